"""Data-parallel training of the toy policy on N processes, with a choice of gradient exchange.

Every rank holds the whole policy, computes the loss on its 1/N of the step's batch, and the
ranks then agree on the *average* gradient before the optimizer steps. How they agree is the
``exchange``, a key of ``exchanges.EXCHANGES`` (allreduce, compressed, ddp_fp16_hook,
ddp_powersgd_hook, sharded, sharded_compressed; that module has the byte accounting).

Objectives (``OBJECTIVES``), one signature ``(module, policy, ctx, step, rank, world) -> (loss,
metrics)``. Compression acts on gradients, whichever loss made them:

  * ``supervised``: ``pretrain.demo_batch`` + cross-entropy on the answer tokens, as the base
    policy was made. Every rank draws the same global batch (seeded by (seed, step)) and takes
    its rows; its loss is (sum of its token losses) * N / (tokens in the global batch), so
    the rank-average gradient is exactly the full-batch mean gradient.
  * ``grpo``: GRPO (DeepSeekMath): each rank runs ``trainer.rollout_batch`` on its 1/N of the
    step's prompts (sampling seeded by (seed, step, rank); ``grpo`` overrides TrainConfig
    fields, dynamic sampling included), group-relative advantages by prompt,
    ``loss.grpo_loss`` (outcome supervision, mu = 1). The honest target, but the toy
    moves slowly under GRPO, so the accuracy-vs-bytes comparisons use ``supervised``.

Deviations: evaluation runs on rank 0 only (all ranks hold the same parameters); gradient
clipping happens after the exchange and is unavailable with ``sharded`` (its exchange lives
inside ``step``).
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from grpo_lab.advantages import ADVANTAGES
from grpo_lab.config import TrainConfig
from grpo_lab.distributed import launch
from grpo_lab.distributed.compression import PRESETS
from grpo_lab.distributed.exchanges import EXCHANGES
from grpo_lab.loss import grpo_loss
from grpo_lab.model import GPT, GPTConfig, load_policy
from grpo_lab.pretrain import demo_batch
from grpo_lab.rollout import completion_logprobs, positions
from grpo_lab.tasks import get_task, load_eval, sample_examples
from grpo_lab.trainer import evaluate, learning_rate, max_new_tokens, rollout_batch


@dataclass
class DistConfig:
    objective: str = "supervised"
    """supervised (demonstrations, cross-entropy on answers) | grpo (GRPO on sampled groups)."""
    exchange: str = "allreduce"
    """How ranks average gradients: a key of EXCHANGES."""
    preset: str = "seed"
    """exchange=compressed | sharded_compressed: a key of compression.PRESETS (seed | fp32 |
    fp16 | aggressive | dgc)."""
    error_feedback: bool = True
    """Compressed exchanges: keep what top-k did not send (False also turns DGC momentum off)."""
    momentum: float | None = None
    """Compressed exchanges: override the preset's DGC momentum correction (None: the preset's)."""
    beta1: float | None = None
    """Compressed exchanges: override the AdamW beta1 of the preset (None: its ``adam_beta1``)."""
    density_warmup: int | None = None
    """Compressed exchanges: override the preset's DGC density warm-up steps (None: the preset's)."""
    powersgd_rank: int = 2
    """exchange=ddp_powersgd_hook: matrix_approximation_rank."""
    powersgd_start: int = 2
    """exchange=ddp_powersgd_hook: steps of vanilla all_reduce first (torch's minimum is 2)."""
    policy: str = "size_balanced"
    """exchange=sharded: a key of shard_plan.POLICIES."""
    importance: str | None = None
    """exchange=sharded: importance score tracked by the owners (None: none)."""
    reshard_every: int = 0
    """exchange=sharded: re-shard every this many steps (0: never)."""
    broadcast_preset: str | None = None
    """exchange=sharded_compressed: also compress the owners' parameter broadcast with this
    preset, EF21-P style (owners keep exact master weights; None: broadcast fp32)."""
    max_shard_numel: int = 0
    """Sharded exchanges: cut tensors into blocks of at most this many elements (0: the
    sharder's default, about 8 blocks per rank)."""
    steps: int = 300
    """Optimizer steps."""
    batch_size: int = 64
    """Global batch per step: demonstrations (supervised) or prompts (grpo); divisible by N."""
    group_size: int = 8
    """grpo: completions per prompt."""
    lr: float = 2e-3
    """Peak AdamW learning rate (supervised from scratch: 2e-3 as pretrain.py; fine-tuning the
    base policy: 1e-3; grpo: about 1e-4, as TrainConfig)."""
    lr_schedule: str = "cosine"
    """cosine (decay to 10%, as pretrain.py) | constant (after warmup_steps)."""
    warmup_steps: int = 0
    """Linear warm-up steps."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    eps: float = 1e-8
    """AdamW eps."""
    grad_clip: float = 0.0
    """Clip the averaged gradient's norm to this (0: off; not with exchange=sharded)."""
    init: str = "fresh"
    """fresh (a new GPT from the shape fields, seeded) or a policy file to start from."""
    n_layer: int = 3
    """fresh init: transformer blocks."""
    n_head: int = 4
    """fresh init: attention heads."""
    n_embd: int = 80
    """fresh init: width of the residual stream."""
    block_size: int = 32
    """fresh init: longest sequence."""
    task: str = "addition"
    """Task trained on and evaluated on (held-out set data/eval_<task>.jsonl)."""
    eval_every: int = 0
    """Evaluate greedy accuracy every this many steps (0: only after the last step)."""
    eval_size: int = 200
    """Held-out examples evaluated (rank 0)."""
    seed: int = 0
    """Seed of initialisation, batches and sampling."""
    threads: int = 1
    """torch threads per process (0: leave as is)."""
    grpo: dict = field(default_factory=dict)
    """objective=grpo: TrainConfig field overrides (temperature, beta, eps_low, ...)."""

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; known: {sorted(OBJECTIVES)}")
        if self.exchange not in EXCHANGES:
            raise ValueError(f"unknown exchange {self.exchange!r}; known: {sorted(EXCHANGES)}")
        if self.exchange in ("compressed", "sharded_compressed") and self.preset not in PRESETS:
            raise ValueError(f"unknown compression preset {self.preset!r}; known: {sorted(PRESETS)}")
        if self.lr_schedule not in ("cosine", "constant"):
            raise ValueError(f"lr_schedule must be 'cosine' or 'constant', got {self.lr_schedule!r}")
        if self.grad_clip and self.exchange.startswith("sharded"):
            raise ValueError(f"grad_clip={self.grad_clip} needs the averaged gradient before the "
                             f"step; exchange {self.exchange!r} reduces inside its step: use "
                             f"grad_clip=0")
        if self.broadcast_preset is not None and self.broadcast_preset not in PRESETS:
            raise ValueError(f"unknown broadcast_preset {self.broadcast_preset!r}; known: "
                             f"{sorted(PRESETS)}")
        if self.broadcast_preset is not None and self.exchange != "sharded_compressed":
            raise ValueError(f"broadcast_preset={self.broadcast_preset!r} compresses the sharder's "
                             f"broadcast: it needs exchange='sharded_compressed', not "
                             f"{self.exchange!r}")
        if self.max_shard_numel < 0:
            raise ValueError(f"max_shard_numel must be >= 0, got {self.max_shard_numel}")
        for name in ("steps", "batch_size", "group_size", "eval_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"DistConfig.{name} must be >= 1, got {getattr(self, name)}")


# ---------------------------------------------------------------- measurements

def wchar() -> int | None:
    """Bytes this process has handed to write()/send() so far (Linux /proc/self/io), or None."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


# ---------------------------------------------------------------- objectives

def supervised_loss(module, policy, ctx, step, rank, world):
    cfg = ctx["cfg"]
    rng = random.Random(f"{cfg.seed}-batch-{step}")
    examples = sample_examples([cfg.task], cfg.batch_size, rng, ctx["held_out"])  # global batch
    ids, mask, tmask = demo_batch(examples)                               # (B, T) each
    b = cfg.batch_size // world
    rows = slice(rank * b, (rank + 1) * b)
    ids, mask, tmask = ids[rows], mask[rows], tmask[rows]                  # (B/N, T) this rank's
    logits, _ = module(ids, positions(mask), mask)                         # (B/N, T, V)
    # position t predicts token t+1; sum here, divide by the global token count
    ce = F.cross_entropy(logits[:, :-1][tmask[:, 1:]], ids[:, 1:][tmask[:, 1:]], reduction="sum")
    n_global = sum(len(e.answer) + 1 for e in examples)                   # answer + <eos> tokens
    loss = ce * world / n_global
    return loss, {"train/loss": float(loss.detach()) / world}              # rank's share of the mean


def grpo_objective_loss(module, policy, ctx, step, rank, world):
    cfg, tcfg = ctx["cfg"], ctx["tcfg"]                # tcfg: this rank's B/N prompts and seed
    b = cfg.batch_size // world

    def draw(_rng, n):                                 # this rank's rows of the global batch
        rng = random.Random(f"{cfg.seed}-prompts-{step}")
        return sample_examples([cfg.task], cfg.batch_size, rng, ctx["held_out"])[rank * b:(rank + 1) * b]

    (examples, r, rewards, _, _), _ = rollout_batch(policy, tcfg, step, draw)  # N = b*G rows
    adv = ADVANTAGES[tcfg.advantage](rewards, r.prompt_index)             # (N,)
    ref_logp = None
    if tcfg.beta:
        with torch.no_grad():
            ref_logp = completion_logprobs(ctx["ref"], r, tcfg.temperature)  # (N, Tc)
    logp = completion_logprobs(module, r, tcfg.temperature)                # (N, Tc)
    loss, stats = grpo_loss(logp, r.logprobs, ref_logp, adv, r.completion_mask, tcfg.eps_low,
                            tcfg.eps_high, tcfg.beta, tcfg.aggregation, max_new_tokens(tcfg))
    return loss, {"train/loss": float(loss.detach()), "reward/mean": float(rewards.mean())}


OBJECTIVES = {"supervised": supervised_loss, "grpo": grpo_objective_loss}


# ---------------------------------------------------------------- the loop

def make_policy(cfg: DistConfig) -> GPT:
    torch.manual_seed(cfg.seed)
    if cfg.init == "fresh":
        return GPT(GPTConfig(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                             block_size=cfg.block_size))
    return load_policy(cfg.init)


def train(cfg: DistConfig, rank: int = 0, world: int = 1, on_grads=None) -> dict:
    """Train as ``cfg`` says on this rank -> {"history": [metrics per step], "params": {name:
    tensor}, "config": dict}. ``world == 1`` runs without a process group (allreduce only).
    ``on_grads(step, policy)``, the one hook point, sees the averaged gradients before the
    optimizer step (not with ``sharded``, which averages inside its step)."""
    if cfg.batch_size % world:
        raise ValueError(f"batch_size={cfg.batch_size} is not divisible by {world} ranks")
    if world == 1 and cfg.exchange != "allreduce" and not dist.is_initialized():
        raise ValueError(f"exchange {cfg.exchange!r} needs a process group; run it through "
                         f"run_all(..., world_size) or torchrun")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    policy = make_policy(cfg)
    eval_set = load_eval(cfg.task)[:cfg.eval_size]
    ctx = {"cfg": cfg, "held_out": {e.prompt for e in load_eval(cfg.task)},
           "tcfg": (TrainConfig(**{"task": cfg.task, "prompts_per_step": cfg.batch_size // world,
                                   "group_size": cfg.group_size, **cfg.grpo,
                                   "seed": 1000 * cfg.seed + rank})   # per-rank sampling
                    if cfg.objective == "grpo" else None),
           "ref": (make_policy(cfg).eval().requires_grad_(False)
                   if cfg.objective == "grpo" else None)}
    ex = EXCHANGES[cfg.exchange](policy, cfg, world, rank)
    objective = OBJECTIVES[cfg.objective]
    max_new = get_task(cfg.task).max_answer_len + 2
    history = []
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        ex.set_lr(learning_rate(cfg, step))           # trainer's warm-up + schedule
        policy.train()
        loss, metrics = objective(ex.module, policy, ctx, step, rank, world)
        w0 = wchar()                                  # DDP's hooks send during backward
        loss.backward()
        payload = ex.reduce()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
        if on_grads is not None:
            on_grads(step, policy)
        metrics.update(ex.step())
        w1 = wchar()
        ex.zero_grad()
        metrics.update({"step": step, "comm/payload_bytes": payload, "comm/bytes": ex.wire(payload),
                        "comm/wchar_bytes": None if w0 is None else w1 - w0,
                        "time/step_s": time.perf_counter() - t0})
        if rank == 0 and ((cfg.eval_every and (step + 1) % cfg.eval_every == 0)
                          or step == cfg.steps - 1):
            metrics.update(evaluate(policy, eval_set, {"accuracy": 1.0}, max_new))
        history.append(metrics)
    return {"history": history, "config": dataclasses.asdict(cfg),
            "params": {n: p.detach().clone() for n, p in policy.named_parameters()}}


def _rank_main(rank: int, world: int, cfgs: list) -> list:
    return [train(c, rank, world) for c in cfgs]


def run_all(cfgs: list[DistConfig], world_size: int = 2, run_timeout_s: float | None = None):
    """Train every config in turn on ``world_size`` spawned gloo processes (one spawn for all)
    -> results[i][rank] = ``train``'s return value for cfgs[i] on that rank."""
    by_rank = launch.spawn(_rank_main, world_size, (list(cfgs),), backend="gloo",
                           run_timeout_s=run_timeout_s)
    return [[by_rank[r][i] for r in range(world_size)] for i in range(len(cfgs))]


def summary(history: list[dict]) -> dict:
    """Totals of one run: bytes per step (mean), total bytes, time, final accuracy."""
    n = len(history)
    wc = [h["comm/wchar_bytes"] for h in history if h["comm/wchar_bytes"] is not None]
    accs = [h["eval/accuracy"] for h in history if "eval/accuracy" in h]
    return {"comm/bytes_per_step": sum(h["comm/bytes"] for h in history) / n,
            "comm/bytes_total": sum(h["comm/bytes"] for h in history),
            "comm/wchar_per_step": sum(wc) / len(wc) if wc else None,
            "time/train_s": sum(h["time/step_s"] for h in history),
            "eval/accuracy": accs[-1] if accs else None}


def parse_args(argv=None) -> DistConfig:
    """Command line -> DistConfig: one ``--flag`` per field (help: its docstring), but
    ``grpo`` (a dict of TrainConfig overrides: build the config in Python for it)."""
    from grpo_lab.cli import add_config_args, overrides
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_config_args(p, DistConfig, skip={"grpo"})
    return DistConfig(**overrides(p.parse_args(argv), DistConfig))


def main(argv=None):
    """``torchrun --nproc_per_node=2 -m grpo_lab.distributed.train_dist --exchange compressed``"""
    cfg = parse_args(argv)
    rank, world, _ = launch.init_from_env(backend="gloo")
    try:
        s = summary(train(cfg, rank, world)["history"])
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print(s)


if __name__ == "__main__":
    main()
