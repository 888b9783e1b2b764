"""sarathi-lab-replay (sarathi_lab/replay/) against stub OpenAI endpoints served in the test
(aiohttp on 127.0.0.1, a free port, stopped by the test): times measured as the stub sent the
tokens, open and closed loop, errors, rejections and a stalled stream recorded as such, the run
directory complete and read by sarathi-lab-report, the API key never written."""
import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest
from aiohttp import web

from sarathi_lab import rundir
from sarathi_lab.metrics import tbt_gaps
from sarathi_lab.replay.command import compose, run_replay
from sarathi_lab.replay.loads import Endpoint
from sarathi_lab.replay.results import remote_section, requests_frame
from sarathi_lab.replay.stream import Outcome
from sarathi_lab.request import Request
from sarathi_lab.settings import ConfigError

# how late a token may be seen after the stub sent it, on a loaded 2-core machine
LATE = 0.25
# the stub's behaviour, chosen by a prompt's first token id
OK, ERROR_500, FULL_429, STALL, SHORT, SILENT = range(6)


class Stub:
    """An OpenAI-style /v1/completions in a thread of its own: streams `max_tokens` chunks, the
    first `first_s` after the request came, then one every `gap_s`; a prompt starting with
    ERROR_500 / FULL_429 gets that status, STALL stalls after two tokens (until the stub stops),
    SHORT streams 2 tokens whatever was asked, SILENT never answers (until the stub stops).
    Records each request's body, headers, when it
    came and when each chunk went (time.perf_counter)."""

    def __init__(self, first_s=0.3, gap_s=0.1):
        self.first_s, self.gap_s = first_s, gap_s
        self.seen = []   # (body, headers, came, [sent...])
        self.active = self.most_active = 0

    async def handle(self, request):
        came = time.perf_counter()
        body = await request.json()
        rec = (body, dict(request.headers), came, [])
        self.seen.append(rec)
        kind = body["prompt"][0]
        if kind == ERROR_500:
            return web.json_response({"error": {"message": "boom", "type": "server_error"}},
                                     status=500)
        if kind == FULL_429:
            return web.json_response({"error": {"message": "queue full"}}, status=429)
        if kind == SILENT:
            await self.release.wait()
            return web.Response(status=204)
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            n = 2 if kind == SHORT else body["max_tokens"]
            await asyncio.sleep(self.first_s)
            for i in range(n):
                if i:
                    await asyncio.sleep(self.gap_s)
                if kind == STALL and i == 2:
                    await self.release.wait()
                    return resp
                last = i == n - 1
                chunk = {"choices": [{"index": 0, "text": f"t{i}",
                                      "finish_reason": "length" if last else None}]}
                rec[3].append(time.perf_counter())
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            usage = {"choices": [], "usage": {"completion_tokens": n}}
            await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            return resp
        finally:
            self.active -= 1

    async def _start(self):
        self.release = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.port = self.runner.addresses[0][1]

    async def _stop(self):
        self.release.set()
        await self.runner.cleanup()

    def __enter__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        self.url = f"http://127.0.0.1:{self.port}/v1"
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def jsonl(path, rows):
    """A JSONL trace: (first token id, prompt length, output length, arrival time) per line."""
    path.write_text("".join(json.dumps({"prompt_token_ids": [k] + [7] * (p - 1),
                                        "output_len": o, "arrival_time": t}) + "\n"
                            for k, p, o, t in rows))
    return [f"trace.path={path}", "trace.name=stub", "trace.qps=null",
            "trace.num_requests=null"]


def endpoint(url, **kw):
    return Endpoint(url, "stub-model", kw.pop("timeout", 30.0), kw.pop("stall_timeout", 10.0),
                    kw.pop("max_connections", 16), **kw)


def test_times_by_hand():
    """The requests table and the remote section from outcomes whose times are known."""
    reqs = [Request(i, a, 4) for i, a in enumerate((1.0, 2.0, 3.0, 4.0))]
    for r in reqs:
        r.max_tokens = 3
    outs = [Outcome(token_times=[1.5, 1.7, 2.0], finish_time=2.1, usage_tokens=3,
                    finish_reason="length", http_status=200),
            Outcome(status="rejected", http_status=429, error="HTTP 429: queue full"),
            Outcome(status="error", http_status=500, error="HTTP 500: boom"),
            Outcome(status="timeout", token_times=[3.5, 3.6], http_status=200,
                    error="no data for 1 s (stall_timeout)")]
    df = requests_frame(reqs, outs, None)
    assert list(df["status"]) == ["finished", "rejected", "error", "timeout"]
    first = df.iloc[0]
    assert first["ttft"] == pytest.approx(0.5) and first["e2e"] == pytest.approx(1.1)
    assert first["tpot"] == pytest.approx(0.3) and first["target_output_tokens"] == 3
    gaps, owner = tbt_gaps(df)
    assert gaps == pytest.approx([0.2, 0.3, 0.1]) and list(owner) == [0, 0, 3]
    assert np.isnan(df["first_scheduled_time"]).all()   # not observable by a client
    assert df.loc[1, "rejection_reason"] == "HTTP 429: queue full"
    assert list(df["num_token_chunks"]) == [3, 0, 0, 2]
    rem = remote_section(df, True)
    assert rem["num_errors"] == 1 and rem["num_timeouts"] == 1
    assert rem["http_status"] == {"200": 2, "429": 1, "500": 1}
    assert rem["output_length_enforced"] is True and rem["num_short"] == 0


def test_open_loop_measures_what_the_stub_sent(tmp_path, monkeypatch):
    monkeypatch.setenv("STUB_KEY", "sk-secret-123")
    rows = [(OK, 5, 4, 0.0), (OK, 3, 3, 0.2), (SHORT, 4, 6, 0.4)]
    with Stub(first_s=0.3, gap_s=0.1) as stub:
        s = run_replay(jsonl(tmp_path / "t.jsonl", rows), endpoint(stub.url), tmp_path / "run",
                       api_key_env="STUB_KEY", progress=False)
    df = pd.read_parquet(tmp_path / "run" / rundir.REQUESTS)
    assert list(df["status"]) == ["finished"] * 3
    first_came = stub.seen[0][2]
    for i, ((body, headers, came, sent), (k, p, o, t)) in enumerate(zip(stub.seen, rows)):
        # what went out: the trace's ids and lengths, greedy, streamed, ignore_eos, the key
        assert body["prompt"] == [k] + [7] * (p - 1) and body["max_tokens"] == o
        assert body["ignore_eos"] is True and body["stream"] is True
        assert body["temperature"] == 0.0
        assert headers["Authorization"] == "Bearer sk-secret-123"
        # open loop: sent at the trace's time
        assert abs((came - first_came) - t) < LATE
        # every token seen after the stub sent it (measured from when it was due, which is no
        # later than when the stub got it), and not much later
        times = df.loc[i, "token_times"] - df.loc[i, "arrival_time"]
        by_stub = np.array(sent) - came
        assert len(times) == len(sent) == df.loc[i, "num_output_tokens"]
        assert np.all(times >= by_stub - 1e-3) and np.all(times <= by_stub + LATE)
        assert by_stub == pytest.approx(0.3 + 0.1 * np.arange(len(sent)), abs=LATE)
        assert df.loc[i, "ttft"] == pytest.approx(times[0])
        assert df.loc[i, "e2e"] >= times[-1]
        assert np.diff(times) == pytest.approx(np.diff(by_stub), abs=LATE)
    # the stub ignored max_tokens for the third: recorded, not hidden
    assert s["remote"]["output_length_enforced"] is False and s["remote"]["num_short"] == 1
    assert s["executor"] == "remote" and s["num_finished"] == 3
    assert s["endpoint"]["base_url"] == stub.url and s["endpoint"]["model"] == "stub-model"
    assert s["endpoint"]["api_key_sent"] is True and s["load"] == {"mode": "open"}
    assert s["config"]["executor"]["prompt_ids"] == "trace"
    for f in (tmp_path / "run").iterdir():
        assert b"sk-secret-123" not in f.read_bytes(), f
    with pytest.raises(ConfigError, match=r"already holds a run"):   # never overwritten
        run_replay([], endpoint(stub.url), tmp_path / "run")
    assert pd.read_parquet(tmp_path / "run" / rundir.ITERATIONS).empty


def test_closed_loop_users_wait_for_their_answers(tmp_path):
    over = ["trace=synthetic", "trace.num_requests=6", "trace.prompt_len=5",
            "trace.output_len=3", "trace.clients=2", "trace.think_time=0.05"]
    with Stub(first_s=0.05, gap_s=0.02) as stub:
        s = run_replay(over, endpoint(stub.url), tmp_path / "run", vocab_size=50,
                       progress=False)
    df = pd.read_parquet(tmp_path / "run" / rundir.REQUESTS)
    assert (df["status"] == "finished").all() and sorted(set(df["client"])) == [0, 1]
    assert stub.most_active <= 2
    for _, mine in df.groupby("client"):
        mine = mine.sort_values("arrival_time")
        # a user's next request goes a think time after its previous answer
        assert (mine["arrival_time"].to_numpy()[1:] >=
                mine["finish_time"].to_numpy()[:-1] + 0.05 - 1e-6).all()
    # synthesized prompts of the trace's lengths, below the vocabulary
    for body, *_ in stub.seen:
        assert len(body["prompt"]) == 5 and max(body["prompt"]) < 50
    assert s["load"]["mode"] == "closed" and s["load"]["clients"] == 2
    assert s["config"]["executor"]["prompt_ids"] == "synthesized"
    assert s["remote"]["output_length_enforced"] is True


def test_errors_rejections_and_a_stall_are_recorded(tmp_path):
    rows = [(OK, 3, 3, 0.0), (ERROR_500, 3, 3, 0.0), (FULL_429, 3, 3, 0.0), (STALL, 3, 6, 0.0),
            (SILENT, 3, 3, 0.0)]
    with Stub(first_s=0.05, gap_s=0.05) as stub:
        t0 = time.perf_counter()
        s = run_replay(jsonl(tmp_path / "t.jsonl", rows), endpoint(stub.url, stall_timeout=0.8),
                       tmp_path / "run", progress=False)
        took = time.perf_counter() - t0
    assert took < 10   # the stall ended at stall_timeout, not when the stub stopped
    df = pd.read_parquet(tmp_path / "run" / rundir.REQUESTS)
    assert list(df["status"]) == ["finished", "error", "rejected", "timeout", "timeout"]
    assert list(df["http_status"].astype(object)) == [200, 500, 429, 200, pd.NA]
    assert df.loc[1, "error"] == "HTTP 500: boom"
    assert df.loc[3, "error"] == "no data for 0.8 s (stall_timeout)"
    assert len(df.loc[3, "token_times"]) == 2 and np.isnan(df.loc[3, "finish_time"])
    # no headers at all: the stall timeout too
    assert df.loc[4, "error"] == "no data for 0.8 s (stall_timeout)"
    assert len(df.loc[4, "token_times"]) == 0
    assert s["num_requests"] == 5 and s["num_finished"] == 1 and s["num_rejected"] == 1
    assert s["rejections"] == {"HTTP N: queue full": 1}
    assert s["remote"]["num_errors"] == 1 and s["remote"]["num_timeouts"] == 2
    assert s["remote"]["http_status"] == {"200": 2, "429": 1, "500": 1}
    assert s["remote"]["failures"] == {"HTTP N: boom": 1, "no data for N s (stall_timeout)": 2}


def test_a_whole_request_timeout(tmp_path):
    """A server that streams steadily but too slowly: the request's own timeout ends it."""
    with Stub(first_s=0.05, gap_s=0.3) as stub:
        s = run_replay(jsonl(tmp_path / "t.jsonl", [(OK, 3, 20, 0.0)]),
                       endpoint(stub.url, timeout=1.0, stall_timeout=0.9), tmp_path / "run",
                       progress=False)
    df = pd.read_parquet(tmp_path / "run" / rundir.REQUESTS)
    assert df.loc[0, "status"] == "timeout"
    assert df.loc[0, "error"] == "the request took over 1 s (timeout)"
    assert 1 <= len(df.loc[0, "token_times"]) < 20 and s["remote"]["num_timeouts"] == 1


def test_only_the_keys_a_replay_reads():
    with pytest.raises(ConfigError, match=r"scheduler=vllm: sarathi-lab-replay reads only"):
        compose(["scheduler=vllm"])
    with pytest.raises(ConfigError, match=r"executor.tensor_parallel=2"):
        compose(["executor.tensor_parallel=2"])
    assert compose(["trace.qps=3", "seed=4"])["trace"]["seed"] == 4


def test_a_length_only_trace_needs_a_vocabulary(tmp_path):
    with pytest.raises(ConfigError, match=r"--vocab-size"):
        run_replay(["trace=synthetic", "trace.num_requests=2"],
                   endpoint("http://127.0.0.1:9/v1"), tmp_path / "run", progress=False)
    with pytest.raises(ConfigError, match=r"credentials in the URL"):
        run_replay([], endpoint("http://u:p@127.0.0.1:9/v1"), tmp_path / "run")


def test_a_refused_connection_is_an_error_per_request(tmp_path):
    """Nothing listens: every request fails with the client's error, the run still finishes."""
    import socket
    with socket.socket() as s:   # a port that was free a moment ago, and now closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_replay(jsonl(tmp_path / "t.jsonl", [(OK, 3, 3, 0.0), (OK, 3, 3, 0.01)]),
               endpoint(f"http://127.0.0.1:{port}/v1"), tmp_path / "run", progress=False)
    df = pd.read_parquet(tmp_path / "run" / rundir.REQUESTS)
    assert list(df["status"]) == ["error", "error"]
    assert df["error"].str.startswith("ClientConnectorError").all()


@pytest.mark.slow   # the command in a subprocess, and sarathi-lab-report over its run
def test_the_command_and_the_report(tmp_path):
    from sarathi_lab.report import make_report
    from sarathi_lab.runner import run
    from helpers import composed, patience
    over = jsonl(tmp_path / "t.jsonl", [(OK, 4, 3, 0.0), (OK, 4, 3, 0.1), (FULL_429, 4, 3, 0.2)])
    env = {**os.environ, "OPENAI_API_KEY": "sk-not-written"}
    with Stub(first_s=0.05, gap_s=0.02) as stub:
        r = subprocess.run([sys.executable, "-c", "from sarathi_lab.replay import main; main()",
                            "--base-url", stub.url, "--model", "stub-model",
                            "--out", str(tmp_path / "remote"), *over],
                           capture_output=True, text=True, timeout=patience(120), env=env)
    assert r.returncode == 0, r.stderr
    assert "3 requests: 2 finished, 1 rejected (HTTP 429), 0 errors, 0 timeouts" in r.stdout
    bad = subprocess.run([sys.executable, "-c", "from sarathi_lab.replay import main; main()",
                          "--base-url", stub.url, "--model", "m", "scheduler=vllm"],
                         capture_output=True, text=True, timeout=patience(120))
    assert bad.returncode == 1 and "scheduler=vllm: sarathi-lab-replay reads only" in bad.stderr
    # a simulated run of the same trace beside it, in one report
    cfg = composed("trace=sharegpt", *over[:1], "trace.name=stub", "trace.qps=null",
                   "trace.num_requests=null", "model=tiny-llama")
    run(cfg, tmp_path / "sim")
    rep = make_report([tmp_path / "remote", tmp_path / "sim"], tmp_path / "report")
    t = rep.table.set_index("policy")
    assert set(t.index) == {"remote", "sarathi"}
    assert t.loc["remote", "num_finished"] == 2 and t.loc["remote", "executor"] == "remote"
    assert t.loc["remote", "ttft_p50"] >= 0.05


def test_the_page_names_every_column_and_key(tmp_path):
    """replay.md (with metrics.md) names every column of a replay's requests table, every key of
    its summary and of the `remote` and `endpoint` sections."""
    import re
    from sarathi_lab.replay.results import write
    docs = rundir.Path(__file__).resolve().parents[1] / "sarathi_lab" / "docs"
    named = {w for page in ("replay.md", "metrics.md")
             for w in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", (docs / page).read_text(),
                                                       flags=re.S))}
    reqs = [Request(0, 0.0, 4, max_tokens=2)]
    df = requests_frame(reqs, [Outcome(token_times=[0.1, 0.2], finish_time=0.3)], [0])
    s = write(tmp_path / "r", df, slo={"p99_tbt": 0.1},
              extra={"remote": remote_section(df, True), "endpoint": {}})
    s["endpoint"] = {"base_url": 1, "model": 1, "api": 1, "api_key_env": 1, "api_key_sent": 1}
    keys = set(df.columns) | set(s) | set(s["remote"]) | set(s["endpoint"])
    assert not keys - named, f"replay.md does not name {sorted(keys - named)}"
    assert "median_scheduling_delay" in [c["name"] for c in s["slo"]["criteria"]
                                         if c.get("not_observed")]
    assert s["num_gpus"] is None and s["slo"]["goodput_rps_per_gpu"] is None
    assert not {"num_iterations", "stalls", "batch", "queue"} & set(s)
