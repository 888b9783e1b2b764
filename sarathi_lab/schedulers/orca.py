"""Orca (OSDI'22): iteration-level scheduling; every iteration runs the decodes of running
requests plus the whole prefills of newly admitted ones. KV is reserved for max length."""
from sarathi_lab.schedulers.base import Policy
from sarathi_lab.schedulers.output import SchedulerOutput


class Orca(Policy):
    name = "orca"
    reserves_kv = True
    whole_prompts = True

    def schedule(self, now):
        out = SchedulerOutput()
        for req in self.running:
            n = req.num_tokens_to_compute
            allocated = self.kv.allocate_slots(req, n)
            assert allocated == [], "reserved up front"
            out.add(req, n)
        budget = self.cfg.max_num_batched_tokens - out.total_tokens
        while self.waiting and len(self.running) < self.cfg.max_num_seqs and budget > 0:
            n = self.admit(self.waiting[0], budget, whole=True)
            if not n:
                break
            out.add(self.running[-1], n)
            budget -= n
        return out

    def steady_decode(self):
        return not self.waiting or self.head_blocked(
            self.cfg.max_num_batched_tokens - len(self.running), whole=True)
