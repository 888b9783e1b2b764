"""The engine in real time, in one worker thread: arrivals come from the HTTP handlers, the
engine steps while work is pending, and each request's tokens go back to its handler on the
asyncio loop (`loop.call_soon_threadsafe`) as soon as the step that made them ends.

The engine is the one every run uses (`sarathi_lab.engine.Engine`), with any policy; only its
clock differs: before each step it is moved to the wall clock (seconds since the server
started), so arrivals, token times and the iterations table are real times. torch blocks, so
the engine never runs on the event loop; the handlers never touch engine objects: they talk to
the worker through its inbox (`submit`, `abort`, `stop`) and read what it posts to their
`Channel`.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from sarathi_lab.request import Request, Status
from sarathi_lab.serve.protocol import ApiError, Generation

log = logging.getLogger(__name__)

DISCONNECTED = "aborted: the client disconnected"
STOPPED = "aborted: the server stopped"
# a blocked engine (its policy scheduled nothing with requests queued) looks again this often:
# a plug-in may wait for time to pass, which no arrival would tell it
_BLOCKED_POLL_S = 0.05


@dataclass
class Channel:
    """What the worker tells one handler: ("tokens", [ids]), then ("end", finish_reason) or
    ("error", ApiError), on an asyncio queue of the handler's loop."""
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)

    def post(self, event: tuple) -> None:   # from the worker thread
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


class _Live:
    __slots__ = ("req", "gen", "channel", "sent", "stop")

    def __init__(self, req: Request, gen: Generation, channel: Channel, stop=None):
        self.req, self.gen, self.channel, self.sent = req, gen, channel, 0
        self.stop = stop   # the request's StopWatch (serve.text) when it gives stop strings


class Worker:
    """Owns `engine` (built as a run's: `runner.build`) and steps it in its thread (`start`).
    `stop_watch(stops)`: a new `serve.text.StopWatch` for a request that gives stop strings
    (None without a tokenizer)."""

    def __init__(self, engine, stop_watch=None):
        self.engine = engine
        self.executor = engine.executor
        self.stop_watch = stop_watch
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.wakeup = threading.Event()
        self.live: dict[int, _Live] = {}
        self.requests: list[Request] = []   # every request the engine was given, in order
        self.error: BaseException | None = None   # what stopped the engine, if anything did
        self.t0 = time.perf_counter()
        self._ids = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="sarathi-lab-engine", daemon=True)
        ex = self.executor
        self._default_sampling = (getattr(ex, "temperature", 0.0), getattr(ex, "top_p", 1.0))
        self.stats: dict = {}   # `/health`'s view, replaced whole (the loop thread reads it)
        self._publish()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    # -- the handlers' side (event loop thread) --------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, gen: Generation, channel: Channel) -> int:
        """Queue `gen` for the engine; returns its request id."""
        self._ids += 1   # only the loop thread submits
        rid = self._ids
        self._put(("add", rid, gen, channel))
        return rid

    def abort(self, rid: int) -> None:
        self._put(("abort", rid))

    def stop(self) -> None:
        self._put(("stop",))

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _put(self, item) -> None:
        self.inbox.put(item)
        self.wakeup.set()

    # -- the worker thread -------------------------------------------------------------------
    def _run(self) -> None:
        e = self.engine
        try:
            while True:
                self.wakeup.clear()
                self._drain()
                if self._stopping:
                    break
                if e.policy.has_work() and not e.blocked:
                    e.wake(self.now())
                    adv = e.advance()   # one iteration (a policy that would never progress raises)
                    self._deliver(adv.batch, adv.finished)
                    self._publish()
                else:
                    self._publish()
                    self.wakeup.wait(_BLOCKED_POLL_S if e.blocked else None)
                    if e.blocked:
                        e.wake(self.now())
        except BaseException as err:   # a plug-in's error: every handler is told, none hangs
            log.exception("the engine stopped")
            self.error = err
            api = ApiError(500, f"the engine stopped: {type(err).__name__}: {err}",
                           code="engine_error")
            for live in self.live.values():
                live.channel.post(("error", api))
            self.live.clear()
            self._refuse_inbox(api)

    def _publish(self) -> None:
        p, kv = self.engine.policy, self.engine.kv
        self.stats = {"waiting": len(p.waiting), "running": len(p.running),
                      "swapped": len(p.swapped), "kv_blocks_used": kv.num_used_blocks,
                      "kv_blocks_total": kv.num_blocks, "requests": len(self.requests),
                      "iterations": self.engine.num_iterations}

    def _refuse_inbox(self, api: ApiError) -> None:
        """After the engine stopped: what is still queued gets `api`."""
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return
            if item[0] == "add":
                item[3].post(("error", api))

    def _drain(self) -> None:
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return
            kind = item[0]
            if kind == "add":
                self._add(*item[1:])
            elif kind == "abort":
                live = self.live.pop(item[1], None)
                if live is not None:
                    self.engine.abort(live.req, DISCONNECTED)
            else:   # stop: what is in flight ends now, recorded as aborted
                self._stopping = True
                for live in self.live.values():
                    self.engine.abort(live.req, STOPPED)
                    live.channel.post(("error", ApiError(503, "the server is stopping",
                                                         code="server_stopping")))
                self.live.clear()
                self._refuse_inbox(ApiError(503, "the server is stopping",
                                            code="server_stopping"))
                return

    def _add(self, rid: int, gen: Generation, channel: Channel) -> None:
        e = self.engine
        t = self.now()
        req = Request(rid, t, len(gen.prompt_ids), None, prompt_token_ids=gen.prompt_ids,
                      max_tokens=gen.max_tokens)
        if (gen.temperature, gen.top_p) != self._default_sampling or gen.seed is not None \
                or gen.ignore_eos:
            self.executor.set_sampling(rid, gen.temperature, gen.top_p, gen.seed,
                                       gen.ignore_eos)
        e.wake(t)
        self.requests.append(req)
        if e.add_request(req):
            watch = self.stop_watch(gen.stop) if gen.stop and self.stop_watch else None
            self.live[rid] = _Live(req, gen, channel, watch)
        else:
            channel.post(("error", _refusal(e, req)))

    def _deliver(self, out, done) -> None:
        live = self.live
        for req in out.reqs:
            lv = live.get(req.request_id)
            if lv is None or lv.sent == len(req.output_token_ids):
                continue
            new = req.output_token_ids[lv.sent:]
            lv.sent += len(new)
            lv.channel.post(("tokens", new))
            if lv.stop is not None and lv.stop.add(new) and req.status is Status.RUNNING:
                self.engine.abort(req, "stop string", finish_reason="stop_string")
                del live[req.request_id]
                lv.channel.post(("end", "stop_string"))
        for req in done:
            lv = live.pop(req.request_id, None)
            if lv is not None:
                lv.channel.post(("end", req.finish_reason))
        for req in out.rejected:
            lv = live.pop(req.request_id, None)
            if lv is not None:
                lv.channel.post(("error", _refusal(self.engine, req)))


def _refusal(engine, req: Request) -> ApiError:
    """The error for a request the policy (or the executor) refused."""
    name = engine.policy.name
    return ApiError(503 if req.num_output_tokens else 400,
                    f"policy {name!r} rejected the request: {req.rejection_reason}",
                    code="rejected")
