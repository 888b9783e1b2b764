"""The shape of a Llama-family model (Llama, Mistral, Qwen2) or of a mixture-of-experts one built
on the same attention (Mixtral; Qwen2-MoE and DeepSeek-MoE with shared + routed experts), read once
for both the cost model and the real model: from a model preset (configs/model/*.yaml) or from a
Hugging Face config.json.

A mixture-of-experts layer replaces the dense MLP with a router (a h x E linear), E routed experts
(each a SwiGLU MLP of width moe_intermediate_size, top-k of them per token) and optionally shared
experts every token goes through (one SwiGLU MLP of total width shared_expert_intermediate_size;
Qwen2-MoE scales its output by a sigmoid gate, a h x 1 linear). DeepSeek-MoE's first
`first_dense_layers` layers keep a dense MLP of intermediate_size.

`model.hf_config` names a config.json (models.hf_config finds it): `resolve_model` fills the model
node's shape keys from it before anything reads the node, so the simulator, the real executor and
the run's recorded config all see the one shape; `dtype` and `max_model_len` in the node are
serving choices (vLLM's --dtype, --max-model-len) and override the file's. Any other shape key the
node sets must agree with the file: a preset's own shape is never silently replaced.

No torch here: the simulator imports this module.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from sarathi_lab.models.dtypes import dtype_bytes, dtype_name
from sarathi_lab.models.hf_config import config_file, shipped_configs
from sarathi_lab.settings import plain

# "deepseek": DeepSeek-MoE (deepseek-moe-16b), plain multi-head attention; not DeepSeek-V2/V3
# (multi-head latent attention, model_type deepseek_v2/v3), whose KV and attention differ
SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "deepseek")
_INTS = ("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads",
         "head_dim", "vocab_size", "max_model_len")
# whole numbers >= 0, 0 meaning none (dense)
_COUNTS = ("num_experts", "num_experts_per_tok", "shared_expert_intermediate_size",
           "first_dense_layers")
_BOOLS = ("tie_word_embeddings", "qkv_bias", "o_bias", "mlp_bias", "shared_expert_gate",
          "norm_topk_prob")
# the MoE fields a dense model (num_experts 0) leaves at their defaults
_MOE_FIELDS = ("num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
               "shared_expert_gate", "first_dense_layers")
# preset keys without a default; the HF names of the same settings
_PRESET_REQUIRED = ("num_layers", "hidden_size", "intermediate_size", "num_heads", "vocab_size",
                    "max_model_len")
_HF_REQUIRED = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "vocab_size")


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int | None           # None: num_heads (no grouped-query attention)
    head_dim: int | None               # None: hidden_size // num_heads
    vocab_size: int
    max_model_len: int                 # positions it is built for (HF max_position_embeddings)
    dtype: str = "bfloat16"            # the weights' element type, as named in models.dtypes
    tie_word_embeddings: bool = False
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # {"rope_type": "linear" | "llama3", ...}, None for plain RoPE; a dict, so left out of the hash
    rope_scaling: dict | None = field(default=None, hash=False)
    qkv_bias: bool = False             # Qwen2; Llama's attention_bias sets it and o_bias
    o_bias: bool = False
    mlp_bias: bool = False
    # Mistral's causal sliding window: each query attends to at most this many keys; None: all
    sliding_window: int | None = None
    # -- mixture of experts (module docstring); the defaults are a dense model
    num_experts: int = 0                    # routed experts per MoE layer; 0: dense
    num_experts_per_tok: int = 0            # top-k
    # FFN width of one routed expert; None: intermediate_size (Mixtral's experts are its MLP)
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int = 0   # total width of the shared expert(s); 0: none
    shared_expert_gate: bool = False        # Qwen2-MoE: sigmoid(x W_g) scales the shared output
    first_dense_layers: int = 0             # leading layers with a dense MLP (DeepSeek)
    # renormalize the chosen k routing weights (Mixtral: softmax over the k chosen logits, the same
    # weights); False: the full softmax's values are used as they are (Qwen2-MoE, DeepSeek)
    norm_topk_prob: bool = True

    def __post_init__(self):
        where = f"model {self.name!r}"
        for key in _INTS:
            v = getattr(self, key)
            if v is None and key in ("num_kv_heads", "head_dim"):
                v = self.num_heads if key == "num_kv_heads" else self._derived_head_dim(where)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 1 \
                    or not float(v).is_integer():
                raise ValueError(f"{where}: {key}={v!r} must be a positive whole number")
            object.__setattr__(self, key, int(v))
        w = self.sliding_window
        if w is not None:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or w < 1 \
                    or not float(w).is_integer():
                raise ValueError(f"{where}: sliding_window={w!r} must be a positive whole number "
                                 "or null")
            object.__setattr__(self, "sliding_window", int(w))
        for key in _BOOLS:
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{where}: {key}={getattr(self, key)!r} must be true or false")
        for key in ("rms_norm_eps", "rope_theta"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
                raise ValueError(f"{where}: {key}={v!r} must be a positive number")
            object.__setattr__(self, key, float(v))
        self._check_moe(where)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{where}: num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, dict):
            raise ValueError(f"{where}: rope_scaling={self.rope_scaling!r} must be a mapping")
        object.__setattr__(self, "dtype", dtype_name(self.dtype, f"{where}: dtype"))
        # a private copy: the caller's dict must not change a frozen shape
        object.__setattr__(self, "rope_scaling", dict(self.rope_scaling)
                           if self.rope_scaling else None)

    def _check_moe(self, where: str) -> None:
        for key in _COUNTS:
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 \
                    or not float(v).is_integer():
                raise ValueError(f"{where}: {key}={v!r} must be a whole number >= 0")
            object.__setattr__(self, key, int(v))
        e, k = self.num_experts, self.num_experts_per_tok
        if e == 0:
            set_ = [f for f in _MOE_FIELDS if getattr(self, f) != ModelShape.__dataclass_fields__[
                f].default]
            if set_:
                raise ValueError(f"{where}: {set_[0]}={getattr(self, set_[0])!r} is a "
                                 "mixture-of-experts setting, but num_experts=0 (dense)")
            return
        if not 1 <= k <= e:
            raise ValueError(f"{where}: num_experts_per_tok={k} must be between 1 and "
                             f"num_experts={e}")
        w = self.moe_intermediate_size
        if w is None:
            w = self.intermediate_size
        if isinstance(w, bool) or not isinstance(w, (int, float)) or w < 1 \
                or not float(w).is_integer():
            raise ValueError(f"{where}: moe_intermediate_size={w!r} must be a positive whole "
                             "number or null")
        object.__setattr__(self, "moe_intermediate_size", int(w))
        if self.shared_expert_gate and not self.shared_expert_intermediate_size:
            raise ValueError(f"{where}: shared_expert_gate=true without a shared expert "
                             "(shared_expert_intermediate_size=0)")
        if self.first_dense_layers >= self.num_layers:
            raise ValueError(f"{where}: first_dense_layers={self.first_dense_layers} leaves no "
                             f"mixture-of-experts layer of num_layers={self.num_layers}")

    def _derived_head_dim(self, where: str) -> int:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"{where}: hidden_size={self.hidden_size} is not a multiple of "
                             f"num_heads={self.num_heads}; set head_dim")
        return self.hidden_size // self.num_heads

    @property
    def dtype_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def moe_layers(self) -> int:
        """Layers with a mixture-of-experts block (the rest have a dense MLP)."""
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    def attention_params(self) -> int:
        """One layer's attention weights: Q, K, V, O (and their biases)."""
        h, d, H, K = self.hidden_size, self.head_dim, self.num_heads, self.num_kv_heads
        return h * d * (2 * H + 2 * K) + (H + 2 * K) * d * self.qkv_bias + h * self.o_bias

    def mlp_params(self, width: int) -> int:
        """One SwiGLU MLP of `width`: gate, up and down projections (and their biases)."""
        h = self.hidden_size
        return 3 * h * width + (2 * width + h) * self.mlp_bias

    def moe_params(self, experts: int | None = None) -> int:
        """One MoE block's weights with `experts` routed experts (default: all of them): the
        router, those experts, the shared expert(s) and their gate."""
        e = self.num_experts if experts is None else experts
        h = self.hidden_size
        shared = self.mlp_params(self.shared_expert_intermediate_size) \
            if self.shared_expert_intermediate_size else 0
        return h * self.num_experts + e * self.mlp_params(self.moe_intermediate_size) \
            + shared + h * self.shared_expert_gate

    def num_params(self, experts: int | None = None) -> int:
        """Every weight; `experts` routed experts per MoE layer instead of all of them
        (active_params: top-k)."""
        h, L = self.hidden_size, self.num_layers
        dense = L - self.moe_layers
        layers = L * (self.attention_params() + 2 * h) \
            + dense * self.mlp_params(self.intermediate_size) \
            + self.moe_layers * (self.moe_params(experts) if self.is_moe else 0)
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return layers + emb + h

    def active_params(self) -> int:
        """The weights one token goes through: top-k routed experts per MoE layer (all the
        weights of a dense model); embedding and LM head counted, as the published "active"
        figures do (Mixtral-8x7B: 12.9B)."""
        return self.num_params(self.num_experts_per_tok if self.is_moe else None)

    def kv_bytes_per_token(self, dtype: str | None = None) -> int:
        """Bytes of one token's K and V over every layer, all KV heads, in `dtype` (default
        the model's)."""
        b = dtype_bytes(dtype) if dtype else self.dtype_bytes
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * b

    def to_preset(self) -> dict:
        """The preset keys (configs/model/*.yaml) that give this shape back by from_config."""
        out = {f: getattr(self, f) for f in self.__dataclass_fields__}
        if out["rope_scaling"] is not None:
            out["rope_scaling"] = dict(out["rope_scaling"])
        return out

    @classmethod
    def from_config(cls, cfg) -> ModelShape:
        """From a model preset (configs/model/*.yaml), a dict or an OmegaConf config; one that
        names a config.json (hf_config) gets its shape from it (models.hf_config)."""
        c = {k: v for k, v in plain(cfg).items() if v is not None}   # YAML null: the default
        if c.get("hf_config"):
            c = {k: v for k, v in resolve_model(c).items() if v is not None}
        name = str(c.get("name", "model"))
        missing = [k for k in _PRESET_REQUIRED if k not in c]
        if missing:
            raise ValueError(f"model {name!r}: the preset lacks {', '.join(missing)}")
        attn_bias = _flag(c, "attention_bias", f"model {name!r}")
        return cls(
            name=name, num_layers=c["num_layers"], hidden_size=c["hidden_size"],
            intermediate_size=c["intermediate_size"], num_heads=c["num_heads"],
            num_kv_heads=c.get("num_kv_heads"), head_dim=c.get("head_dim"),
            vocab_size=c["vocab_size"], max_model_len=c["max_model_len"],
            dtype=c.get("dtype", "bfloat16"),
            tie_word_embeddings=c.get("tie_word_embeddings", False),
            rms_norm_eps=c.get("rms_norm_eps", 1e-5), rope_theta=c.get("rope_theta", 10000.0),
            rope_scaling=c.get("rope_scaling"), qkv_bias=c.get("qkv_bias", attn_bias),
            o_bias=c.get("o_bias", attn_bias), mlp_bias=c.get("mlp_bias", False),
            sliding_window=c.get("sliding_window"),
            **{k: c[k] for k in _MOE_FIELDS + ("num_experts", "norm_topk_prob") if k in c})

    @classmethod
    def from_hf(cls, hf: dict, where: str = "config.json", name: str | None = None) -> ModelShape:
        """From a Hugging Face config.json (transformers 4.x or 5.x layout); `where` names it in
        errors, `name` (default: the config's own) names the model."""
        if not isinstance(hf, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(hf).__name__}")
        hf = {k: v for k, v in hf.items() if v is not None}
        mtype = hf.get("model_type", "llama")
        if mtype not in SUPPORTED_TYPES:
            raise ValueError(f"{where}: model_type {mtype!r} is not supported "
                             f"({', '.join(SUPPORTED_TYPES)} are)")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{where}: hidden_act {hf['hidden_act']!r} is not supported "
                             "(silu is)")
        missing = [k for k in _HF_REQUIRED if k not in hf]
        if missing:
            raise ValueError(f"{where}: lacks {', '.join(missing)}")
        # transformers 5 keeps theta and scaling together in rope_parameters; 4.x splits them
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
        if rope.get("rope_type", rope.get("type", "default")) == "default":
            rope = None
        qwen2 = mtype in ("qwen2", "qwen2_moe")
        attn_bias = _flag(hf, "attention_bias", where)
        moe = _hf_moe(hf, mtype, where)
        try:
            return cls(
                name=str(name or hf.get("_name_or_path") or where),
                num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
                intermediate_size=hf["intermediate_size"], num_heads=hf["num_attention_heads"],
                num_kv_heads=hf.get("num_key_value_heads"), head_dim=hf.get("head_dim"),
                vocab_size=hf["vocab_size"],
                max_model_len=hf.get("max_position_embeddings", 2048),
                # transformers 5 writes "dtype", 4.x "torch_dtype"
                dtype=hf.get("dtype", hf.get("torch_dtype", "bfloat16")),
                tie_word_embeddings=hf.get("tie_word_embeddings", False),
                rms_norm_eps=hf.get("rms_norm_eps", 1e-6), rope_theta=theta, rope_scaling=rope,
                qkv_bias=qwen2 or attn_bias, o_bias=attn_bias and not qwen2,
                mlp_bias=hf.get("mlp_bias", False),
                # Qwen2 configs name a window they do not use (use_sliding_window: false)
                sliding_window=hf.get("sliding_window") if mtype in ("mistral", "mixtral")
                else None, **moe)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None


def _hf_moe(hf: dict, mtype: str, where: str) -> dict:
    """The MoE fields of a Hugging Face config.json (none for a dense model_type); refuses the
    layouts this shape cannot describe (MoE on some layers only, other routing functions)."""
    def need(*keys):
        missing = [k for k in keys if k not in hf]
        if missing:
            raise ValueError(f"{where}: model_type {mtype!r} lacks {', '.join(missing)}")
    if mtype == "mixtral":
        need("num_local_experts", "num_experts_per_tok")
        return {"num_experts": hf["num_local_experts"], "num_experts_per_tok":
                hf["num_experts_per_tok"], "moe_intermediate_size": hf["intermediate_size"]}
    if mtype == "qwen2_moe":
        need("num_experts", "num_experts_per_tok", "moe_intermediate_size")
        if hf.get("decoder_sparse_step", 1) != 1 or hf.get("mlp_only_layers"):
            raise ValueError(f"{where}: decoder_sparse_step={hf.get('decoder_sparse_step')!r}, "
                             f"mlp_only_layers={hf.get('mlp_only_layers')!r}: only a model with "
                             "an MoE block in every layer is supported (1 and [])")
        shared = hf.get("shared_expert_intermediate_size", 0)
        return {"num_experts": hf["num_experts"], "num_experts_per_tok":
                hf["num_experts_per_tok"], "moe_intermediate_size": hf["moe_intermediate_size"],
                "shared_expert_intermediate_size": shared, "shared_expert_gate": bool(shared),
                "norm_topk_prob": _flag(hf, "norm_topk_prob", where)}
    if mtype == "deepseek":
        need("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size")
        if hf.get("moe_layer_freq", 1) != 1:
            raise ValueError(f"{where}: moe_layer_freq={hf['moe_layer_freq']!r}: only an MoE "
                             "block in every layer after first_k_dense_replace is supported (1)")
        if hf.get("scoring_func", "softmax") != "softmax":
            raise ValueError(f"{where}: scoring_func={hf['scoring_func']!r} is not supported "
                             "(softmax is)")
        shared = hf.get("n_shared_experts", 0)
        if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
            raise ValueError(f"{where}: n_shared_experts={shared!r} must be a whole number >= 0")
        return {"num_experts": hf["n_routed_experts"], "num_experts_per_tok":
                hf["num_experts_per_tok"], "moe_intermediate_size": hf["moe_intermediate_size"],
                "shared_expert_intermediate_size": shared * hf["moe_intermediate_size"],
                "first_dense_layers": hf.get("first_k_dense_replace", 0),
                "norm_topk_prob": _flag(hf, "norm_topk_prob", where)}
    return {}


def _flag(c: dict, key: str, where: str) -> bool:
    v = c.get(key, False)
    if not isinstance(v, bool):
        raise ValueError(f"{where}: {key}={v!r} must be true or false")
    return v


#: node keys that override the config.json's (how the model is served, not what it is)
SERVING_KEYS = ("dtype", "max_model_len")


def read_shape(ref, name: str | None = None, where: str = "model.hf_config") -> ModelShape:
    """The shape in the config.json `ref` names; `name` (default: its folder's) names the model."""
    f = config_file(ref, where)
    try:
        hf = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}={str(ref)!r}: {f} is not valid JSON ({e})") from None
    return ModelShape.from_hf(hf, str(f), name=name or f.parent.name)


def resolve_model(node: dict, where: str = "model") -> dict:
    """The model node with its shape keys filled from `hf_config` (the node itself without)."""
    ref = node.get("hf_config")
    if not ref:
        return node
    if ref == "???":   # configs/model/hf.yaml's placeholder (Hydra's "must be set")
        raise ValueError(f"{where}.hf_config: must be set: the model preset takes its shape from "
                         f"a config.json ({where}.hf_config=PATH: a config.json, a model "
                         f"directory, or a shipped config: {', '.join(shipped_configs())})")
    shape = read_shape(ref, node.get("name"), f"{where}.hf_config")
    serving = {k: node[k] for k in SERVING_KEYS if node.get(k) is not None}
    if serving:
        try:
            shape = ModelShape(**{**shape.to_preset(), **serving})
        except ValueError as e:
            raise ValueError(f"{where}.hf_config={ref}: {e}") from None
    keys = shape.to_preset()
    clash = [f"{k}={node[k]!r} (the config.json: {keys[k]!r})" for k in keys
             if k not in SERVING_KEYS and k != "name" and node.get(k) is not None
             and node[k] != keys[k]]
    if clash:
        raise ValueError(
            f"{where}.hf_config={ref}: the model preset sets {', '.join(clash)}; a preset with "
            f"a shape of its own cannot take another's config.json: choose model=hf "
            f"{where}.hf_config={ref} (a preset with no shape), or a preset of this model")
    return {**node, **keys}
