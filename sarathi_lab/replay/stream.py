"""One request: a streamed POST to the endpoint's /v1/completions, every chunk's arrival timed.

A chunk (one server-sent event `data: {...}`) whose choice carries text is one token: vLLM,
SGLang, TGI and `sarathi-lab-serve` stream a token per chunk. The token count the server reports
in its last chunk (`usage.completion_tokens`, asked for with `stream_options.include_usage`) is
the request's output length when given; otherwise the number of token chunks is.

Nothing waits forever: `timeout` bounds the whole request, `stall_timeout` the wait for each
next piece of the response (the headers, then every chunk); either one passing ends the
request as a timeout with the tokens it had. An HTTP error status ends it as an error (429: as
rejected), with the server's message."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field


@dataclass
class Outcome:
    """What the client saw of one request; times in seconds on the replay's clock."""
    status: str = "finished"          # finished | rejected (HTTP 429) | error | timeout
    token_times: list = field(default_factory=list)   # arrival of every token chunk
    finish_time: float | None = None  # when the stream ended (data: [DONE])
    usage_tokens: int | None = None   # usage.completion_tokens, if the server sent it
    finish_reason: str | None = None  # the choice's finish_reason ("length", "stop", ...)
    http_status: int | None = None
    error: str | None = None          # why it failed, as the server or the client said

    @property
    def num_output_tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else len(self.token_times)


def _message(text: str) -> str:
    """An OpenAI-style error body's message, else the body as it is."""
    try:
        obj = json.loads(text)
    except ValueError:
        return text.strip()
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict) and "message" in err:
        return str(err["message"])
    return str(err if err is not None else obj)


def _status_of(code: int) -> str:
    return "rejected" if code == 429 else "error"


async def send(session, url: str, body: dict, headers: dict, clock, *, timeout: float,
               stall_timeout: float) -> Outcome:
    """POST `body` to `url` and read its event stream; `clock()` is the replay's clock."""
    import aiohttp
    out = Outcome()
    limits = aiohttp.ClientTimeout(total=timeout, sock_read=stall_timeout)
    done = False
    start = clock()
    try:
        async with session.post(url, json=body, headers=headers, timeout=limits) as resp:
            out.http_status = resp.status
            if resp.status != 200:
                out.status = _status_of(resp.status)
                out.error = f"HTTP {resp.status}: {_message(await resp.text())}"
                return out
            async for line in resp.content:
                now = clock()
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue   # blank separators, comments (": ping"), event names
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    out.finish_time = now
                    break
                obj = json.loads(data)
                if "error" in obj:   # an error the server reports inside the stream
                    out.status, out.error = "error", f"in stream: {_message(data.decode())}"
                    return out
                choices = obj.get("choices") or []
                if choices:
                    if choices[0].get("text"):
                        out.token_times.append(now)
                    if choices[0].get("finish_reason"):
                        out.finish_reason = choices[0]["finish_reason"]
                usage = obj.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    out.usage_tokens = int(usage["completion_tokens"])
    except asyncio.TimeoutError:
        # aiohttp raises both limits as TimeoutError; which one passed, from the clock
        out.status = "timeout"
        out.error = (f"the request took over {timeout:g} s (timeout)"
                     if clock() - start >= 0.999 * timeout else
                     f"no data for {stall_timeout:g} s (stall_timeout)")
        return out
    except (aiohttp.ClientError, ValueError) as e:   # connection lost, a chunk that is not JSON
        out.status, out.error = "error", f"{type(e).__name__}: {e}"
        return out
    if not done:
        out.status, out.error = "error", "the stream ended before `data: [DONE]`"
    return out


def replay_clock():
    """A clock reading 0 now, in seconds (monotonic)."""
    t0 = time.perf_counter()
    return lambda: time.perf_counter() - t0
