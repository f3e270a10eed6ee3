"""Benchmark: imagined transitions/s of the grounded LLM with KV-cache reuse vs re-encoding the whole prefix.

Both paths run ``GroundedLM.imagine`` on the same batch of (instruction, s_0) pairs, greedy, fp32: ``reuse_cache``
appends one embedding per forward to the KV cache; the baseline re-encodes the full sequence (prompt + every
imagined action and state so far) at each forward, as a generation loop without a cache would. One transition =
(a_t, s_{t+1}) = two forwards. Outputs must agree within 1e-4 (max abs difference of actions and states). Rates are
per CPU second of the process (``time.process_time``; the primary figure on this shared 2-core machine) with the
wall-clock rates beside them; runs alternate and the ratio is the median of paired ratios. Target: ratio ≥ 5.

Usage: python bench/kalm_rollouts.py [--model models/kalm/grounded/metaworld/0] [--batch 8] [--steps 32] [--repeats 3]
Without a trained model folder it builds an untrained grounded model on models/base_llm (speed and equality do
not depend on the weights). Writes bench/results/kalm_rollouts.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmrl.envs import kalm_levels as kl  # noqa: E402
from llmrl.fingerprint import environment_fingerprint  # noqa: E402
from llmrl.files import write_json  # noqa: E402
from llmrl.llm.grounded import GroundedLM, GroundingSpec, build_grounded  # noqa: E402

TARGET = 5.0


def metaworld_model(folder: str, base: str) -> tuple[GroundedLM, str]:
    """The trained Meta-World grounded model in ``folder``, else an untrained one on ``base`` (speed and equality
    do not depend on the weights); with a description of which."""
    if (Path(folder) / "grounding.json").is_file():
        return GroundedLM.load(folder), folder
    spec = kl.action_spec("metaworld")
    return build_grounded(GroundingSpec(obs_dim=kl.obs_dim("metaworld"), action_dim=spec.n, discrete=False,
                                        base_model=base)), f"untrained on {base}"


def timed(fn):
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c0, time.perf_counter() - w0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "models" / "kalm" / "grounded" / "metaworld" / "0"))
    ap.add_argument("--base", default=str(ROOT / "models" / "base_llm"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "kalm_rollouts.json"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model, source = metaworld_model(a.model, a.base)
    model.eval()
    goals = kl.goals("metaworld", "easy")
    instr = [goals[i % len(goals)].instruction for i in range(a.batch)]
    obs0 = np.stack([kl.make_goal_env(goals[i % len(goals)], 30_000 + i).reset(seed=30_000 + i)[0]
                     for i in range(a.batch)]).astype(np.float32)
    transitions = a.batch * a.steps
    runs = []
    for r in range(a.repeats):
        (ac, sc, _), cpu_c, wall_c = timed(lambda: model.imagine(instr, obs0, a.steps, reuse_cache=True))
        (ar, sr, _), cpu_r, wall_r = timed(lambda: model.imagine(instr, obs0, a.steps, reuse_cache=False))
        diff = float(max(np.abs(ac - ar).max(), np.abs(sc - sr).max()))
        runs.append({"cached_cpu_s": round(cpu_c, 3), "reencode_cpu_s": round(cpu_r, 3),
                     "cached_wall_s": round(wall_c, 3), "reencode_wall_s": round(wall_r, 3),
                     "ratio_cpu": round(cpu_r / cpu_c, 2), "ratio_wall": round(wall_r / wall_c, 2),
                     "max_abs_diff": diff})
        print(f"repeat {r}: {runs[-1]}", flush=True)
    ratio = statistics.median(x["ratio_cpu"] for x in runs)
    max_diff = max(x["max_abs_diff"] for x in runs)
    result = {
        "model": source, "batch": a.batch, "steps": a.steps, "threads": a.threads, "transitions": transitions,
        "cached_transitions_per_cpu_s": round(transitions / statistics.median(x["cached_cpu_s"] for x in runs), 1),
        "reencode_transitions_per_cpu_s": round(transitions / statistics.median(x["reencode_cpu_s"] for x in runs), 1),
        "cached_transitions_per_wall_s": round(transitions / statistics.median(x["cached_wall_s"] for x in runs), 1),
        "reencode_transitions_per_wall_s": round(transitions / statistics.median(x["reencode_wall_s"] for x in runs), 1),
        "ratio_cpu": ratio, "ratio_wall": statistics.median(x["ratio_wall"] for x in runs),
        "max_abs_diff": max_diff, "target_ratio": TARGET, "meets_target": bool(ratio >= TARGET and max_diff <= 1e-4),
        "runs": runs, "env": environment_fingerprint(),
    }
    write_json(a.out, result)
    print({k: v for k, v in result.items() if k not in ("runs", "env")})


if __name__ == "__main__":
    main()
