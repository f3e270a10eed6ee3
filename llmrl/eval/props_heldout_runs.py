"""The searches of the held-out test (``llmrl.eval.props_heldout`` scores them): an LLM optimizer's runs, the
baselines' runs and hill climbing's step tuned on validation functions.

Every method spends the same evaluations per search (``search.iterations``) on the same test functions. An LLM
optimizer runs ``props_search``'s own loop (same prompt, parser, re-asks and fallback), all functions of a dimension
in lockstep; sampling stream ``rep`` (the tuned adapter of the i-th training seed samples stream i, as base
repetition i does: paired by stream where both exist). A run is one method's search of one function: its rows, its
best point and score (``gap_closed``) and, for an LLM, its reply counters.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from llmrl.algos.blackbox import cem, hill_climb, random_search
from llmrl.algos.props_function_search import function_task, search_budget
from llmrl.algos.props_search import props_search
from llmrl.envs.functions import FunctionTask, gap_closed

if TYPE_CHECKING:
    import logging

    from llmrl.algos.props_search import OptimizerLLM
    from llmrl.config.props import PropsGRPOParams, PropsHeldoutParams, PropsLLMParams, PropsSearchParams, \
        PropsSpaceParams

__all__ = ["BASELINES", "function_task", "search_budget", "run_entry", "optimizer_runs", "tune_hill_step",
           "baseline_runs"]

BASELINES = ("random_search", "hill_climb", "cem")


def run_entry(task: FunctionTask, space: PropsSpaceParams, method: str, rep: int, state, rows: Sequence[dict]) -> dict:
    """One run's record: its function, best value and score, best point, rows, and an LLM's reply counters."""
    fn = task.function(state.seed)
    best = float(state.best_return)
    entry = {"method": method, "rep": rep, "dim": task.n_params, "function": int(state.seed), "family": fn.family,
             "best_return": best, "score": round(gap_closed(best, fn, space.low, space.high), 6),
             "best_params": [float(x) for x in state.best_params],
             "rows": [r for r in rows if r["seed"] == state.seed]}
    if hasattr(state, "counters"):
        entry.update(state.counters())
    return entry


def optimizer_runs(optimizer: OptimizerLLM, method: str, rep: int, g: PropsGRPOParams, h: PropsHeldoutParams,
                   search: PropsSearchParams, space: PropsSpaceParams, llm_p: PropsLLMParams,
                   log: logging.Logger | None = None) -> tuple[list[dict], list[dict]]:
    """One LLM optimizer's search of every test function, on sampling stream ``rep``: (runs, records), a record
    per search iteration with its prompts, replies and parse results."""
    budget = search_budget(search, h)
    seeds = list(range(h.functions_per_dim))
    runs: list[dict] = []
    records: list[dict] = []
    for dim in h.dims:
        task = function_task("test", dim, g)
        states: list = []
        start = time.perf_counter()
        rows = list(props_search(task, ["props"], seeds, optimizer, budget, space, llm_p, states_out=states, rep=rep))
        mine = [run_entry(task, space, method, rep, st, rows) for st in states]
        runs += mine
        for st in states:
            records += [{"method": method, "rep": rep, "dim": dim, "function": st.seed, **r} for r in st.records]
        if log is not None:
            log.info("%s rep %d, %d-d: %.0f s, mean score %.3f, parse failures %d / %d replies", method, rep, dim,
                     time.perf_counter() - start, np.mean([r["score"] for r in mine]),
                     sum(s.parse_failures for s in states), sum(s.llm_calls for s in states))
    return runs, records


def tune_hill_step(g: PropsGRPOParams, h: PropsHeldoutParams, search: PropsSearchParams,
                   space: PropsSpaceParams) -> tuple[float, dict[str, float]]:
    """Hill climbing's step: the one of ``h.hill_steps`` with the best mean score on the validation functions (over
    dimensions and ``h.reps`` random streams); returns it and every step's score."""
    budget = search_budget(search, h)
    vseeds = list(range(h.validation_functions_per_dim))
    tuning = {}
    for step in h.hill_steps:
        scores = []
        for dim in h.dims:
            task = function_task("validation", dim, g)
            for rep in range(h.reps):
                found = []
                rows = list(hill_climb(task, vseeds, budget.model_copy(update={"seeds": vseeds}), space, step,
                                       states_out=found, rep=rep))
                scores += [run_entry(task, space, "hill_climb", rep, st, rows)["score"] for st in found]
        tuning[str(step)] = round(float(np.mean(scores)), 4)
    return float(max(h.hill_steps, key=lambda s: tuning[str(s)])), tuning


def baseline_runs(hill_step: float, g: PropsGRPOParams, h: PropsHeldoutParams, search: PropsSearchParams,
                  space: PropsSpaceParams) -> list[dict]:
    """Random search, hill climbing (at ``hill_step``) and CEM on every test function, ``h.reps`` random streams
    each."""
    budget = search_budget(search, h)
    seeds = list(range(h.functions_per_dim))
    b = budget.model_copy(update={"seeds": seeds})
    runs = []
    for method in BASELINES:
        for dim in h.dims:
            task = function_task("test", dim, g)
            for rep in range(h.reps):
                found = []
                gen = (random_search(task, seeds, b, space, states_out=found, rep=rep) if method == "random_search"
                       else hill_climb(task, seeds, b, space, hill_step, states_out=found, rep=rep)
                       if method == "hill_climb" else cem(task, seeds, b, space, h.cem, states_out=found, rep=rep))
                rows = list(gen)
                runs += [run_entry(task, space, method, rep, st, rows) for st in found]
    return runs
