"""Sweep bookkeeping: run and sweep directory names, sweep.json and sweep.log, the closing tally,
and where a job stands in its sweep."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
from datetime import datetime
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

def dirname(overrides: str) -> str:
    """A job's overrides as one directory name: deterministic (resume finds it again), no path
    separators, and short enough for any filesystem (a long one keeps its head and a hash)."""
    name = overrides.replace(os.sep, "%") or "defaults"
    if len(name) > 120:
        name = f"{name[:100]}..{hashlib.sha1(name.encode()).hexdigest()[:10]}"
    return name


OmegaConf.register_new_resolver("dirname", dirname, replace=True)

# Set by the task function (single run) or the sweep callback (multirun); read by the CLI.
_failures: list[str] = []


def _append(path: Path, line: str) -> None:
    """One line, appended under a lock: parallel jobs share the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(line.rstrip("\n") + "\n")


def count_jobs(config: DictConfig) -> int | None:
    """How many jobs the basic sweeper will launch (None for other sweepers)."""
    try:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser
        if "BasicSweeper" not in str(config.hydra.sweeper.get("_target_", "")):
            return None
        params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
        parsed = OverridesParser.create().parse_overrides(
            params + list(config.hydra.overrides.task))
        return sum(len(b) for b in BasicSweeper.split_arguments(parsed, None))
    except Exception:   # a count is a nicety; never let it break a sweep
        return None


class SweepLog(Callback):
    """Writes sweep.json (name, job count) before the jobs start and, at the end, prints the
    tally of this invocation's lines in sweep.log; failed jobs make the command exit non-zero."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        total = count_jobs(config)
        (sweep_dir / "sweep.json").write_text(json.dumps(
            {"name": str(config.name), "total": total, "started": datetime.now().isoformat()}))
        logf = sweep_dir / "sweep.log"
        self._offset = logf.stat().st_size if logf.exists() else 0
        print(f"sweep {config.name}: {total if total is not None else '?'} jobs -> {sweep_dir}",
              flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        logf = sweep_dir / "sweep.log"
        lines = []
        if logf.exists():
            with open(logf) as f:
                f.seek(getattr(self, "_offset", 0))
                lines = f.read().splitlines()
        status = [ln.split("\t")[2] for ln in lines if ln.count("\t") >= 3]
        failed = [ln.split("\t")[3] for ln in lines
                  if ln.count("\t") >= 3 and ln.split("\t")[2] == "failed"]
        tally = ", ".join(f"{status.count(s)} {s}" for s in ("done", "skipped", "merged", "failed")
                          if s != "merged" or "merged" in status)
        print(f"sweep {config.name}: {tally} -> {sweep_dir}", flush=True)
        for f in failed:
            print(f"  failed: {f or '(no overrides)'}", flush=True)
        if failed:
            _failures.extend(failed)
        elif status:
            print(f"report: sarathi-lab-report {sweep_dir}", flush=True)


class _Job:
    """Where this job stands: its directory, and its place in the sweep (if any)."""

    def __init__(self):
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        hc = HydraConfig.get()
        self.dir = Path(hc.runtime.output_dir)
        self.multirun = hc.mode == RunMode.MULTIRUN
        self.label = hc.job.override_dirname or "(defaults)"
        self.sweep_dir = Path(str(hc.sweep.dir)) if self.multirun else None
        self.parallel = self.multirun and "joblib" in str(hc.launcher.get("_target_", "")) \
            and hc.launcher.get("n_jobs", -1) != 1
        self.index, self.total = None, None
        if self.multirun:
            self.index = int(hc.job.num) + 1
            try:
                self.total = json.loads((self.sweep_dir / "sweep.json").read_text())["total"]
            except (OSError, ValueError, KeyError):
                pass

    def tag(self, name: str) -> str:
        return f"[{name} {self.index}/{self.total or '?'}]"

    def record(self, name: str, status: str, detail: str) -> None:
        """The sweep-level progress line: plain text, one per job, fit for CI logs."""
        if not self.multirun:
            return
        print(f"{self.tag(name)} {status:<7} {self.label}  {detail}", flush=True)
        _append(self.sweep_dir / "sweep.log", "\t".join(
            [datetime.now().isoformat(timespec="seconds"),
             f"{self.index}/{self.total or '?'}", status, self.label, detail]))


