"""Memory levers (issue 14): what each TrainConfig switch saves and costs, measured.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/bench_memory.py \
        [--seeds 0 1 2] [--reps 7] [--steps 8] [--out bench/RESULTS_memory.md]

Three tables, every number measured in this run:

A. The default GRPO step of the toy policy (``tiny_cpu``: 3 blocks, 16 prompts x 8, the base
   policy), one variant per lever: checkpoint_every 1/2/3, micro_batches 2/4, autocast,
   beta 0 (no reference policy). Per variant, on the same collected batch of each seed:
   ``saved``: bytes autograd saves for backward (``memory.saved_bytes``; the largest
   micro-batch's), ``peak``: most tensor bytes alive during the objective's forward and
   backward (``memory.PeakMemory``, every micro-batch; deterministic), ``update``: time of that
   forward + backward, variants interleaved ``--reps`` times, median, as a ratio to the
   default's median of the same round. ``state``: weights + grads + AdamW moments (+ the
   reference's weights when beta > 0), bytes of the tensors. ``RSS``: a fresh process per
   (seed, variant) runs ``--steps`` steps of ``trainer.train`` (no evaluation): peak RSS
   (ru_maxrss) less the RSS after imports; ``step``: median ``time/step_s`` (rollout included)
   as a ratio to the default's (processes interleaved: seed by seed, every variant).
B. A deeper toy: 16 blocks, random weights, next-token cross-entropy on random tokens (rows x
   24), two batch sizes. ``every k``: the config field (block i checkpointed when i % k == 0,
   transformers' every_n_layers); ``segments of s``: Chen et al. 2016's scheme (consecutive
   runs of s blocks under one checkpoint: keeps 16/s inputs, recomputes s blocks at a time),
   built here from the same blocks. Peak bytes and time ratio to no checkpointing.
C. The tiny transformers model (data/hf_tiny, 3 layers) on its preset's step: checkpoint_every
   0-3 through transformers' every_n_layers.
Intervals: mean and 95% t-interval over seeds (``experiments.mean_ci``).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from grpo_lab.training.config import preset
from grpo_lab.training.experiments import mean_ci
from grpo_lab.policies.memory import (peak_bytes, reset_peak_rss, rss_bytes, saved_bytes,
                                      tensor_bytes)
from grpo_lab.policies.model import GPT, GPTConfig
from grpo_lab.policies.policy import load_for
from grpo_lab.training.step import backward, get_objective, split_batch
from grpo_lab.training.trainer import setup, train

VARIANTS = {                       # TrainConfig overrides of tiny_cpu (beta 0.02 by default)
    "default": {},
    "checkpoint_every 1": {"checkpoint_every": 1},
    "checkpoint_every 2": {"checkpoint_every": 2},
    "checkpoint_every 3": {"checkpoint_every": 3},
    "micro_batches 2": {"micro_batches": 2},
    "micro_batches 4": {"micro_batches": 4},
    "autocast bf16": {"autocast": True},
    "beta 0 (no reference)": {"kl": {"beta": 0.0}},
}
MB = 1e6


def step_batch(c):
    """The first step's batch as the trainer collects it (trainer.setup: the reference when
    the objective uses one and beta > 0)."""
    run = setup(c)
    return run.objective.collect(run.policy, c, 0, run.ctx), run.ctx.ref


def state_bytes(policy, ref) -> int:
    """Weights + gradients + AdamW's moments after one step (+ the reference's weights)."""
    for p in policy.parameters():
        p.grad = torch.zeros_like(p)
    adam = torch.optim.AdamW(policy.parameters())
    adam.step()
    held = [*policy.parameters(), *(p.grad for p in policy.parameters()),
            *(t for s in adam.state.values() for t in s.values()),
            *(ref.parameters() if ref is not None else ())]
    policy.zero_grad(set_to_none=True)
    return tensor_bytes(held)


def interleaved_times(jobs: dict, reps: int) -> dict:
    """{name: fn} -> {name: [seconds per rep]}, the jobs run round-robin ``reps`` times."""
    times = {n: [] for n in jobs}
    for _ in range(reps):
        for n, fn in jobs.items():
            t = time.perf_counter()
            fn()
            times[n].append(time.perf_counter() - t)
    return times


def ratios(times: dict, base: str) -> dict:
    return {n: statistics.median(t) / statistics.median(times[base]) for n, t in times.items()}


def ci_text(values, fmt="{:.2f}") -> str:
    """Mean [95% interval] over seeds; the mean alone when every seed gave the same number."""
    m, lo, hi = mean_ci(values)
    same = max(values) - min(values) <= 1e-9 * max(1.0, abs(m))
    return fmt.format(m) + ("" if same else f" [{fmt.format(lo)}, {fmt.format(hi)}]")


# ---- A: the levers on the default GRPO step

def table_a(seeds, reps):
    rows = {n: {"saved": [], "peak": [], "update": [], "state": []} for n in VARIANTS}
    for seed in seeds:
        base = preset("defaults", seed=seed, threads=1)
        batch, ref = step_batch(base)
        jobs = {}
        for name, kw in VARIANTS.items():
            c = preset("defaults", seed=seed, threads=1, **kw)
            policy = load_for(c)
            b = batch if c.kl.beta else batch._replace(rows={})
            objective = get_objective(c.objective).loss
            parts = split_batch(b, c.micro_batches)
            params = list(policy.parameters())
            rows[name]["saved"].append(max(saved_bytes(lambda: objective(policy, p, c), params)
                                           for p in parts))

            def update(policy=policy, parts=parts, c=c, objective=objective):
                policy.zero_grad(set_to_none=True)
                backward(objective, policy, parts, c)
            rows[name]["peak"].append(peak_bytes(update)[0])
            rows[name]["state"].append(state_bytes(policy, ref if c.kl.beta else None))
            jobs[name] = update
        for name, r in ratios(interleaved_times(jobs, reps), "default").items():
            rows[name]["update"].append(r)
    return rows


def child(args) -> None:
    """One fresh process: --steps training steps of one variant -> JSON on stdout. The peak
    RSS is reset after the first step (``memory.reset_peak_rss``), so ``rss_growth`` is how far
    the later steps rise above the RSS they start from: their activations and temporaries."""
    kw, seen = json.loads(args.child), {}

    def reset(metrics, policy):
        if metrics["step"] == 0:
            seen["peak0"] = rss_bytes(peak=True)
            reset_peak_rss()
            seen["rss"] = rss_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        c = preset("defaults", steps=args.steps, eval_size=0, eval_every=0, time_budget_s=0.0,
                   threads=1, out_dir=tmp, ckpt_every=10 ** 6, **kw)
        hist = train(c, progress=False, on_step=reset)
    print(json.dumps({"peak0": seen["peak0"], "rss": seen["rss"], "rss_growth": rss_bytes(peak=True) - seen["rss"],
                      "step_s": statistics.median(h["time/step_s"] for h in hist[2:])}))


def rss_runs(seeds, steps) -> dict:
    out = {n: {"peak0": [], "rss": [], "growth": [], "step": []} for n in VARIANTS}
    for seed in seeds:
        got = {}
        for name, kw in VARIANTS.items():
            cmd = [sys.executable, __file__, "--steps", str(steps),
                   "--child", json.dumps({**kw, "seed": seed})]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True,
                                 env={**os.environ, "OMP_NUM_THREADS": "1"})
            got[name] = json.loads(res.stdout.strip().splitlines()[-1])
        for name, g in got.items():
            out[name]["peak0"].append(g["peak0"])
            out[name]["rss"].append(g["rss"])
            out[name]["growth"].append(g["rss_growth"])
            out[name]["step"].append(g["step_s"] / got["default"]["step_s"])
    return out


# ---- B: a deeper toy, the config's every-k rule and Chen et al.'s segments

class Segment(nn.Module):
    """s consecutive blocks as one block (GPT.forward then checkpoints it as one)."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x, mask, past):
        for b in self.blocks:
            x, _ = b(x, mask, None)
        return x, None


def segmented(model: GPT, s: int) -> GPT:
    m = copy.deepcopy(model)
    n = len(m.blocks)
    m.blocks = nn.ModuleList(Segment(list(m.blocks[i:i + s])) for i in range(0, n, s))
    m.checkpoint_every = 1
    return m


def table_b(seeds, reps, n_layer=16, sizes=(32, 128), T=24):
    ks, ss = (0, 1, 2, 3, 4, 8, 16), (1, 2, 3, 4, 8, 16)
    out = {}
    for seed in seeds:
        torch.manual_seed(seed)
        base = GPT(GPTConfig(n_layer=n_layer))
        models = {f"every {k}": base for k in ks}
        models.update({f"segments of {s}": segmented(base, s) for s in ss})
        for N in sizes:
            ids = torch.randint(0, base.cfg.vocab_size, (N, T))               # (N, T)
            jobs = {}
            for name, m in models.items():
                k = int(name.split()[-1]) if name.startswith("every") else 1

                def run(m=m, k=k):
                    m.checkpoint_every = k
                    m.zero_grad(set_to_none=True)
                    logits, _ = m(ids)                                         # (N, T, V)
                    F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                    ids[:, 1:].reshape(-1)).backward()
                r = out.setdefault((N, name), {"peak": [], "time": []})
                r["peak"].append(peak_bytes(run)[0])
                jobs[name] = run
            for name, ratio in ratios(interleaved_times(jobs, reps), "every 0").items():
                out[(N, name)]["time"].append(ratio)
    return out


# ---- C: the tiny transformers model

def table_c(seeds, reps):
    rows = {k: {"saved": [], "peak": [], "update": []} for k in (0, 1, 2, 3)}
    for seed in seeds:
        base = preset("hf_tiny_cpu", seed=seed, threads=1, kl={"beta": 0.0})
        batch, _ = step_batch(base)
        jobs = {}
        for k in rows:
            c = preset("hf_tiny_cpu", seed=seed, threads=1, kl={"beta": 0.0}, checkpoint_every=k)
            policy = load_for(c)
            objective = get_objective("grpo").loss
            rows[k]["saved"].append(saved_bytes(lambda: objective(policy, batch, c),
                                                list(policy.parameters())))

            def update(policy=policy, c=c):
                policy.zero_grad(set_to_none=True)
                backward(objective, policy, [batch], c)
            rows[k]["peak"].append(peak_bytes(update)[0])
            jobs[k] = update
        for k, r in ratios(interleaved_times(jobs, reps), 0).items():
            rows[k]["update"].append(r)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default="bench/RESULTS_memory.md")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.child:
        return child(args)
    t0, load0 = time.time(), os.getloadavg()[0]
    a, runs = table_a(args.seeds, args.reps), rss_runs(args.seeds, args.steps)
    b, c = table_b(args.seeds, args.reps), table_c(args.seeds, args.reps)
    write(args, a, runs, b, c, time.time() - t0, load0, os.getloadavg()[0])


def pct(values, base) -> str:
    """Mean change against ``base`` (per seed), in percent, with its interval."""
    return ci_text([100 * (v / b - 1) for v, b in zip(values, base)], "{:+.0f}%")


def write(args, a, runs, b, c, wall, load0, load1):
    d = a["default"]
    lines = [
        "# Memory levers (issue 14)", "",
        "Command: `PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/bench_memory.py "
        f"--seeds {' '.join(map(str, args.seeds))} --reps {args.reps} --steps {args.steps}`", "",
        f"torch {torch.__version__}, {platform.machine()}, 1 thread, on a 2-core machine shared "
        f"with other jobs (1-minute load {load0:.1f} at the start, {load1:.1f} at the end); "
        f"whole bench {wall:.0f} s. Memory columns count tensors (deterministic); RSS is the "
        f"process's. Each cell: mean over seeds {args.seeds} with its 95% t-interval "
        "[low, high] (no interval: every seed gave that number); a ratio or change is per seed "
        "against the default of the same seed.", "",
        "## A. The default GRPO step (toy, 3 blocks, 16 prompts x 8)", "",
        "Saved: `memory.saved_bytes` of the objective's forward (the largest micro-batch's). "
        "Peak: `memory.PeakMemory` over the objective's forward and backward (every micro-batch), "
        "tensors created in it, gradients included. Weights+grads+AdamW+ref: bytes of those "
        "tensors after one AdamW step. RSS: a fresh process per (seed, variant) trains "
        f"{args.steps} steps (no evaluation): its peak RSS (VmHWM) through step 0, then the peak "
        "reset (`memory.reset_peak_rss`) and the rise above the RSS after step 0 over the later "
        "steps. Update time: the objective's forward + backward on the collected batch, variants "
        f"interleaved {args.reps} times, median, over the default's. Step time: the fresh "
        "processes' median `time/step_s` (rollout included) over the default's.", "",
        "| variant | saved for backward (MB) | vs default | peak fwd+bwd (MB) | vs default "
        "| weights+grads+AdamW+ref (MB) | peak RSS to step 0 (MB) | RSS rise in steps 1+ (MB) "
        "| update time vs default | step time vs default |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in a.items():
        lines.append(
            f"| {name} | {ci_text([x / MB for x in r['saved']])} | {pct(r['saved'], d['saved'])} "
            f"| {ci_text([x / MB for x in r['peak']])} | {pct(r['peak'], d['peak'])} "
            f"| {ci_text([x / MB for x in r['state']])} "
            f"| {ci_text([x / MB for x in runs[name]['peak0']], '{:.1f}')} "
            f"| {ci_text([x / MB for x in runs[name]['growth']], '{:.1f}')} "
            f"| {ci_text(r['update'])} | {ci_text(runs[name]['step'])} |")
    lines += ["", "## B. A 16-block toy (random weights), rows x 24 tokens", "",
              "| scheme | rows | peak fwd+bwd (MB) | vs none | time vs none |", "|---|---|---|---|---|"]
    for (N, name), r in b.items():
        lines.append(f"| {name} | {N} | {ci_text([x / MB for x in r['peak']])} "
                     f"| {pct(r['peak'], b[(N, 'every 0')]['peak'])} | {ci_text(r['time'])} |")
    lines += ["", "## C. data/hf_tiny (3 layers, transformers every_n_layers), 16 prompts x 8", "",
              "| checkpoint_every | saved (MB) | peak (MB) | vs 0 | update time vs 0 |",
              "|---|---|---|---|---|"]
    for k, r in c.items():
        lines.append(f"| {k} | {ci_text([x / MB for x in r['saved']])} "
                     f"| {ci_text([x / MB for x in r['peak']])} | {pct(r['peak'], c[0]['peak'])} "
                     f"| {ci_text(r['update'])} |")
    lines += ["", "## Verdicts (one line per claim)", ""] + verdicts(a, b, c)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def verdicts(a, b, c) -> list[str]:
    """The claims of data/claims.md this bench measures, each with its number."""
    d, one = a["default"], a["checkpoint_every 1"]
    big = max(N for N, _ in b)
    best = {N: min((name for M, name in b if M == N and name.startswith("segments")),
                   key=lambda name: statistics.mean(b[(N, name)]["peak"])) for N, _ in b}
    none = b[(big, "every 0")]
    return [
        f"- Claim 15 (gradient checkpointing \"-40% memory\"): checkpointing every block of the "
        f"toy's GRPO step changes peak forward+backward tensor memory by "
        f"{pct(one['peak'], d['peak'])} and the bytes saved for backward by "
        f"{pct(one['saved'], d['saved'])}, for {ci_text(one['update'])}x the update time; "
        f"on the 16-block toy ({big} rows) peak {pct(b[(big, 'every 1')]['peak'], none['peak'])} "
        f"for {ci_text(b[(big, 'every 1')]['time'])}x the time; on data/hf_tiny peak "
        f"{pct(c[1]['peak'], c[0]['peak'])} for {ci_text(c[1]['update'])}x.",
        "- Claim 22 (\"every 4 layers: memory -60%, compute +12%\"), 16 blocks: " + "; ".join(
            f"{N} rows: every 4th block checkpointed: peak "
            f"{pct(b[(N, 'every 4')]['peak'], b[(N, 'every 0')]['peak'])}, time "
            f"{ci_text(b[(N, 'every 4')]['time'])}x; segments of 4 blocks (Chen et al.): peak "
            f"{pct(b[(N, 'segments of 4')]['peak'], b[(N, 'every 0')]['peak'])}, time "
            f"{ci_text(b[(N, 'segments of 4')]['time'])}x" for N in sorted(best)) + ".",
        "- Claim 9 (\"checkpoint interval = sqrt(batch size)\"), 16 blocks: the segment length "
        "with the least peak memory is " + ", ".join(
            f"{best[N].split()[-1]} at {N} rows (sqrt(rows) = {N ** 0.5:.1f})" for N in sorted(best))
        + f"; sqrt(layers) = {16 ** 0.5:.0f}. " + (
            "It does not move with the batch size (a block's inputs and its activations both "
            "grow with the rows, so the batch cancels): not sqrt(batch size). "
            if len(set(best.values())) == 1 else "It moved with the batch size. ") + (
            "It is 1, not sqrt(layers) either: a transformer block's activations are many "
            "times its input, so keeping every block's input is cheapest (Chen et al.'s "
            "sqrt(n) assumes a layer's activations cost what its output does)."
            if set(best.values()) == {"segments of 1"} else ""),
    ]


if __name__ == "__main__":
    main()
