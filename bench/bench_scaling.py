"""Scaling the one trainer over CPU processes: per-step time and global throughput on 1, 2, 4.

    .venv/bin/python bench/bench_scaling.py [--steps 60] [--out bench/RESULTS_scaling.md]

The demo's GRPO step (16 prompts x G=8 = 128 completions, the same global batch on every N:
results do not depend on N, tests/test_scaling.py) run with exchange allreduce on N gloo
processes of one torch thread each, one after another in one run, plus one process with 2
threads. Reported: median step time of rank 0 (steps after the first 5), completions per
second, speed-up over one 1-thread process, and scaling efficiency = speed-up / N. On a 2-core
machine N = 4 oversubscribes the cores: it shows what happens then, not a scaling limit.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

import torch

from grpo_lab.training.config import preset
from grpo_lab.training.trainer import spawn_train


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--out", default="bench/RESULTS_scaling.md")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench_scaling_")
    load0, t0 = os.getloadavg()[0], time.time()
    rows = []
    for n, threads in [(n, 1) for n in args.procs] + [(1, 2)]:
        cfg = preset("defaults", steps=args.steps, eval_every=0, eval_size=20, time_budget_s=0.0,
                     threads=threads, out_dir=f"{tmp}/{n}-{threads}")
        h = spawn_train([cfg], n)[0][0]["history"]
        times = [m["time/step_s"] for m in h if m["step"] >= 5]
        med = statistics.median(times)
        rows.append(dict(n=n, threads=threads, step=med, tput=128 / med,
                         collect=statistics.median(m["time/rollout_s"] for m in h if m["step"] >= 5),
                         comm=statistics.median(m.get("comm/bytes", 0) for m in h if m["step"] >= 0)))
    ref = rows[0]
    lines = ["# Scaling the trainer over CPU processes", "",
             f"Command: `.venv/bin/python bench/bench_scaling.py --steps {args.steps}`", "",
             f"The demo's GRPO step (16 prompts x G=8 = 128 completions per step, the same global "
             f"batch on every N), exchange allreduce, gloo; median over steps 5..{args.steps - 1} "
             f"of rank 0. {os.cpu_count()} cores, **shared with other jobs** (load {load0:.1f} at "
             f"the start, {os.getloadavg()[0]:.1f} at the end); torch {torch.__version__}, "
             f"{platform.machine()}; whole bench {time.time() - t0:.0f} s.", "",
             "| processes x threads | s/step | of which collect | completions/s | speed-up | "
             "efficiency (speed-up / N) | bytes/step per rank |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        sp = ref["step"] / r["step"]
        lines.append(f"| {r['n']} x {r['threads']} | {r['step']:.3f} | {r['collect']:.3f} "
                     f"| {r['tput']:.0f} | {sp:.2f}x | {sp / r['n']:.2f} | {r['comm']:,.0f} |")
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
