"""Mixture-of-experts in the roofline (sarathi_lab/costmodels/roofline/moe.py), checked by hand
on a tiny MoE: the routed experts' FLOPs and weight bytes, the all-to-all's bytes, a one-expert
MoE against its dense twin, memory per GPU under expert parallelism, and the settings' errors."""
import dataclasses

import pytest
import yaml
from helpers import CONFIGS

from sarathi_lab.costmodels.roofline import RooflineConfig, RooflineCostModel
from sarathi_lab.costmodels.roofline.moe import touched_experts
from sarathi_lab.models.shape import ModelShape
from sarathi_lab.settings import ConfigError

# ridge_exponent 1: a GEMM's time is compute + memory (the soft roofline a plain sum), so every
# figure below is a sum written out by hand; efficiencies 1, no overheads
TOY_HW = {"name": "toy", "peak_flops": 1e12, "mem_bandwidth": 1e9, "memory_bytes": 1e6,
          "link_bandwidth": 1e8, "link_latency_s": 1e-5, "compute_eff": 1.0, "mem_eff": 1.0,
          "ridge_exponent": 1.0, "attn_eff": 1.0, "attn_kv_eff": 1.0, "link_eff": 1.0,
          "iteration_overhead_s": 0.0, "layer_overhead_s": 0.0, "gpus_per_node": 8}

# 2 layers, h 8, 2 query heads and 1 KV head of 4, vocab 10, bf16 (2 bytes); 4 experts of width
# 6, top-2
TINY = dict(name="tiny-moe", num_layers=2, hidden_size=8, intermediate_size=16, num_heads=2,
            num_kv_heads=1, head_dim=4, vocab_size=10, max_model_len=64, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=6)


def cm(shape=None, tp=1, **settings):
    return RooflineCostModel(shape or ModelShape(**TINY), TOY_HW, tp, RooflineConfig(**settings))


def test_expected_distinct_experts():
    assert touched_experts(8, 2, 1) == 2                  # one token reads its k experts
    assert touched_experts(4, 2, 3) == 4 * (1 - 0.5 ** 3)   # 3.5
    assert touched_experts(8, 2, 0) == 0
    assert touched_experts(8, 2, 10_000) == pytest.approx(8)


def test_the_routed_experts_flops_and_bytes_of_one_iteration():
    c = cm()
    # 3 tokens x top-2 = 6 assignments; one expert: 3 x h x 6 = 144 weights
    # FLOPs: 2 layers x 2 x 6 x 144 = 3456
    # weights read: 4 experts x (1 - (1 - 2/4)^3) = 3.5 expected experts, 2 layers x 3.5 x 144
    #   x 2 bytes = 2016 bytes
    want = 3456 / 1e12 + 2016 / 1e9
    parts = c.breakdown([(3, 0)], [])
    assert parts["experts"] == pytest.approx(want, rel=1e-12)
    assert parts["all_to_all"] == 0.0                       # one group: nothing moves
    assert parts["total"] == pytest.approx(c.iteration_time([(3, 0)], []), rel=1e-12)
    # a decode of one request: 2 assignments, 2 layers x 2 x 2 x 144 = 1152 FLOPs, and it
    # reads its 2 experts only: 2 layers x 2 x 144 x 2 bytes = 1152 bytes
    assert c.breakdown([], [5])["experts"] == pytest.approx(1152 / 1e12 + 1152 / 1e9)


def test_the_all_to_all_bytes_by_hand():
    c = cm(expert_parallel=2)
    # each token's 2 assignments x h 8 x 2 bytes = 32 bytes; a group holds half the batch's
    # tokens and sends half of its assignments to the other group: 32 / 2 / 2 = 8 bytes per
    # token of the batch, per direction and layer; 2 directions x 2 layers: 32 bytes / 1e8 B/s
    # per token, and 4 latencies of 1e-5 s
    T = 3
    assert c.breakdown([(T, 0)], [])["all_to_all"] == pytest.approx(4e-5 + T * 32 / 1e8)
    # the busiest group's load, twice the mean (rho 2), doubles the bytes
    c2 = cm(expert_parallel=2, moe_imbalance=2.0)
    assert c2.breakdown([(T, 0)], [])["all_to_all"] == pytest.approx(4e-5 + T * 64 / 1e8)
    # ... and its experts' FLOPs: per group 6 / 2 assignments x rho 2 (weights: its 2 experts,
    # 2 x (1 - 1/8) = 1.75 expected)
    assert c2.breakdown([(T, 0)], [])["experts"] == pytest.approx(
        2 * 2 * 6 * 144 / 1e12 + 2 * 1.75 * 144 * 2 / 1e9)


def test_one_expert_top_1_is_the_dense_model_plus_its_router():
    dense = ModelShape(**{**TINY, "num_experts": 0, "num_experts_per_tok": 0,
                          "moe_intermediate_size": None})
    moe = ModelShape(**{**TINY, "num_experts": 1, "num_experts_per_tok": 1,
                        "moe_intermediate_size": 16})
    d, m = cm(dense), cm(moe)
    for prefills, decodes in (([(7, 0)], []), ([], [3, 9]), ([(5, 4)], [2])):
        T = sum(c for c, _ in prefills) + len(decodes)
        # the one expert is the dense MLP: all of its FLOPs, all of its weights read once
        mlp = 2 * T * 2 * 3 * 8 * 16 / 1e12 + 2 * 2 * 3 * 8 * 16 / 1e9
        assert m.breakdown(prefills, decodes)["experts"] == pytest.approx(mlp, rel=1e-12)
        # besides it: the router (h x 1 weights per layer: FLOPs and bytes) and the permute /
        # unpermute of each token's hidden state (4 h x 2 bytes per layer)
        extra = 2 * (2 * T * 8 / 1e12 + 8 * 2 / 1e9) + 2 * T * 4 * 8 * 2 / 1e9
        assert m.iteration_time(prefills, decodes) - d.iteration_time(prefills, decodes) == \
            pytest.approx(extra, rel=1e-9)
    # and the dense model is unchanged by the MoE code: no expert terms in its breakdown
    assert "experts" not in d.breakdown([(7, 0)], [])


def test_memory_per_gpu_by_hand():
    c = cm(expert_parallel=2)
    # per layer: attention 8 x (2 + 2) x 4 + 2 x 4 x 8 = 192, router 8 x 4 = 32, its 2 of the
    # 4 experts 2 x 144 = 288: 512; 2 layers 1024, norms 2 x 2 x 8 = 32, final norm 8,
    # embedding + LM head 2 x 10 x 8 = 160: 1224 weights x 2 bytes
    assert c.weight_bytes == 1224 * 2
    # KV per token (one GPU of a group): 2 layers x (K, V) x 1 head x 4 x 2 bytes
    assert c.kv_bytes_per_token == 32
    # activations per token: 2h + (2 + 2 x 1) x 4 + 3 x (k x 6) = 16 + 16 + 36 = 68 elements,
    # x 2 bytes x 100 tokens = 13600, plus 256 rows of fp32 logits 256 x 10 x 4 = 10240
    usable = 1e6 - 2448 - 23840
    # the two groups' KV pools together: 2 x floor(usable / (16 tokens x 32 bytes))
    assert c.num_kv_blocks(16, 1.0, 0, 100) == 2 * int(usable // 512)
    # every GPU holds all 4 experts without expert parallelism
    assert cm().weight_bytes == (1224 + 2 * 288) * 2
    with pytest.raises(ValueError, match="tiny-moe does not fit on toy at tensor_parallel=1 "
                       "expert_parallel=2: .*or executor.expert_parallel"):
        c.num_kv_blocks(16, 0.001, 0, 100)


def test_mixtral_weights_per_gpu():
    mixtral = ModelShape.from_config({"hf_config": "mixtral-8x7b"})
    a100 = yaml.safe_load((CONFIGS / "hardware" / "a100-80gb.yaml").read_text())
    one = RooflineCostModel(mixtral, a100, 1)
    assert one.weight_bytes == mixtral.num_params() * 2          # all of it, in bf16
    ep8 = RooflineCostModel(mixtral, a100, 1, RooflineConfig(expert_parallel=8))
    # one expert per layer instead of 8: 7 x 32 layers x 3 x 4096 x 14336 weights fewer
    assert one.weight_bytes - ep8.weight_bytes == 2 * 7 * 32 * 3 * 4096 * 14336
    tp8 = RooflineCostModel(mixtral, a100, 8)
    # tp8 shards attention too, and keeps every GPU's router and norms whole
    assert tp8.weight_bytes < ep8.weight_bytes
    # a decode of 1 on tp8 reads 2 of the 8 experts; a big batch all 8
    assert tp8.breakdown([], [100])["experts"] < 0.3 * tp8.breakdown([(4096, 0)], [])["experts"]


@pytest.mark.parametrize("shape, settings, message", [
    ({"num_experts": 0, "num_experts_per_tok": 0, "moe_intermediate_size": None},
     {"expert_parallel": 2}, "expert_parallel=2: model 'tiny-moe' is dense"),
    ({}, {"expert_parallel": 3}, "expert_parallel=3: must divide model 'tiny-moe'.s num_experts=4"),
    ({}, {"moe_imbalance": 1.5}, "moe_imbalance=1.5: read only with expert_parallel > 1"),
    ({}, {"expert_parallel": 2, "moe_imbalance": 3.0}, "moe_imbalance=3.0: must be between 1 "
                                                       "\\(balanced\\) and expert_parallel=2"),
])
def test_bad_layouts_are_named(shape, settings, message):
    with pytest.raises(ValueError, match=message):
        cm(ModelShape(**{**TINY, **shape}), **settings)


@pytest.mark.slow   # two runs of the simulator
def test_a_run_counts_every_gpu_of_the_layout(tmp_path):
    from helpers import composed

    from sarathi_lab.cli.main import check_config
    from sarathi_lab.run.runner import run
    over = ["model=mixtral-8x7b", "parallel=tp1ep4", "trace=synthetic",
            "trace.num_requests=5", "progress=false", "hardware=h100-sxm"]
    r = check_config(composed(*over), over)
    s = run(composed(*over), tmp_path / "run", resolved=r)
    assert s["num_gpus"] == 4
    assert s["cost_model"]["name"] == "roofline"
    over = ["model=mistral-7b", "parallel=tp1ep4", "trace=synthetic", "trace.num_requests=5"]
    with pytest.raises(ConfigError, match="executor.expert_parallel=4: model 'mistral-7b' is "
                                          "dense"):
        check_config(composed(*over), over)   # at the settings check, before any run


def test_expert_parallel_on_a_dense_model_is_refused_before_any_run(tmp_path):
    from helpers import cli
    out = tmp_path / "run"
    res = cli("model=mistral-7b", "executor.expert_parallel=2", f"hydra.run.dir={out}")
    assert res.returncode != 0
    assert ("sarathi-lab: error: executor.expert_parallel=2: model 'mistral-7b' is dense "
            "(num_experts=0: no experts to split); expert parallelism needs a "
            "mixture-of-experts model") in res.stderr
    assert not out.exists()   # no run directory, no error.txt


def test_the_dense_model_is_priced_as_before():
    # the MoE code leaves a dense model's terms alone: its time equals the formula's parts
    m = ModelShape(**{**TINY, "num_experts": 0, "num_experts_per_tok": 0,
                      "moe_intermediate_size": None})
    c = cm(m)
    parts = c.breakdown([(7, 3)], [4])
    assert set(parts) == {"overhead", "layer_overhead", "linear", "elementwise",
                          "attention_prefill", "attention_decode", "lm_head", "allreduce",
                          "total"}
    assert dataclasses.replace(m, name="x").num_experts == 0


def test_a_profile_does_not_price_experts():
    from sarathi_lab.costmodels.profiled import ProfiledConfig, ProfiledCostModel
    from sarathi_lab.costmodels.profiles import ProfileError
    with pytest.raises(ProfileError, match="tiny-moe is a mixture-of-experts model, which a "
                       "profile's dense operators cannot price; use executor.cost_model=roofline"):
        ProfiledCostModel(ModelShape(**TINY), TOY_HW, 1, ProfiledConfig(profile="any.parquet"))


def _running(rid, computed, prompt, outputs=0):
    from sarathi_lab.request import Request
    r = Request(rid, 0.0, prompt, 10_000)
    r.num_computed_tokens, r.num_output_tokens = computed, outputs
    return r


@pytest.mark.parametrize("ep", [1, 2])
def test_the_hot_paths_price_experts_as_a_step_does(ep):
    # fast-forward's decode runs and chunk runs must equal stepping bit for bit (they share
    # _fixed, where the experts and the all-to-all are added)
    import numpy as np
    c = cm(expert_parallel=ep) if ep > 1 else cm()
    ctx = [5, 30, 17]
    reqs = [_running(i, x, 4, x - 3) for i, x in enumerate(ctx)]
    fast = c.decode_run(np.array(ctx), 20)
    slow = []
    for _ in range(20):
        slow.append(c.step_time(reqs, [1] * 3))
        for r in reqs:
            r.num_computed_tokens += 1
            r.num_output_tokens += 1
    np.testing.assert_array_equal(fast, np.array(slow))
    decodes = [_running(i, x, 4, x - 3) for i, x in enumerate(ctx)]
    pre = _running(9, 0, 14)
    runs = c.chunk_run(ctx, 0, [6, 8], True)
    steps = []
    for n in (6, 8):
        steps.append(c.step_time(decodes + [pre], [1] * 3 + [n]))
        for r in decodes:
            r.num_computed_tokens += 1
            r.num_output_tokens += 1
        pre.num_computed_tokens += n
    assert runs == steps


def test_disaggregated_pools_of_expert_parallel_replicas(tmp_path):
    from helpers import composed

    from sarathi_lab.cli.main import check_config
    from sarathi_lab.run.runner import run

    # every replica of both pools is one tensor-parallel group per expert-parallel group: 2 prefill
    # and 1 decode replicas of tp1 x ep2 hold 6 GPUs; the KV a request hands over lives on one
    # tensor-parallel group (attention runs data-parallel over the expert groups), as at ep 1
    over = ["model=mixtral-8x7b", "cluster=disagg", "executor.expert_parallel=2",
            "cluster.prefill.num_replicas=2", "cluster.decode.num_replicas=1",
            "trace=synthetic", "trace.num_requests=6", "progress=false"]
    s = run(composed(*over), tmp_path / "run", resolved=check_config(composed(*over), over))
    assert s["num_gpus"] == 6
    assert [(p["num_gpus"], p["expert_parallel"], p["tensor_parallel"])
            for p in (s["pools"]["prefill"], s["pools"]["decode"])] == [(4, 2, 1), (2, 2, 1)]
    # Mixtral's KV: 32 layers x K and V x 8 heads x 128 x 2 bytes a token, handed over whole
    assert s["transfer"]["kv_bytes_per_token"] == 32 * 2 * 8 * 128 * 2
    import pandas as pd
    req = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert (req["transfer_bytes"] == req["num_prompt_tokens"] * 131072).all()


def test_w8a8_quantizes_each_experts_down_projection_input():
    # W8A8 quantizes every GEMM's input on the fly: read in bf16 (2 bytes), written in int8 (1).
    # Per token and layer: QKV's and gate/up's inputs (h each), O's (heads x d) and the down
    # projections' -- under top-2 routing two of them, each moe_intermediate_size wide (not the
    # dense intermediate_size, 16). 2 layers x 3 bytes x (2 x 8 + 2 x 4 + 2 x 6) = 216 bytes.
    hw = {**TOY_HW, "peak_flops_int8": 2e12}
    w8a8 = RooflineCostModel(ModelShape(**TINY), hw, 1, RooflineConfig(weight_dtype="int8"))
    w8 = RooflineCostModel(ModelShape(**TINY), hw, 1,
                           RooflineConfig(weight_dtype="int8", weight_only=True))
    assert w8a8.ew_per_token - w8.ew_per_token == pytest.approx(216 / 1e9, rel=1e-12)
