"""Stage teach_plans: ask the LLM planner about every observation text of each task, once, into the reply cache.

The text space of each task is small and enumerable (``observation_texts``: 6 for SimpleDoorKey, 8 for
simple_spread), so the cache is filled here and every training and evaluation run replays it offline.
Writes the reply cache (data/teach/replies), one record file per task with prompts, raw replies, their
types and the resulting plan distributions (data/teach/plans/<task>.json), and metrics/teach/plans.json:
invalid- and error-reply rates, the plan distribution per text, and the probability the LLM gives to the
oracle's plan.
"""

from common import ROOT, log, stage_params  # isort: skip
from teach_common import MPE_KEY, PLANS, REPLIES, make_planner, task_kind  # isort: skip

import time

from tqdm.auto import tqdm

from llmrl.agents.teacher import oracle_plan, observation_texts
from llmrl.config.teach import TeachParams
from llmrl.io import write_json


def main() -> None:
    p = stage_params("teach", TeachParams)
    keys = list(p.train.envs) if "llm" in p.train.teachers else []
    keys += [MPE_KEY] if "llm" in p.mpe.teachers else []
    metrics: dict = {}
    for key in keys:
        kind = task_kind(key)
        planner = make_planner(key, "llm", p.teacher, offline=False)
        start = time.perf_counter()
        per_text = {}
        for text in tqdm(observation_texts(kind), desc=f"plans {key}"):
            dist = planner.plan(text)
            oracle = oracle_plan(kind, text)
            per_text[text] = {"plans": dict(zip(dist.plans, dist.probs)), "fallback": dist.fallback,
                              "oracle_plan": oracle,
                              "p_oracle_plan": dict(zip(dist.plans, dist.probs)).get(oracle, 0.0)}
        stats = planner.stats()
        stats.update(seconds=round(time.perf_counter() - start, 1), cache_hits=planner.backend.stats.hits,
                     cache_misses=planner.backend.stats.misses, model_loaded=planner.backend.backend.loaded,
                     mean_p_oracle_plan=sum(t["p_oracle_plan"] for t in per_text.values()) / len(per_text),
                     texts_detail=per_text)
        metrics[key] = stats
        write_json(PLANS / f"{key}.json", {"model_id": planner.backend.model_id, "records": planner.records})
        log.info("%s: %d texts, %d replies, invalid rate %.2f, error rate %.2f, mean P(oracle plan) %.2f, %.0f s",
                 key, stats["texts"], stats["replies"], stats["invalid_rate"], stats["error_rate"],
                 stats["mean_p_oracle_plan"], stats["seconds"])
    for folder in (PLANS, REPLIES):  # DVC outs even when no task asks the LLM
        folder.mkdir(parents=True, exist_ok=True)
    write_json(ROOT / "metrics" / "teach" / "plans.json", metrics)


if __name__ == "__main__":
    main()
