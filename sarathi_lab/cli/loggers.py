"""Where a finished job is reported besides its directory: `logger=csv` or `logger=wandb`.

The CSV log has fixed columns, so runs of different sweeps stay in one table and parallel jobs can
append to it (under a lock). wandb is imported only here, only for logger=wandb, and runs offline
unless asked otherwise: a missing API key never makes a job wait for a login prompt.
"""
from __future__ import annotations

import csv
import fcntl
import logging
import os
from datetime import datetime
from pathlib import Path

from sarathi_lab.run import rundir

log = logging.getLogger(__name__)

CSV_COLUMNS = (
    "time", "name", "mode", "run_dir", "overrides", "policy", "token_budget", "model",
    "hardware", "trace", "qps", "num_requests", "slo",
    "num_finished", "num_rejected", "preemptions", "throughput_rps", "throughput_tok_s",
    "ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99", "tpot_p50", "tpot_p99", "e2e_p50",
    "scheduling_delay_p50", "stalls_count", "stalls_worst_s", "slo_attainment",
    "slo_goodput_rps", "slo_meets_tbt_slo", "slo_meets_attainment",
    "capacity_tbt_qps", "capacity_attainment_qps", "wall_time_s",
)


def csv_row(c: dict, run_dir: Path, result: dict) -> dict:
    from sarathi_lab.report import flat_metrics, identity
    row = {
        "time": datetime.now().isoformat(timespec="seconds"), "name": c.get("name"),
        "mode": c.get("mode", "run"), "run_dir": str(Path(run_dir).resolve()),
        "overrides": ",".join(rundir.overrides(run_dir)), **identity(c),
    }
    if result.get("mode") == "capacity":
        row["num_requests"] = result["num_requests"]
        for k, r in result["criteria"].items():
            row[f"capacity_{k}_qps"] = r["capacity_qps"]
        row["wall_time_s"] = sum(p["wall_s"] for p in result["probes"])
    else:
        row.update({k: v for k, v in flat_metrics(result).items() if k in CSV_COLUMNS})
    return row


def log_csv(c: dict, run_dir: Path, result: dict) -> Path:
    path = (c.get("logger") or {}).get("path")
    path = Path(path) if path else Path(c.get("results_root", ".")) / "runs.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    row = csv_row(c, run_dir, result)
    with open(path, "a", newline="") as f:
        fcntl.flock(f, fcntl.LOCK_EX)   # parallel jobs: one writer at a time, header once
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        if f.tell() == 0:
            w.writeheader()
        w.writerow(row)
    return path


def _have_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text()
    except OSError:
        return False


def wandb_mode(lc: dict) -> str:
    """The mode asked for (logger.mode, else $WANDB_MODE, else offline); online needs a key."""
    mode = lc.get("mode") or os.environ.get("WANDB_MODE") or "offline"
    if mode in ("online", "run") and not _have_wandb_key():
        log.warning("wandb: no API key (WANDB_API_KEY or ~/.netrc); logging offline instead "
                    "(upload later with `wandb sync`)")
        mode = "offline"
    return mode


def log_wandb(c: dict, run_dir: Path, result: dict):
    import wandb  # only here: wandb takes a while to import and most runs never need it

    from sarathi_lab.report import flat_metrics
    lc = dict(c.get("logger") or {})
    run_dir = Path(run_dir)
    overrides = rundir.overrides(run_dir)
    wdir = lc.get("dir") or (None if os.environ.get("WANDB_DIR") else str(run_dir))
    run = wandb.init(
        project=lc.get("project") or "sarathi-lab", entity=lc.get("entity"),
        group=str(lc.get("group") or c.get("name")), job_type=c.get("mode", "run"),
        name=",".join(overrides) or run_dir.name, tags=list(lc.get("tags") or []),
        config={k: v for k, v in c.items() if k != "logger"}, dir=wdir, mode=wandb_mode(lc),
        settings=wandb.Settings(console="off", silent=True))
    try:
        if result.get("mode") == "capacity":
            import pandas as pd

            from sarathi_lab.sweeps.capacity import capacity_rows
            for r in capacity_rows(result):
                run.summary[f"capacity_{r['criterion']}_qps"] = r["capacity_qps"]
            run.log({"probes": wandb.Table(dataframe=pd.DataFrame(result["probes"]))})
            return run
        run.summary.update({k: v for k, v in flat_metrics(result).items() if v is not None})
        if lc.get("log_requests", True) and (run_dir / rundir.REQUESTS).exists():
            import pandas as pd
            req = pd.read_parquet(run_dir / rundir.REQUESTS)
            req = req.drop(columns=[k for k in ("token_times", "prompt_token_ids",
                                                "output_token_ids") if k in req])
            run.log({"requests": wandb.Table(dataframe=req)})
        if lc.get("log_plots", True):
            from sarathi_lab.report import single_run_plots
            for name, path in single_run_plots(run_dir, run_dir / "plots").items():
                run.log({name: wandb.Image(str(path))})
    finally:
        run.finish()
    return run


def log_result(c: dict, run_dir, result: dict) -> None:
    """Hand a finished job to the configured logger (none, csv, wandb)."""
    name = (c.get("logger") or {}).get("name", "none")
    if name == "csv":
        log_csv(c, Path(run_dir), result)
    elif name == "wandb":
        log_wandb(c, Path(run_dir), result)
    elif name != "none":
        raise ValueError(f"logger.name={name!r}: must be one of none, csv, wandb")
