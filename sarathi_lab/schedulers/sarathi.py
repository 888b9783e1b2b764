"""Sarathi-Serve (OSDI'24): stall-free batching with chunked prefills under a token budget."""
from sarathi_lab.request import Status
from sarathi_lab.schedulers.base import Policy
from sarathi_lab.schedulers.output import SchedulerOutput


class Sarathi(Policy):
    name = "sarathi"

    def schedule(self, now):
        out, budget = SchedulerOutput(), self.cfg.token_budget
        # decodes first: a running decode is never stalled by a prefill
        for req in list(self.running):
            if budget == 0:
                break
            if req.is_decoding and req.status is Status.RUNNING:
                if self.allocate_or_preempt(req, 1, out):
                    out.add(req, 1)
                    budget -= 1
        # then ongoing (partial or recomputing) prefills, chunked to what is left
        for req in list(self.running):
            if budget == 0:
                break
            if not req.is_decoding and req.status is Status.RUNNING:
                n = min(req.num_tokens_to_compute, budget)
                if self.allocate_or_preempt(req, n, out):
                    out.add(req, n)
                    budget -= n
        # then new prefills
        while budget and self.waiting and len(self.running) < self.cfg.max_num_seqs:
            n = self.admit(self.waiting[0], budget)
            if not n:
                break
            out.add(self.running[-1], n)
            budget -= n
        return out

    def steady_decode(self):
        return not self.waiting
