"""The step jitter's log-sd (`executor.step_jitter`): from a profile's spread over its repeats
(the prediction) or from the real steps' spread about the model (a diagnostic fitted to the
runs)."""
from __future__ import annotations

import numpy as np
import pandas as pd


def real_sigma(res: pd.DataFrame) -> float:
    """The log-sd of the real steps about the model, as `jitter_sigma` reads a profile's:
    (p90 - p10) / 2.5632 of ln(measured / predicted), each iteration's taken about the median
    of its composition (what the model misses by composition is not spread)."""
    lr = np.log(res["measured_s"] / res["predicted_s"])
    lr = lr - lr.groupby(res["composition"]).transform("median")
    return float((lr.quantile(0.9) - lr.quantile(0.1)) / (2 * 1.2816))


def jitter_sigma(profile) -> float:
    """The log-sd of a step's time around its median, from the profile's repeats: per row
    ln(p90 / p10) / (2 x 1.2816), as a lognormal has it; the median over the rows."""
    prof = pd.read_parquet(profile)
    ok = (prof["time_p10_s"] > 0) & (prof["time_p90_s"] >= prof["time_p10_s"])
    r = np.log(prof.loc[ok, "time_p90_s"] / prof.loc[ok, "time_p10_s"]) / (2 * 1.2816)
    if not len(r):
        raise ValueError(f"{profile}: no row with a measured spread (p10 > 0)")
    return float(np.median(r))
