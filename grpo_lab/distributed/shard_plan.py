"""Which rank owns which slice of the optimizer state: shards and assignment policies.

Pure functions, identical on every rank; ``sharder.ShardedOptimizer`` executes what they
decide (its docstring has the byte accounting).

Shards. A whole tensor per owner (torch's ZeroRedundancyOptimizer) lets one big tensor
unbalance the ranks. ``make_shards`` cuts each parameter larger than ``max_shard_numel``
into near-equal contiguous blocks of its row-major flattened elements (not column blocks:
a flat slice is a zero-copy view and AdamW is elementwise, so the cut changes nothing in
the math, and for a row-major (out, in) weight it is a block of whole rows when sizes
divide).

Assignment policies, one signature ``(shards, n_ranks, importance, capacities) -> owner
per shard``, in ``POLICIES``; ties always go to the lower shard index / lower rank, so every
rank computes the same assignment from the same inputs:

  * ``importance_round_robin``: sort by score, deal round-robin (the popular description;
    ignores sizes).
  * ``size_balanced``: longest-processing-time greedy by bytes (Graham 1969), ZeRO's rule
    applied to blocks instead of whole tensors.
  * ``importance_balanced``: LPT by bytes, but among ranks within ``IMPORTANCE_SLACK`` of
    the least loaded, the one holding the least importance so far.
  * ``capacity_weighted``: LPT on machines of different speed: a shard goes to the rank
    that would finish it first, load / capacity (capacities from ``hardware_capacity``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from grpo_lab.registry import check_number, lookup

IMPORTANCE_SLACK = 0.02  # importance_balanced: rank loads within 2% of the mean count as equal


@dataclass(frozen=True)
class ShardInfo:
    index: int
    """Position in the shard list."""
    name: str
    """Parameter name, with [start:stop] when the parameter is cut into blocks."""
    param: int
    """Index of the parameter in the optimizer's parameter list."""
    start: int
    """First element in the parameter's flattened (row-major) elements."""
    numel: int
    """Elements in the shard."""
    element_size: int = 4
    """Bytes per element (4 for float32)."""

    @property
    def nbytes(self) -> int:
        return self.numel * self.element_size


def default_max_shard_numel(total_numel: int, n_ranks: int, blocks_per_rank: int = 8) -> int:
    """Block size that gives each rank about ``blocks_per_rank`` of the largest blocks."""
    return max(1, math.ceil(total_numel / (n_ranks * blocks_per_rank)))


def make_shards(named_params, max_shard_numel: int) -> list[ShardInfo]:
    """[(name, tensor)] -> shards; tensors over ``max_shard_numel`` cut into near-equal blocks."""
    # finite too: NaN failed inside math.ceil, and inf made ceil(n / inf) = 0 blocks
    check_number("max_shard_numel", max_shard_numel, lambda x: x >= 1, ">= 1")
    shards = []
    for pi, (name, p) in enumerate(named_params):
        n = p.numel()
        if n == 0:
            raise ValueError(f"parameter {name!r} has zero elements (shape {tuple(p.shape)}); "
                             f"nothing to shard: drop it or give it a size")
        k = math.ceil(n / max_shard_numel)                                 # blocks
        bounds = [n * j // k for j in range(k + 1)]                        # near-equal cuts
        for a, b in zip(bounds[:-1], bounds[1:]):
            label = name if k == 1 else f"{name}[{a}:{b}]"
            shards.append(ShardInfo(len(shards), label, pi, a, b - a, p.element_size()))
    return shards


# ---- assignment policies: (shards, n_ranks, importance, capacities) -> owner per shard ----

def importance_round_robin(shards, n_ranks, importance, capacities):
    order = sorted(range(len(shards)), key=lambda i: (-importance[i], i))
    owner = [0] * len(shards)
    for k, i in enumerate(order):
        owner[i] = k % n_ranks
    return owner


def size_balanced(shards, n_ranks, importance, capacities):
    load, owner = [0] * n_ranks, [0] * len(shards)
    for i in sorted(range(len(shards)), key=lambda i: (-shards[i].nbytes, i)):
        r = min(range(n_ranks), key=lambda r: (load[r], r))
        owner[i], load[r] = r, load[r] + shards[i].nbytes
    return owner


def importance_balanced(shards, n_ranks, importance, capacities):
    slack = IMPORTANCE_SLACK * sum(s.nbytes for s in shards) / n_ranks
    load, imp, owner = [0] * n_ranks, [0.0] * n_ranks, [0] * len(shards)
    for i in sorted(range(len(shards)), key=lambda i: (-shards[i].nbytes, -importance[i], i)):
        lightest = min(load)
        near = [r for r in range(n_ranks) if load[r] <= lightest + slack]
        r = min(near, key=lambda r: (imp[r], load[r], r))
        owner[i], load[r], imp[r] = r, load[r] + shards[i].nbytes, imp[r] + importance[i]
    return owner


def capacity_weighted(shards, n_ranks, importance, capacities):
    total = sum(capacities)
    share = [c / total for c in capacities]                                # target fractions
    load, owner = [0] * n_ranks, [0] * len(shards)
    for i in sorted(range(len(shards)), key=lambda i: (-shards[i].nbytes, i)):
        r = min(range(n_ranks), key=lambda r: ((load[r] + shards[i].nbytes) / share[r], r))
        owner[i], load[r] = r, load[r] + shards[i].nbytes
    return owner


@dataclass(frozen=True)
class ShardPolicy:
    """An assignment rule with its capability: ``uses_importance`` (it reads importance scores,
    so re-sharding needs them). Calling it runs the rule."""
    name: str
    fn: Callable                  # (shards, n_ranks, importance, capacities) -> owner per shard
    uses_importance: bool = False

    def __call__(self, shards, n_ranks, importance, capacities):
        return self.fn(shards, n_ranks, importance, capacities)


POLICIES = {p.name: p for p in (
    ShardPolicy("importance_round_robin", importance_round_robin, uses_importance=True),
    ShardPolicy("size_balanced", size_balanced),
    ShardPolicy("importance_balanced", importance_balanced, uses_importance=True),
    ShardPolicy("capacity_weighted", capacity_weighted),
)}


def hardware_capacity(flops, bandwidth, latency, alpha=1.0, beta=1.0, gamma=1.0) -> list[float]:
    """Per-rank capacity = alpha*FLOPS + beta*bandwidth - gamma*latency (the popular model).

    A linear score, not a time model: give each term in units that make it O(1) (TFLOPS,
    GB/s, microseconds) and choose the weights. An AdamW update is memory-bound (about 7
    float32 reads and writes per element), so beta matters more than alpha for the update;
    latency matters for many small messages. Raises if a capacity is not positive.
    """
    if not (len(flops) == len(bandwidth) == len(latency)):
        raise ValueError(f"flops, bandwidth, latency need one entry per rank, got lengths "
                         f"{len(flops)}, {len(bandwidth)}, {len(latency)}")
    caps = [alpha * f + beta * b - gamma * l for f, b, l in zip(flops, bandwidth, latency)]
    for r, c in enumerate(caps):
        if not c > 0:
            raise ValueError(f"capacity of rank {r} is {c} (alpha*{flops[r]} + beta*{bandwidth[r]}"
                             f" - gamma*{latency[r]}); it must be positive")
    return caps


def assign(policy: str, shards: list[ShardInfo], n_ranks: int, importance=None,
           capacities=None) -> list[int]:
    """Validate the inputs, run ``POLICIES[policy]`` -> owner rank per shard."""
    rule = lookup(POLICIES, policy, "shard policy")
    if not isinstance(n_ranks, int) or n_ranks < 1:
        raise ValueError(f"n_ranks must be a positive int, got {n_ranks!r}")
    if len(shards) < n_ranks:
        raise ValueError(f"{n_ranks} ranks but only {len(shards)} shards: some rank would own "
                         f"nothing; use fewer ranks or a smaller max_shard_numel")
    importance = [0.0] * len(shards) if importance is None else [float(x) for x in importance]
    if len(importance) != len(shards):
        raise ValueError(f"{len(importance)} importance scores for {len(shards)} shards")
    for i, x in enumerate(importance):
        if not (math.isfinite(x) and x >= 0):
            raise ValueError(f"importance of shard {i} ({shards[i].name}) is {x}; "
                             f"scores must be finite and >= 0")
    capacities = [1.0] * n_ranks if capacities is None else [float(c) for c in capacities]
    if len(capacities) != n_ranks:
        raise ValueError(f"{len(capacities)} capacities for {n_ranks} ranks")
    for r, c in enumerate(capacities):
        if not (math.isfinite(c) and c > 0):
            raise ValueError(f"capacity of rank {r} is {c}; capacities must be finite and > 0")
    owner = rule(shards, n_ranks, importance, capacities)
    assert len(owner) == len(shards) and all(0 <= o < n_ranks for o in owner), owner
    return owner


def rank_bytes(shards: list[ShardInfo], owner: list[int], n_ranks: int, per_element: int = 8):
    """Bytes each rank holds at ``per_element`` bytes per owned element (8: Adam's state)."""
    out = [0] * n_ranks
    for s, o in zip(shards, owner):
        out[o] += s.numel * per_element
    return out


def migration_bytes(numel: int, tensors: int, element_size: int = 4) -> int:
    """Bytes that move with a shard changing owner: ``tensors`` state tensors of ``numel``
    elements (Adam's 2, + 2 importance moments, + master weights) and two int64 counters."""
    return tensors * numel * element_size + 2 * 8


def imbalance(loads) -> float:
    """max / mean of per-rank loads: 1.0 is perfect, N means one rank holds everything."""
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean > 0 else 1.0
