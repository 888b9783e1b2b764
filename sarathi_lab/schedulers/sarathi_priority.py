"""Class priorities on chunked prefill: admission and the prefill budget go by priority class
(`Request.priority`, lower is more urgent), and a request of a more urgent class that cannot
start may preempt (by recompute) running requests of less urgent classes.

Aging keeps the low classes from starving. A waiting request's effective priority improves by
`aging_rate` classes per second of waiting, continuously, so at any moment requests rank by
priority - aging_rate * (now - arrival); as `now` is common to all, that is the order of the
fixed key priority + aging_rate * arrival (a request of class p is one of class p - 1 that
arrived 1 / aging_rate seconds later). So a request is overtaken only by more urgent arrivals
within (its class gap) / aging_rate seconds of its own arrival: it cannot starve. The same key guards
running requests: one is preempted only for a request of a strictly more urgent class whose
key is smaller, so a low-class request that has aged past the newcomer keeps its place, and
preemption never cycles (it only ever goes from a larger key to a smaller one).
"""
from dataclasses import dataclass

from sarathi_lab.schedulers.mechanics.fast_forward import SARATHI_PRIORITY
from sarathi_lab.schedulers.ordered_sarathi import OrderedSarathi
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.schedulers.queues import PriorityQueue
from sarathi_lab.schedulers.sarathi import SarathiConfig
from sarathi_lab.settings import setting


@dataclass
class SarathiPriorityConfig(SarathiConfig):
    queue: str = setting("priority", choices=("priority",),
                         help="fixed: by priority class, aged by aging_rate")
    aging_rate: float = setting(
        0.1, ge=0, help="priority classes gained per second of waiting (starvation guard); "
                        "0: strict priority, a low class may wait forever")
    priority_preemption: bool = setting(
        True, help="a request that cannot start may preempt running ones of lower classes")


class AgingPriorityQueue(PriorityQueue):
    """Priority classes with continuous aging: key = priority + aging_rate * arrival_time
    (ties, and all of a class without aging, in arrival order)."""

    def __init__(self, aging_rate: float):
        super().__init__()
        self.aging_rate = aging_rate

    def key(self, req):
        return req.priority + self.aging_rate * req.arrival_time


class SarathiPriority(OrderedSarathi):
    name = "sarathi_priority"
    config_class = SarathiPriorityConfig
    fast_forward = SARATHI_PRIORITY   # its steady decode runs (mechanics/fast_forward.py)

    def __init__(self, cfg, kv, queue=None):
        # the order is this policy's own (the queue setting is fixed to `priority`)
        super().__init__(cfg, kv, AgingPriorityQueue(cfg.aging_rate))

    def schedule(self, now):
        out = SchedulerOutput()
        if self.cfg.priority_preemption:
            self.make_room(out)
        return self.fill(out, self.iteration_budget(now))

    def victims(self, head) -> list:
        """The running requests `head` may preempt (strictly less urgent class, larger key),
        if preempting all of them would let it start; else none."""
        key = self.waiting.key
        k = key(head)
        cands = [r for r in self.running if r.priority > head.priority and key(r) > k]
        if not cands or len(self.running) - len(cands) >= self.cfg.max_num_seqs:
            return []
        kv = self.kv
        freed = sum(kv.held_blocks(r.request_id) for r in cands)
        if kv.admission_blocks(head) > kv.num_free_blocks + freed - self.watermark:
            return []
        return cands

    def make_room(self, out: SchedulerOutput) -> None:
        """Preempt less urgent running requests, last-ranked first, until the waiting head
        could start (seats and KV; the budget is not theirs to free). By recompute whatever
        scheduler.preemption_mode says: a swapped victim would be swapped back in before the
        head could start (no admission while a request is swapped)."""
        if not self.waiting or self.swapped:
            return
        head, limit = self.waiting.peek(), self.cfg.token_budget
        if self.admission_blocker(head, limit) is None:
            return
        cands = self.victims(head)
        while cands and self.admission_blocker(head, limit) is not None:
            victim = self.waiting.victim(cands)
            cands.remove(victim)
            self.preempt(victim, out, mode="recompute")
