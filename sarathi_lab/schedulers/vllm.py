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
        for req in list(self.running):
            if req.status is Status.RUNNING and self.allocate_or_preempt(req, 1, out):
                out.reqs.append(req)
                out.num_new_tokens.append(1)
        out.num_decodes = len(out.reqs)
        return out

    def steady_decode(self):
        return not self.waiting
