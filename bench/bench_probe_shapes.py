"""How bf16's gain on SmolLM2 depends on the batch's shape: the speed probe's update phase (fp32
vs bf16 autocast) and rollout phase (fp32 vs the bf16 sampling copy) timed at several
prompts x completions x new-token shapes, side by side in one run.

Why the probe (grpo_lab/training/speed_probe.py) times the run's own batch (up to
PROBE_PROMPTS x PROBE_G x PROBE_TOKENS) and not a fixed small one: on an AMX Xeon the small
batch's autocast update was no faster than fp32 while the run's was 1.5x faster.

    PYTHONPATH=. python bench/bench_probe_shapes.py --threads 2 --out bench/RESULTS_probe_shapes.md
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from grpo_lab.algorithm.rollout import DRAWS, sample
from grpo_lab.policies.policy import load_for
from grpo_lab.training import speed_probe as sp
from grpo_lab.training.config import preset
from grpo_lab.training.step import prompt_generators

SHAPES = [(2, 4, 16), (2, 8, 16), (4, 4, 24), (4, 8, 24)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="smollm_cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="the first is left out (warm-up)")
    ap.add_argument("--out", default="bench/RESULTS_probe_shapes.md")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    load0 = os.getloadavg()
    cfg = preset(a.preset)
    policy = load_for(cfg)
    rows = []
    for B, G, T in SHAPES:
        prompts = sp._prompts(policy, cfg, B)

        def draw():
            return sample(policy, prompts, G, T, cfg.temperature, draw=DRAWS[cfg.sampler.draw],
                          generator=prompt_generators(0, 0, 0, range(B)))
        sp._set_mode(policy, **sp.ROLLOUT_MODES["fp32"])
        batch = draw()
        times = {}
        for rnd in range(a.rounds):
            for mode in ("fp32", "autocast"):
                sp._set_mode(policy, sample_dtype="", **sp.UPDATE_MODES[mode])
                t = time.perf_counter()
                sp._update(policy, batch, cfg)
                if rnd:
                    times.setdefault(f"update {mode}", []).append(time.perf_counter() - t)
            for mode in ("fp32", "bf16 copy"):
                sp._set_mode(policy, **sp.ROLLOUT_MODES[mode])
                t = time.perf_counter()
                draw()
                if rnd:
                    times.setdefault(f"rollout {mode}", []).append(time.perf_counter() - t)
            sp._set_mode(policy, **sp.ROLLOUT_MODES["fp32"])
        m = {k: statistics.median(v) for k, v in times.items()}
        rows.append(f"| {B} x {G} x {T} | {m['update fp32']:.2f} | {m['update autocast']:.2f} | "
                    f"{m['update fp32'] / m['update autocast']:.2f} | {m['rollout fp32']:.2f} | "
                    f"{m['rollout bf16 copy']:.2f} | "
                    f"{m['rollout fp32'] / m['rollout bf16 copy']:.2f} |")
        print(rows[-1], flush=True)
    cpu = sp.machine_id()
    text = "\n".join([
        "# bf16's gain by batch shape (bench/bench_probe_shapes.py)", "",
        f"Command: `PYTHONPATH=. python bench/bench_probe_shapes.py --threads {a.threads} "
        f"--rounds {a.rounds} --out {a.out}`", "",
        f"CPU: {cpu.get('cpu', platform.processor())}, torch {torch.__version__} "
        f"({torch.backends.cpu.get_cpu_capability()}), {a.threads} threads; preset {a.preset}; "
        f"load averages before {'/'.join(f'{x:.2f}' for x in load0)}, after "
        f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())}.", "",
        "Wall seconds, median of the rounds after the first; speed-up = fp32 / bf16.", "",
        "| prompts x completions x new tokens | update fp32 s | update autocast s | speed-up | "
        "rollout fp32 s | rollout bf16 copy s | speed-up |", "|---|---|---|---|---|---|---|",
        *rows, ""])
    Path(a.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
