"""Build a model from a config: a local Hugging Face dir (config.json + safetensors) or a preset's
shape with seeded random weights (tests, benchmarks).

``model`` config keys used here: ``path`` (a Hugging Face model dir, or null), ``init_seed``
(random weights, default 0), ``init_std`` (default 0.02) and, without a path, the preset's shape
(see models.shape.ModelShape.from_config).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

from sarathi_lab.models.dtypes import torch_dtype
from sarathi_lab.models.llama import LlamaForCausalLM
from sarathi_lab.models.shape import ModelShape

log = logging.getLogger(__name__)

# checkpoint name -> (our fused parameter, shard index); shards are concatenated in this order
_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def _model_dir(path) -> Path:
    d = Path(os.path.expanduser(str(path)))
    if not d.is_dir():
        raise FileNotFoundError(f"model.path={str(path)!r}: no such directory")
    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"model.path={str(path)!r}: no config.json in {d} (expected a "
                                "Hugging Face model directory: config.json + *.safetensors)")
    return d


def model_shape(model_cfg: dict) -> ModelShape:
    """The shape in ``model.path``'s config.json, or else the preset's own."""
    if not model_cfg.get("path"):
        return ModelShape.from_config(model_cfg)
    f = _model_dir(model_cfg["path"]) / "config.json"
    try:
        hf = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{f}: not valid JSON ({e})") from None
    return ModelShape.from_hf(hf, str(f), name=model_cfg.get("name"))


def _empty_model(args: ModelShape, device, dtype) -> LlamaForCausalLM:
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
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{index}: not a safetensors index (a JSON object with a "
                             f"weight_map): {type(e).__name__}: {e}") from None
        missing = [n for n in names if not (d / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{index} names {', '.join(missing[:3])}, not found in {d}")
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
        try:
            st_file = safe_open(str(f), framework="pt", device="cpu")
        except Exception as e:   # safetensors raises its own error types for a damaged file
            raise ValueError(f"{f}: not a readable safetensors file ({e})") from None
        with st_file as st:
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
    args = model_shape(model_cfg)
    model = _empty_model(args, torch.device(device), torch_dtype(dtype, "executor.dtype"))
    if model_cfg.get("path"):
        load_weights(model, _model_dir(model_cfg["path"]))
    else:
        random_init(model, model_cfg.get("init_seed") or 0, model_cfg.get("init_std") or 0.02)
    log.info("model %s: %.1fM parameters, %s on %s", model_cfg.get("name"),
             args.num_params() / 1e6, dtype, device)
    return model
