"""vLLM (SOSP'23), v0 scheduler: prefill-only batches of whole prompts take priority; decodes
wait for them, which is what stalls generation."""
from sarathi_lab.request import Status
from sarathi_lab.schedulers.base import Policy
from sarathi_lab.schedulers.output import SchedulerOutput


class VLLM(Policy):
    name = "vllm"
    whole_prompts = True

    def schedule(self, now):
        out = SchedulerOutput()
        self.admit_waiting(out, self.cfg.max_num_batched_tokens, whole=True)
        if out:
            return out
        decodes = list(self.running)
        if not self.kv.allocate_decodes(decodes):   # short of blocks: one by one, preempting
            decodes = [r for r in decodes
                       if r.status is Status.RUNNING and self.allocate_or_preempt(r, 1, out)]
        out.add_decodes(decodes)
        return out

    def steady_decode(self):
        return not self.waiting or self.head_blocked(self.cfg.max_num_batched_tokens, whole=True)
