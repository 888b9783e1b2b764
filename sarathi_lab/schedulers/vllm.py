"""vLLM (SOSP'23), v0 scheduler: prefill-only batches of whole prompts take priority; decodes
wait for them, which is what stalls generation. With preemption by swap, no prompt is admitted
while a request is swapped out; swapped requests come back as decodes beside the running ones,
in a batch that preempted nothing (vLLM v0's `_schedule_default`)."""
from sarathi_lab.schedulers.mechanics.budget import Budget
from sarathi_lab.schedulers.mechanics.fast_forward import VLLM
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.schedulers.whole_prompt import WholePromptPolicy


class VLLM(WholePromptPolicy):
    name = "vllm"
    fast_forward = VLLM   # its steady decode runs (mechanics/fast_forward.py)
    speculates = True

    def schedule(self, now):
        out, budget = SchedulerOutput(), Budget(self.token_cap)
        if not self.swapped:
            self.admit_waiting(out, budget, whole=True)
        if not out:
            self.schedule_decodes(out, list(self.running))
            budget.charge_decodes(out)   # a speculative decode costs 1 + k
            self.swap_in_waiting(out, budget, whole=True)
        return out
