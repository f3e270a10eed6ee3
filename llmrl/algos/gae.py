"""Generalised advantage estimation, shared by every PPO in the project."""

from __future__ import annotations

import torch


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    last_value: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns for a [T, N] rollout of N environments.

    ``dones[t]`` is 1 where the episode ended at step t (the value after it is not bootstrapped);
    ``last_value`` [N] is V(s_T) for the state after the last step. ``lam=1`` gives Monte-Carlo returns
    minus the value baseline; ``lam=0`` gives one-step TD errors.
    """
    T = rewards.shape[0]
    adv = torch.zeros_like(rewards)
    next_adv = torch.zeros_like(last_value)
    next_value = last_value
    for t in reversed(range(T)):
        not_done = 1.0 - dones[t].float()
        delta = rewards[t] + gamma * next_value * not_done - values[t]
        next_adv = delta + gamma * lam * not_done * next_adv
        adv[t] = next_adv
        next_value = values[t]
    return adv, adv + values
