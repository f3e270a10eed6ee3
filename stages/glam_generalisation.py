"""Stage glam_generalisation: GLAM's post-training tests for every glam_train agent (and BC if asked).

Each test is a text variant of the same level (llmrl.envs.babyai_text.languages.VARIANTS): renamed nouns, colour
synonyms, invented nouns / adjectives / both, rephrased goals, renamed actions, French; "none" is the
untransformed reference. Same seeds for every test, so differences come from the text alone. An agent
variant's ``episodes`` are split over its training seeds (each runs ceil(episodes / seeds)). Headline per test
and agent in metrics/glam/generalisation/<test>/<agent>.json (training seeds of a variant pooled as seeds);
the first prompts of each test and the protocol (each agent's compute dtype, the environment line) under
metrics/glam/generalisation_prompts/ (a plain out).
"""

import math

import torch

from llmrl.agents.llm_policy import LLMBatchPolicy, load_agent
from llmrl.config.glam import GlamParams
from llmrl.envs.make import make_env
from llmrl.envs.babyai_text.languages import VARIANTS
from llmrl.eval.batched import evaluate_batched
from llmrl.eval.headline import headline_of_results, metrics_entry
from llmrl.files import atomic_path, write_json
from llmrl.fingerprint import fingerprint_line
from stages import paths
from stages.common import log, open_live, stage_arguments, stage_params


def main(argv: list[str] | None = None) -> None:
    stage_arguments("glam_generalisation", argv)
    p = stage_params("glam", GlamParams)
    g = p.generalisation
    unknown = [t for t in g.tests if t not in VARIANTS]
    if unknown:
        raise SystemExit(f"glam.generalisation.tests: unknown {unknown}; known: {sorted(VARIANTS)}")
    torch.set_num_threads(p.threads)
    rows, dtypes = [], {}
    agents = {f"glam_{v}": [(f"{v}-{s}", paths.glam_train(f"{v}-{s}").model) for s in p.train.seeds]
              for v in p.train.variants}
    if g.include_bc:
        agents["bc"] = [(f"bc-{s}", paths.glam_bc().model / str(s)) for s in p.train.seeds]
    out = paths.glam_generalisation()
    with open_live(out.live) as live, atomic_path(out.metrics, is_dir=True) as gen_dir, \
            atomic_path(out.prompts, is_dir=True) as prompt_dir:
        for name, items in agents.items():
            results: dict = {test: [] for test in g.tests}
            # a test's headline pools the agent's training seeds: the episodes are split over them
            seeds = range(g.seed, g.seed + math.ceil(g.episodes / len(items)))
            for item, folder in items:
                agent, meta = load_agent(folder)
                for test in g.tests:
                    policy = LLMBatchPolicy(agent, name, history=meta["history"], record_steps=3)
                    results[test].append(evaluate_batched(policy, lambda test=test: make_env(g.env_id, variant=test),
                                                          seeds, mode=g.mode, max_steps=g.max_steps, n_envs=g.batch))
                    write_json(prompt_dir / f"{item}_{test}.json", [r["prompt"] for r in policy.records])
                dtypes[name] = agent.llm.dtype_name
                del agent
            for test in g.tests:
                h = headline_of_results(results[test])
                write_json(gen_dir / test / f"{name}.json", metrics_entry({g.mode: h}))
                rows.append({"test": f"{name}: {test}", "success_rate": h["success"], "ci_low": h["success_lo"],
                             "ci_high": h["success_hi"]})
                log.info("%s %s: success %.3f [%.3f, %.3f]", name, test, h["success"], h["success_lo"],
                         h["success_hi"])
        live.log_plot("success_by_test", rows, x="success_rate", y="test", template="bar_horizontal",
                      title="GLAM generalisation tests")
        write_json(prompt_dir / "protocol.json", {"episodes": g.episodes, "mode": g.mode, "dtype": dtypes,
                                                  "env": fingerprint_line()})


if __name__ == "__main__":
    main()
