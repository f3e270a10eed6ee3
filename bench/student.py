"""Benchmark: training frames per second of llmrl's PPO (``llmrl.algos.distilled_ppo``) against Stable-Baselines3 PPO.

Same task (MiniGrid-DoorKey-5x5-v0, 7x7x3 egocentric image flattened), same network (separate actor and
critic MLPs 147 → 64 → 64 → out, tanh — SB3's MlpPolicy default; its NatureCNN does not take 7x7 images),
same rollout (4 envs × 128 steps), 4 epochs, minibatch 64, one torch thread each, measured in one run in
alternating order; the ratio is the median over repeats of each repeat's paired ratio. Writes
bench/results/student.json with machine info, raw timings, the ratio, the target (1.5×) and pass/fail.

Usage: python bench/student.py [--frames 16384] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from minigrid.wrappers import ImgObsWrapper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmrl.agents.student import MLPStudent  # noqa: E402
from llmrl.algos.distilled_ppo import make_vector_env, train  # noqa: E402
from llmrl.config.ppo import PPOParams  # noqa: E402
from llmrl.envs.make import make_env
from llmrl.files import write_json  # noqa: E402

ENV_ID = "MiniGrid-DoorKey-5x5-v0"
N_ENVS, N_STEPS, EPOCHS, MINIBATCH, HIDDEN = 4, 128, 4, 64, (64, 64)
TARGET = 1.5


def make_one() -> gym.Env:
    return ImgObsWrapper(make_env(ENV_ID))


def run_llmrl(frames: int, seed: int) -> float:
    envs = make_vector_env(make_one, N_ENVS)
    agent = MLPStudent(int(np.prod(envs.single_observation_space.shape)), int(envs.single_action_space.n), HIDDEN)
    cfg = PPOParams(total_frames=frames, num_envs=N_ENVS, num_steps=N_STEPS, epochs=EPOCHS, minibatch_size=MINIBATCH,
                    lr=3e-4, entropy_coef=0.0)
    start = time.perf_counter()
    history = list(train(agent, envs, cfg, seed=seed, progress=False))
    seconds = time.perf_counter() - start
    envs.close()
    return history[-1]["frames"] / seconds


def run_sb3(frames: int, seed: int) -> float:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    envs = make_vec_env(make_one, n_envs=N_ENVS, seed=seed)
    model = PPO("MlpPolicy", envs, n_steps=N_STEPS, batch_size=MINIBATCH, n_epochs=EPOCHS, learning_rate=3e-4,
                ent_coef=0.0, policy_kwargs={"net_arch": {"pi": list(HIDDEN), "vf": list(HIDDEN)},
                                             "activation_fn": torch.nn.Tanh},
                seed=seed, device="cpu", verbose=0)
    frames = (frames // (N_ENVS * N_STEPS)) * N_ENVS * N_STEPS
    start = time.perf_counter()
    model.learn(total_timesteps=frames)
    seconds = time.perf_counter() - start
    envs.close()
    return model.num_timesteps / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    raw: dict[str, list[float]] = {"llmrl_fps": [], "sb3_fps": []}
    run_sb3(N_ENVS * N_STEPS, 0)  # warm-up: imports and first-call costs, paid by neither timed run
    for r in range(args.repeats):
        # Alternate which goes first so slow drift of a shared machine's speed does not favour either side.
        order = (("sb3_fps", run_sb3), ("llmrl_fps", run_llmrl))
        for key, run in order if r % 2 == 0 else order[::-1]:
            raw[key].append(run(args.frames, r))
        print(f"repeat {r}: llmrl {raw['llmrl_fps'][-1]:.0f} fps, sb3 {raw['sb3_fps'][-1]:.0f} fps", flush=True)
    ours, ref = float(np.median(raw["llmrl_fps"])), float(np.median(raw["sb3_fps"]))
    # Each repeat's two runs are adjacent in time, so their ratio cancels most of the machine's load changes.
    paired = [a / b for a, b in zip(raw["llmrl_fps"], raw["sb3_fps"])]
    ratio = float(np.median(paired))
    import stable_baselines3

    result = {
        "benchmark": "student PPO training throughput vs Stable-Baselines3 PPO",
        "env_id": ENV_ID,
        "setup": {"n_envs": N_ENVS, "n_steps": N_STEPS, "epochs": EPOCHS, "minibatch": MINIBATCH,
                  "actor_critic_mlp": list(HIDDEN), "frames_per_run": args.frames, "repeats": args.repeats,
                  "torch_threads": 1},
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
                    "sb3": stable_baselines3.__version__, "load_avg_1m": os.getloadavg()[0]},
        "raw": raw,
        "paired_ratios": paired,
        "llmrl_fps": ours,
        "sb3_fps": ref,
        "ratio": ratio,  # median of the paired ratios
        "target": TARGET,
        "pass": ratio >= TARGET,
    }
    write_json(ROOT / "bench" / "results" / "student.json", result)
    print(f"llmrl {ours:.0f} fps / sb3 {ref:.0f} fps = {ratio:.2f}x (target {TARGET}x): "
          f"{'PASS' if result['pass'] else 'FAIL'}")


if __name__ == "__main__":
    main()
