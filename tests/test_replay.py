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
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from aiohttp import web
from helpers import patience

from sarathi_lab.metrics import tbt_gaps
from sarathi_lab.replay.command import compose, run_replay
from sarathi_lab.replay.loads import Endpoint
from sarathi_lab.replay.results import remote_section, requests_frame
from sarathi_lab.replay.stream import Outcome
from sarathi_lab.request import Request
from sarathi_lab.run import rundir
from sarathi_lab.settings import ConfigError

SMOLLM2_DIR = Path(os.environ.get("SARATHI_LAB_SMOLLM2_DIR")
                   or Path.home() / ".cache" / "sarathi_lab" / "models" / "smollm2")
# as tests/test_smollm2.py: with it set (.ci/run) a missing SmolLM2 fails instead of skipping
REQUIRE_SMOLLM2 = os.environ.get("SARATHI_LAB_REQUIRE_SMOLLM2") == "1"

# how late a token may be seen after the stub sent it, on a loaded 2-core machine
LATE = 0.25
# the stub's behaviour, chosen by a prompt's first token id
OK, ERROR_500, FULL_429, STALL, SHORT, SILENT = range(6)
# canned streams (Stub.CANNED): transformers serve's (no [DONE]), empty texts, token ids, a
# usage count above the chunks, a stream cut off, and four malformed events
NO_DONE, EMPTY, IDS2, USAGE5, CUT, BIG_LINE, LIST, CHOICES_STR, TEXT_INT = range(6, 15)


def _ev(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _text(t, reason=None):
    return _ev({"choices": [{"index": 0, "text": t, "finish_reason": reason}]})


USAGE = _ev({"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens": 3}})


class Stub:
    """An OpenAI-style /v1/completions in a thread of its own: streams `max_tokens` chunks, the
    first `first_s` after the request came, then one every `gap_s`; a prompt starting with
    ERROR_500 / FULL_429 gets that status, STALL stalls after two tokens (until the stub stops),
    SHORT streams 2 tokens whatever was asked, SILENT never answers (until the stub stops).
    Records each request's body, headers, when it
    came and when each chunk went (time.perf_counter)."""

    CANNED = {
        # transformers serve 5.25: a closing chunk with empty text, usage, no [DONE]
        NO_DONE: [_text("a"), _text("b"), _text("c"), _text("", "length"), USAGE],
        # empty texts while running (a partial UTF-8 character, a special token): 3 tokens
        EMPTY: [_text(""), _text(""), _text("x"), _text("", "length"), USAGE, "data: [DONE]\n\n"],
        # token ids, two per chunk (text held back in one): 4 tokens
        IDS2: [_ev({"choices": [{"index": 0, "text": "", "token_ids": [5, 6]}]}),
               _ev({"choices": [{"index": 0, "text": "ab", "token_ids": [7, 8],
                                 "finish_reason": "length"}]}), "data: [DONE]\n\n"],
        # 3 chunks, the server counts 5 tokens (e.g. two held in one chunk's text)
        USAGE5: [_text("a"), _text("b"), _text("cde", "length"),
                 _ev({"choices": [], "usage": {"completion_tokens": 5}}), "data: [DONE]\n\n"],
        CUT: [_text("a"), _text("b")],
        BIG_LINE: [_text("a"), "data: " + "x" * (1 << 20) + "\n\n", _text("b")],
        LIST: [_text("a"), "data: [1, 2, 3]\n\n"],
        CHOICES_STR: [_text("a"), _ev({"choices": "abc"})],
        TEXT_INT: [_text("a"), _ev({"choices": [{"text": 7}]})],
    }

    def __init__(self, first_s=0.3, gap_s=0.1):
        self.first_s, self.gap_s = first_s, gap_s
        self.seen = []   # (body, headers, came, [sent...])
        self.active = self.most_active = 0

    async def handle(self, request):
        came = time.perf_counter()
        body = await request.json()
        rec = (body, dict(request.headers), came, [])
        self.seen.append(rec)
        prompt = body["prompt"] if "prompt" in body else body["messages"][0]["content"]
        kind = prompt[0] if isinstance(prompt, list) else OK
        if "messages" in body or isinstance(prompt, str):
            return await self.chat(request, body, rec)
        if kind in self.CANNED:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for event in self.CANNED[kind]:
                await asyncio.sleep(self.gap_s)
                rec[3].append(time.perf_counter())
                await resp.write(event.encode())
            return resp
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

    async def chat(self, request, body, rec):
        """A text prompt (completions) or a chat: as transformers serve streams them (a role
        chunk first in chat, no [DONE]), `max_tokens` tokens; refuses a token-id prompt."""
        chat = "messages" in body
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        events = [{"delta": {"role": "assistant"}}] if chat else []
        events += [{"delta": {"content": f" w{i}"}} if chat else {"text": f" w{i}"}
                   for i in range(body["max_tokens"])]
        events.append({"delta": {}, "finish_reason": "length"} if chat else
                      {"text": "", "finish_reason": "length"})
        for e in events:
            await asyncio.sleep(self.gap_s)
            rec[3].append(time.perf_counter())
            await resp.write(_ev({"choices": [{"index": 0, **e}]}).encode())
        await resp.write(_ev({"choices": [], "usage": {
            "completion_tokens": body["max_tokens"], "prompt_tokens": 99}}).encode())
        return resp

    async def _start(self):
        self.release = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        app.router.add_post("/v1/chat/completions", self.handle)
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
                    finish_reason="length", http_status=200, num_chunks=3),
            Outcome(status="rejected", http_status=429, error="HTTP 429: queue full"),
            Outcome(status="error", http_status=500, error="HTTP 500: boom"),
            Outcome(status="timeout", token_times=[3.5, 3.6], http_status=200,
                    error="no data for 1 s (stall_timeout)", num_chunks=2)]
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
    from helpers import composed

    from sarathi_lab.report import make_report
    from sarathi_lab.run.runner import run
    over = jsonl(tmp_path / "t.jsonl", [(OK, 4, 3, 0.0), (OK, 4, 3, 0.1), (FULL_429, 4, 3, 0.2)])
    env = {**os.environ, "OPENAI_API_KEY": "sk-not-written"}
    with Stub(first_s=0.05, gap_s=0.02) as stub:
        r = subprocess.run([sys.executable, "-c", "from sarathi_lab.replay import main; main()",
                            "--base-url", stub.url, "--model", "stub-model",
                            "--max-concurrency", "2", "--warmup", "1",
                            "--out", str(tmp_path / "remote"), *over],
                           capture_output=True, text=True, timeout=patience(120), env=env)
    assert r.returncode == 0, r.stderr
    assert "3 requests: 2 finished, 1 rejected (HTTP 429), 0 errors, 0 timeouts" in r.stdout
    assert len(stub.seen) == 4   # the warm-up first
    s = json.loads((tmp_path / "remote" / rundir.SUMMARY).read_text())
    assert s["load"]["max_concurrency"] == 2 and s["warmup"]["num_requests"] == 1
    assert "slo" not in s   # none named
    bad = subprocess.run([sys.executable, "-c", "from sarathi_lab.replay import main; main()",
                          "--base-url", stub.url, "--model", "m", "scheduler=vllm"],
                         capture_output=True, text=True, timeout=patience(120))
    assert bad.returncode == 1 and "scheduler=vllm: sarathi-lab-replay reads only" in bad.stderr
    chat = subprocess.run([sys.executable, "-c", "from sarathi_lab.replay import main; main()",
                           "--base-url", stub.url, "--model", "m", "--api", "chat", *over],
                          capture_output=True, text=True, timeout=patience(120))
    assert chat.returncode == 1 and "--api chat: a chat message is text; give --prompt text" \
        in chat.stderr
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
    s["warmup"] = {"num_requests": 0, "num_finished": 0}
    keys = set(df.columns) | set(s) | set(s["remote"]) | set(s["endpoint"]) | set(s["warmup"])
    assert not keys - named, f"replay.md does not name {sorted(keys - named)}"
    assert "median_scheduling_delay" in [c["name"] for c in s["slo"]["criteria"]
                                         if c.get("not_observed")]
    assert s["num_gpus"] is None and s["slo"]["goodput_rps_per_gpu"] is None
    assert not {"num_iterations", "stalls", "batch", "queue"} & set(s)


def test_streams_as_servers_send_them(tmp_path):
    """No [DONE] after the finish (transformers serve), empty-text chunks, token ids, a usage
    count above the chunks, a stream cut off: each read by hand."""
    rows = [(NO_DONE, 3, 3, 0.0), (EMPTY, 3, 3, 0.0), (IDS2, 3, 4, 0.0), (USAGE5, 3, 5, 0.0),
            (CUT, 3, 3, 0.0)]
    with Stub(gap_s=0.05) as stub:
        s = run_replay(jsonl(tmp_path / "t.jsonl", rows), endpoint(stub.url), tmp_path / "run",
                       progress=False)
    df = pd.read_parquet(tmp_path / "run" / rundir.REQUESTS)
    assert list(df["status"]) == ["finished"] * 4 + ["error"]
    sent = {body["prompt"][0]: [t - came for t in ts] for body, _, came, ts in stub.seen}
    # NO_DONE: three text chunks timed, the closing empty one not (usage says 3)
    assert list(df["num_output_tokens"][:4]) == [3, 3, 4, 5]
    assert list(df["num_token_chunks"][:4]) == [3, 3, 2, 3]
    assert list(df["server_prompt_tokens"].astype(object)[:2]) == [3, 3]
    for i, k in enumerate((NO_DONE, EMPTY)):   # times: those of the token chunks
        times = df.loc[i, "token_times"] - df.loc[i, "arrival_time"]
        assert times == pytest.approx(sent[k][:3], abs=LATE)
        assert df.loc[i, "finish_reason"] == "length"
    # token ids: two tokens per chunk, both timed at the chunk
    t = df.loc[2, "token_times"]
    assert len(t) == 4 and t[0] == t[1] and t[2] == t[3] and t[2] > t[0]
    # usage says 5 where 3 chunks came: the output is 5 tokens, TPOT over 4 gaps, by hand
    r = df.loc[3]
    assert len(r["token_times"]) == 3 and r["num_output_tokens"] == 5
    assert r["tpot"] == pytest.approx((r["e2e"] - r["ttft"]) / 4)
    assert s["remote"]["token_chunks_differ"] == 2   # IDS2 and USAGE5
    assert df.loc[4, "error"].startswith("the stream ended before `data: [DONE]`")
    assert len(df.loc[4, "token_times"]) == 2


def test_one_malformed_event_fails_only_its_request(tmp_path):
    """A 1 MiB line of no JSON, a list for an event, `choices` a string, a number for text:
    each fails its request; the others are measured and the run directory is written."""
    rows = [(OK, 3, 3, 0.0), (BIG_LINE, 3, 3, 0.0), (LIST, 3, 3, 0.0), (CHOICES_STR, 3, 3, 0.0),
            (TEXT_INT, 3, 3, 0.0), (OK, 3, 3, 0.1)]
    with Stub(first_s=0.05, gap_s=0.02) as stub:
        s = run_replay(jsonl(tmp_path / "t.jsonl", rows), endpoint(stub.url), tmp_path / "run",
                       progress=False)
    df = pd.read_parquet(tmp_path / "run" / rundir.REQUESTS)
    assert list(df["status"]) == ["finished", "error", "error", "error", "error", "finished"]
    err = list(df["error"])
    assert err[1].startswith("malformed event: an event that is not JSON: b'xxx")
    assert err[2] == "malformed event: an event that is not a JSON object: [1, 2, 3]"
    assert err[3] == "malformed event: `choices` is not a list of objects: abc"
    assert err[4] == "malformed event: the chunk's text is '7', not a string"
    assert s["num_finished"] == 2 and s["remote"]["num_errors"] == 4
    assert (df.loc[[0, 5], "num_output_tokens"] == 3).all()


def test_text_prompts_and_chat(tmp_path, monkeypatch):
    """A trace's own text, sent as it is (completions) or as the user's message (chat); a
    length-only trace without a tokenizer is refused, naming the option."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"hello number {i}", "output_len": 2 + i,
                                        "arrival_time": 0.05 * i}) + "\n" for i in range(3)))
    from sarathi_lab.traces import build_trace
    over = [f"trace.path={path}", "trace.name=t", "trace.qps=null", "trace.num_requests=null"]

    class Words:   # a tokenizer stand-in: a token per word
        chat_template = None

        def __call__(self, texts, add_special_tokens=True):
            return {"input_ids": [[1] * len(t.split()) for t in texts]}
    # the trace's own tokenizer, without files
    monkeypatch.setattr("sarathi_lab.traces.jsonl.load_tokenizer", lambda tok, src: Words())
    assert build_trace({"path": str(path), "tokenizer": "x"})["prompt_text"][1] == \
        "hello number 1"
    with Stub(gap_s=0.01) as stub:
        for api in ("completions", "chat"):
            s = run_replay(over + ["trace.tokenizer=x"], endpoint(stub.url, api=api),
                           tmp_path / api, progress=False, prompt="text")
            df = pd.read_parquet(tmp_path / api / rundir.REQUESTS)
            assert (df["status"] == "finished").all(), df["error"].tolist()
            assert list(df["num_output_tokens"]) == [2, 3, 4]
            # chat: the role chunk is no token; every content chunk is
            assert list(df["num_token_chunks"]) == [2, 3, 4]
            assert list(df["server_prompt_tokens"].astype(object)) == [99] * 3
            assert s["endpoint"]["api"] == api
            assert s["config"]["executor"]["prompt_ids"] == "trace text"
        bodies = [b for b, *_ in stub.seen]
        assert [b["prompt"] for b in bodies[:3]] == [f"hello number {i}" for i in range(3)]
        assert [b["messages"] for b in bodies[3:]] == [
            [{"role": "user", "content": f"hello number {i}"}] for i in range(3)]
    with pytest.raises(ConfigError, match=r"--prompt text: the trace has no prompt text"):
        run_replay(["trace=synthetic", "trace.num_requests=2"], endpoint("http://127.0.0.1:9/v1"),
                   tmp_path / "r", prompt="text")
    with pytest.raises(ConfigError, match=r"--api chat: a chat message is text"):
        run_replay([], endpoint("http://127.0.0.1:9/v1", api="chat"), tmp_path / "r")


@pytest.mark.slow   # transformers and a real tokenizer: 20 s on a loaded machine
def test_text_synthesized_to_the_asked_lengths():
    """SmolLM2's tokenizer, where prepared: every synthesized text tokenizes to exactly its
    length; a tokenizer without whole-word tokens is refused."""
    from transformers import AutoTokenizer

    from sarathi_lab.replay.prompts import synthesize_texts
    if not (SMOLLM2_DIR / "tokenizer.json").exists() and not REQUIRE_SMOLLM2:
        pytest.skip("SmolLM2 not prepared (sarathi-lab-prepare-model smollm2)")
    tok = AutoTokenizer.from_pretrained(str(SMOLLM2_DIR), local_files_only=True)
    lengths = [1, 2, 7, 64, 300, 1000]
    texts = synthesize_texts(tok, lengths, seed=3)
    assert [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts] == lengths
    assert texts == synthesize_texts(tok, lengths, seed=3)   # seeded
    assert texts != synthesize_texts(tok, lengths, seed=4)


def test_slo_only_when_named():
    """No SLO unless an override names one; slo=none, slo=null and ~slo name none."""
    assert compose([])["slo"] is None
    assert compose(["slo=llama-2-7b-relaxed"])["slo"]["name"] == "llama-2-7b-relaxed"
    assert compose(["slo.p99_tbt=0.3"])["slo"]["p99_tbt"] == 0.3
    for none in ("slo=none", "slo=null", "~slo", "~slo=mistral-7b-strict"):
        assert compose([none, "seed=2"]) == {**compose(["seed=2"]), "slo": None}
    with pytest.raises(ConfigError, match=r"judges no SLO"):
        compose(["slo=none", "slo.p99_tbt=0.3"])
    from sarathi_lab.sweeps.bookkeeping import compose_config
    assert compose_config(["slo=none"])["slo"] is None   # sarathi-lab itself takes slo=none


def test_max_concurrency_and_warmup(tmp_path):
    """At most 2 in flight, times from the send; 2 warm-up requests first, not measured."""
    rows = [(OK, 3, 3, 0.0)] * 6
    with Stub(first_s=0.1, gap_s=0.02) as stub:
        s = run_replay(jsonl(tmp_path / "t.jsonl", rows), endpoint(stub.url, max_concurrency=2),
                       tmp_path / "run", progress=False, warmup=2)
    df = pd.read_parquet(tmp_path / "run" / rundir.REQUESTS)
    assert len(df) == 6 and (df["status"] == "finished").all()
    assert len(stub.seen) == 8 and stub.most_active <= 2
    # the warm-ups came (and ended) before the first measured request
    came = sorted(c for _, _, c, _ in stub.seen)
    assert max(ts[-1] for *_, ts in stub.seen[:2]) < came[2]
    # a request's time runs from its send, so TTFT stays the stub's first_s, not the queue
    assert df["ttft"].max() < 0.1 + LATE
    assert df["arrival_time"].max() > 0.25   # the later ones were sent later
    assert s["warmup"] == {"num_requests": 2, "num_finished": 2}
    assert s["load"] == {"mode": "open", "max_concurrency": 2}


def test_two_endpoints_are_two_configurations(tmp_path):
    """Replays of two servers that name the same model: two configurations in a report, each
    labelled with its endpoint; two replays of one server: one configuration, two runs."""
    from sarathi_lab.report.seeds import by_config
    from sarathi_lab.report.tables import run_table
    over = jsonl(tmp_path / "t.jsonl", [(OK, 3, 2, 0.0)])
    with Stub(first_s=0.01, gap_s=0.01) as a, Stub(first_s=0.01, gap_s=0.01) as b:
        for name, stub in (("a1", a), ("a2", a), ("b", b)):
            run_replay(over, endpoint(stub.url), tmp_path / "runs" / name, progress=False)
    t = run_table([tmp_path / "runs"])
    assert sorted(t["endpoint"]) == sorted([a.url, a.url, b.url])
    assert set(t["label"]) == {f"remote (endpoint={a.url}) [a1]", f"remote (endpoint={a.url}) [a2]",
                               f"remote (endpoint={b.url})"}
    c = by_config(t).set_index("endpoint")
    assert len(c) == 2 and c.loc[a.url, "n_seeds"] == 2 and c.loc[b.url, "n_seeds"] == 1


def test_labels_say_where_and_which_clock(tmp_path):
    """A replay's report names the served endpoint, a real executor's run names the executor,
    not "various GPUs"; a measured run's timeline is in wall-clock time, a simulated one's in
    simulated time."""
    from sarathi_lab.plots.style import context
    from sarathi_lab.plots.timeline import timeline
    sim = {"model": "m", "hardware": "a100-80gb", "simulated": True, "executor": None}
    remote = {"model": "m", "hardware": None, "simulated": False, "executor": "remote",
              "endpoint": "http://127.0.0.1:1/v1"}
    served = {"model": "m", "hardware": None, "simulated": False, "executor": "torch",
              "settings_executor_device": "cuda"}
    assert context(pd.DataFrame([sim])) == "m on a100-80gb"
    assert context(pd.DataFrame([remote])) == "m on served endpoint http://127.0.0.1:1/v1"
    assert context(pd.DataFrame([served])) == "m on a real torch executor (device cuda)"
    assert context(pd.DataFrame([sim, remote, {**remote, "endpoint": "http://h:2/v1"}])) == \
        "m on simulated a100-80gb and 2 served endpoints"
    run = tmp_path / "run"
    run.mkdir()
    pd.DataFrame({"start": [0.0, 0.1, 0.2], "duration": [0.1] * 3, "prefill_tokens": [4, 0, 0],
                  "decode_tokens": [0, 1, 1]}).to_parquet(run / rundir.ITERATIONS)
    pd.DataFrame({"token_times": [[0.1, 0.2, 0.3]]}).to_parquet(run / rundir.REQUESTS)
    for simulated, clock in ((False, "wall-clock time (s)"), (True, "simulated time (s)")):
        row = pd.Series({"run_dir": str(run), "label": "x", "simulated": simulated,
                         "slo_p99_tbt": None, "model": "m"})
        fig, _ = timeline.draw(row)
        assert {ax.get_xlabel() for ax in fig.axes if ax.get_xlabel()} == {clock}


@pytest.mark.slow   # `transformers serve` with SmolLM2 on the CPU, in a subprocess
@pytest.mark.skipif(not (SMOLLM2_DIR / "prepared.json").exists() and not REQUIRE_SMOLLM2,
                    reason="SmolLM2 not prepared (sarathi-lab-prepare-model smollm2)")
def test_against_transformers_serve(tmp_path):
    """A server nobody here wrote, that takes text prompts only, refuses ignore_eos and ends its
    streams without [DONE]: 5 requests of synthesized text, completions and chat, all finished,
    every token timed, and the server counts the prompts the trace asked for."""
    import socket
    import urllib.request

    import fastapi  # noqa: F401  the serving extra (dev), imported so a broken install errors
    import uvicorn  # noqa: F401
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the `transformers` console script of this interpreter's package, wherever it lies
    exe = [sys.executable, "-m", "transformers.cli.transformers"]
    log = open(tmp_path / "serve.log", "w")
    # one thread: on a loaded 2-core machine torch's default thread pool makes a token take
    # 3 s instead of 0.3 s (measured)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*exe, "serve", str(SMOLLM2_DIR), "--host", "127.0.0.1",
                             "--port", str(port), "--device", "cpu"],
                            stdout=log, stderr=subprocess.STDOUT, env=env,
                            cwd=tmp_path)   # `-m` puts the folder on sys.path: not the
    # checkout, whose kernels/ would stand for Hugging Face's `kernels` package
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + patience(300)
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "transformers serve did not start in time"
                time.sleep(1)
        over = ["trace=synthetic", "trace.num_requests=5", "trace.prompt_len=12",
                "trace.output_len=6", "trace.qps=2"]
        for api in ("completions", "chat"):
            ep = Endpoint(url, str(SMOLLM2_DIR), 300.0, 120.0, 8, False, api, max_concurrency=2)
            s = run_replay(over, ep, tmp_path / api, progress=False, prompt="text",
                           tokenizer=SMOLLM2_DIR, warmup=1)
            df = pd.read_parquet(tmp_path / api / rundir.REQUESTS)
            assert (df["status"] == "finished").all(), df["error"].tolist()
            assert "slo" not in s   # none named
            n = df["num_output_tokens"].to_numpy()
            # every token the server counted was timed; as asked, unless it stopped at EOS
            assert list(map(len, df["token_times"])) == list(n)
            assert ((df["finish_reason"] == "length") & (n == 6) |
                    (df["finish_reason"] == "stop") & (n <= 6)).all()
            sp = df["server_prompt_tokens"].astype(int).to_numpy()
            if api == "completions":   # the synthesized text is 12 tokens to the server too
                assert (sp == 12).all() and (df["num_prompt_tokens"] == 12).all()
            else:                      # plus the chat template's markers
                assert (sp > 12).all() and len(set(sp)) == 1
            assert s["warmup"] == {"num_requests": 1, "num_finished": 1}
            print(api, df[["ttft", "e2e", "num_output_tokens", "finish_reason",
                           "server_prompt_tokens"]].to_string())
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def test_a_named_slo_judged_by_hand(tmp_path):
    """Gaps 0.2, 0.3 (request 0) and 0.1, 0.1 (request 1): pooled P99 TBT 0.297 (numpy's
    linear rule: 0.2 + 0.97 x 0.1); the TBT verdict rests on it and the rejections (the median
    scheduling delay is not observed); request 0's own P99 TBT (0.299) misses 0.15, request
    1's (0.1) meets it: attainment 0.5."""
    from sarathi_lab.replay.results import write
    reqs = [Request(i, a, 4, max_tokens=3) for i, a in enumerate((1.0, 2.0))]
    outs = [Outcome(token_times=[1.5, 1.7, 2.0], finish_time=2.1, usage_tokens=3, num_chunks=3),
            Outcome(token_times=[2.5, 2.6, 2.7], finish_time=2.8, usage_tokens=3, num_chunks=3)]
    df = requests_frame(reqs, outs, None)
    for limit, met in ((0.25, False), (0.3, True)):
        slo = compose(["slo=mistral-7b-strict", f"slo.p99_tbt={limit}",
                       "slo.request_p99_tbt=0.15"])["slo"]
        s = write(tmp_path / str(limit), df, slo=slo, extra={})
        p99 = next(c for c in s["slo"]["criteria"] if c["name"] == "p99_tbt")
        assert p99["value"] == pytest.approx(0.297) and p99["met"] is met
        assert s["slo"]["meets_tbt_slo"] is met
        assert s["slo"]["attainment"] == pytest.approx(0.5)
    assert "slo" not in write(tmp_path / "none", df, slo=None, extra={})
