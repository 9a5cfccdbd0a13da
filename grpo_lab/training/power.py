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

The sd itself is an estimate. From 3 seeds (2 degrees of freedom) the true sd can be several
times the one seen: (df) s^2 / sigma^2 ~ chi2(df), so sigma <= s sqrt(df / chi2(0.05, df)) with
95% confidence (``sd_upper``): 4.42 s for df 2, 2.37 s for df 4, 1.65 s for df 9. A
difference computed at the observed sd is reached with 80% power only when the true sd is no
larger, which with df 2 happens 37% of the time; at the upper bound, 95% of the time. So
``detectable`` states the difference at the bound, and the one at the observed sd beside it
as a rough figure; ``seeds_needed(..., df=)`` plans with the bound too.
"""
from __future__ import annotations

import math

__all__ = ["paired_power", "detectable_difference", "seeds_needed", "sd_upper", "detectable"]


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
    upper = float(nct.sf(tc, df, nc))
    # P(T' < -tc) = P(-T' > tc), -T' ~ nct(df, -nc); scipy's nct.cdf gives NaN out there
    # (df 1, nc 22.5), and the term is below Phi(-nc) anyway: 0 when it cannot be computed
    lower = float(nct.sf(tc, df, -nc))
    if not math.isfinite(upper):
        raise ValueError(f"the power of {n} seeds at delta={delta}, sd={sd} could not be "
                         f"computed (noncentral t, df {df}, noncentrality {nc:.3g})")
    return upper + (lower if math.isfinite(lower) else 0.0)


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
                 max_seeds: int = 100_000, df: int | None = None) -> int:
    """The fewest seeds (at least 2) whose paired t-test finds a true difference ``delta``
    with probability ``power``; ``df``: the degrees of freedom ``sd`` was estimated with,
    then planned at its upper bound (``sd_upper``; None: sd taken as known)."""
    _check(sd)
    sd = sd if df is None else sd_upper(sd, df)
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


def sd_upper(sd: float, df: int, level: float = 0.95) -> float:
    """The one-sided ``level`` upper confidence bound of a standard deviation estimated as
    ``sd`` with ``df`` degrees of freedom (normal errors): sd * sqrt(df / chi2(1 - level, df)).
    df 2: chi2(0.05, 2) = 0.1026, so 4.415 sd."""
    from scipy.stats import chi2
    _check(sd)
    if isinstance(df, bool) or int(df) != df or df < 1:
        raise ValueError(f"an sd's degrees of freedom must be a whole number >= 1 (seeds - 1), "
                         f"got df={df!r}")
    return float(sd * math.sqrt(df / chi2.ppf(1 - level, df)))


def detectable(sd: float, n: int, df: int | None, power: float = 0.8,
               alpha: float = 0.05) -> dict:
    """What ``n`` seeds can detect when the paired difference's sd was estimated as ``sd``
    with ``df`` degrees of freedom -> {"sd", "df", "sd_bound" (the 95% upper bound; sd itself
    when df is None: an sd taken as known), "detectable" (the difference found with
    probability ``power`` at sd_bound: the figure to state), "rough" (the same at the
    observed sd: a rough figure, reached only when the true sd is no larger)}."""
    bound = sd if df is None else sd_upper(sd, df)
    return {"sd": sd, "df": df, "sd_bound": bound,
            "detectable": detectable_difference(bound, n, power, alpha),
            "rough": detectable_difference(sd, n, power, alpha)}
