"""LLM4Teach's teacher: observation → text → plans (LLM or scripted oracle) → skills → action distribution.

1. ``describe`` turns an observation into a short text ("Agent sees <key>, <door>, holds <nothing>.") plus
   the coordinates of the objects it names (the original ``Mediator.RL2LLM``). ColoredDoorKey colours are
   renamed ``color1``/``color2`` in order of appearance before planning and mapped back afterwards, so one
   cached answer serves every colour pair.
2. ``LLMPlanner`` sends the planner prompt (task description + one worked example + the text) ``n_ask``
   times, parses ``Action: {...}`` out of each reply into a typed ``PlanReply`` (plan / invalid / error),
   and turns the frequencies of the valid plans into probabilities. A reply is a valid plan only if every
   step names a known verb of the task and, where the verb takes one, a known object (``validate_plan``);
   anything else is counted invalid with its reason (the original mediator silently turned such steps into
   "do nothing"). Replies go through the foundation's ``CachedBackend`` (a content-addressed
   ``ReplyCache`` on disk) and every distribution is memoised per text in memory, so a text costs LLM time
   once per cache. When no reply is valid, or the backend reports an LLM fault (``LLM_FAULTS``: HTTP
   errors, timeouts, lost connections), the distribution is the fallback plan ("explore") with the
   failures counted — never a ``None`` plan. Any other exception (a programming error, or an offline cache
   miss ``CacheMissError``) propagates and fails the stage. The model behind the backend is created lazily
   (``LazyBackend``): a fully cached or oracle run touches no model. ``plan_texts`` bounds a whole planning
   pass: once the error replies exceed ``max_error_rate`` of the replies it will ask for, or the deadline
   passes, it raises ``LLMOutageError``, so an outage fails the stage instead of becoming the cached teacher.
3. ``OraclePlanner`` answers the same texts with hand-written rules, to separate planner quality from
   distillation quality.
4. ``TeacherPolicy`` maps each plan through the scripted skills of ``llmrl.agents.skills`` and returns
   π_T(a|s) = Σ_p P(p|text)·U(skill_p(s))(a), U uniform over the primitives that start an equally short
   path: the expectation of the original's per-step plan sampling, computed exactly instead of sampled.
"""

from __future__ import annotations

import copy
import functools
import itertools
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
from minigrid.core.constants import IDX_TO_COLOR, OBJECT_TO_IDX

from llmrl.agents.skills import VERBS, GridView, Step, goto_point_action, parse_step, plan_actions
from llmrl.llm.backends import Backend, CacheMissError, llm_fault_types
from llmrl.llm.generate import Generation, Prompt, SamplingConfig, truncate_at_stop

TaskKind = Literal["doorkey", "coloreddoorkey", "twodoor", "simple_spread"]
KEY, DOOR = OBJECT_TO_IDX["key"], OBJECT_TO_IDX["door"]
FALLBACK_PLAN = "explore"

# Which text and plan vocabulary each environment uses (LavaDoorKey shares SimpleDoorKey's, as in the original).
ENV_KIND: dict[str, TaskKind] = {
    "MiniGrid-SimpleDoorKey-Min5-Max10-View3": "doorkey",
    "MiniGrid-LavaDoorKey-Min5-Max10-View3": "doorkey",
    "MiniGrid-ColoredDoorKey-Min5-Max10-View3": "coloreddoorkey",
    "MiniGrid-TwoDoor-Min20-Max20": "twodoor",
    "simple_spread_v3": "simple_spread",
}

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


# ------------------------------------------------------------------------------------ observation → text


@dataclass(frozen=True)
class Scene:
    """An observation as text, and where each object the text names is (grid cell, or relative position)."""

    text: str
    objects: dict[str, tuple] = field(default_factory=dict, compare=False)


def describe(obs: np.ndarray, kind: TaskKind) -> Scene:
    """The original mediator's text for ``obs``: keys (not held) first, then doors, then what is held."""
    if kind == "simple_spread":
        return describe_spread(obs)
    obj = obs[..., 0]
    agent = tuple(int(v) for v in np.argwhere(obs[..., 3] != 4)[0])
    named: list[str] = []
    objects: dict[str, tuple] = {}
    carrying = "nothing"
    for i, j in np.argwhere(obj == KEY):
        name = f"{IDX_TO_COLOR[int(obs[i, j, 1])]} key" if kind == "coloreddoorkey" else "key"
        if (int(i), int(j)) == agent:
            carrying = name
        else:
            named.append(name)
            objects[name] = (int(i), int(j))
    for n, (i, j) in enumerate(np.argwhere(obj == DOOR), start=1):
        name = {"coloreddoorkey": f"{IDX_TO_COLOR[int(obs[i, j, 1])]} door", "twodoor": f"door{n}"}.get(kind, "door")
        named.append(name)
        objects[name] = (int(i), int(j))
    seen = ", ".join(f"<{n}>" for n in named) or "<nothing>"
    return Scene(f"Agent sees {seen}, holds <{carrying}>.", objects)


def describe_spread(obs: np.ndarray) -> Scene:
    """simple_spread (N=3) agent observation → landmarks by distance, each free or taken by a closer agent.

    Observation layout (mpe2): own velocity (2), own position (2), landmarks relative (3×2), other agents
    relative (2×2), communication (2×2).
    """
    landmarks = obs[4:10].reshape(3, 2)
    others = obs[10:14].reshape(2, 2)
    mine = np.linalg.norm(landmarks, axis=1)
    theirs = np.linalg.norm(landmarks[:, None, :] - others[None, :, :], axis=2).min(axis=1)
    order = np.argsort(mine, kind="stable")
    parts, objects = [], {}
    for rank, k in enumerate(order, start=1):
        parts.append(f"<landmark {rank}> {'taken' if theirs[k] < mine[k] else 'free'}")
        objects[f"landmark {rank}"] = tuple(float(v) for v in landmarks[k])
    return Scene("Landmarks from nearest to farthest: " + ", ".join(parts) + ".", objects)


_COLOR_WORDS = re.compile(r"\b(red|green|blue|purple|yellow|grey)\b")


def canonical_colors(text: str) -> tuple[str, dict[str, str]]:
    """Rename colours to color1, color2, ... in order of first appearance; return the text and the way back."""
    colors = list(dict.fromkeys(_COLOR_WORDS.findall(text)))
    back = {f"color{i}": c for i, c in enumerate(colors, start=1)}
    for alias, color in back.items():
        text = re.sub(rf"\b{color}\b", alias, text)
    return text, back


def restore_colors(plan: str, back: dict[str, str]) -> str:
    for alias, color in back.items():
        plan = re.sub(rf"\b{alias}\b", color, plan)
    return plan


# ------------------------------------------------------------------------------------ replies → plans


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


# The object names each task's text uses (ColoredDoorKey: the canonical color1.. aliases the planner sees, and
# the real colours the skills see after ``restore_colors``).
_OBJECT_NAMES: dict[TaskKind, tuple[str, ...]] = {
    "doorkey": ("key", "door"),
    "coloreddoorkey": tuple(f"{c} {o}" for c in IDX_TO_COLOR.values() for o in ("key", "door")),
    "twodoor": ("key", "door1", "door2"),
    "simple_spread": ("landmark 1", "landmark 2", "landmark 3"),
}
_PLAN_OBJECTS: dict[TaskKind, tuple[str, ...]] = {
    **_OBJECT_NAMES,
    "coloreddoorkey": _OBJECT_NAMES["coloreddoorkey"]
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


class OraclePlanner:
    """Hand-written plans for every text of a task kind: what a perfect planner would answer."""

    name = "oracle"

    def __init__(self, kind: TaskKind):
        self.kind = kind

    def plan(self, text: str) -> PlanDistribution:
        return PlanDistribution((oracle_plan(self.kind, text),), (1.0,), n_plan=1)


def _seen_held(text: str) -> tuple[list[str], str]:
    seen_part, _, held_part = text.partition("holds")
    seen = [s for s in re.findall(r"<([^>]+)>", seen_part) if s != "nothing"]
    held = re.findall(r"<([^>]+)>", held_part)
    return seen, held[0] if held else "nothing"


def oracle_plan(kind: TaskKind, text: str) -> str:
    """The scripted planner's answer for a (canonical) text."""
    if kind == "simple_spread":
        free = re.findall(r"<(landmark \d)> free", text)
        return f"go to <{free[0] if free else 'landmark 1'}>"
    seen, held = _seen_held(text)
    doors = [s for s in seen if s.endswith(("door", "door1", "door2"))]
    keys = [s for s in seen if s.endswith("key")]
    if kind == "coloreddoorkey":
        door = doors[0] if doors else None
        match = door.replace("door", "key") if door else None
        if door is None:
            return "explore"
        if held == match:
            return f"go to <{door}>, open <{door}>"
        if match in keys:
            prefix = f"drop <{held}>, " if held != "nothing" else ""
            return f"{prefix}go to <{match}>, pick up <{match}>"
        return "explore"
    if held != "nothing":
        return f"go to <{doors[0]}>, open <{doors[0]}>" if doors else "explore"
    if keys:
        return f"go to <{keys[0]}>, pick up <{keys[0]}>"
    return "explore"


def observation_texts(kind: TaskKind) -> list[str]:
    """Every text ``describe`` can produce for a task kind (canonical colours), for pre-filling a reply cache.

    The DoorKey family has a handful (6 for SimpleDoorKey); simple_spread has 8 free/taken patterns.
    """
    if kind == "simple_spread":
        return [
            "Landmarks from nearest to farthest: "
            + ", ".join(f"<landmark {r}> {'taken' if (bits >> (r - 1)) & 1 else 'free'}" for r in (1, 2, 3)) + "."
            for bits in range(8)
        ]
    texts = []

    def add(seen: list[str], held: str) -> None:
        text = f"Agent sees {', '.join(f'<{s}>' for s in seen) or '<nothing>'}, holds <{held}>."
        text = canonical_colors(text)[0] if kind == "coloreddoorkey" else text
        if text not in texts:
            texts.append(text)

    if kind == "doorkey":
        for held in ("nothing", "key"):
            for keys in ([], ["key"]) if held == "nothing" else ([],):
                for doors in ([], ["door"]):
                    add(keys + doors, held)
    elif kind == "twodoor":
        for held in ("nothing", "key"):
            for keys in ([], ["key"]) if held == "nothing" else ([],):
                for doors in ([], ["door1"], ["door1", "door2"]):
                    add(keys + doors, held)
    else:  # coloreddoorkey: a blue door, one blue and one red key; keys listed in grid order
        for held in ("nothing", "blue key", "red key"):
            free = [k for k in ("blue key", "red key") if k != held]
            for n in range(len(free) + 1):
                for keys in itertools.permutations(free, n):
                    for doors in ([], ["blue door"]):
                        add(list(keys) + doors, held)
    return texts


# ------------------------------------------------------------------------------------ the LLM planner


class LazyBackend:
    """A backend built on first use: a run whose replies are all cached never loads the model."""

    def __init__(self, model_id: str, factory: Callable[[], Backend]):
        self.model_id = model_id
        self._factory = factory
        self._backend: Backend | None = None

    @property
    def loaded(self) -> bool:
        return self._backend is not None

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig) -> list[Generation]:
        if self._backend is None:
            self._backend = self._factory()
        return self._backend.generate(prompts, sampling)


class SharedPromptBackend:
    """A local model that answers k copies of one prompt from a single prefill, its KV cache repeated k times.

    The planner sends the same prompt ``n_ask`` times; on a small CPU model the prompt's prefill costs about
    ten times the 24-token replies, so computing it once makes a planner query several times cheaper. Replies
    are seeded like ``llmrl.llm.generate`` (``sampling.seed`` per call) but are not the same samples, hence
    the distinct ``model_id`` (and reply-cache keys).
    """

    def __init__(self, llm, batch_size: int = 10):
        self.llm = llm
        self.batch_size = batch_size  # copies decoded together; bounds memory on large models
        self.model_id = f"local-shared-prompt:{llm.spec}"

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig) -> list[Generation]:
        tok, model = self.llm.tokenizer, self.llm.model
        eos = {tok.eos_token_id, *np.atleast_1d(model.generation_config.eos_token_id or [])} - {None}
        out: list[Generation | None] = [None] * len(prompts)
        groups: dict[str, list[int]] = {}
        rendered = [self.llm.render(p) for p in prompts]
        for i, r in enumerate(rendered):
            groups.setdefault(r, []).append(i)
        model.eval()
        for text, idx in groups.items():
            ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids.to(self.llm.device)
            kwargs = dict(max_new_tokens=sampling.max_new_tokens, pad_token_id=tok.pad_token_id or tok.eos_token_id,
                          eos_token_id=[int(e) for e in eos])
            if sampling.greedy:
                kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
            else:
                kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                              top_k=sampling.top_k or None)
            # Stop strings are applied after decoding: transformers' stop-string matcher costs seconds to set
            # up per call, more than the few tokens it would save.
            rows: list[list[int]] = []
            with torch.no_grad(), torch.random.fork_rng():
                torch.manual_seed(sampling.seed)
                prefix = model(ids[:, :-1], use_cache=True).past_key_values  # prefill once, all but the last token
                for lo in range(0, len(idx), self.batch_size):
                    k = min(self.batch_size, len(idx) - lo)
                    cache = copy.deepcopy(prefix) if lo + k < len(idx) else prefix
                    cache.batch_repeat_interleave(k)
                    batch = ids.repeat(k, 1)
                    gen = model.generate(batch, attention_mask=torch.ones_like(batch), past_key_values=cache, **kwargs)
                    rows += gen[:, ids.shape[1]:].tolist()
            for i, row in zip(idx, rows):
                n = next((j for j, t in enumerate(row) if t in eos), len(row))
                reply, hit_stop = truncate_at_stop(tok.decode(row[:n], skip_special_tokens=True), sampling.stop)
                out[i] = Generation(prompt=text, text=reply, n_tokens=n,
                                    finish_reason="stop" if n < len(row) or hit_stop else "length")
        return out  # type: ignore[return-value]


LLM_FAULTS = llm_fault_types()


class LLMPlanner:
    """Plans from ``n_ask`` sampled LLM replies per text; see the module docstring.

    ``answer_prefix`` starts the assistant's turn (e.g. "Action: {" for a model too small to follow the
    three-part answer format); the reply is parsed with the prefix in front. Every query is kept in
    ``records`` (prompt, replies, their types, the distribution) so a stage can save them.
    """

    name = "llm"

    def __init__(self, kind: TaskKind, backend: Backend, *, n_ask: int = 10,
                 sampling: SamplingConfig = SamplingConfig(max_new_tokens=64, temperature=0.9),
                 answer_prefix: str = "", fallback_plan: str = FALLBACK_PLAN):
        if n_ask < 1:
            raise ValueError(f"n_ask: must be >= 1, got {n_ask}")
        if fallback_plan != FALLBACK_PLAN and validate_plan(canonical_plan(fallback_plan), kind):
            raise ValueError(f"fallback_plan: {fallback_plan!r} is not a valid {kind} plan "
                             f"({validate_plan(canonical_plan(fallback_plan), kind)})")
        self.kind = kind
        self.backend = backend
        self.n_ask = n_ask
        self.sampling = sampling
        self.answer_prefix = answer_prefix
        self.fallback_plan = fallback_plan
        self.memo: dict[str, PlanDistribution] = {}
        self.records: list[dict] = []

    def prompt(self, text: str) -> list[dict]:
        task, example = PROMPTS[self.kind]
        messages = [{"role": "user", "content": f"{task}\n\n{example}\n{text}"}]
        if self.answer_prefix:
            messages.append({"role": "assistant", "content": self.answer_prefix})
        return messages

    def plan(self, text: str) -> PlanDistribution:
        if text in self.memo:
            return self.memo[text]
        prompt = self.prompt(text)
        try:
            gens = self.backend.generate([prompt] * self.n_ask, self.sampling)
        except LLM_FAULTS as err:  # a failing LLM is data: every reply of this query is an error record
            replies = [PlanReply("error", "", f"{type(err).__name__}: {err}")] * self.n_ask
            rendered = ""
            repeated = 0
        except CacheMissError as err:  # an offline run whose reply cache lacks this text: fail, naming it
            raise CacheMissError(f"{err.args[0] if err.args else err} (planner text {text!r}; re-run "
                                 "teach_plans to fill the reply cache)") from err
        else:
            replies = [parse_reply(self.answer_prefix + g.text, self.kind) for g in gens]
            rendered = gens[0].prompt if gens else ""
            # Replies of an endpoint that answered the prefix in a new turn instead of continuing it.
            repeated = sum(g.prefix_repeated for g in gens)
        dist = PlanDistribution.from_replies(replies, self.fallback_plan)
        self.memo[text] = dist
        self.records.append({"text": text, "messages": prompt, "rendered_prompt": rendered,
                             "prefix_repeated": repeated,
                             "replies": [asdict(r) for r in replies], "distribution": asdict(dist)})
        return dist

    def stats(self) -> dict:
        """Reply counts and rates over every text queried so far."""
        n = {k: sum(getattr(d, f"n_{k}") for d in self.memo.values()) for k in ("plan", "invalid", "error")}
        total = sum(n.values())
        reasons: Counter[str] = Counter()
        for d in self.memo.values():
            reasons.update(dict(d.invalid_reasons))
        return {
            "texts": len(self.memo),
            "replies": total,
            "valid_replies": n["plan"],
            "invalid_replies": n["invalid"],
            "error_replies": n["error"],
            "invalid_rate": n["invalid"] / total if total else 0.0,
            "error_rate": n["error"] / total if total else 0.0,
            "fallback_texts": sum(d.fallback for d in self.memo.values()),
            "invalid_reasons": {r: reasons[r] for r in ("no_action", "unknown_verb", "unknown_object")},
        }


class LLMOutageError(RuntimeError):
    """The LLM failed too often (or too slowly) for its plans to stand for the teacher."""


def plan_texts(planner: LLMPlanner, texts: Sequence[str], *, max_error_rate: float, deadline_s: float | None,
               clock: Callable[[], float] = time.monotonic) -> dict[str, PlanDistribution]:
    """Each text's plan distribution, or ``LLMOutageError`` as soon as the outcome is an outage.

    Fails fast: once the error replies exceed ``max_error_rate`` of all the replies this pass will ask for
    (``len(texts) * n_ask``), no later text can bring the rate back under it. ``deadline_s`` bounds the whole
    pass (checked after every text; one text is bounded by the backend's own timeout and retries).
    """
    start, planned = clock(), len(texts) * planner.n_ask
    out = {}
    for text in texts:
        out[text] = planner.plan(text)
        errors = sum(d.n_error for d in planner.memo.values())
        if errors > max_error_rate * planned:
            first = next(r for rec in planner.records for r in rec["replies"] if r["kind"] == "error")
            raise LLMOutageError(
                f"teach.teacher.max_error_rate: {errors} of {planned} planned replies failed already (> "
                f"{max_error_rate:.0%}; first: {first['raw']}); the stage writes nothing")
        if deadline_s is not None and clock() - start > deadline_s:
            raise LLMOutageError(f"teach.teacher.deadline_s: planning passed {deadline_s:.0f} s after "
                                 f"{len(out)} of {len(texts)} texts; the stage writes nothing")
    return out


# ------------------------------------------------------------------------------------ the teacher policy


Planner = OraclePlanner | LLMPlanner


@functools.lru_cache(maxsize=4096)
def _plan_steps(plan: str, object_names: tuple[str, ...]) -> tuple[Step, ...]:
    return tuple(parse_step(s, object_names) for s in plan.split(","))


def spread_plan_action(steps: Sequence[Step], obs: np.ndarray, objects: dict[str, tuple]) -> int:
    """simple_spread: the first "go to <landmark k>" step steers there; anything else is a no-op."""
    for step in steps:
        if step.verb == "go to" and step.obj in objects:
            return goto_point_action(np.asarray(objects[step.obj]), obs[0:2])
    return 0


class TeacherPolicy:
    """π_T(a|s) from a planner and the scripted skills; also a harness ``Policy`` (the teacher alone)."""

    def __init__(self, kind: TaskKind, planner: Planner, n_actions: int):
        self.kind = kind
        self.planner = planner
        self.n_actions = n_actions
        self.name = f"teacher-{planner.name}"
        self.text_counts: Counter[str] = Counter()
        self.rng = np.random.default_rng(0)

    def plan_for(self, obs: np.ndarray) -> tuple[Scene, str, PlanDistribution, dict[str, str]]:
        scene = describe(obs, self.kind)
        text, back = canonical_colors(scene.text) if self.kind == "coloreddoorkey" else (scene.text, {})
        return scene, text, self.planner.plan(text), back

    def distribution(self, obs: np.ndarray) -> np.ndarray:
        scene, text, dist, back = self.plan_for(obs)
        self.text_counts[text] += 1
        probs = np.zeros(self.n_actions, dtype=np.float32)
        names = _OBJECT_NAMES[self.kind]
        view = None if self.kind == "simple_spread" else GridView(obs)
        for plan, p in zip(dist.plans, dist.probs):
            steps = _plan_steps(restore_colors(plan, back), names)
            if view is None:
                probs[spread_plan_action(steps, obs, scene.objects)] += p
            else:
                actions = plan_actions(list(steps), view, scene.objects)
                probs[list(actions)] += p / len(actions)
        return probs

    def distributions(self, obs_batch: np.ndarray) -> np.ndarray:
        return np.stack([self.distribution(o) for o in obs_batch])

    # harness Policy protocol
    def reset(self, env: gym.Env, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray, *, greedy: bool) -> int:
        probs = self.distribution(obs)
        if greedy:
            return int(np.argmax(probs))
        return int(self.rng.choice(self.n_actions, p=probs / probs.sum()))
