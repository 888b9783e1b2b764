"""The length filters (``max_total_tokens``, ``max_prompt_tokens``) that a loaded trace and a
generated one apply alike.
"""
from __future__ import annotations

import numpy as np


def length_mask(prompt, output, max_total, max_prompt) -> np.ndarray:
    keep = np.ones(len(prompt), dtype=bool)
    if max_total is not None:
        keep &= (prompt + output) <= max_total
    if max_prompt is not None:
        keep &= prompt <= max_prompt
    return keep


def describe_filters(max_total, max_prompt):
    parts = []
    if max_total is not None:
        parts.append(f"max_total_tokens={max_total}")
    if max_prompt is not None:
        parts.append(f"max_prompt_tokens={max_prompt}")
    return " or ".join(parts)


def check_filters(max_total, max_prompt):
    for name, v in (("max_total_tokens", max_total), ("max_prompt_tokens", max_prompt)):
        if v is not None and v < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {v}")
