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

When compression pays (``compression_pays``, issue 27): a compressed exchange costs its coding
time, which a plain one does not, and saves link time. Exposed seconds per step, n = 4 x params
bytes, p ranks, a link (alpha, bandwidth B), a codec (ratio r, encode and decode throughput E, D
in bytes of fp32 gradient per second), h seconds of backward that communication may hide behind:

    plain       max(0, 2 (p-1) alpha + 2 (p-1)/p n / B - h)
    compressed  n / E + p n / D + max(0, (p-1) (2 alpha + n / (r B)) - h)   (top-k: all-gather)

(comm.py's all-gather is two collectives, the lengths and then the messages: 2 alpha a step).
With h = 0 they are equal at B* = n (2 (p-1)/p - (p-1)/r) / (n/E + p n/D): the
break-even bandwidth. Slower links than B* gain from compressing; faster ones lose. At 250 MB/s
of coding, B* is about 250 MB/s: a 2 Gb/s link. To pay on a 400 Gb/s link the codec must run at
about the link's own speed, which is why DGC and PowerSGD encode on the GPU. Deviations: coding
is never overlapped (it competes with backward for the same device); the plain exchange is one
ring all-reduce (fp32; bf16 gradients halve n for both).
"""
from __future__ import annotations

import math
from typing import NamedTuple

from grpo_lab.distributed.topology import (CLUSTERS, SCHEDULES, Cluster, closed_form, dbtree_chunks,
                                           ring_time, schedule, simulate)
from grpo_lab.registry import lookup

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
    n = 4 * params / lookup(MEASURED_RATIOS, preset, "preset")                 # bytes per rank
    if TRAVELS_AS[preset] == "allgather":
        alpha, beta = c.links()
        worst = (c.alpha_inter, c.beta_inter) if c.nodes > 1 else (c.alpha_intra, c.beta_intra)
        if c.capacity is not None or c.latency is not None:
            worst = (float(alpha.max()), float(beta.max()))                    # the ring's slowest link
        return allgather_time(c.size, n, *worst)
    if c.capacity is None and c.latency is None and c.node_of is None:
        return closed_form(sched, c, n)           # a takes_chunks one: the best chunk count
    kw = {}
    if lookup(SCHEDULES, sched, "schedule").takes_chunks:    # best count for the slowest link
        _, beta = c.links()
        kw["chunks"] = min(256, dbtree_chunks(c.size, n, c.alpha_inter, float(beta.max())))
    return simulate(schedule(sched, c, n, **kw), c).time


def study(nodes: int = 128, clusters=("dgx_ib", "ethernet", "hetero"),
          schedules=("ring", "rhd", "tree", "dbtree", "hierarchical"),
          models=("175B", "toy"), presets=tuple(MEASURED_RATIOS)) -> list[dict]:
    """Rows {cluster, schedule, model, preset, seconds} for every combination (P = 8 x nodes)."""
    rows = []
    for cname in clusters:
        c = lookup(CLUSTERS, cname, "cluster")(nodes)
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


# --------------------------------------------------------------------------- when compression pays

class Link(NamedTuple):
    """One link of the alpha-beta model: latency alpha (s) and bandwidth (bytes/s) = 1 / beta."""
    alpha: float
    bandwidth: float
    name: str = ""


GB = 1e9
LINKS = {
    # this machine: gloo all_reduce between 2 processes over loopback TCP, fitted on the ring
    # model (calibrate.py; BENCHMARKS.md section 7): 87 us, 2.6 GB/s
    "gloo (this machine)": Link(87e-6, 2.6 * GB, "gloo (this machine)"),
    "100 Gb/s Ethernet": Link(25e-6, 12.5 * GB, "100 Gb/s Ethernet"),        # topology's ethernet
    "PCIe 4.0 x16": Link(2e-6, 25 * GB, "PCIe 4.0 x16"),                     # ~25 of 32 GB/s usable
    "400 Gb/s InfiniBand": Link(5e-6, 50 * GB, "400 Gb/s InfiniBand"),       # NDR, one NIC per GPU
    "NVLink 4 (H100)": Link(1e-6, 450 * GB, "NVLink 4 (H100)"),              # per direction
}
"""Links by name: this machine's gloo (measured) and datasheet-level ones (assumptions)."""


def link_from_calibration(cal, p: int = 2, name: str = "gloo (calibrated)") -> Link:
    """The link of a ``calibrate.Calibration``'s ring all-reduce fit for ``p`` processes (alpha,
    1 / beta): how this machine's own numbers enter the calculator (``LINKS`` holds one run's)."""
    alpha, beta = cal.fits[f"allreduce p={p}"]
    if not (alpha >= 0 and beta > 0):
        raise ValueError(f"calibration for p={p} gave alpha={alpha}, beta={beta}: not a link "
                         f"(too few or too noisy points?)")
    return Link(alpha, 1 / beta, name)


class Codec(NamedTuple):
    """A compression protocol as the cost model sees it: what it saves and what it costs."""
    ratio: float
    """fp32 bytes / bytes sent."""
    encode_bps: float
    """Bytes of fp32 gradient encoded per second (select + quantise + code + frame)."""
    decode_bps: float
    """Bytes of fp32 gradient decoded per second (unframe + decode + scatter), per message."""
    sparse: bool = True
    """Top-k messages cannot be summed in flight: an all-gather; dense ones (fp16) all-reduce."""


class Verdict(NamedTuple):
    plain_s: float
    """Exposed seconds of the plain fp32 ring all-reduce (after what backward hides)."""
    compressed_s: float
    """Exposed seconds of the compressed exchange: encode + decode + what backward does not hide."""
    pays: bool
    saving_s: float
    """plain - compressed (negative: compression costs time)."""
    speedup: float
    """plain / compressed."""
    break_even_bandwidth: float
    """Link bandwidth (B/s) below which compression pays, all else equal; 0 if it never pays,
    inf if it always does."""


def exchange_seconds(params: float, link: Link, world: int, codec: Codec | None = None,
                     hidden_s: float = 0.0) -> float:
    """Exposed seconds of one gradient exchange of ``params`` fp32 gradients over ``world``
    ranks on ``link``; ``codec`` None is the plain ring all-reduce. ``hidden_s``: seconds of
    backward the communication may overlap with (overlap fraction x backward time). Coding
    is never hidden: it runs on the same device as backward (and each rank decodes all
    ``world`` messages when they are gathered)."""
    if params < 0 or world < 2 or link.bandwidth <= 0 or link.alpha < 0 or hidden_s < 0:
        raise ValueError(f"need params >= 0, world >= 2, bandwidth > 0, alpha >= 0, hidden_s >= 0; "
                         f"got {params}, {world}, {link.bandwidth}, {link.alpha}, {hidden_s}")
    n = 4 * params                                                         # fp32 bytes
    beta = 1 / link.bandwidth
    if codec is None:
        return max(0.0, ring_time(world, n, link.alpha, beta) - hidden_s)
    if codec.ratio <= 0 or codec.encode_bps <= 0 or codec.decode_bps <= 0:
        raise ValueError(f"codec needs ratio, encode_bps, decode_bps > 0, got {codec}")
    m = n / codec.ratio
    comm = (allgather_time(world, m, 2 * link.alpha, beta) if codec.sparse  # lengths, then bytes
            else ring_time(world, m, link.alpha, beta))
    decodes = world if codec.sparse else 1                                 # every rank's message
    code = n / codec.encode_bps + decodes * n / codec.decode_bps
    return code + max(0.0, comm - hidden_s)


def compression_pays(params: float, link: Link, codec: Codec, world: int = 2,
                     overlap: float = 0.0, backward_s: float = 0.0) -> Verdict:
    """Does a compressed exchange beat a plain fp32 all-reduce, by how much, and below which
    bandwidth? ``overlap`` in [0, 1]: the fraction of ``backward_s`` that communication can hide
    behind (DDP-style buckets; section 7 of BENCHMARKS.md measured 0 to 1/3 on this CPU).

    The saving shrinks as bandwidth grows (both exchanges get cheaper, the plain one faster,
    as long as the compressed one sends fewer bytes), so the break-even bandwidth is found by
    bisection on a log scale, with the link's latency fixed."""
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap must be in [0, 1], got {overlap}")
    hidden = overlap * backward_s
    plain = exchange_seconds(params, link, world, None, hidden)
    comp = exchange_seconds(params, link, world, codec, hidden)

    def saving(bw):
        at = Link(link.alpha, bw)
        return exchange_seconds(params, at, world, None, hidden) - \
            exchange_seconds(params, at, world, codec, hidden)

    lo, hi = 1e3, 1e16                                                     # 1 kB/s .. 10 PB/s
    if saving(lo) <= 0:
        even = 0.0                                                         # never pays
    elif saving(hi) > 0:
        even = math.inf
    else:
        for _ in range(200):                                               # log-scale bisection
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if saving(mid) > 0 else (lo, mid)
            if hi / lo < 1 + 1e-9:
                break
        even = math.sqrt(lo * hi)
    return Verdict(plain, comp, comp < plain, plain - comp, plain / comp if comp else math.inf, even)


def codec_from_bench(ratio: float, encode_ms: float, decode_ms: float, numel: int = 1_000_000,
                     sparse: bool = True) -> Codec:
    """A Codec from a row of bench/bench_codecs.py: ms to encode / decode ``numel`` fp32 values."""
    return Codec(ratio, 4 * numel / (encode_ms / 1e3), 4 * numel / (decode_ms / 1e3), sparse)


MEASURED_CODECS = {
    # bench/bench_codecs.py on one core of this machine, loaded (bench/RESULTS_compression.md,
    # BENCHMARKS.md section 3): 5% of a 1e6-element fp32 gradient, the message's ratio and ms
    # to encode / decode it (the fast row: numba kernels; the readable row: top-k only, exact,
    # Huffman, fp32 values)
    "fast_topk5, fast path (this CPU)": codec_from_bench(46.4, 0.71, 0.35),
    "fp8_topk5, readable path (this CPU)": codec_from_bench(16.9, 44.71, 29.48),
    # an assumption, not a measurement: a fused GPU encoder at half of an H100's ~3 TB/s HBM
    "top-k 46x at 1.5 TB/s (GPU, assumed)": Codec(46.4, 1.5e12, 1.5e12),
}
"""Codecs for the calculator: measured on this CPU, and one assumed GPU-speed encoder."""
