"""`sarathi-lab`: one run or one capacity search (`mode`), alone or as the jobs of a Hydra multirun.

In a multirun every job writes its own directory, a line in the sweep's `sweep.log` and, if it
fails, its traceback in `error.txt`; a failing job never stops the others, and the sweep exits
non-zero at the end if any failed. `resume=true` skips jobs whose result is already there.
Start-up stays light: pandas, matplotlib, torch and wandb are imported only when a job needs them.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback

import hydra
from omegaconf import DictConfig, OmegaConf

from sarathi_lab.sweeps import Abort, Interrupted, _Job, register_resolvers, stop_on_signals

MODES = ("run", "capacity")
LOGGERS = ("none", "csv", "wandb")
RESULT_FILE = {"run": "summary.json", "capacity": "capacity.json"}
ARRIVALS = ("poisson", "uniform", "trace")
CRITERIA = ("tbt", "attainment")



# ------------------------------------------------------------------------------------------
# Validation: every message names the setting, as it would be typed on the command line
# ------------------------------------------------------------------------------------------

def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _need(cond: bool, setting: str, value, why: str) -> None:
    if not cond:
        raise ValueError(f"{setting}={value!r}: {why}")


def check_config(c: dict) -> None:
    """Reject settings that would fail deep inside a run (or, worse, run and mean nothing)."""
    from sarathi_lab.registry import executor_class, policy_class
    from sarathi_lab.runner import scheduler_config

    mode = c.get("mode", "run")
    _need(mode in MODES, "mode", mode, f"must be one of {', '.join(MODES)}")
    tr = c.get("trace") or {}
    qps = tr.get("qps")
    _need(qps is None or (_number(qps) and qps > 0), "trace.qps", qps,
          "must be a positive arrival rate in requests/s (or null to keep a trace's own times)")
    n = tr.get("num_requests")
    _need(n is None or (isinstance(n, int) and not isinstance(n, bool) and n >= 1),
          "trace.num_requests", n, "must be an integer >= 1 (or null for the whole trace)")
    sched = dict(c.get("scheduler") or {})
    name = sched.get("name")
    _need(isinstance(name, str) and bool(name), "scheduler.name", name, "must be a policy name")
    try:
        policy_class(name)
        executor_class((c.get("executor") or {}).get("name", "sim"))
    except ValueError as e:
        setting = "scheduler.name" if "scheduler" in str(e) else "executor.name"
        raise ValueError(f"{setting}: {e}") from None
    try:
        scheduler_config(sched, 1 << 30)   # the policy's own checks; the model length comes later
    except TypeError as e:
        raise ValueError(f"scheduler: {e}") from None
    lg = (c.get("logger") or {}).get("name", "none")
    _need(lg in LOGGERS, "logger.name", lg, f"must be one of {', '.join(LOGGERS)}")
    slo = c.get("slo") or {}
    for key in ("p99_tbt", "request_p99_tbt", "ttft", "tpot", "max_median_scheduling_delay"):
        v = slo.get(key)
        _need(v is None or (_number(v) and v > 0), f"slo.{key}", v, "must be seconds > 0 or null")
    t = slo.get("attainment_target", 0.9)
    _need(_number(t) and 0 < t <= 1, "slo.attainment_target", t, "must be a share in (0, 1]")
    if mode == "capacity":
        _check_capacity(c.get("capacity") or {})


def _check_capacity(cap: dict) -> None:
    lo, hi = cap.get("qps_low"), cap.get("qps_high")
    _need(_number(lo) and lo > 0, "capacity.qps_low", lo, "must be > 0 (requests/s)")
    _need(_number(hi) and hi > lo, "capacity.qps_high", hi, f"must be > capacity.qps_low={lo}")
    p = cap.get("precision")
    _need(_number(p) and 0 < p < 1, "capacity.precision", p, "must be a share in (0, 1)")
    m = cap.get("max_probes")
    _need(isinstance(m, int) and m >= 2, "capacity.max_probes", m, "must be an integer >= 2")
    n = cap.get("num_requests")
    _need(n is None or (isinstance(n, int) and n >= 1), "capacity.num_requests", n,
          "must be an integer >= 1 or null")
    a = cap.get("arrivals")
    _need(a in ARRIVALS, "capacity.arrivals", a, f"must be one of {', '.join(ARRIVALS)}")
    crit = list(cap.get("criteria") or [])
    _need(bool(crit) and all(k in CRITERIA for k in crit), "capacity.criteria", crit,
          f"must be a non-empty list of {', '.join(CRITERIA)}")


def _key_metrics(mode: str, result: dict) -> str:
    if mode == "capacity":
        from sarathi_lab.capacity import short_answer
        return short_answer(result)
    s, slo = result, result.get("slo") or {}

    def ms(v):
        return "-" if v is None else f"{v * 1e3:.0f} ms"

    def sec(v):
        return "-" if v is None else f"{v:.2f} s"
    parts = [f"TBT p99 {ms(s['tbt']['p99'])}", f"TTFT p50 {sec(s['ttft']['p50'])}",
             f"{s['throughput_rps']:.2f} req/s"]
    if slo:
        parts.append(f"goodput {slo['goodput_rps']:.2f} req/s, "
                     f"TBT SLO {'met' if slo['meets_tbt_slo'] else 'missed'}")
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

def _execute(c: dict, job: _Job) -> dict:
    mode = c.get("mode", "run")
    if job.parallel and c.get("progress", "auto") == "auto":
        c["progress"] = False    # bars of parallel jobs would overwrite each other
    if mode == "capacity":
        from sarathi_lab.capacity import format_result, search
        result = search(c, job.dir)
        text = format_result(result)
    else:
        from sarathi_lab.runner import format_summary, run
        result = run(c, job.dir)
        text = format_summary(result)
    if (c.get("logger") or {}).get("name", "none") != "none":
        from sarathi_lab.loggers import log_result
        log_result(c, job.dir, result)
    if not job.multirun:
        print(text)
    return result


@hydra.main(version_base="1.3", config_path="pkg://sarathi_lab.configs", config_name="config")
def _main(cfg: DictConfig):
    job = _Job()
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
        check_config(c)
        (job.dir / "error.txt").unlink(missing_ok=True)   # a stale one from an earlier try
        _limit_threads(c, job)
        result = _execute(c, job)
    except Exception as e:   # recorded, never lost: the sweep goes on without this job
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


def main() -> None:
    """`sarathi-lab`. Exit status 0: every job done; 1: a job failed, or the command could not
    start (one line says why); 128 + N: stopped by signal N, with the sweep's workers."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    register_resolvers()
    try:
        with stop_on_signals():
            _main()
    except Interrupted as e:
        sys.stderr.write(f"sarathi-lab: stopped by {e}; finished jobs keep their results "
                         "(resume=true runs the rest)\n")
        sys.exit(128 + e.signum)


if __name__ == "__main__":
    main()
