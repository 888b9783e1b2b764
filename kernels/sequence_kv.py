"""Per-sequence contiguous copies of the paged KV cache: the torch backend's fast attention path.

Reading a sequence's KV through its block table means copying every one of its blocks into a
padded batch tensor, in every layer of every step: a decode step moves the whole KV of the batch
to attend over it once, and on a CPU that copy (and the padding) costs as much as the attention
itself. Here each running sequence keeps, per layer, its K and V in one ``[Hkv, capacity, D]``
buffer that grows in place: a step copies only its new tokens out of the paged cache (after
``write_kv`` put them there) and attends over a view of the buffer, one sequence at a time, with
no padding and, for a decode, no mask.

The paged cache stays the store: a buffer is filled from it when a sequence starts with KV already
computed (a prefix-cache hit), and rebuilt from it when a sequence's progress went back (preempted
and recomputed). A buffer's capacity is the KV slots its block table holds, so the copies never
hold more than the paged cache does.

    store = SequenceKV()
    plan = store.plan(keys, starts, num_new, block_tables, block_size)   # once per step
    out = plan.attention(q, k_cache, v_cache, scale)                      # once per layer
    store.commit(plan)                                                    # after the forward
    store.drop(keys_of_requests_that_ended_or_were_preempted)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class _Seq:
    """One sequence's buffers: layer key (the layer's k_cache data pointer) -> [2, Hkv, capacity,
    D], K then V."""
    __slots__ = ("length", "layers")

    def __init__(self):
        self.length = 0          # tokens [0, length) are valid in every layer's buffers
        self.layers: dict = {}


class SequenceKV:
    """The contiguous copies of every running sequence, keyed by the caller (request ids)."""

    def __init__(self):
        self.seqs: dict = {}

    def __len__(self) -> int:
        return len(self.seqs)

    def nbytes(self) -> int:
        return sum(kv.nbytes for s in self.seqs.values() for kv in s.layers.values())

    def plan(self, keys, starts, num_new, block_tables, block_size: int) -> "StepPlan":
        """What one step needs: for sequence i (key keys[i]) the tokens [starts[i],
        starts[i] + num_new[i]) are new; its KV lives in the blocks block_tables[i] (a list of
        block ids, at least enough for those tokens)."""
        seqs, slots, fill_from = [], [], []
        for key, s, n, table in zip(keys, starts, num_new, block_tables):
            seq = self.seqs.get(key)
            if seq is None:
                seq = self.seqs[key] = _Seq()
            # progress went back (preempted, then recomputed): what the buffers hold may not be
            # what the paged cache holds now, so refill them from it
            start = seq.length if seq.length <= s else 0
            for p in range(start, s + n):
                slots.append(table[p // block_size] * block_size + p % block_size)
            seqs.append(seq)
            fill_from.append(start)
        return StepPlan(seqs, list(starts), list(num_new), fill_from,
                        [len(t) * block_size for t in block_tables], slots)

    def commit(self, plan: "StepPlan", kept: dict | None = None) -> None:
        """The forward ran through every layer: the new tokens are in the buffers. `kept`: batch
        index -> how many of its new tokens stay (a speculative entry keeps its last token and
        its accepted drafts; the rejected drafts' KV is past its length, refilled when read)."""
        for i, (seq, s, n) in enumerate(zip(plan.seqs, plan.starts, plan.num_new)):
            seq.length = s + (n if kept is None else kept.get(i, n))

    def drop(self, keys) -> None:
        for k in keys:
            self.seqs.pop(k, None)


class StepPlan:
    """One step's sequences and the paged-cache slots their buffers must copy, in batch order."""

    def __init__(self, seqs, starts, num_new, fill_from, capacities, slots):
        self.seqs, self.starts, self.num_new = seqs, starts, num_new
        self.fill_from, self.capacities = fill_from, capacities
        self.slots = torch.tensor(slots, dtype=torch.long)
        self.masks: dict = {}    # i -> causal mask of a chunk that follows earlier KV

    def _buffers(self, layer, k_cache, v_cache):
        """Each sequence's [2, Hkv, capacity, D] buffer (K then V) for this layer, grown to hold
        the step's tokens, with the missing tokens copied in from the paged cache."""
        hkv, d = k_cache.shape[2], k_cache.shape[3]
        if self.slots.device != k_cache.device:
            self.slots = self.slots.to(k_cache.device)
        # K and V side by side: one copy per sequence moves both
        new = torch.stack((k_cache.reshape(-1, hkv, d).index_select(0, self.slots),
                           v_cache.reshape(-1, hkv, d).index_select(0, self.slots)))
        new = new.transpose(1, 2)   # [2, Hkv, tokens, D]
        out, o = [], 0
        for seq, s, n, a, cap in zip(self.seqs, self.starts, self.num_new, self.fill_from,
                                     self.capacities):
            end = s + n
            kv = seq.layers.get(layer)
            if kv is None or kv.shape[2] < end:
                grown = torch.empty(2, hkv, max(cap, end), d, dtype=k_cache.dtype,
                                    device=k_cache.device)
                if kv is not None and a:
                    grown[:, :, :a] = kv[:, :, :a]
                kv = seq.layers[layer] = grown
            # narrow, not slicing: the per-sequence ops of this loop run in every layer
            kv.narrow(2, a, end - a).copy_(new.narrow(2, o, end - a))
            o += end - a
            out.append(kv.narrow(2, 0, end))
        return out

    def attention(self, q, k_cache, v_cache, scale: float, window: int | None = None
                  ) -> torch.Tensor:
        """Causal attention of the flattened batch q [T, H, D] (sequence i owns the next
        num_new[i] rows) over each sequence's buffer; fp32 inside, q's dtype out. With `window`
        a query at position p sees the keys at p - window + 1 .. p only."""
        bufs = self._buffers(k_cache.data_ptr(), k_cache, v_cache)
        T, H, D = q.shape
        hkv = k_cache.shape[2]
        upcast = q.dtype != torch.float32
        qf = q.float() if upcast else q
        # a decode's query heads, grouped by the KV head they share, are its query rows: one
        # pass over each KV head's keys serves the whole group, with no mask and no GQA expansion
        qg = qf.view(T, hkv, H // hkv, D)
        qd = qg * scale
        out = torch.empty(T, hkv, H // hkv, D, dtype=torch.float32, device=q.device)
        row = 0
        for i, (kv, s, n) in enumerate(zip(bufs, self.starts, self.num_new)):
            if upcast:
                kv = kv.float()
            k, v = kv.unbind()
            if n == 1:
                if window is not None and s + 1 > window:   # the last `window` keys only
                    k, v = k.narrow(1, s + 1 - window, window), v.narrow(1, s + 1 - window, window)
                # two batched matmuls and an exact softmax: for one query row per head this
                # costs a CPU about two thirds of what scaled_dot_product_attention does
                torch.bmm(torch.bmm(qd[row], k.transpose(1, 2)).softmax(-1), v, out=out[row])
            else:
                end = s + n
                qi = qf[row:row + n].transpose(0, 1)[None]
                if s == 0 and (window is None or end <= window):   # a first chunk: square causal
                    o = F.scaled_dot_product_attention(qi, k[None], v[None], is_causal=True,
                                                       scale=scale, enable_gqa=True)
                else:
                    mask = self.masks.get(i)
                    if mask is None:
                        mask = self.masks[i] = torch.ones(n, end, dtype=torch.bool,
                                                          device=q.device).tril_(s)
                        if window is not None:   # row r is position s + r: keys > s + r - window
                            mask.triu_(s - window + 1)
                    o = F.scaled_dot_product_attention(qi, k[None], v[None], attn_mask=mask,
                                                       scale=scale, enable_gqa=True)
                out[row:row + n] = o[0].transpose(0, 1).view(n, hkv, H // hkv, D)
            row += n
        out = out.view(T, H, D)
        return out.to(q.dtype) if upcast else out
