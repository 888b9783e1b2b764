"""Issue 23, item 5: every request accounted for at the end of a run on every topology
(topology/accounting.py), arrivals the clock cannot resolve (traces/precision.py), and the bounds
on every resource (sarathi_lab/resources.py), each tried at its limit and past it."""
import math
import re

import pandas as pd
import pytest

from helpers import cli, composed
from sarathi_lab.guard import RuleViolation
from sarathi_lab.routers import RoundRobin
from sarathi_lab.runner import run
from sarathi_lab.schedulers.sarathi import Sarathi
from sarathi_lab.traces.precision import CLOCK_RESOLUTION_S, MAX_ARRIVAL_S

SMALL = ["trace=synthetic", "trace.num_requests=24", "trace.prompt_len=64", "trace.output_len=8",
         "trace.qps=50"]


# -- plug-ins that break the rules (imported by the CLI as test_bounds:<name>) -------------------
class StealsQueued(RoundRobin):
    """Changes the replica it was shown: drops a request waiting on replica 0, once."""
    name = "steals_queued"
    stolen = False

    def route(self, req, replicas, now):
        waiting = replicas[0].engine.policy.waiting
        if waiting and not self.stolen:
            waiting.pop()
            self.stolen = True
        return super().route(req, replicas, now)


class RejectsTwice(Sarathi):
    """Takes request 3, rejects it and reports it rejected twice in its next batch."""
    name = "rejects_twice"
    pending = ()

    def add_request(self, req):
        if req.request_id == 3:
            self.reject(req, "twice")
            self.pending = [req, req]
            return True
        return super().add_request(req)

    def schedule(self, now):
        out = super().schedule(now)
        out.rejected += self.pending
        self.pending = []
        return out


class Strands(Sarathi):
    """Takes request 2 and never queues it."""
    name = "strands"

    def add_request(self, req):
        if req.request_id == 2:
            return True
        return super().add_request(req)


def _run(*overrides):
    return run(composed(*SMALL, *overrides), None, write=False)


def test_router_that_drops_a_queued_request_fails_the_run_naming_it():
    with pytest.raises(RuleViolation) as e:
        _run("cluster.num_replicas=2", "cluster.router=test_bounds:StealsQueued")
    msg = str(e.value)
    assert re.match(r"the run on a fleet of 2 replicas behind router 'steals_queued' "
                    r"\(test_bounds\.StealsQueued\) ended with 1 of 24 requests neither finished "
                    r"nor rejected: replica 0 \(policy 'sarathi' "
                    r"\(sarathi_lab\.schedulers\.sarathi\.Sarathi\)\): requests \[\d+\] left "
                    r"waiting, in no queue\. ", msg), msg
    assert "a router only reads the replicas it is shown" in msg


def test_policy_that_ends_a_request_twice_fails_the_run():
    with pytest.raises(RuleViolation, match=r"^the run on one engine ended with requests not "
                                            r"accounted for: the engine \(policy 'rejects_twice' "
                                            r"\(test_bounds\.RejectsTwice\)\) took 24 requests "
                                            r"and ended 25\. "):
        _run("scheduler=custom", "scheduler.name=test_bounds:RejectsTwice")


@pytest.mark.parametrize("topology, where", [
    ([], "the engine"),
    (["cluster.num_replicas=3"], "replica 2"),
    (["model=llama-2-70b", "parallel=tp2pp2", "trace.max_total_tokens=4096"],
     "virtual engine 0"),
    (["cluster=disagg"], "prefill replica 0"),
])
def test_policy_that_strands_a_request_fails_every_topology(topology, where):
    over = ["scheduler=custom", "scheduler.name=test_bounds:Strands", *topology]
    if topology and topology[0] == "cluster=disagg":
        over = [*topology, "cluster.prefill.scheduler.name=test_bounds:Strands"]
    with pytest.raises(RuleViolation) as e:
        _run(*over)
    assert f"{where} (policy 'strands' (test_bounds.Strands)): requests [2] left waiting" \
        in str(e.value), str(e.value)


@pytest.mark.slow
def test_cli_fails_a_run_whose_router_drops_a_request(tmp_path):
    r = cli(f"hydra.run.dir={tmp_path}/run", *SMALL, "cluster.num_replicas=2",
            "cluster.router=test_bounds:StealsQueued")
    assert r.returncode != 0
    assert "neither finished nor rejected" in r.stderr and "test_bounds.StealsQueued" in r.stderr
    assert not (tmp_path / "run" / "summary.json").exists()


# -- arrival times the clock resolves (traces/precision.py) ------------------------------------
def _trace_file(tmp_path, *times) -> str:
    path = tmp_path / "far.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                    + "".join(f"{t!r},10,5\n" for t in times))
    return str(path)


def _file_run(path, *overrides, run_dir=None):
    return run(composed(f"trace.path={path}", "trace.qps=null", "trace.num_requests=null",
                        *overrides), run_dir, write=run_dir is not None)


def test_an_arrival_just_inside_the_clocks_resolution_is_served(tmp_path):
    last = math.nextafter(MAX_ARRIVAL_S, 0)
    assert math.ulp(last) <= CLOCK_RESOLUTION_S < math.ulp(MAX_ARRIVAL_S)
    s = _file_run(_trace_file(tmp_path, 0.0, last), run_dir=tmp_path / "run")
    assert s["num_finished"] == 2
    rq = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert rq["arrival_time"].iloc[1] == last
    # the same latency as the first request's, to a few microseconds (each of its iterations
    # rounds to the clock's spacing there, under a microsecond)
    assert (rq["ttft"] > 0).all() and (rq["e2e"] > 0).all()
    assert abs(rq["e2e"].iloc[1] - rq["e2e"].iloc[0]) <= 10 * CLOCK_RESOLUTION_S


@pytest.mark.parametrize("t", [MAX_ARRIVAL_S, 1e300])
def test_an_arrival_the_clock_cannot_resolve_is_refused_naming_its_row(tmp_path, t):
    path = _trace_file(tmp_path, 0.0, 1.0, t)
    with pytest.raises(ValueError) as e:
        _file_run(path)
    assert str(e.value).startswith(
        f"trace {path}: row 2 of the trace as built (request id 2) arrives at t={t:.6g} s, "
        f"where the clock's resolution is {math.ulp(t):.3g} s, coarser than the 1e-06 s a run "
        "must resolve (its latencies would round to 0): arrivals must come before "
        "8.58993e+09 s (2**33 s, about 272 years) after the first")


def test_a_think_time_that_sends_past_the_clocks_resolution_is_refused():
    with pytest.raises(ValueError, match=r"^request 0, sent by user 0, arrives at "
                                         r"t=1e\+10 s, where the clock's resolution"):
        _run("trace.clients=1", "trace.think_time=1e10")
