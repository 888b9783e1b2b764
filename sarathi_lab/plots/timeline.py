"""One run's iteration timeline: every TBT gap of the run, and a zoomed window of the tokens
each iteration computed beside the gaps they caused."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sarathi_lab.metrics import tbt_gaps
from sarathi_lab.plots.style import (
    Skip,
    collect_legend,
    context,
    figure_legend,
    figure_plot,
    plain_log,
    simulated,
)
from sarathi_lab.run import rundir


def _rects(it: pd.DataFrame):
    """Outline of one rectangle per iteration: x = start..end, height = its tokens."""
    st = it["start"].to_numpy(float)
    en = st + it["duration"].to_numpy(float)
    x = np.column_stack([st, st, en, en]).ravel()

    pre = it["prefill_tokens"].to_numpy(float)
    dec = it["decode_tokens"].to_numpy(float)
    zero = np.zeros_like(pre)
    # decode as a step line (no drop to 0 between back-to-back iterations)
    return (x, np.column_stack([zero, pre, pre, zero]).ravel(),
            np.column_stack([st, en]).ravel(), np.column_stack([dec, dec]).ravel())


@figure_plot
def timeline(row: pd.Series, window=None):
    run_dir = Path(row["run_dir"])
    if not (run_dir / rundir.ITERATIONS).exists() or not (run_dir / rundir.REQUESTS).exists():
        raise Skip(f"{run_dir.name}: no {rundir.ITERATIONS} / {rundir.REQUESTS}")
    it = pd.read_parquet(run_dir / rundir.ITERATIONS)
    gap, _, ends = tbt_gaps(pd.read_parquet(run_dir / rundir.REQUESTS, columns=["token_times"]),
                            with_times=True)
    gaps = pd.DataFrame({"t": ends, "gap": gap})
    if it.empty or gaps.empty:
        raise Skip(f"{run_dir.name}: no iterations or no TBT gaps")
    end = float((it["start"] + it["duration"]).max())
    if window is None:
        worst = float(gaps.loc[gaps["gap"].idxmax(), "t"])
        span = min(30.0, end)
        a = min(max(0.0, worst - 0.7 * span), max(0.0, end - span))
        window = (a, a + span)
    a, b = window
    w_it = it[(it["start"] + it["duration"] >= a) & (it["start"] <= b)]
    w_gaps = gaps[(gaps["t"] >= a) & (gaps["t"] <= b)]
    slo = row.get("slo_p99_tbt")
    slo = None if slo is None or pd.isna(slo) else float(slo)

    fig = Figure(figsize=(12, 8.5), layout="constrained")
    ov, tok, gp = fig.subplots(3, 1, gridspec_kw={"height_ratios": [1, 1.1, 1.1]})
    ov.scatter(gaps["t"], gaps["gap"] * 1e3, s=1.5, color="tab:blue", alpha=0.4, rasterized=True)
    ov.axvspan(a, b, color="orange", alpha=0.15, label="zoomed below")
    ov.set_xlim(0, end)
    ov.set_title("every TBT gap of the run (stalls stand out as isolated high points)", fontsize=9)
    # one polygon of rectangles (thousands of bar patches would take seconds to draw)
    x, y_pre, x_dec, y_dec = _rects(w_it)
    tok.fill_between(x, y_pre, color="tab:orange", lw=0, label="prefill tokens")
    tok.set_ylabel("prefill tokens per iteration", color="tab:orange")
    tok.set_ylim(bottom=0)
    dec = tok.twinx()
    dec.plot(x_dec, y_dec, color="tab:green", lw=1, label="decode tokens (right axis)")
    dec.set_ylabel("decode tokens per iteration", color="tab:green")
    dec.set_ylim(0, max(1, y_dec.max()) * 1.15)
    tok.set_title("tokens of each iteration, drawn as wide as the iteration took", fontsize=9)
    gp.scatter(w_gaps["t"], w_gaps["gap"] * 1e3, s=6, color="tab:blue", alpha=0.6,
               label="TBT gap (at the later token)")
    for ax in (tok, gp):
        ax.set_xlim(a, b)
    for ax in (ov, gp):
        ax.set_yscale("log")
        plain_log(ax, "y")
        ax.set_ylabel("TBT gap (ms, log)")
        if slo:
            ax.axhline(slo * 1e3, color="k", ls="--", lw=1, label=f"P99 TBT SLO {slo * 1e3:.0f} ms")
        ax.grid(True, alpha=0.3)
    figure_legend(fig, *collect_legend([ov, tok, dec, gp]))
    clock = "simulated time (s)" if simulated(row) else "wall-clock time (s)"
    gp.set_xlabel(clock)
    ov.set_xlabel(clock)
    fig.suptitle(f"Iteration timeline: {row['label']}, zoom {a:.1f}-{b:.1f} s\n"
                 f"{context(pd.DataFrame([row]))}", fontsize=10)
    data = pd.concat([
        pd.DataFrame({"series": "prefill_tokens", "t": w_it["start"], "width": w_it["duration"],
                      "value": w_it["prefill_tokens"]}),
        pd.DataFrame({"series": "decode_tokens", "t": w_it["start"], "width": w_it["duration"],
                      "value": w_it["decode_tokens"]}),
        pd.DataFrame({"series": "tbt_gap", "t": gaps["t"], "width": np.nan,
                      "value": gaps["gap"]}),
    ], ignore_index=True)
    data.attrs["window"] = (a, b)
    return fig, data
