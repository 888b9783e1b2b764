"""One model shape for the cost model and the real model, one dtype table: parsing presets and
Hugging Face configs, their errors, and that both models read the same shape."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import patience

from sarathi_lab.costmodels.roofline import RooflineCostModel
from sarathi_lab.models.dtypes import dtype_bytes, dtype_name, torch_dtype
from sarathi_lab.models.shape import ModelShape

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# the hand-written presets (the others point at a config.json: tests/test_hf_config.py)
PRESETS = sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml")
                 if "hf_config" not in yaml.safe_load(p.read_text()))


def preset(name):
    return yaml.safe_load((CONFIGS / "model" / f"{name}.yaml").read_text())


def hf_of(p: dict, **extra) -> dict:
    """The Hugging Face config.json of a preset's model, written out by hand."""
    return {"model_type": "llama", "hidden_act": "silu", "num_hidden_layers": p["num_layers"],
            "hidden_size": p["hidden_size"], "intermediate_size": p["intermediate_size"],
            "num_attention_heads": p["num_heads"], "num_key_value_heads": p["num_kv_heads"],
            "head_dim": p["head_dim"], "vocab_size": p["vocab_size"],
            "max_position_embeddings": p["max_model_len"], "torch_dtype": p["dtype"],
            "tie_word_embeddings": p["tie_word_embeddings"], "rope_theta": p["rope_theta"],
            "rms_norm_eps": p["rms_norm_eps"],
            **({"model_type": "mistral", "sliding_window": p["sliding_window"]}
               if p.get("sliding_window") else {}), **extra}


@pytest.mark.parametrize("name", PRESETS)
def test_preset_and_its_hf_config_give_one_shape(name):
    p = preset(name)
    a = ModelShape.from_config(p)
    assert ModelShape.from_hf(hf_of(p), name=p["name"]) == a
    assert (a.num_layers, a.hidden_size, a.num_kv_heads, a.head_dim) == \
        (p["num_layers"], p["hidden_size"], p["num_kv_heads"], p["head_dim"])
    assert a.dtype_bytes == {"bfloat16": 2, "float32": 4}[p["dtype"]]


def test_the_cost_model_prices_the_weights_the_real_model_has():
    import torch

    from sarathi_lab.models.loader import load_model
    p = preset("tiny-llama")
    shape = ModelShape.from_config(p)
    hw = yaml.safe_load((CONFIGS / "hardware" / "a100-80gb.yaml").read_text())
    cm = RooflineCostModel(p, hw)
    real = load_model(p, "cpu", "float32")
    assert cm.model == shape == real.args
    n = sum(t.numel() for t in real.parameters())
    assert n == shape.num_params()
    assert cm.weight_bytes == n * 4             # tiny-llama's preset dtype is float32
    assert cm.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4   # layers x (K, V) x kv heads x d x b
    assert real.lm_head.weight.dtype == torch.float32


def test_defaults_are_derived_not_guessed():
    s = ModelShape.from_config({"name": "m", "num_layers": 2, "hidden_size": 96,
                                "intermediate_size": 128, "num_heads": 6, "vocab_size": 10,
                                "max_model_len": 32, "num_kv_heads": None})
    assert (s.num_kv_heads, s.head_dim, s.dtype, s.dtype_bytes) == (6, 16, "bfloat16", 2)
    hf = ModelShape.from_hf({"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 8,
                             "num_attention_heads": 4, "vocab_size": 10, "model_type": "qwen2",
                             "rope_scaling": {"rope_type": "linear", "factor": 2.0},
                             "dtype": "float16"}, name="q")
    assert (hf.num_kv_heads, hf.head_dim, hf.max_model_len, hf.rms_norm_eps) == (4, 16, 2048, 1e-6)
    assert (hf.qkv_bias, hf.o_bias, hf.dtype) == (True, False, "float16")
    assert hf.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    # transformers 5: theta inside rope_parameters; "default" means no scaling
    v5 = ModelShape.from_hf({**hf_of(preset("llama-3-8b")), "rope_theta": None,
                             "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}})
    assert v5.rope_theta == 5e5 and v5.rope_scaling is None
    hash(hf)   # usable as a key although rope_scaling is a dict


def test_a_shape_is_frozen_and_owns_its_rope_dict():
    rope = {"rope_type": "linear", "factor": 2.0}
    s = ModelShape(name="m", num_layers=1, hidden_size=8, intermediate_size=8, num_heads=2,
                   num_kv_heads=None, head_dim=None, vocab_size=4, max_model_len=8,
                   rope_scaling=rope)
    rope["factor"] = 8.0
    assert s.rope_scaling["factor"] == 2.0
    with pytest.raises(AttributeError):
        s.num_layers = 2


BASE = dict(name="m", num_layers=2, hidden_size=64, intermediate_size=128, num_heads=4,
            vocab_size=10, max_model_len=32)


@pytest.mark.parametrize("change, message", [
    ({"num_layers": None}, "model 'm': the preset lacks num_layers"),
    ({"vocab_size": None, "max_model_len": None}, "lacks vocab_size, max_model_len"),
    ({"num_layers": 0}, "num_layers=0 must be a positive whole number"),
    ({"hidden_size": "64"}, "hidden_size='64' must be a positive whole number"),
    ({"intermediate_size": 127.5}, "intermediate_size=127.5 must be"),
    ({"max_model_len": float("nan")}, "max_model_len=nan must be"),
    ({"num_heads": True}, "num_heads=True must be"),
    ({"hidden_size": 66}, "hidden_size=66 is not a multiple of num_heads=4; set head_dim"),
    ({"num_kv_heads": 3}, "num_heads=4 is not a multiple of num_kv_heads=3"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings='no' must be true or false"),
    ({"attention_bias": 1}, "attention_bias=1 must be true or false"),
    ({"rms_norm_eps": 0}, "rms_norm_eps=0 must be a positive number"),
    ({"rope_scaling": [2.0]}, "rope_scaling=.2.0. must be a mapping"),
    ({"dtype": "int4"}, "model 'm': dtype='int4': unknown dtype; expected one of float32"),
])
def test_bad_preset_values_are_named(change, message):
    cfg = {**BASE, **change}
    with pytest.raises(ValueError, match=message):
        ModelShape.from_config({k: v for k, v in cfg.items() if v is not None})


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gpt2"}, "cfg.json: model_type 'gpt2' is not supported"),
    ({"hidden_act": "gelu"}, "cfg.json: hidden_act 'gelu' is not supported"),
    ({"num_hidden_layers": None}, "cfg.json: lacks num_hidden_layers"),
    ({"num_key_value_heads": 0}, "cfg.json: model .*num_kv_heads=0 must be"),
    ({"torch_dtype": "float64"}, "cfg.json: .*dtype='float64': unknown dtype"),
])
def test_bad_hf_values_name_the_file(change, message):
    hf = {k: v for k, v in {**hf_of(preset("llama-2-7b")), **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        ModelShape.from_hf(hf, "cfg.json")
    with pytest.raises(ValueError, match="cfg.json: expected a JSON object, got list"):
        ModelShape.from_hf([], "cfg.json")


def test_one_dtype_table():
    import torch
    for names, nbytes, td in ((("bfloat16", "bf16", "BF16", "torch.bfloat16"), 2, torch.bfloat16),
                              (("float16", "fp16", "half"), 2, torch.float16),
                              (("float32", "fp32", "float", torch.float32), 4, torch.float32)):
        for n in names:
            assert dtype_bytes(n) == nbytes and torch_dtype(n) is td
            assert dtype_name(n) == str(td).removeprefix("torch.")
            assert td.itemsize == nbytes
    assert dtype_bytes("fp8") == 1
    with pytest.raises(ValueError, match=r"executor.dtype='fp8': the torch executor does not "
                                         r"run float8 \(it runs float32, float16, bfloat16\)"):
        torch_dtype("fp8", "executor.dtype")
    # int8 is priced (quantized weights in the roofline), not run
    assert dtype_bytes("int8") == 1
    with pytest.raises(ValueError, match="executor.dtype='int8': the torch executor does not "
                                         "run int8"):
        torch_dtype("int8", "executor.dtype")
    with pytest.raises(ValueError, match="executor.dtype='int4': unknown dtype"):
        torch_dtype("int4", "executor.dtype")


def test_the_cost_model_and_the_shape_import_no_torch():
    code = ("import sys; import sarathi_lab.costmodels.roofline, sarathi_lab.models.shape, "
            "sarathi_lab.models.dtypes; print(sorted(m for m in ('torch', 'triton') "
            "if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=patience(60))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
