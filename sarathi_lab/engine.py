"""The loop: admit arrivals, schedule, execute, update, advance the virtual clock.

Request progress changes in one place, the policy (`update`, and `advance_decodes` for the
simulator's skip through steady decode runs); the executor decides when a request ends; the
engine only moves the clock, hands arrivals over and records iterations.
"""
from __future__ import annotations

import logging
from operator import attrgetter

import numpy as np

from sarathi_lab.executors.base import Executor
from sarathi_lab.guard import BatchGuard
from sarathi_lab.request import Request
from sarathi_lab.schedulers.base import Policy

log = logging.getLogger(__name__)
_COMPUTED = attrgetter("num_computed_tokens")

_TAKE = object()   # add_request: take the output length from the request itself

ITER_COLUMNS = ("start", "duration", "prefill_tokens", "decode_tokens", "num_requests",
                "kv_blocks_used", "kv_tokens_stored", "preemptions", "num_waiting")


def _all_decoding(reqs: list[Request]) -> bool:
    for r in reqs:   # Request.is_decoding, inlined: asked after most iterations
        n = r.num_output_tokens
        if not n or r.num_computed_tokens != r.num_prompt_tokens + n - 1:
            return False
    return True


def _owner(cls: type, method: str) -> type:
    return next(c for c in cls.__mro__ if method in vars(c))


def fast_forward_safe(policy: Policy) -> bool:
    """Whether skipping a steady decode run is exactly what this policy's own calls would do:
    its `steady_decode` must be written for its `schedule`, and its `advance_decodes` for its
    `update` (a subclass that overrides one of a pair but not the other is stepped one
    iteration at a time)."""
    cls = type(policy)
    return all(issubclass(_owner(cls, hook), _owner(cls, base))
               for hook, base in (("steady_decode", "schedule"), ("advance_decodes", "update")))


class Engine:
    """Drives one policy and one executor on a virtual clock.

    `run(requests)` replays a whole workload. A caller that drives several engines on one clock
    uses `add_request` and `step` instead. `progress`, if given, is called as
    progress(num_done, num_tokens) after iterations that end requests."""

    def __init__(self, policy: Policy, executor: Executor, *, fast_forward: bool = True,
                 progress=None, overlong: str = "reject"):
        self.policy = policy
        self.executor = executor
        self.kv = policy.kv
        executor.bind(self.kv)
        if policy.oracle:
            policy._output_len = executor.output_len
        # skipping steady decode runs needs predicted durations and no real tokens
        self.fast_forward = fast_forward and executor.supports_fast_forward
        if self.fast_forward and not fast_forward_safe(policy):
            log.info("%s overrides schedule()/update() without steady_decode()/"
                     "advance_decodes(): fast-forward off", type(policy).__qualname__)
            self.fast_forward = False
        # progress(num_done, num_tokens), or None: called once per executed iteration with the
        # requests done so far (finished or rejected) and the tokens computed so far in executed
        # iterations (the simulator's fast-forwarded decode runs are not counted)
        self.progress = progress
        if overlong not in ("reject", "cap"):
            raise ValueError(f"overlong={overlong!r}: must be reject or cap")
        self.overlong = overlong
        self.guard = BatchGuard(policy, self.kv)
        # the executor's default stop rule is applied in the guard's pass over the batch
        self._stops = executor.stop_lengths() if type(executor).finished is Executor.finished \
            else None
        # iteration records, fields as ITER_COLUMNS: a tuple per stepped iteration, and per
        # skipped run its arrays and scalars, turned into rows only when asked (`iterations`)
        self.rows: list[tuple] = []
        self._runs: list[tuple] = []   # (row index of its first iteration, now, durations,
        #                                 ends, extra blocks, requests, blocks, tokens stored,
        #                                 requests waiting)
        self._table: np.ndarray | None = None   # every record so far, once built
        self._n_skipped = 0
        self.now = 0.0
        self.num_done = 0
        self.num_tokens = 0   # computed in stepped iterations (kept only for `progress`)
        self.output_lens: dict = {}   # request id -> the workload's output length (metrics)

    # -- records ------------------------------------------------------------------------------------
    def iterations(self) -> np.ndarray:
        """Every iteration so far, one row each (columns as ITER_COLUMNS)."""
        n_rows = len(self.rows) + self._n_skipped
        if self._table is not None and len(self._table) == n_rows:
            return self._table
        table = np.empty((n_rows, len(ITER_COLUMNS)))
        stepped = np.ones(n_rows, bool)
        if self._runs:
            first, now, durs, ends, extra, B, used, stored, waiting = zip(*self._runs)
            ks = np.fromiter(map(len, durs), np.int64, len(durs))
            offsets = np.cumsum(ks) - ks              # of each run among the skipped rows
            within = np.arange(int(ks.sum())) - np.repeat(offsets, ks)
            pos = np.repeat(np.array(first), ks) + within
            stepped[pos] = False
            ends_all = np.concatenate(ends)
            start = np.empty_like(ends_all)
            start[1:] = ends_all[:-1]
            start[offsets] = now                      # a run starts where the clock stood
            step_no = within + 1
            B = np.repeat(np.array(B, float), ks)
            run = table[pos]
            run[:, 0], run[:, 1], run[:, 2] = start, np.concatenate(durs), 0
            run[:, 3] = run[:, 4] = B
            run[:, 5] = np.repeat(np.array(used, float), ks) + np.concatenate(extra)
            run[:, 6] = np.repeat(np.array(stored, float), ks) + B * step_no
            run[:, 7] = 0
            run[:, 8] = np.repeat(np.array(waiting, float), ks)
            table[pos] = run
        if self.rows:
            table[stepped] = np.array(self.rows, dtype=float)
        self._table = table
        return table

    @property
    def num_iterations(self) -> int:
        return len(self.rows) + self._n_skipped

    @property
    def iters(self) -> dict[str, list]:
        a = self.iterations()
        return {c: a[:, j].tolist() for j, c in enumerate(ITER_COLUMNS)}

    # -- the loop -------------------------------------------------------------------------------------
    def add_request(self, req: Request, output_len=_TAKE) -> bool:
        """A request arrives now: the executor takes its output length and may refuse it, then
        the policy queues it or refuses it. False (and counted done) if rejected. `output_len`:
        the output length to serve, when the caller took the request's own already (a
        disaggregated prefill replica is given 1: it ends the request at its first token)."""
        out_len = req.take_output_len() if output_len is _TAKE else output_len
        self.output_lens[req.request_id] = out_len
        reason = self.overlong_reason(req, out_len)
        if reason is None:
            try:
                reason = self.executor.add_request(req, out_len)
            except Exception as e:
                raise self._blame(self.executor, "add_request", e) from e
        if reason is not None:
            self.policy.reject(req, reason)
        else:
            try:
                if self.policy.add_request(req):
                    return True
            except Exception as e:
                raise self._blame(self.policy, "add_request", e) from e
        self.num_done += 1
        return False

    def overlong_reason(self, req: Request, out_len: int | None) -> str | None:
        """Why `req`, whose workload output is `out_len` tokens, is refused on arrival: its
        prompt and output exceed max_model_len (with overlong=reject); None if it is not."""
        room = self.kv.max_model_len - req.num_prompt_tokens
        if out_len is not None and out_len > room > 0 and self.overlong == "reject" \
                and (req.max_tokens is None or req.max_tokens > room):
            return (f"prompt of {req.num_prompt_tokens} + output of {out_len} tokens exceeds "
                    f"max_model_len={self.kv.max_model_len} (overlong=cap serves it cut short)")
        return None

    def adopt(self, req: Request, output_len: int | None) -> bool:
        """A request handed over with its first token out and its KV already held here
        (`KVCacheManager.allocate_received`), a disaggregated decode replica's arrival: the
        executor takes its output length, the policy takes it into the running batch
        (`Policy.adopt`). False (KV freed, counted done) if the executor refuses it."""
        self.output_lens[req.request_id] = output_len
        try:
            reason = self.executor.add_request(req, output_len)
        except Exception as e:
            raise self._blame(self.executor, "add_request", e) from e
        if reason is not None:
            self.kv.free(req)
            self.policy.reject(req, reason)
            self.num_done += 1
            return False
        self.policy.adopt(req)
        return True

    def step(self) -> tuple:
        """One iteration at `now`: schedule, execute, update, advance the clock. Returns
        (batch, finished requests, prefill tokens, decode tokens); the batch is empty if the
        policy scheduled nothing (it may still have rejected requests)."""
        policy, kv, ex = self.policy, self.kv, self.executor
        try:
            out = policy.schedule(self.now)
        except Exception as e:
            raise self._blame(policy, "schedule", e) from e
        if not out:
            self.num_done += len(out.rejected)
            return out, [], 0, 0
        emitted, ended = self.guard.check(out, self._where, self._stops)
        try:
            step = ex.execute(out)
            if step.finished is None:
                step.finished = ended if ended is not None else ex.finished(out)
        except Exception as e:
            raise self._blame(ex, "execute", e) from e
        start, end = self.now, self.now + step.duration
        n_pre, n_dec = out.split_counts()
        try:
            done = policy.update(out, step, start, end)
        except Exception as e:
            raise self._blame(policy, "update", e) from e
        for r in done:
            r.finish_reason = ex.finish_reason(r)
        self.rows.append((start, step.duration, n_pre, n_dec, len(out), kv.pool.num_used,
                          kv.num_stored_tokens, len(out.preempted), len(policy.waiting)))
        self.now = end
        self.guard.progressed(emitted, len(done) + len(out.rejected), self._where)
        self.num_done += len(done) + len(out.rejected)
        if self.progress is not None:
            self.num_tokens += n_pre + n_dec
            self.progress(self.num_done, self.num_tokens)
        return out, done, n_pre, n_dec

    def run(self, requests: list[Request]) -> list[Request]:
        reqs = sorted(requests, key=lambda r: r.arrival_time)
        policy = self.policy
        i, n_total = 0, len(reqs)
        while True:
            while i < n_total and reqs[i].arrival_time <= self.now:   # admit
                self.add_request(reqs[i])
                i += 1
            if not policy.has_work():
                if i == n_total:
                    break
                self.now = max(self.now, reqs[i].arrival_time)   # idle: jump to next arrival
                continue
            out, done, n_pre, n_dec = self.step()
            if not out:
                if out.rejected or not policy.has_work():
                    continue
                if i < n_total and not policy.running:
                    self.now = reqs[i].arrival_time   # a plugin may wait for more arrivals
                    continue
                kv = self.kv
                raise RuntimeError(
                    f"policy {policy.name!r} scheduled nothing at t={self.now:.3f}s with "
                    f"{len(policy.waiting)} waiting and {len(policy.running)} running requests "
                    f"and {kv.num_free_blocks}/{kv.num_blocks} KV blocks free; it would never "
                    "make progress")
            if self.fast_forward:
                self.skip_ahead(out, done, n_pre, n_dec,
                                reqs[i].arrival_time if i < n_total else float("inf"))
        self.guard.finished()
        return reqs

    def _where(self) -> str:
        return f"at iteration {self.num_iterations} (t={self.now:.3f}s)"

    def _blame(self, obj, method: str, e: Exception) -> Exception:
        """The same kind of error, naming the plugin and the moment: a user's policy or
        executor may be what raised."""
        cls = type(obj)
        where = (f"{cls.__module__}.{cls.__qualname__}.{method}() at t={self.now:.3f}s "
                 f"(iteration {self.num_iterations})")
        try:
            return type(e)(f"{where}: {e}")
        except Exception:   # an exception class that takes other arguments
            return RuntimeError(f"{where} raised {type(e).__name__}: {e}")

    def skip_ahead(self, out, done, n_pre: int, n_dec: int, next_arrival: float) -> None:
        """After `step()` returned (out, done, n_pre, n_dec), with fast-forward on: if every
        running request is now decoding (after a decode batch, a finish or the last chunk of a
        prompt), the last batch preempted nothing and the policy says the next batch is one
        decode of each of them, run the decode iterations before `next_arrival` at once. For
        `run` and for drivers of their own that call `step` (closed-loop clients, fleets)."""
        policy = self.policy
        if policy.running and not out.preempted \
                and (n_pre == 0 and n_dec == len(out) == len(policy.running) + len(done)
                     or _all_decoding(policy.running)) and policy.steady_decode():
            self._skip_decodes(next_arrival)

    def _skip_decodes(self, next_arrival: float) -> None:
        """Run k identical decode-only iterations at once: same requests, contexts +1 each step,
        stopping before any request finishes, an arrival is due, or KV would run out. Produces
        exactly what k single steps would, through the policy's `advance_decodes`."""
        policy, kv, ex = self.policy, self.kv, self.executor
        running = policy.running
        # no request may finish inside the run: the last of it is taken by the normal loop
        stops = self._stops
        if stops is not None:   # the default stop rule, read directly: asked after most steps
            k = min([stops[r.request_id] - r.num_output_tokens for r in running]) - 1
        else:
            k = int(ex.tokens_left(running).min()) - 1
        if k < 2:
            return
        B = len(running)
        ctx = np.fromiter(map(_COMPUTED, running), np.int64, B)
        durs = ex.decode_run(ctx, k)
        # left to right from `now`, as k single steps would add them (same rounding)
        ends = durs.copy()
        ends[0] += self.now
        ends = np.add.accumulate(ends)
        # iteration j starts at ends[j-1]; arrivals at or before a start are admitted first
        k = min(k, int(np.searchsorted(ends, next_arrival, side="left")) + 1)
        if k < 2:
            return
        extra = kv.decode_growth(running, ctx, k)   # blocks beyond today's after each step
        k = min(k, int(np.searchsorted(extra, kv.num_free_blocks, side="right")))
        if k < 2:
            return
        durs, ends, extra = durs[:k], ends[:k], extra[:k]
        times = ends.tolist()
        used_before, stored_before = kv.num_used_blocks, kv.num_stored_tokens
        try:
            policy.advance_decodes(times)
        except Exception as e:
            raise self._blame(policy, "advance_decodes", e) from e
        assert kv.num_used_blocks == used_before + extra[-1] \
            and kv.num_stored_tokens == stored_before + B * k, \
            "advance_decodes did not do what k decode steps would"
        # nothing arrives or is admitted inside the run: the waiting queue stays as it is
        self._runs.append((len(self.rows) + self._n_skipped, self.now, durs, ends, extra, B,
                           used_before, stored_before, len(policy.waiting)))
        self._n_skipped += k
        self.now = times[-1]
