"""`sarathi-lab`: one run or one capacity search (`mode`), alone or as the jobs of a Hydra multirun.

In a multirun every job writes its own directory, a line in the sweep's `sweep.log` and, if it
fails, its traceback in `error.txt`; a failing job never stops the others, and the sweep exits
non-zero at the end if any failed. `resume=true` skips jobs whose result is already there.
Start-up stays light: pandas, matplotlib, torch and wandb are imported only when a job needs them.
"""
from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from sarathi_lab.run import rundir
from sarathi_lab.settings import ConfigError
from sarathi_lab.sweeps.bookkeeping import (
    Abort,
    Interrupted,
    _Job,
    register_resolvers,
    start_collecting,
    stop_on_signals,
)

RESULT_FILE = {"run": rundir.SUMMARY, "capacity": rundir.CAPACITY}
_single_run_dir: Path | None = None   # a single run's directory, for what a stop leaves there



# ------------------------------------------------------------------------------------------
# Validation: every message names the setting, as it would be typed on the command line
# ------------------------------------------------------------------------------------------

def check_config(c: dict, overrides=None, multirun: bool = False):
    """Every component's settings typed and checked (`config.resolve`), before any run
    directory is made or model loaded. Returns the `Resolved` config."""
    from sarathi_lab.run.config import follow_the_user, resolve
    follow_the_user(c, overrides)   # in place: the run reads c
    return resolve(c, overrides, drop_unread=multirun)


def _claim(sweep_dir: Path, resolved, job: _Job) -> str | None:
    """In a multirun, the first job with a given effective configuration claims it; a later
    one with the same (it differed only in settings its components do not read) is merged
    into it. Returns the claiming job's label if this job is merged, else None."""
    key = hashlib.sha1(json.dumps(resolved.effective(), sort_keys=True, default=str)
                       .encode()).hexdigest()[:16]
    claims = sweep_dir / ".claims"
    claims.mkdir(parents=True, exist_ok=True)
    path = claims / key
    mine = json.dumps({"label": job.label, "dir": str(job.dir)})
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        owner = json.loads(path.read_text() or "{}")
        return None if owner.get("label") == job.label else owner.get("label", "?")
    with os.fdopen(fd, "w") as f:
        f.write(mine)
    return None


def _key_metrics(mode: str, result: dict) -> str:
    if mode == "capacity":
        from sarathi_lab.sweeps.capacity import short_answer
        return short_answer(result)
    s, slo = result, result.get("slo") or {}

    def ms(v):
        return "-" if v is None else f"{v * 1e3:.0f} ms"

    def sec(v):
        return "-" if v is None else f"{v:.2f} s"
    parts = [f"TBT p99 {ms(s['tbt']['p99'])}", f"TTFT p50 {sec(s['ttft']['p50'])}",
             f"{s['throughput_rps']:.2f} req/s"]
    if s.get("num_rejected"):   # a run that served only some of its requests says so
        parts.insert(0, f"REJECTED {s['num_rejected']} of {s['num_requests']}")
    if slo:
        # only the criteria the SLO defines (a TTFT/TPOT SLO has no P99-TBT criterion)
        kinds = {c["criterion"] for c in slo.get("criteria", ())}
        part = f"goodput {slo['goodput_rps']:.2f} req/s"
        if "tbt" in kinds:
            part += f", TBT SLO {'met' if slo['meets_tbt_slo'] else 'missed'}"
        if "attainment" in kinds:
            part += f", attainment {'met' if slo['meets_attainment'] else 'missed'}"
        parts.append(part)
    return " | ".join(parts)


def _limit_threads(c: dict, job: _Job) -> None:
    """Parallel jobs share the cores: one torch thread each unless told otherwise. torch is
    only touched if already imported; otherwise the environment tells it when it loads."""
    n = c.get("num_threads", "auto")
    if n == "auto":
        n = 1 if job.parallel else None
    if not n:
        return
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(n))


# ------------------------------------------------------------------------------------------
# The job
# ------------------------------------------------------------------------------------------

def _overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig
    return list(HydraConfig.get().overrides.task)


def _remove_fresh_run_dir(path: Path) -> None:
    """Remove a run directory that holds nothing but Hydra's own records (its config copy and
    an empty job log)."""
    import shutil
    if path.is_dir() and all(p.name == ".hydra" or (p.suffix == ".log" and not p.stat().st_size)
                             for p in path.iterdir()):
        shutil.rmtree(path)


def _execute(c: dict, job: _Job, resolved) -> dict:
    mode = c.get("mode", "run")
    if job.parallel and c.get("progress", "auto") == "auto":
        c["progress"] = False    # bars of parallel jobs would overwrite each other
    if mode == "capacity":
        from sarathi_lab.run.config import without_unread
        from sarathi_lab.sweeps.capacity import format_result, search
        # each probe resolves the config again: without the settings the multirun left out
        result = search(without_unread(c, resolved.notes), job.dir)
        text = format_result(result)
    else:
        from sarathi_lab.run.runner import run
        from sarathi_lab.run.summary_text import check_served, format_summary
        result = run(c, job.dir, resolved=resolved)
        text = format_summary(result)
    if (c.get("logger") or {}).get("name", "none") != "none":
        from sarathi_lab.cli.loggers import log_result
        log_result(c, job.dir, result)
    if not job.multirun:
        print(text)
    if mode != "capacity":
        check_served(result)   # after the summary is shown; fails the job (exit 1)
    return result


@hydra.main(version_base="1.3", config_path="pkg://sarathi_lab.configs", config_name="config")
def _main(cfg: DictConfig):
    global _single_run_dir
    job = _Job()
    if not job.multirun:
        _single_run_dir = job.dir
    name = str(cfg.get("name", ""))
    t0 = time.perf_counter()
    try:
        c = OmegaConf.to_container(cfg, resolve=True)
        mode = c.get("mode", "run")
        done = job.dir / RESULT_FILE.get(mode, "summary.json")
        if c.get("resume") and done.exists():
            result = json.loads(done.read_text())
            job.record(name, "skipped", f"already done ({done.name} exists)")
            if not job.multirun:
                print(f"skipped: {done} exists (resume=true)")
            return result
        try:
            resolved = check_config(c, _overrides(), job.multirun)
        except ConfigError as e:
            if job.multirun:
                raise
            # a single run's configuration error leaves no run directory behind
            _remove_fresh_run_dir(job.dir)
            sys.stderr.write(f"sarathi-lab: error: {e}\n")
            raise Abort(1) from None
        if job.multirun:
            same_as = _claim(job.sweep_dir, resolved, job)
            if same_as is not None:
                why = "; ".join(resolved.notes) or "same settings"
                rundir.write_json(job.dir / rundir.MERGED,
                                  {"same_as": same_as, "unread": resolved.notes})
                job.record(name, "merged", f"same run as {same_as} ({why})")
                return None
            for note in resolved.notes:
                print(f"{job.tag(name)} note: {note} (left out)", flush=True)
        (job.dir / "error.txt").unlink(missing_ok=True)   # a stale one from an earlier try
        _limit_threads(c, job)
        start_collecting()
        result = _execute(c, job, resolved)
    except Exception as e:   # recorded, never lost: the sweep goes on without this job
        if not job.multirun and isinstance(e, ConfigError):
            # a setting refused once the run was building (a bound, the trace's settings): as
            # a configuration error, no run directory is left that holds no run
            _remove_fresh_run_dir(job.dir)
            if not job.dir.exists():
                sys.stderr.write(f"sarathi-lab: error: {e}\n")
                raise Abort(1) from None
        tb = traceback.format_exc()
        where = job.save_error(tb)
        if job.multirun:
            job.record(name, "failed", f"{type(e).__name__}: {e} ({where})")
            return None
        if not isinstance(e, (ValueError, OSError)):   # a bug, not a setting or the disk
            sys.stderr.write(tb)
        sys.stderr.write(f"sarathi-lab: error: {e}\n({where})\n")
        raise Abort(1) from None
    job.record(name, "done", f"{time.perf_counter() - t0:.1f} s | {_key_metrics(mode, result)}")
    if not job.multirun:
        print(f"\n{'capacity' if mode == 'capacity' else 'run'} directory: {job.dir.resolve()}")
    return result


def _mode_is_known(argv: list[str]) -> bool:
    """Whether `hydra.mode` is surely unset for this command line: no override names it, and
    no option or override brings in configs from elsewhere (another config path, directory or
    name, a search path), which only ours are checked for (tests/test_cli.py: none sets it)."""
    return not any(a.startswith("-") and a not in ("-m", "--multirun")
                   or "hydra.mode" in a or "searchpath" in a for a in argv)


@contextlib.contextmanager
def _no_mode_probe(argv: list[str]):
    """Hydra composes the whole configuration twice per command: once only to read
    `hydra.mode` (Hydra.get_mode), then for the run; each takes about 0.3 s. Where the mode is
    surely unset, the probe's answer is known: None, which Hydra reads as "what the -m flag
    says". Any other command line keeps the probe, and so does any Hydra but 1.3 (the one place
    the project touches a private Hydra module, checked in tests/test_sweeps.py)."""
    if not hydra.__version__.startswith("1.3.") or not _mode_is_known(argv):
        yield
        return
    from hydra._internal.hydra import Hydra
    probe = Hydra.get_mode

    def unset(self, *args, **kwargs):
        return None
    Hydra.get_mode = unset
    try:
        yield
    finally:
        Hydra.get_mode = probe


@contextlib.contextmanager
def _composition_errors():
    """Hydra reports an error composing the command line in its own words and exits, unless
    HYDRA_FULL_ERROR is set, when it raises the exception instead: set for the command, so that
    `run.hydra_errors` can say what to type instead. Jobs catch their own errors (`_main`), so this
    changes nothing else; a user who sets HYDRA_FULL_ERROR gets Hydra's full traceback."""
    if os.environ.get("HYDRA_FULL_ERROR"):
        yield
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    except Exception as e:
        from hydra.errors import CompactHydraException

        from sarathi_lab.run.hydra_errors import explain
        message = explain(e, sys.argv[1:])
        if message is not None:
            raise Abort(f"sarathi-lab: error: {message}") from None
        if not isinstance(e, CompactHydraException):
            raise   # a bug: its traceback
        cause = f"\n{e.__cause__}" if e.__cause__ is not None else ""
        raise Abort(f"sarathi-lab: error: {e}{cause}") from None   # as Hydra words it
    finally:
        os.environ.pop("HYDRA_FULL_ERROR", None)


# Options of a config group that are not choices: the settings every policy option includes.
INTERNAL_OPTIONS = {"scheduler": ("common",)}


def public_help(text: str) -> str:
    """Hydra's --help text without the internal options (`INTERNAL_OPTIONS`) in its list of
    config groups ("scheduler: common, custom, ..." lists what `scheduler=` may choose)."""
    lines = []
    for line in text.splitlines(keepends=True):
        group, sep, options = line.partition(": ")
        if sep and group in INTERNAL_OPTIONS:
            kept = [o for o in options.strip().split(", ") if o not in INTERNAL_OPTIONS[group]]
            line = f"{group}: {', '.join(kept)}\n"
        lines.append(line)
    return "".join(lines)


@contextlib.contextmanager
def _public_help(argv: list[str]):
    """--help prints Hydra's help (the config groups and the composed config), as
    `public_help` words it."""
    if not {"--help", "-h"} & set(argv):
        yield
        return
    import io
    text = io.StringIO()
    try:
        with contextlib.redirect_stdout(text):
            yield
    finally:
        sys.stdout.write(public_help(text.getvalue()))


def _what_is_kept() -> str:
    """What a stopped command leaves: a sweep's finished jobs keep their results; a single run
    writes its results only when it ends, so a stopped one keeps none, and its directory goes
    if it holds nothing but Hydra's records."""
    if _single_run_dir is None:
        return "finished jobs keep their results (resume=true runs the rest)"
    _remove_fresh_run_dir(_single_run_dir)
    where = ("its directory is removed" if not _single_run_dir.exists()
             else f"{_single_run_dir} holds what it wrote before")
    return f"the run did not finish and no result of it is kept ({where})"


def main() -> None:
    """`sarathi-lab`. Exit status 0: every job done; 1: a job failed, or the command could not
    start (one line says why); 128 + N: stopped by signal N, with the sweep's workers."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    gc.disable()   # until the job (or the sweep) starts: `sweeps.start_collecting`
    from sarathi_lab.extras import MissingExtra, check_extras
    try:
        check_extras(sys.argv[1:])   # before Hydra composes: no job starts without its extras
    except MissingExtra as e:
        sys.exit(f"sarathi-lab: error: {e}")
    register_resolvers()
    # configs/hydra/launcher/ray.yaml extends the Ray plug-in's config of the same name, which
    # Hydra checks it against (harmless) with a deprecation warning, repeated at every step
    warnings.filterwarnings("ignore", message="\n'hydra/launcher/ray' is validated against "
                            "ConfigStore schema with the same name", category=UserWarning)
    try:
        with stop_on_signals() as received, _no_mode_probe(sys.argv[1:]), \
                _composition_errors(), _public_help(sys.argv[1:]):
            _main()
    except KeyboardInterrupt:   # Interrupted, or what a launcher (Ray) made of it
        stopped = Interrupted(received.signum or signal.SIGINT)
        sys.stderr.write(f"sarathi-lab: stopped by {stopped}; {_what_is_kept()}\n")
        sys.exit(128 + stopped.signum)
    # The interpreter's last collections before it exits would walk every object left (a
    # tenth of a second after a run); nothing left holds an unwritten result.
    gc.freeze()


if __name__ == "__main__":
    main()
