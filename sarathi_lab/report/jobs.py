"""Jobs of a sweep without a result: failed, unfinished, never started."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from sarathi_lab.report.tables import find
from sarathi_lab.run import rundir

_RESULTS = ("summary.json", "capacity.json")


def _sweep_log_status(sweep_dir: Path) -> dict:
    """{job directory name: (status, detail)} from the job's latest line in sweep.log."""
    from sarathi_lab.sweeps.bookkeeping import dirname
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
    from sarathi_lab.sweeps.bookkeeping import sweep_holder
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


def incomplete_lines(df: pd.DataFrame) -> list[str]:
    """The jobs without a result, as lines for a terminal."""
    if df.empty:
        return []
    w = df["status"].str.len().max()
    return [f"{len(df)} job(s) without a result (not in the table):"] + \
        [f"  {r.status:<{w}}  {r.run_dir}  {r.detail}" for r in df.itertuples()]
