"""The OpenAI API's request bodies read into one `Generation`, its errors, and its response
objects (completions and chat completions, whole and as stream chunks).

A body is read strictly: a number that is not finite (Python's json reads NaN and Infinity), a
string that is not Unicode text (a lone surrogate), a field of the wrong type, a value out of
range or a field it does not know is refused with a 400 naming the field (`param`), never
ignored. The fields of OpenAI's and vLLM's API this server does not run are accepted where they
change nothing and refused where they would (`serve.extensions`). Requests are plain dicts from
`json.loads`; nothing here touches the engine.
"""
from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field

from sarathi_lab.serve import extensions


class ApiError(Exception):
    """An OpenAI-style error: HTTP `status` and the body
    {"error": {"message", "type", "param", "code"}}."""

    TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error",
             413: "invalid_request_error", 429: "rate_limit_error", 503: "server_error",
             500: "server_error"}

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.code}}


@dataclass
class Generation:
    """One request as the worker runs it."""
    prompt_ids: list[int]
    max_tokens: int | None          # None: until max_model_len (chat's default)
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False  # usage in every chunk (vLLM's continuous_usage_stats)
    chat: bool = False
    model: str = ""


_COMMON = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream",
           "stream_options", "ignore_eos", "user", "add_special_tokens"}
COMPLETION_FIELDS = _COMMON | {"prompt"} | extensions.names(chat=False)
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens"} | extensions.names(chat=True)
STREAM_OPTIONS = ("include_usage", "continuous_usage_stats", "include_obfuscation")


def check_values(body) -> None:
    """A 400 naming the place of the first number that is not finite (NaN, Infinity, or a
    literal too large for a float, which json reads as infinity) or the first string that is
    not Unicode text (a lone surrogate, which no tokenizer and no UTF-8 writer takes). Walked
    without recursion: json.loads has already bounded the depth, not the width."""
    todo = [("", body)]
    while todo:
        where, v = todo.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise ApiError(400, f"{where or 'the body'}={v!r}: must be a finite number",
                           _param(where))
        if isinstance(v, str):
            _text(v, where)
        elif isinstance(v, dict):
            for k, x in v.items():
                _text(k, f"{where}.{k}" if where else "a field name")
                todo.append((f"{where}.{k}" if where else k, x))
        elif isinstance(v, list):
            todo.extend((f"{where}[{i}]", x) for i, x in enumerate(v))


def _text(s: str, where: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(400, f"{where or 'the body'}: not Unicode text ({e.reason} at "
                       f"character {e.start}: a lone surrogate)", _param(where)) from None


def _param(where: str) -> str | None:
    """The top-level field of a place (`messages[0].content` -> messages)."""
    if not where or where == "a field name":
        return None
    return where.replace("[", ".").split(".")[0]


def _number(body: dict, key: str, default, lo: float, hi: float, *, lo_open=False):
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ApiError(400, f"{key}={v!r}: must be a number", key)
    if not math.isfinite(v):
        raise ApiError(400, f"{key}={v!r}: must be a finite number", key)
    if v < lo or v > hi or (lo_open and v == lo):
        side = "(" if lo_open else "["
        raise ApiError(400, f"{key}={v!r}: must be in {side}{lo}, {hi}]", key)
    return float(v)


def _int(body: dict, key: str, lo: int):
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(400, f"{key}={v!r}: must be an integer", key)
    if v < lo:
        raise ApiError(400, f"{key}={v}: must be >= {lo}", key)
    return v


def _bool(body: dict, key: str, within: str = "") -> bool:
    v = body.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ApiError(400, f"{within}{key}={v!r}: must be true or false",
                       (within + key).split(".")[0])
    return v


def parse_generation(body, chat: bool, tokenizer, vocab_size: int,
                     defaults: tuple[float, float] = (1.0, 1.0)) -> Generation:
    """A completions (`chat` False) or chat completions body read into a `Generation`; an
    ApiError(400) naming the field for anything it cannot run. `tokenizer`: None when the
    model has none (then only token-id prompts are taken). `defaults`: (temperature, top_p)
    of a body that sets none (the server's: executor.temperature and executor.top_p)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    check_values(body)
    known = CHAT_FIELDS if chat else COMPLETION_FIELDS
    unknown = sorted(set(body) - known)
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0]!r}: this server reads "
                       f"{', '.join(sorted(known))}", unknown[0])
    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    if opts is None:
        opts = {}
    elif not stream:
        raise ApiError(400, "stream_options: only with stream=true", "stream_options")
    if not isinstance(opts, dict) or set(opts) - set(STREAM_OPTIONS):
        raise ApiError(400, f"stream_options={opts!r}: an object with "
                       f"{', '.join(STREAM_OPTIONS)}", "stream_options")
    for key in STREAM_OPTIONS:   # include_obfuscation: read and not honoured (serving.md)
        _bool(opts, key, "stream_options.")
    include_usage = _bool(opts, "include_usage")
    add_special = body.get("add_special_tokens")
    if add_special is not None and not isinstance(add_special, bool):
        raise ApiError(400, f"add_special_tokens={add_special!r}: must be true or false",
                       "add_special_tokens")
    if chat:
        prompt = _chat_prompt(body.get("messages"), tokenizer, bool(add_special))
        max_tokens = _int(body, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = _int(body, "max_tokens", 1)
    else:
        prompt = _completion_prompt(body.get("prompt"), tokenizer, add_special is not False)
        max_tokens = _int(body, "max_tokens", 1)
        if "max_tokens" not in body:
            max_tokens = 16   # the completions API's default
    bad = next((t for t in prompt if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ApiError(400, f"prompt: token id {bad} is outside the vocabulary of {vocab_size}",
                       "messages" if chat else "prompt")
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) \
            or len(stop) > 4:
        raise ApiError(400, f"stop={body.get('stop')!r}: must be a non-empty string or a list "
                       "of up to 4", "stop")
    if stop and tokenizer is None:
        raise ApiError(400, "stop: the model has no tokenizer, so its output has no text to "
                       "find a stop string in (set serve.tokenizer)", "stop")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, f"model={model!r}: must be a string", "model")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise ApiError(400, f"user={body['user']!r}: must be a string", "user")
    g = Generation(prompt_ids=prompt, max_tokens=max_tokens,
                   temperature=_number(body, "temperature", defaults[0], 0.0, 2.0),
                   top_p=_number(body, "top_p", defaults[1], 0.0, 1.0, lo_open=True),
                   seed=_int(body, "seed", 0), stop=stop, ignore_eos=_bool(body, "ignore_eos"),
                   stream=stream, include_usage=include_usage,
                   continuous_usage=include_usage and _bool(opts, "continuous_usage_stats"),
                   chat=chat, model=model)
    ctx = extensions.Context(greedy=g.temperature == 0, ignore_eos=g.ignore_eos,
                             stops=bool(stop), tokenizer=tokenizer is not None,
                             vocab_size=vocab_size, max_tokens=max_tokens)
    refused = extensions.check(body, chat, ctx)
    if refused:
        raise ApiError(400, refused[1], refused[0])
    return g


def _completion_prompt(prompt, tokenizer, add_special: bool) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]   # a batch of one
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return list(prompt)
    if isinstance(prompt, str) and prompt:
        if tokenizer is None:
            raise ApiError(400, "prompt: the model has no tokenizer (random weights, no "
                           "serve.tokenizer): send the prompt as a list of token ids", "prompt")
        return list(tokenizer.encode(prompt, add_special_tokens=add_special))
    raise ApiError(400, f"prompt: must be a non-empty string or list of token ids (one prompt: "
                   f"n>1 batches are not supported), not {type(prompt).__name__}", "prompt")


def _content(m: dict, i: int) -> str:
    """A message's text: its content as a string, or its text parts joined by newlines (as
    vLLM joins them for a template that takes a string); any other part is refused."""
    c = m.get("content")
    if isinstance(c, str):
        return c
    if not isinstance(c, list) or not c:
        raise ApiError(400, f"messages[{i}].content: must be a string or a non-empty list of "
                       f"text parts, not {type(c).__name__}", "messages")
    texts = []
    for j, part in enumerate(c):
        where = f"messages[{i}].content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise ApiError(400, f"{where}: a part of type {kind!r}; this server reads text "
                           "parts only ({'type': 'text', 'text': ...})", "messages")
        if set(part) != {"type", "text"} or not isinstance(part["text"], str):
            raise ApiError(400, f"{where}: a text part is {{'type': 'text', 'text': <string>}}, "
                           f"not {sorted(part)}", "messages")
        texts.append(part["text"])
    return "\n".join(texts)


def _chat_prompt(messages, tokenizer, add_special: bool) -> list[int]:
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise ApiError(400, "messages: must be a non-empty list of {role, content} objects",
                       "messages")
    messages = [{**m, "content": _content(m, i)} for i, m in enumerate(messages)]
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ApiError(400, "messages: the model has no tokenizer with a chat template "
                       "(serve.tokenizer); use /v1/completions with token ids", "messages")
    try:
        if add_special:   # vLLM's add_special_tokens: the template's text encoded with them
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                 tokenize=False)
            return list(tokenizer.encode(text, add_special_tokens=True))
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    except Exception as e:   # a template that rejects these roles raises its own error
        raise ApiError(400, f"messages: the chat template refused them ({e})",
                       "messages") from None
    if not isinstance(ids, list):   # transformers >= 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


# -- responses -------------------------------------------------------------------------------------
FINISH = {"eos": "stop", "stop": "stop", "stop_string": "stop", "max_tokens": "length",
          "max_model_len": "length", "length": "length"}


def new_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def choice(g: Generation, text: str, token_ids: list[int], finish: str | None,
           first: bool, whole: bool) -> dict:
    """One choice: a chunk's (`whole` False: a delta) or a whole response's. `token_ids`: the
    chunk's tokens (an extension, as vLLM's `return_token_ids`)."""
    out = {"index": 0}
    if g.chat:
        if whole:
            out["message"] = {"role": "assistant", "content": text}
        else:
            out["delta"] = ({"role": "assistant"} if first else {}) | (
                {"content": text} if text or not finish else {})
    else:
        out["text"] = text
        out["logprobs"] = None
    out["token_ids"] = token_ids
    out["finish_reason"] = FINISH.get(finish, finish)
    return out


def response(g: Generation, rid: str, choices: list[dict], whole: bool,
             use: dict | None = None) -> dict:
    kind = ("chat.completion" if whole else "chat.completion.chunk") if g.chat else \
        "text_completion"
    out = {"id": rid, "object": kind, "created": int(time.time()), "model": g.model,
           "choices": choices}
    if use is not None:
        out["usage"] = use
    return out
