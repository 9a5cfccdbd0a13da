"""A prompt-level cluster meets the G completions of each of its prompts: advantages per row.

Two ways, siblings with one signature in ``COMBINE``:

  * ``"cluster"``:                  group id per completion = its prompt's cluster id; any
                                    estimator of ``advantages.ADVANTAGES`` runs on it
                                    (baseline = mean over the whole cluster).
  * ``"within_prompt_pooled_std"``: baseline = the prompt's own mean, scale = the
                                    within-prompt std pooled over the cluster,
                                    A = (r - mean_prompt) / (pooled_std + eps). With one
                                    prompt per cluster this is exactly ``grpo``.
"""
from __future__ import annotations

import numpy as np
import torch

from grpo_lab.algorithm.advantages import ADVANTAGES, EPS, group_stats
from grpo_lab.registry import lookup


def cluster_baseline(rewards, prompt_index, cluster_of_row, estimator="grpo", lengths=None):
    fn = ADVANTAGES[estimator]
    if getattr(fn, "needs_lengths", False):                                # per-token whitening
        return fn(rewards, cluster_of_row, lengths=lengths)                # (N,)
    return fn(rewards, cluster_of_row)                                     # (N,)


def within_prompt_pooled_std(rewards, prompt_index, cluster_of_row, estimator="grpo",
                             lengths=None):
    # pooled variance of cluster c: sum_p (n_p - 1) s_p^2 / sum_p (n_p - 1), p in c
    p_inv, n_p, mean_p, std_p = group_stats(rewards, prompt_index)          # (N,), (P,) each
    cluster_p = torch.zeros_like(n_p, dtype=torch.long).scatter_(0, p_inv, cluster_of_row)  # (P,)
    _, c_inv = torch.unique(cluster_p, return_inverse=True)                # (P,) in 0..K-1
    K = int(c_inv.max()) + 1
    dof = torch.zeros(K, dtype=torch.float64).index_add_(0, c_inv, n_p - 1)               # (K,)
    ss = torch.zeros(K, dtype=torch.float64).index_add_(0, c_inv, (n_p - 1) * std_p ** 2)  # (K,)
    pooled = (ss / dof.clamp(min=1)).sqrt()                                # (K,)
    centred = rewards.double() - mean_p[p_inv]                             # (N,) r - mean_prompt
    return (centred / (pooled[c_inv[p_inv]] + EPS)).to(rewards.dtype)      # (N,)


COMBINE = {"cluster": cluster_baseline, "within_prompt_pooled_std": within_prompt_pooled_std}


def grouped_advantages(cluster_ids, prompt_index: torch.Tensor, rewards: torch.Tensor,
                       combine: str = "cluster", estimator: str = "grpo",
                       lengths=None) -> torch.Tensor:
    """Cluster id per prompt (B,), prompt of each row (N,), rewards (N,) -> advantages (N,).

    ``estimator`` (a key of ``ADVANTAGES``) is used by ``combine="cluster"``; the pooled
    variant is its own estimator (GRPO-shaped) and ignores it.
    """
    lookup(COMBINE, combine, "combine option")
    lookup(ADVANTAGES, estimator, "estimator")
    cluster_ids = torch.as_tensor(np.asarray(cluster_ids), dtype=torch.long)  # (B,)
    if prompt_index.numel() and (int(prompt_index.min()) < 0
                                 or int(prompt_index.max()) >= len(cluster_ids)):
        raise ValueError(f"prompt_index holds {int(prompt_index.max())} but only "
                         f"{len(cluster_ids)} prompts have a cluster id")
    cluster_of_row = cluster_ids[prompt_index]                             # (N,)
    adv = COMBINE[combine](rewards, prompt_index, cluster_of_row, estimator, lengths)
    if not torch.is_tensor(adv) or adv.shape != rewards.shape:         # a user's estimator
        got = tuple(adv.shape) if torch.is_tensor(adv) else type(adv).__name__
        raise ValueError(f"advantage estimator {estimator!r} (combine {combine!r}) returned "
                         f"{got} for {tuple(rewards.shape)} rewards: it must return one "
                         f"advantage per reward, a tensor shaped like them")
    return adv
