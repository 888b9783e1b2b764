"""The 90% t-interval of the mean of a few runs, with the t distribution's quantile it needs
(a table and a series, so that the study needs no scipy)."""
from __future__ import annotations

import numpy as np

# Student's t, 95th percentile, by degrees of freedom 1-30 (a 90% two-sided interval)
T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782,
       1.771, 1.761, 1.753, 1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711,
       1.708, 1.706, 1.703, 1.701, 1.699, 1.697)


def t95(df: int) -> float:
    """The t distribution's 95th percentile: the table to 30 degrees of freedom, beyond it the
    Cornish-Fisher series about the normal's 1.6449 (within 1e-4 there)."""
    if df < 1:
        raise ValueError(f"an interval of the mean needs at least 2 runs (got {df + 1})")
    if df <= len(T95):
        return T95[df - 1]
    z = 1.6448536
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def mean_interval(vals) -> tuple[float, float, float]:
    """(mean, low, high): the 90% t-interval of the mean of the runs, mean +- t95(n - 1) s /
    sqrt(n), s the sample standard deviation. Of the mean, not of one run: the simulation
    predicts a figure's expected value, and the question is whether the runs' mean differs from
    it by more than their number can resolve (an empirical 5-95% of five runs would be their
    minimum and maximum, which hold a sixth run with probability 4/6, not 0.9)."""
    v = np.asarray(vals, dtype=float)
    m = float(v.mean())
    h = t95(len(v) - 1) * float(v.std(ddof=1)) / np.sqrt(len(v))
    return m, m - h, m + h
