"""Fast-forward, the engine's side: runs of steady iterations computed at once (the simulator's
speed).

A steady decode run (every running request decodes, k times) and a chunked prefill beside
steady decodes are run at once, exactly as k single steps would run them: the policy's
declared `FastForward` (schedulers/mechanics/fast_forward.py, the policy's side) says when a
run is steady and advances its requests; the executor prices the k iterations in one call
(`decode_run`, `chunk_run`). `Engine.advance` calls `_fast_forward` before it steps; kept
apart from engine.py so that a reader of the loop reads the loop; the engine inherits these
methods (`FastForwardRuns`), so they run on the engine's own state.
"""
from __future__ import annotations

from bisect import bisect_right
from operator import attrgetter

import numpy as np

from sarathi_lab.request import Request, Status

_COMPUTED = attrgetter("num_computed_tokens")
NO_SWAPS = (0, 0, 0, 0, 0.0, 0)   # the swap columns of an iteration that swapped nothing


def all_decoding(reqs: list[Request]) -> bool:
    # Request.is_decoding, inlined: asked after most iterations; from the latest admitted,
    # which are the ones still in their prompts
    for r in reversed(reqs):
        n = r.num_output_tokens
        if not n or r.num_computed_tokens != r.num_prompt_tokens + n - 1:
            return False
    return True


class FastForwardRuns:
    """The runs of `Engine` (which defines every attribute used here)."""

    def _fast_forward(self, until: float):
        """Run steady runs while the policy declares them, each stopping before `until`: decode
        runs while every running request decodes (the last batch preempted nothing), a
        prompt's chunks beside steady decodes otherwise. Returns (requests ended, requests whose
        first token came out, prefill tokens, decode tokens) of a run's last iteration that
        ended requests or emitted a first token (the caller's to see; `_last_start` is when
        that iteration started), else None."""
        policy, rows = self.policy, self.rows
        while self.now < until:   # the caller's engine has work; after a run, asked below
            if self._decoding:
                if not self._fold and rows and until - self.now < 2 * rows[-1][1]:
                    # without the stop rule a run stops before the iteration that ends a
                    # request and needs 2 steps before the bound, and the next decode step takes
                    # about the last step's time or more: not worth pricing (engines of a fleet
                    # that watches answers are bounded by each other's clocks, a step or so
                    # ahead). With it, a run of one iteration costs less than a step. Stepping
                    # instead is exact: this saves time only
                    return None
                ended = self._skip_decodes(until, self._fold) if self._steady() else None
                if ended is None:
                    return None
                if ended:   # the run's last iteration ended them
                    return ended, [], 0, len(policy.running) + len(ended)
                if not policy.has_work():
                    return None
                continue
            if not self._chunks:
                return None
            first = self._skip_chunks(until)
            if first is None:
                return None
            self._decoding = all_decoding(policy.running)   # after the prompt's last chunk
            if first:
                return [], first, self._last_chunk, len(policy.running) - 1
        return None

    def _steady(self) -> bool:
        """Whether the policy says its next batches are one decode of every running request;
        a swap-in that could happen now is the next batch's, which a run would skip."""
        policy = self.policy
        return bool(policy.running) and self._ff.steady_decode(policy) \
            and not (policy.swapped and policy.swap_in_possible())

    def _ends(self, durs: list[float], next_arrival: float) -> list[float]:
        """The clocks at which iterations of durations `durs` end, left to right from `now` as
        single steps add them (the same rounding). Iteration j starts at the end of j - 1, and
        arrivals at or before a start are admitted first: a run stops at the first end at or
        after the next arrival."""
        times, t = [], self.now
        for d in durs:
            t += d
            times.append(t)
            if t >= next_arrival:
                break
        return times

    def _priced(self, ctx: np.ndarray, k: int, next_arrival: float) -> list[float]:
        """decode_run's durations of the run's first steps, up to k: priced in pieces (the
        first sized by the last step's time, then doubling) until the steps priced end at or
        after `next_arrival` (where `_ends` stops the run). Where events come a few steps apart (a fleet, sessions), pricing all k steps --
        a request's whole remaining output -- at every attempt cost more than stepping did.
        Exact: step j is priced at contexts ctx + j whichever piece holds it."""
        ex = self.executor
        durs: list[float] = []
        # first piece: the steps the last step's time says fit before the bound, and one more
        # (a decode step takes about as long as the one before it, or a little longer)
        span, last = next_arrival - self.now, self.rows[-1][1] if self.rows else 0.0
        n = k if last <= 0 or span >= k * last else min(k, max(2, int(span / last) + 2))
        t = self.now
        while True:
            part = ex.decode_run(ctx + len(durs) if durs else ctx, n).tolist()
            durs += part
            for d in part:   # as `_ends` adds them
                t += d
            if len(durs) >= k or t >= next_arrival:
                return durs
            n = min(2 * n, k - len(durs))

    def _skip_chunks(self, next_arrival: float) -> list | None:
        """Run k batches at once of one decode of every running request but one and a chunk of
        that one's prompt, as the policy's `steady_chunks` offers them, stopping before an
        arrival is due, before a batch that would end a request or run out of KV, and at the
        prompt's last chunk (before it if a request waits: that batch could admit it). Produces
        exactly what k single steps would, through the policy's `advance_chunks`; each batch
        is recorded as `_step` records it. None if it ran none, else [req] if the run's last
        chunk emitted its first token, else []."""
        policy, kv = self.policy, self.kv
        offer = self._ff.steady_chunks(policy)
        if offer is None:
            return None
        req, chunk = offer
        stops = self._stops
        computed = req.num_computed_tokens
        todo = req.num_prompt_tokens + req.num_output_tokens - computed
        n_chunks = -(-todo // chunk)
        # the last chunk is stepped: while a request waits (its leftover budget could admit
        # it), if the first token ends the request, and if it is a recomputed request's last
        # token alone (a batch counts that entry as a decode)
        last_ok = not policy.waiting and req.num_output_tokens + 1 < stops[req.request_id] \
            and not (req.num_output_tokens and todo - chunk * (n_chunks - 1) == 1)
        k = n_chunks if last_ok else n_chunks - 1
        if k < 1:
            return None
        decodes = [r for r in policy.running if r is not req]
        for r in decodes:   # batch j (from 1) ends a decode with j tokens left: none may end
            left = stops[r.request_id] - r.num_output_tokens
            if left <= k:
                k = left - 1
        if k < 1:
            return None
        chunks = [chunk] * k
        if k == n_chunks:
            chunks[-1] = todo - chunk * (k - 1)
        ctx = list(map(_COMPUTED, decodes))
        durs = self.executor.chunk_run(ctx, computed, chunks, k == n_chunks)
        if durs is None:
            return None
        times = self._ends(durs, next_arrival)
        k = len(times)
        extra = kv.decode_growth_list(decodes, ctx, k)
        free = kv.pool.num_free
        if extra[-1] > free:
            k = bisect_right(extra, free)
            if k < 1:
                return None
            del times[k:], extra[k:]
        del chunks[k:]
        B = len(decodes)
        used, stored = kv.pool.num_used, kv.num_stored_tokens
        waiting, host = len(policy.waiting), kv.num_used_host_blocks
        try:
            self._ff.advance_chunks(policy, times, req, chunks)
        except Exception as e:
            raise self._blame(policy, "fast_forward.advance_chunks", e) from e
        assert kv.num_used_blocks == used + extra[-1] \
            and kv.num_stored_tokens == stored + B * k + sum(chunks) \
            and req.num_computed_tokens == computed + sum(chunks), \
            "advance_chunks did not do what k batches would"
        start, rows = self.now, self.rows
        for j, (c, end) in enumerate(zip(chunks, times)):
            stored += B + c
            rows.append((start, durs[j], c, B, B + 1, used + extra[j], stored, 0, waiting,
                         *NO_SWAPS, host))
            start = end
        emitted = B + (k == n_chunks)   # the prompt's last chunk samples its first token
        for _ in range(k - 1):
            self.guard.progressed(B, 0, self._where)
        self.guard.progressed(emitted, 0, self._where)
        self._last_start, self._last_chunk = times[-2] if k > 1 else self.now, chunks[-1]
        self.now = times[-1]
        return [req] if k == n_chunks else []

    def _skip_decodes(self, next_arrival: float, fold: bool) -> list | None:
        """Run k identical decode-only iterations at once: same requests, contexts +1 each step,
        stopping before an arrival is due or KV would run out, and at the first iteration that
        ends a request: with `fold`, that iteration is the run's last (its requests end in
        it), else the run stops before it (and needs k >= 2). Produces exactly what k single
        steps would, through the policy's `advance_decodes`. None if it ran none, else the
        requests that ended in its last iteration (a list, empty without `fold`)."""
        policy, kv, ex = self.policy, self.kv, self.executor
        running = policy.running
        stops = self._stops
        if stops is not None:   # the default stop rule, read directly: asked after most steps
            left = [stops[r.request_id] - r.num_output_tokens for r in running]
            k_end = min(left)
        else:
            k_end = int(ex.tokens_left(running).min())
        # iteration k_end ends the requests with the fewest tokens left
        k = k_end if fold else k_end - 1
        if k < (1 if fold else 2):
            return None
        B = len(running)
        ctx = np.fromiter(map(_COMPUTED, running), np.int64, B)
        # a run is a few dozen steps of a few dozen requests: past the executor's prices, it is
        # counted in lists, where numpy's per-call cost would be most of the work
        durs = self._priced(ctx, k, next_arrival)
        times = self._ends(durs, next_arrival)
        k = len(times)
        # blocks beyond today's after each step (non-decreasing)
        extra = kv.decode_growth_list(running, ctx.tolist(), k)
        free = kv.pool.num_free
        if extra and extra[-1] > free:
            k = bisect_right(extra, free)
        if k < (1 if fold else 2):
            return None
        ended = [r for r, n in zip(running, left) if n == k] if fold and k == k_end else ()
        del times[k:]
        del durs[k:], extra[k:]
        n_steady = k - 1 if ended else k   # iterations recorded as a run; a finish: a row
        ends = times[:n_steady]   # taken before the policy sees `times`
        used_before, stored_before = kv.pool.num_used, kv.num_stored_tokens
        waiting = len(policy.waiting)   # nothing arrives or is admitted inside the run
        try:
            done = self._ff.advance_decodes(policy, times, ended)
        except Exception as e:
            raise self._blame(policy, "fast_forward.advance_decodes", e) from e
        if ended:
            holders = kv.block_counts()
            assert list(done or ()) == ended and all(
                r.status is Status.FINISHED and r.request_id not in holders for r in ended) \
                and kv.num_stored_tokens == stored_before + B * k \
                - sum(r.num_computed_tokens for r in ended) \
                and kv.num_used_blocks <= used_before + extra[-1], \
                "advance_decodes did not do what k decode steps would"
        else:
            assert kv.num_used_blocks == used_before + extra[-1] \
                and kv.num_stored_tokens == stored_before + B * k, \
                "advance_decodes did not do what k decode steps would"
        if n_steady:
            self._runs.append((len(self.rows) + self._n_skipped, self.now, durs[:n_steady],
                               ends, extra[:n_steady], B, used_before, stored_before, waiting,
                               kv.num_used_host_blocks))
            self._n_skipped += n_steady
        if ended:   # the last iteration, recorded as `_step` would (KV after the finishes)
            start = ends[-1] if k > 1 else self.now
            self.rows.append((start, float(durs[-1]), 0, B, B, kv.pool.num_used,
                              kv.num_stored_tokens, 0, waiting, *NO_SWAPS,
                              kv.num_used_host_blocks))
            for r in ended:
                r.finish_reason = ex.finish_reason(r)
            self.num_done += len(ended)
            self.guard.progressed(B, len(ended), self._where)
            if self.progress is not None:
                self.progress(self.num_done, self.num_tokens)
        self._last_start = times[-2] if k > 1 else self.now
        self.now = times[-1]
        return list(ended)
