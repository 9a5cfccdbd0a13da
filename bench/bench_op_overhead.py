"""What one torch op costs on a CPU whatever its size: the per-call time of the fast path's ops
(add_, abs, max, a compare, nonzero, index_select, index_fill_) on 16 and on 4,096 float32
elements, one thread, median of many calls. distributed/kernels.py and
docs/reference/dependencies.md quote it; the results file names the CPU (lscpu) and the load.

    PYTHONPATH=. OMP_NUM_THREADS=1 python bench/bench_op_overhead.py --out bench/RESULTS_op_overhead.md
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time

import torch


def cpu_line() -> str:
    """lscpu's model name and the SIMD flags that decide CPU speed here; 'unknown' off Linux."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return f"unknown ({platform.processor() or platform.machine()})"
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    model = fields.get("Model name", "?").strip()
    flags = [f for f in fields.get("Flags", "").split()
             if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx_vnni")]
    cores = fields.get("CPU(s)", "?").strip()
    return f"`lscpu` \"{model}\", {cores} cores, flags {' '.join(flags) or 'none of avx2/avx512/amx'}"


def load_average() -> tuple:
    """The 1, 5 and 15-minute load averages; NaN where the OS has none (Windows)."""
    return os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3


def per_call_us(fn, calls: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean time of ``calls`` calls, in microseconds."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", default="")
    a = p.parse_args()
    torch.set_num_threads(1)
    load0 = load_average()
    rows = []
    for n in (16, 4096):
        x = torch.randn(n)
        r = torch.zeros(n)
        idx = torch.arange(0, n, 4)
        ops = {"add_": lambda: r.add_(x), "abs": lambda: x.abs(), "max": lambda: x.max(),
               "compare (>)": lambda: x > 0.5, "nonzero": lambda: (x > 0.5).nonzero(),
               "index_select": lambda: x.index_select(0, idx), "index_fill_": lambda: r.index_fill_(0, idx, 0.0)}
        for name, fn in ops.items():
            fn()                                                   # warm up
            rows.append((name, n, per_call_us(fn, a.calls, a.repeats)))
    load1 = load_average()
    lines = ["# What one torch op costs on this CPU", "",
             f"Command: `PYTHONPATH=. OMP_NUM_THREADS=1 python bench/bench_op_overhead.py --calls {a.calls} "
             f"--repeats {a.repeats}`; torch {torch.__version__}, one thread.", "",
             f"Machine: {cpu_line()}; load average (1 min) {load0[0]:.2f} at the start, {load1[0]:.2f} at the end "
             "(a shared machine: other jobs ran beside it).", "",
             "| op | elements | us per call (median of the repeats' means) |", "|---|---:|---:|"]
    lines += [f"| {name} | {n:,} | {us:.1f} |" for name, n, us in rows]
    small = [us for _, n, us in rows if n == 16]
    lines += ["", f"On 16 elements, where the work is nothing, one op costs {min(small):.1f}-{max(small):.1f} us."]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
