"""One request: a streamed POST to the endpoint (/v1/completions or /v1/chat/completions), every
chunk's arrival timed.

Tokens per chunk. A chunk whose choice carries `token_ids` (`sarathi-lab-serve`, vLLM with
`return_token_ids`) brings that many tokens, each timed at the chunk's arrival. Otherwise a
chunk whose choice carries text (`text`, or the chat `delta.content`) brings one token, and so
does one whose text is empty while the request is still running (a partial UTF-8 character held
back, a special token with no text): every server here streams one token per chunk. A chat
chunk that only announces the role, and a closing chunk with empty text and a finish reason,
bring none, unless the server's own count (`usage.completion_tokens`) says one token more
arrived than was timed: then the closing chunk is the last token (an EOS whose text is empty).
The output length is the server's count when it sends one, else the timed tokens.

A stream ends as finished at `data: [DONE]`, or when it closes after a finish reason or a
usage record arrived (`transformers serve` sends no `[DONE]`). An event that is not what the
API describes (not JSON, not an object, `choices` not a list of objects, a line over
MAX_LINE_BYTES) fails this request with `error` saying why; the replay goes on.

Nothing waits forever: `timeout` bounds the whole request, `stall_timeout` the wait for each
next piece of the response (the headers, then every chunk); either one passing ends the
request as a timeout with the tokens it had. An HTTP error status ends it as an error (429: as
rejected), with the server's message."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

MAX_LINE_BYTES = 16 << 20   # one event line; a longer one fails the request (not the memory)


@dataclass
class Outcome:
    """What the client saw of one request; times in seconds on the replay's clock."""
    status: str = "finished"          # finished | rejected (HTTP 429) | error | timeout
    token_times: list = field(default_factory=list)   # arrival of every token
    finish_time: float | None = None  # when the stream ended ([DONE], or closed once complete)
    usage_tokens: int | None = None   # usage.completion_tokens, if the server sent it
    prompt_tokens: int | None = None  # usage.prompt_tokens: the prompt as the server counted it
    finish_reason: str | None = None  # the choice's finish_reason ("length", "stop", ...)
    http_status: int | None = None
    error: str | None = None          # why it failed, as the server or the client said
    num_chunks: int = 0               # the chunks that carried tokens

    @property
    def num_output_tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else len(self.token_times)


class Malformed(ValueError):
    """An event the API does not describe."""


def _message(text: str) -> str:
    """An OpenAI-style error body's message (FastAPI's `detail`), else the body as it is."""
    try:
        obj = json.loads(text)
    except ValueError:
        return text.strip()
    if not isinstance(obj, dict):
        return str(obj)
    err = obj.get("error", obj.get("detail"))
    if isinstance(err, dict) and "message" in err:
        return str(err["message"])
    return str(err if err is not None else obj)


def _status_of(code: int) -> str:
    return "rejected" if code == 429 else "error"


def _count(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Malformed(f"{what} is {value!r}, not a count")
    return value


def read_event(obj, chat: bool) -> tuple[int | None, str | None, dict | None]:
    """(tokens the chunk brings, None for "only if usage says so"; its finish reason; its
    usage) of one parsed event; Malformed if it is not a completion chunk."""
    if not isinstance(obj, dict):
        raise Malformed(f"an event that is not a JSON object: {str(obj)[:80]}")
    choices = obj.get("choices", [])
    usage = obj.get("usage")
    if choices is None:
        choices = []
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise Malformed(f"`choices` is not a list of objects: {str(choices)[:80]}")
    if usage is not None and not isinstance(usage, dict):
        raise Malformed(f"`usage` is not an object: {str(usage)[:80]}")
    if not choices:
        return 0, None, usage
    c = choices[0]
    reason = c.get("finish_reason")
    if reason is not None and not isinstance(reason, str):
        raise Malformed(f"`finish_reason` is {reason!r}")
    ids = c.get("token_ids")
    if ids is not None:
        if not isinstance(ids, list):
            raise Malformed(f"`token_ids` is not a list: {str(ids)[:80]}")
        return len(ids), reason, usage
    if chat:
        delta = c.get("delta", {})
        if not isinstance(delta, dict):
            raise Malformed(f"`delta` is not an object: {str(delta)[:80]}")
        text, role_only = delta.get("content"), "role" in delta and not delta.get("content")
    else:
        text, role_only = c.get("text"), False
    if text is not None and not isinstance(text, str):
        raise Malformed(f"the chunk's text is {str(text)[:80]!r}, not a string")
    if text:
        return 1, reason, usage
    if role_only or text is None and not chat:
        return 0, reason, usage
    # empty text: a token while the request runs, the closing marker once it ends
    return (None if reason else 1), reason, usage


async def _lines(content):
    """The response's lines, each at most MAX_LINE_BYTES (aiohttp's own reader stops at 128
    KiB with an error that would not say which request)."""
    parts, size = [], 0   # the line so far, in pieces (joined once: no quadratic copying)
    async for piece in content.iter_any():
        *whole, rest = piece.split(b"\n")
        for i, line in enumerate(whole):
            yield b"".join(parts) + line if i == 0 and parts else line
            if i == 0:
                parts, size = [], 0
        if rest:
            parts.append(rest)
            size += len(rest)
            if size > MAX_LINE_BYTES:
                raise Malformed(f"an event line over {MAX_LINE_BYTES} bytes")
    if parts:
        yield b"".join(parts)


async def send(session, url: str, body: dict, headers: dict, clock, *, timeout: float,
               stall_timeout: float, chat: bool = False) -> Outcome:
    """POST `body` to `url` and read its event stream; `clock()` is the replay's clock."""
    import aiohttp
    out = Outcome()
    limits = aiohttp.ClientTimeout(total=timeout, sock_read=stall_timeout)
    done = complete = False
    pending = None   # when a closing chunk with empty text came
    start = clock()
    try:
        async with session.post(url, json=body, headers=headers, timeout=limits) as resp:
            out.http_status = resp.status
            if resp.status != 200:
                out.status = _status_of(resp.status)
                out.error = f"HTTP {resp.status}: {_message(await resp.text())}"
                return out
            async for line in _lines(resp.content):
                now = clock()
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue   # blank separators, comments (": ping"), event names
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    out.finish_time = now
                    break
                try:
                    obj = json.loads(data)
                except ValueError:
                    raise Malformed(f"an event that is not JSON: {data[:80]!r}") from None
                if isinstance(obj, dict) and "error" in obj:   # the server's own, in the stream
                    out.status, out.error = "error", f"in stream: {_message(data.decode())}"
                    return out
                n, reason, usage = read_event(obj, chat)
                if n is None:
                    pending = now
                elif n:
                    out.token_times += [now] * n
                    out.num_chunks += 1
                if reason:
                    out.finish_reason, complete = reason, True
                if usage is not None:
                    # the closing usage record (not a running count on every chunk)
                    complete = complete or not obj.get("choices")
                    if usage.get("completion_tokens") is not None:
                        out.usage_tokens = _count(usage["completion_tokens"],
                                                  "usage.completion_tokens")
                    if usage.get("prompt_tokens") is not None:
                        out.prompt_tokens = _count(usage["prompt_tokens"], "usage.prompt_tokens")
            if not done and complete:   # closed after the last chunk, without [DONE]
                done, out.finish_time = True, clock()
    except asyncio.TimeoutError:
        # aiohttp raises both limits as TimeoutError; which one passed, from the clock
        out.status = "timeout"
        out.error = (f"the request took over {timeout:g} s (timeout)"
                     if clock() - start >= 0.999 * timeout else
                     f"no data for {stall_timeout:g} s (stall_timeout)")
        return out
    except Malformed as e:
        out.status, out.error = "error", f"malformed event: {e}"
        return out
    except (aiohttp.ClientError, ValueError) as e:   # connection lost, a body not text
        out.status, out.error = "error", f"{type(e).__name__}: {e}"
        return out
    if not done:
        out.status, out.error = "error", ("the stream ended before `data: [DONE]`, with no "
                                          "finish reason or usage")
        return out
    if pending is not None and out.usage_tokens == len(out.token_times) + 1:
        out.token_times.append(pending)   # the closing chunk was the last token
        out.num_chunks += 1
    if out.num_output_tokens and not out.token_times:
        out.status, out.error = "error", (f"the server counted {out.num_output_tokens} output "
                                          "tokens but streamed none")
    return out


def replay_clock():
    """A clock reading 0 now, in seconds (monotonic)."""
    t0 = time.perf_counter()
    return lambda: time.perf_counter() - t0
