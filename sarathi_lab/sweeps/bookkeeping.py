"""Sweep bookkeeping: run and sweep directory names, one sweep at a time per directory (a lock),
sweep.json and sweep.log, the closing tally, where a job stands in its sweep, and stopping a
sweep together with its worker processes."""
from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import types
from datetime import datetime
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from sarathi_lab.run.rundir import atomic_write

LOCK = "sweep.lock"
LOCK_PATIENCE_S = 1.0   # a reader probing the lock (sarathi-lab-report) holds it for an instant
RAY_CONNECT_S = 10.0    # hydra/launcher=ray: how long the cluster's address may take to answer


_PORTABLE = re.compile(r"[^A-Za-z0-9._=+@-]")   # what every filesystem and shell takes as is


def dirname(overrides: str) -> str:
    """A job's overrides (Hydra's `override_dirname`, items joined by ",") as one directory name:
    deterministic (resume finds it again), portable (no commas, colons, backslashes, path
    separators or spaces: items are joined by "__", any other such character becomes "_"),
    and short enough for any filesystem (a long one keeps its head and a hash). Where that is
    not reversible (a character replaced, or "__"/"_," already in the overrides) a hash of the
    overrides keeps two jobs apart. The overrides themselves stay in .hydra/overrides.yaml."""
    if not overrides:
        return "defaults"
    name = _PORTABLE.sub("_", overrides.replace(",", "__"))
    if name.replace("__", ",") != overrides:
        name = f"{name}~{hashlib.sha1(overrides.encode()).hexdigest()[:6]}"
    if len(name) > 120:
        name = f"{name[:100]}..{hashlib.sha1(overrides.encode()).hexdigest()[:10]}"
    return name


def register_resolvers() -> None:
    """Register `${dirname:...}`, which the run and sweep directories in config.yaml use. The
    CLI does this before Hydra composes; code that composes the config itself (Hydra's compose
    API) and resolves the `hydra` section calls it first."""
    if not OmegaConf.has_resolver("dirname"):
        OmegaConf.register_new_resolver("dirname", dirname)


def compose_config(overrides: list[str], config_name: str = "config") -> dict:
    """The config `sarathi-lab <overrides>` would run (Hydra's compose API, resolvers
    registered), as a plain dict without the `hydra` node: for commands and scripts that build
    runs in-process. A Hydra error (an unknown group or option, a malformed override) is a
    ConfigError naming the overrides."""
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException

    from sarathi_lab.settings import ConfigError, plain
    register_resolvers()
    try:
        with initialize_config_module("sarathi_lab.configs", version_base="1.3"):
            cfg = compose(config_name, overrides=list(overrides))
    except HydraException as e:
        raise ConfigError(f"{' '.join(overrides)}: {e}") from None
    c = plain(cfg)
    c.pop("hydra", None)
    return c


def start_collecting() -> None:
    """`sarathi-lab` starts with the cyclic garbage collector off: start-up makes a few hundred
    thousand objects that live to the end (modules, Hydra's state), and each collection would
    walk them all again. When the first job (or a sweep) starts they are set aside (frozen), so
    that later collections look only at what comes after. Only that once: a later job of a
    multirun must not freeze the previous job's uncollected garbage for good."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def ray_worker_setup() -> None:
    """Ray's worker_process_setup_hook (configs/hydra/launcher/ray.yaml). A Ray worker starts in
    the directory its node's Ray was started from; a sweep's jobs run where the sweep was
    started (SARATHI_LAB_CWD), as under the other launchers, so that `results_root=outputs` and
    a relative trace path name the same place. On a node without that directory the worker
    fails to start, naming it, rather than writing results where the sweep does not look."""
    cwd = os.environ.get("SARATHI_LAB_CWD")
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as e:
            raise OSError(f"sarathi-lab: the sweep's directory {cwd} is not on this node "
                          f"({socket.gethostname()}): {e.strerror}; results_root and the "
                          "directory the sweep starts from must be shared by every node") \
                from None


def _start_ray(init: DictConfig) -> None:
    """Join (or start) the Ray cluster of hydra/launcher=ray before the launcher does, which
    then uses it as it is: Ray's ray.init takes over SIGTERM, so that Ctrl-C would stop the
    sweep and SIGTERM end it without a word; the handlers of `stop_on_signals` are put back.
    What the jobs print reaches this terminal as they print it: no "(pid=..)" prefix, no
    colour, and no folding into "[repeated 2x]" of lines that differ only in numbers, as the
    lines of a sweep's jobs do (Ray reads these when it is imported)."""
    for var, value in (("RAY_DISABLE_WORKER_LOG_PREFIX", "1"), ("RAY_COLOR_PREFIX", "0"),
                       ("RAY_DEDUP_LOGS", "0")):
        os.environ.setdefault(var, value)
    import ray
    if ray.is_initialized():
        return
    address = init.get("address")
    where = f"hydra.launcher.ray.init.address={address}"
    if address and address != "auto" and "://" not in str(address):
        # Ray itself retries an address where nothing answers for minutes on end
        host, _, port = str(address).rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=RAY_CONNECT_S).close()
        except (OSError, ValueError) as e:
            raise Abort(f"sarathi-lab: error: no Ray cluster answers at {where}: {e}") from None
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        ray.init(**OmegaConf.to_container(init, resolve=True))
    except Exception as e:   # ConnectionError, ValueError, RuntimeError: Ray's words say why
        raise Abort(f"sarathi-lab: error: cannot join the Ray cluster ({where}): "
                    f"{type(e).__name__}: {e}") from None
    for s, h in handlers.items():
        if h is not None:
            signal.signal(s, h)


class Abort(SystemExit):
    """Ends the command from inside Hydra's machinery, which would turn an exception raised in a
    callback into a warning (and go on) and one raised in a job into a traceback. A message is
    printed as it is, one line on stderr; the exit status is 1."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP raised the way Ctrl-C is, so that everything unwinding it (joblib's
    abort above all) treats them alike."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    def __str__(self) -> str:
        return signal.Signals(self.signum).name


@contextlib.contextmanager
def stop_on_signals():
    """While the command runs, SIGINT, SIGTERM and SIGHUP raise `Interrupted` in it. The
    exception unwinds through the launcher: joblib then kills its worker processes, which the
    default SIGTERM (this process gone at once) leaves computing. A further signal is ignored
    while that clean-up runs; a signal ignored when the command started (a background job,
    nohup) stays ignored. Yields where the signal is recorded (`.signum`, else None): Ray
    turns the exception into a plain KeyboardInterrupt on its way out of ray.get."""
    received = types.SimpleNamespace(signum=None)
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {}

    def handler(signum, frame):
        for s in previous:
            signal.signal(s, signal.SIG_IGN)
        received.signum = signum
        # the stopped jobs' Ray workers die with them, and Ray's driver would log each of their
        # results as an "Unhandled error" from its own thread, after the stop's last line; the
        # stop has already said what is kept (read by Ray when it raises: set here, not earlier)
        os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
        raise Interrupted(signum)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(s) is not signal.SIG_IGN:
            previous[s] = signal.signal(s, handler)
    try:
        yield received
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _or_abort(what: str):
    """An OSError (a full disk, a directory that cannot be made or written) ends the command
    with one line naming what could not be written."""
    try:
        yield
    except OSError as e:
        raise Abort(f"sarathi-lab: error: cannot write {what}: {e}") from None


def _setting(config: DictConfig, path: Path, key: str) -> str:
    """The setting that put `path` where it is: results_root, unless `key` moved it elsewhere."""
    root = config.get("results_root")
    if root is not None and Path(str(root)) in (path, *path.parents):
        return f"results_root={root}"
    return f"{key}={path}"


def _append(path: Path, line: str) -> None:
    """One line, appended under a lock: parallel jobs share the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(line.rstrip("\n") + "\n")


def lock_sweep(sweep_dir: Path, name: str):
    """Take the sweep directory's lock for the multirun's life and return it (an open file:
    closing it, or this process ending in any way, releases it; flock, so a killed sweep leaves
    no stale lock). A second sweep into the same directory is refused, naming the first."""
    f = open(sweep_dir / LOCK, "a+")
    deadline = time.monotonic() + LOCK_PATIENCE_S
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise Abort(f"sarathi-lab: error: sweep {name} is already running in {sweep_dir} "
                        f"({holder}); wait for it to end, or give this one another name=") \
                from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()}, "
            f"started {datetime.now():%Y-%m-%d %H:%M:%S}\n")
    f.flush()
    return f


def sweep_holder(sweep_dir: Path) -> str | None:
    """Who runs the sweep in `sweep_dir` now ("pid N on HOST, started ..."), or None."""
    try:
        f = open(Path(sweep_dir) / LOCK)
    except OSError:
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return f.read().strip() or "another process"
        return None


def count_jobs(config: DictConfig) -> int | None:
    """How many jobs the basic sweeper will launch (`sweeps.check.job_overrides`); None for
    another sweeper or a sweep that cannot be enumerated up front."""
    from sarathi_lab.sweeps.check import job_overrides
    jobs = job_overrides(config)
    return None if jobs is None else len(jobs)


class SweepLog(Callback):
    """The command's side of a multirun: takes the sweep directory's lock, writes sweep.json
    (name, job count) before the jobs start and, at the end, prints the tally of this
    invocation's lines in sweep.log; a failed job, or one that left no line, makes the command
    exit non-zero. Before a single run it makes the run directory, so that one that cannot be
    made is one line, not Hydra's traceback."""

    def __init__(self):
        self._lock = None
        self._offset = 0
        self._total = None

    # Launchers that run jobs in other processes (joblib, submitit) pickle this callback with
    # the Hydra context (the resolvers travel in Hydra's own state); the lock stays here.
    def __getstate__(self):
        return {**self.__dict__, "_lock": None}

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        run_dir = Path(str(config.hydra.run.dir))
        with _or_abort(f"the run directory ({_setting(config, run_dir, 'hydra.run.dir')})"):
            run_dir.mkdir(parents=True, exist_ok=True)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        start_collecting()   # the sweep may run for hours here, its jobs elsewhere
        # hydra/launcher=ray, not ray_aws (which starts Ray on the machines it makes)
        if str(config.hydra.launcher.get("_target_", "")).endswith(".ray_launcher.RayLauncher"):
            _start_ray(config.hydra.launcher.ray.init)   # before anything is written
        from sarathi_lab.sweeps import check as sweep_check
        bad = sweep_check.check_jobs(config)   # before anything is written or started
        if bad is not None:
            raise Abort(f"sarathi-lab: error: sweep {config.name}: {bad}; no job was started")
        sweep_dir = Path(str(config.hydra.sweep.dir))
        grid = sweep_check.grid(config)
        with _or_abort(f"the directory of sweep {config.name} "
                       f"({_setting(config, sweep_dir, 'hydra.sweep.dir')})"):
            sweep_dir.mkdir(parents=True, exist_ok=True)
            self._lock = lock_sweep(sweep_dir, str(config.name))
            other = sweep_check.refuse_other_grid(sweep_dir, str(config.name), grid)
            if other is not None and not other.startswith("note: "):
                self._lock.close()
                raise Abort(f"sarathi-lab: error: {other}")
            if other is not None:
                print(f"sweep {config.name}: {other}", flush=True)
            total = count_jobs(config)
            atomic_write(sweep_dir / "sweep.json", lambda p: p.write_text(json.dumps(
                {"name": str(config.name), "total": total, "grid": grid,
                 "started": datetime.now().isoformat()})))
        logf = sweep_dir / "sweep.log"
        self._offset = logf.stat().st_size if logf.exists() else 0
        self._total = total
        print(f"sweep {config.name}: {total if total is not None else '?'} jobs -> {sweep_dir}",
              flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        logf = sweep_dir / "sweep.log"
        lines = []
        if logf.exists():
            with open(logf) as f:
                f.seek(self._offset)
                lines = [ln.split("\t") for ln in f.read().splitlines() if ln.count("\t") >= 3]
        status = [ln[2] for ln in lines]
        failed = [ln[3] for ln in lines if ln[2] == "failed"]
        silent = max(0, (self._total or 0) - len(lines))
        tally = ", ".join(f"{status.count(s)} {s}" for s in ("done", "skipped", "merged", "failed")
                          if s != "merged" or "merged" in status)
        print(f"sweep {config.name}: {tally}" + (f", {silent} without a line in sweep.log"
                                                  if silent else "") + f" -> {sweep_dir}",
              flush=True)
        for f in failed:
            print(f"  failed: {f or '(no overrides)'}", flush=True)
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        if failed or silent:
            raise Abort(1)
        if status:
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
        launcher = str(hc.launcher.get("_target_", ""))
        self.parallel = self.multirun and (
            "hydra_ray_launcher" in launcher
            or "joblib" in launcher and hc.launcher.get("n_jobs", -1) != 1)
        self.index, self.total = None, None
        if self.multirun:
            self.index = int(hc.job.num) + 1
            try:
                self.total = json.loads((self.sweep_dir / "sweep.json").read_text())["total"]
            except (OSError, ValueError, KeyError):
                pass

    def tag(self, name: str) -> str:
        return f"[{name} {self.index}/{self.total or '?'}]"

    def save_error(self, tb: str) -> str:
        """The traceback into error.txt; says where it is, or why it is nowhere: a full disk
        must not turn one error into a second one that hides the first."""
        path = self.dir / "error.txt"
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            atomic_write(path, lambda p: p.write_text(tb))
        except OSError as e:
            return f"traceback not saved: {e}"
        return f"traceback in {path}"

    def record(self, name: str, status: str, detail: str) -> None:
        """The sweep-level progress line: plain text, one per job, fit for CI logs. A line that
        cannot be appended to sweep.log is said on stderr (and the tally counts it missing)."""
        if not self.multirun:
            return
        print(f"{self.tag(name)} {status:<7} {self.label}  {detail}", flush=True)
        try:
            _append(self.sweep_dir / "sweep.log", "\t".join(
                [datetime.now().isoformat(timespec="seconds"),
                 f"{self.index}/{self.total or '?'}", status, self.label, detail]))
        except OSError as e:
            print(f"{self.tag(name)} cannot append to sweep.log: {e}", file=sys.stderr,
                  flush=True)
