"""vLLM (SOSP'23), v0 scheduler: prefill-only batches of whole prompts take priority; decodes
wait for them, which is what stalls generation."""
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.schedulers.whole_prompt import WholePromptPolicy


class VLLM(WholePromptPolicy):
    name = "vllm"

    def schedule(self, now):
        out = SchedulerOutput()
        self.admit_waiting(out, self.token_cap, whole=True)
        if not out:
            self.schedule_decodes(out, list(self.running))
        return out

    def steady_decode(self):
        return not self.waiting or self.head_blocked(self.token_cap, whole=True)
