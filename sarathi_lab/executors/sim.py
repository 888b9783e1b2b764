"""The simulator executor: no model, a predicted duration per scheduled batch.

Config (``configs/executor/sim.yaml``): ``cost_model`` (``roofline``), ``tensor_parallel``,
``gpu_memory_utilization``, optional overrides of the hardware preset's efficiency factors
(null keeps the preset's), and the memory held back from the KV cache (``workspace_bytes``,
``activation_tokens``).
"""
from __future__ import annotations

import numpy as np

from sarathi_lab.executors.base import Executor, StepResult
from sarathi_lab.config import plain
from sarathi_lab.costmodels.roofline import RooflineCostModel

COST_MODELS = {"roofline": RooflineCostModel}


class SimExecutor(Executor):
    supports_fast_forward = True

    def __init__(self, model, hardware, executor=None):
        self.model_cfg, self.hw_cfg, cfg = plain(model), plain(hardware), plain(executor)
        if not self.hw_cfg:
            raise ValueError("the sim executor needs a hardware preset (e.g. hardware=a100-80gb)")
        name = cfg.get("cost_model") or "roofline"
        if name not in COST_MODELS:
            raise ValueError(f"unknown sim cost_model {name!r}; known: {', '.join(COST_MODELS)}")
        self.tensor_parallel = int(cfg.get("tensor_parallel") or 1)
        self.gpu_memory_utilization = float(cfg.get("gpu_memory_utilization") or 0.9)
        self.workspace_bytes = float(cfg.get("workspace_bytes") or 2**30)
        self.activation_tokens = int(cfg.get("activation_tokens") or 8192)
        self.cost_model = COST_MODELS[name](self.model_cfg, self.hw_cfg, self.tensor_parallel,
                                            overrides=cfg)
        # bound once: execute() runs hundreds of thousands of times per simulation
        self._step_time = self.cost_model.step_time

    def execute(self, out) -> StepResult:
        return StepResult(self._step_time(out.reqs, out.num_new_tokens))

    def decode_run(self, contexts: np.ndarray, k: int) -> np.ndarray:
        return self.cost_model.decode_run(contexts, k)

    def num_kv_blocks(self, block_size: int) -> int:
        return self.cost_model.num_kv_blocks(block_size, self.gpu_memory_utilization,
                                             self.workspace_bytes, self.activation_tokens)

    def max_model_len(self) -> int:
        return self.cost_model.model.max_model_len
