"""The exchanges' records and their settings: what a config names, without the machinery.

``EXCHANGES`` holds one ``ExchangeKind`` per way the ranks average gradients: its capabilities
and the settings blocks it reads. ``ExchangeConfig`` (``TrainConfig.exchange``) holds what
every kind reads; each kind's own fields are settings blocks (registry.SETTINGS, as a step
variant's ``tis``), top-level so they take the one path every block takes (flags, config
files, study arms): ``compression`` (compressed, sharded_compressed: ``--compression.preset
dgc``), ``sharding`` (sharded, sharded_compressed), ``powersgd`` (ddp_powersgd_hook), ``fsdp2``.
A block set while the exchange does not read it is an error (``exchanges.check_exchange``).
Building a config loads this module only: exchanges.py (torch.distributed, the compressors,
the sharder) registers the built-in kinds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from grpo_lab.registry import SETTINGS, check_new, check_number, lookup, register_settings


@dataclass(frozen=True)
class ExchangeKind:
    """An exchange ``ExchangeConfig.name`` can name, with its capabilities as fields (config
    checks read these, never the name)."""
    name: str
    make: Callable                # (model, ExchangeConfig, AdamW, world, rank, **blocks)
    settings: tuple = ()          # the settings blocks it reads, each passed to make by name
    resumes_exactly: bool = True  # a checkpoint holds all its state (no per-rank residuals)
    overlaps: bool = False        # exchange.overlap=True: start reducing during backward
    reduces_in_backward: bool = False   # it reduces inside backward (DDP): no micro-batches
    shards_parameters: bool = False     # weights sharded (FSDP2): no whole weights to sample from
    torch_adamw: bool = True      # steps torch's AdamW (Exchange.optimizer): ckpt_format "dcp"
    description: str = ""


def register_exchange(name: str, make: Callable, settings: tuple = (),
                      **capabilities) -> ExchangeKind:
    """Add an exchange (``ExchangeConfig(name=...)``, ``--exchange.name``) -> its record.
    ``make(model, cfg, opt, world, rank, **settings) -> Exchange`` gets each settings block it
    reads (``settings``: names of registered blocks, registry.register_settings) by its name;
    the registry's naming rule (registry.check_new) applies."""
    check_new(EXCHANGES, "exchange", name, make, lambda k: k.make)
    for block in settings:
        lookup(SETTINGS, block, "settings block", f"exchange {name!r} reads it: register it")
    EXCHANGES[name] = ExchangeKind(name, make, tuple(settings), **capabilities)
    return EXCHANGES[name]


EXCHANGES: dict[str, ExchangeKind] = {}
"""name -> record; exchanges.py registers the built-in kinds."""


@dataclass
class ExchangeConfig:
    name: str = "allreduce"
    """How ranks average gradients: allreduce | compressed | ddp_fp16_hook | ddp_powersgd_hook |
    sharded | sharded_compressed | fsdp2 (weights, gradients and AdamW state sharded too, by
    torch's fully_shard) (on one process without a process group only allreduce, which
    there is plain AdamW)."""
    overlap: bool = False
    """allreduce | sharded: start the reduction during backward, in buckets from grad hooks
    (distributed/overlap.py, as DDP's buckets), instead of after it; same gradients and bytes.
    The DDP exchanges overlap anyway; the compressed ones cannot (an error)."""
    timeout_s: float = 120.0
    """Seconds a collective may wait for a peer before every rank stops with an error (a dead
    or stuck rank never hangs the run)."""

    def __post_init__(self):       # its own fields; exchanges.check_exchange checks the rest
        if not self.timeout_s > 0:
            raise ValueError(f"exchange.timeout_s must be > 0, got {self.timeout_s}")

    @property
    def kind(self) -> "ExchangeKind":
        """The registry record of ``name`` (its capabilities)."""
        return EXCHANGES[self.name]


@dataclass
class Compression:
    """compressed | sharded_compressed: how each rank's gradients are encoded."""
    preset: str = "fp8_topk5"
    """A compression.PRESETS key (fp8_topk5: top 20% of elements in fp8, top-k 5% of the rest
    with coded indices; fp32 | fp16 | aggressive | dgc)."""
    error_feedback: bool = True
    """Keep what top-k did not send (False also turns DGC momentum off)."""
    momentum: float | None = None
    """Override the preset's DGC momentum correction (None: the preset's)."""
    beta1: float | None = None
    """Override the receiver's AdamW beta1 (None: the preset's adam_beta1)."""
    density_warmup: int | None = None
    """Override the preset's DGC density warm-up steps (None: the preset's)."""

    def check(self, cfg):
        from grpo_lab.distributed.compression import PRESETS
        lookup(PRESETS, self.preset, "compression.preset")
        for f in ("momentum", "beta1"):              # before the ranks start, by its name
            if getattr(self, f) is not None:
                check_number(f"compression.{f}", getattr(self, f), lambda x: 0 <= x < 1,
                             "in [0, 1) (None: the preset's)")
        if self.density_warmup is not None:
            check_number("compression.density_warmup", self.density_warmup)


@dataclass
class Sharding:
    """sharded | sharded_compressed: how the sharder (sharder.py) assigns shards to owners."""
    policy: str = "size_balanced"
    """Shard assignment rule, a key of shard_plan.POLICIES."""
    importance: str | None = None
    """Importance score tracked by the owners (None: none)."""
    reshard_every: int = 0
    """Re-shard every this many steps (0: never)."""
    max_shard_numel: int = 0
    """Cut tensors into blocks of at most this many elements (0: about 8 blocks per rank)."""
    broadcast_preset: str | None = None
    """sharded_compressed: also compress the owners' parameter broadcast with this preset,
    EF21-P style (owners keep exact master weights; None: broadcast fp32)."""

    def check(self, cfg):
        from grpo_lab.distributed.compression import PRESETS
        from grpo_lab.distributed.importance import IMPORTANCE
        from grpo_lab.distributed.shard_plan import POLICIES
        for f in ("max_shard_numel", "reshard_every"):
            check_number(f"sharding.{f}", getattr(self, f))
        policy = lookup(POLICIES, self.policy, "sharding.policy")
        if self.importance is not None:       # else every rank's sharder raises once started
            lookup(IMPORTANCE, self.importance, "sharding.importance")
        elif self.reshard_every and policy.uses_importance:
            raise ValueError(f"sharding.policy={self.policy!r} re-shards by importance every "
                             f"{self.reshard_every} steps, but sharding.importance=None: set it "
                             f"to one of {sorted(IMPORTANCE)}")
        if self.broadcast_preset is not None:
            lookup(PRESETS, self.broadcast_preset, "sharding.broadcast_preset")
            if "compression" not in cfg.exchange.kind.settings:       # it compresses the reduce
                raise ValueError(f"sharding.broadcast_preset={self.broadcast_preset!r} compresses "
                                 f"the broadcast of a sharded exchange that compresses "
                                 f"(sharded_compressed), not {cfg.exchange.name!r}'s")


@dataclass
class PowerSGD:
    """ddp_powersgd_hook: torch's PowerSGDState."""
    rank: int = 2
    """matrix_approximation_rank."""
    start: int = 2
    """Steps of vanilla all_reduce first (torch's minimum is 2)."""

    def check(self, cfg):
        check_number("powersgd.rank", self.rank, lambda x: x >= 1, ">= 1 (rank 0 sends nothing)")
        check_number("powersgd.start", self.start, lambda x: x >= 2, ">= 2 (torch's minimum)")


@dataclass
class FSDP2:
    """fsdp2: how torch's fully_shard gathers the weights."""
    reshard_after_forward: bool = True
    """Free each block's gathered weights after its training forward and gather them again in
    backward (ZeRO-3: least memory); False keeps them from forward to backward (one all-gather
    fewer per block, the block's whole weights held meanwhile)."""
    param_dtype: str = ""
    """The dtype weights are gathered and the forward runs in (FSDP2's MixedPrecisionPolicy;
    "bfloat16" on GPUs), gradients reduced in float32 ("": the weights' own dtype; on a CPU
    without bf16 units bf16 matmuls are several times slower)."""

    def check(self, cfg):
        from grpo_lab.distributed.fsdp import DTYPES
        lookup(DTYPES, self.param_dtype, "fsdp2.param_dtype")


for _block in (Compression, Sharding, PowerSGD, FSDP2):
    register_settings(_block.__name__.lower(), _block)
