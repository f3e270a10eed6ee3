"""The ProPS search on the function families (``llmrl.envs.functions``): which functions a split searches and the
search settings of the held-out test, shared by the test's runs (``llmrl.eval.props_heldout_runs``) and by GRPO's
examples from the search's own turns (``llmrl.algos.props_grpo_functions``)."""

from __future__ import annotations

from llmrl.config.props import PropsGRPOParams, PropsHeldoutParams, PropsSearchParams
from llmrl.envs.functions import FunctionTask

__all__ = ["function_task", "search_budget"]


def function_task(split: str, dim: int, g: PropsGRPOParams) -> FunctionTask:
    """The ``split`` functions of dimension ``dim`` in the families GRPO trains on."""
    f = g.functions
    return FunctionTask(split, dim, step_size=f.step_size, centre_range=f.centre_range, curvature=tuple(f.curvature))


def search_budget(search: PropsSearchParams, h: PropsHeldoutParams) -> PropsSearchParams:
    """props_search's settings for one held-out search: the test's evaluations and prompt budget, one episode per
    evaluation (a function has no episodes)."""
    return search.model_copy(update={"tasks": ["quadratic"], "methods": ["props"], "iterations": h.iterations,
                                     "episodes_per_eval": 1, "prompt_token_budget": h.prompt_token_budget})
