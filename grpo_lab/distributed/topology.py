"""The alpha-beta cost model of all-reduce schedules, in closed form and as a phase-by-phase simulation.

A message of n bytes over a link costs ``alpha + n * beta`` seconds (Hockney 1994): alpha is
the latency (s), beta the inverse bandwidth (s/B). A cluster is ``nodes`` x ``gpus_per_node``
ranks, with alpha/beta inside a node (NVLink) and between nodes (InfiniBand, Ethernet).
All-reduce of n bytes over p ranks, the closed forms (Thakur, Rabenseifner & Gropp 2005,
"Optimization of collective communication operations in MPICH", IJHPCA 19(1), sec. 4; the
reduction's compute term gamma is left out, see deviations):

    ring (reduce-scatter + all-gather)        2 (p-1) alpha + 2 (p-1)/p n beta
    recursive halving + doubling (p = 2^k)    2 log2(p) alpha + 2 (p-1)/p n beta   (Rabenseifner)
    binomial tree (reduce, then broadcast)    2 ceil(log2 p) (alpha + n beta)
    double binary tree, k pipelined chunks    2 (k + D - 1) (alpha + n beta / k),  D = floor(log2 p)
                                              (Sanders, Speck & Traeff 2009; NCCL >= 2.4's tree:
                                              each of two trees carries n/2, every rank is an
                                              inner node of at most one, so a rank moves n/k
                                              per step; best k = sqrt((D-1) n beta / alpha))
    hierarchical, M nodes x g GPUs            2 (g-1) (a_in + n/g b_in) + 2 (M-1) (a_out + n/(gM) b_out)
                                              (ring reduce-scatter inside each node, ring
                                              all-reduce of the node's 1/g shard between the i-th
                                              GPUs of all nodes, ring all-gather inside; NCCL's
                                              documented two-level idea, Horovod's hierarchical mode)

Every schedule above puts 2 (p-1) n bytes on the wire in total (summed over ranks): they are
all bandwidth-optimal (Patarasuk & Yuan 2009). They differ in the latency term and in *which
links* carry the bytes. On a two-level cluster (ranks in node order, p = g M) the flat
schedules' closed forms split by link (``closed_form``): the ring runs at its slowest link,
the binomial tree and halving-doubling (smallest distance first) do log2 g steps inside nodes
and log2 M steps between them; halving-doubling then sends only 2 (M-1)/(gM) n bytes per rank
between nodes, as the hierarchical schedule does.

The simulator (``SCHEDULES`` builds the phases, ``simulate`` times them) says who sends what
to whom in each phase. A phase's time is the slowest rank's port: per rank, sending costs
max(alpha of its sends) + sum(bytes * beta) and so does receiving (full duplex, one port per
rank, a rank's concurrent messages share its bandwidth, their latencies overlap). It runs any
cluster, a per-pair latency matrix and scrambled rank placement included, where closed forms
do not exist; on the homogeneous cases tests check it reproduces the closed forms' bytes
and times.

Each schedule is a record in ``SCHEDULES`` (``Schedule``: its phases, its two-level closed
form and what it takes: chunks, the node layout, p = 2^k); ``register_schedule`` adds one.

Deviations and assumptions (say them before trusting a number):
  * no gamma (reduction arithmetic), no contention beyond a rank's own port: a full-bisection
    network, one NIC per GPU (rail-optimized, as in DGX nodes);
  * the flat ring is one ring; NCCL runs several rings (channels) on different NICs, which
    divides the ring's bandwidth term between nodes by the number of channels;
  * ``latency`` (a (P, P) matrix of one-way latencies, s) replaces alpha per pair; ``capacity``
    (per node) scales that node's inter-node bandwidth (a link runs at the slower end's);
  * the double binary tree is simulated with heap-ordered trees (parent (i-1)//2), the second
    one mirrored (rank r at position p-1-r), not NCCL's exact construction;
  * bytes are real numbers: chunks n/p are not rounded.
The cluster presets' alpha/beta are datasheet-level assumptions, stated in ``CLUSTERS``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from grpo_lab.registry import check_new, lookup


@dataclass(frozen=True)
class Cluster:
    nodes: int
    """Number of nodes M."""
    gpus_per_node: int
    """GPUs (ranks) per node g; P = M * g ranks."""
    alpha_intra: float
    """Latency of a message inside a node (s)."""
    beta_intra: float
    """Inverse bandwidth inside a node (s per byte)."""
    alpha_inter: float
    """Latency of a message between nodes (s)."""
    beta_inter: float
    """Inverse bandwidth of one GPU's link between nodes (s per byte)."""
    latency: np.ndarray | None = None
    """Optional (P, P) one-way latency per rank pair (s); replaces alpha."""
    capacity: tuple | None = None
    """Optional relative inter-node bandwidth per node (1 = beta_inter; 0.5 = half as fast)."""
    node_of: tuple | None = None
    """Physical node of each rank (default rank // g); a scrambled placement permutes it."""
    name: str = ""

    def __post_init__(self):
        for f in ("nodes", "gpus_per_node"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise ValueError(f"{f} must be a positive int, got {getattr(self, f)!r}")
        for f in ("alpha_intra", "beta_intra", "alpha_inter", "beta_inter"):
            if not getattr(self, f) >= 0:
                raise ValueError(f"{f} must be >= 0 (seconds, seconds per byte), got {getattr(self, f)!r}")
        P = self.size
        if self.latency is not None and np.shape(self.latency) != (P, P):
            raise ValueError(f"latency must be ({P}, {P}) for {self.nodes} x {self.gpus_per_node} "
                             f"ranks, got shape {np.shape(self.latency)}")
        if self.capacity is not None and (len(self.capacity) != self.nodes or min(self.capacity) <= 0):
            raise ValueError(f"capacity needs {self.nodes} positive values, got {self.capacity!r}")
        if self.node_of is not None and sorted(np.bincount(self.node_of, minlength=self.nodes)) != [self.gpus_per_node] * self.nodes:
            raise ValueError(f"node_of must place exactly {self.gpus_per_node} ranks on each of "
                             f"{self.nodes} nodes, got {self.node_of!r}")

    @property
    def size(self) -> int:
        return self.nodes * self.gpus_per_node

    def node(self) -> np.ndarray:
        """(P,) physical node of each rank."""
        if self.node_of is not None:
            return np.asarray(self.node_of)
        return np.arange(self.size) // self.gpus_per_node

    def links(self) -> tuple[np.ndarray, np.ndarray]:
        """(alpha (P, P) s, beta (P, P) s/B) for every ordered rank pair."""
        node = self.node()
        same = node[:, None] == node[None, :]                                    # (P, P)
        alpha = np.where(same, self.alpha_intra, self.alpha_inter)
        if self.latency is not None:
            alpha = np.asarray(self.latency, dtype=float)
        beta = np.full(same.shape, float(self.beta_inter))
        if self.capacity is not None:
            cap = np.asarray(self.capacity, dtype=float)[node]                   # (P,)
            beta = beta / np.minimum(cap[:, None], cap[None, :])
        return alpha, np.where(same, self.beta_intra, beta)


GB = 1e9
CLUSTERS = {
    # H100 SXM: NVLink 4 at 450 GB/s per direction (datasheet 900 GB/s bidirectional);
    # one 400 Gb/s NDR InfiniBand NIC per GPU = 50 GB/s. Latencies: order of magnitude.
    "dgx_ib": lambda nodes: Cluster(nodes, 8, 1e-6, 1 / (450 * GB), 5e-6, 1 / (50 * GB), name="dgx_ib"),
    # one GPU per host on 100 GbE with TCP: 12.5 GB/s, ~25 us
    "ethernet": lambda nodes: Cluster(nodes * 8, 1, 1e-6, 1 / (450 * GB), 25e-6, 1 / (12.5 * GB), name="ethernet"),
    # dgx_ib nodes, every other one with 200 Gb/s NICs (capacity 0.5) and slower switches
    "hetero": lambda nodes: Cluster(nodes, 8, 1e-6, 1 / (450 * GB), 10e-6, 1 / (50 * GB),
                                    capacity=tuple(1.0 if i % 2 == 0 else 0.5 for i in range(nodes)),
                                    name="hetero"),
}
"""Cluster presets by name; each takes the number of 8-GPU nodes (ethernet: 8 hosts per node)."""


# --------------------------------------------------------------------------- closed forms

def _check(p: int, n: float):
    if not isinstance(p, (int, np.integer)) or p < 1:
        raise ValueError(f"number of ranks p must be a positive int, got {p!r}")
    if n < 0:
        raise ValueError(f"message size n must be >= 0 bytes, got {n!r}")


def ring_time(p: int, n: float, alpha: float, beta: float) -> float:
    _check(p, n)
    return 2 * (p - 1) * (alpha + n / p * beta)


def rhd_time(p: int, n: float, alpha: float, beta: float) -> float:
    _check(p, n)
    if p & (p - 1):
        raise ValueError(f"recursive halving-doubling needs p a power of 2, got p={p}")
    return 2 * math.log2(p) * alpha + 2 * (p - 1) / p * n * beta


def tree_time(p: int, n: float, alpha: float, beta: float) -> float:
    _check(p, n)
    return 2 * math.ceil(math.log2(p)) * (alpha + n * beta)


def dbtree_time(p: int, n: float, alpha: float, beta: float, chunks: int | None = None) -> float:
    _check(p, n)
    if p == 1:
        return 0.0
    D = int(math.floor(math.log2(p)))
    k = chunks or dbtree_chunks(p, n, alpha, beta)
    return 2 * (k + D - 1) * (alpha + n * beta / k)


def dbtree_chunks(p: int, n: float, alpha: float, beta: float) -> int:
    """Best whole number of pipeline chunks k ~ sqrt((D-1) n beta / alpha), at least 1."""
    D = int(math.floor(math.log2(max(p, 2))))
    best = math.sqrt((D - 1) * n * beta / alpha) if alpha > 0 else 1024
    cands = {max(1, math.floor(best)), max(1, math.ceil(best))}
    return min(cands, key=lambda k: (k + D - 1) * (alpha + n * beta / k))


def hierarchical_time(M: int, g: int, n: float, a_in: float, b_in: float, a_out: float, b_out: float) -> float:
    _check(M * g, n)
    return 2 * (g - 1) * (a_in + n / g * b_in) + 2 * (M - 1) * (a_out + n / (g * M) * b_out)


class Links(NamedTuple):
    """A uniform two-level cluster as the closed forms see it: P = M nodes x g ranks, alpha
    and beta inside a node (ai, bi) and between nodes (ae, be; the inside ones when M = 1)."""
    P: int
    M: int
    g: int
    ai: float
    bi: float
    ae: float
    be: float


def _ring_closed(L: Links, n: float, chunks=None) -> float:
    return ring_time(L.P, n, L.ae, L.be) if L.g > 1 or L.M > 1 else 0.0  # at the slowest link


def _rhd_closed(L: Links, n: float, chunks=None) -> float:
    """log2 g steps inside (n/2 .. n/g), then log2 M between nodes."""
    rhd_time(L.P, n, 0, 0)         # validates p = 2^k
    return (2 * math.log2(L.g) * L.ai + 2 * (1 - 1 / L.g) * n * L.bi
            + 2 * math.log2(L.M) * L.ae + 2 * (1 - 1 / L.M) * n / L.g * L.be)


def _tree_closed(L: Links, n: float, chunks=None) -> float:
    """Binomial: distances 1, 2, 4, ...: first inside the node."""
    if L.P & (L.P - 1) or L.g & (L.g - 1):
        raise ValueError(f"the two-level tree form needs p and g powers of 2, got p={L.P}, g={L.g}")
    return 2 * math.log2(L.g) * (L.ai + n * L.bi) + 2 * math.log2(L.M) * (L.ae + n * L.be)


def _dbtree_closed(L: Links, n: float, chunks=None) -> float:
    """Heap-ordered trees mix both kinds of link: the worst link, (ae, be)."""
    return dbtree_time(L.P, n, L.ae, L.be, chunks=chunks)


def _hierarchical_closed(L: Links, n: float, chunks=None) -> float:
    return hierarchical_time(L.M, L.g, n, L.ai, L.bi, L.ae, L.be)


def closed_form(schedule: str, c: Cluster, n: float, chunks: int | None = None) -> float:
    """All-reduce time (s) of ``schedule`` for n bytes on cluster ``c`` (ranks in node order,
    no latency matrix, no capacity: the closed forms need uniform links per level)."""
    if c.latency is not None or c.capacity is not None or c.node_of is not None:
        raise ValueError(f"closed forms need a uniform two-level cluster; {c.name or c} has a latency "
                         f"matrix, capacities or a scrambled placement: use simulate()")
    record = lookup(SCHEDULES, schedule, "schedule")
    M = c.nodes
    ai, bi = c.alpha_intra, c.beta_intra
    ae, be = (ai, bi) if M == 1 else (c.alpha_inter, c.beta_inter)
    return record.closed(Links(c.size, M, c.gpus_per_node, ai, bi, ae, be), n, chunks)


def total_bytes(p: int, n: float) -> float:
    """Bytes on the wire, summed over ranks, of every schedule here: 2 (p-1) n."""
    return 2 * (p - 1) * n


# --------------------------------------------------------------------------- schedules as phases

class Phase(NamedTuple):
    """One phase: message i goes from src[i] to dst[i] carrying nbytes[i] (all (m,) arrays)."""
    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    label: str


def _phase(pairs, nbytes, label) -> Phase:
    pairs = np.asarray(pairs, dtype=int).reshape(-1, 2)
    return Phase(pairs[:, 0], pairs[:, 1], np.full(len(pairs), float(nbytes)), label)


def _ring_phases(members: list[list[int]], n: float, label: str, halves=("reduce-scatter", "all-gather")):
    """Ring all-reduce of n bytes inside each list of ``members`` (all the same size q), in lockstep."""
    q = len(members[0])
    phases = []
    for half in halves:
        for s in range(q - 1):
            pairs = [(m[i], m[(i + 1) % q]) for m in members for i in range(q)]
            phases.append(_phase(pairs, n / q, f"{label} {half} step {s + 1}/{q - 1}"))
    return phases


def ring_schedule(P: int, n: float, **_) -> list[Phase]:
    return _ring_phases([list(range(P))], n, "ring") if P > 1 else []


def rhd_schedule(P: int, n: float, **_) -> list[Phase]:
    """Recursive halving (distance 1, 2, ..., P/2; n/2, n/4, ... n/P) then doubling (reverse)."""
    rhd_time(P, n, 0, 0)
    dists = [1 << k for k in range(int(math.log2(P)))]
    halving = [_phase([(r, r ^ d) for r in range(P)], n / (2 * d), f"halving distance {d}") for d in dists]
    doubling = [_phase([(r, r ^ d) for r in range(P)], n / (2 * d), f"doubling distance {d}")
                for d in reversed(dists)]
    return halving + doubling


def tree_schedule(P: int, n: float, **_) -> list[Phase]:
    """Binomial tree rooted at 0: reduce with distances 1, 2, 4, ..., broadcast in reverse."""
    rounds = []
    d = 1
    while d < P:
        rounds.append([(r, r - d) for r in range(P) if r % (2 * d) == d])
        d *= 2
    reduce = [_phase(pairs, n, f"reduce round {i + 1}") for i, pairs in enumerate(rounds)]
    bcast = [_phase([(b, a) for a, b in pairs], n, f"broadcast round {i + 1}")
             for i, pairs in enumerate(reversed(rounds))]
    return reduce + bcast


def dbtree_schedule(P: int, n: float, chunks: int = 1, **_) -> list[Phase]:
    """Two heap-ordered binary trees (tree 2 mirrored), each carrying n/2 in ``chunks`` pipelined
    chunks: a rank at height h sends chunk c up at step c + h; the root sends chunk c down at
    step c and a rank at depth d forwards it at step c + d."""
    if P == 1:
        return []
    k, D = chunks, int(math.floor(math.log2(P)))
    steps_up, steps_down = k + D - 1, k + D - 1
    up = [[] for _ in range(steps_up)]
    down = [[] for _ in range(steps_down)]
    for pos_to_rank in (lambda i: i, lambda i: P - 1 - i):
        height = [0] * P
        for i in reversed(range(1, P)):
            height[(i - 1) // 2] = max(height[(i - 1) // 2], height[i] + 1)
        for i in range(1, P):
            par, depth = (i - 1) // 2, int(math.floor(math.log2(i + 1)))
            for c in range(k):
                up[c + height[i]].append((pos_to_rank(i), pos_to_rank(par)))
                down[c + depth - 1].append((pos_to_rank(par), pos_to_rank(i)))
    chunk = n / 2 / k
    return ([_phase(p, chunk, f"reduce step {s + 1}/{steps_up}") for s, p in enumerate(up)]
            + [_phase(p, chunk, f"broadcast step {s + 1}/{steps_down}") for s, p in enumerate(down)])


def hierarchical_schedule(P: int, n: float, groups: list[list[int]] | None = None, g: int | None = None,
                          **_) -> list[Phase]:
    """Ring reduce-scatter inside each group, ring all-reduce of the 1/g shards between the i-th
    members of the groups, ring all-gather inside each group. ``groups``: equal-sized lists of
    ranks (default: consecutive blocks of ``g``, the node layout when ranks are in node order)."""
    if groups is None:
        if not g or P % g:
            raise ValueError(f"hierarchical needs groups or a g dividing P={P}, got g={g!r}")
        groups = [list(range(s, s + g)) for s in range(0, P, g)]
    g, M = len(groups[0]), len(groups)
    if any(len(x) != g for x in groups) or sorted(r for x in groups for r in x) != list(range(P)):
        raise ValueError(f"groups must split ranks 0..{P - 1} into equal parts, got sizes "
                         f"{[len(x) for x in groups]}")
    across = [[grp[i] for grp in groups] for i in range(g)]
    inside = _ring_phases(groups, n, "intra", halves=("reduce-scatter",)) if g > 1 else []
    between = _ring_phases(across, n / g, "inter all-reduce") if M > 1 else []
    gather = _ring_phases(groups, n, "intra", halves=("all-gather",)) if g > 1 else []
    return inside + between + gather


@dataclass(frozen=True)
class Schedule:
    """An all-reduce schedule: its phases for the simulator and its two-level closed form,
    with what it takes. Calling the record builds the phases (``SCHEDULES[name](P, n, **kw)``).

    ``phases(P, n, **kw) -> [Phase]``; ``closed(Links, n, chunks) -> seconds``;
    ``takes_chunks``: pipelined in ``chunks`` pieces (the closed form picks the best count
    when none is given); ``node_layout``: its phases need the node size ``g`` (``schedule``
    passes the cluster's unless ``groups`` is given); ``power_of_two``: its phases need
    p = 2^k (the tree's two-level closed form also does; its phases do not)."""
    name: str
    phases: Callable[..., list]
    closed: Callable[..., float]
    takes_chunks: bool = False
    node_layout: bool = False
    power_of_two: bool = False

    def __call__(self, P: int, n: float, **kw) -> list[Phase]:
        return self.phases(P, n, **kw)


SCHEDULES: dict[str, Schedule] = {}


def register_schedule(name: str, phases: Callable, closed: Callable, **capabilities) -> Schedule:
    """Add an all-reduce schedule -> its record; the registry's naming rule (registry.check_new)."""
    check_new(SCHEDULES, "schedule", name, phases, lambda s: s.phases)
    SCHEDULES[name] = Schedule(name, phases, closed, **capabilities)
    return SCHEDULES[name]


register_schedule("ring", ring_schedule, _ring_closed)
register_schedule("rhd", rhd_schedule, _rhd_closed, power_of_two=True)
register_schedule("tree", tree_schedule, _tree_closed)
register_schedule("dbtree", dbtree_schedule, _dbtree_closed, takes_chunks=True)
register_schedule("hierarchical", hierarchical_schedule, _hierarchical_closed, node_layout=True)


def schedule(name: str, c: Cluster, n: float, **kw) -> list[Phase]:
    """The phases of schedule ``name`` for n bytes on cluster ``c`` (a ``node_layout`` one,
    hierarchical: the cluster's nodes unless ``groups`` is given)."""
    record = lookup(SCHEDULES, name, "schedule")
    if record.node_layout:
        kw.setdefault("g", c.gpus_per_node)
    return record(c.size, n, **kw)


class SimResult(NamedTuple):
    time: float
    """Seconds, the sum of the phase times."""
    phase_times: np.ndarray
    """(phases,) seconds."""
    sent: np.ndarray
    """(P,) bytes each rank sent."""
    total_bytes: float
    """Bytes on the wire, all ranks."""
    inter_node_bytes: float
    """The part of total_bytes that crossed between physical nodes."""


def simulate(phases: list[Phase], c: Cluster) -> SimResult:
    """Time and bytes of ``phases`` on cluster ``c`` (see the module docstring for the rule)."""
    P = c.size
    alpha, beta = c.links()                                                # (P, P) each
    node = c.node()
    times, sent, inter = [], np.zeros(P), 0.0
    for ph in phases:
        if len(ph.src) == 0:
            times.append(0.0)
            continue
        if ph.src.max() >= P or ph.dst.max() >= P:
            raise ValueError(f"phase {ph.label!r} names rank {max(ph.src.max(), ph.dst.max())} "
                             f"but the cluster has {P}")
        a = alpha[ph.src, ph.dst]                                          # (m,)
        bw = ph.nbytes * beta[ph.src, ph.dst]                              # (m,)
        t_send = np.bincount(ph.src, bw, P) + _max_by(ph.src, a, P)        # (P,)
        t_recv = np.bincount(ph.dst, bw, P) + _max_by(ph.dst, a, P)        # (P,)
        times.append(float(max(t_send.max(), t_recv.max())))
        sent += np.bincount(ph.src, ph.nbytes, P)
        inter += float(ph.nbytes[node[ph.src] != node[ph.dst]].sum())
    times = np.asarray(times)
    return SimResult(float(times.sum()), times, sent, float(sent.sum()), inter)


def _max_by(idx: np.ndarray, val: np.ndarray, P: int) -> np.ndarray:
    out = np.zeros(P)
    np.maximum.at(out, idx, val)
    return out
