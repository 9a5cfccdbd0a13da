"""Latency-aware grouping with METIS, and value-ordered sends: what each can change.

**Groups from a latency matrix.** A hierarchical all-reduce (``topology.hierarchical_schedule``)
needs groups of ranks that talk cheaply to each other. When the launcher hands out ranks in
node order, the node layout *is* that grouping (NCCL reads it from the hardware topology).
When it does not (ranks scattered over nodes by a scheduler), the popular recipe is to build
a graph whose edge weights say how close two ranks are and cut it into balanced parts with
METIS (Karypis & Kumar 1998, multilevel k-way partitioning; here through ``pymetis``):

    weight(i, j) = round(W * (min latency / latency(i, j))**2)   (integers >= 1, W = 1000)

METIS keeps heavy edges inside parts: it minimises the weight of the cut edges with part sizes
within 3% (its default ``ufactor``), which for parts of g ranks means exactly g. The square
sharpens the contrast between near and far pairs (a modelling choice, not from a paper).
``naive_groups`` (consecutive rank blocks) and ``node_groups`` (the true layout) are the
baselines; the simulator times the hierarchical schedule on each.

**Value-ordered sends.** Sending the most important gradient buckets first moves exactly the
same bytes in exactly the same total time; what it changes is *when* the important part has
arrived, so an owner could start updating those parameters earlier. ``arrival`` returns, for
an order of buckets sent back to back, the time each finishes and the share of the total
importance (scores from ``importance.IMPORTANCE``) arrived by then; ``time_to_value`` reads
the time at which a share f of it has arrived. Deviation from a real system: buckets are sent
one after another with no overlap between them, and backward produces the gradients in
reverse layer order, so a value order can only start once backward has produced its first
bucket (the model ignores that constraint; ``overlap.py`` measures what backward allows).
"""
from __future__ import annotations

import numpy as np

from grpo_lab.registry import lookup

WEIGHT_SCALE = 1000


def latency_graph(latency: np.ndarray) -> tuple[list[int], list[int], list[int]]:
    """Complete graph over ranks in METIS's CSR form -> (xadj, adjncy, eweights)."""
    L = np.asarray(latency, dtype=float)
    if L.ndim != 2 or L.shape[0] != L.shape[1]:
        raise ValueError(f"latency must be a square (P, P) matrix, got shape {L.shape}")
    P = L.shape[0]
    if P < 2:
        raise ValueError(f"latency must be between at least 2 ranks, got shape {L.shape}")
    L = (L + L.T) / 2                                                  # (P, P), symmetric
    off = ~np.eye(P, dtype=bool)
    if not (L[off] > 0).all() or not np.isfinite(L[off]).all():      # NaN fails the first
        bad = L[off][~((L[off] > 0) & np.isfinite(L[off]))][0]
        raise ValueError(f"off-diagonal latencies must be finite and > 0, got {bad}")
    near = np.where(off, L, np.inf)                                    # diagonal: no edge
    w = np.maximum(1, np.rint(WEIGHT_SCALE * (L[off].min() / near) ** 2)).astype(int)  # (P, P)
    _, adjncy = np.nonzero(off)                                        # row i: every j != i
    return [i * (P - 1) for i in range(P + 1)], adjncy.tolist(), w[off].tolist()


def metis_groups(latency: np.ndarray, n_groups: int, seed: int = 0) -> list[list[int]]:
    """Balanced groups of ranks, close ones together (METIS k-way on ``latency_graph``)."""
    import pymetis

    P = len(latency)
    if not isinstance(n_groups, int) or n_groups < 1 or P % n_groups:
        raise ValueError(f"n_groups must be a positive int dividing {P} ranks, got {n_groups!r}")
    if n_groups == 1:
        return [list(range(P))]
    xadj, adjncy, eweights = latency_graph(latency)
    _, part = pymetis.part_graph(n_groups, pymetis.CSRAdjacency(xadj, adjncy), eweights=eweights,
                                 options=pymetis.Options(seed=seed))
    groups = [[r for r in range(P) if part[r] == k] for k in range(n_groups)]
    sizes = sorted(len(x) for x in groups)
    if sizes != [P // n_groups] * n_groups:
        raise RuntimeError(f"METIS returned unequal groups {sizes}; a hierarchical schedule "
                           f"needs {n_groups} groups of {P // n_groups}")
    return sorted(groups)


def naive_groups(P: int, g: int) -> list[list[int]]:
    """Consecutive blocks of g ranks: right only if ranks were handed out in node order."""
    if P % g:
        raise ValueError(f"group size g={g} must divide P={P}")
    return [list(range(s, s + g)) for s in range(0, P, g)]


def node_groups(node_of) -> list[list[int]]:
    """The true layout: the ranks of each physical node."""
    node_of = np.asarray(node_of)
    return [np.flatnonzero(node_of == k).tolist() for k in np.unique(node_of)]


def planted_latency(nodes: int, g: int, intra: float = 2e-6, inter: float = 20e-6,
                    jitter: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A latency matrix with a planted structure: P = nodes*g ranks scattered at random over
    the nodes; latency ``intra`` inside a node, ``inter`` between, each times U(1, 1+jitter).
    -> (latency (P, P) s, node_of (P,))."""
    rng = np.random.default_rng(seed)
    P = nodes * g
    node_of = rng.permutation(np.arange(P) // g)                       # (P,) scrambled
    same = node_of[:, None] == node_of[None, :]
    L = np.where(same, intra, inter) * rng.uniform(1, 1 + jitter, (P, P))
    L = (L + L.T) / 2
    np.fill_diagonal(L, 0.0)
    return L, node_of


def same_partition(a: list[list[int]], b: list[list[int]]) -> bool:
    """True when two groupings hold the same sets of ranks (group order and labels ignored)."""
    return sorted(sorted(x) for x in a) == sorted(sorted(x) for x in b)


# --------------------------------------------------------------------------- value-ordered sends

ORDERS = {
    "model": lambda scores, nbytes: np.arange(len(scores)),
    "backward": lambda scores, nbytes: np.arange(len(scores))[::-1],
    "value": lambda scores, nbytes: np.argsort(-np.asarray(scores), kind="stable"),
    "value_per_byte": lambda scores, nbytes: np.argsort(-np.asarray(scores) / np.asarray(nbytes),
                                                         kind="stable"),
}
"""Send orders ``(scores (B,), nbytes (B,)) -> permutation (B,)``."""


def arrival(nbytes, scores, order: str, time_fn) -> tuple[np.ndarray, np.ndarray]:
    """Buckets sent back to back in ``order``; ``time_fn(nbytes) -> s`` times one bucket's
    all-reduce. -> (finish time of each bucket in send order (B,) s, importance share arrived
    by then (B,))."""
    nbytes, scores = np.asarray(nbytes, dtype=float), np.asarray(scores, dtype=float)
    if nbytes.shape != scores.shape or (scores < 0).any():
        raise ValueError(f"need one non-negative score per bucket: {scores.shape} scores, "
                         f"{nbytes.shape} buckets, min score {scores.min() if scores.size else None}")
    perm = lookup(ORDERS, order, "order")(scores, nbytes)
    t = np.cumsum([time_fn(b) for b in nbytes[perm]])                  # (B,)
    share = np.cumsum(scores[perm]) / scores.sum()                     # (B,)
    return t, share


def time_to_value(t: np.ndarray, share: np.ndarray, f: float) -> float:
    """First finish time at which at least a share ``f`` of the importance has arrived."""
    if not 0 < f <= 1:
        raise ValueError(f"share f must be in (0, 1], got {f}")
    return float(t[np.searchsorted(share, f - 1e-12)])
