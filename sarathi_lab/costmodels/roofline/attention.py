"""Attention's work: the query-key pairs of a prefill chunk, split where the measured kernels'
speeds differ (see `RooflineCostModel.chunk_attention_time`).

A chunk of c new tokens after k cached ones does, under the causal mask, c k pairs against the
cached context (a dense c x k rectangle: a query sees every earlier token) and c (c + 1) / 2 within
the chunk (its own causal triangle). FlashAttention-style kernels run the rectangle at full tiles
and the triangle at the diagonal's masked tiles; Vidur's A100 prefill profile (Llama-2-70B TP2)
times the triangle's pairs at 0.4 x the rectangle's speed
(experiments/calibration/calibrate_roofline.txt), so the two are priced at their own efficiencies.
A sliding window of w keys caps what each query sees: query j of the prompt sees min(j, w) keys.
"""
from __future__ import annotations


def window_pairs(c: int, k: int, w: int) -> int:
    """Query-key pairs of a chunk of c tokens after k cached ones under a causal sliding window
    of w keys: query j (1-based position k + 1 .. k + c) sees min(j, w) keys."""
    if k + c <= w:
        return c * k + c * (c + 1) // 2
    if k >= w:
        return c * w
    return (w * (w + 1) - k * (k + 1)) // 2 + (k + c - w) * w


def chunk_pairs(c: int, k: int, w: int) -> tuple[int, int]:
    """(pairs against the cached context, pairs within the chunk) of c new tokens after k cached
    ones, window w: the chunk's queries see min(i, w) of its own tokens (i: a query's position in
    the chunk), the rest of what they see is cached."""
    own = window_pairs(c, 0, w)
    return window_pairs(c, k, w) - own, own
