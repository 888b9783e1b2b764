"""Steady state: whether a probe's backlog is stationary, and how long a probe runs to tell.

The one definition every capacity answer uses (`capacity.Prober`: ``mode=capacity``, sweeps of
it, the studies that search capacity, and `sarathi-lab-plan`); sarathi_lab/docs/sweeps.md
("Steady-state probes") explains it with measurements.

A probe serves requests arriving at a fixed rate. Its *measured interval* is its arrival span
less a warm-up (the first ``capacity.warmup`` of the span, whose requests found an empty
server); the interval is cut into ``capacity.windows`` equal windows, and two series are taken:

- the backlog: the time-averaged number of requests in the system (arrived, not finished) over
  each window, divided by the arrival rate (seconds of arrivals it holds, Little's law);
- the scheduling delay: the mean arrival-to-first-scheduled time of the window's arrivals.

Each series' least-squares slope against time (seconds per second; for the backlog it is the
share of arrivals not served, 1 - completions / arrivals) and its standard error give the
verdict, in this order:

1. *unstable*: a slope exceeds ``capacity.max_growth`` by more than two standard errors. A
   queue that grows does so however short the probe, and a growing queue fails whatever its
   percentiles say. (The backlog's slope counts only once the probe is long enough, rule 2:
   the backlog of a server filling up rises too, for about one time constant.)
2. *undetermined*: the arrival span is shorter than ``capacity.min_duration_s`` or than
   ``capacity.time_constants`` x the time constant (the mean latency, arrival to last token,
   of the measured requests: near saturation it grows with the queue, and so does the span a
   probe needs), or fewer than ``capacity.min_requests`` requests arrive after the warm-up (a
   tail percentile the SLO judges rests on enough arrivals, not only on enough time: the
   comment above `first_requests`).
3. *stable*: both slopes are below ``capacity.max_growth`` by more than two standard errors.
4. *undetermined* otherwise (the trend is not resolved at this length).

`probe` lengthens an undetermined probe (at least doubling its requests, and to the span the
rule asks, and to the measured requests it asks) up to ``capacity.max_extensions`` times and
``capacity.max_requests`` requests; one still undetermined then stays so, and never counts as
meeting an SLO.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

STABLE, UNSTABLE, UNDETERMINED = "stable", "unstable", "undetermined"
Z = 2.0   # standard errors a slope must clear, either way, to decide



def _slope(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares slope of y on x and its standard error (inf with fewer than 3 points)."""
    ok = np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 2:
        return 0.0, math.inf
    dx = x - x.mean()
    sxx = float((dx * dx).sum())
    if sxx <= 0:
        return 0.0, math.inf
    b = float((dx * (y - y.mean())).sum() / sxx)
    if len(x) < 3:
        return b, math.inf
    resid = y - y.mean() - b * dx
    return b, math.sqrt(float((resid * resid).sum()) / (len(x) - 2) / sxx)


def windows(arrival, scheduled, finish, t0: float, t1: float, n: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(window mid-points, time-averaged requests in the system, mean scheduling delay of the
    window's arrivals; NaN where none arrived) over `n` equal windows of [t0, t1]. A request
    never finished (rejected) leaves at its arrival; one never scheduled waits to the end."""
    arrival = np.asarray(arrival, float)
    finish = np.where(np.isfinite(finish), finish, arrival)
    scheduled = np.where(np.isfinite(scheduled), scheduled, np.maximum(finish, arrival))
    edges = np.linspace(t0, t1, n + 1)
    lo, hi = edges[:-1, None], edges[1:, None]
    overlap = np.clip(np.minimum(finish[None, :], hi) - np.maximum(arrival[None, :], lo), 0, None)
    backlog = overlap.sum(axis=1) / (hi[:, 0] - lo[:, 0])
    k = np.clip(np.searchsorted(edges, arrival, side="right") - 1, 0, n - 1)
    inside = (arrival >= t0) & (arrival <= t1)
    wait = scheduled - arrival
    cnt = np.bincount(k[inside], minlength=n).astype(float)
    tot = np.bincount(k[inside], weights=wait[inside], minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        delay = np.where(cnt > 0, tot / cnt, np.nan)
    return (lo[:, 0] + hi[:, 0]) / 2, backlog, delay


def judge(arrival, scheduled, finish, s: dict) -> dict:
    """The verdict on one probe (its requests' arrival, first-scheduled and finish times; NaN
    where a request never got one) under settings `s` (the capacity node's steady-state keys)."""
    arrival = np.asarray(arrival, float)
    scheduled, finish = np.asarray(scheduled, float), np.asarray(finish, float)
    a0, a1 = float(arrival.min()), float(arrival.max())
    span = a1 - a0
    t0 = a0 + s["warmup"] * span
    measured = arrival >= t0
    n_in = int(measured.sum())
    rate = (n_in - 1) / (a1 - t0) if a1 > t0 and n_in > 1 else math.inf
    done = measured & np.isfinite(finish)
    tau = float((finish[done] - arrival[done]).mean()) if done.any() else math.inf
    need = max(float(s["min_duration_s"]), s["time_constants"] * tau)
    rec = {"requests": int(len(arrival)), "measured_requests": n_in,
           "span_s": span, "warmup_s": t0 - a0,
           "time_constant_s": tau, "needed_span_s": need,
           "backlog_growth": None, "delay_growth": None, "served_ratio": None}
    if a1 <= t0 or n_in < 2:
        return {**rec, "verdict": UNDETERMINED,
                "why": f"{n_in} requests after the warm-up: too few to tell"}
    mid, backlog, delay = windows(arrival, scheduled, finish, t0, a1, int(s["windows"]))
    slopes = {"backlog": _slope(mid, backlog / rate if np.isfinite(rate) else backlog),
              "scheduling delay": _slope(mid, delay)}
    # completions within the measured interval over its arrivals (1: they keep up)
    served = int(((finish >= t0) & (finish <= a1)).sum())
    rec.update(backlog_growth=slopes["backlog"][0], delay_growth=slopes["scheduling delay"][0],
               served_ratio=served / n_in)
    eps = float(s["max_growth"])
    # a backlog also rises while a server fills (requests in service, not queued), for about
    # one time constant: it counts only in a probe long enough that its warm-up covers that;
    # a scheduling delay that grows is a queue at any length
    long_enough = span >= need
    grows = [f"{name} grows {b:.3g} s/s (+- {se:.2g})" for name, (b, se) in slopes.items()
             if b - Z * se > eps and (long_enough or name != "backlog")]
    if grows:
        return {**rec, "verdict": UNSTABLE,
                "why": "; ".join(grows) + f" > capacity.max_growth={eps:g}"}
    if not long_enough:
        return {**rec, "verdict": UNDETERMINED,
                "why": f"arrival span {span:.4g} s < {need:.4g} s (capacity.min_duration_s, or "
                       f"capacity.time_constants x the mean latency {tau:.3g} s)"}
    if n_in < int(s["min_requests"]):
        return {**rec, "verdict": UNDETERMINED,
                "why": f"{n_in} requests after the warm-up < capacity.min_requests="
                       f"{int(s['min_requests'])} (a tail percentile needs enough arrivals)"}
    unresolved = [f"{name} slope {b:.3g} +- {se:.2g} s/s" for name, (b, se) in slopes.items()
                  if not b + Z * se <= eps]
    if unresolved:
        return {**rec, "verdict": UNDETERMINED,
                "why": "; ".join(unresolved) + f": not resolved against "
                       f"capacity.max_growth={eps:g}"}
    return {**rec, "verdict": STABLE, "why": ""}


# Why capacity.min_requests defaults to 1000 (config.CapacityConfig): a P99 estimated from n
# samples is about the (n/100)-th largest; how many of n exceed the true P99 is binomial(n,
# 0.01), sd sqrt(0.0099 n). With n = 1000 that is 10 +- 3.1, so the estimate lies between the
# true P98.4 and P99.6 (two sd); with the 225-300 measured requests of a 120 s probe near 1.3
# req/s it is 2-3 +- 1.6: anywhere from the P97.9 to the maximum. A P99 TBT has one sample per
# token, but its tail is the prefill stalls, one burst per arrival: the samples that count are
# arrivals (docs/sweeps.md, "Steady-state probes", cell C).
def requests_for_measured(s: dict) -> int:
    """Requests a probe needs for capacity.min_requests of them to arrive after the warm-up:
    min_requests / (1 - warmup), 10% more for the Poisson spread of where the warm-up ends
    (sd about sqrt(n warmup (1 - warmup)), 2% of n at 1000)."""
    return math.ceil(1.1 * int(s["min_requests"]) / (1 - float(s["warmup"]))) + 1


def first_requests(rate: float, floor: int, s: dict) -> int:
    """A probe's first request count at `rate`: enough for capacity.min_duration_s of
    arrivals and capacity.min_requests measured ones, at least `floor` (trace.num_requests),
    at most capacity.max_requests (or the floor, when the user asked more)."""
    want = math.ceil(rate * float(s["min_duration_s"])) + 1 if math.isfinite(rate) else math.inf
    want = max(want, requests_for_measured(s))
    return int(max(int(floor), min(int(s["max_requests"]), want)))


def probe(run: Callable[[int], tuple[dict, tuple]], rate: float, floor: int, s: dict
          ) -> tuple[dict, dict]:
    """(the last run's result, its verdict with `extensions`): `run(n)` serves the first n
    requests of one fixed sequence at `rate` and returns (its result, (arrival, scheduled,
    finish) arrays). An undetermined probe is run again longer (at least twice the requests,
    the span the rule asks and its measured requests), at most capacity.max_extensions times and up to
    capacity.max_requests requests."""
    n = first_requests(rate, floor, s)
    cap = max(int(s["max_requests"]), int(floor))
    ext = 0
    while True:
        out, times = run(n)
        v = {**judge(*times, s), "extensions": ext}
        if v["verdict"] != UNDETERMINED:
            return out, v
        if n >= cap or ext >= int(s["max_extensions"]):
            limit = (f"capacity.max_requests={cap}" if n >= cap
                     else f"capacity.max_extensions={s['max_extensions']}")
            v["why"] += f" (still after {ext} extensions, at {limit})"
            return out, v
        want = math.ceil(rate * v["needed_span_s"] * 1.1) + 1 if math.isfinite(rate) else cap
        want = max(want, requests_for_measured(s))
        n, ext = min(cap, max(2 * n, want)), ext + 1


def draw_order(pool: int, n: int, seed: int) -> np.ndarray:
    """Which of `pool` trace rows the first `n` requests of a probe take: the rows in a seeded
    random order, then in another, and so on; every row is used once per pass, so a probe of
    any length represents the whole trace, not its first rows, and a longer probe extends a
    shorter one (the same first n rows)."""
    rng = np.random.default_rng([int(seed), 0x57EAD])
    passes = -(-n // pool)
    return np.concatenate([rng.permutation(pool) for _ in range(passes)])[:n]
