"""Request-level batching (FasterTransformer): a batch is admitted only when nothing runs and
runs to completion. KV is reserved for max length."""
from sarathi_lab.schedulers.mechanics.budget import Budget
from sarathi_lab.schedulers.mechanics.fast_forward import REQUEST_LEVEL
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.schedulers.whole_prompt import WholePromptPolicy


class RequestLevel(WholePromptPolicy):
    name = "request_level"
    reserves_kv = True
    fast_forward = REQUEST_LEVEL   # its steady decode runs (mechanics/fast_forward.py)

    def schedule(self, now):
        out = SchedulerOutput()
        if self.running:
            self.decode_reserved(out)
            return out
        self.admit_waiting(out, Budget(self.token_cap), whole=True)
        return out
