"""Stage kalm_eval@<benchmark>: every KALM policy of one benchmark on each of its test levels, success with
seed-level intervals. One stage per benchmark, so that a benchmark is evaluated (and re-run) without the other's
grounding, imagination and offline runs.

Rows: each offline algorithm of the benchmark trained on real data and on real + imagined data (kalm.offline), a
uniform random policy, and — when KALM-B's llmrl/agents/grounded_policy.py and the model exist — the grounded LLM
acting through its action head: the benchmark's first grounding seed
(models/kalm/grounded/<benchmark>/<kalm.ground.seeds[0]>, the model imagination used; gate 0 covers every seed).
Greedy evaluation, and for a DiscreteBC run also sampled (row ``<algo>-sampled-<data>``: an imitation policy is a
distribution, and its arg-max can fail where its draws succeed). Protocol and aggregation: llmrl.eval.kalm.evaluate_benchmark.

Usage: python -m stages.kalm_eval <benchmark>. Writes metrics/kalm/success/<benchmark>/<row>.json (headline: the
row's success per level and the mean over levels), metrics/kalm/eval/<benchmark>/table.json (per row and level:
success, seed-level interval, per-seed values, episodes, success per goal; the budget, the time and the environment
line; plain out), metrics/kalm/eval/<benchmark>/episodes.json (per-episode outcomes; plain out) and a dvclive bar
plot under plots/kalm/eval/<benchmark>/.
"""

import importlib.util
import time

from llmrl.config.kalm import DATA_KINDS, KalmEnvParams, KalmEvalParams, KalmGroundParams, KalmOfflineParams
from llmrl.data.embeddings import EmbeddingTable
from llmrl.envs.kalm_levels import EnvSettings
from llmrl.eval.headline import metrics_entry
from llmrl.eval.kalm import evaluate_benchmark
from llmrl.fingerprint import fingerprint_line
from llmrl.files import atomic_path, write_json
from stages import paths
from stages.common import log, open_live, stage_arguments, stage_params


def grounded_agent(benchmark: str):
    """KALM-B's LLM-as-policy from the benchmark's first grounding seed, if built: an object with
    ``policy(goal) -> harness Policy``; else None."""
    if importlib.util.find_spec("llmrl.agents.grounded_policy") is None:
        return None
    from llmrl.agents.grounded_policy import GroundedAgent

    seed = stage_params("kalm.ground", KalmGroundParams).seeds[0]
    folder = paths.kalm_ground(benchmark, seed).model
    return GroundedAgent.load({benchmark: folder}) if folder.is_dir() else None


def main(argv: list[str] | None = None) -> None:
    args = stage_arguments("kalm_eval", argv, benchmark="babyai or metaworld")
    benchmark = args.benchmark
    p = stage_params("kalm.eval", KalmEvalParams)
    off = stage_params("kalm.offline", KalmOfflineParams)
    env_p = stage_params("kalm.env", KalmEnvParams)
    benchmarks = sorted({a.benchmark for a in off.algos.values()})
    if benchmark not in benchmarks:
        raise SystemExit(f"kalm_eval: benchmark {benchmark!r} has no run in kalm.offline.algos ({benchmarks})")
    out = paths.kalm_eval(benchmark)
    runs = [(f"{name}-{data}", paths.kalm_offline(benchmark, name, data).models / f"seed-{seed}" / "model.d3")
            for name, algo in off.algos.items() if algo.benchmark == benchmark
            for data in DATA_KINDS for seed in off.seeds]
    agent = grounded_agent(benchmark) if p.grounded_episodes else None
    if agent is None:
        log.warning("%s: no grounded LLM policy (llmrl/agents/grounded_policy.py or the first grounding seed's "
                    "model missing): row left out", benchmark)
    start = time.perf_counter()
    result = evaluate_benchmark(
        benchmark, offline_runs=runs, table=EmbeddingTable.load(paths.kalm_data().real / "embeddings.npz"),
        levels=p.levels, settings=EnvSettings.for_benchmark(env_p, benchmark),
        episodes=p.metaworld_episodes if benchmark == "metaworld" else p.babyai_episodes,
        first_seed=p.seed, random_seeds=p.random_seeds, confidence=p.confidence, grounded=agent,
        grounded_episodes=p.grounded_episodes, threads=p.threads)
    seconds = time.perf_counter() - start
    budget = {"episodes_per_level_and_seed_at_least": (p.metaworld_episodes if benchmark == "metaworld"
                                                       else p.babyai_episodes), "seconds": round(seconds, 1)}
    rows = result["rows"]
    with atomic_path(out.eval, is_dir=True) as folder:
        write_json(folder / "table.json", {"benchmark": benchmark, "rows": rows, "budget": budget, "levels": p.levels,
                                           "grounded_llm": "grounded-llm" in result["headline"],
                                           "env": fingerprint_line()})
        write_json(folder / "episodes.json", result["episodes"])
    with atomic_path(out.success, is_dir=True) as folder:  # one file per row: a row of dvc metrics show
        for row, success in result["headline"].items():
            write_json(folder / f"{row}.json", metrics_entry(success))
    with open_live(out.live) as live:
        live.log_plot("success_by_policy", [{"policy": f"{r['level']}: {r['row']}", "success_rate": r["value"]}
                                            for r in rows],
                      x="success_rate", y="policy", template="bar_horizontal",
                      title=f"KALM on {benchmark}: success rate per level (mean over training seeds)")
    log.info("kalm_eval@%s done in %.1fs", benchmark, seconds)


if __name__ == "__main__":
    main()
