"""Benchmark: TRL's GRPO with the shared prompt prefix computed once, against TRL's own whole-prompt scoring.

The llm_rl_train stage's GRPO set-up (``llm_rl_grpo.trainer_params``: few-shot chat prompts, LoRA, the stage's
problems per round, group size, micro-batch and answer tokens from params.yaml's ``llm_rl.train.common``),
one generation round each, timed in this process one after the other on the same model and seeds. The
reference is TRL's scoring with activation checkpointing (what the stage ran before); the figure of merit is
the ratio of wall times (target >= 2), and the per-step losses must agree. Model: LLMRL_BENCH_MODEL, default
``models/base_llm`` (the pipeline's SmolLM2-135M) where that folder exists, else ``tiny``. Writes
bench/results/grpo_prefix.json with every raw figure.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
from llmrl.kernels import pin_cpu_kernels  # noqa: E402
from llmrl.process import keep_caches_under  # noqa: E402

keep_caches_under(ROOT / ".cache")
pin_cpu_kernels()  # the stages' float path (stages/common.py)
from llmrl.config import load_section, read_params  # noqa: E402

from llmrl.algos.grpo import train  # noqa: E402
from llmrl.algos.llm_rl_grpo import build_trainer, trainer_params  # noqa: E402
from llmrl.config.llm_rl import ReinforceTrainParams  # noqa: E402
from llmrl.envs.word_problems.generator import generated_splits  # noqa: E402
from llmrl.files import write_json  # noqa: E402
from llmrl.llm.load import load_model
from llmrl.seeding import seed_everything  # noqa: E402

TARGET = 2.0


def one_round(spec: str, common, grpo, shared: bool, problems, shots) -> dict:
    seed_everything(0)
    cfg = trainer_params(common, grpo).model_copy(update={"share_prompt_prefix": shared,
                                                          "gradient_checkpointing": not shared})
    with tempfile.TemporaryDirectory() as tmp:
        run = build_trainer(load_model(spec), problems, shots, cfg, output_dir=tmp, record=[])
        t = time.perf_counter()
        rows = list(train(run))
        seconds = time.perf_counter() - t
    return {"seconds": seconds, "losses": [r["loss"] for r in rows], "step_times": [r.get("step_time") for r in rows],
            "trainer": type(run.trainer).__name__}


def main() -> None:
    default = str(ROOT / "models" / "base_llm") if (ROOT / "models" / "base_llm").is_dir() else "tiny"
    spec = os.environ.get("LLMRL_BENCH_MODEL", default)
    torch.set_num_threads(1)  # as the stage runs
    p = load_section(read_params(ROOT / "params.yaml"), "llm_rl.train", ReinforceTrainParams)
    common = p.common.model_copy(update={"iterations": 1})
    train_split, _ = generated_splits(200, 10, seed=0)
    shots, problems = train_split[: common.few_shot], train_split[common.few_shot:]
    shared = one_round(spec, common, p.grpo, True, problems, shots)
    rss_shared = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    whole = one_round(spec, common, p.grpo, False, problems, shots)
    ratio = whole["seconds"] / shared["seconds"]
    losses_agree = all(abs(a - b) <= 1e-3 * max(1.0, abs(b)) for a, b in zip(shared["losses"], whole["losses"]))
    result = {
        "benchmark": "grpo_prefix",
        "model": Path(spec).name if Path(spec).is_dir() else spec,
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "load_average": os.getloadavg()},
        "round": {"problems": common.problems_per_iteration, "group_size": common.group_size,
                  "micro_batch": common.micro_batch, "answer_tokens": common.answer_tokens,
                  "few_shot": common.few_shot},
        "shared_prefix": shared | {"max_rss_gib_so_far": rss_shared},
        "trl_whole_prompt_checkpointed": whole,
        "ratio": ratio,
        "losses_agree": losses_agree,
        "target_ratio": TARGET,
        "passed": bool(ratio >= TARGET and losses_agree),
    }
    write_json(ROOT / "bench" / "results" / "grpo_prefix.json", result)
    print(json.dumps({k: result[k] for k in ("model", "ratio", "losses_agree", "passed")}
                     | {"shared_s": shared["seconds"], "whole_s": whole["seconds"]}))


if __name__ == "__main__":
    main()
