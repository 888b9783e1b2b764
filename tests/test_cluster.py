"""Replicas behind a router (sarathi_lab/topology/fleet.py, routers.py): one replica is the single
engine exactly; each router's choices on hand-built scenarios; what routers see is counted at
the arrival's time; requests are conserved; the CLI writes the run contract with a `replica`
column; bad routers and settings are named."""
import json
import types

import numpy as np
import pandas as pd
import pytest
from conftest import LinearCost, make_policy, req
from helpers import cli, composed, defaults

from sarathi_lab.cli.main import check_config
from sarathi_lab.engine import Engine
from sarathi_lab.metrics import iterations_table, requests_table
from sarathi_lab.registry import known, router_class
from sarathi_lab.run.runner import build, run
from sarathi_lab.run.settings import ClusterConfig
from sarathi_lab.settings import ConfigError
from sarathi_lab.topology.fleet import Fleet
from sarathi_lab.topology.routers import (
    LeastLoaded,
    LeastLoadedConfig,
    PowerOfTwo,
    PrefixAffinity,
    PrefixAffinityConfig,
    ReplicaView,
    RoundRobin,
    Router,
    RouterConfig,
)
from sarathi_lab.traces import synthetic_trace, to_requests

ROUTERS = ["round_robin", "least_loaded", "power_of_two", "prefix_affinity"]


def engines(n, policy="sarathi", executor=LinearCost, **kw):
    return [Engine(make_policy(policy, **kw), executor()) for _ in range(n)]


def fleet(n, router, policy="sarathi", router_cfg=None, seed=0, **kw):
    cls = router_class(router) if isinstance(router, str) else router
    cfg = router_cfg if router_cfg is not None else cls.config_class()
    return Fleet(engines(n, policy, **kw), cls(cfg, n, seed))


def workload(n=60, seed=0, qps=40.0, prompt=(8, 120), output=(1, 40), ids=False):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / qps, n))
    out = []
    for i in range(n):
        p = int(rng.integers(*prompt))
        tok = rng.integers(0, 50, p).tolist() if ids else None
        out.append(req(i, p, int(rng.integers(*output)), t=float(t[i]), ids=tok))
    return out


def tables_of(reqs, engine_or_fleet):
    if isinstance(engine_or_fleet, Fleet):
        r, it = engine_or_fleet.tables(reqs)
        return r.drop(columns="replica"), it.drop(columns="replica")
    return (requests_table(reqs, engine_or_fleet.output_lens),
            iterations_table(engine_or_fleet.iterations()))


def assert_same_run(a, b):
    pd.testing.assert_frame_equal(a[0].drop(columns="token_times"),
                                  b[0].drop(columns="token_times"), check_exact=True)
    for x, y in zip(a[0]["token_times"], b[0]["token_times"]):
        assert np.array_equal(x, y)
    pd.testing.assert_frame_equal(a[1], b[1], check_exact=True)


# -- one replica is the single engine -------------------------------------------------------------
POLICY_CASES = [
    ("sarathi", {"token_budget": 32}),
    ("vllm", {}),
    ("orca", {}),
    ("request_level", {}),
    ("sarathi", {"token_budget": 16, "num_blocks": 40}),            # preemptions
    ("vllm", {"enable_prefix_caching": True, "num_blocks": 60}),    # a shared prefix
]
# prefix_affinity needs a prefix cache: paged KV (sarathi, vllm) with it on
ONE_REPLICA_CASES = [(p, kw, r) for p, kw in POLICY_CASES for r in ROUTERS
                     if r != "prefix_affinity"] \
    + [(p, {**kw, "enable_prefix_caching": True}, "prefix_affinity")
       for p, kw in POLICY_CASES if p in ("sarathi", "vllm")]


@pytest.mark.parametrize("policy, kw, router", ONE_REPLICA_CASES)
def test_one_replica_is_the_single_engine_exactly(policy, kw, router):
    def reqs():
        rs = workload(80, seed=3, ids=True)
        for r in rs[::3]:
            r.prompt_token_ids[:16] = list(range(16))
        return rs
    single, alone = reqs(), Engine(make_policy(policy, **kw), LinearCost())
    alone.run(single)
    many, f = reqs(), fleet(1, router, policy, **kw)
    f.run(many)
    a, b = tables_of(single, alone), tables_of(many, f)
    assert_same_run(a, b)
    assert a[1]["preemptions"].sum() > 0 or kw.get("num_blocks") != 40
    assert len(a[1]) > len(alone.rows)   # fast-forward skipped iterations in both


def test_one_replica_cluster_equals_the_runner_on_the_simulator():
    cfg = composed("trace=synthetic", "trace.num_requests=150", "trace.qps=6",
                   "scheduler.num_kv_blocks=600", "progress=false")
    r = check_config(cfg)
    trace = synthetic_trace(150, 6.0, prompt_len={"dist": "uniform", "low": 128, "high": 2048},
                            output_len={"dist": "uniform", "low": 32, "high": 512}, seed=0)
    single = to_requests(trace)
    s = run(cfg, None, requests=single, write=False, resolved=r)
    assert s["preemptions"] > 0      # a small KV cache: the hard paths are taken
    many = to_requests(trace)
    f = Fleet([Engine(*build(cfg, r))], RoundRobin(RouterConfig(), 1))
    f.run(many)
    req_df, it_df = f.tables(many)
    assert (req_df["replica"] == 0).all()
    s2 = f.summarize(req_df, it_df, slo=cfg["slo"])
    for k in ("ttft", "tbt", "tpot", "e2e", "makespan_s", "num_iterations", "preemptions",
              "slo", "stalls", "kv"):
        assert s2[k] == s[k], k


@pytest.mark.parametrize("router", ROUTERS)
def test_fleet_fast_forward_equals_stepping(router):
    """A decode run cut at an arrival that went elsewhere goes on: the same as stepping."""
    kw = {"token_budget": 32, "enable_prefix_caching": True}
    runs = []
    for ff in (True, False):
        rs = workload(120, seed=5, qps=60, ids=True)
        f = fleet(3, router, **kw)
        for e in f.engines:
            e.fast_forward = ff
        f.run(rs)
        runs.append((f.tables(rs), [e.num_iterations - len(e.rows) for e in f.engines]))
    (a, skipped), (b, none) = runs
    assert_same_run(a, b)
    assert sum(skipped) > 0 and sum(none) == 0


# -- the routers, one by one ----------------------------------------------------------------------
def views(*loads, cached=None):
    """Replicas for unit checks of a router: (outstanding requests, tokens) and cached prefix
    lengths set by hand."""
    out = []
    for j, (n, tokens) in enumerate(loads):
        kv = types.SimpleNamespace(cached_prefix_len=lambda r, c=(cached or {}).get(j, 0): c)
        v = ReplicaView(j, types.SimpleNamespace(kv=kv))
        v.num_outstanding, v.outstanding_tokens = n, tokens
        out.append(v)
    return out


def test_round_robin_cycles():
    rs = [req(i, 8, 2, t=0.001 * i) for i in range(7)]
    f = fleet(3, "round_robin")
    f.run(rs)
    assert [f.replica_of[id(r)] for r in rs] == [0, 1, 2, 0, 1, 2, 0]


def test_least_loaded_by_tokens_and_by_requests():
    tok = LeastLoaded(LeastLoadedConfig(load="tokens"), 3)
    cnt = LeastLoaded(LeastLoadedConfig(load="requests"), 3)
    v = views((1, 500), (4, 100), (2, 300))
    assert tok.route(None, v, 0.0) == 1 and cnt.route(None, v, 0.0) == 0
    assert tok.route(None, views((0, 7), (0, 7), (1, 7)), 0.0) == 0   # lowest index among equals


def test_least_loaded_counts_outstanding_work_at_the_arrivals_time():
    """LinearCost: 0.01 s + 1 ms per token, one iteration at a time per replica.
    Replica 0: A's prefill (100 tokens) in [0, 0.11], then A's last decode with A2's prefill
    (10) in [0.11, 0.131]: A ends at 0.131, A2's first token comes then. Replica 1: B's prefill
    (200 tokens) in [0, 0.21]. E arrives at 0.12: replica 0's engine has already computed A's
    end, but at 0.12 A is still outstanding (2 requests against 1), so E goes to replica 1."""
    rs = [req("A", 100, 2, t=0.0), req("B", 200, 400, t=0.0), req("A2", 10, 400, t=0.001),
          req("E", 10, 1, t=0.12), req("F", 10, 1, t=0.5)]
    f = fleet(2, "least_loaded", router_cfg=LeastLoadedConfig(load="requests"),
              token_budget=512, max_model_len=1024)
    f.run(rs)
    got = {r.request_id: f.replica_of[id(r)] for r in rs}
    # A: all idle -> 0; B: 1 request against 0 -> 1; A2: 1 each, prompt tokens still owed
    # 100 against 200 -> 0; E: 2 against 1 -> 1; F: 1 each (A2, B), no prompt owed -> 0
    assert got == {"A": 0, "B": 1, "A2": 0, "E": 1, "F": 0}
    assert rs[0].finish_time == pytest.approx(0.131) and rs[0].finish_time > 0.12
    assert rs[2].token_times[0] == pytest.approx(0.131)


def test_outstanding_prompt_tokens_end_with_the_first_token():
    """The same fleet by tokens: C (30 tokens) arrives at 0.05, while A's prompt (100) is owed
    on replica 0 and B's (20, first token at 0.03) no longer is on replica 1."""
    rs = [req("A", 100, 5, t=0.0), req("B", 20, 300, t=0.0), req("C", 30, 5, t=0.05)]
    f = fleet(2, "least_loaded", token_budget=512, max_model_len=1024)
    seen = []
    route = f.router.route

    def spy(r, replicas, now):
        seen.append([(v.outstanding_tokens, v.num_outstanding) for v in replicas])
        return route(r, replicas, now)
    f.router.route = spy
    f.run(rs)
    assert seen == [[(0, 0), (0, 0)], [(100, 1), (0, 0)], [(100, 1), (0, 1)]]
    assert [f.replica_of[id(r)] for r in rs] == [0, 1, 1]


def test_power_of_two_takes_the_less_loaded_of_two_draws():
    p = PowerOfTwo(LeastLoadedConfig(load="tokens"), 4, seed=7)
    v = views((0, 0), (0, 10), (0, 20), (0, 30))
    picks = [p.route(None, v, 0.0) for _ in range(3000)]
    share = np.bincount(picks, minlength=4) / len(picks)
    # the least loaded of 2 distinct draws out of 4: replica j wins the pairs with a larger one
    assert share[3] == 0
    assert share == pytest.approx([3 / 6, 2 / 6, 1 / 6, 0], abs=0.03)
    assert PowerOfTwo(LeastLoadedConfig(), 1).route(None, views((5, 5)), 0.0) == 0


def test_power_of_two_is_reproducible_with_its_seed():
    def assignment(seed):
        rs = workload(80, seed=1)
        f = fleet(4, "power_of_two", seed=seed)
        f.run(rs)
        return [f.replica_of[id(r)] for r in rs]
    a = assignment(11)
    assert a == assignment(11)
    assert a != assignment(12)
    assert set(a) == {0, 1, 2, 3}


def test_prefix_affinity_unit():
    r = PrefixAffinity(PrefixAffinityConfig(min_match_tokens=8), 3)
    # the longest cached prefix wins, whatever the load
    assert r.route(None, views((9, 900), (0, 0), (1, 5), cached={0: 32, 2: 16}), 0.0) == 0
    # equal hits: the least loaded of them
    assert r.route(None, views((9, 900), (0, 0), (1, 5), cached={0: 16, 2: 16}), 0.0) == 2
    # a hit below min_match_tokens counts as none: least loaded
    assert r.route(None, views((9, 900), (3, 30), (1, 5), cached={0: 4}), 0.0) == 2
    guard = PrefixAffinity(PrefixAffinityConfig(balance_tokens=100), 3)
    assert guard.route(None, views((9, 105), (0, 60), (1, 5), cached={0: 32}), 0.0) == 0
    assert guard.route(None, views((9, 106), (0, 60), (1, 5), cached={0: 32}), 0.0) == 2


def system_prompt_scenario():
    system = list(range(100, 132))             # 32 tokens = 8 blocks of 4
    return [req(0, 20, 3, t=0.0, ids=list(range(200, 220))),     # unrelated: tie -> 0
            req(1, 36, 3, t=0.0, ids=system + [1, 2, 3, 4]),     # nothing cached: least -> 1
            req(2, 10, 40, t=1.0, ids=list(range(300, 310))),    # all idle: tie -> 0
            req(3, 36, 3, t=1.01, ids=system + [5, 6, 7, 8]),    # replica 1 holds it (8 blocks)
            req(4, 36, 3, t=1.025, ids=system + [9, 9, 9, 9])]   # still replica 1


def test_prefix_affinity_sends_a_shared_system_prompt_to_the_replica_that_holds_it():
    rs = system_prompt_scenario()
    f = fleet(2, "prefix_affinity", enable_prefix_caching=True, token_budget=64)
    f.run(rs)
    assert [f.replica_of[id(r)] for r in rs] == [0, 1, 0, 1, 1]
    # the system prompt was computed once, then served from replica 1's cache twice
    assert f.engines[1].kv.prefix_hit_tokens == 2 * 32
    # at 1.025 requests 2 (on 0) and 3 (on 1) are both decoding: by load alone, request 4 goes
    # to replica 0 (the lowest index among equals) and computes the prompt again
    rs = system_prompt_scenario()
    g = fleet(2, "least_loaded", enable_prefix_caching=True, token_budget=64)
    g.run(rs)
    assert [g.replica_of[id(r)] for r in rs] == [0, 1, 0, 1, 0]
    assert g.engines[1].kv.prefix_hit_tokens == 32 and g.engines[0].kv.prefix_hit_tokens == 0


def test_kv_cached_prefix_len_reads_without_changing():
    from sarathi_lab.kv import KVCacheManager
    kv = KVCacheManager(20, 4, enable_prefix_caching=True)
    a = req(0, 13, 2, ids=list(range(13)))
    assert kv.allocate_slots(a, 13) is not None
    kv.free(a)
    probe = req(1, 14, 2, ids=list(range(10)) + [99, 98, 97, 96])
    free, used = kv.num_free_blocks, kv.num_used_blocks
    assert kv.cached_prefix_len(probe) == 8      # blocks [0..4) and [4..8); [8..12) differs
    assert kv.cached_prefix_len(req(2, 13, 2, ids=list(range(13)))) == 12
    assert kv.cached_prefix_len(req(3, 5, 1)) == 0   # no token ids
    assert (kv.num_free_blocks, kv.num_used_blocks) == (free, used)
    assert not kv.req_blocks and probe.num_computed_tokens == 0


# -- conservation ---------------------------------------------------------------------------------
@pytest.mark.parametrize("router", ROUTERS)
def test_every_request_ends_once_on_one_replica(router):
    rs = workload(150, seed=9, qps=80, prompt=(8, 300), ids=True)
    f = fleet(4, router, enable_prefix_caching=True, token_budget=64, max_model_len=256,
              num_blocks=120)
    f.run(rs)
    req_df, it_df = f.tables(rs)
    assert len(req_df) == 150 and req_df["request_id"].is_unique
    assert set(req_df["status"]) <= {"finished", "rejected"}
    assert (req_df["status"] == "rejected").sum() > 0         # prompts over max_model_len
    assert req_df["replica"].between(0, 3).all()
    # each request went through exactly one engine
    seen = [set(e.output_lens) for e in f.engines]
    assert sum(map(len, seen)) == 150 and set().union(*seen) == set(range(150))
    for j, ids in enumerate(seen):
        assert ids == set(req_df.loc[req_df["replica"] == j, "request_id"])
    assert sum(e.num_done for e in f.engines) == 150
    fin = req_df[req_df["status"] == "finished"]
    assert (fin["num_output_tokens"] == fin["target_output_tokens"]).all()
    s = f.summarize(req_df, it_df)
    assert sum(p["num_requests"] for p in s["replicas"]) == 150
    assert sum(p["num_iterations"] for p in s["replicas"]) == s["num_iterations"] == len(it_df)
    assert [p["replica"] for p in s["replicas"]] == [0, 1, 2, 3]
    # the counts routers read are back to zero: every end was counted
    f.counts.until(np.inf)
    assert all(v.num_outstanding == 0 and v.outstanding_tokens == 0 for v in f.views)


# -- errors ---------------------------------------------------------------------------------------
class Wrong(Router):
    """Sends every request to `answer` (by default: one past the last replica)."""
    name = "wrong"
    answer = None

    def route(self, req, replicas, now):
        return len(replicas) if self.answer is None else self.answer


@pytest.mark.parametrize("answer", [None, -1, 1.0, True, "0"])
def test_a_router_returning_no_replica_is_named(answer):
    router = Wrong(RouterConfig(), 2)
    router.answer = answer
    with pytest.raises(ValueError, match=r"router 'wrong' \(test_cluster\.Wrong\.route\(\)\) "
                                         r"broke the rule 'route\(\) returns a replica index': "
                                         r"it returned .* for request 0 at t=0\.000s: must be a "
                                         r"replica index, an integer in \[0, 2\)"):
        Fleet(engines(2), router).run([req(0, 8, 2)])


def test_a_router_that_raises_is_named():
    class Boom(RoundRobin):
        def route(self, req, replicas, now):
            raise KeyError("boom")
    f = Fleet(engines(2), Boom(RouterConfig(), 2))
    with pytest.raises(KeyError, match=r"Boom\.route\(\) at t=0\.500s \(request 7\)"):
        f.run([req(7, 8, 2, t=0.5)])


def test_a_numpy_index_is_accepted():
    class Np(RoundRobin):
        def route(self, req, replicas, now):
            return np.int64(1)
    f = Fleet(engines(2), Np(RouterConfig(), 2))
    rs = [req(0, 8, 2)]
    f.run(rs)
    assert f.replica_of[id(rs[0])] == 1


def test_prefix_affinity_without_a_prefix_cache_is_refused():
    with pytest.raises(ValueError, match="enable_prefix_caching=true"):
        fleet(2, "prefix_affinity")


@pytest.mark.parametrize("overrides, match", [
    (["cluster.num_replicas=0"], r"^cluster\.num_replicas=0: must be >= 1"),
    (["cluster.num_replicas=2", "cluster.router=no_such"],
     r"^cluster\.router: unknown router 'no_such'; known: least_loaded, power_of_two, "
     r"prefix_affinity, round_robin"),
    (["cluster.num_replicas=2", "cluster.router=my.mod:Nope"], r"^cluster\.router: cannot load"),
    (["cluster.num_replicas=2", "cluster.load=requests"],
     r"^cluster\.load: not a setting of router 'round_robin'"),
    (["cluster.num_replicas=2", "cluster.router=least_loaded", "cluster.load=bytes"],
     r"^cluster\.load='bytes': must be one of tokens, requests"),
    (["cluster.router=least_loaded"],
     r"^cluster\.router: read only with cluster\.num_replicas > 1"),
    (["cluster.num_replicas=2", "cluster.router=least_loaded", "cluster.load=null"],
     r"^cluster\.load=null: must be set \(default 'tokens'\)"),
    (["cluster.num_replicas=2", "cluster.router=test_cluster:Wrong", "+cluster.x=1"],
     r"^cluster\.x: not a setting of router"),
])
def test_bad_cluster_settings_name_the_setting(overrides, match):
    with pytest.raises(ConfigError, match=match):
        check_config(composed(*overrides), overrides)


def test_a_router_that_is_not_a_router_is_refused():
    with pytest.raises(ConfigError, match=r"^cluster\.router: .* not a subclass of "
                                          r"sarathi_lab\.topology\.routers\.Router"):
        check_config(composed("cluster.num_replicas=2", "cluster.router=test_cluster:views"))


def test_unread_router_settings_are_left_out_in_a_multirun():
    ov = ["cluster.router=least_loaded"]
    r = check_config(composed(*ov), ov, multirun=True)
    assert r.router_cls is None and r.notes == [
        "cluster.router: read only with cluster.num_replicas > 1 (a fleet)"]
    ov = ["cluster.num_replicas=3", "cluster.min_match_tokens=4"]
    r = check_config(composed(*ov), ov, multirun=True)
    assert r.router_cls is RoundRobin
    assert r.notes == ["cluster.min_match_tokens: not read by router 'round_robin'"]


def test_the_fleet_is_part_of_the_effective_configuration():
    one = check_config(composed()).effective()
    assert "cluster" not in one      # single-engine runs are unchanged
    two = check_config(composed("cluster.num_replicas=2")).effective()
    p2c = check_config(composed("cluster.num_replicas=2", "cluster.router=power_of_two",
                                "cluster.load=requests")).effective()
    assert two["cluster"] == {"num_replicas": 2, "router": "sarathi_lab.topology.routers:RoundRobin"}
    assert p2c["cluster"] == {"num_replicas": 2, "router": "sarathi_lab.topology.routers:PowerOfTwo",
                              "load": "requests"}


def test_cluster_file_mirrors_the_config_classes():
    node = composed()["cluster"]
    own = defaults(ClusterConfig)
    assert {k: node[k] for k in own} == own
    knobs = set().union(*(defaults(router_class(n).config_class) for n in ROUTERS))
    assert set(node) == set(own) | knobs
    assert all(node[k] is None for k in knobs)
    assert set(known("sarathi_lab.routers")) >= set(ROUTERS)


# -- the command line -----------------------------------------------------------------------------
@pytest.mark.slow   # a CLI subprocess
def test_cli_runs_a_fleet_and_writes_the_run_contract(tmp_path):
    r = cli(f"hydra.run.dir={tmp_path}/run", "trace=synthetic", "trace.num_requests=40",
            "trace.qps=8", "cluster.num_replicas=2", "cluster.router=round_robin", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "run"
    reqs = pd.read_parquet(run_dir / "requests.parquet")
    its = pd.read_parquet(run_dir / "iterations.parquet")
    s = json.loads((run_dir / "summary.json").read_text())
    assert reqs["replica"].tolist() == [0, 1] * 20   # round robin over arrival order
    assert set(its["replica"]) == {0, 1} and its["start"].is_monotonic_increasing
    assert s["num_finished"] == 40 and s["num_replicas"] == 2 and s["router"] == "round_robin"
    assert "fleet of 2 replicas, router round_robin: requests per replica 20, 20" in r.stdout
    assert [p["num_requests"] for p in s["replicas"]] == [20, 20]
    assert [p["num_iterations"] for p in s["replicas"]] == \
        its["replica"].value_counts().sort_index().tolist()
    assert s["settings"]["cluster"] == {"num_replicas": 2,
                                        "router": "sarathi_lab.topology.routers:RoundRobin"}
    one = s["replicas"][0]
    sub = reqs[reqs["replica"] == 0]
    assert one["ttft"]["max"] == pytest.approx(sub["ttft"].max())
    assert s["kv"]["blocks_total"] == 2 * one["kv"]["blocks_total"]


@pytest.mark.slow   # a CLI subprocess
def test_cli_refuses_a_fleet_of_none(tmp_path):
    r = cli(f"hydra.run.dir={tmp_path}/run", "cluster.num_replicas=0", cwd=tmp_path)
    assert r.returncode == 1
    assert "cluster.num_replicas=0: must be >= 1" in r.stderr
    assert not (tmp_path / "run").exists()
