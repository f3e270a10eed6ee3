"""One evaluation harness for every policy: fixed seeds, rates with confidence intervals."""

from llmrl.eval.harness import EpisodeRecord, EvalResult, Policy, evaluate
from llmrl.eval.seeds import SeedAggregate, aggregate_seeds
from llmrl.eval.stats import mean_interval, wilson_interval

__all__ = ["EpisodeRecord", "EvalResult", "Policy", "SeedAggregate", "aggregate_seeds", "evaluate", "mean_interval",
           "wilson_interval"]
