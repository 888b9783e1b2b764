"""One event-driven driver for every topology: one heap of timed events on one clock.

The heap holds what happens at a known time: arrivals (`OpenLoop`), client sends
(`clients.ClosedLoop`), a topology's own events (a disaggregated request's first token handed on,
its KV landing). Between them the topology's engines step: the driver asks the topology when its
busy engine furthest behind steps next (`Topology.earliest`); an event at or before that time
is handled first, so no engine runs past an event that could reach it before the event is
handled, and otherwise the topology advances with the next event's time as its bound (a
fast-forwarded run stops there). Ties: a topology's own events before arrivals and sends, then
by the order given (`push`'s `order`, then the order pushed).

A topology (`Topology`) is a small composition over engines' public methods (`Engine`'s
stepping API); a load (`OpenLoop`, `ClosedLoop`) feeds it requests and may watch them end
(`Topology.watch`). Both report their results through one protocol: the topology's `tables`
and `summarize`, the load's `describe` and `columns`.
"""
from __future__ import annotations

import heapq
import itertools
import math
from operator import attrgetter

from sarathi_lab.request import Request
from sarathi_lab.topology.accounting import check_accounted

_ARRIVAL = attrgetter("arrival_time")
INTERNAL, LOAD = 0, 1   # ranks among events at one time: a topology's own first


class Topology:
    """What the driver needs of a topology (single engine, fleet, pipeline, disaggregated
    pools); see `fleet.Fleet` for the reference implementation."""
    engines: list

    def attach(self, driver: "Driver") -> None:
        """Called once, before the run: a topology with events of its own keeps `driver` to
        `push` them."""

    def watch(self, answered) -> None:
        """Call answered(request, t) when a request ends (finished, or rejected at t); a watched
        topology bounds an engine's fast-forward by the other engines' clocks too (an answer
        may become a new request anywhere)."""
        raise NotImplementedError

    def earliest(self) -> float:
        """When the busy engine furthest behind steps next; inf if none."""
        raise NotImplementedError

    def advance(self, until: float) -> None:
        """Step that engine (a topology whose engines are independent between events may step
        them all up to `until`); fast-forward stops at `until`."""
        raise NotImplementedError

    def submit(self, req: Request, t: float) -> None:
        """A request arrives at t."""
        raise NotImplementedError

    def event(self, t: float) -> None:
        """Any event was handled at t (a blocked engine of a fleet looks again)."""

    def finish(self) -> None:
        """The run is over: check that every engine finished its work."""
        raise NotImplementedError

    def named_engines(self) -> list[tuple]:
        """(name, engine) for every engine, named as messages name it ("replica 2")."""
        raise NotImplementedError

    def describe(self) -> str:
        """The topology as messages name it, with its router plug-ins."""
        raise NotImplementedError

    def tables(self, requests: list[Request]):
        """(requests table, iterations table), with the topology's own columns."""
        raise NotImplementedError

    def run(self, requests: list[Request]) -> list[Request]:
        """Replay `requests` open-loop (their arrival times) on this topology: `drive` with
        `OpenLoop`. Returns them in arrival order."""
        return drive(self, OpenLoop(requests))

    def summarize(self, req_df, it_df, slo=None, price_per_gpu_hour=None,
                  num_gpus: int | None = None) -> dict:
        """summary.json's figures over the tables (`metrics.summarize`), with the topology's
        own sections. `num_gpus`: of one replica; None: its executors' settings say."""
        raise NotImplementedError


class Driver:
    """The heap and the loop. `push(t, fn, arg)` schedules fn(arg, t)."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.heap: list[tuple] = []   # (time, rank, order, seq, fn, arg)
        self.seq = itertools.count()   # the order pushed, last among ties
        topology.attach(self)

    def push(self, t: float, fn, arg, rank: int = LOAD, order: int = 0) -> None:
        heapq.heappush(self.heap, (t, rank, order, next(self.seq), fn, arg))

    def next_time(self) -> float:
        return self.heap[0][0] if self.heap else math.inf

    def run(self) -> None:
        heap, topo = self.heap, self.topology
        pop, earliest, advance, event = heapq.heappop, topo.earliest, topo.advance, topo.event
        inf = math.inf
        while True:
            t_busy = earliest()
            if heap and heap[0][0] <= t_busy:
                t, _, _, _, fn, arg = pop(heap)
                fn(arg, t)
                event(t)
                continue
            if t_busy == inf:
                break
            advance(heap[0][0] if heap else inf)
        topo.finish()


class OpenLoop:
    """Requests arrive at their `arrival_time` (the trace's), whatever the server does."""

    def __init__(self, requests: list[Request]):
        self.requests = sorted(requests, key=_ARRIVAL)
        self._i = 0

    def start(self, driver: Driver) -> None:
        self._driver = driver
        self._submit = driver.topology.submit
        self._heap, self._seq = driver.heap, driver.seq
        if self.requests:
            driver.push(self.requests[0].arrival_time, self._arrive, None)

    def _arrive(self, _, t: float) -> None:
        reqs, i = self.requests, self._i
        self._i = i = i + 1
        if i < len(reqs):   # the next one waits on the heap; one entry, not all of them
            # Driver.push, inlined: once per request
            heapq.heappush(self._heap, (reqs[i].arrival_time, LOAD, 0, next(self._seq),
                                        self._arrive, None))
        self._submit(reqs[i - 1], t)

    def describe(self) -> dict:
        """summary.json's `load`."""
        return {"mode": "open"}

    def columns(self) -> dict:
        """Columns the load adds to the requests table (name -> values in request order)."""
        return {}


def drive(topology: Topology, load) -> list[Request]:
    """Serve `load` (`OpenLoop`, `clients.ClosedLoop`) on `topology` until every request ended
    (checked: `accounting.check_accounted`); returns the requests served."""
    driver = Driver(topology)
    load.start(driver)
    driver.run()
    check_accounted(topology, load.requests)
    return load.requests
