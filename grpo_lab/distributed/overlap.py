"""Reduce gradients *during* backward: bucketed asynchronous all_reduce (or the sharder's reduce
to owners) from per-parameter hooks.

Post-backward reduction waits for the whole backward pass, then all-reduces every gradient:
step time = backward + communication. DDP (Li et al. 2020, "PyTorch Distributed", VLDB,
sec. 3.2.3) overlaps the two: parameters are grouped into buckets of about ``bucket_bytes`` in
*reverse* registration order (backward produces the last layers' gradients first), and as
soon as every gradient of a bucket has been accumulated, that bucket's all_reduce is started
asynchronously while backward carries on with earlier layers. Here the trigger is torch's
``Tensor.register_post_accumulate_grad_hook`` (fires once a parameter's .grad is final for
this backward).

Two ratios, measured side by side by ``overlap_timing.measure_overlap`` (``_overlap_worker``), with T_post =
backward + the same buckets reduced after it (all_reduce, or the sharder's reduce to owners),
T_comm its communication part, T_overlapped = backward with the hooks + the wait for the last
bucket, T_exposed = that wait:

    concurrency   = 1 - T_exposed / T_comm              (share of comm that ran during backward;
                                                         what a profiler timeline shows)
    overlap ratio = (T_post - T_overlapped) / T_comm    (comm time actually hidden: time saved)

They agree only when communication costs the computation nothing. On GPUs NCCL runs on its own
SMs and copy engines; on a CPU gloo's thread takes cores from backward, so backward slows down
and the step time can stay the same (ratio ~0, even < 0 on a loaded machine) while the
concurrency looks high. T_comm includes waiting for the other rank to finish its own backward
(skew), in both modes. The last bucket (the first layers' gradients, produced last) can
never be hidden: its all_reduce starts when backward ends.

``OverlappedAllReduce(model)`` is self-contained: after ``loss.backward()``, ``finish()``
waits for every bucket and leaves each ``.grad`` equal to the average over ranks, exactly
what ``allreduce_grads`` (one all_reduce per tensor after backward, the reference) gives, up
to the summation order of 3+ ranks. ``OverlappedReduce`` does the same for the sharder
(``ShardedOptimizer(overlap=True)``): the shards are cut into buckets in backward order, one
async ``dist.reduce`` per owner in each, and ``finish()`` hands the owner its averaged shards;
the owner's AdamW and the broadcast then run as after a post-backward reduce. Both start
buckets strictly in bucket order (``HookedBuckets``), as DDP does. Deviations from DDP: one
backward per ``finish()`` (no gradient accumulation, no ``no_sync``), buckets fixed at
construction (DDP rebuilds them from the first iteration's order; the sharder's after a
re-shard), a flat copy per bucket (DDP's gradients are views into the bucket), no
unused-parameter detection: a parameter that gets no gradient holds its bucket, and every
later one, back until ``finish()``, which then reduces zeros for it. ZeRO-2 would also free
each reduced gradient that the rank does not own; here every rank keeps its full local
gradient until ``zero_grad``.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

DEFAULT_BUCKET_BYTES = 256 * 1024


def allreduce_grads(model: torch.nn.Module, group=None) -> None:
    """Reference, post-backward: one all_reduce per gradient, then / world size."""
    world = dist.get_world_size(group)
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad.div_(world)


def _cut_backward(items: list, nbytes, bucket_bytes: int) -> list[list]:
    """``items`` in backward order (reversed: the last layers' gradients come first, as DDP
    assumes), cut into groups closed once they reach ``bucket_bytes`` (``nbytes(item)``)."""
    groups, cur, size = [], [], 0
    for x in reversed(items):
        cur.append(x)
        size += nbytes(x)
        if size >= bucket_bytes:
            groups.append(cur)
            cur, size = [], 0
    return groups + [cur] if cur else groups


class HookedBuckets:
    """What both reducers share: a grad hook per parameter counts down the buckets that wait
    for it, and buckets start strictly in bucket order (as DDP's reducer does), so every rank
    issues the same collectives in the same order whatever order its hooks fire in; a bucket
    held back (a parameter without a gradient) holds back the ones after it until finish()."""

    def __init__(self, params: list[torch.Tensor], overlap: bool):
        self.overlap = overlap
        self.enabled = True
        """False: the hooks do nothing (another reducer of the same model is in use)."""
        self.hooks = [p.register_post_accumulate_grad_hook(self._ready) for p in params]

    def _set_buckets(self, needs: list[list[torch.Tensor]]):
        """needs[b]: the parameters whose gradients bucket b waits for."""
        self.needs = needs
        self.waits_on: dict[torch.Tensor, list[int]] = {}
        for b, ps in enumerate(needs):
            for p in ps:
                self.waits_on.setdefault(p, []).append(b)
        self._reset()

    def _reset(self):
        n = len(self.needs)
        self.pending = [len(ps) for ps in self.needs]
        self.works, self.flats = [None] * n, [None] * n
        self.launched_at = [None] * n                    # perf_counter when started
        self.next = 0                                    # the next bucket to start

    def _ready(self, p: torch.Tensor):
        if not self.enabled:
            return
        for b in self.waits_on.get(p, ()):
            self.pending[b] -= 1
            if self.pending[b] < 0:
                raise RuntimeError(f"a second backward before finish(): gradient accumulation "
                                   f"is not supported by {type(self).__name__}")
        while self.overlap and self.next < len(self.needs) and self.pending[self.next] == 0:
            self._start(self.next)

    def _start(self, b: int):
        self.launched_at[b] = time.perf_counter()
        self.works[b] = self._launch(b)
        self.next = b + 1

    def _start_rest(self):
        while self.next < len(self.needs):
            self._start(self.next)

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()


class OverlappedAllReduce(HookedBuckets):
    """Bucketed async all_reduce started by grad hooks; ``finish()`` makes each .grad the average."""

    def __init__(self, model: torch.nn.Module, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 group=None, overlap: bool = True):
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.group = group
        self.world = dist.get_world_size(group)
        params = [p for p in model.parameters() if p.requires_grad]
        self.buckets = _cut_backward(params, lambda p: p.numel() * p.element_size(), bucket_bytes)
        super().__init__(params, overlap)
        self._set_buckets(self.buckets)

    def _launch(self, b: int):
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.buckets[b]]
        self.flats[b] = torch.cat([g.reshape(-1) for g in grads])              # (bucket numel,)
        return dist.all_reduce(self.flats[b], group=self.group, async_op=True)

    def finish(self) -> None:
        """Start what has not started, wait for every bucket, write the averages into .grad."""
        self._start_rest()
        for b, ps in enumerate(self.buckets):
            self.works[b].wait()
            flat = self.flats[b].div_(self.world)
            offset = 0
            for p in ps:
                g = flat[offset:offset + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)
                offset += p.numel()
        self._reset()


class OverlappedReduce(HookedBuckets):
    """The sharder's reduce, overlapped: bucketed async ``dist.reduce`` of gradient shards to
    their owners, started by grad hooks; ``finish()`` -> (this rank's owned shards averaged,
    flat, in ``ShardedOptimizer``'s owned order, or None; floor bytes on the wire, all ranks).

    ``shards`` and ``owner`` are the sharder's (``shard_plan.make_shards`` / ``assign``). The
    shards are cut, in backward order, into groups of about ``bucket_bytes`` as DDP's buckets;
    a group holding shards of k owners is k buckets, one ``dist.reduce`` to each owner (in
    owner order). ``set_owner`` rebuilds them after a re-shard. Sums and bytes are those of
    ``ShardedOptimizer._reduce`` (one reduce per owner after backward): the floor (N-1) * b of
    each b-byte reduce adds up to the same (N-1) * M, only in more, smaller messages."""

    def __init__(self, params: list[torch.Tensor], shards, owner: list[int],
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, group=None, overlap: bool = True):
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.params, self.shards, self.bucket_bytes, self.group = params, shards, bucket_bytes, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        super().__init__(params, overlap)
        self.set_owner(owner)

    def set_owner(self, owner: list[int]) -> None:
        self.owner = list(owner)
        groups = _cut_backward(self.shards, lambda s: s.nbytes, self.bucket_bytes)
        self.buckets = [(o, [s for s in g if owner[s.index] == o])     # (owner, its shards)
                        for g in groups for o in sorted({owner[s.index] for s in g})]
        self._set_buckets([list({id(self.params[s.param]): self.params[s.param]
                                 for s in ss}.values()) for _, ss in self.buckets])

    def _grad_slice(self, s) -> torch.Tensor:
        p = self.params[s.param]
        g = p.grad
        return torch.zeros(s.numel, dtype=p.dtype, device=p.device) if g is None \
            else g.detach().view(-1)[s.start:s.start + s.numel]              # (numel,)

    def _launch(self, b: int):
        o, ss = self.buckets[b]
        self.flats[b] = torch.cat([self._grad_slice(s) for s in ss])           # (bucket numel,)
        return dist.reduce(self.flats[b], dst=o, group=self.group, async_op=True)

    def finish(self) -> tuple[torch.Tensor | None, int]:
        """Start what has not started, wait for every bucket -> (owned shards averaged, bytes)."""
        self._start_rest()
        mine, comm = {}, 0
        for b, (o, ss) in enumerate(self.buckets):
            self.works[b].wait()
            comm += (self.world - 1) * self.flats[b].nbytes
            if o == self.rank:
                flat, off = self.flats[b].div_(self.world), 0                  # mean over ranks
                for s in ss:
                    mine[s.index] = flat[off:off + s.numel]
                    off += s.numel
        self._reset()
        owned = [i for i, o in enumerate(self.owner) if o == self.rank]
        return (torch.cat([mine[i] for i in owned]) if owned else None), comm
