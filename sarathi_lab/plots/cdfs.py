"""CDFs: TTFT, TBT (with its tail), and both per SLO class.

A configuration with several seeds is drawn as the average of its seeds' quantile curves (at
each level q, the mean of the seeds' q-quantiles) with a band spanning, at each q, the interval
of report.seeds (min-max for 2-3 seeds, 95% t from 4). So the curve's P50/P90/P99 are the means
the aggregate table gives and its band is the table's interval. Pooling the seeds' requests
instead would weigh seeds by their number of requests (for TBT, of gaps) and give percentiles
that are in no table.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sarathi_lab.metrics import tbt_gaps
from sarathi_lab.plots.lines import (
    Line,
    arrange,
    caption,
    config_settings,
    configs,
    grid,
    outer_labels,
)
from sarathi_lab.plots.style import (
    DATA_GID,
    QUANTILES,
    Skip,
    collect_legend,
    figure_legend,
    figure_plot,
    plain_log,
    setting_keys,
    slo_value,
)
from sarathi_lab.report.seeds import spread_rows
from sarathi_lab.run import rundir

MAX_LINES = 8
BAND_NOTE = "bands: spread over seeds (min-max for 2-3 seeds, 95% t interval from 4)"


def load_requests(run_dir, columns):
    p = Path(run_dir) / rundir.REQUESTS
    if not p.exists():
        return None
    return pd.read_parquet(p, columns=columns)


def ttft_values(run_dir):
    df = load_requests(run_dir, ["ttft"])
    return None if df is None else df["ttft"].dropna().to_numpy()


def tbt_values(run_dir):
    df = load_requests(run_dir, ["token_times"])
    return None if df is None else tbt_gaps(df)[0]


def quantile_line(rows: pd.DataFrame, per_run: list, settings: dict, **extra) -> Line | None:
    """The line of a configuration from its runs' values (None for a run without any)."""
    curves = [np.quantile(v, QUANTILES) for v in per_run if v is not None and len(v)]
    if not curves:
        return None
    _, mean, lo, hi = spread_rows(np.vstack(curves))
    label = rows["config"].iloc[0] if "config" in rows else rows["label"].iloc[0]
    data = pd.DataFrame({"label": label, "policy": rows["policy"].iloc[0],
                         "run_dir": ";".join(map(str, rows["run_dir"])), **extra,
                         "n_seeds": len(curves), "q": QUANTILES, "value": mean, "lo": lo,
                         "hi": hi})
    return Line(rows["policy"].iloc[0], settings, data, signature=(mean, lo, hi))


def config_lines(table: pd.DataFrame, values_of, keys) -> list[Line]:
    """A quantile line per configuration of the table; `values_of(run row)` gives a run's
    values."""
    lines = []
    for _, rows in configs(table):
        ln = quantile_line(rows, [values_of(r) for _, r in rows.iterrows()],
                           config_settings(rows, keys))
        if ln is not None:
            lines.append(ln)
    return lines


def draw_quantiles(ax, x, q, lo, hi, style, label=None, lw=1.8):
    """A quantile curve (x against q) and, where the seeds spread, its band."""
    c, ls = style
    ax.plot(x, q, color=c, ls=ls, lw=lw, label=label, gid=DATA_GID)
    if np.any(lo != hi):
        ax.fill_betweenx(q, lo, hi, color=c, alpha=0.18, lw=0)


def _layout(table, values_of, what: str, max_lines: int):
    """The configurations' quantile lines of `values_of(run_dir)`, arranged in panels."""
    lines = config_lines(table, lambda r: values_of(r["run_dir"]), setting_keys(table))
    if not lines:
        raise Skip(f"no {rundir.REQUESTS} with {what} in the input runs")
    return lines, arrange(lines, table, max_lines)


@figure_plot
def ttft_cdf(table, max_lines=MAX_LINES):
    lines, layout = _layout(table, ttft_values, "a first token", max_lines)
    fig = Figure(layout="constrained")
    axes = [row[0] for row in grid(fig, len(layout.panels))]
    for (title, drawn), ax in zip(layout.panels, axes):
        for d in drawn:
            v = d.line.data
            draw_quantiles(ax, v["value"], v["q"], v["lo"], v["hi"], d.style, d.legend)
        ax.set_xscale("log")
        plain_log(ax)
        ax.set_ylim(0, 1.01)
        for q in (0.5, 0.99):
            ax.axhline(q, color="0.8", lw=0.8, ls=":", zorder=0)
        ax.grid(True, which="major", alpha=0.3)
        ax.tick_params(which="both", labelbottom=True)
        if title:
            ax.set_title(title, fontsize=9)
    outer_labels(axes, "TTFT: first token - arrival (s, log scale)", "share of requests")
    caption(fig, "TTFT CDF", table, lines, layout, BAND_NOTE)
    figure_legend(fig, *collect_legend(axes))
    return fig, layout.data()


@figure_plot
def tbt_cdf(table, max_lines=MAX_LINES):
    lines, layout = _layout(table, tbt_values, "two or more output tokens", max_lines)
    slo = slo_value(table, "slo_p99_tbt")
    fig = Figure(layout="constrained")
    rows = grid(fig, len(layout.panels), kinds=2, sharey=True)
    for (title, drawn), (ax, tail) in zip(layout.panels, rows):
        for d in drawn:
            v = d.line.data
            ms, lo, hi = v["value"] * 1e3, v["lo"] * 1e3, v["hi"] * 1e3
            draw_quantiles(ax, ms, v["q"], lo, hi, d.style, d.legend)
            draw_quantiles(tail, ms, 1 - v["q"], lo, hi, d.style)
            p99 = v.loc[np.isclose(v["q"], 0.99), "value"].iloc[0] * 1e3
            tail.plot([p99], [0.01], "o", color=d.style[0], ms=5)
        for a in (ax, tail):
            a.set_xscale("log")
            plain_log(a)
            a.grid(True, which="major", alpha=0.3)
            a.tick_params(which="both", labelbottom=True)
            if slo:
                a.axvline(slo * 1e3, color="k", ls="--", lw=1,
                          label=f"P99 TBT SLO {slo * 1e3:.0f} ms")
        ax.set_ylabel("share of TBT gaps")
        ax.set_ylim(0, 1.01)
        tail.set_yscale("log")
        tail.set_ylim(1e-4, 1)
        tail.axhline(0.01, color="0.6", ls=":", lw=0.8)
        tail.set_ylabel("share longer (1 - CDF)")
        prefix = f"{title}: " if title else ""
        ax.set_title(prefix + "CDF (all requests' gaps pooled)", fontsize=9)
        tail.set_title(prefix + "tail: dots mark each line's P99", fontsize=9)
    for a in rows[-1]:
        a.set_xlabel("time between tokens (ms, log scale)")
    caption(fig, "TBT CDF: every gap between consecutive tokens", table, lines, layout,
            BAND_NOTE)
    figure_legend(fig, *collect_legend([a for r in rows for a in r]))
    return fig, layout.data()


@figure_plot
def class_cdfs(table, max_lines=MAX_LINES):
    """TTFT and TBT CDFs of each SLO class of each configuration that has several classes."""
    keys = setting_keys(table)
    lines = {"ttft": [], "tbt": []}
    for _, rows in configs(table):
        per_run = []
        for _, r in rows.iterrows():
            df = load_requests(r["run_dir"], ["ttft", "token_times", "slo_class"])
            per_run.append(df if df is not None and df["slo_class"].nunique() >= 2 else None)
        if all(df is None for df in per_run):
            continue
        names = sorted({c for df in per_run if df is not None
                        for c in df["slo_class"].astype(str)})
        for cls in names:
            vals = {"ttft": [], "tbt": []}
            for df in per_run:
                if df is None:
                    continue
                c = df["slo_class"].astype(str).to_numpy()
                gaps, owner = tbt_gaps(df)
                vals["ttft"].append(df.loc[c == cls, "ttft"].dropna().to_numpy())
                vals["tbt"].append(gaps[c[owner] == cls])
            for metric in lines:
                ln = quantile_line(rows, vals[metric],
                                   {**config_settings(rows, keys), "slo_class": cls},
                                   slo_class=cls, metric=metric)
                if ln is not None:
                    lines[metric].append(ln)
    if not lines["ttft"] and not lines["tbt"]:
        raise Skip("no run has requests of two or more SLO classes (slo_class)")
    # TTFT and TBT lines of a (configuration, class) share a panel and a style: split by the
    # TTFT lines (a class without any TBT gap has only those), the TBT ones the same way
    ckeys = keys[:1] + ["slo_class"] + keys[1:]
    first = "ttft" if lines["ttft"] else "tbt"
    lay = arrange(lines[first], table, max_lines, keys=ckeys, dash="slo_class")
    layout = {m: lay if m == first else arrange(ls, table, max_lines, keys=ckeys,
                                                dash="slo_class", split=lay.split)
              for m, ls in lines.items() if ls}
    titles = [t for t, _ in lay.panels]
    fig = Figure(layout="constrained")
    rows = grid(fig, len(lay.panels), kinds=2, sharey=True)
    for metric, col in (("ttft", 0), ("tbt", 1)):
        scale = 1e3 if metric == "tbt" else 1.0
        for title, drawn in layout[metric].panels if metric in layout else []:
            if title not in titles:
                continue
            ax = rows[titles.index(title)][col]
            for d in drawn:
                v = d.line.data
                draw_quantiles(ax, v["value"] * scale, v["q"], v["lo"] * scale, v["hi"] * scale,
                               d.style, d.legend, lw=1.6)
            if title:
                ax.set_title(title, fontsize=9)
    for axes in rows:
        for ax in axes:
            ax.set_xscale("log")
            plain_log(ax)
            ax.set_ylim(0, 1.01)
            ax.grid(True, which="major", alpha=0.3)
            ax.tick_params(which="both", labelbottom=True)
        axes[0].set_ylabel("share of the class's requests")
        axes[1].set_ylabel("share of the class's TBT gaps")
    rows[-1][0].set_xlabel("TTFT (s, log scale)")
    rows[-1][1].set_xlabel("time between tokens (ms, log scale)")
    all_lines = lines["ttft"] + lines["tbt"]
    caption(fig, "TTFT and TBT per SLO class (line style: class)", table, all_lines, lay,
            BAND_NOTE)
    figure_legend(fig, *collect_legend([a for r in rows for a in r]))
    data = pd.concat([lay_.data() for lay_ in layout.values()], ignore_index=True)
    return fig, data
