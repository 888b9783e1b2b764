"""Per-tenant fairness by virtual token counters (VTC; Sheng et al., "Fairness in Serving Large
Language Models", OSDI'24), on chunked prefill (Sarathi-Serve).

Each tenant has a counter of the service it has received, in weighted tokens: `input_weight`
per prompt token, charged when the request is admitted (its first chunk), and `output_weight`
per output token, charged as it is emitted. Admission takes the oldest waiting request of the
backlogged tenant with the smallest counter, and stops, as every policy here, at the first that
does not fit. A tenant that returns from idle (its waiting queue was empty) would otherwise
come back with a small counter and crowd the others out for as long as it took them to catch
up; its counter is lifted to the smallest counter of the tenants that are backlogged (the
paper's Algorithm 2; with none backlogged, to the counter of the tenant that last left the
queue). A request that returns to the queue after a preemption does not lift its tenant (the
tenant was being served, not idle) and is not charged its prompt again: recompute is the
server's loss, not service received.

The paper's bound (its Theorem on backlogged clients): over any interval in which two tenants
are both backlogged, the service they receive differs by at most 2 * max(input_weight * L,
output_weight * M), L the longest prompt and M the most tokens a batch can hold in the KV cache.

Counters are kept as whole token counts per tenant (prompt, output) plus the lifts, so k
decode steps taken at once (fast-forward) leave exactly the counters k single steps would.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sarathi_lab.schedulers.mechanics.fast_forward import VTC
from sarathi_lab.schedulers.queues import RequestQueue
from sarathi_lab.schedulers.sarathi import Sarathi, SarathiConfig
from sarathi_lab.settings import setting


@dataclass
class VTCConfig(SarathiConfig):
    queue: str = setting("fcfs", choices=("fcfs",),
                         help="fixed: arrival order within a tenant; tenants by their counters")
    input_weight: float = setting(1.0, ge=0, help="VTC: service per prompt token (w_p)")
    output_weight: float = setting(2.0, ge=0, help="VTC: service per output token (w_q)")


class TenantQueue(RequestQueue):
    """One FCFS queue per tenant; the head is the oldest request of the backlogged tenant with
    the smallest counter (ties: the tenant whose head arrived first). Holds the counters."""

    name = "vtc"

    def __init__(self, input_weight: float, output_weight: float):
        self.w_in, self.w_out = input_weight, output_weight
        self.queues: dict[str, deque] = {}
        self.prompt_tokens: dict[str, int] = {}   # charged at admission
        self.output_tokens: dict[str, int] = {}   # charged at emission
        self.lift: dict[str, float] = {}
        self.last_left: str | None = None          # the tenant whose queue emptied last
        self._len = 0

    def counter(self, tenant: str) -> float:
        return (self.w_in * self.prompt_tokens.get(tenant, 0)
                + self.w_out * self.output_tokens.get(tenant, 0) + self.lift.get(tenant, 0.0))

    def backlogged(self) -> list[str]:
        return [t for t, q in self.queues.items() if q]

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def _lifted(self, tenant: str) -> float:
        """What a request of `tenant` pushed now lifts its counter by (0 if it is backlogged
        or ahead of the others already)."""
        if self.queues.get(tenant):
            return 0.0
        others = [self.counter(u) for u in self.backlogged()]
        if others:
            floor = min(others)
        else:
            floor = self.counter(self.last_left) if self.last_left is not None else 0.0
        return max(0.0, floor - self.counter(tenant))

    def push(self, req) -> None:
        t = req.tenant
        lift = self._lifted(t)   # back from idle: no credit for the time away
        if lift:
            self.lift[t] = self.lift.get(t, 0.0) + lift
        self.queues.setdefault(t, deque()).append(req)
        self._len += 1

    def push_preempted(self, req) -> None:
        self.queues.setdefault(req.tenant, deque()).appendleft(req)
        self._len += 1

    def _first(self) -> str:
        counter = self.counter
        return min(self.backlogged(), key=lambda t: (counter(t), self.queues[t][0].arrival_time))

    def peek(self):
        return self.queues[self._first()][0]

    def pop(self):
        t = self._first()
        q = self.queues[t]
        req = q.popleft()
        self._len -= 1
        if not q:
            self.last_left = t
        return req

    def _order(self, extra=None):
        """Waiting requests (and `extra`, as if pushed now) in the order admission would take
        them if nothing ran: each admission charges its prompt, which may pass the turn."""
        lists = {t: list(q) for t, q in self.queues.items() if q}
        charged = {t: self.counter(t) for t in lists}
        if extra is not None:
            t = extra.tenant
            charged[t] = self.counter(t) + self._lifted(t)
            lists.setdefault(t, []).append(extra)
        pos = dict.fromkeys(lists, 0)
        while lists:
            t = min(lists, key=lambda u: (charged[u], lists[u][pos[u]].arrival_time))
            req = lists[t][pos[t]]
            yield req
            charged[t] += self.w_in * req.num_prompt_tokens
            pos[t] += 1
            if pos[t] == len(lists[t]):
                del lists[t]

    def __iter__(self):
        return self._order()

    def ahead(self, req) -> list:
        out = []
        for r in self._order(req):
            if r is req:
                break
            out.append(r)
        return out

    def victim(self, candidates: list):
        """The latest admitted request of the most served tenant."""
        counter = self.counter
        return max(reversed(candidates), key=lambda r: counter(r.tenant))


class VTC(Sarathi):
    name = "vtc"
    config_class = VTCConfig
    # its steady decode runs, charging their tokens as update() does (mechanics/fast_forward.py)
    fast_forward = VTC

    def __init__(self, cfg, kv, queue=None):
        # the tenant queue is this policy's own (the queue setting is fixed to per-tenant FCFS)
        super().__init__(cfg, kv, TenantQueue(cfg.input_weight, cfg.output_weight))

    overrides = ("admit",)   # charges a tenant when its request starts

    def admit(self, req, max_tokens, whole=False):
        n = super().admit(req, max_tokens, whole)
        if n and "vtc_charged" not in req.extra:   # a re-admission after preemption is free
            req.extra["vtc_charged"] = True
            q = self.waiting
            q.prompt_tokens[req.tenant] = q.prompt_tokens.get(req.tenant, 0) + req.num_prompt_tokens
        return n

    def update(self, out, step, start, end):
        before = [r.num_output_tokens for r in out.reqs]
        done = super().update(out, step, start, end)
        served = self.waiting.output_tokens
        for r, b in zip(out.reqs, before):
            if r.num_output_tokens != b:
                served[r.tenant] = served.get(r.tenant, 0) + r.num_output_tokens - b
        return done
