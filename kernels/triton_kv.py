"""Triton kernel that writes new K/V rows into paged cache slots.

Set TRITON_INTERPRET=1 before importing this module to run it on a CPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_cb, stride_co, stride_ch, stride_cd,  # k_cache strides (block, offset, head, dim)
    stride_vcb, stride_vco, stride_vch, stride_vcd,  # v_cache strides
    num_kv_heads, head_dim,
    BLOCK_SIZE: tl.constexpr,  # a power of two, so // and % compile to shifts and masks
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program per token: it copies all of that token's kv heads at once.
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:  # a padding token
        return
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE

    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < num_kv_heads) & (d < head_dim)

    k = tl.load(key_ptr + t * stride_kt + h * stride_kh + d * stride_kd, mask=mask)
    v = tl.load(value_ptr + t * stride_vt + h * stride_vh + d * stride_vd, mask=mask)
    k_dst = k_cache_ptr + blk * stride_cb + off * stride_co + h * stride_ch + d * stride_cd
    v_dst = v_cache_ptr + blk * stride_vcb + off * stride_vco + h * stride_vch + d * stride_vcd
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter key/value [T, Hkv, D] into k_cache/v_cache [N, block_size, Hkv, D] in place."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    assert k_cache.shape[2:] == (num_kv_heads, head_dim) and v_cache.shape == k_cache.shape
    assert slot_mapping.shape[0] == num_tokens
    _write_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        *key.stride(), *value.stride(), *k_cache.stride(), *v_cache.stride(),
        num_kv_heads, head_dim,
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
