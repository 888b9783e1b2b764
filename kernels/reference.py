"""Torch reference for the paged-KV kernels.

This is the ground truth the Triton kernels are tested against, and the attention backend the
real model uses where there is no GPU, so it has to be both obviously right and fast enough for
a batch of ~64 running requests on a CPU.

Layout (shared with the Triton kernels):
  k_cache, v_cache   [num_blocks, block_size, num_kv_heads, head_dim]
  slot               block_id * block_size + offset_in_block
"""

from __future__ import annotations

import torch

# Upper bound on the elements of one gathered K (or V) tensor in the batched decode path: keeps the
# padded [B, Hkv, L, D] gather from blowing up memory for large batches of long contexts.
_DECODE_GATHER_BUDGET = 1 << 26
# Below this many gathered elements a decode batch is cheap enough that splitting it off to save
# padding would cost more in per-batch overhead than it saves.
_DECODE_SPLIT_MIN = 1 << 20


def write_kv_torch(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter key/value [T, Hkv, D] into the caches at `slot_mapping` [T]; slot -1 is skipped."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = k_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    # Two-index assignment works on non-contiguous caches too (no flattening view required).
    k_cache[blocks, offsets] = key[keep].to(k_cache.dtype)
    v_cache[blocks, offsets] = value[keep].to(v_cache.dtype)


def _gather(cache: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Cache rows at (blocks, offsets) [..., L] as [..., Hkv, L, D].

    One advanced-indexing gather lays K/V out head-major, ready for batched matmuls, instead of
    gathering [..., L, Hkv, D] and paying for a strided permute copy afterwards.
    """
    heads = torch.arange(cache.shape[2], device=cache.device)[:, None]
    return cache[blocks[..., None, :], offsets[..., None, :], heads]


def _slots(block_tables: torch.Tensor, length: int, block_size: int):
    """(block ids, offsets) of positions 0..length-1 through block_tables [..., max_blocks]."""
    pos = torch.arange(length, device=block_tables.device)
    # Padding entries of a block table may be -1; positions that reach them are masked out by the
    # caller, so any valid block id will do for the gather.
    blocks = block_tables[..., pos // block_size].long().clamp_min(0)
    return blocks, (pos % block_size).expand_as(blocks)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float):
    """Masked softmax attention with GQA, computed in fp32.

    q [..., Q, H, D]; k, v [..., Hkv, L, D]; mask [..., Q, L] (True = may attend).
    Returns [..., Q, H, D] in fp32.
    """
    *batch, nq, nh, d = q.shape
    nkv, length = k.shape[-3], k.shape[-2]
    group = nh // nkv
    # Rows of one kv head's matmul: its G query heads times the Q tokens, so K/V are never repeated.
    qg = q.float().reshape(*batch, nq, nkv, group, d).movedim(-4, -2).reshape(*batch, nkv, group * nq, d)
    scores = torch.matmul(qg, k.float().transpose(-1, -2)).mul_(scale)
    scores = scores.view(*batch, nkv, group, nq, length)
    scores.masked_fill_(~mask[..., None, None, :, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).view(*batch, nkv, group * nq, length)
    out = torch.matmul(probs, v.float()).view(*batch, nkv, group, nq, d)
    return out.movedim(-2, -4).reshape(*batch, nq, nh, d)


def _decode_batch(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """Attention for sequences that each have exactly one new token, batched with padding.

    q [B, H, D]; block_tables [B, max_blocks]; seq_lens [B] (host list of ints).
    """
    max_len = max(seq_lens)
    blocks, offsets = _slots(block_tables, max_len, k_cache.shape[1])
    k = _gather(k_cache, blocks, offsets)  # [B, Hkv, L, D]
    v = _gather(v_cache, blocks, offsets)
    lens = torch.tensor(seq_lens, device=q.device)
    mask = torch.arange(max_len, device=q.device)[None, :] < lens[:, None]  # [B, L]
    return _attend(q[:, None], k, v, mask[:, None, :], scale)[:, 0]


def _decode_groups(seqs: list[int], lens: list[int], per_token: int) -> list[list[int]]:
    """Split decoding sequences into batches that are each padded to their longest context.

    Sorted by length, a batch is closed when the next sequence would push its padded gather over
    the memory budget, or, once the gather is big enough for per-batch overhead not to matter,
    when the next length is 1.5x the batch's shortest (bounding the padding waste).
    """
    groups: list[list[int]] = []
    group: list[int] = []
    for i in sorted(seqs, key=lambda i: lens[i]):
        if group:
            padded = (len(group) + 1) * lens[i] * per_token
            if padded > _DECODE_GATHER_BUDGET or (
                padded > _DECODE_SPLIT_MIN and lens[i] > 1.5 * lens[group[0]]
            ):
                groups.append(group)
                group = []
        group.append(i)
    if group:
        groups.append(group)
    return groups


def paged_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of a flattened batch of prefill chunks and decodes over a paged cache.

    Sequence i owns q rows query_start_loc[i]:query_start_loc[i+1]; they are its last q_len_i
    tokens out of seq_lens[i], whose K/V are already in the cache.
    """
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    q_lens = [starts[i + 1] - starts[i] for i in range(len(lens))]

    # Decodes dominate a serving batch: run them together, in groups of similar context length.
    decodes = [i for i, n in enumerate(q_lens) if n == 1]
    for group in _decode_groups(decodes, lens, k_cache.shape[2] * k_cache.shape[3]):
        idx = torch.tensor(group, device=q.device)
        rows = torch.tensor([starts[j] for j in group], device=q.device)
        res = _decode_batch(q[rows], k_cache, v_cache, block_tables[idx], [lens[j] for j in group], scale)
        out[rows] = res.to(q.dtype)

    # Prefill chunks (and whole prompts): one masked attention per sequence.
    for i, n in enumerate(q_lens):
        if n <= 1:
            continue
        length = lens[i]
        blocks, offsets = _slots(block_tables[i], length, k_cache.shape[1])
        k, v = _gather(k_cache, blocks, offsets), _gather(v_cache, blocks, offsets)
        q_pos = torch.arange(length - n, length, device=q.device)
        mask = torch.arange(length, device=q.device)[None, :] <= q_pos[:, None]
        out[starts[i] : starts[i + 1]] = _attend(q[starts[i] : starts[i + 1]], k, v, mask, scale).to(q.dtype)
    return out
