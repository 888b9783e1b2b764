"""The service policies (sarathi_priority, edf, vtc) and admission control: exact admission
orders on hand-built scenarios, VTC's fairness bound, admission control's rule, and the CLI."""
import json

import numpy as np
import pandas as pd
import pytest
from conftest import LinearCost, make_policy
from helpers import TESTS, cli

from sarathi_lab.engine import Engine
from sarathi_lab.executors.base import StepResult
from sarathi_lab.metrics import requests_table, summarize
from sarathi_lab.request import Request, Status
from sarathi_lab.schedulers.vtc import TenantQueue

ALL = ["request_level", "orca", "vllm", "sarathi", "sarathi_priority", "edf", "vtc"]
SERVICE_TRACE = TESTS / "data" / "service_trace.csv"


def R(i, prompt, out, t=0.0, **service):
    return Request(i, t, prompt, out, **service)


def run(policy, reqs, ff=True, **cost):
    Engine(policy, LinearCost(**cost), fast_forward=ff).run(reqs)
    assert all(r.status is Status.FINISHED for r in reqs), reqs
    return reqs


def admission_order(reqs):
    return [r.request_id for r in sorted(reqs, key=lambda r: (r.first_scheduled_time,
                                                               r.request_id))]


def batch(out):
    return [(r.request_id, n) for r, n in zip(out.reqs, out.num_new_tokens)]


# -- sarathi_priority ------------------------------------------------------------------------------
def test_priority_admits_by_class_then_arrival():
    p = make_policy("sarathi_priority", max_num_seqs=1, aging_rate=0.0)
    reqs = [R(i, 20, 3, priority=c) for i, c in enumerate([1, 0, 2, 0, 1])]
    assert admission_order(run(p, reqs)) == [1, 3, 0, 4, 2]
    # Sarathi (FCFS) on the same requests: arrival order
    assert admission_order(run(make_policy("sarathi", max_num_seqs=1),
                               [R(i, 20, 3, priority=c) for i, c in enumerate([1, 0, 2, 0, 1])])
                           ) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("rate, order", [(0.0, [0, 2, 1]),    # strict: the later urgent one first
                                         (0.1, [0, 1, 2])])   # aged: 1 + 0.1*0.5 < 0 + 0.1*11
def test_aging_lets_a_low_class_request_pass_later_urgent_ones(rate, order):
    # request 0 holds the only seat until t ~ 12 s (1100 decodes of 0.011 s); 1 (class 1)
    # arrived at 0.5 s, 2 (class 0) at 11 s: with one class per 10 s of waiting, 1 ranks first
    p = make_policy("sarathi_priority", max_num_seqs=1, aging_rate=rate, max_model_len=2048)
    reqs = run(p, [R(0, 20, 1100, 0.0, priority=0), R(1, 20, 3, 0.5, priority=1),
                   R(2, 20, 3, 11.0, priority=0)])
    assert reqs[0].finish_time > 11.0 and admission_order(reqs) == order


def test_an_urgent_chunk_goes_before_a_started_lower_class_prompt():
    p = make_policy("sarathi_priority", token_budget=16)
    low, high = R(0, 64, 2, 0.0, priority=1), R(1, 8, 2, 0.01, priority=0)
    p.add_request(low)
    out = p.schedule(0.0)
    assert batch(out) == [(0, 16)]
    p.update(out, StepResult(0.02), 0.0, 0.02)
    p.add_request(high)
    assert batch(p.schedule(0.02)) == [(1, 8), (0, 8)]   # Sarathi: [(0, 16)], 1 waits


def preemption_case(**kw):
    # 0 (class 1) alone for 2 s holds ~55 of the 65 blocks; 1 (class 0) needs 15 to start
    p = make_policy("sarathi_priority", num_blocks=65, block_size=4, kv_watermark=0.0,
                    max_model_len=512, **kw)
    return p, run(p, [R(0, 40, 200, 0.0, priority=1), R(1, 60, 5, 2.0, priority=0)])


def test_an_urgent_request_preempts_a_lower_class_one():
    p, (low, high) = preemption_case()
    assert low.num_preemptions == 1 and high.num_preemptions == 0
    assert high.token_times[0] - 2.0 < 0.1 and high.finish_time < low.finish_time
    # without preemption it waits for the blocks the low one frees at its end
    p, (low, high) = preemption_case(priority_preemption=False)
    assert low.num_preemptions == 0 and high.token_times[0] > low.finish_time
    # aged past the newcomer (1 + 1.0*0 < 0 + 1.0*2): not a victim
    p, (low, high) = preemption_case(aging_rate=1.0)
    assert low.num_preemptions == 0 and high.token_times[0] > low.finish_time


def test_a_lower_class_arrival_never_preempts():
    p = make_policy("sarathi_priority", num_blocks=65, block_size=4, kv_watermark=0.0,
                    max_model_len=512)
    high, low = run(p, [R(0, 40, 200, 0.0, priority=0), R(1, 60, 5, 2.0, priority=1)])
    assert high.num_preemptions == 0 and low.token_times[0] > high.finish_time


# -- edf -------------------------------------------------------------------------------------------
def test_edf_admits_by_deadline_none_last():
    p = make_policy("edf", max_num_seqs=1)
    reqs = [R(0, 20, 3, deadline=5.0), R(1, 20, 3, deadline=1.0), R(2, 20, 3),
            R(3, 20, 3, deadline=3.0), R(4, 20, 3)]
    assert admission_order(run(p, reqs)) == [1, 3, 0, 2, 4]


def test_edf_gives_the_chunk_to_the_earlier_deadline():
    p = make_policy("edf", token_budget=16)
    late, soon = R(0, 64, 2, 0.0, deadline=9.0), R(1, 8, 2, 0.01, deadline=0.5)
    p.add_request(late)
    out = p.schedule(0.0)
    p.update(out, StepResult(0.02), 0.0, 0.02)
    p.add_request(soon)
    assert batch(p.schedule(0.02)) == [(1, 8), (0, 8)]


@pytest.mark.parametrize("name, queue", [("edf", "fcfs"), ("sarathi_priority", "edf"),
                                         ("vtc", "priority")])
def test_the_ranking_policies_fix_their_queue(name, queue):
    with pytest.raises(ValueError, match="scheduler.queue='.*': must be one of"):
        make_policy(name, queue=queue)


# -- vtc -------------------------------------------------------------------------------------------
def test_vtc_admits_from_the_least_served_tenant():
    # counters (w_p 1, w_q 2; one output token each): A0 -> A 102; B0 -> B 12, B1 -> B 24;
    # then only A is left
    reqs = [R(i, 100, 1, tenant="A") for i in range(4)] + \
           [R(4 + i, 10, 1, tenant="B") for i in range(2)]
    p = make_policy("vtc", max_num_seqs=1)
    assert admission_order(run(p, reqs)) == [0, 4, 5, 1, 2, 3]
    q = p.waiting
    assert (q.counter("A"), q.counter("B")) == (4 * 102, 24)


def lift_case():
    """A: six 100-token prompts at t=0 (0.11 s each); B: one 10-token prompt at t=0 (0.02 s),
    three at t=0.3, added after the 4th iteration (t=0.35), when A has 306 and B 12."""
    return [R(i, 100, 1, 0.0, tenant="A") for i in range(6)] + [R(6, 10, 1, 0.0, tenant="B")] + \
        [R(7 + i, 10, 1, 0.3, tenant="B") for i in range(3)]


def test_a_tenant_back_from_idle_is_lifted_to_the_backlogged_minimum():
    p = make_policy("vtc", max_num_seqs=1)
    reqs = run(p, lift_case())
    # B lifted 12 -> 306; tie with A broken by the older head: A3 first, then B's three
    assert admission_order(reqs) == [0, 6, 1, 2, 3, 7, 8, 9, 4, 5]
    q = p.waiting
    assert q.lift == {"B": 294.0} and q.counter("B") == 306 + 3 * 12
    # without the lift B's three would all go before A3 (its counter 12 < 306)
    p = make_policy("vtc", max_num_seqs=1)
    p.waiting = NoLift(1.0, 2.0)
    assert admission_order(run(p, lift_case())) == [0, 6, 1, 2, 7, 8, 9, 3, 4, 5]


class NoLift(TenantQueue):
    def _lifted(self, tenant):
        return 0.0


def test_with_nobody_backlogged_a_returning_tenant_meets_the_last_one_served():
    q = TenantQueue(1.0, 2.0)
    a = R(0, 100, 1, tenant="A")
    q.push(a)
    assert q.pop() is a and q.last_left == "A"
    q.prompt_tokens["A"] = 100
    b = R(1, 10, 1, tenant="B")
    q.push(b)
    assert q.counter("B") == 100.0 and q.peek() is b


def service(reqs, tenant, t, w_in=1.0, w_out=2.0):
    """Weighted tokens served to `tenant` by time t: prompts charged when first scheduled,
    output tokens when emitted (what VTC's counters count)."""
    mine = [r for r in reqs if r.tenant == tenant]
    return (w_in * sum(r.num_prompt_tokens for r in mine if r.first_scheduled_time < t)
            + w_out * sum(int(np.searchsorted(r.token_times, t, side="right")) for r in mine))


def service_gap(name):
    """Two tenants, both backlogged from t=0: A sends 40 prompts of 512 tokens, B 40 of 32,
    interleaved. The spread of W_A(0,t) - W_B(0,t) over the iteration ends t at which both
    still have requests never scheduled: the largest service difference over any interval in
    which both are backlogged. Also the paper's bound 2 * max(w_p * L, w_q * M)."""
    p = make_policy(name, num_blocks=64, block_size=16, max_model_len=1024, token_budget=512,
                    max_num_seqs=8)
    reqs = []
    for i in range(40):
        reqs += [R(2 * i, 512, 16, tenant="A"), R(2 * i + 1, 32, 16, tenant="B")]
    eng = Engine(p, LinearCost())
    eng.run(reqs)
    end = min(max(r.first_scheduled_time for r in reqs if r.tenant == t) for t in "AB")
    ends = [s + d for s, d in zip(eng.iters["start"], eng.iters["duration"]) if s + d < end]
    d = [service(reqs, "A", t) - service(reqs, "B", t) for t in ends]
    bound = 2 * max(1.0 * 512, 2.0 * 64 * 16)
    return max(d) - min(d), bound, len(ends)


def test_vtc_keeps_two_backlogged_tenants_within_the_papers_bound():
    gap, bound, n = service_gap("vtc")
    assert n > 20 and gap <= bound
    # FCFS on the same trace gives the tenant with long prompts far more
    gap, bound, _ = service_gap("sarathi")
    assert gap > 2 * bound


# -- admission control -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_a_bounded_queue_rejects_arrivals_that_find_it_full(name):
    p = make_policy(name, max_num_seqs=1, max_queue_len=2, token_budget=64,
                    max_num_batched_tokens=256)
    reqs = [R(i, 20, 3) for i in range(5)]
    Engine(p, LinearCost()).run(reqs)
    assert [r.status for r in reqs] == [Status.FINISHED] * 2 + [Status.REJECTED] * 3
    assert all(r.rejection_reason == "waiting queue full: 2 requests wait "
               "(scheduler.max_queue_len=2)" for r in reqs[2:])


def test_predicted_ttft_by_hand():
    # Sarathi, 100-token chunks of 0.01 + 0.1 s: 909.09 prefill tokens/s measured. Request 1
    # arrives at 0.15 and is seen at 0.22 (after two chunks of request 0): 0.07 s late, 100
    # tokens of 0 left plus its own 100 at 909.09/s: 0.07 + 0.22 = 0.29 s
    for rel, rejected in ((0.28, True), (0.30, False)):
        p = make_policy("sarathi", token_budget=100, deadline_admission=True, max_model_len=512)
        reqs = [R(0, 300, 5), R(1, 100, 5, 0.15, deadline=0.15 + rel)]
        Engine(p, LinearCost()).run(reqs)
        assert reqs[1].extra["predicted_ttft"] == pytest.approx(0.29)
        assert (reqs[1].status is Status.REJECTED) is rejected
        if rejected:
            assert reqs[1].rejection_reason == ("predicted TTFT 0.290s exceeds its deadline of "
                                                "0.280s (deadline_admission, 909 prefill "
                                                "tokens/s measured)")
    # before any prefill was measured only a deadline already past is refused
    p = make_policy("sarathi", deadline_admission=True, max_model_len=512)
    first = R(0, 300, 5, deadline=1e-9)
    Engine(p, LinearCost()).run([first])
    assert first.extra["predicted_ttft"] == 0.0 and first.status is Status.FINISHED


def overload(seed=0, n=120):
    """Arrivals at ~3x what the server can prefill, each due within 0.3 s, classes and tenants
    mixed."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(0.05, n))
    return [R(i, int(rng.integers(50, 400)), int(rng.integers(2, 20)), float(t[i]),
              deadline=float(t[i]) + 0.3, priority=int(i % 3 == 0), tenant="AB"[i % 2])
            for i in range(n)]


@pytest.mark.parametrize("name", ALL)
def test_admission_control_admits_no_predicted_miss_and_records_every_rejection(name):
    p = make_policy(name, deadline_admission=True, token_budget=128,
                    max_num_batched_tokens=512, max_model_len=512)
    reqs = overload()
    eng = Engine(p, LinearCost())
    eng.run(reqs)
    late = [r.arrival_time + r.extra["predicted_ttft"] > r.deadline for r in reqs]
    rejected = [r.status is Status.REJECTED for r in reqs]
    assert late == rejected and 10 < sum(rejected) < len(reqs) - 10
    assert all(r.rejection_reason.startswith("predicted TTFT") for r in reqs if r.status
               is Status.REJECTED)
    assert all(r.status is Status.FINISHED for r in reqs if r.status is not Status.REJECTED)
    # every rejection is a miss: attainment over all requests, rejected ones included
    s = summarize(requests_table(reqs, eng.output_lens), pd.DataFrame(eng.iters),
                  slo={"ttft": 0.3})
    met = sum(r.status is Status.FINISHED and r.token_times[0] - r.arrival_time <= 0.3
              for r in reqs)
    assert s["num_rejected"] == sum(rejected)
    assert s["slo"]["attainment"] == met / len(reqs)
    assert s["slo"]["goodput_rps"] == pytest.approx(met / s["makespan_s"])


@pytest.mark.parametrize("name", ALL)
def test_admission_control_is_exact_under_fast_forward(name):
    runs = []
    for ff in (True, False):
        p = make_policy(name, deadline_admission=True, max_queue_len=6, token_budget=128,
                        max_num_batched_tokens=512, max_model_len=512)
        reqs = overload(seed=1, n=60)
        Engine(p, LinearCost(per_ctx=1e-5), fast_forward=ff).run(reqs)
        runs.append([(r.status, r.rejection_reason, r.token_times) for r in reqs])
    assert runs[0] == runs[1]


# -- the command line ------------------------------------------------------------------------------
@pytest.mark.slow   # a CLI subprocess
@pytest.mark.parametrize("name", ["sarathi_priority", "edf", "vtc"])
def test_each_policy_runs_from_the_cli_on_a_trace_with_service_columns(tmp_path, name):
    r = cli(f"hydra.run.dir={tmp_path}/run", f"scheduler={name}", f"trace.path={SERVICE_TRACE}",
            "trace.qps=null", "trace.num_requests=null", "scheduler.deadline_admission=true",
            "scheduler.max_queue_len=8", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["settings"]["scheduler"]["class"].endswith(
        {"sarathi_priority": "SarathiPriority", "edf": "EDF", "vtc": "VTC"}[name])
    # the queue the policy really used, not the plain one its setting names
    assert s["settings"]["scheduler"]["queue"].endswith(
        {"sarathi_priority": "AgingPriorityQueue", "edf": "DeadlineQueue",
         "vtc": "TenantQueue"}[name])
    assert s["num_requests"] == 40 and s["num_finished"] + s["num_rejected"] == 40
    rq = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert rq.loc[rq["status"] == "rejected", "rejection_reason"].notna().all()


@pytest.mark.parametrize("name, queue", [("edf", "DeadlineQueue"), ("sarathi", "RequestQueue")])
def test_without_a_queue_key_the_policy_default_queue_is_resolved(name, queue):
    from helpers import composed

    from sarathi_lab.run.config import resolve
    from sarathi_lab.run.runner import build
    c = composed(f"scheduler={name}")
    c["scheduler"].pop("queue")
    r = resolve(c)
    assert r.queue_cls.__name__ == queue
    assert type(build(c, r)[0].waiting).__name__ == queue


@pytest.mark.slow   # a CLI subprocess
def test_a_policy_knob_of_another_policy_is_an_error(tmp_path):
    r = cli(f"hydra.run.dir={tmp_path}/run", "scheduler=edf", "scheduler.aging_rate=0.5",
            cwd=tmp_path)
    assert r.returncode != 0 and "scheduler.aging_rate" in r.stderr


def test_queues_say_who_would_be_admitted_ahead_of_an_arrival():
    from sarathi_lab.schedulers.queues import PriorityQueue, RequestQueue
    waiting = [R(0, 10, 1, 0.0, priority=1), R(1, 10, 1, 0.1, priority=0),
               R(2, 10, 1, 0.2, priority=1)]
    new = R(3, 10, 1, 0.3, priority=0)
    fcfs, prio = RequestQueue(), PriorityQueue()
    for r in waiting:
        fcfs.push(r)
        prio.push(r)
    assert [r.request_id for r in fcfs.ahead(new)] == [0, 1, 2]
    assert [r.request_id for r in prio.ahead(new)] == [1]
    # vtc: A has been served 100, B nothing, so B's first arrival is lifted to 100 and ties
    # with A, whose head is older: A's request first, then B's two
    q = TenantQueue(1.0, 2.0)
    q.prompt_tokens["A"] = 100
    a = R(0, 50, 1, 0.0, tenant="A")
    q.push(a)
    b1, b2 = R(1, 120, 1, 0.1, tenant="B"), R(2, 10, 1, 0.2, tenant="B")
    assert q.ahead(b1) == [a] and q.counter("B") == 0   # asking pushes nothing, lifts nothing
    q.push(b1)   # lifted to A's 100
    assert q.counter("B") == 100.0
    assert q.ahead(b2) == [a, b1] and list(q) == [a, b1]
