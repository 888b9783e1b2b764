"""`sarathi-lab-serve`'s engine process, journal and metrics.

Fast: the worker fails a request whose error names it and serves the others (and stops on an
error that names none); the journal recovers exactly the requests that ended; the metrics,
fed by hand, say what was fed. Slow (subprocesses): a request that makes the engine raise fails
alone and the next is served; /metrics parses and its counters match the run directory; kill -9
of the server leaves a run directory `sarathi-lab-report` reads as partial; a configuration
that fails while the engine is built, and an engine process that dies, end the server with an
error, never a hang.
"""
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest
from helpers import ROOT, TESTS, composed

from sarathi_lab.engine import Engine
from sarathi_lab.request import Request, Status
from sarathi_lab.run import runner
from sarathi_lab.run.config import resolve
from sarathi_lab.run.journal import Journal, recover
from sarathi_lab.serve.protocol import Generation
from sarathi_lab.serve.worker import Worker
from sarathi_lab.topology import OpenLoop, Single

TINY = ("executor=torch", "model=tiny-llama", "executor.device=cpu", "executor.kv_cache_gib=0.01")


class Marked(Exception):
    """An error that names its request (what a plug-in raises to fail one request)."""

    def __init__(self, rid):
        super().__init__(f"request {rid} is marked")
        self.request_id = rid


class FakeLink:
    """The pipe, in process: `msgs` arrive first; when the engine has nothing to do, a stop."""

    def __init__(self, msgs):
        self.inbox, self.sent = list(msgs), []

    def poll(self, timeout=0):
        if not self.inbox and timeout is None:
            self.inbox.append(["stop"])
        return bool(self.inbox)

    def recv(self):
        return self.inbox.pop(0)

    def send(self, msg):
        self.sent.append(msg)


def _engine(*overrides):
    c = composed(*TINY, *overrides)
    policy, ex = runner.build(c, resolve(c))
    return Engine(policy, ex, fast_forward=False)


def _add(rid, prompt, n):
    return ["add", rid, asdict(Generation(prompt_ids=prompt, max_tokens=n))]


def _events(link):
    """{rid: (tokens, end or None, error code or None)} from the worker's messages."""
    out = {}
    for msg in link.sent:
        _, _, tokens, _, ends, errors, _ = msg
        for rid, ids in tokens:
            out.setdefault(rid, [[], None, None])[0].extend(ids)
        for rid, reason, _ in ends:
            out.setdefault(rid, [[], None, None])[1] = reason
        for rid, _, _, code in errors:
            out.setdefault(rid, [[], None, None])[2] = code
    return out


def test_an_error_that_names_its_request_fails_that_request_alone():
    solo = _engine()
    want = Request(0, 0.0, 6, None, prompt_token_ids=[15, 2, 3, 4, 5, 6], max_tokens=6)
    solo.run([want])
    e = _engine()
    p = e.policy
    add, schedule = p.add_request, p.schedule

    def picky_add(req):   # the request whose prompt starts with 13 is refused by raising
        if req.prompt_token_ids[0] == 13:
            raise ValueError("13 is unlucky")
        return add(req)

    def picky_schedule(now):   # the one starting with 14 fails after its second token
        for r in p.running:
            if r.prompt_token_ids[0] == 14 and r.num_output_tokens >= 2:
                raise Marked(r.request_id)
        return schedule(now)
    p.add_request, p.schedule = picky_add, picky_schedule
    link = FakeLink([_add(1, [13, 2, 3], 4), _add(2, [14, 2, 3, 4], 8),
                     _add(3, [15, 2, 3, 4, 5, 6], 6)])
    w = Worker(e, link)
    w.run()
    assert w.error is None
    ev = _events(link)
    assert ev[1] == [[], None, "request_error"]
    assert len(ev[2][0]) == 2 and ev[2][1:] == [None, "request_error"]
    assert ev[3] == [want.output_token_ids, "max_tokens", None]
    r1, r2, r3 = w.requests
    assert r1.status is r2.status is Status.REJECTED and r3.status is Status.FINISHED
    assert r1.rejection_reason.startswith("error: ValueError: ")
    assert r1.rejection_reason.endswith("add_request() at t=0.000s (iteration 0): 13 is unlucky")
    assert r2.rejection_reason == "error: Marked: request 2 is marked"
    e.finish()   # the guard: nothing left queued or running, every KV block freed
    # the tokens stored were recounted after the failed step: those of the running requests
    assert e.kv.num_stored_tokens == 0


def test_an_error_that_names_no_request_stops_the_engine_and_tells_every_client():
    e = _engine()
    schedule = e.policy.schedule

    def broken(now):
        if any(r.num_output_tokens >= 1 for r in e.policy.running):
            raise RuntimeError("the policy broke")
        return schedule(now)
    e.policy.schedule = broken
    link = FakeLink([_add(1, [5, 6, 7], 4), _add(2, [8, 9], 4)])
    w = Worker(e, link)
    w.run()
    assert isinstance(w.error, RuntimeError) and "the policy broke" in str(w.error)
    ev = _events(link)
    assert ev[1][2] == ev[2][2] == "engine_error" and ev[1][1] is None


def test_the_journal_recovers_the_requests_that_ended(tmp_path):
    c = composed(*TINY)
    r = resolve(c)
    policy, ex = runner.build(c, r)
    e = Engine(policy, ex, fast_forward=False)
    j = Journal(tmp_path)
    _, it0, base = runner.results(c, r, Single(e), OpenLoop([]), [], policy, ex, 0.0)
    j.start(base, {"slo": None, "kv_blocks_total": e.kv.num_blocks,
                   "block_size": e.kv.block_size, "swap_space": None,
                   "price_per_gpu_hour": None, "num_gpus": 1},
            {k: str(v) for k, v in it0.dtypes.items()})
    reqs = [Request(i, 0.01 * i, 4 + i, None, prompt_token_ids=list(range(3, 7 + i)),
                    max_tokens=3 + i) for i in range(3)]
    e.run(reqs)
    j.ended(reqs[:2], e.output_lens)
    j.ended(reqs[2:], e.output_lens)
    cols = e.iteration_columns()
    j.iterations({k: v[:3] for k, v in cols.items()})   # two flushes: the rows once each
    j.iterations(cols)
    j.close()
    with open(tmp_path / "journal" / "requests.jsonl", "a") as f:
        f.write('{"request_id": 9, "arriv')   # the line being written when it was killed
    summary = recover(tmp_path)
    want_req, want_it, want = runner.results(c, r, Single(e), OpenLoop(reqs), reqs, policy,
                                             ex, 0.0)
    rundir_copy = tmp_path / "want.parquet"
    want_req.to_parquet(rundir_copy)
    assert pd.read_parquet(tmp_path / "requests.parquet").equals(pd.read_parquet(rundir_copy))
    assert pd.read_parquet(tmp_path / "iterations.parquet").equals(want_it)
    assert summary["served"]["partial"]["requests_recovered"] == 3
    assert summary["served"]["partial"]["iterations_recovered"] == len(want_it)
    for k in ("num_requests", "num_finished", "ttft", "tbt", "e2e", "num_iterations"):
        assert summary[k] == want[k], k


def test_metrics_say_what_they_were_told():
    from prometheus_client.parser import text_string_to_metric_families

    from sarathi_lab.serve.metrics import Metrics
    state = {"waiting": 2, "running": 3, "swapped": 1, "kv_blocks_used": 5,
             "kv_blocks_total": 20, "preemptions": 4}
    m = Metrics("tiny", lambda: state)
    m.tokens(1, 0.5, 1)
    m.first(1, 0.5, 10)
    m.tokens(1, 0.6, 3)   # a gap of 0.1 s, then two tokens of the same step: gaps of 0
    m.end(1, "max_tokens", 0.6)
    m.tokens(2, 0.7, 1)
    m.first(2, 0.2, 4)
    m.end(2, "abort", 0.3)   # a client that went away: no E2E observed
    m.tokens(3, 0.8, 2)
    m.first(3, 0.1, 7)
    m.end(3, "stop_string", 0.25)
    m.failed(4, "request_error")
    body, ctype = m.render()
    assert ctype.startswith("text/plain")
    got = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            if s.labels.get("model_name") == "tiny" and not s.name.endswith("_created"):
                extra = tuple(v for k, v in sorted(s.labels.items())
                              if k not in ("model_name", "le"))
                got[(s.name, *extra)] = s.value
    assert got[("vllm:time_to_first_token_seconds_count",)] == 3
    assert got[("vllm:time_to_first_token_seconds_sum",)] == pytest.approx(0.8)
    assert got[("vllm:inter_token_latency_seconds_count",)] == 4   # 0.1, 0, 0 and 0 (req 3)
    assert got[("vllm:inter_token_latency_seconds_sum",)] == pytest.approx(0.1)
    assert got[("vllm:e2e_request_latency_seconds_count",)] == 2
    assert got[("vllm:e2e_request_latency_seconds_sum",)] == pytest.approx(0.85)
    assert got[("vllm:prompt_tokens_total",)] == 21
    assert got[("vllm:generation_tokens_total",)] == 7
    assert got[("vllm:request_success_total", "length")] == 1
    assert got[("vllm:request_success_total", "stop")] == 1
    assert got[("vllm:request_success_total", "abort")] == 1
    assert got[("sarathi_lab:request_failure_total", "request_error")] == 1
    assert got[("vllm:num_requests_running",)] == 3 and got[("vllm:num_requests_waiting",)] == 2
    assert got[("vllm:num_requests_swapped",)] == 1
    assert got[("vllm:kv_cache_usage_perc",)] == got[("vllm:gpu_cache_usage_perc",)] == 0.25
    assert got[("vllm:num_preemptions_total",)] == 4


# -- the server, in a subprocess ----------------------------------------------------------------
PICKY = """
from sarathi_lab.schedulers.sarathi import Sarathi


class Marked(Exception):
    def __init__(self, rid):
        super().__init__(f"request {rid} is marked")
        self.request_id = rid


class Picky(Sarathi):
    name = "picky"

    def schedule(self, now):
        for r in self.running:
            if r.prompt_token_ids[0] == 14 and r.num_output_tokens >= 2:
                raise Marked(r.request_id)
        return super().schedule(now)
"""


def _start(cwd: Path, *overrides):
    from served import Served
    return Served(cwd, *overrides)


def _scrape(s) -> dict:
    from prometheus_client.parser import text_string_to_metric_families
    status, text = s.request("GET", "/metrics")
    assert status == 200
    out = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            extra = tuple(v for k, v in sorted(smp.labels.items()) if k not in ("model_name", "le"))
            if smp.labels.get("model_name") == "tiny-llama":
                out[(smp.name, *extra)] = smp.value
    return out


@pytest.mark.slow
def test_a_request_that_makes_the_engine_raise_fails_alone(tmp_path):
    (tmp_path / "picky.py").write_text(PICKY)
    s = _start(tmp_path, "scheduler=custom", "scheduler.name=picky:Picky")
    try:
        body = {"model": "tiny-llama", "max_tokens": 6, "temperature": 0}
        status, err = s.request("POST", "/v1/completions", {**body, "prompt": [14, 2, 3]})
        assert status == 500 and err["error"]["code"] == "request_error"
        assert "request 1 is marked" in err["error"]["message"]
        # the next request is served, and so is a stream
        status, ok = s.request("POST", "/v1/completions", {**body, "prompt": [15, 2, 3]})
        assert status == 200 and len(ok["choices"][0]["token_ids"]) == 6
        assert s.request("GET", "/health")[0] == 200
        metrics = _scrape(s)
        run_dir = s.stop()
    finally:
        s.kill()
    reqs = pd.read_parquet(run_dir / "requests.parquet")
    assert list(reqs["status"]) == ["rejected", "finished"]
    assert reqs["rejection_reason"][0].startswith("error: ")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["served"]["engine_error"] is None
    assert summary["served"]["http_status"] == {"200": 1, "500": 1}
    assert not (run_dir / "journal").exists()   # a clean stop: the usual files only
    # /metrics counted what the run directory holds
    assert metrics[("vllm:request_success_total", "length")] == 1
    assert metrics[("sarathi_lab:request_failure_total", "request_error")] == 1
    assert metrics[("vllm:generation_tokens_total",)] == reqs["num_output_tokens"].sum()
    started = reqs[reqs["num_output_tokens"] > 0]
    assert metrics[("vllm:prompt_tokens_total",)] == started["num_prompt_tokens"].sum()
    assert metrics[("vllm:time_to_first_token_seconds_count",)] == len(started)
    assert metrics[("vllm:time_to_first_token_seconds_sum",)] == pytest.approx(
        started["ttft"].sum())
    done = reqs[reqs["status"] == "finished"]
    assert metrics[("vllm:e2e_request_latency_seconds_sum",)] == pytest.approx(
        (done["finish_time"] - done["arrival_time"]).sum())


@pytest.mark.slow
def test_kill_9_leaves_a_partial_run_directory_the_report_reads(tmp_path):
    s = _start(tmp_path, "scheduler=sarathi")
    try:
        body = {"model": "tiny-llama", "prompt": [5, 6, 7], "max_tokens": 4}
        for _ in range(3):
            assert s.request("POST", "/v1/completions", body)[0] == 200
        s.proc.send_signal(signal.SIGKILL)
        s.proc.communicate(timeout=60)
    finally:
        s.kill()
    run_dirs = [p.parent.parent for p in tmp_path.rglob("journal/session.json")]
    assert len(run_dirs) == 1 and not (run_dirs[0] / "summary.json").exists()
    run_dir = run_dirs[0]
    # the engine process exits when its pipe closes: until then the session counts as serving
    from sarathi_lab.run.journal import writer_alive
    assert json.loads((run_dir / "journal" / "session.json").read_text())["writer"]["pid"] \
        != s.proc.pid   # the engine process writes it
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and writer_alive(run_dir):
        time.sleep(0.5)
    assert not writer_alive(run_dir), "the engine process outlived the server"
    proc = subprocess.run(
        [sys.executable, "-c", "from sarathi_lab.report import main; main()", str(run_dir),
         "--out", str(tmp_path / "report"), "--timeline", "none"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "partial run" in proc.stdout and str(run_dir) in proc.stdout
    reqs = pd.read_parquet(run_dir / "requests.parquet")
    assert len(reqs) == 3 and (reqs["status"] == "finished").all()
    assert (reqs["num_output_tokens"] == 4).all()
    table = pd.read_csv(tmp_path / "report" / "summary.csv")
    assert table["served_partial_requests_recovered"].tolist() == [3]
    assert table["load_mode"].tolist() == ["served"]


@pytest.mark.slow
def test_a_build_error_in_the_engine_process_ends_the_server_with_it(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", "from sarathi_lab.serve.command import main; main()",
         "serve.port=0", "executor.device=cpu", "executor.kv_cache_gib=100000"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sarathi-lab-serve: error: ") and "kv_cache_gib" in last, \
        proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_an_engine_process_that_dies_ends_the_server(tmp_path):
    s = _start(tmp_path, "scheduler=sarathi")
    try:
        import psutil
        engine = [p for p in psutil.Process(s.proc.pid).children()
                  if "spawn_main" in " ".join(p.cmdline())]
        assert len(engine) == 1
        engine[0].kill()
        _, err = s.proc.communicate(timeout=60)
    finally:
        s.kill()
    assert s.proc.returncode == 1 and "the engine process died" in err


@pytest.mark.slow
def test_a_port_in_use_ends_both_processes_leaving_no_journal(tmp_path):
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-c", "from sarathi_lab.serve.command import main; main()",
             f"serve.port={port}", "executor.device=cpu", "executor.kv_cache_gib=0.02"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "cannot bind" in proc.stderr.strip().splitlines()[-1]
    assert not list(tmp_path.rglob("journal")) and not list(tmp_path.rglob("summary.json"))
    assert time.monotonic() - t0 < 120   # the engine process quit: no wait for it


def test_a_named_error_with_prefix_caching_stops_the_engine():
    """Where the state does not allow going on (prefix caching: the failed step's blocks may be
    cached before their KV was computed), an error naming its request stops the engine."""
    e = _engine("scheduler.enable_prefix_caching=true")
    assert e.kv.enable_prefix_caching
    schedule = e.policy.schedule

    def picky(now):
        for r in e.policy.running:
            if r.num_output_tokens >= 1:
                raise Marked(r.request_id)
        return schedule(now)
    e.policy.schedule = picky
    link = FakeLink([_add(1, [5, 6, 7], 4)])
    w = Worker(e, link)
    w.run()
    assert isinstance(w.error, RuntimeError) and "prefix caching" in str(w.error)
    assert _events(link)[1][2] == "engine_error"


def test_a_journal_is_recovered_only_once_its_writer_is_gone(tmp_path):
    import socket

    from sarathi_lab.run.journal import partial_dirs
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    for name, pid in (("live", os.getpid()), ("ended", int(done.stdout))):
        (tmp_path / name / "journal").mkdir(parents=True)
        (tmp_path / name / "journal" / "session.json").write_text(json.dumps(
            {"writer": {"host": socket.gethostname(), "pid": pid}}))
    (tmp_path / "stopped" / "journal").mkdir(parents=True)   # a summary: not partial
    (tmp_path / "stopped" / "journal" / "session.json").write_text("{}")
    (tmp_path / "stopped" / "summary.json").write_text("{}")
    assert partial_dirs([tmp_path]) == ([tmp_path / "ended"], [tmp_path / "live"])
