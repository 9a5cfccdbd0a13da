"""The fast-path probe's choice against each alternative, side by side in one run: a few
GRPO steps of SmolLM2-135M (the ``smollm_cpu`` preset) per setting, interleaved round by round,
ratios to the chosen path per round (issue 51, item 2; speed_probe.py).

    PYTHONPATH=. .venv/bin/python bench/bench_fast_path.py [--steps 3] [--rounds 2] \\
        [--model smollm2-135m] [--prompts 4] [--group 4] [--out bench/RESULTS_fast_path.md]

1. The probe runs afresh (``speed_probe.probe``, its record kept in the results file) and
   names its choice.
2. Arms: each of the probe's four settings (hf.sample_dtype "" or bfloat16, hf.autocast off
   or on) at the thread counts the probe found best for it, and the default (fp32, no
   autocast, the threads a run with threads=0 takes now). The arm equal to the choice is
   marked. Each trains ``--steps`` steps (no evaluation); its step times are the steps after
   the first (step 0 pays the bf16 copy and the decoder's warm-up): wall seconds
   (time/step_s, rollout = time/rollout_s) and this process's CPU seconds per step.
3. Every round trains every arm once, in an order reversed each round, so a change in the
   machine's load hits every arm; a ratio (arm / chosen) is taken within a round and the
   median and range over rounds are reported.

The machine may be shared: the results file records ``lscpu``'s model and flags and the load
averages before and after. Nothing here asserts a speed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_op_overhead import cpu_line, load_average  # noqa: E402


def arms(record: dict) -> dict:
    """label -> (hf.sample_dtype, hf.autocast, rollout_threads, threads); 0 threads: the run's own."""
    out = {}
    for s in record["settings"]:
        name = ("bf16 copy" if s["sample_dtype"] else "fp32 sampling") + \
               (" + autocast" if s["autocast"] else "")
        out[f"{name} (threads {s['rollout_threads']}/{s['threads']})"] = (
            s["sample_dtype"], s["autocast"], s["rollout_threads"], s["threads"])
    out["default (fp32, threads=0)"] = ("", False, 0, 0)
    return out


def run_arm(cfg, steps: int) -> dict:
    """Train ``steps`` steps of ``cfg`` -> per-step wall, rollout and CPU seconds (after step 0)."""
    from grpo_lab.training.trainer import train
    cpu = [time.process_time()]
    history = train(cfg, progress=False, on_step=lambda m, p: cpu.append(time.process_time()))
    rows = [h for h in history if h["step"] >= 1]
    cpu_steps = [b - a for a, b in zip(cpu[1:], cpu[2:])]        # steps 1.. (after step 0)
    return {"step_s": statistics.median(h["time/step_s"] for h in rows),
            "rollout_s": statistics.median(h["time/rollout_s"] for h in rows),
            "cpu_s": statistics.median(cpu_steps), "threads": rows[0].get("time/threads")}


def main() -> int:
    import dataclasses

    import torch

    from grpo_lab.training import speed_probe
    from grpo_lab.training.config import preset
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--probe_rounds", type=int, default=2)
    ap.add_argument("--out", default="bench/RESULTS_fast_path.md")
    args = ap.parse_args()
    if args.steps < 2:
        raise SystemExit(f"--steps must be >= 2 (step 0 is not timed), got {args.steps}")
    load0 = load_average()
    work = Path(tempfile.mkdtemp(prefix="bench_fast_path_"))
    base = preset("smollm_cpu", base_checkpoint=args.model, steps=args.steps, eval_size=0,
                  time_budget_s=0.0, prompts_per_step=args.prompts, group_size=args.group,
                  out_dir=str(work / "run"))
    t0 = time.perf_counter()
    record = speed_probe.probe(base, rounds=args.probe_rounds)
    probe_s = time.perf_counter() - t0
    print(speed_probe.choice_line(record), f"(probe: {probe_s:.0f} s)", flush=True)
    c = record["choice"]
    chosen = (c["sample_dtype"], c["autocast"], c["rollout_threads"], c["threads"])
    table = arms(record)
    label_of = {v: k for k, v in table.items()}
    chosen_label = label_of.get(chosen) or "default (fp32, threads=0)"
    results: dict = {k: [] for k in table}
    order = list(table)
    for rnd in range(args.rounds):
        for label in (order if rnd % 2 == 0 else order[::-1]):
            sd, ac, rt, t = table[label]
            cfg = dataclasses.replace(base, hf=dataclasses.replace(base.hf, sample_dtype=sd,
                                                                    autocast=ac),
                                      speed=dataclasses.replace(base.speed, rollout_threads=rt),
                                      threads=t,
                                      out_dir=str(work / f"r{rnd}"))
            res = run_arm(cfg, args.steps)
            results[label].append(res)
            print(f"round {rnd}: {label}: {res['step_s']:.2f} s/step (rollout "
                  f"{res['rollout_s']:.2f}), CPU {res['cpu_s']:.2f} s", flush=True)
    load1 = load_average()
    ref = results[chosen_label]
    lines = ["# The fast path chosen by measurement, against each alternative "
             "(bench/bench_fast_path.py)", "",
             f"Command: `PYTHONPATH=. python bench/bench_fast_path.py --model {args.model} "
             f"--steps {args.steps} --rounds {args.rounds} --prompts {args.prompts} --group "
             f"{args.group}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             f"CPU: {cpu_line()}; torch {torch.__version__} "
             f"({torch.backends.cpu.get_cpu_capability()}); load averages (1/5/15 min) "
             f"before {load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f}, after "
             f"{load1[0]:.2f}/{load1[1]:.2f}/{load1[2]:.2f} on {os.cpu_count()} cores "
             f"(a shared machine: read the ratios, which are taken within a round)", "",
             f"Preset smollm_cpu, {args.prompts} prompts x {args.group} completions, <= "
             f"{base.max_new_tokens} new tokens, no evaluation; {args.steps} steps per arm "
             f"(step 0 untimed), {args.rounds} rounds interleaved.", "",
             f"Probe ({probe_s:.0f} s, {record['rounds']} rounds, batch {record['shape']}): "
             f"{speed_probe.choice_line(record)}. Accuracy check (mean |log-prob - fp32|, "
             f"bound {record['tolerance']}): " + ", ".join(
                 f"{k} {v:.4f}" for k, v in record["logp_error"].items()) + ".", "",
             "| arm | wall s/step (median of rounds) | rollout s | CPU s/step | wall ratio to "
             "chosen (median [min, max] over rounds) | CPU ratio to chosen |",
             "|---|---|---|---|---|---|"]
    for label in order:
        rs = results[label]
        wr = [a["step_s"] / b["step_s"] for a, b in zip(rs, ref)]
        cr = [a["cpu_s"] / b["cpu_s"] for a, b in zip(rs, ref)]
        mark = " **(chosen)**" if label == chosen_label else ""
        lines.append(f"| {label}{mark} | {statistics.median(r['step_s'] for r in rs):.2f} | "
                     f"{statistics.median(r['rollout_s'] for r in rs):.2f} | "
                     f"{statistics.median(r['cpu_s'] for r in rs):.2f} | "
                     f"{statistics.median(wr):.2f} [{min(wr):.2f}, {max(wr):.2f}] | "
                     f"{statistics.median(cr):.2f} [{min(cr):.2f}, {max(cr):.2f}] |")
    lines += ["", "A ratio above 1: the arm is slower than the chosen path. The probe's medians "
              "(seconds per phase, its batch):", "", "```json",
              json.dumps(record["seconds"], indent=1), "```", ""]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
