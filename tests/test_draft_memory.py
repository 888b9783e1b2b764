"""A speculative-decoding draft model's weights and KV come out of the simulated KV budget
(executors/sim.py, costmodels/roofline/memory.py): by hand for Mistral-7B on an A100."""
import pytest
from helpers import composed

from sarathi_lab.run.runner import build
from sarathi_lab.settings import ConfigError

SPEC = ["model=mistral-7b", "hardware=a100-80gb", "scheduler.num_speculative_tokens=2",
        "executor.acceptance_rate=0.5"]
GIB = 2**30
USABLE = 0.9 * 80 * GIB                       # gpu_memory_utilization x memory
# workspace (1 GiB) + a forward over 8192 tokens: (2 h + (H + 2 Hkv) d + 3 I) x 2 bytes a token
# (4096, 32 + 16 heads of 128, 14336) + 256 rows of fp32 logits over 32000 tokens
RESERVE = GIB + (2 * 4096 + 48 * 128 + 3 * 14336) * 8192 * 2 + 256 * 32000 * 4
MISTRAL_W = 2 * 7_241_732_096                 # bf16 weights (its published parameter count)
LLAMA2_7B_W = 2 * 6_738_415_616
MISTRAL_KV = 32 * 2 * 8 * 128 * 2             # bytes a token: layers x K,V x KV heads x d x 2
LLAMA2_7B_KV = 32 * 2 * 32 * 128 * 2


def blocks(*over):
    policy, _ = build(composed(*over))
    return policy.kv.num_blocks


def test_no_draft_and_a_layer_draft_leave_the_same_blocks():
    alone = int((USABLE - MISTRAL_W - RESERVE) // (16 * MISTRAL_KV))
    assert alone == 28982 == blocks("model=mistral-7b", "hardware=a100-80gb")
    # layers:N is the target's own first layers: no weights or KV of its own
    assert blocks(*SPEC, "executor.draft=layers:8") == alone


def test_a_preset_draft_takes_its_weights_and_its_kv():
    # each block holds both models' KV of its 16 tokens
    want = int((USABLE - MISTRAL_W - LLAMA2_7B_W - RESERVE)
               // (16 * (MISTRAL_KV + LLAMA2_7B_KV)))
    assert want == 4511 == blocks(*SPEC, "executor.draft=llama-2-7b")


def test_a_draft_that_does_not_fit_is_refused():
    with pytest.raises(ConfigError, match=r"executor.draft=llama-2-70b: the draft's weights "
                                          r"\(128.5 GiB per GPU\) do not fit beside "
                                          r"mistral-7b's \(13.5 GiB\)"):
        build(composed(*SPEC, "executor.draft=llama-2-70b"))
    # a cache set by hand is checked against the same memory
    with pytest.raises(ConfigError, match="executor.draft=llama-2-70b"):
        build(composed(*SPEC, "executor.draft=llama-2-70b", "scheduler.num_kv_blocks=100"))
    with pytest.raises(ConfigError, match="scheduler.num_kv_blocks=4512: more than the 4511"):
        build(composed(*SPEC, "executor.draft=llama-2-7b", "scheduler.num_kv_blocks=4512"))
