"""`tbt_target`: the largest budget whose predicted iteration time keeps every running decode
inside its TBT target (Medha, Agrawal et al. 2024, "Mnemosyne"/"Medha: efficiently serving
multi-million context length LLM inference requests": adaptive chunking, chunks shrink as the
context they attend to grows).

Context-aware through the predictor: a chunk is priced at the context its prompt has reached, so
a long prompt's later chunks come out smaller. Binary search over the budget (the predicted time
grows with it). Simplified from the paper: no space (KV-parallel) dimension and no slack-based
request order; the chunk shapes priced are the policy's fill order (`View.chunks`). When the
decodes alone break the target, `min_chunk` prefill tokens still go with them. A decode whose
SLO class has no TBT target (a batch class judged end to end) constrains nothing.
"""
from sarathi_lab.schedulers.controllers.base import BudgetController, Decision, largest_within
from sarathi_lab.schedulers.controllers.targets import NeedsTBTTarget, TargetConfig, tightest


class TBTTarget(NeedsTBTTarget, BudgetController):
    name = "tbt_target"
    config_class = TargetConfig
    needs_predictor = True

    def decide(self, view, predict):
        n_dec, cap = len(view.decodes), view.max_budget
        target = tightest(self, view.decodes)
        if target is None or n_dec >= cap:
            return Decision(cap)   # no target to keep, or no room for a chunk anyway
        ctx = view.decode_contexts()

        def fits(b: int) -> bool:
            return predict(view.chunks(b - n_dec), ctx) <= target
        lo = min(cap, n_dec + self.cfg.min_chunk)
        return Decision(largest_within(lo, cap, fits))
