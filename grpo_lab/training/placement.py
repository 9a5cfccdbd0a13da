"""Where a study's runs train: one run per GPU, N GPUs -> N runs at once.

A study (experiments.py) trains each (strategy, seed) run in a worker process of its own. On
a machine whose torch sees N CUDA devices, it places them like this:

    devices = study_devices("auto")      # ["cuda:0", ..., "cuda:N-1"]; [] without a GPU
    slots = Slots(devices)               # one slot per GPU, all free
    job.cfg.speed.device = slots.take()        # a run starts: the lowest free GPU is its own
    slots.give(job.cfg.speed.device)           # it ended: the GPU is free for the next run

so at most N runs train at once and never two on one GPU. Each run's device is in its
``result.json`` ("cpu" on a machine without one). Nothing else changes: a run is the same
one-process ``trainer.train`` (``TrainConfig.speed.device`` moves its policy, reference and
rollouts), and a study without GPUs runs exactly as before (``device`` stays "", the CPU).

The settings are the study's, not a run's: ``run_experiment(devices=...)`` or
``grpo-lab study --devices``: "auto" (default: every visible GPU, else the CPU), "cpu" (no GPU
even where there is one), GPU indices ("0,2", "cuda:1", ["cuda:0", "cuda:1"]), or from Python
an int (the first N GPUs). The
study's ``study.json`` records the devices its runs were placed on; a resume on another
machine may place its remaining runs elsewhere (where a run trains does not change what it computes
beyond float rounding, so it is not part of what a resume must match).

Workers under GPUs are spawned, never forked: the study evaluates the base policy on its
first GPU, and CUDA cannot run in a child forked from a process that has initialised it.
"""
from __future__ import annotations

import dataclasses
import re

import torch

__all__ = ["study_devices", "Slots", "on_device", "DEVICE_CHOICES"]

DEVICE_CHOICES = ("'auto', 'cpu', GPU indices such as '0,2', 'cuda:1' or ['cuda:0', 'cuda:1'], "
                  "or (from Python) an int: the first N GPUs")


def study_devices(devices="auto") -> list[str]:
    """A study's ``devices`` setting -> the GPUs its runs are placed on, ["cuda:0", ...];
    [] for the CPU (module docstring). A GPU torch does not see is an error naming it."""
    n = torch.cuda.device_count()                     # 0 on a CPU build or without a GPU
    if devices in (None, "auto", ""):
        return [f"cuda:{k}" for k in range(n)]
    if devices == "cpu":
        return []
    if isinstance(devices, int):                      # a count; a string names indices
        if not 0 < devices <= n:
            raise ValueError(f"devices={devices!r} asks for {devices} GPU(s); torch sees {n} here")
        return [f"cuda:{k}" for k in range(devices)]
    items = devices.split(",") if isinstance(devices, str) else list(devices)
    out = []
    for item in items:
        m = re.fullmatch(r"(?:cuda:)?(\d+)", str(item).strip())
        if m is None:
            raise ValueError(f"devices: {item!r} is not a GPU; devices takes {DEVICE_CHOICES}")
        k = int(m.group(1))
        if k >= n:
            raise ValueError(f"devices: cuda:{k} is not here: torch sees {n} GPU(s)")
        if f"cuda:{k}" in out:
            raise ValueError(f"devices: cuda:{k} is given twice")
        out.append(f"cuda:{k}")
    return out


def on_device(cfg, device: str):
    """``cfg`` (a TrainConfig) training on ``device``: its ``speed.device`` set."""
    return dataclasses.replace(cfg, speed=dataclasses.replace(cfg.speed, device=device))


class Slots:
    """One slot per device: ``take`` gives a run the lowest free device, ``give`` frees it."""

    def __init__(self, devices: list[str]):
        if not devices:
            raise ValueError("Slots needs at least one device")
        self.devices = list(devices)
        self.free = list(devices)

    def take(self) -> str:
        if not self.free:
            raise RuntimeError(f"every device of {self.devices} holds a run: a run starts only "
                               f"when one ends")
        return self.free.pop(0)

    def give(self, device: str) -> None:
        if device not in self.devices or device in self.free:
            raise RuntimeError(f"{device!r} is not a device in use of {self.devices}")
        self.free = [d for d in self.devices if d in self.free or d == device]
