"""What every plot shares: saving, colours, labels, log axes, legends, the figure's caption."""
from __future__ import annotations

import functools
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.ticker import FuncFormatter

from sarathi_lab.report.cells import plain
from sarathi_lab.report.seeds import is_seed_key
from sarathi_lab.settings import missing

_CMAPS = {"request_level": "Greys", "orca": "Purples", "vllm": "Reds", "sarathi": "Blues"}
_SPARE = ("Greens", "Oranges", "YlOrBr", "PuRd", "BuGn")
DASHES = ("-", "--", ":", "-.")
# CDF points: an even grid plus a dense tail, and the percentiles the table reports, exactly
QUANTILES = np.unique(np.concatenate([np.linspace(0, 1, 401), 1 - np.logspace(-4, -1, 120),
                                      [0.5, 0.9, 0.99]]))
QUANTILES.flags.writeable = False
DATA_GID = "data"      # the gid of every line that draws runs (not a reference line)


class Skip(Exception):
    """This plot is not supported by the data; the message says why."""


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", str(text)).strip("_")[:80]


# no dates or versions in the files: the same data gives the same bytes
_METADATA = {"png": {"Software": None}, "pdf": {"CreationDate": None, "Producer": None,
                                                "Creator": None}}


def save(fig, out, formats) -> list[Path]:
    files = []
    for fmt in formats:
        p = Path(f"{out}.{fmt}")
        fig.savefig(p, dpi=130, bbox_inches="tight", metadata=_METADATA.get(fmt))
        files.append(p)
    return files


def figure_plot(draw):
    """`draw(table, **kw) -> (figure, data)` as a plot: `plot(table, out, formats, **kw)` saves
    the figure as out.<fmt> and returns (files, data); `plot.draw` is `draw` (for tests that look
    at the figure's artists)."""
    @functools.wraps(draw)
    def plot(table, out, formats=("png",), **kw):
        fig, data = draw(table, **kw)
        return save(fig, out, formats), data
    plot.draw = draw
    return plot


def short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def setting_keys(table: pd.DataFrame) -> list[str]:
    """The settings that vary besides the policy and the seeds, the token budget first (the
    usual x-axis and the shade of a policy's lines)."""
    keys = [k for k in table.attrs.get("varying", []) if k in table and not is_seed_key(k)]
    return sorted(keys, key=lambda k: "token_budget" not in k)


def name(policy, settings: dict, keys) -> str:
    """`policy (k=v, ...)` over `keys` that the settings give a value."""
    extra = ", ".join(f"{short(k)}={plain(settings[k])}" for k in keys
                      if k in settings and not missing(settings[k]))
    return f"{policy} ({extra})" if extra else str(policy)


def line_styles(lines: pd.DataFrame, keys, dash=None) -> dict:
    """name -> (colour, line style) for lines (a DataFrame with `name`, `policy` and `keys`
    columns): a hue per policy; within it, a shade per value of the first key and a dash
    pattern per value of the second (or of `dash`)."""
    styles, spare = {}, iter(_SPARE * 4)
    keys = [k for k in keys if k in lines]
    shades = [k for k in keys if k != dash]
    shade_key = shades[0] if shades else None
    dash_key = dash if dash in keys else (shades[1] if len(shades) > 1 else None)
    for policy, rows in lines.groupby("policy", sort=False):
        cmap = colormaps[_CMAPS.get(policy) or next(spare)]

        def norm(v):   # NaN (a setting the run does not read) is one level, not unequal to itself
            return None if missing(v) else v

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
            ls = DASHES[dashes.index(norm(r[dash_key])) % len(DASHES)] if dash_key else "-"
            styles.setdefault(r["name"], (cmap(x), ls))
    return styles


def run_styles(table: pd.DataFrame) -> dict:
    """label -> (colour, line style) for the runs of a run table."""
    return line_styles(table.assign(name=table["label"]), setting_keys(table))


def series_colors(data: pd.DataFrame) -> dict:
    """series -> colour: the policy's hue, a shade per series of that policy."""
    out = {}
    for policy, g in data.groupby("policy", sort=False):
        names = list(dict.fromkeys(g["series"]))
        cmap = colormaps[_CMAPS.get(policy, "Greens")]
        for i, n in enumerate(names):
            out[n] = cmap(0.8 if len(names) == 1 else 0.45 + 0.5 * i / (len(names) - 1))
    return out


def _one(table, col):
    vals = table[col].dropna().astype(str).unique() if col in table else []
    return vals[0] if len(vals) == 1 else None


def simulated(row) -> bool:
    """Whether a run's times are simulated (else measured: wall-clock)."""
    v = row.get("simulated")
    return True if v is None or (isinstance(v, float) and np.isnan(v)) else bool(v)


def _where(table: pd.DataFrame) -> str | None:
    """What the runs ran on: the simulated hardware; a real executor (served or offline); a
    replay's endpoint. None: simulated runs on several presets."""
    sim = table.apply(simulated, axis=1) if len(table) else pd.Series([], dtype=bool)
    if sim.all():
        return _one(table, "hardware")
    parts = []
    if sim.any():
        parts.append(f"simulated {_one(table[sim], 'hardware') or 'GPUs'}")
    real = table[~sim]
    kind = real["executor"].astype(str) if "executor" in real else pd.Series("?", real.index)
    ends = real["endpoint"].dropna().unique() if "endpoint" in real else []
    if (kind == "remote").any():
        parts.append(f"served endpoint {ends[0]}" if len(ends) == 1 else
                     f"{len(ends)} served endpoints")
    own = real[kind != "remote"]
    if len(own):
        dev = _one(own, "settings_executor_device")
        parts.append(f"a real {_one(own, 'executor') or 'executor'} executor" +
                     (f" (device {dev})" if dev else ""))
    return " and ".join(parts)


def context(table: pd.DataFrame) -> str:
    """What all the runs share: model, hardware (or real executor, or endpoint), trace and
    load, SLO, seeds."""
    model, hw, tp = _one(table, "model"), _where(table), _one(table, "tensor_parallel")
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
    if "config" in table and table["config"].nunique() < len(table):
        n = table.groupby("config").size()
        parts.append(f"{n.min()} seeds per configuration" if n.min() == n.max()
                     else f"{n.min()}-{n.max()} seeds per configuration")
    return " | ".join(parts)


def slo_value(table, col):
    v = table[col].dropna().unique() if col in table else []
    return float(v[0]) if len(v) == 1 else None


def _labelled_digits(lo: float, hi: float) -> set:
    """Which minor ticks of a log axis over [lo, hi] get a label, so that at least three ticks
    carry one: none if three powers of ten are in range, else those at 2 and 5, else all."""
    if not (lo > 0 and hi > lo):
        return set()
    lo, hi = lo * (1 - 1e-9), hi * (1 + 1e-9)
    ks = range(math.floor(math.log10(lo)), math.floor(math.log10(hi)) + 1)

    def count(digits):
        return sum(lo <= d * 10.0 ** k <= hi for k in ks for d in digits)
    if count((1,)) >= 3:
        return set()
    return {2, 5} if count((1, 2, 5)) >= 3 else set(range(2, 10))


def plain_log(ax, axis="x"):
    """A log axis with plain tick labels (20, 50, 100 rather than 2x10^1), at least three of
    them: the powers of ten, and on a short range the minor ticks at 2 and 5 (or all of them)."""
    which = ax.xaxis if axis == "x" else ax.yaxis

    def minor(v, _):
        if v <= 0:
            return ""
        digit = round(v / 10 ** np.floor(np.log10(v)))
        return f"{v:g}" if digit in _labelled_digits(*sorted(which.get_view_interval())) else ""
    which.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    which.set_minor_formatter(FuncFormatter(minor))


def figure_legend(fig, handles, labels, title=None):
    """One legend for the whole figure, outside every axes (below them, in columns)."""
    if not handles:
        return None
    n = len(labels)
    longest = max(len(str(x)) for x in labels)
    ncol = n if n <= 3 else max(1, min(4 if longest < 30 else 3 if longest < 45 else 2,
                                       math.ceil(n / 3)))
    return fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize=7.5,
                      frameon=False, title=title, title_fontsize=8)


def collect_legend(axes) -> tuple[list, list]:
    """The labelled artists of `axes`, each label once (small multiples repeat them)."""
    seen = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    return list(seen.values()), list(seen)
