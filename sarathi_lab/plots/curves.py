"""Sweeps drawn as curves: the token-budget trade-off, goodput and SLO attainment against load
(of the runs and of each SLO class). A point is a configuration: the mean over its seeds, with an
error bar spanning their interval (report.seeds) when it has several."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sarathi_lab.plots.lines import Line, arrange, caption, configs, grid
from sarathi_lab.plots.style import (
    DATA_GID,
    Skip,
    collect_legend,
    figure_legend,
    figure_plot,
    name,
    plain_log,
    setting_keys,
    slo_value,
)
from sarathi_lab.report.seeds import spread

MAX_LINES = 8
DIAGONAL_TOLERANCE = 0.05   # goodput = offered load is drawn if every run's ceiling is this close
ERRORBAR_NOTE = "error bars: spread over seeds (min-max for 2-3 seeds, 95% t interval from 4)"
_BUDGET_KEYS = {"scheduler.token_budget", "token_budget"}
_LOAD_KEYS = {"trace.qps", "qps", "offered_qps"}


def per_config(table: pd.DataFrame, cols: dict, keys) -> pd.DataFrame:
    """One row per configuration: `label` (the configuration's), `policy`, `n_seeds`, the
    settings `keys`, and for each {name: table column}: name (the mean over the seeds),
    name_lo, name_hi."""
    rows = []
    for label, g in configs(table):
        first = g.iloc[0]
        row = {"label": label, "policy": first["policy"], "n_seeds": len(g),
               "run_dir": ";".join(map(str, g["run_dir"])),
               **{k: first[k] for k in keys if k in g}}
        for out, col in cols.items():
            _, mean, lo, hi = spread(g[col].to_numpy(dtype=float) if col in g
                                     else np.full(len(g), np.nan))
            row.update({out: mean, f"{out}_lo": lo, f"{out}_hi": hi})
        rows.append(row)
    return pd.DataFrame(rows)


def series_lines(table, x: str, x_keys, cols: dict, extra=None) -> tuple[list[Line], list]:
    """Configurations joined into lines along x: one line per policy and per setting that
    varies besides x. `extra(row) -> [(settings, data columns)]` splits a configuration's
    point further (one per SLO class). Returns (lines, the keys that tell them apart)."""
    keys = [k for k in setting_keys(table) if k not in x_keys]
    agg = per_config(table, {x: x, **cols}, keys)
    lines = []
    for _, g in agg.groupby(["policy"] + keys, sort=False, dropna=False):
        g = g.sort_values(x, kind="stable")
        first = g.iloc[0]
        settings = {k: first[k] for k in keys}
        series = name(first["policy"], settings, keys)
        parts = [({}, g)] if extra is None else extra(g)
        for more, d in parts:
            d = d.assign(series=series, **{k: v for k, v in more.items()})
            sig = tuple(d[c].to_numpy(dtype=float) for c in
                        [x] + [f"{c}{s}" for c in cols for s in ("", "_lo", "_hi")] if c in d)
            lines.append(Line(first["policy"], {**settings, **more}, d.reset_index(drop=True),
                              signature=sig))
    return lines, keys


def draw_series(ax, x, y, lo, hi, style, label=None, marker="o", lw=1.8):
    """A curve through the means, with error bars where the seeds spread."""
    c, ls = style
    x, y, lo, hi = (np.asarray(a, dtype=float) for a in (x, y, lo, hi))
    if np.nan_to_num(hi - lo).max(initial=0) > 0:
        eb = ax.errorbar(x, y, yerr=[y - lo, hi - y], color=c, ls=ls, marker=marker, lw=lw,
                         capsize=3, label=label)
        eb.lines[0].set_gid(DATA_GID)
    else:
        ax.plot(x, y, color=c, ls=ls, marker=marker, lw=lw, label=label, gid=DATA_GID)


def _finish_load_axes(g_ax, a_ax, title, g_label, a_label):
    g_ax.set_ylabel(g_label)
    a_ax.set_ylabel(a_label)
    a_ax.set_ylim(0, 102)
    g_ax.set_ylim(bottom=0)
    for ax in (g_ax, a_ax):
        ax.grid(True, alpha=0.3)
        ax.tick_params(which="both", labelbottom=True)
        if title:
            ax.set_title(title, fontsize=9)


def _log_if_wide(axes, values, ylabel):
    v = pd.Series(values).dropna()
    log = len(v) and v.min() > 0 and v.max() / v.min() > 5
    for ax in axes:
        if log:   # across budgets and loads these often span decades (a queue that builds up)
            ax.set_yscale("log")
            plain_log(ax, "y")
        else:
            ax.set_ylim(bottom=0)
        ax.set_ylabel(ylabel + (", log scale" if log else ""))


@figure_plot
def budget_tradeoff(table, max_lines=MAX_LINES):
    swept = [p for p, g in table.groupby("policy") if g["token_budget"].nunique() > 1]
    if not swept:
        raise Skip("the token budget (chunk size) does not vary within any policy")
    lines, keys = series_lines(table, "token_budget", _BUDGET_KEYS,
                               {"tbt_p99": "tbt_p99", "ttft_p50": "ttft_p50"})
    for ln in lines:
        ln.data["reference"] = ln.policy not in swept
    layout = arrange(lines, table, max_lines, keys=keys,
                     candidates=["policy"] + keys)
    data = layout.data()
    budgets = sorted(data.loc[~data["reference"], "token_budget"].unique())
    slo = slo_value(table, "slo_p99_tbt")
    fig = Figure(layout="constrained")
    rows = grid(fig, len(layout.panels), kinds=2)
    cols = (("tbt_p99", 1e3), ("ttft_p50", 1.0))
    for (title, drawn), axes in zip(layout.panels, rows):
        for ax, (col, scale) in zip(axes, cols):
            for d in drawn:
                v = d.line.data
                y, lo, hi = (v[c].to_numpy(float) * scale for c in (col, f"{col}_lo",
                                                                     f"{col}_hi"))
                if v["reference"].iloc[0]:
                    # a policy without a token budget: its runs are a level, not a curve
                    c, _ = d.style
                    for i in range(len(v)):
                        ax.axhline(y[i], color=c, ls="--", lw=1.6, gid=DATA_GID,
                                   label=f"{d.legend} (no chunking)")
                        if hi[i] > lo[i]:
                            ax.axhspan(lo[i], hi[i], color=c, alpha=0.15, lw=0)
                else:
                    draw_series(ax, v["token_budget"], y, lo, hi, d.style, d.legend)
            ax.set_xscale("log", base=2)
            ax.set_xticks(budgets)
            ax.set_xticklabels([str(int(b)) for b in budgets])
            ax.grid(True, which="both", alpha=0.3)
            ax.tick_params(which="both", labelbottom=True)
        if slo:
            axes[0].axhline(slo * 1e3, color="k", ls=":", lw=1,
                            label=f"P99 TBT SLO {slo * 1e3:.0f} ms")
        prefix = f"{title}: " if title else ""
        axes[0].set_title(prefix + "decode latency: lower with smaller chunks", fontsize=9)
        axes[1].set_title(prefix + "prefill latency: higher with smaller chunks", fontsize=9)
    _log_if_wide([r[0] for r in rows], data["tbt_p99"] * 1e3, "P99 TBT (ms)")
    _log_if_wide([r[1] for r in rows], data["ttft_p50"], "median TTFT (s)")
    for ax in rows[-1]:
        ax.set_xlabel("token budget per iteration = chunk size (tokens, log scale)")
    caption(fig, "Token budget trade-off", table, lines, layout, ERRORBAR_NOTE)
    figure_legend(fig, *collect_legend([a for r in rows for a in r]))
    return fig, data


def _with_ceiling(table):
    """Each run's goodput if every request met the SLO: its requests / its makespan."""
    if "_ceiling" in table:   # already added (load_curves hands its runs to diagonal_holds)
        return table
    if "num_requests" not in table or "makespan_s" not in table:
        ceiling = pd.Series(np.nan, index=table.index)
    else:
        ceiling = table["num_requests"] / table["makespan_s"].where(table["makespan_s"] > 0)
    # joined, not assigned: a report table is in over 100 pandas blocks (see
    # report.tables.labelled), and adding a column to such a frame warns (fragmented)
    out = pd.concat([table, ceiling.rename("_ceiling")], axis=1)
    out.attrs = dict(table.attrs)
    return out


def diagonal_holds(table, tolerance=DIAGONAL_TOLERANCE) -> bool:
    """Whether goodput = offered load is where every run's goodput would be if all its requests
    met the SLO: requests / makespan within `tolerance` of the offered load for every run. On a
    short trace the makespan is mostly the drain after the last arrival, and the ceiling is far
    below the offered load."""
    t = _with_ceiling(table)
    ok = (t["_ceiling"] - t["offered_qps"]).abs() <= tolerance * t["offered_qps"]
    return bool(len(t)) and bool(ok.all())


@figure_plot
def load_curves(table, max_lines=MAX_LINES):
    if "slo_goodput_rps" not in table:
        raise Skip("the runs have no SLO (slo=none), so no goodput or attainment")
    swept = [p for p, g in table.groupby("policy") if g["offered_qps"].nunique() > 1]
    if not swept:
        raise Skip("the load (trace.qps) does not vary within any policy")
    runs = _with_ceiling(table[table["policy"].isin(swept)])
    lines, keys = series_lines(runs, "offered_qps", _LOAD_KEYS, {
        "goodput_rps": "slo_goodput_rps", "attainment": "slo_attainment",
        "throughput_rps": "throughput_rps", "ceiling_rps": "_ceiling"})
    layout = arrange(lines, runs, max_lines, keys=keys,
                     candidates=["policy"] + keys)
    data = layout.data()
    diagonal = diagonal_holds(runs)
    data.attrs["reference"] = "diagonal" if diagonal else "ceiling"
    target = slo_value(table, "slo_attainment_target")
    fig = Figure(layout="constrained")
    rows = grid(fig, len(layout.panels), kinds=2)
    lo, hi = data["offered_qps"].min(), data["offered_qps"].max()
    pad = 0.05 * (hi - lo) if hi > lo else 0.05 * hi
    for (title, drawn), (g_ax, a_ax) in zip(layout.panels, rows):
        for d in drawn:
            v = d.line.data
            draw_series(g_ax, v["offered_qps"], v["goodput_rps"], v["goodput_rps_lo"],
                        v["goodput_rps_hi"], d.style, d.legend)
            draw_series(a_ax, v["offered_qps"], v["attainment"] * 100, v["attainment_lo"] * 100,
                        v["attainment_hi"] * 100, d.style)
            if not diagonal:
                g_ax.plot(v["offered_qps"], v["ceiling_rps"], ls="none", marker="_", ms=14,
                          mew=1.6, color=d.style[0], gid="ceiling")
        if diagonal:
            g_ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="0.6", ls=":", lw=1,
                      label="every request within SLO (goodput = offered load)")
        else:
            g_ax.plot([], [], ls="none", marker="_", ms=14, mew=1.6, color="0.4",
                      label="every request within SLO: requests / makespan")
        if target:
            a_ax.axhline(target * 100, color="k", ls="--", lw=1,
                         label=f"attainment target {target:.0%}")
        _finish_load_axes(g_ax, a_ax, title, "goodput (req/s within SLO)",
                          "SLO attainment (% of requests)")
        for ax in (g_ax, a_ax):
            ax.set_xlim(lo - pad, hi + pad)
    for ax in rows[-1]:
        ax.set_xlabel("offered load (req/s)")
    caption(fig, "Goodput and SLO attainment vs load", table, lines, layout, ERRORBAR_NOTE)
    figure_legend(fig, *collect_legend([a for r in rows for a in r]))
    return fig, data


def _class_columns(table, metric):
    """{class name: column} for the summary's per-class figure `metric` (classes_<name>_<metric>)."""
    pre, post = "classes_", f"_{metric}"
    return {c[len(pre):-len(post)]: c for c in table.columns
            if c.startswith(pre) and c.endswith(post)}


@figure_plot
def class_goodput(table, max_lines=MAX_LINES):
    """Goodput and SLO attainment of each SLO class against the offered load."""
    good, att = _class_columns(table, "goodput_rps"), _class_columns(table, "attainment")
    names = [n for n in good if n in att and table[good[n]].notna().any()]
    if len(names) < 2:
        raise Skip("fewer than two SLO classes with an SLO (per-class goodput) in the runs")
    swept = [p for p, g in table.groupby("policy") if g["offered_qps"].nunique() > 1]
    if not swept:
        raise Skip("the load (trace.qps) does not vary within any policy")
    cols = {f"{m}@{n}": c[n] for n in names for m, c in (("goodput_rps", good),
                                                           ("attainment", att))}

    def per_class(g):
        out = []
        for n in names:
            d = g[["label", "policy", "n_seeds", "run_dir", "offered_qps"]].copy()
            for m in ("goodput_rps", "attainment"):
                for suffix in ("", "_lo", "_hi"):
                    d[m + suffix] = g[f"{m}@{n}{suffix}"].to_numpy()
            d = d[d["goodput_rps"].notna()]
            if len(d):
                out.append(({"slo_class": n}, d))
        return out
    lines, keys = series_lines(table[table["policy"].isin(swept)], "offered_qps", _LOAD_KEYS,
                               cols, extra=per_class)
    for ln in lines:
        ln.signature = tuple(ln.data[c].to_numpy(float) for c in (
            "offered_qps", "goodput_rps", "goodput_rps_lo", "goodput_rps_hi", "attainment",
            "attainment_lo", "attainment_hi"))
    ckeys = keys[:1] + ["slo_class"] + keys[1:]
    layout = arrange(lines, table, max_lines, keys=ckeys, dash="slo_class",
                     candidates=["slo_class", "policy"] + keys)
    data = layout.data()
    fig = Figure(layout="constrained")
    rows = grid(fig, len(layout.panels), kinds=2)
    for (title, drawn), (g_ax, a_ax) in zip(layout.panels, rows):
        for d in drawn:
            v = d.line.data
            draw_series(g_ax, v["offered_qps"], v["goodput_rps"], v["goodput_rps_lo"],
                        v["goodput_rps_hi"], d.style, d.legend, lw=1.6)
            draw_series(a_ax, v["offered_qps"], v["attainment"] * 100, v["attainment_lo"] * 100,
                        v["attainment_hi"] * 100, d.style, lw=1.6)
        _finish_load_axes(g_ax, a_ax, title, "goodput of the class (req/s within its SLO)",
                          "SLO attainment of the class (%)")
    for ax in rows[-1]:
        ax.set_xlabel("offered load, all classes (req/s)")
    caption(fig, "Goodput and SLO attainment per class vs load (line style: class)", table,
            lines, layout, ERRORBAR_NOTE)
    figure_legend(fig, *collect_legend([a for r in rows for a in r]))
    return fig, data
