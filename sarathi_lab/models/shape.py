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
_MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
               "v_head_dim")
SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek",
                   "deepseek_v2", "deepseek_v3", "gemma2", "gpt_oss")

# Every config.json field is understood or refused, never ignored: a field the reader does not
# know may change the model's shape (a latent KV, a window on some layers, sinks, quantized
# weights), so a file carrying one is refused naming it. The fields below are the ones read
# (_READ, _READ_BY_TYPE) and those that cannot change what a forward computes or holds:
# identifiers, token ids, training-only settings (initialisation, dropout, auxiliary losses,
# Llama's pretraining_tp, which splits the training matmuls with the same result), and fields
# that only matter with a setting _MUST_BE refuses otherwise.
_METADATA = frozenset((
    "architectures", "model_type", "transformers_version", "_name_or_path", "auto_map",
    "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "initializer_range",
    "attention_dropout", "pretraining_tp", "is_llama_config", "transformers.js_config",
    "output_router_logits", "router_aux_loss_coef", "router_jitter_noise", "aux_loss_alpha",
    "seq_aux",
    # Qwen2's layers below max_window_layers use sliding_window only if use_sliding_window
    "max_window_layers"))
_READ = frozenset((
    "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "dtype",
    "torch_dtype", "tie_word_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
    "rope_parameters", "attention_bias", "mlp_bias", "hidden_act"))
# DeepSeek-V2/V3 beyond the MoE: latent attention, the routing function and its groups (which
# experts, not how many: the same cost); transformers 5 adds qk_head_dim (nope + rope), head_dim
# (the RoPE part) and rope_interleave (the order RoPE pairs dimensions in: the same work)
_DEEPSEEK_V2 = ("topk_method", "n_group", "topk_group", "routed_scaling_factor", "ep_size",
                "qk_head_dim", "rope_interleave")
_DEEPSEEK_MOE = ("n_routed_experts", "n_shared_experts", "num_experts_per_tok",
                 "moe_intermediate_size", "first_k_dense_replace", "moe_layer_freq",
                 "scoring_func", "norm_topk_prob")
_QWEN_MOE = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
             "mlp_only_layers", "norm_topk_prob")
# Qwen2 configs name a window they do not use (use_sliding_window: false, _MUST_BE)
_QWEN_WINDOW = ("sliding_window", "use_sliding_window", "layer_types")
_READ_BY_TYPE = {
    "llama": ("rope_interleaved",), "mistral": ("sliding_window",),
    "qwen2": _QWEN_WINDOW + ("qkv_bias", "use_mrope"),
    "mixtral": ("sliding_window", "num_local_experts", "num_experts_per_tok"),
    "qwen2_moe": _QWEN_WINDOW + _QWEN_MOE + ("shared_expert_intermediate_size", "qkv_bias"),
    # transformers 5 writes Qwen3-MoE's num_experts as num_local_experts
    "qwen3_moe": _QWEN_WINDOW + _QWEN_MOE + ("num_local_experts",),
    "deepseek": _DEEPSEEK_MOE,
    # num_nextn_predict_layers: V3's multi-token-prediction module, loaded only to draft
    # tokens (speculation), so not part of the served model (671B leaves its 14B out)
    "deepseek_v2": _DEEPSEEK_MOE + _MLA_FIELDS + _DEEPSEEK_V2,
    "deepseek_v3": _DEEPSEEK_MOE + _MLA_FIELDS + _DEEPSEEK_V2 + ("num_nextn_predict_layers",),
}
# Gemma 2: local (windowed) and global layers alternating, layer_types naming them in
# transformers 5 (sliding_window_size: an older name of sliding_window); tanh soft-capping of
# the attention and final logits and the query scale change values, not the work (a few
# elementwise operations per score, not priced); cache_implementation: transformers' own cache
_READ_BY_TYPE["gemma2"] = (
    "sliding_window", "sliding_window_size", "layer_types", "hidden_activation",
    "attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar",
    "cache_implementation")
# GPT-OSS: local (sliding_window 128) and global layers named by layer_types, attention sinks,
# biases on attention, experts and router; swiglu_limit clamps the gate (values, not work);
# experts_per_token repeats num_experts_per_tok; initial_context_length is the YaRN base
# (rope_scaling carries it too)
_READ_BY_TYPE["gpt_oss"] = (
    "sliding_window", "layer_types", "num_local_experts", "num_experts_per_tok",
    "experts_per_token", "swiglu_limit", "initial_context_length")
# fields read only to check that they keep their default: value -> what it must be
_MUST_BE = {"use_sliding_window": False, "use_mrope": False, "rope_interleaved": False}
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
_FAMILY_FIELDS = ("qk_norm", "full_attention_layers", "norms_per_layer", "hidden_act",
                  "attention_sinks", "router_bias") + _MLA_FIELDS
#: the fields beyond a Llama/MoE layer (the real executor refuses a shape that sets one)
FAMILY_FIELDS = _FAMILY_FIELDS
_ACTS = ("silu", "gelu_pytorch_tanh")
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
    # -- attention families (the defaults: plain grouped-query attention; to_preset leaves them
    # out at their defaults, so a recorded config of the other families is unchanged)
    # Qwen3: an RMSNorm over each query and key head (head_dim weights each) before RoPE
    qk_norm: bool = False
    # layers with full attention when sliding_window is set (the others windowed: Gemma 2's
    # alternating local/global layers); 0: every layer windowed (Mistral)
    full_attention_layers: int = 0
    # RMSNorms per layer (Gemma 2: 4, before and after attention and the MLP)
    norms_per_layer: int = 2
    # the MLP's gate activation: silu (SwiGLU) or gelu_pytorch_tanh (Gemma's GeGLU: the same
    # three matrices, the same cost)
    hidden_act: str = "silu"
    # GPT-OSS: attention sinks (a learned logit per head that every query's softmax also
    # normalises over: num_heads weights a layer, nothing in the KV cache) and a bias on the
    # router's logits (num_experts weights a MoE layer)
    attention_sinks: bool = False
    router_bias: bool = False
    # DeepSeek-V2/V3 multi-head latent attention (MLA): the cache holds, per token and layer, one
    # latent of kv_lora_rank plus one decoupled RoPE key of qk_rope_head_dim, shared by every
    # head; queries go through a low-rank q_lora_rank bottleneck (0: a full projection); per head,
    # qk_nope_head_dim + qk_rope_head_dim query/key dims and v_head_dim value dims. 0: not MLA.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

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
        self._check_mla(where)
        self._check_layers(where)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{where}: num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, dict):
            raise ValueError(f"{where}: rope_scaling={self.rope_scaling!r} must be a mapping")
        object.__setattr__(self, "dtype", dtype_name(self.dtype, f"{where}: dtype"))
        # a private copy: the caller's dict must not change a frozen shape
        object.__setattr__(self, "rope_scaling", dict(self.rope_scaling)
                           if self.rope_scaling else None)

    def _whole_numbers(self, keys, where: str) -> None:
        """Each of `keys` a whole number >= 0 (stored as an int), or an error naming it."""
        for key in keys:
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 \
                    or not float(v).is_integer():
                raise ValueError(f"{where}: {key}={v!r} must be a whole number >= 0")
            object.__setattr__(self, key, int(v))

    def _check_moe(self, where: str) -> None:
        self._whole_numbers(_COUNTS, where)
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

    def _check_layers(self, where: str) -> None:
        """The per-layer attention layout: which layers are windowed, the norms, the MLP."""
        self._whole_numbers(("full_attention_layers", "norms_per_layer"), where)
        g = self.full_attention_layers
        if g and self.sliding_window is None:
            raise ValueError(f"{where}: full_attention_layers={g} without a sliding_window")
        if g >= self.num_layers:
            raise ValueError(f"{where}: full_attention_layers={g} leaves no windowed layer of "
                             f"num_layers={self.num_layers}: drop sliding_window instead")
        for key in ("attention_sinks", "router_bias"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{where}: {key}={getattr(self, key)!r} must be true or false")
        if self.router_bias and not self.is_moe:
            raise ValueError(f"{where}: router_bias=true without experts (num_experts=0)")
        if self.hidden_act not in _ACTS:
            raise ValueError(f"{where}: hidden_act={self.hidden_act!r} is not supported "
                             f"({', '.join(_ACTS)} are)")

    @property
    def windowed_layers(self) -> int:
        """Layers whose attention reads at most sliding_window keys (0: none)."""
        return self.num_layers - self.full_attention_layers if self.sliding_window else 0

    def _check_mla(self, where: str) -> None:
        if not isinstance(self.qk_norm, bool):
            raise ValueError(f"{where}: qk_norm={self.qk_norm!r} must be true or false")
        self._whole_numbers(_MLA_FIELDS, where)
        if not self.kv_lora_rank:
            set_ = [f for f in _MLA_FIELDS if getattr(self, f)]
            if set_:
                raise ValueError(f"{where}: {set_[0]}={getattr(self, set_[0])} is a latent-"
                                 "attention (MLA) setting, but kv_lora_rank=0 (not MLA)")
            return
        for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if not getattr(self, key):
                raise ValueError(f"{where}: {key}=0: latent attention (kv_lora_rank="
                                 f"{self.kv_lora_rank}) needs it positive")
        if self.head_dim != self.qk_nope_head_dim + self.qk_rope_head_dim:
            raise ValueError(f"{where}: head_dim={self.head_dim} must be qk_nope_head_dim + "
                             f"qk_rope_head_dim = {self.qk_nope_head_dim + self.qk_rope_head_dim}"
                             " (the query/key head of latent attention)")
        if self.num_kv_heads != self.num_heads:
            raise ValueError(f"{where}: num_kv_heads={self.num_kv_heads} must be num_heads="
                             f"{self.num_heads} under latent attention (every head reads the "
                             "one latent)")
        if self.qkv_bias or self.o_bias or self.sliding_window is not None or self.qk_norm:
            raise ValueError(f"{where}: latent attention with attention biases, a sliding "
                             "window or qk_norm is not modelled")

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

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def attention_params(self) -> int:
        """One layer's attention weights: Q, K, V, O (and their biases, Qwen3's q/k norms); under
        latent attention the query's low-rank pair (or full projection), the latent's down
        projection (with the RoPE key), its up projection to every head's key and value, O and
        the two low-rank RMSNorms."""
        h, d, H, K = self.hidden_size, self.head_dim, self.num_heads, self.num_kv_heads
        if self.is_mla:
            qr, kr = self.q_lora_rank, self.kv_lora_rank
            q = h * qr + qr + qr * H * d if qr else h * H * d
            kv = h * (kr + self.qk_rope_head_dim) + kr \
                + kr * H * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv + H * self.v_head_dim * h
        return h * d * (2 * H + 2 * K) + (H + 2 * K) * d * self.qkv_bias + h * self.o_bias \
            + 2 * d * self.qk_norm + H * self.attention_sinks

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
        return (h + self.router_bias) * self.num_experts \
            + e * self.mlp_params(self.moe_intermediate_size) \
            + shared + h * self.shared_expert_gate

    def num_params(self, experts: int | None = None) -> int:
        """Every weight; `experts` routed experts per MoE layer instead of all of them
        (active_params: top-k)."""
        h, L = self.hidden_size, self.num_layers
        dense = L - self.moe_layers
        layers = L * (self.attention_params() + self.norms_per_layer * h) \
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
        return self.num_layers * self.kv_elements_per_layer() * b

    def kv_bytes(self, num_tokens: int, dtype: str | None = None) -> int:
        """Bytes of the KV a context of num_tokens needs: its windowed layers keep at most the
        window's sliding_window tokens (vLLM's sliding-window KV frees what falls out of it),
        the others every token. (The KV manager still holds every layer's blocks for the whole
        context: kv_bytes_per_token x num_tokens.)"""
        b = dtype_bytes(dtype) if dtype else self.dtype_bytes
        per_layer = self.kv_elements_per_layer() * b
        local = self.windowed_layers
        return (self.num_layers - local) * per_layer * num_tokens \
            + local * per_layer * min(num_tokens, self.sliding_window or 0)

    def kv_elements_per_layer(self, tp: int = 1) -> int:
        """Elements one token keeps in one layer's cache on one GPU of a tensor-parallel group of
        tp: K and V of its share of the KV heads (a replica of one when there are fewer heads than
        GPUs, as vLLM keeps); under latent attention the latent and the RoPE key, on every GPU
        (every head reads them, so vLLM replicates them)."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * max(1, self.num_kv_heads // tp) * self.head_dim

    def to_preset(self) -> dict:
        """The preset keys (configs/model/*.yaml) that give this shape back by from_config."""
        out = {f: getattr(self, f) for f in self.__dataclass_fields__
               if f not in _FAMILY_FIELDS or getattr(self, f) != self.__dataclass_fields__[
                   f].default}
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
            **{k: c[k] for k in _MOE_FIELDS + _FAMILY_FIELDS + ("num_experts", "norm_topk_prob")
               if k in c})

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
        act = hf.get("hidden_activation", hf.get("hidden_act", "silu")) if mtype == "gemma2" \
            else hf.get("hidden_act", "silu")
        if act != ("gelu_pytorch_tanh" if mtype == "gemma2" else "silu"):
            key = "hidden_activation" if "hidden_activation" in hf else "hidden_act"
            raise ValueError(f"{where}: {key} {act!r} is not supported for model_type "
                             f"{mtype!r}")
        _check_fields(hf, mtype, where)
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
        family = _hf_attention(hf, mtype, where)
        try:
            return cls(
                name=str(name or hf.get("_name_or_path") or where),
                num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
                intermediate_size=hf["intermediate_size"], num_heads=hf["num_attention_heads"],
                num_kv_heads=hf.get("num_key_value_heads"),
                head_dim=family.pop("head_dim", hf.get("head_dim")),
                vocab_size=hf["vocab_size"],
                max_model_len=hf.get("max_position_embeddings", 2048),
                # transformers 5 writes "dtype", 4.x "torch_dtype"
                dtype=hf.get("dtype", hf.get("torch_dtype", "bfloat16")),
                # Gemma ties them unless its file says otherwise (its configs omit the key)
                tie_word_embeddings=hf.get("tie_word_embeddings", mtype == "gemma2"),
                rms_norm_eps=hf.get("rms_norm_eps", 1e-6), rope_theta=theta, rope_scaling=rope,
                qkv_bias=_flag(hf, "qkv_bias", where, True) if qwen2 else attn_bias,
                o_bias=attn_bias and not qwen2,
                mlp_bias=True if mtype == "gpt_oss" else hf.get("mlp_bias", False),
                # Qwen2 configs name a window they do not use (use_sliding_window: false)
                sliding_window=hf.get("sliding_window") if mtype in ("mistral", "mixtral",
                                                                     "gemma2", "gpt_oss")
                else None, **moe, **family)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None


def _hf_moe(hf: dict, mtype: str, where: str) -> dict:
    """The MoE fields of a Hugging Face config.json (none for a dense model_type); refuses the
    layouts this shape cannot describe (MoE on some layers only, other routing functions)."""
    def need(*keys):
        missing = [k for k in keys if k not in hf]
        if missing:
            raise ValueError(f"{where}: model_type {mtype!r} lacks {', '.join(missing)}")
    if mtype == "gpt_oss":
        need("num_local_experts", "num_experts_per_tok")
        if hf.get("experts_per_token", hf["num_experts_per_tok"]) != hf["num_experts_per_tok"]:
            raise ValueError(f"{where}: experts_per_token={hf['experts_per_token']!r} and "
                             f"num_experts_per_tok={hf['num_experts_per_tok']!r} disagree")
        # each expert is a SwiGLU MLP of intermediate_size with biases (mlp_bias below)
        return {"num_experts": hf["num_local_experts"], "num_experts_per_tok":
                hf["num_experts_per_tok"], "moe_intermediate_size": hf["intermediate_size"]}
    if mtype == "mixtral":
        need("num_local_experts", "num_experts_per_tok")
        return {"num_experts": hf["num_local_experts"], "num_experts_per_tok":
                hf["num_experts_per_tok"], "moe_intermediate_size": hf["intermediate_size"]}
    if mtype in ("qwen2_moe", "qwen3_moe"):
        if "num_local_experts" in hf:
            if "num_experts" in hf and hf["num_experts"] != hf["num_local_experts"]:
                raise ValueError(f"{where}: num_experts={hf['num_experts']!r} and "
                                 f"num_local_experts={hf['num_local_experts']!r} disagree")
            hf = {**hf, "num_experts": hf["num_local_experts"]}
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
    if mtype in ("deepseek", "deepseek_v2", "deepseek_v3"):
        need("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size")
        if hf.get("moe_layer_freq", 1) != 1:
            raise ValueError(f"{where}: moe_layer_freq={hf['moe_layer_freq']!r}: only an MoE "
                             "block in every layer after first_k_dense_replace is supported (1)")
        # V3 scores experts with a sigmoid (the same router matmul, so the same cost); DeepSeek-
        # MoE (v1) runs on the real executor, whose router is a softmax
        scoring = ("softmax", "sigmoid") if mtype == "deepseek_v3" else ("softmax",)
        if hf.get("scoring_func", "softmax") not in scoring:
            raise ValueError(f"{where}: scoring_func={hf['scoring_func']!r} is not supported "
                             f"({' and '.join(scoring)} are)")
        shared = hf.get("n_shared_experts", 0)
        if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
            raise ValueError(f"{where}: n_shared_experts={shared!r} must be a whole number >= 0")
        return {"num_experts": hf["n_routed_experts"], "num_experts_per_tok":
                hf["num_experts_per_tok"], "moe_intermediate_size": hf["moe_intermediate_size"],
                "shared_expert_intermediate_size": shared * hf["moe_intermediate_size"],
                "first_dense_layers": hf.get("first_k_dense_replace", 0),
                "norm_topk_prob": _flag(hf, "norm_topk_prob", where)}
    return {}


def _check_fields(hf: dict, mtype: str, where: str) -> None:
    """Refuse a field the reader does not understand (module constants say why), naming it, and
    one of _MUST_BE's with another value than the one modelled."""
    known = _METADATA | _READ | set(_READ_BY_TYPE[mtype])
    unknown = sorted(k for k in hf if k not in known)
    if unknown:
        raise ValueError(
            f"{where}: field {unknown[0]!r}"
            + (f" (and {', '.join(map(repr, unknown[1:]))})" if unknown[1:] else "")
            + f" is not understood by the shape reader for model_type {mtype!r}: it may change "
            "the model's shape or cost (attention layout, windows, sinks, quantization), so it "
            "is refused, not ignored (sarathi_lab/docs/models.md lists the fields read)")
    for key, want in _MUST_BE.items():
        if key in hf and hf[key] != want:
            raise ValueError(f"{where}: {key}={hf[key]!r} is not modelled ({want!r} is)")
    types = hf.get("layer_types")
    if mtype not in ("gemma2", "gpt_oss") and types is not None and (not isinstance(types, list)
                              or any(t != "full_attention" for t in types)):
        raise ValueError(f"{where}: layer_types={types!r}: only full attention on every layer "
                         "is modelled for this model type")


def _hf_attention(hf: dict, mtype: str, where: str) -> dict:
    """The attention-family fields of a config.json: Qwen3's q/k norms, DeepSeek-V2/V3's latent
    attention (its query/key head is qk_nope_head_dim + qk_rope_head_dim; every head reads the
    one latent)."""
    if mtype == "qwen3_moe":
        return {"qk_norm": True}
    if mtype == "gemma2":
        return _gemma2_layers(hf, where)
    if mtype == "gpt_oss":
        return {**_window_layers(hf, "gpt_oss", where, None), "attention_sinks": True,
                "router_bias": True}
    if mtype not in ("deepseek_v2", "deepseek_v3"):
        return {}
    missing = [k for k in _MLA_FIELDS if k != "q_lora_rank" and k not in hf]
    if missing:
        raise ValueError(f"{where}: model_type {mtype!r} lacks {', '.join(missing)}")
    if _flag(hf, "attention_bias", where):
        raise ValueError(f"{where}: attention_bias=true is not modelled for latent attention")
    out = {k: hf.get(k, 0) for k in _MLA_FIELDS}   # q_lora_rank null: a full query projection
    for k, v in out.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{where}: {k}={v!r} must be a whole number >= 0")
    if not out["kv_lora_rank"]:
        raise ValueError(f"{where}: kv_lora_rank={out['kv_lora_rank']}: must be positive")
    qk = out["qk_nope_head_dim"] + out["qk_rope_head_dim"]
    for key, allowed in (("qk_head_dim", (qk,)), ("head_dim", (qk, out["qk_rope_head_dim"]))):
        if key in hf and hf[key] not in allowed:
            raise ValueError(f"{where}: {key}={hf[key]!r} disagrees with qk_nope_head_dim + "
                             f"qk_rope_head_dim = {qk}")
    out["head_dim"] = qk
    heads = hf.get("num_key_value_heads", hf.get("num_attention_heads"))
    if heads != hf.get("num_attention_heads"):
        raise ValueError(f"{where}: num_key_value_heads={heads!r} must equal "
                         "num_attention_heads under latent attention")
    return out


def _window_layers(hf: dict, mtype: str, where: str, alternate: bool | None) -> dict:
    """How many layers are global: the full_attention entries of layer_types, or without it
    (alternate) every odd layer (Gemma 2's even layers are windowed)."""
    L, w = hf.get("num_hidden_layers"), hf.get("sliding_window")
    if not isinstance(L, int) or isinstance(L, bool):
        return {}                                  # the missing/invalid count is named later
    if w is None:
        raise ValueError(f"{where}: model_type {mtype!r} lacks sliding_window")
    if "layer_types" not in hf and not alternate:
        raise ValueError(f"{where}: model_type {mtype!r} lacks layer_types")
    types = hf.get("layer_types", ["sliding_attention" if i % 2 == 0 else "full_attention"
                                   for i in range(L)])
    if not isinstance(types, list) or len(types) != L or \
            any(t not in ("sliding_attention", "full_attention") for t in types):
        raise ValueError(f"{where}: layer_types={types!r} must name sliding_attention or "
                         f"full_attention for each of num_hidden_layers={L}")
    return {"full_attention_layers": types.count("full_attention")}


def _gemma2_layers(hf: dict, where: str) -> dict:
    """Gemma 2's layer layout: even layers windowed, odd ones global (transformers' Gemma2
    model), or as its layer_types name them; four norms a layer; GeGLU."""
    w = hf.get("sliding_window")
    if hf.get("sliding_window_size", w) != w:
        raise ValueError(f"{where}: sliding_window_size={hf['sliding_window_size']!r} and "
                         f"sliding_window={w!r} disagree")
    return {**_window_layers(hf, "gemma2", where, True), "norms_per_layer": 4,
            "hidden_act": "gelu_pytorch_tanh"}


def _flag(c: dict, key: str, where: str, default: bool = False) -> bool:
    v = c.get(key, default)
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
