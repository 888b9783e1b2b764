"""A run directory as a Chrome / Perfetto trace (`chrome://tracing` JSON, `traceEvents`): one
process per replica (per pool replica with disaggregation; a pipeline's virtual engines as its
threads), each iteration a complete slice, each request an async span with its waiting, time
to first token and decode inside. Works on any run directory: simulated, real, served or
replayed (a replay has no iterations: its requests only). The fields are listed in
sarathi_lab/docs/replay.md ("Timeline export")."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from sarathi_lab.run import rundir

US = 1e6   # the format's times are microseconds
# the iteration columns a slice carries in its args, where the table has them
ITERATION_ARGS = ("prefill_tokens", "decode_tokens", "num_requests", "kv_blocks_used",
                  "kv_tokens_stored", "num_waiting", "preemptions", "swap_outs", "swap_ins")
REQUEST_ARGS = ("status", "num_prompt_tokens", "num_output_tokens", "ttft", "tpot", "e2e",
                "num_preemptions", "tenant", "slo_class", "rejection_reason", "error")


def _plain(v):
    """A table value as JSON holds it (NaN and NA as null)."""
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return None
    return v.item() if isinstance(v, np.generic) else v


def _track_names(it: pd.DataFrame) -> tuple[pd.Series, dict]:
    """Each iteration's process id, and each process id's name."""
    if "pool" in it:
        keys = list(zip(it["pool"].astype(str), it["replica"].astype(int)))
        name = {k: f"{k[0]} replica {k[1]}" for k in keys}
    elif "replica" in it:
        keys = list(it["replica"].astype(int))
        name = {k: f"replica {k}" for k in keys}
    else:
        keys = [0] * len(it)
        name = {0: "engine"}
    order = sorted(set(keys), key=lambda k: (k[0] != "prefill", k) if isinstance(k, tuple) else k)
    pid = {k: i + 1 for i, k in enumerate(order)}
    return pd.Series([pid[k] for k in keys], index=it.index, dtype=np.int64), \
        {pid[k]: name[k] for k in order}


def _request_pids(req: pd.DataFrame, names: dict) -> np.ndarray:
    """Each request's process: the replica that served it (with disaggregation, the prefill
    replica it arrived at); 1 when the run has one track or the request none."""
    by_name = {v: k for k, v in names.items()}
    if "prefill_replica" in req:
        col, fmt = req["prefill_replica"], "prefill replica {}"
    elif "replica" in req:
        col, fmt = req["replica"], "replica {}"
    else:
        return np.ones(len(req), np.int64)
    return np.array([by_name.get(fmt.format(int(r)), 1) if r is not None and r >= 0 else 1
                     for r in col], np.int64)


def _in_window(start, end, window) -> np.ndarray:
    if window is None:
        return np.ones(len(start), bool)
    a, b = window
    return (np.asarray(end) >= a) & (np.asarray(start) <= b)


def iteration_events(it: pd.DataFrame, window=None) -> tuple[list, dict]:
    """The iterations as "X" slices (and a counter of KV blocks and waiting requests per
    process), and the process names."""
    if it.empty:
        return [], {}
    pids, names = _track_names(it)
    tids = it["virtual_engine"].astype(int) if "virtual_engine" in it else \
        pd.Series(0, index=it.index)
    start = it["start"].to_numpy(float)
    dur = it["duration"].to_numpy(float)
    keep = _in_window(start, start + dur, window)
    pre = it["prefill_tokens"].to_numpy()
    dec = it["decode_tokens"].to_numpy()
    kind = np.where(pre > 0, np.where(dec > 0, "mixed", "prefill"),
                    np.where(dec > 0, "decode", "no tokens"))
    args = [c for c in ITERATION_ARGS if c in it]
    cols = {c: it[c].to_numpy() for c in args}
    events = []
    for i in np.flatnonzero(keep).tolist():
        ts = start[i] * US
        pid = int(pids.iat[i])
        a = {"iteration": i, **{c: _plain(cols[c][i]) for c in args}}
        events.append({"ph": "X", "cat": "iteration", "name": str(kind[i]), "pid": pid,
                       "tid": int(tids.iat[i]), "ts": ts, "dur": dur[i] * US, "args": a})
        if "kv_blocks_used" in cols and "num_waiting" in cols:
            events.append({"ph": "C", "name": "kv and queue", "pid": pid, "ts": ts,
                           "args": {"kv_blocks_used": _plain(cols["kv_blocks_used"][i]),
                                    "num_waiting": _plain(cols["num_waiting"][i])}})
    threads = sorted(set(zip(pids.tolist(), tids.tolist())))
    for pid, tid in threads:
        label = f"virtual engine {tid}" if "virtual_engine" in it else "iterations"
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": label}})
    return events, names


def request_events(req: pd.DataFrame, pids: np.ndarray, window=None) -> list:
    """Each request as an async span "request ID" from its arrival to its end (its finish, else
    its last token, else its arrival), with "ttft" (arrival to first token; "waiting", arrival
    to first scheduled, inside it where known) and "decode" (first token to finish) nested."""
    arrival = req["arrival_time"].to_numpy(float)
    first = req["first_token_time"].to_numpy(float)
    sched = req["first_scheduled_time"].to_numpy(float)
    finish = req["finish_time"].to_numpy(float)
    last = np.array([t[-1] if len(t) else np.nan for t in req["token_times"]], float)
    end = np.where(np.isnan(finish), np.where(np.isnan(last), arrival, last), finish)
    keep = _in_window(arrival, end, window)
    args = [c for c in REQUEST_ARGS if c in req]
    cols = {c: req[c].to_numpy() for c in args}
    ids = req["request_id"].tolist()
    events = []

    def begin(name, i, t, extra=None):
        events.append({"ph": "b", "cat": "request", "name": name, "id": str(ids[i]),
                       "pid": int(pids[i]), "tid": 0, "ts": t * US,
                       **({"args": extra} if extra else {})})

    def end_(name, i, t):
        events.append({"ph": "e", "cat": "request", "name": name, "id": str(ids[i]),
                       "pid": int(pids[i]), "tid": 0, "ts": t * US})

    # written in nesting order (a span's end after those of the spans inside it), which a
    # viewer keeps when it sorts events of equal times
    for i in np.flatnonzero(keep).tolist():
        begin(f"request {ids[i]}", i, arrival[i],
              {"request_id": _plain(ids[i]), **{c: _plain(cols[c][i]) for c in args}})
        if not np.isnan(first[i]):
            begin("ttft", i, arrival[i])
            if not np.isnan(sched[i]):
                begin("waiting", i, arrival[i])
                end_("waiting", i, sched[i])
            end_("ttft", i, first[i])
            if not np.isnan(finish[i]):
                begin("decode", i, first[i])
                end_("decode", i, finish[i])
        end_(f"request {ids[i]}", i, end[i])
    return events


def chrome_trace(run_dir, window=None) -> dict:
    """The trace of one run directory (its requests.parquet, and iterations.parquet if it has
    one); `window` (start, end) in the run's seconds keeps what overlaps it."""
    run_dir = Path(run_dir)
    if not (run_dir / rundir.REQUESTS).exists():
        raise FileNotFoundError(f"{run_dir}: no {rundir.REQUESTS}; --chrome exports one run "
                                "directory")
    req = pd.read_parquet(run_dir / rundir.REQUESTS)
    it_path = run_dir / rundir.ITERATIONS
    it = pd.read_parquet(it_path) if it_path.exists() else pd.DataFrame()
    events, names = iteration_events(it, window)
    if not names:   # no iterations (a replay sees none): the requests on one track
        names = {1: "requests"}
    events += request_events(req, _request_pids(req, names), window)
    for pid, name in names.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                       "args": {"sort_index": pid}})
    summary = {}
    if (run_dir / rundir.SUMMARY).exists():
        summary = rundir.read_json(run_dir / rundir.SUMMARY)
    executor = summary.get("executor") or ((summary.get("config") or {}).get("executor")
                                           or {}).get("name")
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"run_dir": str(run_dir), "executor": executor,
                          "window": list(window) if window else None}}


def write_chrome_trace(run_dir, out, window=None) -> Path:
    """`chrome_trace(run_dir, window)` written to `out` (atomically)."""
    trace = chrome_trace(run_dir, window)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rundir.atomic_write(out, lambda p: p.write_text(json.dumps(trace, allow_nan=False)))
    return out
