"""Grouping strategies side by side in real GRPO training on the task mixture, over seeds.

Every strategy trains the same base policy with the same prompts per step (seed s draws the
same prompts at step s in every run), the same number of steps and hyper-parameters; only
``TrainConfig.grouping`` / ``group.combine`` (and, in the last row, dynamic sampling, which draws
extra rollouts) differ. Each strategy runs once per seed through ``experiments.run_experiment``
(parallel processes, one thread each), and the table reports the mean over seeds with the
half-width of its 95% t-interval:

  * held-out greedy accuracy on the union of the 7 eval sets at the end, and its gain over
    the base policy;
  * step means of ``group/zero_std_frac``, ``adv/var``, rollouts per step, ``group/purity``
    and ``adv/between_prompt_frac`` (docs/reference/metrics.md defines each);
  * the paired difference (same seed) of each strategy minus by_prompt, with its interval:
    a difference is called real only when that interval excludes 0.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/bench_grouping_train.py
        # writes bench/RESULTS_grouping_train.md
    ... bench_grouping_train.py --base data/base_mixture.safetensors --seeds 0 1 2 \
        --out bench/RESULTS_grouping_train_mixture_base.md   # a base that knows every family
"""
from __future__ import annotations

import argparse
import functools
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

from grpo_lab.training.config import preset
from grpo_lab.training.experiments import difference_sentence, mean_ci, run_experiment

STRATEGIES = {  # name -> TrainConfig overrides (the notebook uses the same dict's spirit)
    "by_prompt (GRPO)": {},
    "random (control)": {"grouping": "random"},
    "by_task": {"grouping": "by_task"},
    "kmeans_semantic": {"grouping": "kmeans_semantic"},
    "kmeans_semantic, pooled std": {"grouping": "kmeans_semantic",
                                    "group": {"combine": "within_prompt_pooled_std"}},
    "mixed": {"grouping": "mixed"},
    "kmeans, reclustered every 10, k 3->14": {"grouping": "kmeans_semantic", "group": {
        "k": 14, "recluster_every": 10, "schedule": True}},
    "by_prompt + dynamic sampling": {"dynamic": {"sampling": True}},
}
OPT_IN = {  # run only when named in --only: claim 12's literal schedule (5 -> 20 groups, +20% per
    # re-fit) against its fixed count (BENCHMARKS.md section 14)
    "kmeans, reclustered every 10, k 5->20": {"grouping": "kmeans_semantic", "group": {
        "k": 20, "recluster_every": 10, "schedule": True}},
    "kmeans, reclustered every 10, k 20 fixed": {"grouping": "kmeans_semantic", "group": {
        "k": 20, "recluster_every": 10}},
}
REFERENCE = "by_prompt (GRPO)"
EXTRA = ["group/purity", "adv/between_prompt_frac"]          # step means, beyond METRICS
PAIRED = ["eval/accuracy", "group/zero_std_frac", "adv/var"]


def step_mean(history: list[dict], key: str) -> float:
    vals = [h[key] for h in history if h["step"] >= 0 and key in h]
    return sum(vals) / len(vals)


def excludes_zero(values, level: float) -> bool:
    _, lo, hi = mean_ci(values, level)
    return lo > 0 or hi < 0


def pm(values, fmt=".3f") -> str:
    """mean ± half-width of the 95% t-interval."""
    m, lo, hi = mean_ci(values)
    return f"{m:{fmt}} ± {(hi - lo) / 2:{fmt.lstrip('+')}}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--prompts", type=int, default=28, help="prompts per step (4 per family)")
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--eval-size", type=int, default=100, help="held-out examples per task")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--processes", type=int, default=None, help="default: the CPU count")
    ap.add_argument("--base", default="data/base_policy.safetensors",
                    help="policy to start from (data/base_mixture.safetensors: all 7 families)")
    ap.add_argument("--only", default="", help="strategy names separated by ; (default all)")
    ap.add_argument("--reference", default=REFERENCE,
                    help="strategy the paired differences are taken against")
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_grouping_train.md")))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    known = {**STRATEGIES, **OPT_IN}
    names = [n for n in known if n in args.only.split(";")] if args.only else list(STRATEGIES)
    if args.reference not in known:
        raise ValueError(f"unknown --reference {args.reference!r}; known: {list(known)}")
    ref = args.reference
    base = dict(task="mixture", steps=args.steps, prompts_per_step=args.prompts,
                group_size=args.G, eval_size=args.eval_size, eval_every=0, ckpt_every=10_000,
                base_checkpoint=args.base)
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    res = run_experiment({n: known[n] for n in names}, seeds=tuple(args.seeds), base=base,
                         processes=args.processes)
    wall, load1 = time.perf_counter() - t0, os.getloadavg()[0]
    by = {n: [r["history"] for r in res.runs if r["strategy"] == n] for n in names}
    cfg = preset("defaults", **base)
    hyper = ", ".join(f"{k} {functools.reduce(getattr, k.split('.'), cfg)}" for k in
                      ("lr", "lr_schedule", "warmup_steps", "temperature", "kl.beta", "mu",
                       "clip.eps_low", "clip.eps_high", "advantage", "loss.aggregation"))
    cmd = "PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/bench_grouping_train.py " + \
        " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    acc0 = by[names[0]][0][0]["eval/accuracy"]
    n = len(args.seeds)
    lines = [
        "# Grouping strategies in GRPO training on the task mixture, over seeds", "", "```",
        cmd.strip(), "```", "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
        f"(1 thread per run, {args.processes or os.cpu_count()} runs at a time), Python "
        f"{platform.python_version()}. Load average (1 min) {load0:.1f} before, {load1:.1f} "
        f"after; {len(res.runs)} runs in {wall / 60:.1f} min of wall time (other processes "
        f"shared the CPUs when the load was above the core count).", "",
        f"Run: base policy `{args.base}` (held-out accuracy {acc0:.3f}), task `mixture` "
        f"({len(cfg.task_names)} families), {args.steps} steps x {args.prompts} prompts x "
        f"G={args.G}, seeds {', '.join(map(str, args.seeds))}, TrainConfig defaults otherwise "
        f"({hyper}, reward weights {cfg.reward_weights}; k = {len(cfg.task_names)} groups "
        f"unless stated). Held-out greedy accuracy on {args.eval_size} examples per family. "
        f"Each cell: mean over the {n} seeds ± the half-width of the 95% t-interval of that "
        f"mean (t(0.975, {n - 1}) x sd / sqrt({n})). Diagnostics are means over the steps.", "",
        res.to_markdown(), "",
        "`-` under sample/draws: one rollout per step (no dynamic sampling).", "",
        "More step-mean diagnostics (mean ± 95% half-width):", "",
        "| strategy | " + " | ".join(EXTRA) + " |", "|---|" + "---:|" * len(EXTRA)]
    for s in names:
        lines.append(f"| {s} | " + " | ".join(pm([step_mean(h, k) for h in by[s]])
                                               for k in EXTRA) + " |")
    sentences = []
    if ref in names and n > 1:
        lines += ["", f"Paired difference, strategy minus {ref} on the same seed "
                  "(mean [95% interval]; **bold**: the interval excludes 0, a real "
                  "difference):", "",
                  "| strategy | " + " | ".join(f"Δ {m}" for m in PAIRED) + " |",
                  "|---|" + "---:|" * len(PAIRED)]
        for s in names:
            if s == ref:
                continue
            cells = []
            for m in PAIRED:
                d = res.compare(s, ref, m)
                c = f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"
                cells.append(f"**{c}**" if d["excludes_zero"] else c)
                if m == "eval/accuracy":
                    sentences.append(difference_sentence(d))
            lines.append(f"| {s} | " + " | ".join(cells) + " |")
        others = [s for s in names if s != ref]
        diffs = {s: res.compare(s, ref, "eval/accuracy") for s in others}
        real = [s for s in others if diffs[s]["excludes_zero"]]
        k = len(others)                      # comparisons made at once: Bonferroni 1 - 0.05/k
        strict = [s for s in real if excludes_zero(diffs[s]["values"], 1 - 0.05 / k)]
        if real:
            verdict = ("; ".join(f"`{s}` ({diffs[s]['mean']:+.3f})" for s in real)
                       + f" exclude 0 at 95%, every other interval includes 0. With {k} "
                       f"comparisons at 95%, about {0.05 * k:.2f} exclude 0 by chance alone; "
                       f"with Bonferroni intervals (level 1 - 0.05/{k}) "
                       + (", ".join(f"`{s}`" for s in strict) + " still exclude 0."
                          if strict else "none does."))
        else:
            verdict = (f"no strategy's interval excludes 0: every accuracy difference from "
                       f"{ref} is within seed noise at {n} seeds.")
        lines += ["", f"On final accuracy: {verdict} In the diagnostics columns every bold "
                  "interval is a real difference in the training signal.", ""]
        lines += [f"- {t}" for t in sentences]
    tasks = [k[14:] for k in by[names[0]][0][-1] if k.startswith("eval/accuracy/")]
    lines += ["", "Per-family held-out accuracy at the end, mean over seeds (base: "
              + ", ".join(f"{t} {by[names[0]][0][0]['eval/accuracy/' + t]:.2f}" for t in tasks)
              + "):", "", "| strategy | " + " | ".join(tasks) + " |",
              "|---|" + "---:|" * len(tasks)]
    for s in names:
        means = [mean_ci([h[-1]["eval/accuracy/" + t] for h in by[s]])[0] for t in tasks]
        lines.append(f"| {s} | " + " | ".join(f"{m:.2f}" for m in means) + " |")
    lines += ["", "Per run (seed: final accuracy):", ""]
    for s in names:
        lines.append(f"- {s}: " + ", ".join(
            f"{r['seed']}: {r['history'][-1]['eval/accuracy']:.3f}"
            for r in res.runs if r["strategy"] == s))
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
