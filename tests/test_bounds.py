"""Issue 23, item 5: every request accounted for at the end of a run on every topology
(topology/accounting.py), arrivals the clock cannot resolve (traces/precision.py), and the bounds
on every resource (sarathi_lab/resources.py), each tried at its limit and past it."""
import math
import re

import pandas as pd
import pytest
import yaml
from helpers import CONFIGS, cli, composed

from sarathi_lab import resources
from sarathi_lab.engine.guard import RuleViolation
from sarathi_lab.kv import KVCacheManager
from sarathi_lab.request import Request
from sarathi_lab.resources import ENGINE_BYTES, REQUEST_BYTES, TOKEN_BYTES, check_run
from sarathi_lab.run.config import resolve
from sarathi_lab.run.runner import build, run
from sarathi_lab.schedulers.sarathi import Sarathi
from sarathi_lab.settings import ConfigError
from sarathi_lab.topology.routers import RoundRobin
from sarathi_lab.traces import parse_trace_config
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
    overrides = ("add_request",)
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
    overrides = ("add_request",)
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


# -- bounds on every resource (sarathi_lab/resources.py and the checks it names) ---------------
@pytest.fixture
def memory(monkeypatch):
    """memory(n): the run's memory limit is n bytes (as if the machine had n available)."""
    monkeypatch.delenv(resources.LIMIT_ENV, raising=False)
    return lambda n: monkeypatch.setattr(resources, "available_memory", lambda: n)


def test_engines_and_requests_at_the_memory_limit_and_past_it(memory):
    r = resolve(composed("cluster.num_replicas=2000"))
    need = 2000 * ENGINE_BYTES + 1000 * REQUEST_BYTES + 50_000 * TOKEN_BYTES
    memory(need)
    check_run(r, 1000, 50_000)   # exactly at the limit: accepted
    memory(need - 1)
    with pytest.raises(ConfigError) as e:
        check_run(r, 1000, 50_000)
    assert str(e.value) == (
        f"cluster.num_replicas: the run would hold about {need / 2**30:,.1f} GiB "
        "(cluster.num_replicas=2000: 2,000 x 450.0 kB per engine, trace.num_requests=1000: "
        "1,000 x 1.1 kB per request, trace.num_requests=1000 (their output tokens): 50,000 x "
        "70 bytes per output token; measured per item, sarathi_lab/resources.py) but "
        f"{(need - 1) / 2**30:,.1f} GiB is the limit (the memory available now; "
        "SARATHI_LAB_MEMORY_GIB=GiB sets another); lower cluster.num_replicas")


@pytest.mark.parametrize("overrides, setting", [
    (["cluster.num_replicas=2000"], "cluster.num_replicas"),
    (["cluster=disagg", "cluster.prefill.num_replicas=1000", "cluster.decode.num_replicas=1000"],
     "cluster.prefill.num_replicas"),
    (["trace.num_requests=1000000000"], "trace.num_requests"),
])
def test_a_run_past_the_memory_limit_is_refused_before_it_is_built(monkeypatch, overrides,
                                                                    setting):
    monkeypatch.setenv(resources.LIMIT_ENV, "0.5")
    with pytest.raises(ConfigError, match=rf"^{re.escape(setting)}: the run would hold about "
                                          r".* but 0\.5 GiB is the limit "
                                          r"\(SARATHI_LAB_MEMORY_GIB=0\.5\); lower "):
        _run(*overrides)


def test_a_row_asking_past_max_model_len_is_rejected_alone_not_the_run(memory, tmp_path):
    """A trace row asking 1e12 output tokens counts for what fits within max_model_len in the
    memory estimate (70 TB otherwise): the run goes on and the engine rejects that request
    alone, with its reason (issue 35, item 5)."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,100,20\n"
                     "0.1,50,1000000000000\n0.2,80,10\n")
    memory(2**30)
    s = run(composed(f"trace.path={trace}", "trace.num_requests=null"), None, write=False)
    assert (s["num_finished"], s["num_rejected"]) == (2, 1)
    assert list(s["rejections"]) == ["prompt of N + output of N tokens exceeds "
                                     "max_model_len=N (overlong=cap serves it cut short)"]
    assert resources.output_tokens_held([100, 50, 80, 5000], [20, 10**12, 4000, 1], 4096) == \
        20 + 4046 + 4000 + 0


SESSIONS = {"name": "s", "sessions": 100, "session_rate": 1.0, "turns": 3, "message_len": 20,
            "answer_len": 10, "system_prompt_len": 0}


@pytest.mark.parametrize("extra, setting, count", [
    ({"sessions": 10**9}, "trace.sessions", "1,000,000,000 x 1.1 kB per session"),
    ({"turns": 10**9}, "trace.turns", "100,000,000,000 x 1.1 kB per turn"),
    # 100 sessions of 300 turns that each grow the prompt by 30 tokens: 30 x (1 + ... + 300)
    # ids per session, the prompts and answers held as lists of ids
    ({"turns": 300, "message_len": 20, "answer_len": 10}, "trace.max_total_tokens",
     f"{100 * 30 * 300 * 301 // 2:,} x 36 bytes per token id"),
])
def test_multi_turn_sessions_past_the_memory_limit_are_refused_naming_the_setting(
        memory, extra, setting, count):
    """Refused before what is named is allocated: a billion sessions or turns would otherwise
    draw arrays of tens of GiB (issue 35, item 5)."""
    from sarathi_lab.traces import build_trace
    memory(100 * 2**20)
    with pytest.raises(ConfigError) as e:
        build_trace({**SESSIONS, **extra})
    assert str(e.value).startswith(f"{setting}: the run would hold about "), e.value
    assert count in str(e.value) and str(e.value).endswith(f"; lower {setting}")


def test_multi_turn_sessions_within_the_limit_are_built(memory):
    from sarathi_lab.traces import build_trace
    memory(2**30)   # 15,150,000 token ids (0.5 GiB) fit
    df = build_trace({**SESSIONS, "turns": 300, "max_total_tokens": 3000})
    # a session's prompt + answer grows by 30 a turn: 100 turns fit within 3,000 tokens
    assert len(df) == 100 * 100 and df["turn"].max() == 99


def test_the_memory_limit_setting_is_checked(monkeypatch):
    monkeypatch.setenv(resources.LIMIT_ENV, "lots")
    with pytest.raises(ConfigError, match="^SARATHI_LAB_MEMORY_GIB='lots': must be a number of "
                                          "GiB > 0$"):
        resources.memory_limit()


@pytest.mark.slow
def test_cli_refuses_two_thousand_replicas_past_the_limit(tmp_path):
    r = cli(f"hydra.run.dir={tmp_path}/run", "cluster.num_replicas=2000",
            env={resources.LIMIT_ENV: "0.5"})
    assert r.returncode != 0
    assert "sarathi-lab: error: cluster.num_replicas: the run would hold about 0.8 GiB" \
        in r.stderr, r.stderr


def test_kv_blocks_are_made_on_first_use():
    kv = KVCacheManager(10**12, 16)   # a trillion blocks: nothing built up front
    a = Request(0, 0.0, 40, 4)
    assert kv.allocate_slots(a, 40) is not None
    assert kv.block_table(a) == [0, 1, 2] and len(kv.pool.blocks) == 3
    assert kv.num_free_blocks == 10**12 - 3
    kv.free(a)
    b = Request(1, 0.0, 70, 4)
    kv.allocate_slots(b, 70)   # the freed blocks first (last freed on top), then new ones
    assert kv.block_table(b) == [0, 1, 2, 3, 4] and len(kv.pool.blocks) == 5


def test_tiny_model_on_a_large_simulated_gpu_builds_no_blocks_up_front():
    policy, _ = build(composed("model=tiny-llama", "hardware=h200"))
    assert policy.kv.num_blocks > 10**7 and len(policy.kv.pool.blocks) == 0


def test_closed_loop_users_at_most_one_per_request():
    s = _run("trace.clients=24", "trace.think_time=0.1")   # 24 requests: at the limit
    assert s["num_finished"] == 24
    with pytest.raises(ValueError, match=r"^trace\.clients=25: more users than the trace's 24 "
                                         r"requests; each user waits for its answer before "
                                         r"sending again, so at most 24 of them ever send "
                                         r"\(set trace\.clients <= 24\)$"):
        _run("trace.clients=25")


def test_swap_space_at_the_simulated_hosts_limit_and_past_it():
    over = ["scheduler.preemption_mode=swap"]
    # 70% of 2 TB over 8 GPUs: 162.98... GiB each
    policy, _ = build(composed(*over, "scheduler.swap_space_gib=162.98"))
    assert policy.kv.num_host_blocks == 83445
    with pytest.raises(ConfigError) as e:
        build(composed(*over, "scheduler.swap_space_gib=162.99"))
    assert str(e.value) == (
        "scheduler.swap_space_gib: a swap space of 162.988 GiB per GPU (83,450 KV blocks), on "
        "each of hardware.gpus_per_node=8 GPUs, takes 1,304 GiB of the node's host memory "
        "(hardware.host_memory_bytes=2e+12, 1,863 GiB), more than the 70% vLLM allows; lower "
        "scheduler.swap_space_gib (or scheduler.num_swap_blocks) to at most 162.98 GiB per GPU")


def test_mix_tenants_at_most_one_per_request():
    base = composed("trace=mix", "trace.num_requests=40")["trace"]
    n = parse_trace_config(base).counts()["chat"]
    base["components"]["chat"]["tenants"] = n
    assert parse_trace_config(base).components["chat"].tenants == n   # at the limit
    base["components"]["chat"]["tenants"] = 10**9
    with pytest.raises(ConfigError, match=rf"^trace\.components\.chat\.tenants=1000000000: more "
                                          rf"tenants than the component's {n} requests \(of "
                                          rf"num_requests=40\); a tenant without a request has "
                                          rf"no service to measure \(set at most {n}, or more "
                                          rf"requests\)$"):
        parse_trace_config(base)


def _sweep_ends(preset: str) -> list[list[str]]:
    """The overrides of a preset's sweep jobs at the first and at the last value of every
    swept key."""
    params = yaml.safe_load((CONFIGS / "experiment" / f"{preset}.yaml").read_text())
    params = params.get("hydra", {}).get("sweeper", {}).get("params", {})
    values = {k: str(v).split(",") for k, v in params.items()}
    return [[f"{k}={v[end]}" for k, v in values.items()] for end in (0, -1)]


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml")))
def test_no_shipped_study_trips_a_bound(monkeypatch, preset):
    """The first and the last job of each preset's sweep resolve, fit 8 GiB (a laptop's
    memory) and build their first engine (where the swap space is checked)."""
    monkeypatch.setenv(resources.LIMIT_ENV, "8")
    for jobs in _sweep_ends(preset):
        c = composed(f"experiment={preset}", *jobs)
        r = resolve(c, jobs, drop_unread=True)   # as a sweep's job is
        check_run(r, c["trace"].get("num_requests"))
        build(c, r)
        clients = c["trace"].get("clients")
        assert clients is None or clients <= c["trace"]["num_requests"], jobs


@pytest.mark.slow
def test_a_sweep_with_a_job_past_the_memory_limit_fails_before_its_first_job(tmp_path):
    r = cli("-m", f"results_root={tmp_path}", "name=big", "trace.num_requests=20",
            "cluster.num_replicas=1,2000", env={resources.LIMIT_ENV: "0.5"})
    assert r.returncode != 0
    assert r.stderr.startswith("sarathi-lab: error: sweep big: job 2/2 (trace.num_requests=20,"
                               "cluster.num_replicas=2000): cluster.num_replicas: the run would "
                               "hold about 0.8 GiB"), r.stderr
    assert r.stderr.rstrip().endswith("lower cluster.num_replicas; no job was started")
    assert not list(tmp_path.rglob("summary.json"))   # job 1 never ran
