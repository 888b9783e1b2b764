"""Latency figures and per-request SLOs: pooled TBT gaps, each request's own P99 TBT, the
summary statistics of a column (mean, P50/P90/P99, max), and whether a request met its class's
targets."""
from __future__ import annotations

import numpy as np
import pandas as pd

from sarathi_lab.metrics.tables import token_times_flat

PCTS = (50, 90, 99)


def tbt_gaps(req_df: pd.DataFrame, with_times: bool = False,
             flat_owner=None) -> tuple[np.ndarray, ...]:
    """All TBT gaps pooled (between a request's successive emission events: tokens emitted in
    one iteration arrive together), and the request row each belongs to (non-decreasing); with_times
    adds when each gap ends (the time of its later token). `token_times` entries may be lists
    or arrays (as requests_table and a parquet file give them). `flat_owner`:
    token_times_flat(req_df), if already computed."""
    flat, owner = flat_owner if flat_owner is not None else token_times_flat(req_df)
    gaps = np.diff(flat)
    # a gap is between a request's successive emission events, as a streaming client sees
    # them: the tokens one iteration emits together (speculative decoding) make one event
    same = (owner[1:] == owner[:-1]) & (gaps != 0)
    if with_times:
        return gaps[same], owner[1:][same], flat[1:][same]
    return gaps[same], owner[1:][same]


def request_p99_tbt(req_df: pd.DataFrame, gaps_owner=None) -> np.ndarray:
    """Each request's own P99 TBT (linear interpolation, as numpy's percentile); NaN with
    fewer than two tokens. `gaps_owner`: tbt_gaps(req_df), if already computed."""
    gaps, owner = gaps_owner if gaps_owner is not None else tbt_gaps(req_df)
    out = np.full(len(req_df), np.nan)
    if not len(gaps):
        return out
    assert (owner[1:] >= owner[:-1]).all(), "gaps must come grouped by request, as tbt_gaps"
    start = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    count = np.diff(np.r_[start, len(owner)])
    pos = 0.99 * (count - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, count - 1)
    at_lo, at_hi = np.empty(len(start)), np.empty(len(start))
    # the requests with as many gaps as each other, as the rows of one matrix, partitioned in
    # one call: a few hundred distinct counts, where a call per request would be thousands
    order = np.argsort(count, kind="stable")
    by_count = count[order]
    edges = np.flatnonzero(np.r_[True, by_count[1:] != by_count[:-1], True]).tolist()
    for a, b in zip(edges[:-1], edges[1:]):
        rows = order[a:b]
        c, k_lo, k_hi = int(by_count[a]), int(lo[rows[0]]), int(hi[rows[0]])
        m = gaps[start[rows][:, None] + np.arange(c)]
        if c > 1:
            m = np.partition(m, (k_lo, k_hi), axis=1)
        at_lo[rows], at_hi[rows] = m[:, k_lo], m[:, k_hi]
    out[owner[start]] = at_lo + (at_hi - at_lo) * (pos - lo)
    return out


def stats(x) -> dict:
    x = np.asarray(x, float)
    nan = np.isnan(x)
    if nan.any():   # most columns have none: no copy of millions of TBT gaps
        x = x[~nan]
    if not len(x):
        return {"mean": None, **{f"p{p}": None for p in PCTS}, "max": None}
    q = np.percentile(x, PCTS)
    return {"mean": float(x.mean()), **{f"p{p}": float(v) for p, v in zip(PCTS, q)},
            "max": float(x.max())}


def slo_limits(req_df: pd.DataFrame, slo: dict, target: str) -> np.ndarray:
    """Per request, the limit of one per-request target (config.TARGETS): its SLO class's
    (`slo.classes.<class>`) if the class has an entry, else the top-level one; NaN: none."""
    top = slo.get(target)
    limit = np.full(len(req_df), np.nan if top is None else float(top))
    classes = slo.get("classes") or {}
    if classes:
        cls = column_labels(req_df, "slo_class")
        for name, targets in classes.items():
            value = (targets or {}).get(target)
            limit[cls == name] = np.nan if value is None else float(value)
    return limit


def slo_met(req_df: pd.DataFrame, slo: dict, gaps_owner=None) -> np.ndarray:
    """Per request: meets every per-request target of its class that is set (rejected ones
    never do)."""
    ok = (req_df["status"] == "finished").to_numpy().copy()
    # a one-token request has no TPOT nor TBT; it cannot miss them
    values = {"ttft": lambda: req_df["ttft"].to_numpy(float),
              "tpot": lambda: req_df["tpot"].fillna(0).to_numpy(float),
              "request_p99_tbt": lambda: np.nan_to_num(request_p99_tbt(req_df, gaps_owner),
                                                       nan=0.0),
              "e2e": lambda: req_df["e2e"].to_numpy(float)}
    for target, value in values.items():
        limit = slo_limits(req_df, slo, target)
        has = ~np.isnan(limit)
        if has.any():
            with np.errstate(invalid="ignore"):
                ok &= ~has | (value() <= limit)
    return ok


def column_labels(req_df: pd.DataFrame, col: str) -> np.ndarray:
    """A service column as strings; a table without it (an older run) is all "default"."""
    if col not in req_df:
        return np.full(len(req_df), "default", dtype=object)
    return req_df[col].astype(str).to_numpy(dtype=object)


TARGET_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "request_p99_tbt": "own P99 TBT", "e2e": "E2E"}


def _targets(t: dict) -> str:
    return " and ".join(f"{label} <= {t[k]:g} s" for k, label in TARGET_LABELS.items()
                        if (t or {}).get(k) is not None)


def slo_judged_by(slo: dict) -> str:
    """What a request must meet to count in attainment and goodput, in words: the per-request
    targets that are set ("own P99 TBT <= 0.1 s (no TTFT target)"), per SLO class when the SLO
    has classes. Without a TTFT target anywhere a request that queued for minutes still counts,
    which the text says."""
    top = _targets(slo) or "no target"
    classes = slo.get("classes") or {}
    if classes:
        text = "; ".join(f"class {name}: {_targets(t) or 'no target'}"
                         for name, t in classes.items()) + f"; any other class: {top}"
    elif top == "no target":
        return "no per-request target (every finished request counts)"
    else:
        text = top
    if slo.get("ttft") is None and not any((t or {}).get("ttft") is not None
                                           for t in classes.values()):
        text += " (no TTFT target)"
    return text
