from sarathi_lab.schedulers.base import Policy, SchedulerConfig
from sarathi_lab.schedulers.output import SchedulerOutput

__all__ = ["Policy", "SchedulerConfig", "SchedulerOutput"]
