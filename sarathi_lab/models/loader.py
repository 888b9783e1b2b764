"""Build a model from a config: a local Hugging Face dir (config.json + safetensors) or a preset's
shape with seeded random weights (tests, benchmarks).

``model`` config keys used here: ``path`` (a Hugging Face model dir, or null), ``random_weights``
(without a path: seeded random weights for a model that is not test-sized), ``init_seed``
(random weights, default 0), ``init_std`` (default 0.02) and, without a path, the preset's shape
(see models.shape.ModelShape.from_config).

Before anything is allocated, `check_memory` sets the model's memory (weights, KV cache,
activations) against what the machine has free: a 7B model in float32 on a laptop is refused
with the estimate, not an out-of-memory kill minutes later.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

import torch

from sarathi_lab.models.dtypes import torch_dtype
from sarathi_lab.models.hf_config import read_shape
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
    """The shape in ``model.path``'s config.json, or else the preset's own (or its
    ``hf_config``'s, which must then agree with the weights' config.json)."""
    if not model_cfg.get("path"):
        return ModelShape.from_config(model_cfg)
    d = _model_dir(model_cfg["path"])
    shape = read_shape(d, model_cfg.get("name"), "model.path")
    if model_cfg.get("hf_config"):
        named = ModelShape.from_config(model_cfg)
        if dataclasses.replace(named, name=shape.name) != shape:
            raise ValueError(f"model.hf_config={model_cfg['hf_config']} and model.path="
                             f"{model_cfg['path']}: their config.json files describe different "
                             "models (set one)")
    return shape


def _empty_model(args: ModelShape, device, dtype) -> LlamaForCausalLM:
    # Built on the target device (not meta: meta-device init pulls in seconds of torch imports);
    # the default init is cheap next to loading and is overwritten anyway.
    # Built in its dtype: built in float32 and cast, a bfloat16 model would need its weights
    # three times over at the peak (a 7B model: 27 GB of float32 beside 13.5 GB of bfloat16).
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(args)
    finally:
        torch.set_default_dtype(default)
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


# Random weights by default only up to this size: test models (tiny-llama, 0.1M parameters; the
# fidelity and chunk-overhead studies' random Llamas, about 5M). A real model's shape without
# its weights is asked for explicitly (model.random_weights=true): its outputs mean nothing.
TEST_SIZED_PARAMS = 100_000_000

# The activations of the largest step, estimated for this many tokens at once (as the
# simulator's executor.activation_tokens, after vLLM's max-size profiling forward): per token the
# residual stream, q/k/v/o, the MLP's gate, up and product, and one row of logits.
ACTIVATION_TOKENS = 8192


def check_weights(model_cfg: dict, args: ModelShape) -> None:
    """A model that is not test-sized needs its weights (``model.path``) or an explicit
    ``model.random_weights=true``; random weights beside a path cannot act."""
    name = model_cfg.get("name")
    if model_cfg.get("path"):
        if model_cfg.get("random_weights"):
            raise ValueError(f"model.random_weights=true with model.path={model_cfg['path']}: "
                             "the weights are loaded from model.path; drop one of the two")
        return
    n = args.num_params()
    if n > TEST_SIZED_PARAMS and not model_cfg.get("random_weights"):
        raise ValueError(
            f"model {name}: {n / 1e9:.2f}B parameters and no model.path: set model.path=DIR (a "
            "Hugging Face model directory: config.json and *.safetensors) to run its weights, "
            "or model.random_weights=true to run seeded random ones (only models of up to "
            f"{TEST_SIZED_PARAMS / 1e6:.0f}M parameters get them without asking)")


def memory_estimate(args: ModelShape, itemsize: int) -> dict[str, int]:
    """Bytes of the weights and of the largest step's activations (`ACTIVATION_TOKENS`)."""
    per_token = (4 * args.hidden_size + 2 * args.num_heads * args.head_dim
                 + 3 * args.intermediate_size + args.vocab_size)
    return {"weights": args.num_params() * itemsize,
            "activations": ACTIVATION_TOKENS * per_token * itemsize}


def check_memory(model_cfg: dict, dtype, kv_bytes: int, kv_setting: str, free: int | None,
                 where: str) -> None:
    """Refuse, before allocating anything, a model whose weights, KV cache (`kv_bytes`, sized by
    `kv_setting`; 0 where the cache takes a share of what is left) and activations exceed the
    `free` bytes of `where` (None: unknown, not checked)."""
    args = model_shape(model_cfg)
    check_weights(model_cfg, args)
    if free is None or kv_bytes > free:
        return   # a KV budget that alone exceeds it is refused by name when the cache is sized
    dt = torch_dtype(dtype, "executor.dtype")
    est = memory_estimate(args, dt.itemsize)
    need = est["weights"] + est["activations"] + kv_bytes
    if need <= free:
        return
    gib = 2 ** 30
    kv = f", KV cache {kv_bytes / gib:.2f} GiB ({kv_setting})" if kv_bytes else ""
    raise ValueError(
        f"model {model_cfg.get('name') or '(unnamed)'}: about {need / gib:.1f} GiB (weights "
        f"{est['weights'] / gib:.2f} GiB in {str(dt).removeprefix('torch.')}{kv}, activations "
        f"{est['activations'] / gib:.2f} GiB for a {ACTIVATION_TOKENS}-token step) but "
        f"{free / gib:.1f} GiB is free on {where}; use a smaller model, a narrower "
        f"executor.dtype{' or a smaller ' + kv_setting if kv_bytes else ''}, or a machine "
        "with more memory")


def load_model(model_cfg: dict, device, dtype) -> LlamaForCausalLM:
    """The model with weights from ``model.path``, or random ones seeded by ``model.init_seed``."""
    args = model_shape(model_cfg)
    check_weights(model_cfg, args)
    model = _empty_model(args, torch.device(device), torch_dtype(dtype, "executor.dtype"))
    if model_cfg.get("path"):
        load_weights(model, _model_dir(model_cfg["path"]))
    else:
        random_init(model, model_cfg.get("init_seed") or 0, model_cfg.get("init_std") or 0.02)
    log.info("model %s: %.1fM parameters, %s on %s", model_cfg.get("name"),
             args.num_params() / 1e6, dtype, device)
    return model
