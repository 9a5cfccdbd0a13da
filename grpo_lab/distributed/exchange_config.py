"""The exchanges' records and their settings: what a config names, without the machinery.

``EXCHANGES`` holds one ``ExchangeKind`` per way the ranks average gradients, its capabilities
as fields; ``ExchangeConfig`` is ``TrainConfig.exchange``. Building a config loads this module
only: exchanges.py (torch.distributed, the compressors, the sharder) registers the built-in
kinds and checks a config against them (``exchanges.check_exchange``) when a run is set up.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from grpo_lab.registry import check_new


@dataclass(frozen=True)
class ExchangeKind:
    """An exchange ``ExchangeConfig.name`` can name, with its capabilities as fields (config
    checks read these, never the name). Calling it builds the rank's ``Exchange``."""
    name: str
    make: Callable                # (model, ExchangeConfig, AdamW, world, rank) -> Exchange
    resumes_exactly: bool = True  # a checkpoint holds all its state (no per-rank residuals)
    overlaps: bool = False        # exchange.overlap=True: start reducing during backward
    reduces_in_backward: bool = False   # it reduces inside backward (DDP): no micro-batches
    compresses: bool = False      # reads exchange.preset (and error_feedback, momentum, beta1)
    shards: bool = False          # an owner per shard: exchange.policy, importance, reshard_every
    broadcast_compression: bool = False  # exchange.broadcast_preset applies
    shards_parameters: bool = False   # weights sharded (FSDP2): reads exchange.reshard_after_forward
                                      # and param_dtype, and none of the fields above
    torch_adamw: bool = True      # steps torch's AdamW (Exchange.optimizer): ckpt_format "dcp"
    description: str = ""

    def __call__(self, model, cfg, opt, world: int = 1, rank: int = 0):
        return self.make(model, cfg, opt, world, rank)


def register_exchange(name: str, make: Callable, **capabilities) -> ExchangeKind:
    """Add an exchange (``ExchangeConfig(name=...)``, ``--exchange.name``) -> its record.
    ``make(model, cfg, opt, world, rank) -> Exchange``; the registry's naming rule
    (registry.check_new) applies."""
    check_new(EXCHANGES, "exchange", name, make, lambda k: k.make)
    EXCHANGES[name] = ExchangeKind(name, make, **capabilities)
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
    preset: str = "fp8_topk5"
    """compressed | sharded_compressed: a compression.PRESETS key (fp8_topk5: top 20% of
    elements in fp8, top-k 5% of the rest with coded indices; fp32 | fp16 | aggressive | dgc)."""
    error_feedback: bool = True
    """Compressed exchanges: keep what top-k did not send (False also turns DGC momentum off)."""
    momentum: float | None = None
    """Compressed exchanges: override the preset's DGC momentum correction (None: the preset's)."""
    beta1: float | None = None
    """Compressed exchanges: override the receiver's AdamW beta1 (None: the preset's adam_beta1)."""
    density_warmup: int | None = None
    """Compressed exchanges: override the preset's DGC density warm-up steps (None: the preset's)."""
    powersgd_rank: int = 2
    """ddp_powersgd_hook: matrix_approximation_rank."""
    powersgd_start: int = 2
    """ddp_powersgd_hook: steps of vanilla all_reduce first (torch's minimum is 2)."""
    policy: str = "size_balanced"
    """Sharded exchanges: shard assignment rule, a key of shard_plan.POLICIES."""
    importance: str | None = None
    """Sharded exchanges: importance score tracked by the owners (None: none)."""
    reshard_every: int = 0
    """Sharded exchanges: re-shard every this many steps (0: never)."""
    broadcast_preset: str | None = None
    """sharded_compressed: also compress the owners' parameter broadcast with this preset,
    EF21-P style (owners keep exact master weights; None: broadcast fp32)."""
    max_shard_numel: int = 0
    """Sharded exchanges: cut tensors into blocks of at most this many elements (0: about 8
    blocks per rank)."""
    overlap: bool = False
    """allreduce | sharded: start the reduction during backward, in buckets from grad hooks
    (distributed/overlap.py, as DDP's buckets), instead of after it; same gradients and bytes.
    The DDP exchanges overlap anyway; the compressed ones cannot (an error)."""
    timeout_s: float = 120.0
    """Seconds a collective may wait for a peer before every rank stops with an error (a dead
    or stuck rank never hangs the run)."""
    reshard_after_forward: bool = True
    """fsdp2: free each block's gathered weights after its training forward and gather them
    again in backward (ZeRO-3: least memory); False keeps them from forward to backward (one
    all-gather fewer per block, the block's whole weights held meanwhile)."""
    param_dtype: str = ""
    """fsdp2: the dtype weights are gathered and the forward runs in (FSDP2's
    MixedPrecisionPolicy; "bfloat16" on GPUs), gradients reduced in float32 ("": the weights'
    own dtype; on a CPU without bf16 units bf16 matmuls are several times slower)."""

    def __post_init__(self):       # its own fields; exchanges.check_exchange checks the rest
        for f in ("max_shard_numel", "reshard_every"):
            if getattr(self, f) < 0:
                raise ValueError(f"exchange.{f} must be >= 0, got {getattr(self, f)}")
        if not self.timeout_s > 0:
            raise ValueError(f"exchange.timeout_s must be > 0, got {self.timeout_s}")

    @property
    def kind(self) -> "ExchangeKind":
        """The registry record of ``name`` (its capabilities)."""
        return EXCHANGES[self.name]
