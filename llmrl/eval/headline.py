"""The headline entry of a metrics file: one small, shared vocabulary for every method.

Every evaluation stage writes one metrics file per agent (``metrics/<method>/eval/<agent>.json``) with, per
mode, the same keys, so ``dvc metrics show`` prints one row per agent and a handful of columns in total::

    {"greedy": {"success": 0.97, "success_lo": 0.94, "success_hi": 0.98, "return": 0.81,
                "return_lo": ..., "return_hi": ..., "seeds": 3, "episodes": 300}, "sampled": {...}}

Intervals come from ``llmrl.eval.seeds.aggregate_seeds`` (seeds as the unit; one seed gives an episode-level
interval and ``seeds: 1`` says so; success intervals contain the pooled Wilson interval, so 0 of 100 is
reported as [0, 0.037], not [0, 0]). A metrics file holds numbers only (``metrics_entry`` refuses anything else):
the environment line, dtypes, per-seed values, verdicts, per-episode tables and prompts go to the stage's plain outs.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmrl.eval.harness import EvalResult
from llmrl.eval.seeds import aggregate_seeds

__all__ = ["HEADLINE_KEYS", "headline", "headline_of_results", "headline_part", "metrics_entry"]

# The keys of one mode's headline: what ``dvc metrics show`` lists for every agent of every method.
HEADLINE_KEYS = ("success", "success_lo", "success_hi", "return", "return_lo", "return_hi", "seeds", "episodes")


def headline(per_seed_success: Sequence[Sequence[float]], per_seed_return: Sequence[Sequence[float]] | None = None,
             *, digits: int = 4, reps: int = 2000) -> dict:
    """``success``/``return`` with seed-level intervals, seed and episode counts."""
    s = aggregate_seeds(per_seed_success, reps=reps, rate=True)
    out = {"success": round(s.value, digits), "success_lo": round(s.ci_low, digits),
           "success_hi": round(s.ci_high, digits)}
    if per_seed_return is not None:
        r = aggregate_seeds(per_seed_return, reps=reps)
        out.update({"return": round(r.value, digits), "return_lo": round(r.ci_low, digits),
                    "return_hi": round(r.ci_high, digits)})
    out.update({"seeds": s.n_seeds, "episodes": int(sum(s.episodes))})
    return out


def headline_of_results(results: Sequence[EvalResult], **kw) -> dict:
    """The headline of one agent in one mode, from one ``EvalResult`` per training seed."""
    if not results:
        raise ValueError("headline_of_results: no results")
    modes = {r.mode for r in results}
    if len(modes) != 1:
        raise ValueError(f"headline_of_results: results mix modes {sorted(modes)}; report greedy and sampled apart")
    return headline([[float(e.success) for e in r.episodes] for r in results],
                    [[e.episode_return for e in r.episodes] for r in results], **kw)


def headline_part(entry: dict) -> dict:
    """The ``HEADLINE_KEYS`` of one mode's entry (a richer entry, e.g. ``llmrl.eval.llm_rl.accuracy_entry``, keeps
    the rest for a plain output)."""
    return {k: entry[k] for k in HEADLINE_KEYS if k in entry}


def _leaves(node, path: str = ""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{path}.{key}" if path else str(key))
    else:
        yield path, node


def metrics_entry(modes: dict[str, dict], **extra) -> dict:
    """A per-agent metrics file: the headline per mode and any extra headline figures (``aulc``, ``beats_random``).
    Numbers and booleans only, so ``dvc metrics show`` lists them as columns; anything else is a ``ValueError``
    naming it (the stage's plain outputs take it)."""
    entry = {**modes, **extra}
    other = [f"{key}={value!r}" for key, value in _leaves(entry)
             if isinstance(value, str) or not isinstance(value, (int, float, bool))]
    if other:
        raise ValueError(f"metrics_entry: not a number: {', '.join(other)}; a metrics file holds headline figures "
                         "only (write the rest to a plain output)")
    return entry
