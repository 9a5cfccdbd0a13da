"""Per-shard importance scores from running gradient statistics (no history kept).

The popular description of "importance-aware sharding" scores each parameter shard by

    seed = 0.7 * mean variance of the recent gradient history + 0.3 * current gradient norm

and keeps the recent gradients in a list to compute that variance. A window of k gradients
costs 4k bytes per element (k=10: 40 bytes, five times Adam's state). We keep instead an
exponential moving mean and variance per element (West 1979; Finch 2009, "Incremental
calculation of weighted mean and variance", eqs. 124 and 143), with decay d (default 0.9,
an effective window of 1/(1-d) = 10 steps):

    delta = g - mean
    mean <- mean + (1 - d) * delta
    var  <- d * (var + (1 - d) * delta**2)

That is 8 bytes per element, the same as Adam's exp_avg + exp_avg_sq, and in the sharder it
lives only on the shard's owner (so 8/N per element per rank) and migrates with the shard.
The first gradient sets mean = g, var = 0.

Scores, siblings with one signature ``(moments: RunningMoments, grad (n,)) -> float``,
collected in ``IMPORTANCE``:

  * ``seed``:     0.7 * mean(var) + 0.3 * ||g||_2, the popular formula as stated.
  * ``norm``:     ||g||_2.
  * ``variance``: mean(var).
  * ``snr``:      mean(mean**2) / (mean(var) + eps), the gradient signal-to-noise ratio
                  (how much of the gradient is a steady direction rather than noise).

Where the popular formula deserves a warning: its two terms have different units. var is in
gradient units squared and the norm in gradient units summed over the shard (it grows as
sqrt(numel)); for typical gradients (|g| ~ 1e-3) 0.7 * var is ~1e-6 against a norm of
~1e-3 * sqrt(n), so ``seed`` ranks shards almost exactly as ``norm`` does, and larger shards
look "more important" because they are larger. Equal-sized shards (see shard_plan.make_shards)
make the norm comparable; the 0.7 weight stays mostly decorative. tests/test_sharder.py
checks the formula on hand-worked values; bench/bench_sharder.py shows the ranking.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_lab.registry import lookup

DEFAULT_DECAY = 0.9
EPS = 1e-12


@dataclass
class RunningMoments:
    """Exponential moving mean and variance of one shard's gradient, per element."""
    mean: torch.Tensor
    """(n,) running mean of the gradient."""
    var: torch.Tensor
    """(n,) running variance of the gradient (0 after the first step)."""
    steps: int = 0
    """Gradients seen so far."""

    @property
    def nbytes(self) -> int:
        return self.mean.nbytes + self.var.nbytes


def init_moments(numel: int, device="cpu", dtype=torch.float32) -> RunningMoments:
    return RunningMoments(torch.zeros(numel, device=device, dtype=dtype),
                          torch.zeros(numel, device=device, dtype=dtype))


def update_moments(m: RunningMoments, grad: torch.Tensor, decay: float = DEFAULT_DECAY) -> RunningMoments:
    """Fold one gradient (n,) into the running moments, in place; returns ``m``."""
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"decay must be in [0, 1), got {decay}")
    if grad.shape != m.mean.shape:
        raise ValueError(f"gradient shape {tuple(grad.shape)} does not match the moments' "
                         f"{tuple(m.mean.shape)}")
    if m.steps == 0:
        m.mean.copy_(grad)
        m.var.zero_()
    else:
        delta = grad - m.mean                                               # (n,)
        m.mean.add_(delta, alpha=1 - decay)                                 # Finch eq. 124
        m.var.add_(delta * delta, alpha=1 - decay).mul_(decay)             # Finch eq. 143
    m.steps += 1
    return m


def seed_score(m: RunningMoments, grad: torch.Tensor) -> float:
    return 0.7 * float(m.var.mean()) + 0.3 * float(grad.norm())


def norm_score(m: RunningMoments, grad: torch.Tensor) -> float:
    return float(grad.norm())


def variance_score(m: RunningMoments, grad: torch.Tensor) -> float:
    return float(m.var.mean())


def snr_score(m: RunningMoments, grad: torch.Tensor) -> float:
    return float((m.mean * m.mean).mean()) / (float(m.var.mean()) + EPS)


IMPORTANCE = {
    "seed": seed_score,
    "norm": norm_score,
    "variance": variance_score,
    "snr": snr_score,
}


def get_importance(name: str):
    return lookup(IMPORTANCE, name, "importance score")
