"""Grouping strategies side by side in real GRPO training on the task mixture.

Every strategy trains the shipped base policy with the same seed, the same prompts per step
(step s draws the same prompts in every run: the draws depend only on (seed, s)), the same
number of steps and the same hyper-parameters; only ``TrainConfig.grouping`` / ``combine``
(and, in the last rows, dynamic sampling, which draws extra rollouts) differ. The table
reports, per run:

  * held-out greedy accuracy on the union of the 7 eval sets (before -> after), and the
    families that moved most;
  * step means of the diagnostics the trainer logs: ``adv/var``, ``group/zero_std_frac``,
    ``group/purity``, ``adv/between_prompt_frac`` (README "Metrics" defines each);
  * wall time of the run.

One seed, so accuracy differences of a few points are within run-to-run noise; the
diagnostics are properties of the grouping and much steadier.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/bench_grouping_train.py
        # writes bench/RESULTS_grouping_train.md
    ... bench_grouping_train.py --base data/base_mixture.safetensors \
        --out bench/RESULTS_grouping_train_mixture_base.md   # a base that knows every family
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch

from grpo_lab.config import TrainConfig
from grpo_lab.trainer import train

STRATEGIES = {  # name -> TrainConfig overrides (the notebook uses the same dict's spirit)
    "by_prompt (GRPO)": {},
    "random (control)": {"grouping": "random"},
    "by_task": {"grouping": "by_task"},
    "kmeans_semantic": {"grouping": "kmeans_semantic"},
    "kmeans_semantic, pooled std": {"grouping": "kmeans_semantic",
                                    "combine": "within_prompt_pooled_std"},
    "mixed": {"grouping": "mixed"},
    "kmeans, reclustered every 10, k 3->14": {"grouping": "kmeans_semantic", "group_k": 14,
                                              "recluster_every": 10, "group_schedule": True},
    "by_prompt + dynamic sampling": {"dynamic_sampling": True},
}
DIAG = ["adv/var", "group/zero_std_frac", "group/purity", "adv/between_prompt_frac"]


def summarise(history: list[dict]) -> dict:
    """One run's history -> accuracy before/after, per-task after, step means of DIAG."""
    evals = [h for h in history if "eval/accuracy" in h]
    steps = [h for h in history if h["step"] >= 0]
    out = {"acc_before": evals[0]["eval/accuracy"], "acc_after": evals[-1]["eval/accuracy"],
           "per_task_before": {k[14:]: v for k, v in evals[0].items()
                               if k.startswith("eval/accuracy/")},
           "per_task_after": {k[14:]: v for k, v in evals[-1].items()
                              if k.startswith("eval/accuracy/")},
           "reward_last10": sum(h["reward/mean"] for h in steps[-10:]) / len(steps[-10:])}
    for k in DIAG:
        out[k] = sum(h[k] for h in steps) / len(steps)
    out["draws"] = sum(h.get("sample/draws", 1) for h in steps) / len(steps)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--prompts", type=int, default=28, help="prompts per step (4 per family)")
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--eval-size", type=int, default=100, help="held-out examples per task")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base", default="data/base_policy.safetensors",
                    help="policy to start from (data/base_mixture.safetensors: all 7 families)")
    ap.add_argument("--only", default="", help="strategy names separated by ; (default all)")
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_grouping_train.md")))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    names = [n for n in STRATEGIES if not args.only or n in args.only.split(";")]
    rows, base = {}, dict(task="mixture", steps=args.steps, prompts_per_step=args.prompts,
                          group_size=args.G, eval_size=args.eval_size, eval_every=0,
                          time_budget_s=0.0, ckpt_every=10_000, seed=args.seed, threads=1,
                          base_checkpoint=args.base)
    load0 = os.getloadavg()[0]
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            hist = train(TrainConfig(out_dir=tmp, **base, **STRATEGIES[name]), progress=False)
            rows[name] = {**summarise(hist), "wall_s": time.perf_counter() - t0}
        r = rows[name]
        print(f"{name:40s} acc {r['acc_before']:.3f} -> {r['acc_after']:.3f}  "
              f"adv/var {r['adv/var']:.3f}  zero_std {r['group/zero_std_frac']:.3f}  "
              f"purity {r['group/purity']:.3f}  {r['wall_s']:.0f} s", flush=True)
    cfg = TrainConfig(**base)
    hyper = ", ".join(f"{k} {getattr(cfg, k)}" for k in
                      ("lr", "lr_schedule", "warmup_steps", "temperature", "beta", "mu",
                       "eps_low", "eps_high", "advantage", "aggregation") if hasattr(cfg, k))
    cmd = "PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/bench_grouping_train.py " + \
        " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    lines = [
        "# Grouping strategies in GRPO training on the task mixture", "", "```", cmd.strip(),
        "```", "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
        f"(1 thread), Python {platform.python_version()}. Load average (1 min) "
        f"{load0:.1f} before, {os.getloadavg()[0]:.1f} after (other processes shared the CPUs "
        f"when above 2: wall times are indicative).", "",
        f"Run: base policy `{args.base}`, task `mixture` "
        f"({len(cfg.task_names)} families), {args.steps} steps x {args.prompts} prompts x "
        f"G={args.G}, seed {args.seed}, TrainConfig defaults otherwise ({hyper}, "
        f"reward weights {cfg.reward_weights}; k = {len(cfg.task_names)} groups unless "
        f"stated). Held-out greedy accuracy on "
        f"{args.eval_size} examples per family. Diagnostics are means over the steps.", "",
        "| strategy | accuracy before -> after | adv/var | group/zero_std_frac | "
        "group/purity | adv/between_prompt_frac | rollouts/step | wall (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['acc_before']:.3f} -> {r['acc_after']:.3f} | "
                     f"{r['adv/var']:.3f} | {r['group/zero_std_frac']:.3f} | "
                     f"{r['group/purity']:.3f} | {r['adv/between_prompt_frac']:.3f} | "
                     f"{r['draws']:.2f} | {r['wall_s']:.0f} |")
    tasks = list(next(iter(rows.values()))["per_task_after"])
    lines += ["", "Per-family held-out accuracy after training (before: "
              + ", ".join(f"{t} {next(iter(rows.values()))['per_task_before'][t]:.2f}"
                          for t in tasks) + "):", "",
              "| strategy | " + " | ".join(tasks) + " |", "|---|" + "---:|" * len(tasks)]
    for name, r in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{r['per_task_after'][t]:.2f}" for t in tasks)
                     + " |")
    lines += ["", "Reading it: `group/zero_std_frac` counts groups whose rewards are all equal "
              "(no signal); bigger groups are rarely all equal, so every cluster strategy "
              "wastes fewer rows than by_prompt, at a price `adv/between_prompt_frac` shows: "
              "that share of the advantage variance is a per-prompt offset (easy prompt: all "
              "its completions pushed up; hard prompt: all pushed down), not a comparison of "
              "completions of one prompt. The pooled-std option removes it by centring on the "
              "prompt's own mean. Accuracy differences from one seed are within noise unless "
              "large."]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
