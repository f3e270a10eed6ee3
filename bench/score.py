"""Benchmark: candidate scoring with the prompt's KV cache reused vs. one full sequence per candidate.

Embedded SmolLM2-135M-Instruct, GLAM's six BabyAI action strings, ~150-token chat prompts. Both methods run
in this process on the same prompts; the figure of merit is the ratio of their rates (target >= 3x) with
log-probabilities equal within 1e-4. The same measurement in bf16 runs beside it in a child
process on the CPU's own kernels (bf16 needs them; the stages pin AVX2, llmrl/kernels.py), on CPUs with native
bf16: rates side by side and the largest log-prob difference bf16 makes. Writes bench/results/score.json.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
from llmrl.kernels import cpu_supports_bf16, pin_cpu_kernels, unpinned_environ  # noqa: E402
from llmrl.process import keep_caches_under  # noqa: E402

keep_caches_under(ROOT / ".cache")
pin_cpu_kernels()  # the stages' float path (stages/common.py)

from llmrl.files import write_json  # noqa: E402
from llmrl.llm.score import score, score_naive
from llmrl.llm.load import load_model

ACTIONS = ["turn left", "turn right", "go forward", "pick up", "drop", "toggle"]
TARGET = 3.0
N_PROMPTS, REPEATS = 8, 3


def babyai_prompt(i: int) -> str:
    colours = ["red", "green", "blue", "purple", "yellow", "grey"]
    objects = ["ball", "key", "box"]
    obs = [
        f"You see a {colours[(i + k) % 6]} {objects[(i + k) % 3]} {k + 1} steps left and {k % 3 + 1} steps forward"
        for k in range(3)
    ]
    lines = [
        "Possible action of the agent: turn left, turn right, go forward, pick up, drop, toggle",
        f"Goal of the agent: go to the {colours[i % 6]} {objects[i % 3]}",
    ]
    for t in range(3):
        lines.append(f"Observation {t}: " + ", ".join(obs[t:] + ["You see a wall 3 steps forward"]))
        if t < 2:
            lines.append(f"Action {t}: {ACTIONS[(i + t) % 6]}")
    lines.append("Action 2:")
    return "\n".join(lines)


def measure(dtype: str) -> dict:
    torch.set_num_threads(os.cpu_count() or 1)
    llm = load_model(os.environ.get("LLMRL_BENCH_MODEL", "embedded:smollm2-135m-instruct"), dtype=dtype)
    prompts = [llm.render(babyai_prompt(i)) for i in range(N_PROMPTS)]
    candidates = [" " + a for a in ACTIONS]
    prompt_tokens = [len(llm.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]

    score(llm, prompts[:2], candidates)  # warm-up
    naive_t, fast_t, fast1_t = [], [], []
    for _ in range(REPEATS):
        t = time.perf_counter()
        naive = score_naive(llm, prompts, candidates)
        naive_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        fast = score(llm, prompts, candidates, batch_size=4)
        fast_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        score(llm, prompts, candidates, batch_size=1)
        fast1_t.append(time.perf_counter() - t)
    diff = max(float(np.abs(a.logprob - b.logprob).max()) for a, b in zip(naive, fast))
    n_scores = N_PROMPTS * len(candidates)
    naive_rate = n_scores / statistics.median(naive_t)
    fast_rate = n_scores / statistics.median(fast_t)
    return {
        "model": llm.spec,
        "dtype": llm.dtype_name,
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "threads": torch.get_num_threads()},
        "prompts": N_PROMPTS,
        "candidates": candidates,
        "prompt_tokens_mean": float(np.mean(prompt_tokens)),
        "repeats": REPEATS,
        "naive_seconds": naive_t,
        "kv_reuse_batch4_seconds": fast_t,
        "kv_reuse_batch1_seconds": fast1_t,
        "naive_scores_per_s": naive_rate,
        "kv_reuse_scores_per_s": fast_rate,
        "kv_reuse_batch1_scores_per_s": n_scores / statistics.median(fast1_t),
        "ratio": fast_rate / naive_rate,
        "target_ratio": TARGET,
        "max_abs_logprob_diff": diff,
        "passed": bool(fast_rate / naive_rate >= TARGET and diff <= 1e-4),
        "kv_logprobs": [o.logprob.tolist() for o in fast],
    }


def main() -> None:
    if sys.argv[1:2] == ["--dtype"]:  # child: one dtype
        print(json.dumps(measure(sys.argv[2])))
        return
    result = {"benchmark": "score", **measure("float32")}
    fp32_lp = np.array(result.pop("kv_logprobs"))
    if cpu_supports_bf16():
        out = subprocess.run([sys.executable, __file__, "--dtype", "bfloat16"], capture_output=True, text=True,
                             check=True, env=unpinned_environ())
        bf16 = json.loads(out.stdout.strip().splitlines()[-1])
        bf16_lp = np.array(bf16.pop("kv_logprobs"))
        result["bfloat16"] = {
            **{k: bf16[k] for k in ("kernels", "naive_scores_per_s", "kv_reuse_scores_per_s",
                                    "kv_reuse_batch1_scores_per_s", "ratio", "max_abs_logprob_diff")},
            "kv_speedup_over_fp32": bf16["kv_reuse_scores_per_s"] / result["kv_reuse_scores_per_s"],
            "max_abs_logprob_diff_vs_fp32": float(np.abs(bf16_lp - fp32_lp).max()),
            "mean_abs_logprob_diff_vs_fp32": float(np.abs(bf16_lp - fp32_lp).mean()),
            "best_candidate_changed": float(np.mean(bf16_lp.argmax(-1) != fp32_lp.argmax(-1))),
        }
    else:
        result["bfloat16"] = "not measured: the CPU has no native bf16 (AVX-512-BF16 / AMX)"
    write_json(ROOT / "bench" / "results" / "score.json", result)
    print(json.dumps({k: result[k] for k in ("ratio", "max_abs_logprob_diff", "passed", "prompt_tokens_mean",
                                             "bfloat16")}))


if __name__ == "__main__":
    main()
