"""scheduler.sliding_window_kv: the KV manager frees the blocks a windowed model no longer reads
(sarathi_lab/kv/window.py): by hand on a tiny scenario, randomized against the window's reads,
in a simulation of long prompts on Mistral-7B, and the combinations it refuses."""
import json
import random

import pytest
from helpers import cli, composed
from hypothesis import given, settings
from hypothesis import strategies as st

from sarathi_lab.kv import NULL, WindowedKVCacheManager
from sarathi_lab.request import Request
from sarathi_lab.run.runner import build, run
from sarathi_lab.settings import ConfigError


def decode(kv, r, steps):
    """`steps` decodes of one token each; the blocks held after each."""
    held = []
    for _ in range(steps):
        assert kv.allocate_decodes([r])
        r.num_computed_tokens += 1
        held.append(kv.num_used_blocks)
    return held


def test_by_hand_whole_prompt():
    # block_size 4, window 8 (a query at p reads p - 7 .. p), a 40-token prompt in one step:
    # positions 0..39 fill blocks 0..9, all read by that step (query 0 reads key 0)
    kv = WindowedKVCacheManager(32, 4, window=8, max_model_len=64)
    r = Request(0, 0.0, 40, 10)
    assert kv.admission_blocks(r) == 10
    assert kv.allocate_slots(r, 40) == list(range(10))
    r.num_computed_tokens = 40
    assert kv.num_used_blocks == 10
    # decode at context c (the query at position c) reads c - 7 .. c: blocks (c - 7) // 4 ..
    # c // 4. c = 40: 33..40, blocks 8, 9, 10 (one new); c = 43: 36..43, blocks 9, 10;
    # c = 44: 37..44, blocks 9, 10, 11 (new); c = 47: 40..47, blocks 10, 11; c = 48: 41..48,
    # blocks 10, 11, 12 (new); c = 49: 42..49, the same
    assert decode(kv, r, 10) == [3, 3, 3, 2, 3, 3, 3, 2, 3, 3]
    table = kv.block_table(r)
    assert table[:10] == [-1] * 10 and -1 not in table[10:] and len(table) == 13
    # tokens whose KV is held: positions 40..49 in blocks 10..12 (the rest left the window)
    assert kv.num_stored_tokens == 50 - 40
    assert kv.held_slots([r]) == [13 * 4]   # the table's logical length: 52 slots
    assert kv.held_blocks(0) == 3
    kv.free(r)
    assert kv.num_used_blocks == 0 and kv.num_free_blocks == 32 and kv.num_stored_tokens == 0


def test_by_hand_chunks():
    # chunks of at most 16 tokens: a step at c..c+15 reads c - 7 .. c + 15, 23 positions,
    # at most cdiv(8 + 16 - 2, 4) + 1 = 7 blocks; the 40-token prompt's footprint min(10, 7)
    kv = WindowedKVCacheManager(32, 4, window=8, max_model_len=64, max_chunk=16)
    assert kv.cap == 7
    r = Request(0, 0.0, 40, 10)
    assert kv.admission_blocks(r) == 7 and kv.min_blocks(r) == 7
    assert kv.allocate_slots(r, 16, lookahead=24) == [0, 1, 2, 3]   # 3 more kept aside
    assert kv.num_used_blocks == 7 and kv.held_blocks(0) == 7
    r.num_computed_tokens = 16
    # c = 16 reads 9..31: blocks 2..7; blocks 0, 1 leave and go into the table again
    assert kv.allocate_slots(r, 16) == []
    assert kv.block_table(r) == [-1, -1, 2, 3, 0, 1, 4, 5] and kv.num_used_blocks == 7
    r.num_computed_tokens = 32
    # the last chunk (c = 32 reads 25..39: blocks 6..9): what is aside goes back
    assert kv.allocate_slots(r, 8) == []
    assert kv.block_table(r) == [-1] * 6 + [4, 5, 2, 3] and kv.num_used_blocks == 4
    r.num_computed_tokens = 40
    assert decode(kv, r, 10) == [3, 3, 3, 2, 3, 3, 3, 2, 3, 3]
    # a decode reads `window` positions: at most cdiv(8 - 1, 4) + 1 = 3 blocks
    kv.free(r)
    assert kv.num_free_blocks == 32


def test_short_context_unchanged():
    """Within the window nothing is freed: the paged manager's blocks, the same counts."""
    kv = WindowedKVCacheManager(32, 4, window=64, max_model_len=128)
    r = Request(0, 0.0, 20, 10)
    assert kv.admission_blocks(r) == 5
    kv.allocate_slots(r, 20)
    r.num_computed_tokens = 20
    assert decode(kv, r, 10) == [6, 6, 6, 6, 7, 7, 7, 7, 8, 8]


def test_refuses_what_it_does_not_support():
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        WindowedKVCacheManager(8, 4, window=8, max_model_len=64, enable_prefix_caching=True)
    with pytest.raises(ValueError, match="reserves"):
        WindowedKVCacheManager(8, 4, window=8, max_model_len=64, reserve=True)
    with pytest.raises(ValueError, match="preemption_mode=swap"):
        WindowedKVCacheManager(8, 4, window=8, max_model_len=64, num_host_blocks=4)
    kv = WindowedKVCacheManager(8, 4, window=8, max_model_len=64)
    with pytest.raises(NotImplementedError, match="disaggregated"):
        kv.retain(Request(0, 0.0, 4, 1))


# -- randomized: no block freed while a read needs it, none lost ------------------------------
def check_reads(kv, r, n):
    """The step computing r's positions c .. c + n - 1 reads keys max(0, c - W + 1) .. c + n - 1:
    each of their blocks is in r's table, live, and r's alone."""
    bs, c = kv.block_size, r.num_computed_tokens
    table = kv.req_blocks[r.request_id]
    for b in range(max(0, c - kv.window + 1) // bs, (c + n - 1) // bs + 1):
        assert table[b] is not NULL, (r.request_id, c, n, b)
        assert not kv.pool.is_free(table[b])


def check_pool(kv, running):
    live = [b for r in running for b in kv.req_blocks[r.request_id] if b is not NULL]
    live += [b for blocks, _ in kv._ahead.values() for b in blocks]
    assert len({id(b) for b in live}) == len(live), "a block in two places"
    assert kv.num_used_blocks == len(live) == sum(kv.held_blocks(r.request_id) for r in running)
    assert kv.num_used_blocks + kv.num_free_blocks == kv.num_blocks
    bs = kv.block_size
    assert kv.num_stored_tokens == sum(r.num_computed_tokens - kv.dropped.get(r.request_id, 0)
                                       * bs for r in running)
    for r in running:   # never more than the derived bound (kv/window.py)
        assert kv.held_blocks(r.request_id) <= kv.footprint(r.num_tokens)


@settings(max_examples=60, deadline=None)
@given(bs=st.sampled_from([1, 2, 4, 8]), window=st.integers(1, 40),
       max_chunk=st.integers(3, 24), extra=st.integers(0, 40), seed=st.integers(0, 10**6),
       lens=st.lists(st.tuples(st.integers(1, 90), st.integers(1, 30)), min_size=1, max_size=8))
def test_random_schedules(bs, window, max_chunk, extra, seed, lens):
    rng = random.Random(seed)
    kv = WindowedKVCacheManager(1, bs, window=window, max_model_len=256, max_chunk=max_chunk)
    need = max(kv.footprint(p + o) for p, o in lens)
    kv = WindowedKVCacheManager(need + extra, bs, window=window, max_model_len=256,
                                max_chunk=max_chunk)
    waiting = [Request(i, 0.0, p) for i, (p, _) in enumerate(lens)]
    outs = dict(enumerate(o for _, o in lens))
    running, done = [], 0

    def advance(r, n):   # n tokens computed; one sampled when the request catches up
        r.num_computed_tokens += n
        if r.num_computed_tokens == r.num_tokens:
            r.num_output_tokens += 1
            if r.num_output_tokens >= outs[r.request_id]:
                kv.free(r)
                running.remove(r)
                return 1
        return 0

    for _ in range(5000):
        if not waiting and not running:
            break
        if waiting and rng.random() < 0.5:
            r = waiting[0]
            if kv.admission_blocks(r) <= kv.num_free_blocks:
                todo = r.num_tokens - r.num_computed_tokens
                n = rng.randint(1, min(todo, max_chunk))
                assert kv.allocate_slots(r, n, lookahead=todo - n) is not None
                check_reads(kv, r, n)
                waiting.pop(0)
                running.append(r)
                done += advance(r, n)
                check_pool(kv, running)
        for r in list(running):
            todo = r.num_tokens - r.num_computed_tokens
            if not r.num_output_tokens or todo > 1:   # a prompt chunk (a recompute's too)
                n = rng.randint(1, min(todo, max_chunk))
                assert kv.allocate_slots(r, n) == [], "a later chunk took blocks from the pool"
                check_reads(kv, r, n)
                done += advance(r, n)
                check_pool(kv, running)
                continue
            drafts = rng.randint(0, min(2, max_chunk - 1))
            if kv.allocate_slots(r, 1 + drafts) is None:   # preempt it (recompute)
                kv.free(r)
                running.remove(r)
                r.num_computed_tokens = 0
                waiting.insert(0, r)
                check_pool(kv, running)
                continue
            check_reads(kv, r, 1 + drafts)
            accepted = rng.randint(0, drafts)
            r.num_computed_tokens += accepted   # the drafts kept; advance adds the token
            r.num_output_tokens += accepted
            kv.release_slots(r, drafts - accepted)
            done += advance(r, 1)
            check_pool(kv, running)
    assert done == len(lens)
    assert kv.num_free_blocks == kv.num_blocks and kv.num_used_blocks == 0
    assert kv.num_stored_tokens == 0 and not kv.req_blocks and not kv._ahead and not kv.dropped


# -- through the run layer ------------------------------------------------------------------
LONG = ["model=mistral-7b", "scheduler=vllm", "trace=synthetic", "trace.num_requests=16",
        "trace.qps=100", "trace.prompt_len.low=6000", "trace.prompt_len.high=9000",
        "trace.output_len.low=1500", "trace.output_len.high=2500", "slo=none",
        "scheduler.num_kv_blocks=2500", "progress=false"]


def summary(tmp_path, *over):
    out = tmp_path / "-".join(over).replace("=", "_")
    run(composed(*LONG, *over), out)
    return json.loads((out / "summary.json").read_text())


def test_long_prompts_on_mistral(tmp_path):
    """2500 blocks of 16 tokens hold ~4 contexts of 7.5-11.5k tokens (prompt and output); a
    request past Mistral's 4096-token window holds at most cdiv(4095, 16) + 1 = 257 blocks once
    it decodes (measured: 5 running at most and 4 preemptions without, 8 and none with)."""
    off = summary(tmp_path, "scheduler.sliding_window_kv=false")
    on = summary(tmp_path, "scheduler.sliding_window_kv=true")
    assert off["num_finished"] == on["num_finished"] == 16
    assert on["batch"]["requests_max"] > off["batch"]["requests_max"]
    assert on["preemptions"] < off["preemptions"]
    assert on["makespan_s"] < off["makespan_s"]
    assert on["fast_forward"]["enabled"] is False
    assert "sliding_window_kv" in on["fast_forward"]["why_not"]
    assert on["config"]["scheduler"]["sliding_window_kv"] is True


@pytest.mark.parametrize("over, match", [
    (["model=llama-2-7b"], "^scheduler.sliding_window_kv=true: model 'llama-2-7b' has no "
     "sliding window"),
    (["model=hf", "model.hf_config=gemma-2-9b", "slo=hf-strict"],
     "global \\(full-attention\\) layers"),
    (["model=hf", "model.hf_config=gpt-oss-20b", "slo=hf-strict"],
     "global \\(full-attention\\) layers"),
    (["model=mistral-7b", "scheduler.enable_prefix_caching=true"], "enable_prefix_caching"),
    (["model=mistral-7b", "scheduler.preemption_mode=swap"], "preemption_mode=swap"),
    (["model=mistral-7b", "scheduler=orca"], "policy 'orca' reserves each request's whole"),
    (["model=mistral-7b", "scheduler=request_level"],
     "policy 'request_level' reserves each request's whole"),
    (["model=tiny-llama", "model.sliding_window=32", "executor=torch"],
     "executor TorchExecutor does not support it"),
])
def test_refused(over, match):
    with pytest.raises(ConfigError, match=match):
        build(composed(*over, "scheduler.sliding_window_kv=true"))


def test_refused_for_disaggregated_pools():
    from sarathi_lab.run.config import resolve
    with pytest.raises(ConfigError, match="cluster.prefill.scheduler.sliding_window_kv=true"):
        resolve(composed("model=mistral-7b", "cluster=disagg",
                         "scheduler.sliding_window_kv=true"))


def test_built_for_mistral_with_the_policy_chunk():
    """The run layer's manager: Mistral's window, the policy's batch cap as the chunk bound
    (sarathi's token_budget 512: cdiv(4096 + 512 - 2, 16) + 1 = 289 blocks at most). Attention
    sinks (GPT-OSS's: a learned logit per head) hold no KV, so nothing more is kept for them."""
    for over in ([], ["+model.attention_sinks=true"]):
        policy, _ = build(composed("model=mistral-7b", "scheduler=sarathi", *over,
                                   "scheduler.sliding_window_kv=true"))
        kv = policy.kv
        assert isinstance(kv, WindowedKVCacheManager)
        assert (kv.window, kv.max_chunk, kv.cap) == (4096, 512, 289)
        assert policy.fast_forward is None
    policy, _ = build(composed("model=mistral-7b", "scheduler=vllm",
                               "scheduler.sliding_window_kv=true"))
    assert policy.kv.max_chunk == policy.token_cap == 32768   # whole prompts: no cap below them
    policy, _ = build(composed("model=mistral-7b"))
    assert type(policy.kv).__name__ == "KVCacheManager" and policy.kv.window is None


@pytest.mark.slow
def test_from_the_cli(tmp_path):
    """The setting from the command line: the run's summary records it and its effect."""
    r = cli(f"results_root={tmp_path}", "name=w", *LONG, "scheduler.sliding_window_kv=true")
    assert r.returncode == 0, r.stderr[-2000:]
    (summary_file,) = tmp_path.glob("runs/*/summary.json")
    s = json.loads(summary_file.read_text())
    assert s["config"]["scheduler"]["sliding_window_kv"] is True
    assert s["num_finished"] == 16 and s["preemptions"] == 0 and s["batch"]["requests_max"] == 8
    r = cli(f"results_root={tmp_path}", "name=t", "model=tiny-llama", "model.sliding_window=32",
            "executor=torch", "scheduler.sliding_window_kv=true")
    assert r.returncode != 0 and "scheduler.sliding_window_kv=true: executor TorchExecutor" \
        in r.stderr, r.stderr[-2000:]
