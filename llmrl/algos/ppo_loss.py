"""The clipped PPO objective (Schulman et al. 2017), the one both PPO variants minimise: LLM4Teach's distilled PPO
and MAPPO (``distilled_ppo``) and GLAM's PPO over an LLM's action scores (``ppo_llm``).

    ratio = exp(log π_θ(a|s) − log π_old(a|s))
    L_clip = −mean(min(ratio · A, clip(ratio, 1 − ε, 1 + ε) · A))
    L_V    = mean(max((V − R)², (V_old + clip(V − V_old, −ε, ε) − R)²))   (or mean((V − R)²) unclipped)

Each caller adds its own terms (entropy bonus, the teacher's cross-entropy) and statistics.
"""

from __future__ import annotations

import torch

__all__ = ["clipped_ppo_losses"]


def clipped_ppo_losses(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, values: torch.Tensor,
                       old_values: torch.Tensor, returns: torch.Tensor, clip: float, clip_value: bool = True
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ratio, clipped policy loss, value loss) of one minibatch; ``clip`` is ε for both the ratio and the value."""
    ratio = (logp - old_logp).exp()
    policy_loss = -torch.min(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages).mean()
    if clip_value:
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)
        value_loss = torch.max((values - returns).pow(2), (v_clipped - returns).pow(2)).mean()
    else:
        value_loss = (values - returns).pow(2).mean()
    return ratio, policy_loss, value_loss
