"""The harness's protocol with many environments stepped in lockstep, for policies that act in batches.

An LLM policy scores many prompts per forward far faster than one at a time, so ``evaluate_batched`` keeps
``n_envs`` episodes running and asks the policy for all their actions at once. The protocol is the harness's
(``llmrl.eval.harness``): episode i starts from ``env.reset(seed=seeds[i])``, success and the step cap are
judged the same way, and the result is the same ``EvalResult`` in seed order. A policy whose actions in an
episode depend only on that episode's seed (``LLMBatchPolicy`` seeds its sampler per episode) gives the
same episodes here as under ``evaluate``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import gymnasium as gym
from tqdm.auto import tqdm

from llmrl.envs.make import episode_success
from llmrl.eval.harness import EpisodeRecord, EvalResult, Mode

__all__ = ["BatchPolicy", "evaluate_batched"]


class BatchPolicy(Protocol):
    name: str

    def reset(self, slot: int, env: gym.Env, seed: int) -> None:
        """Start an episode in environment ``slot``; ``seed`` seeds any sampling the policy does in it."""

    def act_batch(self, slots: list[int], observations: list[Any], *, greedy: bool) -> list[Any]:
        """One action per listed slot, for its current observation."""


def evaluate_batched(
    policy: BatchPolicy,
    make_env: Callable[[], gym.Env],
    seeds: Sequence[int],
    *,
    mode: Mode = "greedy",
    max_steps: int | None = None,
    n_envs: int = 16,
    progress: bool = True,
) -> EvalResult:
    """Evaluate ``policy`` for one episode per seed, ``n_envs`` episodes at a time."""
    if mode not in ("greedy", "sampled"):
        raise ValueError(f"evaluate_batched: mode must be 'greedy' or 'sampled', got {mode!r}")
    if len(seeds) == 0:
        raise ValueError("evaluate_batched: seeds is empty")
    if n_envs < 1:
        raise ValueError(f"evaluate_batched: n_envs must be >= 1, got {n_envs}")
    envs = [make_env() for _ in range(min(n_envs, len(seeds)))]
    spec = envs[0].spec
    result = EvalResult(policy=policy.name, env_id=spec.id if spec else str(envs[0]), mode=mode)
    records: list[EpisodeRecord | None] = [None] * len(seeds)
    pending = iter(range(len(seeds)))
    # slot -> [episode index, observation, return, steps]
    running: dict[int, list] = {}

    def start(slot: int) -> None:
        i = next(pending, None)
        if i is None:
            running.pop(slot, None)
            return
        obs, _ = envs[slot].reset(seed=int(seeds[i]))
        policy.reset(slot, envs[slot], int(seeds[i]))
        running[slot] = [i, obs, 0.0, 0]

    for slot in range(len(envs)):
        start(slot)
    bar = tqdm(total=len(seeds), desc=f"eval {policy.name} {mode}", disable=not progress, leave=False)
    while running:
        slots = sorted(running)
        actions = policy.act_batch(slots, [running[s][1] for s in slots], greedy=mode == "greedy")
        for slot, action in zip(slots, actions):
            ep = running[slot]
            obs, reward, terminated, truncated, info = envs[slot].step(action)
            ep[1], ep[2], ep[3] = obs, ep[2] + float(reward), ep[3] + 1
            if max_steps is not None and ep[3] >= max_steps and not terminated:
                truncated = True
            if terminated or truncated:
                records[ep[0]] = EpisodeRecord(seed=int(seeds[ep[0]]), episode_return=ep[2], length=ep[3],
                                               success=episode_success(info, float(reward), terminated))
                bar.update(1)
                start(slot)
    bar.close()
    for env in envs:
        env.close()
    result.episodes = [r for r in records if r is not None]
    return result
