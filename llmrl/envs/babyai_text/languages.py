"""The languages: facts and mission trees written as sentences, and the text variants built from them.

Sentences (English)::

    You see a wall 3 steps forward
    You see a red ball 2 steps left and 1 step forward
    You see a locked red door 1 step right and 4 steps forward
    You carry a purple key

The text ``variant`` (``VARIANTS``) implements GLAM's generalisation tests as transforms of the same sentences:
renamed nouns, colour synonyms, invented nouns and/or adjectives, rephrased goals, renamed actions, French.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field

from llmrl.envs.babyai_text.description import Fact
from llmrl.envs.babyai_text.missions import Desc

__all__ = ["ACTIONS_EN", "CHARSET", "English", "French", "VARIANTS"]

ACTIONS_EN = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")
# every character any language writes (French accents included): the charset of the observation's text spaces
CHARSET = string.ascii_letters + string.digits + " ,.'-:_" + "àâäçéèêëîïôöùûüÿœæÀÂÇÉÈÊËÎÏÔÙÛÜŒ"


def _n(k: int, one: str, many: str) -> str:
    return f"{k} {one if k == 1 else many}"


@dataclass(frozen=True)
class English:
    """English sentences with optional word maps (the generalisation tests)."""

    nouns: dict[str, str] = field(default_factory=dict)
    colors: dict[str, str] = field(default_factory=dict)
    verbs: dict[str, str] = field(default_factory=lambda: {"go": "go to", "pickup": "pick up", "open": "open",
                                                           "put": "put", "next": "next to"})
    links: dict[str, str] = field(default_factory=lambda: {"then": ", then ", "after": " after you ",
                                                           "and": " and "})
    actions: tuple[str, ...] = ACTIONS_EN
    labels: dict[str, str] = field(default_factory=lambda: {
        "actions": "Possible actions of the agent", "goal": "Goal of the agent", "obs": "Observation",
        "action": "Action", "none": "You see nothing"})

    def _obj(self, noun: str, color: str, state: str = "") -> str:
        words = [w for w in (state, self.colors.get(color, color), self.nouns.get(noun, noun)) if w]
        phrase = " ".join(words)
        return ("an " if phrase[0] in "aeiou" else "a ") + phrase

    def sentence(self, f: Fact) -> str:
        if f.kind == "carry":
            return f"You carry {self._obj(f.noun, f.color)}"
        side = "left" if f.right < 0 else "right"
        if f.kind == "wall":
            where = _n(f.forward, "step", "steps") + " forward" if f.forward else _n(abs(f.right), "step",
                                                                                        "steps") + " " + side
            return f"You see a wall {where}"
        parts = []
        if f.right:
            parts.append(f"{_n(abs(f.right), 'step', 'steps')} {side}")
        if f.forward:
            parts.append(f"{_n(f.forward, 'step', 'steps')} forward")
        return f"You see {self._obj(f.noun, f.color, f.state)} {' and '.join(parts)}"

    def _desc(self, d: Desc) -> str:
        rest = " ".join(w for w in (self.colors.get(d.color, d.color), self.nouns.get(d.noun, d.noun), d.loc) if w)
        article = "an" if d.article == "a" and rest[0] in "aeiou" else d.article
        return f"{article} {rest}"

    def mission(self, tree: tuple) -> str:
        kind = tree[0]
        if kind in self.links:
            return self.mission(tree[1]) + self.links[kind] + self.mission(tree[2])
        if kind == "put":
            return f"{self.verbs['put']} {self._desc(tree[1])} {self.verbs['next']} {self._desc(tree[2])}"
        return f"{self.verbs[kind]} {self._desc(tree[1])}"


_FR_NOUNS = {"key": ("clé", "f"), "ball": ("balle", "f"), "box": ("boîte", "f"), "door": ("porte", "f"),
             "wall": ("mur", "m"), "object": ("objet", "m"), "goal": ("but", "m"), "lava": ("lave", "f")}
_FR_COLORS = {"red": ("rouge", "rouge"), "green": ("vert", "verte"), "blue": ("bleu", "bleue"),
              "purple": ("violet", "violette"), "yellow": ("jaune", "jaune"), "grey": ("gris", "grise")}
_FR_STATES = {"open": ("ouvert", "ouverte"), "closed": ("fermé", "fermée"), "locked": ("verrouillé", "verrouillée")}
_FR_LOCS = {"on your left": "à ta gauche", "on your right": "à ta droite", "in front of you": "devant toi",
            "behind you": "derrière toi"}


@dataclass(frozen=True)
class French:
    """French sentences, written from the same facts and mission trees (gender agreement included)."""

    actions: tuple[str, ...] = ("tourner à gauche", "tourner à droite", "avancer", "ramasser", "lâcher",
                                "basculer")
    labels: dict[str, str] = field(default_factory=lambda: {
        "actions": "Actions possibles de l'agent", "goal": "But de l'agent", "obs": "Observation",
        "action": "Action", "none": "Tu ne vois rien"})

    @staticmethod
    def _np(noun: str, color: str, state: str, definite: bool) -> str:
        word, g = _FR_NOUNS[noun]
        fem = g == "f"
        art = ("la " if fem else "le ") if definite else ("une " if fem else "un ")
        if definite and word[0] in "aeiouéè":
            art = "l'"
        adj = [_FR_COLORS[color][fem] if color else "", _FR_STATES[state][fem] if state else ""]
        return art + " ".join(w for w in [word, *adj] if w)

    def sentence(self, f: Fact) -> str:
        if f.kind == "carry":
            return f"Tu portes {self._np(f.noun, f.color, '', False)}"
        side = "à gauche" if f.right < 0 else "à droite"
        parts = []
        if f.right:
            parts.append(f"{abs(f.right)} pas {side}")
        if f.forward:
            parts.append(f"{f.forward} pas en avant")
        return f"Tu vois {self._np(f.noun, f.color, f.state, False)} {' et '.join(parts)}"

    def _desc(self, d: Desc) -> str:
        np_ = self._np(d.noun, d.color, "", d.article == "the")
        return np_ + (" " + _FR_LOCS[d.loc] if d.loc else "")

    @staticmethod
    def _after(prep: str, phrase: str) -> str:
        """French contractions: à le -> au, de le -> du, de un(e) -> d'un(e)."""
        if phrase.startswith("le "):
            return ("au " if prep == "à" else "du ") + phrase[3:]
        if prep == "de" and phrase.startswith(("un ", "une ")):
            return "d'" + phrase
        return f"{prep} {phrase}"

    def _clause(self, tree: tuple, past: bool) -> str:
        kind = tree[0]
        if kind == "go":
            return ("être allé " if past else "va ") + self._after("à", self._desc(tree[1]))
        if kind == "pickup":
            return ("ramassé " if past else "ramasse ") + self._desc(tree[1])
        if kind == "open":
            return ("ouvert " if past else "ouvre ") + self._desc(tree[1])
        return (("posé " if past else "pose ") + self._desc(tree[1]) + " à côté " + self._after("de",
                                                                                         self._desc(tree[2])))

    def mission(self, tree: tuple, past: bool = False) -> str:
        kind = tree[0]
        if kind == "then":
            return self.mission(tree[1]) + ", puis " + self.mission(tree[2])
        if kind == "and":
            return self.mission(tree[1], past) + " et " + self.mission(tree[2], past)
        if kind == "after":
            b = self.mission(tree[2], past=True)
            return self.mission(tree[1]) + " après " + ("" if b.startswith("être") else "avoir ") + b
        return self._clause(tree, past)


VARIANTS: dict[str, English | French] = {
    "none": English(),
    "nouns_renamed": English(nouns={"key": "chair", "ball": "table", "box": "car"}),
    "colour_synonyms": English(colors={"red": "crimson", "green": "emerald", "blue": "azure", "purple": "violet",
                                       "yellow": "golden", "grey": "silver"}),
    "invented_nouns": English(nouns={"key": "dax", "ball": "wug", "box": "blicket"}),
    "invented_adjectives": English(colors={"red": "faze", "green": "lorp", "blue": "sniv", "purple": "trul",
                                           "yellow": "wemb", "grey": "quab"}),
    "invented_nouns_adjectives": English(nouns={"key": "dax", "ball": "wug", "box": "blicket"},
                                         colors={"red": "faze", "green": "lorp", "blue": "sniv",
                                                 "purple": "trul", "yellow": "wemb", "grey": "quab"}),
    "rephrased_goals": English(verbs={"go": "reach", "pickup": "grab", "open": "unbar", "put": "place",
                                      "next": "beside"},
                               links={"then": ", and afterwards ", "after": " once you ", "and": " as well as "}),
    "renamed_actions": English(actions=("rotate left", "rotate right", "move ahead", "take", "release",
                                        "switch")),
    "french": French(),
}
