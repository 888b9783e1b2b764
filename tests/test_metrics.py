"""Every summary field, computed by hand.

Two kinds of scenario: request and iteration tables built by hand (each formula of
`metrics.summarize` on its own), and small runs through the engine whose iteration durations are
simple enough to add up on paper (what the engine records is checked too). Runs go through public
paths only: `runner.build` / `runner.run` with a config dict, and `Engine(policy, executor).run`.
"""

import numpy as np
import pytest
from conftest import only_read
from helpers import SARATHI_8, instant_sim_cfg, three_sarathi_requests

from sarathi_lab.engine import FLOAT_COLUMNS, ITER_COLUMNS, Engine
from sarathi_lab.metrics import (
    iterations_table,
    request_p99_tbt,
    requests_table,
    summarize,
    tbt_gaps,
)
from sarathi_lab.request import Request, Status
from sarathi_lab.run.runner import build, run

approx = pytest.approx


# ---- hand-built tables ------------------------------------------------------------------------

def finished(rid, arrival, scheduled, times, preemptions=0, prompt=4):
    r = Request(rid, arrival, prompt, len(times))
    r.status = Status.FINISHED
    r.first_scheduled_time = scheduled
    r.token_times = list(times)
    r.num_output_tokens = len(times)
    r.finish_time = times[-1]
    r.num_preemptions = preemptions
    return r


def rejected(rid, arrival):
    r = Request(rid, arrival, 4, 3)
    r.status = Status.REJECTED
    r.rejection_reason = "too long"
    return r


# the engine's iteration records these tests know
COLUMNS = ("start", "duration", "prefill_tokens", "decode_tokens", "num_requests",
           "kv_blocks_used", "kv_tokens_stored", "preemptions")


def it_row(duration, prefill=0, decode=1, blocks=0, stored=0, preempted=0, start=0.0):
    """One engine record, by column name (columns added later default to 0)."""
    row = dict.fromkeys(ITER_COLUMNS, 0)
    row.update(zip(COLUMNS, (start, duration, prefill, decode, prefill + decode, blocks, stored,
                             preempted)))
    return tuple(row[c] for c in ITER_COLUMNS)


def table(reqs):
    """requests_table with the workload output lengths recorded as the engine records them."""
    return requests_table(reqs, {r.request_id: r.take_output_len() for r in reqs})


def four_requests():
    """r0: 3 tokens, gaps 1, 1            ttft 1  e2e 3  tpot 1    delay 0.5  1 preemption
    r1: 4 tokens, gaps 0.5, 0.5, 6     ttft 1  e2e 8  tpot 7/3  delay 0    2 preemptions
    r2: 1 token                        ttft 4  e2e 4  tpot -    delay 2
    r3: rejected at t=3 (no times; it counts in num_requests and against attainment)"""
    return table([
        finished(0, 0.0, 0.5, [1.0, 2.0, 3.0], preemptions=1),
        finished(1, 1.0, 1.0, [2.0, 2.5, 3.0, 9.0], preemptions=2),
        finished(2, 2.0, 4.0, [6.0]),
        rejected(3, 3.0),
    ])


# decode-only durations 0.5, 1, 1.5 (median 1) and one prefill iteration of 10 s
ITERS = iterations_table([it_row(0.5), it_row(1.0), it_row(1.5), it_row(10.0, prefill=50)])


def test_requests_table_per_request_formulas():
    rq = four_requests()
    assert list(rq["ttft"][:3]) == [1.0, 1.0, 4.0]
    assert list(rq["e2e"][:3]) == [3.0, 8.0, 4.0]
    assert rq["tpot"][:2].tolist() == approx([1.0, 7 / 3]) and np.isnan(rq["tpot"][2])
    assert list(rq["normalized_e2e"][:3]) == [1.0, 2.0, 4.0]
    assert list(rq["scheduling_delay"][:3]) == [0.5, 0.0, 2.0]
    assert list(rq["status"]) == ["finished"] * 3 + ["rejected"]
    assert rq["rejection_reason"][3] == "too long"
    assert all(np.isnan(rq.loc[3, c]) for c in ("ttft", "tpot", "e2e", "scheduling_delay"))


# requests.parquet's columns (others may be added)
REQUEST_COLUMNS = ["request_id", "status", "rejection_reason", "arrival_time",
                   "num_prompt_tokens", "num_output_tokens", "target_output_tokens",
                   "first_scheduled_time", "first_token_time", "finish_time", "ttft", "tpot", "e2e",
                   "normalized_e2e", "scheduling_delay", "num_preemptions", "token_times"]


@pytest.mark.filterwarnings("error")   # one-token and rejected requests divide by zero quietly
def test_requests_table_columns_and_types():
    rq = four_requests()
    assert set(REQUEST_COLUMNS) <= set(rq.columns)
    assert list(rq["request_id"]) == [0, 1, 2, 3]
    assert list(rq["num_prompt_tokens"]) == [4] * 4
    assert list(rq["target_output_tokens"]) == [3, 4, 1, 3]
    assert list(rq["first_scheduled_time"][:3]) == [0.5, 1.0, 4.0]
    assert list(rq["first_token_time"][:3]) == [1.0, 2.0, 6.0]
    assert list(rq["finish_time"][:3]) == [3.0, 9.0, 6.0]
    assert list(rq["num_preemptions"]) == [1, 2, 0, 0]
    for col in REQUEST_COLUMNS[3:-1]:
        # target_output_tokens: float, NaN where the workload gave no length
        want = np.int64 if col.startswith("num_") else np.float64
        assert rq[col].dtype == want, col


def test_requests_table_keeps_token_ids_when_a_request_has_them():
    a = finished(0, 0.0, 0.0, [1.0, 2.0])
    a.prompt_token_ids, a.output_token_ids = [5, 6, 7, 8], [9, 10]
    b = rejected(1, 0.0)
    rq = requests_table([a, b])
    assert {"prompt_token_ids", "output_token_ids"} <= set(rq.columns)
    assert list(rq["prompt_token_ids"]) == [[5, 6, 7, 8], None]
    assert list(rq["output_token_ids"]) == [[9, 10], []]
    plain = requests_table([finished(0, 0.0, 0.0, [1.0])]).columns
    assert "prompt_token_ids" not in plain and "output_token_ids" not in plain


def test_two_token_request_tpot_is_its_one_gap():
    rq = requests_table([finished(0, 0.0, 0.0, [1.0, 1.25])])
    assert rq["tpot"][0] == 0.25 and rq["normalized_e2e"][0] == 0.625


def test_iterations_table_columns_and_types():
    it = iterations_table([it_row(0.5, prefill=3, decode=2, blocks=4, stored=7, preempted=1,
                                  start=2.0)])
    assert list(it.columns) == list(ITER_COLUMNS)
    assert it.iloc[0][list(COLUMNS)].tolist() == [2.0, 0.5, 3, 2, 5, 4, 7, 1]
    assert it["start"].dtype == it["duration"].dtype == np.float64
    assert all(it[c].dtype == np.int64 for c in ITER_COLUMNS if c not in FLOAT_COLUMNS)
    assert all(it[c].dtype == np.float64 for c in FLOAT_COLUMNS)
    assert len(iterations_table([])) == 0


def test_iterations_table_owns_its_columns():
    """The frame takes its column arrays without copying them into blocks; none of them may be
    the records' own memory (the engine keeps its table as a cache)."""
    rows = np.array([it_row(0.5, prefill=3, start=2.0), it_row(0.25, decode=2, start=2.5)],
                    float)
    before = rows.copy()
    it = iterations_table(rows)
    it.loc[0, "start"] = 9.0
    it.loc[1, "duration"] = 9.0
    it.loc[0, "prefill_tokens"] = 9
    np.testing.assert_array_equal(rows, before)
    assert it["start"].tolist() == [9.0, 2.5] and it["duration"].tolist() == [0.5, 9.0]


def test_request_p99_tbt_is_each_requests_own_percentile():
    rng = np.random.default_rng(0)
    # 150 gaps (where P99 falls between two values that are not the last two), one gap, none,
    # and last a request with exactly one gap
    times = [np.cumsum(rng.uniform(0.01, 1.0, 151)).tolist(), [1.0, 3.0], [2.0], [0.5, 0.75]]
    rq = requests_table([finished(i, 0.0, 0.0, t) for i, t in enumerate(times)])
    own = request_p99_tbt(rq)
    assert own[0] == approx(np.percentile(np.diff(times[0]), 99), rel=1e-12)
    assert own[1] == 2.0 and np.isnan(own[2]) and own[3] == 0.25
    assert np.isnan(request_p99_tbt(requests_table([finished(0, 0.0, 0.0, [1.0])]))).all()


def test_request_p99_tbt_matches_numpy_for_every_length():
    """Requests with as many gaps as each other are partitioned as the rows of one matrix:
    lengths shared by three requests and one alone, in a shuffled order, each checked against
    numpy's percentile of its own gaps; exact, not approximately."""
    rng = np.random.default_rng(1)
    lengths = rng.permutation([0, 1, 2, 3, 63, 64, 65, 66, 130, 300] * 3 + [1001])
    # few distinct values: ties, as a steady decode batch gives them
    times = [np.cumsum(rng.choice([0.01, 0.02, 0.5, rng.uniform(0, 2)], n)).tolist()
             for n in lengths]
    own = request_p99_tbt(requests_table([finished(i, 0.0, 0.0, t) if t else rejected(i, 0.0)
                                          for i, t in enumerate(times)]))
    for i, t in enumerate(times):
        if len(t) < 2:
            assert np.isnan(own[i])
        else:
            assert own[i] == np.percentile(np.diff(t), 99), i


def test_token_times_column_holds_each_requests_times_as_arrays():
    reqs = [finished(0, 0.0, 0.0, [1.0, 2.5]), rejected(1, 0.5), finished(2, 1.0, 1.0, [3.0])]
    rq = requests_table(reqs)
    assert [t.tolist() for t in rq["token_times"]] == [[1.0, 2.5], [], [3.0]]
    assert rq["first_token_time"][0] == 1.0 and np.isnan(rq["first_token_time"][1])
    assert rq["first_token_time"][2] == 3.0
    # lists (a table built by hand) and arrays (requests_table, parquet) give the same gaps
    by_hand = rq.assign(token_times=[list(t) for t in rq["token_times"]])
    for a, b in zip(tbt_gaps(rq, with_times=True), tbt_gaps(by_hand, with_times=True)):
        assert a.tolist() == b.tolist()
    assert tbt_gaps(rq)[0].tolist() == [1.5]


def test_counts_makespan_throughput_preemptions():
    s = summarize(four_requests(), ITERS)
    assert (s["num_requests"], s["num_finished"], s["num_rejected"]) == (4, 3, 1)
    assert s["num_iterations"] == 4
    assert s["makespan_s"] == 9.0                      # first arrival 0 to last finish 9
    assert s["throughput_rps"] == approx(3 / 9)
    assert s["throughput_tok_s"] == approx((3 + 4 + 1) / 9)
    assert s["preemptions"] == 3


def test_latency_stats_skip_rejected_requests():
    s = summarize(four_requests(), ITERS)
    # numpy's linear percentiles, by hand: of [1, 1, 4], p90 sits at 1.8 -> 1 + 0.8 * 3
    assert s["ttft"] == approx({"mean": 2.0, "p50": 1.0, "p90": 3.4, "p99": 3.94, "max": 4.0})
    assert s["e2e"] == approx({"mean": 5.0, "p50": 4.0, "p90": 7.2, "p99": 7.92, "max": 8.0})
    # of [1, 7/3]: the one-token request has no TPOT
    assert s["tpot"] == approx({"mean": 5 / 3, "p50": 5 / 3, "p90": 1 + 0.9 * 4 / 3,
                                "p99": 1 + 0.99 * 4 / 3, "max": 7 / 3})
    assert s["normalized_e2e"] == approx({"mean": 7 / 3, "p50": 2.0, "p90": 3.6, "p99": 3.96,
                                          "max": 4.0})
    # of [0.5, 0, 2]
    assert s["scheduling_delay"] == approx({"mean": 2.5 / 3, "p50": 0.5, "p90": 1.7,
                                            "p99": 1.97, "max": 2.0})


def test_tbt_pools_gaps_within_requests_only():
    s = summarize(four_requests(), ITERS)
    # gaps [1, 1] and [0.5, 0.5, 6]; none across requests (r0's last token 3 -> r1's first 2)
    assert s["tbt"] == approx({"mean": 1.8, "p50": 1.0, "p90": 4.0, "p99": 5.8, "max": 6.0})


def test_summary_does_not_depend_on_when_the_run_starts():
    def shifted(dt):
        return requests_table([
            finished(0, 0.0 + dt, 0.5 + dt, [1.0 + dt, 2.0 + dt, 3.0 + dt], preemptions=1),
            finished(1, 1.0 + dt, 1.0 + dt, [2.0 + dt, 2.5 + dt, 3.0 + dt, 9.0 + dt]),
            finished(2, 2.0 + dt, 4.0 + dt, [6.0 + dt]),
            rejected(3, 3.0 + dt)])
    slo = {"ttft": 2.0, "tpot": 1.5}
    a, b = summarize(shifted(0.0), ITERS, slo=slo), summarize(shifted(100.0), ITERS, slo=slo)
    assert b["makespan_s"] == approx(9.0) and b["throughput_rps"] == approx(3 / 9)
    assert b["slo"]["goodput_rps"] == approx(1 / 9)
    for key in ("ttft", "tpot", "e2e", "scheduling_delay", "tbt"):
        assert b[key] == approx(a[key]), key


def test_stalls_against_decode_only_median():
    s = summarize(four_requests(), ITERS)
    # every gap ends after the last decode-only iteration (batch of 1 request: median 1, the
    # 10 s prefill iteration is not a decode); x 5 = 5: the gap of 6 alone, 5 s lost of the
    # 9 s of gaps (1 + 1 + 0.5 + 0.5 + 6)
    assert s["stalls"] == {"factor": 5.0, "count": 1, "worst_s": 6.0, "time_lost_s": 5.0,
                           "time_lost_share": approx(5 / 9)}
    # a gap equal to the threshold is no stall: factor 1 -> threshold 1, gaps of 1 are not > 1
    assert summarize(four_requests(), ITERS, stall_factor=1.0)["stalls"]["count"] == 1
    assert summarize(four_requests(), ITERS, stall_factor=0.9)["stalls"]["count"] == 3
    assert summarize(four_requests(), ITERS, stall_factor=0.4)["stalls"]["count"] == 5


def test_stalls_without_decode_only_iterations_use_all():
    prefill_only = iterations_table([it_row(1.0, prefill=8), it_row(2.0, prefill=8),
                                     it_row(1.2, prefill=8)])
    st = summarize(four_requests(), prefill_only, stall_factor=2.0)["stalls"]
    # median 1.2 (all 9-request batches), x 2 = 2.4: the gap of 6, 4.8 s lost
    assert st == {"factor": 2.0, "count": 1, "worst_s": 6.0, "time_lost_s": approx(4.8),
                  "time_lost_share": approx(4.8 / 9)}


def test_stalls_when_iterations_take_no_time():
    # an executor that reports zero durations: every positive gap exceeds 5 x 0
    free = iterations_table([it_row(0.0, prefill=4), it_row(0.0, prefill=4)])
    # and loses all of itself: 9 s of 9
    assert summarize(four_requests(), free)["stalls"] == {
        "factor": 5.0, "count": 5, "worst_s": 6.0, "time_lost_s": 9.0, "time_lost_share": 1.0}


@pytest.mark.filterwarnings("error")   # the empty iteration's 0 / 0 is quiet
def test_kv_utilisation_and_internal_waste():
    # 8 blocks of 4 slots: used 2, 4, 6, 0; stored 8, 10, 12, 0 tokens
    it = iterations_table([it_row(1.0, blocks=b, stored=t)
                           for b, t in [(2, 8), (4, 10), (6, 12), (0, 0)]])
    kv = summarize(four_requests(), it, kv_blocks_total=8, block_size=4)["kv"]
    assert kv["blocks_total"] == 8
    assert kv["utilization_mean"] == approx(3 / 8)      # mean 3 blocks of 8
    assert kv["utilization_max"] == approx(6 / 8)
    # waste 1 - stored / slots: 0, 6/16, 12/24; the empty iteration has none
    assert kv["internal_waste_mean"] == approx((0 + 6 / 16 + 0.5) / 3)
    # block_size is the slot count: the same table at 8 slots a block wastes more
    kv8 = summarize(four_requests(), it, kv_blocks_total=8, block_size=8)["kv"]
    assert kv8["internal_waste_mean"] == approx((0.5 + 22 / 32 + 36 / 48) / 3)


def test_kv_waste_clipped_when_shared_prefixes_store_more_than_the_slots():
    it = iterations_table([it_row(1.0, blocks=2, stored=12), it_row(1.0, blocks=2, stored=4)])
    kv = summarize(four_requests(), it, kv_blocks_total=4, block_size=4)["kv"]
    assert kv["internal_waste_mean"] == approx((0 + 0.5) / 2)


def test_kv_waste_of_one_token_blocks_and_the_default_block_size():
    # block_size 1: one block, one slot; empty it wastes all of it, full none
    it = iterations_table([it_row(1.0, blocks=1, stored=0), it_row(1.0, blocks=1, stored=1)])
    assert summarize(four_requests(), it, kv_blocks_total=2, block_size=1
                     )["kv"]["internal_waste_mean"] == 0.5
    # default 16 slots a block: 2 blocks holding 24 tokens waste 1 - 24/32
    it = iterations_table([it_row(1.0, blocks=2, stored=24)])
    assert summarize(four_requests(), it, kv_blocks_total=2)["kv"]["internal_waste_mean"] == 0.25


def test_no_kv_section_without_the_cache_size():
    assert "kv" not in summarize(four_requests(), ITERS)


def test_slo_attainment_and_goodput_count_only_requests_meeting_it():
    rq = four_requests()
    # ttft <= 2 and tpot <= 1.5: only r0 (r1's TPOT 7/3, r2's TTFT 4, r3 rejected)
    slo = summarize(rq, ITERS, slo={"ttft": 2.0, "tpot": 1.5})["slo"]
    assert slo["ttft"] == 2.0 and slo["tpot"] == 1.5            # the SLO is echoed
    assert slo["attainment"] == 0.25
    assert slo["goodput_rps"] == approx(1 / 9)                  # 3 finished, 1 good
    # a one-token request has no TPOT and cannot miss it: r0 and r2
    slo = summarize(rq, ITERS, slo={"tpot": 1.5})["slo"]
    assert slo["attainment"] == 0.5 and slo["goodput_rps"] == approx(2 / 9)
    # a request's own P99 TBT: r0's is 1, r1's 0.5 + 0.98 * 5.5, r2 has no gap
    slo = summarize(rq, ITERS, slo={"request_p99_tbt": 2.0})["slo"]
    assert slo["attainment"] == 0.5 and slo["goodput_rps"] == approx(2 / 9)
    slo = summarize(rq, ITERS, slo={"request_p99_tbt": 5.9})["slo"]
    assert slo["attainment"] == 0.75 and slo["goodput_rps"] == approx(3 / 9)
    slo = summarize(rq, ITERS, slo={"request_p99_tbt": 5.88})["slo"]
    assert slo["attainment"] == 0.5
    # no per-request limit set: every finished request meets it, a rejected one never does
    slo = summarize(rq, ITERS, slo={"p99_tbt": 100.0})["slo"]
    assert slo["attainment"] == 0.75 and slo["goodput_rps"] == approx(3 / 9)


def test_slo_limits_are_inclusive_and_missing_tpot_or_tbt_cannot_miss():
    rq = four_requests()

    def attainment(**slo):
        return summarize(rq, ITERS, slo=slo)["slo"]["attainment"]
    # r0 sits exactly on each limit: TTFT 1, TPOT 1, own P99 TBT 1 (r1's TTFT is 1 too)
    assert attainment(ttft=1.0) == 0.5 and attainment(ttft=0.99) == 0.0
    assert attainment(tpot=1.0) == 0.5 and attainment(tpot=0.99) == 0.25
    assert attainment(request_p99_tbt=1.0) == 0.5 and attainment(request_p99_tbt=0.99) == 0.25
    # below every real value, only the one-token request r2 (no TPOT, no gap) meets them
    assert attainment(tpot=0.5) == 0.25 and attainment(request_p99_tbt=0.5) == 0.25


def test_meets_attainment_against_its_target():
    rq = four_requests()
    assert not summarize(rq, ITERS, slo={"tpot": 1.5})["slo"]["meets_attainment"]   # 0.5 < 0.9
    assert summarize(rq, ITERS, slo={"tpot": 1.5, "attainment_target": 0.5}
                     )["slo"]["meets_attainment"]
    assert not summarize(rq, ITERS, slo={"tpot": 1.5, "attainment_target": 0.51}
                         )["slo"]["meets_attainment"]
    # default target 0.9: 9 of 10 requests meeting it is enough
    ten = requests_table([finished(i, 0.0, 0.0, [1.0]) for i in range(9)] + [rejected(9, 0.0)])
    assert summarize(ten, ITERS, slo={"ttft": 1.0})["slo"]["meets_attainment"]


def test_meets_tbt_slo_needs_p99_tbt_delay_and_no_rejection():
    served = requests_table([finished(0, 0.0, 0.5, [1.0, 2.0, 3.0]),
                             finished(1, 1.0, 1.0, [2.0, 2.5, 3.0, 9.0]),
                             finished(2, 2.0, 4.0, [6.0])])
    # pooled P99 TBT 5.8; median scheduling delay 0.5 (default limit 2 s)
    def meets(rq=served, **slo):
        return summarize(rq, ITERS, slo=slo)["slo"]["meets_tbt_slo"]
    assert meets(p99_tbt=5.8)
    assert not meets(p99_tbt=5.79)
    assert not meets(p99_tbt=5.8, max_median_scheduling_delay=0.49)
    assert meets(p99_tbt=5.8, max_median_scheduling_delay=0.5)
    assert not meets(four_requests(), p99_tbt=100.0)        # one request was rejected
    # the default limit on the median scheduling delay is 2 s: 2.5 misses it
    late = requests_table([finished(i, 0.0, 2.5, [3.0, 3.5]) for i in range(3)])
    assert not meets(late, p99_tbt=1.0) and meets(late, p99_tbt=1.0,
                                                  max_median_scheduling_delay=2.5)
    assert not meets(ttft=100.0)                            # no P99-TBT SLO, no verdict


def test_nothing_finished_gives_zeros_and_no_stats():
    rq = requests_table([rejected(0, 0.0), rejected(1, 1.0)])
    s = summarize(rq, iterations_table([]), slo={"ttft": 1.0}, kv_blocks_total=4)
    assert (s["num_finished"], s["num_rejected"], s["num_iterations"]) == (0, 2, 0)
    assert s["makespan_s"] == 0.0 and s["throughput_rps"] == 0.0 and s["throughput_tok_s"] == 0.0
    assert s["ttft"] == {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    assert s["stalls"] == {"factor": 5.0, "count": 0, "worst_s": 0.0, "time_lost_s": 0.0,
                           "time_lost_share": 0.0}   # no NaN
    assert s["kv"] == {"blocks_total": 4, "utilization_mean": 0.0, "utilization_max": 0.0,
                       "internal_waste_mean": 0.0, "token_share_mean": 0.0}
    assert s["batch"] == {"requests_mean": 0.0, "requests_max": 0}
    assert s["slo"]["attainment"] == 0.0 and s["slo"]["goodput_rps"] == 0.0
    assert not s["slo"]["meets_attainment"]


@pytest.mark.filterwarnings("error")
def test_no_requests_at_all():
    s = summarize(requests_table([]), iterations_table([]), slo={"ttft": 1.0}, kv_blocks_total=4)
    assert (s["num_requests"], s["num_finished"], s["makespan_s"]) == (0, 0, 0.0)
    assert s["slo"]["attainment"] == 0.0 and not s["slo"]["meets_attainment"]


# ---- runs through the engine ------------------------------------------------------------------


def token_cost_cfg(scheduler, *, base=0.01, per_token=0.001, max_model_len=64, **top):
    return {"scheduler": only_read(scheduler),
            "executor": {"name": "helpers:TokenCost", "base": base, "per_token": per_token},
            "model": {"name": "toy", "max_model_len": max_model_len},
            "progress": False, **top}


def engine_run(cfg, requests, fast_forward=True):
    policy, executor = build(cfg)
    eng = Engine(policy, executor, fast_forward=fast_forward)
    eng.run(requests)
    return policy, iterations_table(eng.iterations())


def test_sim_durations_are_the_fixed_overhead_on_instant_hardware():
    _, it = engine_run(instant_sim_cfg(SARATHI_8), three_sarathi_requests())
    assert (it["duration"] == 0.01).all()


@pytest.mark.parametrize("ff", [False, True])
def test_sarathi_run_recorded_and_summarised(ff):
    """Budget 8, 0.01 s an iteration, blocks of 4:
    it1 0.00-0.01  a 6 (whole prompt), b 2 (chunk)      a: token 1
    it2 0.01-0.02  a decode, b 4 (last chunk)           a: 2, b: 1     (c arrives at 0.025)
    it3 0.02-0.03  a, b decode                          a: 3, b: 2, both finish and free
    it4 0.03-0.04  c 3                                  c: 1
    it5 0.04-0.05  c decode                             c: 2, finishes"""
    reqs = three_sarathi_requests()
    policy, it = engine_run(instant_sim_cfg(SARATHI_8), reqs, fast_forward=ff)
    a, b, c = reqs
    assert a.token_times == approx([0.01, 0.02, 0.03])
    assert b.token_times == approx([0.02, 0.03]) and b.first_scheduled_time == 0.0
    assert c.first_scheduled_time == approx(0.03) and c.token_times == approx([0.04, 0.05])
    assert list(it["start"]) == approx([0.0, 0.01, 0.02, 0.03, 0.04])
    assert list(it["prefill_tokens"]) == [8, 4, 0, 3, 0]
    assert list(it["decode_tokens"]) == [0, 1, 2, 0, 1]
    assert list(it["num_requests"]) == [2, 2, 2, 1, 1]
    # recorded after the update: finished requests have freed their blocks. a and b take
    # 2 blocks each for their whole prompts at admission (b's later chunk included)
    assert list(it["kv_blocks_used"]) == [4, 4, 0, 1, 0]
    assert list(it["kv_tokens_stored"]) == [8, 13, 0, 3, 0]
    assert list(it["preemptions"]) == [0] * 5

    s = run(instant_sim_cfg(SARATHI_8, fast_forward=ff), None,
            requests=three_sarathi_requests(), write=False)
    assert (s["num_requests"], s["num_finished"], s["num_rejected"], s["num_iterations"]) == \
        (3, 3, 0, 5)
    assert s["makespan_s"] == approx(0.05)
    assert s["throughput_rps"] == approx(3 / 0.05)
    assert s["throughput_tok_s"] == approx(7 / 0.05)
    assert s["preemptions"] == 0
    assert s["ttft"]["max"] == approx(0.02) and s["ttft"]["mean"] == approx(0.045 / 3)
    assert s["tpot"] == approx({"mean": 0.01, "p50": 0.01, "p90": 0.01, "p99": 0.01,
                                "max": 0.01})
    assert s["e2e"]["mean"] == approx(0.085 / 3)                     # 0.03, 0.03, 0.025
    assert s["normalized_e2e"]["mean"] == approx((0.01 + 0.015 + 0.0125) / 3)
    assert s["scheduling_delay"]["max"] == approx(0.005)             # c: 0.025 -> 0.03
    assert s["scheduling_delay"]["p50"] == 0.0
    assert s["tbt"]["mean"] == approx(0.01) and s["tbt"]["max"] == approx(0.01)
    assert s["stalls"] == approx({"factor": 5.0, "count": 0, "worst_s": 0.01, "time_lost_s": 0.0,
                                  "time_lost_share": 0.0})
    kv = s["kv"]
    assert kv["blocks_total"] == 16
    assert kv["utilization_mean"] == approx(9 / 5 / 16)
    assert kv["utilization_max"] == approx(4 / 16)
    # 1 - stored / slots: 1 - 8/16, 1 - 13/16, 1 - 3/4 (empty iterations have no waste)
    assert kv["internal_waste_mean"] == approx((0.5 + 3 / 16 + 0.25) / 3)


VLLM_TINY_KV = {"name": "vllm", "block_size": 4, "num_kv_blocks": 6, "max_num_batched_tokens": 32,
                "max_model_len": 24}


def preempting_pair():
    return [Request(0, 0.0, 8, 10), Request(1, 0.0, 8, 10)]


# Iterations (COLUMNS: start, duration, prefill, decode, requests, blocks used, tokens stored,
# preempted), by hand:
# 6 blocks of 4 tokens hold both 8-token prompts, and both grow together until, at 13 tokens
# each, they need a 4th block apiece and only 0 are left: b (the newest) is preempted, a runs
# alone to its 10th token, then b recomputes its 8 + 5 tokens and finishes. An iteration costs
# 0.01 s + 0.001 s a token.
PREEMPTING_ITERS = [
    (0.000, 0.026, 16, 0, 2, 4, 16, 0),   # it1  a, b prompts     a1 b1 at 0.026
    (0.026, 0.012, 0, 2, 2, 6, 18, 0),    # it2  decodes          a2 b2 at 0.038, 3rd block each
    (0.038, 0.012, 0, 2, 2, 6, 20, 0),    # it3                   a3 b3 at 0.050
    (0.050, 0.012, 0, 2, 2, 6, 22, 0),    # it4                   a4 b4 at 0.062
    (0.062, 0.012, 0, 2, 2, 6, 24, 0),    # it5                   a5 b5 at 0.074 (blocks full)
    (0.074, 0.011, 0, 1, 1, 4, 13, 1),    # it6  b preempted      a6 at 0.085
    (0.085, 0.011, 0, 1, 1, 4, 14, 0),    # it7  b's 13 tokens need 4 blocks, 2 free: waits
    (0.096, 0.011, 0, 1, 1, 4, 15, 0),    # it8
    (0.107, 0.011, 0, 1, 1, 4, 16, 0),    # it9
    (0.118, 0.011, 0, 1, 1, 0, 0, 0),     # it10 a10 at 0.129: a finishes, frees all
    (0.129, 0.023, 13, 0, 1, 4, 13, 0),   # it11 b recomputes 13  b6 at 0.152
    (0.152, 0.011, 0, 1, 1, 4, 14, 0),    # it12                  b7 at 0.163
    (0.163, 0.011, 0, 1, 1, 4, 15, 0),    # it13
    (0.174, 0.011, 0, 1, 1, 4, 16, 0),    # it14
    (0.185, 0.011, 0, 1, 1, 0, 0, 0),     # it15 b10 at 0.196: b finishes
]


@pytest.mark.parametrize("ff", [False, True])
def test_preempting_run_recorded_by_the_engine(ff):
    reqs = preempting_pair()
    policy, it = engine_run(token_cost_cfg(VLLM_TINY_KV), reqs, fast_forward=ff)
    expected = np.array(PREEMPTING_ITERS)
    for j, col in enumerate(COLUMNS):
        np.testing.assert_allclose(it[col], expected[:, j], atol=1e-12, err_msg=col)
    a, b = reqs
    assert (a.num_preemptions, b.num_preemptions) == (0, 1)
    assert a.token_times == approx([0.026 + 0.012 * i for i in range(5)]
                                   + [0.074 + 0.011 * i for i in range(1, 6)])
    assert b.token_times == approx([0.026 + 0.012 * i for i in range(5)]
                                   + [0.152 + 0.011 * i for i in range(5)])
    assert b.first_scheduled_time == 0.0     # its first schedule, not its restart
    assert policy.kv.num_free_blocks == 6


@pytest.mark.parametrize("ff", [False, True])
def test_preempting_run_summary(ff):
    slo = {"ttft": 0.03, "tpot": 0.012, "p99_tbt": 0.1}
    s = run(token_cost_cfg(VLLM_TINY_KV, slo=slo, fast_forward=ff), None,
            requests=preempting_pair(), write=False)
    assert (s["num_finished"], s["num_iterations"], s["preemptions"]) == (2, 15, 1)
    assert s["makespan_s"] == approx(0.196)
    assert s["throughput_tok_s"] == approx(20 / 0.196)
    assert s["ttft"]["mean"] == approx(0.026)
    # a: (0.129 - 0.026) / 9, b: (0.196 - 0.026) / 9
    assert s["tpot"]["max"] == approx(0.170 / 9) and s["tpot"]["p50"] == approx(0.273 / 18)
    assert s["e2e"]["mean"] == approx((0.129 + 0.196) / 2)
    # b's gap over its preemption (0.074 -> 0.152) is the stall: it ends with it11, a batch of
    # 1 request, whose decode-only step is 0.011 s (batches of 2: 0.012 s); threshold
    # 5 x 0.011; lost 0.078 - 0.011 of the 0.273 s of gaps (9 x 0.011 + 8 x 0.012 + 0.078)
    assert s["stalls"] == approx({"factor": 5.0, "count": 1, "worst_s": 0.078,
                                  "time_lost_s": 0.067, "time_lost_share": 0.067 / 0.273})
    # 18 gaps pooled: 9 of 0.011, 8 of 0.012, one of 0.078; P99 at position 16.83
    assert s["tbt"]["p99"] == approx(0.012 + 0.83 * 0.066)
    assert s["tbt"]["mean"] == approx((9 * 0.011 + 8 * 0.012 + 0.078) / 18)
    kv = s["kv"]
    assert kv["blocks_total"] == 6
    assert kv["utilization_mean"] == approx(60 / 15 / 6)   # blocks used sum to 60
    assert kv["utilization_max"] == 1.0
    # waste per non-empty iteration (slots = 4 x blocks): 0, 1/4, 1/6, 1/12, 0,
    # then twice 3/16, 1/8, 1/16, 0
    assert kv["internal_waste_mean"] == approx((0.5 + 2 * 0.375) / 13)
    # only a meets TPOT <= 0.012 (0.0114 against b's 0.0189); TTFTs are 0.026
    assert s["slo"]["attainment"] == 0.5
    assert s["slo"]["goodput_rps"] == approx(1 / 0.196)
    assert s["slo"]["meets_tbt_slo"]          # P99 0.0668 <= 0.1, no delay, nothing rejected
    assert not s["slo"]["meets_attainment"]


def test_vllm_prefill_stalls_a_decode():
    """vLLM runs b's whole 50-token prompt alone while a waits for its third token:
    it1 0.000 a 4 -> a1 at 0.014; it2 a decode -> a2 at 0.025; it3 b 50 (arrived at 0.02) ->
    b1 at 0.085; it4, it5 a decodes -> a3 at 0.096, a4 at 0.107."""
    cfg = token_cost_cfg({"name": "vllm", "block_size": 4, "num_kv_blocks": 64,
                          "max_num_batched_tokens": 64}, slo={"ttft": 0.05})
    reqs = [Request(0, 0.0, 4, 4), Request(1, 0.02, 50, 1)]
    s = run(cfg, None, requests=reqs, write=False)
    assert reqs[0].token_times == approx([0.014, 0.025, 0.096, 0.107])
    # a's gap 0.025 -> 0.096 ends with it4, a batch of 1, whose decode-only step is 0.011 s
    # (it2, it4, it5): > 5 x 0.011, 0.060 s lost of a's 0.093 s of gaps
    assert s["stalls"] == approx({"factor": 5.0, "count": 1, "worst_s": 0.071,
                                  "time_lost_s": 0.060, "time_lost_share": 0.060 / 0.093})
    assert s["scheduling_delay"]["max"] == approx(0.005)
    # b waits from 0.02 to 0.025 (it arrived during it2): 0.005 s of the 0.107 s makespan; the
    # policy's queue after each iteration never holds it (vLLM admits it at once)
    assert s["queue"] == approx({"mean": 0.005 / 0.107, "max": 1, "iteration_end_mean": 0.0,
                                 "iteration_end_max": 0})
    assert s["ttft"]["max"] == approx(0.065)
    # b's TTFT 0.065 misses 0.05; a's 0.014 meets it
    assert s["slo"]["attainment"] == 0.5 and s["slo"]["goodput_rps"] == approx(1 / 0.107)


def test_rejected_requests_in_a_run_summary():
    # a 30-token prompt needs 8 blocks of 4, the cache has 6: rejected on arrival
    cfg = token_cost_cfg({**VLLM_TINY_KV, "max_model_len": 64, "max_num_batched_tokens": 64},
                         slo={"ttft": 1.0})
    reqs = [Request(0, 0.0, 4, 2), Request(1, 0.0, 30, 2)]
    s = run(cfg, None, requests=reqs, write=False)
    assert reqs[1].status is Status.REJECTED and "KV blocks" in reqs[1].rejection_reason
    assert (s["num_requests"], s["num_finished"], s["num_rejected"]) == (2, 1, 1)
    assert s["makespan_s"] == approx(0.014 + 0.011)
    assert s["slo"]["attainment"] == 0.5 and s["slo"]["goodput_rps"] == approx(1 / 0.025)


# ---- admission limits, as the engine's records show them ------------------------------------

@pytest.mark.parametrize("name", ["request_level", "orca", "vllm", "sarathi"])
def test_max_num_seqs_holds_back_the_third_request(name):
    """Two of three identical requests run (4-token prompts, 3 tokens out): it1 8 tokens ends at
    0.018, two decode iterations at 0.030 and 0.042, where both finish; c starts then."""
    cfg = token_cost_cfg({"name": name, "block_size": 4, "num_kv_blocks": 64,
                          "max_num_batched_tokens": 64, "token_budget": 64, "max_num_seqs": 2})
    reqs = [Request(i, 0.0, 4, 3) for i in range(3)]
    _, it = engine_run(cfg, reqs)
    assert list(it["num_requests"]) == [2, 2, 2, 1, 1, 1]
    assert reqs[0].finish_time == reqs[1].finish_time == approx(0.042)
    assert reqs[2].first_scheduled_time == approx(0.042)


@pytest.mark.parametrize("name", ["vllm", "sarathi"])
@pytest.mark.parametrize("prompt,waits", [(204, True), (200, False)])
def test_kv_watermark_keeps_blocks_free_at_admission(name, prompt, waits):
    """100 blocks of 4 tokens, watermark 10%: a's 160-token prompt takes 40 blocks, leaving 60.
    b's 204 tokens (51 blocks) would leave 9 < 10: b waits until a finishes. 200 tokens
    (50 blocks) leave exactly 10: b starts at once."""
    cfg = token_cost_cfg({"name": name, "block_size": 4, "num_kv_blocks": 100,
                          "kv_watermark": 0.1, "max_num_batched_tokens": 512,
                          "token_budget": 512}, max_model_len=512)
    a, b = Request(0, 0.0, 160, 2), Request(1, 0.0, prompt, 2)
    policy, it = engine_run(cfg, [a, b])
    assert a.status is b.status is Status.FINISHED
    if waits:
        assert it["num_requests"][0] == 1 and it["kv_blocks_used"][0] == 40
        assert b.first_scheduled_time == a.finish_time
    else:
        assert it["num_requests"][0] == 2 and it["kv_blocks_used"][0] == 90
        assert b.first_scheduled_time == 0.0


@pytest.mark.parametrize("prompt,fits", [(15, True), (16, False)])
def test_paged_admission_needs_the_prompt_and_one_more_token(prompt, fits):
    """4 blocks of 4 tokens: a 15-token prompt and its first output fit; a 16-token prompt
    could never emit its token's KV, so it is rejected on arrival."""
    cfg = token_cost_cfg({"name": "sarathi", "block_size": 4, "num_kv_blocks": 4,
                          "token_budget": 64})
    r = Request(0, 0.0, prompt, 1)
    run(cfg, None, requests=[r], write=False)
    if fits:
        assert r.status is Status.FINISHED and r.num_output_tokens == 1
    else:
        assert r.status is Status.REJECTED and "needs 5 KV blocks" in r.rejection_reason


def prefix_cfg(num_kv_blocks, token_budget):
    return token_cost_cfg({"name": "sarathi", "block_size": 4, "num_kv_blocks": num_kv_blocks,
                           "token_budget": token_budget, "enable_prefix_caching": True})


def test_prefix_cache_hits_blocks_computed_chunk_by_chunk():
    """a's 18-token prompt runs in chunks of 6 (blocks of 4: the chunks end mid-block), each
    full block cached as its chunk is computed; b, the same prompt after a finished, hits all 4
    full blocks (its last token is always computed) and computes 2 tokens."""
    ids = list(range(18))
    a, b = Request(0, 0.0, 18, 1, prompt_token_ids=ids), Request(1, 1.0, 18, 1,
                                                                   prompt_token_ids=list(ids))
    _, it = engine_run(prefix_cfg(16, 6), [a, b])
    assert list(it["prefill_tokens"]) == [6, 6, 6, 2]
    assert a.status is b.status is Status.FINISHED


def test_prefix_cache_evicts_uncached_blocks_before_cached_ones():
    """6 blocks of 4, one request at a time. a (9 tokens) caches 2 full blocks and frees them
    with its partial third; d (2 tokens) takes and frees one uncached block; e (16 tokens)
    takes 4 blocks: the uncached and never-used ones, so a's 2 cached blocks survive and b
    (a's prompt again) hits both: 8 tokens, computing 1."""
    a_ids = list(range(100, 109))
    reqs = [Request(0, 0.0, 9, 1, prompt_token_ids=a_ids),
            Request(1, 1.0, 2, 1, prompt_token_ids=[7, 7]),
            Request(2, 2.0, 16, 1, prompt_token_ids=list(range(200, 216))),
            Request(3, 3.0, 9, 1, prompt_token_ids=list(a_ids))]
    _, it = engine_run(prefix_cfg(6, 64), reqs)
    assert list(it["prefill_tokens"]) == [9, 2, 16, 1]


def test_prefix_caching_with_reserved_kv_is_refused():
    cfg = token_cost_cfg({"name": "orca", "block_size": 4, "num_kv_blocks": 64,
                          "enable_prefix_caching": True})
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        build(cfg)


def test_a_group_holding_every_request_has_the_runs_figures_and_others_their_own():
    # four_requests: one class and one tenant ("default"); its figures are the run's, as a
    # separate copy (summary.json holds them twice)
    s = summarize(four_requests(), ITERS)
    for groups in (s["classes"], s["tenants"]):
        g = groups["default"]
        assert g["ttft"] == s["ttft"] and g["tbt"] == s["tbt"] and g["e2e"] == s["e2e"]
        assert g["ttft"] is not s["ttft"]
        # gaps 0.5, 0.5, 1, 1, 6: P90 at 3.6 of 4 -> 1 + 0.6 x 5, P99 at 3.96 -> 1 + 0.96 x 5
        assert g["tbt"] == {"mean": approx(9 / 5), "p50": 1.0, "p90": approx(4.0),
                            "p99": approx(5.8), "max": 6.0}
    # two tenants: r0 and r2 in A (gaps 1, 1), r1 and r3 in B (gaps 0.5, 0.5, 6)
    reqs = [finished(0, 0.0, 0.5, [1.0, 2.0, 3.0]), finished(1, 1.0, 1.0, [2.0, 2.5, 3.0, 9.0]),
            finished(2, 2.0, 4.0, [6.0]), rejected(3, 3.0)]
    for r in reqs:
        r.tenant = "A" if r.request_id % 2 == 0 else "B"
    t = summarize(table(reqs), ITERS)["tenants"]
    assert t["A"]["tbt"]["max"] == 1.0 and t["A"]["tbt"]["mean"] == 1.0
    assert t["B"]["tbt"]["max"] == 6.0 and t["B"]["tbt"]["mean"] == approx(7 / 3)
    assert t["A"]["ttft"]["mean"] == approx((1 + 4) / 2) and t["B"]["ttft"]["mean"] == 1.0
    assert t["B"]["e2e"]["max"] == 8.0 and t["A"]["num_rejected"] == 0 \
        and t["B"]["num_rejected"] == 1
