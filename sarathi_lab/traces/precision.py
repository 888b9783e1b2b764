"""Arrival times the run's clock can resolve.

Times are float64 seconds. Far from 0 a float's spacing (`math.ulp`) grows: at t = 1e300 it is
~1e284 s, so adding an iteration of a few milliseconds leaves the clock where it was, and a
request arriving there reports a TTFT and an end-to-end latency of exactly 0. The run must
resolve a microsecond (`CLOCK_RESOLUTION_S`: the finest iteration a cost model prices is
tens of microseconds); the float spacing is at most that below `MAX_ARRIVAL_S` = 2**33 s (about
272 years after the first arrival), and coarser from there on. An arrival at or past it is refused,
naming the request (its row in the trace as built) and the limit.
"""
from __future__ import annotations

import math

import numpy as np

CLOCK_RESOLUTION_S = 1e-6
# the smallest power of two whose float spacing exceeds the resolution: below it, every float's
# spacing is at most half of that, 2**-20 s
MAX_ARRIVAL_S = 2.0 ** (math.floor(math.log2(CLOCK_RESOLUTION_S)) + 53)


def unresolvable(t: float, what: str) -> str | None:
    """Why the clock cannot take `t` (`what`: the request, for the message); None if it can."""
    if t < MAX_ARRIVAL_S:
        return None
    return (f"{what} arrives at t={t:.6g} s, where the clock's resolution is "
            f"{math.ulp(t):.3g} s, coarser than the {CLOCK_RESOLUTION_S:g} s a run must resolve "
            f"(its latencies would round to 0): arrivals must come before {MAX_ARRIVAL_S:.6g} s "
            "(2**33 s, about 272 years) after the first; check the trace's times, trace.qps "
            "or the think time")


def check_arrivals(df, source: str) -> None:
    """ValueError naming the first row of the trace frame `df` (`source`: the trace's name)
    whose arrival time the clock cannot resolve."""
    t = df["arrival_time"].to_numpy(dtype=np.float64)
    bad = np.flatnonzero(t >= MAX_ARRIVAL_S)
    if len(bad):
        i = int(bad[0])
        more = f" ({len(bad) - 1} later rows too)" if len(bad) > 1 else ""
        raise ValueError(f"trace {source}: " + unresolvable(float(t[i]), f"row {i} of the trace as built "
                                                             f"(request id {i})")
                         + more)
