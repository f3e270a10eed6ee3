"""BabyAI-Text: BabyAI levels described in sentences, with GLAM's mixed train/test levels and text variants.

The wrapper reads only the agent's encoded 7x7 egocentric view (plus the mission), as GLAM's original does, so
it describes any BabyAI level, multi-room ones included: what is hidden behind walls or closed doors is unseen in
the view and is not described, doors are described with their state wherever they are, and the wall rays stop
at the first thing seen.

Sentence order: by default GLAM's (``order="glam"``): the carried object first, then the walls (forward, left,
right), then the objects in the view's column scan (left to right, far to near), so published prompts are
reproduced. ``order="nearest"`` lists objects nearest first and the carried object last.

Sentences (English)::

    You see a wall 3 steps forward
    You see a red ball 2 steps left and 1 step forward
    You see a locked red door 1 step right and 4 steps forward
    You carry a purple key

Observations are dicts: ``image`` (the 7x7x3 encoding), ``direction``, ``mission`` (the goal, transformed by the
variant) and ``text`` (the sentences joined by ", "). Actions are the first six MiniGrid actions; their strings
are ``env.get_wrapper_attr("action_texts")``. The text ``variant`` (``VARIANTS``) implements GLAM's
generalisation tests as transforms of the same sentences: renamed nouns, colour synonyms, invented nouns and/or
adjectives, rephrased goals, renamed actions, French.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT
from minigrid.envs.babyai.core.roomgrid_level import RejectSampling, RoomGridLevel
from minigrid.envs.babyai.core.verifier import (
    AfterInstr,
    BeforeInstr,
    GoToInstr,
    ObjDesc,
    OpenInstr,
    PickupInstr,
    PutNextInstr,
)

ACTIONS_EN = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")
HELD_OUT = ("yellow box", "red key", "red door", "green ball", "grey door")
VIEW = 7
AGENT = (VIEW // 2, VIEW - 1)  # the agent's cell in the egocentric view: bottom row, middle column
DOOR_STATES = {0: "open", 1: "closed", 2: "locked"}
CHARSET = string.ascii_letters + string.digits + " ,.'-:_" + "àâäçéèêëîïôöùûüÿœæÀÂÇÉÈÊËÎÏÔÙÛÜŒ"


class Fact(NamedTuple):
    """One thing seen: a wall on a ray, an object at (right, forward) from the agent, or the carried object."""

    kind: str  # "wall" | "object" | "carry"
    noun: str = ""
    color: str = ""
    state: str = ""  # doors only: open | closed | locked
    right: int = 0  # negative = left
    forward: int = 0


ORDERS = ("glam", "nearest")


def describe_image(image: np.ndarray, order: str = "glam") -> list[Fact]:
    """Facts seen in an encoded egocentric view (``image[x, y] = (object, colour, state)``, agent at (3, 6)).

    Walls are reported along the three rays (forward, left, right) up to the first thing seen; every visible
    object or door anywhere in the view is reported with its offsets. ``order="glam"``: the carried object
    first, objects in column-scan order (x outer, y inner) as GLAM's description code does; ``"nearest"``:
    objects nearest first, the carried object last.
    """
    if order not in ORDERS:
        raise ValueError(f"describe_image: order must be one of {ORDERS}, got {order!r}")
    image = np.asarray(image)
    if image.shape != (VIEW, VIEW, 3):
        raise ValueError(f"describe_image: expected a {VIEW}x{VIEW}x3 view, got shape {image.shape}")
    ax, ay = AGENT
    facts: list[Fact] = []
    carried = IDX_TO_OBJECT[int(image[ax, ay, 0])]
    carry = ([Fact("carry", carried, IDX_TO_COLOR[int(image[ax, ay, 1])])]
             if carried not in ("unseen", "empty", "agent") else [])
    if order == "glam":
        facts.extend(carry)
    rays = [("forward", [(ax, y) for y in range(ay - 1, -1, -1)]),
            ("left", [(x, ay) for x in range(ax - 1, -1, -1)]),
            ("right", [(x, ay) for x in range(ax + 1, VIEW)])]
    for direction, cells in rays:
        for dist, (x, y) in enumerate(cells, start=1):
            kind = IDX_TO_OBJECT[int(image[x, y, 0])]
            if kind in ("empty", "floor"):
                continue
            if kind == "wall":
                facts.append(Fact("wall", "wall", right=(-dist if direction == "left" else dist
                                                           if direction == "right" else 0),
                                  forward=dist if direction == "forward" else 0))
            break  # anything else (object, door, unseen) ends the ray
    objects = []
    for x in range(VIEW):
        for y in range(VIEW):
            kind = IDX_TO_OBJECT[int(image[x, y, 0])]
            if (x, y) == AGENT or kind in ("unseen", "empty", "floor", "wall", "agent"):
                continue
            state = DOOR_STATES[int(image[x, y, 2])] if kind == "door" else ""
            objects.append(Fact("object", kind, IDX_TO_COLOR[int(image[x, y, 1])], state, x - ax, ay - y))
    if order == "nearest":
        objects.sort(key=lambda f: (abs(f.right) + f.forward, f.forward, f.right))
    facts.extend(objects)
    if order == "nearest":
        facts.extend(carry)
    return facts


# ------------------------------------------------------------------------------------------ missions as trees


class Desc(NamedTuple):
    article: str  # "the" | "a"
    color: str
    noun: str
    loc: str  # "" | "on your left" | "on your right" | "in front of you" | "behind you"


_D = r"(the|a) (?:(red|green|blue|purple|yellow|grey) )?(key|ball|box|door|object)(?: (on your left|on your right|in front of you|behind you))?"
_CLAUSES = [("go", re.compile(rf"^go to {_D}$")), ("pickup", re.compile(rf"^pick up {_D}$")),
            ("open", re.compile(rf"^open {_D}$")), ("put", re.compile(rf"^put {_D} next to {_D}$"))]


def parse_mission(mission: str) -> tuple:
    """A BabyAI mission as a tree: ``("then"|"after"|"and", a, b)`` or ``(verb, Desc, ...)``.

    Raises ValueError naming the mission when it is outside the BabyAI grammar.
    """
    for sep, kind in ((", then ", "then"), (" after you ", "after"), (" and ", "and")):
        if sep in mission:
            a, b = mission.split(sep, 1)
            return (kind, parse_mission(a), parse_mission(b))
    for verb, pattern in _CLAUSES:
        m = pattern.match(mission)
        if m:
            g = [x or "" for x in m.groups()]
            return (verb, *[Desc(*g[i:i + 4]) for i in range(0, len(g), 4)])
    raise ValueError(f"parse_mission: {mission!r} is not a BabyAI mission")


# ------------------------------------------------------------------------------------------------- languages


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


# ----------------------------------------------------------------------------------------------- the wrapper


class BabyAIText(gym.Wrapper):
    """Text observations for any BabyAI level (see module doc); six actions (MiniGrid's "done" is dropped)."""

    def __init__(self, env: gym.Env, variant: str = "none", order: str = "glam"):
        super().__init__(env)
        if variant not in VARIANTS:
            raise ValueError(f"BabyAIText: unknown variant {variant!r}; known: {sorted(VARIANTS)}")
        if order not in ORDERS:
            raise ValueError(f"BabyAIText: order must be one of {ORDERS}, got {order!r}")
        self.variant, self.order = variant, order
        self.language = VARIANTS[variant]
        self.action_texts: tuple[str, ...] = self.language.actions
        self.labels: dict[str, str] = self.language.labels
        self.action_space = spaces.Discrete(len(ACTIONS_EN))
        text = spaces.Text(max_length=4096, charset=CHARSET)
        self.observation_space = spaces.Dict({
            "image": env.observation_space["image"],
            "direction": env.observation_space["direction"],
            "mission": text,
            "text": text,
        })

    def observation(self, obs: dict) -> dict[str, Any]:
        facts = describe_image(obs["image"], self.order)
        sentences = [self.language.sentence(f) for f in facts] or [self.labels["none"]]
        return {"image": obs["image"], "direction": obs["direction"],
                "mission": self.language.mission(parse_mission(obs["mission"])), "text": ", ".join(sentences)}

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self.observation(obs), info

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"BabyAIText.step: action must be in 0..5, got {action!r}")
        obs, reward, terminated, truncated, info = self.env.step(int(action))
        return self.observation(obs), reward, terminated, truncated, info


# ------------------------------------------------------------------------------------- GLAM's mixed levels

TASKS = ("goto", "pickup", "open", "putnext", "pickup_then_goto")
_OBJ_COMBOS = [(t, c) for t in ("key", "ball", "box") for c in ("red", "green", "blue", "purple", "yellow", "grey")]


class MixedLocal(RoomGridLevel):
    """GLAM's mixed level: go to / pick up / open / put next to / pick up A then go to B in one 8x8 room.

    The grid holds two rooms side by side; only *open* connects them (a locked door whose key lies in the
    agent's room), so every other task is a single closed room, as in the original. ``split="train"`` never
    names a held-out combination (``HELD_OUT``) in the mission; ``split="test"`` always names one.
    """

    def __init__(self, split: str = "train", num_dists: int = 8, room_size: int = 8, **kwargs):
        if split not in ("train", "test"):
            raise ValueError(f"MixedLocal: split must be 'train' or 'test', got {split!r}")
        self.split, self.num_dists = split, num_dists
        super().__init__(room_size=room_size, num_rows=1, num_cols=2, **kwargs)

    def _combo_ok(self, combos: list[str]) -> bool:
        held = any(c in HELD_OUT for c in combos)
        return held if self.split == "test" else not held

    def _pick_combo(self, held_out: bool | None = None) -> tuple[str, str]:
        pool = [tc for tc in _OBJ_COMBOS if held_out is None or (f"{tc[1]} {tc[0]}" in HELD_OUT) == held_out]
        return self._rand_elem(pool)

    def gen_mission(self):
        task = self._rand_elem(TASKS)
        self.task = task
        if task == "open":
            colors = ["red", "grey"] if self.split == "test" else ["green", "blue", "purple", "yellow"]
            color = self._rand_elem(colors)
            self.add_door(0, 0, 0, color=color, locked=True)
            self.add_object(0, 0, "key", color)
            self.add_distractors(0, 0, num_distractors=self.num_dists, all_unique=False)
            self.place_agent(0, 0)
            named = color if self.split == "test" else self._rand_elem([None, color])
            self.instrs = OpenInstr(ObjDesc("door", named))
        else:
            n_targets = 2 if task in ("putnext", "pickup_then_goto") else 1
            if self.split == "test":  # at least one held-out combination, the other free
                combos = [self._pick_combo(True)] + [self._pick_combo() for _ in range(n_targets - 1)]
                if n_targets == 2 and self._rand_bool():
                    combos.reverse()
            else:
                combos = [self._pick_combo(False) for _ in range(n_targets)]
            if n_targets == 2 and combos[0] == combos[1]:
                raise RejectSampling("the two objects of a two-object task must differ")
            objs = [self.add_object(0, 0, t, c)[0] for t, c in combos]
            self.add_distractors(0, 0, num_distractors=self.num_dists + 1 - n_targets, all_unique=False)
            self.place_agent(0, 0)
            descs = [ObjDesc(o.type, o.color) for o in objs]
            if task == "goto":
                self.instrs = GoToInstr(descs[0])
            elif task == "pickup":
                self.instrs = PickupInstr(descs[0])
            elif task == "putnext":
                self.instrs = PutNextInstr(descs[0], descs[1])
            elif self._rand_bool():
                self.instrs = BeforeInstr(PickupInstr(descs[0]), GoToInstr(descs[1]))
            else:
                self.instrs = AfterInstr(GoToInstr(descs[1]), PickupInstr(descs[0]))
        self.check_objs_reachable()
        mission = self.instrs.surface(self)
        if not self._combo_ok([h for h in HELD_OUT if h in mission]):
            raise RejectSampling(f"mission {mission!r} is outside the {self.split} split")

    def reset(self, **kwargs):
        obs = super().reset(**kwargs)
        if not self.fixed_max_steps:  # one room's navigation budget per sub-goal (the second room is closed)
            self.max_steps = self.room_size ** 2 * self.num_navs_needed(self.instrs) * (2 if self.task == "open"
                                                                                          else 1)
        return obs


# ------------------------------------------------------------------------------------------- registration

# text id -> underlying level (a BabyAI id, or a MixedLocal split)
LEVELS = {
    "BabyAI-Text-MixedTrainLocal-v0": "train",
    "BabyAI-Text-MixedTestLocal-v0": "test",
    "BabyAI-Text-GoToRedBallNoDists-v0": "BabyAI-GoToRedBallNoDists-v0",
    "BabyAI-Text-GoToObjS4-v0": "BabyAI-GoToObjS4-v0",
    "BabyAI-Text-GoToLocal-v0": "BabyAI-GoToLocal-v0",
    "BabyAI-Text-PickupLoc-v0": "BabyAI-PickupLoc-v0",
    "BabyAI-Text-KeyCorridorS3R1-v0": "BabyAI-KeyCorridorS3R1-v0",
    "BabyAI-Text-GoToSeqS5R2-v0": "BabyAI-GoToSeqS5R2-v0",
}


def make_text_env(level: str, variant: str = "none", order: str = "glam", **kwargs) -> BabyAIText:
    """Entry point of every ``BabyAI-Text-*`` id: the level (a BabyAI id or a mixed split) in the text wrapper."""
    if level in ("train", "test"):
        base = MixedLocal(split=level, **kwargs)
    else:
        import minigrid  # noqa: F401  (registers the BabyAI ids)

        base = gym.make(level, disable_env_checker=True, **kwargs).unwrapped
    return BabyAIText(base, variant=variant, order=order)


for _id, _level in LEVELS.items():
    if _id not in gym.registry:
        gym.register(id=_id, entry_point="llmrl.envs.babyai_text:make_text_env", kwargs={"level": _level})
