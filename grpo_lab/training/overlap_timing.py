"""Timing the overlap of backward and gradient reduction on the toy policy (distributed/overlap.py).

Two ratios, measured side by side by ``measure_overlap`` (``_overlap_worker``) on gloo processes;
their definitions and what they mean on CPUs vs GPUs are in distributed/overlap.py's docstring.
``check_equivalence`` runs both reductions and returns the gradients and parameters to compare
(tests/test_overlap.py). This harness lives outside distributed/ because it needs the model.
"""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from grpo_lab.distributed.launch import spawn
from grpo_lab.distributed.overlap import (DEFAULT_BUCKET_BYTES, OverlappedAllReduce,
                                          OverlappedReduce, allreduce_grads)
from grpo_lab.distributed.shard_plan import assign, default_max_shard_numel, make_shards
from grpo_lab.policies.model import GPT, GPTConfig, load_policy
from grpo_lab.paths import BASE_POLICY
from grpo_lab.registry import lookup


def toy_policy(seed: int = 0, tiny: bool = False):
    """The shipped base policy (or a tiny random GPT, for tests) and its vocabulary size."""
    torch.manual_seed(seed)
    model = (GPT(GPTConfig(n_layer=2, n_embd=32, n_head=2, block_size=16))
             if tiny or not BASE_POLICY.exists() else load_policy(BASE_POLICY))
    return model, model.cfg.vocab_size


def lm_loss(model, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of tokens (B, T): a fixed, deterministic workload."""
    logits, _ = model(tokens[:, :-1])                                           # (B, T-1, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def _batch(rank: int, step: int, vocab: int, batch: int, seq: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)                        # per rank data
    return torch.randint(0, vocab, (batch, seq), generator=g)                     # (B, T)


def _all_reduce_pair(model, bucket_bytes: int, world: int):
    return tuple(OverlappedAllReduce(model, bucket_bytes, overlap=o) for o in (False, True))


def _reduce_pair(model, bucket_bytes: int, world: int):  # the sharder's: size_balanced owners
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    shards = make_shards(named, default_max_shard_numel(sum(p.numel() for _, p in named), world))
    owner = assign("size_balanced", shards, world)
    return tuple(OverlappedReduce([p for _, p in named], shards, owner, bucket_bytes, overlap=o)
                 for o in (False, True))


# the collectives timed: (model, bucket_bytes, world) -> (post-backward, overlapped) reducers,
# the same buckets, started after backward or by the hooks
COLLECTIVES = {"all_reduce": _all_reduce_pair, "reduce": _reduce_pair}


def _overlap_worker(rank: int, world: int, batch: int, seq: int, reps: int,
                    bucket_bytes: int, tiny: bool, collective: str = "all_reduce") -> dict:
    torch.set_num_threads(1)
    model, vocab = toy_policy(tiny=tiny)
    seq = min(seq, model.cfg.block_size + 1)
    post, ovl = lookup(COLLECTIVES, collective, "collective")(model, bucket_bytes, world)
    rows = []
    for r in range(reps + 1):                                          # rep 0 is warm-up
        x = _batch(rank, r, vocab, batch, seq)
        row = {}
        for mode in (("post", "overlap") if r % 2 else ("overlap", "post")):   # alternate
            red = post if mode == "post" else ovl
            post.enabled, ovl.enabled = mode == "post", mode == "overlap"
            model.zero_grad(set_to_none=True)
            loss = lm_loss(model, x)
            dist.barrier()
            t0 = time.perf_counter()
            loss.backward()
            t1 = time.perf_counter()
            early = sum(1 for t in red.launched_at if t is not None and t < t1)   # during backward
            red.finish()
            t2 = time.perf_counter()
            row[mode] = (t1 - t0, t2 - t1, t2 - t0, early)               # backward, after, total
        if r:
            rows.append(row)
    med = lambda mode, i: float(np.median([r[mode][i] for r in rows]))
    comm, exposed = med("post", 1), med("overlap", 1)
    saved = float(np.median([r["post"][2] - r["overlap"][2] for r in rows]))   # paired
    return {"backward_s": med("post", 0), "backward_overlapped_s": med("overlap", 0),
            "comm_s": comm, "post_total_s": med("post", 2), "overlap_total_s": med("overlap", 2),
            "exposed_s": exposed, "concurrency": 1 - exposed / comm, "overlap_ratio": saved / comm,
            "launched_during_backward": med("overlap", 3), "buckets": len(ovl.buckets),
            "grad_bytes": sum(4 * p.numel() for p in model.parameters()), "rows": rows}


def measure_overlap(world: int = 2, batch: int = 4, seq: int = 24, reps: int = 20,
                    bucket_bytes: int = DEFAULT_BUCKET_BYTES, tiny: bool = False,
                    collective: str = "all_reduce") -> list[dict]:
    """Post-backward vs overlapped reduction of the toy policy, side by side (alternating), on
    ``world`` gloo processes -> each rank's medians: ``overlap_ratio`` (median of the paired
    time saved / comm), ``concurrency``, ``comm_s``, ``backward_s`` ... ``collective``:
    "all_reduce" (``OverlappedAllReduce``, as DDP) or "reduce" (``OverlappedReduce``, the
    sharder's reduce to size_balanced owners, without its AdamW and broadcast, which are the
    same in both modes)."""
    lookup(COLLECTIVES, collective, "collective")
    return spawn(_overlap_worker, world, (batch, seq, reps, bucket_bytes, tiny, collective),
                 backend="gloo", run_timeout_s=600, progress=f"measuring {collective} overlap")


def _equivalence_worker(rank: int, world: int, steps: int, bucket_bytes: int) -> dict:
    """Gradients of one step and parameters after ``steps`` AdamW steps, reduced both ways."""
    torch.set_num_threads(1)
    out = {}
    for mode in ("post", "overlap"):
        model, vocab = toy_policy(seed=0, tiny=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        red = OverlappedAllReduce(model, bucket_bytes) if mode == "overlap" else None
        grads = None
        for step in range(steps):
            model.zero_grad(set_to_none=True)
            lm_loss(model, _batch(rank, step, vocab, 4, 12)).backward()
            red.finish() if red else allreduce_grads(model)
            if step == 0:
                grads = {n: p.grad.clone() for n, p in model.named_parameters()}
            opt.step()
        out[mode] = {"grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()},
                     "buckets": len(red.buckets) if red else None}
    return out


def check_equivalence(world: int = 2, steps: int = 3, bucket_bytes: int = 4096) -> list[dict]:
    """Run both reductions on ``world`` processes -> per rank {"post": ..., "overlap": ...}."""
    return spawn(_equivalence_worker, world, (steps, bucket_bytes), backend="gloo", run_timeout_s=300)
