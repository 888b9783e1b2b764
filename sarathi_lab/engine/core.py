"""The loop: admit arrivals, schedule, execute, update, advance the virtual clock.

Request progress changes in one place, the policy (`update`, and its fast-forward declaration's
`advance_decodes` for the simulator's runs of steady iterations); the executor decides when a
request ends; the engine only moves the clock, hands arrivals over and records iterations.
Every caller moves it with one call, `advance(until)`, which says what happened (`Advanced`).
"""
from __future__ import annotations

import itertools
import logging
from operator import attrgetter

import numpy as np

from sarathi_lab.engine.fast_forward import NO_SWAPS, FastForwardRuns, all_decoding
from sarathi_lab.engine.guard import BatchGuard
from sarathi_lab.executors.base import Executor, check_speculation
from sarathi_lab.request import Request, Status
from sarathi_lab.schedulers.base import Policy
from sarathi_lab.schedulers.output import SchedulerOutput

log = logging.getLogger(__name__)
_ARRIVAL = attrgetter("arrival_time")
_INF = float("inf")

_TAKE = object()   # add_request: take the output length from the request itself

ITER_COLUMNS = ("start", "duration", "prefill_tokens", "decode_tokens", "num_requests",
                "kv_blocks_used", "kv_tokens_stored", "preemptions", "num_waiting",
                # preemption by swap: requests and KV blocks moved each way, the seconds of
                # `duration` the executor spent copying them, swaps that fell back to
                # recompute, host blocks held after the iteration
                "swap_outs", "swap_ins", "swap_out_blocks", "swap_in_blocks", "swap_s",
                "swap_fallbacks", "host_blocks_used")
FLOAT_COLUMNS = ("start", "duration", "swap_s")   # the others count things
# a column of the iterations of an executor that measures host time (`Engine.step`), after
# ITER_COLUMNS: the simulator's tables have none
HOST_COLUMN = "host_s"
# the columns of a speculating engine's iterations (scheduler.num_speculative_tokens > 0), after
# those: draft tokens proposed and accepted, speculative entries, and the tokens those emitted
SPEC_COLUMNS = ("spec_proposed", "spec_accepted", "spec_steps", "spec_tokens")
_NO_SPEC = (0, 0, 0, 0)


class Advanced:
    """What one `Engine.advance` call did. Its last iteration ran from `start` to `end` (the
    engine's clock after the call): `batch`, that iteration's SchedulerOutput if it was
    stepped (empty if the policy scheduled nothing; None if the call ended in a fast-forwarded
    run); `finished`, the requests that ended in it (each at its `finish_time`, which is
    `end`); `rejected`, those the policy refused in it (at `start`); `prefill_tokens`,
    `decode_tokens`, what it computed; `first_tokens`, the requests whose first token came out
    at its end. Fast-forwarded runs before it ended nothing and emitted no first token."""
    __slots__ = ("start", "end", "batch", "finished", "rejected", "prefill_tokens",
                 "decode_tokens", "_token_time", "_first")

    def __init__(self, start: float, end: float, batch, finished, rejected, prefill_tokens=0,
                 decode_tokens=0, token_time: float = _INF, first=None):
        self.start, self.end, self.batch = start, end, batch
        self.finished, self.rejected = finished, rejected
        self.prefill_tokens, self.decode_tokens = prefill_tokens, decode_tokens
        self._token_time, self._first = token_time, first

    @property
    def first_tokens(self) -> list:
        if self._first is None:   # a stepped batch: its entries whose first token is its own
            t = self._token_time
            self._first = [r for r in self.batch.reqs if r.token_times
                           and r.token_times[0] == t] if self.prefill_tokens else []
        return self._first


class Engine(FastForwardRuns):
    """Drives one policy and one executor on a virtual clock.

    Every caller -- a topology (sarathi_lab/topology/), the server's worker, a benchmark, a
    test -- moves it with `advance(until)`, hands it requests with `add_request` / `adopt`
    after `wake(t)`, asks `next_event_time()` when it steps next and `finish()` at the end.
    `run(requests)` replays a whole workload on this engine alone over those calls.
    `progress`, if given, is called as progress(num_done, num_tokens) after iterations that
    end requests."""

    def __init__(self, policy: Policy, executor: Executor, *, fast_forward: bool = True,
                 progress=None, overlong: str = "reject",
                 why_not: str = "run.fast_forward=false"):
        self.policy = policy
        self.executor = executor
        self.kv = policy.kv
        executor.bind(self.kv)
        self.speculative = check_speculation(policy.cfg.num_speculative_tokens, executor)
        # admission control reads this engine's clock; an oracle policy, the true lengths
        policy.bind_engine(self.clock, executor.output_len if policy.oracle else None)
        # skipping steady decode runs needs predicted durations and no real tokens (and every
        # step: a steady run's tokens per step would depend on the drafts accepted), and the
        # policy's declaration of its steady runs, the only thing read to skip them;
        # `fast_forward_off` says which is missing (`why_not`: why it was not asked for), for
        # the summary's record (`runner.results`)
        self._ff = policy.fast_forward
        # a policy that turned its class's declaration off says why (a budget controller)
        undeclared = policy.fast_forward_off \
            or f"{type(policy).__qualname__} declares no fast_forward"
        self.fast_forward_off = (
            why_not if not fast_forward else
            executor.no_fast_forward if not executor.supports_fast_forward else
            "speculative decoding: a steady run's tokens per step depend on the drafts "
            "accepted" if self.speculative else
            undeclared if self._ff is None else None)
        self.fast_forward = self.fast_forward_off is None
        if self.fast_forward_off == undeclared:
            log.info("%s (schedulers/mechanics/fast_forward.py): stepped one iteration at a "
                     "time", undeclared)
        # progress(num_done, num_tokens), or None: called once per executed iteration with the
        # requests done so far (finished or rejected) and the tokens computed so far in executed
        # iterations (the simulator's fast-forwarded runs are not counted)
        self.progress = progress
        if overlong not in ("reject", "cap"):
            raise ValueError(f"overlong={overlong!r}: must be reject or cap")
        self.overlong = overlong
        self.guard = BatchGuard(policy, self.kv)
        # the executor's default stop rule is applied in the guard's pass over the batch
        self._stops = executor.stop_lengths() if type(executor).finished is Executor.finished \
            else None
        # `run` ends requests inside a skipped run (its last iteration) where the engine applies
        # the stop rule itself
        self._fold = self.fast_forward and self._stops is not None
        # `run` skips through a prompt's chunks where the policy declares chunk runs, the
        # engine applies the stop rule itself and the executor prices such batches (`chunk_run`)
        self._chunks = self._fold and self._ff.steady_chunks is not None
        # iteration records, fields as ITER_COLUMNS: a tuple per stepped iteration, and per
        # skipped run its arrays and scalars, turned into rows only when asked (`iterations`)
        self.rows: list[tuple] = []
        self._runs: list[tuple] = []   # (row index of its first iteration, now, durations,
        #                                 ends, extra blocks, requests, blocks, tokens stored,
        #                                 requests waiting)
        self._table: np.ndarray | None = None   # every record so far, once built
        self._n_skipped = 0
        self._emitted = 0   # entries of the last stepped batch that emitted a token
        self.now = 0.0
        self.num_done = 0
        self.num_tokens = 0   # computed in stepped iterations (kept only for `progress`)
        self.output_lens: dict = {}   # request id -> the workload's output length (metrics)
        self._blocked = False   # scheduled nothing with only queued work: waits for an input
        # every running request decodes and the last batch preempted nothing: the state in
        # which the policy is asked whether the next batches are steady decodes (kept between
        # `advance` calls: an arrival that only joined the queue leaves it as it was)
        self._decoding = False
        self._last_start = 0.0   # when a fast-forwarded run's last iteration started
        self._last_chunk = 0     # the prompt tokens of a chunk run's last iteration
        # host time: the seconds of each stepped iteration outside the executor's step (the
        # policy's schedule and update, the guard, this loop's bookkeeping), on the executor's
        # `host_clock` where it has one (the torch executor; the simulator's cost model prices
        # any such time itself). With `host_in_clock` (executor.clock=wall) the clock counts it:
        # an iteration spans host_s + duration, its tokens out after the schedule and the step
        self._host_clock = getattr(executor, "host_clock", None)
        self._host_in_clock = bool(getattr(executor, "host_in_clock", False))
        self._host_s: list[float] | None = [] if self._host_clock else None
        # a speculating engine's per-iteration SPEC_COLUMNS (it steps every iteration)
        self._spec_rows: list[tuple] | None = [] if self.speculative else None

    # -- records ------------------------------------------------------------------------------------
    def iterations(self) -> np.ndarray:
        """Every iteration so far, one row each (columns as ITER_COLUMNS, all float)."""
        n_rows = len(self.rows) + self._n_skipped
        if self._table is None or len(self._table) != n_rows:
            cols = self.iteration_columns()
            table = np.empty((len(ITER_COLUMNS), n_rows))
            for row, c in zip(table, ITER_COLUMNS):
                row[:] = cols[c]
            self._table = table.T
        return self._table

    def iteration_columns(self) -> dict[str, np.ndarray]:
        """Every iteration so far, one new array per column of ITER_COLUMNS (float64 for
        FLOAT_COLUMNS, int64 for the counts), the caller's to keep: what the iterations table
        is made of, without a float matrix in between (a million skipped iterations make
        tens of megabytes per column)."""
        n_rows = len(self.rows) + self._n_skipped
        width = len(ITER_COLUMNS)
        # zeros: a skipped run has no prefill, preemption or swap to record
        cols = {c: np.zeros(n_rows, float if c in FLOAT_COLUMNS else np.int64)
                for c in ITER_COLUMNS}
        stepped = slice(None)
        if self._runs:
            first, now, durs, ends, extra, B, used, stored, waiting, host = zip(*self._runs)
            ks = np.fromiter(map(len, durs), np.int64, len(durs))
            n_skip = int(ks.sum())
            offsets = np.cumsum(ks) - ks              # of each run among the skipped rows
            within = np.arange(n_skip) - np.repeat(offsets, ks)
            skip = np.zeros(n_rows, bool)             # the skipped rows (a mask: in order)
            skip[np.repeat(np.array(first), ks) + within] = True
            stepped = ~skip
            chain = itertools.chain.from_iterable
            ends_all = np.fromiter(chain(ends), float, n_skip)
            start = np.empty_like(ends_all)
            start[1:] = ends_all[:-1]
            start[offsets] = now                      # a run starts where the clock stood
            B = np.repeat(np.array(B, np.int64), ks)
            cols["start"][skip] = start
            cols["duration"][skip] = np.fromiter(chain(durs), float, n_skip)
            cols["decode_tokens"][skip] = cols["num_requests"][skip] = B
            cols["kv_blocks_used"][skip] = np.repeat(np.array(used, np.int64), ks) \
                + np.fromiter(chain(extra), np.int64, n_skip)
            cols["kv_tokens_stored"][skip] = np.repeat(np.array(stored, np.int64), ks) \
                + B * (within + 1)
            cols["num_waiting"][skip] = np.repeat(np.array(waiting, np.int64), ks)
            cols["host_blocks_used"][skip] = np.repeat(np.array(host, np.int64), ks)
        if self.rows:
            rows = np.fromiter(itertools.chain.from_iterable(self.rows), float,
                               len(self.rows) * width).reshape(-1, width)
            for i, c in enumerate(ITER_COLUMNS):
                cols[c][stepped] = rows[:, i]
        if self._host_s is not None:   # an executor that steps every iteration (no skips)
            assert len(self._host_s) == n_rows, "host time recorded for every iteration"
            cols[HOST_COLUMN] = np.array(self._host_s, float)
        if self._spec_rows is not None:   # no skips either
            assert len(self._spec_rows) == n_rows, "speculation recorded for every iteration"
            spec = np.array(self._spec_rows, np.int64).reshape(-1, len(SPEC_COLUMNS))
            for i, c in enumerate(SPEC_COLUMNS):
                cols[c] = spec[:, i].copy()
        return cols

    def swap_space(self) -> dict | None:
        """The host swap space, for the summary (`metrics.summarize`): its blocks and the
        bytes of one KV block on one GPU (None if the executor does not know); None without."""
        kv = self.kv
        if not kv.num_host_blocks:
            return None
        return {"host_blocks_total": kv.num_host_blocks,
                "kv_block_bytes": self.executor.kv_block_bytes(kv.block_size)}

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

    def abort(self, req: Request, reason: str, finish_reason: str | None = None) -> bool:
        """End `req` now wherever it is (`sarathi-lab-serve`: its client went away): the
        policy drops it and frees its KV (`Policy.abort`), the executor forgets it, and it
        counts as done: rejected with `reason`, or with `finish_reason` (a request the server
        ended itself, e.g. at a stop string) finished at its last token. False if it had
        already ended. Called between steps."""
        try:
            if not self.policy.abort(req, reason):
                return False
        except Exception as e:
            raise self._blame(self.policy, "abort", e) from e
        self.executor.abort(req)
        if finish_reason is not None:
            req.status = Status.FINISHED
            req.rejection_reason = None
            req.finish_reason = finish_reason
            req.finish_time = req.token_times[-1] if req.token_times else self.now
        self._decoding = False
        self.num_done += 1
        return True

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
        self._decoding = False   # its next batch is stepped before any run
        return True

    def _step(self) -> tuple:
        """One iteration at `now`: schedule, execute, update, advance the clock. Returns
        (batch, finished requests, prefill tokens, decode tokens, the time its tokens came
        out); the batch is empty if the policy scheduled nothing (it may still have rejected
        requests)."""
        policy, kv, ex = self.policy, self.kv, self.executor
        clock = self._host_clock
        t0 = clock() if clock else 0.0
        try:
            out = policy.schedule(self.now)
        except Exception as e:
            raise self._blame(policy, "schedule", e) from e
        if out.__class__ is not SchedulerOutput:   # a subclass passes the guard's own check
            self.guard.output_type(out, self._where)
        if not out.reqs:   # len(out), without a Python-level call
            if out.swapped_out or out.swapped_in:
                self.guard.swaps_without_batch(out, self._where)
            self.num_done += len(out.rejected)
            return out, [], 0, 0, _INF
        emitted, ended = self.guard.check(out, self._where, self._stops)
        self._emitted = emitted
        pre = clock() - t0 if clock else 0.0
        try:
            step = ex.execute(out)
            if step.accepted is not None:
                self._speculated(out, step)
            elif out.spec_lens and any(out.spec_lens):
                raise RuntimeError("returned no StepResult.accepted for a batch with "
                                   "speculative entries (SchedulerOutput.spec_lens)")
            elif step.finished is None:
                step.finished = ended if ended is not None else ex.finished(out)
        except Exception as e:
            raise self._blame(ex, "execute", e) from e
        t1 = clock() if clock else 0.0
        start = self.now
        end = start + pre + step.duration if self._host_in_clock else start + step.duration
        n_pre, n_dec = out.split_counts()
        try:
            done = policy.update(out, step, start, end)
        except Exception as e:
            raise self._blame(policy, "update", e) from e
        for r in done:
            r.finish_reason = ex.finish_reason(r)
        if out.swapped_out or out.swapped_in or out.swap_fallbacks:
            swaps = (len(out.swapped_out), len(out.swapped_in),
                     sum(len(p) for _, p in out.swapped_out),
                     sum(len(p) for _, p in out.swapped_in), step.swap_s, len(out.swap_fallbacks))
        else:
            swaps = NO_SWAPS
        self.rows.append((start, step.duration, n_pre, n_dec, len(out.reqs), kv.pool.num_used,
                          kv.num_stored_tokens, len(out.preempted), len(policy.waiting),
                          *swaps, kv.num_used_host_blocks))
        if self._spec_rows is not None:
            self._spec_rows.append(_spec_record(out, step) if step.accepted is not None
                                   else _NO_SPEC)
        token_time, self.now = end, end
        if clock:
            host = pre + clock() - t1
            self._host_s.append(host)
            if self._host_in_clock:   # the update and the bookkeeping after the tokens
                self.now = end + host - pre
        self.guard.progressed(emitted, len(done) + len(out.rejected), self._where)
        self.num_done += len(done) + len(out.rejected)
        if self.progress is not None:
            self.num_tokens += n_pre + n_dec
            self.progress(self.num_done, self.num_tokens)
        return out, done, n_pre, n_dec, token_time

    def _speculated(self, out, step) -> None:
        """A step that ran speculative decodes: check its `accepted` and fill `emitted` and
        `finished` by the default stop rule where the executor left them."""
        acc, spec = step.accepted, out.spec_lens or [0] * len(out.reqs)
        if len(acc) != len(out.reqs) or any(not 0 <= a <= s for a, s in zip(acc, spec)):
            raise ValueError(f"StepResult.accepted={acc[:10]!r}: one count per entry, each "
                             f"from 0 to the entry's drafts (spec_lens={spec[:10]!r})")
        if step.emitted is None or step.finished is None:
            emitted, ended = self.executor.speculative_ends(out, acc)
            if step.emitted is None:
                step.emitted = emitted
            if step.finished is None:
                step.finished = ended
        else:   # an executor's own: at most what the step computed, a token at least if it ends
            em, fin = step.emitted, set(step.finished)
            if len(em) != len(acc) or any(
                    not (1 if i in fin else 0) <= m <= (1 + a if s else 1)
                    for i, (m, a, s) in enumerate(zip(em, acc, spec))):
                raise ValueError(f"StepResult.emitted={em[:10]!r}: one count per entry, at "
                                 "most 1 + its accepted drafts (1 for an ordinary entry), at "
                                 f"least 1 for an entry that ends (accepted={acc[:10]!r}, "
                                 f"finished={step.finished[:10]!r})")
        self._emitted = sum(1 for m in step.emitted if m)

    # -- the stepping call ----------------------------------------------------------------------
    def clock(self) -> float:
        """The engine's clock (`now`), for what reads it between steps (admission control)."""
        return self.now

    @property
    def blocked(self) -> bool:
        """The policy scheduled nothing with only queued requests: the engine waits for an input
        (`wake`)."""
        return self._blocked

    def next_event_time(self) -> float:
        """When this engine steps next: its clock while it has work and is not blocked (waiting
        for an input after a batch that scheduled nothing); inf otherwise."""
        return _INF if self._blocked or not self.policy.has_work() else self.now

    def wake(self, t: float) -> None:
        """An input reaches the engine at t (an arrival, KV landing, any event for a blocked
        engine): an idle or blocked engine's clock moves on to t (a busy one is at or past
        it: the driver handles an event only once no busy engine is behind it)."""
        self._blocked = False
        if self.now < t:
            self.now = t

    def advance(self, until: float | None = None, where: str = "") -> Advanced:
        """Move the engine on: with fast-forward, through runs of steady iterations (every
        running request decoding; one prompt's chunks beside them) that end before `until`,
        then one stepped iteration, unless the runs brought the clock to `until`; returns what
        the last iteration did (`Advanced`). A call whose `until` is at or before the clock (a
        watched engine level with another) steps once. A run that ends requests or emits a first token is
        the call's last iteration, as a stepped one is; runs stop at `until` (no iteration of
        a run starts at or after it: the next input that could reach this engine; a topology
        that watches answers passes the earliest time another engine could send one).
        `until=None`: exactly one stepped iteration, no fast-forward. Called while the engine
        has work and is not blocked (`next_event_time` < inf); an empty batch leaves it
        blocked until its next input, or raises if the policy would never make progress
        (`where`: the replica, prefixed to the message)."""
        if until is not None and self.fast_forward and (self._decoding or self._chunks):
            before = self.now
            ran = self._fast_forward(until)
            if ran is not None:
                finished, first, n_pre, n_dec = ran
                return Advanced(self._last_start, self.now, None, finished, [], n_pre,
                                n_dec, self.now, first)
            if self.now != before and (self.now >= until or not self.policy.has_work()):
                return Advanced(self._last_start, self.now, None, [], [])
        start = self.now
        out, done, n_pre, n_dec, token_time = self._step()
        policy = self.policy
        n = len(out.reqs)
        if not n:
            self._decoding = False
            self._settle_empty(out, where)
        else:
            # every request of the batch decodes next if each decoded, or each emitted a token
            # (a prompt's last chunk too), and the batch held every running request
            self._decoding = not out.preempted and (
                (n_dec == n and n_pre == 0 or self._emitted == n)
                and n == len(policy.running) + len(done) or all_decoding(policy.running))
        return Advanced(start, self.now, out, done, out.rejected, n_pre, n_dec, token_time)

    def stuck(self, where: str = "") -> RuntimeError:
        """The error for a policy that scheduled nothing and never will (`where`: the replica,
        prefixed to the message)."""
        policy, kv = self.policy, self.kv
        return RuntimeError(
            f"{where}policy {policy.name!r} scheduled nothing at t={self.now:.3f}s with "
            f"{len(policy.waiting)} waiting, {len(policy.swapped)} swapped and "
            f"{len(policy.running)} running requests "
            f"and {kv.num_free_blocks}/{kv.num_blocks} KV blocks free; it would never "
            "make progress")

    def _settle_empty(self, out, where: str) -> None:
        """After a step that scheduled nothing: nothing to do if it rejected requests or no
        work is left; blocked until its next input if only queued requests remain (a plug-in
        may wait for more arrivals); with requests running, the policy would never make
        progress (RuntimeError)."""
        policy = self.policy
        if out.rejected or not policy.has_work():
            return
        if not policy.running:
            self._blocked = True
            return
        raise self.stuck(where)

    def run(self, requests: list[Request]) -> list[Request]:
        """Replay `requests` open-loop on this engine alone, over `wake`, `add_request` and
        `advance` up to each arrival: what the topology driver does with one engine
        (`topology.drive(Single(engine), OpenLoop(requests))`, which the run uses), kept for
        tests and tools that hold only an engine. Returns them in arrival order."""
        reqs = sorted(requests, key=_ARRIVAL)
        for r in reqs:
            t = r.arrival_time
            while self.next_event_time() < t:
                self.advance(t)
            self.wake(t)
            self.add_request(r)
        while self.next_event_time() < _INF:
            self.advance(_INF)
        self.finish()
        return reqs

    def finish(self, where: str = "") -> None:
        """The run is over: a blocked engine with work left never made progress; the guard
        checks that every request ended."""
        if self._blocked and self.policy.has_work():
            raise self.stuck(where)
        self.guard.finished()

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


def _spec_record(out, step) -> tuple:
    """An iteration's SPEC_COLUMNS: drafts proposed and accepted, speculative entries, the
    tokens they emitted."""
    proposed = accepted = steps = tokens = 0
    for s, a, m in zip(out.spec_lens, step.accepted, step.emitted):
        if s:
            proposed += s
            accepted += a
            steps += 1
            tokens += m
    return proposed, accepted, steps, tokens
