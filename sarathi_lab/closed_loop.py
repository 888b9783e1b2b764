"""Closed-loop clients: N users, each sending its next request a think time after its previous
answer ended, so that the load adapts to the server (the usual benchmark client) instead of
arriving regardless of it (open-loop replay, `Engine.run`).

The trace gives the requests and their order (its arrival times are not used): whenever a user is
ready, it sends the next request of the trace not yet sent, its `arrival_time` being the moment it
is sent (a relative deadline moves with it). Every user starts with one think time from 0, so a
random think time staggers the first requests. A user whose request is rejected has its answer
then: when the engine took it (sent during an iteration, a request is taken when the iteration
ends, as in open-loop replay), or when the policy rejected it later; it thinks from then on. Users ready at the same
instant send in user order. Each user draws its think times from a stream of its own (seeded by
the trace's seed), so its sequence of think times does not depend on the schedule.

The driver calls only the engine's public loop (`add_request`, `step`, `skip_ahead`), so every
output (requests.parquet, iterations.parquet, summary.json) is that of an open-loop run.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from sarathi_lab.settings import ConfigError, parse, setting

THINK_DISTS = ("constant", "exponential", "lognormal", "uniform")
_THINK_STREAM = 0x7417   # apart from the trace's arrival and length streams
_NEEDS = {"constant": ("mean",), "exponential": ("mean",), "lognormal": ("mean", "sigma"),
          "uniform": ("low", "high")}


@dataclass
class ThinkTime:
    """A user's pause between an answer and its next request (``trace.think_time``): a number
    (that many seconds, always) or ``{dist: constant | exponential | lognormal | uniform, ...}``."""
    dist: str = setting("constant", choices=THINK_DISTS, help="the distribution")
    mean: float | None = setting(None, ge=0, help="s; constant, exponential, lognormal")
    sigma: float | None = setting(None, ge=0, help="lognormal: sigma of the underlying normal")
    low: float | None = setting(None, ge=0, help="uniform: s, inclusive")
    high: float | None = setting(None, ge=0, help="uniform: s, inclusive")

    def validate(self) -> None:
        need = _NEEDS[self.dist]
        for key in ("mean", "sigma", "low", "high"):
            given = getattr(self, key) is not None
            if key in need and not given:
                raise ValueError(f"{key}: dist={self.dist} needs it")
            if key not in need and given:
                raise ValueError(f"{key}={getattr(self, key)!r}: not read by dist={self.dist} "
                                 f"(it reads {', '.join(need)})")
        if self.dist == "uniform" and self.low > self.high:
            raise ValueError(f"low={self.low}: must be <= high={self.high}")
        if self.dist == "lognormal" and self.mean == 0:
            raise ValueError("mean=0: a lognormal needs mean > 0 (use dist=constant)")

    @classmethod
    def from_spec(cls, spec, where: str = "trace.think_time") -> "ThinkTime":
        """None: no pause; a number: that many seconds; a mapping: checked as ThinkTime."""
        if spec is None:
            return cls("constant", 0.0)
        if isinstance(spec, (int, float)) and not isinstance(spec, bool):
            return parse(cls, {"mean": spec}, where)
        if not isinstance(spec, dict):
            raise ConfigError(f"{where}={spec!r}: must be a number of seconds or a mapping "
                              f"{{dist: {' | '.join(THINK_DISTS)}, ...}}")
        return parse(cls, spec, where)

    def sampler(self, rng: np.random.Generator):
        """A function () -> one think time in seconds, drawing from `rng`."""
        if self.dist == "constant":
            return lambda: self.mean
        if self.dist == "exponential":
            return lambda: float(rng.exponential(self.mean))
        if self.dist == "uniform":
            return lambda: float(rng.uniform(self.low, self.high))
        mu = np.log(self.mean) - self.sigma ** 2 / 2   # so that the draws average `mean`
        return lambda: float(rng.lognormal(mu, self.sigma))


@dataclass
class ClientSettings:
    """The trace node's keys that choose the load generator (every trace config has them)."""
    clients: int | None = setting(None, ge=1, help="closed loop: this many users; null: "
                                                   "open-loop replay of the trace's arrivals")
    think_time: float | dict | None = setting(None, help="closed loop: seconds, or {dist: ...}; "
                                                         "null: 0")

    def check_clients(self) -> None:
        if self.think_time is not None:
            if self.clients is None:
                raise ValueError(f"think_time={self.think_time!r}: read only with clients=N "
                                 "(closed loop)")
            try:
                ThinkTime.from_spec(self.think_time, "think_time")
            except ConfigError as e:
                raise ValueError(str(e)) from None


def run_closed_loop(engine, requests: list, clients: int, think: ThinkTime,
                    seed: int = 0) -> list[int]:
    """Serve `requests` (in this order) to `clients` closed-loop users on `engine`; each
    request's `arrival_time` becomes the moment its user sent it. Returns the user of each
    request, in the order of `requests`."""
    if clients < 1:
        raise ValueError(f"clients={clients}: must be >= 1")
    draws = [think.sampler(np.random.default_rng([_THINK_STREAM, int(seed), u]))
             for u in range(clients)]
    policy = engine.policy
    ready = [(draws[u](), u) for u in range(clients)]   # (when the user sends, user)
    heapq.heapify(ready)
    owner: dict = {}   # request in flight -> its user
    n, sent = len(requests), 0
    users = [-1] * n

    def answered(req, t: float) -> None:
        u = owner.pop(req)
        heapq.heappush(ready, (t + draws[u](), u))

    def send_due() -> None:
        nonlocal sent
        while sent < n and ready and ready[0][0] <= engine.now:
            t, u = heapq.heappop(ready)
            req = requests[sent]
            sent += 1
            if req.deadline is not None:
                req.deadline = t + (req.deadline - req.arrival_time)
            req.arrival_time = t
            owner[req] = users[sent - 1] = u
            if not engine.add_request(req):
                answered(req, engine.now)   # refused when the engine took it

    def next_send() -> float:
        return ready[0][0] if sent < n and ready else float("inf")

    while True:
        send_due()
        if not policy.has_work():
            if sent == n:
                break
            # nothing runs, so no user waits for an answer: one is ready later
            engine.now = max(engine.now, next_send())
            continue
        start = engine.now
        out, done, n_pre, n_dec = engine.step()
        for r in out.rejected:
            answered(r, start)
        for r in done:
            answered(r, r.finish_time)
        if not out:
            if out.rejected or not policy.has_work():
                continue
            if next_send() < float("inf") and not policy.running:
                engine.now = next_send()   # a plug-in may wait for more arrivals
                continue
            raise RuntimeError(
                f"policy {policy.name!r} scheduled nothing at t={engine.now:.3f}s with "
                f"{len(policy.waiting)} waiting and {len(policy.running)} running requests "
                f"(closed loop, {sent} of {n} requests sent); it would never make progress")
        if engine.fast_forward:
            engine.skip_ahead(out, done, n_pre, n_dec, next_send())
    engine.guard.finished()
    return users
