"""BabyAI missions as trees: the grammar of the missions BabyAI writes, parsed so that each language can write
the same goal in its own words (``languages.py``)."""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["Desc", "parse_mission"]


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
