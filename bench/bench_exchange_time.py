"""One gradient exchange on 2 gloo processes, plain and compressed, against the calculator.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_exchange_time.py   # writes bench/RESULTS_exchange_time.md

The toy policy's gradient shapes (240,160 fp32 values, 49 tensors, random values), exchanged
by: the plain fp32 ``all_reduce`` of one flat tensor; ``comm.compressed_all_reduce`` with the
``fp8_topk5`` preset (readable path), ``fp8_topk5_fast`` (the same algorithm through the fast
path) and ``fast_topk5``. Each repeat times every exchange once, in turn (interleaved, so a
burst of load hits all of them); each figure is the minimum over the repeats of rank 0's time
(the least disturbed). Beside each, ``scaling.compression_pays``'s prediction for this
machine's gloo link (``scaling.LINKS``) with the codec timed here on one process (encode of
the message, decode of both messages). The machine is shared: read ratios, not absolutes.
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import torch

PRESETS = ("fp8_topk5", "fp8_topk5_fast", "fast_topk5")


def toy_grads(seed: int) -> dict:
    from grpo_lab.training.overlap_timing import toy_policy
    model, _ = toy_policy()
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(p.shape, generator=g) * 1e-3 for n, p in model.named_parameters()}


def _worker(rank: int, world: int, repeats: int) -> dict:
    import torch.distributed as dist

    from grpo_lab.distributed import comm
    from grpo_lab.distributed.compression import Compressor
    torch.set_num_threads(1)
    grads = toy_grads(rank)
    flat = torch.cat([g.reshape(-1) for g in grads.values()])
    comps = {p: Compressor(p, seed=rank) for p in PRESETS}
    runs = {"allreduce fp32": lambda: dist.all_reduce(flat.clone()),
            **{f"compressed {p}": (lambda c=c: comm.compressed_all_reduce(grads, c))
               for p, c in comps.items()}}
    times = {name: [] for name in runs}
    for r in range(repeats + 1):
        for name, fn in runs.items():
            dist.barrier()
            t = time.perf_counter()
            fn()
            if r:                                                          # r = 0: warm-up
                times[name].append(time.perf_counter() - t)
    return {name: min(ts) for name, ts in times.items()}


def codec_times(preset: str, repeats: int) -> tuple[float, float, float]:
    """(ratio, encode s, decode s of one message) on this process, the toy's gradient."""
    from grpo_lab.distributed.compression import Compressor, decode_message, get_config
    grads = toy_grads(0)
    comp = Compressor(preset)
    msg = comp.encode(grads)
    fast = get_config(preset).fast
    best = {"enc": float("inf"), "dec": float("inf")}
    for _ in range(repeats):
        t = time.perf_counter()
        msg = comp.encode(grads)
        best["enc"] = min(best["enc"], time.perf_counter() - t)
        t = time.perf_counter()
        decode_message(msg, fast)
        best["dec"] = min(best["dec"], time.perf_counter() - t)
    numel = sum(g.numel() for g in grads.values())
    return 4 * numel / len(msg), best["enc"], best["dec"]


def main() -> None:
    from grpo_lab.distributed.launch import spawn
    from grpo_lab.distributed.scaling import LINKS, Codec, compression_pays
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_exchange_time.md")))
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0, load0 = time.time(), os.getloadavg()[0]
    measured = spawn(_worker, 2, (args.repeats,), backend="gloo", run_timeout_s=900)[0]
    numel = sum(g.numel() for g in toy_grads(0).values())
    link = LINKS["gloo (this machine)"]
    rows = ["| exchange | measured ms (min of repeats) | vs fp32 | ratio | encode ms | decode ms "
            "| predicted ms | predicted verdict |", "|---|---|---|---|---|---|---|---|"]
    plain = measured["allreduce fp32"]
    rows.append(f"| allreduce fp32 | {1e3 * plain:.2f} | 1.00x | 1.0x | | | "
                f"{1e3 * compression_pays(numel, link, Codec(1, 1, 1), 2).plain_s:.2f} | |")
    for p in PRESETS:
        ratio, te, td = codec_times(p, args.repeats)
        v = compression_pays(numel, link, Codec(ratio, 4 * numel / te, 4 * numel / td), 2)
        m = measured[f"compressed {p}"]
        rows.append(f"| compressed {p} | {1e3 * m:.2f} | {m / plain:.2f}x | {ratio:.1f}x | "
                    f"{1e3 * te:.2f} | {1e3 * td:.2f} | {1e3 * v.compressed_s:.2f} | "
                    f"{'pays' if v.pays else 'loses'} (break-even {v.break_even_bandwidth / 1e9:.2f} GB/s) |")
    text = "\n".join([
        "# One gradient exchange, plain and compressed, on 2 gloo processes", "",
        "Produced by:", "", "    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_exchange_time.py"
        + (f" --repeats {args.repeats}" if args.repeats != 30 else ""), "",
        f"{platform.machine()}, torch {torch.__version__}, one thread per process; load average "
        f"{load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; {time.time() - t0:.0f} s. "
        f"The toy's {numel:,} fp32 gradient values; predictions: scaling.compression_pays on "
        f"the link {link.name} ({1e6 * link.alpha:.0f} us, {link.bandwidth / 1e9:.1f} GB/s) with "
        f"the codec timed on one process.", "", *rows, ""])
    print(text)
    Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
