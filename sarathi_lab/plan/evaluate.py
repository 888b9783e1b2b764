"""One candidate's evaluation: the fewest units that serve the load within the SLO (one unit
at the load first; when it fails, one unit's coarse capacity bounds the count), and that
deployment's capacity. Runs in a worker (joblib or Ray) from a
picklable job; every step leaves its file in the candidate's directory, so that a rerun after an
interruption redoes nothing already done (result.json last: the marker of a finished one).

A deployment of k units replays k times one unit's requests (trace.num_requests): each of its
engines then sees as many requests as one unit alone, so that k units reach the steady state
(the queues) that one reaches. With one unit's requests spread over k, a probe ended before any
queue built and many units looked super-linearly better than one (issue 26)."""
from __future__ import annotations

import json
import math
import shlex
import time
from pathlib import Path

from sarathi_lab.metrics import cost_at_rate
from sarathi_lab.plan.space import with_settings
from sarathi_lab.run import rundir
from sarathi_lab.settings import ConfigError
from sarathi_lab.sweeps import capacity

RESULT = "result.json"
CHECK = "check.json"


def read_json(path: Path) -> dict:
    """A file an earlier evaluation wrote; one cut short (an interrupted write by an older
    version, a full disk) or edited is an error naming it, not a traceback."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a complete JSON file ({e}); it is what an earlier "
                          "evaluation left; delete it (or the candidate's directory) to evaluate "
                          "that step again") from None


class _Eval:
    def __init__(self, job: dict):
        self.job, self.dir = job, Path(job["dir"])
        self.load, self.sims = float(job["load"]), 0

    def config(self, units: int, extra=()):
        """(config, overrides) of `units` units: every setting of `job["per_unit"]` (the
        replicas, and the requests they replay) times `units`."""
        settings = [(k, per * units) for k, per in self.job["per_unit"]] + list(extra)
        return with_settings(self.job["c"], self.job["overrides"], settings)

    def search(self, sub: str, units: int, extra=()) -> dict:
        """capacity.search of `units` units (capacity.json reused when there)."""
        done = self.dir / sub / rundir.CAPACITY
        if done.exists():
            return read_json(done)
        c, _ = self.config(units, extra)
        r = capacity.search({**c, "progress": False}, self.dir / sub)
        self.sims += len(r["probes"])
        return r

    def passes(self, units: int) -> bool:
        """Whether `units` units serve the load within every criterion (one simulation)."""
        path = self.dir / f"units={units}.json"
        if path.exists():
            return read_json(path)["passes"]
        c, _ = self.config(units)
        row = capacity.Prober({**c, "progress": False}, self.dir / f"units={units}")(
            self.load, "plan")
        self.sims += 1
        ok = all(row[capacity.CRITERIA[k][0]] for k in self.job["criteria"])
        self.dir.mkdir(parents=True, exist_ok=True)
        rundir.write_json(path, {"passes": ok, "probe": row})
        return ok


def binding(result: dict) -> tuple[float, str, str]:
    """(capacity, criterion, what it missed at the rate where it failed): the criterion with the
    lowest capacity is the one that binds ("" missed: the search never saw it fail)."""
    crit, r = min(result["criteria"].items(), key=lambda kv: kv[1]["capacity_qps"])
    row = next((p for p in result["probes"] if r["fails_at_qps"] is not None
                and round(p["qps"], 9) == round(r["fails_at_qps"], 9)), {})
    return r["capacity_qps"], crit, row.get(f"{crit}_missed", "")


UNIT_PRECISION = 0.1   # one unit's capacity only sets where the replica search starts


def _units(e: _Eval, method: str, most: int) -> tuple[int | None, dict | None]:
    """(the fewest units whose probe at the load passes, or None when `most` do not; one unit's
    capacity search, when it ran). bisect: more units never lower the capacity, and one unit's
    capacity bounds how many are needed, so the search starts at ceil(load / capacity), doubles
    until a count passes and bisects below it."""
    if method == "exhaustive":
        return next((k for k in range(1, most + 1) if e.passes(k)), None), None
    if e.passes(1):
        return 1, None
    # it fails at the load: its capacity lies below (a bracket widened by the search if not)
    unit = e.search("unit", 1, [("capacity.qps_low", e.load / 8), ("capacity.qps_high", e.load / 2),
                               ("capacity.precision", UNIT_PRECISION)])
    cap = binding(unit)[0]
    if not cap:   # it fails even at a small share of the load: a latency no replica count meets
        return None, unit
    lo, hi = 1, min(most, max(2, math.ceil(e.load / cap)))
    while not e.passes(hi):
        if hi >= most:
            return None, unit
        lo, hi = hi, min(most, hi * 2)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if e.passes(mid):
            hi = mid
        else:
            lo = mid
    return hi, unit


def evaluate(job: dict) -> dict:
    """The candidate's row of the plan (see `sarathi_lab.plan.table.COLUMNS`)."""
    e = _Eval(job)
    done = e.dir / RESULT
    if done.exists():
        return {**read_json(done), "resumed": True}
    t0, cpu0 = time.perf_counter(), time.process_time()
    row = {**job["row"], "load_qps": e.load, "dir": str(e.dir), "resumed": False}
    try:
        row.update(_evaluate(e, job))
    except ConfigError as err:   # e.g. a layout that cannot run as a fleet of several replicas
        row.update(status="infeasible", reason=str(err))
    row.update(simulations=e.sims, wall_s=time.perf_counter() - t0,
               cpu_s=time.process_time() - cpu0)
    e.dir.mkdir(parents=True, exist_ok=True)   # refused before any probe made it
    rundir.write_json(done, row)
    return row


def _evaluate(e: _Eval, job: dict) -> dict:
    k, unit = _units(e, job["method"], job["max_units"])
    out = {} if unit is None else {"unit_capacity_qps": binding(unit)[0]}
    if k is None:
        why = ""
        if unit is not None:
            cap, crit, missed = binding(unit)
            why = f"; one unit's capacity {cap:.4g} req/s ({crit}" + \
                (f": {missed})" if missed else ")")
        return {**out, "status": "infeasible",
                "reason": f"{job['max_units']} units (plan.space.max_replicas) do not serve "
                          f"{e.load:.4g} req/s within the SLO" + why}
    hi = 2 * e.load if k == 1 else e.load * k / (k - 1)
    extra = [("capacity.qps_low", e.load), ("capacity.qps_high", float(hi))]
    deploy = e.search(f"deploy_units={k}", k, extra)
    cap, crit, missed = binding(deploy)
    if k == 1:
        out["unit_capacity_qps"] = cap
    at_load = next(p for p in deploy["probes"] if round(p["qps"], 9) == round(e.load, 9))
    if cap < e.load:   # cannot happen: the deployment's first probe is the one that passed
        return {**out, "status": "infeasible",
                "reason": f"{k} units failed their own search at {e.load:.4g} req/s"}
    gpus = int(at_load["num_gpus"])
    _, overrides = e.config(k, extra)
    cost = cost_at_rate(e.load, job["mean_output_tokens"], job["price"], gpus)
    return {**out, "status": "feasible", "reason": "", "units": k,
            "replicas": k * job["replicas_per_unit"], "gpus": gpus, "capacity_qps": cap,
            "capacity_bracketed": bool(deploy["criteria"][crit]["bracketed"]),
            "binds": crit, "binds_missed": missed,
            "usd_per_1m_output_tokens": cost["usd_per_1m_output_tokens"],
            "usd_per_hour": job["price"] * gpus,
            "ttft_p99": at_load["ttft_p99"], "tbt_p99": at_load["tbt_p99"],
            "tpot_p99": at_load["tpot_p99"], "attainment": at_load["attainment"],
            "probe_rule": at_load.get("rule"), "probe_stability": at_load.get("stability"),
            "probe_requests": int(at_load.get("probe_requests") or job["per_unit"][-1][1] * k),
            "command": "sarathi-lab " + " ".join(shlex.quote(o) for o in overrides)}


def check(job: dict, row: dict, factor: int) -> dict:
    """The long independent run of a feasible row (the plan's answer): its deployment at the
    load, `factor` x the requests of the probe that passed there, as one ordinary run
    (mode=run, the trace's own draw of lengths: shuffled for a length-only file), judged on all its
    requests by the plan's criteria and by the steady-state rule. Returns the row's `check_*`
    columns; check.json in the candidate's directory keeps them (a rerun reuses it)."""
    from sarathi_lab.run.runner import run
    from sarathi_lab.sweeps import steady
    e = _Eval(job)
    done = e.dir / f"{CHECK[:-5]}_x{factor}.json"
    if done.exists():
        return read_json(done)
    n = int(factor * row["probe_requests"])
    extra = [("mode", "run"), ("trace.qps", e.load), ("trace.num_requests", n)]
    tc = job["c"]["trace"]
    if tc.get("path") is not None and capacity.length_pool(
            tc, capacity.probe_settings(job["c"]["capacity"])).attrs.get("arrivals") == "drawn":
        # a length-only file: a random sample of its rows (a timestamped one keeps its first
        # rows, their own gaps rescaled to the load: shuffling would part them from their times)
        extra.append(("trace.shuffle", True))
    c, overrides = e.config(int(row["units"]), extra)
    overrides = [o for o in overrides if not o.lstrip("+~").startswith("capacity.")]
    keep: dict = {}
    s = run({**c, "progress": False}, e.dir / f"check_x{factor}", write=False, keep=keep)
    rq = keep["requests"]
    v = steady.judge(rq["arrival_time"].to_numpy(float), rq["first_scheduled_time"].to_numpy(float),
                     rq["finish_time"].to_numpy(float), capacity.probe_settings(c["capacity"]))
    slo = s.get("slo") or {}
    met = all(bool(slo.get(capacity.CRITERIA[k][0])) for k in job["criteria"])
    missed = "; ".join(m for m in (capacity.missed(slo, k) for k in job["criteria"]) if m)
    out = {"check_requests": int(s["num_requests"]), "check_factor": factor,
           "check_held": bool(met and v["verdict"] != steady.UNSTABLE),
           "check_stability": v["verdict"], "check_missed": missed,
           "check_ttft_p99": s["ttft"]["p99"], "check_tbt_p99": s["tbt"]["p99"],
           "check_attainment": slo.get("attainment"),
           "check_command": "sarathi-lab " + " ".join(shlex.quote(o) for o in overrides)}
    rundir.write_json(done, out)
    return out
