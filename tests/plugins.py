"""Plug-ins the way a user writes them, loaded by dotted path in the CLI tests."""
from dataclasses import dataclass

import numpy as np

from sarathi_lab.costmodels.base import CostModel, CostModelConfig
from sarathi_lab.costmodels.roofline import RooflineConfig, RooflineCostModel
from sarathi_lab.executors.base import Executor, ExecutorConfig, StepResult
from sarathi_lab.settings import setting


@dataclass
class SlowConfig(RooflineConfig):
    slowdown: float = setting(1.0, gt=0, help="multiplies every predicted time")


class SlowRoofline(RooflineCostModel):
    """The roofline's iteration times, multiplied."""
    config_class = SlowConfig

    def __init__(self, model, hardware, tensor_parallel=1, cfg=None):
        super().__init__(model, hardware, tensor_parallel, cfg)
        self.slowdown = cfg.slowdown

    def step_time(self, reqs, num_new_tokens):
        return self.slowdown * super().step_time(reqs, num_new_tokens)

    def decode_run(self, contexts, k):
        return self.slowdown * super().decode_run(contexts, k)


@dataclass
class FixedStepConfig(ExecutorConfig):
    step_s: float = setting(0.01, gt=0, help="seconds per iteration")


class FixedStep(Executor):
    """Every iteration takes `step_s`; plenty of KV."""
    config_class = FixedStepConfig
    simulated = True
    supports_fast_forward = True

    def __init__(self, cfg, model, hardware=None):
        self.step_s = cfg.step_s

    def num_kv_blocks(self, block_size):
        return 10_000

    def max_model_len(self):
        return 8192

    def execute(self, out):
        return StepResult(self.step_s)

    def decode_run(self, contexts, k):
        return np.full(k, self.step_s)


@dataclass
class FixedCostConfig(CostModelConfig):
    step_s: float = setting(0.01, gt=0, help="seconds per iteration, whatever the batch")


class FixedCost(CostModel):
    """Every iteration takes `step_s` whatever it holds (uniform micro-batches); memory is the
    roofline's. Written for iteration_time only: the generic step_time and step_parts."""
    config_class = FixedCostConfig

    def __init__(self, model, hardware, tensor_parallel=1, cfg=None):
        self.step_s = (cfg or FixedCostConfig()).step_s
        self.memory = RooflineCostModel(model, hardware, tensor_parallel)

    def iteration_time(self, prefills, decode_contexts, num_sampled=None):
        return self.step_s

    def num_kv_blocks(self, block_size, gpu_memory_utilization, workspace_bytes,
                      activation_tokens):
        return self.memory.num_kv_blocks(block_size, gpu_memory_utilization, workspace_bytes,
                                         activation_tokens)

    @property
    def max_model_len(self):
        return self.memory.max_model_len
