"""The cost model at cluster scale: one gradient exchange of a 175B model (and of the toy) on
1024 GPUs, with and without compression, plus the memory and compute arithmetic the popular
claims lean on.

Gradient bytes: 4 B per parameter (fp32, the reference every ratio below is measured against).
Compression ratios are the ones *measured* on the toy by bench/bench_train_dist.py
(BENCHMARKS.md section 4, bytes actually sent over 400 steps): ``fp16`` 2.0x, ``fp8_topk5``
10.1x, ``aggressive`` 105x. How each travels matters more than the ratio:

  * dense formats (fp32, fp16) can be summed in flight: an all-reduce of n / r bytes, any
    schedule of ``topology``;
  * top-k messages (``fp8_topk5``, ``aggressive``) cannot (each rank keeps other indices): every
    rank's message goes to every rank, an all-gather (comm.py). A ring all-gather of P
    messages of m bytes: (P-1) (alpha + m beta), and every rank receives (P-1) m bytes:

        all-reduce 2 (P-1)/P n  vs  all-gather (P-1) n / r  ->  sparse wins only while r > P/2

    (comm.py's docstring; PowerSGD, Vogels et al. 2019). At P = 1024 that is r > 512.
Deviations: the ratios are the toy's (a 175B model's gradients would compress differently);
the all-gather is the flat ring (a hierarchical all-gather changes the latency term and which
links carry bytes, not the (P-1) m bytes each rank must receive).

Memory (ZeRO, Rajbhandari et al. 2020, sec. 3, mixed-precision Adam: 2 B fp16 parameter +
2 B fp16 gradient + 12 B fp32 master, momentum, variance = 16 B per parameter):

    stage 0 (replicated)  16 psi          stage 1  4 psi + 12 psi / N
    stage 2               2 psi + 14 psi / N      stage 3  16 psi / N

Compute per step (Kaplan et al. 2020): 6 x parameters x tokens FLOPs (forward + backward).
"""
from __future__ import annotations

from grpo_lab.distributed.topology import (CLUSTERS, Cluster, closed_form, dbtree_chunks, schedule,
                                           simulate)

MEASURED_RATIOS = {"fp32": 1.0, "fp16": 2.0, "fp8_topk5": 10.1, "aggressive": 105.0}
"""Bytes ratio vs fp32 measured on the toy (BENCHMARKS.md section 4)."""
TRAVELS_AS = {"fp32": "allreduce", "fp16": "allreduce", "fp8_topk5": "allgather", "aggressive": "allgather"}
MODELS = {"175B": 175e9, "toy": 240_160}
"""Parameters: GPT-3 175B (Brown et al. 2020) and the shipped toy policy."""


def allgather_time(p: int, m: float, alpha: float, beta: float) -> float:
    """Ring all-gather of p messages of m bytes: (p-1) (alpha + m beta) (Thakur et al. 2005)."""
    return (p - 1) * (alpha + m * beta)


def exchange_time(c: Cluster, sched: str, params: float, preset: str = "fp32") -> float:
    """Seconds for one gradient exchange of ``params`` fp32 gradients compressed by ``preset``:
    an all-reduce under ``sched`` for dense formats, a flat ring all-gather for top-k ones."""
    if preset not in MEASURED_RATIOS:
        raise ValueError(f"unknown preset {preset!r}; known: {sorted(MEASURED_RATIOS)}")
    n = 4 * params / MEASURED_RATIOS[preset]                                   # bytes per rank
    if TRAVELS_AS[preset] == "allgather":
        alpha, beta = c.links()
        worst = (c.alpha_inter, c.beta_inter) if c.nodes > 1 else (c.alpha_intra, c.beta_intra)
        if c.capacity is not None or c.latency is not None:
            worst = (float(alpha.max()), float(beta.max()))                    # the ring's slowest link
        return allgather_time(c.size, n, *worst)
    if c.capacity is None and c.latency is None and c.node_of is None:
        return closed_form(sched, c, n)                  # dbtree: the best chunk count
    kw = {}
    if sched == "dbtree":                                # best chunk count for the slowest link
        _, beta = c.links()
        kw["chunks"] = min(256, dbtree_chunks(c.size, n, c.alpha_inter, float(beta.max())))
    return simulate(schedule(sched, c, n, **kw), c).time


def study(nodes: int = 128, clusters=("dgx_ib", "ethernet", "hetero"),
          schedules=("ring", "rhd", "tree", "dbtree", "hierarchical"),
          models=("175B", "toy"), presets=tuple(MEASURED_RATIOS)) -> list[dict]:
    """Rows {cluster, schedule, model, preset, seconds} for every combination (P = 8 x nodes)."""
    rows = []
    for cname in clusters:
        c = CLUSTERS[cname](nodes)
        for sched in schedules:
            for model in models:
                for preset in presets:
                    if TRAVELS_AS[preset] == "allgather" and sched != "ring":
                        continue                                               # one all-gather row
                    rows.append({"cluster": cname, "ranks": c.size, "schedule": sched if
                                 TRAVELS_AS[preset] == "allreduce" else "ring all-gather",
                                 "model": model, "preset": preset,
                                 "seconds": exchange_time(c, sched, MODELS[model], preset)})
    return rows


def bandwidth_floor(c: Cluster, params: float, ratio: float = 1.0) -> float:
    """Lower bound for any all-reduce: a node must send 2 (M-1)/M of the n bytes out through
    its g NICs (Patarasuk & Yuan 2009's bound applied to the node)."""
    n = 4 * params / ratio
    return 2 * (c.nodes - 1) / c.nodes * n * c.beta_inter / c.gpus_per_node


def zero_memory(params: float, N: int, stage: int, extra_bytes_per_param: float = 0.0) -> float:
    """Bytes per GPU for mixed-precision Adam under ZeRO stage 0-3 (+ extra state per
    parameter, replicated: e.g. 4 for an fp32 error-feedback residual, 8 for importance moments)."""
    if stage not in (0, 1, 2, 3) or N < 1:
        raise ValueError(f"stage must be 0..3 and N >= 1, got stage={stage}, N={N}")
    per = {0: 16, 1: 4 + 12 / N, 2: 2 + 14 / N, 3: 16 / N}[stage]
    return params * (per + extra_bytes_per_param)


def compute_time(params: float, tokens: float, gpus: int, peak_flops: float, mfu: float) -> float:
    """Seconds of forward + backward for ``tokens`` tokens: 6 P T / (gpus x peak x MFU)."""
    return 6 * params * tokens / (gpus * peak_flops * mfu)
