"""Disaggregated prefill/decode: a prefill pool and a decode pool of engines on one virtual clock.

A request is routed on arrival to a prefill replica, which computes its prompt and emits its first
token there (the executor is given an output length of 1, as a disaggregation proxy sends the
prefill instance `max_tokens=1`), and keeps its KV (`KVCacheManager.retain`). At that first token
the decode router picks a decode replica; the request waits in that replica's queue, its KV held
on the prefill side (back-pressure: the prefill replica admits fewer prompts while its cache holds
KV waiting to leave, as in DistServe and Splitwise), until the decode replica has room: seats and
the KV of the prompt and next token above its watermark (`Policy.admission_blocker`). It then
reserves the blocks (`KVCacheManager.allocate_received`), the KV moves over the link (one transfer
at a time on each replica's link), the prefill side frees its copy when the transfer ends, and
the request joins the decode replica's running batch at its next iteration
(`Engine.adopt`), where it decodes to its end.

Every engine is driven through its public API (`wake`, `add_request`, `adopt`, and its one
stepping call, `advance`) on the driver's clock (topology/driver.py): as in a fleet, the busy engine furthest
behind steps next and an event (an arrival, a first token, a transfer's end: the last two pushed
on the driver's heap) is handled before any engine steps past it. A decode replica's
fast-forward stops where a new request could reach it (the `until` it is advanced to; a
prefill replica steps one iteration at a time): the next arrival or event, the clock of
every prefill replica at work (its next iteration may end in a first token), and, while a prefill
replica is blocked on KV waiting to leave or the load watches requests end (closed-loop
clients), the clocks of the other decode replicas (whose next iteration may take that KV, or end
a request whose answer becomes a new one). Timing and design: sarathi_lab/DESIGN.md,
"Disaggregated prefill/decode".
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from sarathi_lab.engine import Engine
from sarathi_lab.engine.guard import RuleViolation
from sarathi_lab.metrics import queue_stats, summarize, transfer_stats
from sarathi_lab.request import Request
from sarathi_lab.topology.accounting import plugin
from sarathi_lab.topology.disagg.settings import POOLS
from sarathi_lab.topology.disagg.transfer import Transfer
from sarathi_lab.topology.driver import INTERNAL, Topology
from sarathi_lab.topology.fleet import Counts, route
from sarathi_lab.topology.results import (
    expert_parallel,
    iterations_frame,
    pooled_prefix,
    requests_frame,
)
from sarathi_lab.topology.routers import Router


@dataclass(slots=True)
class _Track:
    """What the driver records of one request."""
    output_len: int | None
    continues: bool                  # it decodes on after its first token
    prefill: int = -1                # replica indices; -1: none
    decode: int = -1
    ready: float = math.nan          # first token out on the prefill replica
    last_prefill_s: float = 0.0      # duration of the iteration that emitted it
    start: float = math.nan          # transfer start and end
    end: float = math.nan
    nbytes: int = 0




class Disaggregated(Topology):
    """A prefill pool and a decode pool. `transfer` prices
    each KV move, and its tensor-parallel sizes count the GPUs. `progress`, if given, is called
    as progress(num_done, num_tokens)."""

    def __init__(self, prefill: list[Engine], decode: list[Engine], prefill_router: Router,
                 decode_router: Router, transfer: Transfer, *, progress=None):
        if not prefill or not decode:
            raise ValueError("cluster.prefill.num_replicas and cluster.decode.num_replicas: "
                             "each pool needs at least one engine")
        for r in (prefill_router, decode_router):
            if not isinstance(r, Router):
                raise TypeError(f"router {r!r} is not a sarathi_lab.topology.routers.Router")
        for e in decode:
            assert not e.kv.enable_prefix_caching, "the decode pool keeps no prefix cache"
        self.prefill, self.decode = prefill, decode
        self.routers = (prefill_router, decode_router)
        self.transfer = transfer
        self.tensor_parallel = (transfer.tp_prefill, transfer.tp_decode)
        self.views = (Counts(prefill), Counts(decode))
        self.track: dict[int, _Track] = {}
        self._driver = None
        self._answered = None    # the load's answered(request, t), when it watches
        self._next = None        # (pool, j) of the engine `earliest` found
        self._queue = [deque() for _ in decode]     # awaiting room: (request, prefill j)
        self._in_flight = [0] * len(decode)          # transfers under way to each
        self._landed = [deque() for _ in decode]     # KV here, waiting for a seat
        self._send_free = [0.0] * len(prefill)       # each replica's link, free from
        self._recv_free = [0.0] * len(decode)
        self._handed = 0    # requests a prefill replica counted done, handed on
        self._refused = 0   # refused on arrival for the decode pool's limits
        if progress is not None:
            def pools_progress(_done, _tokens):
                engines = prefill + decode
                progress(sum(e.num_done for e in engines) - self._handed + self._refused,
                         sum(e.num_tokens for e in engines))
            for e in prefill + decode:
                e.progress = pools_progress
        prefill_router.check(self.views[0].views)
        decode_router.check(self.views[1].views)

    # -- routing ------------------------------------------------------------------------------
    def _route(self, pool: int, req: Request, t: float) -> int:
        views = self.views[pool]
        views.until(t)
        return route(self.routers[pool], req, views.views, t, POOLS[pool])

    # -- the driver's calls -------------------------------------------------------------------
    def attach(self, driver) -> None:
        self._driver = driver

    def watch(self, answered) -> None:
        self._answered = answered

    def _answer(self, reqs, t: float | None = None) -> None:
        """Requests ended (rejected at t, or finished: at their finish time)."""
        if self._answered is not None:
            for r in reqs:
                self._answered(r, r.finish_time if t is None else t)

    def submit(self, req: Request, t: float) -> None:
        out_len = req.take_output_len()
        d0 = self.decode[0]
        room = d0.kv.max_model_len - req.num_prompt_tokens
        stop = min(x for x in (out_len, req.max_tokens, room) if x is not None)
        tr = self.track[id(req)] = _Track(out_len, stop > 1)
        if tr.continues:   # the decode pool must be able to serve the rest
            reason = d0.overlong_reason(req, out_len) or d0.policy.rejection_reason(req)
            if reason is not None:
                d0.policy.reject(req, f"decode pool: {reason}")
                self._refused += 1
                self._answer((req,), t)
                return
        j = tr.prefill = self._route(0, req, t)
        e = self.prefill[j]
        e.wake(t)   # an idle (or blocked) replica waits for what comes at t
        self.views[0].add(j, req.num_prompt_tokens)
        if tr.continues:
            e.kv.retain(req)
        if not e.add_request(req, output_len=1 if tr.continues else out_len):
            self.views[0].remove(t, j, req.num_prompt_tokens)
            e.kv.release(req.request_id)
            self._answer((req,), e.now)

    def _handoff(self, handed: tuple, t: float) -> None:
        """The first token is out on prefill replica p at t: the request goes to a decode
        replica's queue, its KV held where it is."""
        req, p = handed
        d = self._route(1, req, t)
        tr = self.track[id(req)]
        tr.decode = d
        self.views[1].add(d, req.num_prompt_tokens)
        self._queue[d].append((req, p))
        e = self.decode[d]
        # layerwise reserves room at the first token; whole waits for the replica's next
        # iteration boundary (its clock, if it is running an iteration now)
        self._accept(d, t if self.transfer.mode == "layerwise" else max(t, e.now))

    def _accept(self, d: int, t: float) -> bool:
        """Decode replica d takes the requests of its queue, in order, while seats and KV
        (above its watermark) hold them, and none of its own waits (a preempted request, to be
        recomputed there, goes first); each one's transfer starts when both links are free.
        True if it took any."""
        q, e = self._queue[d], self.decode[d]
        policy = e.policy
        took = False
        while q and not policy.waiting:
            req, p = q[0]
            seats = len(policy.running) + self._in_flight[d] + len(self._landed[d])
            if seats >= policy.cfg.max_num_seqs or policy.admission_blocker(req, 1) is not None:
                break
            ok = e.kv.allocate_received(req)
            assert ok is not None, "admission_blocker and allocate_received disagree"
            q.popleft()
            tr = self.track[id(req)]
            start = max(t, self._send_free[p], self._recv_free[d])
            tr.start = start
            tr.nbytes = self.transfer.bytes(req.num_computed_tokens)
            tr.end = start + self.transfer.seconds(req.num_computed_tokens, tr.last_prefill_s,
                                                   overlapped=start == tr.ready)
            self._send_free[p] = self._recv_free[d] = tr.end
            self._in_flight[d] += 1
            self._driver.push(tr.end, self._land, (req, p, d), rank=INTERNAL)
            took = True
        return took

    def _land(self, landed: tuple, t: float) -> None:
        """A transfer ends at t: the prefill side frees its copy, the decode side seats it."""
        req, p, d = landed
        pe = self.prefill[p]
        pe.kv.release(req.request_id)
        pe.wake(t)
        self._in_flight[d] -= 1
        self._landed[d].append(req)
        self.decode[d].wake(t)
        self._seat(d)

    def _seat(self, d: int) -> None:
        """Landed requests join decode replica d's running batch while it has seats."""
        e, q = self.decode[d], self._landed[d]
        policy = e.policy
        seated = False
        while q and len(policy.running) < policy.cfg.max_num_seqs:
            req = q.popleft()
            tr = self.track[id(req)]
            seated = True
            if not e.adopt(req, tr.output_len):
                self.views[1].remove(e.now, d, req.num_prompt_tokens)
                self._answer((req,), e.now)
        if seated:
            e.wake(e.now)

    # -- steps --------------------------------------------------------------------------------
    def _bound(self, d: int) -> float:
        """The earliest time a request could reach decode replica d (its fast-forward stops
        there)."""
        b = self._driver.next_time()   # the next arrival, send, first token or transfer
        blocked = False
        for e in self.prefill:
            if e.policy.has_work():
                if e.blocked:
                    blocked = True
                elif e.now < b:
                    b = e.now
        # a prefill replica's KV may leave at another decode replica's next iteration; an
        # answer there may become a request
        if blocked or self._answered is not None:
            for k, e in enumerate(self.decode):
                if k != d and e.next_event_time() < b:
                    b = e.now
        return b

    def _ended(self, pool: int, j: int, t: float, reqs) -> None:
        for r in reqs:
            self.views[pool].remove(t, j, r.num_prompt_tokens)
            if pool == 0:
                self.prefill[j].kv.release(r.request_id)
        if self._answered is not None:
            for r in reqs:   # rejected at t; finished at its finish time
                self._answered(r, t if r.finish_time is None else r.finish_time)

    def _step_prefill(self, j: int) -> None:
        e = self.prefill[j]
        # one iteration: its first tokens are handed on as events, which decode replicas'
        # steps (`_accept`, transfers landing) may answer before its next one
        adv = e.advance(None, f"{POOLS[0]} replica {j}: ")
        if adv.rejected:
            self._ended(0, j, adv.start, adv.rejected)
        for r in adv.finished:   # a prefill replica ends every request at its first token
            self.views[0].remove(adv.end, j, r.num_prompt_tokens)
            tr = self.track[id(r)]
            if tr.continues:
                tr.ready, tr.last_prefill_s = adv.end, adv.end - adv.start
                self._handed += 1
                self._driver.push(adv.end, self._handoff, (r, j), rank=INTERNAL)
            else:
                self._answer((r,))

    def _step_decode(self, d: int) -> None:
        e = self.decode[d]
        adv = e.advance(self._bound(d), f"{POOLS[1]} replica {d}: ")
        if adv.rejected:
            self._ended(1, d, adv.start, adv.rejected)
        if adv.finished:
            self._ended(1, d, adv.end, adv.finished)
        if adv.batch is None and not adv.finished:
            return   # a run that ended nothing: no seat came free, no iteration was scheduled
        if adv.batch is not None and not adv.batch.reqs:   # scheduled nothing
            if not e.blocked and self._queue[d]:
                self._accept(d, e.now)
            return
        if self._queue[d]:   # at its iteration boundary, it takes what waits for it
            self._accept(d, e.now)
        if self._landed[d]:
            self._seat(d)

    def earliest(self) -> float:
        """When the busy replica furthest behind steps (the prefill pool first, lowest index
        among equals)."""
        best, t_best = None, math.inf
        for pool, engines in enumerate((self.prefill, self.decode)):
            for j, e in enumerate(engines):
                t = e.next_event_time()
                if t < t_best:
                    best, t_best = (pool, j), t
        self._next = best
        return t_best

    def advance(self, until: float) -> None:
        pool, j = self._next
        if pool == 0:
            self._step_prefill(j)
        else:
            self._step_decode(j)

    def finish(self) -> None:
        self._check_finished()

    def _check_finished(self) -> None:
        stuck = [f"decode replica {d}: {len(q)} requests waiting for room, "
                 f"{len(self._landed[d])} for a seat" for d, q in enumerate(self._queue)
                 if q or self._landed[d]]
        if stuck:
            raise RuntimeError("the run ended with requests undelivered: " + "; ".join(stuck))
        for pool, engines in enumerate((self.prefill, self.decode)):
            for j, e in enumerate(engines):
                try:
                    e.finish(f"{POOLS[pool]} replica {j}: ")
                except RuleViolation as err:
                    raise RuleViolation(f"{POOLS[pool]} replica {j}: {err}") from err

    def named_engines(self) -> list[tuple]:
        return [(f"{POOLS[pool]} replica {j}", e)
                for pool, engines in enumerate((self.prefill, self.decode))
                for j, e in enumerate(engines)]

    def describe(self) -> str:
        return "disaggregated pools (" + ", ".join(
            f"{len(engines)} {POOLS[pool]} replicas behind router {plugin(self.routers[pool])}"
            for pool, engines in enumerate((self.prefill, self.decode))) + ")"

    # -- results ------------------------------------------------------------------------------
    def tables(self, requests: list[Request]):
        """(requests table, iterations table). Requests gain `prefill_replica`,
        `decode_replica` (-1: none), `transfer_start`, `transfer_end` (NaN: no transfer) and
        `transfer_bytes`; iterations are every replica's, with `pool` and `replica`, in order
        of start (prefill pool first among equal starts)."""
        tracks = [self.track.get(id(r)) for r in requests]
        lens = {r.request_id: (t.output_len if t is not None else None)
                for r, t in zip(requests, tracks)}
        req_df = requests_frame(requests, (), lens)
        none = _Track(None, False)
        tracks = [t or none for t in tracks]
        n = len(requests)
        req_df["prefill_replica"] = np.fromiter((t.prefill for t in tracks), np.int64, n)
        req_df["decode_replica"] = np.fromiter((t.decode for t in tracks), np.int64, n)
        req_df["transfer_start"] = np.fromiter((t.start for t in tracks), float, n)
        req_df["transfer_end"] = np.fromiter((t.end for t in tracks), float, n)
        req_df["transfer_bytes"] = np.fromiter((t.nbytes for t in tracks), np.int64, n)
        it_df = iterations_frame([(e, {"pool": POOLS[pool], "replica": j})
                                  for pool, engines in enumerate((self.prefill, self.decode))
                                  for j, e in enumerate(engines)])
        return req_df, it_df

    def num_gpus(self) -> int:
        return sum(self._pool_gpus(pool) for pool in (0, 1))

    def _pool_gpus(self, pool: int) -> int:
        """Each replica: a tensor-parallel group per expert-parallel group (pools have no
        pipeline stages)."""
        engines = (self.prefill, self.decode)[pool]
        return sum(self.tensor_parallel[pool] * expert_parallel(e) for e in engines)

    def summarize(self, req_df, it_df, slo: dict | None = None,
                  price_per_gpu_hour: float | None = None,
                  num_gpus: int | None = None) -> dict:
        """The run's summary over both pools (every GPU counted in `num_gpus`, the cost and the
        goodput per GPU; no fleet-wide `kv`, the pools' caches differing), with `pools` (each
        pool's size, load and KV), `transfer` (the link and the KV's shape) and `transfers`
        (the KV moved). The pools count their GPUs themselves (each its replicas' tensor x
        expert parallel): `num_gpus` must be None."""
        if num_gpus is not None:
            raise ValueError(f"num_gpus={num_gpus}: disaggregated pools count their own GPUs "
                             "(each pool's replicas x their tensor x expert parallel)")
        out = summarize(req_df, it_df, slo=slo,
                        prefix_cache=pooled_prefix([e.kv for e in self.prefill]),
                        price_per_gpu_hour=price_per_gpu_hour, num_gpus=self.num_gpus())
        span = out["makespan_s"]
        out["pools"] = {
            POOLS[pool]: self._pool_summary(pool, req_df, it_df, span)
            for pool in (0, 1)}
        out["transfers"] = transfer_stats(req_df)
        out["transfer"] = self.transfer.as_dict()
        return out

    def _pool_summary(self, pool: int, req_df, it_df, span: float) -> dict:
        engines = (self.prefill, self.decode)[pool]
        kv = engines[0].kv
        col = "prefill_replica" if pool == 0 else "decode_replica"
        mine = it_df[it_df["pool"] == POOLS[pool]]
        served_here = req_df[req_df[col] >= 0]
        s = summarize(served_here, mine, kv_blocks_total=kv.num_blocks,
                      block_size=kv.block_size)
        if pool == 1:
            # a request waits for the decode pool from its first token (its KV ready on the
            # prefill side) to its transfer's start, not from its arrival
            moved = served_here.assign(arrival_time=served_here["first_token_time"],
                                       first_scheduled_time=served_here["transfer_start"])
            s["queue"] = queue_stats(moved, mine, span)
        tp = self.tensor_parallel[pool]
        busy = float(mine["duration"].sum())
        served = req_df[col].to_numpy()
        router = self.routers[pool]
        return {
            # expert parallel: attention runs data-parallel over the groups, so a request's KV
            # (what the hand-off moves) lives on one tensor-parallel group either way
            "num_replicas": len(engines), "tensor_parallel": tp,
            "expert_parallel": expert_parallel(engines[0]), "num_gpus": self._pool_gpus(pool),
            "policy": engines[0].policy.name, "router": router.name or type(router).__qualname__,
            "requests_per_replica": [int((served == j).sum()) for j in range(len(engines))],
            "num_iterations": int(len(mine)),
            "busy_s": busy,
            "utilization": busy / (span * len(engines)) if span > 0 else 0.0,
            "preemptions": int(mine["preemptions"].sum()),
            "kv": s["kv"], "queue": s.get("queue"),
        }
