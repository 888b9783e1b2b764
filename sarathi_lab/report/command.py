"""make_report and the `sarathi-lab-report` command."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from sarathi_lab.report.jobs import incomplete_jobs, incomplete_lines
from sarathi_lab.report.markdown import KEY_COLUMNS, spread_view, write_markdown
from sarathi_lab.report.seeds import by_config
from sarathi_lab.report.tables import (
    capacity_table,
    relative,
    run_table,
    saved_tables,
    write_tables,
)
from sarathi_lab.run import rundir

MAX_LINES = 8          # lines on one axes; more are split into small multiples (--max-lines)


@dataclass
class Report:
    out: Path
    table: pd.DataFrame
    capacity: pd.DataFrame
    plots: dict = field(default_factory=dict)     # name -> (files, the DataFrame drawn)
    skipped: dict = field(default_factory=dict)   # name -> why not
    tables: list = field(default_factory=list)
    incomplete: pd.DataFrame = field(default_factory=pd.DataFrame)   # jobs without a result
    by_config: pd.DataFrame = field(default_factory=pd.DataFrame)    # over seeds, if any
    capacity_by_config: pd.DataFrame = field(default_factory=pd.DataFrame)
    from_tables: bool = False                     # drawn from an earlier report's tables
    partial: list = field(default_factory=list)   # served sessions recovered from a journal
    live: list = field(default_factory=list)      # served sessions still running


def _aggregate(table: pd.DataFrame) -> pd.DataFrame:
    """The table over seeds, when some configuration has more than one run."""
    if table.empty:
        return pd.DataFrame()
    agg = by_config(table)
    return agg if (agg["n_seeds"] > 1).any() else pd.DataFrame()


def make_report(paths, out, *, pdf: bool = False, timeline: str = "auto", window=None,
                max_lines: int = MAX_LINES, capacity_scale: str = "auto") -> Report:
    from sarathi_lab import plots
    if max_lines < 1:
        raise ValueError(f"max_lines={max_lines}: must be at least 1")
    if capacity_scale not in plots.CAPACITY_SCALES:
        raise ValueError(f"capacity_scale={capacity_scale!r}: one of {plots.CAPACITY_SCALES}")
    paths = [Path(p) for p in paths]
    out = Path(out)
    # a served session that did not stop cleanly left its journal: its run directory first
    from sarathi_lab.run.journal import partial_dirs, recover
    partial, live = partial_dirs(paths)
    for d in partial:
        recover(d)
    rep = Report(out, run_table(paths), capacity_table(paths), partial=partial, live=live)
    rep.incomplete = incomplete_jobs(paths)
    rep.incomplete["run_dir"] = rep.incomplete["run_dir"].map(lambda p: relative(Path(p), paths))
    if rep.table.empty and rep.capacity.empty:
        rep.table, rep.capacity = saved_tables(paths, "summary"), saved_tables(paths, "capacity")
        rep.from_tables = not (rep.table.empty and rep.capacity.empty)
    if rep.table.empty and rep.capacity.empty:
        raise FileNotFoundError("\n".join(
            [f"no {rundir.SUMMARY} or {rundir.CAPACITY} below {', '.join(map(str, paths))}"]
            + incomplete_lines(rep.incomplete)
            + [f"still serving (its journal is recovered once it ends): {d}" for d in live]))
    out.mkdir(parents=True, exist_ok=True)
    formats = ("png", "pdf") if pdf else ("png",)
    rep.by_config, rep.capacity_by_config = _aggregate(rep.table), _aggregate(rep.capacity)
    for df, stem in ((rep.table, "summary"), (rep.by_config, "summary_by_config"),
                     (rep.capacity, "capacity"), (rep.capacity_by_config, "capacity_by_config")):
        if not df.empty:
            rep.tables += write_tables(df, out, stem, paths)
    if not rep.incomplete.empty:
        rep.incomplete.to_csv(out / "incomplete.csv", index=False)
        rep.tables.append(out / "incomplete.csv")

    def attempt(name, fn, *args, **kw):
        try:
            rep.plots[name] = fn(*args, out / name, formats, **kw)
        except plots.Skip as why:
            rep.skipped[name] = str(why)

    no_runs = "no runs (summary.json) in the input"
    for name, fn in (("ttft_cdf", plots.ttft_cdf), ("tbt_cdf", plots.tbt_cdf),
                     ("budget_tradeoff", plots.budget_tradeoff), ("load", plots.load_curves),
                     ("open_closed", plots.open_closed), ("class_cdf", plots.class_cdfs),
                     ("class_goodput", plots.class_goodput)):
        if rep.table.empty:
            rep.skipped[name] = no_runs
        else:
            attempt(name, fn, rep.table, max_lines=max_lines)
    if rep.capacity.empty:
        rep.skipped["capacity"] = "no capacity searches (capacity.json) in the input"
    else:
        attempt("capacity", plots.capacity_bars, rep.capacity, scale=capacity_scale)
    n = len(rep.table)
    if timeline == "none" or n == 0:
        rep.skipped["timeline"] = "--timeline none" if n else no_runs
    elif timeline == "auto" and n > 4:
        rep.skipped["timeline"] = (f"{n} runs; the iteration timeline is drawn for up to 4 "
                                   "(--timeline all draws one per run)")
    else:
        for i, row in rep.table.iterrows():
            name = "timeline" if n == 1 else f"timeline_{plots.slug(row['label'])}"
            attempt(name, plots.timeline, row, window=window)
    _tenant_plots(rep, attempt, timeline)
    write_markdown(rep, paths)
    return rep


def _tenant_plots(rep: Report, attempt, which: str) -> None:
    """Service per tenant over time, for each run with several tenants (as many runs as the
    timeline: up to 4 unless --timeline all)."""
    from sarathi_lab import plots
    if rep.table.empty or which == "none":
        rep.skipped["tenant_service"] = "--timeline none" if which == "none" else \
            "no runs (summary.json) in the input"
        return
    col = "fairness_num_tenants"
    multi = rep.table[rep.table[col] > 1] if col in rep.table else rep.table.iloc[:0]
    if multi.empty:
        rep.skipped["tenant_service"] = "no run has requests of two or more tenants"
    elif which == "auto" and len(multi) > 4:
        rep.skipped["tenant_service"] = (f"{len(multi)} runs with tenants; drawn for up to 4 "
                                         "(--timeline all draws one per run)")
    else:
        for _, row in multi.iterrows():
            name = "tenant_service" if len(multi) == 1 else \
                f"tenant_service_{plots.slug(row['label'])}"
            attempt(name, plots.tenant_service, row)


def single_run_plots(run_dir, out) -> dict:
    """The plots of one run as {name: PNG path} (for loggers)."""
    rep = make_report([run_dir], out, timeline="all")
    return {name: files[0] for name, (files, _) in rep.plots.items()}


def _window(text):
    if text is None:
        return None
    a, _, b = text.partition(":")
    try:
        return float(a), float(b)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--window {text!r}: expected START:END in seconds")


def _positive(text):
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"--max-lines {text!r}: expected a whole number >= 1")
    return v


def _export_chrome(ap, a) -> None:
    from sarathi_lab.report.chrome_trace import write_chrome_trace
    if len(a.paths) != 1 or a.out:
        ap.error("--chrome FILE exports one run directory: give one PATH and no --out")
    try:
        out = write_chrome_trace(a.paths[0], a.chrome, a.window)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"sarathi-lab-report: {e}")
    print(f"chrome trace -> {out} (open in https://ui.perfetto.dev or chrome://tracing)")


def main(argv=None) -> None:
    from sarathi_lab.plots import CAPACITY_SCALES
    ap = argparse.ArgumentParser(
        prog="sarathi-lab-report",
        description="Tabulate and plot runs: every summary.json (and capacity.json) below PATH; "
                    "with none, the tables (summary.parquet/.csv) of an earlier report.")
    ap.add_argument("paths", nargs="+", metavar="PATH", help="sweep or run directories")
    ap.add_argument("--out", help="output directory (default: PATH/report for one PATH, "
                                  "else ./report)")
    ap.add_argument("--pdf", action="store_true", help="also write every plot as PDF")
    ap.add_argument("--timeline", choices=("auto", "all", "none"), default="auto",
                    help="iteration timelines and service per tenant over time: auto = one "
                         "per run for up to 4 runs")
    ap.add_argument("--window", type=_window, default=None, metavar="START:END",
                    help="timeline zoom window in simulated seconds (default: around the "
                         "worst TBT gap); with --chrome, what the export keeps")
    ap.add_argument("--max-lines", type=_positive, default=MAX_LINES, metavar="N",
                    help=f"lines on one axes before a plot splits into small multiples "
                         f"(default {MAX_LINES})")
    ap.add_argument("--chrome", metavar="FILE",
                    help="instead of the report, export the one run directory PATH as a "
                         "Chrome/Perfetto trace (JSON; --window keeps what overlaps it)")
    ap.add_argument("--capacity-scale", choices=CAPACITY_SCALES, default="auto",
                    help="y scale of the capacity bars: auto = log when the largest capacity "
                         "is more than 20x the smallest")
    a = ap.parse_args(argv)
    for p in a.paths:
        if not Path(p).exists():
            ap.error(f"{p}: no such file or directory")
    if a.chrome:
        _export_chrome(ap, a)
        return
    out = Path(a.out) if a.out else (Path(a.paths[0]) / "report" if len(a.paths) == 1
                                     else Path("report"))
    try:
        rep = make_report(a.paths, out, pdf=a.pdf, timeline=a.timeline, window=a.window,
                          max_lines=a.max_lines, capacity_scale=a.capacity_scale)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"sarathi-lab-report: {e}")
    n_cap = 0 if rep.capacity.empty else rep.capacity["run_dir"].nunique()
    src = " (from an earlier report's tables)" if rep.from_tables else ""
    print(f"{len(rep.table)} runs, {n_cap} capacity searches{src} -> {out}")
    for f in rep.tables:
        print(f"  table  {f}")
    for name, (files, _) in rep.plots.items():
        print(f"  plot   {', '.join(str(f) for f in files)}")
    for name, why in rep.skipped.items():
        print(f"  skipped {name}: {why}")
    with pd.option_context("display.width", 160, "display.max_columns", 20,
                           "display.max_colwidth", 60):
        if not rep.table.empty:
            print()
            print(rep.table[[c for c in KEY_COLUMNS if c in rep.table]].to_string(index=False))
        for agg, what in ((rep.by_config, "configurations"),
                          (rep.capacity_by_config, "capacity searches")):
            if not agg.empty:
                print(f"\n{len(agg)} {what} over seeds, mean [lo, hi]: the 95% t interval of "
                      "the mean with 4 or more seeds, the range with 2 or 3")
                print(spread_view(agg).to_string(index=False))
    if not rep.incomplete.empty:
        print("\n" + "\n".join(incomplete_lines(rep.incomplete)))
    for d in rep.partial:
        print(f"\npartial run: {d}: a served session that did not stop cleanly, recovered "
              "from its journal (the requests in flight were lost; summary.json's "
              "served.partial says what was recovered)")
    for d in rep.live:
        print(f"\nstill serving (not in the table): {d}")
    sys.stdout.flush()
