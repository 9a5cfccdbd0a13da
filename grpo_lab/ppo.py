"""PPO's critic, the part GRPO drops: generalized advantage estimation and the value loss.

PPO (Schulman et al. 2017) for language models (Ouyang et al. 2022) learns a value function
V(s_t) of each prefix and turns the rewards into per-token advantages with GAE(lambda)
(Schulman et al. 2016, eq. 16):

    delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)           (V after the last token is 0)
    A_t     = delta_t + gamma * lambda * A_{t+1}           = sum_l (gamma lambda)^l delta_{t+l}
    R_t     = A_t + V(s_t)                                 (the critic's regression target)

and trains the critic with a clipped value loss (as PPO2 / TRL's PPOTrainer):

    L_V = 1/2 * mean_t max((V - R)^2, (clip(V, V_old - eps, V_old + eps) - R)^2)

GRPO replaces V by the group's mean reward (advantages.py): no critic to hold, train or run,
which is its real saving (claims 10 and 21 measure what that costs or buys). This module holds
the pure functions and the critic's head; training PPO through the one trainer is open work.
Shapes: N completions, T completion tokens; ``mask`` (N, T) True on real tokens, a completion's
tokens first and padding after them.
"""
from __future__ import annotations

import torch
import torch.nn as nn


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards and values (N, T), mask (N, T) -> (advantages (N, T), returns (N, T)),
    0 on padding. An outcome reward is a reward on the completion's last token."""
    if rewards.shape != values.shape or rewards.shape != mask.shape or rewards.dim() != 2:
        raise ValueError(f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and mask "
                         f"{tuple(mask.shape)} must be one (N, T) shape")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"need gamma and lambda in [0, 1], got gamma={gamma}, lambda={lam}")
    m = mask.to(values.dtype)
    r, v = torch.where(mask, rewards, 0.0), torch.where(mask, values, 0.0)        # (N, T)
    next_v = torch.cat([v[:, 1:] * m[:, 1:], torch.zeros_like(v[:, :1])], 1)       # (N, T)
    delta = (r + gamma * next_v - v) * m                                          # (N, T)
    T = delta.shape[1]
    adv = torch.zeros_like(delta)
    a_next = torch.zeros_like(delta[:, 0])                                        # (N,) A_{t+1}
    for t in reversed(range(T)):                       # A_t = delta_t + gamma lambda A_{t+1}
        cont = m[:, t + 1] if t + 1 < T else torch.zeros_like(a_next)             # next is real
        a_next = delta[:, t] + gamma * lam * cont * a_next
        adv[:, t] = a_next
    adv = adv * m
    return adv, (adv + v) * m


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               mask: torch.Tensor, clip: float = 0.2) -> torch.Tensor:
    """Clipped value loss (module docstring), the mean over real tokens."""
    if clip < 0:
        raise ValueError(f"value clip must be >= 0, got {clip}")
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    per_tok = torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)    # (N, T)
    m = mask.to(values.dtype)
    return 0.5 * (per_tok * m).sum() / m.sum().clamp(min=1)


class ValueHead(nn.Module):
    """A scalar value per position from the policy's hidden states (B, T, C) -> (B, T)."""

    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden).squeeze(-1)                                      # (B, T)
