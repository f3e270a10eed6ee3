"""Stable-Baselines3 PPO as the RL baseline of ProPS, stopped at the same episode budget.

PPO trains on one environment whose episodes are seeded like a ProPS search's (search seed s: episode k of
training resets with ``s * 1_000_000 + k``) and stops as soon as ``budget_episodes`` episodes have finished:
every training episode counts, as every ProPS evaluation episode does. One row per PPO rollout, with the
shared vocabulary (``step``, ``episodes``, ``env_steps``, ``return_mean`` of the episodes finished in that
rollout, ``best_return`` the best such mean so far, ``seconds``). The final policy is PPO's deterministic
policy, evaluated by ``llmrl.eval.props.evaluate_ppo`` on the held-out seeds. Episodes run at the task's horizon
(``ControlTask.horizon``), the one the LLM methods' prompts state.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import gymnasium as gym
import numpy as np

from llmrl.algos.props_search import SEED_STRIDE
from llmrl.config.props import PPOBaselineParams
from llmrl.envs.control import ControlTask, as_task, make_control_env

__all__ = ["ppo_baseline"]


class _SeededResets(gym.Wrapper):
    """Reset episode k with ``base + k`` (SB3's DummyVecEnv resets without a seed after the first episode)."""

    def __init__(self, env: gym.Env, base: int):
        super().__init__(env)
        self.base, self.count = base, 0

    def reset(self, **kwargs):
        kwargs["seed"] = self.base + self.count
        self.count += 1
        return self.env.reset(**kwargs)


def ppo_baseline(
    task: str | ControlTask,
    seed: int,
    budget_episodes: int,
    p: PPOBaselineParams,
    *,
    model_out: list | None = None,
) -> Iterator[dict]:
    """Train SB3 PPO until ``budget_episodes`` episodes finished; the trained model goes to ``model_out``."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger

    t = as_task(task)
    env = _SeededResets(make_control_env(t), seed * SEED_STRIDE)
    model = PPO("MlpPolicy", env, learning_rate=p.learning_rate, n_steps=p.n_steps, batch_size=p.batch_size,
                n_epochs=p.n_epochs, gamma=p.gamma, policy_kwargs={"net_arch": list(p.net_arch)}, seed=seed,
                device="cpu", verbose=0)
    # Rows go out through the callback; without a logger of its own every learn() call makes a /tmp/SB3-* folder.
    model.set_logger(Logger(folder=None, output_formats=[]))
    rows: list[dict] = []

    class Budget(BaseCallback):
        """Counts finished episodes, stops at the budget, and emits a row per rollout."""

        def __init__(self):
            super().__init__()
            self.episodes, self.env_steps, self.rollout, self.best = 0, 0, 0, -np.inf
            self.returns: list[float] = []
            self.current = 0.0
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            self.env_steps += 1
            self.current += float(self.locals["rewards"][0])
            if self.locals["dones"][0]:
                self.returns.append(self.current)
                self.current = 0.0
                self.episodes += 1
            return self.episodes < budget_episodes

        def _on_rollout_end(self) -> None:
            self._emit()

        def _emit(self) -> None:
            if not self.returns:
                return
            self.rollout += 1
            mean = float(np.mean(self.returns))
            self.best = max(self.best, mean)
            rows.append({"task": t.key, "method": "ppo", "seed": seed, "step": self.rollout,
                         "episodes": self.episodes, "env_steps": self.env_steps, "return_mean": mean,
                         "best_return": self.best, "seconds": time.perf_counter() - self.t0})
            self.returns = []
            self.t0 = time.perf_counter()

    cb = Budget()
    # Learn in chunks of one rollout so rows stream out; the callback stops training at the budget.
    while cb.episodes < budget_episodes:
        model.learn(total_timesteps=p.n_steps, callback=cb, reset_num_timesteps=False)
        if cb.episodes >= budget_episodes:
            cb._emit()  # the rollout cut short by the budget
        yield from rows
        rows.clear()
    env.close()
    if model_out is not None:
        model_out.append(model)
