"""K-means for grouping: one fit, and clusters that persist across training steps.

``kmeans_fit`` is the one K-means fit (what the kmeans_semantic and mixed groupers and the
Reclusterer run); ``check_k`` the one check of a number of groups k (every grouper that
takes k). ``Reclusterer`` re-fits K-means every N steps, warm-started from the previous
centroids, and keeps cluster ids stable by Hungarian matching of centroids (Kuhn 1955), so
an id keeps meaning the same region of prompt space; ``group_count_schedule`` grows k coarse
to fine. The trainer's grouper (``grouping.StepGrouper``) holds one when ``group.recluster_every``.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np


def check_k(k, B: int) -> int:
    if k is None or isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"number of groups k must be a positive integer, got {k!r}")
    if k > B:
        raise ValueError(f"k={k} groups is more than the {B} prompts to group")
    return int(k)


def kmeans_fit(X: np.ndarray, k: int, seed: int, init="k-means++", n_init: int = 4):
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits
    n_init = 1 if isinstance(init, np.ndarray) else n_init                # warm start: one run
    # Speed only: scikit-learn splits Lloyd's step over chunks of 256 samples, so a batch of
    # a few hundred prompts gains nothing from threads, and on a busy CPU the OpenMP/BLAS
    # threads spin: 2.7 s instead of 0.07 s measured (bench/bench_grouping.py). One thread.
    with threadpool_limits(1):
        return KMeans(k, init=init, n_init=n_init, random_state=seed).fit(X)


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
    ids[ids < 0] = sorted(set(range(k_new)) - set(ids.tolist()))          # the unmatched, in order
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
        k = check_k(self.k(self.round) if callable(self.k) else self.k, len(X))
        init = "k-means++" if self.centroids is None else self._warm_init(X, k)
        km = kmeans_fit(X, k, self.seed, init)
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
