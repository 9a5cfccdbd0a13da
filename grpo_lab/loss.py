"""The GRPO loss (DeepSeekMath, Shao et al. 2024, eq. 3) on one screen.

    J = E[ 1/G sum_i 1/|o_i| sum_t { min(r_it A_it, clip(r_it, 1-eps_low, 1+eps_high) A_it)
                                      - beta * KL_it } ]
    r_it  = pi_theta(o_it | q, o_i<t) / pi_old(o_it | q, o_i<t)
    KL_it = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1          (eq. 4, the "k3" estimator)

We minimise -J. Deviations, each a documented option:
  * eps_low and eps_high may differ ("clip-higher", DAPO, Yu et al. 2025).
  * The 1/G * 1/|o_i| average is one of three sibling aggregations in ``AGGREGATIONS``:
      ``seq_mean_token_mean`` (the paper), ``token_mean`` (DAPO: every token weighs the
      same), ``dr_grpo`` (Dr. GRPO, Liu et al. 2025: a constant normaliser N * max_len, so
      long and short answers are not re-weighted).
"""
from __future__ import annotations

import torch


def seq_mean_token_mean(per_tok, mask, max_len):
    lengths = mask.sum(1).clamp(min=1)                                     # (N,)
    return ((per_tok * mask).sum(1) / lengths).mean()


def token_mean(per_tok, mask, max_len):
    return (per_tok * mask).sum() / mask.sum().clamp(min=1)


def dr_grpo_constant(per_tok, mask, max_len):
    return (per_tok * mask).sum() / (per_tok.shape[0] * max_len)


AGGREGATIONS = {"seq_mean_token_mean": seq_mean_token_mean, "token_mean": token_mean,
                "dr_grpo": dr_grpo_constant}


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, eps_low=0.2, eps_high=0.2,
              beta=0.0, aggregation="seq_mean_token_mean", max_len=None):
    """-> (loss, stats). logp, old_logp, ref_logp, mask: (N, T); advantages: (N,) for
    outcome supervision (one per completion) or (N, T) for process supervision.

    ``ref_logp`` may be None when beta == 0. ``max_len`` is the constant of the dr_grpo
    aggregation (default: T).
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; known: {sorted(AGGREGATIONS)}")
    if logp.shape != old_logp.shape or logp.shape != mask.shape or logp.dim() != 2:
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and "
                         f"mask {tuple(mask.shape)} must be one (N, T) shape")
    if advantages.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(f"advantages {tuple(advantages.shape)} must be (N,) or (N, T) = "
                         f"{tuple(logp.shape)}")
    if beta != 0 and (ref_logp is None or ref_logp.shape != logp.shape):
        raise ValueError("beta != 0 needs ref_logp of the same (N, T) shape as logp")
    mask = mask.to(logp.dtype)
    A = advantages[:, None] if advantages.dim() == 1 else advantages       # (N, 1) or (N, T)
    ratio = torch.exp(logp - old_logp)                                     # (N, T)
    surr = torch.min(ratio * A, ratio.clamp(1 - eps_low, 1 + eps_high) * A)  # (N, T)
    per_tok = -surr                                                        # (N, T)
    if beta != 0:
        d = ref_logp - logp                                                # (N, T) log(pi_ref/pi)
        kl = torch.exp(d) - d - 1                                          # (N, T) eq. 4, k3
        per_tok = per_tok + beta * kl
    else:
        kl = torch.zeros_like(logp)
    loss = AGGREGATIONS[aggregation](per_tok, mask, max_len or logp.shape[1])
    with torch.no_grad():
        n_tok = mask.sum().clamp(min=1)
        low = ((ratio < 1 - eps_low) & (A < 0)).to(mask.dtype)             # clipped below
        high = ((ratio > 1 + eps_high) & (A > 0)).to(mask.dtype)           # clipped above
        stats = {
            "loss/total": float(loss),
            "loss/kl": float((kl * mask).sum() / n_tok),
            "clip/low_frac": float((low * mask).sum() / n_tok),
            "clip/high_frac": float((high * mask).sum() / n_tok),
            "clip/ratio_mean": float((ratio * mask).sum() / n_tok),
        }
    return loss, stats
