"""Roofline cost model: how long one iteration of a Llama-family model takes on one GPU.

Every term is a roofline, max(FLOPs / (peak x eff), bytes / (bandwidth x eff)), per GPU of a
tensor-parallel group, summed over the model's L layers. The efficiency factors and kernel floors
are fitted to measured operator profiles by ``experiments/calibrate_roofline.py``.

An iteration with T scheduled tokens, S of whose requests sample a token, costs

    overhead + L x layer_overhead      CPU side of the iteration (scheduling, input preparation,
                                       sampling) + per-layer GPU kernel floors (tiny kernels
                                       still take microseconds)
  + linear(T)      = max(2 T P / (peak ce), b P / (bw me))    P: QKV, O, gate/up, down params
  + elementwise(T) = T x bytes of the norms, residual adds, RoPE, SiLU*mul and KV-cache write
                     / (bw me)
  + attention      = sum over scheduled requests of max(4 d H pairs / (peak ae),
                                                        b KV (k + c) / (bw me))
  + lm_head(S)     = max(2 S h V / (peak ce), b h V / (bw me)), sampled rows only (0 if S = 0)
  + allreduce(T)   = 2 L x (latency + 2 (tp-1)/tp x T h b / (link_bw le)), tp > 1 only

with b bytes per element, h hidden size, V vocabulary, H query heads and KV the per-token KV bytes
of the GPU's share of the KV heads; P, H, V and the intermediate size are divided by tp.

Attention of a chunk of c new tokens after k cached ones: query i of the chunk sees k + i + 1 keys,
so the causal mask leaves pairs = c k + c (c + 1) / 2 query-key pairs of 4 d FLOPs per head (QK^T
and PV) -- the unmasked 4 c (k + c) d H with the masked half of the chunk's own square skipped, as
FlashAttention-style kernels skip fully masked tiles. The chunk reads the KV of all k + c tokens.
So chunking is FLOP-neutral: a chunked prefill pays extra only for re-reading the earlier chunks'
KV (visible where a chunk is memory-bound) and for the per-iteration terms it pays once per chunk.
A decode is the chunk c = 1 (k + 1 tokens of KV, always memory-bound): one formula serves both.

Not modelled (small, or properties of the serving stack rather than the GPU): the embedding lookup
and its all-reduce, the final norm, the gather of TP-sharded logits, sampling kernels, Mistral's
sliding window (attention always spans the whole context), and kernel floors that vary with the
batch (the floors are a constant per layer).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from sarathi_lab.config import plain
from sarathi_lab.costmodels.base import CostModel, CostModelConfig
from sarathi_lab.models.shape import ModelShape
from sarathi_lab.settings import parse, setting

# vLLM's default max_num_seqs: its memory profile holds this many rows of fp32 full-vocab logits.
_MAX_SAMPLED_ROWS = 256


@dataclass(frozen=True)
class HardwareSpec:
    """A GPU preset (configs/hardware/*.yaml). The peaks come from datasheets; the efficiencies
    and floors are fitted by experiments/calibrate_roofline.py (defaults: roughly the A100 fit,
    for a preset that leaves them out)."""
    name: str = setting(help="label")
    peak_flops: float = setting(gt=0, help="dense bf16 tensor-core FLOP/s")
    mem_bandwidth: float = setting(gt=0, help="HBM bytes/s")
    memory_bytes: float = setting(gt=0, help="GPU memory, bytes")
    link_bandwidth: float = setting(gt=0, help="GPU-to-GPU bytes/s, one direction")
    link_latency_s: float = setting(ge=0, help="per all-reduce")
    compute_eff: float = setting(0.7, gt=0, le=1, help="achieved share of peak_flops in GEMMs")
    attn_eff: float = setting(0.25, gt=0, le=1, help="achieved share of peak_flops in attention")
    mem_eff: float = setting(0.75, gt=0, le=1, help="achieved share of mem_bandwidth")
    link_eff: float = setting(0.6, gt=0, le=1, help="achieved share of link_bandwidth")
    iteration_overhead_s: float = setting(2e-3, ge=0, help="CPU side of an iteration")
    layer_overhead_s: float = setting(5e-5, ge=0, help="GPU kernel floors per layer")
    price_per_gpu_hour: float | None = setting(None, gt=0, help="USD, for the run's cost "
                                               "figures; null: none")

    @classmethod
    def from_config(cls, cfg, overrides=None) -> "HardwareSpec":
        """`overrides` (the cost model's settings) replaces efficiency factors it sets
        non-null; a preset's keys are checked like any setting (``hardware.<key>``)."""
        c = plain(cfg)
        for key, val in plain(overrides).items():
            if val is not None and key in cls.__dataclass_fields__:
                c[key] = val
        return parse(cls, c, "hardware", f"hardware preset {c.get('name')!r}")


@dataclass
class RooflineConfig(CostModelConfig):
    """Efficiency overrides; null keeps the hardware preset's (fitted by
    experiments/calibrate_roofline.py)."""
    compute_eff: float | None = setting(None, gt=0, le=1, help="share of peak FLOP/s in GEMMs")
    attn_eff: float | None = setting(None, gt=0, le=1, help="share of peak FLOP/s in attention")
    mem_eff: float | None = setting(None, gt=0, le=1, help="share of HBM bandwidth achieved")
    link_eff: float | None = setting(None, gt=0, le=1, help="share of link bandwidth achieved")
    iteration_overhead_s: float | None = setting(None, ge=0, help="CPU side of an iteration")
    layer_overhead_s: float | None = setting(None, ge=0, help="GPU kernel floors per layer")


class RooflineCostModel(CostModel):
    """Iteration time of `model` on one GPU of a `tensor_parallel` group of `hardware`."""

    config_class = RooflineConfig

    def __init__(self, model, hardware, tensor_parallel: int = 1, cfg=None):
        m = model if isinstance(model, ModelShape) else ModelShape.from_config(model)
        overrides = asdict(cfg) if isinstance(cfg, RooflineConfig) else cfg
        hw = hardware if isinstance(hardware, HardwareSpec) else \
            HardwareSpec.from_config(hardware, overrides)
        tp = int(tensor_parallel)
        if tp < 1 or m.num_heads % tp:
            raise ValueError(f"{m.name}: tensor_parallel={tp} must divide num_heads={m.num_heads}")
        if m.num_kv_heads >= tp and m.num_kv_heads % tp:
            raise ValueError(f"{m.name}: tensor_parallel={tp} must divide "
                             f"num_kv_heads={m.num_kv_heads}")
        self.model, self.hw, self.tp = m, hw, tp
        h, d, b, L = m.hidden_size, m.head_dim, m.dtype_bytes, m.num_layers
        self.heads = m.num_heads // tp
        # With fewer KV heads than GPUs, each GPU keeps a replica of one (as vLLM does).
        self.kv_heads = max(1, m.num_kv_heads // tp)
        inter = m.intermediate_size / tp

        # -- weights and KV per GPU
        self.linear_params = h * (self.heads + 2 * self.kv_heads) * d + self.heads * d * h \
            + 3 * h * inter                                    # per layer
        vocab_params = m.vocab_size * h / tp                   # vocab-parallel embedding, LM head
        self.weight_bytes = b * (L * (self.linear_params + 2 * h) + h
                                 + vocab_params * (1 if m.tie_word_embeddings else 2))
        self.kv_bytes_per_token = L * 2 * self.kv_heads * d * b   # all layers

        # -- seconds per unit, whole model; precomputed so the hot path is a few multiplies
        flops, bw = hw.peak_flops, hw.mem_bandwidth * hw.mem_eff
        self.lin_per_token = L * 2 * self.linear_params / (flops * hw.compute_eff)
        self.lin_weights = L * b * self.linear_params / bw
        # norms (read+write h, x2), residual adds (read 2h write h, x2) are replicated per rank;
        # RoPE (read+write q, k), SiLU*mul (read 2I write I), KV write are sharded.
        ew_elems = 10 * h + 2 * (self.heads + self.kv_heads) * d + 3 * inter \
            + 2 * self.kv_heads * d
        self.ew_per_token = L * b * ew_elems / bw
        self.attn_per_pair = L * 4 * d * self.heads / (flops * hw.attn_eff)
        self.attn_per_kv_token = self.kv_bytes_per_token / bw
        self.decode_per_kv_token = max(self.attn_per_pair, self.attn_per_kv_token)
        self.lm_per_row = 2 * vocab_params / (flops * hw.compute_eff)
        self.lm_weights = b * vocab_params / bw
        if tp > 1:
            self.ar_fixed = 2 * L * hw.link_latency_s
            self.ar_per_token = 2 * L * (2 * (tp - 1) / tp) * h * b \
                / (hw.link_bandwidth * hw.link_eff)
        else:
            self.ar_fixed = self.ar_per_token = 0.0
        self.overhead = hw.iteration_overhead_s
        self.layer_floors = L * hw.layer_overhead_s

    # ---- components (seconds, whole model, per GPU) -----------------------------------------
    def linear_time(self, T: int) -> float:
        return max(T * self.lin_per_token, self.lin_weights) if T > 0 else 0.0

    def elementwise_time(self, T: int) -> float:
        return T * self.ew_per_token

    def chunk_attention_time(self, c: int, k: int) -> float:
        """Attention of c new tokens after k cached ones (a decode is c = 1)."""
        f = (c * k + c * (c + 1) // 2) * self.attn_per_pair
        m = (k + c) * self.attn_per_kv_token
        return f if f > m else m

    def attention_time(self, prefills, decode_contexts) -> float:
        pre = 0.0
        for c, k in prefills:
            pre += self.chunk_attention_time(c, k)
        dec = sum(decode_contexts) + len(decode_contexts)    # each decode reads k + 1 tokens
        return pre + dec * self.decode_per_kv_token

    def lm_head_time(self, S: int) -> float:
        return max(S * self.lm_per_row, self.lm_weights) if S > 0 else 0.0

    def allreduce_time(self, T: int) -> float:
        return self.ar_fixed + T * self.ar_per_token if self.tp > 1 and T > 0 else 0.0

    def _fixed(self, T: int, S: int) -> float:
        """Everything but attention: a function of the batch's token and sampled-row counts."""
        if T <= 0:
            return self.overhead
        lin = T * self.lin_per_token
        if lin < self.lin_weights:
            lin = self.lin_weights
        lm = 0.0
        if S > 0:
            lm = S * self.lm_per_row
            if lm < self.lm_weights:
                lm = self.lm_weights
        return self.overhead + self.layer_floors + lin + T * self.ew_per_token + lm \
            + (self.ar_fixed + T * self.ar_per_token if self.tp > 1 else 0.0)

    # ---- whole iterations --------------------------------------------------------------------
    def iteration_time(self, prefills, decode_contexts, num_sampled: int | None = None) -> float:
        """prefills: (chunk, context) pairs; decode_contexts: tokens in KV before each decode.
        num_sampled defaults to every request (each prefill taken as a prompt's last chunk)."""
        T = sum(c for c, _ in prefills) + len(decode_contexts)
        S = len(prefills) + len(decode_contexts) if num_sampled is None else num_sampled
        return self._fixed(T, S) + self.attention_time(prefills, decode_contexts)

    def breakdown(self, prefills, decode_contexts, num_sampled: int | None = None) -> dict:
        T = sum(c for c, _ in prefills) + len(decode_contexts)
        S = len(prefills) + len(decode_contexts) if num_sampled is None else num_sampled
        parts = {
            "overhead": self.overhead,
            "layer_overhead": self.layer_floors if T > 0 else 0.0,
            "linear": self.linear_time(T),
            "elementwise": self.elementwise_time(T),
            "attention_prefill": self.attention_time(prefills, []),
            "attention_decode": self.attention_time([], decode_contexts),
            "lm_head": self.lm_head_time(S),
            "allreduce": self.allreduce_time(T),
        }
        parts["total"] = sum(parts.values())
        return parts

    def step_time(self, reqs, num_new_tokens) -> float:
        """The hot path: iteration_time of a scheduled batch, read straight off the requests."""
        T = S = dec = 0
        pre = 0.0
        a_pair, a_kv = self.attn_per_pair, self.attn_per_kv_token
        for r, c in zip(reqs, num_new_tokens):
            k = r.num_computed_tokens
            T += c
            if k + c == r.num_prompt_tokens + r.num_output_tokens:
                S += 1                       # the request caught up: it samples a token
            if c == 1:
                dec += k + 1                 # decode (or a 1-token chunk: same cost)
            else:
                f = (c * k + c * (c + 1) // 2) * a_pair
                m = (k + c) * a_kv
                pre += f if f > m else m
        return self._fixed(T, S) + (pre + dec * self.decode_per_kv_token)

    def decode_run(self, contexts: np.ndarray, k: int) -> np.ndarray:
        """Durations of k decode-only iterations of the same requests, contexts +1 per step;
        the same floating-point operations as k calls of step_time."""
        ctx = np.asarray(contexts, dtype=np.int64)
        B = int(ctx.size)
        fixed = self._fixed(B, B)
        dec = int(ctx.sum()) + B * np.arange(1, k + 1, dtype=np.int64)
        return fixed + (0.0 + dec * self.decode_per_kv_token)

    # ---- memory ------------------------------------------------------------------------------
    def activation_bytes(self, num_tokens: int) -> float:
        """Transient memory of one forward over num_tokens tokens: residual and normed input,
        QKV, the MLP's gate/up output and activation, plus sampled logits in fp32."""
        m = self.model
        per_tok = 2 * m.hidden_size + (self.heads + 2 * self.kv_heads) * m.head_dim \
            + 3 * m.intermediate_size / self.tp
        return num_tokens * m.dtype_bytes * per_tok + _MAX_SAMPLED_ROWS * m.vocab_size * 4

    @property
    def max_model_len(self) -> int:
        return self.model.max_model_len

    def num_kv_blocks(self, block_size: int, gpu_memory_utilization: float = 0.9,
                      workspace_bytes: float = 2**30, activation_tokens: int = 8192) -> int:
        m, hw = self.model, self.hw
        usable = hw.memory_bytes * gpu_memory_utilization
        reserve = workspace_bytes + self.activation_bytes(activation_tokens)
        gib = 2**30
        if self.weight_bytes + reserve >= usable:
            need_tp = self.tp
            while need_tp < 64 and self.weight_bytes * self.tp / need_tp + reserve >= usable:
                need_tp *= 2
            raise ValueError(
                f"{m.name} does not fit on {hw.name} at tensor_parallel={self.tp}: weights take "
                f"{self.weight_bytes / gib:.1f} GiB per GPU plus {reserve / gib:.1f} GiB of "
                f"activations/workspace, but gpu_memory_utilization={gpu_memory_utilization} "
                f"of {hw.memory_bytes / gib:.1f} GiB leaves {usable / gib:.1f} GiB "
                f"(try tensor_parallel={need_tp})")
        blocks = int((usable - self.weight_bytes - reserve)
                     // (block_size * self.kv_bytes_per_token))
        if blocks < 1:
            raise ValueError(f"{m.name} on {hw.name} at tensor_parallel={self.tp}: no room for "
                             f"one KV block of {block_size} tokens")
        return blocks
