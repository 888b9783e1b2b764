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
import torch.nn.functional as F

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
    if (k_cache.is_contiguous() and v_cache.is_contiguous() and len(slot_mapping)
            and int(slot_mapping.min()) >= 0):
        # no padding (the executor's batches have none): one flat indexed copy per cache,
        # several ops fewer than the masked path below, in every layer of every step
        slots = slot_mapping.long()
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, key.to(k_cache.dtype))
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, value.to(v_cache.dtype))
        return
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = k_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    # Two-index assignment works on non-contiguous caches too (no flattening view required).
    k_cache[blocks, offsets] = key[keep].to(k_cache.dtype)
    v_cache[blocks, offsets] = value[keep].to(v_cache.dtype)


def _gather(cache: torch.Tensor, block_tables: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` cached tokens of each sequence, [B, length, Hkv, D].

    Whole blocks are copied with one index_select (a block is one contiguous run of
    block_size * Hkv * D values): far cheaper on a CPU than indexing token by token. Padding
    entries of a block table may be -1; the positions that reach them are masked by the caller,
    so any valid block id will do.
    """
    bs = cache.shape[1]
    nb = -(-length // bs)
    ids = block_tables[:, :nb].long().clamp_min(0).reshape(-1)
    rows = cache.index_select(0, ids).view(block_tables.shape[0], nb * bs, *cache.shape[2:])
    return rows[:, :length]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float):
    """Masked softmax attention with GQA, computed in fp32.

    q [B, Q, H, D]; k, v [B, L, Hkv, D]; mask [B, Q, L] (True = may attend; every query row
    has at least its own position). Returns [B, Q, H, D] in fp32.
    """
    out = F.scaled_dot_product_attention(
        q.float().transpose(1, 2), k.float().transpose(1, 2), v.float().transpose(1, 2),
        attn_mask=mask[:, None], scale=scale, enable_gqa=True)
    return out.transpose(1, 2)


def _decode_batch(q, k_cache, v_cache, block_tables, seq_lens, scale, window=None):
    """Attention for sequences that each have exactly one new token, batched with padding.

    q [B, H, D]; block_tables [B, max_blocks]; seq_lens [B] (host list of ints).
    """
    max_len = max(seq_lens)
    k, v = _gather(k_cache, block_tables, max_len), _gather(v_cache, block_tables, max_len)
    lens = torch.tensor(seq_lens, device=q.device)
    key_pos = torch.arange(max_len, device=q.device)[None, :]
    mask = key_pos < lens[:, None]  # [B, L]
    if window is not None:   # the query (at lens - 1) sees its last `window` keys
        mask &= key_pos >= lens[:, None] - window
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
    sequence_kv=None,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention of a flattened batch of prefill chunks and decodes over a paged cache.

    Sequence i owns q rows query_start_loc[i]:query_start_loc[i+1]; they are its last q_len_i
    tokens out of seq_lens[i], whose K/V are already in the cache.

    With `sequence_kv` (a `sequence_kv.StepPlan` for this batch) attention reads each sequence's
    contiguous copy, which the plan first brings up to date from the cache, instead of gathering
    its blocks. With `window` (Mistral's sliding window) a query at position p attends to the
    keys at positions p - window + 1 .. p only, as Hugging Face's mask has it.
    """
    if sequence_kv is not None:
        return sequence_kv.attention(q, k_cache, v_cache, scale, window)
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    q_lens = [starts[i + 1] - starts[i] for i in range(len(lens))]

    # Decodes dominate a serving batch: run them together, in groups of similar context length.
    decodes = [i for i, n in enumerate(q_lens) if n == 1]
    for group in _decode_groups(decodes, lens, k_cache.shape[2] * k_cache.shape[3]):
        idx = torch.tensor(group, device=q.device)
        rows = torch.tensor([starts[j] for j in group], device=q.device)
        res = _decode_batch(q[rows], k_cache, v_cache, block_tables[idx], [lens[j] for j in group],
                            scale, window)
        out[rows] = res.to(q.dtype)

    # Prefill chunks (and whole prompts): one masked attention per sequence.
    for i, n in enumerate(q_lens):
        if n <= 1:
            continue
        length = lens[i]
        table = block_tables[i : i + 1]
        k, v = _gather(k_cache, table, length), _gather(v_cache, table, length)
        q_pos = torch.arange(length - n, length, device=q.device)
        key_pos = torch.arange(length, device=q.device)[None, :]
        mask = key_pos <= q_pos[:, None]
        if window is not None:
            mask &= key_pos > q_pos[:, None] - window
        res = _attend(q[None, starts[i] : starts[i + 1]], k, v, mask[None], scale)[0]
        out[starts[i] : starts[i + 1]] = res.to(q.dtype)
    return out
