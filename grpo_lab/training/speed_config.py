"""``SpeedConfig`` (``TrainConfig.speed``): where a run trains and how fast, never what it computes.

Its own module, as ``ppo_config`` and ``hf_config``, so a config loads no trainer. On the
command line ``--speed.fast_path probe``; in a dict ``{"speed": {"fast_path": "probe"}}``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

FAST_PATHS = ("", "probe")
"""SpeedConfig.fast_path's values."""


@dataclass
class SpeedConfig:
    fast_path: str = ""
    """"" (the settings as given) or "probe": time the candidate settings of each phase on this
    machine (speed_probe.py: hf.sample_dtype, hf.autocast, threads per phase; cached per CPU,
    torch version and model) and train with the fastest that passes the bf16 accuracy check;
    policy="hf" only. The choice is in config.json (fast_path_choice) and the report."""
    rollout_threads: int = 0
    """torch CPU threads while the rollout samples (0: ``threads``); the update runs on
    ``threads``. fast_path="probe" sets both from what it measured fastest here."""
    device: str = ""
    """Where a one-process run trains: "" (the process group's device: a GPU under NCCL, else
    the CPU), "cpu", or "cuda" / "cuda:N" (a study places its runs one per GPU this way:
    experiments.py)."""

    def __post_init__(self):
        if self.fast_path not in FAST_PATHS:
            raise ValueError(f"speed.fast_path must be one of {FAST_PATHS}, got "
                             f"{self.fast_path!r}")
        if self.rollout_threads < 0:
            raise ValueError(f"speed.rollout_threads must be >= 0, got {self.rollout_threads}")
        if self.device and not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"speed.device must be '', 'cpu', 'cuda' or 'cuda:N', got "
                             f"{self.device!r}")

    def check(self, cfg) -> None:
        """What these settings need of the run (config.check_records asks)."""
        if self.fast_path and cfg.policy != "hf":
            raise ValueError(f"speed.fast_path={self.fast_path!r} probes a transformers "
                             f"model's settings; policy={cfg.policy!r} has none: use policy='hf'")
