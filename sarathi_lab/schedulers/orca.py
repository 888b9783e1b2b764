"""Orca (OSDI'22): iteration-level scheduling; every iteration runs the decodes of running
requests plus the whole prefills of newly admitted ones. KV is reserved for max length."""
from sarathi_lab.schedulers.mechanics.budget import Budget
from sarathi_lab.schedulers.mechanics.fast_forward import ORCA
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.schedulers.whole_prompt import WholePromptPolicy


class Orca(WholePromptPolicy):
    name = "orca"
    reserves_kv = True
    fast_forward = ORCA   # its steady decode runs (mechanics/fast_forward.py)

    def schedule(self, now):
        out, budget = SchedulerOutput(), Budget(self.token_cap)
        self.decode_reserved(out)
        budget.charge_decodes(out)
        self.admit_waiting(out, budget, whole=True)
        return out
