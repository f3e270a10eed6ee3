"""Stage kalm_eval: every KALM policy on every test level of its benchmark, success with seed-level intervals.

Rows per benchmark: each offline algorithm trained on real data and on real + imagined data (kalm.offline),
a uniform random policy, and — when KALM-B's llmrl/agents/grounded_policy.py and the models exist — the
grounded LLM acting through its action head: each benchmark's first grounding seed
(models/kalm/grounded/<benchmark>/<kalm.ground.seeds[0]>, the model imagination used; gate 0 covers every seed).
Greedy evaluation. The two benchmarks run in parallel processes (kalm.eval.workers). Protocol and aggregation: llmrl.eval.kalm.evaluate_benchmark.

Writes metrics/kalm/success/<benchmark>/<row>.json (headline: the row's success per level and the mean over
levels), metrics/kalm/eval/table.json (per row and level: success, seed-level interval, per-seed values, episodes,
success per goal; the budget, the time and the environment line; plain out), metrics/kalm/eval/episodes.json
(per-episode outcomes; plain out) and a dvclive bar plot.
"""

import importlib.util
import logging
import time
from concurrent.futures import ProcessPoolExecutor

from llmrl.config.kalm import KalmEnvParams, KalmEvalParams, KalmGroundParams, KalmOfflineParams
from llmrl.data.embeddings import EmbeddingTable
from llmrl.envs.kalm_levels import EnvSettings
from llmrl.eval.headline import metrics_entry
from llmrl.eval.kalm import evaluate_benchmark
from llmrl.fingerprint import fingerprint_line
from llmrl.files import atomic_path, write_json
from stages import paths
from stages.common import log, open_live, stage_arguments, stage_params

OUT = paths.kalm_eval()


def grounded_agent(benchmarks):
    """KALM-B's LLM-as-policy from each benchmark's first grounding seed, if built: an object with
    ``policy(goal) -> harness Policy``; else None."""
    if importlib.util.find_spec("llmrl.agents.grounded_policy") is None:
        return None
    from llmrl.agents.grounded_policy import GroundedAgent

    seed = stage_params("kalm.ground", KalmGroundParams).seeds[0]
    folders = {b: paths.kalm_ground(b, seed).model for b in benchmarks}
    present = {b: f for b, f in folders.items() if f.is_dir()}
    return GroundedAgent.load(present) if present else None


def run_benchmark(benchmark: str) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    p = stage_params("kalm.eval", KalmEvalParams)
    off = stage_params("kalm.offline", KalmOfflineParams)
    env_p = stage_params("kalm.env", KalmEnvParams)
    runs = [(f"{name}-{data}", paths.kalm_offline(name, data).models / f"seed-{seed}" / "model.d3")
            for name, algo in off.algos.items() if algo.benchmark == benchmark
            for data in off.data for seed in off.seeds]
    agent = grounded_agent([benchmark]) if p.grounded_episodes else None
    if agent is None:
        log.warning("%s: no grounded LLM policy (llmrl/agents/grounded_policy.py or the first grounding seed's "
                    "model missing): row left out", benchmark)
    return evaluate_benchmark(
        benchmark, offline_runs=runs, table=EmbeddingTable.load(paths.kalm_data().real / "embeddings.npz"),
        levels=p.levels, settings=EnvSettings.for_benchmark(env_p, benchmark),
        episodes=p.metaworld_episodes if benchmark == "metaworld" else p.babyai_episodes,
        first_seed=p.seed, random_seeds=p.random_seeds, confidence=p.confidence, grounded=agent,
        grounded_episodes=p.grounded_episodes, threads=p.threads)


def main(argv: list[str] | None = None) -> None:
    stage_arguments("kalm_eval", argv)
    p = stage_params("kalm.eval", KalmEvalParams)
    off = stage_params("kalm.offline", KalmOfflineParams)
    benchmarks = sorted({a.benchmark for a in off.algos.values()})
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=min(p.workers, len(benchmarks))) as pool:
        results = dict(zip(benchmarks, pool.map(run_benchmark, benchmarks)))
    seconds = time.perf_counter() - start
    budget = {"babyai_episodes_per_level_and_seed_at_least": p.babyai_episodes,
              "metaworld_episodes_per_level_and_seed_at_least": p.metaworld_episodes, "seconds": round(seconds, 1),
              "seconds_per_benchmark": {b: r["seconds"] for b, r in results.items()}}
    rows = [row for r in results.values() for row in r["rows"]]
    with atomic_path(OUT.eval, is_dir=True) as out:
        write_json(out / "table.json", {"rows": rows, "budget": budget, "levels": p.levels,
                                        "grounded_llm": any("grounded-llm" in r["headline"] for r in results.values()),
                                        "env": fingerprint_line()})
        write_json(out / "episodes.json", [e for r in results.values() for e in r["episodes"]])
    with atomic_path(OUT.success, is_dir=True) as out:  # one file per benchmark and row: a row of dvc metrics show
        for benchmark, r in results.items():
            for row, success in r["headline"].items():
                write_json(out / benchmark / f"{row}.json", metrics_entry(success))
    with open_live(OUT.live) as live:
        live.log_plot("success_by_policy", [{"policy": f"{r['benchmark']} {r['level']}: {r['row']}",
                                             "success_rate": r["value"]} for r in rows],
                      x="success_rate", y="policy", template="bar_horizontal",
                      title="KALM: success rate per level (mean over training seeds)")
    log.info("kalm_eval done in %.1fs", seconds)


if __name__ == "__main__":
    main()
