"""The HTTP process's side of the engine process (`engine_process`): handlers `submit` a
request with a `Channel` and read what comes back on it; the engine's messages are read on the
event loop itself (`loop.add_reader` on the pipe: no thread shares the loop's interpreter).

A channel gets ("tokens", [ids], finish_reason) events, the finish reason None until the
request ends (then it comes with the step's last tokens, or with no tokens when the step gave
the request none), or ("error", ApiError).
If the engine process dies (its pipe closes before it said ``stopped``), every request in
flight gets an error, `error` says what happened, and `gone` is set: the server then stops.
"""
from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field

from sarathi_lab.serve.protocol import ApiError, Generation

STATS = ("waiting", "running", "swapped", "kv_blocks_used", "kv_blocks_total", "requests",
         "iterations", "preemptions")


@dataclass
class Channel:
    """What the engine tells one handler, on an asyncio queue of the handler's loop."""
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)

    def post(self, event: tuple) -> None:   # on the loop
        self.queue.put_nowait(event)


class EngineFailed(RuntimeError):
    """The engine process could not start: its reason."""


class EngineClient:
    """`proc` and `link` from `engine_process.start`. `metrics`: a `serve.metrics.Metrics` told
    of tokens, first tokens, ends and errors (or None)."""

    def __init__(self, proc, link, metrics=None):
        self.proc, self.link, self.metrics = proc, link, metrics
        self.info: dict = {}
        self.channels: dict[int, Channel] = {}
        self.stats: dict = {}
        self.error: str | None = None   # why the engine is gone, if it went by itself
        self.result: tuple | None = None   # (text, error) of its ``stopped``
        self.gone: asyncio.Event | None = None      # the pipe closed
        self.halted: asyncio.Event | None = None    # the engine's loop is over
        self._ids = 0
        self._loop = None

    # -- before serving ------------------------------------------------------------------------
    def wait_ready(self) -> dict:
        """Block until the engine is built: its info; EngineFailed with its reason otherwise
        (never a hang: a process that dies without a word is noticed within a second)."""
        link = self.link
        while True:
            if link.poll(1.0):
                try:
                    msg = link.recv()
                except (EOFError, OSError):
                    raise EngineFailed(self._exit_words()) from None
                if msg[0] == "failed":
                    self.proc.join(10)
                    raise EngineFailed(msg[1])
                self.info = msg[1]
                self.stats = {"kv_blocks_total": self.info["kv_blocks_total"]}
                return self.info
            if not self.proc.is_alive():
                raise EngineFailed(self._exit_words())

    def _exit_words(self) -> str:
        self.proc.join(5)
        return f"the engine process exited with code {self.proc.exitcode} (see its error above)"

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.gone, self.halted = asyncio.Event(), asyncio.Event()
        loop.add_reader(self.link.fileno(), self._readable)

    # -- the handlers' side --------------------------------------------------------------------
    def submit(self, gen: Generation, channel: Channel) -> int:
        """Send `gen` to the engine; returns its request id."""
        self._ids += 1
        rid = self._ids
        if self.halted.is_set():
            channel.post(("error", ApiError(503, "the server is stopping",
                                            code="server_stopping")))
            return rid
        self.channels[rid] = channel
        self.link.send(["add", rid, asdict(gen)])
        return rid

    def abort(self, rid: int) -> None:
        if self.channels.pop(rid, None) is not None:
            self._send(["abort", rid])

    def quit(self) -> None:
        """The server never served: the engine process ends writing nothing."""
        self._send(["quit"])

    def stop(self) -> None:
        """In-flight requests end now (aborted, their handlers told); the engine says
        ``halted``."""
        self._send(["stop"])

    def finish(self, served: dict) -> None:
        """After ``halted``: the engine writes the run directory with `served` (the HTTP
        side's record) and says ``stopped``."""
        self._send(["finish", served])

    def _send(self, msg) -> None:
        if not self.gone.is_set():
            try:
                self.link.send(msg)
            except OSError:   # it is gone already: the reader sees it
                pass

    # -- the engine's messages, on the loop --------------------------------------------------------
    def _readable(self) -> None:
        link = self.link
        for _ in range(64):   # then the loop's other callbacks run; it calls again if more
            try:
                if not link.poll(0):
                    return
                msg = link.recv()
            except (EOFError, OSError):
                self._ended()
                return
            if msg[0] == "step":
                self._step(*msg[1:])
            elif msg[0] == "halted":
                self.error = msg[1]
                self.halted.set()
            elif msg[0] == "stopped":
                self.result = (msg[1], msg[2])
                self.error = msg[2]

    def _step(self, clock, tokens, firsts, ends, errors, stats) -> None:
        ch, m = self.channels, self.metrics
        # a request's end comes with its last tokens (one event, so one chunk for the client:
        # a separate finish chunk would add an inter-token gap to a client that times chunks)
        reasons = {rid: reason for rid, reason, _ in ends}
        for rid, ids in tokens:
            reason = reasons.get(rid)
            c = ch.get(rid) if reason is None else ch.pop(rid, None)
            if c is not None:
                c.post(("tokens", ids, reason))
            if m is not None:
                m.tokens(rid, clock, len(ids))
        if m is not None:
            for rid, ttft, n_prompt in firsts:
                m.first(rid, ttft, n_prompt)
        for rid, reason, e2e in ends:
            c = ch.pop(rid, None)   # still here: no tokens this step
            if c is not None:
                c.post(("tokens", [], reason))
            if m is not None:
                m.end(rid, reason, e2e)
        for rid, status, message, code in errors:
            c = ch.pop(rid, None)
            if c is not None:
                c.post(("error", ApiError(status, message, code=code)))
            if m is not None:
                m.failed(rid, code)
        self.stats = dict(zip(STATS, stats))

    def _ended(self) -> None:
        """The pipe closed: after ``stopped``, the end; before it, the engine process died.
        Requests still waiting for an answer get one either way."""
        self._loop.remove_reader(self.link.fileno())
        if self.result is None:
            self.proc.join(5)
            self.error = (f"the engine process died (exit code {self.proc.exitcode}); "
                          "the requests in flight are lost")
            api = ApiError(500, self.error, code="engine_error")
        else:
            self.error = self.result[1]
            api = ApiError(503, "the server is stopping", code="server_stopping")
        for c in self.channels.values():
            c.post(("error", api))
        self.channels.clear()
        self.gone.set()
        self.halted.set()
