"""Stage llm_rl_data: train and test problems in one JSONL format under data/llm_rl/ (train.jsonl, test.jsonl).

Sources (params ``llm_rl.data.source``): the embedded generator (default, offline), reasoning-gym's
gsm_symbolic templates (offline), GSM8K or MATH from local files (``train_path``/``test_path``) or the hub. The test split is only ever read by llm_rl_eval.
"""

from common import ROOT, log, prepare_stage_process, stage_params  # isort: skip

prepare_stage_process()

import paths  # isort: skip

from llmrl.config.llm_rl import MathDataParams
from llmrl.envs.word_problems.datasets import (
    check_disjoint,
    gsm_symbolic_splits,
    load_hub,
    normalize,
    read_records,
    write_jsonl,
)
from llmrl.envs.word_problems.generator import generated_splits
from llmrl.files import atomic_path, write_json

OUT = paths.llm_rl_data().data
HUB = {"gsm8k": ("openai/gsm8k", ["main"]),
       "math": ("EleutherAI/hendrycks_math", ["algebra", "counting_and_probability", "geometry",
                                              "intermediate_algebra", "number_theory", "prealgebra", "precalculus"])}


def real_split(p: MathDataParams, split: str, path: str | None) -> list[dict]:
    if path is not None:
        return normalize(read_records(ROOT / path), p.source, f"{p.source}-{split}")
    name, configs = HUB[p.source]
    name, configs = p.hub_name or name, p.hub_configs or configs
    records = [r for config in configs for r in load_hub(name, config, split)]
    return normalize(records, p.source, f"{p.source}-{split}")


def main() -> None:
    p = stage_params("llm_rl.data", MathDataParams)
    if p.source == "generated":
        train, test = generated_splits(p.n_train, p.n_test, p.seed, p.two_step_fraction, p.max_number)
    elif p.source == "gsm_symbolic":
        train, test = gsm_symbolic_splits(p.n_train, p.n_test, p.seed, p.test_templates)
    else:
        import random

        train, test = real_split(p, "train", p.train_path), real_split(p, "test", p.test_path)
        random.Random(p.seed).shuffle(train)  # the first items become the few-shot examples
        train, test = train[: p.n_train], test[: p.n_test]
    check_disjoint(train, test)
    with atomic_path(OUT, is_dir=True) as tmp:
        write_jsonl(tmp / "train.jsonl", train)
        write_jsonl(tmp / "test.jsonl", test)
        write_json(tmp / "summary.json", {"source": p.source, "train": len(train), "test": len(test),
                                          "disjoint": True})
    log.info("llm_rl_data: %d train and %d test problems from %s", len(train), len(test), p.source)


if __name__ == "__main__":
    main()
