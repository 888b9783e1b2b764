"""Sarathi-Serve (OSDI'24): stall-free batching with chunked prefills under a token budget."""
from dataclasses import dataclass

from sarathi_lab.request import Status
from sarathi_lab.schedulers.base import Policy, SchedulerConfig
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.settings import setting


@dataclass
class SarathiConfig(SchedulerConfig):
    token_budget: int = setting(512, ge=1, help="tokens per iteration (the chunk size)")


class Sarathi(Policy):
    name = "sarathi"
    config_class = SarathiConfig

    def schedule(self, now):
        out, budget = SchedulerOutput(), self.cfg.token_budget
        decodes, prefills = [], []
        decode, prefill = decodes.append, prefills.append
        for req in self.running:   # req.is_decoding, inlined: the simulator's hottest loop
            out_n = req.num_output_tokens
            if out_n and req.num_computed_tokens == req.num_prompt_tokens + out_n - 1:
                decode(req)
            else:
                prefill(req)
        # decodes first: a running decode is never stalled by a prefill
        self.schedule_decodes(out, decodes if len(decodes) <= budget else decodes[:budget])
        budget -= len(out.reqs)
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

    def steady_chunks(self):
        # one prompt under way beside decodes only: each batch is every decode plus the chunk
        # that fills the budget, which leaves none to admit with until the prompt's last chunk
        # (the engine stops before that one while a request waits). A waiting head that could
        # never fit is not left behind by any schedule(): admit_waiting rejects it there
        running, budget = self.running, self.cfg.token_budget
        if self.admission is not None or self.swapped or self.kv.enable_prefix_caching \
                or len(running) > budget:
            return None
        pre = None
        for req in running:
            out_n = req.num_output_tokens
            if not out_n or req.num_computed_tokens != req.num_prompt_tokens + out_n - 1:
                if pre is not None:
                    return None
                pre = req
        if pre is None or pre.status is not Status.RUNNING:
            return None
        return pre, budget - (len(running) - 1)

    def steady_decode(self):
        # decodes never outnumber the budget (each request's prompt went through it first);
        # checked anyway, as the engine no longer sees the last batch decode them all
        left = self.cfg.token_budget - len(self.running)
        return left >= 0 and (not self.waiting or self.head_blocked(left))
