"""The paging study's figures computed by hand (KV token share, batch size), and the study at toy
scale: reservation against paging at the same KV memory, and prefix caching on a shared prompt."""
import json

import numpy as np
import pandas as pd
import pytest
from conftest import slow_fixture
from helpers import INSTANT_HW, TINY_MODEL
from study_scripts import load_study

from sarathi_lab.engine import ITER_COLUMNS
from sarathi_lab.metrics import iterations_table, requests_table, summarize
from sarathi_lab.request import Request
from sarathi_lab.run.runner import run

approx = pytest.approx


def test_token_share_and_batch_size_of_an_iteration_table():
    # (start, duration, prefill, decode, requests, blocks used, tokens stored, preempted, waiting):
    # the columns before the swap ones (a run without swap)
    rows = [(0, 1, 8, 0, 2, 4, 8, 0, 0), (1, 1, 0, 3, 3, 6, 11, 0, 0), (2, 1, 0, 1, 1, 2, 3, 0, 0)]
    assert len(rows[0]) == ITER_COLUMNS.index("swap_outs")
    reqs = requests_table([Request(0, 0.0, 4, 2)])
    s = summarize(reqs, iterations_table(rows), kv_blocks_total=8, block_size=4)
    # 8 blocks of 4 slots = 32: 8, 11 and 3 tokens held
    assert s["kv"]["token_share_mean"] == approx((8 + 11 + 3) / 3 / 32)
    assert s["batch"] == {"requests_mean": approx(2.0), "requests_max": 3}
    # token share = utilisation x (1 - waste) iteration by iteration, not of the means
    assert s["kv"]["utilization_mean"] == approx(12 / 3 / 8)
    assert s["kv"]["internal_waste_mean"] == approx((0.5 + 13 / 24 + 5 / 8) / 3)


def tiny(policy):
    return {"scheduler": {"name": policy, "block_size": 4, "num_kv_blocks": 8,
                          "max_model_len": 16},
            "executor": {"name": "sim"}, "model": dict(TINY_MODEL),
            "hardware": dict(INSTANT_HW), "progress": False}


@pytest.mark.parametrize("ff", [True, False])
def test_reservation_holds_half_the_requests_of_paging_in_the_same_memory(ff):
    """8 blocks of 4 tokens, max_model_len 16, 0.01 s an iteration; four requests at t = 0,
    4 prompt and 2 output tokens each (6 tokens: 2 blocks paged, 4 reserved).
    orca:  it1 a, b prompts (8 blocks reserved, 8 tokens)   it2 a, b decode, finish (0, 0)
           it3 c, d prompts (8 blocks, 8 tokens)             it4 c, d decode, finish (0, 0)
    vllm:  it1 all four prompts (4 blocks, 16 tokens)        it2 four decodes, a 5th slot each
           (4 more blocks), all finish (0, 0)"""
    reqs = lambda: [Request(i, 0.0, 4, 2) for i in range(4)]  # noqa: E731
    orca = run({**tiny("orca"), "fast_forward": ff}, None, requests=reqs(), write=False)
    vllm = run({**tiny("vllm"), "fast_forward": ff}, None, requests=reqs(), write=False)
    assert orca["kv"]["token_share_mean"] == approx((8 + 0 + 8 + 0) / 4 / 32)
    assert vllm["kv"]["token_share_mean"] == approx((16 + 0) / 2 / 32)
    assert orca["batch"] == {"requests_mean": approx(2.0), "requests_max": 2}
    assert vllm["batch"] == {"requests_mean": approx(4.0), "requests_max": 4}
    # reservation fills its blocks a quarter: 8 tokens in 8 blocks of 4 slots
    assert orca["kv"]["utilization_mean"] == approx(0.5)
    assert orca["kv"]["internal_waste_mean"] == approx(1 - 8 / 32)
    assert vllm["kv"]["internal_waste_mean"] == approx(0.0)
    assert orca["throughput_rps"] == approx(4 / 0.04) and vllm["throughput_rps"] == approx(4 / 0.02)


def test_max_tokens_rules_of_the_reservation_arms():
    rule = load_study("paging").max_tokens
    out = np.array([1, 3, 4, 5, 0])
    assert rule(out, None) == [None] * 5
    assert rule(out, "oracle") == [1, 3, 4, 5, 1]       # an output of 0 runs as 1 token
    assert rule(out, "pow2") == [1, 4, 4, 8, 1]


@slow_fixture(scope="module")
def toy(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("paging")
    study = load_study("paging")
    res, cells, pre, effect = study.run_study(tmp, tmp / "out", [0, 1], 30, 20.0, 20, 1.0, 1024, 1,
                                              (1.0, 0.25))
    return study, tmp, res, cells, pre, effect


@pytest.mark.slow   # a study at toy scale
def test_reservation_arms_at_the_same_kv_memory(toy):
    study, tmp, res, cells, _, _ = toy
    assert len(res) == len(study.ARMS) * 2 * 2 and (res["num_finished"] == 30).all()
    full = study.full_cache_blocks()
    blocks = res.groupby("kv_fraction")["kv_blocks_total"].unique()
    assert blocks[1.0].tolist() == [full] and blocks[0.25].tolist() == [round(full / 4)]
    cells = cells[cells["kv_fraction"] == 1.0]
    fill = cells.set_index("arm")["kv_slot_fill_mean"]
    # reserving less of what is never used fills more of what is held
    assert fill["orca"] < fill["orca_pow2"] < fill["orca_oracle"] < 1
    assert fill["vllm"] > 0.95 and fill["sarathi"] > 0.95   # only the last block's tail is empty
    for _, r in res.iterrows():
        d = tmp / "paging" / "reservation" / f"{r['arm']}_kv{r['kv_fraction']:g}_seed{r['seed']}"
        s = json.loads((d / "summary.json").read_text())
        assert r["kv_token_share"] == s["kv"]["token_share_mean"]
        assert r["batch_requests_mean"] == s["batch"]["requests_mean"]
        assert r["kv_slot_fill"] == approx(1 - s["kv"]["internal_waste_mean"])
        assert s["config"]["scheduler"]["max_num_seqs"] == 256
        assert s["config"]["trace"]["shuffle"] is True and s["config"]["seed"] == r["seed"]
        # while requests wait, by hand from the iteration table
        it = pd.read_parquet(d / "iterations.parquet")
        w = it[it["num_waiting"] > 0]
        assert r["saturated_share"] == approx(w["duration"].sum() / it["duration"].sum())
        assert r["kv_token_share_saturated"] == approx(
            w["kv_tokens_stored"].mean() / (r["kv_blocks_total"] * 16))
        assert r["batch_requests_saturated"] == approx(w["num_requests"].mean())
    full_res = res[res["kv_fraction"] == 1.0]
    for col in ("kv_token_share", "batch_requests_mean"):
        got = cells.set_index("arm")[f"{col}_mean"]
        want = full_res.groupby("arm")[col].mean()
        pd.testing.assert_series_equal(got.sort_index(), want.sort_index(), check_names=False)
    assert (tmp / "out" / "paging.png").stat().st_size > 1000


@pytest.mark.slow   # a study at toy scale
def test_prefix_caching_on_a_shared_system_prompt(toy):
    study, tmp, _, _, pre, effect = toy
    from sarathi_lab.traces import build_trace
    assert len(pre) == 2 * 2 * 2
    for _, r in pre[pre["prefix_caching"]].iterrows():
        c = study.config(r["policy"], r["seed"], 20, 1.0)
        prompts = build_trace(c["trace"])["num_prompt_tokens"] + 1024
        # 1024 shared tokens = 64 blocks of 16; every request after the first finds them all
        assert r["cached_blocks"] == 64 * 19
        assert r["hit_rate"] == approx(1024 * 19 / prompts.sum())
        off = pre[(~pre["prefix_caching"]) & (pre["policy"] == r["policy"])
                  & (pre["seed"] == r["seed"])].iloc[0]
        assert off["prefill_tokens"] == prompts.sum()          # no preemption at 1 req/s
        assert r["prefill_tokens"] == prompts.sum() - 1024 * 19
    e = effect.set_index("policy")
    # no preemption: the prompt work saved is exactly the share served from the cache
    np.testing.assert_allclose(e["prefill_tokens_saved_mean"], e["hit_rate_mean"], rtol=1e-12)
    assert (e["ttft_p50_ratio_mean"] < 1).all()
