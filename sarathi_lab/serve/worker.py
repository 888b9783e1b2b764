"""The engine in real time, in the engine process (`engine_process`): arrivals come from the
HTTP process over a pipe, the engine steps while work is pending, and after each step one
message goes back with every request's new tokens, ends and errors, and the engine's state.

The engine is the one every run uses (`sarathi_lab.engine.Engine`), with any policy; only its
clock differs: before each step it is moved to the wall clock (seconds since the engine process
started), so arrivals, token times and the iterations table are real times. Only `advance`
drives the engine's loop.

An error that names its request (an exception in the chain with a ``request_id`` attribute,
or one raised while taking a request in or by its stop strings) fails that request alone: it
is taken out of the engine (`Engine.abort`), its client gets an error, the others go on. Any
other error, or a state that no longer holds after such a failure, stops the engine: every
request in flight gets the error and the process exits non-zero.
"""
from __future__ import annotations

import logging
import time

from sarathi_lab.request import Request, Status
from sarathi_lab.serve.protocol import Generation

log = logging.getLogger(__name__)

DISCONNECTED = "aborted: the client disconnected"
STOPPED = "aborted: the server stopped"
# a blocked engine (its policy scheduled nothing with requests queued) looks again this often:
# a plug-in may wait for time to pass, which no arrival would tell it
_BLOCKED_POLL_S = 0.05
# the errors a client is told: (HTTP status, message, code)
STOPPING = (503, "the server is stopping", "server_stopping")


def advance(engine, now: float):
    """One iteration of `engine` at wall time `now`: (batch, requests that finished). The one
    place the serve worker drives the engine's loop."""
    engine.wake(now)
    adv = engine.advance()   # one iteration (a policy that would never progress raises)
    return adv.batch, adv.finished


class EngineStopped(Exception):
    """The engine cannot go on (`Worker.error` holds why)."""


class _Live:
    __slots__ = ("req", "sent", "stop")

    def __init__(self, req: Request, stop=None):
        self.req, self.sent = req, 0
        self.stop = stop   # the request's StopWatch (serve.text) when it gives stop strings


class Worker:
    """Steps `engine` (built as a run's: `runner.build`) and talks to the HTTP process through
    `link` (`engine_process.Link`: `poll(timeout)`, `recv()`, `send(msg)`). `stop_watch(stops)`:
    a new `serve.text.StopWatch` for a request that gives stop strings (None without a
    tokenizer). `journal`: a `sarathi_lab.run.journal.Journal` that ended requests go to."""

    def __init__(self, engine, link, stop_watch=None, journal=None):
        self.engine = engine
        self.executor = engine.executor
        self.link = link
        self.stop_watch = stop_watch
        self.journal = journal
        self.live: dict[int, _Live] = {}
        self.requests: list[Request] = []   # every request the engine was given, in order
        self.error: BaseException | None = None   # what stopped the engine, if anything did
        self.orphaned = False   # the HTTP process went away without a stop
        self.quit = False       # told to leave no run directory (the server never served)
        self.preemptions = 0
        self.t0 = time.perf_counter()
        self._stopping = False
        ex = self.executor
        self._default_sampling = (getattr(ex, "temperature", 0.0), getattr(ex, "top_p", 1.0))
        self._out_tokens: list = []   # [rid, [ids]] of this step
        self._firsts: list = []       # [rid, TTFT s, prompt tokens]
        self._ends: list = []         # [rid, finish_reason or "abort", E2E s]
        self._errors: list = []       # [rid, status, message, code]
        self._ended: list[Request] = []   # for the journal

    def now(self) -> float:
        return time.perf_counter() - self.t0

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        """Until the HTTP process says stop (or goes away), or the engine fails (`error`)."""
        e = self.engine
        try:
            while True:
                busy = e.policy.has_work() and not e.blocked
                self._drain(0 if busy else _BLOCKED_POLL_S if e.blocked else None)
                if self._stopping:
                    break
                if e.policy.has_work() and not e.blocked:
                    self._step()
                elif e.blocked:
                    e.wake(self.now())
                self._flush()
        except EngineStopped:
            pass
        except BaseException as err:   # a plug-in's error: every client is told, none hangs
            self._fail_all(err)
        self._flush()

    def _step(self) -> None:
        e = self.engine
        kv = e.kv
        host = kv.num_used_host_blocks   # a swap in the failed step would leave KV uncopied
        try:
            out, done = advance(e, self.now())
        except Exception as err:
            bad = {rid: exc for rid, exc in _named_requests(err) if rid in self.live}
            if not bad:
                raise
            why = _unrecoverable(e, host)
            if why:
                raise RuntimeError(f"request(s) {list(bad)} failed ({err}), and {why}: the "
                                   "engine cannot go on") from err
            log.warning("%s", err)   # where it was raised (the plug-in's method)
            for rid, exc in bad.items():   # those fail; the others are scheduled again
                self._fail_request(rid, exc)
            held = {r.request_id for r in e.policy.running}
            if not set(kv.holders()) <= held:
                raise RuntimeError(f"after request(s) {list(bad)} failed ({err}), KV blocks "
                                   "are held by requests the policy does not run: the "
                                   "engine's state is corrupt") from err
            # the failed step allocated its tokens' slots without computing them: recounted
            kv.num_stored_tokens = sum(r.num_computed_tokens for r in e.policy.running)
            return
        self.preemptions += len(out.preempted)
        self._deliver(out, done)

    def _fail_all(self, err: BaseException) -> None:
        log.error("the engine stopped", exc_info=err)
        self.error = err
        msg = (500, f"the engine stopped: {type(err).__name__}: {err}", "engine_error")
        for rid in self.live:
            self._errors.append([rid, *msg])
        self.live.clear()

    def _fail_request(self, rid: int, err: BaseException) -> None:
        """Request `rid` alone failed (`err`): out of the engine, its client told."""
        lv = self.live.pop(rid)
        why = f"{type(err).__name__}: {err}"
        req, e = lv.req, self.engine
        try:
            if req.status in (Status.WAITING, Status.RUNNING, Status.SWAPPED) and (
                    req in e.policy.waiting or req in e.policy.running
                    or req in e.policy.swapped):
                e.abort(req, f"error: {why}")
            else:   # never reached the policy (add_request raised)
                e.executor.abort(req)
                req.status, req.rejection_reason = Status.REJECTED, f"error: {why}"
        except Exception as again:   # the engine could not take it out: nothing holds now
            raise RuntimeError(f"request {rid} failed ({why}) and could not be taken out of "
                               f"the engine: {again}") from again
        log.warning("request %s failed: %s", rid, why)
        self._errors.append([rid, 500, f"the request failed in the engine: {why}",
                             "request_error"])
        self._ended.append(req)

    def refuse(self, rid: int) -> None:
        """After the loop: a request that came too late gets the stopping error."""
        self._errors.append([rid, *STOPPING])
        self._flush()

    def _flush(self) -> None:
        """This step's events to the HTTP process in one message; ended requests to the
        journal."""
        if self._ended and self.journal is not None:
            self.journal.ended(self._ended, self.engine.output_lens)
            if self.journal.due():
                self.journal.iterations(self.engine.iteration_columns())
        self._ended = []
        p, kv = self.engine.policy, self.engine.kv
        stats = [len(p.waiting), len(p.running), len(p.swapped), kv.num_used_blocks,
                 kv.num_blocks, len(self.requests), self.engine.num_iterations,
                 self.preemptions]
        self.link.send(["step", self.engine.now, self._out_tokens, self._firsts, self._ends,
                        self._errors, stats])
        self._out_tokens, self._firsts, self._ends, self._errors = [], [], [], []

    # -- the HTTP process's messages -----------------------------------------------------------
    def _drain(self, timeout: float | None) -> None:
        link = self.link
        if not link.poll(timeout):
            return
        while True:
            try:
                msg = link.recv()
            except EOFError:   # the HTTP process went away: stop as if told
                self.orphaned = True
                self._stop()
                return
            kind = msg[0]
            if kind == "add":
                self._add(msg[1], Generation(**msg[2]))
            elif kind == "abort":
                live = self.live.pop(msg[1], None)
                if live is not None and self.engine.abort(live.req, DISCONNECTED):
                    self._ended.append(live.req)
                    self._ends.append([msg[1], "abort", self.now() - live.req.arrival_time])
            else:   # stop, or quit
                self.quit = kind == "quit"
                self._stop()
                return
            if not link.poll(0):
                return

    def _stop(self) -> None:
        """What is in flight ends now, recorded as aborted; its clients are told."""
        self._stopping = True
        for rid, live in self.live.items():
            self.engine.abort(live.req, STOPPED)
            self._ended.append(live.req)
            self._errors.append([rid, *STOPPING])
        self.live.clear()

    def _add(self, rid: int, gen: Generation) -> None:
        e = self.engine
        t = self.now()
        req = Request(rid, t, len(gen.prompt_ids), None, prompt_token_ids=gen.prompt_ids,
                      max_tokens=gen.max_tokens)
        self.requests.append(req)
        self.live[rid] = lv = _Live(req)
        try:
            if (gen.temperature, gen.top_p) != self._default_sampling or gen.seed is not None \
                    or gen.ignore_eos:
                self.executor.set_sampling(rid, gen.temperature, gen.top_p, gen.seed,
                                           gen.ignore_eos)
            e.wake(t)
            if gen.stop and self.stop_watch:
                lv.stop = self.stop_watch(gen.stop)
            if not e.add_request(req):
                del self.live[rid]
                self._errors.append([rid, *_refusal(e, req)])
                self._ended.append(req)
        except Exception as err:   # this request's: it fails alone
            self._fail_request(rid, err)

    def _deliver(self, out, done) -> None:
        live, t = self.live, self.engine.now
        for req in out.reqs:
            rid = req.request_id
            lv = live.get(rid)
            if lv is None or lv.sent == len(req.output_token_ids):
                continue
            new = req.output_token_ids[lv.sent:]
            if lv.sent == 0:
                self._firsts.append([rid, req.token_times[0] - req.arrival_time,
                                     req.num_prompt_tokens])
            lv.sent += len(new)
            self._out_tokens.append([rid, new])
            if lv.stop is not None and req.status is Status.RUNNING:
                try:
                    hit = lv.stop.add(new)
                except Exception as err:   # the tokenizer failed on this request's text
                    self._fail_request(rid, err)
                    continue
                if hit:
                    self.engine.abort(req, "stop string", finish_reason="stop_string")
                    del live[rid]
                    self._ends.append([rid, "stop_string", t - req.arrival_time])
                    self._ended.append(req)
        for req in done:
            self._ended.append(req)
            if live.pop(req.request_id, None) is not None:
                self._ends.append([req.request_id, req.finish_reason,
                                   req.finish_time - req.arrival_time])
        for req in out.rejected:
            self._ended.append(req)
            if live.pop(req.request_id, None) is not None:
                self._errors.append([req.request_id, *_refusal(self.engine, req)])


def _named_requests(err: BaseException) -> list:
    """(request id, the error naming it) for each request an error names: a ``request_id``
    (or ``request_ids``) attribute of the error or of any error in its chain (the engine
    re-raises a plug-in's error naming the plug-in, the original as its cause)."""
    out, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        ids = getattr(err, "request_ids", None)
        if ids is None and getattr(err, "request_id", None) is not None:
            ids = [err.request_id]
        out += [(rid, err) for rid in ids or ()]
        err = err.__cause__ or err.__context__
    return out


def _unrecoverable(engine, host_blocks_before: int) -> str | None:
    """Why a step that raised cannot simply be scheduled again, or None: with prefix caching
    its blocks were offered for reuse before their KV was computed; a swap it made may not
    have been copied."""
    kv = engine.kv
    if kv.enable_prefix_caching:
        return "with prefix caching the step's blocks may be cached before their KV was computed"
    if kv.num_used_host_blocks != host_blocks_before:
        return "the step swapped KV blocks that may not have been copied"
    return None


def _refusal(engine, req: Request) -> tuple:
    """(status, message, code) for a request the policy (or the executor) refused."""
    name = engine.policy.name
    return (503 if req.num_output_tokens else 400,
            f"policy {name!r} rejected the request: {req.rejection_reason}", "rejected")
