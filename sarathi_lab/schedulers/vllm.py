"""vLLM (SOSP'23), v0 scheduler: prefill-only batches of whole prompts take priority; decodes
wait for them, which is what stalls generation."""
from sarathi_lab.schedulers.base import Policy
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.schedulers.whole_prompt import WholePromptConfig, batch_token_cap


class VLLM(Policy):
    name = "vllm"
    config_class = WholePromptConfig
    whole_prompts = True

    def __init__(self, cfg, kv, queue=None):
        super().__init__(cfg, kv, queue)
        self.token_cap = batch_token_cap(cfg, self.max_model_len)

    def schedule(self, now):
        out = SchedulerOutput()
        self.admit_waiting(out, self.token_cap, whole=True)
        if not out:
            self.schedule_decodes(out, list(self.running))
        return out

    def steady_decode(self):
        return not self.waiting or self.head_blocked(self.token_cap, whole=True)
