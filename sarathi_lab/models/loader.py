"""Build a model from a config: a local Hugging Face dir (config.json + safetensors) or a preset's
shape with seeded random weights (tests, benchmarks).

``model`` config keys used here: ``path`` (a Hugging Face model dir, or null), ``init_seed``
(random weights, default 0), ``init_std`` (default 0.02) and, without a path, the preset's shape:
num_layers, hidden_size, intermediate_size, num_heads, num_kv_heads, head_dim, vocab_size,
max_model_len, tie_word_embeddings, rope_theta, rms_norm_eps (optional: rope_scaling,
attention_bias, qkv_bias, mlp_bias).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

from sarathi_lab.models.llama import LlamaForCausalLM, ModelArgs

log = logging.getLogger(__name__)

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
          "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}

# checkpoint name -> (our fused parameter, shard index); shards are concatenated in this order
_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def parse_dtype(name) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    key = str(name).replace("torch.", "").lower()
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}")
    return DTYPES[key]


def _model_dir(path) -> Path:
    d = Path(os.path.expanduser(str(path)))
    if not d.is_dir():
        raise FileNotFoundError(f"model.path={str(path)!r}: no such directory")
    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"model.path={str(path)!r}: no config.json in {d} (expected a "
                                "Hugging Face model directory: config.json + *.safetensors)")
    return d


def args_from_hf(hf: dict, where: str = "config.json") -> ModelArgs:
    """ModelArgs from a Hugging Face config dict (transformers 4.x or 5.x layout)."""
    mtype = hf.get("model_type", "llama")
    if mtype not in SUPPORTED_TYPES:
        raise ValueError(f"{where}: model_type {mtype!r} is not supported "
                         f"({', '.join(SUPPORTED_TYPES)} are)")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{where}: hidden_act {hf['hidden_act']!r} is not supported (silu is)")
    heads = hf["num_attention_heads"]
    # transformers 5 keeps theta and scaling together in rope_parameters; 4.x splits them
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
    if rope.get("rope_type", rope.get("type", "default")) == "default":
        rope = None
    qwen2 = mtype == "qwen2"
    attn_bias = bool(hf.get("attention_bias", False))
    return ModelArgs(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
        num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6), rope_theta=float(theta), rope_scaling=rope,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=qwen2 or attn_bias, o_bias=attn_bias and not qwen2,
        mlp_bias=bool(hf.get("mlp_bias", False)))


_PRESET_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "max_model_len")


def args_from_preset(m: dict) -> ModelArgs:
    missing = [k for k in _PRESET_KEYS if m.get(k) is None]
    if missing:
        raise ValueError(f"model {m.get('name')!r}: without model.path the preset needs "
                         f"{', '.join(missing)} to build a random model")
    return ModelArgs(
        vocab_size=m["vocab_size"], hidden_size=m["hidden_size"],
        intermediate_size=m["intermediate_size"], num_layers=m["num_layers"],
        num_heads=m["num_heads"], num_kv_heads=m.get("num_kv_heads") or m["num_heads"],
        head_dim=m.get("head_dim") or m["hidden_size"] // m["num_heads"],
        max_position_embeddings=m["max_model_len"], rms_norm_eps=m.get("rms_norm_eps", 1e-5),
        rope_theta=float(m.get("rope_theta", 10000.0)), rope_scaling=m.get("rope_scaling"),
        tie_word_embeddings=bool(m.get("tie_word_embeddings", False)),
        qkv_bias=bool(m.get("qkv_bias", m.get("attention_bias", False))),
        o_bias=bool(m.get("attention_bias", False)), mlp_bias=bool(m.get("mlp_bias", False)))


def model_args(model_cfg: dict) -> ModelArgs:
    if model_cfg.get("path"):
        d = _model_dir(model_cfg["path"])
        return args_from_hf(json.loads((d / "config.json").read_text()), str(d / "config.json"))
    return args_from_preset(model_cfg)


def _empty_model(args: ModelArgs, device, dtype) -> LlamaForCausalLM:
    # Built on the target device (not meta: meta-device init pulls in seconds of torch imports);
    # the default init is cheap next to loading and is overwritten anyway.
    with torch.device(device):
        model = LlamaForCausalLM(args)
    return model.to(dtype).eval()


def random_init(model: LlamaForCausalLM, seed: int, std: float = 0.02) -> None:
    g = torch.Generator(device=model.lm_head.weight.device).manual_seed(int(seed))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, std, generator=g)


def _checkpoint_files(d: Path) -> list[Path]:
    index = d / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [d / n for n in names]
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model.path={str(d)!r}: no *.safetensors files in {d} "
                                "(only safetensors checkpoints are supported)")
    return files


def load_weights(model: LlamaForCausalLM, d: Path) -> None:
    from safetensors import safe_open
    params = dict(model.named_parameters())
    a = model.args
    q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    splits = {"qkv_proj": [q, kv, kv], "gate_up_proj": [a.intermediate_size] * 2}
    todo = {n: len(splits.get(n.split(".")[-2], [0])) for n in params}  # shards still missing
    for f in _checkpoint_files(d):
        with safe_open(str(f), framework="pt", device="cpu") as st:
            for key in st.keys():
                if "rotary_emb" in key or (a.tie_word_embeddings and key == "lm_head.weight"):
                    continue   # derived buffers, or a tied head saved anyway
                parts = key.split(".")
                fused = _FUSED.get(parts[-2]) if len(parts) >= 2 else None
                if fused:
                    parts[-2], shard = fused
                name = ".".join(parts)
                if name not in params:
                    raise ValueError(f"{f}: unexpected tensor {key!r} for a {a.num_layers}-layer "
                                     "Llama-family model")
                dst = params[name].data
                if fused:
                    sizes = splits[parts[-2]]
                    dst = dst.narrow(0, sum(sizes[:shard]), sizes[shard])
                t = st.get_tensor(key)
                if t.shape != dst.shape:
                    raise ValueError(f"{f}: {key} has shape {tuple(t.shape)}, the config says "
                                     f"{tuple(dst.shape)}")
                dst.copy_(t)
                todo[name] -= 1
    missing = [n for n, left in todo.items() if left > 0]
    if missing:
        raise ValueError(f"model.path={str(d)!r}: checkpoint lacks {', '.join(missing[:5])}"
                         + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))


def load_model(model_cfg: dict, device, dtype) -> LlamaForCausalLM:
    """The model with weights from ``model.path``, or random ones seeded by ``model.init_seed``."""
    args = model_args(model_cfg)
    model = _empty_model(args, torch.device(device), parse_dtype(dtype))
    if model_cfg.get("path"):
        load_weights(model, _model_dir(model_cfg["path"]))
    else:
        random_init(model, model_cfg.get("init_seed") or 0, model_cfg.get("init_std") or 0.02)
    log.info("model %s: %.1fM parameters, %s on %s", model_cfg.get("name"),
             args.num_params() / 1e6, dtype, device)
    return model
