"""Closed-loop clients as a source of events on the driver's clock, on any topology.

N users, each sending its next request a think time after its previous answer ended
(`closed_loop.py` describes the load and holds its settings, `ThinkTime`): whenever a user is
ready, it sends the next request of the trace not yet sent, its `arrival_time` being the moment
it is sent (a relative deadline moves with it). A user's send is an event on the driver's heap
(users ready at the same instant send in user order); the topology tells the load when a request
ends (`Topology.watch`): finished, at its finish time; rejected, when it was rejected (a request
refused on arrival: when the engine took it, the end of the iteration it arrived in). Each user
draws its think times from a stream of its own (seeded by the trace's seed), so its sequence of
think times does not depend on the schedule.
"""
from __future__ import annotations

import numpy as np

from sarathi_lab.closed_loop import THINK_STREAM, ThinkTime
from sarathi_lab.request import Request
from sarathi_lab.traces.precision import MAX_ARRIVAL_S, unresolvable


class ClosedLoop:
    """`clients` users send `requests` in this order, each after its previous answer and a
    think time drawn from `think`."""

    def __init__(self, requests: list[Request], clients: int, think: ThinkTime, seed: int = 0):
        if clients < 1:
            raise ValueError(f"clients={clients}: must be >= 1")
        if clients > max(len(requests), 1):
            # each user has one request in flight at a time, so at most one user per request
            # ever sends; the rest would only cost a random stream and an event each
            raise ValueError(f"trace.clients={clients}: more users than the trace's "
                             f"{len(requests)} requests; each user waits for its answer before "
                             f"sending again, so at most {len(requests)} of them ever send "
                             f"(set trace.clients <= {len(requests)})")
        self.requests = list(requests)
        self.clients = clients
        self.think = think
        self._draws = [think.sampler(np.random.default_rng([THINK_STREAM, int(seed), u]))
                       for u in range(clients)]
        self.users = [-1] * len(self.requests)   # the user who sent each request
        self._owner: dict = {}   # request in flight -> its user
        self._sent = 0

    def start(self, driver) -> None:
        self._driver = driver
        driver.topology.watch(self._answered)
        for u in range(self.clients):   # every user starts with one think time from 0
            self._ready(u, self._draws[u]())

    def _ready(self, u: int, t: float) -> None:
        self._driver.push(t, self._send, u, order=u)

    def _send(self, u: int, t: float) -> None:
        n, sent = len(self.requests), self._sent
        if sent == n:
            return   # nothing left to send: the user is done
        req = self.requests[sent]
        self._sent = sent + 1
        if t >= MAX_ARRIVAL_S:   # a huge think time: the clock could not resolve the request
            raise ValueError(unresolvable(t, f"request {req.request_id!r}, sent by user {u},"))
        if req.deadline is not None:
            req.deadline = t + (req.deadline - req.arrival_time)
        req.arrival_time = t
        self._owner[req] = self.users[sent] = u
        self._driver.topology.submit(req, t)

    def _answered(self, req: Request, t: float) -> None:
        u = self._owner.pop(req)
        self._ready(u, t + self._draws[u]())

    def describe(self) -> dict:
        """summary.json's `load`."""
        import dataclasses
        return {"mode": "closed", "clients": self.clients,
                "think_time": dataclasses.asdict(self.think)}

    def columns(self) -> dict:
        """The user who sent each request (the requests table's `client`)."""
        return {"client": self.users}
