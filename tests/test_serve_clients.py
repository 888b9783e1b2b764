"""`sarathi-lab-serve` as the ecosystem's clients use it, and against what they may send.

The exact request bodies of GuideLLM 0.8.1 (recorded from its run against this server: text
parts, `stream_options.continuous_usage_stats`) and of `vllm bench serve` 0.34 (its openai and
openai-chat backends, read from vllm/benchmarks/lib/endpoint_request_func.py and serve.py:
`repetition_penalty: 1.0`, `logprobs: null`, the sampling flags) are served; each field of
OpenAI's and vLLM's API is accepted or refused by hand through HTTP; a number that is not
finite, a lone surrogate, a body nested 100,000 deep never gets a plain-text 500 nor stops the
server; the API key guards every route but /health.

GuideLLM itself is not a dev dependency: it pins click 8.4 and multidict 6.9 below this
project's (serving.md, "Clients", gives the command and the result of a run against the server).
"""
import json
import math
import string
import sys
from pathlib import Path

import pytest
import torch
from served import PROMPT, Served, _greedy, save_tokenizer

from sarathi_lab.executors.sampling import draw, probabilities
from sarathi_lab.metrics.costs import offered_load
from sarathi_lab.serve import command
from sarathi_lab.serve.protocol import ApiError, parse_generation
from sarathi_lab.serve.settings import ServeConfig

pytestmark = pytest.mark.xdist_group("serve")
MODEL = "tiny-llama"


def char_tokenizer(d: Path):
    """A tokenizer for the tiny model's 512 ids: one id per printable character (so any text
    GuideLLM synthesizes encodes and decodes back unchanged), the rest as `<wN>` pieces, a BOS
    added by `encode` (so add_special_tokens shows), and a chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for c in string.printable.strip("\t\n\r\x0b\x0c") + " ":
        vocab.setdefault(c, len(vocab))
    while len(vocab) < 512:
        vocab[f"<w{len(vocab)}>"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[
        ("<s>", 1)])
    return save_tokenizer(d, tok, "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                                  "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")


# -- the real clients' bodies --------------------------------------------------------------------
TEXT = "1 0 m0 Finish medical want almos"
# GuideLLM 0.8.1, `guidellm run --backend kind=openai_http,...`: the bodies it recorded
# (request_args.body in its JSON report); its code also sets "stop": null with ignore_eos
GUIDELLM_COMPLETIONS = {
    "model": MODEL, "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    "max_tokens": 16, "ignore_eos": True, "prompt": TEXT}
GUIDELLM_CHAT = {
    "model": MODEL, "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    "max_completion_tokens": 16, "ignore_eos": True,
    "messages": [{"role": "user", "content": [{"type": "text", "text": TEXT}]}]}
# vllm bench serve --backend openai (a random dataset sets ignore_eos; --temperature etc. are
# merged from extra_body) and --backend openai-chat
VLLM_SAMPLING = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "temperature": 0.0,
                 "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0}
VLLM_COMPLETIONS = {
    "model": MODEL, "prompt": TEXT, "repetition_penalty": 1.0, "max_tokens": 16,
    "logprobs": None, "stream": True, "stream_options": {"include_usage": True},
    "ignore_eos": True}
VLLM_CHAT = {
    "model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": TEXT}]}],
    "max_completion_tokens": 16, "stream": True, "stream_options": {"include_usage": True},
    "ignore_eos": True}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("clients")
    tok = char_tokenizer(d / "tok")
    s = Served(d, "scheduler=sarathi", f"serve.tokenizer={d / 'tok'}")
    s.tok = tok
    yield s
    s.kill()


def _events(text: str) -> list[dict]:
    events = [e[len("data: "):] for e in text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def _post(s, body, chat=None, headers=None):
    chat = "messages" in body if chat is None else chat
    return s.request("POST", "/v1/chat/completions" if chat else "/v1/completions", body,
                     headers=headers)


@pytest.mark.slow
def test_guidellm_and_vllm_bench_bodies_are_served(served):
    prompt_ids = served.tok.encode(TEXT)   # BOS + one id per character
    chat_ids = served.tok.apply_chat_template([{"role": "user", "content": TEXT}],
                                              add_generation_prompt=True, tokenize=True)
    chat_ids = chat_ids if isinstance(chat_ids, list) else chat_ids["input_ids"]
    for name, body, n_prompt in [("guidellm completions", GUIDELLM_COMPLETIONS, len(prompt_ids)),
                                 ("guidellm completions, stop null",
                                  {**GUIDELLM_COMPLETIONS, "stop": None}, len(prompt_ids)),
                                 ("guidellm chat", GUIDELLM_CHAT, len(chat_ids)),
                                 ("vllm bench openai", VLLM_COMPLETIONS, len(prompt_ids)),
                                 ("vllm bench openai, sampling flags",
                                  {**VLLM_COMPLETIONS, **VLLM_SAMPLING}, len(prompt_ids)),
                                 ("vllm bench openai-chat", VLLM_CHAT, len(chat_ids)),
                                 ("vllm bench openai-chat, sampling flags",
                                  {**VLLM_CHAT, **VLLM_SAMPLING}, len(chat_ids))]:
        status, text = _post(served, body)
        assert status == 200, (name, text)
        events = _events(text)
        tokens = [e for e in events if e["choices"]]
        assert sum(len(e["choices"][0]["token_ids"]) for e in tokens) == 16, name
        assert events[-1]["choices"] == [] and events[-1]["usage"] == {
            "prompt_tokens": n_prompt, "completion_tokens": 16,
            "total_tokens": n_prompt + 16}, name
        continuous = body["stream_options"].get("continuous_usage_stats", False)
        # vLLM's continuous_usage_stats: every chunk carries the usage so far
        sent = 0
        for e in tokens:
            sent += len(e["choices"][0]["token_ids"])
            if continuous:
                assert e["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": sent,
                                      "total_tokens": n_prompt + sent}, name
            else:
                assert "usage" not in e, name
        if "messages" in body:
            assert tokens[0]["choices"][0]["delta"]["role"] == "assistant"
        assert tokens[-1]["choices"][0]["finish_reason"] == "length"
    # the text parts are the text: the same tokens as the same text given as a string
    whole = {k: v for k, v in VLLM_CHAT.items() if k not in ("stream", "stream_options")}
    a = _post(served, whole)[1]
    b = _post(served, {**whole, "messages": [{"role": "user", "content": TEXT}]})[1]
    assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]
    assert a["usage"] == b["usage"]
    # several text parts are joined by a newline, as vLLM joins them
    two = {**whole, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}]}]}
    one = {**whole, "messages": [{"role": "user", "content": "ab\ncd"}]}
    assert _post(served, two)[1]["usage"] == _post(served, one)[1]["usage"]


# -- each field, by hand, through HTTP -----------------------------------------------------------
BASE = {"model": MODEL, "prompt": [5, 17, 42], "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
# (body, whether it is served): accepted where it changes nothing, refused where it would
ACCEPTED = [{**BASE, k: v} for k, v in [
    ("n", 1), ("best_of", 1), ("use_beam_search", False), ("length_penalty", 1.0),
    ("early_stopping", False), ("presence_penalty", 0.0), ("frequency_penalty", 0),
    ("repetition_penalty", 1.0), ("top_k", -1), ("top_k", 0), ("top_k", 512), ("min_p", 0.0),
    ("min_tokens", 0), ("logprobs", None), ("logprobs", False), ("top_logprobs", 0),
    ("prompt_logprobs", None), ("echo", False), ("suffix", None), ("logit_bias", {}),
    ("logit_bias", None), ("stop_token_ids", []), ("bad_words", []),
    ("allowed_token_ids", None), ("include_stop_str_in_output", False),
    ("include_stop_str_in_output", True), ("skip_special_tokens", True),
    ("spaces_between_special_tokens", False), ("return_token_ids", True),
    ("return_tokens_as_token_ids", False), ("truncate_prompt_tokens", None), ("priority", 0),
    ("response_format", {"type": "text"}), ("structured_outputs", None), ("guided_json", None),
    ("guided_regex", None), ("guided_choice", None), ("guided_grammar", None), ("seed", 7),
    ("ignore_eos", True), ("user", "someone"), ("add_special_tokens", False),
    ("stop", None), ("temperature", 0.5), ("top_p", 0.5), ("temperature", 1e-300),
    ("top_p", 1e-300)]] + [
    {**BASE, "temperature": 0, "top_k": 40}, {**BASE, "temperature": 0, "min_p": 0.5},
    {**BASE, "ignore_eos": True, "min_tokens": 2},
    {**BASE, "stream": True, "stream_options": {"include_usage": False}},
    {**BASE, "stream": True, "stream_options": {"include_obfuscation": True}},
    {**BASE, "stream": True, "stream_options": {"include_obfuscation": False,
                                                "continuous_usage_stats": True}},
] + [{**CHAT, k: v} for k, v in [
    ("tools", []), ("tool_choice", "none"), ("parallel_tool_calls", True), ("functions", []),
    ("function_call", "none"), ("add_generation_prompt", True), ("continue_final_message", False),
    ("chat_template", None), ("chat_template_kwargs", {}), ("documents", None),
    ("reasoning_effort", None), ("modalities", ["text"]), ("logprobs", False),
    ("max_completion_tokens", 3), ("add_special_tokens", True)]]
REFUSED = [({**BASE, k: v}, k) for k, v in [
    ("n", 2), ("n", True), ("best_of", 2), ("use_beam_search", True), ("presence_penalty", 0.5),
    ("frequency_penalty", -0.1), ("repetition_penalty", 1.1), ("top_k", "5"),
    ("logprobs", 0), ("logprobs", 1), ("top_logprobs", 2), ("prompt_logprobs", 1),
    ("echo", True), ("suffix", "x"), ("logit_bias", {"5": 1}), ("stop_token_ids", [2]),
    ("bad_words", ["x"]), ("allowed_token_ids", [1]), ("skip_special_tokens", False),
    ("truncate_prompt_tokens", 4), ("priority", 1), ("response_format", {"type": "json_object"}),
    ("guided_json", {}), ("structured_outputs", {"json": {}}), ("length_penalty", "x"),
    ("tools", [{"type": "function"}]), ("bogus", 1), ("add_special_tokens", "yes"),
    ("temperature", 2.5), ("top_p", 0), ("max_tokens", 0), ("seed", -1)]] + [
    ({**BASE, "temperature": 1, "top_k": 40}, "top_k"),
    ({**BASE, "temperature": 1, "min_p": 0.1}, "min_p"),
    ({**BASE, "min_tokens": 2}, "min_tokens"),
    ({**BASE, "ignore_eos": True, "min_tokens": 3}, "min_tokens"),   # past max_tokens
    ({**BASE, "prompt": "ab", "stop": "x", "include_stop_str_in_output": True},
     "include_stop_str_in_output"),
    ({**BASE, "stream": True, "stream_options": {"bogus": True}}, "stream_options"),
    ({**BASE, "stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options"),
    ({**BASE, "stream_options": {"include_usage": True}}, "stream_options"),   # not streamed
] + [({**CHAT, k: v}, k) for k, v in [
    ("logprobs", True), ("tool_choice", "auto"), ("add_generation_prompt", False),
    ("continue_final_message", True), ("chat_template", "{{ x }}"), ("modalities", ["audio"]),
    ("suffix", None)]] + [
    ({**CHAT, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, "messages"),
    ({**CHAT, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "a", "cache_control": {}}]}]}, "messages"),
    ({**CHAT, "messages": [{"role": "user", "content": []}]}, "messages"),
    ({**CHAT, "messages": [{"role": "user", "content": None}]}, "messages"),
]


@pytest.mark.slow
def test_each_field_accepted_or_refused_through_http(served):
    for body in ACCEPTED:
        status, answer = _post(served, body)
        assert status == 200, (body, answer)
        if not body.get("stream"):
            assert answer["usage"]["completion_tokens"] == body.get(
                "max_completion_tokens", body["max_tokens"])
    for body, param in REFUSED:
        status, answer = _post(served, body)
        assert status == 400 and answer["error"]["param"] == param, (body, answer)
        assert answer["error"]["type"] == "invalid_request_error"
    # include_obfuscation is read and honoured as "no padding": the chunks are the same
    events = _events(_post(served, {**BASE, "stream": True,
                                    "stream_options": {"include_obfuscation": True}})[1])
    assert all("obfuscation" not in e for e in events)
    # add_special_tokens: the BOS the tokenizer adds, or not (completions default: added)
    text = {**BASE, "prompt": "abc"}
    assert _post(served, text)[1]["usage"]["prompt_tokens"] == 4
    assert _post(served, {**text, "add_special_tokens": False})[1]["usage"][
        "prompt_tokens"] == 3
    chat = _post(served, CHAT)[1]["usage"]["prompt_tokens"]   # chat default: not added
    assert _post(served, {**CHAT, "add_special_tokens": True})[1]["usage"][
        "prompt_tokens"] == chat + 1
    assert served.request("GET", "/health")[0] == 200


def _raw(s, text: str, chat=False):
    return s.request("POST", "/v1/chat/completions" if chat else "/v1/completions",
                     text.encode())


@pytest.mark.slow
def test_non_finite_numbers_and_tiny_values_never_stop_the_server(served):
    """Python's json reads NaN, Infinity and 1e400 (infinity): each refused naming its field;
    temperature 1e-300 and top_p 1e-300 are greedy decoding, served; the server serves on."""
    base = json.dumps(BASE)[:-1]
    for field in ("temperature", "top_p", "repetition_penalty", "presence_penalty",
                  "length_penalty", "min_p", "seed", "max_tokens", "top_k"):
        for value in ("NaN", "Infinity", "-Infinity", "1e400"):
            status, answer = _raw(served, f'{base}, "{field}": {value}}}')
            assert status == 400 and answer["error"]["param"] == field, (field, value, answer)
    status, answer = _raw(served, '{"model": "tiny-llama", "prompt": [1, NaN], "max_tokens": 2}')
    assert status == 400 and answer["error"]["param"] == "prompt"
    status, answer = _raw(served, f'{base}, "stream": true, "stream_options": '
                                  '{"include_usage": true, "x": Infinity}}')
    assert status == 400 and answer["error"]["param"] == "stream_options"
    want = _greedy(PROMPT, 6)
    for sampling in ({"temperature": 1e-300}, {"temperature": 5e-324},
                     {"temperature": 1.0, "top_p": 1e-300}, {"temperature": 1e-300, "seed": 3}):
        status, answer = _post(served, {"model": MODEL, "prompt": PROMPT, "max_tokens": 6,
                                        **sampling})
        assert status == 200 and answer["choices"][0]["token_ids"] == want, (sampling, answer)
    assert served.request("GET", "/health")[0] == 200
    status, answer = _post(served, {"model": MODEL, "prompt": PROMPT, "max_tokens": 6})
    assert status == 200 and answer["choices"][0]["token_ids"] == want


@pytest.mark.slow
def test_no_plain_text_500_reaches_a_client(served):
    deep = '{"model": "tiny-llama", "prompt": ' + "[" * 100_000 + "]" * 100_000 + "}"
    cases = [(deep, False, None), ('{"model": "tiny-llama", "prompt": "a\\ud800b"}', False,
                                   "prompt"),
             ('{"model": "tiny-llama", "messages": [{"role": "user", "content": "\\udfff"}]}',
              True, "messages"),
             (('{"model": "tiny-llama", "messages": [{"role": "user", "content": [{"type": '
               '"text", "text": "x\\ud83d"}]}]}'), True, "messages"),
             ('{"model": "tiny-llama", "prompt": [1], "stop": ["\\ud800"]}', False, "stop"),
             ('{"model": "tiny-llama", "prompt": [1], "\\ud800": 1}', False, None),
             ("{not json", False, None), ("[1, 2]", False, None), ('"text"', True, None),
             ("", False, None)]
    for text, chat, param in cases:
        status, answer = _raw(served, text, chat)
        assert status == 400, (text[:80], answer)
        assert isinstance(answer, dict) and set(answer["error"]) == {
            "message", "type", "param", "code"} and answer["error"]["param"] == param, answer
    status, answer = served.request("POST", "/v1/completions", b"\xff\xfe{")   # not UTF-8
    assert status == 400 and "error" in answer
    assert _post(served, BASE)[0] == 200   # served on


# -- the API key ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_api_key_guards_every_route_but_health(tmp_path):
    """serve.api_key wins over SARATHI_LAB_API_KEY; every route but /health answers 401 (an
    OpenAI error object) without it or with another; the key is in no file of the run
    directory nor its name; the stopped server prints no NaN."""
    key, other = "sk-setting-5d1f", "sk-environment-9a2b"
    s = Served(tmp_path, f"serve.api_key={key}", env={command.API_KEY_ENV: other})
    try:
        routes = [("GET", "/v1/models", None), ("POST", "/v1/completions", BASE),
                  ("POST", "/v1/chat/completions", CHAT), ("GET", "/v1/nowhere", None),
                  ("POST", "/v1/models", None)]
        for method, path, body in routes:
            for headers in ({}, {"Authorization": f"Bearer {other}"},
                            {"Authorization": key}, {"Authorization": f"Basic {key}"}):
                status, answer = s.request(method, path, body, headers=headers)
                assert status == 401, (path, headers, answer)
                assert answer["error"]["code"] == "invalid_api_key"
                assert answer["error"]["type"] == "invalid_request_error"
        good = {"Authorization": f"Bearer {key}"}
        assert s.request("GET", "/v1/models", headers=good)[0] == 200
        assert s.request("POST", "/v1/completions", BASE, headers=good)[0] == 200
        assert s.request("GET", "/v1/nowhere", headers=good)[0] == 404
        assert s.request("GET", "/health")[0] == 200   # a probe needs no key
        assert any("asks for the API key (serve.api_key)" in line for line in s.out)
        run_dir = s.stop()
    finally:
        s.kill()
    assert key not in str(run_dir)
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert key.encode() not in f.read_bytes(), f
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["served"]["api_key"] is True
    assert summary["served"]["http_status"] == {"200": 1, "401": 8}
    assert "nan" not in s.printed.lower(), s.printed


def test_api_key_precedence_and_the_exposure_warning(monkeypatch):
    monkeypatch.delenv(command.API_KEY_ENV, raising=False)
    assert command.api_key(ServeConfig()) == (None, "")
    monkeypatch.setenv(command.API_KEY_ENV, " env-key ")
    assert command.api_key(ServeConfig()) == ("env-key", command.API_KEY_ENV)
    assert command.api_key(ServeConfig(api_key="set")) == ("set", "serve.api_key")
    with pytest.raises(SystemExit, match="serve.api_key"):
        command.api_key(ServeConfig(api_key=" "))
    for host in ("127.0.0.1", "127.8.0.1", "::1", "localhost"):
        assert command.exposure_warning(host, None) is None, host
    for host in ("0.0.0.0", "::", "10.1.2.3", "myhost.example"):
        w = command.exposure_warning(host, None)
        assert w and f"serve.host={host}" in w and command.API_KEY_ENV in w
        assert command.exposure_warning(host, "k") is None


# -- in process -------------------------------------------------------------------------------------
def test_help_is_the_servers_own(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["sarathi-lab-serve", "--help"])
    command.main()
    out = capsys.readouterr().out
    assert out.startswith("usage: sarathi-lab-serve")
    for f in ("serve.host", "serve.port", "serve.max_queue", "serve.model_name",
              "serve.tokenizer", "serve.api_key", command.API_KEY_ENV, "examples:"):
        assert f in out, f
    assert "Powered by Hydra" not in out and "== Config ==" not in out


def test_a_served_session_offers_no_nan_output_rate():
    import pandas as pd

    from sarathi_lab.run.summary_text import _offered_line
    df = pd.DataFrame({"arrival_time": [0.0, 1.0, 2.0], "num_prompt_tokens": [10, 20, 30],
                       "target_output_tokens": [math.nan] * 3})
    off = offered_load(df)
    # 3 arrivals over 2 s: 1 req/s; prompts 20 on average
    assert off["requests_per_s"] == 1.0 and off["prompt_tokens_per_s"] == 20.0
    assert off["output_tokens_per_s"] is None
    line = _offered_line({"offered_load": off})
    assert "nan" not in line and line.endswith("20 prompt tok/s (output lengths not known in "
                                               "advance)")
    df["target_output_tokens"] = [4.0, math.nan, 8.0]   # known for some: their mean
    assert offered_load(df)["output_tokens_per_s"] == 6.0


def test_sampling_is_greedy_at_any_tiny_temperature_and_unchanged_elsewhere():
    torch.manual_seed(0)
    logits = torch.randn(4, 512) * 8
    top = logits.argmax(-1).tolist()
    for t in (1e-3 / 2, 1e-30, 1e-46, 1e-300, 5e-324):
        p = probabilities(logits, t)
        assert torch.isfinite(p).all() and p.argmax(-1).tolist() == top, t
        assert [draw(p[i], 1.0, 7) for i in range(4)] == top
    for t in (1e-3, 0.7, 2.0):   # the same bits as before
        assert torch.equal(probabilities(logits, t), torch.softmax(logits / t, dim=-1))
    p = probabilities(logits, 1.0)
    # a nucleus smaller than float32 can say still holds the top token
    assert [draw(p[i], 1e-300, 7) for i in range(4)] == top
    assert [draw(p[i], 5e-324, 7) for i in range(4)] == top


def test_fields_read_in_process():
    """The tests of "changes nothing" that read the rest of the request."""
    def ok(body, chat=False, tok=None):
        return parse_generation({"model": "m", **body}, chat, tok, 512, (0.0, 1.0))

    def refused(body, chat=False):
        with pytest.raises(ApiError) as e:
            ok(body, chat)
        return e.value.param
    p = [1, 2]
    g = ok({"prompt": p, "stream": True, "stream_options": {
        "include_usage": True, "continuous_usage_stats": True, "include_obfuscation": True}})
    assert g.include_usage and g.continuous_usage
    # vLLM: continuous usage only with include_usage
    assert not ok({"prompt": p, "stream": True,
                   "stream_options": {"continuous_usage_stats": True}}).continuous_usage
    assert ok({"prompt": p, "top_k": 9}).temperature == 0
    assert refused({"prompt": p, "top_k": 9, "temperature": 0.1}) == "top_k"
    assert refused({"prompt": p, "top_k": -2}) == "top_k"
    assert ok({"prompt": p, "min_tokens": 16, "ignore_eos": True}).max_tokens == 16
    assert refused({"prompt": p, "min_tokens": 17, "ignore_eos": True}) == "min_tokens"
    assert ok({"prompt": p, "skip_special_tokens": False}).prompt_ids == p   # no tokenizer
    for value in (math.nan, math.inf, -math.inf):
        assert refused({"prompt": p, "temperature": value}) == "temperature"
        assert refused({"prompt": p, "top_p": value}) == "top_p"
        assert refused({"prompt": p, "length_penalty": value}) == "length_penalty"
    assert refused({"prompt": p, "user": "\ud800"}) == "user"


def test_a_bug_in_a_route_is_an_error_object_not_a_plain_text_500():
    """The error middleware's last resort: any exception a handler raises is a 500 OpenAI error
    object (aiohttp's own answer would be a plain-text page)."""
    import asyncio
    from types import SimpleNamespace

    from aiohttp.test_utils import TestClient, TestServer

    from sarathi_lab.serve.app import Server
    info = {"max_model_len": 64, "vocab_size": 512, "defaults": [0.0, 1.0],
            "per_request_sampling": True}   # an engine process's (`EngineClient.info`)
    server = Server(SimpleNamespace(info=info), MODEL, 4)

    async def broken(request):
        raise KeyError("a bug")
    server.models = broken

    async def go():
        async with TestClient(TestServer(server.app())) as client:
            resp = await client.get("/v1/models")
            return resp.status, resp.headers["Content-Type"], await resp.json()
    status, kind, body = asyncio.run(go())
    assert status == 500 and kind.startswith("application/json")
    assert body["error"]["code"] == "internal_error" and "KeyError" in body["error"]["message"]
