"""`sarathi-lab-report RUN --chrome FILE` (sarathi_lab/report/chrome_trace.py): the trace loads as
JSON with the documented fields, its slices are the iteration table's rows, its request spans
the requests table's times, nested as documented; one process per replica or pool replica; a
replay's run directory (no iterations) exports its requests."""
import json
from collections import defaultdict

import pandas as pd
import pytest
from helpers import composed

from sarathi_lab.report import main as report_main
from sarathi_lab.report.chrome_trace import chrome_trace
from sarathi_lab.run import rundir
from sarathi_lab.run.runner import run

SLICE_KEYS = {"ph", "cat", "name", "pid", "tid", "ts", "dur", "args"}
SLICE_ARGS = {"iteration", "prefill_tokens", "decode_tokens", "num_requests", "kv_blocks_used",
              "kv_tokens_stored", "num_waiting", "preemptions", "swap_outs", "swap_ins"}
SPAN_KEYS = {"ph", "cat", "name", "id", "pid", "tid", "ts"}


def simulated(tmp_path, name, *overrides):
    cfg = composed("trace.num_requests=12", "trace.qps=4", *overrides)
    run(cfg, tmp_path / name)
    return tmp_path / name


def spans(events):
    """{request id: [(name, begin us, end us), ...]} from the b/e events, checking that they
    nest (each e closes the latest open span of its id, with the same name)."""
    open_, out = defaultdict(list), defaultdict(list)
    for e in events:
        if e["ph"] == "b":
            assert set(e) - {"args"} == SPAN_KEYS and e["cat"] == "request"
            open_[e["id"]].append((e["name"], e["ts"]))
        elif e["ph"] == "e":
            name, ts = open_[e["id"]].pop()
            assert name == e["name"] and e["ts"] >= ts
            out[e["id"]].append((name, ts, e["ts"]))
    assert not any(open_.values())
    return out


def test_slices_are_the_iterations_and_spans_the_requests(tmp_path):
    d = simulated(tmp_path, "single")
    out = tmp_path / "trace.json"
    report_main([str(d), "--chrome", str(out)])
    trace = json.loads(out.read_text())
    assert trace["displayTimeUnit"] == "ms" and trace["otherData"]["executor"] == "sim"
    ev = trace["traceEvents"]
    it = pd.read_parquet(d / rundir.ITERATIONS)
    xs = [e for e in ev if e["ph"] == "X"]
    assert len(xs) == len(it)
    for e in xs:
        assert set(e) == SLICE_KEYS and set(e["args"]) == SLICE_ARGS and e["pid"] == 1
        row = it.iloc[e["args"]["iteration"]]
        assert e["ts"] == pytest.approx(row["start"] * 1e6)
        assert e["dur"] == pytest.approx(row["duration"] * 1e6)
        assert (e["args"]["prefill_tokens"], e["args"]["decode_tokens"]) == \
            (row["prefill_tokens"], row["decode_tokens"])
        assert e["name"] == {(True, False): "prefill", (False, True): "decode",
                             (True, True): "mixed"}[(row["prefill_tokens"] > 0,
                                                     row["decode_tokens"] > 0)]
    assert [e["args"]["name"] for e in ev if e["name"] == "process_name"] == ["engine"]
    req = pd.read_parquet(d / rundir.REQUESTS)
    by_id = spans(ev)
    assert len(by_id) == len(req)
    for r in req.itertuples():
        s = {name: (a, b) for name, a, b in by_id[str(r.request_id)]}
        assert s[f"request {r.request_id}"] == pytest.approx((r.arrival_time * 1e6,
                                                              r.finish_time * 1e6))
        assert s["ttft"][1] - s["ttft"][0] == pytest.approx(r.ttft * 1e6)
        assert s["waiting"][1] == pytest.approx(r.first_scheduled_time * 1e6)
        assert s["decode"] == pytest.approx((r.first_token_time * 1e6, r.finish_time * 1e6))
    # a window keeps what overlaps it
    a, b = float(it["start"].iloc[5]), float(it["start"].iloc[20])
    part = chrome_trace(d, (a, b))["traceEvents"]
    ends = it["start"] + it["duration"]
    assert len([e for e in part if e["ph"] == "X"]) == int(((ends >= a) & (it["start"] <= b)).sum())


def test_one_process_per_replica_and_pool(tmp_path):
    def names(d):
        ev = chrome_trace(d)["traceEvents"]
        return ev, {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
    ev, n = names(simulated(tmp_path, "fleet", "cluster.num_replicas=2"))
    assert sorted(n.values()) == ["replica 0", "replica 1"]
    req = pd.read_parquet(tmp_path / "fleet" / rundir.REQUESTS)
    pid_of = {e["id"]: e["pid"] for e in ev if e["ph"] == "b"}
    for r in req.itertuples():   # a request on its replica's process
        assert n[pid_of[str(r.request_id)]] == f"replica {r.replica}"
    ev, n = names(simulated(tmp_path, "disagg", "cluster=disagg"))
    assert sorted(n.values()) == ["decode replica 0", "prefill replica 0"]
    decode = [k for k, v in n.items() if v.startswith("decode")][0]
    assert all(e["args"]["prefill_tokens"] == 0 for e in ev
               if e["ph"] == "X" and e["pid"] == decode)
    spans(ev)
    ev, n = names(simulated(tmp_path, "pp", "executor.pipeline_parallel=2"))
    threads = {e["tid"]: e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    assert threads == {0: "virtual engine 0", 1: "virtual engine 1"}


def test_a_replay_exports_its_requests(tmp_path):
    """A run directory without iterations (as sarathi-lab-replay writes): request spans on one
    process; a failed request's span ends at its last token."""
    from sarathi_lab.replay.results import requests_frame, write
    from sarathi_lab.replay.stream import Outcome
    from sarathi_lab.request import Request
    reqs = [Request(0, 0.0, 4, max_tokens=2), Request(1, 0.5, 4, max_tokens=2)]
    outs = [Outcome(token_times=[0.2, 0.3], finish_time=0.35, usage_tokens=2),
            Outcome(status="timeout", token_times=[0.9], error="no data")]
    write(tmp_path / "r", requests_frame(reqs, outs, None), slo=None,
          extra={"executor": "remote"})
    ev = chrome_trace(tmp_path / "r")["traceEvents"]
    assert not [e for e in ev if e["ph"] == "X"]
    assert [e["args"]["name"] for e in ev if e["name"] == "process_name"] == ["requests"]
    s = spans(ev)
    def flat(rows):   # closing order: inner spans first
        return [r[0] for r in rows], [t for r in rows for t in r[1:]]
    assert flat(s["0"]) == (["ttft", "decode", "request 0"],
                            pytest.approx([0, 0.2e6, 0.2e6, 0.35e6, 0, 0.35e6]))
    assert flat(s["1"]) == (["ttft", "request 1"], pytest.approx([0.5e6, 0.9e6, 0.5e6, 0.9e6]))
    first = next(e for e in ev if e["ph"] == "b" and e["id"] == "1")
    assert first["args"]["status"] == "timeout" and first["args"]["error"] == "no data"


def test_one_run_directory_only(tmp_path, capsys):
    with pytest.raises(SystemExit):
        report_main([str(tmp_path), str(tmp_path), "--chrome", str(tmp_path / "t.json")])
    assert "--chrome FILE exports one run directory" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"no requests.parquet"):
        report_main([str(tmp_path), "--chrome", str(tmp_path / "t.json")])
