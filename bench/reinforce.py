"""Benchmark: training samples per second of our stepwise REINFORCE-with-KL against TRL's GRPOTrainer.

Same model (``tiny``, a ~3M-parameter random Llama, so the run stays under 3 minutes on 2 cores; set
LLMRL_BENCH_MODEL to try another), same LoRA adapter, same few-shot chat prompts from the generated math
problems, same batch (4 problems × 4 samples, one optimiser step per batch), same completion length budget
(32 new tokens; our episodes are one line, cut at a newline, which the random model rarely writes). Ours keeps
its KL to the reference (β = 0.25: one extra no-grad forward); TRL runs with its defaults (β = 0, no reference,
loss "dapo"). Both are timed in this process, one after the other, over the same number of batches after
one warm-up batch each; the figure of merit is the ratio of samples per second (target >= 1.5). Writes
bench/results/reinforce.json with every raw figure.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import TrainerCallback

ROOT = Path(__file__).resolve().parents[1]
from llmrl.kernels import pin_cpu_kernels  # noqa: E402
from llmrl.process import keep_caches_under  # noqa: E402

keep_caches_under(ROOT / ".cache")
pin_cpu_kernels()  # the stages' float path (stages/common.py)

from llmrl.algos.llm_rl_grpo import build_trainer, trainer_params  # noqa: E402
from llmrl.algos.reinforce_kl import ReinforceKL  # noqa: E402
from llmrl.config.llm_rl import CommonTrainParams, GRPOParams, ReinforceKLParams, ReinforceTrainParams  # noqa: E402
from llmrl.envs.word_problems.generator import generated_splits  # noqa: E402
from llmrl.files import write_json  # noqa: E402
from llmrl.config.lora import LoraSettings
from llmrl.llm.load import load_model
from llmrl.seeding import seed_everything  # noqa: E402

TARGET = 1.5
PROBLEMS, GROUP, NEW_TOKENS, BATCHES = 4, 4, 32, 3
LORA = LoraSettings(r=16, alpha=32, dropout=0.0)


class StepTimer(TrainerCallback):
    """Wall time of each GRPO optimiser step (generation included: one generation round per step here)."""

    def __init__(self):
        self.times, self._t = [], 0.0

    def on_step_begin(self, args, state, control, **kw):
        self._t = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.times.append(time.perf_counter() - self._t)


def main() -> None:
    spec = os.environ.get("LLMRL_BENCH_MODEL", "tiny")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    seed_everything(0)
    train, _ = generated_splits(200, 10, seed=0)
    shots, problems = train[:2], train[2:]

    ours_cfg = ReinforceTrainParams(
        common=CommonTrainParams(iterations=BATCHES + 1, problems_per_iteration=PROBLEMS, group_size=GROUP,
                                 line_tokens=NEW_TOKENS, answer_tokens=NEW_TOKENS, micro_batch=PROBLEMS * GROUP,
                                 gen_batch_size=PROBLEMS * GROUP, lr=1e-4, temperature=1.0, lora=LORA),
        reinforce_kl=ReinforceKLParams(max_steps=1, beta=0.25))
    ours = ReinforceKL(load_model(spec, lora=LORA), ours_cfg, problems, shots)

    trl_cfg = trainer_params(CommonTrainParams(
        iterations=BATCHES + 1, problems_per_iteration=PROBLEMS, group_size=GROUP, micro_batch=PROBLEMS * GROUP,
        answer_tokens=NEW_TOKENS, line_tokens=NEW_TOKENS, lr=1e-4, temperature=1.0,
        lora=LORA), GRPOParams())
    # TRL's own scoring is the reference here (bench/grpo_prefix.py measures the shared-prefix trainer).
    trl_cfg = trl_cfg.model_copy(update={"share_prompt_prefix": False, "gradient_checkpointing": True})
    timer = StepTimer()
    record: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(load_model(spec), problems, shots, trl_cfg, output_dir=tmp, record=record).trainer
        trainer.add_callback(timer)
        t = time.perf_counter()
        trainer.train()
        trl_total = time.perf_counter() - t

    ours_times, ours_tokens = [], []
    for _ in range(BATCHES + 1):
        t = time.perf_counter()
        stats, episodes = ours.step()
        ours_times.append(time.perf_counter() - t)
        ours_tokens.append(stats["tokens"] / max(stats["samples"], 1))
    trl_tokens = [float(np.mean([len(trainer.processing_class(r["completion"], add_special_tokens=False)["input_ids"])
                                 for r in record]))]

    batch = PROBLEMS * GROUP
    ours_rate = batch / statistics.median(ours_times[1:])
    trl_rate = batch / statistics.median(timer.times[1:])
    result = {
        "benchmark": "reinforce",
        "model": spec,
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "load_average": os.getloadavg()},
        "batch_samples": batch,
        "problems_per_batch": PROBLEMS,
        "group_size": GROUP,
        "max_new_tokens": NEW_TOKENS,
        "prompt_tokens_mean": float(np.mean([len(ours.llm.tokenizer(ep.head)["input_ids"]) for ep in episodes])),
        "batches_timed": BATCHES,
        "ours": {"config": "reinforce_kl, beta 0.25 (reference forward), LoRA r16, one optimiser step per batch",
                 "seconds_per_batch": ours_times, "completion_tokens_mean": float(np.mean(ours_tokens)),
                 "samples_per_s": ours_rate},
        "trl_grpo": {"config": "trl GRPOTrainer defaults: beta 0, loss dapo, num_iterations 1; LoRA r16",
                     "seconds_per_batch": timer.times, "train_seconds_total": trl_total,
                     "completion_tokens_mean": trl_tokens[0], "samples_per_s": trl_rate},
        "ratio": ours_rate / trl_rate,
        "target_ratio": TARGET,
        "passed": bool(ours_rate / trl_rate >= TARGET),
    }
    write_json(ROOT / "bench" / "results" / "reinforce.json", result)
    print(json.dumps({k: result[k] for k in ("ratio", "passed")} | {
        "ours_samples_per_s": ours_rate, "trl_samples_per_s": trl_rate,
        "ours_tokens": result["ours"]["completion_tokens_mean"], "trl_tokens": trl_tokens[0]}))


if __name__ == "__main__":
    main()
