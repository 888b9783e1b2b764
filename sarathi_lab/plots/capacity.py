"""Capacity per policy: a group of bars per policy (and per other swept setting), a bar per
criterion and SLO; with several seeds per configuration, the bar is the mean and an error bar
spans the seeds' interval (report.seeds)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure

from sarathi_lab.plots.style import DATA_GID, Skip, context, figure_legend, figure_plot, plain_log
from sarathi_lab.report.cells import plain
from sarathi_lab.report.seeds import is_seed_key, spread

CAPACITY_SCALES = ("auto", "linear", "log")
LOG_RATIO = 20      # scale="auto": log when the largest capacity is more than this x the smallest
SIGNIFICANT = 3     # every bar's number: this many significant digits, trailing zeros kept


def sig(v: float, digits: int = SIGNIFICANT) -> str:
    """`v` with `digits` significant digits in plain decimals (0.0283, 1.10, 2.48, 148)."""
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(v))))
    return f"{v:.{decimals}f}"


def capacity_data(cap: pd.DataFrame) -> pd.DataFrame:
    """A row per (configuration, criterion): the capacity's mean over seeds, `lo` and `hi`
    (their interval), `n_seeds`, `bracketed` (every seed's search bracketed it)."""
    others = [k for k in cap.attrs.get("varying", []) if k != "slo" and k in cap
              and not is_seed_key(k)]
    config = cap["config"] if "config" in cap else cap["label"]
    rows = []
    for (label, criterion), g in cap.groupby([config, "criterion"], sort=False):
        first = g.iloc[0]
        n, mean, lo, hi = spread(g["capacity_qps"].to_numpy(dtype=float))
        group = str(first["policy"]) + "".join(f"\n{k.rsplit('.', 1)[-1]}={plain(first[k])}"
                                               for k in others if not pd.isna(first[k]))
        rows.append({"label": label, "policy": first["policy"], "slo": first["slo"],
                     "criterion": criterion, "source": first["source"], "capacity_qps": mean,
                     "capacity_lo": lo, "capacity_hi": hi, "n_seeds": len(g),
                     "fails_at_qps": spread(g["fails_at_qps"].to_numpy(dtype=float))[1],
                     "bracketed": bool(g["bracketed"].astype(bool).all()), "group": group,
                     "bar": f"{first['source']} | {first['slo']}"})
    return pd.DataFrame(rows)


def use_log(values, scale: str) -> bool:
    if scale not in CAPACITY_SCALES:
        raise ValueError(f"capacity scale {scale!r}: one of {CAPACITY_SCALES}")
    v = pd.Series(values, dtype=float)
    v = v[v > 0]
    return scale == "log" or (scale == "auto" and len(v) > 1 and v.max() / v.min() > LOG_RATIO)


@figure_plot
def capacity_bars(cap: pd.DataFrame, scale: str = "auto"):
    if cap.empty:
        raise Skip("no capacity searches")
    data = capacity_data(cap)
    bars = list(dict.fromkeys(data["bar"]))
    groups = list(dict.fromkeys(data["group"]))
    width = 0.8 / len(bars)
    log = use_log(data["capacity_qps"], scale)
    data.attrs["scale"] = "log" if log else "linear"
    # wide enough for the longest line of a group's label (~0.08 inch a character)
    chars = max(len(line) for g in groups for line in g.split("\n"))
    fig = Figure(figsize=(max(6.5, len(groups) * max(0.5 * (len(bars) + 1), 0.08 * chars)), 4.6),
                 layout="constrained")
    ax = fig.subplots()
    cmap = colormaps["tab10"]
    positive = data.loc[data["capacity_qps"] > 0, "capacity_lo"]
    floor = float(positive.min()) / 2 if log and len(positive) else 0.0
    for j, b in enumerate(bars):
        d = data[data["bar"] == b].set_index("group").reindex(groups)
        x = np.arange(len(groups)) + (j - (len(bars) - 1) / 2) * width
        y = d["capacity_qps"].fillna(0).to_numpy(float)
        h = ax.bar(x, np.maximum(y - floor, 0), width * 0.95, bottom=floor, color=cmap(j),
                   label=b, gid=DATA_GID)
        spread_ = (d["capacity_hi"] - d["capacity_lo"]).fillna(0).to_numpy(float)
        if (spread_ > 0).any():
            ax.errorbar(x, y, yerr=[y - d["capacity_lo"].fillna(0), d["capacity_hi"].fillna(0) - y],
                        fmt="none", ecolor="k", elinewidth=1, capsize=3)
        for rect, v, top, ok in zip(h, d["capacity_qps"], d["capacity_hi"], d["bracketed"]):
            if pd.isna(v):
                continue
            ax.annotate(sig(v) + ("" if ok else "*"),
                        (rect.get_x() + rect.get_width() / 2, max(v, top)),
                        xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                        fontsize=7)
    ax.set_xticks(np.arange(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_xlabel("policy")
    if log:
        ax.set_yscale("log")
        top = float(data[["capacity_qps", "capacity_hi"]].max().max())
        ax.set_ylim(floor, top * 2)
        plain_log(ax, "y")
        ax.set_ylabel("capacity (req/s, log scale)")
    else:
        ax.set_ylim(0, float(data[["capacity_qps", "capacity_hi"]].max().max()) * 1.1)
        ax.set_ylabel("capacity (req/s)")
    ax.grid(True, axis="y", which="both" if log else "major", alpha=0.3)
    figure_legend(fig, *ax.get_legend_handles_labels(), title="criterion | SLO")
    title = context(cap.assign(offered_qps=np.nan, slo=None))
    seeds = (data["n_seeds"] > 1).any()
    fig.suptitle("Capacity: highest load within the SLO (bisection; * = not bracketed)\n"
                 f"{title}" + ("\nerror bars: spread over seeds (min-max for 2-3 seeds, 95% t "
                               "interval from 4)" if seeds else ""), fontsize=10)
    return fig, data
