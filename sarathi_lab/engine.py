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
        self.progress = progress          # callable(num_done) or None
        self.rows: list[tuple] = []       # one per iteration, fields as ITER_COLUMNS
        self.now = 0.0

    @property
    def iters(self) -> dict[str, list]:
        cols = list(zip(*self.rows)) if self.rows else [()] * len(ITER_COLUMNS)
        return {c: list(v) for c, v in zip(ITER_COLUMNS, cols)}

    def run(self, requests: list[Request]) -> list[Request]:
        reqs = sorted(requests, key=lambda r: r.arrival_time)
        policy, kv, ex = self.policy, self.kv, self.executor
        record = self.rows.append
        i, n_total, n_done = 0, len(reqs), 0
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
            out = policy.schedule(self.now)
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
            step = ex.execute(out)
            start, end = self.now, self.now + step.duration
            n_pre, n_dec = out.split_counts()
            done = policy.update(out, step.sampled, start, end)
            record((start, step.duration, n_pre, n_dec, len(out), kv.pool.num_used,
                    kv.num_stored_tokens, len(out.preempted)))
            self.now = end
            if done or out.rejected:
                n_done += len(done) + len(out.rejected)
                if self.progress is not None:
                    self.progress(n_done)
            if (self.fast_forward and not done and not out.preempted and policy.running
                    and len(out) == len(policy.running) and policy.steady_decode()
                    and all(n == 1 for n in out.num_new_tokens)
                    and all(r.is_decoding for r in policy.running)):
                self._skip_decodes(reqs[i].arrival_time if i < n_total else float("inf"))
        return reqs

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
        ctx = np.fromiter((r.num_computed_tokens for r in running), np.int64, len(running))
        durs = self.executor.decode_run(ctx, k)
        # left to right from `now`, as k single steps would add them (same rounding)
        ends = np.cumsum(np.concatenate(([self.now], durs)))[1:]
        # iteration j starts at ends[j-1]; arrivals at or before a start are admitted first
        k = min(k, int(np.searchsorted(ends, next_arrival, side="left")) + 1)
        bs = kv.block_size
        held = np.fromiter((len(kv.req_blocks[r.request_id]) for r in running), np.int64,
                           len(running))
        steps = np.arange(1, k + 1)[:, None]
        extra = np.maximum(0, -(-(ctx[None, :] + steps) // bs) - held[None, :]).sum(axis=1)
        if kv.reserve:
            extra[:] = 0
        while k >= 2 and extra[k - 1] > kv.num_free_blocks:
            k -= 1
        if k < 2:
            return
        durs, ends, extra = durs[:k], ends[:k], extra[:k]
        start0 = self.now
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
        B = len(running)
        used = (kv.num_used_blocks - int(extra[-1]) + extra).tolist()
        stored = (kv.num_stored_tokens - B * k + B * np.arange(1, k + 1)).tolist()
        starts = [start0] + times[:-1]
        self.rows.extend(zip(starts, durs.tolist(), [0] * k, [B] * k, [B] * k, used, stored,
                             [0] * k))
        self.now = times[-1]

