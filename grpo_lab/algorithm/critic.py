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
the pure functions (the critic's modules are policies/model.py's); PPO as an objective of the one trainer
(``objective="ppo"``: ``collect_ppo`` and ``ppo_objective``) is ppo.py.
The critic (``cfg.ppo.critic``) is a ``ValueHead`` on the policy's own final hidden states
("head": a shared body, nearly free) or a ``ValueNetwork``, a second GPT started from the base
checkpoint with its own head ("network": the classic RLHF setup of Ouyang et al. 2022, a critic
as big as the policy, whose parameters, AdamW state and activations GRPO does not hold). The
trainer attaches either as ``policy.value_head``, so the one optimizer trains it (its own lr:
``cfg.ppo.vf_lr``) and checkpoints hold it. One process, the toy policy.
Shapes: N completions, T completion tokens; ``mask`` (N, T) True on real tokens, a completion's
tokens first and padding after them.
"""
from __future__ import annotations

import torch

from grpo_lab.policies.engine import chosen_logprobs, full_sequence
from grpo_lab.policies.model import ValueHead


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
    next_m = torch.cat([m[:, 1:], torch.zeros_like(m[:, :1])], 1)                 # (N, T) t+1 real
    next_v = torch.cat([v[:, 1:] * m[:, 1:], torch.zeros_like(v[:, :1])], 1)       # (N, T)
    delta = (r + gamma * next_v - v) * m                                          # (N, T)
    adv, a_next = torch.zeros_like(delta), torch.zeros_like(delta[:, 0])          # a_next: A_{t+1}
    for t in reversed(range(delta.shape[1])):          # A_t = delta_t + gamma lambda A_{t+1}
        a_next = delta[:, t] + gamma * lam * next_m[:, t] * a_next
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


def logprobs_and_values(policy, r, temperature: float = 1.0):
    """One forward over prompt+completion -> per-token log-probs, entropy and values, each
    (N, Tc); the value of token t is V(prefix before t), read at the position predicting t."""
    ids, pos, mask = full_sequence(r, next(policy.parameters()).device)   # (N, Tp+Tc) each
    logits, _, h = policy(ids, pos, mask, return_hidden=True)              # (N, Tp+Tc, V|C)
    critic = policy.value_head
    v_all = critic(h.float()) if isinstance(critic, ValueHead) else critic(ids, pos, mask)
    Tp = r.prompt_ids.shape[1]
    c_ids, c_mask = r.completion_ids.to(logits.device), r.completion_mask.to(logits.device)
    tok_logp, entropy = chosen_logprobs(logits[:, Tp - 1:-1], c_ids, temperature)  # (N, Tc) each
    values = v_all[:, Tp - 1:-1].masked_fill(~c_mask, 0.0)                 # (N, Tc)
    return tok_logp.masked_fill(~c_mask, 0.0), entropy.masked_fill(~c_mask, 0.0), values


def outcome_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N,) rewards -> (N, T): each on its completion's last real token."""
    out = torch.zeros(mask.shape, dtype=torch.float32)
    last = (mask.sum(1) - 1).clamp(min=0)
    out[torch.arange(len(last)), last] = rewards.float()
    return torch.where(mask, out, 0.0)


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the real tokens; 0 on padding."""
    real = x[mask]
    return torch.where(mask, (x - real.mean()) / (real.std(unbiased=False) + eps), 0.0)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - var(returns - values) / var(returns) over real tokens (1: perfect, 0: a constant);
    0 when the returns do not vary (up to float rounding: the ratio would be noise)."""
    var = returns[mask].var(unbiased=False)
    return float(1 - (returns - values)[mask].var(unbiased=False) / var) if var > 1e-8 else 0.0
