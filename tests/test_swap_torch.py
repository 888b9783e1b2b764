"""Preemption by swap on the real model: the KV really goes to a host tensor and back, so a
swapped run's greedy tokens equal Hugging Face's (and an unpreempted run's), and every block a
swap-in restores holds, bit for bit, what its swap-out copied."""
import pytest
import torch

# the fixtures too: one thread, and the tiny HF model with its greedy outputs
from hf_oracle import one_thread, oracle, run_engine  # noqa: F401

# 80 tokens of KV for 18 requests of up to 75 tokens: 6-7 preemptions
CASES = {
    "vllm-swap-b4": dict(name="vllm", block_size=4, num_kv_blocks=20, num_swap_blocks=64),
    "sarathi-swap-b4": dict(token_budget=16, block_size=4, num_kv_blocks=20,
                            num_swap_blocks=64),
    "sarathi-swap-prefix-b16": dict(token_budget=32, block_size=16, num_kv_blocks=6,
                                    enable_prefix_caching=True, num_swap_blocks=16),
    # host space for a few requests' KV only: some swaps fall back to recompute
    "vllm-swap-fallback-b4": dict(name="vllm", block_size=4, num_kv_blocks=20,
                                  num_swap_blocks=10),
}


@pytest.mark.parametrize("case", list(CASES))
def test_swapped_runs_equal_hugging_face(oracle, case):
    path, specs, ref = oracle
    reqs, engine = run_engine(path, specs, preemption_mode="swap", **CASES[case])
    assert [r.output_token_ids for r in reqs] == ref
    assert sum(r.num_swap_outs for r in reqs) > 0
    assert sum(r.num_swap_ins for r in reqs) == sum(r.num_swap_outs for r in reqs)
    if "fallback" in case:
        assert sum(r.num_swap_fallbacks for r in reqs) > 0
    it = engine.iters
    assert sum(it["swap_out_blocks"]) == sum(r.num_swapped_blocks for r in reqs)
    assert all(0 <= s <= d for s, d in zip(it["swap_s"], it["duration"]))
    assert engine.executor.timers["swap"] == pytest.approx(sum(it["swap_s"]))


def test_a_swap_in_restores_every_block_bit_for_bit(oracle):
    path, specs, ref = oracle
    from sarathi_lab.executors.torch_exec import TorchExecutor
    seen, checked = {}, []
    swap = TorchExecutor.swap

    def recording_swap(self, out):
        for r, pairs in out.swapped_out:   # what the device blocks hold before the copy
            dev = [d for d, _ in pairs]
            seen[r.request_id] = self.kv_cache[:, :, dev].clone()
        swap(self, out)
        for r, pairs in out.swapped_in:    # what the new device blocks hold after it
            dev = [d for _, d in pairs]
            assert torch.equal(self.kv_cache[:, :, dev], seen.pop(r.request_id))
            checked.append(r.request_id)

    TorchExecutor.swap = recording_swap
    try:
        reqs, _ = run_engine(path, specs, preemption_mode="swap", **CASES["sarathi-swap-b4"])
    finally:
        TorchExecutor.swap = swap
    assert checked and not seen
    assert [r.output_token_ids for r in reqs] == ref

