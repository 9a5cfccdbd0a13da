"""How the ranks of data-parallel training agree on the average gradient: ``EXCHANGES``.

Every rank holds the whole policy, computes the loss on its 1/N of the step's batch, and the
ranks then agree on the *average* gradient before the optimizer steps. How they agree is the
``exchange``, a sibling in ``EXCHANGES``:

  * ``allreduce``:        one fp32 ``all_reduce`` of all gradients (flat), / N. The reference.
  * ``compressed``:       ``comm.compressed_all_reduce`` with a ``compression.PRESETS`` preset
                          (``seed`` | ``fp16`` | ``aggressive`` | ``dgc`` | ``fp32``);
                          ``error_feedback=False`` drops the residual (and DGC momentum, which
                          needs it); ``momentum`` overrides the preset's DGC momentum
                          correction. Note: DGC's momentum correction assumes the receiver runs
                          plain SGD; here every exchange feeds AdamW, with the preset's
                          ``adam_beta1`` (0 for ``aggressive``: its error-feedback residual
                          already averages like momentum).
  * ``ddp_fp16_hook``:    torch DDP with torch's ``default_hooks.fp16_compress_hook``.
  * ``ddp_powersgd_hook``: torch DDP with torch's ``powerSGD_hook`` (rank ``powersgd_rank``).
  * ``sharded``:          ``sharder.ShardedOptimizer``: reduce to owners, owner AdamW, broadcast.
  * ``sharded_compressed``: the same, each rank's gradients encoded with ``preset`` (and
                          ``error_feedback``, ``momentum``, ``beta1`` as for ``compressed``), one
                          message per owner; the parameter broadcast fp32, or compressed with
                          ``broadcast_preset`` (EF21-P, see sharder.py).

Byte accounting. ``comm/bytes`` is what this rank sends per step, counted from the tensors it
hands to each collective under the bandwidth-optimal algorithm of that collective:

    all_reduce of b bytes (ring: reduce-scatter + all-gather)    2 (N-1)/N * b   (= b at N=2)
    all_gather of W messages of b bytes (comm.py's count)        (N-1) * (8 + b)
    reduce + broadcast of b bytes (sharder, all ranks together)  2 (N-1) * b, i.e. /N per rank

How each exchange gets b: ``allreduce`` 4 B x numel (float32); ``compressed`` the length of the
encoded message (``comm/sent_bytes`` of comm.py, padding to the longest message included);
``ddp_fp16_hook`` 2 B x the bucket's numel (the hook all-reduces the bucket as float16);
``ddp_powersgd_hook`` 4 B x (uncompressed elements + P + Q), read from torch's own
``PowerSGDState.total_numel_after_compression`` (or the whole bucket in the first
``start_powerSGD_iter`` steps, when torch runs a vanilla all_reduce); ``sharded`` the sharder's
own ``comm/bytes`` / N (re-shards included). ``comm/payload_bytes`` is b itself, and
``comm/wchar_bytes`` a measurement: the growth of ``wchar`` in /proc/self/io over the exchange
and optimizer step (the bytes gloo handed the kernel's sockets; Linux only, else None).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from grpo_lab.distributed import comm
from grpo_lab.distributed.compression import PRESETS, CompressionConfig, Compressor
from grpo_lab.distributed.sharder import ShardedOptimizer


def ring_allreduce_bytes(b: int, world: int) -> int:
    """Bytes one rank sends in a ring all_reduce of b bytes: 2 (N-1)/N * b (rounded down)."""
    return 2 * (world - 1) * b // world


@dataclass
class Exchange:
    module: torch.nn.Module
    """What forward and backward run through: the policy, or DDP wrapping it."""
    reduce: Callable[[], int]
    """After backward: make every .grad the rank-average -> payload bytes this rank sent."""
    step: Callable[[], dict]
    """Optimizer step -> metrics (the sharder's comm and shard/* metrics; {} for AdamW)."""
    zero_grad: Callable[[], None]
    set_lr: Callable[[float], None]
    wire: Callable[[int], int]
    """payload bytes -> bytes sent under this exchange's collective (see module docstring)."""


def _adamw(model, cfg, beta1: float = 0.9):
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, eps=cfg.eps, betas=(beta1, 0.999),
                            weight_decay=cfg.weight_decay)

    def set_lr(lr):
        for g in opt.param_groups:
            g["lr"] = lr
    return opt, set_lr


def make_allreduce(model, cfg, world, rank) -> Exchange:
    params = list(model.parameters())
    opt, set_lr = _adamw(model, cfg)

    def reduce():
        flat = torch.cat([p.grad.reshape(-1) for p in params])             # (numel,) fp32
        if world > 1:
            dist.all_reduce(flat)
        flat /= world
        off = 0
        for p in params:
            p.grad.copy_(flat[off:off + p.numel()].view_as(p))
            off += p.numel()
        return 0 if world == 1 else flat.nbytes

    return Exchange(model, reduce, lambda: opt.step() or {}, lambda: opt.zero_grad(True),
                    set_lr, lambda b: ring_allreduce_bytes(b, world))


def compression_config(cfg) -> CompressionConfig:
    """The preset of ``cfg`` with its momentum, density_warmup, beta1 and error_feedback
    overrides."""
    ccfg = PRESETS[cfg.preset]
    if cfg.momentum is not None:
        ccfg = dataclasses.replace(ccfg, momentum=cfg.momentum)
    if cfg.density_warmup is not None:
        ccfg = dataclasses.replace(ccfg, warmup_steps=cfg.density_warmup)
    if cfg.beta1 is not None:
        ccfg = dataclasses.replace(ccfg, adam_beta1=cfg.beta1)
    if not cfg.error_feedback:
        ccfg = dataclasses.replace(ccfg, error_feedback=False, momentum=0.0)
    return ccfg


def make_compressed(model, cfg, world, rank) -> Exchange:
    ccfg = compression_config(cfg)
    compressor = Compressor(ccfg, seed=1000 * cfg.seed + rank)
    named = [(n, p) for n, p in model.named_parameters()]
    opt, set_lr = _adamw(model, cfg, ccfg.adam_beta1)
    stats = comm.new_stats()
    sent = {"bytes": 0}

    def reduce():
        sent0, own0 = stats["comm/sent_bytes"], stats["comm/payload_bytes"]
        avg = comm.compressed_all_reduce({n: p.grad for n, p in named}, compressor, stats=stats)
        for n, p in named:
            p.grad.copy_(avg[n])
        sent["bytes"] = stats["comm/sent_bytes"] - sent0                   # (N-1)(8 + max_len)
        return stats["comm/payload_bytes"] - own0                          # this rank's message

    return Exchange(model, reduce, lambda: opt.step() or {}, lambda: opt.zero_grad(True),
                    set_lr, lambda b: sent["bytes"])


@dataclass
class HookCounter:
    """State for a counting DDP hook: torch's own hook state plus the payload bytes so far."""
    inner: object
    payload_bytes: int = 0


def fp16_counted_hook(state: HookCounter, bucket):
    """torch's fp16_compress_hook; the bucket travels as float16: 2 B per element."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
    state.payload_bytes += 2 * bucket.buffer().numel()
    return fp16_compress_hook(state.inner, bucket)


def powersgd_counted_hook(state: HookCounter, bucket):
    """torch's powerSGD_hook; elements all-reduced read from its PowerSGDState."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook
    ps = state.inner
    if ps.iter < ps.start_powerSGD_iter:                                   # vanilla all_reduce
        n = bucket.buffer().numel()
        fut = powerSGD_hook(ps, bucket)
    else:                                                                  # uncompressed + P + Q
        before = ps.total_numel_after_compression
        fut = powerSGD_hook(ps, bucket)
        n = ps.total_numel_after_compression - before
    state.payload_bytes += n * bucket.buffer().element_size()
    return fut


def _make_ddp(hook, make_state):
    def make(model, cfg, world, rank) -> Exchange:
        ddp = torch.nn.parallel.DistributedDataParallel(model)  # the GPT has no buffers
        counter = HookCounter(make_state(cfg))
        ddp.register_comm_hook(counter, hook)
        opt, set_lr = _adamw(model, cfg)
        seen = {"bytes": 0}

        def reduce():                                 # DDP already averaged during backward
            b, seen["bytes"] = counter.payload_bytes - seen["bytes"], counter.payload_bytes
            return b

        return Exchange(ddp, reduce, lambda: opt.step() or {}, lambda: opt.zero_grad(True),
                        set_lr, lambda b: ring_allreduce_bytes(b, world))
    return make


def _powersgd_state(cfg):
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState
    return PowerSGDState(process_group=None, matrix_approximation_rank=cfg.powersgd_rank,
                         start_powerSGD_iter=cfg.powersgd_start, random_seed=cfg.seed)


def make_sharded(model, cfg, world, rank, compression=None) -> Exchange:
    beta1 = 0.9 if compression is None else compression.adam_beta1
    opt = ShardedOptimizer(model.named_parameters(), lr=cfg.lr, betas=(beta1, 0.999), eps=cfg.eps,
                           weight_decay=cfg.weight_decay, policy=cfg.policy,
                           importance=cfg.importance, reshard_every=cfg.reshard_every,
                           max_shard_numel=cfg.max_shard_numel or None, compression=compression,
                           broadcast_compression=cfg.broadcast_preset,
                           compression_seed=1000 * cfg.seed + rank)
    last = {"bytes": 0}

    def step():
        m = opt.step()                                # reduce, owner AdamW, broadcast, re-shard
        last["bytes"] = m["comm/bytes"] // world      # the sharder counts all ranks together
        return {"comm/reduce_bytes": m["comm/reduce_bytes"] // world,
                **{k: v for k, v in m.items() if k.startswith("shard/")}}

    def set_lr(lr):
        opt.lr = lr
    return Exchange(model, lambda: 0, step, lambda: opt.zero_grad(True), set_lr,
                    lambda b: last["bytes"])


def make_sharded_compressed(model, cfg, world, rank) -> Exchange:
    return make_sharded(model, cfg, world, rank, compression_config(cfg))


EXCHANGES = {
    "allreduce": make_allreduce,
    "compressed": make_compressed,
    "ddp_fp16_hook": _make_ddp(fp16_counted_hook, lambda cfg: None),
    "ddp_powersgd_hook": _make_ddp(powersgd_counted_hook, _powersgd_state),
    "sharded": make_sharded,
    "sharded_compressed": make_sharded_compressed,
}
