"""Benchmark: GLAM's LLM PPO (collection + update) with the KV-cache scorer vs. naive per-candidate scoring.

One PPO update of ``llmrl.algos.ppo_llm.train`` on BabyAI-Text-GoToObjS4 with the embedded SmolLM2-135M
(models/base_llm if the base_llm stage ran, else ``embedded:smollm2-135m-instruct``), LoRA, GLAM's scoring
head. "kv" scores through ``llmrl.llm.score_tensors`` (each prompt computed once, its KV cache reused by the
six candidates); "naive" recomputes the prompt for every candidate (one full prompt+candidate sequence per
row, same token ids, same padding conventions, differentiable). Each method runs in its own subprocess, so
its peak RSS is its own. Figure of merit: env steps/s of kv over naive (target >= 2x). Writes
bench/results/glam.json.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
from llmrl.kernels import pin_cpu_kernels  # noqa: E402
from llmrl.process import keep_caches_under  # noqa: E402

keep_caches_under(ROOT / ".cache")
pin_cpu_kernels()  # the stages' float path (stages/common.py)

import llmrl.agents.llm_policy as llm_policy  # noqa: E402
from llmrl.llm.score import ScoreOutput, tokenize_left_padded  # noqa: E402

TARGET = 2.0
ENV = "BabyAI-Text-GoToObjS4-v0"
THREADS = 1  # measured faster than 2 on this shared 2-core machine


def naive_score_tensors(llm, prompts, candidates, *, return_prompt_hidden=False) -> ScoreOutput:
    """Reference scorer: every (prompt, candidate) pair is one full sequence; no cache."""
    tok = llm.tokenizer
    n_cand = len(candidates[0])
    p_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    c_ids = [tok(c, add_special_tokens=False)["input_ids"] for cands in candidates for c in cands]
    rows = [p_ids[i // n_cand] + c for i, c in enumerate(c_ids)]
    texts_ids, mask = tokenize_left_padded(_IdsTokenizer(tok), rows, llm.device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = llm.model(input_ids=texts_ids, attention_mask=mask, position_ids=pos, output_hidden_states=True)
    logp = F.log_softmax(out.logits.float(), dim=-1)
    width = texts_ids.shape[1]
    scores, n_tok, hidden = [], [], []
    for r, c in enumerate(c_ids):
        start = width - len(c)  # the candidate's tokens are the row's last ones (left padding)
        idx = torch.arange(start - 1, width - 1, device=llm.device)
        scores.append(logp[r, idx, torch.tensor(c, device=llm.device)].sum())
        n_tok.append(len(c))
        if r % n_cand == 0:
            hidden.append(out.hidden_states[-1][r, start - 1])
    return ScoreOutput(logprob=torch.stack(scores).view(len(prompts), n_cand),
                       n_tokens=torch.tensor(n_tok).view(len(prompts), n_cand),
                       prompt_hidden=torch.stack(hidden) if return_prompt_hidden else None)


class _IdsTokenizer:
    """Lets the foundation's left-padding helper take ready token-id lists."""

    def __init__(self, tok):
        self.pad_token_id = tok.pad_token_id

    def __call__(self, ids, add_special_tokens=False):
        return {"input_ids": ids}


def run_one(method: str, model: str) -> dict:
    from llmrl.agents.llm_policy import build_agent
    from llmrl.algos.ppo_llm import train
    from llmrl.config.glam import GlamPPO
    from llmrl.envs import make_env

    torch.set_num_threads(THREADS)
    if method == "naive":
        llm_policy.score_tensors = naive_score_tensors
    agent = build_agent(model, "lora", seed=0)
    cfg = GlamPPO(n_envs=2, frames_per_env=3, updates=1, epochs=1, minibatch_size=6, micro_batch=3, lr=1e-4,
                  max_steps=6)
    start = time.perf_counter()
    row = list(train(agent, lambda: make_env(ENV), cfg, history=1, seed=0, progress=False))[-1]
    wall = time.perf_counter() - start
    frames = cfg.n_envs * cfg.frames_per_env
    return {"method": method, "frames": frames, "env_steps_per_s": row["fps"], "collect_s": row["collect_s"],
            "update_s": frames / row["fps"] - row["collect_s"], "train_wall_s": wall,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "ppo_loss": row["loss"]}


def main() -> None:
    if len(sys.argv) == 3:  # child: one method
        print(json.dumps(run_one(sys.argv[1], sys.argv[2])))
        return
    model = str(ROOT / "models" / "base_llm") if (ROOT / "models" / "base_llm").is_dir() \
        else "embedded:smollm2-135m-instruct"
    results = {}
    for method in ("kv", "naive"):
        out = subprocess.run([sys.executable, __file__, method, model], capture_output=True, text=True, check=True,
                             env={**os.environ, "OMP_NUM_THREADS": str(THREADS)})
        results[method] = json.loads(out.stdout.strip().splitlines()[-1])
        print(method, results[method], flush=True)
    ratio = results["kv"]["env_steps_per_s"] / results["naive"]["env_steps_per_s"]
    report = {
        "benchmark": "GLAM LLM-PPO env steps/s (collection + update), KV-cache scorer vs naive per-candidate",
        "model": model, "env_id": ENV, "kv": results["kv"], "naive": results["naive"], "ratio": ratio,
        "target_ratio": TARGET, "passed": ratio >= TARGET,
        "machine": {"cpu_count": os.cpu_count(), "load_average": list(os.getloadavg()), "threads": THREADS,
                    "platform": platform.platform(), "torch": torch.__version__},
    }
    from llmrl.files import write_json

    write_json(ROOT / "bench" / "results" / "glam.json", report)
    print(f"ratio {ratio:.2f} (target {TARGET}) -> bench/results/glam.json")


if __name__ == "__main__":
    main()
