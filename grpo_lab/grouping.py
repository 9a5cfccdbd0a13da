"""Grouping: which completions share a baseline.

GRPO (DeepSeekMath sec. 4.1.2) judges each of the G completions of a prompt against the
other G - 1: the group is the prompt. Here the group is a choice. A *grouper* maps B
prompts to a cluster id per prompt; one signature
``grouper(batch: PromptBatch, k: int | None, seed: int = 0) -> ids (B,) int64 in 0..k-1``:

  * ``by_prompt``:       one group per prompt (canonical GRPO; ``k`` ignored).
  * ``random``:          k balanced random groups (a control: groups with no meaning).
  * ``by_task``:         one group per task family (``k`` ignored).
  * ``kmeans_semantic``: K-means (Lloyd 1982, k-means++ init, Arthur & Vassilvitskii
                         2007) on prompt embeddings (``embeddings.py``), seeded.
  * ``mixed``:           K-means on embeddings joined with per-prompt reward statistics.

A prompt-level cluster then meets the G completions of each prompt in one of two ways
(``COMBINE``, siblings with one signature):

  * ``"cluster"``:                  group id per completion = its prompt's cluster id; any
                                    estimator of ``advantages.ADVANTAGES`` runs on it
                                    (baseline = mean over the whole cluster).
  * ``"within_prompt_pooled_std"``: baseline = the prompt's own mean, scale = the
                                    within-prompt std pooled over the cluster,
                                    A = (r - mean_prompt) / (pooled_std + eps). With one
                                    prompt per cluster this is exactly ``grpo``.

Also here: ``Reclusterer`` (re-fit every N steps, warm-started, ids kept stable by
Hungarian matching of centroids, Kuhn 1955), ``group_count_schedule``, diagnostics as dicts
of documented metric names, and dynamic sampling (DAPO, Yu et al. 2025, sec. 3.2: keep only
groups whose rewards differ, draw more until the batch is full). Deviation: DAPO filters
per-prompt groups; ``informative_rows`` accepts any group ids. ``StepGrouper`` is the
trainer's glue: a grouper by name, a fixed embedder and an optional Reclusterer, per step.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from grpo_lab.advantages import ADVANTAGES, EPS, group_stats
from grpo_lab.embeddings import EMBEDDERS, check_prompts, fit_tfidf


@dataclass(frozen=True)
class PromptBatch:
    """What a grouper may look at, one entry per prompt (B prompts)."""
    prompts: list[str]                       # (B,) prompt texts
    tasks: list[str] | None = None           # (B,) task labels (by_task, purity)
    embeddings: np.ndarray | None = None     # (B, d) precomputed (e.g. cached) embeddings
    reward_mean: np.ndarray | None = None    # (B,) mean reward of the prompt's completions
    reward_std: np.ndarray | None = None     # (B,) std of the prompt's completion rewards


def prompt_reward_stats(rewards: torch.Tensor, prompt_index: torch.Tensor, B: int):
    """Per-row rewards (N,) -> per-prompt (mean (B,), unbiased std (B,)) as numpy."""
    _, _, mean, std = group_stats(rewards, prompt_index)                   # (P,) over present ids
    present = torch.unique(prompt_index)
    if len(present) != B or int(present[0]) != 0 or int(present[-1]) != B - 1:
        raise ValueError(f"prompt_index must cover every prompt 0..{B - 1}, "
                         f"got ids {present.tolist()[:10]}...")
    return mean.numpy(), std.numpy()


def _ids(group_ids) -> torch.Tensor:
    """Group ids from a grouper (numpy) or a tensor -> long tensor (N,)."""
    return group_ids if torch.is_tensor(group_ids) else torch.as_tensor(np.asarray(group_ids))


def _check_k(k, B: int) -> int:
    if k is None or isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"number of groups k must be a positive integer, got {k!r}")
    if k > B:
        raise ValueError(f"k={k} groups is more than the {B} prompts to group")
    return int(k)


def _embeddings(batch: PromptBatch, embedder) -> np.ndarray:
    if batch.embeddings is not None:
        X = np.asarray(batch.embeddings, dtype=np.float64)                 # (B, d)
        if X.ndim != 2 or X.shape[0] != len(batch.prompts):
            raise ValueError(f"embeddings of shape {X.shape} do not match "
                             f"{len(batch.prompts)} prompts")
        return X
    embed = EMBEDDERS[embedder] if isinstance(embedder, str) else embedder
    return embed(batch.prompts)                                            # (B, d)


def _kmeans(X: np.ndarray, k: int, seed: int, init="k-means++", n_init: int = 4):
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits
    n_init = 1 if isinstance(init, np.ndarray) else n_init                # warm start: one run
    # Speed only: scikit-learn splits Lloyd's step over chunks of 256 samples, so a batch of
    # a few hundred prompts gains nothing from threads, and on a busy CPU the OpenMP/BLAS
    # threads spin: 2.7 s instead of 0.07 s measured (bench/bench_grouping.py). One thread.
    with threadpool_limits(1):
        return KMeans(k, init=init, n_init=n_init, random_state=seed).fit(X)


# ---------------------------------------------------------------- groupers
def by_prompt(batch: PromptBatch, k: int | None = None, seed: int = 0) -> np.ndarray:
    return np.arange(len(check_prompts(batch.prompts)), dtype=np.int64)    # (B,)


def random_groups(batch: PromptBatch, k: int | None, seed: int = 0) -> np.ndarray:
    B = len(check_prompts(batch.prompts))
    k = _check_k(k, B)
    perm = np.random.default_rng(seed).permutation(B)                      # (B,)
    ids = np.empty(B, dtype=np.int64)
    ids[perm] = np.arange(B) % k                                           # sizes differ by <= 1
    return ids


def by_task(batch: PromptBatch, k: int | None = None, seed: int = 0) -> np.ndarray:
    check_prompts(batch.prompts)
    if batch.tasks is None or len(batch.tasks) != len(batch.prompts):
        raise ValueError(f"by_task needs one task label per prompt, got "
                         f"{None if batch.tasks is None else len(batch.tasks)} labels "
                         f"for {len(batch.prompts)} prompts")
    names = sorted(set(batch.tasks))                                       # id = rank of the name
    return np.array([names.index(t) for t in batch.tasks], dtype=np.int64)


def kmeans_semantic(batch: PromptBatch, k: int | None, seed: int = 0,
                    embedder: str | Callable = "tfidf", n_init: int = 4) -> np.ndarray:
    """``n_init`` k-means++ restarts, best kept: 4 costs 4x one run and recovers the mixture's
    families more reliably (bench/RESULTS_grouping.md measures both)."""
    B = len(check_prompts(batch.prompts))
    k = _check_k(k, B)
    X = _embeddings(batch, embedder)                                       # (B, d)
    return _kmeans(X, k, seed, n_init=n_init).labels_.astype(np.int64)     # (B,)


def mixed_features(X: np.ndarray, reward_mean, reward_std, reward_weight: float = 0.5,
                   reward_scale: float = 1.0) -> np.ndarray:
    """[sqrt(1 - w) * e, sqrt(w) * (mean, std) / reward_scale] -> (B, d + 2).

    With unit-length embeddings e, the squared distance K-means minimises is
    (1 - w) * |e_a - e_b|^2 + w * |s_a - s_b|^2: w = 0 is ``kmeans_semantic``, w = 1 groups
    by reward statistics alone (prompts of like difficulty). The default w = 0.5 weighs
    both alike when rewards lie in [0, 1]; set ``reward_scale`` to the reward range otherwise.
    """
    if not 0.0 <= reward_weight <= 1.0:
        raise ValueError(f"reward_weight must be in [0, 1], got {reward_weight}")
    if reward_scale <= 0:
        raise ValueError(f"reward_scale must be positive, got {reward_scale}")
    S = np.stack([np.asarray(reward_mean, float), np.asarray(reward_std, float)], 1)  # (B, 2)
    if S.shape[0] != X.shape[0]:
        raise ValueError(f"{S.shape[0]} reward statistics for {X.shape[0]} prompts")
    return np.hstack([math.sqrt(1 - reward_weight) * X,
                      math.sqrt(reward_weight) * S / reward_scale])        # (B, d + 2)


def mixed(batch: PromptBatch, k: int | None, seed: int = 0, embedder: str | Callable = "tfidf",
          reward_weight: float = 0.5, reward_scale: float = 1.0) -> np.ndarray:
    B = len(check_prompts(batch.prompts))
    k = _check_k(k, B)
    if batch.reward_mean is None or batch.reward_std is None:
        raise ValueError("the mixed grouper needs per-prompt reward statistics: PromptBatch("
                         "reward_mean=..., reward_std=...) (see prompt_reward_stats)")
    F = mixed_features(_embeddings(batch, embedder), batch.reward_mean, batch.reward_std,
                       reward_weight, reward_scale)                        # (B, d + 2)
    return _kmeans(F, k, seed).labels_.astype(np.int64)


GROUPERS: dict[str, Callable[..., np.ndarray]] = {
    "by_prompt": by_prompt,
    "random": random_groups,
    "by_task": by_task,
    "kmeans_semantic": kmeans_semantic,
    "mixed": mixed,
}


# ---------------------------------------------------------------- prompt clusters -> advantages
def cluster_baseline(rewards, prompt_index, cluster_of_row, estimator="grpo"):
    return ADVANTAGES[estimator](rewards, cluster_of_row)                  # (N,)


def within_prompt_pooled_std(rewards, prompt_index, cluster_of_row, estimator="grpo"):
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
                       combine: str = "cluster", estimator: str = "grpo") -> torch.Tensor:
    """Cluster id per prompt (B,), prompt of each row (N,), rewards (N,) -> advantages (N,).

    ``estimator`` (a key of ``ADVANTAGES``) is used by ``combine="cluster"``; the pooled
    variant is its own estimator (GRPO-shaped) and ignores it.
    """
    if combine not in COMBINE:
        raise ValueError(f"unknown combine option {combine!r}; known: {sorted(COMBINE)}")
    if estimator not in ADVANTAGES:
        raise ValueError(f"unknown estimator {estimator!r}; known: {sorted(ADVANTAGES)}")
    cluster_ids = torch.as_tensor(np.asarray(cluster_ids), dtype=torch.long)  # (B,)
    if prompt_index.numel() and (int(prompt_index.min()) < 0
                                 or int(prompt_index.max()) >= len(cluster_ids)):
        raise ValueError(f"prompt_index holds {int(prompt_index.max())} but only "
                         f"{len(cluster_ids)} prompts have a cluster id")
    cluster_of_row = cluster_ids[prompt_index]                             # (N,)
    return COMBINE[combine](rewards, prompt_index, cluster_of_row, estimator)


# ---------------------------------------------------------------- dynamics
def group_count_schedule(round_: int, start: int = 5, stop: int = 20, growth: float = 0.2) -> int:
    """Groups at re-clustering round ``round_``: start * (1 + growth)^round, rounded, capped.

    Defaults: 5, 6, 7, 9, 10, 12, 15, 18, 20, 20, ... (+20% per round, coarse to fine).
    """
    if round_ < 0:
        raise ValueError(f"round must be >= 0, got {round_}")
    if start < 1 or stop < start:
        raise ValueError(f"need 1 <= start <= stop, got start={start}, stop={stop}")
    if growth < 0:
        raise ValueError(f"growth must be >= 0, got {growth}")
    return min(stop, math.floor(start * (1 + growth) ** round_ + 0.5))


def match_clusters(old_centroids: np.ndarray, new_centroids: np.ndarray) -> np.ndarray:
    """Stable id for each new cluster (k_new,): Hungarian matching on squared centroid
    distance keeps the old id of the nearest old cluster; ids stay in 0..k_new-1, so when
    k grows the unmatched clusters take the new ids, when k shrinks old ids >= k_new are freed."""
    from scipy.optimize import linear_sum_assignment
    k_new = len(new_centroids)
    cost = ((new_centroids[:, None, :] - old_centroids[None, :, :]) ** 2).sum(-1)  # (k_new, k_old)
    rows, cols = linear_sum_assignment(cost)
    ids = np.full(k_new, -1, dtype=np.int64)
    keep = cols < k_new
    ids[rows[keep]] = cols[keep]
    free = iter(sorted(set(range(k_new)) - set(ids.tolist())))
    for i in np.flatnonzero(ids < 0):
        ids[i] = next(free)
    return ids


class Reclusterer:
    """K-means clusters that persist across training steps.

    Every ``every`` calls (the first included) it re-fits K-means on the batch's embeddings,
    warm-started from the previous centroids (``init=centroids, n_init=1``), and renames the
    new clusters with ``match_clusters`` so an id keeps meaning the same region. Between
    re-fits a batch is assigned to the nearest centroid. ``k`` is a number or a function of
    the re-clustering round (e.g. ``group_count_schedule``). The embeddings must stay in one
    space across calls: use a fixed embedder (``embeddings.fit_tfidf``), not ``tfidf_embed``.
    """

    def __init__(self, k: int | Callable[[int], int] = 8, every: int = 10, seed: int = 0):
        if every < 1:
            raise ValueError(f"every must be >= 1 step, got {every}")
        self.k, self.every, self.seed = k, every, seed
        self.centroids: np.ndarray | None = None     # (K, d); row j is the centroid of id j
        self.calls = 0
        self.round = 0                               # re-fits done so far

    def __call__(self, X: np.ndarray) -> np.ndarray:
        """Embeddings (B, d) -> cluster id per prompt (B,); re-fits every ``every`` calls."""
        refit = self.calls % self.every == 0
        self.calls += 1
        return self.refit(X) if refit else self.assign(X)

    def assign(self, X: np.ndarray) -> np.ndarray:
        X = self._check(X)
        if self.centroids is None:
            raise RuntimeError("Reclusterer.assign before any fit: call refit(X) first")
        d2 = ((X[:, None, :] - self.centroids[None]) ** 2).sum(-1)          # (B, K)
        return d2.argmin(1).astype(np.int64)

    def refit(self, X: np.ndarray) -> np.ndarray:
        X = self._check(X)
        k = _check_k(self.k(self.round) if callable(self.k) else self.k, len(X))
        init = "k-means++" if self.centroids is None else self._warm_init(X, k)
        km = _kmeans(X, k, self.seed, init)
        ids = (np.arange(k) if self.centroids is None
               else match_clusters(self.centroids, km.cluster_centers_))    # (k,) new -> id
        self.centroids = np.empty_like(km.cluster_centers_)
        self.centroids[ids] = km.cluster_centers_                           # (k, d)
        self.round += 1
        return ids[km.labels_]                                              # (B,)

    def _warm_init(self, X: np.ndarray, k: int) -> np.ndarray:
        C = self.centroids[:k]                                              # shrink: keep ids < k
        while len(C) < k:                                                   # grow: farthest point
            d2 = ((X[:, None, :] - C[None]) ** 2).sum(-1).min(1)            # (B,)
            C = np.vstack([C, X[d2.argmax()]])
        return C                                                            # (k, d)

    def _check(self, X) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or len(X) == 0:
            raise ValueError(f"embeddings must be a non-empty (B, d) array, got shape {X.shape}")
        if self.centroids is not None and X.shape[1] != self.centroids.shape[1]:
            raise ValueError(f"embeddings have d={X.shape[1]} but the clusters live in "
                             f"d={self.centroids.shape[1]}: embed every batch with one fixed embedder")
        return X


# ---------------------------------------------------------------- diagnostics
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
                        embeddings: np.ndarray | None = None) -> dict:
    """Prompt-level clusters (B,) -> ``group/tfidf_cosine`` (mean over clusters of >= 2
    prompts of the mean pairwise cosine of their TF-IDF vectors, fitted on ``prompts``),
    ``group/silhouette`` (cosine silhouette on ``embeddings``, default the TF-IDF vectors),
    ``group/purity`` (share of prompts whose cluster's majority task is their own).
    A value is NaN where it is undefined (no cluster of 2, one cluster, no task labels)."""
    from sklearn.metrics import silhouette_score
    from threadpoolctl import threadpool_limits

    from grpo_lab.embeddings import tfidf_embed

    ids = np.asarray(cluster_ids)
    if ids.shape != (len(prompts),):
        raise ValueError(f"{ids.shape} cluster ids for {len(prompts)} prompts")
    T = tfidf_embed(list(prompts))                                          # (B, V) unit rows
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


def fill_informative_groups(draw: Callable, target_groups: int, max_draws: int = 8,
                            strict: bool = True) -> list:
    """DAPO dynamic sampling: call ``draw() -> (rewards (N,), group_ids (N,), payload)`` until
    ``target_groups`` informative groups are gathered -> [(payload, row_mask (N,)), ...].

    The last batch's mask is trimmed so exactly ``target_groups`` groups are kept; batches
    with none are dropped. After ``max_draws`` draws short of the target it raises
    ``RuntimeError`` (``strict``) or warns and returns what it has.
    """
    if target_groups < 1 or max_draws < 1:
        raise ValueError(f"need target_groups >= 1 and max_draws >= 1, "
                         f"got {target_groups} and {max_draws}")
    out, have = [], 0
    for _ in range(max_draws):
        rewards, group_ids, payload = draw()
        group_ids = _ids(group_ids)
        ids, keep = informative_groups(rewards, group_ids)
        kept = ids[keep][:target_groups - have]
        if len(kept):
            out.append((payload, torch.isin(group_ids, kept)))
            have += len(kept)
        if have == target_groups:
            return out
    msg = (f"dynamic sampling gathered {have} of target_groups={target_groups} informative "
           f"groups in max_draws={max_draws} draws: rewards are too often all equal "
           f"(too easy or too hard); raise max_draws, lower the target or change the tasks")
    if strict:
        raise RuntimeError(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=2)
    return out


# ---------------------------------------------------------------- the trainer's glue
class StepGrouper:
    """One step's prompts -> a cluster id per prompt (B,), for ``trainer.py``.

    ``grouping`` names a ``GROUPERS`` entry. The embedding groupers embed with one TF-IDF
    fit on ``corpus`` (fixed, so vectors of different steps share a space); with
    ``recluster_every`` > 0 a ``Reclusterer`` keeps K-means clusters across steps, its k
    following ``group_count_schedule`` from max(1, k // 4) up to k when ``schedule``.
    Every other draw depends only on (seed, step), so a resumed run regroups the same way
    once ``load_state_dict`` has restored the Reclusterer.
    """

    def __init__(self, grouping: str = "by_prompt", k: int | None = None, seed: int = 0,
                 corpus: Sequence[str] | None = None, recluster_every: int = 0,
                 schedule: bool = False):
        if grouping not in GROUPERS:
            raise ValueError(f"unknown grouping {grouping!r}; known: {sorted(GROUPERS)}")
        self.grouping, self.k, self.seed = grouping, k, seed
        self.embed = None
        if grouping in ("kmeans_semantic", "mixed"):
            if corpus is None:
                raise ValueError(f"grouping {grouping!r} needs a corpus to fit its embedder on")
            self.embed = fit_tfidf(corpus)
        self.reclusterer = None
        if recluster_every:
            k_of = (lambda r: group_count_schedule(r, max(1, k // 4), k)) if schedule else k
            self.reclusterer = Reclusterer(k_of, recluster_every, seed)

    def __call__(self, prompts: Sequence[str], tasks: Sequence[str], rewards: torch.Tensor,
                 prompt_index: torch.Tensor, step: int) -> np.ndarray:
        B = len(prompts)
        X = self.embed(list(prompts)) if self.embed is not None else None   # (B, d)
        if self.reclusterer is not None:
            return self.reclusterer(X)                                      # (B,)
        mean = std = None
        if self.grouping == "mixed":
            mean, std = prompt_reward_stats(rewards, prompt_index, B)       # (B,) each
        batch = PromptBatch(list(prompts), list(tasks), X, mean, std)
        k = min(self.k, B) if self.k else None
        return GROUPERS[self.grouping](batch, k, self.seed * 1_000_003 + step)  # (B,)

    def state_dict(self) -> dict:
        """The Reclusterer's state (empty without one), for the training checkpoint."""
        rc = self.reclusterer
        if rc is None or rc.centroids is None:
            return {}
        return {"centroids": torch.from_numpy(rc.centroids.copy()),
                "calls": torch.tensor(rc.calls), "round": torch.tensor(rc.round)}

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        if self.reclusterer is None:
            raise ValueError("the checkpoint holds re-clustering state but this config "
                             "does not re-cluster (recluster_every=0)")
        self.reclusterer.centroids = state["centroids"].numpy().astype(np.float64)
        self.reclusterer.calls, self.reclusterer.round = int(state["calls"]), int(state["round"])
