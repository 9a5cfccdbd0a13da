"""``SpeedConfig`` (``TrainConfig.speed``): where a run trains and how fast; of its settings only
``async_steps`` changes what it computes (the rollout's weights are k updates old).

Its own module, as ``ppo_config`` and ``hf_config``, so a config loads no trainer. On the
command line ``--speed.fast_path probe``; in a dict ``{"speed": {"fast_path": "probe"}}``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from grpo_lab.registry import lookup

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
    ``threads``. fast_path="probe" sets both from what it measured fastest here. With
    async_steps > 0: the sampler thread's threads (0: 1), beside the update's ``threads``."""
    device: str = ""
    """Where a one-process run trains: "" (the process group's device: a GPU under NCCL, else
    the CPU), "cpu", or "cuda" / "cuda:N" (a study places its runs one per GPU this way:
    experiments.py)."""
    async_steps: int = 0
    """k: sample step t+k in a second thread, from a snapshot of the weights, while step t
    updates (async_rollout.py); 0 = sync (the rollout of step t on the weights after update
    t-1). Step t's completions then come from the weights k updates old (async/staleness);
    tis.cap recomputes pi_old on the current weights and weights the drift by truncated IS.
    GRPO and PPO, without dynamic sampling; a resumed run keeps it (it changes the numbers)."""
    update_forward: str = "prompt_once"
    """The training forward (engine.UPDATE_FORWARDS), whoever sampled: "prompt_once" (each
    prompt once, its KV cache shared by its G completions, logits only where a completion
    token is predicted), "packed" (each prompt once with its G completions in one row under an
    attention mask: one forward, so every weight gets one gradient GEMM instead of two added;
    its attention spans prompt + G completions, so it pays for short completions, e.g. on
    SmolLM2 with <= 16 tokens, BENCHMARKS.md section 15), "completion" (prompt + completion
    per row, logits on the completion only, TRL's logits_to_keep) or "all_positions" (logits
    everywhere). Same log-probs."""

    def __post_init__(self):
        if self.fast_path not in FAST_PATHS:
            raise ValueError(f"speed.fast_path must be one of {FAST_PATHS}, got "
                             f"{self.fast_path!r}")
        if self.rollout_threads < 0:
            raise ValueError(f"speed.rollout_threads must be >= 0, got {self.rollout_threads}")
        if not isinstance(self.async_steps, int) or isinstance(self.async_steps, bool) or \
                self.async_steps < 0:
            raise ValueError(f"speed.async_steps must be an int >= 0 (0: sync, k: the rollout "
                             f"k steps ahead), got {self.async_steps!r}")
        if self.device and not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"speed.device must be '', 'cpu', 'cuda' or 'cuda:N', got "
                             f"{self.device!r}")

    def check(self, cfg) -> None:
        """What these settings need of the run (config.check_records asks)."""
        from grpo_lab.policies.engine import UPDATE_FORWARDS
        lookup(UPDATE_FORWARDS, self.update_forward, "speed.update_forward")
        if self.fast_path and cfg.policy != "hf":
            raise ValueError(f"speed.fast_path={self.fast_path!r} probes a transformers "
                             f"model's settings; policy={cfg.policy!r} has none: use policy='hf'")
        if self.async_steps:
            from grpo_lab.training import async_rollout
            async_rollout.check(cfg)
