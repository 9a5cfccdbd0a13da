"""Runs per CPU-hour of one study spec on SmolLM2, by how the study lays its runs on the cores
(issue 51, item 4): ``--layouts 2x1,1x2`` = 2 worker processes of 1 torch thread each (the
default of ``grpo-lab study`` on 2 cores) against 1 process of 2 threads (the runs one after
another, in this process), each layout on the same spec, the layouts alternating per round.

The spec (``--arms``, ``--seeds``, ``--steps``; every arm the ``--base`` preset with one
change): 2 arms x 2 seeds of the smollm_cpu preset (the preset, and lr 2e-5), evaluated at the
start and at the end on ``--eval_size`` held-out prompts. A run's numbers depend on its
threads (a matmul's summation order), so each layout's runs are checked against the same run
trained alone by ``train()`` with that layout's threads (its config read back from the run's
folder): every metric but the time/* ones, bit for bit.

    PYTHONPATH=. .venv/bin/python bench/bench_study_throughput.py --rounds 1 \\
        --out bench/RESULTS_study_throughput.md

    # plumbing only, on data/hf_tiny in under a minute:
    PYTHONPATH=. .venv/bin/python bench/bench_study_throughput.py --dry

Reported: each layout's wall seconds for the whole study (the base evaluation included),
runs per hour of the 2-core machine, and the paired ratio over rounds; the CPU model, its
flags and the load before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
from bench_op_overhead import cpu_line, load_average  # noqa: E402

SPECS = {
    "smollm": dict(base_preset="smollm_cpu", arms={"preset": {}, "lr2e-5": {"lr": 2e-5}},
                   base={"eval_size": 20}),
    "dry": dict(base_preset="hf_tiny_cpu", arms={"preset": {}, "lr2x": {"lr": 2e-4}},
                base={"eval_size": 10, "prompts_per_step": 4, "group_size": 4,
                      "max_new_tokens": 6}),
}


def layout(text: str) -> tuple[int, int]:
    """'2x1' -> (2 processes, 1 thread each)."""
    try:
        p, t = (int(x) for x in text.split("x"))
    except ValueError:
        raise SystemExit(f"a layout is PROCESSESxTHREADS (e.g. 2x1), got {text!r}") from None
    if p < 1 or t < 1 or p * t > (os.cpu_count() or 1):
        raise SystemExit(f"layout {text!r}: {p} x {t} threads is more than the "
                         f"{os.cpu_count()} cores here (or below 1)")
    return p, t


def comparable(history: list[dict]) -> list[dict]:
    """A history without what a clock measured (time/*, the wall-clock columns)."""
    return [{k: v for k, v in row.items() if not k.startswith("time/") and "wall" not in k}
            for row in history]


def same_as(mine: dict, theirs: dict) -> str:
    """Which runs of ``mine`` ({layout: {arm:seed: history}}, JSON-shaped) equal ``theirs``."""
    said = []
    for lo, runs in mine.items():
        for run, h in runs.items():
            other = theirs.get(lo, {}).get(run)
            said.append(f"{lo} {run} " + ("identical" if other == json.loads(json.dumps(h))
                                          else "absent" if other is None else "DIFFERS"))
    return "; ".join(said)


def run_layout(spec: dict, seeds: int, steps: int, processes: int, threads: int,
               folder: Path) -> tuple[float, object]:
    from grpo_lab.training.experiments import run_experiment
    base = {**spec["base"], "steps": steps, "eval_every": steps, "threads": threads}
    t0 = time.perf_counter()
    res = run_experiment(spec["arms"], seeds=range(seeds), base=base, processes=processes,
                         progress=False, base_preset=spec["base_preset"], out_dir=str(folder),
                         keep="none")
    return time.perf_counter() - t0, res


def alone(run_folder: Path, threads: int, out: Path) -> list[dict]:
    """The run whose folder is ``run_folder``, trained again alone by train() from the config
    it wrote, with ``threads`` torch threads."""
    import torch
    from grpo_lab.training.config import from_dict
    from grpo_lab.training.config_file import FAST_PATH_KEY, VERSION_KEY
    from grpo_lab.training.trainer import train
    d = json.loads((run_folder / "config.json").read_text())
    for key in (VERSION_KEY, FAST_PATH_KEY):  # what wrote it and what it chose: not settings
        d.pop(key, None)
    d.update(out_dir=str(out), threads=threads)
    before = torch.get_num_threads()
    try:
        return train(from_dict(d), progress=False)
    finally:
        torch.set_num_threads(before)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layouts", default="2x1,1x2")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--check", default="preset:0",
                    help="ARM:SEED of the run trained again alone per layout ('' skips)")
    ap.add_argument("--histories", default="",
                    help="JSON file of every run's metrics (time/* aside) in round 0, per layout: "
                         "two checkouts' runs compared number for number")
    ap.add_argument("--compare", default="",
                    help="a --histories file of another run (e.g. another checkout's): each of "
                         "this round 0's runs said identical to it or not, number for number")
    ap.add_argument("--dry", action="store_true", help="data/hf_tiny, 2 steps: plumbing only")
    ap.add_argument("--out", default="", help="markdown file (default: printed only)")
    a = ap.parse_args()
    spec = SPECS["dry" if a.dry else "smollm"]
    steps = 2 if a.dry else a.steps
    layouts = [layout(x) for x in a.layouts.split(",")]
    n_runs = len(spec["arms"]) * a.seeds
    lines = [f"Command: `python bench/bench_study_throughput.py {' '.join(sys.argv[1:])}`", "",
             f"Spec: {spec['base_preset']} with arms {list(spec['arms'])} x {a.seeds} seeds "
             f"({n_runs} runs), {steps} steps each, evaluated at the start and the end "
             f"({spec['base']['eval_size']} held-out prompts); the base evaluated once per "
             f"study.", "", f"- start: {cpu_line()}; load {load_average()[0]:.2f}"]
    print("\n".join(lines), flush=True)
    walls: dict[tuple, list[float]] = {lo: [] for lo in layouts}
    checks: dict[tuple, str] = {}
    histories: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="study_tp_") as tmp:
        for rnd in range(a.rounds):
            order = layouts if rnd % 2 == 0 else layouts[::-1]
            for p, t in order:
                folder = Path(tmp) / f"r{rnd}_{p}x{t}"
                wall, res = run_layout(spec, a.seeds, steps, p, t, folder)
                walls[(p, t)].append(wall)
                print(f"round {rnd}, {p}x{t}: {wall:.1f} s for {n_runs} runs "
                      f"({n_runs / wall * 3600:.1f} runs/hour), load {load_average()[0]:.2f}",
                      flush=True)
                if rnd == 0:
                    histories[f"{p}x{t}"] = {f"{r['strategy']}:{r['seed']}":
                                             comparable(r["history"]) for r in res.runs}
                if a.check and rnd == 0:
                    arm, seed = a.check.rsplit(":", 1)
                    run = next(r for r in res.runs if r["strategy"] == arm
                               and r["seed"] == int(seed))
                    from grpo_lab.training.experiments import _slug
                    again = alone(folder / "runs" / _slug(arm) / f"seed{seed}", t,
                                  Path(tmp) / f"alone_{p}x{t}")
                    same = comparable(again) == comparable(run["history"])
                    checks[(p, t)] = (f"{arm} seed {seed} trained alone with {t} thread(s): "
                                      f"{'every metric identical' if same else 'DIFFERS'} "
                                      f"({len(again)} rows)")
                    print("  " + checks[(p, t)], flush=True)
                    if not same:
                        print("  a study run differs from the same run alone", file=sys.stderr)
                        return 1
    first = layouts[0]
    out = ["", "| layout | wall s per study (rounds) | runs per hour of the machine | "
               f"vs {first[0]}x{first[1]} | check |", "|---|---|---|---|---|"]
    for lo in layouts:
        w = walls[lo]
        mean = sum(w) / len(w)
        ratio = [a0 / b0 for a0, b0 in zip(walls[first], w)]
        out.append(f"| {lo[0]} process(es) x {lo[1]} thread(s) | "
                   f"{', '.join(f'{x:.0f}' for x in w)} | {n_runs / mean * 3600:.1f} | "
                   f"{sum(ratio) / len(ratio):.2f}x | {checks.get(lo, '-')} |")
    out += ["", f"- end: {cpu_line()}; load {load_average()[0]:.2f}"]
    print("\n".join(out), flush=True)
    if a.histories:
        Path(a.histories).write_text(json.dumps(histories, sort_keys=True) + "\n")
    if a.compare:
        out += ["", f"Against `{a.compare}`: " + same_as(histories, json.loads(
            Path(a.compare).read_text()))]
        print(out[-1], flush=True)
    if a.out:
        Path(a.out).write_text("\n".join(lines + out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
