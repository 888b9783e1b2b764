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
from sarathi_lab.models.hf_config import config_file
from sarathi_lab.models.llama import LlamaForCausalLM
from sarathi_lab.models.shape import FAMILY_FIELDS, ModelShape, read_shape

log = logging.getLogger(__name__)

# checkpoint name -> (our fused parameter, shard index); shards are concatenated in this order.
# Mixtral's expert projections: w1 gate, w3 up, w2 down.
_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
          "w1": ("gate_up_proj", 0), "w3": ("gate_up_proj", 1), "w2": ("down_proj", None),
          "down_proj": ("down_proj", None)}
# the config.json model types whose weights this loader reads and whose forward llama.py computes
# (tests/test_moe_torch.py and test_model.py check each against transformers); the simulator reads
# more (models/shape.py's SUPPORTED_TYPES), e.g. DeepSeek-MoE, whose checkpoints need remote code
REAL_TYPES = ("llama", "mistral", "qwen2", "mixtral", "qwen2_moe")
# Mixtral's MoE block is named block_sparse_moe in its checkpoints; ours is mlp, as Qwen2-MoE's
_RENAMED = {"block_sparse_moe": "mlp"}


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
    if model_cfg.get("hf_config"):
        _check_real_type(config_file(model_cfg["hf_config"]), "model.hf_config")
    if not model_cfg.get("path"):
        return _check_real_family(ModelShape.from_config(model_cfg))
    d = _model_dir(model_cfg["path"])
    _check_real_type(d / "config.json", "model.path")
    shape = read_shape(d, model_cfg.get("name"), "model.path")
    if model_cfg.get("hf_config"):
        named = ModelShape.from_config(model_cfg)
        if dataclasses.replace(named, name=shape.name) != shape:
            raise ValueError(f"model.hf_config={model_cfg['hf_config']} and model.path="
                             f"{model_cfg['path']}: their config.json files describe different "
                             "models (set one)")
    return shape


def _check_real_family(shape: ModelShape) -> ModelShape:
    """Refuse a preset whose attention family the real model does not compute (latent attention,
    q/k norms, local and global layers, Gemma's norms and GeGLU): the simulator prices them, the
    forward here would silently be another model's."""
    odd = [k for k in FAMILY_FIELDS
           if getattr(shape, k) != ModelShape.__dataclass_fields__[k].default]
    if odd:
        raise ValueError(f"model {shape.name!r}: {odd[0]}={getattr(shape, odd[0])!r} is not run "
                         "by the real executor (the simulator prices it)")
    return shape


def _check_real_type(f: Path, where: str) -> None:
    """Refuse a config.json whose model type the real executor does not run (the simulator may:
    models/shape.py's SUPPORTED_TYPES), naming what it runs."""
    try:
        mtype = json.loads(f.read_text()).get("model_type", "llama")
    except (ValueError, AttributeError):
        return   # not a JSON object: read_shape says so, naming the file
    if mtype not in REAL_TYPES:
        raise ValueError(f"{where}: {f}: model_type {mtype!r} does not run on the real executor "
                         f"(executor=torch runs {', '.join(REAL_TYPES)}: the architectures whose "
                         "forward it computes and whose checkpoints it reads; the simulator "
                         "prices more)")


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


def _target(key: str) -> tuple[str, int | None, int | None]:
    """Our parameter for checkpoint tensor `key`, the expert it is one slice of (a stacked
    ``experts.*`` parameter) or None, and its shard of a fused projection or None."""
    parts = [_RENAMED.get(p, p) for p in key.split(".")]
    if len(parts) >= 4 and parts[-4] == "experts" and parts[-3].isdigit() \
            and parts[-2] in _FUSED and parts[-1] == "weight":
        # experts.{i}.{proj}.weight -> experts.{gate_up_proj|down_proj}[i]
        name, shard = _FUSED[parts[-2]]
        return ".".join(parts[:-3] + [name]), int(parts[-3]), shard
    fused = _FUSED.get(parts[-2]) if len(parts) >= 2 else None
    if fused and fused[1] is not None:
        parts[-2] = fused[0]
        return ".".join(parts), None, fused[1]
    return ".".join(parts), None, None


def load_weights(model: LlamaForCausalLM, d: Path) -> None:
    from safetensors import safe_open
    params = dict(model.named_parameters())
    a = model.args
    q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    # each parameter's pieces: (expert, shard) pairs, all of which the checkpoint must hold
    todo = {}
    for n, p in params.items():
        last = n.split(".")[-1 if ".experts." in n else -2]
        experts = range(p.shape[0]) if ".experts." in n else [None]
        shards = {"qkv_proj": range(3), "gate_up_proj": range(2)}.get(last, [None])
        todo[n] = {(e, s) for e in experts for s in shards}
    for f in _checkpoint_files(d):
        try:
            st_file = safe_open(str(f), framework="pt", device="cpu")
        except Exception as e:   # safetensors raises its own error types for a damaged file
            raise ValueError(f"{f}: not a readable safetensors file ({e})") from None
        with st_file as st:
            for key in st.keys():
                if "rotary_emb" in key or (a.tie_word_embeddings and key == "lm_head.weight"):
                    continue   # derived buffers, or a tied head saved anyway
                name, expert, shard = _target(key)
                if name not in params:
                    raise ValueError(f"{f}: unexpected tensor {key!r} for a {a.num_layers}-layer "
                                     f"{_kind(a)} model")
                dst = params[name].data
                if expert is not None:
                    if expert >= dst.shape[0]:
                        raise ValueError(f"{f}: {key} is expert {expert}, the config says "
                                         f"{dst.shape[0]} experts")
                    dst = dst[expert]
                if shard is not None:
                    # qkv: q, k, v rows; gate_up: gate then up, halves
                    sizes = [q, kv, kv] if ".qkv_proj." in name else [dst.shape[0] // 2] * 2
                    dst = dst.narrow(0, sum(sizes[:shard]), sizes[shard])
                t = st.get_tensor(key)
                if t.shape != dst.shape:
                    raise ValueError(f"{f}: {key} has shape {tuple(t.shape)}, the config says "
                                     f"{tuple(dst.shape)}")
                dst.copy_(t)
                if expert is None and shard is None and ".experts." in name:
                    todo[name].clear()   # a stacked tensor saved whole (transformers 5 layout)
                todo[name].discard((expert, shard))
    missing = [n for n, left in todo.items() if left]
    if missing:
        raise ValueError(f"model.path={str(d)!r}: checkpoint lacks {', '.join(missing[:5])}"
                         + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))


def _kind(a: ModelShape) -> str:
    return f"mixture-of-experts ({a.num_experts} experts)" if a.is_moe else "Llama-family"

# Random weights by default only up to this size: test models (tiny-llama, 0.1M parameters; the
# fidelity and chunk-overhead studies' random Llamas, about 5M). A real model's shape without
# its weights is asked for explicitly (model.random_weights=true): its outputs mean nothing.
TEST_SIZED_PARAMS = 100_000_000

# The activations of the largest step, estimated for this many tokens at once (as the
# simulator's executor.activation_tokens, after vLLM's max-size profiling forward): per token the
# residual stream, q/k/v/o, the MLP's gate, up and product, and one row of logits; an MoE layer's
# MLP holds that for each of a token's k experts and the shared expert, plus its router's scores
# and the token's gathered copy per expert.
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
    mlp = 3 * args.intermediate_size
    if args.is_moe:
        k = args.num_experts_per_tok
        moe = (3 * (k * args.moe_intermediate_size + args.shared_expert_intermediate_size)
               + 2 * args.num_experts + 2 * k * args.hidden_size)
        mlp = max(mlp if args.first_dense_layers else 0, moe)
    per_token = (4 * args.hidden_size + 2 * args.num_heads * args.head_dim + mlp
                 + args.vocab_size)
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
