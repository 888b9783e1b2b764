"""Request-level batching (FasterTransformer): a batch is admitted only when nothing runs and
runs to completion. KV is reserved for max length."""
from sarathi_lab.schedulers.base import Policy
from sarathi_lab.schedulers.output import SchedulerOutput


class RequestLevel(Policy):
    name = "request_level"
    reserves_kv = True
    whole_prompts = True

    def schedule(self, now):
        out = SchedulerOutput()
        if self.running:
            for req in self.running:
                n = req.num_tokens_to_compute
                allocated = self.kv.allocate_slots(req, n)
                assert allocated == [], "reserved up front"
                out.add(req, n)
            return out
        budget = self.cfg.max_num_batched_tokens
        while self.waiting and len(self.running) < self.cfg.max_num_seqs:
            n = self.admit(self.waiting[0], budget, whole=True)
            if not n:
                break
            out.add(self.running[-1], n)
            budget -= n
        return out

    def steady_decode(self):
        return True
