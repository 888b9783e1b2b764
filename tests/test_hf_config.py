"""Models from a Hugging Face config.json: the shipped configs (sarathi_lab/data/models) give the
hand-written presets' shapes, the mixture-of-experts fields and their parameter counts match the
published totals, and what cannot be described is refused by name."""
import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from sarathi_lab.models.shape import SUPPORTED_TYPES, ModelShape

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "sarathi_lab" / "data" / "models"


def shipped(name: str) -> ModelShape:
    f = SHIPPED / name / "config.json"
    return ModelShape.from_hf(json.loads(f.read_text()), str(f), name=name)


def hand_preset(name: str) -> ModelShape:
    return ModelShape.from_config(yaml.safe_load((ROOT / "configs" / "model" /
                                                  f"{name}.yaml").read_text()))


@pytest.mark.parametrize("name", ["llama-2-7b", "llama-2-70b", "llama-3-8b", "mistral-7b"])
def test_shipped_configs_give_the_hand_presets_shapes(name):
    hand, hf = hand_preset(name), shipped(name)
    assert hf.num_params() == hand.num_params()
    assert hf.kv_bytes_per_token() == hand.kv_bytes_per_token()
    # the Llama 2 checkpoints are stored in float16 and served in bf16 by the presets (same bytes)
    assert dataclasses.replace(hf, dtype=hand.dtype) == hand


# published totals (model cards, the Mixtral paper): (total, active) in billions, and the
# rounding they are quoted to
@pytest.mark.parametrize("name, total, active, digits", [
    ("mixtral-8x7b", 46.7, 12.9, 1),
    ("qwen1.5-moe-a2.7b", 14.3, 2.7, 1),
    ("deepseek-moe-16b", 16.4, 2.8, 1),
    ("qwen2.5-7b", 7.6, 7.6, 1),       # the card says 7.61B: 7.6156B cut, not rounded
    ("qwen2.5-72b", 72.7, 72.7, 1),
    ("llama-3-70b", 70.6, 70.6, 1),
    ("llama-3.2-1b", 1.24, 1.24, 2),   # the card says 1.23B: 1.2355B, embeddings tied
])
def test_parameter_counts_match_the_published_totals(name, total, active, digits):
    s = shipped(name)
    assert round(s.num_params() / 1e9, digits) == total
    assert round(s.active_params() / 1e9, digits) == active


def test_moe_fields_from_each_layout():
    mx = shipped("mixtral-8x7b")
    assert (mx.num_experts, mx.num_experts_per_tok, mx.moe_intermediate_size) == (8, 2, 14336)
    assert (mx.shared_expert_intermediate_size, mx.first_dense_layers, mx.norm_topk_prob) == \
        (0, 0, True)
    assert mx.moe_layers == 32 and mx.sliding_window is None
    qw = shipped("qwen1.5-moe-a2.7b")
    assert (qw.num_experts, qw.num_experts_per_tok, qw.moe_intermediate_size) == (60, 4, 1408)
    assert (qw.shared_expert_intermediate_size, qw.shared_expert_gate, qw.norm_topk_prob) == \
        (5632, True, False)
    assert qw.qkv_bias and not qw.o_bias     # Qwen2's attention
    ds = shipped("deepseek-moe-16b")
    # two shared experts of the routed width, no gate; the first layer keeps a dense MLP
    assert (ds.num_experts, ds.num_experts_per_tok, ds.shared_expert_intermediate_size) == \
        (64, 6, 2 * 1408)
    assert (ds.shared_expert_gate, ds.first_dense_layers, ds.moe_layers) == (False, 1, 27)
    assert ds.num_kv_heads == ds.num_heads == 16    # plain multi-head attention
    # KV per token: layers x (K, V) x KV heads x head_dim x 2 bytes
    assert mx.kv_bytes_per_token() == 32 * 2 * 8 * 128 * 2
    assert ds.kv_bytes_per_token("float8") == 28 * 2 * 16 * 128 * 1


def test_a_tiny_moe_parameter_count_by_hand():
    s = ModelShape(name="t", num_layers=3, hidden_size=8, intermediate_size=16, num_heads=2,
                   num_kv_heads=1, head_dim=4, vocab_size=10, max_model_len=32, num_experts=4,
                   num_experts_per_tok=2, moe_intermediate_size=6,
                   shared_expert_intermediate_size=5, shared_expert_gate=True,
                   first_dense_layers=1)
    attn = 8 * 4 * (2 * 2 + 2 * 1)          # Q, O: 8x8 each; K, V: 8x4 each = 192
    norms = 2 * 8
    dense_mlp = 3 * 8 * 16                  # 384
    router, expert, shared, gate = 8 * 4, 3 * 8 * 6, 3 * 8 * 5, 8
    moe_all = router + 4 * expert + shared + gate      # 32 + 576 + 120 + 8 = 736
    moe_k = router + 2 * expert + shared + gate        # 448
    emb = 2 * 10 * 8 + 8                    # embedding, LM head, final norm
    assert s.num_params() == 3 * (attn + norms) + dense_mlp + 2 * moe_all + emb
    assert s.active_params() == 3 * (attn + norms) + dense_mlp + 2 * moe_k + emb
    assert ModelShape.from_config(s.to_preset()) == s


def test_presets_round_trip_through_their_keys():
    for name in ("mixtral-8x7b", "qwen1.5-moe-a2.7b", "deepseek-moe-16b", "qwen2.5-7b"):
        s = shipped(name)
        assert ModelShape.from_config(s.to_preset()) == s


TINY = dict(name="m", num_layers=2, hidden_size=8, intermediate_size=16, num_heads=2,
            num_kv_heads=None, head_dim=None, vocab_size=10, max_model_len=32)


@pytest.mark.parametrize("change, message", [
    ({"num_experts_per_tok": 2}, "num_experts_per_tok=2 is a mixture-of-experts setting, but "
                                 "num_experts=0"),
    ({"first_dense_layers": 1}, "first_dense_layers=1 is a mixture-of-experts setting"),
    ({"num_experts": 4, "num_experts_per_tok": 5}, "num_experts_per_tok=5 must be between 1 "
                                                   "and num_experts=4"),
    ({"num_experts": 4, "num_experts_per_tok": 0}, "num_experts_per_tok=0 must be between"),
    ({"num_experts": -1}, "num_experts=-1 must be a whole number >= 0"),
    ({"num_experts": 4, "num_experts_per_tok": 1, "moe_intermediate_size": 0},
     "moe_intermediate_size=0 must be a positive whole number"),
    ({"num_experts": 4, "num_experts_per_tok": 1, "shared_expert_gate": True},
     "shared_expert_gate=true without a shared expert"),
    ({"num_experts": 4, "num_experts_per_tok": 1, "first_dense_layers": 2},
     "first_dense_layers=2 leaves no mixture-of-experts layer of num_layers=2"),
])
def test_bad_moe_fields_are_named(change, message):
    with pytest.raises(ValueError, match=f"model 'm': {message}"):
        ModelShape(**{**TINY, **change})


def test_moe_width_defaults_to_the_mlp():
    s = ModelShape(**TINY, num_experts=4, num_experts_per_tok=1)
    assert s.moe_intermediate_size == 16 and s.is_moe


@pytest.mark.parametrize("name, change, message", [
    ("qwen1.5-moe-a2.7b", {"mlp_only_layers": [0]}, "only a model with an MoE block in every "
                                                    "layer is supported"),
    ("qwen1.5-moe-a2.7b", {"decoder_sparse_step": 2}, "decoder_sparse_step=2"),
    ("qwen1.5-moe-a2.7b", {"num_experts": None}, "model_type 'qwen2_moe' lacks num_experts"),
    ("deepseek-moe-16b", {"moe_layer_freq": 2}, "moe_layer_freq=2"),
    ("deepseek-moe-16b", {"scoring_func": "sigmoid"}, "scoring_func='sigmoid' is not supported"),
    ("mixtral-8x7b", {"num_local_experts": None}, "lacks num_local_experts"),
    # DeepSeek-MoE's file relabelled V2: latent attention's fields are required, not guessed
    ("deepseek-moe-16b", {"model_type": "deepseek_v2"},
     "model_type 'deepseek_v2' lacks kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, "
     "v_head_dim"),
    ("deepseek-moe-16b", {"model_type": "gemma3_text"},
     "model_type 'gemma3_text' is not supported"),
])
def test_layouts_the_shape_cannot_describe_are_refused(name, change, message):
    hf = json.loads((SHIPPED / name / "config.json").read_text())
    hf = {k: v for k, v in {**hf, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=f"cfg.json: .*{message}"):
        ModelShape.from_hf(hf, "cfg.json")
    assert "deepseek" in SUPPORTED_TYPES


# -- model.hf_config, the setting ----------------------------------------------------------------

def _check(*overrides):
    from helpers import composed

    from sarathi_lab.cli.main import check_config
    return check_config(composed(*overrides), list(overrides))


@pytest.mark.slow   # three Hydra compositions
def test_a_config_json_gives_the_run_its_shape(tmp_path):
    # a shipped name, a model directory and a config.json file: one shape, recorded in the
    # run's model node for every reader (the cost model reads the node)
    d = tmp_path / "Llama-3-8B"
    d.mkdir()
    (d / "config.json").write_text((SHIPPED / "llama-3-8b" / "config.json").read_text())
    nodes = [{k: v for k, v in _check("model=hf", f"model.hf_config={ref}", "model.name=l3",
                                      "slo=llama-3-8b-strict").model.items()
              if k != "hf_config"}
             for ref in ("llama-3-8b", d, d / "config.json")]
    assert nodes[0] == nodes[1] == nodes[2]
    assert ModelShape.from_config(nodes[0]) == \
        dataclasses.replace(hand_preset("llama-3-8b"), name="l3")
    # unnamed: the config.json's folder names the model
    assert _check("model=hf", f"model.hf_config={d}",
                  "slo=hf-strict").model["name"] == "Llama-3-8B"
    r = _check("model=mixtral-8x7b", "executor.tensor_parallel=2")
    assert r.model["num_experts"] == 8 and r.model["hf_config"] == "mixtral-8x7b"


def test_model_hf_takes_no_slo_unasked():
    # its default SLO (hf-strict, Mistral-7B's limits) would judge any config.json's model
    from sarathi_lab.settings import ConfigError
    with pytest.raises(ConfigError, match=r"^slo=hf-strict: model=hf .* has no SLO of its own; "
                                          r"choose one for this model's size with slo="):
        _check("model=hf", "model.hf_config=qwen2.5-72b")
    assert _check("model=hf", "model.hf_config=qwen2.5-72b",
                  "slo=llama-2-70b-strict").slo.p99_tbt == 1.0


def test_serving_choices_override_the_config_json():
    r = _check("model=qwen2.5-7b", "model.dtype=float16", "model.max_model_len=4096")
    s = ModelShape.from_config(r.model)
    assert (s.dtype, s.max_model_len, s.num_layers) == ("float16", 4096, 28)


@pytest.mark.parametrize("overrides, message", [
    (["model=hf"], "model.hf_config: must be set: the model preset takes its shape from a "
                   "config.json .*shipped config: deepseek-moe-16b, deepseek-v2-lite, deepseek-v3, "
                   "gemma-2-9b, gpt-oss-20b, llama-2-70b"),
    (["model=hf", "model.hf_config=nosuch"], "model.hf_config='nosuch': no such config.json"),
    (["model=hf", "model.hf_config=llama-3-8b", "model.max_model_len=0"],
     "model.hf_config=llama-3-8b: model 'llama-3-8b': max_model_len=0 must be a positive"),
])
def test_bad_hf_config_settings_are_named(overrides, message):
    from sarathi_lab.settings import ConfigError
    with pytest.raises(ConfigError, match=message):
        _check(*overrides)


def test_a_preset_with_its_own_shape_cannot_take_another_config():
    from sarathi_lab.models.shape import resolve_model
    node = yaml.safe_load((ROOT / "configs" / "model" / "mistral-7b.yaml").read_text())
    with pytest.raises(ValueError, match="model.hf_config=llama-3-8b: the model preset sets "
                       "intermediate_size=14336 .the config.json: 14336.|rope_theta=10000.0 "
                       ".the config.json: 500000.0., .*choose model=hf"):
        resolve_model({**node, "hf_config": "llama-3-8b"})
    # the same values are no clash: a preset may carry the fields of its config.json
    assert resolve_model({**node, "hf_config": "mistral-7b"})["sliding_window"] == 4096
    # on the command line, a hand-written preset has no hf_config key: the error says what to do
    from helpers import cli
    r = cli("model.hf_config=llama-3-8b")
    assert "choose model=hf model.hf_config=PATH" in r.stderr


@pytest.mark.slow   # imports torch
def test_the_real_model_reads_the_same_config(tmp_path):
    from sarathi_lab.models.loader import model_shape
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text((SHIPPED / "mistral-7b" / "config.json").read_text())
    assert model_shape({"name": "x", "hf_config": "mistral-7b", "path": str(d)}) == \
        dataclasses.replace(shipped("mistral-7b"), name="x")
    with pytest.raises(ValueError, match="model.hf_config=llama-3-8b and model.path=.*: their "
                       "config.json files describe different models"):
        model_shape({"name": "x", "hf_config": "llama-3-8b", "path": str(d)})
