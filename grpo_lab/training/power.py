"""How many seeds a study needs: the power of the paired t-test, before any run.

A study compares two arms seed by seed: d_s = metric(arm a, seed s) - metric(arm b, seed s),
and ``experiments.Results.compare`` reports mean(d) with its 95% t-interval over n seeds.
That interval excludes 0 when |t| = |mean(d)| / (sd(d) / sqrt(n)) > t(0.975, n - 1). If the
true difference is delta, t follows the noncentral t distribution with n - 1 degrees of
freedom and noncentrality delta * sqrt(n) / sd(d), so the chance of a verdict is

    power(delta, sd, n) = P(T' > t_c) + P(T' < -t_c),   T' ~ nct(n - 1, delta sqrt(n) / sd)

(the exact power of the two-sided paired t-test; scipy's nct). Worked by hand with the
normal approximation and Guenther's t correction (Guenther 1981),

    n ~ ((z(1 - alpha/2) + z(power)) * sd / delta)^2 + z(1 - alpha/2)^2 / 2,

delta = sd at 80% power and alpha 0.05: (1.960 + 0.842)^2 + 1.960^2 / 2 = 7.85 + 1.92 = 9.77,
so 10 seeds; the exact power with 10 is 0.803. With 3 seeds the smallest difference seen 80%
of the time is 3.26 sd(d) (the t quantile with 2 degrees of freedom is 4.30, not 1.96).
"""
from __future__ import annotations

import math

__all__ = ["paired_power", "detectable_difference", "seeds_needed"]


def _check(sd: float, n: int | None = None) -> None:
    if not (isinstance(sd, (int, float)) and math.isfinite(sd) and sd > 0):
        raise ValueError(f"sd (the seed-to-seed spread of the paired difference) must be a "
                         f"positive number, got {sd!r}")
    if n is not None and (isinstance(n, bool) or int(n) != n or n < 2):
        raise ValueError(f"a paired t-test needs at least 2 seeds, got n={n!r}")


def paired_power(delta: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """The chance that the two-sided paired t-test over ``n`` seeds rejects "no difference"
    at level ``alpha`` when the true mean difference is ``delta`` and its seed-to-seed
    standard deviation ``sd`` (noncentral t, df n - 1)."""
    from scipy.stats import nct, t
    _check(sd, n)
    df = n - 1
    tc = t.ppf(1 - alpha / 2, df)                      # the interval's quantile: 4.303 for n=3
    nc = abs(delta) * math.sqrt(n) / sd
    return float(nct.sf(tc, df, nc) + nct.cdf(-tc, df, nc))


def detectable_difference(sd: float, n: int, power: float = 0.8, alpha: float = 0.05) -> float:
    """The smallest true difference the paired t-test over ``n`` seeds finds with probability
    ``power`` (in the metric's units: sd's)."""
    from scipy.optimize import brentq
    _check(sd, n)
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1), got {power!r}")
    hi = sd
    while paired_power(hi, sd, n, alpha) < power:      # bracket the root
        hi *= 2
    return float(brentq(lambda d: paired_power(d, sd, n, alpha) - power, 0.0, hi, xtol=1e-10))


def seeds_needed(delta: float, sd: float, power: float = 0.8, alpha: float = 0.05,
                 max_seeds: int = 100_000) -> int:
    """The fewest seeds (at least 2) whose paired t-test finds a true difference ``delta``
    with probability ``power``."""
    _check(sd)
    if not (isinstance(delta, (int, float)) and math.isfinite(delta) and delta != 0):
        raise ValueError(f"the difference to detect must be a non-zero number, got {delta!r}")
    from scipy.stats import norm
    za, zb = norm.ppf(1 - alpha / 2), norm.ppf(power)
    n = max(2, math.ceil(((za + zb) * sd / abs(delta)) ** 2 + za ** 2 / 2))   # Guenther: a start
    while n > 2 and paired_power(delta, sd, n - 1, alpha) >= power:
        n -= 1
    while paired_power(delta, sd, n, alpha) < power:
        n += 1
        if n > max_seeds:
            raise ValueError(f"more than {max_seeds} seeds to see {delta} with sd {sd}")
    return n
