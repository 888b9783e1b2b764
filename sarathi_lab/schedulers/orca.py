"""Orca (OSDI'22): iteration-level scheduling; every iteration runs the decodes of running
requests plus the whole prefills of newly admitted ones. KV is reserved for max length."""
from sarathi_lab.schedulers.base import Policy
from sarathi_lab.schedulers.output import SchedulerOutput


class Orca(Policy):
    name = "orca"
    reserves_kv = True
    whole_prompts = True

    def schedule(self, now):
        out = SchedulerOutput()
        self.decode_reserved(out)
        self.admit_waiting(out, self.cfg.max_num_batched_tokens - out.total_tokens, whole=True)
        return out

    def steady_decode(self):
        return not self.waiting or self.head_blocked(
            self.cfg.max_num_batched_tokens - len(self.running), whole=True)
