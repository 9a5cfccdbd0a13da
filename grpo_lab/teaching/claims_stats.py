"""One scale for comparing two methods over paired seeds (claims 10 and 21): the geometric mean of
per-seed ratios with the t-interval of the mean log-ratio, exponentiated."""
from __future__ import annotations

import math


def ratio_interval(ratios, level: float = 0.95) -> dict:
    """Claims 10 and 21 on one scale: per-seed ratios, their geometric mean and the t-interval
    of the mean log-ratio, exponentiated (a ratio's interval stays positive and symmetric in
    log: 2x and 0.5x are equally far from 1). PPO's samples over GRPO's: a 50-70% cut of
    samples is a ratio of 2.0-3.3x. -> {"ratios", "mean", "low", "high"}."""
    from grpo_lab.training.experiments import mean_ci
    ratios = [float(r) for r in ratios]
    if not ratios or min(ratios) <= 0:
        raise ValueError(f"ratios must be positive, got {ratios}")
    m, lo, hi = mean_ci([math.log(r) for r in ratios], level)
    return {"ratios": ratios, "mean": math.exp(m), "low": math.exp(lo), "high": math.exp(hi)}


def paired_ratio(numerators, denominators, level: float = 0.95) -> dict:
    """``ratio_interval`` of a_s / b_s over paired seeds s."""
    if len(numerators) != len(denominators):
        raise ValueError(f"paired ratios need one denominator per numerator, got {len(numerators)} "
                         f"numerators, {len(denominators)} denominators")
    return ratio_interval([a / b for a, b in zip(numerators, denominators)], level)
