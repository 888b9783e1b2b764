import random

import numpy as np
import pytest
from conftest import LinearCost, make_policy, req
from helpers import add, step

from sarathi_lab.engine import Engine
from sarathi_lab.request import Status

POLICIES = ["request_level", "orca", "vllm", "sarathi"]


def test_sarathi_decodes_first_then_partial_then_new_chunk():
    p, ex = make_policy("sarathi", token_budget=8, max_model_len=64), LinearCost()
    for i, n in enumerate([6, 6, 20]):
        add(p, ex, req(i, n, 5))
    assert step(p, ex) == [(0, 6), (1, 2)]            # C waits: budget spent
    assert step(p, ex) == [(0, 1), (1, 4), (2, 3)]    # A decodes, B's next chunk, C's first
    assert step(p, ex) == [(0, 1), (1, 1), (2, 6)]    # two decodes, C chunked to what is left
    assert step(p, ex) == [(0, 1), (1, 1), (2, 6)]
    assert step(p, ex) == [(0, 1), (1, 1), (2, 5)]    # C's last chunk: 20 = 3 + 6 + 6 + 5


def test_vllm_prefill_only_batch_stalls_decodes():
    p, ex = make_policy("vllm", max_num_batched_tokens=12, max_model_len=12), LinearCost()
    add(p, ex, req(0, 6, 5))
    add(p, ex, req(1, 6, 5))
    assert step(p, ex) == [(0, 6), (1, 6)]
    assert step(p, ex) == [(0, 1), (1, 1)]
    add(p, ex, req(2, 7, 5))
    assert step(p, ex) == [(2, 7)]                    # decodes of 0 and 1 stall
    assert step(p, ex) == [(0, 1), (1, 1), (2, 1)]


def test_vllm_prefill_batch_respects_token_cap():
    p, ex = make_policy("vllm", max_num_batched_tokens=12, max_model_len=12), LinearCost()
    for i in range(3):
        add(p, ex, req(i, 5, 3))
    assert step(p, ex) == [(0, 5), (1, 5)]            # 15 tokens would exceed 12
    assert step(p, ex) == [(2, 5)]


def test_orca_hybrid_batch_with_whole_prefills():
    p, ex = make_policy("orca", max_model_len=64), LinearCost()
    add(p, ex, req(0, 6, 5))
    add(p, ex, req(1, 6, 5))
    assert step(p, ex) == [(0, 6), (1, 6)]
    add(p, ex, req(2, 30, 5))
    assert step(p, ex) == [(0, 1), (1, 1), (2, 30)]   # whole prompt beside the decodes
    # KV reserved up front: max_model_len per request (no max_tokens cap)
    assert p.kv.num_used_blocks == 3 * 64 // 4


def test_request_level_no_admission_while_batch_runs():
    p, ex = make_policy("request_level", max_model_len=32), LinearCost()
    add(p, ex, req(0, 4, 2))
    add(p, ex, req(1, 4, 4))
    assert step(p, ex) == [(0, 4), (1, 4)]
    add(p, ex, req(2, 4, 1))
    assert step(p, ex) == [(0, 1), (1, 1)]            # 0 finishes here
    assert step(p, ex) == [(1, 1)]                    # 2 still waits
    assert step(p, ex) == [(1, 1)]                    # 1 finishes
    assert step(p, ex) == [(2, 4)]


@pytest.mark.parametrize("name", ["vllm", "sarathi"])
def test_preemption_by_recompute_under_tiny_kv(name):
    # 6 blocks of 4 tokens: two 8-token prompts fit, but not both at 16+ tokens
    p = make_policy(name, num_blocks=6, max_model_len=24, token_budget=32,
                    max_num_batched_tokens=32)
    reqs = [req(0, 8, 10), req(1, 8, 10)]
    Engine(p, LinearCost(), fast_forward=False).run(reqs)
    assert all(r.status is Status.FINISHED and r.num_output_tokens == 10 for r in reqs)
    assert reqs[1].num_preemptions >= 1 and reqs[0].num_preemptions == 0   # newest goes first
    assert p.kv.num_free_blocks == 6


def test_request_too_large_is_rejected_not_looped():
    p = make_policy("sarathi", num_blocks=4, max_model_len=64)
    big, ok = req(0, 20, 3), req(1, 4, 3)
    Engine(p, LinearCost()).run([big, ok])
    assert big.status is Status.REJECTED and "KV blocks" in big.rejection_reason
    assert ok.status is Status.FINISHED
    # one that fits at first but outgrows the whole cache while decoding
    p = make_policy("vllm", num_blocks=4, max_model_len=64, max_num_batched_tokens=64)
    grow = req(0, 10, 30)
    Engine(p, LinearCost()).run([grow])
    assert grow.status is Status.REJECTED and "grew" in grow.rejection_reason
    assert grow.num_output_tokens == 7 and p.kv.num_free_blocks == 4


def test_prompt_beyond_max_model_len_rejected():
    p = make_policy("orca", max_model_len=16)
    r = req(0, 16, 2)
    Engine(p, LinearCost()).run([r])
    assert r.status is Status.REJECTED and "max_model_len" in r.rejection_reason


def test_output_stops_at_max_model_len_and_max_tokens():
    # a prompt of 10 + an output of 50 cannot fit max_model_len=16: rejected, with its reason,
    # unless the run asks for outputs to be capped (then it ends after 6 tokens, marked)
    p = make_policy("sarathi", max_model_len=16)
    a, b = req(0, 10, 50), req(1, 4, 50, max_tokens=3)
    Engine(p, LinearCost()).run([a, b])
    assert a.status is Status.REJECTED and "exceeds max_model_len=16" in a.rejection_reason
    assert b.num_output_tokens == 3 and b.finish_reason == "max_tokens"
    p = make_policy("sarathi", max_model_len=16)
    a, b = req(0, 10, 50), req(1, 4, 50, max_tokens=3)
    Engine(p, LinearCost(), overlong="cap").run([a, b])
    assert a.num_output_tokens == 6 and a.finish_reason == "max_model_len"
    assert b.num_output_tokens == 3 and b.finish_reason == "max_tokens"
    from sarathi_lab.metrics import iterations_table, requests_table, summarize
    rq = requests_table([a, b])
    assert list(rq["status"]) == ["length_capped", "finished"]
    s = summarize(rq, iterations_table([]))
    assert (s["num_finished"], s["num_length_capped"], s["num_rejected"]) == (1, 1, 0)


@pytest.mark.slow   # a CLI subprocess
def test_overlong_reject_through_the_cli_is_counted_and_capped_runs_say_so(tmp_path):
    import json

    from helpers import cli
    args = ("trace=synthetic", "trace.num_requests=10", "trace.prompt_len=100",
            "trace.output_len=50", "scheduler.max_model_len=120")
    r = cli(f"hydra.run.dir={tmp_path}/a", *args, cwd=tmp_path)
    assert r.returncode == 1 and "ALL 10 REQUESTS WERE REJECTED" in r.stdout
    r = cli(f"hydra.run.dir={tmp_path}/b", *args, "overlong=cap", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert (s["num_finished"], s["num_length_capped"]) == (0, 10)
    assert "10 cut short at max_model_len" in r.stdout


def test_policy_may_not_read_true_output_length():
    from sarathi_lab.schedulers.sarathi import Sarathi

    class Peek(Sarathi):
        seen = {}

        def schedule(self, now):
            for r in self.waiting:
                self.seen[r.request_id] = self.oracle_output_len(r)
            return super().schedule(now)

    class Oracle(Peek):
        oracle = True

    r = req(0, 4, 9)
    p = make_policy("sarathi")
    Engine(p, LinearCost()).run([r])
    with pytest.raises(PermissionError):
        p.oracle_output_len(r)
    assert not hasattr(r, "_stop_len") and r.take_output_len() is None
    kv = make_policy("sarathi").kv
    with pytest.raises(PermissionError, match="Peek.*oracle = True"):
        Engine(Peek(Peek.config_class(), kv), LinearCost()).run([req(1, 4, 9)])
    o = Oracle(Oracle.config_class(), make_policy("sarathi").kv)
    Engine(o, LinearCost()).run([req(2, 4, 9)])
    assert Oracle.seen == {2: 9}


def random_trace(rng, n=40):
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(20.0)
        out.append(req(i, rng.randint(1, 60), rng.randint(1, 40), t))
    return out


# The invariants over random traces and configurations are properties in test_properties.py;
# these are fixed examples where fast-forward must really skip.
@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("blocks,seqs", [(300, 128), (60, 128), (300, 3)])
def test_fast_forward_is_exact(name, blocks, seqs):
    # (60, 128): the queue head is often blocked by KV; (300, 3): by max_num_seqs
    def go(ff):
        p = make_policy(name, num_blocks=blocks, max_model_len=128, token_budget=32,
                        max_num_batched_tokens=128, max_num_seqs=seqs)
        reqs = random_trace(random.Random(7), 30)
        eng = Engine(p, LinearCost(per_ctx=1e-5), fast_forward=ff)
        calls, schedule = [], p.schedule
        p.schedule = lambda now: calls.append(now) or schedule(now)
        eng.run(reqs)
        if ff:   # the skip really happened: fewer schedule() calls than iterations
            assert len(calls) < eng.num_iterations
        return reqs, eng.iters
    (a, ia), (b, ib) = go(False), go(True)
    for x, y in zip(a, b):
        assert x.num_output_tokens == y.num_output_tokens
        np.testing.assert_allclose(x.token_times, y.token_times, rtol=1e-12)
    for col in ia:
        np.testing.assert_allclose(ia[col], ib[col], rtol=1e-12, err_msg=col)


def test_invalid_configs_name_the_setting():
    with pytest.raises(ValueError, match="token_budget"):
        make_policy("sarathi", token_budget=0)
    with pytest.raises(ValueError, match="block_size"):
        make_policy("sarathi", block_size=12)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        make_policy("vllm", max_num_batched_tokens=100, max_model_len=256)
    with pytest.raises(ValueError, match="unknown scheduler 'fcfs'.*sarathi"):
        make_policy("fcfs")
    with pytest.raises(ValueError, match="scheduler.token_budget.*not a setting of policy 'vllm'"):
        make_policy("vllm", token_budget=128, strict=True)
