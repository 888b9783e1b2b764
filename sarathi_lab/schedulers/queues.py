"""Waiting queues: the order in which a policy considers waiting requests for admission, and
which running request it gives up first when KV runs out.

Admission walks the queue from its head and stops at the first request that does not fit (as
vLLM does: no overtaking). A preempted request goes back into the queue: at the head for FCFS
(it was admitted before everything still waiting), by its key for the ordered queues.

Choose one with ``scheduler.queue`` (a name below, or a dotted path to a `RequestQueue`
subclass). An ordered queue is a `key` over request fields -- a few lines each.
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator

from sarathi_lab.request import Request


class RequestQueue:
    """FCFS: arrival order; preempted requests return to the head; the preemption victim is the
    latest admitted running request (vLLM)."""

    name = "fcfs"

    def __init__(self):
        self._q: deque[Request] = deque()

    def __len__(self) -> int:
        return len(self._q)

    def __bool__(self) -> bool:
        return bool(self._q)

    def __iter__(self) -> Iterator[Request]:
        """Requests in admission order (head first)."""
        return iter(self._q)

    def push(self, req: Request) -> None:
        self._q.append(req)

    def push_preempted(self, req: Request) -> None:
        self._q.appendleft(req)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def remove(self, req: Request) -> None:
        """Take `req` out wherever it waits (a served request whose client went away)."""
        self._q.remove(req)

    def victim(self, candidates: list[Request]) -> Request:
        """The running request to preempt among `candidates` (in admission order)."""
        return candidates[-1]

    def ahead(self, req: Request) -> list[Request]:
        """The waiting requests that would be admitted before `req` if it were pushed now
        (admission control's estimate of its wait)."""
        return list(self)


class OrderedQueue(RequestQueue):
    """A queue ordered by `key(req)` (smallest first; ties in arrival order). The preemption
    victim is the candidate with the largest key (the latest admitted among equals)."""

    name = "ordered"

    def __init__(self):
        self._heap: list = []
        self._seq = itertools.count()

    @staticmethod
    def key(req: Request):
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[-1] for entry in sorted(self._heap))

    def push(self, req: Request) -> None:
        heapq.heappush(self._heap, (self.key(req), req.arrival_time, next(self._seq), req))

    push_preempted = push

    def peek(self) -> Request:
        return self._heap[0][-1]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[-1]

    def remove(self, req: Request) -> None:
        self._heap = [e for e in self._heap if e[-1] is not req]
        heapq.heapify(self._heap)

    def ahead(self, req: Request) -> list[Request]:
        k = (self.key(req), req.arrival_time)
        return [e[-1] for e in self._heap if (e[0], e[1]) <= k]

    def victim(self, candidates: list[Request]) -> Request:
        key = self.key
        # max() keeps the first of equal keys; reversed: the latest admitted among equals
        return max(reversed(candidates), key=key)


class PriorityQueue(OrderedQueue):
    """Smallest `priority` value first (0 is the default class)."""
    name = "priority"

    @staticmethod
    def key(req: Request):
        return req.priority


class DeadlineQueue(OrderedQueue):
    """Earliest deadline first; requests without a deadline after all that have one."""
    name = "edf"

    @staticmethod
    def key(req: Request):
        return float("inf") if req.deadline is None else req.deadline


class ShortestPromptQueue(OrderedQueue):
    """Shortest prompt first (shortest-job-first on what a scheduler can see)."""
    name = "spf"

    @staticmethod
    def key(req: Request):
        return req.num_prompt_tokens


BUILTIN = {q.name: q for q in (RequestQueue, PriorityQueue, DeadlineQueue, ShortestPromptQueue)}


def builtin_queue(name: str) -> RequestQueue:
    """A new built-in queue by its name (`scheduler.queue`), for a policy built in code without
    one. Plug-in queues (registered names, dotted paths) are found by the run layer
    (`registry.queue_class`), which a policy does not import."""
    if name not in BUILTIN:
        raise ValueError(f"scheduler.queue={name!r}: a policy built without a queue knows only "
                         f"the built-in ones ({', '.join(BUILTIN)}); pass a plug-in's as "
                         "queue=registry.queue_class(name)()")
    return BUILTIN[name]()
