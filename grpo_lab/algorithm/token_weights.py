"""Weights on the policy-gradient term of each token, computed before the loss (no grad).

``loss.grpo_loss`` multiplies its per-token surrogate by ``tis_weight`` (N, T), detached; the
step builds that weight here from two independent choices, each a record with one signature:

1. Sampler / trainer mismatch (``cfg.tis.level``, ``IS_LEVELS``; on when ``cfg.tis.cap`` = C > 0):
   with w_it = pi_trainer(o_it) / pi_sampler(o_it) (the trainer's old log-probs against the
   sampler's),
     * ``token``    truncated IS, min(w_it, C) per token (Yao et al. 2025, "Your efficient RL
                    framework secretly brings you off-policy RL training");
     * ``sequence`` sequence-level truncated IS, min(prod_t w_it, C) on every token of the
                    completion (verl's sequence-level rollout importance sampling): the
                    completion was sampled as a whole, so its weight is the product;
     * ``sequence_mask`` masking of off-policy sequences: weight 1 if the completion's
                    geometric-mean ratio exp(mean_t log w_it) lies in [1/C, C] (bounds
                    included), else 0: the whole completion leaves the policy gradient
                    (as verl's sequence-level rollout rejection with geometric-mean bounds).
                    Its tokens still count in the normaliser.
2. DeepSeek-V3.2's off-policy sequence mask (``cfg.off_policy_mask.delta`` > 0; DeepSeek-AI
   2025, eq. 9; TRL's ``off_policy_mask_threshold``): a completion with A < 0 whose mean
   log(pi_sampler / pi_theta) over its tokens exceeds delta (strictly) leaves the policy
   gradient: a negative advantage on a sample the policy has since moved far from teaches
   little and destabilises. Outcome supervision only (one A per completion).
3. The 80/20 high-entropy token mask (``cfg.top_entropy.quantile`` = q < 1; Wang et al. 2025,
   "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective RL for LLM
   Reasoning"; TRL's ``top_entropy_quantile``): only tokens whose entropy is at least the
   (1 - q) quantile of the real tokens' entropies (torch.quantile, linear interpolation) keep
   their policy gradient; the paper keeps q = 0.2. The KL and entropy terms are not masked,
   the normaliser still counts every token (as the paper's eq. and TRL).
   Deviation: the quantile is over the tokens of the loss's call (this rank's micro-batch),
   not the global batch as TRL gathers it; on one process with micro_batches = 1 they agree.
"""
from __future__ import annotations

from typing import Callable

import torch


def token_is(log_w, mask, cap):
    return torch.exp(log_w).clamp(max=cap)                                 # (N, T) min(w, C)


def sequence_is(log_w, mask, cap):
    log_seq = (log_w * mask).sum(1, keepdim=True)                          # (N, 1) log prod_t w
    return torch.exp(log_seq).clamp(max=cap).expand_as(log_w)              # (N, T)


def sequence_mask(log_w, mask, cap):
    n = mask.sum(1, keepdim=True).clamp(min=1)                             # (N, 1)
    log_geo = (log_w * mask).sum(1, keepdim=True) / n                      # (N, 1) mean log w
    inside = (log_geo >= -torch.log(torch.as_tensor(cap, dtype=log_w.dtype))) & \
             (log_geo <= torch.log(torch.as_tensor(cap, dtype=log_w.dtype)))  # (N, 1)
    return inside.to(log_w.dtype).expand_as(log_w)                         # (N, T) 1 or 0


IS_LEVELS: dict[str, Callable] = {"token": token_is, "sequence": sequence_is,
                                  "sequence_mask": sequence_mask}


def is_weight(level: str, trainer_logp, sampler_logp, mask, cap: float) -> torch.Tensor:
    """(N, T) log-probs of the trainer and the sampler -> (N, T) weights (0 on padding)."""
    m = mask.bool()
    log_w = torch.where(m, trainer_logp - sampler_logp, 0.0)               # (N, T) log w, pad 0
    return torch.where(m, IS_LEVELS[level](log_w, m.to(log_w.dtype), cap), 0.0)


def off_policy_sequence_mask(logp, sampler_logp, advantages, mask, delta: float):
    """(N, T) log-probs of the policy and the sampler, (N,) advantages -> (N, T) 1.0, or 0 on
    every token of a completion with A < 0 and mean log(pi_sampler / pi) > delta."""
    if advantages.dim() != 1:
        raise ValueError("off_policy_mask reads one advantage per completion (outcome "
                         "supervision), got advantages of shape " f"{tuple(advantages.shape)}")
    m = mask.bool()
    n = m.sum(1).clamp(min=1)                                              # (N,)
    kl = torch.where(m, sampler_logp - logp.detach(), 0.0).sum(1) / n      # (N,) mean log ratio
    keep = ~((advantages < 0) & (kl > delta))                              # (N,)
    return (m & keep[:, None]).to(logp.dtype)                              # (N, T)


def high_entropy_mask(entropy, mask, quantile: float) -> torch.Tensor:
    """(N, T) token entropies -> (N, T) 1.0 where the entropy is in the top ``quantile``
    fraction of the real tokens' (entropy >= their (1 - quantile) quantile), else 0."""
    if not 0 < quantile <= 1:
        raise ValueError(f"top_entropy_quantile must be in (0, 1] (1 = off), got {quantile}")
    m = mask.bool()
    h = entropy.detach()
    if quantile == 1 or not m.any():
        return m.to(h.dtype)
    threshold = torch.quantile(h[m].float(), 1 - quantile).to(h.dtype)     # () over real tokens
    return (m & (h >= threshold)).to(h.dtype)                              # (N, T)
