"""Closed-loop clients as a source of events on the driver's clock, on any topology.

N users, each sending its next request a think time after its previous answer ended
(`traces/clients.py` describes the load and holds its settings, `ThinkTime`): whenever a user is
ready, it sends the next request of the trace not yet sent, its `arrival_time` being the moment
it is sent (a relative deadline moves with it). A user's send is an event on the driver's heap
(users ready at the same instant send in user order); the topology tells the load when a request
ends (`Topology.watch`): finished, at its finish time; rejected, when it was rejected (a request
refused on arrival: when the engine took it, the end of the iteration it arrived in). Each user
draws its think times from a stream of its own (seeded by the trace's seed), so its sequence of
think times does not depend on the schedule.

`Sessions` is the same loop with one user per multi-turn session (`traces.sessions`): a user
sends its own turns, the first at the session's start.
"""
from __future__ import annotations

import numpy as np

from sarathi_lab.request import Request
from sarathi_lab.traces.clients import THINK_STREAM, ThinkTime
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

    def _next(self, u: int) -> int | None:
        """The index of the request user `u` sends now: the trace's next; None when all are."""
        sent = self._sent
        if sent == len(self.requests):
            return None   # nothing left to send: the user is done
        self._sent = sent + 1
        return sent

    def _send(self, u: int, t: float) -> None:
        sent = self._next(u)
        if sent is None:
            return
        req = self.requests[sent]
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


class Sessions(ClosedLoop):
    """Multi-turn sessions (`traces.sessions`): each session is a user of `ClosedLoop` whose
    requests are its own turns, in order. Its first turn is sent at its `arrival_time` (the
    session's start), each later one a think time after the previous turn's answer (a rejected
    turn is answered when it is rejected: the conversation goes on, as a user would retry).
    `session[i]`, `turn[i]`: request i's session (0..S-1) and turn (0.. in order)."""

    def __init__(self, requests: list[Request], session, turn, think: ThinkTime, seed: int = 0):
        session, turn = [int(s) for s in session], [int(k) for k in turn]
        if len(session) != len(requests) or len(turn) != len(requests):
            raise ValueError(f"sessions: {len(requests)} requests but {len(session)} session "
                             f"and {len(turn)} turn labels")
        count = max(session, default=-1) + 1
        self._turns: list[list[int]] = [[] for _ in range(count)]
        for i, (s, k) in enumerate(zip(session, turn)):
            if s < 0 or k != len(self._turns[s]):
                raise ValueError(f"sessions: request {i} is turn {k} of session {s}, but "
                                 f"that session's turns so far are {len(self._turns[s])}; "
                                 "a session's turns must come in order 0, 1, ...")
            self._turns[s].append(i)
        if any(not t for t in self._turns):
            raise ValueError(f"sessions: session {[not t for t in self._turns].index(True)} "
                             "has no turns; sessions must be numbered 0.. without gaps")
        super().__init__(requests, count, think, seed)
        self.session, self.turn = session, turn
        self._at = [0] * count   # each session's next turn

    def start(self, driver) -> None:
        self._driver = driver
        driver.topology.watch(self._answered)
        for u, turns in enumerate(self._turns):   # no think time before a session's first turn
            self._ready(u, self.requests[turns[0]].arrival_time)

    def _next(self, u: int) -> int | None:
        k, turns = self._at[u], self._turns[u]
        if k == len(turns):
            return None   # the session is over
        self._at[u] = k + 1
        return turns[k]

    def describe(self) -> dict:
        """summary.json's `load`."""
        import dataclasses
        return {"mode": "sessions", "sessions": self.clients,
                "think_time": dataclasses.asdict(self.think)}

    def columns(self) -> dict:
        """Each request's session and turn (the requests table's `session`, `turn`)."""
        return {"session": self.session, "turn": self.turn}
