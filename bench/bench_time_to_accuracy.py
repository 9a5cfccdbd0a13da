"""Time to accuracy: steps and seconds until held-out greedy accuracy first reaches 85% / 90%.

Each variant is TrainConfig overrides of the field defaults ("defaults" preset), run over
several seeds by ``experiments.run_experiment`` (the one trainer, one thread per run, runs
in parallel worker processes). Per variant: steps to each target (mean and 95% t-interval
over the seeds that reached it, and how many did), the training seconds at that evaluation,
the median seconds per step, and the last and best evaluation.

Seconds measured with runs in parallel on a shared machine are not idle seconds; the steps
are the same whatever the load (a run's tokens depend only on (seed, step)). So a variant's
seconds on an idle machine are estimated here as steps x its idle s/step, which
``--time_steps`` measures side by side in one process (variants interleaved, median), and the
demo itself is then timed on the idle machine (BENCHMARKS.md).

    python bench/bench_time_to_accuracy.py --variants baseline,fast --seeds 0 1 2
    python bench/bench_time_to_accuracy.py --variants baseline,fast --time_steps 60
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from grpo_lab.training.config import PRESETS, preset  # noqa: E402
from grpo_lab.training.experiments import mean_ci, run_experiment, time_to_target  # noqa: E402
from grpo_lab.training.trainer import train  # noqa: E402

# The variants measured (BENCHMARKS.md section 13); overrides of the field defaults.
OLD_DEMO = dict(lr=1e-4, steps=3000, kl={"beta": 0.02}, warmup_steps=20, lr_schedule="cosine",
                prompts_per_step=16, group_size=8, temperature=0.7, mu=1)
VARIANTS = {
    "baseline": OLD_DEMO,                                           # the demo before issue 13
    "beta0": {**OLD_DEMO, "kl": {"beta": 0.0}},
    "lr2e-4": {**OLD_DEMO, "lr": 2e-4},
    "lr2e-4_beta0": {**OLD_DEMO, "lr": 2e-4, "kl": {"beta": 0.0}},
    "lr3e-4_beta0": {**OLD_DEMO, "lr": 3e-4, "kl": {"beta": 0.0}},
    "cos1500": {**OLD_DEMO, "steps": 1500},
    "cos1500_lr2e-4_beta0": {**OLD_DEMO, "steps": 1500, "lr": 2e-4, "kl": {"beta": 0.0}},
    "mu2": {**OLD_DEMO, "mu": 2},
    "mu2_beta0": {**OLD_DEMO, "mu": 2, "kl": {"beta": 0.0}},
    "B32_lr2e-4_beta0": {**OLD_DEMO, "prompts_per_step": 32, "lr": 2e-4, "kl": {"beta": 0.0}},
    "G16_B8_beta0": {**OLD_DEMO, "prompts_per_step": 8, "group_size": 16, "kl": {"beta": 0.0}},
    "T1.0_beta0": {**OLD_DEMO, "temperature": 1.0, "kl": {"beta": 0.0}},
    "T0.5_beta0": {**OLD_DEMO, "temperature": 0.5, "kl": {"beta": 0.0}},
    "dapo_beta0": {**OLD_DEMO, "kl": {"beta": 0.0}, "dynamic": {"sampling": True}},
    "tokmean_beta0": {**OLD_DEMO, "kl": {"beta": 0.0}, "loss": {"aggregation": "token_mean"}},
    "dr_grpo_beta0": {**OLD_DEMO, "kl": {"beta": 0.0}, "advantage": "dr_grpo",
                      "loss": {"aggregation": "dr_grpo"}},
    "no_partial_beta0": {**OLD_DEMO, "kl": {"beta": 0.0},
                         "reward_weights": {"accuracy": 1.0, "format": 0.1}},
    "demo": {k: v for k, v in PRESETS["tiny_cpu"].items() if k != "target_accuracy"},  # now
}
NEW_DEMO = {**OLD_DEMO, "lr": 3e-4, "kl": {"beta": 0.0}}         # = "lr3e-4_beta0" = "demo"
VARIANTS.update({                                        # one change each against the new demo
    "demo_mu2": {**NEW_DEMO, "mu": 2},
    "demo_G16_B8": {**NEW_DEMO, "prompts_per_step": 8, "group_size": 16},
    "demo_B32": {**NEW_DEMO, "prompts_per_step": 32},
    "demo_T1.0": {**NEW_DEMO, "temperature": 1.0},
    "demo_dapo": {**NEW_DEMO, "dynamic": {"sampling": True}},
    "demo_dr_grpo": {**NEW_DEMO, "advantage": "dr_grpo", "loss": {"aggregation": "dr_grpo"}},
    "demo_token_mean": {**NEW_DEMO, "loss": {"aggregation": "token_mean"}},
    "demo_accuracy_only": {**NEW_DEMO, "reward_weights": {"accuracy": 1.0, "format": 0.1}},
})


def summarize(res, targets) -> list[dict]:
    """Results -> one row per variant: steps/seconds to each target, last/best accuracy."""
    rows = []
    for s in res.strategies:
        runs = [r for r in res.runs if r["strategy"] == s]
        row = {"variant": s, "seeds": [r["seed"] for r in runs]}
        for t in targets:
            hits = [time_to_target(r["history"], t) for r in runs]
            row[t] = {"steps": [h[0] for h in hits], "seconds": [h[1] for h in hits]}
        evals = [[h["eval/accuracy"] for h in r["history"] if "eval/accuracy" in h] for r in runs]
        row["base"] = [e[0] for e in evals]
        row["last"] = [e[-1] for e in evals]
        row["best"] = [max(e) for e in evals]
        row["s_per_step"] = statistics.median(
            h["time/step_s"] for r in runs for h in r["history"] if "time/step_s" in h)
        rows.append(row)
    return rows


def _ci(values, fmt=".0f") -> str:
    got = [v for v in values if v is not None]
    if not got:
        return f"never (0/{len(values)})"
    m, lo, hi = mean_ci(got)
    text = format(m, fmt) + ("" if len(got) < 2 else " ± " + format((hi - lo) / 2, fmt))
    return text + ("" if len(got) == len(values) else f" ({len(got)}/{len(values)})")


def markdown(rows, targets) -> str:
    head = (["variant"] + [f"steps to {t:.0%}" for t in targets] + ["last acc", "best acc",
                                                                    "s/step (loaded)"])
    out = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for r in rows:
        cells = [r["variant"]] + [_ci(r[t]["steps"]) for t in targets]
        cells += [_ci([100 * v for v in r["last"]], ".1f"), _ci([100 * v for v in r["best"]], ".1f"),
                  f"{r['s_per_step']:.3f}"]
        out.append("| " + " | ".join(cells) + " |")
    per_seed = ["", "per seed (steps to each target; None = not reached):"]
    for r in rows:
        per_seed.append(f"- {r['variant']}: " + "; ".join(
            f"{t:.0%}: {r[t]['steps']}" for t in targets) + f"; last {r['last']}")
    return "\n".join(out + per_seed)


def time_steps(variants: dict, steps: int, threads: int) -> dict:
    """Median seconds per step of each variant, measured in this one process, the variants
    interleaved in rounds of ``steps`` // 3 steps so that load changes hit all alike."""
    times = {n: [] for n in variants}
    for _ in range(3):
        for name, ov in variants.items():
            with tempfile.TemporaryDirectory() as d:
                cfg = preset("defaults", **{**ov, "steps": max(steps // 3, 5), "eval_size": 0,
                                            "time_budget_s": 0.0, "threads": threads,
                                            "ckpt_every": 10 ** 6, "out_dir": d})
                h = train(cfg, progress=False)
            times[name] += [x["time/step_s"] for x in h[1:]][2:]          # drop warm-up
    return {n: statistics.median(t) for n, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="baseline,demo",
                    help=f"comma-separated names from {sorted(VARIANTS)}")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--eval_every", type=int, default=50)
    ap.add_argument("--targets", type=float, nargs="+", default=[0.85, 0.90])
    ap.add_argument("--stop_at", type=float, default=0.0,
                    help="stop a run once held-out accuracy reaches this (0: run all steps)")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--time_steps", type=int, default=0,
                    help="instead: median s/step per variant, interleaved in one process")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench/RESULTS_time_to_accuracy.md")
    a = ap.parse_args()
    names = a.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    variants = {n: dict(VARIANTS[n]) for n in names}
    command = "python bench/bench_time_to_accuracy.py " + " ".join(sys.argv[1:])
    if a.time_steps:
        t = time_steps(variants, a.time_steps, a.threads)
        base = t[names[0]]
        text = "\n".join([f"| variant | s/step ({a.threads} thread) | ratio to {names[0]} |",
                          "|---|---:|---:|"] + [f"| {n} | {v:.4f} | {v / base:.2f} |"
                                               for n, v in t.items()])
    else:
        for ov in variants.values():
            ov.update(eval_every=a.eval_every, ckpt_every=10 ** 6)
            if a.stop_at:
                ov["target_accuracy"] = a.stop_at
        t0 = time.time()
        res = run_experiment(variants, seeds=tuple(a.seeds), processes=a.processes)
        text = markdown(summarize(res, a.targets), a.targets) + \
            f"\n\n({len(res.runs)} runs in {time.time() - t0:.0f} s wall, {a.processes} processes)"
    header = (f"\n## {time.strftime('%Y-%m-%d %H:%M')}: `{command}`\n\n"
              f"torch {torch.__version__}; overrides per variant: "
              + "; ".join(f"{n} = {VARIANTS[n]}" for n in names) + "\n\n")
    print(header + text)
    with open(a.out, "a") as f:
        f.write(header + text + "\n")


if __name__ == "__main__":
    main()
