"""Planners: text → ``PlanDistribution``. ``OraclePlanner`` answers with hand-written rules; ``LLMPlanner`` asks an
LLM backend ``n_ask`` times per text and counts faults; ``ScoringPlanner`` scores every admissible plan under the
LLM (one prompt, its KV cache reused across the candidates) and takes their softmax; ``UniformPlanner`` and
``RandomScorePlanner`` are its controls, the same candidates with equal or random scores and no LLM;
``TablePlanner`` replays stored distributions; ``plan_texts`` bounds a whole planning pass."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict

import numpy as np

from llmrl.agents.teacher.describe import TaskKind
from llmrl.agents.teacher.prompts import (FALLBACK_PLAN, PROMPTS, PlanDistribution, PlanReply, canonical_plan,
                                          parse_reply, validate_plan)
from llmrl.llm.backends import Backend, CacheMissError
from llmrl.llm.faults import FaultGuard, LLMOutageError, llm_fault_types
from llmrl.llm.generate import SamplingConfig

__all__ = ["OraclePlanner", "oracle_plan", "admissible_plans", "planner_messages", "LLM_FAULTS", "LLMPlanner",
           "ScoringPlanner", "UniformPlanner", "RandomScorePlanner", "TablePlanner", "LLMOutageError", "plan_texts",
           "Planner"]

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


def admissible_plans(kind: TaskKind, text: str) -> list[str]:
    """Every plan the skills can carry out from the state a text describes, in a fixed order: the candidates a
    scoring teacher weighs (the oracle's plan is one of them, for every text; tested)."""
    if kind == "simple_spread":
        return [f"go to <landmark {r}>" for r in (1, 2, 3)]
    seen, held = _seen_held(text)
    keys = [s for s in seen if s.endswith("key")]
    plans = ["explore"]
    for obj in seen:
        plans.append(f"go to <{obj}>")
        if obj in keys and held == "nothing":
            plans.append(f"go to <{obj}>, pick up <{obj}>")
        if obj.endswith(("door", "door1", "door2")):
            plans.append(f"go to <{obj}>, open <{obj}>")
    if held != "nothing":
        plans.append(f"drop <{held}>")
        plans += [f"drop <{held}>, go to <{k}>, pick up <{k}>" for k in keys]
    return list(dict.fromkeys(plans))


def planner_messages(kind: TaskKind, text: str, answer_prefix: str = "") -> list[dict]:
    """The planner's chat: task description, worked example and the text; ``answer_prefix`` opens its answer."""
    task, example = PROMPTS[kind]
    messages = [{"role": "user", "content": f"{task}\n\n{example}\n{text}"}]
    if answer_prefix:
        messages.append({"role": "assistant", "content": answer_prefix})
    return messages


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
        return planner_messages(self.kind, text, self.answer_prefix)

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
                                 "llm4teach_plans to fill the reply cache)") from err
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


class ScoringPlanner:
    """π(plan | text) = softmax over ``admissible_plans`` of log P_LLM(plan + closing brace | prompt) / temperature.

    The prompt is the sampling planner's, opened with ``answer_prefix`` (which must end with "{": the candidates
    are the bracketed plan's contents). Summed token log-probs, as GLAM scores actions. No sampling, so no
    invalid replies and no fallback: every text gets a full distribution, kept in ``records``.
    """

    name = "llm_score"

    def __init__(self, kind: TaskKind, llm, *, answer_prefix: str = "Action: {", temperature: float = 1.0):
        if not answer_prefix.endswith("{"):
            raise ValueError(f"answer_prefix: the scoring teacher needs it to open the plan with '{{', got "
                             f"{answer_prefix!r}")
        if temperature <= 0:
            raise ValueError(f"temperature: must be > 0, got {temperature}")
        self.kind, self.llm, self.answer_prefix, self.temperature = kind, llm, answer_prefix, temperature
        self.memo: dict[str, PlanDistribution] = {}
        self.records: list[dict] = []

    def plan(self, text: str) -> PlanDistribution:
        if text in self.memo:
            return self.memo[text]
        from llmrl.llm.score import score

        plans = admissible_plans(self.kind, text)
        rendered = self.llm.render(planner_messages(self.kind, text, self.answer_prefix))
        logp = score(self.llm, [rendered], [[p + "}" for p in plans]])[0].logprob
        z = logp / self.temperature
        probs = np.exp(z - z.max())
        probs /= probs.sum()
        dist = PlanDistribution(tuple(plans), tuple(float(x) for x in probs), n_plan=len(plans))
        self.memo[text] = dist
        self.records.append({"text": text, "rendered_prompt": rendered, "plans": plans,
                             "logprob": [float(x) for x in logp], "distribution": asdict(dist)})
        return dist


class UniformPlanner:
    """Control of the scoring teacher: every plan of ``admissible_plans`` with equal probability. The oracle's plan
    is among them, so a student taught by this one learns what the candidate set alone teaches, with no LLM."""

    name = "uniform"

    def __init__(self, kind: TaskKind):
        self.kind = kind

    def plan(self, text: str) -> PlanDistribution:
        plans = admissible_plans(self.kind, text)
        return PlanDistribution(tuple(plans), (1.0 / len(plans),) * len(plans), n_plan=len(plans))


class RandomScorePlanner:
    """Control of the scoring teacher: the ``admissible_plans`` with random scores, probabilities drawn from a flat
    Dirichlet (uniform over the simplex) by a generator seeded with ``seed`` and the text.

    The draw is fixed per text, not per call: the LLM's scores are a fixed function of the text, so a control for
    them must be one too. Scores redrawn at every call would average to the uniform teacher over a state's visits
    and give the student a target that moves between iterations, another difference from the scoring teacher.
    """

    name = "random_score"

    def __init__(self, kind: TaskKind, seed: int = 0):
        if seed < 0:
            raise ValueError(f"seed: must be >= 0, got {seed}")
        self.kind, self.seed = kind, seed

    def plan(self, text: str) -> PlanDistribution:
        plans = admissible_plans(self.kind, text)
        # sha256, not hash(): Python salts str hashes per process, and the draw must not depend on the process
        digest = hashlib.sha256(f"{self.seed}\0{text}".encode()).digest()
        probs = np.random.default_rng(int.from_bytes(digest[:8], "little")).dirichlet(np.ones(len(plans)))
        return PlanDistribution(tuple(plans), tuple(float(x) for x in probs), n_plan=len(plans))


class TablePlanner:
    """Plans replayed from stored distributions (a scoring pass's output): no model at training time."""

    def __init__(self, kind: TaskKind, table: dict[str, PlanDistribution], name: str):
        self.kind, self.table, self.name = kind, table, name

    def plan(self, text: str) -> PlanDistribution:
        if text not in self.table:
            raise KeyError(f"{self.name} planner: no stored distribution for text {text!r} (re-run the planning "
                           "stage)")
        return self.table[text]


def plan_texts(planner: LLMPlanner, texts: Sequence[str], guard: FaultGuard | None = None
               ) -> dict[str, PlanDistribution]:
    """Each text's plan distribution. With ``guard`` (the one behind the planner's backend: ``GuardedBackend``)
    the pass plans ``len(texts) * n_ask`` requests, so the guard fails it with ``LLMOutageError`` as soon as the
    failed replies exceed the policy's share of them, or the deadline passes; a fault within the share stays an
    error record of its text, which takes the fallback plan."""
    texts = list(texts)
    if guard is not None:
        guard.expect(len(texts) * planner.n_ask)
    return {text: planner.plan(text) for text in texts}


Planner = OraclePlanner | LLMPlanner | ScoringPlanner | UniformPlanner | RandomScorePlanner | TablePlanner
