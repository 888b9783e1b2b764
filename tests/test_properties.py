"""Policy invariants over random small traces and configurations (Hypothesis).

Each example builds a policy and an executor from a config dict (`runner.build`), runs the engine
with and without fast-forward, and checks what must hold whatever the trace: budgets and
max_num_seqs respected, every request accounted for, outputs of exactly the length asked, time
moving forward, every KV block back at the end, and fast-forward changing nothing.
"""
import numpy as np
from conftest import only_read
from helpers import TokenCost
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sarathi_lab.engine import Engine
from sarathi_lab.metrics import iterations_table
from sarathi_lab.request import Request, Status
from sarathi_lab.run.runner import build

POLICIES = ["request_level", "orca", "vllm", "sarathi", "sarathi_priority", "edf", "vtc"]
RESERVES_KV = {"request_level", "orca"}


def cdiv(a, b):
    return -(-a // b)


@st.composite
def configs(draw):
    name = draw(st.sampled_from(POLICIES))
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    max_model_len = draw(st.sampled_from([8, 16, 32, 64]))
    # build() refuses a cache that cannot hold one request: of max_model_len tokens when it is
    # reserved up front, else of 2 (one prompt token and one output)
    least = cdiv(max_model_len if name in RESERVES_KV else 2, block_size)
    sched = {
        "name": name, "block_size": block_size, "max_model_len": max_model_len,
        # from barely one request to a few: small caches are where preemption happens
        "num_kv_blocks": draw(st.integers(least, least + 2 * cdiv(max_model_len, block_size))),
        "max_num_seqs": draw(st.integers(1, 12)),
        "token_budget": draw(st.integers(1, 48)),
        # whole-prompt policies need room for the longest prompt
        "max_num_batched_tokens": draw(st.integers(max_model_len, 2 * max_model_len)),
        "enable_prefix_caching": name not in RESERVES_KV and draw(st.booleans()),
        "kv_watermark": draw(st.sampled_from([0.0, 0.01, 0.1, 0.3])),
        # admission control, for every policy
        "max_queue_len": draw(st.none() | st.integers(1, 4)),
        "deadline_admission": draw(st.booleans()),
    }
    if name == "sarathi_priority":
        sched["aging_rate"] = draw(st.sampled_from([0.0, 1.0, 30.0]))
        sched["priority_preemption"] = draw(st.booleans())
    if name == "vtc":
        sched["input_weight"] = draw(st.sampled_from([0.0, 1.0, 0.3]))
        sched["output_weight"] = draw(st.sampled_from([0.0, 2.0, 1.7]))
    return {"scheduler": only_read(sched),
            # durations that grow with the context: fast-forward has something to get wrong
            "executor": {"name": f"{TokenCost.__module__}:TokenCost", "base": 0.01,
                         "per_token": 1e-3, "per_ctx": draw(st.sampled_from([0.0, 1e-5]))},
            "model": {"name": "toy", "max_model_len": max_model_len}}


# Two base prompts whose prefixes recur, so prefix caching finds hits.
BASES = [list(range(100, 200)), [7] * 8 + list(range(300, 392))]


@st.composite
def traces(draw, max_model_len):
    n = draw(st.integers(1, 10))
    # mostly bursts: requests that run together compete for KV and seats
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.0, 0.003, 0.02, 0.1]), min_size=n,
                         max_size=n))
    out = []
    for i, t in enumerate(np.cumsum(gaps)):
        # prompts up to and past max_model_len: some requests must be rejected
        prompt = draw(st.integers(1, max_model_len + 2))
        base = BASES[draw(st.integers(0, 1))]
        out.append(dict(request_id=i, arrival_time=float(t), num_prompt_tokens=prompt,
                        output_len=draw(st.integers(1, 30)),
                        max_tokens=draw(st.none() | st.integers(1, 20)),
                        prompt_token_ids=base[:prompt],
                        # service fields for the policies that rank by them
                        priority=draw(st.integers(0, 2)), tenant=draw(st.sampled_from("ab")),
                        deadline=draw(st.none() | st.floats(0.0, 0.5).map(lambda d: t + d))))
    return out


def run(cfg, spec, fast_forward):
    policy, executor = build(cfg)
    reqs = [Request(**s) for s in spec]
    targets = {s["request_id"]: s["output_len"] for s in spec}
    eng = Engine(policy, executor, fast_forward=fast_forward)
    eng.run(reqs)
    return policy, reqs, iterations_table(eng.iterations()), targets


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_policy_invariants(data):
    cfg = data.draw(configs(), label="config")
    sc = cfg["scheduler"]
    spec = data.draw(traces(sc["max_model_len"]), label="trace")
    policy, reqs, it, targets = run(cfg, spec, fast_forward=False)
    event(f'{sc["name"]}: {"preempted" if it["preemptions"].any() else "no preemption"}')
    event("rejected" if any(r.status is Status.REJECTED for r in reqs) else "none rejected")

    tokens = it["prefill_tokens"] + it["decode_tokens"]
    budget = policy.token_limit()
    assert (tokens <= budget).all() and (tokens >= 1).all()
    assert (it["num_requests"] <= sc["max_num_seqs"]).all()
    assert (it["duration"] > 0).all() and (np.diff(it["start"]) > 0).all()
    assert it["preemptions"].sum() == sum(r.num_preemptions for r in reqs)
    for r in reqs:
        assert r.status in (Status.FINISHED, Status.REJECTED), r
        if r.status is Status.REJECTED:
            assert r.rejection_reason
            continue
        out_len = max(targets[r.request_id], 1)
        target = min(out_len, r.max_tokens or out_len, sc["max_model_len"] - r.num_prompt_tokens)
        assert r.num_output_tokens == len(r.token_times) == target
        assert r.arrival_time <= r.first_scheduled_time < r.token_times[0]
        assert all(a < b for a, b in zip(r.token_times, r.token_times[1:]))
        assert r.finish_time == r.token_times[-1]
    fin = [r for r in reqs if r.status is Status.FINISHED]
    if not (sc["enable_prefix_caching"] or it["preemptions"].any()
            or any(r.first_scheduled_time is not None for r in reqs if r not in fin)):
        # nothing cached, recomputed or abandoned: each prompt computed once, then one decode
        # per output token after the first
        assert it["prefill_tokens"].sum() == sum(r.num_prompt_tokens for r in fin)
        assert it["decode_tokens"].sum() == sum(r.num_output_tokens - 1 for r in fin)
    # a prompt that leaves no room to generate is the one rejection every config must make
    assert all(r.status is Status.REJECTED for r in reqs
               if r.num_prompt_tokens >= sc["max_model_len"])
    kv = policy.kv
    assert not policy.waiting and not policy.running and not kv.req_blocks
    assert kv.num_free_blocks == kv.num_blocks and kv.num_stored_tokens == 0

    # fast-forward skips steady decode runs; it must produce exactly the same run
    _, reqs_ff, it_ff, _ = run(cfg, spec, fast_forward=True)
    for a, b in zip(reqs, reqs_ff):
        assert (a.status, a.num_output_tokens, a.num_preemptions, a.first_scheduled_time,
                a.finish_time, a.finish_reason) == \
            (b.status, b.num_output_tokens, b.num_preemptions, b.first_scheduled_time,
             b.finish_time, b.finish_reason)
        assert a.token_times == b.token_times
    np.testing.assert_array_equal(it.to_numpy(), it_ff.to_numpy())
