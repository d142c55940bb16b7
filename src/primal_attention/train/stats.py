"""Summary statistics of results over seeds: one mean ± std for every table and summary."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value) of a non-empty sequence."""
    if not values:
        raise ValueError("mean_std: no values")
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def percent_cell(values: Sequence[float]) -> str:
    """``mean ± sample std (n=k)`` of fractions, in percent; ``–`` when empty."""
    if not values:
        return "–"
    mean, sd = mean_std([100 * v for v in values])
    return f"{mean:.1f} ± {sd:.1f} (n={len(values)})"


def value_cell(values: Sequence[float], digits: int = 2) -> str:
    """``mean ± sample std`` to ``digits`` decimals (the value alone for one seed); ``–`` when empty."""
    if not values:
        return "–"
    mean, sd = mean_std(values)
    return f"{mean:.{digits}f} ± {sd:.{digits}f}" if len(values) > 1 else f"{mean:.{digits}f}"


def _t_cdf(x: float, df: float) -> float:
    """Student t CDF by Simpson's rule on the density (accurate to ~1e-9 for the quantiles used here)."""
    if x < 0:
        return 1.0 - _t_cdf(-x, df)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    steps = 2000
    h = x / steps
    total = 0.0
    for i in range(steps + 1):
        w = 1 if i in (0, steps) else (4 if i % 2 else 2)
        total += w * math.exp(log_c - (df + 1) / 2 * math.log1p((i * h) ** 2 / df))
    return 0.5 + total * h / 3


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (0.5 < p < 1), by bisection."""
    if not 0.5 < p < 1 or df <= 0:
        raise ValueError(f"t_quantile: need 0.5 < p < 1 and df > 0, got p={p}, df={df}")
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Difference:
    """mean(a) − mean(b) with its Welch 95 % interval over seeds, and a verdict: "better" / "worse"
    (the interval excludes 0, in the metric's good / bad direction) or "within noise"."""

    diff: float
    low: float
    high: float
    n_a: int
    n_b: int
    verdict: str
    method: str = "Welch t, 95 %"
    se: float = math.nan  # the standard error of the difference
    df: float = math.nan  # Welch's degrees of freedom
    level: float = 0.95

    def detectable(self, power: float = 0.8) -> float:
        """The smallest true difference this many seeds find (the interval excluding 0) with probability ``power``,
        taking the observed spread as the true one: (t_{1-α/2} + t_power) · se, e.g. ≈ 1.4× the interval's
        half width at 80 % and about 10 degrees of freedom (at 50 %: the half width); 0.5 <= ``power`` < 1;
        nan without an interval, 0 where every value of both samples agrees."""
        if not 0.5 <= power < 1:
            raise ValueError(f"detectable: power must lie in [0.5, 1), got {power}")
        if math.isnan(self.se) or self.se == 0:
            return self.se
        return (t_quantile(0.5 + self.level / 2, self.df) + (t_quantile(power, self.df) if power != 0.5 else 0.0)) * self.se

    def cell(self, scale: float = 1.0, digits: int = 1, *, directed: bool = True) -> str:
        """``+d [low, high] verdict``; with ``directed`` False (a difference that is no verdict, e.g. beside a
        starved reference) an interval that excludes 0 reads *excludes 0* instead of better / worse."""
        if math.isnan(self.low):
            return f"{scale * self.diff:+.{digits}f} (n < 2: no interval)"
        word = self.verdict if directed or self.verdict not in ("better", "worse") else "excludes 0"
        return f"{scale * self.diff:+.{digits}f} [{scale * self.low:+.{digits}f}, {scale * self.high:+.{digits}f}] {word}"


def welch_difference(a: Sequence[float], b: Sequence[float], *, maximize: bool = True, level: float = 0.95) -> Difference:
    """Difference of means of ``a`` and ``b`` (e.g. a primal model's and the Transformer's val-selected
    test accuracy over seeds) with Welch's ``level`` interval; both need two or more values for one."""
    if not a or not b:
        raise ValueError("welch_difference: both samples need at least one value")
    diff = statistics.mean(a) - statistics.mean(b)
    if len(a) < 2 or len(b) < 2:
        return Difference(diff, math.nan, math.nan, len(a), len(b), "no interval")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se, df = math.sqrt(va + vb), math.nan
    if se == 0:
        low = high = diff
    else:
        df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
        half = t_quantile(0.5 + level / 2, df) * se
        low, high = diff - half, diff + half
    if low > 0 or high < 0:
        good = (low > 0) == maximize
        verdict = "better" if good else "worse"
    else:
        verdict = "within noise"
    return Difference(diff, low, high, len(a), len(b), verdict, se=se, df=df, level=level)
