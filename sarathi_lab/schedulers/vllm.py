"""vLLM (SOSP'23), v0 scheduler: prefill-only batches of whole prompts take priority; decodes
wait for them, which is what stalls generation."""
from sarathi_lab.request import Status
from sarathi_lab.schedulers.base import Policy
from sarathi_lab.schedulers.output import SchedulerOutput


class VLLM(Policy):
    name = "vllm"
    whole_prompts = True

    def schedule(self, now):
        out, budget = SchedulerOutput(), self.cfg.max_num_batched_tokens
        while self.waiting and len(self.running) < self.cfg.max_num_seqs:
            n = self.admit(self.waiting[0], budget, whole=True)
            if not n:
                break
            out.add(self.running[-1], n)
            budget -= n
        if out:
            return out
        decodes = list(self.running)
        if not self.kv.allocate_decodes(decodes):   # short of blocks: one by one, preempting
            decodes = [r for r in decodes
                       if r.status is Status.RUNNING and self.allocate_or_preempt(r, 1, out)]
        out.reqs, out.num_new_tokens = decodes, [1] * len(decodes)
        out.num_decodes = len(decodes)
        return out

    def steady_decode(self):
        return not self.waiting or self.head_blocked(self.cfg.max_num_batched_tokens, whole=True)
