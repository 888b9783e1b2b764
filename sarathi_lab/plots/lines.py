"""Many lines, kept readable: a line per configuration (its seeds as a band), lines identical in
what they draw drawn once under both names, and past `max_lines` on one axes small multiples (a
panel per value of the setting that splits the lines best)."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pandas as pd

from sarathi_lab.plots.style import context, line_styles, name, setting_keys, short
from sarathi_lab.report.cells import plain
from sarathi_lab.settings import missing

MAX_PANELS = 12        # past this many panels a split is not tried
SAME = " = "           # joins the names of lines drawn once


@dataclass
class Line:
    """One line of a plot: a configuration (or a series of them along the x-axis)."""
    policy: str
    settings: dict               # setting -> value (what tells it from the other lines)
    data: pd.DataFrame           # what it draws, returned with the plot's data
    signature: tuple = ()        # arrays it draws: equal signatures are drawn once


def configs(table: pd.DataFrame):
    """(configuration label, its runs) in the table's order; a table without a `config`
    column (no seeds known) has a configuration per run."""
    col = "config" if "config" in table else "label"
    return list(table.groupby(col, sort=False))


def config_settings(rows: pd.DataFrame, keys) -> dict:
    first = rows.iloc[0]
    return {k: first[k] for k in keys if k in rows}


def facet_candidates(table: pd.DataFrame, keys) -> list[str]:
    """The keys lines may be split by, in order of preference: the policy, the settings that
    vary, open or closed loop."""
    extra = ["load_mode"] if "load_mode" in table and table["load_mode"].nunique() > 1 else []
    return ["policy"] + [k for k in keys if k != "policy"] + extra


def _value(line: Line, key):
    return line.policy if key == "policy" else line.settings.get(key)


def _matches(line_values, panel_values) -> bool:
    return all(missing(x) or missing(v) or x == v for x, v in zip(line_values, panel_values))


def _panels(lines, combo):
    """{panel values: lines in it} for splitting by the keys of `combo`. A line without a value
    for a key (a setting its policy does not read) is drawn in every panel it matches on the
    others, and gets a panel of its own only if it matches none."""
    vals = [tuple(_value(ln, k) for k in combo) for ln in lines]
    full = list(dict.fromkeys(v for v in vals if not any(missing(x) for x in v)))
    try:
        full = sorted(full, key=lambda v: tuple((str(type(x)), x) for x in v))
    except TypeError:
        pass
    own = list(dict.fromkeys(v for v in vals if any(missing(x) for x in v)
                             and not any(_matches(v, f) for f in full)))
    return {p: [ln for ln, v in zip(lines, vals) if _matches(v, p)] for p in full + own}


def choose_split(lines, keys, max_lines: int):
    """The keys (one, else two) whose panels hold at most `max_lines` lines each, the fewest
    panels first; if none does, the split with the smallest largest panel. () when the lines
    fit on one axes (counting identical ones once) or nothing splits them."""
    if len({_key(ln.signature) for ln in lines}) <= max_lines:
        return ()
    best, best_score = (), None
    for order, combo in enumerate([(k,) for k in keys] + list(combinations(keys, 2))):
        panels = _panels(lines, combo)
        if not 2 <= len(panels) <= MAX_PANELS:
            continue
        size = max(len({_key(ln.signature) for ln in p}) for p in panels.values())
        score = (size > max_lines, size if size > max_lines else 0, len(panels), order)
        if best_score is None or score < best_score:
            best, best_score = combo, score
    return best


def merge_identical(lines) -> list[list[Line]]:
    """The lines in groups of equal signature (drawn once), in order of first appearance."""
    groups: dict = {}
    for ln in lines:
        groups.setdefault(_key(ln.signature), []).append(ln)
    return list(groups.values())


def _key(signature):
    return tuple(np.asarray(a, dtype=float).tobytes() for a in signature)


@dataclass
class Drawn:
    line: Line                   # what is drawn: the first of `same`
    legend: str                  # its legend entry: the names of all of them
    style: tuple                 # (colour, line style): that of the first
    same: list                   # the lines it stands for (equal signatures)


@dataclass
class Layout:
    split: tuple                 # the keys of the small multiples (() for one axes)
    panels: list                 # [(title, [Drawn, ...])]

    def data(self) -> pd.DataFrame:
        """Every line's data as drawn, with its panel and legend entry (`drawn_as`); a line in
        several panels appears once per panel."""
        parts = [ln.data.assign(panel=title, drawn_as=d.legend)
                 for title, drawn in self.panels for d in drawn for ln in d.same]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def arrange(lines: list[Line], table: pd.DataFrame, max_lines: int, keys=None,
            candidates=None, dash=None, split=None) -> Layout:
    """Split `lines` into panels (by `split`, else as choose_split finds) and name and style
    them: names leave out the split's keys; a name has the same style in every panel; `dash`:
    the key whose values get the dash patterns."""
    keys = setting_keys(table) if keys is None else keys
    candidates = facet_candidates(table, keys) if candidates is None else candidates
    split = choose_split(lines, candidates, max_lines) if split is None else tuple(split)
    shown = [k for k in keys if k not in split]
    names = {id(ln): name(ln.policy, ln.settings, shown) for ln in lines}
    frame = pd.DataFrame([{"name": names[id(ln)], "policy": ln.policy,
                           **{k: ln.settings.get(k) for k in shown}} for ln in lines])
    styles = line_styles(frame, shown, dash=dash if dash in shown else None) if len(frame) \
        else {}
    panels = []
    for values, members in (_panels(lines, split).items() if split else [((), lines)]):
        title = ", ".join(f"{short(k)}={plain(v)}" for k, v in zip(split, values)
                          if not missing(v))
        drawn = []
        for same in merge_identical(members):
            ns = list(dict.fromkeys(names[id(ln)] for ln in same))
            drawn.append(Drawn(same[0], SAME.join(ns), styles[ns[0]], same))
        panels.append((title, drawn))
    return Layout(split, panels)


def grid(fig, n_panels: int, kinds: int = 1, *, sharey=True, width=None, height=3.3):
    """Axes for `n_panels` small multiples: with one kind of axes, up to 3 per row (x and y
    shared); with several kinds, a row per panel and a column per kind (x shared per column,
    y too if `sharey`). Returns [[axes of each kind] per panel]."""
    if kinds == 1:
        ncols = min(3, n_panels)
        nrows = -(-n_panels // ncols)
        fig.set_size_inches(width or (7.5 if n_panels == 1 else 4.3 * ncols),
                            (4.4 if n_panels == 1 else height * nrows) + 0.9)
        axes = np.atleast_1d(fig.subplots(nrows, ncols, sharex=True, sharey=sharey,
                                          squeeze=False)).ravel()
        for ax in axes[n_panels:]:
            ax.remove()
        return [[ax] for ax in axes[:n_panels]]
    fig.set_size_inches(width or 12, (4.4 if n_panels == 1 else height * n_panels) + 0.9)
    axes = fig.subplots(n_panels, kinds, squeeze=False, sharex="col",
                        sharey="col" if sharey else False)
    return [list(row) for row in axes]


def outer_labels(axes, xlabel, ylabel):
    """Axis labels on the outer panels of a grid(kinds=1): x on the lowest of each column, y
    on the first of each row."""
    ncols = min(3, len(axes))
    for i, ax in enumerate(axes):
        if i + ncols >= len(axes):
            ax.set_xlabel(xlabel)
        if i % ncols == 0:
            ax.set_ylabel(ylabel)


def seeded(lines) -> bool:
    """Whether some line stands for several seeds."""
    return any((ln.data["n_seeds"] > 1).any() for ln in lines)


def caption(fig, what: str, table, lines, layout: Layout, seeds_note: str):
    """The figure's title: what it shows, what the runs share, the split, the seeds' note."""
    parts = [what, context(table)]
    if layout.split:
        parts.append("a panel per " + " and ".join(short(k) for k in layout.split))
    if seeded(lines):
        parts.append(seeds_note)
    fig.suptitle("\n".join(p for p in parts if p), fontsize=10)
