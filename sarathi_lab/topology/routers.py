"""The router contract: which replica of a fleet serves each arriving request.

A plug-in router subclasses `Router`, declares its settings as a dataclass (`config_class`,
parsed from the ``cluster`` config node: every key but ``num_replicas`` and ``router``) and
implements `route`. It is constructed as ``cls(cfg, num_replicas, seed)`` (seed: the run's), and
chosen by ``cluster.router=<name>`` (built-in table or entry-point group ``sarathi_lab.routers``)
or a dotted path (``cluster.router=my_pkg.mod:MyRouter``).

`route(req, replicas, now)` is called once per arrival, in arrival order, when the fleet's clock
reaches it; it returns the index of the replica that takes the request. Each `ReplicaView` says
what a router in front of real servers knows at that moment: the requests it has sent that are
neither finished nor rejected yet (`num_outstanding`), the prompt tokens of those whose first
token has not come back yet (`outstanding_tokens`: the prefill the replica still owes, as a
proxy that streams responses can tell), both counted exactly at `now`, and the replica's prefix
cache (`cached_prefix_len`). `view.engine` is the replica itself, to read and never to change: its
policy and KV state are as of the end of the iteration it is running at `now`.
"""
from __future__ import annotations

import abc
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Sequence

from sarathi_lab.settings import setting

if TYPE_CHECKING:
    from sarathi_lab.engine import Engine
    from sarathi_lab.request import Request


class ReplicaView:
    """One replica as its router sees it; the fleet driver keeps the counts."""
    __slots__ = ("index", "engine", "num_outstanding", "outstanding_tokens")

    def __init__(self, index: int, engine: Engine):
        self.index = index
        self.engine = engine
        self.num_outstanding = 0      # requests sent here, not finished or rejected by `now`
        self.outstanding_tokens = 0   # prompt tokens of those without a first token by `now`

    def cached_prefix_len(self, req: Request) -> int:
        """Prompt tokens of `req` this replica's prefix cache holds now (full blocks)."""
        return self.engine.kv.cached_prefix_len(req)

    def load(self, kind: str) -> tuple[int, int]:
        """A sort key, least loaded first. `tokens`: outstanding prompt tokens, then requests;
        `requests`: outstanding requests, then prompt tokens."""
        if kind == "tokens":
            return self.outstanding_tokens, self.num_outstanding
        return self.num_outstanding, self.outstanding_tokens

    def __repr__(self):
        return (f"ReplicaView({self.index}, outstanding={self.num_outstanding}, "
                f"tokens={self.outstanding_tokens})")


@dataclass
class RouterConfig:
    """Settings shared by every router (none yet); plug-ins subclass it."""


class Router(abc.ABC):
    name: ClassVar[str] = ""
    config_class: ClassVar[type] = RouterConfig

    def __init__(self, cfg, num_replicas: int, seed: int = 0):
        self.cfg = cfg
        self.num_replicas = num_replicas
        self.seed = seed

    @classmethod
    def parse_config(cls, values: dict, where: str = "cluster"):
        """Typed settings from the ``cluster`` node (without num_replicas and router)."""
        from sarathi_lab.settings import parse
        return parse(cls.config_class, values, where, f"router {cls.name or cls.__qualname__!r}")

    def check(self, replicas: Sequence[ReplicaView]) -> None:
        """Before the first arrival: raise ValueError if this fleet cannot serve the router's
        purpose (the message names the setting to change)."""

    @abc.abstractmethod
    def route(self, req: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        """The index (0 .. len(replicas) - 1) of the replica that takes `req`, arriving at
        `now`. Called once per request, in arrival order."""


def least_loaded(replicas: Sequence[ReplicaView], kind: str) -> int:
    """The replica with the least load of `kind`; the lowest index among equals."""
    best, best_load = 0, None
    for v in replicas:
        x = v.load(kind)
        if best_load is None or x < best_load:
            best, best_load = v.index, x
    return best


class RoundRobin(Router):
    """Replica 0, 1, ..., N - 1, 0, ...: blind to load."""
    name = "round_robin"

    def __init__(self, cfg, num_replicas: int, seed: int = 0):
        super().__init__(cfg, num_replicas, seed)
        self._next = 0

    def route(self, req, replicas, now):
        j = self._next
        self._next = (j + 1) % len(replicas)
        return j


@dataclass
class LeastLoadedConfig(RouterConfig):
    load: str = setting("tokens", choices=("tokens", "requests"),
                        help="tokens: prompt tokens not yet answered by a first token | "
                             "requests: outstanding requests (each breaks the other's ties)")


class LeastLoaded(Router):
    """The replica with the least outstanding load (tokens: least outstanding prefill tokens;
    requests: least outstanding requests, Vidur's `lor`)."""
    name = "least_loaded"
    config_class = LeastLoadedConfig

    def route(self, req, replicas, now):
        return least_loaded(replicas, self.cfg.load)


class PowerOfTwo(Router):
    """Power of two choices (Mitzenmacher): two distinct replicas drawn at random (seeded by
    the run's seed), the less loaded of them; the first drawn among equals."""
    name = "power_of_two"
    config_class = LeastLoadedConfig

    def __init__(self, cfg, num_replicas: int, seed: int = 0):
        super().__init__(cfg, num_replicas, seed)
        self._rng = random.Random(seed)

    def route(self, req, replicas, now):
        if len(replicas) < 2:
            return 0
        a, b = self._rng.sample(range(len(replicas)), 2)
        kind = self.cfg.load
        return b if replicas[b].load(kind) < replicas[a].load(kind) else a


@dataclass
class PrefixAffinityConfig(LeastLoadedConfig):
    min_match_tokens: int = setting(1, ge=1, help="a shorter cached prefix counts as no hit")
    balance_tokens: int | None = setting(
        None, ge=0, help="null: always follow the cache | N: go least loaded instead when the "
                         "cache's replica owes more than N prefill tokens above the least")


class PrefixAffinity(Router):
    """The replica holding the longest cached prefix of the prompt (the least loaded among
    equals); least loaded when no replica holds at least `min_match_tokens`. With
    `balance_tokens`, a hit is given up for load when the gap in outstanding tokens exceeds it
    (SGLang's cache-aware router keeps such a guard against hot spots)."""
    name = "prefix_affinity"
    config_class = PrefixAffinityConfig

    def check(self, replicas):
        off = [v.index for v in replicas if not v.engine.kv.enable_prefix_caching]
        if off:
            raise ValueError(f"cluster.router={self.name}: replicas {off} have no prefix cache "
                             "(set scheduler.enable_prefix_caching=true)")

    def route(self, req, replicas, now):
        kind = self.cfg.load
        lens = [v.cached_prefix_len(req) for v in replicas]
        longest = max(lens)
        fallback = least_loaded(replicas, kind)
        if longest < self.cfg.min_match_tokens:
            return fallback
        best = least_loaded([v for v, n in zip(replicas, lens) if n == longest], kind)
        gap = self.cfg.balance_tokens
        if gap is not None and \
                replicas[best].outstanding_tokens - replicas[fallback].outstanding_tokens > gap:
            return fallback
        return best
