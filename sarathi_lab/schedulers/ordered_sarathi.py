"""Sarathi-Serve's chunked prefill with the prefill budget handed out in the waiting queue's
order: the base of the policies that rank requests (`edf`, `sarathi_priority`).

Sarathi gives what is left of the token budget after the decodes to ongoing prefills first, in
admission order, then to new ones. With a ranking, an urgent arrival would then wait behind
every chunk of a less urgent prompt already started (an 8k-token batch prompt at 512 tokens an
iteration holds it for 16 iterations). Here ongoing prefills and waiting requests are merged by
the queue's key: whoever ranks first gets the next chunk. Decodes still come first (no stall).
"""
from sarathi_lab.request import Status
from sarathi_lab.schedulers.mechanics.budget import Budget
from sarathi_lab.schedulers.mechanics.fast_forward import ORDERED_SARATHI
from sarathi_lab.schedulers.mechanics.progress import split_running
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.schedulers.queues import OrderedQueue
from sarathi_lab.schedulers.sarathi import Sarathi


class OrderedSarathi(Sarathi):
    """Chunked prefill under `token_budget`, prefill chunks in the order of an `OrderedQueue`.
    No request overtakes the waiting queue's head (as `admit_waiting`); an ongoing prefill that
    ranks after a head that cannot start still gets its chunk (its blocks are held already)."""

    name = "ordered_sarathi"
    fast_forward = ORDERED_SARATHI   # its steady decode runs (mechanics/fast_forward.py)
    follows_prefill_order = False   # prompts go by the queue's key (a controller's order refused)

    def __init__(self, cfg, kv, queue=None):
        super().__init__(cfg, kv, queue)
        if not isinstance(self.waiting, OrderedQueue):
            raise ValueError(f"scheduler.queue={cfg.queue!r}: policy {self.name!r} ranks "
                             "prefills by the queue's key; it needs an ordered queue")

    def rank(self, req):
        """A request's place in the order: the queue's key, ties in arrival order."""
        return self.waiting.key(req), req.arrival_time

    def schedule(self, now):
        return self.fill(SchedulerOutput(), self.iteration_budget(now))

    def fill(self, out: SchedulerOutput, tokens: int) -> SchedulerOutput:
        """Add this iteration's decodes, then prefill chunks in rank order, to `out`, within
        `tokens`."""
        budget = Budget(tokens)
        decodes, prefills = split_running(self.running)
        self.schedule_decodes(out, decodes[:tokens])
        budget.charge_decodes(out)   # a speculative decode costs 1 + k
        prefills = sorted((r for r in prefills if r.status is Status.RUNNING), key=self.rank)
        i, admitting, waiting = 0, True, self.waiting
        while budget:
            head = waiting.peek() if admitting and waiting else None
            if i < len(prefills) and (head is None or self.rank(prefills[i]) <= self.rank(head)):
                req = prefills[i]
                i += 1
                n = budget.chunk(req)
                assert self.kv.allocate_slots(req, n) == [], "prompt blocks are held from admission"
                budget.add(out, req, n)
            elif head is None:
                break
            elif n := self.admit(head, budget.left):
                budget.add(out, head, n)
            elif (reason := self.never_fits(head)) is not None:
                # a preempted request that grew may never fit again: it would block the queue
                self.reject(waiting.pop(), reason)
                out.rejected.append(head)
            else:
                admitting = False   # no overtaking; started prefills go on
        # swapped requests (admission waits for them) take what ongoing prefills left
        self.swap_in_waiting(out, budget)
        return out
