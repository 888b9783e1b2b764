"""The cost-model contract: how long one iteration of a batch takes, and how much memory the model
leaves for KV.

A plug-in cost model subclasses `CostModel`, declares its settings as a dataclass
(`config_class`; they are set flat under ``executor``, beside the sim executor's own, e.g.
``executor.cost_model=my_pkg.costs:TableModel +executor.table=PATH``) and implements
`iteration_time`. It is constructed as ``cls(model, hardware, tensor_parallel, cfg)`` with the
model and hardware presets (plain dicts) and its typed settings. `step_time` and `decode_run`, the
simulator's hot paths, have generic versions built on `iteration_time`; override them for speed.
Under pipeline parallelism the simulator asks `step_parts` how a batch's time splits into its
CPU side, its layers and its LM head (generic: all of it layers).
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
    #: a `costmodels.rewarm.Rewarm` where the decodes right after a prompt step run slower than
    #: steady ones (a CPU profile's); the sim executor then follows the step order and charges
    #: them (and steps every batch: no fast-forward). None: a step's price is its shape's alone
    rewarm = None

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

    def describe(self) -> dict:
        """What the run's summary records of this cost model beside its name (under
        ``cost_model``): e.g. the profile it reads and the device it was measured on."""
        return {}

    def kv_block_bytes(self, block_size: int) -> int | None:
        """Bytes of one KV block of `block_size` tokens on one GPU (None: unknown); the sim
        executor prices swapping KV to host memory by it."""
        return None

    def step_time(self, reqs, num_new_tokens) -> float:
        """iteration_time of a scheduled batch (entries (req, n): n tokens after
        req.num_computed_tokens)."""
        return self.iteration_time(*batch_shape(reqs, num_new_tokens))

    def decode_run(self, contexts: np.ndarray, k: int) -> np.ndarray:
        """Durations of k decode-only iterations of the same requests, contexts +1 per step."""
        ctx = np.asarray(contexts, dtype=np.int64)
        return np.array([self.iteration_time([], (ctx + j).tolist()) for j in range(k)])

    def chunk_run(self, contexts: list[int], computed: int, chunks: list[int],
                  samples_last: bool) -> list[float] | None:
        """Durations of batches of the same decodes (`contexts`, +1 per batch) and one prompt
        chunk each (`chunks[j]` tokens after `computed` + the chunks before it; the last one
        samples if `samples_last`), exactly as step_time would price them; None: not offered
        (the engine then steps these batches)."""
        return None

    # -- pipeline stages (executor.pipeline_parallel > 1) ------------------------------------
    def iteration_parts(self, prefills, decode_contexts,
                        num_sampled: int | None = None) -> tuple[float, float, float]:
        """iteration_time in three parts that add up to it: (the CPU side, charged once per
        micro-batch on its virtual engine's host, the model's layers, split among the stages in
        proportion to their layers, the LM head, on the last stage). Generic: all of it is layer
        time (a model that knows its own CPU side and LM head overrides this)."""
        return 0.0, self.iteration_time(prefills, decode_contexts, num_sampled), 0.0

    def step_parts(self, reqs, num_new_tokens) -> tuple[float, float, float]:
        """iteration_parts of a scheduled batch."""
        return self.iteration_parts(*batch_shape(reqs, num_new_tokens))


def batch_shape(reqs, num_new_tokens) -> tuple[list, list, int]:
    """(prefills, decode_contexts, num_sampled) of a scheduled batch, as iteration_time takes
    them: a one-token entry is a decode at its context, any other a (chunk, context) prefill."""
    prefills, decodes, sampled = [], [], 0
    for r, n in zip(reqs, num_new_tokens):
        k = r.num_computed_tokens
        if k + n == r.num_prompt_tokens + r.num_output_tokens:
            sampled += 1
        if n == 1:
            decodes.append(k)
        else:
            prefills.append((n, k))
    return prefills, decodes, sampled


def _owner(cls: type, method: str) -> type:
    return next(c for c in cls.__mro__ if method in vars(c))


def split_step(cost_model: CostModel):
    """The callable that splits a batch's time for pipeline stages: the model's own
    `step_parts` when it is written for its `step_time` and its `iteration_parts` for its
    `iteration_time` (each defined in the same class as its partner or below it); otherwise,
    all of step_time as layer time, so that a subclass re-pricing one of them alone (say a
    slowdown on step_time) is never bypassed."""
    cls = type(cost_model)
    if all(issubclass(_owner(cls, part), _owner(cls, whole))
           for part, whole in (("step_parts", "step_time"),
                               ("iteration_parts", "iteration_time"))):
        return cost_model.step_parts
    step_time = cost_model.step_time
    return lambda reqs, num_new_tokens: (0.0, step_time(reqs, num_new_tokens), 0.0)
