"""Grouping: which completions share a baseline.

GRPO (DeepSeekMath sec. 4.1.2) judges each of the G completions of a prompt against the
other G - 1: the group is the prompt. Here the group is a choice. A *grouper* maps B
prompts to a cluster id per prompt,
``grouper(batch: PromptBatch, k: int | None, seed: int = 0) -> ids (B,) int64 in 0..k-1``
(a grouper registered without ``takes_k`` is called ``grouper(batch, seed=seed)``):

  * ``by_prompt``:       one group per prompt (canonical GRPO; ``k`` ignored).
  * ``random``:          k balanced random groups (a control: groups with no meaning).
  * ``by_task``:         one group per task family (``k`` ignored).
  * ``kmeans_semantic``: K-means (Lloyd 1982, k-means++ init, Arthur & Vassilvitskii
                         2007) on prompt embeddings (``embeddings.py``), seeded.
  * ``mixed``:           K-means on embeddings joined with per-prompt reward statistics.

Each is a ``Grouper`` record in ``GROUPERS`` (what it takes and needs); add your own with
``register_grouper`` (a function or a decorator), from a notebook or a plugin module. The
settings every grouper reads are the ``group`` block (group_config.Group: ``cfg.group.k``);
a grouper with settings of its own declares its block (``settings=``).

``cluster_diagnostics`` measures the clusters of a step (TF-IDF cosine, silhouette, purity).
How a prompt cluster meets its prompts' completions (``COMBINE``, ``grouped_advantages``),
the diagnostics of a step's groups and DAPO's filter (``informative_groups``) are
advantages.py.
``StepGrouper`` is the trainer's grouper: a ``GROUPERS`` record, a fixed embedder (fitted
when first needed) and, with ``group.recluster_every``, a ``reclustering.Reclusterer`` (K-means
clusters kept across steps), called once per step.
"""
from __future__ import annotations

import inspect
import math
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from grpo_lab.algorithm.advantages import group_stats
from grpo_lab.algorithm.embeddings import EMBEDDERS, check_prompts, fit_tfidf, tfidf_embed
from grpo_lab.algorithm.reclustering import Reclusterer, check_k, group_count_schedule, kmeans_fit
from grpo_lab.registry import check_new, lookup, register_settings
from grpo_lab.timelimit import guarded


class PromptBatch:
    """What a grouper may look at, one entry per prompt (B prompts).

    Which text is which (an instruct run renders the task's prompt before sampling):

      * ``prompts``      what the policy reads: "7+74=" on the toy; with an answer_format
                         the question in words, "What is 7 + 74? Put the final answer in
                         \\boxed{}." (instruct.render). The embedders read these.
      * ``raw_prompts``  the task's own prompt, "7+74=" in both runs (a task written in
                         words: its prompt as ``make`` wrote it).
      * ``fields``       the task's own values behind it, {"a": 7, "b": 74} (``Example.fields``;
                         {} for a task that gives none); ``tasks`` the family of each prompt.

    ``embeddings`` and ``reward_mean`` / ``reward_std`` are given, or computed on first use
    from ``embed`` (a fixed embedder, prompts -> (B, d)) and from ``rewards`` (N,) with
    ``prompt_index`` (N,): a grouper pays only for what it reads, whatever its name.
    """

    def __init__(self, prompts, tasks=None, embeddings=None, reward_mean=None, reward_std=None,
                 *, embed: Callable | None = None, rewards=None, prompt_index=None,
                 examples=None):
        self.prompts: list[str] = list(prompts)                     # (B,) prompt texts
        self.tasks: list[str] | None = None if tasks is None else list(tasks)  # (B,) labels
        self._examples = None if examples is None else list(examples)  # (B,) tasks.Example
        if self._examples is not None and len(self._examples) != len(self.prompts):
            raise ValueError(f"{len(self._examples)} examples for {len(self.prompts)} prompts")
        self._embeddings, self._embed, self._rewards = embeddings, embed, rewards
        self._mean, self._std, self._prompt_index = reward_mean, reward_std, prompt_index

    @property
    def raw_prompts(self) -> list[str]:
        """(B,) the task's own prompts."""
        exs = self._examples
        return list(self.prompts) if exs is None else [e.raw_prompt or e.prompt for e in exs]

    @property
    def fields(self) -> list[dict]:
        """(B,) the task's own values behind each prompt."""
        exs = self._examples
        return [{} for _ in self.prompts] if exs is None else [dict(e.fields) for e in exs]

    @property
    def embeddings(self) -> np.ndarray | None:
        """(B, d) prompt embeddings, or None when the batch has no way to make them."""
        if self._embeddings is None and self._embed is not None:
            self._embeddings = self._embed(self.prompts)
        return self._embeddings

    def _stats(self):
        if self._mean is None and self._rewards is not None:
            self._mean, self._std = prompt_reward_stats(self._rewards, self._prompt_index,
                                                        len(self.prompts))
        return self._mean, self._std

    @property
    def reward_mean(self) -> np.ndarray | None:
        """(B,) mean reward of each prompt's completions."""
        return self._stats()[0]

    @property
    def reward_std(self) -> np.ndarray | None:
        """(B,) unbiased std of each prompt's completion rewards."""
        return self._stats()[1]


def prompt_reward_stats(rewards: torch.Tensor, prompt_index: torch.Tensor, B: int):
    """Per-row rewards (N,) -> per-prompt (mean (B,), unbiased std (B,)) as numpy."""
    _, _, mean, std = group_stats(rewards, prompt_index)                   # (P,) over present ids
    present = torch.unique(prompt_index)
    if len(present) != B or int(present[0]) != 0 or int(present[-1]) != B - 1:
        raise ValueError(f"prompt_index must cover every prompt 0..{B - 1}, "
                         f"got ids {present.tolist()[:10]}...")
    return mean.numpy(), std.numpy()


def _embeddings(batch: PromptBatch, embedder) -> np.ndarray:
    if batch.embeddings is not None:
        X, what = np.asarray(batch.embeddings, dtype=np.float64), "embeddings"  # (B, d)
    else:
        embed = lookup(EMBEDDERS, embedder, "embedder") if isinstance(embedder, str) else embedder
        X = embed(batch.prompts)                                           # (B, d) as it gives
        what = f"embeddings from embedder {getattr(embedder, '__name__', embedder)!r}"
    if np.ndim(X) != 2 or np.shape(X)[0] != len(batch.prompts):   # else fewer ids than prompts
        raise ValueError(f"{what} of shape {np.shape(X)} do not match "
                         f"{len(batch.prompts)} prompts")
    return X


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

    ids = np.asarray(cluster_ids)
    if ids.shape != (len(prompts),):
        raise ValueError(f"{ids.shape} cluster ids for {len(prompts)} prompts")
    T = tfidf_embed(list(prompts)) if tfidf is None else np.asarray(tfidf)  # (B, V) unit rows
    X = T if embeddings is None else np.asarray(embeddings)
    labels = np.unique(ids)
    with threadpool_limits(1):      # see reclustering.kmeans_fit
        S = T @ T.T                                                         # (B, B) cosine
        blocks = [S[np.ix_(ids == c, ids == c)] for c in labels]           # (n_c, n_c) each
        cos = [(Sc.sum() - np.trace(Sc)) / (len(Sc) * (len(Sc) - 1))       # off-diagonal mean
               for Sc in blocks if len(Sc) >= 2]
        sil = (silhouette_score(X, ids, metric="cosine") if 2 <= len(labels) < len(ids)
               else math.nan)
    purity = math.nan
    if tasks is not None:
        tasks = np.asarray(tasks)
        purity = sum(np.unique(tasks[ids == c], return_counts=True)[1].max()
                     for c in labels) / len(ids)
    return {"group/tfidf_cosine": float(np.mean(cos)) if cos else math.nan,
            "group/silhouette": float(sil), "group/purity": float(purity)}


# ---------------------------------------------------------------- groupers
def by_prompt(batch: PromptBatch, k: int | None = None, seed: int = 0) -> np.ndarray:
    return np.arange(len(batch.prompts), dtype=np.int64)                   # (B,) reads no text


def random_groups(batch: PromptBatch, k: int | None, seed: int = 0) -> np.ndarray:
    B = len(check_prompts(batch.prompts))
    k = check_k(k, B)
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
    k = check_k(k, len(check_prompts(batch.prompts)))
    X = _embeddings(batch, embedder)                                       # (B, d)
    return kmeans_fit(X, k, seed, n_init=n_init).labels_.astype(np.int64)     # (B,)


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
    if not 0 < reward_scale < math.inf:          # NaN: NaN features, inf: no reward part
        raise ValueError(f"reward_scale must be a finite number > 0, got {reward_scale}")
    S = np.stack([np.asarray(reward_mean, float), np.asarray(reward_std, float)], 1)  # (B, 2)
    if S.shape[0] != X.shape[0]:
        raise ValueError(f"{S.shape[0]} reward statistics for {X.shape[0]} prompts")
    return np.hstack([math.sqrt(1 - reward_weight) * X,
                      math.sqrt(reward_weight) * S / reward_scale])        # (B, d + 2)


def mixed(batch: PromptBatch, k: int | None, seed: int = 0, embedder: str | Callable = "tfidf",
          reward_weight: float = 0.5, reward_scale: float = 1.0) -> np.ndarray:
    k = check_k(k, len(check_prompts(batch.prompts)))
    if batch.reward_mean is None or batch.reward_std is None:
        raise ValueError("the mixed grouper needs per-prompt reward statistics: PromptBatch("
                         "reward_mean=..., reward_std=...) (see prompt_reward_stats)")
    F = mixed_features(_embeddings(batch, embedder), batch.reward_mean, batch.reward_std,
                       reward_weight, reward_scale)                        # (B, d + 2)
    return kmeans_fit(F, k, seed).labels_.astype(np.int64)


@dataclass(frozen=True)
class Grouper:
    """One grouping strategy and what it needs (the registry ``GROUPERS`` holds these).

    Called like its function, ``grouper(batch, k, seed) -> ids (B,)``, it passes k only when
    ``takes_k`` (``fn(batch, k, seed)``; the others are called ``fn(batch, seed=seed)``) and
    checks the answer: one integer id per prompt.
    """
    name: str
    fn: Callable[..., np.ndarray]
    """(batch: PromptBatch, k: int, seed: int) -> (B,) integer group ids when takes_k, else
    (batch: PromptBatch, seed: int) -> ids: a grouper without k is never given one."""
    takes_k: bool = False
    """It uses k, the number of groups (config group.k); the others are called without k."""
    needs_embeddings: bool = False
    """It reads batch.embeddings (computed lazily, so this is documentation)."""
    needs_reward_stats: bool = False
    """It reads batch.reward_mean / reward_std (computed lazily too)."""
    reclusterable: bool = False
    """reclustering.Reclusterer can keep its clusters across steps (group.recluster_every)."""
    description: str = ""
    one_per_prompt: bool = False
    """Each prompt is its own group, ids 0..B-1 whatever the batch holds (by_prompt): the
    trainer's grouper (StepGrouper) then gives those ids without a batch or a call. Last, so a
    record built positionally in the older field order keeps its description a description."""
    settings: type | None = None
    """Its own settings block's dataclass (``cfg.<name>``), given to ``fn`` as ``settings=``."""

    def __call__(self, batch: PromptBatch, k: int | None = None, seed: int = 0,
                 **options) -> np.ndarray:
        B = len(batch.prompts)                       # check_k: never a silent clamp
        ids = np.asarray(self.fn(batch, check_k(k, B), seed, **options) if self.takes_k
                         else self.fn(batch, seed=seed, **options))
        if ids.shape != (B,):
            raise ValueError(f"grouper {self.name!r} returned {ids.shape[0] if ids.ndim else 0} "
                             f"ids of shape {ids.shape} for {B} prompts: it must return one "
                             f"integer group id per prompt, shape ({B},)")
        if ids.dtype.kind not in "iu":
            raise ValueError(f"grouper {self.name!r} returned ids of dtype {ids.dtype}: group "
                             f"ids must be integers")
        return ids.astype(np.int64)


GROUPERS: dict[str, Grouper] = {}


def register_grouper(name: str | Callable | None = None, fn: Callable | None = None, *,
                     description: str = "", settings: type | None = None, **capabilities):
    """Add a grouper to ``GROUPERS`` -> its record; as a decorator, returns the function.

        register_grouper("by_difficulty", my_fn, takes_k=True, needs_reward_stats=True)
        @register_grouper("by_difficulty", takes_k=True)
        def my_fn(batch, k, seed): ...

    ``capabilities``: the record's flags (``takes_k``, ``needs_embeddings``,
    ``needs_reward_stats``, ``reclusterable``, ``one_per_prompt``; each False unless given).
    ``settings``: the grouper's own settings block (a dataclass, as register_variant's),
    ``cfg.<name>``, passed as ``settings=``. Re-running a notebook cell that defines the same
    function again replaces it; another function under a taken name is an error naming both.
    """
    if callable(name) and fn is None:                        # register_grouper(my_fn)
        name, fn = name.__name__, name
    if fn is None:                                           # decorator form
        return lambda f: (register_grouper(name or f.__name__, f, description=description,
                                           settings=settings, **capabilities), f)[1]
    check_new(GROUPERS, "grouping", name, fn, lambda rec: rec.fn)
    if not capabilities.get("takes_k"):            # called fn(batch, seed=): k never comes
        try:
            params = list(inspect.signature(fn).parameters.values())[1:]
        except (TypeError, ValueError):              # no signature to read (a builtin)
            params = []
        need = [p.name for p in params if p.default is p.empty and p.name != "seed" and
                p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if need:
            raise TypeError(f"grouper {name!r} needs {need[0]!r} (no default), but it is called "
                            f"fn(batch, seed=seed) unless registered with takes_k=True")
    rec = Grouper(name, fn, description=description or (fn.__doc__ or "").strip().split("\n")[0],
                  settings=settings, **capabilities)          # an unknown flag: TypeError here
    if settings is not None:
        register_settings(name, settings)
    GROUPERS[name] = rec
    return rec


def get_grouper(grouping) -> Grouper:
    """A name, a ``Grouper`` record or a bare function -> its record (a function or record
    not yet registered is registered under its name; a bare function is given k)."""
    if isinstance(grouping, Grouper):
        GROUPERS.setdefault(grouping.name, grouping)
        return GROUPERS[grouping.name]
    if callable(grouping):
        return register_grouper(grouping.__name__, grouping, takes_k=True)
    return lookup(GROUPERS, grouping, "grouping", "register your own with grouping.register_grouper")


register_grouper("by_prompt", by_prompt, one_per_prompt=True,
                 description="one group per prompt (canonical GRPO)")
register_grouper("random", random_groups, takes_k=True,
                 description="k balanced random groups (a control: groups with no meaning)")
register_grouper("by_task", by_task, description="one group per task family")
register_grouper("kmeans_semantic", kmeans_semantic, takes_k=True, needs_embeddings=True,
                 reclusterable=True, description="K-means on prompt embeddings")
register_grouper("mixed", mixed, takes_k=True, needs_embeddings=True, needs_reward_stats=True,
                 description="K-means on embeddings joined with reward statistics")


# ---------------------------------------------------------------- the trainer's grouper
class GroupingFallback(UserWarning):
    """A grouper asked for fewer groups than prompts gave each prompt its own."""


class StepGrouper:
    """One step's prompts -> a cluster id per prompt (B,), for ``step.collect``.

    ``grouping`` is a ``GROUPERS`` name, a ``Grouper`` record or a function. The
    grouper sees a ``PromptBatch`` whose embeddings (one TF-IDF fit on ``corpus``, fixed so
    vectors of different steps share a space, fitted on first use) and per-prompt reward
    statistics are computed only if it reads them. With ``recluster_every`` > 0 (groupers
    marked ``reclusterable``) a ``Reclusterer`` keeps K-means clusters across steps, its k
    following ``group_count_schedule`` from max(1, k // 4) up to k when ``schedule``;
    ``settings``: the grouper's own block, if it has one.
    Every other draw depends only on (seed, step), so a resumed run regroups the same way
    once ``load_state_dict`` has restored the Reclusterer.
    """

    def __init__(self, grouping="by_prompt", k: int | None = None, seed: int = 0,
                 corpus: Sequence[str] | Callable[[], Sequence[str]] | None = None,
                 recluster_every: int = 0, schedule: bool = False, settings=None):
        self.record = get_grouper(grouping)
        self.grouping, self.k, self.seed = self.record.name, k, seed
        self.options = {} if settings is None else {"settings": settings}   # its own block
        self._corpus, self._embed = corpus, None
        if self.record.needs_embeddings and corpus is None:
            raise ValueError(f"grouping {self.grouping!r} needs a corpus to fit its embedder on")
        self.last_batch: PromptBatch | None = None
        self._warned = False
        self.reclusterer = None
        if recluster_every:
            if not self.record.reclusterable:
                raise ValueError(f"group.recluster_every={recluster_every} keeps K-means clusters "
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

    def __call__(self, prompts: Sequence[str], tasks: Sequence[str], rewards: torch.Tensor,
                 prompt_index: torch.Tensor, step: int, examples=None) -> np.ndarray:
        if self.record.one_per_prompt:                    # by_prompt: reads nothing
            return np.arange(len(prompts), dtype=np.int64)                 # (B,)
        embed = self.embed if self._corpus is not None else None
        self.last_batch = batch = PromptBatch(list(prompts), list(tasks), embed=embed,
                                              rewards=rewards, prompt_index=prompt_index,
                                              examples=examples)
        if self.reclusterer is not None:
            return self.reclusterer(batch.embeddings)                       # (B,)
        with guarded(f"grouper {self.grouping!r}", self.record.fn):        # a plugin's: limited
            ids = self.record(batch, self.k, self.seed * 1_000_003 + step,  # (B,)
                              **self.options)
        if self.record.takes_k:
            self._check_not_by_prompt(ids, step)
        return ids

    def _check_not_by_prompt(self, ids: np.ndarray, step: int) -> None:
        """A k-taking grouper (the only ones checked) asked for k < B groups that put every prompt in its own group
        ran as by_prompt: warned once per run (a study would otherwise compare by_prompt with
        itself). The usual cause: it matched ``PromptBatch.prompts``, the rendered instruct
        text, where it meant ``raw_prompts`` or ``fields``."""
        B = len(ids)
        if self._warned or self.k is None or self.k >= B or len(np.unique(ids)) < B:
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
                             "does not re-cluster (group.recluster_every=0)")
        self.reclusterer.centroids = state["centroids"].numpy().astype(np.float64)
        self.reclusterer.calls, self.reclusterer.round = int(state["calls"]), int(state["round"])
