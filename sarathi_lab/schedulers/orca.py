"""Orca (OSDI'22): iteration-level scheduling; every iteration runs the decodes of running
requests plus the whole prefills of newly admitted ones. KV is reserved for max length."""
from sarathi_lab.schedulers.base import Policy
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.schedulers.whole_prompt import WholePromptConfig, batch_token_cap


class Orca(Policy):
    name = "orca"
    config_class = WholePromptConfig
    reserves_kv = True
    whole_prompts = True

    def __init__(self, cfg, kv, queue=None):
        super().__init__(cfg, kv, queue)
        self.token_cap = batch_token_cap(cfg, self.max_model_len)

    def schedule(self, now):
        out = SchedulerOutput()
        self.decode_reserved(out)
        self.admit_waiting(out, self.token_cap - out.total_tokens, whole=True)
        return out

    def steady_decode(self):
        return not self.waiting or self.head_blocked(self.token_cap - len(self.running),
                                                     whole=True)
