"""The dynamic gradient sharder: who owns which slice of the optimizer state (ZeRO-2 style).

Byte accounting first (Rajbhandari et al. 2020, "ZeRO", sec. 3 and 5). Training with AdamW
in float32 holds, per parameter element, on every data-parallel rank:

    params 4 B + grads 4 B + Adam exp_avg 4 B + exp_avg_sq 4 B  = 16 B per element

ZeRO-1 splits the Adam state over N ranks: 4 + 4 + 8/N. ZeRO-2 also splits the reduced
gradients: 4 + (4 + 8)/N. On the shipped toy policy (data/base_policy.safetensors, 3 layers
x 80 wide, 240,160 elements) Adam's state is 8 B x 240,160 = 1.92 MB; on 4 ranks each should
hold 0.48 MB, and "imbalance" (max/mean bytes per rank) says how far the busiest rank is from
that: the busiest rank sets the memory peak.

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

Shards and assignment policies (``POLICIES``: importance_round_robin, size_balanced,
importance_balanced, capacity_weighted) live in ``shard_plan``, pure functions.

Compression inside the sharder (``compression=`` and ``broadcast_compression=``, each a
``compression.PRESETS`` name or a ``CompressionConfig``; the codecs run on the CPU):

  reduce:     every rank encodes all shards as one step of its ``Compressor``
              (``encode_split``: one message per owner; the fp8/top-k plan over all shards,
              ranked by the sharder's importance scores once a re-shard has gathered them,
              by each gradient's RMS before), sends each message to its owner point to point
              (after all-gathering an (N, N) int64 table of lengths), and the owner decodes
              the N messages and averages them in rank order, as comm.compressed_all_reduce
              does. Error-feedback residuals are the sender's memory of what it has not sent
              yet, kept per shard name: they stay with the sender, nothing migrates.
  broadcast:  fp32 unless ``broadcast_compression``: replicas must stay identical, and a
              lossy copy of the parameters would drift. With it, EF21-P (Gruntkowska, Tyurin
              and Richtarik 2023): the owner keeps exact master weights w (4 B per owned
              element, migrated with the shard), AdamW updates w, and the owner broadcasts
              C(w - x), the compressed difference to the replica x that forward uses; every
              rank, the owner too, adds the decoded difference to x. What was not sent stays
              in w - x and goes out later, so the preset's own residual is turned off.

Bytes per step, all ranks, for a gradient of M fp32 bytes whose compressed message is C
bytes: reduce (N-1) * C (each rank sends its N-1 other owners their part) + N(N-1) * 8N
for the table; broadcast (N-1) * M in fp32, or (N-1) * P for P bytes of compressed
differences + N(N-1) * 8 for their lengths. An all_gather of compressed messages (comm.py)
costs N(N-1) * C: every rank receives every message, because top-k messages cannot be summed
in flight; sending each part to one owner costs N times less. With an fp32 broadcast,
compressing the reduce can at best halve the sharder's bytes: (N-1) * M of 2(N-1) * M stays.

Overlap (``overlap=True``, uncompressed reduce only): ``overlap.OverlappedReduce`` registers a
grad hook on every parameter and starts the reduce during backward, bucket by bucket (shards
cut in backward order into groups of about ``bucket_bytes``, one async ``dist.reduce`` per
owner in each), as DDP's buckets do; ``step()`` waits for the last buckets, then AdamW and
the broadcast run as without it. Same sums, so the same parameters (bitwise at N=2), and the
same ``comm/bytes``: (N-1) * b per b-byte reduce adds up to (N-1) * M in either case.

Deviations from ZeRO-2 proper: gradients are reduced after backward unless ``overlap=True``,
and even then the full local gradient exists until ``zero_grad`` (``shard/grad_bytes``
reports the reduced, owned part). A parameter without a gradient is treated as a zero
gradient (torch's AdamW would skip it, so weight decay and momentum differ for it).

Metrics, one dict per ``step()``, identical on every rank:
  shard/opt_state_bytes   per-rank list: optimizer state actually allocated (exp_avg,
                          exp_avg_sq, and master weights with a compressed broadcast)
  shard/importance_bytes  per-rank list: running moments allocated (0 without importance)
  shard/grad_bytes        per-rank list: reduced gradient bytes each rank owns
  shard/imbalance         max / mean of shard/opt_state_bytes
  comm/bytes              floor bytes on the wire this step, all ranks (re-shard included)
  comm/reduce_bytes       the part of comm/bytes spent on the gradient reduce
  shard/migrated_bytes    state bytes moved by this step's re-shard (0 without one)
  shard/moved             shards that changed owner in this step's re-shard
  time/step_s             wall time of step(): reduce, update, broadcast, re-shard
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from grpo_lab.distributed.compression import Compressor, decode_message, get_config
from grpo_lab.distributed.importance import (DEFAULT_DECAY, RunningMoments, get_importance,
                                             init_moments, update_moments)
from grpo_lab.distributed.overlap import DEFAULT_BUCKET_BYTES, OverlappedReduce
from grpo_lab.distributed.shard_plan import (POLICIES, assign, default_max_shard_numel,
                                             imbalance, make_shards, migration_bytes)
from grpo_lab.registry import check_number, lookup

# ---- AdamW on one flat shard: torch.optim.AdamW's single-tensor path, line for line ----

@dataclass
class AdamState:
    exp_avg: torch.Tensor
    """(n,) first moment."""
    exp_avg_sq: torch.Tensor
    """(n,) second moment."""
    step: int = 0
    """Updates applied."""
    master: torch.Tensor | None = None
    """(n,) the owner's exact parameters when the broadcast is compressed (else None)."""


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
    whose record says ``uses_importance`` refuse to re-shard without it. ``compression`` compresses the
    gradient reduce, ``broadcast_compression`` the parameter broadcast (EF21-P), each a preset
    name or a ``CompressionConfig`` (module docstring); ``compression_seed`` seeds the sampled
    top-k (give each rank its own). ``grad_clip`` > 0 clips the averaged gradient's global
    norm as ``torch.nn.utils.clip_grad_norm_`` does (owners sum their squares, one all_reduce).
    ``full_state_dict`` / ``load_full_state_dict`` gather / scatter the state in
    ``torch.optim.AdamW``'s format, so a checkpoint resumes on any number of ranks.
    ``overlap=True`` starts the fp32 reduce during backward in buckets of about
    ``bucket_bytes`` (grad hooks on the parameters; ``remove_hooks()`` takes them off).
    """

    def __init__(self, named_params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 policy="size_balanced", importance=None, reshard_every=0,
                 max_shard_numel=None, capacities=None, importance_decay=DEFAULT_DECAY,
                 compression=None, broadcast_compression=None, compression_seed=0, group=None,
                 grad_clip: float = 0.0, overlap: bool = False,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        named = [(n, p) for n, p in named_params if p.requires_grad]
        if not named:
            raise ValueError("no parameters that require grad")
        for n, p in named:
            if not p.is_contiguous():
                raise ValueError(f"parameter {n!r} is not contiguous; shards are flat views")
            if p.device != named[0][1].device or p.dtype != named[0][1].dtype:
                raise ValueError(f"parameter {n!r} is {p.dtype} on {p.device}, but "
                                 f"{named[0][0]!r} is {named[0][1].dtype} on {named[0][1].device}")
        # torch.optim.AdamW refuses these too; unchecked, a NaN reaches every weight, a negative
        # grad_clip flips the gradient and a NaN one clips nothing, a NaN reshard_every never fires
        for name, value in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay),
                            ("grad_clip", grad_clip)):
            check_number(name, value)
        for name, value in (("betas[0]", betas[0]), ("betas[1]", betas[1]),
                            ("importance_decay", importance_decay)):
            check_number(name, value, lambda x: 0 <= x < 1, "in [0, 1)")
        check_number("reshard_every", reshard_every, lambda x: x >= 0 and float(x).is_integer(),
                     "a whole number >= 0 (0: never)")
        if reshard_every and lookup(POLICIES, policy, "shard policy").uses_importance \
                and importance is None:
            raise ValueError(f"policy {policy!r} re-shards by importance every {reshard_every} "
                             f"steps, but importance=None: pass importance='seed' (or one of "
                             f"'norm', 'variance', 'snr')")
        if overlap and compression is not None:
            raise ValueError(f"overlap=True overlaps the fp32 reduce only, but compression="
                             f"{compression!r}: use one or the other")
        self.group, self.rank, self.world = group, dist.get_rank(group), dist.get_world_size(group)
        self.params = [p for _, p in named]
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay
        self.grad_clip = grad_clip
        self.policy, self.capacities, self.reshard_every = policy, capacities, reshard_every
        self.score_fn = None if importance is None else get_importance(importance)
        self.importance_decay = importance_decay
        total = sum(p.numel() for p in self.params)
        self.shards = make_shards(named, max_shard_numel or default_max_shard_numel(total, self.world))
        self.owner = assign(policy, self.shards, self.world, None, capacities)
        self.device, self.dtype = self.params[0].device, self.params[0].dtype
        self.compressor = None if compression is None else Compressor(compression, compression_seed)
        self.bcompressor = None
        if broadcast_compression is not None:                # EF21-P: no residual of its own
            self.bcompressor = Compressor(dataclasses.replace(
                get_config(broadcast_compression), error_feedback=False, momentum=0.0),
                compression_seed)
        self.shard_index = {s.name: s.index for s in self.shards}
        self.state: dict[int, AdamState] = {}
        self.moments: dict[int, RunningMoments] = {}
        for i in self._owned(self.rank):
            self._new_state(i)
        self.scores: dict[int, float] = {}
        self.global_scores: list[float] | None = None      # every shard's score, after a re-shard
        self.steps = 0
        self.reshard_count = 0
        self.overlapped = None if not overlap else \
            OverlappedReduce(self.params, self.shards, self.owner, bucket_bytes, group)
        self._measure_memory()

    def _owned(self, rank) -> list[int]:
        return [i for i, o in enumerate(self.owner) if o == rank]

    def _new_state(self, i):
        n = self.shards[i].numel
        z = lambda: torch.zeros(n, device=self.device, dtype=self.dtype)  # noqa: E731
        self.state[i] = AdamState(z(), z())
        if self.bcompressor is not None:                   # a migrated shard overwrites it
            self.state[i].master = self._slice(self.params[self.shards[i].param], i).clone()
        if self.score_fn is not None:
            self.moments[i] = init_moments(n, self.device, self.dtype)

    def _state_tensors(self, i) -> list[torch.Tensor]:  # what migrates with shard i
        extra = [self.moments[i].mean, self.moments[i].var] if self.score_fn else []
        master = [self.state[i].master] if self.bcompressor is not None else []
        return [self.state[i].exp_avg, self.state[i].exp_avg_sq] + extra + master

    def _slice(self, t, i):  # (numel,) view of shard i inside tensor t shaped like its param
        s = self.shards[i]
        return t.detach().view(-1)[s.start:s.start + s.numel]

    def _measure_memory(self) -> int:
        """All-gather the bytes each rank actually holds -> comm bytes spent doing it."""
        mine = torch.tensor([sum(st.exp_avg.nbytes + st.exp_avg_sq.nbytes +
                                 (0 if st.master is None else st.master.nbytes)
                                 for st in self.state.values()),
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

    def remove_hooks(self) -> None:
        """Take the overlap's grad hooks off the parameters (no-op without overlap)."""
        if self.overlapped is not None:
            self.overlapped.remove()

    def zero_grad(self, set_to_none: bool = True):
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def _reduce(self, grads) -> tuple[torch.Tensor, int]:
        """fp32: one dist.reduce per owner -> (this rank's owned shards averaged, flat; bytes)."""
        N, comm, reduced = self.world, 0, None
        for o in range(N):
            idx = self._owned(o)
            if not idx:
                continue
            buf = torch.cat([self._slice(grads[self.shards[i].param], i) for i in idx])  # (n_o,)
            dist.reduce(buf, dst=o, group=self.group)
            comm += (N - 1) * buf.nbytes
            if o == self.rank:
                reduced = buf.div_(N)                                      # mean over ranks
        return reduced, comm

    def _reduce_compressed(self, grads) -> tuple[torch.Tensor, int]:
        """Each rank encodes every shard (one step of its Compressor), one message per owner,
        sends each message to its owner point to point; owners decode the N messages and
        average them in rank order (as comm.compressed_all_reduce does)."""
        N = self.world
        named = {s.name: self._slice(grads[s.param], s.index).cpu() for s in self.shards}
        groups = [[self.shards[i].name for i in self._owned(o)] for o in range(N)]
        importance = None if self.global_scores is None else \
            {s.name: self.global_scores[s.index] for s in self.shards}
        messages = self.compressor.encode_split(named, groups, importance)  # N x bytes
        lengths = torch.tensor([len(m) for m in messages], dtype=torch.int64,
                               device=self.device)                         # (N,) to each owner
        table = [torch.zeros_like(lengths) for _ in range(N)]
        dist.all_gather(table, lengths, group=self.group)                  # table[src][dst]
        table = torch.stack(table).tolist()                                # (N, N)
        ops, inbox = [], {}
        for o in range(N):
            if o != self.rank and messages[o]:
                ops.append(dist.P2POp(dist.isend, torch.frombuffer(bytearray(messages[o]),
                                      dtype=torch.uint8).to(self.device), o, self.group, 2))
            if o != self.rank and table[o][self.rank]:
                inbox[o] = torch.empty(table[o][self.rank], dtype=torch.uint8, device=self.device)
                ops.append(dist.P2POp(dist.irecv, inbox[o], o, self.group, 2))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        comm = sum(table[src][dst] for src in range(N) for dst in range(N) if src != dst) \
            + N * (N - 1) * lengths.nbytes                                 # + the length table
        idx = self._owned(self.rank)
        if not idx:
            return None, comm
        decoded = [decode_message(messages[src] if src == self.rank else
                                  bytes(inbox[src].cpu().numpy())) for src in range(N)]
        names = [self.shards[i].name for i in idx]                        # sums in rank order
        parts = [sum((d[name] for d in decoded[1:]), decoded[0][name]) / N for name in names]
        return torch.cat(parts).to(self.device, self.dtype), comm

    def _broadcast(self) -> int:
        """fp32: each owner broadcasts its updated parameter slices -> bytes on the wire."""
        N, comm = self.world, 0
        for o in range(N):
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
                for i, part in zip(idx, buf.split([self.shards[i].numel for i in idx])):
                    self._slice(self.params[self.shards[i].param], i).copy_(part)
        return comm

    def _broadcast_compressed(self) -> int:
        """EF21-P: each owner encodes master - replica of its shards, every rank (the owner
        too) adds the decoded difference to its replica; what was not sent stays in the
        difference and goes out in a later step -> bytes on the wire."""
        N = self.world
        named = {self.shards[i].name: (self.state[i].master - self._slice(
            self.params[self.shards[i].param], i)).cpu() for i in self._owned(self.rank)}
        mine = self.bcompressor.encode(named)                              # b"" if it owns none
        length = torch.tensor([len(mine)], dtype=torch.int64, device=self.device)
        lengths = [torch.zeros_like(length) for _ in range(N)]
        dist.all_gather(lengths, length, group=self.group)
        comm = N * (N - 1) * length.nbytes
        for o, n in enumerate(int(x) for x in lengths):
            if not n:
                continue
            buf = torch.frombuffer(bytearray(mine), dtype=torch.uint8).to(self.device) \
                if o == self.rank else torch.empty(n, dtype=torch.uint8, device=self.device)
            dist.broadcast(buf, src=o, group=self.group)
            comm += (N - 1) * n
            for name, delta in decode_message(bytes(buf.cpu().numpy())).items():
                i = self.shard_index[name]
                self._slice(self.params[self.shards[i].param], i).add_(
                    delta.to(self.device, self.dtype))
        return comm

    @torch.no_grad()
    def step(self) -> dict:
        t0 = time.perf_counter()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        if self.overlapped is not None:                     # 1. started during backward: wait
            reduced, comm = self.overlapped.finish()
        elif self.compressor is None:                       # 1. reduce each owner's buffer to it
            reduced, comm = self._reduce(grads)
        else:
            reduced, comm = self._reduce_compressed(grads)
        reduce_bytes = comm
        sq = torch.zeros(1, dtype=torch.float64, device=self.device)
        if reduced is not None:
            sq += reduced.double().square().sum()
        dist.all_reduce(sq, group=self.group)                # global norm of the mean gradient
        gnorm = float(sq.sqrt())
        if not math.isfinite(gnorm):                        # every rank sees it: all stop
            raise FloatingPointError(f"gradient norm is {gnorm}")
        if self.grad_clip and reduced is not None:
            reduced.mul_(min(1.0, self.grad_clip / (gnorm + 1e-6)))       # as clip_grad_norm_
        off = 0
        for i in self._owned(self.rank):                    # 2. AdamW on owned shards
            g = reduced[off:off + self.shards[i].numel]                    # (n_i,)
            off += self.shards[i].numel
            st = self.state[i]
            target = self._slice(self.params[self.shards[i].param], i) if st.master is None \
                else st.master
            adamw_update(target, g, st, self.lr, self.betas, self.eps, self.weight_decay)
            if self.score_fn is not None:
                self.scores[i] = self.score_fn(update_moments(self.moments[i], g,
                                                              self.importance_decay), g)
        if self.bcompressor is None:                        # 3. owners broadcast new params
            comm += self._broadcast()
        else:
            comm += self._broadcast_compressed()
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
                "comm/bytes": comm, "comm/reduce_bytes": reduce_bytes, "grad/norm": gnorm,
                "time/step_s": time.perf_counter() - t0}

    @torch.no_grad()
    def reshard(self, policy: str | None = None, capacities=None) -> dict:
        """Rerun the policy on fresh importance scores; move the state of shards that change
        owner (point to point, old owner -> new owner). Overrides persist for later re-shards."""
        policy = policy or self.policy
        if lookup(POLICIES, policy, "shard policy").uses_importance and self.score_fn is None:
            raise ValueError(f"policy {policy!r} ranks shards by importance, but this "
                             f"optimizer tracks none: pass importance='seed' (or one of "
                             f"'norm', 'variance', 'snr') to ShardedOptimizer")
        capacities = capacities if capacities is not None else self.capacities
        N, S = self.world, len(self.shards)
        scores = torch.zeros(S, dtype=torch.float64, device=self.device)   # (S,)
        for i, v in self.scores.items():
            scores[i] = v                                                  # owners fill theirs
        dist.all_reduce(scores, group=self.group)                          # exact: x + 0 + ...
        self.global_scores = scores.tolist()
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
            per = 2 + 2 * bool(self.score_fn) + (self.bcompressor is not None)  # tensors per shard
            n_float = per * sum(self.shards[i].numel for i in idx)
            migrated += sum(migration_bytes(self.shards[i].numel, per, self.dtype.itemsize)
                            for i in idx)
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
                    # the old owner's score: a re-shard before the next step must not read a 0
                    self.scores[i] = self.global_scores[i]
        self.owner = new_owner
        if self.overlapped is not None:
            self.overlapped.set_owner(new_owner)            # buckets follow the new owners
        self.reshard_count += 1
        comm += migrated + self._measure_memory()
        return {"comm/bytes": comm, "shard/migrated_bytes": migrated,
                "shard/moved": sum(len(v) for v in moves.values())}

    @torch.no_grad()
    def full_state_dict(self) -> dict:
        """Every shard's AdamW state gathered on every rank (a collective), in
        ``torch.optim.AdamW.state_dict()`` form: {"state": {param index: {"step", "exp_avg",
        "exp_avg_sq"[, "master"]}}, "param_groups": [...]}."""
        mine = {i: (st.step, st.exp_avg.cpu(), st.exp_avg_sq.cpu(),
                    None if st.master is None else st.master.cpu())
                for i, st in self.state.items()}
        out = [None] * self.world
        dist.all_gather_object(out, mine, group=self.group)
        state = {}
        for held in out:
            for i, (step, m, v, master) in held.items():
                s = self.shards[i]
                p = self.params[s.param]
                st = state.setdefault(s.param, {
                    "step": torch.tensor(float(step)),
                    "exp_avg": torch.zeros(p.numel(), dtype=p.dtype),
                    "exp_avg_sq": torch.zeros(p.numel(), dtype=p.dtype),
                    **({} if master is None else {"master": torch.zeros(p.numel(), dtype=p.dtype)})})
                st["exp_avg"][s.start:s.start + s.numel] = m
                st["exp_avg_sq"][s.start:s.start + s.numel] = v
                if master is not None:
                    st["master"][s.start:s.start + s.numel] = master
        for pid, st in state.items():
            for k in ("exp_avg", "exp_avg_sq", "master"):
                if k in st:
                    st[k] = st[k].view_as(self.params[pid])
        group = {"lr": self.lr, "betas": self.betas, "eps": self.eps,
                 "weight_decay": self.weight_decay, "params": list(range(len(self.params)))}
        return {"state": state, "param_groups": [group]}

    @torch.no_grad()
    def load_full_state_dict(self, sd: dict) -> None:
        """Take this rank's shards from a whole state (``full_state_dict`` or torch AdamW's)."""
        steps = {int(st["step"]) for st in sd["state"].values()}
        self.steps = max(steps, default=0)                  # the re-shard schedule counts these
        for i in self._owned(self.rank):
            s = self.shards[i]
            st = sd["state"].get(s.param) if isinstance(sd["state"], dict) else None
            if st is None:
                continue                                   # no step taken yet: zeros, as new
            own = self.state[i]
            own.step = int(st["step"])
            own.exp_avg.copy_(st["exp_avg"].reshape(-1)[s.start:s.start + s.numel])
            own.exp_avg_sq.copy_(st["exp_avg_sq"].reshape(-1)[s.start:s.start + s.numel])
            if own.master is not None and "master" in st:
                own.master.copy_(st["master"].reshape(-1)[s.start:s.start + s.numel])
