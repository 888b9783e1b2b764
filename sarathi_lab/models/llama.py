"""Paged-KV forward of Llama-family decoders (Llama, Mistral, Qwen2, and the mixture-of-experts
Mixtral and Qwen2-MoE, whose MLP is models/moe.py's) over a flattened batch.

The batch is one row per scheduled token, no padding: sequence i owns rows
``query_start_loc[i]:query_start_loc[i+1]``, which are its last tokens out of ``seq_lens[i]``.
Each layer first writes the new K/V of every row into its paged cache, then attends through the
block tables, so a prefix-cache hit on blocks being filled in this very step reads them correctly.

Numerics follow Hugging Face's Llama (fp32 RMSNorm then cast, RoPE cos/sin computed in fp32 and
cast, rotate-half layout) so that greedy decoding equals ``transformers`` token for token.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from sarathi_lab.models.moe import SparseMoE, SwiGLU, is_moe_layer
from sarathi_lab.models.shape import ModelShape


@dataclass
class AttnMetadata:
    slot_mapping: torch.Tensor      # [T] int64, block_id * block_size + offset
    block_tables: torch.Tensor      # [B, max_blocks] int32
    query_start_loc: torch.Tensor   # [B + 1] int32
    seq_lens: torch.Tensor          # [B] int32, tokens in KV after this step
    attn_kwargs: dict = field(default_factory=dict)   # backend extras (triton: max_query_len)


def rope_inv_freq(args: ModelShape) -> torch.Tensor:
    """Inverse frequencies as Hugging Face computes them (same ops, so the same fp32 bits)."""
    d = args.head_dim
    inv = 1.0 / (args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = dict(args.rope_scaling or {})
    kind = s.get("rope_type", s.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / s["factor"]
    if kind == "llama3":
        factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old = s["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / hi) * ~(wavelen > old / lo)
        return torch.where(medium, smoothed, scaled)
    raise NotImplementedError(f"rope_type {kind!r} is not supported (none, linear, llama3 are)")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [T, H, D]; cos/sin [T, 1, D]; rotate-half layout, as in Hugging Face checkpoints
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, a: ModelShape):
        super().__init__()
        self.nh, self.nkv, self.d = a.num_heads, a.num_kv_heads, a.head_dim
        self.q_size, self.kv_size = self.nh * self.d, self.nkv * self.d
        # one matmul for q, k and v (the loader concatenates the checkpoint's three)
        self.qkv_proj = nn.Linear(a.hidden_size, self.q_size + 2 * self.kv_size, bias=a.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, a.hidden_size, bias=a.o_bias)
        self.scale = self.d ** -0.5
        self.window = a.sliding_window   # Mistral's; None: every earlier key
        self.k_cache = self.v_cache = None   # set by the executor's bind()

    def forward(self, x, cos, sin, meta: AttnMetadata, kernels):
        write_kv, paged_attention = kernels
        qkv = self.qkv_proj(x)
        # q and k side by side: one rotation (its six ops) serves both
        qk = _rotate(qkv[:, :self.q_size + self.kv_size].view(-1, self.nh + self.nkv, self.d),
                     cos, sin)
        q, k = qk[:, :self.nh], qk[:, self.nh:]
        v = qkv[:, self.q_size + self.kv_size:].view(-1, self.nkv, self.d)
        write_kv(k, v, self.k_cache, self.v_cache, meta.slot_mapping)
        o = paged_attention(q, self.k_cache, self.v_cache, meta.block_tables,
                            meta.query_start_loc, meta.seq_lens, self.scale, window=self.window,
                            **meta.attn_kwargs)
        return self.o_proj(o.reshape(-1, self.q_size))


class DecoderLayer(nn.Module):
    def __init__(self, a: ModelShape, index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.self_attn = Attention(a)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.mlp = (SparseMoE.from_shape(a) if is_moe_layer(a, index)
                    else SwiGLU(a.hidden_size, a.intermediate_size, a.mlp_bias))

    def forward(self, x, cos, sin, meta, kernels, keep=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta, kernels)
        if keep is not None:   # the rows after this one are read only here (see the model)
            x = x[keep]
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, a: ModelShape):
        super().__init__()
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(a, i) for i in range(a.num_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Module names mirror Hugging Face's, except the fused ``qkv_proj`` and ``gate_up_proj``."""

    def __init__(self, args: ModelShape):
        super().__init__()
        self.args = args
        self.model = LlamaModel(args)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.kernels = None
        self.cos = self.sin = None

    def setup(self, kernels, device, max_len: int | None = None) -> None:
        """Pick the attention kernels and build the RoPE table once (not per step)."""
        self.kernels = kernels
        n = max(max_len or 0, self.args.max_model_len)
        freqs = torch.arange(n, dtype=torch.float)[:, None] * rope_inv_freq(self.args)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        dtype = self.model.embed_tokens.weight.dtype
        self.cos = emb.cos().to(device=device, dtype=dtype)
        self.sin = emb.sin().to(device=device, dtype=dtype)

    def bind_cache(self, k_caches, v_caches) -> None:
        for layer, k, v in zip(self.model.layers, k_caches, v_caches):
            layer.self_attn.k_cache, layer.self_attn.v_cache = k, v

    @torch.inference_mode()
    def forward(self, input_ids, positions, meta: AttnMetadata, logits_indices=None):
        """Logits [len(logits_indices), vocab] in fp32 (all rows if None)."""
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]
        x = self.model.embed_tokens(input_ids)
        *layers, last = self.model.layers
        for layer in layers:
            x = layer(x, cos, sin, meta, self.kernels)
        # every row's K/V is cached by the last layer's attention, but its MLP, the norm and
        # lm_head are row-wise and only the sampling rows are read: the other rows (prompt
        # chunks that sample nothing) skip them, as llama.cpp does
        x = last(x, cos, sin, meta, self.kernels, keep=logits_indices)
        return self.lm_head(self.model.norm(x)).float()
