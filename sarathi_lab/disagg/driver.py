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

Every engine is driven through its public API (`add_request`, `step`, `skip_ahead`, `adopt`); as
in `cluster.py`, the busy engine furthest behind steps next and an event (an arrival, a first
token, a transfer's end) is handled before any engine steps past it. A decode replica's
fast-forward stops where a new request could reach it: the next arrival or event, the clock of
every prefill replica at work (its next iteration may end in a first token), and, while a prefill
replica is blocked on KV waiting to leave, the clocks of the other decode replicas (whose next
iteration may take that KV). Timing and design: sarathi_lab/DESIGN.md, "Disaggregated
prefill/decode".
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from sarathi_lab.cluster import route
from sarathi_lab.disagg.pools import POOLS
from sarathi_lab.disagg.transfer import Transfer
from sarathi_lab.engine import Engine
from sarathi_lab.guard import RuleViolation
from sarathi_lab.request import Request
from sarathi_lab.routers import ReplicaView, Router


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


class _Views:
    """A pool's `ReplicaView`s, counted exactly as of the time a router asks: a change made by
    an iteration that ends later waits in a heap until then."""

    def __init__(self, engines: list[Engine]):
        self.views = [ReplicaView(j, e) for j, e in enumerate(engines)]
        self._changes: list[tuple] = []
        self._seq = 0

    def add(self, j: int, tokens: int) -> None:
        self.views[j].num_outstanding += 1
        self.views[j].outstanding_tokens += tokens

    def remove(self, t: float, j: int, tokens: int) -> None:
        """From time t on, replica j has one outstanding request and `tokens` tokens fewer."""
        heapq.heappush(self._changes, (t, self._seq, j, tokens))
        self._seq += 1

    def until(self, t: float) -> None:
        changes, views = self._changes, self.views
        while changes and changes[0][0] <= t:
            _, _, j, tokens = heapq.heappop(changes)
            views[j].outstanding_tokens -= tokens
            views[j].num_outstanding -= 1


_HANDOFF, _LAND = 0, 1


class Disaggregated:
    """`run(requests)` serves a workload on a prefill pool and a decode pool. `transfer` prices
    each KV move, and its tensor-parallel sizes count the GPUs. `progress`, if given, is called
    as progress(num_done, num_tokens)."""

    def __init__(self, prefill: list[Engine], decode: list[Engine], prefill_router: Router,
                 decode_router: Router, transfer: Transfer, *, progress=None):
        if not prefill or not decode:
            raise ValueError("cluster.prefill.num_replicas and cluster.decode.num_replicas: "
                             "each pool needs at least one engine")
        for r in (prefill_router, decode_router):
            if not isinstance(r, Router):
                raise TypeError(f"router {r!r} is not a sarathi_lab.routers.Router")
        for e in decode:
            assert not e.kv.enable_prefix_caching, "the decode pool keeps no prefix cache"
        self.prefill, self.decode = prefill, decode
        self.routers = (prefill_router, decode_router)
        self.transfer = transfer
        self.tensor_parallel = (transfer.tp_prefill, transfer.tp_decode)
        self.views = (_Views(prefill), _Views(decode))
        self.track: dict[int, _Track] = {}
        self._events: list[tuple] = []   # (time, seq, kind, request, prefill j, decode j)
        self._seq = 0
        self._queue = [deque() for _ in decode]     # awaiting room: (request, prefill j)
        self._in_flight = [0] * len(decode)          # transfers under way to each
        self._landed = [deque() for _ in decode]     # KV here, waiting for a seat
        self._send_free = [0.0] * len(prefill)       # each replica's link, free from
        self._recv_free = [0.0] * len(decode)
        self._asleep: set[tuple[int, int]] = set()   # (pool, j): blocked until an event
        self._resume: list[tuple | None] = [None] * len(decode)
        self._next_arrival = math.inf
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

    @staticmethod
    def _wake(e: Engine, t: float) -> None:
        if e.now < t:   # an idle (or blocked) replica waits for what comes at t
            e.now = t

    # -- events -------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, req: Request, p: int, d: int) -> None:
        heapq.heappush(self._events, (t, self._seq, kind, req, p, d))
        self._seq += 1

    def _arrive(self, req: Request, t: float) -> None:
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
                return
        j = tr.prefill = self._route(0, req, t)
        e = self.prefill[j]
        self._wake(e, t)
        self._asleep.discard((0, j))
        self.views[0].add(j, req.num_prompt_tokens)
        if tr.continues:
            e.kv.retain(req)
        if not e.add_request(req, output_len=1 if tr.continues else out_len):
            self.views[0].remove(t, j, req.num_prompt_tokens)
            e.kv.release(req.request_id)

    def _handoff(self, req: Request, p: int, t: float) -> None:
        """The first token is out on prefill replica p at t: the request goes to a decode
        replica's queue, its KV held where it is."""
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
            self._push(tr.end, _LAND, req, p, d)
            took = True
        if took:
            self._resume[d] = None
        return took

    def _land(self, req: Request, p: int, d: int, t: float) -> None:
        """A transfer ends at t: the prefill side frees its copy, the decode side seats it."""
        pe = self.prefill[p]
        pe.kv.release(req.request_id)
        self._wake(pe, t)
        self._asleep.discard((0, p))
        self._in_flight[d] -= 1
        self._landed[d].append(req)
        self._wake(self.decode[d], t)
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
        if seated:
            self._asleep.discard((1, d))
            self._resume[d] = None

    # -- steps --------------------------------------------------------------------------------
    def _bound(self, d: int) -> float:
        """The earliest time a request could reach decode replica d (its fast-forward stops
        there)."""
        b = self._next_arrival
        if self._events:
            b = min(b, self._events[0][0])
        blocked = False
        for j, e in enumerate(self.prefill):
            if e.policy.has_work():
                if (0, j) in self._asleep:
                    blocked = True
                elif e.now < b:
                    b = e.now
        if blocked:   # its KV may leave at another decode replica's next iteration
            for k, e in enumerate(self.decode):
                if k != d and e.policy.has_work() and (1, k) not in self._asleep and e.now < b:
                    b = e.now
        return b

    def _ended(self, pool: int, j: int, t: float, reqs) -> None:
        for r in reqs:
            self.views[pool].remove(t, j, r.num_prompt_tokens)
            if pool == 0:
                self.prefill[j].kv.release(r.request_id)

    def _empty(self, pool: int, j: int, e: Engine, out) -> bool:
        """An empty batch: rejections, nothing left, or blocked until an event; True when
        the replica may go on."""
        if out.rejected:
            self._ended(pool, j, e.now, out.rejected)
            return True
        policy = e.policy
        if not policy.has_work():
            return True
        if not policy.running:
            self._asleep.add((pool, j))
            return False
        kv = e.kv
        raise RuntimeError(
            f"{POOLS[pool]} replica {j}: policy {policy.name!r} scheduled nothing at "
            f"t={e.now:.3f}s with {len(policy.waiting)} waiting and {len(policy.running)} "
            f"running requests and {kv.num_free_blocks}/{kv.num_blocks} KV blocks free; it "
            "would never make progress")

    def _step_prefill(self, j: int) -> None:
        e = self.prefill[j]
        start = e.now
        out, done, _, _ = e.step()
        if not out:
            self._empty(0, j, e, out)
            return
        if out.rejected:
            self._ended(0, j, start, out.rejected)
        for r in done:   # a prefill replica ends every request at its first token
            self.views[0].remove(e.now, j, r.num_prompt_tokens)
            tr = self.track[id(r)]
            if tr.continues:
                tr.ready, tr.last_prefill_s = e.now, e.now - start
                self._handed += 1
                self._push(e.now, _HANDOFF, r, j, -1)

    def _step_decode(self, d: int) -> None:
        e = self.decode[d]
        last = self._resume[d]
        if last is not None:
            # its decode run was cut where a request could have come; none did
            before = e.now
            e.skip_ahead(*last, self._bound(d))
            if e.now != before:
                return
            self._resume[d] = None
        start = e.now
        out, done, n_pre, n_dec = e.step()
        if not out:
            if self._empty(1, d, e, out) and self._queue[d]:
                self._accept(d, e.now)
            return
        if out.rejected:
            self._ended(1, d, start, out.rejected)
        if done:
            self._ended(1, d, e.now, done)
        if self._queue[d]:   # at its iteration boundary, it takes what waits for it
            self._accept(d, e.now)
        if self._landed[d]:
            self._seat(d)
        if e.fast_forward:
            e.skip_ahead(out, done, n_pre, n_dec, self._bound(d))
            self._resume[d] = (out, done, n_pre, n_dec)

    def _earliest(self) -> tuple[int, int, Engine] | None:
        """The busy replica furthest behind (the prefill pool first, lowest index among
        equals)."""
        best = None
        for pool, engines in enumerate((self.prefill, self.decode)):
            for j, e in enumerate(engines):
                if (best is None or e.now < best[2].now) and e.policy.has_work() \
                        and (pool, j) not in self._asleep:
                    best = (pool, j, e)
        return best

    def run(self, requests: list[Request]) -> list[Request]:
        reqs = sorted(requests, key=lambda r: r.arrival_time)
        i, n = 0, len(reqs)
        events = self._events
        while True:
            self._next_arrival = reqs[i].arrival_time if i < n else math.inf
            busy = self._earliest()
            t_busy = busy[2].now if busy is not None else math.inf
            t_event = events[0][0] if events else math.inf
            if t_event <= t_busy and t_event <= self._next_arrival and events:
                t, _, kind, req, p, d = heapq.heappop(events)
                if kind == _HANDOFF:
                    self._handoff(req, p, t)
                else:
                    self._land(req, p, d, t)
                continue
            if i < n and self._next_arrival <= t_busy:
                self._arrive(reqs[i], self._next_arrival)
                i += 1
                continue
            if busy is None:
                break
            pool, j, _ = busy
            if pool == 0:
                self._step_prefill(j)
            else:
                self._step_decode(j)
        self._check_finished()
        return reqs

    def _check_finished(self) -> None:
        stuck = [f"decode replica {d}: {len(q)} requests waiting for room, "
                 f"{len(self._landed[d])} for a seat" for d, q in enumerate(self._queue)
                 if q or self._landed[d]]
        if stuck:
            raise RuntimeError("the run ended with requests undelivered: " + "; ".join(stuck))
        for pool, engines in enumerate((self.prefill, self.decode)):
            for j, e in enumerate(engines):
                try:
                    e.guard.finished()
                except RuleViolation as err:
                    raise RuleViolation(f"{POOLS[pool]} replica {j}: {err}") from err

    # -- results ------------------------------------------------------------------------------
    def tables(self, requests: list[Request]):
        """(requests table, iterations table). Requests gain `prefill_replica`,
        `decode_replica` (-1: none), `transfer_start`, `transfer_end` (NaN: no transfer) and
        `transfer_bytes`; iterations are every replica's, with `pool` and `replica`, in order
        of start (prefill pool first among equal starts)."""
        import pandas as pd

        from sarathi_lab.metrics import iterations_table, requests_table
        tracks = [self.track.get(id(r)) for r in requests]
        lens = {r.request_id: (t.output_len if t is not None else None)
                for r, t in zip(requests, tracks)}
        req_df = requests_table(requests, lens)
        none = _Track(None, False)
        tracks = [t or none for t in tracks]
        n = len(requests)
        req_df["prefill_replica"] = np.fromiter((t.prefill for t in tracks), np.int64, n)
        req_df["decode_replica"] = np.fromiter((t.decode for t in tracks), np.int64, n)
        req_df["transfer_start"] = np.fromiter((t.start for t in tracks), float, n)
        req_df["transfer_end"] = np.fromiter((t.end for t in tracks), float, n)
        req_df["transfer_bytes"] = np.fromiter((t.nbytes for t in tracks), np.int64, n)
        parts = []
        for pool, engines in enumerate((self.prefill, self.decode)):
            for j, e in enumerate(engines):
                it = iterations_table(e.iteration_columns())
                it["pool"] = POOLS[pool]
                it["replica"] = np.full(len(it), j, np.int64)
                parts.append(it)
        it_df = pd.concat(parts, ignore_index=True)
        it_df = it_df.sort_values("start", kind="stable", ignore_index=True)
        return req_df, it_df

    def num_gpus(self) -> int:
        tp_p, tp_d = self.tensor_parallel
        return len(self.prefill) * tp_p + len(self.decode) * tp_d

    def summarize(self, req_df, it_df, slo: dict | None = None,
                  price_per_gpu_hour: float | None = None) -> dict:
        """The run's summary over both pools (every GPU counted in `num_gpus`, the cost and the
        goodput per GPU; no fleet-wide `kv`, the pools' caches differing), with `pools` (each
        pool's size, load and KV), `transfer` (the link and the KV's shape) and `transfers`
        (the KV moved)."""
        from sarathi_lab.metrics import summarize, transfer_stats
        stats = [e.kv.prefix_cache_stats() for e in self.prefill]
        pooled = None if stats[0] is None else {
            k: sum(s[k] for s in stats) for k in ("hit_tokens", "query_tokens")}
        out = summarize(req_df, it_df, slo=slo, prefix_cache=pooled,
                        price_per_gpu_hour=price_per_gpu_hour, num_gpus=self.num_gpus())
        span = out["makespan_s"]
        out["pools"] = {
            POOLS[pool]: self._pool_summary(pool, req_df, it_df, span)
            for pool in (0, 1)}
        out["transfers"] = transfer_stats(req_df)
        out["transfer"] = self.transfer.as_dict()
        return out

    def _pool_summary(self, pool: int, req_df, it_df, span: float) -> dict:
        from sarathi_lab.metrics import summarize
        engines = (self.prefill, self.decode)[pool]
        kv = engines[0].kv
        col = "prefill_replica" if pool == 0 else "decode_replica"
        mine = it_df[it_df["pool"] == POOLS[pool]]
        s = summarize(req_df[req_df[col] >= 0], mine, kv_blocks_total=kv.num_blocks,
                      block_size=kv.block_size)
        tp = self.tensor_parallel[pool]
        busy = float(mine["duration"].sum())
        served = req_df[col].to_numpy()
        router = self.routers[pool]
        return {
            "num_replicas": len(engines), "tensor_parallel": tp,
            "num_gpus": len(engines) * tp,
            "policy": engines[0].policy.name, "router": router.name or type(router).__qualname__,
            "requests_per_replica": [int((served == j).sum()) for j in range(len(engines))],
            "num_iterations": int(len(mine)),
            "busy_s": busy,
            "utilization": busy / (span * len(engines)) if span > 0 else 0.0,
            "preemptions": int(mine["preemptions"].sum()),
            "kv": s["kv"], "queue": s.get("queue"),
        }
