"""Measurements the claims table (grpo_lab.teaching.claims) quotes that need real gradients or seeds.

  * claim 3: bits per index of the top 5% of real toy-policy gradients, chosen over the whole
    model ("global") and per tensor (the fp8_topk5 protocol), for each index codec, beside the
    bound for random positions;
  * claim 2: e4m3 round-trip error per tensor of the same gradients;
  * claim 16: bytes of a dense fp32, fp16 and 8-bit (e4m3) message of one real gradient, as
    ``compression.Compressor`` produces them (headers and scales included);
  * claim 29: the trace of the policy gradient's covariance with no baseline, the group mean as
    baseline and GRPO's (r - mean) / std, on the same samples, over seeds (``baseline_variance``).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/bench_claims.py     # about 1 min
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

from grpo_lab.teaching import claims_bytes, claims_gradient
from grpo_lab.training.experiments import mean_ci

CODECS = ("huffman", "rice", "ans", "zstd")


def rng(values, fmt=".2f") -> str:
    return f"{min(values):{fmt}}-{max(values):{fmt}}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gradients", type=int, default=5, help="supervised steps recorded")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--draws", type=int, default=32, help="gradient estimates per seed (claim 29)")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per draw (claim 29), G = 8")
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_claims.md")))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    grads = claims_bytes.real_gradients(args.gradients)
    bits = [claims_bytes.topk_index_bits(g) for g in grads]
    errs = [sorted(claims_bytes.fp8_errors(g).values()) for g in grads]
    sizes = claims_bytes.exchange_bytes(grads[-1])
    var = {s: claims_gradient.baseline_variance(seed=s, prompts=args.prompts, draws=args.draws) for s in args.seeds}
    cmd = "PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/bench_claims.py " + \
        " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    n, k = bits[0]["n"], bits[0]["k"]
    lines = ["# Measurements for the claims table", "", "```", cmd.strip(), "```", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
             f"one thread; load average {load0:.1f} at the start; {time.perf_counter() - t0:.0f} s.", "",
             f"## Claim 3: top-5% indices of {len(grads)} real gradients", "",
             f"The toy policy's gradients of {len(grads)} supervised steps from the base checkpoint "
             f"(`experiments.record_gradients`), n = {n:,} elements, k = {k:,} (5%). Global: the top 5% "
             "over the whole model, one index set; per tensor: each tensor's own top 5% (what the "
             "`fp8_topk5` protocol sends), bytes summed. Bits per index, min-max over the gradients; "
             "vs int32 = 32 / bits.", "",
             "| selection | " + " | ".join(CODECS) + " | bound for random positions |",
             "|---|" + "---|" * (len(CODECS) + 1)]
    bound = bits[0]["bound"]
    for sel in ("global", "per_tensor"):
        cells = [f"{rng([b[sel][c] for b in bits])} ({rng([32 / b[sel][c] for b in bits], '.1f')}x)"
                 for c in CODECS]
        lines.append(f"| {sel} | " + " | ".join(cells) + f" | {bound:.2f} ({32 / bound:.1f}x) |")
    share = [b["share_top_tensor"] for b in bits]
    zg, hg = [b["global"]["zstd"] for b in bits], [b["global"]["huffman"] for b in bits]
    lines += ["", f"The busiest tensor holds {rng(share, '.0%')} of the global top 5%: the positions "
              f"cluster. Claim 3 verdict line: whole-model top 5%: zstd {rng(zg)} bits/index "
              f"({rng([32 / z for z in zg], '.1f')}x vs int32), Huffman {rng(hg)} bits "
              f"({rng([32 / h for h in hg], '.1f')}x); per tensor: every codec "
              f"{rng([b['per_tensor'][c] for b in bits for c in CODECS])} bits; random positions: "
              f"at least {bound:.2f} bits ({32 / bound:.1f}x).", "",
              "## Claim 2: e4m3 round trip per tensor (one scale per tensor)", "",
              f"Relative L2 error over the {len(errs[0])} non-zero tensors of each gradient: median "
              f"{rng([float(np.median(e)) for e in errs], '.1%')}, smallest {rng([e[0] for e in errs], '.1%')}, "
              f"largest {rng([e[-1] for e in errs], '.1%')} (claimed < 0.3%).", "",
              "## Claim 16: bytes of one dense message of a real gradient", "",
              "| format | bytes | vs fp32 |", "|---|---|---|"]
    for f, b in sizes.items():
        lines.append(f"| {f} | {b:,} | {b / sizes['fp32'] - 1:+.1%} |")
    lines += ["", f"Claim 16 verdict line: an 8-bit (e4m3) message of the whole gradient is "
              f"{1 - sizes['e4m3'] / sizes['fp32']:.1%} smaller than fp32, fp16 "
              f"{1 - sizes['fp16'] / sizes['fp32']:.1%} (headers and per-tensor scales included).", "",
              "## Claim 29: gradient variance with and without a group baseline", "",
              f"Base toy policy, {args.prompts} addition prompts (fixed per seed: a seed is a prompt set) "
              f"x G = 8, temperature 0.7, the defaults' rewards, {args.draws} draws per seed; on each "
              "draw's samples the gradient of `grpo_loss` (beta 0, at pi = pi_old, tokens summed over a "
              "constant: the dr_grpo aggregation) with three advantages: the reward (no baseline), reward "
              "minus the group mean, GRPO's (r - mean) / std. var: trace of the gradient's covariance over "
              "the draws; noise/signal: var / ||mean gradient||^2 (GRPO's scale differs, so compare it "
              "on this); scale: the group-mean estimate's mean gradient along no-baseline's (expected "
              "(G-1)/G = 0.875: the baseline leaves the direction, shrinks the length).", "",
              "| seed | var, no baseline | var, group mean | ratio | scale | noise/signal: none | group mean | grpo |",
              "|---|---|---|---|---|---|---|---|"]
    ratios = []
    for s, v in var.items():
        ratios.append(v["group mean"]["var"] / v["none"]["var"])
        lines.append(f"| {s} | {v['none']['var']:.3f} | {v['group mean']['var']:.3f} | {ratios[-1]:.2f} | "
                     f"{v['group mean']['scale_vs_none']:.2f} | "
                     + " | ".join(f"{v[b]['noise_to_signal']:.3f}" for b in claims_gradient.BASELINES) + " |")
    lr = [float(np.log(r)) for r in ratios]
    m, lo, hi = mean_ci(lr)
    nsr = {b: mean_ci([var[s][b]["noise_to_signal"] for s in var]) for b in claims_gradient.BASELINES}
    lower = sum(r < 1 for r in ratios)
    lines += ["", f"Claim 29 verdict line: the group-mean baseline multiplies the gradient's variance by "
              f"{np.exp(m):.2f} [{np.exp(lo):.2f}, {np.exp(hi):.2f}] (geometric mean over {len(ratios)} prompt "
              f"sets, 95% t-interval of the log-ratio; lower in {lower} of {len(ratios)}, per set "
              f"{rng(ratios)}"
              f"); noise/signal {nsr['none'][0]:.2f} without a baseline, "
              f"{nsr['group mean'][0]:.2f} with the group mean, {nsr['grpo'][0]:.2f} with GRPO's advantage."]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
