"""The shape of a Llama-family model (Llama, Mistral, Qwen2), read once for both the cost model and
the real model: from a model preset (configs/model/*.yaml) or from a Hugging Face config.json.

No torch here: the simulator imports this module.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sarathi_lab.models.dtypes import dtype_bytes, dtype_name
from sarathi_lab.settings import plain

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")
_INTS = ("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads",
         "head_dim", "vocab_size", "max_model_len")
_BOOLS = ("tie_word_embeddings", "qkv_bias", "o_bias", "mlp_bias")
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
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{where}: num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, dict):
            raise ValueError(f"{where}: rope_scaling={self.rope_scaling!r} must be a mapping")
        object.__setattr__(self, "dtype", dtype_name(self.dtype, f"{where}: dtype"))
        # a private copy: the caller's dict must not change a frozen shape
        object.__setattr__(self, "rope_scaling", dict(self.rope_scaling)
                           if self.rope_scaling else None)

    def _derived_head_dim(self, where: str) -> int:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"{where}: hidden_size={self.hidden_size} is not a multiple of "
                             f"num_heads={self.num_heads}; set head_dim")
        return self.hidden_size // self.num_heads

    @property
    def dtype_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    def num_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        attn = h * d * (2 * self.num_heads + 2 * self.num_kv_heads)
        layer = attn + 3 * h * self.intermediate_size + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + emb + h

    @classmethod
    def from_config(cls, cfg) -> ModelShape:
        """From a model preset (configs/model/*.yaml), a dict or an OmegaConf config."""
        c = {k: v for k, v in plain(cfg).items() if v is not None}   # YAML null: the default
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
            o_bias=attn_bias, mlp_bias=c.get("mlp_bias", False),
            sliding_window=c.get("sliding_window"))

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
        qwen2 = mtype == "qwen2"
        attn_bias = _flag(hf, "attention_bias", where)
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
                sliding_window=hf.get("sliding_window") if mtype == "mistral" else None)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None


def _flag(c: dict, key: str, where: str) -> bool:
    v = c.get(key, False)
    if not isinstance(v, bool):
        raise ValueError(f"{where}: {key}={v!r} must be true or false")
    return v
