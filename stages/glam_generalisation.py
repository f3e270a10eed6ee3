"""Stage glam_generalisation: GLAM's post-training tests for every glam_train agent (and BC if asked).

Each test is a text variant of the same level (llmrl.envs.babyai_text.VARIANTS): renamed nouns, colour
synonyms, invented nouns / adjectives / both, rephrased goals, renamed actions, French; "none" is the
untransformed reference. Same seeds for every test, so differences come from the text alone.
"""

from common import ROOT, log, stage_params  # isort: skip

import time

import torch
from dvclive import Live

from llmrl.agents.llm_policy import LLMBatchPolicy, load_agent
from llmrl.config.glam import GlamParams
from llmrl.envs import make_env
from llmrl.envs.babyai_text import VARIANTS
from llmrl.eval.batched import evaluate_batched
from llmrl.io import write_json


def main() -> None:
    p = stage_params("glam", GlamParams)
    g = p.generalisation
    unknown = [t for t in g.tests if t not in VARIANTS]
    if unknown:
        raise SystemExit(f"glam.generalisation.tests: unknown {unknown}; known: {sorted(VARIANTS)}")
    torch.set_num_threads(p.threads)
    seeds = range(g.seed, g.seed + g.episodes)
    metrics: dict = {"protocol": {"env_id": g.env_id, "episodes": g.episodes, "mode": g.mode,
                                  "seeds": f"{seeds[0]}-{seeds[-1]}", "max_steps": g.max_steps}}
    rows = []
    start = time.perf_counter()
    items = [f"{v}-{s}" for v in p.train.variants for s in p.train.seeds] + (["bc"] if g.include_bc else [])
    with Live(dir=str(ROOT / "plots" / "glam_generalisation"), save_dvc_exp=False, dvcyaml=None,
              report=None) as live:
        for item in items:
            name = item if item == "bc" else f"glam_{item}"
            agent, meta = load_agent(ROOT / "models" / "glam" / item)
            for test in g.tests:
                policy = LLMBatchPolicy(agent, name, history=meta["history"], record_steps=3)
                s = evaluate_batched(policy, lambda test=test: make_env(g.env_id, variant=test), seeds, mode=g.mode,
                                     max_steps=g.max_steps, n_envs=g.batch).summary()
                s["prompts"] = [r["prompt"] for r in policy.records]
                metrics.setdefault(name, {})[test] = s
                rows.append({"test": f"{name}: {test}", "success_rate": s["success_rate"],
                             "ci_low": s["success_ci95"][0], "ci_high": s["success_ci95"][1]})
                log.info("%s %s: success %.3f [%.3f, %.3f]", name, test, s["success_rate"], *s["success_ci95"])
            del agent
        live.log_plot("success_by_test", rows, x="success_rate", y="test", template="bar_horizontal",
                      title="GLAM generalisation tests")
    metrics["wall_s"] = time.perf_counter() - start
    write_json(ROOT / "metrics" / "glam" / "generalisation.json", metrics)


if __name__ == "__main__":
    main()
