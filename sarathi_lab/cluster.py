"""A fleet: N engines behind a router, on one virtual clock.

Each replica is a whole `Engine` (its own policy, KV cache and executor) driven through its public
API: `add_request`, `step` and `skip_ahead`. The driver always advances the busy engine that is
furthest behind, so no engine runs past an arrival before that arrival is routed: a request is
routed when the fleet's clock reaches it, and every engine's fast-forward stops at the next
arrival (the router may send it there). One replica reproduces `Engine.run` exactly.

What the router sees (`routers.ReplicaView`): per replica, the requests it was sent that had not
finished or been rejected at the arrival's time, and the prompt tokens of those that had not
emitted a first token yet, counted exactly at that time (a request that ends in an iteration
still running at that time is still outstanding), and the replica's prefix cache.
"""
from __future__ import annotations

import heapq
import math
from numbers import Integral
from operator import attrgetter

import numpy as np

from sarathi_lab.engine import Engine
from sarathi_lab.guard import RuleViolation
from sarathi_lab.request import Request
from sarathi_lab.routers import ReplicaView, Router

_ARRIVAL = attrgetter("arrival_time")


class Cluster:
    """`run(requests)` replays a workload over `engines`, `router` choosing each request's
    replica. `progress`, if given, is called as progress(num_done, num_tokens) with the
    fleet's totals after iterations that end requests (as `Engine`'s)."""

    def __init__(self, engines: list[Engine], router: Router, progress=None):
        if not engines:
            raise ValueError("cluster.num_replicas: a fleet needs at least one engine")
        if not isinstance(router, Router):
            raise TypeError(f"router {router!r} is not a sarathi_lab.routers.Router")
        self.engines = engines
        self.router = router
        self.views = [ReplicaView(j, e) for j, e in enumerate(engines)]
        self.replica_of: dict[int, int] = {}   # id(request) -> its replica
        # heap of changes to the routers' counts: (time, seq, replica, tokens, requests)
        self._changes: list[tuple] = []
        self._owed: list[set[int]] = [set() for _ in engines]   # ids without a first token yet
        self._seq = 0
        # per engine, while it may go on skipping decodes: the result of its last step
        self._resume: list[tuple | None] = [None] * len(engines)
        if progress is not None:
            def fleet_progress(_done, _tokens):
                progress(sum(e.num_done for e in engines), sum(e.num_tokens for e in engines))
            for e in engines:
                e.progress = fleet_progress
        router.check(self.views)

    # -- the router's counts ------------------------------------------------------------------
    def _change(self, t: float, j: int, tokens: int, requests: int) -> None:
        """From time t on, replica j owes `tokens` fewer prompt tokens and has `requests`
        fewer outstanding requests."""
        heapq.heappush(self._changes, (t, self._seq, j, tokens, requests))
        self._seq += 1

    def _first_tokens(self, j: int, out) -> None:
        """After a step of replica j that computed prompt tokens: the requests whose first
        token came out in it no longer owe their prompt."""
        owed = self._owed[j]
        if owed:
            for r in out.reqs:
                if r.num_output_tokens and id(r) in owed:
                    owed.discard(id(r))
                    self._change(r.token_times[0], j, r.num_prompt_tokens, 0)

    def _ended(self, j: int, t: float, reqs) -> None:
        """Requests of replica j that finished or were rejected at time t."""
        owed = self._owed[j]
        for r in reqs:
            tokens = 0
            if id(r) in owed:   # rejected before a first token
                owed.discard(id(r))
                tokens = r.num_prompt_tokens
            self._change(t, j, tokens, 1)

    def _count_until(self, t: float) -> None:
        """The routers' counts as of time t."""
        changes, views = self._changes, self.views
        while changes and changes[0][0] <= t:
            _, _, j, tokens, requests = heapq.heappop(changes)
            views[j].outstanding_tokens -= tokens
            views[j].num_outstanding -= requests

    def _route(self, req: Request, t: float) -> None:
        self._count_until(t)
        j = route(self.router, req, self.views, t)
        engine, view = self.engines[j], self.views[j]
        if not engine.policy.has_work():
            engine.now = max(engine.now, t)   # an idle replica waits for its next arrival
        self.replica_of[id(req)] = j
        self._resume[j] = None   # its next batch may take the new request
        view.num_outstanding += 1
        view.outstanding_tokens += req.num_prompt_tokens
        self._owed[j].add(id(req))
        if not engine.add_request(req):
            self._ended(j, t, (req,))

    # -- the loop -----------------------------------------------------------------------------
    def run(self, requests: list[Request]) -> list[Request]:
        reqs = sorted(requests, key=_ARRIVAL)
        engines, resume = self.engines, self._resume
        i, n_total = 0, len(reqs)
        while True:
            busy, j_busy = None, -1       # the busy engine furthest behind (lowest index first)
            for j, e in enumerate(engines):
                if (busy is None or e.now < busy.now) and e.policy.has_work():
                    busy, j_busy = e, j
            t_next = reqs[i].arrival_time if i < n_total else math.inf
            if busy is None or t_next <= busy.now:
                if i == n_total:
                    break
                self._route(reqs[i], t_next)
                i += 1
                continue
            last = resume[j_busy]
            if last is not None:
                # its decode run was cut at an arrival that went elsewhere: nothing changed on
                # it since, so the run goes on (`skip_ahead` asks the policy again)
                before = busy.now
                busy.skip_ahead(*last, t_next)
                if busy.now != before:
                    continue
                resume[j_busy] = None
            start = busy.now
            out, done, n_pre, n_dec = busy.step()
            if n_pre:
                self._first_tokens(j_busy, out)
            if out.rejected:
                self._ended(j_busy, start, out.rejected)
            if done:
                self._ended(j_busy, busy.now, done)
            if not out:
                policy = busy.policy
                if out.rejected or not policy.has_work():
                    continue
                if i < n_total and not policy.running:
                    busy.now = t_next   # a plug-in may wait for more arrivals
                    continue
                kv = busy.kv
                raise RuntimeError(
                    f"replica {j_busy}: policy {policy.name!r} scheduled nothing at "
                    f"t={busy.now:.3f}s with {len(policy.waiting)} waiting and "
                    f"{len(policy.running)} running requests and {kv.num_free_blocks}/"
                    f"{kv.num_blocks} KV blocks free; it would never make progress")
            if busy.fast_forward:
                busy.skip_ahead(out, done, n_pre, n_dec, t_next)
                resume[j_busy] = (out, done, n_pre, n_dec)
        for j, e in enumerate(engines):
            try:
                e.guard.finished()
            except RuleViolation as err:
                raise RuleViolation(f"replica {j}: {err}") from err
        return reqs

    # -- results ------------------------------------------------------------------------------
    def tables(self, requests: list[Request]):
        """(requests table, iterations table) of the whole fleet, each with a `replica` column;
        iterations in order of start time (replica order among equal starts)."""
        import pandas as pd

        from sarathi_lab.metrics import iterations_table, requests_table
        lens = {}
        for e in self.engines:
            lens.update(e.output_lens)
        req_df = requests_table(requests, lens)
        req_df["replica"] = np.fromiter((self.replica_of.get(id(r), -1) for r in requests),
                                        np.int64, len(requests))
        parts = []
        for j, e in enumerate(self.engines):
            it = iterations_table(e.iteration_columns())
            it["replica"] = np.full(len(it), j, np.int64)
            parts.append(it)
        it_df = pd.concat(parts, ignore_index=True)
        it_df = it_df.sort_values("start", kind="stable", ignore_index=True)
        return req_df, it_df

    def summarize(self, req_df, it_df, slo: dict | None = None,
                  price_per_gpu_hour: float | None = None, num_gpus: int = 1) -> dict:
        """The run's summary over the whole fleet (`kv.blocks_total`: the fleet's blocks;
        `kv.utilization_*` over every replica's iterations, each against its own cache; `cost`:
        every replica's `num_gpus`), with `replicas`: each replica's own summary."""
        from sarathi_lab.metrics import summarize
        kvs = [e.kv for e in self.engines]
        sizes = {(kv.num_blocks, kv.block_size) for kv in kvs}
        assert len(sizes) == 1, "utilization per iteration assumes one KV size for the fleet"
        blocks, block_size = sizes.pop()
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
        stats = [kv.prefix_cache_stats() for kv in kvs]
        pooled = None if stats[0] is None else {
            k: sum(s[k] for s in stats) for k in ("hit_tokens", "query_tokens")}
        out = summarize(req_df, it_df, slo=slo, kv_blocks_total=blocks, block_size=block_size,
                        prefix_cache=pooled, price_per_gpu_hour=price_per_gpu_hour,
                        num_gpus=num_gpus * len(kvs), swap_space=fleet_swap)
        out["kv"]["blocks_total"] = blocks * len(kvs)
        if fleet_swap:
            out["swap"]["host_blocks_total"] = sum(w["host_blocks_total"] for w in swaps)
        out["num_replicas"] = len(kvs)
        out["router"] = self.router.name or type(self.router).__qualname__
        out["replicas"] = per
        return out


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
                         f"({cls.__module__}.{cls.__qualname__}) returned {j!r} for "
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
