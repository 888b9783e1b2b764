"""Capacity search: bisection, and a case whose capacity is known in closed form.

The case: one request at a time (request_level, max_num_seqs=1), every iteration takes c = 10 ms,
every request has 100 prompt and 100 output tokens, so it is served in S = 100 iterations = 1 s
(one prefill iteration that emits the first token, 99 decodes). With N evenly spaced arrivals at
rate q, gap g = 1/q: below 1 req/s nothing waits; above, request k waits k (S - g).
  Sarathi-Serve criterion (median scheduling delay <= 2 s; TBT is always c):
      median_k k (S - g) = (N - 1)/2 (S - g) <= 2        ->  q* = 1 / (S - 4 / (N - 1))
  DistServe criterion (>= 90% with TTFT = k (S - g) + c <= T): the first ceil(0.9 N) requests,
      k <= K = ceil(0.9 N) - 1, must make it     ->  q* = 1 / (S - (T - c) / K)
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import patience

from sarathi_lab.sweeps.capacity import bisect, unit_arrivals

TESTS = Path(__file__).resolve().parent
C, S, N, T = 0.01, 1.0, 201, 1.81


def test_bisect_brackets_a_threshold():
    for true in (0.07, 1.2345, 37.0):   # below, inside and above the first bracket
        r = bisect(lambda q: q <= true, 0.25, 8.0, 0.01, 60)
        assert r["bracketed"]
        assert r["capacity_qps"] <= true < r["fails_at_qps"]
        assert r["fails_at_qps"] - r["capacity_qps"] <= 0.01 * r["capacity_qps"]


def test_bisect_gives_up_honestly():
    r = bisect(lambda q: True, 1.0, 2.0, 0.01, 50)
    assert r["capacity_qps"] == 64.0          # widened 5 times, then gave up
    assert not r["bracketed"] and r["fails_at_qps"] is None and "qps_high" in r["note"]
    r = bisect(lambda q: False, 1.0, 2.0, 0.01, 5)
    assert not r["bracketed"] and r["capacity_qps"] == 0.0


def test_unit_arrivals_have_rate_one():
    for kind in ("poisson", "uniform"):
        u = unit_arrivals(5001, kind, 0, None)
        assert u[0] == 0 and np.all(np.diff(u) >= 0)
        assert abs(u[-1] / 5000 - 1) < 0.05
    u = unit_arrivals(4, "trace", 0, np.array([10.0, 10.0, 13.0, 16.0]))
    assert np.allclose(u, [0, 0, 1.5, 3.0])


def _one_at_a_time(tmp_path, *extra):
    """sarathi-lab mode=capacity of the M/D/1-like toy: one request at a time (request_level,
    max_num_seqs=1), 100 steps of C seconds each, so a service time S = 1 s; its JSON."""
    env = {**os.environ, "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    args = [f"hydra.run.dir={tmp_path}/cap", "mode=capacity",
            "executor=custom", "executor.name=plugins:FixedStep", f"+executor.step_s={C}",
            "scheduler=request_level",
            "scheduler.max_num_seqs=1", "trace=synthetic",
            "trace.prompt_len.low=100", "trace.prompt_len.high=100",
            "trace.output_len.low=100", "trace.output_len.high=100", *extra]
    r = subprocess.run([sys.executable, "-c", "from sarathi_lab.cli.main import main; main()", *args],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, json.loads((tmp_path / "cap" / "capacity.json").read_text())


@pytest.mark.slow   # a CLI subprocess
@pytest.mark.parametrize("arrivals", ["uniform", "poisson"])
def test_steady_capacity_of_one_request_at_a_time_is_one_over_the_service_time(
        tmp_path, arrivals):
    # the analytic capacity is 1/S = 1 req/s at any queue length (D/D/1 with uniform arrivals,
    # M/D/1 with Poisson): the steady rule finds it within the bracket it reports, widened by
    # the growth it tolerates (capacity.max_growth), with no SLO limit binding first (a loose
    # scheduling-delay limit); 25 requests per probe would have said 1/(S - 4/24) = 1.2 under
    # the fixed rule (the test below)
    eps = 0.01
    out, res = _one_at_a_time(
        tmp_path, "trace.num_requests=25", f"capacity.arrivals={arrivals}",
        "capacity.criteria=[tbt]", "slo.max_median_scheduling_delay=1000",
        "capacity.qps_low=0.5", "capacity.qps_high=2", "capacity.precision=0.01",
        f"capacity.max_growth={eps}", "capacity.max_requests=4000")
    got = res["criteria"]["tbt"]
    assert got["bracketed"] and got["rule"] == "steady"
    assert got["capacity_qps"] <= (1 + eps) / S, got
    if arrivals == "uniform":   # D/D/1: 1/S inside the bracket, to the tolerated growth
        assert got["fails_at_qps"] >= 1 / S and got["capacity_qps"] >= 0.97 / S, got
    else:
        # M/D/1: near 1/S its queue is stationary but resolves only over far more requests
        # than capacity.max_requests: undetermined there, so below 1/S, and not far below
        assert got["capacity_qps"] >= 0.8 / S, got
    at_fail = next(p for p in res["probes"] if p["qps"] == got["fails_at_qps"])
    assert at_fail["stability"] in ("unstable", "undetermined")
    assert "P99 TTFT" in out and "steady" in out


@pytest.mark.slow   # a CLI subprocess
def test_capacity_search_brackets_the_known_answer(tmp_path):
    # capacity.rule=fixed: the old rule's exact finite-N answer (N requests evenly spaced: the
    # queue never grows past what N requests hold, so 1/(S - 4/(N-1)) > 1/S "passes")
    env = {**os.environ, "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    args = [f"hydra.run.dir={tmp_path}/cap", "mode=capacity", "capacity.rule=fixed",
            "executor=custom", "executor.name=plugins:FixedStep", f"+executor.step_s={C}",
            "scheduler=request_level",
            "scheduler.max_num_seqs=1", "trace=synthetic",
            "trace.prompt_len.low=100", "trace.prompt_len.high=100",
            "trace.output_len.low=100", "trace.output_len.high=100",
            f"trace.num_requests={N}", "capacity.arrivals=uniform",
            "capacity.qps_low=0.5", "capacity.qps_high=2", "capacity.precision=0.002",
            f"slo.ttft={T}", "slo.tpot=0.05", "slo.request_p99_tbt=null"]
    r = subprocess.run([sys.executable, "-c", "from sarathi_lab.cli.main import main; main()", *args],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=patience(180))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Sarathi-Serve" in r.stdout and "DistServe" in r.stdout   # the answer is printed

    res = json.loads((tmp_path / "cap" / "capacity.json").read_text())
    expect = {"tbt": 1 / (S - 4 / (N - 1)),
              "attainment": 1 / (S - (T - C) / (math.ceil(0.9 * N) - 1))}
    for crit, q_star in expect.items():
        got = res["criteria"][crit]
        assert got["bracketed"]
        assert got["capacity_qps"] <= q_star < got["fails_at_qps"], (crit, got, q_star)
        assert got["fails_at_qps"] - got["capacity_qps"] <= 0.0021 * got["capacity_qps"]

    # every probe is recorded, once per rate, in the JSON and the CSV
    probes = pd.read_csv(tmp_path / "cap" / "capacity_probes.csv")
    assert len(probes) == len(res["probes"]) == probes["qps"].nunique()
    assert {"qps", "meets_tbt_slo", "meets_attainment", "tbt_p99",
            "scheduling_delay_p50", "attainment"} <= set(probes.columns)
    by_q = probes.set_index("qps")
    for crit, flag in (("tbt", "meets_tbt_slo"), ("attainment", "meets_attainment")):
        assert by_q.loc[res["criteria"][crit]["capacity_qps"], flag]
        assert not by_q.loc[res["criteria"][crit]["fails_at_qps"], flag]
    assert np.allclose(probes["tbt_p99"], C)          # the executor's constant step
    # cheap probes: nothing but the result files
    assert not (tmp_path / "cap" / "probes").exists()
    assert not list((tmp_path / "cap").glob("*.parquet"))
