"""Closed-loop runs (trace.clients) beside open-loop ones: TTFT against the throughput each
realised, and every configuration's TTFT CDF. What a closed-loop benchmark hides shows as the
gap between the two at the same throughput."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure

from sarathi_lab.plots.cdfs import draw_quantiles, quantile_line, ttft_values
from sarathi_lab.plots.curves import ERRORBAR_NOTE, draw_series, per_config
from sarathi_lab.plots.lines import configs
from sarathi_lab.plots.style import (
    Skip,
    collect_legend,
    context,
    figure_legend,
    figure_plot,
    plain_log,
)

MAX_LINES = 8
_HUE = {"closed": "Blues", "open": "Reds"}
_NAME = {"closed": "closed loop (users)", "open": "open loop (Poisson)"}


@figure_plot
def open_closed(table, max_lines=MAX_LINES):
    if "clients" not in table:
        raise Skip("no closed-loop runs (trace.clients) in the input")
    closed = table["clients"].notna()
    if not closed.any() or closed.all():
        raise Skip("needs both closed-loop (trace.clients=N) and open-loop runs")
    cols = {"arrival_rps": "offered_load_requests_per_s", "throughput_rps": "throughput_rps",
            "ttft_p50": "ttft_p50", "ttft_p99": "ttft_p99", "e2e_p99": "e2e_p99"}
    parts, cdfs = [], []
    for mode, g in (("closed", table[closed]), ("open", table[~closed])):
        d = per_config(g, cols, ["clients"]).sort_values("throughput_rps", kind="stable")
        parts.append(d.assign(mode=mode))
        for label, rows in configs(g):
            ln = quantile_line(rows, [ttft_values(r["run_dir"]) for _, r in rows.iterrows()], {},
                               mode=mode)
            if ln is not None:
                cdfs.append(ln.data)
    data = pd.concat(parts, ignore_index=True)
    data = data[["mode"] + [c for c in data.columns if c != "mode"]]
    cdf = pd.concat(cdfs, ignore_index=True) if cdfs else pd.DataFrame()
    # the CDFs (none without the runs' request tables) on one axes, or one per mode past
    # max_lines lines
    n_cdf = 0 if cdf.empty else 2 if cdf["label"].nunique() > max_lines else 1
    split = n_cdf == 2
    fig = Figure(figsize=(6.5 + 5.5 * n_cdf, 4.8), layout="constrained")
    axes = list(np.atleast_1d(fig.subplots(1, 1 + n_cdf)))
    lat = axes[0]
    cdf_axes = {} if not n_cdf else {"closed": axes[1], "open": axes[-1]}
    for mode, d in data.groupby("mode", sort=False):
        c = colormaps[_HUE[mode]](0.8)
        for col, marker, ls, lw, what in (("ttft_p99", "o", "-", 1.8, "P99"),
                                          ("ttft_p50", "s", "--", 1.2, "P50")):
            draw_series(lat, d["throughput_rps"], d[col], d[f"{col}_lo"], d[f"{col}_hi"],
                        (c, ls), f"{_NAME[mode]}: {what}", marker=marker, lw=lw)
        labels = list(d["label"]) if n_cdf else []
        for i, label in enumerate(labels):
            q = cdf[cdf["label"] == label]
            if q.empty:
                continue
            shade = colormaps[_HUE[mode]](0.4 + 0.55 * i / max(1, len(labels) - 1))
            draw_quantiles(cdf_axes[mode], q["value"], q["q"], q["lo"], q["hi"],
                           (shade, "-" if mode == "closed" else "--"), label, lw=1.5)
    for ax in axes:
        ax.grid(True, which="major", alpha=0.3)
    lat.set_yscale("log")
    plain_log(lat, "y")
    lat.set_xlabel("realised throughput (finished requests/s)")
    lat.set_ylabel("TTFT (s, log scale)")
    for mode, ax in cdf_axes.items() if split else list(cdf_axes.items())[:1]:
        ax.set_xscale("log")
        plain_log(ax)
        ax.set_xlabel("TTFT (s, log scale)")
        ax.set_ylabel("share of requests")
        ax.set_ylim(0, 1.01)
        if split:
            ax.set_title(f"TTFT CDF: {_NAME[mode]}", fontsize=9)
    if split:
        cdf_axes["open"].sharex(cdf_axes["closed"])
    figure_legend(fig, *collect_legend(axes))
    seeds = (data["n_seeds"] > 1).any()
    fig.suptitle("Open vs closed loop: TTFT at the same throughput\n" + context(table)
                 + (f"\n{ERRORBAR_NOTE}; CDF bands likewise" if seeds else ""), fontsize=10)
    data.attrs["cdf"] = cdf   # the quantiles drawn on the right, per configuration
    return fig, data
