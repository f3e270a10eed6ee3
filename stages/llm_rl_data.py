"""Stage llm_rl_data: train and test problems in one JSONL format under data/llm_rl/ (train.jsonl, test.jsonl).

Sources (params ``llm_rl.data.source``): the embedded generator (default, offline), reasoning-gym's
gsm_symbolic templates (offline), GSM8K or MATH from local files (``train_path``/``test_path``) or the hub. The test split is only ever read by llm_rl_eval.
"""

from llmrl.config.llm_rl import MathDataParams
from llmrl.envs.word_problems.datasets import problem_splits, write_jsonl
from llmrl.files import atomic_path, write_checksums, write_json
from stages import paths
from stages.common import log, stage_arguments, stage_params
from stages.paths import ROOT

OUT = paths.llm_rl_data().data


def main(argv: list[str] | None = None) -> None:
    stage_arguments("llm_rl_data", argv)
    p = stage_params("llm_rl.data", MathDataParams)
    train, test = problem_splits(p, ROOT)
    with atomic_path(OUT, is_dir=True) as tmp:
        write_jsonl(tmp / "train.jsonl", train)
        write_jsonl(tmp / "test.jsonl", test)
        write_json(tmp / "summary.json", {"source": p.source, "train": len(train), "test": len(test),
                                          "disjoint": True})
        write_checksums(tmp)  # read_jsonl checks the problem files against it
    log.info("llm_rl_data: %d train and %d test problems from %s", len(train), len(test), p.source)


if __name__ == "__main__":
    main()
