"""How the ranks of data-parallel training agree on the average gradient: ``EXCHANGES``.

Every rank holds the whole policy, computes the loss on its 1/N of the step's batch, and the
ranks then agree on the *average* gradient before the optimizer steps. How they agree is the
``exchange``, a sibling in ``EXCHANGES``:

  * ``allreduce``:        one fp32 ``all_reduce`` of all gradients (flat), / N. The reference.
  * ``compressed``:       ``comm.compressed_all_reduce`` with a ``compression.PRESETS`` preset
                          (``compression.preset``: ``fp8_topk5`` | ``fp16`` | ``aggressive`` |
                          ``dgc`` | ``fp32``); ``compression.error_feedback=False`` drops the
                          residual (and DGC momentum, which needs it); ``compression.momentum``
                          overrides the preset's DGC momentum correction. Note: DGC's momentum
                          correction assumes the receiver runs plain SGD; here every exchange
                          feeds AdamW, with the preset's
                          ``adam_beta1`` (0 for ``aggressive``: its error-feedback residual
                          already averages like momentum).
  * ``ddp_fp16_hook``:    torch DDP with torch's ``default_hooks.fp16_compress_hook``.
  * ``ddp_powersgd_hook``: torch DDP with torch's ``powerSGD_hook`` (``powersgd.rank``).
  * ``sharded``:          ``sharder.ShardedOptimizer``: reduce to owners, owner AdamW, broadcast
                          (the ``sharding`` block: policy, importance, re-sharding).
  * ``sharded_compressed``: the same, each rank's gradients encoded as ``compressed``'s are
                          (the ``compression`` block), one message per owner; the parameter
                          broadcast fp32, or compressed with ``sharding.broadcast_preset``
                          (EF21-P, see sharder.py).
  * ``fsdp2``:            torch's FSDP2 (``fully_shard``, fsdp.py): weights, gradients and AdamW
                          state 1/N per rank; gradients averaged by reduce-scatter in backward;
                          the ``fsdp2`` block: reshard_after_forward, param_dtype.
Each kind's ``make`` gets the settings blocks its record names (exchange_config.py) by name.

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
own ``comm/bytes`` / N (re-shards included); ``fsdp2`` 4 B x numel of what trains (float32
gradients, reduce-scattered: (N-1)/N b), plus (N-1)/N of the bytes of every all-gather of
weights FSDP2 ran since the last update (fsdp.CountedAllGather: the gathered rollout's, the
training forwards' and the backward's, at the gathered dtype, FSDP2's padding included). ``comm/payload_bytes`` is b itself, and
``comm/wchar_bytes`` a measurement: the growth of ``wchar`` in /proc/self/io over the exchange
and optimizer step (the bytes gloo handed the kernel's sockets; Linux only, else None).
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch.autograd.graph import increment_version

from grpo_lab.distributed import comm, fsdp
from grpo_lab.distributed.compression import PRESETS, CompressionConfig, Compressor
from grpo_lab.distributed.overlap import OverlappedAllReduce
from grpo_lab.distributed.sharder import ShardedOptimizer
from grpo_lab.distributed.exchange_config import (EXCHANGES, FSDP2, Compression, ExchangeConfig,
                                                 PowerSGD, Sharding, register_exchange)
from grpo_lab.registry import SETTINGS, lookup


def ring_allreduce_bytes(b: int, world: int) -> int:
    """Bytes one rank sends in a ring all_reduce of b bytes: 2 (N-1)/N * b (rounded down)."""
    return 2 * (world - 1) * b // world


@dataclass
class AdamW:
    """The optimizer every exchange steps (torch.optim.AdamW's hyper-parameters)."""
    lr: float = 1e-4
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip: float = 0.0
    """Clip the rank-averaged gradient's global norm to this (0: off)."""
    seed: int = 0
    """Seeds the compressors' sampled top-k (each rank its own: 1000 * seed + rank)."""
    lr_scales: dict = field(default_factory=dict)
    """Parameter-name prefix -> multiplier of the scheduled lr: those parameters get their own
    AdamW parameter group (PPO's critic: {"value_head.": vf_lr / lr}); {}: one group. Only
    the exchanges that step a torch AdamW (all but the sharded ones)."""
    fused: bool = False
    """torch's fused AdamW (``fused=True``: one kernel per tensor, no Python loop over the
    AdamW arithmetic) instead of its per-tensor loop: the same update up to float rounding
    (tests/test_fused_adamw.py), 0.17 vs 0.48-0.88 CPU s over SmolLM2's 134.5 M weights
    (BENCHMARKS.md section 15). The trainer sets it from the policy's record
    (``policy.PolicyKind.fused_adamw``: on for HF models; off for the toy, whose exact
    equivalence tests compare against the sharder's own per-tensor Adam). Only the exchanges
    that step a torch AdamW; a resumed run keeps the setting its checkpoint was saved with
    (torch restores it with the parameter groups), so resume stays exact. torch's fused
    kernel does not bump the weights' version counters (the per-tensor loop does), so the
    step bumps them itself: the bf16 sampling copy and the lean decoder's stacked weights
    (hf.py, decoder.py) are refreshed by them."""


@dataclass
class Exchange:
    module: torch.nn.Module
    """What forward and backward run through: the policy, or DDP wrapping it."""
    reduce: Callable[[], int]
    """After backward: make every .grad the rank-average -> payload bytes this rank sent."""
    step: Callable[[], dict]
    """Clip, optimizer step -> metrics (grad/norm; the sharder's comm and shard/* metrics)."""
    zero_grad: Callable[[], None]
    set_lr: Callable[[float], None]
    wire: Callable[[int], int]
    """payload bytes -> bytes sent under this exchange's collective (see module docstring)."""
    state_dict: Callable[[], dict]
    """The optimizer state in torch.optim.AdamW's format, whole on every rank (a collective
    for the sharded exchanges: every rank calls it)."""
    load_state_dict: Callable[[dict], None]
    bad_state: Callable[[], str | None]
    """The name of the first parameter or optimizer state tensor this rank holds that is not
    finite, or None (checked after every step, so nothing non-finite is ever saved)."""
    gathered: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    """A context every rank enters together around forwards that ranks run different numbers
    of times (sampling, the reference, evaluation on rank 0): the weights whole inside, no
    collective in a forward (fsdp2: one all-gather at the start; the others: nothing)."""
    model_state: Callable[[], dict] | None = None
    """The policy's weights whole, each tied tensor once (a collective for fsdp2: every rank
    calls it); None: checkpoint.state_without_aliases(module)."""
    optimizer: torch.optim.Optimizer | None = None
    """The torch optimizer that steps the policy (None: the exchange steps its own Adam, the
    sharder's): what a sharded checkpoint (distributed/dcp.py) saves and loads."""


def first_non_finite(named) -> str | None:
    """The name of the first tensor in ``named`` ((name, tensor) pairs) with a NaN or inf.

    One sum per tensor (NaN or inf when any element is), all checked at once: one host sync
    per device. Only a non-finite sum makes it look element by element (None if only that sum
    overflowed; the element-wise check alone costs twice the memory traffic: tenths of a CPU
    second a step over SmolLM2's weights and AdamW moments, BENCHMARKS.md section 15; a fused
    ``torch._foreach_norm(inf)`` was no faster on the toy, section 13)."""
    named = [(n, t) for n, t in named if torch.is_tensor(t) and t.is_floating_point()]
    by_device: dict = {}
    for _, t in named:                 # float64 sums stay float64, the rest sum in float32
        acc = torch.float64 if t.dtype == torch.float64 else torch.float32
        by_device.setdefault(t.device, []).append(t.sum(dtype=acc).to(torch.float64))
    if all(bool(torch.isfinite(torch.stack(s)).all()) for s in by_device.values()):
        return None
    return next((name for name, t in named if not bool(torch.isfinite(t).all())), None)


def trainable(model) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) of every parameter that trains, in model order: what every exchange
    averages and steps (with LoRA the frozen base weights have no gradient at all)."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def param_groups(model, lr_scales: dict) -> tuple[list[list], list[float]]:
    """-> (parameter groups, lr multiplier of each): first the parameters no prefix of
    ``lr_scales`` names (multiplier 1), then one group per prefix, in model order."""
    named = trainable(model)
    prefix = [next((k for k in lr_scales if n.startswith(k)), None) for n, _ in named]
    groups = [[p for (_, p), k in zip(named, prefix) if k is None]]
    for k in lr_scales:
        groups.append([p for (_, p), kk in zip(named, prefix) if kk == k])
        if not groups[-1]:
            raise ValueError(f"lr_scales prefix {k!r} names no parameter of the model")
    return groups, [1.0, *(float(s) for s in lr_scales.values())]


def _adamw(model, opt: AdamW, beta1: float = 0.9):
    groups, scales = param_groups(model, opt.lr_scales)      # the scales stay out of the
    adam = torch.optim.AdamW([{"params": g, "lr": opt.lr * s}   # saved state: a resume with
                              for g, s in zip(groups, scales)],  # another vf_lr uses its own
                             lr=opt.lr, eps=opt.eps, betas=(beta1, 0.999),
                             weight_decay=opt.weight_decay, fused=opt.fused or None)
    params = [p for _, p in trainable(model)]

    def set_lr(lr):
        for g, s in zip(adam.param_groups, scales):
            g["lr"] = lr * s

    def step():
        gnorm = torch.nn.utils.clip_grad_norm_(params, opt.grad_clip or float("inf"))
        if not torch.isfinite(gnorm):                 # stop before a NaN reaches the weights
            raise FloatingPointError(f"gradient norm is {float(gnorm)}")
        adam.step()
        if opt.fused:              # the fused kernel leaves version counters alone; what caches
            increment_version([p for p in params if p.grad is not None])  # weights reads them
        return {"grad/norm": float(gnorm)}
    return adam, set_lr, step


def _local(model, adam, set_lr, step, reduce, wire, module=None) -> Exchange:
    names = {id(p): n for n, p in model.named_parameters()}

    def bad_state():
        return first_non_finite([*model.named_parameters(),
                                 *((f"optimizer {k} of {names.get(id(p), '?')}", v)
                                   for p, st in adam.state.items() for k, v in st.items())])
    return Exchange(module or model, reduce, step, lambda: adam.zero_grad(True), set_lr, wire,
                    adam.state_dict, adam.load_state_dict, bad_state, optimizer=adam)


def make_allreduce(model, cfg: ExchangeConfig, opt: AdamW, world, rank) -> Exchange:
    params = [p for _, p in trainable(model)]
    adam, set_lr, step = _adamw(model, opt)
    overlapped = OverlappedAllReduce(model) if cfg.overlap and world > 1 else None

    if world == 1:                                    # nothing to exchange, nothing sent
        return _local(model, adam, set_lr, step, lambda: 0, lambda b: 0)

    def reduce():
        if overlapped is not None:                    # buckets started during backward
            overlapped.finish()
            return sum(p.grad.nbytes for p in params)
        flat = torch.cat([p.grad.reshape(-1) for p in params])             # (numel,) fp32
        dist.all_reduce(flat)
        flat /= world
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p))
        return flat.nbytes

    return _local(model, adam, set_lr, step, reduce, lambda b: ring_allreduce_bytes(b, world))


def check_exchange(cfg) -> None:
    """Raise unless ``cfg`` (a TrainConfig) names a registered exchange and sets no settings
    block another exchange reads and its own does not (the run would not do what the block
    says); each block checks its own values (its ``check``), config.check_records calls it."""
    kind = lookup(EXCHANGES, cfg.exchange.name, "exchange")
    for block in sorted({b for k in EXCHANGES.values() for b in k.settings} - set(kind.settings)):
        given = [f"{block}.{k}={v!r}" for k, v in vars(cfg.blocks[block]).items()
                 if v != getattr(SETTINGS[block](), k)]
        if given:
            able = " or ".join(repr(n) for n, k in EXCHANGES.items() if block in k.settings)
            raise ValueError(f"{', '.join(given)}: the {block} block is read by exchange "
                             f"{able}, not by {kind.name!r} (the run would ignore it): drop "
                             f"{'it' if len(given) == 1 else 'them'} or pick that exchange")
    if cfg.exchange.overlap and not kind.overlaps:
        able = " and ".join(repr(n) for n, k in EXCHANGES.items() if k.overlaps)
        raise ValueError(f"overlap=True starts the reduction during backward for exchanges "
                         f"{able} only, not {kind.name!r}")


def make_fsdp2(model, cfg: ExchangeConfig, opt: AdamW, world, rank,
               fsdp2: FSDP2 = FSDP2()) -> Exchange:
    """FSDP2 (fsdp.py): ``fully_shard`` per block and the root, then torch's AdamW over the
    sharded parameters; the reduce-scatter runs in backward, so ``reduce`` only counts."""
    mods = fsdp.shard(model, fsdp2.reshard_after_forward, fsdp2.param_dtype)
    adam, set_lr, step = _adamw(model, opt)
    numel = sum(p.numel() for _, p in trainable(model))                   # whole, not the shard
    counter = fsdp.count_all_gathers(mods)
    names = {id(p): n for n, p in model.named_parameters()}
    sent = {"gathered": 0}

    def gathered():
        return fsdp.gathered(mods, fsdp2.reshard_after_forward)

    def reduce():                                     # FSDP2 reduce-scattered during backward
        return 4 * numel                              # fp32 gradients of what trains

    def wire(b):                                      # reduce-scatter + the weights' all-gathers
        ag, sent["gathered"] = counter.bytes - sent["gathered"], counter.bytes
        return (world - 1) * (b + ag) // world

    def bad_state():                                  # this rank's shards (the trainer agrees)
        return first_non_finite([*((n, fsdp.local(p)) for n, p in model.named_parameters()),
                                 *((f"optimizer {k} of {names.get(id(p), '?')}", fsdp.local(v))
                                   for p, st in adam.state.items() for k, v in st.items())])

    return Exchange(model, reduce, step, lambda: adam.zero_grad(True), set_lr, wire,
                    lambda: fsdp.full_optimizer_state(adam),
                    lambda sd: fsdp.load_full_optimizer_state(adam, sd), bad_state,
                    gathered, lambda: fsdp.full_state(model), adam)


def compression_config(cfg: Compression) -> CompressionConfig:
    """The preset of ``cfg`` with its momentum, density_warmup, beta1 and error_feedback
    overrides."""
    ccfg = PRESETS[cfg.preset]
    for name, value in (("momentum", cfg.momentum), ("warmup_steps", cfg.density_warmup),
                        ("adam_beta1", cfg.beta1)):              # one at a time: its own check
        if value is not None:
            ccfg = dataclasses.replace(ccfg, **{name: value})
    if not cfg.error_feedback:
        ccfg = dataclasses.replace(ccfg, error_feedback=False, momentum=0.0)
    return ccfg


def make_compressed(model, cfg: ExchangeConfig, opt: AdamW, world, rank,
                    compression: Compression = Compression()) -> Exchange:
    ccfg = compression_config(compression)
    compressor = Compressor(ccfg, seed=1000 * opt.seed + rank)
    named = trainable(model)
    adam, set_lr, step = _adamw(model, opt, ccfg.adam_beta1)
    stats = comm.new_stats()
    sent = {"bytes": 0}

    def reduce():
        sent0, own0 = stats["comm/sent_bytes"], stats["comm/payload_bytes"]
        avg = comm.compressed_all_reduce({n: p.grad for n, p in named}, compressor, stats=stats)
        for n, p in named:
            p.grad.copy_(avg[n])
        sent["bytes"] = stats["comm/sent_bytes"] - sent0                   # (N-1)(8 + max_len)
        return stats["comm/payload_bytes"] - own0                          # this rank's message

    return _local(model, adam, set_lr, step, reduce, lambda b: sent["bytes"])


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
    vanilla, before = ps.iter < ps.start_powerSGD_iter, ps.total_numel_after_compression
    fut = powerSGD_hook(ps, bucket)
    n = (bucket.buffer().numel() if vanilla                                 # vanilla all_reduce
         else ps.total_numel_after_compression - before)                   # uncompressed + P + Q
    state.payload_bytes += n * bucket.buffer().element_size()
    return fut


def _make_ddp(hook, make_state):
    def make(model, cfg: ExchangeConfig, opt: AdamW, world, rank, **settings) -> Exchange:
        ddp = torch.nn.parallel.DistributedDataParallel(model)  # the GPT has no buffers
        counter = HookCounter(make_state(opt, **settings))
        ddp.register_comm_hook(counter, hook)
        adam, set_lr, step = _adamw(model, opt)
        seen = {"bytes": 0}

        def reduce():                                 # DDP already averaged during backward
            b, seen["bytes"] = counter.payload_bytes - seen["bytes"], counter.payload_bytes
            return b

        return _local(model, adam, set_lr, step, reduce, lambda b: ring_allreduce_bytes(b, world),
                      module=ddp)
    return make


def _powersgd_state(opt: AdamW, powersgd: PowerSGD = PowerSGD()):
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState
    return PowerSGDState(process_group=None, matrix_approximation_rank=powersgd.rank,
                         start_powerSGD_iter=powersgd.start, random_seed=opt.seed)


def make_sharded(model, cfg: ExchangeConfig, opt: AdamW, world, rank,
                 sharding: Sharding = Sharding(), compression: Compression | None = None) -> Exchange:
    """sharded; with a ``compression`` block, sharded_compressed."""
    if opt.lr_scales:
        raise ValueError(f"exchange {cfg.name!r} steps one learning rate for all parameters: "
                         f"lr_scales={opt.lr_scales} needs an exchange that steps torch's AdamW")
    ccfg = None if compression is None else compression_config(compression)
    beta1 = 0.9 if ccfg is None else ccfg.adam_beta1
    sharded = ShardedOptimizer(trainable(model), lr=opt.lr, betas=(beta1, 0.999),
                               eps=opt.eps, weight_decay=opt.weight_decay, policy=sharding.policy,
                               importance=sharding.importance,
                               reshard_every=sharding.reshard_every,
                               max_shard_numel=sharding.max_shard_numel or None,
                               compression=ccfg, broadcast_compression=sharding.broadcast_preset,
                               compression_seed=1000 * opt.seed + rank, grad_clip=opt.grad_clip,
                               overlap=cfg.overlap)
    last = {"bytes": 0}

    def step():
        m = sharded.step()                            # reduce, clip, owner AdamW, broadcast
        last["bytes"] = m["comm/bytes"] // world      # the sharder counts all ranks together
        return {"comm/reduce_bytes": m["comm/reduce_bytes"] // world, "grad/norm": m["grad/norm"],
                **{k: v for k, v in m.items() if k.startswith("shard/")}}

    def set_lr(lr):
        sharded.lr = lr
    def bad_state():
        return first_non_finite([*model.named_parameters(),
                                 *((f"optimizer {k} of shard {sharded.shards[i].name}", v)
                                   for i, st in sharded.state.items()
                                   for k, v in vars(st).items())])
    return Exchange(model, lambda: 0, step, lambda: sharded.zero_grad(True), set_lr,
                    lambda b: last["bytes"], sharded.full_state_dict, sharded.load_full_state_dict,
                    bad_state)


make_ddp_fp16 = _make_ddp(fp16_counted_hook, lambda opt: None)
make_ddp_powersgd = _make_ddp(powersgd_counted_hook, _powersgd_state)

register_exchange("allreduce", make_allreduce, overlaps=True,
                  description="one fp32 all_reduce of all gradients, / N (the reference)")
register_exchange("compressed", make_compressed, ("compression",), resumes_exactly=False,
                  description="comm.compressed_all_reduce with a compression preset")
register_exchange("ddp_fp16_hook", make_ddp_fp16, resumes_exactly=False,
                  reduces_in_backward=True, description="torch DDP, fp16_compress_hook")
register_exchange("ddp_powersgd_hook", make_ddp_powersgd, ("powersgd",), resumes_exactly=False,
                  reduces_in_backward=True, description="torch DDP, powerSGD_hook")
register_exchange("sharded", make_sharded, ("sharding",), overlaps=True, torch_adamw=False,
                  description="reduce to owners, owner AdamW, broadcast (sharder.py)")
register_exchange("sharded_compressed", make_sharded, ("compression", "sharding"),
                  resumes_exactly=False, torch_adamw=False,
                  description="sharded, each rank's gradients compressed")
register_exchange("fsdp2", make_fsdp2, ("fsdp2",), shards_parameters=True,
                  description="torch's FSDP2: weights, gradients and AdamW state sharded")


def make_exchange(model, cfg: ExchangeConfig, opt: AdamW, world: int = 1, rank: int = 0,
                  blocks: dict | None = None) -> Exchange:
    """``EXCHANGES[cfg.name]`` for this rank, given the settings blocks it reads from
    ``blocks`` (a TrainConfig's ``blocks``; None or one left out: its defaults); every name but
    allreduce needs a process group."""
    if cfg.name != "allreduce" and not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"exchange {cfg.name!r} needs a process group: run with "
                         f"`grpo-lab train --nproc N` or under torchrun")
    kind = lookup(EXCHANGES, cfg.name, "exchange")
    return kind.make(model, cfg, opt, world, rank,
                     **{b: (blocks or {}).get(b) or SETTINGS[b]() for b in kind.settings})
