"""`sarathi-lab-serve`: the OpenAI-compatible server on the real executor.

In-process (fast): a request aborted while waiting, running or swapped leaves the policy with
its KV freed; the request bodies are read strictly. In a subprocess (slow; 127.0.0.1, a free
port, stopped by the test): streamed and whole completions equal the in-process executor's
greedy tokens; a client that disconnects frees its KV; every documented status code; a burst
past serve.max_queue gets 429s and the run directory counts exactly the accepted requests.
"""
import http.client
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import slow_fixture
from helpers import ROOT, patience
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from served import PROMPT, Served, _greedy, _tiny, save_tokenizer

from sarathi_lab.engine import Engine
from sarathi_lab.request import Request, Status
from sarathi_lab.serve.configure import configure
from sarathi_lab.serve.protocol import ApiError, parse_generation
from sarathi_lab.sweeps.bookkeeping import register_resolvers

# the module's server is shared by its tests: one worker runs them all (pytest-xdist)
pytestmark = pytest.mark.xdist_group("serve")


# -- in process --------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["waiting", "running", "swapped"])
def test_an_aborted_request_leaves_the_policy_and_frees_its_kv(where):
    swap = dict(preemption_mode="swap", num_swap_blocks=64) if where == "swapped" else {}
    # 20 blocks of 4: each request (20 + 40 tokens) fits alone, two outgrow them: a preemption
    policy, ex = _tiny(name="vllm", block_size=4, num_kv_blocks=20, kv_watermark=0.0,
                       max_num_seqs=1 if where == "waiting" else 8, **swap)
    e = Engine(policy, ex, fast_forward=False)
    reqs = [Request(i, 0.0, 20, None, prompt_token_ids=list(range(1 + i, 21 + i)),
                    max_tokens=40) for i in range(2)]
    for r in reqs:
        e.add_request(r)
    status = {"waiting": Status.WAITING, "running": Status.RUNNING,
              "swapped": Status.SWAPPED}[where]
    for _ in range(200):
        e.advance()
        victim = next((r for r in reqs if r.status is status), None)
        if victim is not None and (where != "running" or victim.num_output_tokens):
            break
    assert victim is not None, f"no request was ever {where}"
    held = e.kv.num_used_blocks + e.kv.num_used_host_blocks
    assert e.abort(victim, "aborted: the client disconnected")
    assert victim.status is Status.REJECTED and "disconnected" in victim.rejection_reason
    assert e.kv.num_used_blocks + e.kv.num_used_host_blocks < held or where == "waiting"
    assert not e.abort(victim, "again")   # already ended: nothing to do
    while policy.has_work():
        e.advance()
    e.finish()   # the guard: every request ended, every block (device and host) free
    other = next(r for r in reqs if r is not victim)
    assert other.status is Status.FINISHED and other.num_output_tokens == 40


def test_ignore_eos_and_a_seed_are_per_request():
    """A served request's own sampling (`TorchExecutor.set_sampling`): ignore_eos runs past the
    model's EOS to max_tokens while its neighbour ends there; a seed gives the same tokens
    whatever the request id; all of it forgotten when the requests end."""
    want = _greedy(PROMPT, 8)
    eos = next(t for t in want[1:] if t not in want[:want.index(t)])
    policy, ex = _tiny()
    ex.eos_ids, ex.stop_at_eos = frozenset({eos}), True   # as a checkpoint that declares it
    reqs = [Request(i, 0.0, len(PROMPT), None, prompt_token_ids=list(PROMPT), max_tokens=8)
            for i in range(4)]
    ex.set_sampling(1, 0.0, 1.0, None, True)
    ex.set_sampling(2, 1.0, 0.9, 5, True)
    ex.set_sampling(3, 1.0, 0.9, 5, True)
    Engine(policy, ex).run(reqs)
    cut = want.index(eos) + 1
    assert reqs[0].output_token_ids == want[:cut] and reqs[0].finish_reason == "eos"
    assert reqs[1].output_token_ids == want and reqs[1].finish_reason == "max_tokens"
    assert reqs[2].output_token_ids == reqs[3].output_token_ids != want
    assert ex.request_sampling == {}


def test_request_bodies_are_read_strictly():
    def err(body, chat=False):
        with pytest.raises(ApiError) as e:
            parse_generation(body, chat, None, 512, (0.0, 1.0))
        return e.value
    base = {"model": "m", "prompt": [1, 2]}
    g = parse_generation(base, False, None, 512, (0.0, 1.0))
    assert (g.prompt_ids, g.max_tokens, g.temperature, g.top_p) == ([1, 2], 16, 0.0, 1.0)
    for body, param in [({**base, "n": 2}, "n"), ({**base, "logprobs": 3}, "logprobs"),
                        ({**base, "frequency_penalty": 0.5}, "frequency_penalty"),
                        ({**base, "bogus": 1}, "bogus"), ({**base, "max_tokens": 0}, "max_tokens"),
                        ({**base, "temperature": "hot"}, "temperature"),
                        ({**base, "top_p": 0}, "top_p"), ({**base, "prompt": "text"}, "prompt"),
                        ({**base, "prompt": [1, 600]}, "prompt"),
                        ({**base, "stop": "x"}, "stop"),
                        ({**base, "stream_options": {"include_usage": True}}, "stream_options")]:
        e = err(body)
        assert (e.status, e.param) == (400, param), (body, e.message)
    e = err({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, chat=True)
    assert e.param == "messages" and "chat template" in e.message


def _documented_commands():
    page = ROOT / "sarathi_lab" / "docs" / "serving.md"
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
        for line in block.splitlines():
            if line.startswith("sarathi-lab-serve "):
                yield shlex.split(os.path.expandvars(line.split(" #")[0]))[1:]


def test_documented_commands_and_refusals():
    """serving.md's commands pass the start-up checks; what a server cannot be is refused,
    naming the setting."""
    register_resolvers()
    commands = list(_documented_commands())
    assert len(commands) >= 2
    for args in commands:
        _, sc, r = configure(composed_serve(*args), args)
        assert r.executor_cls.__name__ == "TorchExecutor" and sc.host == "127.0.0.1"
    for args, words in [(["executor=sim"], "executor=sim"), (["mode=capacity"], "mode=capacity"),
                        (["cluster.num_replicas=2"], "cluster"),
                        (["serve.max_queue=0"], "serve.max_queue"),
                        (["+serve.bogus=1"], "serve.bogus"),
                        (["trace=sharegpt"], "trace")]:
        with pytest.raises(SystemExit, match=re.escape(words)):
            c = composed_serve(*args)
            configure(c, args)


def composed_serve(*overrides) -> dict:
    with initialize_config_module("sarathi_lab.configs", version_base="1.3"):
        cfg = compose("serve", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


# -- the server, in a subprocess ----------------------------------------------------------------
@slow_fixture(scope="module")
def server(tmp_path_factory):
    s = Served(tmp_path_factory.mktemp("serve"), "scheduler=sarathi",
               "scheduler.token_budget=8")
    yield s
    s.kill()


def _ids(events) -> list[int]:
    return [t for e in events for c in e["choices"] for t in c["token_ids"]]


@pytest.mark.slow
def test_completions_equal_the_in_process_greedy_tokens(server):
    want = _greedy(PROMPT, 12)
    body = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    events = server.stream({**body, "stream_options": {"include_usage": True}})
    assert _ids(events) == want
    # one token per chunk as it is produced, then the finish, then the usage
    assert [len(e["choices"][0]["token_ids"]) for e in events[:12]] == [1] * 12
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"] == {
        "prompt_tokens": len(PROMPT), "completion_tokens": 12, "total_tokens": len(PROMPT) + 12}
    status, whole = server.request("POST", "/v1/completions", body)
    assert status == 200 and whole["choices"][0]["token_ids"] == want
    # no tokenizer: each token's text in vLLM's token-id form
    assert whole["choices"][0]["text"] == "".join(f"token_id:{t}" for t in want)
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == whole["choices"][0]["text"]
    assert whole["usage"]["completion_tokens"] == 12
    # a seeded sample is the same twice (its stream depends on the seed only)
    seeded = {**body, "temperature": 1.0, "top_p": 0.9, "seed": 11}
    a, b = (server.request("POST", "/v1/completions", seeded)[1] for _ in range(2))
    assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]


@pytest.mark.slow
def test_documented_status_codes(server):
    ok = {"model": "tiny-llama", "prompt": [1, 2, 3], "max_tokens": 2}
    cases = [("POST", "/v1/completions", b"{not json", 400, None),
             ("POST", "/v1/completions", {**ok, "n": 3}, 400, "n"),
             ("POST", "/v1/completions", {**ok, "prompt": "words"}, 400, "prompt"),
             ("POST", "/v1/chat/completions", {"model": "tiny-llama", "messages": [
                 {"role": "user", "content": "hi"}]}, 400, "messages"),
             ("POST", "/v1/completions", {**ok, "model": "gpt-9"}, 404, "model"),
             ("GET", "/v1/nowhere", None, 404, None),
             ("POST", "/v1/completions", {**ok, "prompt": [1] * 8192}, 413, "prompt")]
    for method, path, body, code, param in cases:
        status, answer = server.request(method, path, body)
        assert status == code, (path, body if not isinstance(body, dict) else list(body), answer)
        err = answer["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["param"] == param
    status, models = server.request("GET", "/v1/models")
    assert status == 200 and models["data"][0]["id"] == "tiny-llama"
    assert server.request("GET", "/health")[0] == 200


@pytest.mark.slow
def test_a_client_that_disconnects_frees_its_kv(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=patience(60))
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"model": "tiny-llama", "prompt": PROMPT * 20, "max_tokens": 4000, "stream": True}),
        headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.readline().startswith(b"data: ")   # a first token came
    health = server.request("GET", "/health")[1]
    assert health["running"] == 1 and health["kv_blocks_used"] > 0
    conn.sock.close()   # the client goes away mid-stream
    conn.close()
    server.disconnected += 1
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        health = server.request("GET", "/health")[1]
        if health["kv_blocks_used"] == 0 and health["running"] == 0:
            break
        time.sleep(0.2)
    assert health["kv_blocks_used"] == 0 and health["running"] == 0 and health["in_flight"] == 0


@pytest.mark.slow
def test_the_run_directory_records_the_session(server, tmp_path):
    """Last of the module: the server is stopped; its run directory holds every request once.
    (The counts are this server's: under xdist a module fixture can be made again between tests
    when a worker's queue runs dry, so one request of its own keeps the check from being empty.)"""
    status, _ = server.request("POST", "/v1/completions",
                               {"model": "tiny-llama", "prompt": [1, 2, 3], "max_tokens": 3})
    assert status == 200
    run_dir = server.stop()
    summary = json.loads((run_dir / "summary.json").read_text())
    reqs = pd.read_parquet(run_dir / "requests.parquet")
    assert summary["executor"] == "torch" and summary["load"] == {"mode": "served"}
    assert "arrivals over HTTP (served)" in server.printed
    assert summary["served"]["requests_accepted"] == len(reqs) == summary["num_requests"]
    aborted = reqs[reqs["rejection_reason"] == "aborted: the client disconnected"]
    assert len(aborted) == server.disconnected
    assert ((0 < aborted["num_output_tokens"]) & (aborted["num_output_tokens"] < 4000)).all()
    assert (reqs["status"] == "finished").sum() == server.completed
    assert len(reqs) == server.completed + server.disconnected
    assert summary["served"]["http_status"]["200"] == server.completed
    assert summary["served"]["port"] == server.port
    its = pd.read_parquet(run_dir / "iterations.parquet")
    assert its["decode_tokens"].sum() + its["prefill_tokens"].sum() > 0
    # a run like any other: the report reads it
    from sarathi_lab.report import main as report
    report([str(run_dir), "--out", str(tmp_path / "report"), "--timeline", "none"])
    table = pd.read_csv(tmp_path / "report" / "summary.csv")
    assert list(table["load_mode"]) == ["served"] and list(table["policy"]) == ["sarathi"]


def _word_tokenizer(d: Path):
    """A tokenizer for the tiny model's 512 ids (id i is the word "w<i>") with a chat template:
    what `serve.tokenizer` points at."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 512)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return save_tokenizer(d, tok, "{% for m in messages %}w3 {{ m['content'] }} {% endfor %}"
                                  "{% if add_generation_prompt %}w4{% endif %}")


@pytest.mark.slow
def test_chat_template_text_and_stop_strings(tmp_path):
    tok = _word_tokenizer(tmp_path / "tok")
    s = Served(tmp_path, f"serve.tokenizer={tmp_path / 'tok'}", "serve.model_name=tiny")
    try:
        messages = [{"role": "user", "content": "w9 w10"}]
        templated = [3, 9, 10, 4]   # the template's ids: w3 <content> w4
        want = _greedy(templated, 10)
        status, whole = s.request("POST", "/v1/chat/completions", {
            "model": "tiny", "messages": messages, "max_tokens": 10, "temperature": 0})
        assert status == 200, whole
        msg = whole["choices"][0]["message"]
        assert msg["role"] == "assistant" and whole["choices"][0]["token_ids"] == want
        assert msg["content"] == tok.decode(want, skip_special_tokens=True)
        # a stop string: the request ends at the step whose text holds it, the text cut before
        text = tok.decode(want, skip_special_tokens=True)
        stop = text.split()[3]
        k = next(k for k in range(1, 11)
                 if stop in tok.decode(want[:k], skip_special_tokens=True))
        status, sse = s.request("POST", "/v1/chat/completions", {
            "model": "tiny", "messages": messages, "max_tokens": 10, "temperature": 0,
            "stop": stop, "stream": True})
        events = [json.loads(e[6:]) for e in sse.split("\n\n") if e and e != "data: [DONE]"]
        assert _ids(events) == want[:k]
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
        assert streamed == text[:text.find(stop)]
        assert events[-1]["choices"][0]["finish_reason"] == "stop"
        # text prompts on /v1/completions go through the tokenizer
        status, comp = s.request("POST", "/v1/completions", {
            "model": "tiny", "prompt": "w3 w9 w10 w4", "max_tokens": 10, "temperature": 0})
        assert comp["choices"][0]["token_ids"] == want and comp["choices"][0]["text"] == text
        run_dir = s.stop()
    finally:
        s.kill()
    reqs = pd.read_parquet(run_dir / "requests.parquet")
    assert list(reqs["finish_reason"]) == ["max_tokens", "stop_string", "max_tokens"]
    assert list(reqs["num_output_tokens"]) == [10, k, 10]


@pytest.mark.slow
def test_a_burst_past_max_queue_gets_429_and_nothing_is_lost(tmp_path):
    # 64 blocks of 16 tokens: room for 3 requests in flight, not for a prompt of 2000 tokens
    s = Served(tmp_path, "scheduler=vllm", "serve.max_queue=3", "scheduler.num_kv_blocks=64")
    try:
        status, err = s.request("POST", "/v1/completions",
                                {"model": "tiny-llama", "prompt": [1] * 2000, "max_tokens": 1})
        assert status == 400 and err["error"]["code"] == "rejected"
        assert "policy 'vllm' rejected the request" in err["error"]["message"]
        body = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 300, "temperature": 0}
        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda _: s.request("POST", "/v1/completions", body),
                                    range(12)))
        codes = [a[0] for a in answers]
        assert 429 in codes and 200 in codes and set(codes) <= {200, 429}
        full = next(a for c, a in answers if c == 429)["error"]
        assert full["code"] == "queue_full" and full["type"] == "rate_limit_error"
        served = [a for c, a in answers if c == 200]
        run_dir = s.stop(signal.SIGTERM)
    finally:
        s.kill()
    reqs = pd.read_parquet(run_dir / "requests.parquet")
    summary = json.loads((run_dir / "summary.json").read_text())
    # every accepted request once, finished, with the tokens its client received; the one the
    # policy refused recorded as rejected
    assert len(reqs) == len(served) + 1 == summary["served"]["requests_accepted"]
    assert summary["served"]["http_status"] == {"200": len(served), "400": 1,
                                                "429": 12 - len(served)}
    assert reqs["request_id"].is_unique and (reqs["status"] == "rejected").sum() == 1
    done = reqs[reqs["status"] == "finished"]
    assert len(done) == len(served) and (done["num_output_tokens"] == 300).all()
    assert all(a["choices"][0]["token_ids"] == served[0]["choices"][0]["token_ids"]
               for a in served)


BOOM = """
from sarathi_lab.schedulers.sarathi import Sarathi


class Boom(Sarathi):
    name = "boom"

    def schedule(self, now):
        if any(r.num_output_tokens >= 3 for r in self.running):
            raise RuntimeError("boom after 3 tokens")
        return super().schedule(now)
"""


@pytest.mark.slow
def test_a_plugin_that_raises_stops_the_server_with_its_error(tmp_path):
    """Any policy, a plug-in too; one that raises does not hang its clients: each is told, the
    server exits 1 naming the error, and the run directory keeps what it served."""
    (tmp_path / "boom.py").write_text(BOOM)
    s = Served(tmp_path, "scheduler=custom", "scheduler.name=boom:Boom")
    try:
        events = s.stream({"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 10})
        assert _ids(events[:-1]) == _greedy(PROMPT, 3)
        assert events[-1]["error"]["code"] == "engine_error"
        assert "boom after 3 tokens" in events[-1]["error"]["message"]
        _, err = s.proc.communicate(timeout=patience(120))   # it stops by itself
    finally:
        s.kill()
    assert s.proc.returncode == 1 and "the engine stopped" in err and "boom.Boom" in err
    run_dir = Path(err.split("the run directory ")[1].split(" holds")[0])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "boom after 3 tokens" in summary["served"]["engine_error"]
    assert summary["settings"]["scheduler"]["class"] == "boom:Boom"


@pytest.mark.slow
def test_the_replay_client_against_the_server(tmp_path):
    """sarathi-lab-replay, open and closed loop, against sarathi-lab-serve: both sides' run
    directories complete, and the tokens each request was sent are the ones the server made."""
    s = Served(tmp_path, "scheduler=sarathi")
    outs = {}
    try:
        for name, load in [("open", ["trace.qps=20"]),
                           ("closed", ["trace.clients=3", "trace.think_time=0.05"])]:
            outs[name] = tmp_path / name
            proc = subprocess.run(
                [sys.executable, "-c", "from sarathi_lab.replay import main; main()",
                 "--base-url", f"http://127.0.0.1:{s.port}/v1", "--model", "tiny-llama",
                 "--vocab-size", "512", "--out", str(outs[name]), "trace=synthetic",
                 "trace.num_requests=6", *load], capture_output=True, text=True,
                 timeout=patience(600),
                cwd=tmp_path)
            assert proc.returncode == 0, proc.stderr[-3000:]
        run_dir = s.stop()
    finally:
        s.kill()
    served = pd.read_parquet(run_dir / "requests.parquet")
    assert len(served) == 12 and (served["status"] == "finished").all()
    sent = []
    for name, out in outs.items():
        summary = json.loads((out / "summary.json").read_text())
        assert summary["executor"] == "remote" and summary["remote"]["num_short"] == 0
        reqs = pd.read_parquet(out / "requests.parquet")
        assert len(reqs) == 6 and (reqs["status"] == "finished").all()
        assert (reqs["num_output_tokens"] == reqs["target_output_tokens"]).all()
        sent += list(reqs["num_output_tokens"])
    assert sorted(served["num_output_tokens"]) == sorted(sent)


def test_stop_watch_finds_a_stop_at_the_step_whole_decoding_would(tmp_path):
    # the worker's StopWatch decodes only each step's new tokens; the step at which it sees a
    # stop string must be the one at which decoding the whole output first holds it, also when
    # the stop spans two tokens or the output arrives several tokens a step
    from sarathi_lab.serve.text import StopWatch
    tok = _word_tokenizer(tmp_path / "tok")
    rng = np.random.default_rng(0)
    for trial in range(40):
        ids = rng.integers(3, 20, size=30).tolist()
        stops = ["9 w1", "w17"] if trial % 2 else ["w5 w6 w"]
        step = 1 + trial % 3   # tokens per step: 1, 2 or 3
        watch, got = StopWatch(tok, stops), None
        for i in range(0, len(ids), step):
            if watch.add(ids[i:i + step]):
                got = min(i + step, len(ids))
                break
        want = next((k for k in range(step, len(ids) + step, step)
                     if any(s in tok.decode(ids[:k], skip_special_tokens=True) for s in stops)),
                    None)
        assert got == (None if want is None else min(want, len(ids))), (trial, ids, stops)
