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
            self.decode_reserved(out)
            return out
        self.admit_waiting(out, self.cfg.max_num_batched_tokens, whole=True)
        return out

    def steady_decode(self):
        return True
