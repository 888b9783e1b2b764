"""The load: open loop (each request sent at its trace time, whatever the server does; with
`max_concurrency`, at its trace time or once one of that many requests in flight ended, as
`vllm bench serve --max-concurrency`, its times then running from the send) or closed
loop (`trace.clients` users, each sending the next request of the trace a think time after its
previous answer ended, as `topology.clients.ClosedLoop` does on the simulator's clock, with the
same per-user think-time streams). Every request goes through one aiohttp session whose
connection pool holds at most `max_connections`; a request sent while all are busy waits for
one, and that wait counts in its latency (times run from the moment it was due: an overloaded
client shows as latency, never as a lower offered load)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from sarathi_lab.replay.prompts import APIS, request_body
from sarathi_lab.replay.stream import Outcome, replay_clock, send


@dataclass(frozen=True)
class Endpoint:
    """Where and how requests go. The API key itself is never kept here (nor written): only the
    name of the environment variable it came from."""
    base_url: str
    model: str
    timeout: float
    stall_timeout: float
    max_connections: int
    ignore_eos: bool = True
    api: str = "completions"   # completions | chat
    max_concurrency: int | None = None   # open loop: requests in flight at most

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + APIS[self.api]


def _progress(total: int, enabled):
    """A tqdm bar of finished requests, or None. auto: on a terminal outside CI."""
    import os
    import sys
    if enabled == "auto":
        enabled = sys.stderr.isatty() and not os.environ.get("CI")
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, unit="req", desc="replaying", mininterval=0.5, leave=False)


def sent_at(r, t: float) -> None:
    """A request sent at `t` rather than at its trace time; a relative deadline moves with it."""
    if r.deadline is not None:
        r.deadline = t + (r.deadline - r.arrival_time)
    r.arrival_time = t


async def _send_safely(session, ep: Endpoint, body: dict, headers: dict, clock) -> Outcome:
    """One request's outcome, whatever happens to it: a failure this client did not foresee
    fails the request (named in its `error`), not the replay."""
    try:
        return await send(session, ep.url, body, headers, clock, timeout=ep.timeout,
                          stall_timeout=ep.stall_timeout, chat=ep.api == "chat")
    except Exception as e:   # noqa: BLE001 - recorded on the request, the others go on
        return Outcome(status="error", error=f"client: {type(e).__name__}: {e}")


async def _warm_up(session, ep: Endpoint, requests, prompts, headers: dict) -> list[Outcome]:
    """Send the warm-up requests, at once (bounded by the connection pool and
    max_concurrency), and wait for all of them."""
    gate = asyncio.Semaphore(ep.max_concurrency or len(requests) or 1)
    clock = replay_clock()

    async def one(r, p):
        async with gate:
            return await _send_safely(session, ep, request_body(
                ep.model, p, r.max_tokens, ep.ignore_eos, ep.api), headers, clock)
    return list(await asyncio.gather(*(one(r, p) for r, p in zip(requests, prompts))))


async def _replay(requests, prompts, ep: Endpoint, headers: dict, clients: int | None, think,
                  seed: int, progress, warmup) -> tuple[list[Outcome], list[int], list[Outcome]]:
    import aiohttp
    outcomes: list[Outcome | None] = [None] * len(requests)
    users = [-1] * len(requests)
    bar = _progress(len(requests), progress)
    counts = {"error": 0, "timeout": 0, "rejected": 0}

    async def one(i: int) -> None:
        r = requests[i]
        body = request_body(ep.model, prompts[i], r.max_tokens, ep.ignore_eos, ep.api)
        o = await _send_safely(session, ep, body, headers, clock)
        outcomes[i] = o
        if bar is not None:
            if o.status in counts:
                counts[o.status] += 1
                bar.set_postfix(counts, refresh=False)
            bar.update(1)

    connector = aiohttp.TCPConnector(limit=ep.max_connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        warm = await _warm_up(session, ep, *warmup, headers) if warmup else []
        clock = replay_clock()   # the measured replay starts after the warm-up
        if clients is None:   # open loop: each at its time (or once a slot is free)
            gate = asyncio.Semaphore(ep.max_concurrency) if ep.max_concurrency else None

            async def gated(i: int) -> None:
                async with gate:   # its times run from the send, as vllm bench serve's
                    sent_at(requests[i], max(requests[i].arrival_time, clock()))
                    await one(i)
            tasks = []
            for i, r in enumerate(requests):
                wait = r.arrival_time - clock()
                if wait > 0:
                    await asyncio.sleep(wait)
                tasks.append(asyncio.ensure_future(gated(i) if gate else one(i)))
            await asyncio.gather(*tasks)
        else:
            from sarathi_lab.traces.clients import THINK_STREAM
            queue = iter(range(len(requests)))

            async def user(u: int) -> None:
                draw = think.sampler(np.random.default_rng([THINK_STREAM, int(seed), u]))
                await asyncio.sleep(draw())   # every user starts with one think time from 0
                for i in queue:
                    sent_at(requests[i], clock())
                    users[i] = u
                    await one(i)
                    await asyncio.sleep(draw())
            await asyncio.gather(*(user(u) for u in range(clients)))
    if bar is not None:
        bar.close()
    return outcomes, users, warm


def replay(requests, prompts, ep: Endpoint, headers: dict, *, clients: int | None = None,
           think=None, seed: int = 0, progress="auto", warmup=None
           ) -> tuple[list[Outcome], list[int], list[Outcome]]:
    """Send `requests` (`Request`s with `max_tokens`, `prompts[i]` the i-th one's ids or text;
    open loop at their `arrival_time`, or closed loop with `clients` users, whose sends set it)
    and return each one's Outcome, in closed loop the user who sent it (-1 in open loop), and
    the outcomes of `warmup` ((requests, prompts) sent first, their times not measured)."""
    return asyncio.run(_replay(requests, prompts, ep, headers, clients, think, seed, progress,
                               warmup))
