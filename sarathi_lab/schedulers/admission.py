"""Admission control, for any policy: refuse a request on arrival instead of letting the
waiting queue grow without bound, or serving a request that cannot meet its deadline anyway.

Two shared settings (`SchedulerConfig`), each off by default:

- `max_queue_len`: an arrival that finds that many requests waiting is rejected.
- `deadline_admission`: an arrival with a TTFT deadline is rejected if its predicted first
  token comes after it. The prediction is a running estimate, not the cost model (the policy
  does not see the executor, and a real server has no cost model either): the prompt tokens
  that will be computed before its first token -- the rest of every prompt under way, the
  waiting requests the queue ranks ahead of it, its own prompt -- at the prefill rate the
  server has just shown, prefill tokens per second of the last `RATE_WINDOW` iterations that
  computed prompt tokens (decodes sharing those iterations slow them, and so are in the rate).
  Before the first such iteration there is no estimate and only a deadline already past is
  refused. The estimate ignores requests that will arrive later and rank ahead (priority,
  EDF): it errs towards admitting.

It lives with the policy, not in a wrapper around it, so it composes with every policy and
queue, built-in or plug-in, without forwarding each hook; the policy calls it at arrival
(`add_request`) and feeds it each stepped iteration (`update`; a fast-forwarded run computes no prompt tokens
while admission control is on: `mechanics/fast_forward.py`); it reads the engine's clock.
"""
from __future__ import annotations

from collections import deque

# Iterations with prefill in the rate estimate: a few requests' worth of chunks, so that one
# odd iteration does not swing it, while it still follows a change of load within seconds.
RATE_WINDOW = 64


class AdmissionControl:
    def __init__(self, max_queue_len: int | None, deadline: bool):
        self.max_queue_len = max_queue_len
        self.deadline = deadline
        self._clock = None                   # the engine's clock (`bind_clock`)
        self._window: deque = deque()        # (prefill tokens, seconds) per iteration
        self._tokens = 0
        self._seconds = 0.0

    def bind_clock(self, clock) -> None:
        """`clock()`: the time now, the engine's clock (the engine binds it; no copy of it is
        kept here, which fast-forwarded runs would have to patch)."""
        self._clock = clock

    def observe(self, prefill_tokens: int, start: float, end: float) -> None:
        if not (self.deadline and prefill_tokens):
            return
        w = self._window
        w.append((prefill_tokens, end - start))
        self._tokens += prefill_tokens
        self._seconds += end - start
        if len(w) > RATE_WINDOW:
            n, s = w.popleft()
            self._tokens -= n
            self._seconds -= s

    @property
    def prefill_rate(self) -> float | None:
        """Prefill tokens per second over the window, or None before any."""
        return self._tokens / self._seconds if self._window and self._seconds > 0 else None

    def predicted_ttft(self, req, policy) -> float:
        """Seconds from arrival to the first token of `req`, arriving now (not yet queued)."""
        # it waits at least for the iteration under way (unbound, outside an engine: none)
        now = req.arrival_time if self._clock is None else max(req.arrival_time, self._clock())
        rate = self.prefill_rate
        if rate is None:
            return now - req.arrival_time
        work = req.num_tokens_to_compute
        work += sum(r.num_tokens_to_compute for r in policy.running if not r.is_decoding)
        work += sum(r.num_tokens_to_compute for r in policy.waiting.ahead(req))
        return now - req.arrival_time + work / rate

    def refusal(self, req, policy) -> str | None:
        """Why `req`, arriving now, is refused, or None (then the policy queues it)."""
        n = len(policy.waiting)
        if self.max_queue_len is not None and n >= self.max_queue_len:
            return (f"waiting queue full: {n} requests wait "
                    f"(scheduler.max_queue_len={self.max_queue_len})")
        if not self.deadline or req.deadline is None:
            return None
        ttft = self.predicted_ttft(req, policy)
        req.extra["predicted_ttft"] = ttft
        if req.arrival_time + ttft > req.deadline:
            rate = self.prefill_rate
            return (f"predicted TTFT {ttft:.3f}s exceeds its deadline of "
                    f"{req.deadline - req.arrival_time:.3f}s (deadline_admission, "
                    + (f"{rate:.0f} prefill tokens/s measured)" if rate else "no rate yet)"))
        return None
