"""Groups over training: K-means clusters that persist across steps, and the trainer's grouper.

``Reclusterer`` re-fits K-means every N steps, warm-started from the previous centroids, and
keeps cluster ids stable by Hungarian matching of centroids (Kuhn 1955), so an id keeps
meaning the same region of prompt space; ``group_count_schedule`` grows k coarse to fine.
``StepGrouper`` is the trainer's glue: a ``grouping.GROUPERS`` record, a fixed embedder
(fitted when first needed) and an optional Reclusterer, called once per step.
"""
from __future__ import annotations

import math
import warnings
from typing import Callable, Sequence

import numpy as np
import torch

from grpo_lab.algorithm.embeddings import fit_tfidf
from grpo_lab.algorithm.grouping import PromptBatch, check_k, get_grouper, kmeans_fit


class GroupingFallback(UserWarning):
    """A grouper asked for fewer groups than prompts gave each prompt its own."""


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


class StepGrouper:
    """One step's prompts -> a cluster id per prompt (B,), for ``step.collect``.

    ``grouping`` is a ``grouping.GROUPERS`` name, a ``Grouper`` record or a function. The
    grouper sees a ``PromptBatch`` whose embeddings (one TF-IDF fit on ``corpus``, fixed so
    vectors of different steps share a space, fitted on first use) and per-prompt reward
    statistics are computed only if it reads them. With ``recluster_every`` > 0 (groupers
    marked ``reclusterable``) a ``Reclusterer`` keeps K-means clusters across steps, its k
    following ``group_count_schedule`` from max(1, k // 4) up to k when ``schedule``.
    Every other draw depends only on (seed, step), so a resumed run regroups the same way
    once ``load_state_dict`` has restored the Reclusterer.
    """

    def __init__(self, grouping="by_prompt", k: int | None = None, seed: int = 0,
                 corpus: Sequence[str] | Callable[[], Sequence[str]] | None = None,
                 recluster_every: int = 0, schedule: bool = False):
        self.record = get_grouper(grouping)
        self.grouping, self.k, self.seed = self.record.name, k, seed
        self._corpus, self._embed = corpus, None
        if self.record.needs_embeddings and corpus is None:
            raise ValueError(f"grouping {self.grouping!r} needs a corpus to fit its embedder on")
        self.last_batch: PromptBatch | None = None
        self._warned = False
        self.reclusterer = None
        if recluster_every:
            if not self.record.reclusterable:
                raise ValueError(f"recluster_every={recluster_every} keeps K-means clusters "
                                 f"across steps; grouping {self.grouping!r} is not reclusterable")
            k_of = (lambda r: group_count_schedule(r, max(1, k // 4), k)) if schedule else k
            self.reclusterer = Reclusterer(k_of, recluster_every, seed)

    def embed(self, prompts: Sequence[str]) -> np.ndarray:
        """The fixed TF-IDF embedder (fitted on the corpus on first use) -> (B, d)."""
        if self._embed is None:
            if self._corpus is None:
                raise ValueError(f"grouping {self.grouping!r} read embeddings, but no corpus "
                                 f"was given to fit the embedder on")
            corpus = self._corpus() if callable(self._corpus) else self._corpus
            self._embed = fit_tfidf(list(corpus))
        return self._embed(list(prompts))

    @property
    def last_embeddings(self) -> np.ndarray | None:
        """The last batch's embeddings if the grouper computed them (diagnostics reuse them)."""
        b = self.last_batch
        return None if b is None else b._embeddings

    def __call__(self, prompts: Sequence[str], tasks: Sequence[str], rewards: torch.Tensor,
                 prompt_index: torch.Tensor, step: int, examples=None) -> np.ndarray:
        embed = self.embed if self._corpus is not None else None
        batch = PromptBatch(list(prompts), list(tasks), embed=embed, rewards=rewards,
                            prompt_index=prompt_index, examples=examples)
        self.last_batch = batch
        if self.reclusterer is not None:
            return self.reclusterer(batch.embeddings)                       # (B,)
        ids = self.record(batch, self.k, self.seed * 1_000_003 + step)      # (B,)
        self._check_not_by_prompt(ids, step)
        return ids

    def _check_not_by_prompt(self, ids: np.ndarray, step: int) -> None:
        """A k-taking grouper asked for k < B groups that put every prompt in its own group
        ran as by_prompt: warned once per run (a study would otherwise compare by_prompt with
        itself). The usual cause: it matched ``PromptBatch.prompts``, the rendered instruct
        text, where it meant ``raw_prompts`` or ``fields``."""
        B = len(ids)
        if (self._warned or not self.record.takes_k or self.k is None or self.k >= B
                or len(np.unique(ids)) < B):
            return
        self._warned = True
        warnings.warn(f"grouper {self.grouping!r} put each of the {B} prompts in its own group "
                      f"at step {step}, though k={self.k} groups were asked for: it ran as "
                      f"by_prompt. If it reads batch.prompts, note they are what the policy "
                      f"reads (the rendered instruct question under an answer_format); the "
                      f"task's own prompt is batch.raw_prompts, its values batch.fields",
                      GroupingFallback, stacklevel=2)

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
