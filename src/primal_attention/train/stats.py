"""Summary statistics of results over seeds: one mean ± std for every table and summary."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


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
