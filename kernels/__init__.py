"""Paged-KV kernels: cache writes and paged attention, as Triton kernels and a torch reference.

Importing this package never needs triton or a GPU: the Triton versions live in their own modules
(``triton_kv.write_kv_triton``, ``triton_attention.paged_attention_triton``), imported where they
are used, and ``get_backend("triton")`` imports them when asked for.

    write_kv(key, value, k_cache, v_cache, slot_mapping)
    paged_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale) -> out
"""

from __future__ import annotations

import os
from typing import Callable

from .reference import paged_attention_torch, write_kv_torch

__all__ = ["write_kv_torch", "paged_attention_torch", "get_backend", "triton_available"]


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


def triton_available() -> bool:
    """Whether the Triton backend can run here: a CUDA device, or the Triton interpreter."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    import torch

    return torch.cuda.is_available() or _interpreting()


def get_backend(name: str) -> tuple[Callable, Callable]:
    """(write_kv, paged_attention) for backend "torch" or "triton"."""
    if name == "torch":
        return write_kv_torch, paged_attention_torch
    if name == "triton":
        try:
            import triton  # noqa: F401
        except ImportError as e:
            raise RuntimeError("the 'triton' kernel backend needs the triton package") from e
        import torch

        if not (torch.cuda.is_available() or _interpreting()):
            raise RuntimeError(
                "the 'triton' kernel backend needs a CUDA device; on a CPU set TRITON_INTERPRET=1 "
                "in the environment before anything imports the kernels (slow: tiny shapes only), "
                "or use the 'torch' backend"
            )
        from .triton_attention import paged_attention_triton
        from .triton_kv import write_kv_triton

        return write_kv_triton, paged_attention_triton
    raise ValueError(f"unknown kernel backend {name!r}; expected 'torch' or 'triton'")
