"""The steady-state rule (sarathi_lab/sweeps/steady.py) by hand: a queue that grows is unstable however
short, a stationary one is stable once long enough, one too short to tell is lengthened and
never passed."""
import math

import numpy as np

from sarathi_lab.run.settings import CapacityConfig
from sarathi_lab.settings import to_dict
from sarathi_lab.sweeps import steady

S = to_dict(CapacityConfig())


def fifo(arrival, service):
    """One server, first come first served (Lindley): (arrival, started, finished)."""
    start, finish = np.empty(len(arrival)), np.empty(len(arrival))
    free = -math.inf
    for i, (a, d) in enumerate(zip(arrival, service)):
        start[i] = max(a, free)
        finish[i] = free = start[i] + d
    return np.asarray(arrival, float), start, finish


def test_a_queue_growing_linearly_is_unstable_however_short():
    # one arrival a second, two seconds of work each: the wait grows by 1 s per s, the
    # backlog by half an arrival per arrival; 12 requests (12 s, far below min_duration_s)
    for n in (12, 40, 2000):
        a = np.arange(n, dtype=float)
        v = steady.judge(*fifo(a, np.full(n, 2.0)), S)
        assert v["verdict"] == steady.UNSTABLE, (n, v)
        # the wait of an arrival at t is t - t0 s: 1 s/s, to the windows' whole arrivals
        assert abs(v["delay_growth"] - 1.0) < 0.02 if n > 40 else v["delay_growth"] > 0.5
        assert v["served_ratio"] < 0.6


def test_a_stationary_queue_is_stable_and_keeps_up():
    # half a second of work a second: no wait, one request in the system half the time; 1,050
    # requests after the warm-up (capacity.min_requests: 1,000)
    n = 1400
    v = steady.judge(*fifo(np.arange(n, dtype=float), np.full(n, 0.5)), S)
    assert v["verdict"] == steady.STABLE, v
    assert v["delay_growth"] == 0 and abs(v["backlog_growth"]) < 1e-4
    assert abs(v["served_ratio"] - 1) < 0.01
    # warm-up: the first quarter of the span is left out
    assert abs(v["warmup_s"] - 0.25 * (n - 1)) < 1e-9
    assert abs(v["time_constant_s"] - 0.5) < 1e-12


def test_a_probe_too_short_to_tell_is_undetermined_not_stable():
    n = 30   # 29 s of arrivals < capacity.min_duration_s
    v = steady.judge(*fifo(np.arange(n, dtype=float), np.full(n, 0.5)), S)
    assert v["verdict"] == steady.UNDETERMINED and "arrival span" in v["why"]
    # the span asked scales with the system's time constant: 10 mean latencies of 30 s
    v = steady.judge(*fifo(np.arange(400, dtype=float) * 40, np.full(400, 30.0)),
                     {**S, "min_requests": 300})
    assert v["needed_span_s"] == 300.0 and v["verdict"] == steady.STABLE


def test_probe_lengthens_an_undetermined_probe_and_caps_it():
    seen = []

    def run(n):   # 1 req/s, each 60 s in the system and never queued (as many servers)
        seen.append(n)
        a = np.arange(n, dtype=float)
        return n, (a, a, a + 60.0)
    # the first probe covers min_duration_s (121 requests), but the rule asks 10 latencies
    # (600 s): lengthened to 1.1 x that, then judged stable (one measured request is enough)
    s = {**S, "min_requests": 1}
    out, v = steady.probe(run, 1.0, 10, s)
    assert seen == [121, 661] and out == 661
    assert v["verdict"] == steady.STABLE and v["extensions"] == 1
    # capped: still undetermined, said so, never stable
    seen.clear()
    out, v = steady.probe(run, 1.0, 10, {**s, "max_requests": 300})
    assert v["verdict"] == steady.UNDETERMINED and "capacity.max_requests=300" in v["why"]
    assert seen == [121, 300]


def test_a_probe_long_enough_but_with_too_few_measured_requests_is_undetermined():
    # 2 req/s, 0.1 s of work each (stationary): 600 requests span 300 s, past min_duration_s
    # (120 s) and 10 latencies (1 s), but only the 450 after the warm-up (the first 25% of the
    # span) are measured, under capacity.min_requests=1000
    a = np.arange(600, dtype=float) / 2
    v = steady.judge(*fifo(a, np.full(600, 0.1)), S)
    assert v["span_s"] >= v["needed_span_s"] and v["measured_requests"] == 450
    assert v["verdict"] == steady.UNDETERMINED and "capacity.min_requests=1000" in v["why"]
    # with enough of them it is stable
    v = steady.judge(*fifo(a, np.full(600, 0.1)), {**S, "min_requests": 450})
    assert v["verdict"] == steady.STABLE


def test_probe_asks_the_measured_requests_first_and_lengthens_to_them():
    seen = []

    def run(n):   # arrival i at i^2 / n: the warm-up (a quarter of the span) holds half of them
        seen.append(n)
        a = np.arange(n, dtype=float) ** 2 / n
        return n, fifo(a, np.full(n, 0.01))
    # 1000 measured after a warm-up of 25%, 10% more: ceil(1.1 x 1000 / 0.75) + 1 = 1468
    # requests, at 2 req/s more than 120 s needs (241); half of them measured (734), so it is
    # lengthened (doubled: 2936, of which 1468 measured) and then stable
    out, v = steady.probe(run, 2.0, 10, S)
    assert seen == [1468, 2936] and v["extensions"] == 1
    assert v["verdict"] == steady.STABLE and v["measured_requests"] >= 1000
    # one that cannot reach it within capacity.max_requests (1800: 900 measured) stays
    # undetermined, never stable
    seen.clear()
    out, v = steady.probe(run, 2.0, 10, {**S, "max_requests": 1800})
    assert seen == [1468, 1800] and v["verdict"] == steady.UNDETERMINED
    assert "capacity.min_requests=1000" in v["why"] and "capacity.max_requests=1800" in v["why"]


def test_an_overload_too_small_to_resolve_is_not_passed():
    # Poisson arrivals at 1.5% above the service rate: the trend is within noise on a short
    # probe (undetermined) or seen (unstable); never stable
    rng = np.random.default_rng(3)
    a = np.cumsum(rng.exponential(1 / 1.015, 3000))
    v = steady.judge(*fifo(a, np.full(3000, 1.0)), S)
    assert v["verdict"] != steady.STABLE, v


def test_draw_order_uses_every_row_once_per_pass_and_extends_a_prefix():
    o = steady.draw_order(10, 25, 0)
    assert sorted(o[:10]) == list(range(10)) and sorted(o[10:20]) == list(range(10))
    assert list(steady.draw_order(10, 12, 0)) == list(o[:12])
    assert list(o[:10]) != list(range(10))   # not the trace's first rows in order
