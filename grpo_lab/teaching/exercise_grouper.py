"""The grouping exercise: ``check_grouper(fn, strategy)``, your grouper against
``grouping.GROUPERS[strategy]`` on prompts of the shipped mixture: by_task exactly (up to a
relabelling), random balanced and seeded, kmeans_semantic as pure as the library's (within
0.05) and seeded. The contract (one integer id per prompt, in 0..k-1, k groups) is checked
first, then determinism, then the strategy's own property."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from grpo_lab.teaching.exercise_harness import Failure, call, fmt, report, require_function
from grpo_lab.algorithm.grouping import GROUPERS, PromptBatch, cluster_diagnostics
from grpo_lab.registry import lookup


def _same_partition(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.all((a[:, None] == a[None, :]) == (b[:, None] == b[None, :])))


def _grouper_batches(strategy: str):
    from grpo_lab.tasks.task_data import load_mixture
    mix = load_mixture()
    rng = np.random.default_rng(0)
    out = []
    for n, k in ((14, 7), (28, 4), (70, 7), (140, 7), (140, 4)) if strategy != "random" else \
            ((10, 3), (13, 4), (28, 7), (3, 3)):
        ex = [mix[i] for i in sorted(rng.choice(len(mix), n, replace=False))]
        prompts, tasks = [e.prompt for e in ex], [e.task for e in ex]
        if strategy == "kmeans_semantic" and n < 70:
            continue                                          # purity is noisy on tiny batches
        out.append((f"{n} mixture prompts, k={k}", PromptBatch(prompts, tasks), k))
    return out


def _grouper_contract(ids, batch: PromptBatch, k: int, takes_k: bool) -> str | None:
    B = len(batch.prompts)
    try:
        arr = np.asarray(ids.detach() if torch.is_tensor(ids) else ids)
    except Exception:
        return f"return an array of integer group ids, one per prompt; got {type(ids).__name__}"
    if arr.shape != (B,):
        return (f"a grouper returns one id per prompt: shape (B,) = ({B},), got {arr.shape} "
                f"(ids per completion come later, from prompt_index)")
    if not np.issubdtype(arr.dtype, np.integer):
        return f"ids must be integers (np.int64), got dtype {arr.dtype}"
    if takes_k and (arr.min() < 0 or arr.max() > k - 1):
        return f"ids must lie in 0..k-1 = 0..{k - 1}, got ids from {arr.min()} to {arr.max()}"
    if takes_k and len(np.unique(arr)) != k:
        return f"use exactly k = {k} groups, got {len(np.unique(arr))}"
    return None


def check_grouper(fn: Callable, strategy: str = "kmeans_semantic") -> bool:
    """Your grouper ``fn(batch: PromptBatch, k, seed=0) -> ids (B,)`` against
    ``grouping.GROUPERS[strategy]``; strategy is "by_task", "random" or "kmeans_semantic".

    by_task must give the library's partition exactly (ids may differ by a relabelling);
    random must be balanced (sizes differ by <= 1), seeded and use all k groups;
    kmeans_semantic must recover the task families as well as the library (purity within
    0.05) and be seeded.
    """
    require_function("check_grouper", fn)
    lookup(("by_task", "random", "kmeans_semantic"), strategy, "check_grouper strategy")
    ref = GROUPERS[strategy]
    batches, failure = _grouper_batches(strategy), None
    for name, batch, k in batches:
        expected = ref(batch, k, 0)
        shown = (PromptBatch(batch.prompts, ["?"] * len(batch.prompts))   # the labels blanked:
                 if strategy == "kmeans_semantic" else batch)              # purity is scored with them
        got, err = call(fn, shown, k, seed=0)
        hint = err or _grouper_contract(got, batch, k, ref.takes_k)
        if hint is None:                    # first: a result that changes is judged by chance
            again, err = call(fn, shown, k, seed=0)
            if err or not _same_partition(got, again):
                hint = err or ("the same seed must give the same groups: pass seed to your "
                               "random generator (np.random.default_rng(seed), "
                               "KMeans(random_state=seed))")
        if hint is None and strategy == "by_task" and not _same_partition(got, expected):
            hint = ("prompts with the same task label must share one group, and different labels "
                    "different groups" + (": you made one group per prompt (that is by_prompt)"
                                          if len(set(np.asarray(got).tolist())) == len(got) else ""))
        if hint is None and strategy == "random":
            sizes = np.bincount(np.asarray(got), minlength=k)
            if sizes.max() - sizes.min() > 1:
                hint = (f"random groups must be balanced (sizes differ by at most 1), got sizes "
                        f"{sizes.tolist()}: deal a random permutation round-robin")
            elif len(batch.prompts) > k and _same_partition(got, call(fn, batch, k, seed=1)[0]):
                hint = "a different seed must give different groups: use the seed argument"
        if hint is None and strategy == "kmeans_semantic":
            mine = cluster_diagnostics(batch.prompts, got, batch.tasks)["group/purity"]
            theirs = cluster_diagnostics(batch.prompts, expected, batch.tasks)["group/purity"]
            if mine < theirs - 0.05:
                hint = (f"your clusters recover the task families less well than the library's "
                        f"(purity {mine:.2f} vs {theirs:.2f}): embed the prompts with "
                        f"grpo_lab.algorithm.embeddings.tfidf_embed and run K-means on those vectors")
            elif (any(not _same_partition(expected, ref(batch, k, s)) for s in (1, 2, 3)) and
                  all(_same_partition(got, call(fn, shown, k, seed=s)[0]) for s in (1, 2, 3))):
                hint = ("seeds 1-3 gave the groups of seed 0 where K-means' start changes them: "
                        "pass seed on (KMeans(random_state=seed))")
        if hint is not None:
            failure = Failure(name, f"{fmt(expected, 14)} (or any relabelling)",
                              "an error" if err else fmt(got, 14), hint)
            break
    return report(f"check_grouper ({strategy})", failure, len(batches),
                   f"grpo_lab.algorithm.grouping.GROUPERS[{strategy!r}]")
