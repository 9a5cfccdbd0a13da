"""A study placed on the GPUs (training/placement.py), checked where GPUs are: a tiny study of
toy runs, one run per visible GPU at once, then the same study on the CPU -> each run's
device, the wall time of each, and how far the GPU runs' final accuracies are from the CPU's.

    PYTHONPATH=. .venv/bin/python bench/bench_gpu_study.py [--arms 2] [--seeds 2] [--steps 20]

On a machine without a CUDA GPU it prints ``no GPU: nothing measured`` and exits with code 0
(a CPU-only CI never measures anything here). With N GPUs, ``--arms`` x ``--seeds`` runs of
the ``quick`` preset (the toy policy; the second arm has lr 2e-4) train N at once, each on a
GPU of its own, in spawned workers (``devices="auto"``); then the same study with
``devices="cpu"``. It prints each run's device (from its result.json; a GPU run that names no
GPU stops the script), each study's wall time, and the largest difference of a run's final
eval/accuracy between the two. Toy runs are small: what this checks is that the placement
works on real GPUs, not a speed-up (tests/test_placement.py checks on the CPU, with a faked
GPU count, that no GPU holds two runs at once).
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time


def machine() -> str:
    """The CPU (lscpu's model name and flags count), the load and the GPUs."""
    import torch
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        info = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
        cpu = (f"{info.get('Model name', '?').strip()} ({len(info.get('Flags', '').split())} "
               f"flags, {os.cpu_count()} cores)")
    except OSError:
        cpu = platform.processor() or platform.machine()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    gpus = ", ".join(torch.cuda.get_device_name(k) for k in range(torch.cuda.device_count()))
    return f"CPU {cpu}, load {load:.2f}; GPUs: {gpus}; torch {torch.__version__}"


def study(devices: str, arms: int, seeds: int, steps: int, out: str):
    from grpo_lab.training.experiments import run_experiment
    strategies = {"lr1e-4": {}, "lr2e-4": {"lr": 2e-4}, "lr5e-5": {"lr": 5e-5},
                  "lr3e-4": {"lr": 3e-4}}
    base = {"steps": steps, "eval_every": steps, "eval_size": 50, "prompts_per_step": 8,
            "group_size": 4}
    t0 = time.perf_counter()
    res = run_experiment(dict(list(strategies.items())[:arms]), seeds=range(seeds), base=base,
                         base_preset="quick", out_dir=out, progress=False, devices=devices,
                         start_method="spawn", in_process=False)
    return res, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", type=int, default=2, choices=(1, 2, 3, 4))
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("no GPU: nothing measured (bench/bench_gpu_study.py needs CUDA; exit code 0)")
        return 0
    print(machine())
    walls, finals = {}, {}
    for devices in ("auto", "cpu"):
        with tempfile.TemporaryDirectory() as tmp:
            res, walls[devices] = study(devices, args.arms, args.seeds, args.steps, tmp)
        finals[devices] = [r["history"][-1].get("eval/accuracy") for r in res.runs]
        print(f"devices={devices}: {len(res.runs)} runs in {walls[devices]:.1f} s")
        for r in res.runs:
            print(f"  {r['strategy']} seed {r['seed']}: {r['device']}, eval/accuracy "
                  f"{r['history'][-1].get('eval/accuracy')}")
        used = [r["device"] for r in res.runs]
        if devices == "auto" and not all(d.startswith("cuda:") for d in used):
            raise SystemExit(f"a run of the GPU study did not train on a GPU: {used}")
    diff = max(abs(a - b) for a, b in zip(finals["auto"], finals["cpu"]))
    print(f"largest |GPU - CPU| final eval/accuracy over the runs: {diff:.3f} "
          f"(float rounding can flip a sampled token, so small differences are expected)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
