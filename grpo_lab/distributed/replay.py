"""Recorded gradients of the toy policy, replayed through the sharder's pure functions.

The dynamic sharder decides owners from importance scores that depend on the gradient
history, so to *see* a policy at work we record the gradients of a few real training steps
once (``experiments.record_gradients``: single process, the full batch's gradient, which is what
the owners of a real sharded run score) and replay them (``replay_sharding``): for each step,
``importance.update_moments`` folds the gradient of every shard into its running moments and
scores it; every ``reshard_every`` steps ``shard_plan.assign`` reruns the policy. Pure and fast
(no process group), so a widget can replay on every change of a control.

Cost of a recording: 4 B x numel x steps (the shipped base policy, 240,160 elements, 30 steps:
29 MB). Migration is counted as the sharder counts it: a shard that changes owner moves Adam's
exp_avg and exp_avg_sq plus the importance moments (16 B per element) and two int64 counters.
"""
from __future__ import annotations

import itertools

import torch

from grpo_lab.distributed.importance import DEFAULT_DECAY, get_importance, init_moments, update_moments
from grpo_lab.distributed.shard_plan import (assign, default_max_shard_numel, imbalance,
                                             make_shards, migration_bytes, rank_bytes)


def replay_sharding(recording: dict, policy: str = "size_balanced", n_ranks: int = 2,
                    reshard_every: int = 10, score: str = "seed", decay: float = DEFAULT_DECAY,
                    max_shard_numel: int | None = None) -> dict:
    """Replay ``recording`` -> per step: scores (S,), owner (S,), loads (N,) Adam bytes per rank,
    importance per rank (N,), imbalance, migrated bytes; and the shards."""
    score_fn = get_importance(score)
    named = [(n, torch.empty(s)) for n, s in zip(recording["names"], recording["shapes"])]
    offsets = [0, *itertools.accumulate(t.numel() for _, t in named)]   # (P + 1,) flat starts
    shards = make_shards(named, max_shard_numel or default_max_shard_numel(offsets[-1], n_ranks))
    moments = [init_moments(s.numel) for s in shards]
    owner = assign(policy, shards, n_ranks)                                # no scores yet
    out = {"shards": shards, "scores": [], "owner": [], "loads": [], "importance": [],
           "imbalance": [], "migrated_bytes": [], "moved": []}
    for step, g in enumerate(recording["grads"]):                          # g: (numel,)
        scores = []
        for s, m in zip(shards, moments):
            gs = g[offsets[s.param] + s.start:offsets[s.param] + s.start + s.numel]  # (n_s,)
            scores.append(score_fn(update_moments(m, gs, decay), gs))
        migrated = moved = 0
        if reshard_every and (step + 1) % reshard_every == 0:
            new = assign(policy, shards, n_ranks, scores)
            changed = [i for i, (a, b) in enumerate(zip(owner, new)) if a != b]
            migrated = sum(migration_bytes(shards[i].numel, 4) for i in changed)  # as the sharder
            moved, owner = len(changed), new
        loads = rank_bytes(shards, owner, n_ranks)                         # Adam state, 8 B/elt
        held = [0.0] * n_ranks
        for i, o in enumerate(owner):
            held[o] += scores[i]
        out["scores"].append(scores)
        out["owner"].append(list(owner))
        out["loads"].append(loads)
        out["importance"].append(held)
        out["imbalance"].append(imbalance(loads))
        out["migrated_bytes"].append(migrated)
        out["moved"].append(moved)
    return out
