"""Disaggregated prefill/decode (sarathi_lab/topology/disagg): transfer times, TTFT on the prefill side,
TPOT on the decode side and goodput per GPU computed by hand; an ideal link reproduces a
colocated run where it should; requests and tokens are conserved; neither pool's KV overflows and
a full decode pool holds KV back on the prefill side; fast-forward equals stepping."""
import math

import numpy as np
import pandas as pd
import pytest
from conftest import LinearCost, make_policy, req

from sarathi_lab.engine import Engine
from sarathi_lab.metrics import requests_table
from sarathi_lab.registry import router_class
from sarathi_lab.topology.disagg import Disaggregated, Link, Transfer

IDEAL = Link("net", math.inf, 1.0, 0.0)


def transfer(link=IDEAL, per_token=100, layers=4, heads=8, tp=(1, 1), mode="whole"):
    return Transfer(link, per_token, layers, heads, tp[0], tp[1], mode)


def engine(policy="sarathi", num_blocks=1000, executor=None, **kw):
    kw.setdefault("token_budget", 64)
    return Engine(make_policy(policy, num_blocks=num_blocks, **kw), executor or LinearCost())


def pools(n_p=1, n_d=1, *, tr=None, policy_p="sarathi", policy_d="sarathi", kw_p=None,
          kw_d=None, router_p="round_robin", router_d="round_robin", seed=0):
    pre = [engine(policy_p, **(kw_p or {})) for _ in range(n_p)]
    dec = [engine(policy_d, **(kw_d or {})) for _ in range(n_d)]
    rp, rd = router_class(router_p), router_class(router_d)
    return Disaggregated(pre, dec, rp(rp.config_class(), n_p, seed), rd(rd.config_class(), n_d, seed),
                         tr or transfer())


def workload(n=60, seed=0, qps=40.0, prompt=(8, 120), output=(1, 40)):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / qps, n))
    return [req(i, int(rng.integers(*prompt)), int(rng.integers(*output)), t=float(t[i]))
            for i in range(n)]


# -- the transfer, by hand ------------------------------------------------------------------------
def test_transfer_time_is_latency_plus_bytes_over_bandwidth():
    tr = transfer(Link("net", 1e9, 0.5, 1e-3), per_token=1000)
    assert tr.bytes(100) == 100_000
    assert tr.seconds(100) == pytest.approx(1e-3 + 1e5 / 0.5e9)          # 1.2 ms
    assert tr.seconds(0) == pytest.approx(1e-3)


def test_tensor_parallel_splits_the_kv_over_gpu_pairs():
    B = 1000 * 64
    # 8 KV heads over TP2 -> TP4: each decode GPU receives 2 heads (B/4), each prefill GPU
    # sends 4 heads (B/2): the prefill side's links are the busier
    assert transfer(per_token=1000, heads=8, tp=(2, 4)).link_bytes(64) == B / 2
    assert transfer(per_token=1000, heads=8, tp=(4, 4)).link_bytes(64) == B / 4
    # 2 KV heads over TP4: each decode GPU holds one head, replicated (B/2 each); the prefill
    # GPUs (TP2, one head each) send each head to two GPUs: B each
    assert transfer(per_token=1000, heads=2, tp=(2, 4)).link_bytes(64) == B
    t = transfer(Link("nvlink", 2e9, 1.0, 0.0), per_token=1000, tp=(4, 4))
    assert t.seconds(64) == pytest.approx(B / 4 / 2e9)


def test_layerwise_hides_what_the_last_prefill_iteration_overlaps():
    tr = transfer(Link("net", 1e9, 0.5, 1e-3), per_token=1000, layers=4, mode="layerwise")
    T = 1e5 / 0.5e9                                                         # 0.2 ms whole
    # a link slower than the compute: what it could not keep up with, T - d (L-1)/L
    assert tr.seconds(100, last_prefill_s=1e-4, overlapped=True) == \
        pytest.approx(1e-3 + T - 1e-4 * 3 / 4)
    # a faster link: only the last layer's share, T / L
    assert tr.seconds(100, last_prefill_s=1e-3, overlapped=True) == pytest.approx(1e-3 + T / 4)
    # a transfer that waited sends whole
    assert tr.seconds(100, last_prefill_s=1e-3, overlapped=False) == pytest.approx(1e-3 + T)
    whole = transfer(Link("net", 1e9, 0.5, 1e-3), per_token=1000, layers=4)
    assert whole.seconds(100, last_prefill_s=1e-3, overlapped=True) == pytest.approx(1e-3 + T)


def test_links_come_from_the_hardware_preset():
    from helpers import composed
    hw = composed("hardware=a100-80gb")["hardware"]
    net = Link.from_hardware(hw, "net")
    assert (net.bandwidth, net.eff, net.latency_s) == (25e9, 0.9, 1e-5)
    nv = Link.from_hardware(hw, "nvlink")
    assert (nv.bandwidth, nv.eff, nv.latency_s) == (300e9, 0.51, 3.1e-5)
    pcie = Link.from_hardware(hw, "pcie", bandwidth=4e9, latency_s=0.0)
    assert (pcie.bandwidth, pcie.eff, pcie.latency_s) == (4e9, 0.8, 0.0)
    # the KV of a token: layers x (K, V) x KV heads x head_dim x 2 bytes (bf16)
    m = composed("model=llama-3-8b")["model"]
    assert Transfer.for_model(m, net).kv_bytes_per_token == 32 * 2 * 8 * 128 * 2
    m = composed("model=llama-2-70b")["model"]
    assert Transfer.for_model(m, net, 4, 2).kv_bytes_per_token == 80 * 2 * 8 * 128 * 2


# -- one request, by hand -------------------------------------------------------------------------
def test_one_request_ttft_from_the_prefill_side_tpot_from_the_decode_side():
    """LinearCost: an iteration takes 10 ms + 1 ms per token. The prompt (8 tokens) runs in one
    prefill iteration, 18 ms: the first token at 0.018 s. Its KV (8 x 100 B) moves over a link of
    5 ms latency and 1 MB/s: 5.8 ms, to 0.0238 s; the decode replica then emits tokens 2 and 3
    at 11 ms each: 0.0348, 0.0458."""
    tr = transfer(Link("net", 1e6, 1.0, 5e-3), per_token=100)
    d = pools(tr=tr)
    r = req(0, 8, 3)
    d.run([r])
    df, it = d.tables([r])
    row = df.iloc[0]
    assert row["ttft"] == pytest.approx(0.018)
    assert (row["transfer_start"], row["transfer_end"]) == pytest.approx((0.018, 0.0238))
    assert row["transfer_bytes"] == 800
    assert list(row["token_times"]) == pytest.approx([0.018, 0.0348, 0.0458])
    assert row["tpot"] == pytest.approx((0.0458 - 0.018) / 2)
    assert row["e2e"] == pytest.approx(0.0458)
    assert (row["prefill_replica"], row["decode_replica"]) == (0, 0)
    assert row["status"] == "finished" and row["finish_reason"] == "stop"
    assert row["target_output_tokens"] == 3
    # the prefill replica ran one iteration (8 prompt tokens), the decode replica two decodes
    assert it["pool"].tolist() == ["prefill", "decode", "decode"]
    assert it["prefill_tokens"].tolist() == [8, 0, 0] and it["decode_tokens"].tolist() == [0, 1, 1]
    s = d.summarize(df, it)
    t = s["transfers"]
    assert t["num_transfers"] == 1 and t["bytes_total"] == 800
    assert t["time_s"]["max"] == pytest.approx(0.0058) and t["wait_s"]["max"] == pytest.approx(0)


def test_a_one_token_request_ends_on_the_prefill_side():
    d = pools()
    rs = [req(0, 8, 1), req(1, 8, 4, max_tokens=1), req(2, 8, 3)]
    d.run(rs)
    df, _ = d.tables(rs)
    assert df["decode_replica"].tolist() == [-1, -1, 0]
    assert df["transfer_bytes"].tolist() == [0, 0, 800]
    assert df["num_output_tokens"].tolist() == [1, 1, 3]
    assert df["finish_reason"].tolist() == ["stop", "max_tokens", "stop"]
    assert (df["status"] == "finished").all()


def test_goodput_per_gpu_counts_both_pools():
    """Three isolated requests of 8 prompt tokens and 3 output tokens (TTFT 18 ms, TPOT 13.9 ms,
    as above over an ideal link: TPOT 11 ms), one of 16 prompt tokens (TTFT 26 ms). With TTFT <= 20
    ms, 3 of 4 meet the SLO; makespan = last finish - first arrival = 3 + 0.018 + 0.022 s; one
    prefill replica of TP2 and two decode replicas of TP1: 4 GPUs."""
    d = Disaggregated([engine()], [engine(), engine()],
                      router_class("round_robin")(None, 1), router_class("round_robin")(None, 2),
                      transfer(tp=(2, 1)))
    rs = [req(0, 8, 3, t=0.0), req(1, 16, 3, t=1.0), req(2, 8, 3, t=2.0), req(3, 8, 3, t=3.0)]
    d.run(rs)
    df, it = d.tables(rs)
    assert df["ttft"].tolist() == pytest.approx([0.018, 0.026, 0.018, 0.018])
    assert df["tpot"].tolist() == pytest.approx([0.011] * 4)
    s = d.summarize(df, it, slo={"ttft": 0.02, "tpot": 0.05}, price_per_gpu_hour=3.6)
    span = 3 + 0.018 + 0.022
    assert s["makespan_s"] == pytest.approx(span)
    assert s["num_gpus"] == 4 and s["cost"]["num_gpus"] == 4
    assert s["slo"]["attainment"] == pytest.approx(0.75)
    assert s["slo"]["goodput_rps"] == pytest.approx(3 / span)
    assert s["slo"]["goodput_rps_per_gpu"] == pytest.approx(3 / span / 4)
    assert s["cost"]["usd"] == pytest.approx(3.6 * 4 * span / 3600)
    assert s["pools"]["prefill"]["num_gpus"] == 2 and s["pools"]["decode"]["num_gpus"] == 2
    assert s["pools"]["decode"]["requests_per_replica"] == [2, 2]


# -- an ideal link and a colocated run ------------------------------------------------------------
@pytest.mark.parametrize("policy", ["sarathi", "vllm"])
def test_isolated_requests_over_an_ideal_link_time_as_one_colocated_engine(policy):
    """A request alone: its prefill on one GPU and its decodes on another take what they take
    on one GPU, and a zero-latency, infinite-bandwidth link adds nothing."""
    def reqs():
        return [req(i, 20 + 7 * i, 2 + 3 * i, t=10.0 * i) for i in range(6)]
    alone = engine(policy)
    a = reqs()
    alone.run(a)
    d = pools(policy_p=policy, policy_d=policy)
    b = reqs()
    d.run(b)
    df, _ = d.tables(b)
    ref = requests_table(a, alone.output_lens)
    for x, y in zip(ref["token_times"], df["token_times"]):
        assert np.array_equal(x, y)
    for col in ("ttft", "tpot", "e2e", "num_output_tokens"):
        assert df[col].tolist() == ref[col].tolist()
    assert (df["transfer_end"] == df["transfer_start"]).all()


def test_ttft_over_an_ideal_link_is_a_prefill_only_run():
    """With room on the decode side, the prefill pool never waits for it: every first token
    comes out when a colocated engine running the prompts alone (each request ending at its
    first token) emits it, whatever the decode pool does."""
    base = workload(80, seed=4, qps=60, prompt=(8, 200), output=(2, 60))
    only = [req(r.request_id, r.num_prompt_tokens, 1, t=r.arrival_time) for r in base]
    e = engine()
    e.run(only)
    ref = requests_table(only, e.output_lens)
    d = pools(n_d=2, router_d="least_loaded")
    rs = workload(80, seed=4, qps=60, prompt=(8, 200), output=(2, 60))
    d.run(rs)
    df, _ = d.tables(rs)
    assert df["first_token_time"].tolist() == ref["first_token_time"].tolist()
    # ... while the decode side differs from any colocated run: it is the decode pool's own
    assert (df["num_output_tokens"] > 1).all() and (df["decode_replica"] >= 0).all()


# -- conservation and KV bounds -------------------------------------------------------------------
def check_conserved(d, rs):
    df, it = d.tables(rs)
    n = len(rs)
    assert len(df) == n and df["request_id"].is_unique
    fin = df[df["status"] == "finished"]
    assert len(fin) == n
    assert (fin["num_output_tokens"] == fin["target_output_tokens"]).all()
    assert df["prefill_replica"].between(0, len(d.prefill) - 1).all()
    moved = df["target_output_tokens"] > 1
    assert (df.loc[moved, "decode_replica"] >= 0).all()
    assert (df.loc[~moved, "decode_replica"] == -1).all()
    assert df.loc[moved, "transfer_end"].notna().all() and df.loc[~moved, "transfer_end"].isna().all()
    assert (df.loc[moved, "transfer_start"] >= df.loc[moved, "first_token_time"]).all()
    # each request went through one prefill replica and at most one decode replica
    for pool, col in ((d.prefill, "prefill_replica"), (d.decode, "decode_replica")):
        for j, e in enumerate(pool):
            assert set(e.output_lens) == set(df.loc[df[col] == j, "request_id"])
    # tokens: every prompt once on the prefill side (no preemption there), every later token
    # once on the decode side
    pre, dec = it[it["pool"] == "prefill"], it[it["pool"] == "decode"]
    assert pre["decode_tokens"].sum() == 0
    if pre["preemptions"].sum() == 0:
        assert pre["prefill_tokens"].sum() == df["num_prompt_tokens"].sum()
    later = (df["num_output_tokens"] - 1).sum()
    if dec["preemptions"].sum() == 0:
        assert dec["decode_tokens"].sum() == later and dec["prefill_tokens"].sum() == 0
    else:   # a recompute after a preemption emits its next token from a prefill
        assert 0 < later - dec["decode_tokens"].sum() <= dec["preemptions"].sum()
    # the routers' counts are back to zero: every end was counted
    for v in d.views:
        v.until(math.inf)
        assert all(x.num_outstanding == 0 and x.outstanding_tokens == 0 for x in v.views)
    return df, it


@pytest.mark.parametrize("n_p, n_d, router", [(1, 1, "round_robin"), (2, 3, "least_loaded"),
                                               (3, 2, "power_of_two")])
def test_requests_and_tokens_are_conserved(n_p, n_d, router):
    rs = workload(120, seed=n_p + n_d, qps=80, prompt=(8, 150), output=(1, 50))
    d = pools(n_p, n_d, router_p=router, router_d=router,
              tr=transfer(Link("net", 2e5, 0.9, 1e-3)))
    d.run(rs)
    check_conserved(d, rs)


def test_neither_pool_exceeds_its_kv_and_a_full_decode_pool_holds_kv_back():
    """A decode replica of 60 blocks (240 tokens): requests wait for room with their KV held on
    the prefill side (its cache of 120 blocks fills with it, and it admits less), and every
    iteration of either pool stays within its cache."""
    def run(num_blocks_d):
        rs = workload(100, seed=2, qps=200, prompt=(20, 100), output=(20, 60))
        d = pools(1, 1, kw_p={"num_blocks": 120}, kw_d={"num_blocks": num_blocks_d})
        d.run(rs)
        df, it = check_conserved(d, rs)
        return d, df, it
    _, roomy_df, roomy_it = run(2000)
    d, df, it = run(60)
    for pool, e in (("prefill", d.prefill[0]), ("decode", d.decode[0])):
        mine = it[it["pool"] == pool]
        assert mine["kv_blocks_used"].max() <= e.kv.num_blocks
        assert (mine["kv_tokens_stored"] <= mine["kv_blocks_used"] * e.kv.block_size).all()
    assert it.loc[it["pool"] == "decode", "kv_blocks_used"].max() > 45   # it was full
    wait = df["transfer_start"] - df["first_token_time"]
    assert wait.max() > 0.1 and (roomy_df["transfer_start"] - roomy_df["first_token_time"]).max() < 0.05
    # the prefill cache held KV waiting to leave: fuller than with room downstream, and
    # prompts started later
    pre = it[it["pool"] == "prefill"]
    roomy_pre = roomy_it[roomy_it["pool"] == "prefill"]
    assert pre["kv_blocks_used"].mean() > 1.5 * roomy_pre["kv_blocks_used"].mean()
    assert df["ttft"].mean() > roomy_df["ttft"].mean()


def test_a_prefill_replica_blocked_by_held_kv_resumes():
    """A prefill cache that holds two prompts (17 blocks of 4 tokens; 8 blocks each): while
    their KV waits for room on the decode replica, nothing else starts there; it goes on once
    their transfers free it."""
    rs = [req(i, 30, 40, t=0.0) for i in range(6)]
    d = pools(1, 1, kw_p={"num_blocks": 17}, kw_d={"num_blocks": 40, "kv_watermark": 0.0})
    d.run(rs)
    df, it = check_conserved(d, rs)
    start, end = df["first_scheduled_time"], df["transfer_end"]
    # two by two: a pair starts when the previous pair's KV has left
    assert start[2] == start[3] == end[0] == end[1] and start[4] == start[5] == end[2] == end[3]
    # the last one's KV waited on the prefill side for the decode replica's room
    assert df["transfer_start"][5] - df["first_token_time"][5] > 0.1
    assert it.loc[it["pool"] == "decode", "kv_blocks_used"].max() <= 40


# -- fast-forward ---------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["plain", "tight", "layerwise", "three_decoders"])
def test_decode_fast_forward_equals_stepping(case):
    kw_p, kw_d, n_d, mode = {}, {}, 1, "whole"
    if case == "tight":
        kw_p, kw_d = {"num_blocks": 90}, {"num_blocks": 70}
    if case == "layerwise":
        mode = "layerwise"
    if case == "three_decoders":
        n_d = 3
    runs = []
    for ff in (True, False):
        rs = workload(90, seed=7, qps=120, prompt=(8, 100), output=(2, 80))
        d = pools(2, n_d, kw_p=kw_p, kw_d=kw_d, router_d="least_loaded",
                  tr=transfer(Link("net", 5e5, 0.9, 2e-3), mode=mode))
        for e in d.decode:
            e.fast_forward = ff
        d.run(rs)
        runs.append((d.tables(rs), sum(e.num_iterations - len(e.rows) for e in d.decode)))
    (a, skipped), (b, none) = runs
    if case == "tight":   # KV held back on the prefill side: the bound's hard case
        assert (a[0]["transfer_start"] - a[0]["first_token_time"]).max() > 0.05
    pd.testing.assert_frame_equal(a[0].drop(columns="token_times"),
                                  b[0].drop(columns="token_times"), check_exact=True)
    for x, y in zip(a[0]["token_times"], b[0]["token_times"]):
        assert np.array_equal(x, y)
    pd.testing.assert_frame_equal(a[1], b[1], check_exact=True)
    assert skipped > 0 and none == 0


# -- the entry points -----------------------------------------------------------------------------
def test_retained_kv_outlives_the_request_until_released():
    policy = make_policy("sarathi", num_blocks=10, token_budget=64)
    kv = policy.kv
    r = req(0, 9, 1)
    kv.retain(r)
    e = Engine(policy, LinearCost())
    e.add_request(r, output_len=1)
    e.advance()
    assert r.status.name == "FINISHED" and kv.num_used_blocks == 3 and kv.num_retained() == 1
    assert kv.num_stored_tokens == 9 and kv.holders() == [0]
    with pytest.raises(Exception, match="every KV block is freed"):
        e.guard.finished()
    kv.release(0)
    assert kv.num_used_blocks == 0 and kv.num_stored_tokens == 0 and kv.num_retained() == 0
    e.guard.finished()


def test_a_preempted_request_frees_its_kv_even_when_retained():
    policy = make_policy("sarathi", num_blocks=10, token_budget=4)
    kv, r = policy.kv, req(0, 9, 1)
    kv.retain(r)
    e = Engine(policy, LinearCost())
    e.add_request(r, output_len=1)
    e.advance()                       # 4 of its 9 prompt tokens
    assert kv.num_used_blocks == 3 and kv.num_stored_tokens == 4
    from sarathi_lab.schedulers.output import SchedulerOutput
    policy.preempt(r, SchedulerOutput())
    assert kv.num_used_blocks == 0 and kv.num_retained() == 0 and kv.num_stored_tokens == 0


@pytest.mark.parametrize("policy, blocks", [("sarathi", 3), ("orca", 64)])
def test_received_kv_is_counted_and_adopted(policy, blocks):
    """A handed-over request: KV for its 9 prompt tokens and next token (3 blocks of 4; orca
    reserves the whole max_model_len = 256 tokens, 64 blocks), counted as stored."""
    e = engine(policy, num_blocks=100, max_model_len=256)
    r = req(0, 9, 3)
    r.take_output_len()
    r.num_computed_tokens, r.num_output_tokens, r.token_times = 9, 1, [0.5]
    assert e.policy.admission_blocker(r, 1) is None
    assert len(e.kv.allocate_received(r)) == blocks
    assert e.kv.num_stored_tokens == 9
    e.now = 1.0
    assert e.adopt(r, 3)
    assert r in e.policy.running and r.status.name == "RUNNING"
    while e.policy.has_work():
        e.advance()
    assert r.token_times == pytest.approx([0.5, 1.011, 1.022]) and r.status.name == "FINISHED"
    e.guard.finished()


def test_a_request_the_decode_pool_cannot_hold_is_refused_on_arrival():
    """A decode replica of 10 blocks of 4 tokens: a 60-token prompt that decodes on cannot be
    served and is refused before any prefill; one that ends at its first token does not need
    the decode pool."""
    d = pools(kw_d={"num_blocks": 10})
    rs = [req(0, 60, 5), req(1, 8, 3), req(2, 60, 1)]
    d.run(rs)
    df, it = d.tables(rs)
    assert df["status"].tolist() == ["rejected", "finished", "finished"]
    assert df["rejection_reason"][0] == ("decode pool: needs 16 KV blocks, the cache has 10 "
                                         "(block_size=4)")
    assert df["prefill_replica"].tolist() == [-1, 0, 0]
    assert df["decode_replica"].tolist() == [-1, 0, -1]
    assert it.loc[it["pool"] == "prefill", "prefill_tokens"].sum() == 8 + 60
