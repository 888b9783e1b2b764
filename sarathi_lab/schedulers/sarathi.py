"""Sarathi-Serve (OSDI'24): stall-free batching with chunked prefills under a token budget."""
from sarathi_lab.request import Status
from sarathi_lab.schedulers.base import Policy
from sarathi_lab.schedulers.output import SchedulerOutput


class Sarathi(Policy):
    name = "sarathi"

    def schedule(self, now):
        out, budget = SchedulerOutput(), self.cfg.token_budget
        decodes, prefills = [], []
        for req in self.running:
            (decodes if req.num_computed_tokens == req.num_prompt_tokens + req.num_output_tokens
             - 1 and req.num_output_tokens else prefills).append(req)
        # decodes first: a running decode is never stalled by a prefill
        decodes = decodes[:budget]
        if not self.kv.allocate_decodes(decodes):   # short of blocks: one by one, preempting
            decodes = [r for r in decodes
                       if r.status is Status.RUNNING and self.allocate_or_preempt(r, 1, out)]
        out.add_decodes(decodes)
        budget -= len(decodes)
        # then ongoing prefills, chunked to what is left; their blocks were taken at admission,
        # so they never preempt the decodes already in this batch
        for req in prefills:
            if budget == 0:
                break
            if req.status is Status.RUNNING:
                n = min(req.num_tokens_to_compute, budget)
                new_blocks = self.kv.allocate_slots(req, n)
                assert new_blocks == [], "prompt blocks are held from admission"
                out.add(req, n)
                budget -= n
        self.admit_waiting(out, budget)   # then new prefills, chunked to what is left
        return out

    def steady_decode(self):
        return not self.waiting or self.head_blocked(self.cfg.token_budget - len(self.running))
