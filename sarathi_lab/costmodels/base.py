"""The cost-model contract: how long one iteration of a batch takes, and how much memory the model
leaves for KV.

A plug-in cost model subclasses `CostModel`, declares its settings as a dataclass
(`config_class`; they are set flat under ``executor``, beside the sim executor's own, e.g.
``executor.cost_model=my_pkg.costs:TableModel +executor.table=PATH``) and implements
`iteration_time`. It is constructed as ``cls(model, hardware, tensor_parallel, cfg)`` with the
model and hardware presets (plain dicts) and its typed settings. `step_time` and `decode_run`, the
simulator's hot paths, have generic versions built on `iteration_time`; override them for speed.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

import numpy as np


@dataclass
class CostModelConfig:
    """Settings shared by every cost model (none yet)."""


class CostModel(abc.ABC):
    config_class: ClassVar[type] = CostModelConfig

    @abc.abstractmethod
    def iteration_time(self, prefills, decode_contexts, num_sampled: int | None = None) -> float:
        """Seconds for one iteration. prefills: (chunk tokens, tokens already in KV) pairs;
        decode_contexts: tokens in KV before each decode; num_sampled: requests that sample a
        token (default: all of them)."""

    @abc.abstractmethod
    def num_kv_blocks(self, block_size: int, gpu_memory_utilization: float,
                      workspace_bytes: float, activation_tokens: int) -> int:
        """KV blocks of `block_size` tokens that fit one GPU beside the weights, the workspace
        and the activations of a forward over `activation_tokens` tokens."""

    @property
    @abc.abstractmethod
    def max_model_len(self) -> int:
        """The model's context length."""

    def kv_block_bytes(self, block_size: int) -> int | None:
        """Bytes of one KV block of `block_size` tokens on one GPU (None: unknown); the sim
        executor prices swapping KV to host memory by it."""
        return None

    def step_time(self, reqs, num_new_tokens) -> float:
        """iteration_time of a scheduled batch (entries (req, n): n tokens after
        req.num_computed_tokens)."""
        prefills, decodes, sampled = [], [], 0
        for r, n in zip(reqs, num_new_tokens):
            k = r.num_computed_tokens
            if k + n == r.num_prompt_tokens + r.num_output_tokens:
                sampled += 1
            if n == 1:
                decodes.append(k)
            else:
                prefills.append((n, k))
        return self.iteration_time(prefills, decodes, sampled)

    def decode_run(self, contexts: np.ndarray, k: int) -> np.ndarray:
        """Durations of k decode-only iterations of the same requests, contexts +1 per step."""
        ctx = np.asarray(contexts, dtype=np.int64)
        return np.array([self.iteration_time([], (ctx + j).tolist()) for j in range(k)])
