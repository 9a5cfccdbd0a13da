"""Compressed gradients between ranks, over torch.distributed (gloo on CPU, NCCL on GPUs).

Every rank's message has its own length, so one exchange is two collectives:

  1. all_gather the lengths: one int64 per rank;
  2. pad each message to the longest, all_gather the uint8 tensors, cut each back.

Then every rank decodes all W messages and averages them in rank order, so every rank holds
the same result, as with all_reduce; only compressed bytes crossed the wire. gloo rejects
float8 tensors, so everything travels as uint8.

Bytes on the wire (ring all_gather: each rank sends W - 1 chunks of the padded size):
    sent per rank = (W - 1) * (8 + max_len)       against (W - 1) / W * 2 * 4n for a ring
    all_reduce of n fp32 elements. An all_gather of compressed messages grows with W, an
    all_reduce does not: compression pays while ratio > W / 2 (PowerSGD, Vogels et al. 2019,
    discusses this; Top-K messages cannot be summed in flight, Agarwal et al. 2022).
``stats`` counts ``comm/payload_bytes`` (own messages), ``comm/sent_bytes`` (the formula
above, padding included) and ``comm/padding_bytes``.

``compressed_allreduce_hook`` plugs the same exchange into DDP
(``model.register_comm_hook(state, compressed_allreduce_hook)``): each parameter of a bucket is
one named tensor for the ``Compressor`` (so importance, residuals and momentum are per
parameter), and the hook returns the *average* over ranks shaped like ``bucket.buffer()``, as
torch's ``allreduce_hook`` does. Deviation: the exchange runs synchronously inside the hook
(two blocking collectives) rather than as a chained future; correct, not overlapped.
"""
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from grpo_lab.distributed.compression import Compressor


def new_stats() -> dict:
    return {"comm/payload_bytes": 0, "comm/sent_bytes": 0, "comm/padding_bytes": 0,
            "comm/exchanges": 0}


def comm_device(group=None) -> torch.device:
    """Where the group's collectives take their tensors: the current CUDA device with NCCL
    (which cannot send CPU tensors), the CPU otherwise."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_bytes(payload: bytes, group=None, stats: dict | None = None) -> list[bytes]:
    """Every rank's ``payload``, in rank order, on every rank."""
    world, dev = dist.get_world_size(group), comm_device(group)
    length = torch.tensor([len(payload)], dtype=torch.int64, device=dev)
    lengths = [torch.zeros_like(length) for _ in range(world)]
    dist.all_gather(lengths, length, group=group)                          # W x (1,)
    lengths = [int(x) for x in lengths]
    longest = max(lengths)
    buf = torch.zeros(longest, dtype=torch.uint8)                          # (max_len,)
    if payload:
        buf[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    buf = buf.to(dev)
    bufs = [torch.empty(longest, dtype=torch.uint8, device=dev) for _ in range(world)]
    dist.all_gather(bufs, buf, group=group)                                # W x (max_len,)
    if stats is not None:
        stats["comm/payload_bytes"] += len(payload)
        stats["comm/sent_bytes"] += (world - 1) * (8 + longest)
        stats["comm/padding_bytes"] += (world - 1) * (longest - len(payload))
        stats["comm/exchanges"] += 1
    return [bytes(b[:n].cpu().numpy()) for b, n in zip(bufs, lengths)]


def compressed_all_reduce(named_grads: dict[str, torch.Tensor], compressor: Compressor,
                          importance: dict | None = None, group=None, average: bool = True,
                          stats: dict | None = None) -> dict[str, torch.Tensor]:
    """Encode here, exchange, decode every rank's message, sum (or average) in rank order.
    The codecs run on the CPU: gradients on a GPU are copied to the host and back."""
    host = {name: g.detach().cpu() for name, g in named_grads.items()}
    messages = all_gather_bytes(compressor.encode(host, importance), group, stats)
    decoded = [compressor.decode(m) for m in messages]                     # W x {name: tensor}
    out = {}
    for name, g in named_grads.items():
        total = decoded[0][name].clone()
        for d in decoded[1:]:
            total += d[name]
        out[name] = (total / len(decoded) if average else total).to(g.device, g.dtype)
    return out


@dataclass
class CompressedHookState:
    """What the DDP hook needs: the compressor (its residuals persist across steps), the group,
    readable names per parameter (``for_model``), optional importance by name, and stats."""
    compressor: Compressor
    process_group: object = None
    names: dict = field(default_factory=dict)       # id(parameter) -> name
    importance: dict | None = None
    stats: dict = field(default_factory=new_stats)

    @classmethod
    def for_model(cls, model: torch.nn.Module, compressor: Compressor, process_group=None):
        return cls(compressor, process_group, {id(p): n for n, p in model.named_parameters()})


def bucket_named_grads(state: CompressedHookState, bucket) -> dict[str, torch.Tensor]:
    """{parameter name: gradient view} for one DDP bucket, in the bucket's order."""
    return {state.names.get(id(p), f"bucket{bucket.index()}.{i}"): g
            for i, (p, g) in enumerate(zip(bucket.parameters(), bucket.gradients()))}


def compressed_allreduce_hook(state: CompressedHookState,
                              bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: -> Future holding the rank-average of this bucket, like ``bucket.buffer()``.

    (No ``from __future__ import annotations`` in this module: DDP compares these annotations
    with the real types.)"""
    buffer = bucket.buffer()                                               # (numel,) flat
    named = bucket_named_grads(state, bucket)
    avg = compressed_all_reduce(named, state.compressor, state.importance,
                                state.process_group, stats=state.stats)
    out = torch.cat([avg[n].reshape(-1) for n in named]).to(buffer.dtype)  # (numel,)
    if out.shape != buffer.shape:
        raise RuntimeError(f"bucket {bucket.index()} holds {buffer.numel()} elements, its "
                           f"gradients {out.numel()}")
    fut = torch.futures.Future()
    fut.set_result(out)
    return fut
