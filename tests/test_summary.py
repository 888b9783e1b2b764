"""The run summary's figures, each on a scenario small enough to compute by hand: offered load,
rejections by kind, prefix-cache hit rate, the SLO criteria; and what the text says of them."""
import json

import pytest
from conftest import LinearCost, make_policy, req
from helpers import cli, composed

from sarathi_lab.engine import Engine
from sarathi_lab.kv import KVCacheManager
from sarathi_lab.metrics import (
    iterations_table,
    offered_load,
    rejection_kind,
    requests_table,
    summarize,
)
from sarathi_lab.request import Request, Status
from sarathi_lab.run.runner import run
from sarathi_lab.run.summary_text import NothingServed, check_served, format_summary


def served(i, arrival, prompt, sched, times):
    """A finished request with its times set by hand."""
    r = Request(i, arrival, prompt, len(times))
    r.status, r.first_scheduled_time = Status.FINISHED, sched
    r.token_times, r.num_output_tokens, r.finish_time = list(times), len(times), times[-1]
    return r


def rejected(i, arrival, prompt, out, reason):
    r = Request(i, arrival, prompt, out)
    r.status, r.rejection_reason = Status.REJECTED, reason
    return r


def hand_run(slo=None):
    """r0 arrives at 0, waits 2.5 s, tokens at 3.0, 3.1, 3.3; r1 arrives at 0.2, waits 3.0 s,
    tokens at 3.5, 3.6; r2 arrives at 1.0 and is rejected (its trace asked for 4 tokens)."""
    reqs = [served(0, 0.0, 10, 2.5, [3.0, 3.1, 3.3]), served(1, 0.2, 20, 3.2, [3.5, 3.6]),
            rejected(2, 1.0, 30, 4, "prompt of 30 tokens leaves no room to generate within "
                                    "max_model_len=16")]
    lens = {r.request_id: r.take_output_len() for r in reqs}   # as the engine records them
    s = summarize(requests_table(reqs, lens), iterations_table([]), slo=slo)
    s.update(wall_time_s=0.0, config={})
    return s


def with_config(s):
    s["wall_time_s"], s["config"] = 0.0, {}
    return s


# -- offered load -------------------------------------------------------------------------------

def test_offered_load_counts_every_arrival_over_the_arrival_span():
    off = hand_run()["offered_load"]
    # 3 arrivals over 1.0 s: 2 gaps in 1 s; prompts 10, 20, 30 (mean 20); trace outputs 3, 2, 4
    assert off["requests_per_s"] == pytest.approx(2.0)
    assert off["arrival_span_s"] == pytest.approx(1.0)
    assert off["prompt_tokens_per_s"] == pytest.approx(2.0 * 20)
    assert off["output_tokens_per_s"] == pytest.approx(2.0 * 3)


def test_evenly_spaced_arrivals_give_their_own_rate():
    reqs = [Request(i, i / 4, 8, 2) for i in range(5)]     # 4 req/s
    assert offered_load(requests_table(reqs))["requests_per_s"] == pytest.approx(4.0)


@pytest.mark.parametrize("arrivals", [[0.5], [1.0, 1.0]])
def test_offered_rate_undefined_for_one_request_or_one_instant(arrivals):
    off = offered_load(requests_table([Request(i, t, 8, 2) for i, t in enumerate(arrivals)]))
    assert off["requests_per_s"] is None and off["prompt_tokens_per_s"] is None
    assert off["num_requests"] == len(arrivals)
    assert "no arrival rate" in format_summary(with_config(summarize(
        requests_table([served(0, 0.5, 8, 0.5, [1.0, 1.1])]), iterations_table([]))))


def test_summary_text_shows_the_offered_load():
    assert "offered load 2.00 req/s over 1.0 s of arrivals: 40 prompt + 6 output tok/s" \
        in format_summary(hand_run())


# -- rejections ---------------------------------------------------------------------------------

def test_rejections_grouped_by_kind_with_counts():
    # max_model_len 32: prompts of 40, 50 and 35 tokens leave no room; 4 blocks of 4 tokens: a
    # prompt of 16 needs ceil(17 / 4) = 5 blocks; one of 6 is served
    p = make_policy("sarathi", num_blocks=4, block_size=4, max_model_len=32)
    reqs = [req(0, 40, 2), req(1, 50, 2, t=0.1), req(2, 16, 2, t=0.2), req(3, 6, 2, t=0.3),
            req(4, 35, 1, t=0.4)]
    Engine(p, LinearCost()).run(reqs)
    s = summarize(requests_table(reqs), iterations_table([]))
    assert s["rejections"] == {
        "prompt of N tokens leaves no room to generate within max_model_len=N": 3,
        "needs N KV blocks, the cache has N (block_size=N)": 1,
    }
    assert list(s["rejections"])[0].startswith("prompt of")   # the most frequent first
    assert s["num_rejected"] == 4 and s["num_finished"] == 1
    s = with_config(s)
    s["settings"] = {"scheduler": {"max_model_len": 32, "block_size": 4}}
    # the limits filled in from the settings, the requests' own lengths left out
    assert ("REJECTED 4 of 5 requests (80%), never served (no latency; missed in the SLO "
            "attainment): 3 x prompt leaves no room to generate within max_model_len=32; 1 x "
            "needs N KV blocks, the cache has N (block_size=4) (N: numbers that differ by "
            "request; requests.parquet, column rejection_reason)") in format_summary(s)


def test_rejection_kind_of_a_plugin_without_a_reason():
    assert rejection_kind(None) == "no reason given"
    assert rejection_kind("queue full at 3.25 s") == "queue full at N s"


def test_only_the_top_rejection_kinds_are_printed():
    reqs = [rejected(i, 0.0, 8, 2, f"kind{'abcde'[i]} of 7") for i in range(5)]
    s = with_config(summarize(requests_table(reqs), iterations_table([])))
    assert len(s["rejections"]) == 5
    line = next(ln for ln in format_summary(s).splitlines() if ln.startswith("  REJECTED"))
    assert "1 x kinda; 1 x kindb; 1 x kindc; 2 more kinds in summary.json" in line


# -- prefix cache -------------------------------------------------------------------------------

def test_prefix_counters_count_an_admission_once_even_after_a_failed_try():
    kv = KVCacheManager(4, 4, enable_prefix_caching=True)
    a = req(0, 10, 2, ids=list(range(10)))
    assert kv.allocate_slots(a, 10, kv.get_computed_blocks(a)[0]) is not None   # 3 blocks
    a.num_computed_tokens = 10
    d = req(1, 3, 2, ids=[50, 51, 52])
    assert kv.allocate_slots(d, 3, kv.get_computed_blocks(d)[0]) is not None    # the 4th
    b = req(2, 10, 2, ids=list(range(8)) + [100, 101])
    hit, n_hit = kv.get_computed_blocks(b)
    assert n_hit == 8                                   # a's first two blocks
    assert kv.allocate_slots(b, 2, hit) is None         # its third block: none free
    assert kv.prefix_cache_stats() == {"hit_tokens": 0, "query_tokens": 13}
    kv.free(d)
    hit, n_hit = kv.get_computed_blocks(b)
    assert kv.allocate_slots(b, 2, hit) is not None     # the retry succeeds
    assert kv.prefix_cache_stats() == {"hit_tokens": 8, "query_tokens": 23}
    kv.allocate_slots(b, 1)                             # later growth is no new lookup
    assert kv.prefix_cache_stats() == {"hit_tokens": 8, "query_tokens": 23}


def test_prefix_cache_stats_absent_when_caching_is_off():
    assert KVCacheManager(4, 4).prefix_cache_stats() is None


def _shared_prefix_requests():
    # b arrives after a is done; its first 8 tokens are a's: (10 - 1) // 4 = 2 blocks hit
    return [req(0, 10, 2, ids=list(range(10))),
            req(1, 10, 2, t=5.0, ids=list(range(8)) + [100, 101])]


def test_summary_prefix_cache_hit_rate():
    p = make_policy("sarathi", block_size=4, enable_prefix_caching=True)
    reqs = _shared_prefix_requests()
    eng = Engine(p, LinearCost())
    eng.run(reqs)
    s = summarize(requests_table(reqs), iterations_table(eng.iterations()),
                  prefix_cache=p.kv.prefix_cache_stats())
    assert s["prefix_cache"] == {"hit_tokens": 8, "query_tokens": 20, "hit_rate": 0.4}
    assert "prefix cache: 40.0% of prompt tokens served from cache (8 of 20)" \
        in format_summary(with_config(s))


def test_runner_reports_the_prefix_cache_only_when_it_is_on():
    for on in (True, False):
        c = composed("scheduler.block_size=4", f"scheduler.enable_prefix_caching={on}",
                     "scheduler.num_kv_blocks=64", "progress=false")
        s = run(c, None, requests=_shared_prefix_requests(), write=False)
        if on:
            assert s["prefix_cache"] == {"hit_tokens": 8, "query_tokens": 20, "hit_rate": 0.4}
        else:
            assert "prefix_cache" not in s


# -- SLO criteria -------------------------------------------------------------------------------

SLO = {"name": "hand", "p99_tbt": 0.25, "max_median_scheduling_delay": 2.0, "ttft": 3.2,
       "tpot": None, "request_p99_tbt": None, "attainment_target": 0.5}


def test_slo_criteria_say_what_was_met_and_by_how_much():
    s = hand_run(SLO)
    # TBT gaps 0.1, 0.2, 0.1: P99 = 0.1 + 0.98 * 0.1 = 0.198; scheduling delays 2.5 and 3.0:
    # median 2.75; one rejected; TTFT 3.0 (met), 3.3 (missed), rejected: attainment 1/3
    crit = {c["name"]: c for c in s["slo"]["criteria"]}
    assert [(c["criterion"], c["name"]) for c in s["slo"]["criteria"]] == [
        ("tbt", "p99_tbt"), ("tbt", "median_scheduling_delay"), ("tbt", "num_rejected"),
        ("attainment", "attainment")]
    assert crit["p99_tbt"]["value"] == pytest.approx(0.198) and crit["p99_tbt"]["met"]
    assert crit["p99_tbt"]["limit"] == 0.25
    assert crit["median_scheduling_delay"]["value"] == pytest.approx(2.75)
    assert crit["median_scheduling_delay"]["limit"] == 2.0
    assert not crit["median_scheduling_delay"]["met"]
    assert crit["num_rejected"] == {"criterion": "tbt", "name": "num_rejected", "value": 1,
                                    "limit": 0, "met": False}
    assert crit["attainment"]["value"] == pytest.approx(1 / 3) and not crit["attainment"]["met"]
    assert s["slo"]["meets_tbt_slo"] is False and s["slo"]["meets_attainment"] is False
    text = format_summary(s)
    assert ("Sarathi-Serve criterion (P99 TBT, median scheduling delay, no rejection): missed "
            "on median scheduling delay, rejections\n") in text
    assert "P99 TBT 198 ms <= 250 ms met" in text
    assert "median scheduling delay 2.75 s > 2 s missed by 750 ms" in text
    assert "rejected 1 requests (missed" in text
    assert "SLO attainment 33.3% < 50% missed by 16.7%" in text
    json.dumps(s)   # the criteria go to summary.json as they are


def test_slo_criteria_all_met():
    s = hand_run({**SLO, "max_median_scheduling_delay": 3.0, "ttft": 4.0,
                  "attainment_target": 0.6})
    crit = {c["name"]: c["met"] for c in s["slo"]["criteria"]}
    # the rejection alone fails Sarathi-Serve's criterion; 2/3 >= 0.6 meets DistServe's
    assert crit == {"p99_tbt": True, "median_scheduling_delay": True, "num_rejected": False,
                    "attainment": True}
    assert "median scheduling delay 2.75 s <= 3 s met" in format_summary(s)
    assert "SLO attainment 66.7% >= 60% met" in format_summary(s)


def test_no_tbt_criterion_without_a_p99_tbt_slo():
    s = hand_run({**SLO, "p99_tbt": None})
    assert [c["name"] for c in s["slo"]["criteria"]] == ["attainment"]
    assert s["slo"]["meets_tbt_slo"] is False
    assert "Sarathi-Serve criterion (P99 TBT, median scheduling delay, no rejection): not " \
        "defined (slo.p99_tbt is not set)" in format_summary(s)


def test_value_and_limit_get_the_digits_that_tell_them_apart():
    from sarathi_lab.run.summary_text import format_criterion
    c = {"criterion": "tbt", "name": "p99_tbt", "value": 0.10004, "limit": 0.1, "met": False}
    assert format_criterion(c).startswith("P99 TBT 100.04 ms > 100 ms missed")


# -- a run that served nothing ------------------------------------------------------------------

def test_check_served():
    check_served(hand_run())                                  # one of three served: fine
    reqs = [rejected(i, 0.0, 8, 2, "prompt of 8 tokens too long") for i in range(2)]
    s = with_config(summarize(requests_table(reqs), iterations_table([])))
    with pytest.raises(NothingServed, match="all 2 requests were rejected.*2 x prompt too long"):
        check_served(s)
    assert "ALL 2 REQUESTS WERE REJECTED" in format_summary(s)
    assert json.loads(json.dumps(s, allow_nan=False))["stalls"]["time_lost_share"] == 0.0


@pytest.mark.slow   # a CLI subprocess
def test_cli_run_where_every_request_is_rejected_fails_loudly(tmp_path):
    r = cli(f"hydra.run.dir={tmp_path}/run", "trace.num_requests=5", "scheduler.max_model_len=8",
            cwd=tmp_path)
    assert r.returncode != 0
    assert "ALL 5 REQUESTS WERE REJECTED" in r.stdout
    assert "all 5 requests were rejected" in r.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())   # kept, to look into
    assert s["num_rejected"] == 5 and s["rejections"] == {
        "prompt of N tokens leaves no room to generate within max_model_len=N": 5}
