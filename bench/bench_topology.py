"""Communication at cluster scale: calibration of gloo, overlap on 2 processes, 1024-GPU tables.

    .venv/bin/python bench/bench_topology.py            # about 2-3 minutes on 2 CPU cores
    .venv/bin/python bench/bench_topology.py --quick    # fewer sizes and repeats (~40 s)

Writes bench/RESULTS_topology.md:
  1. calibration: ping-pong and all_reduce sweeps (2, 3, 4 gloo processes), the fitted alpha
     and beta (calibrate.py), measured vs predicted for the toy's sizes, each fit's error;
  2. overlap: post-backward vs overlapped bucketed reduction of the toy (overlap.py), side by
     side in one run, for a few batch sizes (the comm:compute ratio sets what can be hidden),
     for DDP's all_reduce and for the sharder's reduce to owners (``--only overlap``: this
     part alone, replacing its section of the results);
  3. 1024 GPUs: one gradient exchange of a 175B model and of the toy per cluster, schedule and
     compression preset (scaling.py), with the node bandwidth floor;
  4. placement: METIS vs rank order vs the true layout on a scrambled 1024-rank cluster;
  5. value-ordered sends: when the important half of the toy's gradient has arrived.
The machine is shared (2 cores, other jobs running): timings are medians of interleaved
repeats; parts 3-5 are the cost model (no timing).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from grpo_lab.distributed import calibrate as C  # noqa: E402
from grpo_lab.distributed import placement as PL  # noqa: E402
from grpo_lab.distributed import scaling as S  # noqa: E402
from grpo_lab.distributed import topology as T  # noqa: E402
from grpo_lab.training.overlap_timing import measure_overlap  # noqa: E402


def us(s):
    return f"{s * 1e6:,.0f}"


def part_calibration(quick: bool) -> tuple[list[str], C.Calibration]:
    toy = C.toy_sizes()
    sizes = sorted(set(C.QUICK_SIZES if quick else C.FULL_SIZES) | set(toy.values()))
    t0 = time.time()
    cal = C.calibrate(C.measure(4, sizes, repeats=3 if quick else 7))
    out = [f"## 1. Calibration of gloo on this machine ({time.time() - t0:.0f} s)", "",
           f"Message sizes {sizes[0]} B .. {sizes[-1]:,} B; 2, 3, 4 processes on 2 shared cores "
           f"(3 and 4 oversubscribe them). Fits minimise relative error (calibrate.py).", "",
           "| fit | alpha (us) | bandwidth 1/beta (GB/s) | median error | max error | error >= 64 KiB |",
           "|---|---|---|---|---|---|"]
    for name, (a, b) in cal.fits.items():
        which = name if name in ("pingpong", "allreduce") else "allreduce per p"
        p = int(name.split("=")[1]) if "=" in name else None
        e, big = C.rel_errors(cal, which, p), C.rel_errors(cal, which, p, min_bytes=65536)
        out.append(f"| {name} | {a * 1e6:.1f} | {1 / b / 1e9:.2f} | {np.median(e):.0%} | "
                   f"{e.max():.0%} | {np.median(big):.0%} |")
    out += ["", "All_reduce of the toy's sizes, measured vs the ring model (us):", "",
            "| p | what | bytes | measured | model (joint fit) | model (fit for this p) | model (ping-pong fit) |",
            "|---|---|---|---|---|---|---|"]
    names = {v: k for k, v in toy.items()}
    for r in cal.rows:
        if r["bytes"] in names:
            out.append(f"| {r['p']} | {names[r['bytes']]} | {r['bytes']:,} | {us(r['measured_s'])} | "
                       f"{us(r['allreduce'])} | {us(r['allreduce per p'])} | {us(r['pingpong'])} |")
    return out, cal


def part_overlap(quick: bool) -> list[str]:
    out = ["", "## 2. Overlap: bucketed reduction started during backward, 2 gloo processes", "",
           "Toy policy (960,640 B of gradient), sequence 24; per rank, medians over repeats that "
           "alternate the two modes; concurrency = 1 - exposed / comm, overlap ratio = median paired "
           "(post total - overlapped total) / comm (overlap.py). `all_reduce`: OverlappedAllReduce, "
           "buckets of >= 256 KiB (as DDP). `reduce`: the sharder's reduce to its owners "
           "(OverlappedReduce, 16 size_balanced shards cut into groups of >= 256 KiB, one reduce per "
           "owner in each; AdamW and broadcast left out, they are the same in both modes). "
           "Re-run this section alone: `bench/bench_topology.py --only overlap`. Load average when "
           f"it started: {os.getloadavg()[0]:.1f} on 2 cores; timings are indicative.", "",
           "| batch | run | collective | rank | backward (ms) | backward with hooks (ms) | comm after backward (ms) | "
           "exposed wait (ms) | buckets started in backward | concurrency | overlap ratio | bound backward/comm |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for batch in ((4, 16) if quick else (2, 8, 32)):
        for run in range(1 if quick else 2):
            for collective in ("all_reduce", "reduce"):
                t0 = time.time()
                res = measure_overlap(2, batch=batch, seq=24, reps=15 if quick else 40,
                                      collective=collective)
                for rank, r in enumerate(res):
                    out.append(f"| {batch} | {run + 1} | {collective} | {rank} | {r['backward_s'] * 1e3:.2f} | "
                               f"{r['backward_overlapped_s'] * 1e3:.2f} | {r['comm_s'] * 1e3:.2f} | "
                               f"{r['exposed_s'] * 1e3:.2f} | {r['launched_during_backward']:.0f} of {r['buckets']} | "
                               f"{r['concurrency']:.0%} | {r['overlap_ratio']:+.0%} | "
                               f"{min(1.0, r['backward_s'] / r['comm_s']):.0%} |")
                print(f"overlap {collective} batch {batch} run {run + 1}: {time.time() - t0:.0f} s",
                      flush=True)
    return out


def part_scale() -> list[str]:
    rows = S.study()
    out = ["", "## 3. One gradient exchange on 1024 GPUs (cost model)", "",
           "Clusters (topology.CLUSTERS): `dgx_ib` 128 nodes x 8 GPUs, NVLink 450 GB/s + 1 us inside, "
           "one 50 GB/s NIC per GPU + 5 us between; `ethernet` 1024 hosts x 1 GPU, 12.5 GB/s, 25 us; "
           "`hetero` dgx_ib with every other node at half NIC bandwidth and 10 us. fp32 gradients = "
           "4 B/param; presets' ratios measured on the toy (BENCHMARKS.md section 4); top-k presets "
           "travel as a ring all-gather.", ""]
    for model in S.MODELS:
        out += [f"**{model}** ({S.MODELS[model]:,.0f} parameters, {4 * S.MODELS[model] / 1e9:,.3g} GB fp32); seconds:", "",
                "| cluster | schedule | fp32 | fp16 (2.0x) | seed (10.1x) | aggressive (105x) |", "|---|---|---|---|---|---|"]
        for cl in ("dgx_ib", "ethernet", "hetero"):
            for sched in ("ring", "rhd", "tree", "dbtree", "hierarchical", "ring all-gather"):
                sel = {r["preset"]: r["seconds"] for r in rows
                       if r["model"] == model and r["cluster"] == cl and r["schedule"] == sched}
                cells = [f"{sel[p]:.4g}" if p in sel else "-" for p in S.MEASURED_RATIOS]
                out.append(f"| {cl} | {sched} | " + " | ".join(cells) + " |")
        out.append("")
    c = T.CLUSTERS["dgx_ib"](128)
    out.append(f"Bandwidth floor of any fp32 all-reduce of 175B on dgx_ib (2 (M-1)/M n through a node's "
               f"8 NICs): {S.bandwidth_floor(c, 175e9):.2f} s; bf16 gradients: "
               f"{S.bandwidth_floor(c, 175e9, 2):.2f} s.")
    return out


def part_placement() -> list[str]:
    nodes, g = 128, 8
    L, node_of = PL.planted_latency(nodes, g, intra=2e-6, inter=20e-6, seed=0)
    t0 = time.time()
    metis = PL.metis_groups(L, nodes)
    dt = time.time() - t0
    c = T.Cluster(nodes, g, 1e-6, 1 / 450e9, 5e-6, 1 / 50e9, latency=L, node_of=tuple(node_of))
    out = ["", "## 4. Placement: 1024 ranks scattered over 128 nodes (planted latency 2 us inside, "
           "20 us between, +-20% jitter)", "",
           f"METIS (pymetis k-way, {dt:.2f} s) recovers the nodes: "
           f"{PL.same_partition(metis, PL.node_groups(node_of))}. Hierarchical all-reduce, seconds:", "",
           "| groups | toy fp32 (960,640 B) | 175B fp32 | share of bytes between nodes |", "|---|---|---|---|"]
    for name, grp in (("rank order (naive)", PL.naive_groups(nodes * g, g)), ("METIS", metis),
                      ("true nodes", PL.node_groups(node_of))):
        small = T.simulate(T.schedule("hierarchical", c, 960_640, groups=grp), c)
        big = T.simulate(T.schedule("hierarchical", c, 700e9, groups=grp), c)
        out.append(f"| {name} | {small.time * 1e3:.3f} ms | {big.time:.2f} | "
                   f"{big.inter_node_bytes / big.total_bytes:.1%} |")
    flat = T.simulate(T.schedule("ring", c, 700e9), c)
    out.append(f"| (flat ring, rank order) | {T.simulate(T.schedule('ring', c, 960_640), c).time * 1e3:.3f} ms | "
               f"{flat.time:.2f} | {flat.inter_node_bytes / flat.total_bytes:.1%} |")
    return out


def part_value_order(cal: C.Calibration) -> list[str]:
    from grpo_lab.distributed.replay import replay_sharding
    from grpo_lab.training.experiments import record_gradients
    rec = record_gradients(steps=8)
    r = replay_sharding(rec, "size_balanced", 2, 0, "seed")
    nbytes = [4 * s.numel for s in r["shards"]]
    a, b = cal.fits["allreduce p=2"]
    c = T.CLUSTERS["dgx_ib"](128)
    out = ["", "## 5. Value-ordered sends: the toy's shards, seed scores of 8 recorded steps", "",
           f"{len(nbytes)} shards sent one after another; time to the arrival of 50% / 90% of the "
           "total importance, and the total (ms).", "",
           "| link model | order | 50% | 90% | total |", "|---|---|---|---|---|"]
    for label, fn in ((f"gloo p=2 (fit: alpha {a * 1e6:.0f} us)", lambda n: T.ring_time(2, n, a, b)),
                      ("dgx_ib 1024 GPUs, hierarchical", lambda n: T.closed_form("hierarchical", c, n))):
        for order in PL.ORDERS:
            t, share = PL.arrival(nbytes, r["scores"][-1], order, fn)
            out.append(f"| {label} | {order} | {PL.time_to_value(t, share, 0.5) * 1e3:.3f} | "
                       f"{PL.time_to_value(t, share, 0.9) * 1e3:.3f} | {t[-1] * 1e3:.3f} |")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer sizes, repeats and batch sizes")
    ap.add_argument("--only", choices=["overlap"],
                    help="re-run one part and replace its section of RESULTS_topology.md")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    results = Path(__file__).parent / "RESULTS_topology.md"
    if args.only == "overlap":
        old, part = results.read_text(), part_overlap(args.quick)
        start, end = old.index("## 2. Overlap"), old.index("## 3. ")
        results.write_text(old[:start] + "\n".join(part[1:]) + "\n\n" + old[end:])
        print("\n".join(part))
        return
    cmd = "bench/bench_topology.py" + (" --quick" if args.quick else "")
    text, cal = part_calibration(args.quick)
    print("calibration done", flush=True)
    text += part_overlap(args.quick) + part_scale() + part_placement() + part_value_order(cal)
    head = ["# Topology results", "", f"Command: `.venv/bin/python {cmd}` ({time.time() - t0:.0f} s; "
            f"torch {torch.__version__}, 2 shared CPU cores, other jobs running)", ""]
    results.write_text("\n".join(head + text) + "\n")
    print("\n".join(head + text))


if __name__ == "__main__":
    main()
