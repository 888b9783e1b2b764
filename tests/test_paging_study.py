"""The paging study's figures computed by hand (KV token share, batch size), and the study at toy
scale: reservation against paging at the same KV memory, and prefix caching on a shared prompt."""
import numpy as np
import pandas as pd
import pytest
from study_scripts import load_study
from test_metrics import INSTANT_HW, TINY_MODEL

from sarathi_lab.engine import ITER_COLUMNS
from sarathi_lab.metrics import iterations_table, requests_table, summarize
from sarathi_lab.request import Request
from sarathi_lab.runner import run

approx = pytest.approx


def test_token_share_and_batch_size_of_an_iteration_table():
    # (start, duration, prefill, decode, requests, blocks used, tokens stored, preempted, waiting)
    rows = [(0, 1, 8, 0, 2, 4, 8, 0, 0), (1, 1, 0, 3, 3, 6, 11, 0, 0), (2, 1, 0, 1, 1, 2, 3, 0, 0)]
    assert len(rows[0]) == len(ITER_COLUMNS)
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
