"""Attention families from a config.json: DeepSeek-V2/V3's latent attention (MLA), Qwen3-MoE's
q/k norms, Gemma 2's local/global layers, GPT-OSS's sinks; per-token KV bytes and parameter counts by hand against the published figures; a field
the shape reader does not understand refused by name; the roofline's latent-attention terms by
hand. The configs are the shipped ones (sarathi_lab/data/models: deepseek-v2-lite, deepseek-v3,
qwen3-30b-a3b; sources in its README)."""
import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from sarathi_lab.costmodels.roofline import RooflineCostModel
from sarathi_lab.costmodels.roofline.hardware import HardwareSpec
from sarathi_lab.models.shape import ModelShape

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "sarathi_lab" / "data" / "models"


def hf(name: str, **change) -> dict:
    d = {**json.loads((SHIPPED / name / "config.json").read_text()), **change}
    return {k: v for k, v in d.items() if v is not None}


def shape(name: str, **change) -> ModelShape:
    return ModelShape.from_hf(hf(name, **change), f"{name}.json", name=name)


# -- per-token KV and parameters, by hand -----------------------------------------------------------

def test_deepseek_v2_lite_latent_kv_and_parameters():
    s = shape("deepseek-v2-lite")
    assert s.is_mla and s.is_moe
    # (kv_lora_rank + qk_rope_head_dim) x layers x 2 B, not 2 x 16 heads x 128 x 27 x 2 = 221,184
    assert s.kv_bytes_per_token() == (512 + 64) * 27 * 2 == 31_104
    h, H = 2048, 16
    attn = h * H * 192 + h * (512 + 64) + 512 + 512 * H * (128 + 128) + H * 128 * h
    assert s.attention_params() == attn == 13_763_072
    moe = h * 64 + 64 * 3 * h * 1408 + 3 * h * 2 * 1408          # router, experts, 2 shared
    total = 27 * (attn + 2 * h) + 3 * h * 10944 + 26 * moe + 2 * 102400 * h + h
    assert s.num_params() == total == 15_706_484_224
    assert abs(total / 15.7e9 - 1) < 0.005                        # published: 15.7B


def test_deepseek_v3_latent_kv_and_parameters():
    s = shape("deepseek-v3")
    assert s.kv_bytes_per_token() == (512 + 64) * 61 * 2 == 70_272
    h, H = 7168, 128
    attn = h * 1536 + 1536 + 1536 * H * 192 + h * 576 + 512 + 512 * H * 256 + H * 128 * h
    assert s.attention_params() == attn
    moe = h * 256 + 256 * 3 * h * 2048 + 3 * h * 2048
    total = 61 * (attn + 2 * h) + 3 * 3 * h * 18432 + 58 * moe + 2 * 129280 * h + h
    assert s.num_params() == total
    assert abs(total / 671e9 - 1) < 0.005                         # published: 671B (no MTP)
    active = total - 58 * 248 * 3 * h * 2048                      # 8 of 256 experts per layer
    assert s.active_params() == active
    # published "37B activated" (two digits): 37.55B with the embedding table, 36.63B without
    assert abs(active / 37e9 - 1) < 0.015
    assert s.first_dense_layers == 3 and s.norm_topk_prob is True


def test_qwen3_moe_kv_and_parameters():
    s = shape("qwen3-30b-a3b")
    assert s.kv_bytes_per_token() == 48 * 2 * 4 * 128 * 2 == 98_304
    h = 2048
    attn = h * 128 * (2 * 32 + 2 * 4) + 2 * 128                   # Q, K, V, O; q/k norms
    assert s.attention_params() == attn and s.qk_norm and not s.qkv_bias
    moe = h * 128 + 128 * 3 * h * 768
    total = 48 * (attn + 2 * h + moe) + 2 * 151936 * h + h
    assert s.num_params() == total
    assert abs(total / 30.5e9 - 1) < 0.005                        # published: 30.5B
    active = total - 48 * 120 * 3 * h * 768
    assert s.active_params() == active
    assert abs(active / 3.3e9 - 1) < 0.02                         # published: 3.3B (3.35B)


def test_transformers5_spellings_give_the_same_shapes():
    # transformers 5 writes Qwen3-MoE's num_experts as num_local_experts, and for DeepSeek-V2/V3
    # qk_head_dim (nope + rope), head_dim (the rope part) and rope_interleave
    q = hf("qwen3-30b-a3b", num_experts=None, num_local_experts=128)
    assert ModelShape.from_hf(q, "q.json", name="qwen3-30b-a3b") == shape("qwen3-30b-a3b")
    d = hf("deepseek-v2-lite", qk_head_dim=192, head_dim=64, rope_interleave=True)
    assert ModelShape.from_hf(d, "d.json", name="deepseek-v2-lite") == shape("deepseek-v2-lite")
    with pytest.raises(ValueError, match="d.json: qk_head_dim=128 disagrees with "
                                         "qk_nope_head_dim \\+ qk_rope_head_dim = 192"):
        ModelShape.from_hf(hf("deepseek-v2-lite", qk_head_dim=128), "d.json")


def test_gemma2_local_global_layers_kv_and_parameters():
    s = shape("gemma-2-9b", torch_dtype="bfloat16")
    assert (s.sliding_window, s.full_attention_layers, s.windowed_layers) == (4096, 21, 21)
    h = 3584
    layer = h * 256 * (2 * 16 + 2 * 8) + 3 * h * 14336 + 4 * h   # 4 norms a layer
    total = 42 * layer + 256000 * h + h                           # embeddings tied
    assert s.num_params() == total and s.tie_word_embeddings
    assert abs(total / 9.24e9 - 1) < 0.005                        # published: 9.24B
    per_layer = 2 * 8 * 256 * 2                                   # K and V, 8 heads, bf16
    assert s.kv_bytes_per_token() == 42 * per_layer == 344_064
    # a 8192-token context: the 21 global layers hold every token, the 21 windowed 4096
    assert s.kv_bytes(8192) == 21 * per_layer * 8192 + 21 * per_layer * 4096
    assert s.kv_bytes(100) == 100 * s.kv_bytes_per_token()
    # transformers 5 names each layer's kind; the same layout
    types = ["sliding_attention", "full_attention"] * 21
    assert shape("gemma-2-9b", torch_dtype="bfloat16", layer_types=types,
                 sliding_window_size=None) == s
    with pytest.raises(ValueError, match="layer_types=.*must name sliding_attention or "
                                         "full_attention for each of num_hidden_layers=42"):
        shape("gemma-2-9b", layer_types=types[:40])


def test_gpt_oss_sinks_windows_and_biased_experts():
    s = shape("gpt-oss-20b")
    assert (s.sliding_window, s.full_attention_layers, s.attention_sinks, s.router_bias) == \
        (128, 12, True, True)
    h, H, K, d, E = 2880, 64, 8, 64, 32
    # Q, K, V, O with biases; one sink logit per head (nothing cached)
    attn = h * d * (2 * H + 2 * K) + (H + 2 * K) * d + h + H
    assert s.attention_params() == attn
    expert = 3 * h * 2880 + 2 * 2880 + h                          # SwiGLU with biases
    moe = (h + 1) * E + E * expert                                # router with its bias
    total = 24 * (attn + 2 * h + moe) + 2 * 201088 * h + h
    assert s.num_params() == total
    assert abs(total / 20.9e9 - 1) < 0.005                        # published: 20.9B
    # published 3.61B active: the unembedding counted, the embedding lookup not
    active = s.active_params() - 201088 * h
    assert active == total - 24 * 28 * expert - 201088 * h
    assert abs(active / 3.61e9 - 1) < 0.005
    # sinks hold no KV: K and V of 8 heads of 64, 24 layers, bf16; half the layers windowed
    assert s.kv_bytes_per_token() == 24 * 2 * 8 * 64 * 2 == 49_152
    assert s.kv_bytes(1000) == 12 * 2048 * 1000 + 12 * 2048 * 128
    # the published file's mxfp4 experts are refused by name (the shipped copy leaves them out)
    with pytest.raises(ValueError, match="o.json: field 'quantization_config'"):
        ModelShape.from_hf(hf("gpt-oss-20b", quantization_config={"quant_method": "mxfp4"}),
                           "o.json")
    with pytest.raises(ValueError, match="o.json: model_type 'gpt_oss' lacks layer_types"):
        ModelShape.from_hf(hf("gpt-oss-20b", layer_types=None), "o.json")


def test_roofline_local_and_global_layers_by_hand():
    s, hw = shape("gemma-2-9b", torch_dtype="bfloat16"), _hw()
    cm = RooflineCostModel(s, hw)
    full = RooflineCostModel(dataclasses.replace(s, sliding_window=None,
                                                 full_attention_layers=0), hw)
    local = RooflineCostModel(dataclasses.replace(s, full_attention_layers=0), hw)
    assert cm.decode_per_kv_token == full.decode_per_kv_token
    rate = cm.decode_per_kv_token
    # a decode after 10,000 cached tokens: half the layers read 4,096 keys, half 10,001
    assert cm.chunk_attention_time(1, 10_000) == pytest.approx((0.5 * 4096 + 0.5 * 10_001) * rate,
                                                               rel=1e-12)
    assert cm.chunk_attention_time(1, 100) == pytest.approx(101 * rate, rel=1e-12)
    # a prefill chunk beyond the window: the mean of the windowed and the plain prices
    assert cm.chunk_attention_time(512, 6000) == pytest.approx(
        0.5 * local.chunk_attention_time(512, 6000) + 0.5 * full.chunk_attention_time(512, 6000),
        rel=1e-12)
    # the hot paths price the same batch alike; decode_run as step_time step by step
    from types import SimpleNamespace
    reqs = [SimpleNamespace(num_computed_tokens=k, num_prompt_tokens=10, num_output_tokens=k - 9)
            for k in (100, 4095, 9000)]
    assert cm.step_time(reqs, [1, 1, 1]) == cm.iteration_time([], [100, 4095, 9000])
    run = cm.decode_run([100, 4095, 9000], 3)
    for j in range(3):
        step = [SimpleNamespace(num_computed_tokens=k + j, num_prompt_tokens=10,
                                num_output_tokens=k + j - 9) for k in (100, 4095, 9000)]
        assert run[j] == cm.step_time(step, [1, 1, 1])


# -- fields the reader does not understand ----------------------------------------------------

def test_latent_attention_under_another_label_is_refused_naming_the_field():
    # the same DeepSeek-V2-Lite file relabelled DeepSeek-MoE used to be read with 16 full KV
    # heads (221,184 B/token), kv_lora_rank ignored
    with pytest.raises(ValueError, match="v2.json: field 'kv_lora_rank' .and 'q_lora_rank'|"
                                         "v2.json: field 'kv_lora_rank'"):
        ModelShape.from_hf(hf("deepseek-v2-lite", model_type="deepseek"), "v2.json")


@pytest.mark.parametrize("change, message", [
    ({"sliding_window_pattern": 6},
     ("field 'sliding_window_pattern' is not understood by the shape reader for model_type "
      "'llama'")),
    ({"attention_sink": True}, "field 'attention_sink' is not understood"),
    ({"quantization_config": {"quant_method": "fp8"}}, "field 'quantization_config'"),
    ({"sliding_window": 4096}, "field 'sliding_window' is not understood .*'llama'"),
    ({"kv_lora_rank": 512, "q_lora_rank": 64}, "field 'kv_lora_rank' \\(and 'q_lora_rank'\\)"),
])
def test_unknown_fields_are_refused_by_name(change, message):
    d = {**json.loads((SHIPPED / "llama-3-8b" / "config.json").read_text()), **change}
    with pytest.raises(ValueError, match=f"cfg.json: {message}"):
        ModelShape.from_hf(d, "cfg.json")


@pytest.mark.parametrize("name, change, message", [
    ("qwen2.5-7b", {"use_sliding_window": True}, "use_sliding_window=True is not modelled"),
    ("qwen2.5-7b", {"layer_types": ["sliding_attention"] + ["full_attention"] * 27},
     "layer_types=.*only full attention on every layer"),
    ("qwen2.5-7b", {"use_mrope": True}, "use_mrope=True is not modelled"),
    ("deepseek-moe-16b", {"qk_rope_head_dim": 64}, "field 'qk_rope_head_dim'"),
])
def test_settings_of_known_fields_that_are_not_modelled_are_refused(name, change, message):
    d = {**json.loads((SHIPPED / name / "config.json").read_text()), **change}
    with pytest.raises(ValueError, match=f"cfg.json: {message}"):
        ModelShape.from_hf(d, "cfg.json")


def test_deepseek_v3_quantized_weights_are_refused_naming_the_field():
    # the published file carries its fp8 checkpoint's quantization_config (the shipped one
    # leaves it out: data/models/README.md)
    q = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
         "weight_block_size": [128, 128]}
    with pytest.raises(ValueError, match="v3.json: field 'quantization_config'"):
        ModelShape.from_hf(hf("deepseek-v3", quantization_config=q), "v3.json")


@pytest.mark.parametrize("name", sorted(p.name for p in SHIPPED.iterdir()
                                        if (p / "config.json").is_file()))
def test_every_shipped_config_still_loads(name):
    f = SHIPPED / name / "config.json"
    assert ModelShape.from_hf(json.loads(f.read_text()), str(f)).num_params() > 1e9


def test_a_preset_keeps_latent_attention():
    s = shape("deepseek-v2-lite")
    preset = s.to_preset()
    assert preset["kv_lora_rank"] == 512 and ModelShape.from_config(preset) == s
    # a dense model's preset does not carry the family keys (recorded configs unchanged)
    assert "kv_lora_rank" not in shape("qwen3-30b-a3b").to_preset()
    with pytest.raises(ValueError, match="qk_nope_head_dim=128 is a latent-attention .MLA. "
                                         "setting, but kv_lora_rank=0"):
        ModelShape.from_config({**preset, "kv_lora_rank": 0})


# -- the roofline's latent attention, by hand ---------------------------------------------------

def _hw() -> HardwareSpec:
    return HardwareSpec.from_config(yaml.safe_load(
        (ROOT / "configs" / "hardware" / "h100-sxm.yaml").read_text()))


@pytest.mark.parametrize("tp", [1, 2])
def test_roofline_latent_attention_by_hand(tp):
    s, hw = shape("deepseek-v2-lite"), _hw()
    cm = RooflineCostModel(s, hw, tensor_parallel=tp)
    L, H = 27, 16 // tp
    # the latent is held whole on every GPU of the group
    assert cm.kv_bytes_per_token == L * 576 * 2
    kv = L * 576 * 2 / (hw.mem_bandwidth * hw.attn_kv_eff)
    # decode, absorbed: 2 (512 + 64) + 2 x 512 FLOPs a pair and head
    per_key = L * (2 * 576 + 2 * 512) * H / (hw.peak_flops * hw.attn_eff) + kv
    assert cm.chunk_attention_time(1, 999) == pytest.approx(1000 * per_key, rel=1e-12)
    assert cm.attention_time([], [999, 99]) == pytest.approx(1100 * per_key, rel=1e-12)
    # a prefill chunk of 100 after 300: plain attention (2 x 192 + 2 x 128 a pair and head) and
    # the 300 cached latents up-projected to keys and values (2 x 512 x H x 256 each)
    pair = L * (2 * 192 + 2 * 128) * H / hw.peak_flops
    ctx, own = 100 * 300, 100 * 101 // 2
    want = ctx * pair / hw.attn_eff + own * pair / (hw.attn_self_eff or hw.attn_eff) \
        + 400 * kv + 300 * L * 2 * 512 * H * 256 / (hw.peak_flops * hw.compute_eff)
    assert cm.chunk_attention_time(100, 300) == pytest.approx(want, rel=1e-12)


def test_roofline_latent_attention_hot_paths_agree():
    from types import SimpleNamespace
    cm = RooflineCostModel(shape("deepseek-v2-lite"), _hw())
    reqs = [SimpleNamespace(num_computed_tokens=k, num_prompt_tokens=p, num_output_tokens=0)
            for k, p in ((300, 1000), (50, 10), (700, 10))]
    reqs[1].num_output_tokens, reqs[2].num_output_tokens = 41, 691
    chunks = [100, 1, 1]
    assert cm.step_time(reqs, chunks) == pytest.approx(
        cm.iteration_time([(100, 300)], [50, 700], num_sampled=2), rel=1e-12)
    assert cm.chunk_run([50], 300, [100, 100], True) is None   # priced per request instead
    run = cm.decode_run([50, 700], 3)
    assert run[2] == pytest.approx(cm.iteration_time([], [52, 702]), rel=1e-12)
    # weights: the parameter count the shape gives (experts, embeddings, norms) at 2 B each
    assert cm.weight_bytes == pytest.approx(2 * shape("deepseek-v2-lite").num_params(), rel=1e-9)


@pytest.mark.slow   # Hydra compositions
def test_the_new_families_run_from_the_command_line():
    from helpers import composed

    from sarathi_lab.cli.main import check_config
    for name, kv in (("deepseek-v2-lite", 31_104), ("qwen3-30b-a3b", 98_304)):
        ov = ["model=hf", f"model.hf_config={name}", "slo=llama-2-70b-strict"]
        r = check_config(composed(*ov), ov)
        s = ModelShape.from_config(r.model)
        assert s.kv_bytes_per_token() == kv and s == shape(name)


@pytest.mark.parametrize("name, field", [("deepseek-v2-lite", "kv_lora_rank"),
                                         ("gemma-2-9b", "full_attention_layers"),
                                         ("qwen3-30b-a3b", "qk_norm"),
                                         ("gpt-oss-20b", "full_attention_layers")])
def test_the_real_executor_refuses_what_it_does_not_compute(name, field):
    # a preset written from the shape (no config.json to name the model_type) is refused too
    from sarathi_lab.models.loader import model_shape
    preset = shape(name).to_preset()
    with pytest.raises(ValueError, match=f"model '{name}': {field}=.* is not run by the real "
                                         "executor"):
        model_shape(preset)
    with pytest.raises(ValueError, match="model_type .* does not run on the real executor"):
        model_shape({"name": name, "hf_config": name})


def test_a_disaggregated_hand_off_moves_the_latent_to_every_decode_gpu():
    """MLA's KV is one latent per token and layer, (512 + 64) x 27 x 2 B = 31,104 B for
    DeepSeek-V2-Lite, held whole on every GPU of a tensor-parallel group: each of TP_d = 2 decode
    GPUs receives all of it (31,104 B a token, not half), and one prefill GPU sends both copies."""
    from sarathi_lab.topology.disagg.transfer import Link, Transfer
    link = Link("net", bandwidth=1e9, eff=1.0, latency_s=0.0)
    t = Transfer.for_model(shape("deepseek-v2-lite"), link, tp_prefill=1, tp_decode=2)
    assert t.kv_bytes_per_token == 31_104
    assert t.link_bytes(10) == 2 * 311_040      # sent: two decode GPUs' whole copies
    assert Transfer.for_model(shape("deepseek-v2-lite"), link, 2, 2).link_bytes(10) == 311_040


def test_a_config_converted_from_gguf_is_read_as_its_dtype():
    """`sarathi-lab-prepare-model` saves what transformers writes for a GGUF file: the source in
    quantization_config (quant_method gguf; the saved weights are dequantized, in `dtype`) and
    generic PretrainedConfig fields: read, same shape as without them; another quantization
    is still refused."""
    base = json.loads((SHIPPED / "llama-3-8b" / "config.json").read_text())
    d = {**base, "_model_name_or_path": "x", "unk_token_id": 0, "num_beams": 1,
         "quantization_config": {"dequantize": False, "gguf_file": "m.Q4_1.gguf",
                                 "quant_method": "gguf"}}
    assert ModelShape.from_hf(d, "cfg.json", name="m") == ModelShape.from_hf(base, "b.json",
                                                                            name="m")
    with pytest.raises(ValueError, match="field 'quantization_config'"):
        ModelShape.from_hf({**base, "quantization_config": {"quant_method": "awq"}}, "cfg.json")
