"""Async rollout (speed.async_steps = 1) against sync on this CPU: seconds per step and held-out
accuracy, paired by seed, the modes interleaved (issue 51, item 3).

    PYTHONPATH=. .venv/bin/python bench/bench_async.py --preset hf_tiny_cpu --steps 12
    PYTHONPATH=. .venv/bin/python bench/bench_async.py --preset smollm_cpu --steps 6 \\
        --out bench/RESULTS_async_smollm.md

Every run is a child process (spawned), one at a time; for each seed the modes run back to
back, in a rotating order, so load drifts hit every mode. The modes:

    sync     threads = --cores for both phases (the update and the rollout take turns)
    sync_1t  one thread for both phases (on a loaded machine --cores OpenMP threads can be
             slower than one: the fair baseline is the faster sync)
    async    the update on --cores - 1 threads, the sampler thread on 1 (they run together)

s/step is the median time/step_s over the steps after the first (step 0 of an async run
samples synchronously); the ratio sync / async per seed is the speed-up, summarised as its
mean with a t interval over the seeds (95%, n - 1 degrees of freedom), against each sync mode. Held-out accuracy is
the greedy eval/accuracy after the last step (eval_size prompts); per wall-second it is
(final - base) / the seconds the steps took (the sum of time/step_s). The machine is shared:
the report names the CPU (lscpu model name and flags) and the load before and after.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

MODES = ("sync", "sync_1t", "async")
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365}  # t_{0.975, df}


def run_one(preset: str, seed: int, mode: str, steps: int, cores: int, eval_size: int,
            extra: dict, queue) -> None:
    from grpo_lab.training.config import preset as make
    from grpo_lab.training.trainer import train
    speed = ({"async_steps": 1, "rollout_threads": 1} if mode == "async" else {})
    threads = {"sync": cores, "sync_1t": 1, "async": max(1, cores - 1)}[mode]
    cfg = make(preset, **{"seed": seed, "steps": steps, "eval_every": 0, "eval_size": eval_size,
                          "ckpt_every": 10_000, "time_budget_s": 0.0, "target_accuracy": 0.0,
                          "dynamic": {"sampling": False}, "threads": threads, "speed": speed,
                          "out_dir": tempfile.mkdtemp(prefix=f"bench_async_{mode}_"), **extra})
    history = train(cfg, progress=False)
    queue.put([{k: v for k, v in h.items() if not isinstance(v, (dict, list))} for h in history])


def child(*args) -> list[dict]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=run_one, args=(*args, q))
    p.start()
    out = q.get()
    p.join()
    return out


def summary(history: list[dict]) -> dict:
    rows = [h for h in history if h["step"] >= 0]
    base = next(h["eval/accuracy"] for h in history if h["step"] == -1)
    final = rows[-1]["eval/accuracy"]
    wall = sum(h["time/step_s"] for h in rows)
    return {"s_step": statistics.median(h["time/step_s"] for h in rows[1:]),
            "wait": statistics.median(h.get("time/async_wait_s", 0.0) for h in rows[1:]),
            "base": base, "final": final, "wall": wall, "per_s": (final - base) / wall,
            "reward": statistics.mean(h["reward/mean"] for h in rows),
            "gap": statistics.mean(h.get("sample/logprob_gap", float("nan")) for h in rows)}


def interval(xs: list[float]) -> str:
    m = statistics.mean(xs)
    if len(xs) < 2:
        return f"{m:.3f}"
    half = T95[len(xs) - 1] * statistics.stdev(xs) / len(xs) ** 0.5
    return f"{m:.3f} [{m - half:.3f}, {m + half:.3f}]"


def machine() -> list[str]:
    info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    pick = {k: v.strip() for k, _, v in (line.partition(":") for line in info)}
    import torch
    return [f"- CPU: {pick.get('Model name', '?')}, {os.cpu_count()} logical cores; torch "
            f"{torch.__version__}",
            f"- flags: {pick.get('Flags', '?')}"]


def load() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__repr__()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="hf_tiny_cpu")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--eval_size", type=int, default=100)
    ap.add_argument("--tis", type=float, default=2.0, help="tis.cap on every mode (0: off)")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="a subset of sync,sync_1t,async (async is always run)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    extra = {"tis": {"cap": a.tis}} if a.tis else {}
    seeds = [int(s) for s in a.seeds.split(",")]
    modes = tuple(m for m in MODES if m in a.modes.split(",") or m == "async")
    base_modes = modes[:-1]
    load_before, t0 = load(), time.time()
    res: dict[tuple, dict] = {}
    for i, seed in enumerate(seeds):
        for mode in modes[i % len(modes):] + modes[:i % len(modes)]:
            res[seed, mode] = summary(child(a.preset, seed, mode, a.steps, a.cores,
                                            a.eval_size, extra))
            print(seed, mode, {k: round(v, 4) for k, v in res[seed, mode].items()}, flush=True)
    ratios = {m: [res[s, m]["s_step"] / res[s, "async"]["s_step"] for s in seeds]
              for m in base_modes}
    lines = [f"# Async rollout (k = 1) vs sync: {a.preset}, {a.steps} steps, seeds {a.seeds}",
             "", f"`python bench/bench_async.py --preset {a.preset} --steps {a.steps} "
             f"--seeds {a.seeds} --cores {a.cores} --eval_size {a.eval_size} --tis {a.tis} "
             f"--modes {','.join(modes)}`", "",
             *machine(), f"- load average (1, 5, 15 min) before: {load_before}, after: {load()}; "
             f"{time.time() - t0:.0f} s in all", "",
             "| seed | mode | s/step (median) | async wait s | mean reward | held-out base -> final | "
             "(final - base) / wall s | logprob gap |", "|---|---|---|---|---|---|---|---|"]
    for s in seeds:
        for mode in modes:
            r = res[s, mode]
            lines.append(f"| {s} | {mode} | {r['s_step']:.3f} | {r['wait']:.3f} | "
                         f"{r['reward']:.3f} | {r['base']:.3f} -> {r['final']:.3f} | "
                         f"{r['per_s']:.5f} | {r['gap']:.4f} |")
    finals = {m: [res[s, m]["final"] for s in seeds] for m in modes}
    lines.append("")
    for m in base_modes:
        lines += [f"- speed-up ({m} s/step / async s/step), mean [95% t interval]: "
                  f"{interval(ratios[m])}; per seed {[round(r, 3) for r in ratios[m]]}"]
    lines += [f"- held-out accuracy after {a.steps} steps, mean [95% t interval]: "
              + "; ".join(f"{m} {interval(finals[m])}" for m in modes),
              f"- seed-to-seed spread of the sync modes' final accuracy (max - min): "
              + "; ".join(f"{m} {max(finals[m]) - min(finals[m]):.3f}" for m in base_modes)
              + f"; async - {base_modes[0]} per seed: "
              f"{[round(x - y, 3) for x, y in zip(finals['async'], finals[base_modes[0]])]}"]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
