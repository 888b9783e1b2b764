"""The simulator executor: no model, a predicted duration per scheduled batch from a cost model.

Settings (``configs/executor/sim.yaml``): `SimConfig` below, plus the chosen cost model's own
(`RooflineConfig` for ``roofline``), set flat under ``executor``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from sarathi_lab.executors.base import Executor, ExecutorConfig, StepResult
from sarathi_lab.settings import ConfigError, parse, setting


@dataclass
class SimConfig(ExecutorConfig):
    cost_model: str = setting("roofline", help="a registered cost model or a dotted path")
    tensor_parallel: int = setting(1, ge=1, le=64, help="GPUs per model replica")
    gpu_memory_utilization: float = setting(0.9, gt=0, le=1,
                                            help="share of GPU memory the engine may use")
    workspace_bytes: int = setting(2**30, ge=0, help="memory held back: CUDA context, workspaces")
    activation_tokens: int = setting(8192, ge=0,
                                     help="activations of the largest step, held back from KV")
    # the chosen cost model's typed settings, filled by SimExecutor.parse_config
    cost_model_settings: object = field(default=None, metadata={"internal": True})


class SimExecutor(Executor):
    config_class = SimConfig
    simulated = True
    uses_hardware = True
    supports_fast_forward = True

    @classmethod
    def reads_model_key(cls, key: str) -> bool:
        from sarathi_lab.models.shape import ModelShape
        # the shape, and hf_name (where the shape came from, for the reader)
        return key in ModelShape.__dataclass_fields__ or key in ("hf_name", "dtype")

    @classmethod
    def parse_config(cls, values: dict, where: str = "executor") -> SimConfig:
        """The sim executor's settings and, from the same node, its cost model's."""
        from sarathi_lab.registry import cost_model_class
        values = dict(values)
        own = {f.name for f in fields(SimConfig) if not f.metadata.get("internal")}
        name = values.get("cost_model", SimConfig.cost_model)
        try:
            cm_cls = cost_model_class(name)
        except ValueError as e:
            raise ConfigError(f"{where}.cost_model: {e}") from None
        theirs = {f.name for f in fields(cm_cls.config_class)}
        # sim.yaml lists the roofline's overrides as null: unset, whichever cost model is chosen
        values = {k: v for k, v in values.items() if v is not None or k in own or k in theirs}
        unknown = sorted(set(values) - own - theirs)
        if unknown:
            raise ConfigError(
                f"{where}.{unknown[0]}: not a setting of the sim executor nor of its cost model "
                f"{name!r}; the executor's: {', '.join(sorted(own))}; the cost model's: "
                f"{', '.join(sorted(theirs)) or '(none)'}")
        cfg = parse(SimConfig, {k: v for k, v in values.items() if k in own}, where,
                    "the sim executor")
        cfg.cost_model_settings = parse(cm_cls.config_class,
                                        {k: v for k, v in values.items() if k in theirs},
                                        where, f"cost model {name!r}")
        return cfg

    def __init__(self, cfg: SimConfig, model: dict, hardware: dict | None):
        from sarathi_lab.registry import cost_model_class
        if not hardware:
            raise ConfigError("the sim executor needs a hardware preset (e.g. hardware=a100-80gb)")
        self.cfg = cfg
        cm_cls = cost_model_class(cfg.cost_model)
        cm_cfg = cfg.cost_model_settings or cm_cls.config_class()
        self.cost_model = cm_cls(model, hardware, cfg.tensor_parallel, cm_cfg)
        # bound once: execute() runs hundreds of thousands of times per simulation
        self._step_time = self.cost_model.step_time

    def execute(self, out) -> StepResult:
        return StepResult(self._step_time(out.reqs, out.num_new_tokens))

    def decode_run(self, contexts: np.ndarray, k: int) -> np.ndarray:
        return self.cost_model.decode_run(contexts, k)

    def num_kv_blocks(self, block_size: int) -> int:
        c = self.cfg
        return self.cost_model.num_kv_blocks(block_size, c.gpu_memory_utilization,
                                             c.workspace_bytes, c.activation_tokens)

    def check_kv_memory(self, num_blocks: int, block_size: int) -> None:
        fit = self.num_kv_blocks(block_size)
        if num_blocks > fit:
            raise ConfigError(
                f"scheduler.num_kv_blocks={num_blocks}: more than the {fit} blocks of "
                f"{block_size} tokens that fit the simulated GPU's memory beside the weights "
                "(see executor.gpu_memory_utilization, or the hardware preset)")

    def max_model_len(self) -> int:
        return self.cost_model.max_model_len
