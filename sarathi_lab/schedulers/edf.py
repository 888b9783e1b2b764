"""Earliest deadline first: chunked prefill (Sarathi-Serve) where admission and the prefill
budget follow each request's TTFT deadline.

A request's `deadline` is the absolute time its first token is due (a trace gives it relative
to the arrival; `traces.to_requests` adds the arrival). Requests without one rank after all that
have one, in arrival order, so a trace without deadlines runs as chunked-prefill FCFS. Only
the first token has a deadline: a request that has emitted it is never preempted for another's,
and once every running request decodes the order no longer matters. Under overload EDF serves
requests already late before those still on time (the domino effect); pair it with admission
control (`scheduler.deadline_admission`), which rejects on arrival what would miss.
"""
from dataclasses import dataclass

from sarathi_lab.schedulers.ordered_sarathi import OrderedSarathi
from sarathi_lab.schedulers.sarathi import SarathiConfig
from sarathi_lab.settings import setting


@dataclass
class EDFConfig(SarathiConfig):
    queue: str = setting("edf", choices=("edf",),
                         help="fixed: earliest absolute deadline first, none last")


class EDF(OrderedSarathi):
    name = "edf"
    config_class = EDFConfig

    def __init__(self, cfg, kv, queue=None):
        # the order is fixed by the settings (queue=edf), whatever queue the caller built
        super().__init__(cfg, kv)
