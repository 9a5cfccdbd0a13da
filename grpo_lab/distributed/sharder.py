"""The dynamic gradient sharder: who owns which slice of the optimizer state (ZeRO-2 style).

Byte accounting first (Rajbhandari et al. 2020, "ZeRO", sec. 3 and 5). Training with AdamW
in float32 holds, per parameter element, on every data-parallel rank:

    params 4 B + grads 4 B + Adam exp_avg 4 B + exp_avg_sq 4 B  = 16 B per element

ZeRO-1 splits the Adam state over N ranks: 4 + 4 + 8/N. ZeRO-2 also splits the reduced
gradients: 4 + (4 + 8)/N. On the default toy policy (343,488 elements) Adam's state is
2.75 MB; on 4 ranks each should hold 0.69 MB, and "imbalance" (max/mean bytes per rank)
says how far the busiest rank is from that: the busiest rank sets the memory peak.

The step, for a parameter shard s owned by rank o(s):

    backward (every rank, its slice of the batch)  -> local grads, full size
    reduce:     grads of the shards of o summed onto o (one flat buffer per owner), / N
    update:     o runs AdamW on its shards only (math as torch.optim.AdamW, single-tensor path)
    broadcast:  o sends its updated parameter slices to every rank (one flat buffer per owner)

Communication, counted as the bytes the wire must carry at minimum, summed over ranks: a
reduce of b bytes to one rank needs (N-1)*b (each other rank's partial sum leaves it once),
a broadcast of b bytes needs (N-1)*b, an all_reduce 2*(N-1)*b. Over all owners that is
2*(N-1)*M for M gradient bytes, exactly DDP's all_reduce (2*(N-1)/N * M per rank, ring):
ZeRO-2's well-known result that sharding the state costs no extra traffic. Measured on
gloo (bytes its sockets were handed, /proc/self/io): all_reduce and broadcast sit at the
floor, but gloo's reduce is a reduce-scatter plus a gather, (N-1)*(1 + 1/N)*b, so on gloo
this sharder writes 1 + 1/(2N) times DDP's bytes (1.25x at N=2). all_reduce-and-keep would
be 2x the reduce floor, and gloo's reduce_scatter is emulated (about 2x): reduce is the best
gloo offers. NCCL's reduce is a pipelined ring/tree near the floor.

The popular claim, "importance-aware sharding cuts communication by ~58%": under this
accounting the traffic of a step is sum over shards of 2*(N-1)*bytes(s), whoever owns s. No
assignment policy can change it; only sending fewer bytes (compression, skipping shards,
i.e. changing the optimizer's math) can. What assignment does change: the memory peak
(imbalance), the per-owner update work, and, when owners change, migration traffic: moving
a shard moves its Adam state, 8 B per element, twice its gradient, plus the importance
moments (8 B per element) when they are kept. ``comm/bytes`` and ``shard/migrated_bytes``
measure exactly these, per step, for every policy (see bench/RESULTS_sharder.md).

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

Deviations from ZeRO-2 proper: gradients are reduced after backward, not bucket by bucket
during it, so the full local gradient exists until ``zero_grad`` (``shard/grad_bytes``
reports the reduced, owned part). A parameter without a gradient is treated as a zero
gradient (torch's AdamW would skip it, so weight decay and momentum differ for it).

Metrics, one dict per ``step()``, identical on every rank:
  shard/opt_state_bytes   per-rank list: Adam state actually allocated (exp_avg + exp_avg_sq)
  shard/importance_bytes  per-rank list: running moments allocated (0 without importance)
  shard/grad_bytes        per-rank list: reduced gradient bytes each rank owns
  shard/imbalance         max / mean of shard/opt_state_bytes
  comm/bytes              floor bytes on the wire this step, all ranks (re-shard included)
  shard/migrated_bytes    state bytes moved by this step's re-shard (0 without one)
  shard/moved             shards that changed owner in this step's re-shard
  time/step_s             wall time of step(): reduce, update, broadcast, re-shard
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from grpo_lab.distributed.importance import (DEFAULT_DECAY, RunningMoments, get_importance,
                                             init_moments, update_moments)

IMPORTANCE_SLACK = 0.02  # importance_balanced: rank loads within 2% of the mean count as equal
USES_IMPORTANCE = {"importance_round_robin", "importance_balanced"}


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
    if max_shard_numel < 1:
        raise ValueError(f"max_shard_numel must be >= 1, got {max_shard_numel}")
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


POLICIES = {
    "importance_round_robin": importance_round_robin,
    "size_balanced": size_balanced,
    "importance_balanced": importance_balanced,
    "capacity_weighted": capacity_weighted,
}


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
    if policy not in POLICIES:
        raise ValueError(f"unknown shard policy {policy!r}; known: {sorted(POLICIES)}")
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
    owner = POLICIES[policy](shards, n_ranks, importance, capacities)
    assert len(owner) == len(shards) and all(0 <= o < n_ranks for o in owner), owner
    return owner


def rank_bytes(shards: list[ShardInfo], owner: list[int], n_ranks: int, per_element: int = 8):
    """Bytes each rank holds at ``per_element`` bytes per owned element (8: Adam's state)."""
    out = [0] * n_ranks
    for s, o in zip(shards, owner):
        out[o] += s.numel * per_element
    return out


def imbalance(loads) -> float:
    """max / mean of per-rank loads: 1.0 is perfect, N means one rank holds everything."""
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean > 0 else 1.0


# ---- AdamW on one flat shard: torch.optim.AdamW's single-tensor path, line for line ----

@dataclass
class AdamState:
    exp_avg: torch.Tensor
    """(n,) first moment."""
    exp_avg_sq: torch.Tensor
    """(n,) second moment."""
    step: int = 0
    """Updates applied."""


def adamw_update(param, grad, st: AdamState, lr, betas, eps, weight_decay) -> None:
    """In place on ``param`` (n,) and ``st``; same op order as torch/optim/adam.py."""
    beta1, beta2 = betas
    st.step += 1
    param.mul_(1 - lr * weight_decay)                                      # decoupled decay
    st.exp_avg.lerp_(grad, 1 - beta1)
    st.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1 ** st.step
    bias_correction2_sqrt = (1 - beta2 ** st.step) ** 0.5
    denom = (st.exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    param.addcdiv_(st.exp_avg, denom, value=-lr / bias_correction1)


# ---- execution: reduce to owners, owners update, broadcast back, re-shard every N steps ----

class ShardedOptimizer:
    """AdamW whose state is split over the ranks of a process group by a ``POLICIES`` rule.

    Use like a torch optimizer: every rank runs forward/backward on its slice of the batch,
    then ``metrics = opt.step()`` and ``opt.zero_grad()``. Gradients are averaged over ranks
    (sum / N), so per-rank mean losses over equal slices give the full-batch mean gradient.
    ``reshard_every=k`` (0: never) recomputes importance and reruns the policy after every
    k-th step, migrating the state of shards that change owner; ``reshard()`` does it now.
    ``importance`` names a score in ``IMPORTANCE`` (None: track none). Tracking costs 8 B per
    owned element (running mean and variance), so it is off unless asked for; the policies
    in ``USES_IMPORTANCE`` refuse to re-shard without it.
    """

    def __init__(self, named_params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 policy="size_balanced", importance=None, reshard_every=0,
                 max_shard_numel=None, capacities=None, importance_decay=DEFAULT_DECAY,
                 group=None):
        named = [(n, p) for n, p in named_params if p.requires_grad]
        if not named:
            raise ValueError("no parameters that require grad")
        for n, p in named:
            if not p.is_contiguous():
                raise ValueError(f"parameter {n!r} is not contiguous; shards are flat views")
            if p.device != named[0][1].device or p.dtype != named[0][1].dtype:
                raise ValueError(f"parameter {n!r} is {p.dtype} on {p.device}, but "
                                 f"{named[0][0]!r} is {named[0][1].dtype} on {named[0][1].device}")
        if reshard_every < 0:
            raise ValueError(f"reshard_every must be >= 0, got {reshard_every}")
        if reshard_every and policy in USES_IMPORTANCE and importance is None:
            raise ValueError(f"policy {policy!r} re-shards by importance every {reshard_every} "
                             f"steps, but importance=None: pass importance='seed' (or one of "
                             f"'norm', 'variance', 'snr')")
        self.group, self.rank, self.world = group, dist.get_rank(group), dist.get_world_size(group)
        self.params = [p for _, p in named]
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay
        self.policy, self.capacities, self.reshard_every = policy, capacities, reshard_every
        self.score_fn = None if importance is None else get_importance(importance)
        self.importance_decay = importance_decay
        total = sum(p.numel() for p in self.params)
        self.shards = make_shards(named, max_shard_numel or default_max_shard_numel(total, self.world))
        self.owner = assign(policy, self.shards, self.world, None, capacities)
        self.device, self.dtype = self.params[0].device, self.params[0].dtype
        self.state: dict[int, AdamState] = {}
        self.moments: dict[int, RunningMoments] = {}
        for i in self._owned(self.rank):
            self._new_state(i)
        self.scores: dict[int, float] = {}
        self.steps = 0
        self.reshard_count = 0
        self._measure_memory()

    def _owned(self, rank) -> list[int]:
        return [i for i, o in enumerate(self.owner) if o == rank]

    def _new_state(self, i):
        n = self.shards[i].numel
        z = lambda: torch.zeros(n, device=self.device, dtype=self.dtype)  # noqa: E731
        self.state[i] = AdamState(z(), z())
        if self.score_fn is not None:
            self.moments[i] = init_moments(n, self.device, self.dtype)

    def _state_tensors(self, i) -> list[torch.Tensor]:  # what migrates with shard i
        extra = [self.moments[i].mean, self.moments[i].var] if self.score_fn else []
        return [self.state[i].exp_avg, self.state[i].exp_avg_sq] + extra

    def _slice(self, t, i):  # (numel,) view of shard i inside tensor t shaped like its param
        s = self.shards[i]
        return t.detach().view(-1)[s.start:s.start + s.numel]

    def _measure_memory(self) -> int:
        """All-gather the bytes each rank actually holds -> comm bytes spent doing it."""
        mine = torch.tensor([sum(st.exp_avg.nbytes + st.exp_avg_sq.nbytes for st in self.state.values()),
                             sum(m.nbytes for m in self.moments.values()),
                             sum(self.shards[i].nbytes for i in self._owned(self.rank))],
                            dtype=torch.int64, device=self.device)         # (3,)
        out = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(out, mine, group=self.group)
        table = torch.stack(out).tolist()                                  # (N, 3)
        self.opt_state_bytes = [row[0] for row in table]
        self.importance_bytes = [row[1] for row in table]
        self.grad_bytes = [row[2] for row in table]
        return self.world * (self.world - 1) * mine.nbytes

    def zero_grad(self, set_to_none: bool = True):
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> dict:
        t0 = time.perf_counter()
        N, comm = self.world, 0
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        reduced = None
        for o in range(N):                                  # 1. reduce each owner's buffer to it
            idx = self._owned(o)
            if not idx:
                continue
            buf = torch.cat([self._slice(grads[self.shards[i].param], i) for i in idx])  # (n_o,)
            dist.reduce(buf, dst=o, group=self.group)
            comm += (N - 1) * buf.nbytes
            if o == self.rank:
                reduced = buf.div_(N)                                      # mean over ranks
        off = 0
        for i in self._owned(self.rank):                    # 2. AdamW on owned shards
            g = reduced[off:off + self.shards[i].numel]                    # (n_i,)
            off += self.shards[i].numel
            adamw_update(self._slice(self.params[self.shards[i].param], i), g, self.state[i],
                         self.lr, self.betas, self.eps, self.weight_decay)
            if self.score_fn is not None:
                self.scores[i] = self.score_fn(update_moments(self.moments[i], g,
                                                              self.importance_decay), g)
        for o in range(N):                                  # 3. owners broadcast new params
            idx = self._owned(o)
            if not idx:
                continue
            if o == self.rank:
                buf = torch.cat([self._slice(self.params[self.shards[i].param], i) for i in idx])
            else:
                buf = torch.empty(sum(self.shards[i].numel for i in idx), device=self.device,
                                  dtype=self.dtype)
            dist.broadcast(buf, src=o, group=self.group)
            comm += (N - 1) * buf.nbytes
            if o != self.rank:
                off = 0
                for i in idx:
                    self._slice(self.params[self.shards[i].param], i).copy_(
                        buf[off:off + self.shards[i].numel])
                    off += self.shards[i].numel
        self.steps += 1
        migrated = moved = 0
        if self.reshard_every and self.steps % self.reshard_every == 0:
            r = self.reshard()                              # 4. every k steps
            comm, migrated, moved = comm + r["comm/bytes"], r["shard/migrated_bytes"], r["shard/moved"]
        return {"shard/opt_state_bytes": list(self.opt_state_bytes),
                "shard/importance_bytes": list(self.importance_bytes),
                "shard/grad_bytes": list(self.grad_bytes),
                "shard/imbalance": imbalance(self.opt_state_bytes),
                "shard/migrated_bytes": migrated, "shard/moved": moved,
                "comm/bytes": comm, "time/step_s": time.perf_counter() - t0}

    @torch.no_grad()
    def reshard(self, policy: str | None = None, capacities=None) -> dict:
        """Rerun the policy on fresh importance scores; move the state of shards that change
        owner (point to point, old owner -> new owner). Overrides persist for later re-shards."""
        policy = policy or self.policy
        if policy in USES_IMPORTANCE and self.score_fn is None:
            raise ValueError(f"policy {policy!r} ranks shards by importance, but this "
                             f"optimizer tracks none: pass importance='seed' (or one of "
                             f"'norm', 'variance', 'snr') to ShardedOptimizer")
        capacities = capacities if capacities is not None else self.capacities
        N, S = self.world, len(self.shards)
        scores = torch.zeros(S, dtype=torch.float64, device=self.device)   # (S,)
        for i, v in self.scores.items():
            scores[i] = v                                                  # owners fill theirs
        dist.all_reduce(scores, group=self.group)                          # exact: x + 0 + ...
        comm = 2 * (N - 1) * scores.nbytes
        new_owner = assign(policy, self.shards, N, scores.tolist(), capacities)
        self.policy, self.capacities = policy, capacities
        check = torch.tensor(new_owner, dtype=torch.int64, device=self.device)  # (S,)
        ref = check.clone()
        dist.broadcast(ref, src=0, group=self.group)
        comm += (N - 1) * ref.nbytes
        if not torch.equal(check, ref):
            bad = int((check != ref).nonzero()[0])
            raise RuntimeError(f"rank {self.rank} assigns shard {bad} ({self.shards[bad].name}) "
                               f"to rank {new_owner[bad]}, rank 0 to {int(ref[bad])}: ranks must "
                               f"pass the same policy and capacities")
        moves: dict[tuple[int, int], list[int]] = {}
        for i, (a, b) in enumerate(zip(self.owner, new_owner)):
            if a != b:
                moves.setdefault((a, b), []).append(i)
        ops, inbox, migrated = [], [], 0
        for (src, dst), idx in moves.items():
            per = 4 if self.score_fn else 2                                # tensors per shard
            n_float = per * sum(self.shards[i].numel for i in idx)
            migrated += n_float * self.dtype.itemsize + len(idx) * 2 * 8   # + steps (int64)
            if self.rank == src:
                payload = torch.cat([t for i in idx for t in self._state_tensors(i)])    # (n_float,)
                steps = torch.tensor([v for i in idx for v in (
                    self.state[i].step, self.moments[i].steps if self.score_fn else 0)],
                    dtype=torch.int64, device=self.device)                 # (2 * moved,)
                ops += [dist.P2POp(dist.isend, payload, dst, self.group, 0),
                        dist.P2POp(dist.isend, steps, dst, self.group, 1)]
                for i in idx:
                    self.state.pop(i)
                    self.moments.pop(i, None)
                    self.scores.pop(i, None)
            elif self.rank == dst:
                payload = torch.empty(n_float, device=self.device, dtype=self.dtype)
                steps = torch.empty(2 * len(idx), dtype=torch.int64, device=self.device)
                ops += [dist.P2POp(dist.irecv, payload, src, self.group, 0),
                        dist.P2POp(dist.irecv, steps, src, self.group, 1)]
                inbox.append((idx, payload, steps))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        for idx, payload, steps in inbox:
            off = 0
            for k, i in enumerate(idx):
                self._new_state(i)
                n = self.shards[i].numel
                for t in self._state_tensors(i):
                    t.copy_(payload[off:off + n])
                    off += n
                self.state[i].step = int(steps[2 * k])
                if self.score_fn:
                    self.moments[i].steps = int(steps[2 * k + 1])
        self.owner = new_owner
        self.reshard_count += 1
        comm += migrated + self._measure_memory()
        return {"comm/bytes": comm, "shard/migrated_bytes": migrated,
                "shard/moved": sum(len(v) for v in moves.values())}
