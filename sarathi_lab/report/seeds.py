"""Runs that differ only in their seed: one configuration, aggregated over its seeds.

A *seed setting* is a swept key named `seed` or ending in `.seed` (`seed`, the run's every random
stream; `trace.seed`, `executor.seed`). A *configuration* is what a run ran apart from its seeds:
every swept setting except the seed settings, plus what the run's config says it ran (policy and
its budgets, model, hardware or a replay's endpoint, trace, load, SLO). A capacity search is aggregated per criterion.

Per configuration and numeric metric (seeds where the metric is null are left out, n counts the
others): the mean, and an interval `lo`..`hi`:
- n >= 4: the 95% Student-t interval of the mean, mean -+ t(0.975, n-1) * s / sqrt(n) (s the
  sample standard deviation, ddof 1);
- n = 2 or 3: the smallest and the largest value. With so few seeds a t interval is mostly its own
  t factor (12.7 for n = 2, 4.3 for n = 3) and says little; the range says what was seen;
- n = 1: the value itself (lo = hi = mean).
A true/false metric (`slo_meets_tbt_slo`) gets only its mean: the share of seeds where it holds.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from sarathi_lab.report.cells import plain
from sarathi_lab.settings import missing

LEVEL = 0.95
T_MIN_SEEDS = 4          # from this many seeds on, the t interval; below it, min-max
# what a run ran besides its swept settings (report.tables.identity)
CONFIG_COLUMNS = ("policy", "token_budget", "max_num_batched_tokens", "max_num_seqs", "model",
                  "hardware", "endpoint", "tensor_parallel", "trace", "qps", "clients", "slo")
ROW_COLUMNS = ("criterion", "source")   # a capacity search has a row per criterion
_NOT_METRICS = frozenset({"label", "config", "run_dir", "overrides"})


def is_seed_key(key: str) -> bool:
    return key == "seed" or key.endswith(".seed")


def interval_name(n: int) -> str:
    return "t95" if n >= T_MIN_SEEDS else "min-max" if n >= 2 else "none" if n == 1 else ""


# ------------------------------------------------------------------------------------------
# Student t quantile (no SciPy among the dependencies): bisection on the CDF, which is a
# regularized incomplete beta function, evaluated by its continued fraction (Lentz's method)
# ------------------------------------------------------------------------------------------

def _betacf(a: float, b: float, x: float) -> float:
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b), regularized."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with df degrees of freedom."""
    assert 0.0 < p < 1.0 and df > 0, (p, df)
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo <= 1e-12 * hi:
            break
    return 0.5 * (lo + hi)


def spread(values) -> tuple[int, float, float, float]:
    """(n, mean, lo, hi) of the non-missing values, by the rule in the module's docstring."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    n = len(v)
    if n == 0:
        return 0, np.nan, np.nan, np.nan
    mean = float(v.mean())
    if n < T_MIN_SEEDS:
        return n, mean, float(v.min()), float(v.max())
    half = t_quantile(0.5 + LEVEL / 2, n - 1) * float(v.std(ddof=1)) / math.sqrt(n)
    return n, mean, mean - half, mean + half


def spread_rows(matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`spread` of each column of a (seeds x points) matrix: n, mean, lo, hi as arrays (for a
    CDF's quantile curves, one row per seed)."""
    m = np.asarray(matrix, dtype=float)
    cols = [spread(m[:, j]) for j in range(m.shape[1])]
    return tuple(np.array(c) for c in zip(*cols)) if cols else (np.array([]),) * 4


# ------------------------------------------------------------------------------------------
# Configurations of a run (or capacity) table
# ------------------------------------------------------------------------------------------

def seed_keys(table: pd.DataFrame) -> list[str]:
    """The swept seed settings of the table's runs (varying or not)."""
    return [k for k in table.attrs.get("override_keys", []) if is_seed_key(k) and k in table]


def config_columns(table: pd.DataFrame) -> list[str]:
    """The columns that identify a configuration: the swept settings but the seeds, and what
    the runs' configs say they ran."""
    swept = [k for k in table.attrs.get("override_keys", []) if not is_seed_key(k) and k in table]
    return [c for c in CONFIG_COLUMNS if c in table and c not in swept] + swept


def config_ids(table: pd.DataFrame) -> pd.Series:
    """A number per configuration, in order of first appearance (missing values are values)."""
    cols = config_columns(table)
    if table.empty or not cols:
        return pd.Series(np.arange(len(table)), index=table.index)
    key = table[cols].map(lambda v: "\x00missing" if missing(v) else repr(v))
    return key.groupby(cols, sort=False, dropna=False).ngroup()


def _kinds(table: pd.DataFrame, skip) -> tuple[list[str], list[str]]:
    """(numeric metric columns, true/false metric columns) of the table, `skip` left out."""
    nums, bools = [], []
    for c in table.columns:
        if c in skip or c in _NOT_METRICS:
            continue
        s = table[c]
        vals = s.dropna()
        if s.dtype == bool or (len(vals) and vals.map(lambda v: isinstance(v, (bool, np.bool_))).all()):
            bools.append(c)
        elif pd.api.types.is_numeric_dtype(s):
            nums.append(c)
    return nums, bools


def by_config(table: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration (and capacity criterion): its columns, `n_seeds`, `seeds` (their values, e.g. "seed=0
    seed=1"), `interval` (the rule for n_seeds: t95, min-max, none), `run_dirs`, and for every
    numeric metric M: M_mean, M_lo, M_hi (and M_n where some seed lacks it); for a true/false
    metric M_mean only. Rows in the table's order."""
    if table.empty:
        return pd.DataFrame()
    seeds = seed_keys(table)
    cols = config_columns(table) + [c for c in ROW_COLUMNS if c in table]
    nums, bools = _kinds(table, set(cols) | set(seeds))
    by = [config_ids(table)] + [table[c] for c in ROW_COLUMNS if c in table]
    rows = []
    for _, g in table.groupby(by, sort=True):
        first = g.iloc[0]
        row = {"config": first.get("config", first.get("label"))}
        row.update({c: first[c] for c in cols})
        row["n_seeds"] = len(g)
        row["seeds"] = " ".join(",".join(f"{k}={plain(r[k])}" for k in seeds)
                                for _, r in g.iterrows()) if seeds else ""
        row["interval"] = interval_name(len(g))
        row["run_dirs"] = ";".join(map(str, g["run_dir"])) if "run_dir" in g else ""
        for c in nums:
            n, mean, lo, hi = spread(g[c].to_numpy(dtype=float))
            row.update({f"{c}_mean": mean, f"{c}_lo": lo, f"{c}_hi": hi, f"{c}_n": n})
        for c in bools:
            v = g[c].dropna().astype(bool)
            row[f"{c}_mean"] = float(v.mean()) if len(v) else np.nan
        rows.append(row)
    out = pd.DataFrame(rows)
    # M_n only where it says something (some seed without M)
    drop = [f"{c}_n" for c in nums if (out[f"{c}_n"] == out["n_seeds"]).all()]
    out = out.drop(columns=drop)
    out.attrs = {"config_columns": cols, "seed_keys": seeds}
    return out

