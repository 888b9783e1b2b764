"""The load: open loop (each request sent at its trace time, whatever the server does) or closed
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

from sarathi_lab.replay.prompts import completion_body
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

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/completions"


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


async def _replay(requests, ep: Endpoint, headers: dict, clients: int | None, think,
                  seed: int, progress) -> tuple[list[Outcome], list[int]]:
    import aiohttp
    outcomes: list[Outcome | None] = [None] * len(requests)
    users = [-1] * len(requests)
    clock = replay_clock()
    bar = _progress(len(requests), progress)
    counts = {"error": 0, "timeout": 0, "rejected": 0}

    async def one(i: int) -> None:
        r = requests[i]
        body = completion_body(ep.model, r.prompt_token_ids, r.max_tokens, ep.ignore_eos)
        o = await send(session, ep.url, body, headers, clock, timeout=ep.timeout,
                       stall_timeout=ep.stall_timeout)
        outcomes[i] = o
        if bar is not None:
            if o.status in counts:
                counts[o.status] += 1
                bar.set_postfix(counts, refresh=False)
            bar.update(1)

    connector = aiohttp.TCPConnector(limit=ep.max_connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        if clients is None:   # open loop: each at its time
            tasks = []
            for i, r in enumerate(requests):
                wait = r.arrival_time - clock()
                if wait > 0:
                    await asyncio.sleep(wait)
                tasks.append(asyncio.ensure_future(one(i)))
            await asyncio.gather(*tasks)
        else:
            from sarathi_lab.closed_loop import THINK_STREAM
            queue = iter(range(len(requests)))

            async def user(u: int) -> None:
                draw = think.sampler(np.random.default_rng([THINK_STREAM, int(seed), u]))
                await asyncio.sleep(draw())   # every user starts with one think time from 0
                for i in queue:
                    r = requests[i]
                    t = clock()
                    if r.deadline is not None:   # a relative deadline moves with the send
                        r.deadline = t + (r.deadline - r.arrival_time)
                    r.arrival_time = t
                    users[i] = u
                    await one(i)
                    await asyncio.sleep(draw())
            await asyncio.gather(*(user(u) for u in range(clients)))
    if bar is not None:
        bar.close()
    return outcomes, users


def replay(requests, ep: Endpoint, headers: dict, *, clients: int | None = None, think=None,
           seed: int = 0, progress="auto") -> tuple[list[Outcome], list[int]]:
    """Send `requests` (`Request`s with prompt ids and `max_tokens`; open loop at their
    `arrival_time`, or closed loop with `clients` users, whose sends set it) and return each
    one's Outcome, and in closed loop the user who sent it (-1 in open loop)."""
    return asyncio.run(_replay(requests, ep, headers, clients, think, seed, progress))
