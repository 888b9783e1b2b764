"""Closed-loop clients (traces/clients.py, topology/clients.py): arrival times worked out by hand, never two requests of
one user in flight, the think-time distributions, and the CLI (trace.clients, trace.think_time)."""
import json

import numpy as np
import pandas as pd
import pytest
from conftest import LinearCost, make_policy, req
from helpers import cli

from sarathi_lab.engine import Engine
from sarathi_lab.metrics import iterations_table, requests_table
from sarathi_lab.run.config import resolve
from sarathi_lab.settings import ConfigError
from sarathi_lab.topology import ClosedLoop, Single, drive
from sarathi_lab.traces.clients import ThinkTime


def serve(reqs, clients, think, *, ff=True, seed=0, **policy):
    """Every iteration takes 1 s (LinearCost with no per-token cost)."""
    engine = Engine(make_policy("sarathi", token_budget=512, **policy), LinearCost(1.0, 0.0),
                    fast_forward=ff)
    load = ClosedLoop(reqs, clients, think, seed)
    drive(Single(engine), load)
    return engine, load.users


@pytest.mark.parametrize("ff", [True, False])
def test_arrivals_by_hand(ff):
    """Two users, think time 0.5 s, 1-s iterations, prompts of 4 tokens (one iteration each):
    t=0.5  u0 sends r0 (1 token), u1 sends r1 (3 tokens); [0.5, 1.5] prefills both, r0 ends
    t=2.0  u0 ready; [1.5, 2.5] decodes r1, so r2 is handed over at 2.5 (arrival 2.0)
    [2.5, 3.5] decodes r1 (its 3rd token: ends) and prefills r2 (1 token: ends)
    t=4.0  u0 and u1 ready together: u0 (the first) sends r3 (2 tokens), ending at 6.0"""
    reqs = [req(0, 4, 1), req(1, 4, 3), req(2, 4, 1), req(3, 4, 2)]
    engine, users = serve(reqs, 2, ThinkTime("constant", 0.5), ff=ff)
    assert [r.arrival_time for r in reqs] == [0.5, 0.5, 2.0, 4.0]
    assert [r.finish_time for r in reqs] == [1.5, 3.5, 3.5, 6.0]
    assert users == [0, 1, 0, 0]
    rq = requests_table(reqs)
    assert list(rq["ttft"]) == [1.0, 1.0, 1.5, 1.0]
    it = iterations_table(engine.iterations())
    assert list(it["start"]) == [0.5, 1.5, 2.5, 4.0, 5.0]


def test_a_users_next_request_leaves_a_think_time_after_its_answer():
    """Never two requests of one user in flight: with a constant think time Z, each user's next
    arrival is exactly its previous finish + Z (preemptions and fast-forward on the way)."""
    rng = np.random.default_rng(3)
    reqs = [req(i, int(rng.integers(5, 60)), int(rng.integers(1, 40))) for i in range(60)]
    engine, users = serve(reqs, 5, ThinkTime("constant", 0.25), num_blocks=40)
    assert sum(r.num_preemptions for r in reqs) > 0    # the hard case: requests re-queued
    assert sorted(set(users)) == [0, 1, 2, 3, 4]
    for u in range(5):
        mine = [r for r, v in zip(reqs, users) if v == u]
        arrive = np.array([r.arrival_time for r in mine])
        finish = np.array([r.finish_time for r in mine])
        assert arrive[0] == 0.25
        np.testing.assert_allclose(arrive[1:], finish[:-1] + 0.25)
        assert (finish > arrive).all()


def test_random_think_times_keep_one_request_per_user_in_flight():
    rng = np.random.default_rng(5)
    reqs = [req(i, int(rng.integers(5, 60)), int(rng.integers(1, 30))) for i in range(50)]
    _, users = serve(reqs, 4, ThinkTime("exponential", 2.0), seed=7)
    for u in set(users):
        mine = sorted((r for r, v in zip(reqs, users) if v == u), key=lambda r: r.arrival_time)
        for a, b in zip(mine, mine[1:]):
            assert b.arrival_time >= a.finish_time


def test_fast_forward_gives_the_same_run():
    def tables(ff):
        reqs = [req(i, 10 + i, 30 + 3 * i) for i in range(12)]
        engine, users = serve(reqs, 3, ThinkTime("uniform", low=0.0, high=2.0), ff=ff, seed=1)
        return requests_table(reqs), iterations_table(engine.iterations()), users
    on, off = tables(True), tables(False)
    assert len(on[1]) == len(off[1])
    pd.testing.assert_frame_equal(on[0].drop(columns="token_times"),
                                  off[0].drop(columns="token_times"))
    pd.testing.assert_frame_equal(on[1], off[1])
    assert on[2] == off[2]


def test_a_rejected_request_is_answered_at_once():
    """r0 (prompt 300) cannot fit max_model_len=256: rejected on arrival at 1.0, so its user
    sends r1 at 1.0 + 1.0."""
    reqs = [req(0, 300, 2), req(1, 4, 1)]
    _, users = serve(reqs, 1, ThinkTime("constant", 1.0))
    assert reqs[0].rejection_reason and reqs[0].arrival_time == 1.0
    assert reqs[1].arrival_time == 2.0 and reqs[1].finish_time == 3.0
    assert users == [0, 0]


def test_users_refused_by_admission_control_think_and_retry():
    """One request at a time, a waiting queue of at most 1 (scheduler.max_queue_len), three
    users thinking 0.5 s, one-token requests of one 1-s iteration each:
    t=0.5  u0: r0 queued; u1: r1 and u2: r2 refused (r0 waits)     u1, u2 ready at 1.0
    [0.5, 1.5] r0                                                   u0 ready at 2.0
    t=1.5  u1: r3 (sent at 1.0) queued; u2: r4 (1.0) refused at 1.5 u2 ready at 2.0
    [1.5, 2.5] r3                                                   u1 ready at 3.0
    t=2.5  u0: r5 (2.0) queued; u2: r6 (2.0) refused at 2.5         u2 ready at 3.0
    [2.5, 3.5] r5;  t=3.5  u1: r7 (3.0) queued;  [3.5, 4.5] r7"""
    reqs = [req(i, 4, 1) for i in range(8)]
    engine, users = serve(reqs, 3, ThinkTime("constant", 0.5), max_num_seqs=1, max_queue_len=1)
    assert [r.arrival_time for r in reqs] == [0.5, 0.5, 0.5, 1.0, 1.0, 2.0, 2.0, 3.0]
    assert users == [0, 1, 2, 1, 2, 0, 2, 1]
    assert [i for i, r in enumerate(reqs) if r.rejection_reason] == [1, 2, 4, 6]
    assert [reqs[i].finish_time for i in (0, 3, 5, 7)] == [1.5, 2.5, 3.5, 4.5]
    assert "waiting queue full" in reqs[1].rejection_reason


def test_relative_deadlines_move_with_the_arrival():
    r = req(0, 4, 1, t=100.0)
    r.deadline = 103.0    # 3 s after its trace arrival
    serve([r], 1, ThinkTime("constant", 0.5))
    assert r.arrival_time == 0.5 and r.deadline == 3.5


def test_think_time_distributions():
    rng = np.random.default_rng(0)
    for spec, mean in [({"dist": "exponential", "mean": 2.0}, 2.0),
                       ({"dist": "lognormal", "mean": 3.0, "sigma": 0.5}, 3.0),
                       ({"dist": "uniform", "low": 1.0, "high": 2.0}, 1.5), (0.7, 0.7)]:
        draw = ThinkTime.from_spec(spec).sampler(rng)
        x = np.array([draw() for _ in range(20000)])
        assert x.mean() == pytest.approx(mean, rel=0.03), spec
    assert ThinkTime.from_spec(None) == ThinkTime("constant", 0.0)


@pytest.mark.parametrize("spec, match", [
    ({"dist": "exponential"}, "mean: dist=exponential needs it"),
    ({"dist": "uniform", "low": 3.0, "high": 2.0}, "low=3.0: must be <= high"),
    ({"dist": "constant", "mean": 1.0, "sigma": 1.0}, "sigma=1.0: not read by dist=constant"),
    ({"dist": "gauss", "mean": 1.0}, "dist='gauss': must be one of"),
    (-1.0, "mean=-1.0: must be >= 0"),
    ("2s", "must be a number of seconds or a mapping"),
])
def test_bad_think_time(spec, match):
    with pytest.raises(ConfigError, match=match):
        ThinkTime.from_spec(spec)


def base_cfg(**trace):
    return {"scheduler": {"name": "sarathi"}, "executor": {"name": "sim"},
            "model": {"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_heads": 4,
                      "num_kv_heads": 4, "intermediate_size": 128, "vocab_size": 100,
                      "max_model_len": 512},
            "trace": {"name": "t", "path": None, "num_requests": 5, "qps": 1.0,
                      "prompt_len": 8, "output_len": 4, **trace}}


def test_config_rules():
    with pytest.raises(ConfigError, match="trace.think_time=1.0: read only with clients"):
        resolve(base_cfg(think_time=1.0))
    with pytest.raises(ConfigError, match="trace.qps: closed-loop users"):
        resolve(base_cfg(clients=2), ["trace.clients=2", "trace.qps=3"])
    with pytest.raises(ConfigError, match="no arrival rate for mode=capacity"):
        resolve({**base_cfg(clients=2), "mode": "capacity"})
    with pytest.raises(ConfigError, match="trace.think_time.mean: dist=lognormal needs it"):
        resolve(base_cfg(clients=2, think_time={"dist": "lognormal", "sigma": 1.0}))
    with pytest.raises(ConfigError, match="trace.clients=0: must be >= 1"):
        resolve(base_cfg(clients=0))
    resolve(base_cfg(clients=2, think_time={"dist": "exponential", "mean": 1.0}))


@pytest.mark.slow   # a CLI subprocess
def test_cli_closed_loop_run(tmp_path):
    """The same three files as an open-loop run, with the user of each request."""
    r = cli("trace.num_requests=40", "trace.clients=4", "trace.think_time={dist:constant,mean:0.5}",
            f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["load"] == {"mode": "closed", "clients": 4, "think_time": {
        "dist": "constant", "mean": 0.5, "sigma": None, "low": None, "high": None}}
    assert s["num_finished"] == 40
    assert "closed loop: 4 users, think time 0.5 s" in r.stdout
    rq = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert sorted(rq["client"].unique()) == [0, 1, 2, 3]
    for _, mine in rq.groupby("client"):
        mine = mine.sort_values("arrival_time")
        np.testing.assert_allclose(mine["arrival_time"].to_numpy()[1:],
                                   mine["finish_time"].to_numpy()[:-1] + 0.5)
    assert (tmp_path / "run" / "iterations.parquet").stat().st_size > 0
