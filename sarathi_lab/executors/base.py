"""The executor interface: run one scheduled batch, say how long it took and what it sampled."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class StepResult:
    duration: float                      # seconds the iteration took (measured or predicted)
    sampled: list[int] | None = None     # aligned with SchedulerOutput.reqs; None in simulation


class Executor:
    """Base class. An executor turns a `SchedulerOutput` into a `StepResult`.

    Each scheduled entry (req, n) means: compute tokens [req.num_computed_tokens,
    req.num_computed_tokens + n) of `req`, reading its earlier KV through the block table of the
    KV manager; if that catches the request up (num_computed_tokens + n == num_tokens), sample one
    token for it.
    """

    #: True when `decode_run` is implemented (lets the engine skip through steady decode runs).
    supports_fast_forward = False

    def bind(self, kv) -> None:
        """Called once by the engine with the KV-cache manager (block tables live there)."""

    def num_kv_blocks(self, block_size: int) -> int | None:
        """How many KV blocks of `block_size` tokens fit this executor's memory (None: unknown)."""
        return None

    def max_model_len(self) -> int | None:
        return None

    def execute(self, out) -> StepResult:
        raise NotImplementedError

    def decode_run(self, contexts: np.ndarray, k: int) -> np.ndarray:
        """Durations of k consecutive decode-only iterations of the same requests, whose
        contexts (tokens already in KV) start at `contexts` and grow by one each step."""
        raise NotImplementedError
