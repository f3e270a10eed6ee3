"""MPE ``simple_spread_v3`` (mpe2, PettingZoo parallel API) as a batch of episodes for multi-agent PPO.

N agents must cover N landmarks; each agent's reward is ``local_ratio`` × its collision penalty plus
(1 − ``local_ratio``) × the shared negative sum of landmark-to-nearest-agent distances. Episodes last
``max_cycles`` steps and always end by that time limit, which is part of the task (the observation has no
clock), so it is treated as the end of the episode. Actions are discrete: no-op, left, right, down, up.

``SpreadBatch`` steps ``num_envs`` independent copies in one process and returns arrays shaped
[env, agent, ...]; finished episodes reset in the same step. ``clock()`` is each episode's elapsed share of
``max_cycles``: the agents do not see it, but a critic needs it (below).
"""

from __future__ import annotations

import numpy as np
from mpe2 import simple_spread_v3

__all__ = ["ENV_ID", "N_ACTIONS", "SpreadBatch"]

ENV_ID = "simple_spread_v3"
N_ACTIONS = 5  # no-op, left, right, down, up


def make_spread(n_agents: int = 3, max_cycles: int = 25, local_ratio: float = 0.5):
    """The PettingZoo parallel env with discrete actions."""
    return simple_spread_v3.parallel_env(N=n_agents, local_ratio=local_ratio, max_cycles=max_cycles,
                                         continuous_actions=False)


class SpreadBatch:
    """``num_envs`` simple_spread episodes stepped together; episode i of env e is seeded from ``seed``."""

    def __init__(self, num_envs: int, n_agents: int = 3, max_cycles: int = 25, local_ratio: float = 0.5):
        if num_envs < 1:
            raise ValueError(f"num_envs: must be >= 1, got {num_envs}")
        self.envs = [make_spread(n_agents, max_cycles, local_ratio) for _ in range(num_envs)]
        self.agents = [f"agent_{i}" for i in range(n_agents)]
        self.num_envs, self.n_agents = num_envs, n_agents
        self.obs_dim = self.envs[0].observation_space(self.agents[0]).shape[0]
        self.n_actions = int(self.envs[0].action_space(self.agents[0]).n)
        self.max_cycles = max_cycles
        self.rng = np.random.default_rng(0)
        self.elapsed = np.zeros(num_envs, dtype=np.int64)

    def clock(self) -> np.ndarray:
        """[env] steps taken in each current episode / ``max_cycles``, in [0, 1)."""
        return (self.elapsed / self.max_cycles).astype(np.float32)

    def _reset_one(self, e: int) -> np.ndarray:
        obs, _ = self.envs[e].reset(seed=int(self.rng.integers(2**31)))
        return np.stack([obs[a] for a in self.agents])

    def reset(self, seed: int) -> np.ndarray:
        """[env, agent, obs_dim] first observations; ``seed`` fixes every later episode too."""
        self.rng = np.random.default_rng(seed)
        self.returns = np.zeros(self.num_envs)
        self.elapsed[:] = 0
        return np.stack([self._reset_one(e) for e in range(self.num_envs)]).astype(np.float32)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[float]]:
        """Apply [env, agent] actions → (obs, rewards [env, agent], done [env], returns of finished episodes).

        A finished episode's return is the sum over its steps of the agents' mean reward.
        """
        obs_out, rew_out = [], []
        done = np.zeros(self.num_envs, dtype=bool)
        finished = []
        self.elapsed += 1
        for e, env in enumerate(self.envs):
            obs, rew, term, trunc, _ = env.step({a: int(actions[e, i]) for i, a in enumerate(self.agents)})
            rewards = np.array([rew[a] for a in self.agents], dtype=np.float32)
            self.returns[e] += rewards.mean()
            if any(term.values()) or any(trunc.values()):
                done[e] = True
                finished.append(float(self.returns[e]))
                self.returns[e], self.elapsed[e] = 0.0, 0
                obs_out.append(self._reset_one(e))
            else:
                obs_out.append(np.stack([obs[a] for a in self.agents]))
            rew_out.append(rewards)
        return np.stack(obs_out).astype(np.float32), np.stack(rew_out), done, finished
