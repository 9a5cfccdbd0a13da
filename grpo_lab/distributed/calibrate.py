"""Measure alpha and beta of gloo on this machine's processes, and fit the cost model to them.

Two sweeps over message sizes, each group size its own ``launch.spawn`` (2-4 processes):

  * ping-pong between ranks 0 and 1: ``send`` n bytes, ``recv`` them back; one-way time =
    round trip / 2, fitted to ``t = alpha + n beta`` (Hockney 1994);
  * ``all_reduce`` of n bytes on the groups {0, 1}, {0, 1, 2}, ... {0..world-1}, fitted to the
    ring model ``t = 2 (p-1) alpha + 2 (p-1)/p n beta`` (topology.ring_time; gloo's default
    all_reduce algorithm is a ring of reduce-scatter + all-gather).

Each point is the minimum (or median, ``stat``) over ``repeats`` of the mean of ``inner``
back-to-back operations (more for small messages); the repeats sweep all sizes in turn, so a
burst of load from another job spoils one repeat of each size, not every repeat of one. The fit minimises the *relative* squared error (rows divided by the
measured time), so 30 us and 30 ms points weigh alike; ``rel_errors`` reports
|predicted - measured| / measured per point. What the fitted numbers mean here: all ranks are
processes on one machine talking over loopback TCP, so beta includes memory copies and the
reduction's arithmetic (the gamma term the model leaves out), and alpha is gloo's and the
kernel's software overhead, not a wire. On a shared 2-core machine, 3-4 processes
oversubscribe the cores: the numbers are this machine's, not a network's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from grpo_lab.distributed.launch import spawn
from grpo_lab.distributed.topology import ring_time
from grpo_lab.registry import lookup

QUICK_SIZES = [4 * 2 ** k for k in range(0, 19, 3)]                  # 4 B .. 1 MiB
FULL_SIZES = [4 * 2 ** k for k in range(0, 22)]                      # 4 B .. 8 MiB


def _inner(n: int) -> int:
    """Back-to-back operations per timing: many for tiny messages, few for large ones."""
    return int(max(2, min(10, 2e6 // max(n, 1))))


def _timed(fn, inner: int) -> float:
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def _times(sizes: list[int], repeats: int, op, per_op: int = 1, barrier: bool = False) -> dict:
    """-> {n: [min, median]} over the repeats of seconds per ``op(buf of n bytes)`` / ``per_op``."""
    torch.set_num_threads(1)
    bufs = {n: torch.zeros(max(1, n // 4)) for n in sizes}               # n bytes of float32
    times = {n: [] for n in sizes}
    for r in range(repeats + 1):                  # sizes interleaved: a burst of load from
        for n in sizes:                           # another job hits one repeat of each size
            if barrier:
                dist.barrier()
            t = _timed(lambda: op(bufs[n]), _inner(n)) / per_op
            if r:                                 # r = 0 is warm-up
                times[n].append(t)
    return {n: [float(np.min(v)), float(np.median(v))] for n, v in times.items()}


def _pingpong(rank: int, world: int, sizes: list[int], repeats: int) -> dict:
    """Ranks 0 and 1 (the only ranks): one-way time per size = round trip / 2."""
    def rt(buf):
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)
    return _times(sizes, repeats, rt, per_op=2)


def _allreduce(rank: int, world: int, sizes: list[int], repeats: int) -> dict:
    """Every rank: seconds per all_reduce of each size (each rank's own clock)."""
    return _times(sizes, repeats, dist.all_reduce, barrier=True)


def _sweep(rank: int, world: int, sizes: list[int], repeats: int) -> dict:
    return {"pingpong": _pingpong(rank, world, sizes, repeats) if world == 2 else None,
            "allreduce": _allreduce(rank, world, sizes, repeats)}


def measure(world: int = 4, sizes: list[int] | None = None, repeats: int = 5,
            stat: str = "min") -> dict:
    """Ping-pong and all_reduce on 2 gloo processes, all_reduce on 3, .. ``world`` (one spawn
    per group size, so no idle rank competes for the cores) -> {"pingpong": {n: s},
    "allreduce": {p: {n: s}}}, rank 0's timings, the ``stat`` ("min" or "median") over the
    repeats. The minimum is the default: on a machine shared with other jobs it is the
    repeat least disturbed by them (the median is kept under "median")."""
    if not 2 <= world <= 8:
        raise ValueError(f"world must be 2..8 processes, got {world}")
    if stat not in ("min", "median"):
        raise ValueError(f"stat must be 'min' or 'median', got {stat!r}")
    k = 0 if stat == "min" else 1
    sizes = sorted(sizes or QUICK_SIZES)
    out = {"allreduce": {}, "median": {"allreduce": {}}, "stat": stat}
    for p in range(2, world + 1):
        r = spawn(_sweep, p, (sizes, repeats), backend="gloo", run_timeout_s=600,
                  progress="timing gloo collectives")[0]
        out["allreduce"][p] = {n: v[k] for n, v in r["allreduce"].items()}
        out["median"]["allreduce"][p] = {n: v[1] for n, v in r["allreduce"].items()}
        if p == 2:
            out["pingpong"] = {n: v[k] for n, v in r["pingpong"].items()}
            out["median"]["pingpong"] = {n: v[1] for n, v in r["pingpong"].items()}
    return out


def fit(a_coef, b_coef, t) -> tuple[float, float]:
    """Least squares on relative error: t ~ a_coef * alpha + b_coef * beta -> (alpha, beta)."""
    a_coef, b_coef, t = (np.asarray(v, dtype=float) for v in (a_coef, b_coef, t))
    A = np.stack([a_coef / t, b_coef / t], axis=1)                        # (m, 2)
    (alpha, beta), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    return float(alpha), float(beta)


@dataclass
class Calibration:
    measured: dict
    """The sweeps, as ``measure`` returns them."""
    fits: dict = field(default_factory=dict)
    """(alpha s, beta s/B) by name: "pingpong"; "allreduce" (every all_reduce point, one ring
    model); "allreduce p=2", "allreduce p=3", ... (one group size each)."""
    rows: list = field(default_factory=list)
    """One dict per all_reduce point: p, bytes, measured_s, and the ring model's time with each
    fit under the fit's name."""


def calibrate(measured: dict) -> Calibration:
    """Fit the models to a measurement and predict every all_reduce point with each fit."""
    pp = measured["pingpong"]
    n = np.array(sorted(pp), dtype=float)
    fits = {"pingpong": fit(np.ones_like(n), n, [pp[int(k)] for k in n])}
    pts = [(p, nb, t) for p, d in measured["allreduce"].items() for nb, t in d.items()]
    p_, n_, t_ = (np.array(v, dtype=float) for v in zip(*pts))
    fits["allreduce"] = fit(2 * (p_ - 1), 2 * (p_ - 1) / p_ * n_, t_)
    for p in sorted(measured["allreduce"]):
        m = p_ == p
        fits[f"allreduce p={p}"] = fit(2 * (p_[m] - 1), 2 * (p_[m] - 1) / p_[m] * n_[m], t_[m])
    rows = [{"p": int(p), "bytes": int(nb), "measured_s": t,
             **{name: ring_time(int(p), nb, *fits[name]) for name in ("pingpong", "allreduce")},
             "allreduce per p": ring_time(int(p), nb, *fits[f"allreduce p={int(p)}"])}
            for p, nb, t in pts]
    return Calibration(measured, fits, rows)


FITS = ("pingpong", "allreduce", "allreduce per p")
"""The fits a ``Calibration`` row carries a prediction of (``rel_errors``' ``which``)."""


def rel_errors(cal: Calibration, which: str = "allreduce", p: int | None = None,
               min_bytes: int = 0) -> np.ndarray:
    """|predicted - measured| / measured of the all_reduce points (of group size ``p``, of at
    least ``min_bytes``) under fit ``which``: "pingpong", "allreduce" or "allreduce per p"."""
    lookup(FITS, which, "fit")
    return np.array([abs(r[which] - r["measured_s"]) / r["measured_s"] for r in cal.rows
                     if r["bytes"] >= min_bytes and (p is None or r["p"] == p)])


def quick_calibrate(world: int = 2, extra_sizes=(), repeats: int = 9) -> Calibration:
    """The notebook's short run: QUICK_SIZES (+ ``extra_sizes``, e.g. the toy's gradient bytes)."""
    return calibrate(measure(world, sorted(set(QUICK_SIZES) | set(extra_sizes)), repeats))


def toy_sizes() -> dict[str, int]:
    """Bytes the toy policy's reductions move: its whole fp32 gradient, its largest and its
    median tensor (the sizes a flat exchange and a per-tensor exchange send)."""
    from grpo_lab.checkpoint import read_tensors     # the file's tensors are the parameters
    from grpo_lab.paths import BASE_POLICY
    tensors, _ = read_tensors(BASE_POLICY)                 # (tied lm_head saved once)
    b = sorted(4 * t.numel() for t in tensors.values())
    return {"whole gradient": sum(b), "largest tensor": b[-1], "median tensor": b[len(b) // 2]}
