"""Arrival processes: Poisson, gamma with a coefficient of variation, on/off bursts; and re-timing a
timestamped trace to a mean rate with its pattern of bursts kept.
"""
from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)


ARRIVALS = ("poisson", "gamma", "onoff")


def retime(t, qps, src):
    """Scale inter-arrival gaps so the mean rate is ``qps``; the pattern of bursts is kept."""
    if len(t) < 2:
        return t
    if t[-1] <= 0:
        raise ValueError(f"trace {src}: all requests arrive at the same instant, so they cannot "
                         f"be re-timed to qps={qps}")
    # (n - 1) gaps span t[-1]; make their mean exactly 1 / qps.
    return t * ((len(t) - 1) / qps / t[-1])


def arrival_times(n, qps, arrival, cv, rng, burst=None) -> np.ndarray:
    """n arrival times, the first at 0.0, at a mean rate of qps: independent gaps (poisson,
    gamma), or (onoff) a Poisson process that runs only during the first on_s seconds of every
    on_s + off_s, at qps x (on_s + off_s) / on_s while on."""
    if arrival == "onoff":
        on, off = burst
        # a Poisson process on the clock that runs only while on, then laid out on real time
        u = np.concatenate([[0.0], np.cumsum(rng.exponential(on / (qps * (on + off)), n - 1))])
        return np.floor(u / on) * (on + off) + np.mod(u, on)
    if arrival == "poisson":
        gaps = rng.exponential(1.0 / qps, n - 1)
    else:
        shape = 1.0 / cv ** 2  # a gamma's CV is 1/sqrt(shape)
        gaps = rng.gamma(shape, 1.0 / (qps * shape), n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def check_arrival_options(qps, arrival, cv, burst=None):
    if qps is not None and not qps > 0:
        raise ValueError(f"qps must be > 0, got {qps}")
    if arrival not in ARRIVALS:
        raise ValueError(f"unknown arrival process {arrival!r}; use one of {ARRIVALS}")
    if (burst is not None) != (arrival == "onoff"):
        raise ValueError(f"burst={burst!r}: (on_s, off_s) is needed by arrival=onoff and "
                         "read by nothing else")
    if burst is not None and not (len(burst) == 2 and all(x > 0 for x in burst)):
        raise ValueError(f"burst={burst!r}: must be (on_s > 0, off_s > 0)")
    if not cv > 0:
        raise ValueError(f"cv must be > 0, got {cv}")
    if arrival == "poisson" and cv != 1.0:
        logger.warning("cv=%s is ignored for poisson arrivals (their CV is 1); use "
                       "arrival=gamma", cv)


def check_arrival_settings(c) -> None:
    """The cross-setting rules of `arrival`, `cv`, `on_s` and `off_s` (a trace's or a workload
    component's)."""
    if c.cv != 1.0 and c.arrival != "gamma":
        raise ValueError(f"cv={c.cv}: read only with arrival=gamma")
    for key in ("on_s", "off_s"):
        if (getattr(c, key) is None) == (c.arrival == "onoff"):
            raise ValueError(f"{key}={getattr(c, key)!r}: " + (
                "arrival=onoff needs it" if c.arrival == "onoff" else
                "read only with arrival=onoff"))


def burst_of(c) -> tuple | None:
    return (c.on_s, c.off_s) if c.arrival == "onoff" else None
