"""Labels that say what the numbers say (issue 23, item 2) and contract violations that name the
plug-in, the method and the rule (item 4): stalls against the decode step of the same batch
size, the queue where requests wait, the capacity criteria's parts, goodput with what it was
judged by, disaggregated transfers and policies; each figure computed by hand on a small
scenario."""
import json

import pandas as pd
import pytest
from conftest import LinearCost, make_policy
from helpers import cli, composed

from sarathi_lab.engine import Engine
from sarathi_lab.engine.guard import RuleViolation
from sarathi_lab.metrics import iterations_table, requests_table, summarize
from sarathi_lab.request import Request, Status
from sarathi_lab.run.runner import run
from sarathi_lab.run.summary_text import format_summary
from sarathi_lab.topology.fleet import Fleet
from sarathi_lab.topology.routers import RouterConfig
from sarathi_lab.traces import load_trace

approx = pytest.approx


def served(i, arrival, sched, times, prompt=8):
    r = Request(i, arrival, prompt, len(times))
    r.status, r.first_scheduled_time = Status.FINISHED, sched
    r.token_times, r.num_output_tokens, r.finish_time = list(times), len(times), times[-1]
    return r


def table(reqs):
    return requests_table(reqs, {r.request_id: r.take_output_len() for r in reqs})


def iters(rows):
    """(start, duration, prefill tokens, requests) per iteration; the other columns 0."""
    from sarathi_lab.engine import ITER_COLUMNS
    out = []
    for start, dur, pre, n in rows:
        row = dict.fromkeys(ITER_COLUMNS, 0)
        row.update(start=start, duration=dur, prefill_tokens=pre, decode_tokens=n,
                   num_requests=n)
        out.append(tuple(row[c] for c in ITER_COLUMNS))
    return iterations_table(out)


# -- stalls ----------------------------------------------------------------------------------------
# decode-only steps: 0.01 s with 1 request (it0, it1, it5), 0.04 s with 4 (it2, it3); it4 and it6
# carry prefills (not decode steps); a batch of 2 has no decode step of its own: interpolated,
# 0.01 + (0.04 - 0.01) / 3 = 0.02 s
STALL_ITERS = [(0.00, 0.01, 0, 1), (0.01, 0.01, 0, 1), (0.02, 0.04, 0, 4), (0.06, 0.04, 0, 4),
               (0.10, 0.30, 100, 4), (0.40, 0.01, 0, 1), (0.41, 0.20, 50, 2)]


def test_a_stall_is_a_gap_far_above_the_decode_step_of_its_own_batch_size():
    reqs = [served(0, 0.0, 0.0, [0.01, 0.02, 0.06, 0.10, 0.40]),
            served(1, 0.0, 0.0, [0.10, 0.41, 0.61]),
            served(2, 0.0, 0.0, [0.02, 0.10])]
    st = summarize(table(reqs), iters(STALL_ITERS))["stalls"]
    # r0: 0.01 (ends it1: 1 request, step 0.01, threshold 0.05), 0.04 and 0.04 (it2, it3: 4
    # requests, step 0.04, threshold 0.2), 0.30 (it4: 4 requests): a stall, 0.26 lost.
    # r1: 0.31 (it5: 1 request): a stall, 0.30 lost; 0.20 (it6: 2 requests, step 0.02,
    # threshold 0.1): a stall, 0.18 lost. r2: 0.08 (it3: 4 requests): none, though 0.08 is 8x
    # the run's median decode step (0.01), which the old threshold (5 x that) called a stall.
    # All gaps: 0.39 + 0.51 + 0.08 = 0.98 s
    assert st == {"factor": 5.0, "count": 3, "worst_s": approx(0.31),
                  "time_lost_s": approx(0.74), "time_lost_share": approx(0.74 / 0.98)}
    line = next(ln for ln in format_summary({**summarize(table(reqs), iters(STALL_ITERS)),
                                             "wall_time_s": 0.0, "config": {}}).splitlines()
                if ln.startswith("stalls"))
    assert line == ("stalls (TBT gaps > 5x a decode-only step of the same batch size): 3, worst "
                    "310 ms; 740 ms of decode time lost (75.5% of all TBT gaps)")


# -- the queue -------------------------------------------------------------------------------------
def test_the_queue_counts_requests_from_arrival_to_their_first_iteration():
    # r0 waits 0, r1 0.5 -> 1.0, r2 0.7 -> 1.5, r3 arrives at 1.0 as r1 leaves and is scheduled
    # at once: at most 2 wait (0.7 to 1.0); 1.3 s of waiting over the makespan of 2 s
    reqs = [served(0, 0.0, 0.0, [1.0, 2.0]), served(1, 0.5, 1.0, [1.5, 2.0]),
            served(2, 0.7, 1.5, [2.0]), served(3, 1.0, 1.0, [2.0])]
    # the policy's queue after each of the two iterations: 0 and 1 (a vLLM-like table)
    it = iters([(0.0, 1.0, 8, 1), (1.0, 1.0, 16, 3)])
    it["num_waiting"] = [0, 1]
    q = summarize(table(reqs), it)["queue"]
    assert q == {"mean": approx(1.3 / 2), "max": 2, "iteration_end_mean": 0.5,
                 "iteration_end_max": 1}


def test_under_vllm_the_queue_sees_what_the_iteration_end_sample_misses():
    """vLLM admits every waiting prompt that fits: requests arriving during an iteration are
    admitted at the next, so the policy's queue after an iteration is empty while they wait."""
    cfg = {"name": "vllm", "block_size": 4, "num_kv_blocks": 256, "max_num_batched_tokens": 256}
    policy = make_policy("vllm", **{k: v for k, v in cfg.items() if k != "name"})
    reqs = [Request(i, 0.001 + 0.004 * i, 16, 4) for i in range(6)]
    engine = Engine(policy, LinearCost(0.01, 0.001), fast_forward=False)
    engine.run(reqs)
    req_df = requests_table(reqs, engine.output_lens)
    q = summarize(req_df, iterations_table(engine.iterations()))["queue"]
    assert q["iteration_end_max"] == 0
    delays = req_df["first_scheduled_time"] - req_df["arrival_time"]
    span = req_df["finish_time"].max() - req_df["arrival_time"].min()
    assert delays.max() > 0 and q["max"] >= 1
    assert q["mean"] == approx(delays.sum() / span)


# -- the capacity criteria and goodput, as printed -----------------------------------------------
SLO = {"name": "hand", "p99_tbt": 0.25, "max_median_scheduling_delay": 2.0,
       "request_p99_tbt": 0.25, "attainment_target": 0.9}


def test_p99_tbt_met_and_scheduling_delay_missed_is_printed_as_such():
    # r0 waits 2.5 s, gaps 0.1, 0.2; r1 waits 3.0 s, gap 0.1: pooled P99 TBT 0.1 + 0.98 x 0.1
    # = 0.198 s (met), median scheduling delay 2.75 s (missed), nothing rejected; both meet
    # their own P99 TBT (0.199 s, 0.1 s): attainment 100%, goodput 2 / 3.6 s
    reqs = [served(0, 0.0, 2.5, [3.0, 3.1, 3.3]), served(1, 0.2, 3.2, [3.5, 3.6])]
    s = summarize(table(reqs), iterations_table([]), slo=SLO)
    s.update(wall_time_s=0.0, config={})
    assert s["slo"]["meets_tbt_slo"] is False and s["slo"]["meets_attainment"] is True
    assert s["slo"]["judged_by"] == "own P99 TBT <= 0.25 s (no TTFT target)"
    text = format_summary(s)
    start = text.index("SLO hand")
    assert text[start:].splitlines() == [
        "SLO hand: attainment 100.0%, goodput 0.56 req/s, judged by own P99 TBT <= 0.25 s "
        "(no TTFT target)",
        "  Sarathi-Serve criterion (P99 TBT, median scheduling delay, no rejection): missed on "
        "median scheduling delay",
        "    P99 TBT 198 ms <= 250 ms met",
        "    median scheduling delay 2.75 s > 2 s missed by 750 ms",
        "    rejected 0 requests (met: none may be)",
        "  DistServe criterion (share of requests meeting the SLO): met",
        "    SLO attainment 100% >= 90% met"]


@pytest.mark.parametrize("slo,text", [
    ({"ttft": 2.5, "tpot": 0.15}, "TTFT <= 2.5 s and TPOT <= 0.15 s"),
    ({}, "no per-request target (every finished request counts)"),
    ({"ttft": 2.5, "classes": {"batch": {"e2e": 60.0}}},
     "class batch: E2E <= 60 s; any other class: TTFT <= 2.5 s"),
    ({"request_p99_tbt": 0.1, "classes": {"batch": {"e2e": 60.0}}},
     "class batch: E2E <= 60 s; any other class: own P99 TBT <= 0.1 s (no TTFT target)"),
])
def test_goodput_says_what_it_was_judged_by(slo, text):
    from sarathi_lab.metrics import slo_judged_by
    assert slo_judged_by(slo) == text


@pytest.mark.slow   # a CLI subprocess
def test_cli_prints_which_part_of_the_criterion_missed(tmp_path):
    r = cli(f"hydra.run.dir={tmp_path}/run", "trace=synthetic", "trace.qps=20",
            "trace.num_requests=150", "progress=false", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    crit = {c["name"]: c for c in s["slo"]["criteria"]}
    assert crit["p99_tbt"]["met"] and not crit["median_scheduling_delay"]["met"]
    assert ("Sarathi-Serve criterion (P99 TBT, median scheduling delay, no rejection): missed on "
            "median scheduling delay\n") in r.stdout
    assert f"judged by {s['slo']['judged_by']}" in r.stdout


def test_a_capacity_search_prints_what_the_failing_rate_missed(tmp_path):
    from sarathi_lab.sweeps.capacity import format_result, search
    c = composed("mode=capacity", "trace=synthetic", "trace.num_requests=60",
                 "capacity.max_probes=4", "capacity.criteria=[tbt]", "progress=false")
    out = search(c, tmp_path)
    r = out["criteria"]["tbt"]
    assert r["definition"] == ("P99 TBT <= 0.1 s, median scheduling delay <= 2.0 s and no "
                               "request rejected")
    failing = next(p for p in out["probes"] if p["qps"] == r["fails_at_qps"])
    assert failing["tbt_missed"] and not failing["meets_tbt_slo"]
    assert f"at {r['fails_at_qps']:.4g} req/s it missed: {failing['tbt_missed']}" in \
        format_result(out)
    assert all(p["tbt_missed"] == "" for p in out["probes"] if p["meets_tbt_slo"])


# -- disaggregated pools ---------------------------------------------------------------------------
def test_disagg_prints_each_pools_policy_and_the_kv_moved_per_request_and_in_total():
    c = composed("cluster=disagg", "cluster.prefill.scheduler.name=vllm", "trace=synthetic",
                 "trace.num_requests=30", "trace.qps=4", "progress=false")
    s = run(c, None, write=False)
    text = format_summary(s)
    assert text.startswith("prefill pool vllm, decode pool sarathi | mistral-7b on ")
    t = s["transfers"]
    n, total = t["num_transfers"], t["bytes_total"]
    assert n == 30   # every request has more than one output token: each moves once
    # Mistral-7B: 32 layers x K and V x 8 KV heads x 128 x 2 bytes per prompt token
    per_token = 32 * 2 * 8 * 128 * 2
    assert total % per_token == 0 and t["bytes"]["mean"] == approx(total / n)
    assert (f"{n} KV transfers (one per request moved), {total / 1e9:.3g} GB in total; per "
            f"request {t['bytes']['mean'] / 1e6:.3g} MB on average") in text


def test_a_disagg_capacity_search_names_each_pools_policy(tmp_path):
    from sarathi_lab.sweeps.capacity import format_result, search
    c = composed("cluster=disagg", "cluster.prefill.scheduler.name=vllm", "mode=capacity",
                 "trace=synthetic", "trace.num_requests=20", "capacity.criteria=[tbt]",
                 "capacity.max_probes=2", "progress=false")
    out = search(c, tmp_path)
    assert out["pool_policies"] == {"prefill": "vllm", "decode": "sarathi"}
    assert format_result(out).startswith("capacity of prefill pool vllm, decode pool sarathi | ")


def test_the_decode_pools_queue_runs_from_the_first_token_to_the_transfer(tmp_path):
    # four seats on the decode replica: KV waits on the prefill side for one
    c = composed("cluster=disagg", "trace=synthetic", "trace.num_requests=30", "trace.qps=8",
                 "cluster.decode.scheduler.max_num_seqs=4", "progress=false")
    s = run(c, tmp_path, write=True)
    req = pd.read_parquet(tmp_path / "requests.parquet")
    moved = req[req["decode_replica"] >= 0]
    wait = (moved["transfer_start"] - moved["first_token_time"]).to_numpy()
    assert wait.max() > 0
    q = s["pools"]["decode"]["queue"]
    assert q["mean"] == approx(wait.sum() / s["makespan_s"])
    # the prefill pool's queue is the run's: arrival to the first iteration
    assert s["pools"]["prefill"]["queue"]["mean"] == approx(s["queue"]["mean"])


# -- contract violations ---------------------------------------------------------------------------
def run_policy(cls_name):
    import plugins
    base = make_policy("sarathi")
    p = getattr(plugins, cls_name)(base.cfg, base.kv)
    Engine(p, LinearCost(), fast_forward=False).run([Request(0, 0.0, 20, 3)])


@pytest.mark.parametrize("cls,message", [
    ("ReturnsNone", "plugins.ReturnsNone.schedule() broke the rule 'schedule() returns a "
                    "SchedulerOutput' at iteration 0 (t=0.000s): it returned None (build one "
                    "with out = SchedulerOutput(), out.add(req, n) per request, and return out)"),
    ("ReturnsList", "plugins.ReturnsList.schedule() broke the rule 'schedule() returns a "
                    "SchedulerOutput' at iteration 0 (t=0.000s): it returned a list: "
                    "[Request(0, prompt=20, out=0, computed=0, RUNNING)] (build one"),
    ("MovesProgress", "plugins.MovesProgress.schedule() broke the rule 'no more tokens than a "
                      "request has left' at iteration 0 (t=0.000s): request 0 is given 20 "
                      "tokens with 19 left to compute (its num_computed_tokens is 1; only the "
                      "engine's update() may move it, never schedule())"),
])
def test_a_policy_breaking_the_batch_contract_is_named(cls, message):
    with pytest.raises(RuleViolation) as e:
        run_policy(cls)
    assert str(e.value).startswith(message)


def test_a_zero_token_entry_names_the_policy_the_method_and_the_rule():
    with pytest.raises(ValueError) as e:
        run_policy("AddsZeroTokens")
    assert str(e.value) == (
        "plugins.AddsZeroTokens.schedule() at t=0.000s (iteration 0): broke the rule 'at least "
        "one token per entry': out.add(request 0, 0) gives it 0 tokens; a request with nothing "
        "to compute this iteration is left out of the batch")


def test_a_router_answering_no_replica_names_the_router_the_method_and_the_rule():
    import plugins
    engines = [Engine(make_policy("sarathi"), LinearCost()) for _ in range(2)]
    with pytest.raises(ValueError) as e:
        Fleet(engines, plugins.ToNowhere(RouterConfig(), 2)).run([Request(0, 0.0, 8, 2)])
    assert str(e.value) == (
        "router 'to_nowhere' (plugins.ToNowhere.route()) broke the rule 'route() returns a "
        "replica index': it returned 2 for request 0 at t=0.000s: must be a replica index, an "
        "integer in [0, 2)")


@pytest.mark.slow   # CLI subprocesses
def test_the_cli_names_a_broken_policy_and_a_broken_router(tmp_path):
    r = cli(f"hydra.run.dir={tmp_path}/p", "scheduler=custom",
            "scheduler.name=plugins:ReturnsNone", "trace.num_requests=5", cwd=tmp_path)
    assert r.returncode != 0
    assert "error: plugins.ReturnsNone.schedule() broke the rule 'schedule() returns a " \
        "SchedulerOutput'" in r.stderr
    r = cli(f"hydra.run.dir={tmp_path}/r", "cluster.num_replicas=2",
            "cluster.router=plugins:ToNowhere", "trace.num_requests=5", cwd=tmp_path)
    assert r.returncode != 0
    assert "(plugins.ToNowhere.route()) broke the rule 'route() returns a replica index'" \
        in r.stderr


@pytest.mark.parametrize("name,text,message", [
    ("t.jsonl", '{"prompt_token_ids": [1, 2], "output_len": 2, "priority": 1e30}\n',
     r"line 1: priority must be a whole number below 2\*\*53 in magnitude \(lower is more "
     r"urgent\), got 1e\+30"),
    ("t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens,priority\n0,10,5,1e30\n",
     r"data row 1 .* column 'priority': 1e\+30 is not a whole number below 2\*\*53 in "
     r"magnitude"),
])
def test_a_priority_beyond_exact_floats_says_so(tmp_path, name, text, message):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_trace(p, qps=1.0)
