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

Here are the load's settings (`ThinkTime`, `ClientSettings`); the users themselves are a source of
events on the topology driver's clock (`topology.clients.ClosedLoop`), so they work on every
topology (one engine, a fleet, pipeline stages, disaggregated pools), and every output
(requests.parquet, iterations.parquet, summary.json) is that of an open-loop run on it, with the
user of each request (`client`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sarathi_lab.settings import ConfigError, parse, setting

THINK_DISTS = ("constant", "exponential", "lognormal", "uniform")
THINK_STREAM = 0x7417   # apart from the trace's arrival and length streams
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
