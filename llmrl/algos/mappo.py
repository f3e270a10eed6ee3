"""MAPPO for MPE simple_spread with an optional per-agent teacher (LLM4Teach's loss, multi-agent).

One actor shared by all agents sees its own observation plus a one-hot agent id; the centralised critic
sees every agent's observation plus the id and the episode clock, and predicts that agent's return. The clock
is part of the state of this fixed-horizon task (Pardo et al. 2018, "Time Limits in Reinforcement
Learning"): without it the critic cannot tell 24 steps of reward left from 1, and GAE's bootstrap is biased
enough that, measured on validation episodes at the CPU budget, plain MAPPO ended below random and more
update epochs made it worse; with it the same settings beat random. Agents are
stacked into the batch dimension, so the loss is exactly ``llmrl.algos.distilled_ppo.ppo_loss`` — PPO + λ_k ·
H(π_T, π_θ) with the same ``DistillParams`` — and λ₀ = 0 (or no teacher) is plain MAPPO. Advantages are
GAE per agent stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from llmrl.agents.student import MLPStudent
from llmrl.algos.distilled_ppo import Teacher, act_into, distill_coef, rollout_buffers, update_from_rollout
from llmrl.config.ppo import DistillParams, PPOParams
from llmrl.envs.mpe import SpreadBatch

__all__ = ["make_mappo_agent", "train", "greedy_joint_policy"]


def mappo_inputs(obs: np.ndarray, clock: np.ndarray) -> np.ndarray:
    """[env, agent, D] observations and [env] clocks → [env, agent, (D + A) + (A·D + A + 1)]: actor | critic."""
    E, A, D = obs.shape
    ids = np.broadcast_to(np.eye(A, dtype=np.float32), (E, A, A))
    state = np.broadcast_to(obs.reshape(E, 1, A * D), (E, A, A * D))
    time = np.broadcast_to(np.asarray(clock, dtype=np.float32).reshape(E, 1, 1), (E, A, 1))
    return np.concatenate([obs, ids, state, ids, time], axis=-1)


def make_mappo_agent(obs_dim: int, n_agents: int, n_actions: int, hidden: tuple[int, ...] = (64, 64)) -> MLPStudent:
    return MLPStudent(obs_dim + n_agents, n_actions, hidden, critic_dim=n_agents * obs_dim + n_agents + 1)


def train(agent: nn.Module, envs: SpreadBatch, cfg: PPOParams, *, seed: int,
          teacher: Teacher | None = None, distill: DistillParams | None = None,
          progress: bool = True) -> Iterator[dict]:
    """Train the shared actor and centralised critic in place, yielding one metrics row per iteration (the
    vocabulary of ``distilled_ppo.train``; return_mean is the mean team return of the episodes that ended).

    ``cfg.num_envs`` must equal ``envs.num_envs``; ``cfg.total_frames`` counts joint steps × agents.
    ``teacher`` maps raw per-agent observations [B, D] to π_T [B, n_actions].
    """
    if envs.num_envs != cfg.num_envs:
        raise ValueError(f"num_envs: config says {cfg.num_envs}, env batch has {envs.num_envs}")
    distill = distill or DistillParams(initial=0.0)
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(agent.parameters(), lr=cfg.lr, eps=cfg.adam_eps, fused=True)
    T, E, A = cfg.num_steps, envs.num_envs, envs.n_agents
    S = E * A  # agent streams
    iterations = max(1, cfg.total_frames // (T * S))

    obs = envs.reset(seed=seed)
    in_dim = mappo_inputs(obs, envs.clock()).shape[-1]
    buf = rollout_buffers(T, S, (in_dim,), np.float32, envs.n_actions)
    frames, start = 0, time.perf_counter()

    for it in tqdm(range(iterations), desc="mappo", disable=not progress, leave=False):
        coef = distill_coef(distill, it) if teacher is not None else 0.0
        finished: list[float] = []
        for t in range(T):
            buf["obs"][t] = mappo_inputs(obs, envs.clock()).reshape(S, in_dim)
            if coef > 0:
                buf["teacher"][t] = teacher(obs.reshape(S, -1))
            obs, reward, done, ended = envs.step(act_into(agent, buf, t, gen).reshape(E, A))
            finished += ended
            buf["rewards"][t] = reward.reshape(S) * cfg.reward_scale
            buf["dones"][t] = np.repeat(done, A)
        frames += T * S

        with torch.inference_mode():
            last_value = agent(torch.as_tensor(mappo_inputs(obs, envs.clock())).reshape(S, in_dim))[1].numpy()
        losses = update_from_rollout(agent, optimizer, buf, last_value, cfg, coef, gen)

        stats = {"iteration": it + 1, "frames": frames, "distill_coef": coef, **losses,
                 "episodes": len(finished), "fps": frames / (time.perf_counter() - start)}
        if finished:
            stats["return_mean"] = float(np.mean(finished))
        yield stats


def greedy_joint_policy(agent: nn.Module) -> Callable[[np.ndarray], np.ndarray]:
    """The trained shared actor as a joint policy ``obs [A, D] -> actions [A]`` (argmax per agent)."""
    agent.eval()
    no_clock = np.zeros(1, dtype=np.float32)  # the critic's input only; the actor never reads it

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return agent(torch.as_tensor(mappo_inputs(obs[None], no_clock)[0]))[0].argmax(-1).numpy()

    return act
