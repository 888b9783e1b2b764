"""`sarathi-lab-report PATH... [--out DIR] [--pdf]`: one table and the plots of a set of runs.

PATH is a sweep directory, a run directory, or any directory above them: every `summary.json`
below is a run (one row), every `capacity.json` a capacity search. The swept settings come from
each job's `.hydra/overrides.yaml` (one column per overridden key), the metrics from the summary,
flattened (`tbt_p99`, `ttft_p50`, `slo_goodput_rps`, ...). Only the plots the data supports are
made; the others are listed with the reason. Jobs without a result (failed, unfinished, never
started) are listed beside the table.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sarathi_lab import rundir

POLICY_ORDER = ("request_level", "orca", "vllm", "sarathi")
# what is not a "setting that varies" when labelling runs: the policy is named anyway
_POLICY_KEYS = frozenset({"scheduler", "scheduler.name"})


def flat_metrics(summary: dict, prefix: str = "") -> dict:
    """{"tbt": {"p99": x}} -> {"tbt_p99": x}; the embedded config is left out."""
    out = {}
    for k, v in summary.items():
        if k == "config" and not prefix:
            continue
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_metrics(v, key + "_"))
        elif isinstance(v, (list, tuple)):
            out[key] = json.dumps(v)
        else:
            out[key] = v
    return out


def find(paths, filename: str) -> list[Path]:
    """Directories below `paths` that hold `filename` (a path may also name the file itself)."""
    found = set()
    for p in map(Path, paths):
        if p.is_file() and p.name == filename:
            found.add(p.parent.resolve())
        elif p.is_dir():
            found.update(f.parent.resolve() for f in p.rglob(filename)
                         if "probes" not in f.relative_to(p).parts[:-2])
    return sorted(found)


def _value(text: str):
    import yaml
    try:
        v = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return v if isinstance(v, (int, float, str, bool)) or v is None else text


# how a job was run, not what it ran (as hydra.job.config.override_dirname.exclude_keys)
_BOOKKEEPING = frozenset({"resume", "progress", "results_root", "name", "num_threads"})


def read_overrides(run_dir: Path) -> dict:
    """The job's command-line settings, {key: value} (numbers as numbers), bookkeeping left out."""
    out = {}
    for item in rundir.overrides(run_dir):
        key, _, val = item.partition("=")
        key = key.lstrip("+~")
        if key in _BOOKKEEPING or key.split(".")[0] in ("logger", "hydra"):
            continue
        out[key] = _value(val)
    return out


def _offered_qps(cfg_qps, run_dir: Path):
    """The configured rate, or (a trace replayed at its own times) the measured one."""
    if cfg_qps is not None:
        return float(cfg_qps)
    try:
        t = pd.read_parquet(run_dir / rundir.REQUESTS, columns=["arrival_time"])["arrival_time"]
    except Exception:
        return np.nan
    span = t.max() - t.min()
    return (len(t) - 1) / span if len(t) > 1 and span > 0 else np.nan


def identity(cfg: dict) -> dict:
    """What a run ran, from its config: policy and its budgets, model, hardware, trace, SLO."""
    sch, tr = cfg.get("scheduler") or {}, cfg.get("trace") or {}
    return {
        "policy": sch.get("name"), "token_budget": sch.get("token_budget"),
        "max_num_batched_tokens": sch.get("max_num_batched_tokens"),
        "max_num_seqs": sch.get("max_num_seqs"),
        "model": (cfg.get("model") or {}).get("name"),
        "hardware": (cfg.get("hardware") or {}).get("name"),
        "tensor_parallel": (cfg.get("executor") or {}).get("tensor_parallel"),
        "pipeline_parallel": (cfg.get("executor") or {}).get("pipeline_parallel"),
        "trace": tr.get("name"), "qps": None if tr.get("clients") else tr.get("qps"),
        "clients": tr.get("clients"),
        "slo": (cfg.get("slo") or {}).get("name"),
    }


def _rel(p: Path, roots) -> str:
    for r in roots:
        try:
            rel = p.relative_to(Path(r).resolve())
            return str(Path(Path(r).resolve().name) / rel)
        except ValueError:
            continue
    return str(p)


def _policy_rank(p) -> int:
    return POLICY_ORDER.index(p) if p in POLICY_ORDER else len(POLICY_ORDER)


def _finish(df: pd.DataFrame) -> pd.DataFrame:
    """Order the rows and give every run a short label naming what distinguishes it."""
    if df.empty:
        return df
    df = df.assign(_rank=df["policy"].map(_policy_rank))
    sort = ["_rank", "policy"] + [c for c in ("trace", "offered_qps", "token_budget", "slo")
                                  if c in df]
    df = df.sort_values(sort, kind="stable").drop(columns="_rank").reset_index(drop=True)
    varying = [k for k in df.attrs.get("override_keys", [])
               if k not in _POLICY_KEYS and df[k].map(str).nunique() > 1]  # NaN counts

    def value(v):   # a column with gaps turns ints into floats: 256.0 reads as 256
        return int(v) if isinstance(v, float) and v.is_integer() else v

    def label(row):
        extra = ", ".join(f"{k.rsplit('.', 1)[-1]}={value(row[k])}" for k in varying
                          if not pd.isna(row[k]))
        return f"{row['policy']} ({extra})" if extra else str(row["policy"])
    df.insert(0, "label", df.apply(label, axis=1))
    # the same label for different runs (a capacity search has a row per criterion)
    dup = df.groupby("label")["run_dir"].transform("nunique") > 1
    df.loc[dup, "label"] = df.loc[dup, "label"] + " [" + \
        df.loc[dup, "run_dir"].map(lambda p: Path(p).name) + "]"
    df.attrs["varying"] = varying
    return df


def run_table(paths) -> pd.DataFrame:
    """One row per run below `paths`."""
    rows, keys = [], []
    for d in find(paths, rundir.SUMMARY):
        s = json.loads((d / rundir.SUMMARY).read_text())
        cfg = s.get("config") or {}
        # a multirun leaves out settings the run's components do not read: so does its label
        unread = {n.split(":", 1)[0] for n in (s.get("settings") or {}).get("unread", [])}
        ov = {k: v for k, v in read_overrides(d).items() if k not in unread}
        keys += [k for k in ov if k not in keys]
        ident = identity(cfg)
        for k in unread:
            if k.startswith("scheduler.") and k.split(".", 1)[1] in ident:
                ident[k.split(".", 1)[1]] = None
        rows.append({"run_dir": str(d), "overrides": ",".join(f"{k}={v}" for k, v in ov.items()),
                     **ident, "offered_qps": _offered_qps(ident["qps"], d), **ov,
                     **flat_metrics(s)})
    df = pd.DataFrame(rows)
    df.attrs["override_keys"] = keys
    return _finish(df)


def capacity_table(paths) -> pd.DataFrame:
    """One row per (capacity search, criterion) below `paths`."""
    from sarathi_lab.capacity import capacity_rows
    rows, keys = [], []
    for d in find(paths, rundir.CAPACITY):
        res = json.loads((d / rundir.CAPACITY).read_text())
        ov = read_overrides(d)
        keys += [k for k in ov if k not in keys]
        for r in capacity_rows(res):
            rows.append({"run_dir": str(d),
                         "overrides": ",".join(f"{k}={v}" for k, v in ov.items()), **ov, **r})
    df = pd.DataFrame(rows)
    df.attrs["override_keys"] = keys
    return _finish(df)


_RESULTS = ("summary.json", "capacity.json")


def _sweep_log_status(sweep_dir: Path) -> dict:
    """{job directory name: (status, detail)} from the job's latest line in sweep.log."""
    from sarathi_lab.sweeps import dirname
    out = {}
    try:
        text = (sweep_dir / "sweep.log").read_text()
    except OSError:
        return out
    for ln in text.splitlines():
        f = ln.split("\t")
        if len(f) >= 5:
            out[dirname("" if f[3] == "(defaults)" else f[3])] = (f[2], f[4])
    return out


def incomplete_jobs(paths) -> pd.DataFrame:
    """The jobs below `paths` without a result, one row each (status, run_dir, detail):
    `failed` (an error.txt, or a failed line in sweep.log when the disk took no error.txt),
    `unfinished` (a job directory with neither a result nor an error: running, interrupted or
    killed) and `not started` (sweep.json counts more jobs than there are directories)."""
    from sarathi_lab.sweeps import sweep_holder
    rows, per_sweep, logs = [], {}, {}
    for d in find(paths, ".hydra"):
        per_sweep[d.parent] = per_sweep.get(d.parent, 0) + 1
        has_result = any((d / f).exists() for f in _RESULTS)
        if (d / rundir.MERGED).exists() and not has_result:
            continue   # ran as another job of the sweep (same effective settings): not missing
        if (d / "error.txt").exists():
            lines = [ln for ln in (d / "error.txt").read_text(errors="replace").splitlines()
                     if ln.strip()]
            detail = lines[-1].strip() if lines else "empty error.txt"
            if has_result:
                detail += " (an earlier result is also there, and in the table)"
            rows.append({"status": "failed", "run_dir": str(d), "detail": detail})
        elif not has_result:
            if d.parent not in logs:
                logs[d.parent] = _sweep_log_status(d.parent)
            status, detail = logs[d.parent].get(d.name, ("", ""))
            if status == "failed":
                rows.append({"status": "failed", "run_dir": str(d), "detail": detail})
            else:
                holder = sweep_holder(d.parent)
                rows.append({"status": "unfinished", "run_dir": str(d), "detail":
                             "no summary.json, capacity.json or error.txt" +
                             (f"; the sweep is running ({holder})" if holder else "")})
    for s in find(paths, "sweep.json"):
        try:
            total = json.loads((s / "sweep.json").read_text()).get("total")
        except (OSError, ValueError, AttributeError):
            continue
        found = per_sweep.get(s, 0)
        if isinstance(total, int) and total > found:
            holder = sweep_holder(s)
            rows.append({"status": "not started", "run_dir": str(s), "detail":
                         f"{total - found} of the sweep's {total} jobs have no directory" +
                         (f"; the sweep is running ({holder})" if holder else "")})
    return pd.DataFrame(rows, columns=["status", "run_dir", "detail"])


@dataclass
class Report:
    out: Path
    table: pd.DataFrame
    capacity: pd.DataFrame
    plots: dict = field(default_factory=dict)     # name -> (files, the DataFrame drawn)
    skipped: dict = field(default_factory=dict)   # name -> why not
    tables: list = field(default_factory=list)
    incomplete: pd.DataFrame = field(default_factory=pd.DataFrame)   # jobs without a result


def _write_tables(df: pd.DataFrame, out: Path, stem: str, roots) -> list[Path]:
    df = df.copy()
    df["run_dir"] = df["run_dir"].map(lambda p: _rel(Path(p), roots))
    df.attrs = {}
    # mixed-type object columns (e.g. an override that is a number in one job, null in another)
    # must be one type for Parquet
    for c in df.columns[df.dtypes == object]:
        if df[c].map(type).nunique() > 1:
            df[c] = df[c].map(lambda v: None if v is None or (isinstance(v, float) and np.isnan(v))
                              else str(v))
    files = [out / f"{stem}.csv", out / f"{stem}.parquet"]
    rundir.atomic_write(files[0], lambda p: df.to_csv(p, index=False))
    rundir.atomic_write(files[1], lambda p: df.to_parquet(p, index=False))
    return files


_KEY_COLUMNS = ("label", "policy", "token_budget", "load_mode", "offered_qps", "ttft_p50",
                "ttft_p99", "tbt_p50", "tbt_p99", "stalls_count", "stalls_worst_s",
                "throughput_rps", "slo_attainment", "slo_goodput_rps", "slo_meets_tbt_slo",
                "queue_mean", "fairness_jain", "cost_usd_per_1m_output_tokens")


def _md_table(df: pd.DataFrame, cols) -> str:
    cols = [c for c in cols if c in df]

    def cell(v):
        if isinstance(v, float):
            return "" if np.isnan(v) else f"{v:.4g}"
        return str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in df[cols].itertuples(False)]
    return "\n".join(lines)


def _write_markdown(rep: Report, paths) -> Path:
    lines = ["# Report", "", "Inputs: " + ", ".join(f"`{p}`" for p in paths), ""]
    if not rep.table.empty:
        lines += [f"## Runs ({len(rep.table)})", "", _md_table(rep.table, _KEY_COLUMNS), "",
                  "Times in seconds; full table in `summary.csv`.", ""]
    if not rep.capacity.empty:
        lines += ["## Capacity", "", _md_table(rep.capacity, ["label", "policy", "slo",
                                                              "criterion", "capacity_qps",
                                                              "fails_at_qps", "probes"]), ""]
    if not rep.incomplete.empty:
        lines += [f"## Jobs without a result ({len(rep.incomplete)})", "",
                  "Not in the tables above; also in `incomplete.csv`.", "",
                  _md_table(rep.incomplete.assign(detail=rep.incomplete["detail"].str.replace(
                      "|", "\\|", regex=False)), ["status", "run_dir", "detail"]), ""]
    lines += ["## Plots", ""]
    for name, (files, _) in rep.plots.items():
        png = [f for f in files if f.suffix == ".png"]
        lines += [f"### {name}", ""] + [f"![{name}]({f.name})" for f in png] + [""]
    if rep.skipped:
        lines += ["Not made:", ""] + [f"- {k}: {v}" for k, v in rep.skipped.items()] + [""]
    p = rep.out / "report.md"
    text = "\n".join(lines)
    rundir.atomic_write(p, lambda tmp: tmp.write_text(text))
    return p


def incomplete_lines(df: pd.DataFrame) -> list[str]:
    """The jobs without a result, as lines for a terminal."""
    if df.empty:
        return []
    w = df["status"].str.len().max()
    return [f"{len(df)} job(s) without a result (not in the table):"] + \
        [f"  {r.status:<{w}}  {r.run_dir}  {r.detail}" for r in df.itertuples()]


def make_report(paths, out, *, pdf: bool = False, timeline: str = "auto",
                window=None) -> Report:
    from sarathi_lab import plots
    paths = [Path(p) for p in paths]
    out = Path(out)
    rep = Report(out, run_table(paths), capacity_table(paths))
    rep.incomplete = incomplete_jobs(paths)
    rep.incomplete["run_dir"] = rep.incomplete["run_dir"].map(lambda p: _rel(Path(p), paths))
    if rep.table.empty and rep.capacity.empty:
        raise FileNotFoundError("\n".join(
            [f"no {rundir.SUMMARY} or {rundir.CAPACITY} below {', '.join(map(str, paths))}"]
            + incomplete_lines(rep.incomplete)))
    out.mkdir(parents=True, exist_ok=True)
    formats = ("png", "pdf") if pdf else ("png",)
    if not rep.table.empty:
        rep.tables += _write_tables(rep.table, out, "summary", paths)
    if not rep.capacity.empty:
        rep.tables += _write_tables(rep.capacity, out, "capacity", paths)
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
            attempt(name, fn, rep.table)
    if rep.capacity.empty:
        rep.skipped["capacity"] = "no capacity searches (capacity.json) in the input"
    else:
        attempt("capacity", plots.capacity_bars, rep.capacity)
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
    _write_markdown(rep, paths)
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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="sarathi-lab-report",
        description="Tabulate and plot runs: every summary.json (and capacity.json) below PATH.")
    ap.add_argument("paths", nargs="+", metavar="PATH", help="sweep or run directories")
    ap.add_argument("--out", help="output directory (default: PATH/report for one PATH, "
                                  "else ./report)")
    ap.add_argument("--pdf", action="store_true", help="also write every plot as PDF")
    ap.add_argument("--timeline", choices=("auto", "all", "none"), default="auto",
                    help="iteration timelines and service per tenant over time: auto = one "
                         "per run for up to 4 runs")
    ap.add_argument("--window", type=_window, default=None, metavar="START:END",
                    help="timeline zoom window in simulated seconds (default: around the "
                         "worst TBT gap)")
    a = ap.parse_args(argv)
    for p in a.paths:
        if not Path(p).exists():
            ap.error(f"{p}: no such file or directory")
    out = Path(a.out) if a.out else (Path(a.paths[0]) / "report" if len(a.paths) == 1
                                     else Path("report"))
    try:
        rep = make_report(a.paths, out, pdf=a.pdf, timeline=a.timeline, window=a.window)
    except FileNotFoundError as e:
        sys.exit(f"sarathi-lab-report: {e}")
    n_cap = 0 if rep.capacity.empty else rep.capacity["run_dir"].nunique()
    print(f"{len(rep.table)} runs, {n_cap} capacity searches -> {out}")
    for f in rep.tables:
        print(f"  table  {f}")
    for name, (files, _) in rep.plots.items():
        print(f"  plot   {', '.join(str(f) for f in files)}")
    for name, why in rep.skipped.items():
        print(f"  skipped {name}: {why}")
    if not rep.table.empty:
        with pd.option_context("display.width", 160, "display.max_columns", 20):
            print()
            print(rep.table[[c for c in _KEY_COLUMNS if c in rep.table]].to_string(index=False))
    if not rep.incomplete.empty:
        print("\n" + "\n".join(incomplete_lines(rep.incomplete)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
