"""SmolLM2-135M-Instruct on the CPU: the smollm_cpu preset, base vs after, over seeds.

    GRPO_LAB_MODELS=... python bench/bench_smollm_cpu.py --seeds 0,1,2 --threads 1 \\
        --out bench/RESULTS_smollm_cpu.md

Each seed is one `trainer.train` run of the preset (10 minutes of training by its time budget),
run one after the other so they do not compete for the cores. Writes per-seed held-out accuracy
and format rate before and after, their changes with 95% t-intervals over seeds
(experiments.mean_ci), steps done, seconds per step split into rollout (sampling, scoring,
advantages) and update (loss forward, backward, AdamW), and the first seed's before/after
samples (samples.jsonl). Needs `grpo-lab model get smollm2-135m` first.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from grpo_lab.algorithm import samples
from grpo_lab.training.config import preset
from grpo_lab.training.experiments import mean_ci
from grpo_lab.training.trainer import train


def run_seed(seed: int, threads: int, out_root: Path, overrides: dict) -> dict:
    out = out_root / f"seed{seed}"
    cfg = preset("smollm_cpu", seed=seed, threads=threads, out_dir=str(out), **overrides)
    t0 = time.time()
    history = train(cfg, progress=False)
    evals = [h for h in history if "eval/accuracy" in h]
    steps = [h for h in history if h.get("step", -1) >= 0]
    roll = [h["time/rollout_s"] for h in steps]
    step = [h["time/step_s"] for h in steps]
    return {"seed": seed, "acc_before": evals[0]["eval/accuracy"], "acc_after": evals[-1]["eval/accuracy"],
            "fmt_before": evals[0].get("eval/format"), "fmt_after": evals[-1].get("eval/format"),
            "steps": len(steps), "train_s": steps[-1]["time/elapsed_s"], "wall_s": time.time() - t0,
            "s_per_step": sum(step) / len(step), "rollout_s": sum(roll) / len(roll),
            "update_s": (sum(step) - sum(roll)) / len(step),
            "reward_first5": sum(h["reward/mean"] for h in steps[:5]) / min(5, len(steps)),
            "reward_last5": sum(h["reward/mean"] for h in steps[-5:]) / min(5, len(steps)),
            "load_start": os.getloadavg()[0], "out_dir": str(out)}


def matmul_check(repeats: int = 3) -> list[str]:
    """Why the preset trains in float32: one SmolLM2-sized matmul (1280 x 576 @ 576 x 1536, an
    MLP projection over 16 sequences of 80 tokens), forward + backward, float32 vs bf16
    autocast, alternated in one process on one thread -> markdown lines."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    W = torch.randn(1536, 576, requires_grad=True)
    x = torch.randn(1280, 576, requires_grad=True)
    times = {False: [], True: []}
    for _ in range(repeats):
        for ac in (False, True):
            t = time.perf_counter()
            with torch.autocast("cpu", torch.bfloat16, enabled=ac):
                y = x @ W.t()                                          # (1280, 1536)
            y.float().sum().backward()
            times[ac].append(time.perf_counter() - t)
    f32, bf = min(times[False]), min(times[True])
    return [f"- matmul forward + backward, best of {repeats}: float32 {f32:.2f} s, bf16 autocast "
            f"{bf:.2f} s ({bf / f32:.1f}x); torch CPU capability: "
            f"{torch.backends.cpu.get_cpu_capability()}"]


def fmt_ci(values, scale=100.0, unit=" points"):
    m, lo, hi = mean_ci([v * scale for v in values])
    return f"{m:+.1f} [{lo:+.1f}, {hi:+.1f}]{unit}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench/RESULTS_smollm_cpu.md")
    ap.add_argument("--runs", default="runs/bench_smollm_cpu")
    ap.add_argument("--overrides", default="{}", help="JSON of TrainConfig overrides")
    ap.add_argument("--matmul_check", action="store_true",
                    help="only time a float32 vs bf16-autocast matmul (why float32) and exit")
    ap.add_argument("--combine", default="",
                    help="comma-separated JSON files of earlier runs (one seed each, run side by "
                         "side as separate processes): render them together, train nothing")
    a = ap.parse_args()
    if a.matmul_check:
        print("\n".join(matmul_check()))
        return
    rows = []
    if a.combine:
        rows = [r for f in a.combine.split(",") for r in json.loads(Path(f).read_text())]
        a.seeds = ",".join(str(r["seed"]) for r in rows)
    for s in ([] if a.combine else [int(x) for x in a.seeds.split(",")]):
        rows.append(run_seed(s, a.threads, Path(a.runs), json.loads(a.overrides)))
        print(json.dumps(rows[-1]), flush=True)
        Path(a.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))
    lines = ["# smollm_cpu: SmolLM2-135M-Instruct, base vs after GRPO on 2-digit addition", "",
             f"`python bench/bench_smollm_cpu.py --seeds {a.seeds} --threads {a.threads}`"
             f" (overrides {a.overrides}); held-out: the first 50 of data/eval_addition.jsonl, "
             f"greedy, asked in words as the preset asks (answer_format, system_prompt).", "",
             "| seed | accuracy before | after | format before | after | steps | s/step | rollout s | update s | load (1 min) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['seed']} | {r['acc_before']:.0%} | {r['acc_after']:.0%} | "
                     f"{r['fmt_before']:.0%} | {r['fmt_after']:.0%} | {r['steps']} | "
                     f"{r['s_per_step']:.1f} | {r['rollout_s']:.1f} | {r['update_s']:.1f} | {r['load_start']:.1f} |")
    lines += ["", f"- accuracy change (mean, 95% t-interval over seeds): "
                  f"{fmt_ci([r['acc_after'] - r['acc_before'] for r in rows])}",
              f"- format-rate change: {fmt_ci([r['fmt_after'] - r['fmt_before'] for r in rows])}",
              f"- training reward, first 5 vs last 5 steps: "
              f"{fmt_ci([r['reward_last5'] - r['reward_first5'] for r in rows], 1.0, '')}",
              f"- seconds per step: {mean_ci([r['s_per_step'] for r in rows])[0]:.1f} (rollout "
              f"{mean_ci([r['rollout_s'] for r in rows])[0]:.1f}, update "
              f"{mean_ci([r['update_s'] for r in rows])[0]:.1f})", ""]
    lines += samples.markdown(samples.read(rows[0]["out_dir"]))
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
