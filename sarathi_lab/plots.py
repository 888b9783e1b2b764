"""The report's plots. Each takes the run table (see report.run_table), draws one figure, saves it
as `out.<fmt>` for each format and returns (files, the DataFrame it drew), so that what a figure
shows can be checked against the table. A plot the data cannot support raises Skip(why).

Colours: one hue per policy (vLLM red, Sarathi blue, ...), shades of it for that policy's runs.

Figures are drawn on `matplotlib.figure.Figure` objects, not through pyplot: saving them needs no
GUI backend, so nothing here selects one or keeps figures open in a global registry.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from sarathi_lab import rundir
from sarathi_lab.metrics import tbt_gaps, token_times_flat

_CMAPS = {"request_level": "Greys", "orca": "Purples", "vllm": "Reds", "sarathi": "Blues"}
_SPARE = ("Greens", "Oranges", "YlOrBr", "PuRd", "BuGn")
# CDF points: an even grid plus a dense tail, and the percentiles the table reports, exactly
QUANTILES = np.unique(np.concatenate([np.linspace(0, 1, 401), 1 - np.logspace(-4, -1, 120),
                                      [0.5, 0.9, 0.99]]))
QUANTILES.flags.writeable = False


class Skip(Exception):
    """This plot is not supported by the data; the message says why."""


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", str(text)).strip("_")[:80]


def _save(fig, out, formats) -> list[Path]:
    files = []
    for fmt in formats:
        p = Path(f"{out}.{fmt}")
        fig.savefig(p, dpi=130, bbox_inches="tight")
        files.append(p)
    return files


_DASHES = ("-", "--", ":", "-.")


def _rank_keys(table) -> list[str]:
    """The settings that vary besides the policy, the token budget first (the usual x-axis)."""
    keys = [k for k in table.attrs.get("varying", []) if k in table]
    return sorted(keys, key=lambda k: "token_budget" not in k)


def run_styles(table: pd.DataFrame) -> dict:
    """label -> (colour, line style): a hue per policy; within it, a shade per value of the
    first setting that varies and a dash pattern per value of the second."""
    styles, spare = {}, iter(_SPARE * 4)
    keys = _rank_keys(table)
    for policy, rows in table.groupby("policy", sort=False):
        cmap = colormaps[_CMAPS.get(policy) or next(spare)]
        shade_key = keys[0] if keys else None
        dash_key = keys[1] if len(keys) > 1 else None

        def norm(v):   # NaN (a setting the run does not read) is one level, not unequal to itself
            return None if pd.isna(v) else v

        def levels(key):
            vals = list(dict.fromkeys(map(norm, rows[key].tolist()))) if key else []
            try:
                vals = sorted(vals)
            except TypeError:
                pass
            return vals
        shades, dashes = levels(shade_key), levels(dash_key)
        for i, (_, r) in enumerate(rows.iterrows()):
            if shade_key and len(shades) > 1:
                x = 0.45 + 0.5 * shades.index(norm(r[shade_key])) / (len(shades) - 1)
            elif len(rows) > 1 and not shade_key:
                x = 0.45 + 0.5 * i / (len(rows) - 1)
            else:
                x = 0.75
            ls = _DASHES[dashes.index(norm(r[dash_key])) % len(_DASHES)] if dash_key else "-"
            styles[r["label"]] = (cmap(x), ls)
    return styles


def series_colors(data: pd.DataFrame) -> dict:
    """series -> colour: the policy's hue, a shade per series of that policy."""
    out = {}
    for policy, g in data.groupby("policy", sort=False):
        names = list(dict.fromkeys(g["series"]))
        cmap = colormaps[_CMAPS.get(policy, "Greens")]
        for i, name in enumerate(names):
            out[name] = cmap(0.8 if len(names) == 1 else 0.45 + 0.5 * i / (len(names) - 1))
    return out


def _one(table, col):
    vals = table[col].dropna().astype(str).unique() if col in table else []
    return vals[0] if len(vals) == 1 else None


def context(table: pd.DataFrame) -> str:
    """What all the runs share: model, hardware, trace and load, SLO."""
    model, hw, tp = _one(table, "model"), _one(table, "hardware"), _one(table, "tensor_parallel")
    parts = []
    if model or hw:
        tp_txt = f" (TP{tp})" if tp not in (None, "1", "None") else ""
        parts.append(f"{model or 'various models'}{tp_txt} on {hw or 'various GPUs'}")
    trace = _one(table, "trace")
    qps = table["offered_qps"].dropna().unique() if "offered_qps" in table else []
    load = f" @ {qps[0]:.3g} req/s" if len(qps) == 1 else ""
    if trace:
        n = _one(table, "num_requests")
        parts.append(f"trace {trace}{load}" + (f", {n} requests" if n else ""))
    slo = _one(table, "slo")
    if slo:
        parts.append(f"SLO {slo}")
    return " | ".join(parts)


def _slo_value(table, col):
    v = table[col].dropna().unique() if col in table else []
    return float(v[0]) if len(v) == 1 else None


def _plain_log(ax, axis="x"):
    """Log axis with plain tick labels (20, 50, 100 rather than 2x10^1): every minor tick
    labelled on a short range, those at 2 and 5 on a range of a decade or two, none beyond."""
    which = ax.xaxis if axis == "x" else ax.yaxis
    lim = ax.get_xlim if axis == "x" else ax.get_ylim

    def minor(v, _):
        if v <= 0:
            return ""
        lo, hi = lim()
        digit = round(v / 10 ** np.floor(np.log10(v)))
        span = hi / lo if lo > 0 else np.inf
        return f"{v:g}" if span < 5 or (span < 300 and digit in (2, 5)) else ""
    which.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    which.set_minor_formatter(FuncFormatter(minor))


def _legend(ax, n, fig=None):
    """Inside the axes for a few lines; below the figure, in columns, for many."""
    if fig is not None and n > 7:
        fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", fontsize=7,
                   frameon=False, ncol=2 if n <= 10 else 3)
    else:
        ax.legend(fontsize=8, frameon=False)


# ------------------------------------------------------------------------------------------
# CDFs
# ------------------------------------------------------------------------------------------

def _load(run_dir, columns):
    p = Path(run_dir) / rundir.REQUESTS
    if not p.exists():
        return None
    return pd.read_parquet(p, columns=columns)


def _quantile_frame(table, values_of) -> pd.DataFrame:
    parts = []
    for _, row in table.iterrows():
        v = values_of(row)
        if v is None or not len(v):
            continue
        parts.append(pd.DataFrame({"label": row["label"], "policy": row["policy"],
                                   "run_dir": row["run_dir"], "q": QUANTILES,
                                   "value": np.quantile(v, QUANTILES)}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _ttft_values(run_dir):
    df = _load(run_dir, ["ttft"])
    return None if df is None else df["ttft"].dropna().to_numpy()


def ttft_cdf(table, out, formats=("png",)):
    data = _quantile_frame(table, lambda row: _ttft_values(row["run_dir"]))
    if data.empty:
        raise Skip(f"no {rundir.REQUESTS} with a first token in the input runs")
    styles = run_styles(table)
    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = fig.subplots()
    for label, d in data.groupby("label", sort=False):
        c, ls = styles[label]
        ax.plot(d["value"], d["q"], color=c, ls=ls, lw=1.8, label=label)
    ax.set_xscale("log")
    _plain_log(ax)
    ax.set_xlabel("TTFT: first token - arrival (s, log scale)")
    ax.set_ylabel("share of requests")
    ax.set_ylim(0, 1.01)
    for q in (0.5, 0.99):
        ax.axhline(q, color="0.8", lw=0.8, ls=":", zorder=0)
    ax.grid(True, which="major", alpha=0.3)
    fig.suptitle(f"TTFT CDF\n{context(table)}", fontsize=10)
    _legend(ax, data["label"].nunique(), fig)
    return _save(fig, out, formats), data


def tbt_cdf(table, out, formats=("png",)):
    def values(row):
        df = _load(row["run_dir"], ["token_times"])
        return None if df is None else tbt_gaps(df)[0]
    data = _quantile_frame(table, values)
    if data.empty:
        raise Skip(f"no {rundir.REQUESTS} with two or more output tokens in the input runs")
    styles = run_styles(table)
    slo = _slo_value(table, "slo_p99_tbt")
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    ax, tail = fig.subplots(1, 2)
    for label, d in data.groupby("label", sort=False):
        ms = d["value"] * 1e3
        c, ls = styles[label]
        ax.plot(ms, d["q"], color=c, ls=ls, lw=1.8, label=label)
        tail.plot(ms, 1 - d["q"], color=c, ls=ls, lw=1.8, label=label)
        p99 = d.loc[np.isclose(d["q"], 0.99), "value"].iloc[0] * 1e3
        tail.plot([p99], [0.01], "o", color=c, ms=5)
    for a in (ax, tail):
        a.set_xscale("log")
        _plain_log(a)
        a.set_xlabel("time between tokens (ms, log scale)")
        a.grid(True, which="major", alpha=0.3)
        if slo:
            a.axvline(slo * 1e3, color="k", ls="--", lw=1, label=f"P99 TBT SLO {slo * 1e3:.0f} ms")
    ax.set_ylabel("share of TBT gaps (all requests pooled)")
    ax.set_ylim(0, 1.01)
    tail.set_yscale("log")
    tail.set_ylim(1e-4, 1)
    tail.axhline(0.01, color="0.6", ls=":", lw=0.8)
    tail.set_ylabel("share of gaps longer (1 - CDF, log)")
    tail.set_title("tail: dots mark each run's P99", fontsize=9)
    fig.suptitle(f"TBT CDF: every gap between consecutive tokens\n{context(table)}", fontsize=10)
    _legend(ax, data["label"].nunique() + bool(slo), fig)
    return _save(fig, out, formats), data


# ------------------------------------------------------------------------------------------
# Sweeps: token budget, load, capacity
# ------------------------------------------------------------------------------------------

def _series(table, x, x_keys):
    """Split runs into lines: one per policy and per setting that varies besides x."""
    others = [k for k in table.attrs.get("varying", []) if k not in x_keys]
    if not others:
        return [(p, "", g) for p, g in table.groupby("policy", sort=False)]
    out = []
    for key, g in table.groupby(["policy"] + others, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        extra = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in zip(others, key[1:]))
        out.append((key[0], extra, g))
    return out


def budget_tradeoff(table, out, formats=("png",)):
    swept = [p for p, g in table.groupby("policy") if g["token_budget"].nunique() > 1]
    if not swept:
        raise Skip("the token budget (chunk size) does not vary within any policy")
    keys = {"scheduler.token_budget", "token_budget"}
    rows = []
    for policy, extra, g in _series(table, "token_budget", keys):
        ref = policy not in swept
        for _, r in g.sort_values("token_budget").iterrows():
            rows.append({"policy": policy, "series": policy + (f" ({extra})" if extra else ""),
                         "reference": ref, "token_budget": r["token_budget"],
                         "tbt_p99": r["tbt_p99"], "ttft_p50": r["ttft_p50"],
                         "label": r["label"]})
    data = pd.DataFrame(rows)
    budgets = sorted(data.loc[~data["reference"], "token_budget"].unique())
    slo = _slo_value(table, "slo_p99_tbt")
    fig = Figure(figsize=(12, 4.6), layout="constrained")
    axes = fig.subplots(1, 2)
    colors = series_colors(data)
    for ax, col, scale, ylabel in ((axes[0], "tbt_p99", 1e3, "P99 TBT (ms)"),
                                   (axes[1], "ttft_p50", 1.0, "median TTFT (s)")):
        for s, d in data.groupby("series", sort=False):
            color = colors[s]
            if d["reference"].iloc[0]:
                # a policy without a token budget: its runs are a level, not a curve
                for v in d[col]:
                    ax.axhline(v * scale, color=color, ls="--", lw=1.6, label=f"{s} (no chunking)")
            else:
                ax.plot(d["token_budget"], d[col] * scale, "o-", color=color, lw=1.8, label=s)
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets)
        ax.set_xticklabels([str(int(b)) for b in budgets])
        ax.set_xlabel("token budget per iteration = chunk size (tokens, log scale)")
        v = data[col].dropna()
        if len(v) and v.min() > 0 and v.max() / v.min() > 5:
            # across budgets and loads these often span decades (a queue that builds up)
            ax.set_ylabel(ylabel + ", log scale")
            ax.set_yscale("log")
            _plain_log(ax, "y")
        else:
            ax.set_ylabel(ylabel)
            ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
    if slo:
        axes[0].axhline(slo * 1e3, color="k", ls=":", lw=1, label=f"P99 TBT SLO {slo * 1e3:.0f} ms")
    axes[0].set_title("decode latency: lower with smaller chunks", fontsize=9)
    axes[1].set_title("prefill latency: higher with smaller chunks", fontsize=9)
    _legend(axes[0], data["series"].nunique() + 1, fig)
    fig.suptitle(f"Token budget trade-off\n{context(table)}", fontsize=10)
    return _save(fig, out, formats), data


def load_curves(table, out, formats=("png",)):
    if "slo_goodput_rps" not in table:
        raise Skip("the runs have no SLO (slo=none), so no goodput or attainment")
    swept = [p for p, g in table.groupby("policy") if g["offered_qps"].nunique() > 1]
    if not swept:
        raise Skip("the load (trace.qps) does not vary within any policy")
    keys = {"trace.qps", "qps", "offered_qps"}
    rows = []
    for policy, extra, g in _series(table[table["policy"].isin(swept)], "offered_qps", keys):
        for _, r in g.sort_values("offered_qps").iterrows():
            rows.append({"policy": policy, "series": policy + (f" ({extra})" if extra else ""),
                         "offered_qps": r["offered_qps"], "goodput_rps": r["slo_goodput_rps"],
                         "attainment": r["slo_attainment"], "throughput_rps": r["throughput_rps"],
                         "label": r["label"]})
    data = pd.DataFrame(rows)
    target = _slo_value(table, "slo_attainment_target")
    fig = Figure(figsize=(12, 4.6), layout="constrained")
    g_ax, a_ax = fig.subplots(1, 2)
    colors = series_colors(data)
    for s, d in data.groupby("series", sort=False):
        c = colors[s]
        g_ax.plot(d["offered_qps"], d["goodput_rps"], "o-", color=c, lw=1.8, label=s)
        a_ax.plot(d["offered_qps"], d["attainment"] * 100, "o-", color=c, lw=1.8)  # legend left
    lo, hi = data["offered_qps"].min(), data["offered_qps"].max()
    pad = 0.05 * (hi - lo)
    g_ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="0.6", ls=":", lw=1,
              label="every request within SLO")
    g_ax.set_ylabel("goodput: requests within SLO per second (req/s)")
    a_ax.set_ylabel("SLO attainment (% of requests)")
    a_ax.set_ylim(0, 102)
    if target:
        a_ax.axhline(target * 100, color="k", ls="--", lw=1, label=f"target {target:.0%}")
    for ax in (g_ax, a_ax):
        ax.set_xlabel("offered load (req/s)")
        ax.set_xlim(lo - pad, hi + pad)
        ax.grid(True, alpha=0.3)
    g_ax.set_ylim(bottom=0)
    _legend(g_ax, data["series"].nunique() + 1, fig)
    if target:
        a_ax.legend(fontsize=8, frameon=False)
    fig.suptitle(f"Goodput and SLO attainment vs load\n{context(table)}", fontsize=10)
    return _save(fig, out, formats), data


def capacity_bars(cap: pd.DataFrame, out, formats=("png",)):
    if cap.empty:
        raise Skip("no capacity searches")
    data = cap[["label", "policy", "slo", "criterion", "source", "capacity_qps", "fails_at_qps",
                "bracketed"]].copy()
    # a group of bars per policy (and per other swept setting), a bar per criterion and SLO
    others = [k for k in cap.attrs.get("varying", []) if k != "slo" and k in cap]
    data["group"] = cap["policy"].astype(str) + cap[others].apply(
        lambda r: "".join(f"\n{k.rsplit('.', 1)[-1]}={v}" for k, v in r.items()
                          if not pd.isna(v)), axis=1) \
        if others else cap["policy"].astype(str)
    data["bar"] = data["source"] + " | " + data["slo"].astype(str)
    bars = list(dict.fromkeys(data["bar"]))
    groups = list(dict.fromkeys(data["group"]))
    width = 0.8 / len(bars)
    # wide enough for the longest line of a group's label (~0.08 inch a character)
    chars = max(len(line) for g in groups for line in g.split("\n"))
    fig = Figure(figsize=(max(6.5, len(groups) * max(0.5 * (len(bars) + 1), 0.08 * chars)), 4.6),
                 layout="constrained")
    ax = fig.subplots()
    cmap = colormaps["tab10"]
    for j, b in enumerate(bars):
        d = data[data["bar"] == b].set_index("group").reindex(groups)
        x = np.arange(len(groups)) + (j - (len(bars) - 1) / 2) * width
        h = ax.bar(x, d["capacity_qps"].fillna(0), width * 0.95, color=cmap(j), label=b)
        for rect, v, ok in zip(h, d["capacity_qps"], d["bracketed"]):
            if pd.isna(v):
                continue
            ax.annotate(f"{v:.3g}" + ("" if ok else "*"), (rect.get_x() + rect.get_width() / 2,
                        rect.get_height()), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(np.arange(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel("capacity (req/s)")
    ax.set_xlabel("policy")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, frameon=False, title="criterion | SLO", title_fontsize=8,
              loc="upper left")
    title = context(cap.assign(offered_qps=np.nan, slo=None))
    ax.set_title("Capacity: highest load within the SLO (bisection; * = not bracketed)\n"
                 f"{title}", fontsize=10)
    return _save(fig, out, formats), data


# ------------------------------------------------------------------------------------------
# One run: the iteration timeline
# ------------------------------------------------------------------------------------------

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


def timeline(row: pd.Series, out, formats=("png",), window=None):
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
    handles = tok.get_legend_handles_labels()[0] + dec.get_legend_handles_labels()[0]
    tok.legend(handles=handles, fontsize=8, loc="upper right", framealpha=0.85)
    gp.scatter(w_gaps["t"], w_gaps["gap"] * 1e3, s=6, color="tab:blue", alpha=0.6,
               label="TBT gap (at the later token)")
    for ax in (tok, gp):
        ax.set_xlim(a, b)
    for ax in (ov, gp):
        ax.set_yscale("log")
        _plain_log(ax, "y")
        ax.set_ylabel("TBT gap (ms, log)")
        if slo:
            ax.axhline(slo * 1e3, color="k", ls="--", lw=1, label=f"P99 TBT SLO {slo * 1e3:.0f} ms")
        ax.legend(fontsize=8, loc="upper right", framealpha=0.85)
        ax.grid(True, alpha=0.3)
    gp.set_xlabel("simulated time (s)")
    ov.set_xlabel("simulated time (s)")
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
    return _save(fig, out, formats), data


# ------------------------------------------------------------------------------------------
# Open loop vs closed loop
# ------------------------------------------------------------------------------------------

def open_closed(table, out, formats=("png",)):
    """Closed-loop runs (trace.clients) beside open-loop ones: TTFT against the throughput each
    realised, and every run's TTFT CDF. What a closed-loop benchmark hides shows as the gap
    between the two at the same throughput."""
    if "clients" not in table:
        raise Skip("no closed-loop runs (trace.clients) in the input")
    closed = table["clients"].notna()
    if not closed.any() or closed.all():
        raise Skip("needs both closed-loop (trace.clients=N) and open-loop runs")
    rows = []
    for is_closed, g in ((True, table[closed]), (False, table[~closed])):
        for _, r in g.sort_values("throughput_rps").iterrows():
            rows.append({"mode": "closed" if is_closed else "open", "label": r["label"],
                         "run_dir": r["run_dir"],
                         "clients": r["clients"] if is_closed else np.nan,
                         "arrival_rps": r.get("offered_load_requests_per_s", np.nan),
                         "throughput_rps": r["throughput_rps"], "ttft_p50": r["ttft_p50"],
                         "ttft_p99": r["ttft_p99"], "e2e_p99": r.get("e2e_p99", np.nan)})
    data = pd.DataFrame(rows)
    cdfs = _quantile_frame(data.assign(policy=data["mode"]), lambda r: _ttft_values(r["run_dir"]))
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    lat, cdf = fig.subplots(1, 2)
    hue = {"closed": "Blues", "open": "Reds"}
    for mode, d in data.groupby("mode", sort=False):
        c = colormaps[hue[mode]](0.8)
        name = "closed loop (users)" if mode == "closed" else "open loop (Poisson)"
        lat.plot(d["throughput_rps"], d["ttft_p99"], "o-", color=c, lw=1.8, label=f"{name}: P99")
        lat.plot(d["throughput_rps"], d["ttft_p50"], "s--", color=c, lw=1.2, label=f"{name}: P50")
        labels = list(d["label"])
        for i, label in enumerate(labels):
            q = cdfs[cdfs["label"] == label]
            x = 0.4 + 0.55 * i / max(1, len(labels) - 1)
            cdf.plot(q["value"], q["q"], color=colormaps[hue[mode]](x),
                     ls="-" if mode == "closed" else "--", lw=1.5, label=label)
    for ax in (lat, cdf):
        ax.grid(True, which="major", alpha=0.3)
    lat.set_yscale("log")
    _plain_log(lat, "y")
    lat.set_xlabel("realised throughput (finished requests/s)")
    lat.set_ylabel("TTFT (s, log scale)")
    lat.legend(fontsize=8, frameon=False)
    cdf.set_xscale("log")
    _plain_log(cdf)
    cdf.set_xlabel("TTFT (s, log scale)")
    cdf.set_ylabel("share of requests")
    cdf.set_ylim(0, 1.01)
    _legend(cdf, len(data), fig)
    fig.suptitle(f"Open vs closed loop: TTFT at the same throughput\n{context(table)}",
                 fontsize=10)
    data.attrs["cdf"] = cdfs   # the quantiles drawn on the right, per run
    return _save(fig, out, formats), data


# ------------------------------------------------------------------------------------------
# Classes and tenants
# ------------------------------------------------------------------------------------------

def class_cdfs(table, out, formats=("png",)):
    """TTFT and TBT CDFs of each SLO class of each run that has several classes."""
    parts = []
    for _, row in table.iterrows():
        df = _load(row["run_dir"], ["ttft", "token_times", "slo_class"])
        if df is None or df["slo_class"].nunique() < 2:
            continue
        cls = df["slo_class"].astype(str).to_numpy()
        gaps, owner = tbt_gaps(df)
        for name in sorted(set(cls)):
            for metric, v in (("ttft", df.loc[cls == name, "ttft"].dropna().to_numpy()),
                              ("tbt", gaps[cls[owner] == name])):
                if len(v):
                    parts.append(pd.DataFrame({"label": row["label"], "policy": row["policy"],
                                               "run_dir": row["run_dir"], "slo_class": name,
                                               "metric": metric, "q": QUANTILES,
                                               "value": np.quantile(v, QUANTILES)}))
    if not parts:
        raise Skip("no run has requests of two or more SLO classes (slo_class)")
    data = pd.concat(parts, ignore_index=True)
    styles = run_styles(table)
    classes = sorted(data["slo_class"].unique())
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    axes = dict(zip(("ttft", "tbt"), fig.subplots(1, 2)))
    for (label, name, metric), d in data.groupby(["label", "slo_class", "metric"], sort=False):
        c = styles[label][0]
        scale = 1e3 if metric == "tbt" else 1.0
        axes[metric].plot(d["value"] * scale, d["q"], color=c,
                          ls=_DASHES[classes.index(name) % len(_DASHES)], lw=1.6,
                          label=f"{label}: {name}")
    for metric, ax in axes.items():
        ax.set_xscale("log")
        _plain_log(ax)
        ax.set_ylim(0, 1.01)
        ax.grid(True, which="major", alpha=0.3)
    axes["ttft"].set_xlabel("TTFT (s, log scale)")
    axes["ttft"].set_ylabel("share of the class's requests")
    axes["tbt"].set_xlabel("time between tokens (ms, log scale)")
    axes["tbt"].set_ylabel("share of the class's TBT gaps")
    _legend(axes["ttft"], data.groupby(["label", "slo_class"]).ngroups, fig)
    fig.suptitle(f"TTFT and TBT per SLO class (line style: class)\n{context(table)}",
                 fontsize=10)
    return _save(fig, out, formats), data


def _class_columns(table, metric):
    """{class name: column} for the summary's per-class figure `metric` (classes_<name>_<metric>)."""
    pre, post = "classes_", f"_{metric}"
    return {c[len(pre):-len(post)]: c for c in table.columns
            if c.startswith(pre) and c.endswith(post)}


def class_goodput(table, out, formats=("png",)):
    """Goodput and SLO attainment of each SLO class against the offered load."""
    good, att = _class_columns(table, "goodput_rps"), _class_columns(table, "attainment")
    names = [n for n in good if n in att and table[good[n]].notna().any()]
    if len(names) < 2:
        raise Skip("fewer than two SLO classes with an SLO (per-class goodput) in the runs")
    swept = [p for p, g in table.groupby("policy") if g["offered_qps"].nunique() > 1]
    if not swept:
        raise Skip("the load (trace.qps) does not vary within any policy")
    rows = []
    for policy, extra, g in _series(table[table["policy"].isin(swept)], "offered_qps",
                                    {"trace.qps", "qps", "offered_qps"}):
        for _, r in g.sort_values("offered_qps").iterrows():
            for n in names:
                if pd.isna(r[good[n]]):
                    continue
                rows.append({"policy": policy, "series": policy + (f" ({extra})" if extra else ""),
                             "slo_class": n, "offered_qps": r["offered_qps"],
                             "goodput_rps": r[good[n]], "attainment": r[att[n]],
                             "label": r["label"]})
    data = pd.DataFrame(rows)
    fig = Figure(figsize=(12, 4.6), layout="constrained")
    g_ax, a_ax = fig.subplots(1, 2)
    colors = series_colors(data)
    for (s, n), d in data.groupby(["series", "slo_class"], sort=False):
        ls = _DASHES[names.index(n) % len(_DASHES)]
        g_ax.plot(d["offered_qps"], d["goodput_rps"], "o", ls=ls, color=colors[s], lw=1.6,
                  label=f"{s}: {n}")
        a_ax.plot(d["offered_qps"], d["attainment"] * 100, "o", ls=ls, color=colors[s], lw=1.6)
    g_ax.set_ylabel("goodput of the class (req/s within its SLO)")
    a_ax.set_ylabel("SLO attainment of the class (%)")
    a_ax.set_ylim(0, 102)
    for ax in (g_ax, a_ax):
        ax.set_xlabel("offered load, all classes (req/s)")
        ax.grid(True, alpha=0.3)
    g_ax.set_ylim(bottom=0)
    _legend(g_ax, data.groupby(["series", "slo_class"]).ngroups, fig)
    fig.suptitle(f"Goodput and SLO attainment per class vs load (line style: class)\n"
                 f"{context(table)}", fontsize=10)
    return _save(fig, out, formats), data


MAX_TENANT_LINES = 10


def tenant_service(row: pd.Series, out, formats=("png",), points: int = 200):
    """Weighted tokens served to each tenant so far, over the run (metrics.service_tokens'
    weights: a prompt counts when its first token comes out, each output token when it does).
    The tenants with the most service get a line each, the rest one summed line."""
    from sarathi_lab.metrics import SERVICE_WEIGHTS
    df = _load(row["run_dir"], ["tenant", "num_prompt_tokens", "token_times"])
    name = Path(row["run_dir"]).name
    if df is None or df["tenant"].nunique() < 2:
        raise Skip(f"{name}: fewer than two tenants")
    flat, owner = token_times_flat(df)
    if not len(flat):
        raise Skip(f"{name}: no output token")
    first = np.r_[True, owner[1:] != owner[:-1]]
    w = SERVICE_WEIGHTS["output"] + np.where(
        first, SERVICE_WEIGHTS["prompt"] * df["num_prompt_tokens"].to_numpy(float)[owner], 0.0)
    tenants = df["tenant"].astype(str).to_numpy()[owner]
    total = pd.Series(w).groupby(tenants).sum().sort_values(ascending=False)
    top = list(total.index[:MAX_TENANT_LINES])
    rest = len(total) - len(top)
    others = f"{rest} other tenant" + ("s" if rest > 1 else "")
    group = np.where(np.isin(tenants, top), tenants, others)
    grid = np.linspace(0.0, float(flat.max()), points + 1)
    parts = []
    for g in top + ([others] if rest else []):
        sel = group == g
        t, cum = flat[sel], np.cumsum(w[sel][np.argsort(flat[sel], kind="stable")])
        served = cum[np.searchsorted(np.sort(t), grid, side="right") - 1]
        served[grid < t.min()] = 0.0
        parts.append(pd.DataFrame({"tenant": g, "t": grid, "service_tokens": served}))
    data = pd.concat(parts, ignore_index=True)
    fig = Figure(figsize=(12, 4.6), layout="constrained")
    cum_ax, share_ax = fig.subplots(1, 2)
    wide = data.pivot(index="t", columns="tenant", values="service_tokens")[data["tenant"].unique()]
    cmap = colormaps["tab20"]
    for i, g in enumerate(wide.columns):
        cum_ax.plot(wide.index, wide[g], color=cmap(i % 20), lw=1.5, label=g)
    tot = wide.sum(axis=1).to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(tot > 0, wide.to_numpy().T / tot, np.nan)
    share_ax.stackplot(wide.index, np.nan_to_num(share), colors=[cmap(i % 20)
                                                                for i in range(len(wide.columns))])
    cum_ax.set_ylabel(f"service so far (weighted tokens: prompt x{SERVICE_WEIGHTS['prompt']:g}, "
                      f"output x{SERVICE_WEIGHTS['output']:g})")
    share_ax.set_ylabel("share of all service so far")
    share_ax.set_ylim(0, 1)
    for ax in (cum_ax, share_ax):
        ax.set_xlabel("simulated time (s)")
        ax.grid(True, alpha=0.3)
    _legend(cum_ax, len(wide.columns), fig)
    fig.suptitle(f"Service per tenant over time: {row['label']}\n"
                 f"{context(pd.DataFrame([row]))}", fontsize=10)
    return _save(fig, out, formats), data
