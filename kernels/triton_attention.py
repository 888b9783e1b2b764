"""Triton paged attention for a flattened batch that mixes prefill chunks and decodes.

One launch serves every sequence of the batch. A program owns (sequence, tile of query tokens,
kv head): it packs the tile's tokens times the query heads that share the kv head into the rows
of one matrix, so each K/V tile read from the cache is used by the whole GQA group, and it runs an
online softmax over the context in tiles of BLOCK_N keys, read through the block table one
position at a time so that any power-of-two block size works.

Set TRITON_INTERPRET=1 before importing this module to run it on a CPU (fp32/fp16 only: the
interpreter computes bf16 wrongly, so loads are upcast to fp32 there).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

_LOG2E = 1.0 / math.log(2.0)
# tl.dot needs a reduction dimension >= 16 for 16-bit operands and pads smaller row/column
# counts to 16 anyway, so no tile dimension goes below it.
_MIN_DOT = 16


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    block_tables_ptr, query_start_loc_ptr, seq_lens_ptr,
    scale_log2,  # softmax scale * log2(e): the softmax runs on exp2
    window,  # a query at p sees keys p - window + 1 .. p (a sliding window; huge: none)
    stride_qt, stride_qh, stride_qd,
    stride_ot, stride_oh, stride_od,
    stride_kb, stride_ko, stride_kh, stride_kd,
    stride_vb, stride_vo, stride_vh, stride_vd,
    stride_bt,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per kv head
    BLOCK_G: tl.constexpr,  # GROUP rounded up to a power of two
    BLOCK_Q: tl.constexpr,  # query tokens per program
    BLOCK_N: tl.constexpr,  # keys per loop step
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two >= 16
    UPCAST: tl.constexpr,  # compute in fp32 (the interpreter)
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    tile = tl.program_id(1)
    kv_head = tl.program_id(2)

    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    # The grid is sized for the longest chunk of the batch; shorter ones leave programs idle.
    if tile * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx_len = seq_len - q_len  # tokens cached before this chunk

    # Row r of the tile is token r // BLOCK_G of the tile, query head r % BLOCK_G of the group.
    rows = tl.arange(0, BLOCK_Q * BLOCK_G)
    q_idx = tile * BLOCK_Q + rows // BLOCK_G
    g = rows % BLOCK_G
    row_ok = (q_idx < q_len) & (g < GROUP)
    head = kv_head * GROUP + g
    q_pos = ctx_len + q_idx
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM

    q_ptrs = (q_ptr + (q_start + q_idx)[:, None] * stride_qt + head[:, None] * stride_qh
              + d[None, :] * stride_qd)
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    # A finite start for the running max keeps fully masked steps from producing inf - inf.
    m_i = tl.full([BLOCK_Q * BLOCK_G], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q * BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q * BLOCK_G, BLOCK_D], dtype=tl.float32)

    # Causality: nothing in this tile sees past its last token.
    kv_end = tl.minimum(seq_len, ctx_len + (tile + 1) * BLOCK_Q)
    # Sliding window: nothing in this tile sees before its first token's window (whole key tiles
    # from there, so the loop's tiles stay aligned to BLOCK_N).
    kv_start = tl.maximum(ctx_len + tile * BLOCK_Q - window + 1, 0) // BLOCK_N * BLOCK_N
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    n = tl.arange(0, BLOCK_N)
    for start in range(kv_start, kv_end, BLOCK_N):
        pos = start + n
        pos_ok = pos < kv_end
        blk = tl.load(table + pos // BLOCK_SIZE, mask=pos_ok, other=0).to(tl.int64)
        off = pos % BLOCK_SIZE
        k_base = blk * stride_kb + off * stride_ko + kv_head * stride_kh
        v_base = blk * stride_vb + off * stride_vo + kv_head * stride_vh
        # K is loaded already transposed, [BLOCK_D, BLOCK_N], ready for q @ k.
        k = tl.load(k_cache_ptr + k_base[None, :] + d[:, None] * stride_kd,
                    mask=pos_ok[None, :] & d_ok[:, None], other=0.0)
        v = tl.load(v_cache_ptr + v_base[:, None] + d[None, :] * stride_vd,
                    mask=pos_ok[:, None] & d_ok[None, :], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)

        s = tl.dot(q, k, input_precision=DOT_PRECISION) * scale_log2
        # pos <= q_pos also implies pos < kv_end for every real row.
        s = tl.where((pos[None, :] <= q_pos[:, None]) & (pos[None, :] > q_pos[:, None] - window),
                     s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new

    # Padding rows may have l_i == 0; they are not stored, but keep them finite anyway.
    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_ptrs = (out_ptr + (q_start + q_idx)[:, None] * stride_ot + head[:, None] * stride_oh
              + d[None, :] * stride_od)
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def launch_params(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    max_query_len: int,
    on_gpu: bool,
    block_q: int | None = None,
    block_n: int | None = None,
) -> dict:
    """The kernel's compile-time parameters (and num_warps/num_stages) for one launch."""
    group = num_heads // num_kv_heads
    block_g = triton.next_power_of_2(group)
    if block_q is None:
        # ~64 rows per program for prefill; decodes get the smallest tile tl.dot allows.
        block_q = min(max(1, 64 // block_g), triton.next_power_of_2(max(max_query_len, 1)))
        block_q = max(block_q, _MIN_DOT // block_g, 1)
    if block_n is None:
        # 64x64 tiles at head dim 128 compile to ~190 registers on sm_90 without spills in
        # 16-bit; fp32 operands (3xTF32 dots) need half the key tile to stay near that.
        block_n = 64 if on_gpu and dtype != torch.float32 else 32
    assert block_q * block_g >= _MIN_DOT and block_n >= _MIN_DOT, "tiles too small for tl.dot"
    return dict(
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        GROUP=group,
        BLOCK_G=block_g,
        BLOCK_Q=block_q,
        BLOCK_N=block_n,
        BLOCK_D=max(_MIN_DOT, triton.next_power_of_2(head_dim)),
        # The interpreter computes bf16 wrongly; on a GPU, 16-bit operands go to the tensor cores.
        UPCAST=not on_gpu,
        # fp32 operands: 3xTF32 keeps fp32 accuracy on tensor cores (plain "ieee" dots spill
        # heavily at these tile sizes); 16-bit operands ignore the setting.
        DOT_PRECISION="tf32x3" if dtype == torch.float32 else "tf32",
        num_warps=4,
        num_stages=2,
    )


def paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    max_query_len: int | None = None,
    block_q: int | None = None,
    block_n: int | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention of a flattened batch over a paged cache; see reference.paged_attention_torch
    (`window`: a sliding window, as there).

    `max_query_len` (the longest chunk of the batch) sizes the grid; pass it when the caller knows
    it, to spare a device-to-host sync. `block_q`/`block_n` override the tile shape (for tests).
    """
    num_tokens, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    assert k_cache.shape[3] == head_dim and v_cache.shape == k_cache.shape
    assert num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
    assert block_size & (block_size - 1) == 0, "block_size must be a power of two"
    out = torch.empty_like(q)
    batch = seq_lens.shape[0]
    if num_tokens == 0 or batch == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max().item())
    if max_query_len == 0:
        return out

    params = launch_params(num_heads, num_kv_heads, head_dim, block_size, q.dtype, max_query_len,
                           q.is_cuda, block_q, block_n)
    block_tables = block_tables.contiguous()
    grid = (batch, triton.cdiv(max_query_len, params["BLOCK_Q"]), num_kv_heads)
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, out,
        block_tables, query_start_loc, seq_lens,
        scale * _LOG2E,
        # no window: one wider than any context (an int32 the kernel compares positions with)
        window if window is not None else 2**30,
        *q.stride(), *out.stride(), *k_cache.stride(), *v_cache.stride(),
        block_tables.stride(0),
        **params,
    )
    return out
