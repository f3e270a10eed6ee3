"""Measurement: is a small RL network's training byte-identical across CPU kernel levels, thread counts and MKL modes?

Trains LLM4Teach's student PPO (``llmrl.algos.distilled_ppo``, the MLP student on MiniGrid-DoorKey-5x5, 4 envs x 128 steps,
a few iterations) once per variant, each in a fresh subprocess (ATen reads ``ATEN_CPU_CAPABILITY`` and MKL reads
``MKL_CBWR`` at start-up), and hashes (a) the final parameters' bytes and (b) the per-iteration metrics (fps and
timings removed). A variant is *identical* when its hashes equal the reference's (default kernel level, 1 thread,
deterministic algorithms on, as `seed_everything` sets by default). Writes bench/results/determinism.json: per
variant the environment it ran under, the hashes, the final train return, identical-or-not, and seconds.

Usage: python bench/determinism.py [--iterations 8] [--repeats 1]   (results are written after every variant)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV_ID = "MiniGrid-DoorKey-5x5-v0"
N_ENVS, N_STEPS = 4, 128

# name -> (environment variables, torch threads, use_deterministic_algorithms)
VARIANTS: dict[str, tuple[dict[str, str], int, bool]] = {
    "reference: default ISA, 1 thread, deterministic": ({}, 1, True),
    "avx2, 1 thread": ({"ATEN_CPU_CAPABILITY": "avx2"}, 1, True),
    "default ISA, 2 threads": ({}, 2, True),
    "avx2, 2 threads": ({"ATEN_CPU_CAPABILITY": "avx2"}, 2, True),
    "MKL_CBWR=COMPATIBLE, 1 thread": ({"MKL_CBWR": "COMPATIBLE"}, 1, True),
    "MKL_CBWR=COMPATIBLE, avx2, 1 thread": ({"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "avx2"}, 1, True),
    "default ISA, 1 thread, not deterministic": ({}, 1, False),
    "default (no vectorisation), 1 thread": ({"ATEN_CPU_CAPABILITY": "default"}, 1, True),
    "avx512, 1 thread": ({"ATEN_CPU_CAPABILITY": "avx512"}, 1, True),
    "default ISA, 1 thread, deterministic (rerun)": ({}, 1, True),
    "MKL_CBWR=COMPATIBLE, 2 threads": ({"MKL_CBWR": "COMPATIBLE"}, 2, True),
    "avx512, 2 threads": ({"ATEN_CPU_CAPABILITY": "avx512"}, 2, True),
}


def worker(iterations: int, threads: int, deterministic: bool, seed: int) -> dict:
    """One training in this process; returns hashes, the final return and the training seconds."""
    sys.path.insert(0, str(ROOT))
    import numpy as np
    import torch
    from minigrid.wrappers import ImgObsWrapper

    from llmrl.agents.student import MLPStudent
    from llmrl.algos.distilled_ppo import make_vector_env, train
    from llmrl.config.ppo import PPOParams
    from llmrl.envs.make import make_env
    from llmrl.seeding import seed_everything

    torch.set_num_threads(threads)
    seed_everything(seed, deterministic_torch=deterministic)
    if not deterministic:
        torch.use_deterministic_algorithms(False)
    envs = make_vector_env(lambda: ImgObsWrapper(make_env(ENV_ID)), N_ENVS)
    agent = MLPStudent(int(np.prod(envs.single_observation_space.shape)), int(envs.single_action_space.n), (64, 64))
    cfg = PPOParams(total_frames=iterations * N_ENVS * N_STEPS, num_envs=N_ENVS, num_steps=N_STEPS, epochs=4,
                    minibatch_size=64, lr=3e-4, entropy_coef=0.01)
    start = time.perf_counter()
    history = list(train(agent, envs, cfg, seed=seed, progress=False))
    seconds = time.perf_counter() - start
    envs.close()
    params = hashlib.sha256()
    for name, tensor in sorted(agent.state_dict().items()):
        params.update(name.encode())
        params.update(tensor.detach().contiguous().numpy().tobytes())
    rows = [{k: v for k, v in row.items() if k != "fps"} for row in history]
    metrics = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()
    returns = [r["return_mean"] for r in history if "return_mean" in r]
    return {"param_sha256": params.hexdigest()[:16], "metrics_sha256": metrics[:16],
            "final_train_return": returns[-1] if returns else None, "final_loss": history[-1].get("loss"),
            "train_seconds": seconds, "aten_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__}


def _write(results: dict, args, last: dict) -> dict:
    ref = next(iter(results.values()))
    for r in results.values():
        r["identical_to_reference"] = (r["param_sha256"], r["metrics_sha256"]) == (ref["param_sha256"],
                                                                                 ref["metrics_sha256"])
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    groups: dict[str, list[str]] = {}
    for name, r in results.items():
        groups.setdefault(f"{r['param_sha256']}/{r['metrics_sha256']}", []).append(name)
    doc = {"what": f"student PPO ({ENV_ID}, {N_ENVS}x{N_STEPS} steps x {args.iterations} iterations, seed "
                   f"{args.seed}): final params and metrics hashes per variant, each in a fresh process",
           "machine": {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
                       "torch": last["torch"], "load_average_1min_at_write": os.getloadavg()[0]},
           "reference": next(iter(results)), "variants": results, "groups_of_identical_results": list(groups.values())}
    sys.path.insert(0, str(ROOT))
    from llmrl.files import write_json

    write_json(ROOT / "bench" / "results" / "determinism.json", doc)
    return doc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per variant (seconds: the median)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--worker", nargs=3, metavar=("ITERS", "THREADS", "DETERMINISTIC"))
    args = ap.parse_args()
    if args.worker:
        it, th, det = args.worker
        print(json.dumps(worker(int(it), int(th), det == "1", args.seed)))
        return

    results = {}
    for name, (env_vars, threads, det) in VARIANTS.items():
        runs = []
        for _ in range(args.repeats):
            env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")}
            env.update(env_vars)
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
            out = subprocess.run([sys.executable, __file__, "--seed", str(args.seed), "--worker",
                                  str(args.iterations), str(threads), "1" if det else "0"],
                                 env=env, capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        first = runs[0]
        results[name] = {"env": env_vars, "threads": threads, "deterministic_algorithms": det,
                         **{k: first[k] for k in ("param_sha256", "metrics_sha256", "final_train_return",
                                                  "final_loss", "aten_capability")},
                         "stable_across_repeats": len({(r["param_sha256"], r["metrics_sha256"]) for r in runs}) == 1,
                         "seconds_median": statistics.median(r["train_seconds"] for r in runs),
                         "seconds_all": [round(r["train_seconds"], 3) for r in runs]}
        _write(results, args, first)  # after every variant: a cut-short run still leaves its measurements
        print(f"{name:55s} {first['aten_capability']:8s} params {first['param_sha256']} "
              f"metrics {first['metrics_sha256']} return {first['final_train_return']!s:>22s} "
              f"{results[name]['seconds_median']:.2f}s", flush=True)
    doc = _write(results, args, first)
    print(json.dumps(doc["groups_of_identical_results"], indent=1))


if __name__ == "__main__":
    main()
