"""A fleet: N engines behind a router, on the driver's clock (`Fleet`); one engine (`Single`).

Each replica is a whole `Engine` (its own policy, KV cache and executor) moved by its one
stepping call, `Engine.advance(until)`. The busy engine furthest behind advances next (lowest
index among equals), and the driver handles an arrival before any engine steps past it: a
request is routed when the fleet's clock reaches it, and every engine's fast-forward stops at
the next event (the router may send it there) and, when the load watches requests end
(closed-loop clients), at the other engines' clocks (an answer there may become a request
here): that is the `until` the fleet passes. One engine no one watches advances to the next
event in one go (`Single`); a fleet of one reproduces it exactly.

What the router sees (`routers.ReplicaView`): per replica, the requests it was sent that had not
finished or been rejected at the arrival's time, and the prompt tokens of those that had not
emitted a first token yet, counted exactly at that time (a request that ends in an iteration
still running at that time is still outstanding), and the replica's prefix cache.
"""
from __future__ import annotations

import heapq
import math
from numbers import Integral

from sarathi_lab.engine import Engine
from sarathi_lab.engine.guard import RuleViolation
from sarathi_lab.metrics import iterations_table, summarize
from sarathi_lab.request import Request
from sarathi_lab.topology.accounting import plugin
from sarathi_lab.topology.driver import Topology
from sarathi_lab.topology.results import (
    iterations_frame,
    one_kv_size,
    pooled_prefix,
    replica_column,
    replica_gpus,
    requests_frame,
)
from sarathi_lab.topology.routers import ReplicaView, Router


class Counts:
    """A pool's `ReplicaView`s, counted exactly as of the time a router asks: a change made by
    an iteration that ends later waits in a heap until then."""

    def __init__(self, engines: list[Engine]):
        self.views = [ReplicaView(j, e) for j, e in enumerate(engines)]
        self._changes: list[tuple] = []   # (time, seq, replica, tokens, requests)
        self._seq = 0

    def add(self, j: int, tokens: int) -> None:
        """A request of `tokens` prompt tokens sent to replica j now."""
        self.views[j].num_outstanding += 1
        self.views[j].outstanding_tokens += tokens

    def remove(self, t: float, j: int, tokens: int, requests: int = 1) -> None:
        """From time t on, replica j owes `tokens` fewer prompt tokens and has `requests`
        fewer outstanding requests."""
        heapq.heappush(self._changes, (t, self._seq, j, tokens, requests))
        self._seq += 1

    def until(self, t: float) -> None:
        """The counts as of time t."""
        changes, views = self._changes, self.views
        while changes and changes[0][0] <= t:
            _, _, j, tokens, requests = heapq.heappop(changes)
            views[j].outstanding_tokens -= tokens
            views[j].num_outstanding -= requests


class Fleet(Topology):
    """`engines` behind `router`, which chooses each request's replica. `progress`, if given,
    is called as progress(num_done, num_tokens) with the fleet's totals after iterations that
    end requests (as `Engine`'s)."""

    #: the requests table's column naming the engine that served a request
    replica_col = "replica"

    def __init__(self, engines: list[Engine], router: Router | None, progress=None):
        if not engines:
            raise ValueError("cluster.num_replicas: a fleet needs at least one engine")
        if router is not None and not isinstance(router, Router):
            raise TypeError(f"router {router!r} is not a sarathi_lab.topology.routers.Router")
        if router is None and len(engines) != 1:
            raise ValueError(f"{len(engines)} engines without a router: only one engine needs "
                             "none")
        self.engines = engines
        self.router = router
        self.counts = Counts(engines)
        self.views = self.counts.views
        self.replica_of: dict[int, int] = {}   # id(request) -> its replica
        self._owed: list[set[int]] = [set() for _ in engines]   # ids without a first token yet
        self._next = -1            # the engine `earliest` found
        # the engines with work (queued, running, swapped; blocked or not): only these can step
        # or wake, so a large fleet's scans cost its busy replicas, not all of them (a fleet of
        # 10,000 replicas scanned them all at every step: > 5 minutes for 1,000 requests)
        self._busy: set[int] = set()
        self._answered = None      # the load's answered(request, t), when it watches
        if progress is not None and len(engines) > 1:
            def fleet_progress(_done, _tokens):
                progress(sum(e.num_done for e in engines), sum(e.num_tokens for e in engines))
            for e in engines:
                e.progress = fleet_progress
        elif progress is not None:
            engines[0].progress = progress
        if router is not None:
            router.check(self.views)

    def attach(self, driver) -> None:
        self._driver = driver

    def watch(self, answered) -> None:
        self._answered = answered

    # -- the router's counts ------------------------------------------------------------------
    def _first_tokens(self, j: int, adv) -> None:
        """After an iteration of replica j that computed prompt tokens (`Advanced`): the
        requests whose first token came out in it no longer owe their prompt."""
        owed = self._owed[j]
        if owed:
            for r in adv.first_tokens:
                if id(r) in owed:
                    owed.discard(id(r))
                    self.counts.remove(r.token_times[0], j, r.num_prompt_tokens, 0)

    def _ended(self, j: int, t: float, reqs) -> None:
        """Requests of replica j that finished or were rejected at time t."""
        if self.router is None:
            return
        owed = self._owed[j]
        for r in reqs:
            tokens = 0
            if id(r) in owed:   # rejected before a first token
                owed.discard(id(r))
                tokens = r.num_prompt_tokens
            self.counts.remove(t, j, tokens)

    # -- the driver's calls -------------------------------------------------------------------
    def submit(self, req: Request, t: float) -> None:
        if self.router is None:
            j = 0
        else:
            self.counts.until(t)
            j = route(self.router, req, self.views, t)
            self.counts.add(j, req.num_prompt_tokens)
            self._owed[j].add(id(req))
        engine = self.engines[j]
        self._busy.add(j)
        engine.wake(t)   # an idle replica waits for its next arrival
        if self.router is not None:
            self.replica_of[id(req)] = j
        if not engine.add_request(req):
            self._ended(j, t, (req,))
            if self._answered is not None:
                self._answered(req, engine.now)   # refused when the engine took it

    def event(self, t: float) -> None:
        # a blocked replica (its policy scheduled nothing with requests queued) looks again at
        # every event: a plug-in may wait for more arrivals, or for time to pass
        engines = self.engines
        for j in self._busy:
            e = engines[j]
            if e.blocked:
                e.wake(t)

    def earliest(self) -> float:
        best, t_best = -1, math.inf
        engines, idle = self.engines, None
        for j in self._busy:
            e = engines[j]
            if not e.policy.has_work():
                idle = [j] if idle is None else idle + [j]
                continue
            if e.blocked:
                continue
            t = e.now
            if t < t_best or t == t_best and j < best:   # the lowest index among equals
                best, t_best = j, t
        if idle is not None:
            self._busy.difference_update(idle)
        self._next = best
        return t_best

    def advance(self, until: float) -> None:
        j = self._next
        adv = self.engines[j].advance(self._bound(j, until), self._where(j))
        if self.router is not None:
            if adv.prefill_tokens:
                self._first_tokens(j, adv)
            if adv.rejected:
                self._ended(j, adv.start, adv.rejected)
            if adv.finished:
                self._ended(j, adv.end, adv.finished)
        answered = self._answered
        if answered is not None:
            for r in adv.rejected:
                answered(r, adv.start)
            for r in adv.finished:
                answered(r, r.finish_time)

    def _bound(self, j: int, until: float) -> float:
        """Where engine j's fast-forward stops: the next event, and when the load watches
        answers, the other engines' clocks (an answer there may send a request here)."""
        if self._answered is None:
            return until
        engines = self.engines
        for k in self._busy:
            if k != j:
                t = engines[k].next_event_time()
                if t < until:
                    until = t
        return until

    def _where(self, j: int) -> str:
        return f"replica {j}: " if len(self.engines) > 1 else ""

    def finish(self) -> None:
        for j, e in enumerate(self.engines):
            try:
                e.finish(self._where(j))
            except RuleViolation as err:
                if len(self.engines) == 1:
                    raise
                raise RuleViolation(f"replica {j}: {err}") from err

    def named_engines(self) -> list[tuple]:
        return [(f"replica {j}", e) for j, e in enumerate(self.engines)]

    def describe(self) -> str:
        return f"a fleet of {len(self.engines)} replicas behind router {plugin(self.router)}"

    # -- results ------------------------------------------------------------------------------
    def tables(self, requests: list[Request]):
        """(requests table, iterations table) of the whole fleet, each with a `replica` column;
        iterations in order of start time (replica order among equal starts)."""
        req_df = requests_frame(requests, self.engines)
        req_df[self.replica_col] = replica_column(requests, self.replica_of)
        it_df = iterations_frame([(e, {"replica": j}) for j, e in enumerate(self.engines)])
        return req_df, it_df

    def summarize(self, req_df, it_df, slo: dict | None = None,
                  price_per_gpu_hour: float | None = None,
                  num_gpus: int | None = None) -> dict:
        """The run's summary over the whole fleet (`kv.blocks_total`: the fleet's blocks;
        `kv.utilization_*` over every replica's iterations, each against its own cache; `cost`:
        every replica's `num_gpus`, by default its executor's), with `replicas`: each
        replica's own summary."""
        if num_gpus is None:
            num_gpus = replica_gpus(self.engines[0])
        kvs = [e.kv for e in self.engines]
        blocks, block_size = one_kv_size(kvs)
        swaps = [e.swap_space() for e in self.engines]
        per = []
        for j, kv in enumerate(kvs):
            s = summarize(req_df[req_df["replica"] == j], it_df[it_df["replica"] == j], slo=slo,
                          kv_blocks_total=blocks, block_size=block_size,
                          prefix_cache=kv.prefix_cache_stats(),
                          price_per_gpu_hour=price_per_gpu_hour, num_gpus=num_gpus,
                          swap_space=swaps[j])
            per.append({"replica": j, **s})
        # host utilisation per iteration against its replica's swap space, as for the KV cache
        fleet_swap = swaps[0]
        out = summarize(req_df, it_df, slo=slo, kv_blocks_total=blocks, block_size=block_size,
                        prefix_cache=pooled_prefix(kvs), price_per_gpu_hour=price_per_gpu_hour,
                        num_gpus=num_gpus * len(kvs), swap_space=fleet_swap)
        out["kv"]["blocks_total"] = blocks * len(kvs)
        if fleet_swap:
            out["swap"]["host_blocks_total"] = sum(w["host_blocks_total"] for w in swaps)
        out["num_replicas"] = len(kvs)
        out["router"] = self.router.name or type(self.router).__qualname__
        out["replicas"] = per
        return out


class Single(Fleet):
    """One engine: every request goes to it; its tables and summary are the engine's own (no
    replica column). No one watching it (open loop), it advances to the next event in one go;
    watched (closed loop), it is a fleet of one."""

    def __init__(self, engine: Engine, progress=None):
        super().__init__([engine], None, progress)
        # `earliest` below finds no engine (there is one): watched, Fleet.advance steps
        # engine 0, and `_bound` must not take it for another engine whose clock stops the
        # fast-forward (with -1 it did: a closed loop on one engine never skipped)
        self._next = 0

    @property
    def engine(self) -> Engine:
        return self.engines[0]

    def named_engines(self) -> list[tuple]:
        return [("the engine", self.engines[0])]

    def describe(self) -> str:
        return "one engine"

    # the driver's calls, written for one engine: between two events the driver calls these a
    # few times, and a replay of 10,000 arrivals must cost no more than the engine alone
    def earliest(self) -> float:
        return self.engines[0].next_event_time()

    def submit(self, req: Request, t: float) -> None:
        if self._answered is not None:
            super().submit(req, t)
            return
        e = self.engines[0]
        e.wake(t)
        e.add_request(req)

    def advance(self, until: float) -> None:
        if self._answered is not None:
            super().advance(until)
            return
        # no one watches it: it runs on its own until the next event (what the driver would
        # do, without a turn of its loop per iteration)
        e = self.engines[0]
        e.advance(until)
        while e.next_event_time() < until:
            e.advance(until)

    def event(self, t: float) -> None:
        e = self.engines[0]
        if e.blocked:
            e.wake(t)

    def tables(self, requests: list[Request]):
        e = self.engines[0]
        return requests_frame(requests, (), e.output_lens), \
            iterations_table(e.iteration_columns())

    def summarize(self, req_df, it_df, slo: dict | None = None,
                  price_per_gpu_hour: float | None = None,
                  num_gpus: int | None = None) -> dict:
        e = self.engines[0]
        if num_gpus is None:
            num_gpus = replica_gpus(e)
        return summarize(req_df, it_df, slo=slo, kv_blocks_total=e.kv.num_blocks,
                         block_size=e.kv.block_size, prefix_cache=e.kv.prefix_cache_stats(),
                         swap_space=e.swap_space(), price_per_gpu_hour=price_per_gpu_hour,
                         num_gpus=num_gpus)


def route(router: Router, req: Request, views, t: float, pool: str = "") -> int:
    """`router.route(req, views, t)`, checked: an exception inside it names the router, the
    time and the request; an answer that is not a replica index is a ValueError. `pool` names
    the pool in messages (disaggregated prefill/decode)."""
    n = len(views)
    where = f"{pool} pool, " if pool else ""
    try:
        j = router.route(req, views, t)
    except Exception as e:
        raise blame(router, f"route() at t={t:.3f}s ({where}request {req.request_id!r})",
                    e) from e
    if not isinstance(j, Integral) or isinstance(j, bool) or not 0 <= j < n:
        cls = type(router)
        raise ValueError(f"router {router.name or cls.__qualname__!r} "
                         f"({cls.__module__}.{cls.__qualname__}.route()) broke the rule "
                         f"'route() returns a replica index': it returned {j!r} for "
                         f"{where}request {req.request_id!r} at t={t:.3f}s: must be a replica "
                         f"index, an integer in [0, {n})")
    return int(j)


def blame(obj, what: str, e: Exception) -> Exception:
    """The same kind of error as `e`, naming the plug-in's class and `what` it was doing."""
    cls = type(obj)
    where = f"{cls.__module__}.{cls.__qualname__}.{what}"
    try:
        return type(e)(f"{where}: {e}")
    except Exception:   # an exception class that takes other arguments
        return RuntimeError(f"{where} raised {type(e).__name__}: {e}")
