"""Stage llm4teach_plans: ask the LLM planner about every observation text of each task, once, into the reply cache.

The text space of each task is small and enumerable (``observation_texts``: 6 for SimpleDoorKey, 8 for
simple_spread), so the cache is filled here and every training and evaluation run replays it offline.
Writes the reply cache (data/llm4teach/replies); one record file per task, data/llm4teach/plans/<task>.json (a plain
out: prompts, raw replies, their types and invalid reasons, the plan distribution per text, reply counts,
cache statistics, time); and the headline per task, metrics/llm4teach/plans/<task>.json: invalid- and error-reply
rates, texts that fell back, and the mean probability the LLM gives to the oracle's plan. With the scoring teacher
(``llm_score`` among the teachers) it also scores every admissible plan of every text under the local model:
data/llm4teach/plans/<task>-score.json (prompts, plans, log-probs, distributions) and
metrics/llm4teach/plans/<task>-score.json (the mean probability given to the oracle's plan).
"""

import time

import torch
from tqdm.auto import tqdm

from llmrl.agents.teacher import observation_texts, oracle_plan, plan_texts
from llmrl.config.llm4teach import LLM4TeachParams
from llmrl.fingerprint import fingerprint_line
from llmrl.files import atomic_path, write_json
from llmrl.llm.faults import FaultGuard
from llmrl.llm.load import default_device_dtype, dtype_name
from stages import paths
from stages.common import log, stage_arguments, stage_params
from stages.llm4teach_common import MPE_KEY, make_planner, scores_file, task_kind

OUT = paths.llm4teach_plans()


def main(argv: list[str] | None = None) -> None:
    stage_arguments("llm4teach_plans", argv)
    p = stage_params("llm4teach", LLM4TeachParams)
    torch.set_num_threads(p.teacher.threads)
    # The local model's compute dtype as load_model resolves it (an endpoint's is the server's business).
    local = p.teacher.backend == "local"
    dtype = {"dtype": dtype_name(default_device_dtype(None, p.teacher.dtype)[1])} if local else {}
    keys = list(p.train.envs) if "llm" in p.train.teachers else []
    keys += [MPE_KEY] if "llm" in p.mpe.teachers else []
    # One fault policy for the whole pass, every task's requests together.
    guard = FaultGuard(p.teacher.faults, "llm4teach.teacher.faults")
    with atomic_path(OUT.plans, is_dir=True) as plans_dir, atomic_path(OUT.metrics, is_dir=True) as head_dir:
        for key in keys:
            kind = task_kind(key)
            planner = make_planner(key, "llm", p.teacher, offline=False, guard=guard)
            start = time.perf_counter()
            per_text = {}
            dists = plan_texts(planner, tqdm(observation_texts(kind), desc=f"plans {key}"), guard)
            for text, dist in dists.items():
                oracle = oracle_plan(kind, text)
                plans = dict(zip(dist.plans, dist.probs))
                per_text[text] = {"plans": plans, "fallback": dist.fallback, "oracle_plan": oracle,
                                  "p_oracle_plan": plans.get(oracle, 0.0)}
            stats = planner.stats()
            mean_p_oracle = sum(t["p_oracle_plan"] for t in per_text.values()) / len(per_text)
            headline = {"invalid_rate": round(stats["invalid_rate"], 4), "error_rate": round(stats["error_rate"], 4),
                        "fallback_texts": stats["fallback_texts"], "mean_p_oracle_plan": round(mean_p_oracle, 4),
                        **dtype, "env": fingerprint_line()}
            detail = {**stats, "seconds": round(time.perf_counter() - start, 1),
                      "cache_hits": planner.backend.stats.hits, "cache_misses": planner.backend.stats.misses,
                      "cache_damaged": list(planner.backend.stats.damaged),
                      "model_loaded": planner.backend.backend.backend.loaded, "mean_p_oracle_plan": mean_p_oracle,
                      "texts_detail": per_text}
            write_json(plans_dir / f"{key}.json", {"model_id": planner.backend.model_id, "stats": detail,
                                                   "records": planner.records})
            write_json(head_dir / f"{key}.json", headline)
            log.info("%s: %d texts, %d replies, invalid rate %.2f %s, error rate %.2f, mean P(oracle plan) %.2f, "
                     "%.0f s", key, stats["texts"], stats["replies"], stats["invalid_rate"], stats["invalid_reasons"],
                     stats["error_rate"], mean_p_oracle, detail["seconds"])
        score_keys = list(p.train.envs) if "llm_score" in p.train.teachers else []
        score_keys += [MPE_KEY] if "llm_score" in p.mpe.teachers else []
        for key in score_keys:
            kind = task_kind(key)
            planner = make_planner(key, "llm_score", p.teacher, offline=False)
            start = time.perf_counter()
            p_oracle = {t: dict(zip(d.plans, d.probs)).get(oracle_plan(kind, t), 0.0)
                        for t, d in ((t, planner.plan(t)) for t in tqdm(observation_texts(kind), desc=f"scores {key}"))}
            mean_p_oracle = sum(p_oracle.values()) / len(p_oracle)
            write_json(plans_dir / scores_file(key).name,
                       {"model_id": f"local:{p.teacher.spec}", "mean_p_oracle_plan": mean_p_oracle,
                        "p_oracle_plan": p_oracle, "seconds": round(time.perf_counter() - start, 1),
                        "records": planner.records})
            write_json(head_dir / f"{key}-score.json", {"mean_p_oracle_plan": round(mean_p_oracle, 4),
                                                        "texts": len(p_oracle), "dtype": dtype_name(planner.llm.dtype),
                                                        "env": fingerprint_line()})
            log.info("%s (scoring teacher): %d texts, mean P(oracle plan) %.2f, %.0f s", key, len(p_oracle),
                     mean_p_oracle, time.perf_counter() - start)
            del planner
    OUT.replies.mkdir(parents=True, exist_ok=True)  # a DVC out even when no task asks the LLM


if __name__ == "__main__":
    main()
