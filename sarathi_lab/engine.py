"""The loop: admit arrivals, schedule, execute, update, advance the virtual clock."""
from __future__ import annotations

import logging

import numpy as np

from sarathi_lab.executors.base import Executor
from sarathi_lab.request import Request
from sarathi_lab.schedulers.base import Policy

log = logging.getLogger(__name__)

ITER_COLUMNS = ("start", "duration", "prefill_tokens", "decode_tokens", "num_requests",
                "kv_blocks_used", "kv_tokens_stored", "preemptions")


class Engine:
    def __init__(self, policy: Policy, executor: Executor, *, fast_forward: bool = True,
                 progress=None):
        self.policy = policy
        self.executor = executor
        self.kv = policy.kv
        # skipping steady decode runs needs predicted durations and no real tokens
        self.fast_forward = fast_forward and executor.supports_fast_forward
        # progress(num_done, num_tokens), or None: called once per executed iteration with the
        # requests done so far (finished or rejected) and the tokens computed so far in executed
        # iterations (the simulator's fast-forwarded decode runs are not counted)
        self.progress = progress
        # iteration records, fields as ITER_COLUMNS: tuples of the latest stepped iterations,
        # arrays for what came before them and for skipped runs
        self.rows: list[tuple] = []
        self._chunks: list[np.ndarray] = []
        self.now = 0.0

    def _flush(self) -> None:
        if self.rows:
            self._chunks.append(np.array(self.rows, dtype=float))
            self.rows.clear()

    def iterations(self) -> np.ndarray:
        """Every iteration so far, one row each (columns as ITER_COLUMNS)."""
        self._flush()
        if not self._chunks:
            return np.empty((0, len(ITER_COLUMNS)))
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return self._chunks[0]

    @property
    def num_iterations(self) -> int:
        return sum(len(c) for c in self._chunks) + len(self.rows)

    @property
    def iters(self) -> dict[str, list]:
        a = self.iterations()
        return {c: a[:, j].tolist() for j, c in enumerate(ITER_COLUMNS)}

    def run(self, requests: list[Request]) -> list[Request]:
        reqs = sorted(requests, key=lambda r: r.arrival_time)
        policy, kv, ex = self.policy, self.kv, self.executor
        record = self.rows.append
        i, n_total, n_done, n_tok = 0, len(reqs), 0, 0
        while True:
            while i < n_total and reqs[i].arrival_time <= self.now:   # admit
                if not policy.add_request(reqs[i]):
                    n_done += 1
                i += 1
            if not policy.has_work():
                if i == n_total:
                    break
                self.now = max(self.now, reqs[i].arrival_time)   # idle: jump to next arrival
                continue
            try:
                out = policy.schedule(self.now)
            except Exception as e:
                raise self._blame(policy, "schedule", e) from e
            if not out:
                if out.rejected or not policy.has_work():
                    n_done += len(out.rejected)
                    continue
                if i < n_total and not policy.running:
                    self.now = reqs[i].arrival_time   # a plugin may wait for more arrivals
                    continue
                raise RuntimeError(
                    f"policy {policy.name!r} scheduled nothing at t={self.now:.3f}s with "
                    f"{len(policy.waiting)} waiting and {len(policy.running)} running requests "
                    f"and {kv.num_free_blocks}/{kv.num_blocks} KV blocks free; it would never "
                    "make progress")
            try:
                step = ex.execute(out)
            except Exception as e:
                raise self._blame(ex, "execute", e) from e
            start, end = self.now, self.now + step.duration
            n_pre, n_dec = out.split_counts()
            try:
                done = policy.update(out, step.sampled, start, end)
            except Exception as e:
                raise self._blame(policy, "update", e) from e
            record((start, step.duration, n_pre, n_dec, len(out), kv.pool.num_used,
                    kv.num_stored_tokens, len(out.preempted)))
            self.now = end
            if done or out.rejected:
                n_done += len(done) + len(out.rejected)
            if self.progress is not None:
                n_tok += n_pre + n_dec
                self.progress(n_done, n_tok)
            # a batch of nothing but one decode per running request, none finished: if the
            # policy says the next batch would be the same, skip ahead
            if (self.fast_forward and not done and n_pre == 0 and not out.preempted
                    and n_dec == len(out) == len(policy.running) and policy.steady_decode()):
                self._skip_decodes(reqs[i].arrival_time if i < n_total else float("inf"))
        return reqs

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

    def _skip_decodes(self, next_arrival: float) -> None:
        """Run k identical decode-only iterations at once: same requests, contexts +1 each step,
        stopping before any request finishes, an arrival is due, or KV would run out. Produces
        exactly what k single steps would."""
        policy, kv = self.policy, self.kv
        running = policy.running
        # no request may finish inside the run: the last of it is taken by the normal loop
        k = min(r._stop_at - r.num_output_tokens for r in running) - 1
        if k < 2:
            return
        table, B = kv.req_blocks, len(running)
        state = np.array([(r.num_computed_tokens, len(table[r.request_id])) for r in running])
        ctx, held = state[:, 0], state[:, 1]
        durs = self.executor.decode_run(ctx, k)
        # left to right from `now`, as k single steps would add them (same rounding)
        ends = np.cumsum(np.concatenate(([self.now], durs)))[1:]
        # iteration j starts at ends[j-1]; arrivals at or before a start are admitted first
        k = min(k, int(np.searchsorted(ends, next_arrival, side="left")) + 1)
        # blocks the batch holds beyond today's after each step
        if kv.reserve:
            extra = np.zeros(k, np.int64)
        else:
            need = -(-(ctx + np.arange(1, k + 1)[:, None]) // kv.block_size) - held
            extra = np.maximum(need, 0).sum(axis=1)
            k = min(k, int(np.searchsorted(extra, kv.num_free_blocks, side="right")))
        if k < 2:
            return
        durs, ends = durs[:k], ends[:k]
        times = ends.tolist()
        ok = kv.allocate_decodes(running, k)   # blocks for all k tokens: the end state of k steps
        assert ok or kv.enable_prefix_caching
        if not ok:
            for r in running:
                kv.allocate_slots(r, k)
        for r in running:
            r.num_computed_tokens += k
            r.num_output_tokens += k
            r.token_times.extend(times)
        run = np.zeros((k, len(ITER_COLUMNS)))
        run[0, 0], run[1:, 0] = self.now, ends[:-1]          # start
        run[:, 1] = durs                                     # duration
        run[:, 3] = run[:, 4] = B                            # decode tokens, requests
        run[:, 5] = kv.num_used_blocks - extra[k - 1] + extra[:k]
        run[:, 6] = kv.num_stored_tokens - B * np.arange(k - 1, -1, -1)
        self._flush()
        self._chunks.append(run)
        self.now = times[-1]

