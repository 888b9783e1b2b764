"""Settings and helpers the built-in controllers share: a TBT target of their own or the run's."""
from __future__ import annotations

from dataclasses import dataclass

from sarathi_lab.schedulers.controllers.base import ControllerConfig, DecodeView
from sarathi_lab.settings import setting


@dataclass
class TargetConfig(ControllerConfig):
    target_tbt_s: float | None = setting(
        None, gt=0, help="s, the TBT every decode must keep; null: its SLO class's (slo "
                         "request_p99_tbt, else tpot, else p99_tbt)")
    min_chunk: int = setting(16, ge=0, help="prefill tokens every iteration may hold even when "
                             "the decodes alone break their target (prompts never starve)")


def tbt_target(ctl, d: DecodeView) -> float:
    """The TBT target of decode `d` under controller `ctl` (its own setting, else the SLO's)."""
    t = ctl.cfg.target_tbt_s if ctl.cfg.target_tbt_s is not None else d.tbt_target
    if t is None:
        raise ValueError(f"scheduler.controller={ctl.name}: request {d.request_id!r} (slo class "
                         f"{d.slo_class!r}) has no TBT target; set scheduler.target_tbt_s or "
                         "choose an slo with request_p99_tbt, tpot or p99_tbt")
    return t
