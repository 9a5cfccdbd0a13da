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
"""

import torch
import torch.distributed as dist

from grpo_lab.distributed.compression import Compressor, decode_message


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
    decoded = [decode_message(m, compressor.cfg.fast) for m in messages]  # W x {name: tensor}
    out = {}
    for name, g in named_grads.items():
        total = sum((d[name] for d in decoded[1:]), decoded[0][name])        # rank order
        out[name] = (total / len(decoded) if average else total).to(g.device, g.dtype)
    return out
