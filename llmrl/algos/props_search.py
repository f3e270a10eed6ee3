"""ProPS: an LLM proposes policy parameters from the history of (parameters, mean return); no gradient step.

Per iteration, for K independent searches (seeds × methods) advancing in lockstep:
1. render each search's chat (``props_prompts.search_messages``: the one ProPS system message and the user
   prompt) from its history, dropping the oldest entries until it fits ``prompt_token_budget`` tokens of the
   model's own tokenizer with the chat template applied;
2. ask the LLM for all K chats in one batched call per method (the chat template is always applied:
   ``generate``/the chat endpoint do it), each reply capped at ``reply_token_cap`` tokens unless
   ``max_new_tokens`` says more;
3. parse each reply strictly (``parse_reply``); a search whose reply is unusable gets its reply and a
   correction message appended to its conversation and is re-asked (all such searches again in one batch),
   up to ``max_reasks`` times;
4. a search still without a proposal, or whose LLM call failed (HTTP error, timeout, connection: an
   ``LLM_FAULTS`` exception), proposes the fallback: a uniform random point of the parameter space from the
   search's own generator. A programming error, or an offline reply-cache miss, is not a fault and raises;
   so does ``LLMOutageError``: past the fault policy's share of failed requests or its deadline
   (``props.llm.faults``, ``llmrl.llm.faults``) the search ends and its stage writes nothing;
5. all K proposals are evaluated together, each over ``episodes_per_eval`` episodes (``objective_for``: the
   task's environment at its horizon, or the quadratic's exact f), and appended to their histories.

Every prompt, reply, parse result, re-ask, fault and fallback is recorded in ``SearchState.records``.
``props_search`` yields one metrics row per search per iteration with the shared vocabulary (``step``,
``episodes``, ``return_mean``) and ProPS's own: ``proposal`` ("llm" or "fallback": where this iteration's point
came from; "replaced" in the repeats control), ``best_return`` and the cumulative counters ``llm_proposals`` (iterations whose point the LLM made),
``llm_calls``, ``tokens``, ``reasks``, ``parse_failures``, ``example_copies`` (replies that copied the format's
placeholder), ``parse_errors`` (failures by reason), ``duplicates``, ``faults``, ``fallbacks``, and ``seconds``.

Episode seeds: search seed s, iteration i (1-based), episode e uses ``s * 1_000_000 + (i - 1) * E + e``; every
method uses the same episode seeds for the same search seed (common random numbers). Held-out evaluation seeds
start at ``eval_seed`` (10,000,000 by default), disjoint from them (checked).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from llmrl.agents.linear_policy import ParamEvaluator, objective_for
from llmrl.algos.props_prompts import (
    PARSE_ERRORS,
    PromptSettings,
    chat_token_counter,
    parse_reply,
    render_correction,
    reply_token_cap,
    search_messages,
    trim_history,
)
from llmrl.config.props import PropsLLMParams, PropsSearchParams, PropsSpaceParams
from llmrl.envs.control import ControlTask, QuadraticTask, get_task
from llmrl.envs.functions import FunctionTask
from llmrl.llm.backends import Backend, CachedBackend, LocalBackend, ReplyCache, llm_fault_types, openai_backend
from llmrl.llm.faults import FaultGuard, GuardedBackend
from llmrl.llm.generate import SamplingConfig

__all__ = ["SEED_STRIDE", "SearchState", "search_task", "episode_seeds", "held_out_seeds", "HeldOutEvaluation",
           "random_point", "OptimizerLLM", "build_optimizer_llm", "reply_cap", "props_search", "single_search"]

SEED_STRIDE = 1_000_000
TEMPLATES = {"props": "numeric", "props_plus": "semantic"}


LLM_FAULTS = llm_fault_types()


@dataclass
class SearchState:
    """One search: its history, best point, counters and the record of every exchange."""

    method: str
    seed: int
    rng: np.random.Generator
    history: list[tuple[np.ndarray, float]] = field(default_factory=list)
    best_params: np.ndarray | None = None
    best_return: float = -np.inf
    episodes: int = 0
    llm_proposals: int = 0
    llm_calls: int = 0
    prompt_tokens: int = 0
    tokens: int = 0
    reasks: int = 0
    parse_failures: int = 0
    example_copies: int = 0
    parse_errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PARSE_ERRORS, 0))
    duplicates: int = 0
    faults: int = 0
    fallbacks: int = 0
    dropped_history: int = 0
    records: list[dict] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.method}-{self.seed}"

    @property
    def current(self) -> np.ndarray | None:
        return self.history[-1][0] if self.history else None

    def counters(self) -> dict:
        return {"llm_proposals": self.llm_proposals, "llm_calls": self.llm_calls, "tokens": self.tokens,
                "prompt_tokens": self.prompt_tokens, "reasks": self.reasks, "parse_failures": self.parse_failures,
                "example_copies": self.example_copies, "parse_errors": dict(self.parse_errors),
                "duplicates": self.duplicates, "faults": self.faults, "fallbacks": self.fallbacks}


def search_task(search: PropsSearchParams,
                task: str | ControlTask | QuadraticTask | FunctionTask) -> ControlTask | QuadraticTask | FunctionTask:
    """The task a search runs: a task object as it is (at its horizon), a control task's key at the horizon
    ``search.max_episode_steps`` gives it (its own limit if none)."""
    if isinstance(task, (ControlTask, QuadraticTask, FunctionTask)):
        return task
    return get_task(task, search.max_episode_steps.get(task))


def episode_seeds(seed: int, iteration: int, episodes: int) -> np.ndarray:
    """Seeds of the ``episodes`` evaluation episodes of iteration ``iteration`` (1-based) of search ``seed``."""
    start = seed * SEED_STRIDE + (iteration - 1) * episodes
    return np.arange(start, start + episodes)


def check_seed_ranges(seeds: Sequence[int], iterations: int, episodes: int, eval_seed: int) -> None:
    """Search episodes must fit their stride and stay below the held-out evaluation seeds."""
    if iterations * episodes > SEED_STRIDE:
        raise ValueError(f"iterations × episodes_per_eval = {iterations * episodes} exceeds {SEED_STRIDE} seeds")
    top = (max(seeds) + 1) * SEED_STRIDE
    if top > eval_seed:
        raise ValueError(f"eval_seed {eval_seed} overlaps the search episode seeds (up to {top}); "
                         f"use seeds < {eval_seed // SEED_STRIDE} or a larger eval_seed")


def held_out_seeds(search: PropsSearchParams) -> np.ndarray:
    """Seeds of the held-out evaluation of every run's final policy (disjoint from all search episodes)."""
    return np.arange(search.eval_seed, search.eval_seed + search.eval_episodes)


class HeldOutEvaluation:
    """The held-out evaluation of a run's final policy, the same for every method of a table: its return in each
    episode of the held-out seeds (``held_out_seeds``), at the task's horizon. A context manager (it holds the
    task's environments)."""

    def __init__(self, task: ControlTask, search: PropsSearchParams):
        self.seeds = held_out_seeds(search)
        self._evaluator = ParamEvaluator(task)

    def __call__(self, params: Sequence[float] | np.ndarray) -> list[float]:
        return [float(x) for x in self._evaluator.returns(params, self.seeds)[0]]

    def close(self) -> None:
        self._evaluator.close()

    def __enter__(self) -> HeldOutEvaluation:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def random_point(rng: np.random.Generator, n: int, space: PropsSpaceParams) -> np.ndarray:
    """The fallback proposal: uniform in the space, rounded to the prompt's decimals."""
    return np.round(rng.uniform(space.low, space.high, size=n), space.decimals)


def _model_fingerprint(spec: str, adapter: str | None) -> str:
    """Content hash of a model folder's weights (and adapter), so the reply cache never mixes models."""
    h = hashlib.sha256()
    for folder in [spec, adapter]:
        if folder and Path(folder).is_dir():
            for f in sorted(Path(folder).glob("*.safetensors")):
                h.update(f.name.encode())
                with f.open("rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 22), b""):
                        h.update(chunk)
        elif folder:
            h.update(folder.encode())
    return h.hexdigest()[:16]


@dataclass
class OptimizerLLM:
    """The backend to ask, the counter that measures prompts in the model's own tokens, and that tokenizer."""

    backend: Backend
    count_tokens: object  # Callable[[str | list[dict]], int]
    label: str
    tokenizer: object = None  # the model's tokenizer: sizes the reply cap
    guard: FaultGuard | None = None  # the stage's fault policy over the backend (props_search plans its requests)

def build_optimizer_llm(
    p: PropsLLMParams,
    *,
    cache_dir: str | Path | None,
    adapter: str | Path | None = None,
    llm=None,
    guard: FaultGuard | None = None,
) -> OptimizerLLM:
    """Backend from params: a local model (optionally with a peft adapter) or an OpenAI-compatible endpoint,
    under the fault policy ``guard`` (by default one of ``p.faults``; a stage asking several optimizers passes
    one for all), wrapped in the content-addressed reply cache when ``cache_dir`` is given. ``llm`` reuses a
    loaded model."""
    from llmrl.llm.load import load_model, load_tokenizer, reply_tag

    adapter = str(adapter) if adapter else None
    guard = guard or FaultGuard(p.faults, "props.llm.faults")
    if p.backend == "local":
        if llm is None:
            llm = load_model(p.spec, dtype=p.dtype)
            if adapter:
                from llmrl.llm.load import load_adapter

                llm.model = load_adapter(llm.model, adapter)  # its checksums checked first
                llm.model.eval()
        backend: Backend = LocalBackend(llm, batch_size=p.batch_size, shared_prefix=True)
        backend.model_id = f"local-shared-prefix:{p.spec}" + (f"+{adapter}" if adapter else "") + \
            f"@{_model_fingerprint(p.spec, adapter)}{reply_tag(llm.dtype)}"
        tokenizer = llm.tokenizer
    else:
        if adapter:
            raise ValueError("an adapter applies to a local model only (serve base+adapter behind the endpoint)")
        tokenizer = llm.tokenizer if llm is not None else load_tokenizer(p.spec)
        backend = openai_backend(p.api, p.model, p.base_url, tokenizer=tokenizer, api_key_env=p.api_key_env,
                                 guard=guard)
    backend = GuardedBackend(backend, guard)
    if cache_dir is not None:
        backend = CachedBackend(backend, ReplyCache(cache_dir), offline=p.offline)
    return OptimizerLLM(backend, chat_token_counter(tokenizer), backend.model_id, tokenizer, guard)


def reply_cap(optimizer: OptimizerLLM, p: PropsLLMParams, n_params: int, space: PropsSpaceParams) -> int:
    """The reply token cap: what a complete answer of ``n_params`` values needs (``reply_token_cap``), or
    ``p.max_new_tokens`` where set, which must not be smaller."""
    need = reply_token_cap(optimizer.tokenizer, n_params, space.low, space.high, space.decimals)
    if p.max_new_tokens is None:
        return need
    if p.max_new_tokens < need:
        raise ValueError(f"props.llm.max_new_tokens: {p.max_new_tokens} cannot hold a complete answer of {n_params} "
                         f"values ({need} tokens); raise it or leave it unset")
    return p.max_new_tokens


def sampling_for(p: PropsLLMParams, iteration: int, attempt: int, max_new_tokens: int, rep: int = 0) -> SamplingConfig:
    return SamplingConfig(max_new_tokens=max_new_tokens, temperature=p.temperature, top_p=p.top_p,
                          stop=("\n",) if p.stop_at_newline else (), seed=iteration * 100 + attempt + rep * 1_000_003)


def _with_prefix(conv: list[dict], prefix: str) -> list[dict]:
    return conv + [{"role": "assistant", "content": prefix}] if prefix else conv


def props_search(
    task: str | ControlTask | QuadraticTask,
    methods: Sequence[str],
    seeds: Sequence[int],
    optimizer: OptimizerLLM,
    search: PropsSearchParams,
    space: PropsSpaceParams,
    llm_params: PropsLLMParams,
    *,
    iterations: int | None = None,
    states_out: list[SearchState] | None = None,
    rep: int = 0,
    repeats: Literal["keep", "random"] = "keep",
) -> Iterator[dict]:
    """Run len(methods) × len(seeds) searches in lockstep; yield one row per search per iteration.

    ``repeats="random"`` is a control, not ProPS: an LLM proposal that repeats a point of its history is evaluated
    as a uniform random point instead (``proposal`` "replaced", drawn from a stream of its own, so the fallbacks
    stay those of ``"keep"``). It asks how much of an optimizer's result the repeats alone cost it.

    ``rep`` > 0 samples the replies and the fallbacks from further streams: another run of the same searches
    (repetition 0 keeps the streams of runs made before ``rep`` existed).

    ``task``: a task object (at its horizon) or a control task's key (at ``search.max_episode_steps``' horizon).
    The final ``SearchState`` objects (histories, best points, records) are appended to ``states_out``.
    """
    if repeats not in ("keep", "random"):
        raise ValueError(f"repeats: {repeats!r} is neither 'keep' nor 'random'")
    t = search_task(search, task)
    if isinstance(t, (QuadraticTask, FunctionTask)) and "props_plus" in methods:
        raise ValueError(f"methods: props_plus describes an environment; the task {t.key!r} has none (use props)")
    n_iter = iterations or search.iterations
    if not isinstance(t, FunctionTask):  # a function's search seed names the function: it draws no episodes
        check_seed_ranges(seeds, n_iter, search.episodes_per_eval, search.eval_seed)
    evaluator = objective_for(t)
    policy = evaluator.policy
    n = policy.n_params
    try:
        max_new_tokens = reply_cap(optimizer, llm_params, n, space)
    except ValueError:
        evaluator.close()
        raise
    optimum = t.optimum if search.optimum_hint else None
    settings = PromptSettings(low=space.low, high=space.high, decimals=space.decimals,
                              step_size=search.step_size.get(t.key, t.step_size), optimum=optimum,
                              episodes=search.episodes_per_eval)
    # The fallback stream depends on (method, seed) only, so a search draws the same points alone or batched.
    states = [SearchState(m, s, np.random.default_rng([s, 7919, list(TEMPLATES).index(m)] + ([rep] if rep else [])))
              for m in methods for s in seeds]
    replacements = {id(st): np.random.default_rng([st.seed, 104729, list(TEMPLATES).index(st.method)])
                    for st in states} if repeats == "random" else {}
    if states_out is not None:
        states_out.extend(states)
    if optimizer.guard is not None:  # a fault-free run asks at least one request per search and iteration
        optimizer.guard.expect(n_iter * len(states))
    try:
        for it in range(1, n_iter + 1):
            t0 = time.perf_counter()
            convs: list[list[dict]] = []
            recs: list[dict] = []
            for st in states:
                render = lambda hist, st=st: search_messages(  # noqa: E731
                    TEMPLATES[st.method], task=t, policy=policy, history=hist, iteration=it,
                    total_iterations=n_iter, settings=settings)
                chat, dropped, n_tok = trim_history(render, st.history, optimizer.count_tokens,
                                                    search.prompt_token_budget)
                st.dropped_history = dropped
                convs.append(chat)
                recs.append({"iteration": it, "search": st.name, "prompt_tokens": n_tok, "history_dropped": dropped,
                             "exchanges": []})
            proposals: list[np.ndarray | None] = [None] * len(states)
            pending = list(range(len(states)))
            for attempt in range(search.max_reasks + 1):
                if not pending:
                    break
                sampling = sampling_for(llm_params, it, attempt, max_new_tokens, rep)
                try:
                    # One call per method: its seeds' prompts share the template, which a shared-prefix local
                    # backend computes once.
                    gens = {}
                    for group in ([i for i in pending if states[i].method == m] for m in methods):
                        if group:
                            gens.update(zip(group, optimizer.backend.generate(
                                [_with_prefix(convs[i], llm_params.answer_prefix) for i in group], sampling)))
                except LLM_FAULTS as err:
                    for i in pending:
                        states[i].faults += 1
                        recs[i]["exchanges"].append({"attempt": attempt, "fault": f"{type(err).__name__}: {err}"})
                    break
                still = []
                for i in pending:
                    st, gen = states[i], gens[i]
                    st.llm_calls += 1
                    st.tokens += gen.n_tokens
                    st.prompt_tokens += optimizer.count_tokens(convs[i])
                    if attempt:
                        st.reasks += 1
                    reply = llm_params.answer_prefix + gen.text
                    parsed = parse_reply(reply, n, space.low, space.high, current=st.current)
                    recs[i]["exchanges"].append({"attempt": attempt, "messages": convs[i], "reply": reply,
                                                 "finish_reason": gen.finish_reason, "n_tokens": gen.n_tokens,
                                                 "parse": parsed.as_record()})
                    if parsed.ok:
                        proposals[i] = parsed.params
                    else:
                        st.parse_failures += 1
                        st.parse_errors[parsed.error] += 1
                        st.example_copies += parsed.error == "example_copy"
                        convs[i] = convs[i] + [
                            {"role": "assistant", "content": reply},
                            {"role": "user", "content": render_correction(parsed.detail, n_params=n, low=space.low,
                                                                          high=space.high, current=st.current)},
                        ]
                        still.append(i)
                pending = still
            origin = []
            for i, st in enumerate(states):
                if proposals[i] is None:
                    st.fallbacks += 1
                    proposals[i] = random_point(st.rng, n, space)
                    recs[i]["fallback"] = [float(x) for x in proposals[i]]
                    origin.append("fallback")
                elif any(np.array_equal(proposals[i], h) for h, _ in st.history):
                    st.duplicates += 1
                    if replacements:
                        recs[i]["repeated"] = [float(x) for x in proposals[i]]
                        proposals[i] = random_point(replacements[id(st)], n, space)
                        origin.append("replaced")
                    else:
                        st.llm_proposals += 1
                        origin.append("llm")
                else:
                    st.llm_proposals += 1
                    origin.append("llm")
            seeds_mat = np.stack([episode_seeds(st.seed, it, search.episodes_per_eval) for st in states])
            returns = evaluator.returns(np.stack(proposals), seeds_mat, search_seeds=[st.seed for st in states])
            seconds = time.perf_counter() - t0
            for i, st in enumerate(states):
                mean = float(returns[i].mean())
                st.history.append((proposals[i], mean))
                st.episodes += search.episodes_per_eval
                if mean > st.best_return:
                    st.best_return, st.best_params = mean, proposals[i]
                recs[i].update(params=[float(x) for x in proposals[i]], proposal=origin[i], return_mean=mean,
                               returns=[float(x) for x in returns[i]])
                st.records.append(recs[i])
                yield {"task": t.key, "method": st.method, "seed": st.seed, "step": it, "episodes": st.episodes,
                       "return_mean": mean, "proposal": origin[i], "best_return": st.best_return, **st.counters(),
                       "seconds": seconds}
    finally:
        evaluator.close()


def single_search(task: ControlTask, method: str, label: str, seed: int, optimizer: OptimizerLLM,
                  search: PropsSearchParams, space: PropsSpaceParams, llm_params: PropsLLMParams, *,
                  adapter: str | None = None, repeats: Literal["keep", "random"] = "keep") -> dict:
    """One search of ``method``'s template alone (not batched with other seeds: a search's replies depend on which
    prompts share its batch) and its held-out evaluation, as a run record named ``label``: its rows, best point,
    LLM counters and held-out returns."""
    states: list[SearchState] = []
    rows = [{**row, "method": label} for row in props_search(task, [method], [seed], optimizer, search, space,
                                                              llm_params, states_out=states, repeats=repeats)]
    st = states[0]
    with HeldOutEvaluation(task, search) as held_out:
        return {"task": task.key, "method": label, "seed": seed, "adapter": adapter, "rows": rows,
                "best_return": st.best_return, "final_params": [float(x) for x in st.best_params],
                "final_eval": held_out(st.best_params), **st.counters()}
