"""Roofline cost model: how long one iteration of a Llama-family model takes on one GPU.

Every term prices an operator's FLOPs and bytes against the hardware preset's peaks at fitted
efficiencies, per GPU of a tensor-parallel group, summed over the model's L layers. The
efficiencies, the ridge exponent and the kernel floors are fitted to measured operator profiles by
``experiments/calibration/calibrate_roofline.py`` (report:
experiments/calibration/calibrate_roofline.txt).

An iteration of B requests with T scheduled tokens, S of which sample a token, costs

    overhead + B x request_overhead      CPU side of the iteration (scheduling, input preparation,
                                         sampling, output processing; measured for vLLM by Vidur)
  + L x layer_overhead                   per-layer GPU kernel floors (tiny kernels take µs)
  + linear(T)      = soft(2 T P / (peak ce), b P / (bw me))    P: QKV, O, gate/up, down params
  + elementwise(T) = T x bytes of the norms, residual adds, RoPE, SiLU*mul and KV-cache write
                     / (bw me)
  + attention      = sum over scheduled requests of
                       4 d H (ctx_pairs / ae + own_pairs / ase) / peak  +  b KV kv_tokens / (bw ke)
  + lm_head(S)     = soft(2 S h V / (peak ce), b h V / (bw me)), sampled rows only (0 if S = 0)
  + allreduce(T)   = 2 L x min(one-shot(m), ring(m)), m = T h b bytes, tp > 1 only
                     (communication.py: ring steps and per-peer latencies, fitted to NCCL and
                     vLLM custom all-reduce measurements)

with b bytes per element, h hidden size, V vocabulary, H query heads and KV the per-token KV bytes
of the GPU's share of the KV heads; P, H, V and the intermediate size are divided by tp.

soft(F, M) = (F^n + M^n)^(1/n), n = ridge_exponent: a smooth roofline. A hard max (n = inf)
assumes a GEMM at the ridge point reaches full compute and full bandwidth at once; measured GEMMs
lose efficiency near the ridge (tiles and waves only partly fill the GPU, loads and math overlap
imperfectly): with the hard max the 76-306-token layers came out at 0.82 of the measured profiles.
The fitted n (~1.5) prices a GEMM at its ridge point 2^(1/n) ~ 1.6 x the hard max.

Attention of a chunk of c new tokens after k cached ones: query i of the chunk sees k + i keys,
so the causal mask leaves ctx_pairs = c k query-key pairs against the cached context and
own_pairs = c (c + 1) / 2 within the chunk, each of 4 d FLOPs per head (QK^T and PV), and the chunk
reads kv_tokens = k + c tokens of KV. The two kinds of pairs run at their own measured speeds
(attn_eff, attn_self_eff; attention.py says why); the KV reads are added to the FLOPs (a sum fits
the profile as well as a max, see the calibration), so every chunk's re-read of the KV of the
chunks before it is charged at any chunk size. A decode is the chunk c = 1: k + 1 context pairs
and k + 1 tokens of KV. With a sliding window W (Mistral-7B v0.1) query j sees min(j, W) keys and
the chunk reads min(k + c, W + c - 1) tokens of KV. With local and global layers (Gemma 2: every other
layer windowed) each term is the windowed one for the windowed layers' share of L and the plain one
for the rest.

Quantization (executor.weight_dtype, weight_only, kv_cache_dtype): the linear layers' weights
are read, and held, at b_w bytes (lin_weights, weight memory); with 8-bit weights and 8-bit
activations (W8A8, the default for fp8/int8 weights) the GEMMs' F uses the hardware's 8-bit
peak (H100/H200: fp8 and int8 1,979 TFLOPS dense; A100: int8 624 TOPS dense, no fp8) and each
GEMM input pays a quantization pass (read b, write 1 byte per element); weight-only 8-bit
weights keep the 16-bit peak and dequantise for free in the GEMM (an assumption). The KV cache's
b_kv bytes set KV per token: attention's KV reads, the KV write, the KV capacity and the bytes a
swap moves. Attention's FLOPs stay at the 16-bit peak (fp8 KV is converted in the kernel, as
vLLM's paged attention does; the conversion's cost is taken as hidden under the KV reads).
Norms, embeddings, the LM head and all-reduces stay in model.dtype.

Pipeline stages (executor.pipeline_parallel, sarathi_lab/topology/pipeline.py): `iteration_parts` splits an
iteration into its CPU side, its L layers (a stage of l layers takes l / L: every layer term above
is linear in L) and its LM head; `send_recv_terms` prices handing the activations to the next
stage, `gather_terms` the receiving TP group's all-gather, and `pipeline_kv_blocks` the KV cache
that every stage's GPUs hold beside their layers' weights (memory.py).

Mixture-of-experts models (moe.py: the formulas and their sources): the router, shared experts
and dense MLPs join P above; the routed experts add experts(T), priced by the tokens each expert
gets and the weights of the experts the batch touches, and with expert parallelism
(executor.expert_parallel = ep) the all-to-all dispatch and combine; the ep groups run attention
data-parallel, so every per-token term above is that of 1/ep of the batch, and the KV pool is the
groups' sum.

Latent attention (DeepSeek-V2/V3, MLA; `_mla_attention`): KV per token and layer is one latent of
r = kv_lora_rank plus a RoPE key of p = qk_rope_head_dim, shared by every head and held whole on
every GPU of the TP group; a decode scores it in the absorbed form, 2 (r + p) + 2 r FLOPs per pair
and head, reading (r + p) b_kv bytes per token and layer; a prefill chunk runs the plain form,
2 (n + p) + 2 v FLOPs per pair and head (n = qk_nope_head_dim, v = v_head_dim), after
up-projecting each cached token it reads, 2 r H (n + v) FLOPs at the GEMM peak.

Not modelled (small, or properties of the serving stack rather than the GPU): the embedding lookup
and its all-reduce, the final norm, the gather of TP-sharded logits, sampling kernels, tile and
wave quantisation (the soft roofline averages it), kernel floors that vary with the batch (the
floors are a constant per layer), and the KV memory a sliding window would free (the KV manager
keeps every block).
"""
from __future__ import annotations

from dataclasses import asdict

import numpy as np

from sarathi_lab.costmodels.base import CostModel, batch_shape
from sarathi_lab.costmodels.roofline.attention import chunk_pairs
from sarathi_lab.costmodels.roofline.communication import (
    allreduce_terms,
    gather_terms,
    send_recv_terms,
)
from sarathi_lab.costmodels.roofline.hardware import HardwareSpec, RooflineConfig, gemm_peak
from sarathi_lab.costmodels.roofline.memory import RooflineMemory
from sarathi_lab.costmodels.roofline.moe import MoeCost, check_layout
from sarathi_lab.models.dtypes import dtype_bytes
from sarathi_lab.models.shape import ModelShape

# "no window": larger than any context, so min(k + 1, _NO_WINDOW) is k + 1
_NO_WINDOW = 1 << 62
# decode runs up to this many steps are priced in Python floats, longer ones in arrays
_SHORT_RUN = 48


class RooflineCostModel(RooflineMemory, CostModel):
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
        q = cfg if isinstance(cfg, RooflineConfig) else RooflineConfig()
        ep = self.ep = int(q.expert_parallel or 1)
        check_layout(m, ep, q.moe_imbalance)
        h, d, b, L = m.hidden_size, m.head_dim, m.dtype_bytes, m.num_layers
        # quantization: the linear layers' weight bytes (b_w) and GEMM peak, the KV bytes (b_kv);
        # activations, norms, embeddings and the LM head stay in model.dtype (b)
        self.weight_dtype = q.weight_dtype or m.dtype
        self.kv_cache_dtype = q.kv_cache_dtype or m.dtype
        b_w, b_kv = dtype_bytes(self.weight_dtype), dtype_bytes(self.kv_cache_dtype)
        gemm_flops = gemm_peak(hw, self.weight_dtype, bool(q.weight_only))
        w8a8 = self.weight_dtype in ("float8", "int8") and not q.weight_only
        self.heads = m.num_heads // tp
        # With fewer KV heads than GPUs, each GPU keeps a replica of one (as vLLM does).
        self.kv_heads = max(1, m.num_kv_heads // tp)
        inter = m.intermediate_size / tp
        self.window = m.sliding_window or _NO_WINDOW
        # local/global layers (Gemma 2): the share of the L layers that read at most the window
        # (the others every key); 0.0: all layers alike (every one windowed if window is set)
        self.local_share = m.windowed_layers / L if m.full_attention_layers else 0.0

        # -- weights and KV per GPU
        # one layer's attention weights on one GPU (Q, K, V, O sharded by heads)
        attn_params = h * (self.heads + 2 * self.kv_heads) * d + self.heads * d * h
        if m.is_mla:
            attn_params = self._mla_params()
        self.linear_params = attn_params + 3 * h * inter        # per layer
        # the MLP read per token (ew_bytes), and the down projection's input per token (what
        # W8A8 quantizes): a dense model's, or a MoE layer's share below
        mlp_width, down_in = 3 * inter, inter
        self.moe = None
        if m.is_moe:
            # per layer, averaged over the layers: the attention, the dense MLPs of the first
            # layers, and each MoE layer's router (replicated: every GPU routes its tokens),
            # shared experts (sharded like a dense MLP) and their gate; the routed experts are
            # the MoeCost's
            shared = m.shared_expert_intermediate_size / tp
            moe_dense = h * m.num_experts + 3 * h * shared + h * m.shared_expert_gate
            dense = m.first_dense_layers
            self.linear_params = attn_params \
                + (dense * 3 * h * inter + m.moe_layers * moe_dense) / L
            self.moe = MoeCost(m, hw, tp, ep, q.moe_imbalance or 1.0, b, b_w,
                               gemm_peak(hw, self.weight_dtype, bool(q.weight_only)))
            # SiLU x mul of the k experts each token visits, the shared ones, the dense MLPs;
            # and the permute / unpermute of each assignment's hidden state (read + write, in
            # and out: 4 h)
            e_width = m.num_experts_per_tok * m.moe_intermediate_size / tp
            mlp_width = (dense * 3 * inter + m.moe_layers * (3 * (e_width + shared)
                         + 4 * h * m.num_experts_per_tok)) / L
            # each of a token's k experts (and the shared one) has a down projection of its own
            down_in = (dense * inter + m.moe_layers * (e_width + shared)) / L
        #: routed experts' weights on one GPU, all layers (0: dense)
        self.expert_params = self.moe.params if self.moe else 0
        vocab_params = m.vocab_size * h / tp                   # vocab-parallel embedding, LM head
        # per-channel or per-tensor scales of 8-bit weights (<= 4 bytes a row of >= 4096) left
        # out: under 0.1% of the weight bytes
        self.weight_bytes = b_w * (L * self.linear_params + self.expert_params) \
            + b * (L * 2 * h + h + vocab_params * (1 if m.tie_word_embeddings else 2))
        self.kv_bytes_per_token = L * m.kv_elements_per_layer(tp) * b_kv   # all layers

        # -- seconds per unit, whole model; precomputed so the hot path is a few multiplies
        flops, bw = hw.peak_flops, hw.mem_bandwidth * hw.mem_eff
        self.n, self.inv_n = hw.ridge_exponent, 1.0 / hw.ridge_exponent
        # ASSUMPTION: 8-bit GEMMs reach the same share of their peak as the fitted 16-bit ones
        # (no 8-bit profile here to fit compute_eff to)
        self.lin_per_token = L * 2 * self.linear_params / (gemm_flops * hw.compute_eff)
        self.lin_weights = L * b_w * self.linear_params / bw
        # norms (read+write h, x2), residual adds (read 2h write h, x2) are replicated per rank;
        # RoPE (read+write q, k), SiLU*mul (read 2I write I), KV write (in kv_cache_dtype) are
        # sharded.
        # (latent attention: RoPE on each head's and the shared key's qk_rope_head_dim dims)
        roped = (self.heads + 1) * m.qk_rope_head_dim if m.is_mla \
            else (self.heads + self.kv_heads) * d
        ew_bytes = b * (10 * h + 2 * roped + mlp_width) + b_kv * m.kv_elements_per_layer(tp)
        if w8a8:
            # each GEMM's input quantized to 8 bits on the fly by its own kernel (read in
            # model.dtype, write 8 bits), as vLLM's dynamic fp8 (a per-tensor scale per forward)
            # and int8 quantization do unless fused into the norm before it (ASSUMPTION: not
            # fused); the output's dequantization is in the GEMM's epilogue
            ew_bytes += (b + b_w) * (2 * h + self.heads * d + down_in)
        self.ew_per_token = L * ew_bytes / bw
        # attention: 4 d FLOPs per query-key pair and head (QK^T and PV); the pairs against
        # cached context and those within a prefill chunk at their own efficiencies (attention.py)
        self.attn_per_pair = L * 4 * d * self.heads / (flops * hw.attn_eff)
        self.attn_per_self_pair = L * 4 * d * self.heads / (flops * (hw.attn_self_eff
                                                                      or hw.attn_eff))
        self.attn_per_kv_token = self.kv_bytes_per_token / (hw.mem_bandwidth * hw.attn_kv_eff)
        # a decode's k + 1 pairs are all priced as context pairs (its one pair with itself too)
        self.decode_per_kv_token = self.attn_per_pair + self.attn_per_kv_token
        #: FLOP-seconds per cached token a prefill chunk re-reads, beyond its pairs and bytes
        #: (latent attention's up-projection; 0: none)
        self.ctx_upproj = 0.0
        if m.is_mla:
            self._mla_attention(hw, flops, gemm_flops)
        self.lm_per_row = 2 * vocab_params / (flops * hw.compute_eff)
        self.lm_weights = b * vocab_params / bw
        self.ar_fixed, self.ar_per_token, self.far_fixed, self.far_per_token = \
            allreduce_terms(hw, tp, L, h * b)
        self.overhead = hw.iteration_overhead_s
        self.req_overhead = hw.request_overhead_s
        self.layer_floors = L * hw.layer_overhead_s
        if ep > 1:
            # attention data-parallel over the ep groups: each group runs 1/ep of the batch's
            # tokens, pairs, KV reads and sampled rows (weights are read by every group)
            for name in ("lin_per_token", "ew_per_token", "attn_per_pair", "attn_per_self_pair",
                         "attn_per_kv_token", "decode_per_kv_token", "ctx_upproj", "lm_per_row",
                         "ar_per_token", "far_per_token"):
                setattr(self, name, getattr(self, name) / ep)
        self._by_tokens: dict[int, float] = {}             # memo of _fixed's terms of T
        self._by_rows: dict[int, float] = {}                # ... and of S

    # ---- latent attention (DeepSeek-V2/V3; module docstring) ----------------------------------
    def _mla_params(self) -> float:
        """One layer's latent-attention weights on one GPU: the query's and the latent's down
        projections (and their norms) replicated on every GPU, as vLLM does; the query's up
        projection, the latent's up projection to keys and values and O sharded by heads."""
        m, h, H = self.model, self.model.hidden_size, self.heads
        qr, kr = m.q_lora_rank, m.kv_lora_rank
        q = h * qr + qr + qr * H * m.head_dim if qr else h * H * m.head_dim
        return q + h * (kr + m.qk_rope_head_dim) + kr \
            + kr * H * (m.qk_nope_head_dim + m.v_head_dim) + H * m.v_head_dim * h

    def _mla_attention(self, hw, flops: float, gemm_flops: float) -> None:
        """Latent attention's per-pair and per-token costs. A decode runs the absorbed form
        (vLLM's MLA decode): the key up-projection is folded into the query, so each head scores
        the cached (kv_lora_rank + qk_rope_head_dim) latent directly and sums kv_lora_rank values
        (2 (r + p) + 2 r FLOPs a pair and head), reading only the latent. A prefill chunk runs
        the plain form over up-projected keys and values (2 (n + p) + 2 v FLOPs a pair and head),
        so every cached token it reads is first up-projected (2 r H (n + v) FLOPs, a GEMM); its
        own tokens' up-projection is the linear term's kv_b weights (each token goes through them
        once: prefill to up-project, decode to absorb)."""
        m, L, H = self.model, self.model.num_layers, self.heads
        r, p, n, v = m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim
        prefill = L * (2 * (n + p) + 2 * v) * H
        self.attn_per_pair = prefill / (flops * hw.attn_eff)
        self.attn_per_self_pair = prefill / (flops * (hw.attn_self_eff or hw.attn_eff))
        self.decode_per_kv_token = L * (2 * (r + p) + 2 * r) * H / (flops * hw.attn_eff) \
            + self.attn_per_kv_token
        self.ctx_upproj = L * 2 * r * H * (n + v) / (gemm_flops * hw.compute_eff)

    # ---- components (seconds, whole model, per GPU) -----------------------------------------
    def _soft(self, compute: float, memory: float) -> float:
        """(compute^n + memory^n)^(1/n), written so that it stays finite for any n."""
        x = compute / memory
        return memory * (1.0 + x ** self.n) ** self.inv_n

    def linear_time(self, T: int) -> float:
        return self._soft(T * self.lin_per_token, self.lin_weights) if T > 0 else 0.0

    def elementwise_time(self, T: int) -> float:
        return T * self.ew_per_token

    def chunk_attention_time(self, c: int, k: int) -> float:
        """Attention of c new tokens after k cached ones (a decode is c = 1, priced as one)."""
        w = self.window
        if c == 1:
            return self._decode_keys(k) * self.decode_per_kv_token
        if self.ctx_upproj:
            return self._plain_chunk_time(c, k, w) + k * self.ctx_upproj
        f = self.local_share
        if f:
            # the windowed layers' share at the window, the global layers' at every key
            return f * self._plain_chunk_time(c, k, w) \
                + (1.0 - f) * self._plain_chunk_time(c, k, _NO_WINDOW)
        return self._plain_chunk_time(c, k, w)

    def _decode_keys(self, k: int):
        """Keys a decode after k cached tokens reads, averaged over the layers."""
        w = self.window
        if k < w:
            return k + 1
        f = self.local_share
        return f * w + (1.0 - f) * (k + 1) if f else w

    def _plain_chunk_time(self, c: int, k: int, w: int) -> float:
        if k + c <= w:
            return c * k * self.attn_per_pair + c * (c + 1) // 2 * self.attn_per_self_pair \
                + (k + c) * self.attn_per_kv_token
        ctx, own = chunk_pairs(c, k, w)
        return ctx * self.attn_per_pair + own * self.attn_per_self_pair \
            + min(k + c, w + c - 1) * self.attn_per_kv_token

    def attention_time(self, prefills, decode_contexts) -> float:
        pre = 0.0
        for c, k in prefills:
            pre += self.chunk_attention_time(c, k)
        w = self.window
        dec = 0
        if self.local_share:
            for k in decode_contexts:
                dec += self._decode_keys(k)
            return pre + dec * self.decode_per_kv_token
        for k in decode_contexts:                # each decode reads k + 1 tokens, at most w
            dec += k + 1 if k < w else w
        return pre + dec * self.decode_per_kv_token

    def lm_head_time(self, S: int) -> float:
        return self._soft(S * self.lm_per_row, self.lm_weights) if S > 0 else 0.0

    def allreduce_time(self, T: int) -> float:
        if self.tp == 1 or T <= 0:
            return 0.0
        ring = self.ar_fixed + T * self.ar_per_token
        fast = self.far_fixed + T * self.far_per_token
        return fast if fast < ring else ring

    def _fixed(self, T: int, S: int, B: int) -> float:
        """Everything but attention: a function of the batch's token, sampled-row and request
        counts. The terms of T and of S are memoized: this runs once per simulated iteration,
        and a run sees few distinct token and row counts."""
        if T <= 0:
            return self.overhead
        by_t = self._by_tokens.get(T)
        if by_t is None:
            by_t = self.layer_floors + self.linear_time(T) + T * self.ew_per_token \
                + self.allreduce_time(T)
            if self.moe is not None:
                by_t += self.moe.experts_time(T) + self.moe.all_to_all_time(T)
            self._by_tokens[T] = by_t
        by_s = self._by_rows.get(S)
        if by_s is None:
            by_s = self._by_rows[S] = self.lm_head_time(S)
        return self.overhead + B * self.req_overhead + by_t + by_s

    # ---- whole iterations --------------------------------------------------------------------
    def iteration_time(self, prefills, decode_contexts, num_sampled: int | None = None) -> float:
        """prefills: (chunk, context) pairs; decode_contexts: tokens in KV before each decode.
        num_sampled defaults to every request (each prefill taken as a prompt's last chunk)."""
        B = len(prefills) + len(decode_contexts)
        T = sum(c for c, _ in prefills) + len(decode_contexts)
        S = B if num_sampled is None else num_sampled
        return self._fixed(T, S, B) + self.attention_time(prefills, decode_contexts)

    def breakdown(self, prefills, decode_contexts, num_sampled: int | None = None) -> dict:
        B = len(prefills) + len(decode_contexts)
        T = sum(c for c, _ in prefills) + len(decode_contexts)
        S = B if num_sampled is None else num_sampled
        parts = {
            "overhead": self.overhead + (B * self.req_overhead if T > 0 else 0.0),
            "layer_overhead": self.layer_floors if T > 0 else 0.0,
            "linear": self.linear_time(T),
            "elementwise": self.elementwise_time(T),
            "attention_prefill": self.attention_time(prefills, []),
            "attention_decode": self.attention_time([], decode_contexts),
            "lm_head": self.lm_head_time(S),
            "allreduce": self.allreduce_time(T),
        }
        if self.moe is not None:
            parts["experts"] = self.moe.experts_time(T)
            parts["all_to_all"] = self.moe.all_to_all_time(T)
        parts["total"] = sum(parts.values())
        return parts

    def step_time(self, reqs, num_new_tokens) -> float:
        """The hot path: iteration_time of a scheduled batch, read straight off the requests."""
        if self.window != _NO_WINDOW or self.ctx_upproj:
            return self._windowed_step_time(reqs, num_new_tokens)
        S = dec = 0
        pre = 0.0
        a_pair, a_self, a_kv = self.attn_per_pair, self.attn_per_self_pair, self.attn_per_kv_token
        for r, c in zip(reqs, num_new_tokens):
            k = r.num_computed_tokens
            end = k + c
            if end == r.num_prompt_tokens + r.num_output_tokens:
                S += 1                       # the request caught up: it samples a token
            if c == 1:
                dec += end                   # decode (or a 1-token chunk: same cost)
            else:
                pre += c * k * a_pair + c * (c + 1) // 2 * a_self + end * a_kv
        return self._fixed(sum(num_new_tokens), S, len(num_new_tokens)) \
            + (pre + dec * self.decode_per_kv_token)

    def _windowed_step_time(self, reqs, num_new_tokens) -> float:
        """step_time priced request by request (chunk_attention_time): a sliding-window model
        (attention reads at most the window) or latent attention (a chunk's context is
        up-projected)."""
        T = S = dec = 0
        pre = 0.0
        w = self.window
        for r, c in zip(reqs, num_new_tokens):
            k = r.num_computed_tokens
            T += c
            if k + c == r.num_prompt_tokens + r.num_output_tokens:
                S += 1
            if c == 1:
                dec += (k + 1 if k < w else w) if not self.local_share else self._decode_keys(k)
            else:
                pre += self.chunk_attention_time(c, k)
        return self._fixed(T, S, len(num_new_tokens)) + (pre + dec * self.decode_per_kv_token)

    def decode_run(self, contexts: np.ndarray, k: int) -> np.ndarray:
        """Durations of k decode-only iterations of the same requests, contexts +1 per step;
        the same floating-point operations as k calls of step_time."""
        ctx = np.asarray(contexts, dtype=np.int64)
        B = int(ctx.size)
        fixed = self._fixed(B, B, B)
        w = self.window
        if self.local_share and int(ctx.max(initial=0)) + k > w:
            # local and global layers: step_time's sums, request by request
            rate, keys, cs = self.decode_per_kv_token, self._decode_keys, ctx.tolist()
            out = []
            for j in range(k):
                dec = 0
                for c in cs:
                    dec += keys(c + j)
                out.append(fixed + (0.0 + dec * rate))
            return np.array(out)
        if w == _NO_WINDOW or int(ctx.max(initial=0)) + k <= w:
            total = sum(ctx.tolist())
            if k <= _SHORT_RUN:
                # a run is a few dozen steps, where numpy's per-call cost would be most of
                # the work; Python floats round as numpy's float64 does
                rate = self.decode_per_kv_token
                return np.array([fixed + (0.0 + (total + B * j) * rate)
                                 for j in range(1, k + 1)])
            dec = total + B * np.arange(1, k + 1, dtype=np.int64)
        else:
            steps = np.arange(1, k + 1, dtype=np.int64)
            # step j reads sum_i min(ctx_i + j, w): the contexts still below w - j, plus w each
            srt = np.sort(ctx)
            prefix = np.concatenate(([0], np.cumsum(srt)))
            below = np.searchsorted(srt, w - steps, side="left")
            dec = prefix[below] + steps * below + w * (B - below)
        return fixed + (0.0 + dec * self.decode_per_kv_token)

    def chunk_run(self, contexts: list[int], computed: int, chunks: list[int],
                  samples_last: bool) -> list[float] | None:
        """Durations of len(chunks) batches of the same decodes (`contexts`, +1 per batch) and
        one prompt chunk each (`chunks[j]` tokens after `computed` + the chunks before it; the
        last one samples if `samples_last`): the same floating-point operations as step_time
        on each batch. None for what step_time prices otherwise (a sliding window, a subclass
        that reprices a step)."""
        if self.window != _NO_WINDOW or self.ctx_upproj \
                or type(self).step_time is not RooflineCostModel.step_time \
                or type(self)._fixed is not RooflineCostModel._fixed:
            return None
        B = len(contexts)
        total = sum(contexts)
        a_pair, a_self, a_kv = self.attn_per_pair, self.attn_per_self_pair, self.attn_per_kv_token
        rate = self.decode_per_kv_token
        fixed, out, k = self._fixed, [], computed
        last = len(chunks) - 1
        for j, c in enumerate(chunks):
            dec = total + B * (j + 1)   # each decode's end, summed, as step_time adds them
            end = k + c
            pre = 0.0
            if c == 1:
                dec += end
            else:
                pre += c * k * a_pair + c * (c + 1) // 2 * a_self + end * a_kv
            S = B + 1 if samples_last and j == last else B
            out.append(fixed(B + c, S, B + 1) + (pre + dec * rate))
            k = end
        return out

    # ---- pipeline stages (executor.pipeline_parallel) -----------------------------------------
    def iteration_parts(self, prefills, decode_contexts, num_sampled: int | None = None):
        """iteration_time in three parts (they add up to it): the CPU side, the L layers (a stage
        of l layers takes l / L of it: every layer term is linear in L, the soft roofline
        included) and the LM head (the last stage's)."""
        B = len(prefills) + len(decode_contexts)
        T = sum(c for c, _ in prefills) + len(decode_contexts)
        if T <= 0:
            return self.overhead, 0.0, 0.0
        S = B if num_sampled is None else num_sampled
        self._fixed(T, S, B)   # fills the memos of the terms of T and of S read below
        layers = self._by_tokens[T] + self.attention_time(prefills, decode_contexts)
        return self.overhead + B * self.req_overhead, layers, self._by_rows[S]

    def step_parts(self, reqs, num_new_tokens):
        # the generic one, declared here: it is consistent with this class's step_time (a
        # subclass that re-prices step_time alone gets the generic split, see base.split_step)
        return self.iteration_parts(*batch_shape(reqs, num_new_tokens))

    def send_recv_terms(self, across_nodes: bool = False) -> tuple[float, float]:
        """(latency, seconds per token) of one stage handing its activations to the next. vLLM
        sends two tensors per token (hidden states and residual, its IntermediateTensors), each
        TP rank its 1/tp slice to its peer of the next stage, all pairs at once (send-allgather):
        2 h b / tp bytes per token over NVLink within a node, over a NIC across nodes."""
        m = self.model
        # with expert parallelism each group hands on its own 1/ep of the tokens, all at once
        lat, per_token = send_recv_terms(self.hw, 2 * m.hidden_size * m.dtype_bytes / self.tp,
                                         across_nodes)
        return lat, per_token / self.ep

    def send_recv_time(self, num_tokens: int, across_nodes: bool = False) -> float:
        lat, per_token = self.send_recv_terms(across_nodes)
        return lat + num_tokens * per_token if num_tokens > 0 else 0.0

    def gather_terms(self) -> tuple[float, float]:
        """(latency, seconds per token) of the receiving stage's all-gather of those slices
        within its TP group (tp > 1; none at tp 1): a ring all-gather, (tp-1)/tp of the 2 h b
        bytes per token (communication.gather_terms)."""
        m = self.model
        lat, per_token = gather_terms(self.hw, self.tp, 2 * m.hidden_size * m.dtype_bytes)
        return lat, per_token / self.ep
