"""Plug-ins the way a user writes them, loaded by dotted path in the CLI tests."""
from dataclasses import dataclass

import numpy as np

from sarathi_lab.costmodels.base import CostModel, CostModelConfig
from sarathi_lab.costmodels.roofline import RooflineConfig, RooflineCostModel
from sarathi_lab.executors.base import Executor, ExecutorConfig, StepResult
from sarathi_lab.schedulers.controllers.base import BudgetController, ControllerConfig, Decision
from sarathi_lab.schedulers.sarathi import Sarathi
from sarathi_lab.settings import setting
from sarathi_lab.topology.routers import Router


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


# -- plug-ins that break a contract (tests/test_labels.py: each message names the plug-in, the
# method and the rule) ---------------------------------------------------------------------------


class ReturnsNone(Sarathi):
    """Builds its batch and forgets to return it."""
    def schedule(self, now):
        super().schedule(now)


class ReturnsList(Sarathi):
    """Returns the batch's requests instead of the batch."""
    def schedule(self, now):
        return list(super().schedule(now).reqs)


class AddsZeroTokens(Sarathi):
    """Adds the first running request again with nothing to compute."""
    def schedule(self, now):
        out = super().schedule(now)
        if self.running:
            out.add(self.running[0], 0)
        return out


class MovesProgress(Sarathi):
    """Counts a token as computed before the batch runs."""
    def schedule(self, now):
        out = super().schedule(now)
        for r in out.reqs:
            r.num_computed_tokens += 1
        return out


class ToNowhere(Router):
    """Sends every request one past the last replica."""
    name = "to_nowhere"

    def route(self, req, replicas, now):
        return len(replicas)


@dataclass
class FractionConfig(ControllerConfig):
    divisor: int = setting(2, ge=1, help="the budget is token_budget // divisor")


class Fraction(BudgetController):
    """A share of the cap every iteration (a controller as a user writes one)."""
    config_class = FractionConfig

    def decide(self, view, predict):
        return Decision(max(1, view.max_budget // self.cfg.divisor))


class FullBudget(BudgetController):
    """The cap every iteration, consulted (so the policy is stepped): must equal `static`."""

    def decide(self, view, predict):
        return Decision(view.max_budget)


class ZeroBudget(BudgetController):
    """Breaks the rule budget >= 1."""

    def decide(self, view, predict):
        return Decision(0)


class ReturnsInt(BudgetController):
    """Returns a number, not a Decision."""

    def decide(self, view, predict):
        return view.max_budget


class OneDraft(BudgetController):
    """The cap every iteration and one draft per decode, whatever the run's k."""

    def decide(self, view, predict):
        return Decision(view.max_budget, spec_len=min(1, view.max_spec_len))
