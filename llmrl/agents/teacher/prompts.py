"""The planner's prompt per task kind (task description + one worked example) and its replies → typed plans:
``parse_reply`` takes the first ``Action: {...}`` block, ``validate_plan`` checks every step against the task's
verbs and objects, ``PlanDistribution`` turns a query's replies into plan probabilities with fault counts."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from minigrid.core.constants import IDX_TO_COLOR

from llmrl.agents.skills import VERBS, parse_step
from llmrl.agents.teacher.describe import OBJECT_NAMES, TaskKind

__all__ = ["FALLBACK_PLAN", "PROMPTS", "PlanReply", "canonical_plan", "PLAN_VERBS", "validate_plan", "parse_reply",
           "PlanDistribution"]

FALLBACK_PLAN = "explore"

_DOOR_TASK = (
    "In a locked 2D grid room there is an agent whose task is to open the door. The door can only be opened "
    "while the agent holds the key. The agent can perform the following actions: explore, go to <object>, "
    "pick up <object>, drop <object>, or open <object>. First state which objects the agent sees and holds. "
    "Then reason about what the agent should do in the current state. Finally give the agent's actions in the "
    "form 'Action: {...}'."
)
_COLORED_TASK = (
    "In a locked 2D grid room the agent can only open the door while holding the key whose colour matches the "
    "door. The agent can perform the following actions: explore, go to <object>, pick up <object>, drop "
    "<object>, or open <object>. The agent can hold only one object. First state which objects the agent "
    "sees and holds. Then reason about what the agent can do in the current state. Finally give the agent's "
    "actions in the form 'Action: {...}'."
)
_DOOR_EXAMPLE = (
    "Example:\nAgent sees <key>, holds <nothing>.\n"
    "1. What the agent sees and holds: the agent sees the key, holds nothing, and has not seen the door yet.\n"
    "2. What the agent should do: go to the key, then pick it up.\n"
    "3. Action: {go to <key>, pick up <key>}\n"
)
_SPREAD_TASK = (
    "Three agents and three landmarks are on a 2D plane. The agents must spread out so that every landmark is "
    "covered by one agent. A landmark is taken when another agent is closer to it than this agent, otherwise "
    "it is free. The agent can perform the following action: go to <object>. First state which landmarks are "
    "free. Then reason about where the agent should go. Finally give the agent's action in the form "
    "'Action: {...}'."
)
_SPREAD_EXAMPLE = (
    "Example:\nLandmarks from nearest to farthest: <landmark 1> taken, <landmark 2> free, <landmark 3> free.\n"
    "1. Which landmarks are free: landmark 2 and landmark 3; landmark 1 is taken by another agent.\n"
    "2. Where the agent should go: to the nearest free landmark, landmark 2.\n"
    "3. Action: {go to <landmark 2>}\n"
)
PROMPTS: dict[TaskKind, tuple[str, str]] = {
    "doorkey": (_DOOR_TASK, _DOOR_EXAMPLE),
    "coloreddoorkey": (_COLORED_TASK, _DOOR_EXAMPLE),
    "twodoor": (_DOOR_TASK, _DOOR_EXAMPLE),
    "simple_spread": (_SPREAD_TASK, _SPREAD_EXAMPLE),
}


@dataclass(frozen=True)
class PlanReply:
    """One LLM reply, typed: a parsed ``plan``, an ``invalid`` reply, or an ``error`` (an LLM fault).

    ``reason`` says why a reply is invalid: ``no_action`` (no non-empty ``Action: {...}``), ``unknown_verb``
    or ``unknown_object`` (a step the task's vocabulary does not have).
    """

    kind: Literal["plan", "invalid", "error"]
    plan: str  # canonical plan text for kind == "plan", "" otherwise
    raw: str  # the reply text, or the error message
    reason: str = ""


_ACTION_RE = re.compile(r"Actions?\s*:\s*\{([^{}]*)\}", re.IGNORECASE)


def canonical_plan(body: str) -> str:
    """Steps split on commas, lower-cased, whitespace collapsed: "go to <key>, pick up <key>"."""
    steps = [" ".join(s.lower().split()) for s in body.split(",")]
    return ", ".join(s for s in steps if s)


_PLAN_OBJECTS: dict[TaskKind, tuple[str, ...]] = {
    **OBJECT_NAMES,
    "coloreddoorkey": OBJECT_NAMES["coloreddoorkey"]
    + tuple(f"color{i} {o}" for i in range(1, len(IDX_TO_COLOR) + 1) for o in ("key", "door")),
}
# The verbs each task's prompt offers; simple_spread's agents only "go to" a landmark.
PLAN_VERBS: dict[TaskKind, tuple[str, ...]] = {
    "doorkey": VERBS, "coloreddoorkey": VERBS, "twodoor": VERBS, "simple_spread": ("go to",),
}
_NO_OBJECT_VERBS = ("explore",)


def validate_plan(plan: str, kind: TaskKind) -> str:
    """"" if every step of a canonical plan names a known verb of ``kind`` and, unless the verb takes none, a
    known object; otherwise the reason: ``unknown_verb`` or ``unknown_object``.

    Steps are matched by keyword like the original mediator (``llmrl.agents.skills.parse_step``), so the
    accepted plans are exactly those whose every step maps onto a skill.
    """
    for text in plan.split(","):
        step = parse_step(text, _PLAN_OBJECTS[kind])
        if step.verb not in PLAN_VERBS[kind]:
            return "unknown_verb"
        if step.verb not in _NO_OBJECT_VERBS and not step.obj:
            return "unknown_object"
    return ""


def parse_reply(text: str, kind: TaskKind | None = None) -> PlanReply:
    """The first ``Action: {...}`` block of a reply as a plan; anything else is invalid.

    With ``kind`` the plan must also pass ``validate_plan`` for that task, or the reply is invalid with the
    reason.
    """
    match = _ACTION_RE.search(text)
    plan = canonical_plan(match.group(1)) if match else ""
    if not plan:
        return PlanReply("invalid", "", text, "no_action")
    reason = validate_plan(plan, kind) if kind is not None else ""
    return PlanReply("invalid", "", text, reason) if reason else PlanReply("plan", plan, text)


@dataclass(frozen=True)
class PlanDistribution:
    """Plans with probabilities for one text, and how many replies were valid, invalid (and why) or failed."""

    plans: tuple[str, ...]
    probs: tuple[float, ...]
    n_plan: int = 0
    n_invalid: int = 0
    n_error: int = 0
    fallback: bool = False  # True when no reply was valid and the fallback plan stands in
    invalid_reasons: tuple[tuple[str, int], ...] = ()  # (reason, count), sorted by reason

    @classmethod
    def from_dict(cls, d: dict) -> PlanDistribution:
        """The inverse of ``dataclasses.asdict`` after a JSON round trip (lists back to tuples)."""
        return cls(plans=tuple(d["plans"]), probs=tuple(float(p) for p in d["probs"]), n_plan=d["n_plan"],
                   n_invalid=d["n_invalid"], n_error=d["n_error"], fallback=d["fallback"],
                   invalid_reasons=tuple((str(r), int(n)) for r, n in d["invalid_reasons"]))

    @classmethod
    def from_replies(cls, replies: Sequence[PlanReply], fallback_plan: str = FALLBACK_PLAN) -> PlanDistribution:
        counts = Counter(r.plan for r in replies if r.kind == "plan")
        reasons = tuple(sorted(Counter(r.reason or "no_action" for r in replies if r.kind == "invalid").items()))
        n_invalid = sum(r.kind == "invalid" for r in replies)
        n_error = sum(r.kind == "error" for r in replies)
        n_plan = sum(counts.values())
        if n_plan == 0:
            return cls((fallback_plan,), (1.0,), 0, n_invalid, n_error, fallback=True, invalid_reasons=reasons)
        plans = tuple(sorted(counts, key=lambda p: (-counts[p], p)))
        return cls(plans, tuple(counts[p] / n_plan for p in plans), n_plan, n_invalid, n_error,
                   invalid_reasons=reasons)
