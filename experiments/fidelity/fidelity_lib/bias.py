"""The simulation against the real runs: per policy and figure, the error against the runs' mean
and whether it lies in their interval (`verdict`); over figures, the bias and the spread of the
errors (`bias`); the bias's own interval over the rounds of real runs (`bias_interval`); and the
bias at the profile's own speed (`round_levels`, `matched_bias`), since a round's bias is mostly
how fast the machine ran that round."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .interval import mean_interval, t95
from .runs import METRICS, metric_name

# the figures the bias is taken over: latency percentiles (not throughput or counts, which the
# arrival rate and the trace fix while the system keeps up)
LATENCY = [metric_name(m, q) for m, q in METRICS if q]


# the issue's goal: these inside the real runs' interval
GOAL = ["ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99"]


def verdict(real: dict[str, list[dict]], sim: dict[str, dict]) -> pd.DataFrame:
    """Per policy and figure: the real runs' mean and 90% interval (`mean_interval`), their
    spread (max - min) / mean, the simulated value, its error against the mean and whether it
    lies inside the interval."""
    rows = []
    for policy, runs in real.items():
        for name in (metric_name(m, q) for m, q in METRICS):
            vals = [r[name] for r in runs]
            m, lo, hi = mean_interval(vals)
            s = float(sim[policy][name])
            rows.append({"policy": policy, "metric": name, "real_mean": m, "real_lo": lo,
                         "real_hi": hi, "half_width": (hi - m) / m if m else np.nan,
                         "real_spread": (max(vals) - min(vals)) / m if m else np.nan,
                         "sim": s, "error": s / m - 1 if m else np.nan,
                         "inside": bool(lo <= s <= hi), "repeats": len(vals)})
    return pd.DataFrame(rows)


def bias(table: pd.DataFrame, metrics=None) -> dict:
    """Over the latency figures (`metrics`, default all of LATENCY) of `verdict`'s table: the
    bias (mean signed error), the spread of the errors about it (their standard deviation), the
    mean |error|, the figures inside the real runs' interval, and the real runs' own spread
    (the median interval half-width, relative to the mean)."""
    t = table[table["metric"].isin(metrics or LATENCY)]
    e = t["error"].to_numpy(dtype=float)
    return {"figures": len(t), "bias": float(e.mean()), "error_sd": float(e.std(ddof=1)),
            "mean_abs_error": float(np.abs(e).mean()), "inside": int(t["inside"].sum()),
            "half_width_median": float(t["half_width"].median())}


def bias_interval(real: dict[str, list[dict]], sim: dict[str, dict], metrics=None) -> dict:
    """The bias's own 90% interval: can five rounds of real runs tell it from 0? The runs of one
    round (repeat i of every policy, back to back) share the machine's state, and that state
    moves every figure of a run together (a figure's runs differ by more than its steps'
    noise would make them), so the figures' errors are not independent and the spread of the
    errors over figures says nothing of the bias's uncertainty. Per round i: the mean over
    policies and `metrics` (default LATENCY) of sim / run_i - 1; the half-width of the
    t-interval of the rounds' biases (`mean_interval`) about the bias (`bias`'s, against the
    runs' means: the rounds' own mean is higher by Jensen's inequality, 1 / x being convex)."""
    ms = metrics or LATENCY
    rounds = {len(r) for r in real.values()}
    if len(rounds) != 1:
        raise ValueError(f"every policy needs as many rounds of real runs, got {sorted(rounds)}")
    per = [float(np.mean([sim[p][m] / real[p][i][m] - 1 for p in real for m in ms]))
           for i in range(rounds.pop())]
    m, lo, _ = mean_interval(per)
    b = float(np.mean([sim[p][m] / np.mean([r[m] for r in real[p]]) - 1
                       for p in real for m in ms]))
    return {"per_round": per, "bias": b, "half_width": m - lo, "lo": b - (m - lo),
            "hi": b + (m - lo)}


def round_levels(res: pd.DataFrame) -> list[float]:
    """Per round of real runs (repeat i of every policy: runs named real-<i>), its steps'
    measured time over what the profile predicts for them (`residuals`, a ratio of sums, which
    is what a latency sees): how slow the machine ran that round against the profile."""
    rep = res["run"].str.extract(r"real-(\d+)$")[0]
    if rep.isna().any():
        raise ValueError("round_levels: every run's folder must be named real-<i>")
    g = res.groupby(rep.astype(int))
    return (g["measured_s"].sum() / g["predicted_s"].sum()).sort_index().tolist()


def matched_bias(per_round, levels) -> dict:
    """The bias at the profile's own speed. A round whose machine ran slower than the profile
    has every figure's error lower by about the same share, so a study's bias is mostly its
    rounds' speed (on this machine 0.85-1.17 of the profile from one round to the next), not
    the simulation's. The per-round biases (`bias_interval`'s) against the log of the rounds'
    levels (`round_levels`), a least-squares line: its intercept, the bias of a round whose
    steps took in sum what the profile predicts, with its 90% t-interval (n - 2 degrees of
    freedom), the slope (the bias per unit of log level) and the correlation."""
    x, y = np.log(np.asarray(levels, dtype=float)), np.asarray(per_round, dtype=float)
    n = len(y)
    if n != len(x) or n < 3:
        raise ValueError(f"matched_bias: needs as many levels as rounds, >= 3 (got {n} "
                         f"rounds, {len(x)} levels)")
    if np.ptp(x) == 0:
        raise ValueError("matched_bias: every round ran at the same level; no line through them")
    a = np.c_[np.ones(n), x]
    coef = np.linalg.lstsq(a, y, rcond=None)[0]
    resid = y - a @ coef
    cov = float(resid @ resid) / (n - 2) * np.linalg.inv(a.T @ a)
    h = t95(n - 2) * float(np.sqrt(cov[0, 0]))
    return {"bias": float(coef[0]), "lo": float(coef[0] - h), "hi": float(coef[0] + h),
            "slope": float(coef[1]), "r": float(np.corrcoef(x, y)[0, 1]), "rounds": n}


def bias_rows(real: dict, sim: dict, **label) -> list[dict]:
    """The goal's and all latency figures' bias of `sim` against the real runs, a row each
    (with `label`'s columns first): bias, its 90% interval, the errors' sd, figures inside."""
    vb, rows = variant_bias(real, sim), []
    for g in ("goal", "latency"):
        b, iv = vb[g], vb[g]["interval"]
        rows.append({**label, "figures": g, "bias": b["bias"],
                     "bias_90": f"{iv['lo']:+.1%} to {iv['hi']:+.1%}",
                     "error_sd": b["error_sd"], "inside": b["inside"], "of": b["figures"]})
    return rows


# every real iteration priced on each profile (`residuals`), kept in a study's runs/ folder
RESIDUALS = {"median": "residuals.parquet", "mean": "residuals_mean.parquet"}


def profile_of(variant: str) -> str:
    """Which profile a simulation variant runs on: the rounds' speeds are taken against it."""
    return "mean" if variant.startswith("mean") else "median"


def variant_bias(real: dict, sim: dict, levels=None) -> dict:
    """{"latency" | "goal": `bias` over those figures, its "interval" (`bias_interval`) and,
    given the rounds' levels (>= 3 rounds), its "matched" bias (`matched_bias`)}."""
    t = verdict(real, sim)
    out = {}
    for g, ms in (("latency", None), ("goal", GOAL)):
        iv = bias_interval(real, sim, ms)
        out[g] = {**bias(t, ms), "interval": iv}
        if levels is not None and len(levels) >= 3:
            out[g]["matched"] = matched_bias(iv["per_round"], levels)
    return out
