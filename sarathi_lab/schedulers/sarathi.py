"""Sarathi-Serve (OSDI'24): stall-free batching with chunked prefills under a token budget."""
from dataclasses import dataclass

from sarathi_lab.request import Status
from sarathi_lab.schedulers import steady
from sarathi_lab.schedulers.base import Policy, SchedulerConfig
from sarathi_lab.schedulers.mechanics.progress import split_running
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.settings import setting


@dataclass
class SarathiConfig(SchedulerConfig):
    token_budget: int = setting(512, ge=1, help="tokens per iteration (the chunk size)")


class Sarathi(Policy):
    name = "sarathi"
    config_class = SarathiConfig
    fast_forward = steady.SARATHI   # its steady decode and chunk runs (schedulers/steady.py)
    speculates = True

    def schedule(self, now):
        out, budget = SchedulerOutput(), self.cfg.token_budget
        decodes, prefills = split_running(self.running)
        # decodes first: a running decode is never stalled by a prefill
        self.schedule_decodes(out, decodes if len(decodes) <= budget else decodes[:budget])
        # speculative decodes take 1 + k tokens of the budget each
        budget -= out.total_tokens if out.spec_lens else len(out.reqs)
        # then ongoing prefills, chunked to what is left; their blocks were taken at admission,
        # so they never preempt the decodes already in this batch
        for req in prefills:
            if budget == 0:
                break
            if req.status is Status.RUNNING:
                n = min(req.num_tokens_to_compute, budget)
                new_blocks = self.kv.allocate_blocks(req, n)
                assert new_blocks == [], "prompt blocks are held from admission"
                out.add(req, n)
                budget -= n
        self.admit_waiting(out, budget)   # then new prefills, chunked to what is left
        return out

    def token_limit(self):
        return self.cfg.token_budget
