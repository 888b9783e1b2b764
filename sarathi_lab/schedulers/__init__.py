from sarathi_lab.schedulers.base import Policy, SchedulerConfig
from sarathi_lab.schedulers.mechanics.budget import Budget
from sarathi_lab.schedulers.mechanics.fast_forward import FastForward
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.schedulers.queues import RequestQueue

__all__ = ["Budget", "FastForward", "Policy", "RequestQueue", "SchedulerConfig", "SchedulerOutput"]
