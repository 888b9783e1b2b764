"""Settings and helpers the built-in controllers share: a TBT target of their own or the run's,
and the predictor they price batches with (`predictor.PredictedConfig`)."""
from __future__ import annotations

from dataclasses import dataclass

from sarathi_lab.schedulers.controllers.base import DecodeView
from sarathi_lab.schedulers.controllers.predictor import PredictedConfig
from sarathi_lab.settings import ConfigError, setting


@dataclass
class TargetConfig(PredictedConfig):
    target_tbt_s: float | None = setting(
        None, gt=0, help="s, the TBT every decode must keep; null: its SLO class's (slo "
                         "request_p99_tbt, else tpot, else p99_tbt)")
    min_chunk: int = setting(16, ge=0, help="prefill tokens every iteration may hold even when "
                             "the decodes alone break their target (prompts never starve)")


def tbt_target(ctl, d: DecodeView) -> float | None:
    """The TBT target of decode `d` under controller `ctl` (its own setting, else its SLO
    class's; None: its class has none, e.g. a batch class judged end to end)."""
    return ctl.cfg.target_tbt_s if ctl.cfg.target_tbt_s is not None else d.tbt_target


def tightest(ctl, decodes, of=lambda d, t: t) -> float | None:
    """The least of of(d, target) over the decodes that have a TBT target; None: none has."""
    ts = [of(d, t) for d in decodes if (t := tbt_target(ctl, d)) is not None]
    return min(ts) if ts else None


class NeedsTBTTarget:
    """A controller whose settings are a TargetConfig: refuses a run where no request can have
    a TBT target (neither scheduler.target_tbt_s nor a TBT target in the SLO)."""

    def check_targets(self, has_tbt_target: bool) -> None:
        if not has_tbt_target and self.cfg.target_tbt_s is None:
            raise ConfigError(
                f"scheduler.controller={self.name}: no request has a TBT target to keep; set "
                "scheduler.target_tbt_s or choose an slo with request_p99_tbt, tpot or p99_tbt")
