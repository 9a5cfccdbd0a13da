"""Diagnostics of one step's groups, as dicts of metric names (docs/reference/metrics.md):
``group/*`` (reward variance within groups, sizes, TF-IDF cosine, silhouette, purity) and
``adv/*`` (advantage variance, the share of it between prompts); and the filter of dynamic
sampling (DAPO, Yu et al. 2025, sec. 3.2): ``informative_groups`` keeps groups whose rewards
differ (step.draw_prompts applies it to per-prompt groups). Deviation: ``informative_rows``
accepts any group ids, not only prompts.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from grpo_lab.algorithm.advantages import group_stats


def _ids(group_ids) -> torch.Tensor:
    """Group ids from a grouper (numpy) or a tensor -> long tensor (N,)."""
    return group_ids if torch.is_tensor(group_ids) else torch.as_tensor(np.asarray(group_ids))


def reward_group_diagnostics(rewards: torch.Tensor, group_ids: torch.Tensor) -> dict:
    """Row-level groups -> ``group/within_var`` (mean over groups of the unbiased reward
    variance, 0 for a group of one), ``group/zero_std_frac`` (fraction of groups whose
    rewards are all equal: no signal), ``group/size_mean|min|max`` (rows per group)."""
    _, count, _, std = group_stats(rewards, _ids(group_ids))               # (K,) each
    return {"group/within_var": float((std ** 2).mean()),
            "group/zero_std_frac": float((std == 0).double().mean()),
            "group/size_mean": float(count.mean()),
            "group/size_min": int(count.min()),
            "group/size_max": int(count.max())}


def cluster_diagnostics(prompts: Sequence[str], cluster_ids, tasks: Sequence[str] | None = None,
                        embeddings: np.ndarray | None = None,
                        tfidf: np.ndarray | None = None) -> dict:
    """Prompt-level clusters (B,) -> ``group/tfidf_cosine`` (mean over clusters of >= 2
    prompts of the mean pairwise cosine of their TF-IDF vectors: ``tfidf``, unit rows (B, V)
    already computed, e.g. by the trainer's fixed embedder, or fitted here on ``prompts``),
    ``group/silhouette`` (cosine silhouette on ``embeddings``, default the TF-IDF vectors),
    ``group/purity`` (share of prompts whose cluster's majority task is their own).
    A value is NaN where it is undefined (no cluster of 2, one cluster, no task labels)."""
    from sklearn.metrics import silhouette_score
    from threadpoolctl import threadpool_limits

    from grpo_lab.algorithm.embeddings import tfidf_embed

    ids = np.asarray(cluster_ids)
    if ids.shape != (len(prompts),):
        raise ValueError(f"{ids.shape} cluster ids for {len(prompts)} prompts")
    T = tfidf_embed(list(prompts)) if tfidf is None else np.asarray(tfidf)  # (B, V) unit rows
    X = T if embeddings is None else np.asarray(embeddings)
    labels = np.unique(ids)
    with threadpool_limits(1):                                              # see _kmeans
        S = T @ T.T                                                         # (B, B) cosine
        cos = []
        for c in labels:
            Sc = S[np.ix_(ids == c, ids == c)]                              # (n_c, n_c)
            n = len(Sc)
            if n >= 2:
                cos.append((Sc.sum() - np.trace(Sc)) / (n * (n - 1)))      # off-diagonal mean
        sil = (silhouette_score(X, ids, metric="cosine") if 2 <= len(labels) < len(ids)
               else math.nan)
    purity = math.nan
    if tasks is not None:
        tasks = np.asarray(tasks)
        purity = sum(np.unique(tasks[ids == c], return_counts=True)[1].max()
                     for c in labels) / len(ids)
    return {"group/tfidf_cosine": float(np.mean(cos)) if cos else math.nan,
            "group/silhouette": float(sil), "group/purity": float(purity)}


def advantage_diagnostics(advantages: torch.Tensor) -> dict:
    """``adv/var``: variance of the advantages over the batch (population, divide by N)."""
    return {"adv/var": float(advantages.double().var(unbiased=False))}


def advantage_split(advantages: torch.Tensor, prompt_index: torch.Tensor) -> dict:
    """``adv/between_prompt_frac``: share of the advantages' (population) variance that lies
    between prompts, var(per-prompt mean advantage, per row) / var(advantages); 0 when there
    is no variance. By-prompt GRPO centres every prompt, so it is 0 there; a cluster baseline
    pushes all completions of an easy prompt up and of a hard one down, whichever was better."""
    a = advantages.double()                                                # (N,)
    inv, _, mean_p, _ = group_stats(a, _ids(prompt_index))                 # (N,), (P,)
    total = float(a.var(unbiased=False))
    between = float(((mean_p[inv] - a.mean()) ** 2).mean())
    return {"adv/between_prompt_frac": between / total if total > 1e-12 else 0.0}


# ---------------------------------------------------------------- dynamic sampling (DAPO)
def informative_groups(rewards: torch.Tensor, group_ids: torch.Tensor, tol: float = 1e-8):
    """-> (group ids (K,), mask (K,)): True where the group's rewards are not all equal
    (std > tol). DAPO's filter 0 < |{correct}| < G, for any reward and any grouping."""
    group_ids = _ids(group_ids)
    _, _, _, std = group_stats(rewards, group_ids)                         # (K,)
    return torch.unique(group_ids), std > tol


def informative_rows(rewards: torch.Tensor, group_ids: torch.Tensor, tol: float = 1e-8):
    """-> (N,) bool, True on rows whose group is informative."""
    ids, keep = informative_groups(rewards, group_ids, tol)
    return torch.isin(_ids(group_ids), ids[keep])
