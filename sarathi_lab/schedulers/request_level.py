"""Request-level batching (FasterTransformer): a batch is admitted only when nothing runs and
runs to completion. KV is reserved for max length."""
from sarathi_lab.schedulers.base import Policy
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.schedulers.whole_prompt import WholePromptConfig, batch_token_cap


class RequestLevel(Policy):
    name = "request_level"
    config_class = WholePromptConfig
    reserves_kv = True
    whole_prompts = True

    def __init__(self, cfg, kv, queue=None):
        super().__init__(cfg, kv, queue)
        self.token_cap = batch_token_cap(cfg, self.max_model_len)

    def schedule(self, now):
        out = SchedulerOutput()
        if self.running:
            self.decode_reserved(out)
            return out
        self.admit_waiting(out, self.token_cap, whole=True)
        return out

    def steady_decode(self):
        return True
