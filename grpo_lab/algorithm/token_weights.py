"""Weights on the policy-gradient term of each token, computed before the loss (no grad).

``loss.grpo_loss`` multiplies its per-token surrogate by ``tis_weight`` (N, T), detached; the
step builds that weight here from two independent choices, each a record with one signature:

1. Sampler / trainer mismatch (``cfg.tis.level``, ``IS_LEVELS``; on when ``cfg.tis.cap`` = C > 0):
   with w_it = pi_trainer(o_it) / pi_sampler(o_it) (the trainer's old log-probs against the
   sampler's) and W_i = prod_t w_it, each mode named as the reference that computes it:
     verl's (verl/trainer/ppo/rollout_corr_helper.py; log w clamped to [-20, 20] before exp
     or before the mean, as its SAFETY_BOUND):
     * ``token``       min(w_it, C) per token (Yao et al. 2025, "Your efficient RL framework
                       secretly brings you off-policy RL training"; verl's
                       ``compute_rollout_correction_weights`` with rollout_is="token");
     * ``sequence``    min(W_i, C) on every token of the completion (rollout_is="sequence"):
                       the completion was sampled as a whole, so its weight is the product;
     * ``seq_mean_k1`` rejection by the geometric mean (``compute_rollout_rejection_mask``
                       with rollout_rs="seq_mean_k1" and one threshold C, i.e. bounds
                       [1/C, C]): a completion whose mean_t log(pi_sampler / pi_trainer) lies
                       outside [log(1/C), log C] (bounds included) is rejected: it leaves the
                       loss *and its normaliser* (verl writes the rejection into the
                       response mask, so token-mean divides by the kept tokens and the
                       per-sequence means by the kept sequences); kept tokens get weight 1.
     TRL's (TRL 1.16 grpo_trainer.py, ``vllm_importance_sampling_mode`` with
     ``vllm_importance_sampling_clip_max`` = C and ``..._clip_min`` = ``tis.floor`` = F, 0 =
     None; no clamp of log w):
     * ``token_truncate``    clamp(w_it, F, C) per token (= ``token`` at F = 0);
     * ``sequence_truncate`` clamp(W_i, F, C) on every token (= ``sequence`` at F = 0);
     * ``token_mask``        w_it where F <= w_it <= C, else 0;
     * ``sequence_mask``     W_i on every token where F <= W_i <= C, else 0 (TRL's default
                             mode: the product, not the geometric mean; the kept completion is
                             weighted by W_i, not 1).
     TRL's masked tokens stay in the normaliser (TRL multiplies the per-token loss by the
     weight and keeps its mask), as every mode but ``seq_mean_k1`` does here.
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

import math
from dataclasses import dataclass
from typing import Callable

import torch

from grpo_lab.algorithm.loss import _first_non_finite
from grpo_lab.registry import check_number, lookup

SAFETY_BOUND = 20.0     # verl: log w clamped to [-20, 20] before exp (e^20 = 4.9e8)


def token_is(log_w, mask, cap, floor):
    w = torch.exp(log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND))                # (N, T) verl
    return w.clamp(max=cap)                                                # (N, T) min(w, C)


def sequence_is(log_w, mask, cap, floor):
    log_seq = (log_w * mask).sum(1, keepdim=True)                          # (N, 1) log prod_t w
    w = torch.exp(log_seq.clamp(-SAFETY_BOUND, SAFETY_BOUND))              # (N, 1) verl
    return w.clamp(max=cap).expand_as(log_w)                               # (N, T)


def seq_mean_k1(log_w, mask, cap, floor):
    k1 = -log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND)                         # (N, T) log(pi_s / pi_t)
    stat = (k1 * mask).sum(1, keepdim=True) / (mask.sum(1, keepdim=True) + 1e-8)  # (N, 1) verl's
    inside = (stat >= math.log(1.0 / cap)) & (stat <= math.log(cap))       # masked_mean; [1/C, C]
    return inside.to(log_w.dtype).expand_as(log_w)                         # (N, T) 1 or 0


def _trl(level: str, mask_out: bool):
    """TRL's mode ``level`` (token or sequence ratio) truncated to [F, C] or masked outside it."""
    def weight(log_w, mask, cap, floor):
        if level == "sequence":
            log_w = (log_w * mask).sum(1, keepdim=True)                    # (N, 1) log W_i
        w = torch.exp(log_w)                                               # (N, T) or (N, 1)
        if mask_out:
            w = w.masked_fill((w < floor) | (w > cap), 0.0)                # outside [F, C]: 0
        else:
            w = w.clamp(floor or None, cap)                                # clamp(w, F, C)
        return w.expand_as(mask)                                           # (N, T)
    return weight


@dataclass(frozen=True)
class ISLevel:
    """One way to weigh the sampler/trainer mismatch, named as the reference that computes it."""
    name: str
    fn: Callable                  # (log_w (N, T) pad 0, mask (N, T) float, cap, floor) -> (N, T)
    reference: str                # where the formula is
    reads_floor: bool = False     # tis.floor (TRL's clip_min) is read
    rejects: bool = False         # rejected rows leave the loss and its normaliser (verl)


IS_LEVELS: dict[str, ISLevel] = {m.name: m for m in (
    ISLevel("token", token_is, "verl rollout_is='token'"),
    ISLevel("sequence", sequence_is, "verl rollout_is='sequence'"),
    ISLevel("seq_mean_k1", seq_mean_k1, "verl rollout_rs='seq_mean_k1'", rejects=True),
    ISLevel("token_truncate", _trl("token", False), "TRL token_truncate", reads_floor=True),
    ISLevel("sequence_truncate", _trl("sequence", False), "TRL sequence_truncate",
            reads_floor=True),
    ISLevel("token_mask", _trl("token", True), "TRL token_mask", reads_floor=True),
    ISLevel("sequence_mask", _trl("sequence", True), "TRL sequence_mask", reads_floor=True),
)}


def is_weight(level: str, trainer_logp, sampler_logp, mask, cap: float,
              floor: float = 0.0) -> torch.Tensor:
    """(N, T) log-probs of the trainer and the sampler -> (N, T) weights (0 on padding)."""
    fn = lookup(IS_LEVELS, level, "tis.level").fn
    if not (trainer_logp.dim() == 2 and trainer_logp.shape == sampler_logp.shape == mask.shape):
        raise ValueError(f"trainer_logp, sampler_logp and mask must be one (N, T) shape (not "
                         f"broadcast), got {tuple(trainer_logp.shape)}, "
                         f"{tuple(sampler_logp.shape)} and {tuple(mask.shape)}")
    check_number("cap", cap, lambda x: x > 0, "a finite number > 0")   # seq_mean_k1: log(1 / cap)
    check_number("floor", floor, what="a finite number >= 0 (0 = none)")
    m = mask.bool()
    log_w = torch.where(m, trainer_logp - sampler_logp, 0.0)               # (N, T) log w, pad 0
    return torch.where(m, fn(log_w, m.to(log_w.dtype), cap, floor), 0.0)


def rejected_rows(level: str, trainer_logp, sampler_logp, mask, cap: float) -> torch.Tensor:
    """(N,) bool: the completions a rejecting level (``seq_mean_k1``) takes out of the loss and
    its normaliser; all False for the others."""
    if not lookup(IS_LEVELS, level, "tis.level").rejects:
        return torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
    w = is_weight(level, trainer_logp, sampler_logp, mask, cap)            # (N, T) 1 or 0
    return mask.bool().any(1) & ~(w > 0).any(1)                            # (N,)


def off_policy_sequence_mask(logp, sampler_logp, advantages, mask, delta: float):
    """(N, T) log-probs of the policy and the sampler, (N,) advantages -> (N, T) 1.0, or 0 on
    every token of a completion with A < 0 and mean log(pi_sampler / pi) > delta."""
    if advantages.shape != mask.shape[:1]:
        raise ValueError("off_policy_mask reads one advantage per completion (outcome "
                         "supervision), got advantages of shape " f"{tuple(advantages.shape)} "
                         f"for mask {tuple(mask.shape)}: it must be (N,) = ({mask.shape[0]},)")
    check_number("delta", delta)                 # NaN > delta is False: every row was kept
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
    hm = h[m]                                                              # (n_real,)
    if not torch.isfinite(hm).all():             # a NaN quantile would mask every token
        _first_non_finite("entropy", h, m)
    threshold = torch.quantile(hm.float(), 1 - quantile).to(h.dtype)       # () over real tokens
    return (m & (h >= threshold)).to(h.dtype)                              # (N, T)
