"""Per-class and per-tenant figures, SLO classes, service and Jain's index, queue length and
cost, each computed by hand on a small scenario."""
import numpy as np
import pytest
from conftest import LinearCost, make_policy, req
from helpers import SARATHI_8, instant_sim_cfg, three_sarathi_requests

from sarathi_lab.engine import Engine
from sarathi_lab.metrics import (
    cost_at_rate,
    iterations_table,
    jain,
    requests_table,
    slo_met,
    summarize,
)
from sarathi_lab.request import Request, Status
from sarathi_lab.run.runner import run
from sarathi_lab.run.settings import SLOConfig, SLOTargets
from sarathi_lab.run.summary_text import format_summary
from sarathi_lab.settings import ConfigError, parse

approx = pytest.approx


def finished(rid, arrival, times, tenant, cls, prompt=4):
    r = Request(rid, arrival, prompt, len(times), tenant=tenant, slo_class=cls)
    r.status, r.first_scheduled_time = Status.FINISHED, arrival
    r.token_times, r.num_output_tokens, r.finish_time = list(times), len(times), times[-1]
    return r


def scenario():
    """r0  A chat   arrives 0, tokens 1, 2, 3        ttft 1  e2e 3  tpot 1    gaps 1, 1
    r1  B chat   arrives 1, tokens 2, 2.5, 3, 9   ttft 1  e2e 8  tpot 7/3  gaps .5, .5, 6
    r2  A batch  arrives 2, token 6               ttft 4  e2e 4
    r3  B batch  rejected at 3 (the trace asked for 3 tokens)
    Every prompt is 4 tokens; makespan 9 - 0 = 9 s."""
    r3 = Request(3, 3.0, 4, 3, tenant="B", slo_class="batch")
    r3.status, r3.rejection_reason = Status.REJECTED, "no"
    reqs = [finished(0, 0.0, [1.0, 2.0, 3.0], "A", "chat"),
            finished(1, 1.0, [2.0, 2.5, 3.0, 9.0], "B", "chat"),
            finished(2, 2.0, [6.0], "A", "batch"), r3]
    return requests_table(reqs, {r.request_id: r.take_output_len() for r in reqs})


# top-level TTFT 2 s would fail r2 (TTFT 4); its class replaces it with E2E <= 5 s
SLO = {"name": "x", "ttft": 2.0, "classes": {"chat": {"ttft": 1.0, "tpot": 2.0},
                                              "batch": {"e2e": 5.0}}}


def test_requests_table_carries_the_service_columns():
    rq = scenario()
    assert list(rq["tenant"]) == ["A", "B", "A", "B"]
    assert list(rq["slo_class"]) == ["chat", "chat", "batch", "batch"]
    assert list(rq["priority"]) == [0] * 4 and rq["deadline"].isna().all()


def test_class_targets_replace_the_top_level_ones():
    # r0 meets chat's TTFT 1 and TPOT 2; r1's TPOT 7/3 misses; r2 meets batch's E2E 5 (its
    # TTFT 4 is no target of its class); r3 was rejected
    assert list(slo_met(scenario(), SLO)) == [True, False, True, False]
    # a class without an entry gets the top-level targets: r2 then misses TTFT 2
    only_chat = {"ttft": 2.0, "classes": {"chat": {"ttft": 1.0, "tpot": 2.0}}}
    assert list(slo_met(scenario(), only_chat)) == [True, False, False, False]
    # E2E at the top level: r0 (3) and r2 (4) within 4 s, r1 (8) not
    assert list(slo_met(scenario(), {"e2e": 4.0})) == [True, False, True, False]


def test_per_class_figures_by_hand():
    s = summarize(scenario(), iterations_table([]), slo=SLO)
    assert s["slo"]["attainment"] == 0.5 and s["slo"]["goodput_rps"] == approx(2 / 9)
    chat, batch = s["classes"]["chat"], s["classes"]["batch"]
    assert (chat["num_requests"], chat["num_finished"], chat["num_rejected"]) == (2, 2, 0)
    assert (batch["num_requests"], batch["num_finished"], batch["num_rejected"]) == (2, 1, 1)
    assert chat["ttft"]["p50"] == 1.0 and chat["e2e"]["mean"] == 5.5 and chat["e2e"]["max"] == 8
    # chat's gaps pooled: 1, 1, .5, .5, 6 -> median 1, max 6, mean 9 / 5
    assert chat["tbt"]["p50"] == 1.0 and chat["tbt"]["max"] == 6.0
    assert chat["tbt"]["mean"] == approx(1.8)
    assert batch["tbt"]["p50"] is None and batch["ttft"]["max"] == 4.0
    assert chat["attainment"] == 0.5 and batch["attainment"] == 0.5   # r3 counts, as a miss
    assert s["slo"]["classes_without_targets"] == []
    only_chat = summarize(scenario(), iterations_table([]), slo={"classes": {"chat": {}}})
    assert only_chat["slo"]["classes_without_targets"] == ["batch"]
    assert "classes" not in summarize(scenario(), iterations_table([]), slo={"ttft": 1.0})["slo"]
    assert chat["goodput_rps"] == approx(1 / 9) and batch["goodput_rps"] == approx(1 / 9)


def test_per_tenant_figures_service_and_fairness_by_hand():
    s = summarize(scenario(), iterations_table([]), slo=SLO)
    a, b = s["tenants"]["A"], s["tenants"]["B"]
    assert a["attainment"] == 1.0 and b["attainment"] == 0.0
    assert a["goodput_rps"] == approx(2 / 9) and b["goodput_rps"] == 0.0
    assert a["ttft"]["max"] == 4.0 and b["e2e"]["p50"] == 8.0
    # service = 1 x prompt (once its first token came) + 2 x output tokens:
    # A: r0 4 + 2x3, r2 4 + 2x1 = 16; B: r1 4 + 2x4 = 12, r3 (rejected) 0
    # demand = 1 x prompt + 2 x the trace's output: A 10 + 6 = 16; B 12 + (4 + 2x3) = 22
    assert (a["service_tokens"], a["demand_tokens"]) == (16.0, 16.0)
    assert (b["service_tokens"], b["demand_tokens"]) == (12.0, 22.0)
    assert a["service_share"] == approx(16 / 28)
    f = s["fairness"]
    assert f["service_weights"] == {"prompt": 1.0, "output": 2.0} and f["num_tenants"] == 2
    assert f["jain"] == approx(28 ** 2 / (2 * (16 ** 2 + 12 ** 2)))           # 0.98
    assert f["jain_of_demand_served"] == approx(289 / 314)   # shares 1 and 6/11
    # by the last arrival (3.0): r0's 3 tokens and r1's first 3 (not the one at 9), r2 none yet:
    # A 4 + 2x3 = 10, B 4 + 2x3 = 10
    assert a["service_tokens_by_last_arrival"] == b["service_tokens_by_last_arrival"] == 10.0
    assert f["jain_by_last_arrival"] == 1.0


def test_without_an_slo_groups_have_no_attainment():
    s = summarize(scenario(), iterations_table([]))
    assert "attainment" not in s["classes"]["chat"] and "slo" not in s


def test_jain_index():
    assert jain([5, 5, 5]) == 1.0
    assert jain([3, 0, 0]) == approx(1 / 3)
    assert jain([1, 3]) == approx(16 / 20)
    assert jain([0, 0]) is None and jain([]) is None


def test_queue_length_weighted_by_time():
    it = iterations_table([(0, 1.0, 4, 0, 1, 0, 0, 0, 3), (1, 2.0, 0, 1, 1, 0, 0, 0, 0),
                           (3, 1.0, 0, 1, 1, 0, 0, 0, 6)])
    q = summarize(scenario(), it)["queue"]
    # every request of the scenario is scheduled as it arrives: none waits
    assert q == {"mean": 0.0, "max": 0, "iteration_end_mean": approx((3 * 1 + 0 * 2 + 6 * 1) / 4),
                 "iteration_end_max": 6}
    instant = iterations_table([(0, 0.0, 4, 0, 1, 0, 0, 0, 1), (0, 0.0, 4, 0, 1, 0, 0, 0, 4)])
    assert summarize(scenario(), instant)["queue"]["iteration_end_mean"] == 2.5


@pytest.mark.parametrize("ff", [True, False])
def test_the_engine_records_the_waiting_queue(ff):
    """max_num_seqs=1, three requests at 0, each a prefill then 5 decodes of 1 s: after each of
    r0's 6 iterations two wait, after r1's one, after r2's none (skipped runs included)."""
    engine = Engine(make_policy("sarathi", token_budget=512, max_num_seqs=1),
                    LinearCost(1.0, 0.0), fast_forward=ff)
    engine.run([req(i, 4, 6) for i in range(3)])
    it = iterations_table(engine.iterations())
    assert list(it["num_waiting"]) == [2] * 6 + [1] * 6 + [0] * 6
    q = summarize(scenario(), it)["queue"]
    assert (q["iteration_end_mean"], q["iteration_end_max"]) == (1.0, 2)


def test_cost_by_hand():
    # 2 GPUs at $2/GPU-hour for the 9 s makespan: 0.005 GPU-hours, $0.01, over 8 output tokens
    # of 3 finished requests
    c = summarize(scenario(), iterations_table([]), price_per_gpu_hour=2.0, num_gpus=2)["cost"]
    assert c["gpu_hours"] == approx(0.005) and c["usd"] == approx(0.01)
    assert c["usd_per_1m_output_tokens"] == approx(0.01 / 8 * 1e6)
    assert c["usd_per_request"] == approx(0.01 / 3)
    assert "cost" not in summarize(scenario(), iterations_table([]))
    # at a steady 2 req/s of 100 output tokens on one $3.6/hour GPU: $0.001/s for 200 tok/s
    assert cost_at_rate(2.0, 100.0, 3.6, 1) == {"usd_per_1m_output_tokens": approx(5.0),
                                                "usd_per_request": approx(0.0005)}


def test_cost_uses_the_tensor_parallel_group_from_a_run():
    cfg = instant_sim_cfg(SARATHI_8)
    cfg["hardware"]["price_per_gpu_hour"] = 7.2
    cfg["executor"]["tensor_parallel"] = 2
    s = run(cfg, None, requests=three_sarathi_requests(), write=False)
    # five iterations of the 10 ms overhead (test_metrics: the same run), 3 + 2 + 2 tokens
    assert s["makespan_s"] == approx(0.05)
    usd = 0.05 / 3600 * 2 * 7.2
    assert s["cost"]["num_gpus"] == 2 and s["cost"]["price_per_gpu_hour"] == 7.2
    assert s["cost"]["usd"] == approx(usd) and s["cost"]["usd_per_request"] == approx(usd / 3)
    assert s["cost"]["usd_per_1m_output_tokens"] == approx(usd / 7 * 1e6)


def test_slo_classes_are_typed():
    slo = parse(SLOConfig, {"classes": {"chat": {"ttft": 1.0}, "batch": None}}, "slo")
    assert slo.classes == {"chat": SLOTargets(ttft=1.0), "batch": SLOTargets()}
    for node, match in [({"chat": {"ttfx": 1.0}}, "slo.classes.chat.ttfx: not a setting"),
                        ({"chat": {"ttft": -1.0}}, "slo.classes.chat.ttft=-1.0: must be > 0"),
                        ({"chat": 3}, "slo.classes.chat=3: must be a mapping")]:
        with pytest.raises(ConfigError, match=match):
            parse(SLOConfig, {"classes": node}, "slo")


def test_summary_text_shows_classes_tenants_fairness_and_cost():
    s = summarize(scenario(), iterations_table([(0, 1.0, 4, 0, 1, 0, 0, 0, 3)]), slo=SLO,
                  price_per_gpu_hour=2.0, num_gpus=2)
    s.update(wall_time_s=0.0, config={})
    text = format_summary(s)
    assert "SLO class" in text and "tenant" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("chat "))
    assert line.split()[:3] == ["chat", "2", "0"] and "50%" in line
    assert ("Jain's index 0.980 of service (1.000 by the last arrival), 0.920 of the share of "
            "demand served") in text
    assert "$1.25e+03 per 1M output tokens" in text and "2 GPU(s)" in text
    assert ("queue (arrived, not yet scheduled): 0.00 requests on average over the makespan, at "
            "most 0; the policy's waiting queue after each iteration: 3.00 on average, at most "
            "3") in text
    assert "classes without targets" not in text
    one = summarize(scenario().assign(slo_class="x", tenant="y"), iterations_table([]))
    one.update(wall_time_s=0.0, config={})
    assert "SLO class" not in format_summary(one) and "Jain" not in format_summary(one)


def test_old_tables_without_service_columns_are_one_group():
    rq = scenario().drop(columns=["tenant", "slo_class"])
    s = summarize(rq, iterations_table([]))
    assert list(s["classes"]) == ["default"] and s["tenants"]["default"]["num_requests"] == 4
    assert np.isclose(s["fairness"]["jain"], 1.0)


def test_cost_at_capacity_and_the_attainment_criterion_with_classes():
    import pandas as pd

    from sarathi_lab.sweeps.capacity import _cost_at_capacity, criterion_defined, describe
    c = {"hardware": {"price_per_gpu_hour": 3.6}, "executor": {"tensor_parallel": 2}}
    trace = pd.DataFrame({"num_output_tokens": [100, 300, 0]})   # 0 runs as 1 token: mean 401/3
    # 2 GPUs at $3.6/hour: $0.002/s; at 1 req/s, 401/3 output tok/s
    assert _cost_at_capacity(c, trace, 1.0) == {
        "usd_per_1m_output_tokens": approx(0.002 / (401 / 3) * 1e6),
        "usd_per_request": approx(0.002)}
    assert _cost_at_capacity({"hardware": {}}, trace, 1.0) == {}
    assert _cost_at_capacity(c, trace, 0.0) == {}
    assert criterion_defined({"e2e": 60.0}, "attainment")
    assert criterion_defined({"classes": {"batch": {"e2e": 60.0}}}, "attainment")
    assert not criterion_defined({"classes": {"chat": {"request_p99_tbt": 0.1}}}, "attainment")
    # a class listed without targets has none (its entry replaces the top-level ones)
    assert describe({"e2e": 60.0, "classes": {"batch": {}}}, "attainment") == \
        (">= 90% of requests meet class batch: no target; any other class: E2E <= 60 s "
         "(no TTFT target)")


def test_design_defines_the_service_figures():
    """Every key of the per-group, fairness, queue, cost and load sections is defined in
    sarathi_lab/DESIGN.md (as test_docs checks the others)."""
    import re
    from pathlib import Path
    design = (Path(__file__).resolve().parents[1] / "sarathi_lab/DESIGN.md").read_text()
    words = {w for d in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", design, flags=re.S))
             for w in re.split(r"[^\w]+", d) if w}
    s = summarize(scenario(), iterations_table([(0, 1.0, 4, 0, 1, 0, 0, 0, 3)]), slo=SLO,
                  price_per_gpu_hour=2.0)
    keys = set(s["classes"]["chat"]) | set(s["tenants"]["A"]) | set(s["fairness"]) | \
        set(s["queue"]) | set(s["cost"]) | {"classes", "tenants", "fairness", "queue", "cost",
                                             "load", "clients", "think_time", "client"}
    assert not sorted(k for k in keys if k not in words)


def test_report_table_has_the_new_columns(tmp_path):
    from sarathi_lab.report import run_table
    for name, clients in (("open", None), ("closed", 2)):
        cfg = instant_sim_cfg(SARATHI_8)
        cfg["hardware"]["price_per_gpu_hour"] = 3.6
        cfg["trace"] = {"name": "t", "path": None, "num_requests": 6, "qps": 50.0,
                        "prompt_len": 5, "output_len": 3, "clients": clients}
        run(cfg, tmp_path / name)
    t = run_table([tmp_path]).set_index("load_mode")
    assert t.loc["closed", "clients"] == 2 and np.isnan(t.loc["closed", "qps"])
    assert t.loc["open", "qps"] == 50.0
    for mode in ("open", "closed"):
        row = t.loc[mode]
        assert row["cost_usd_per_1m_output_tokens"] == approx(
            row["makespan_s"] / 3600 * 3.6 / (6 * 3) * 1e6)
        assert row["fairness_jain"] == 1.0 and row["queue_max"] >= 0


def test_summary_text_shows_the_largest_groups_only():
    from sarathi_lab.run.summary_text import MAX_GROUP_ROWS
    reqs = []
    for i in range(MAX_GROUP_ROWS + 5):   # tenant t00 has 2 requests, the others 1
        reqs.append(finished(i, 0.0, [1.0], f"t{i:02d}", "c"))
    reqs.append(finished(99, 0.0, [1.0], "t24", "c"))
    s = summarize(requests_table(reqs), iterations_table([]))
    s.update(wall_time_s=0.0, config={})
    text = format_summary(s)
    assert "... 5 more in summary.json (the 20 with the most requests shown)" in text
    assert "\nt24 " in text and "\nt00 " in text and "\nt23 " not in text
