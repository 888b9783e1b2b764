"""The one driver (sarathi_lab/topology/): closed-loop clients on every topology (a fleet,
pipeline stages, disaggregated pools), each client's requests strictly one after another, and
fast-forward leaving every number where it is; `Engine.run`, a fleet of one and the runner's
`drive(Single(...))` give one run."""
from pathlib import Path

import pandas as pd
import pytest
from conftest import LinearCost, make_policy, req

from sarathi_lab.engine import Engine
from sarathi_lab.metrics import iterations_table, requests_table
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.schedulers.sarathi import Sarathi
from sarathi_lab.topology import ClosedLoop, Fleet, OpenLoop, Single, drive
from sarathi_lab.topology.routers import RoundRobin, RouterConfig
from sarathi_lab.traces.clients import ThinkTime

THINK = 0.3


class Stuck(Sarathi):
    name = "stuck"

    def schedule(self, now):
        return SchedulerOutput()


_SMALL = ["trace=sharegpt", "trace.num_requests=40", "progress=false", "seed=5",
          "trace.clients=5", f"trace.think_time={THINK}"]
TOPOLOGIES = {
    "fleet": ["scheduler=sarathi", "cluster.num_replicas=3", "cluster.router=least_loaded"],
    "pipeline": ["scheduler=vllm", "model=llama-2-70b", "parallel=tp2pp2",
                 "trace.max_total_tokens=4096"],
    "disagg": ["scheduler=sarathi", "cluster=disagg", "cluster.prefill.num_replicas=1",
               "cluster.decode.num_replicas=2", "cluster.decode.router=least_loaded"],
}


def run_config(overrides, out: Path):
    from hydra import compose, initialize_config_module

    from sarathi_lab.run.runner import run
    with initialize_config_module("sarathi_lab.configs", version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    summary = run(cfg, out)
    return summary, pd.read_parquet(out / "requests.parquet"), \
        pd.read_parquet(out / "iterations.parquet")


def assert_sequential_clients(rq: pd.DataFrame, clients: int, think: float) -> None:
    """Every user sends its first request at `think` and each next one exactly `think` after
    its previous answer (the finish of a served request): never two in flight."""
    assert sorted(rq["client"].unique()) == list(range(clients))
    for _, mine in rq.groupby("client"):
        mine = mine.sort_values("arrival_time")
        arrivals = mine["arrival_time"].to_numpy()
        finishes = mine["finish_time"].to_numpy()
        assert arrivals[0] == think
        assert (arrivals[1:] == finishes[:-1] + think).all()
        assert (arrivals[1:] > finishes[:-1]).all()


@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
def test_closed_loop_clients_on_every_topology(topology, tmp_path):
    summary, rq, it = run_config([*_SMALL, *TOPOLOGIES[topology]], tmp_path / topology)
    assert len(rq) == 40 and (rq["status"] == "finished").all()
    assert (rq["num_output_tokens"] == rq["target_output_tokens"]).all()
    assert_sequential_clients(rq, 5, THINK)
    assert summary["load"] == {"mode": "closed", "clients": 5,
                               "think_time": {"dist": "constant", "mean": THINK, "sigma": None,
                                              "low": None, "high": None}}
    # the topology's own columns are there beside the client's
    own = {"fleet": "replica", "pipeline": "virtual_engine", "disagg": "decode_replica"}
    assert rq[own[topology]].nunique() > 1, "the load reached more than one engine"
    assert len(it) == summary["num_iterations"]


@pytest.mark.parametrize("topology", ["fleet", "disagg"])
def test_fast_forward_moves_nothing_under_closed_loop(topology, tmp_path):
    """A watched engine's fast-forward stops where an answer elsewhere could send it a request:
    on and off give the same tables, value for value."""
    base = [*_SMALL, *TOPOLOGIES[topology], "trace.think_time={dist: exponential, mean: 0.2}"]
    _, rq_on, it_on = run_config([*base, "fast_forward=true"], tmp_path / "on")
    _, rq_off, it_off = run_config([*base, "fast_forward=false"], tmp_path / "off")
    pd.testing.assert_frame_equal(rq_on, rq_off)
    pd.testing.assert_frame_equal(it_on, it_off)


def workload():
    return [req(i, 30 + 7 * (i % 5), 5 + 3 * (i % 4), t=0.4 * i) for i in range(24)]


def engine(ff=True):
    return Engine(make_policy("sarathi", token_budget=64), LinearCost(0.05, 0.001),
                  fast_forward=ff)


def tables(reqs, e):
    return requests_table(reqs, e.output_lens), iterations_table(e.iterations())


@pytest.mark.parametrize("ff", [True, False])
def test_one_engine_three_ways_is_one_run(ff):
    """`Engine.run`, `drive(Single(engine), OpenLoop)` (the runner's) and a fleet of one behind
    a router (stepped and watched one iteration at a time) give the same tables."""
    runs = []
    for how in ("engine", "single", "fleet"):
        reqs, e = workload(), engine(ff)
        if how == "engine":
            e.run(reqs)
        elif how == "single":
            drive(Single(e), OpenLoop(reqs))
        else:
            Fleet([e], RoundRobin(RouterConfig(), 1)).run(reqs)
        runs.append(tables(reqs, e))
    for rq, it in runs[1:]:
        pd.testing.assert_frame_equal(rq, runs[0][0])
        pd.testing.assert_frame_equal(it, runs[0][1])


def test_closed_loop_on_a_fleet_of_one_equals_one_engine():
    """The same users on one engine and on a fleet of one: the fleet routes every request to
    its only replica, so the runs are the same."""
    runs = []
    for fleet in (False, True):
        reqs, e = workload(), engine()
        topo = Fleet([e], RoundRobin(RouterConfig(), 1)) if fleet else Single(e)
        load = ClosedLoop(reqs, 3, ThinkTime("exponential", 0.5), seed=2)
        drive(topo, load)
        runs.append((load.users, *tables(reqs, e)))
    assert runs[0][0] == runs[1][0]
    pd.testing.assert_frame_equal(runs[0][1], runs[1][1])
    pd.testing.assert_frame_equal(runs[0][2], runs[1][2])


def test_a_policy_that_never_schedules_is_named_after_the_run():
    """A replica whose policy schedules nothing with requests queued waits for an input (a
    plug-in may wait for more arrivals); if none comes, the run ends with the error naming
    the replica and the policy, the other replica's work done."""
    stuck = make_policy("sarathi", token_budget=64)
    stuck.__class__ = Stuck
    engines = [Engine(stuck, LinearCost(0.05, 0.001)),
               Engine(make_policy("sarathi", token_budget=64), LinearCost(0.05, 0.001))]
    reqs = [req(0, 8, 2), req(1, 8, 2, t=1.0), req(2, 8, 2, t=2.0)]
    with pytest.raises(RuntimeError, match=r"^replica 0: policy 'stuck' scheduled nothing at "
                                           r"t=2\.000s with 2 waiting"):
        Fleet(engines, RoundRobin(RouterConfig(), 2)).run(reqs)
    assert reqs[1].status.name == "FINISHED"
