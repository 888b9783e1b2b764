"""Plug-in policies as a user writes them, with no fast-forward code (tests/test_plugin_policy.py
runs them with fast-forward on and off, in code and through the CLI)."""
from dataclasses import dataclass

from sarathi_lab.schedulers import Budget, Policy, SchedulerConfig, SchedulerOutput
from sarathi_lab.schedulers.sarathi import Sarathi
from sarathi_lab.settings import setting


@dataclass
class DecodeFirstConfig(SchedulerConfig):
    prefill_chunk: int = setting(256, ge=1, help="prompt tokens per iteration, beside the decodes")


class DecodeFirst(Policy):
    """Every running decode, then at most `prefill_chunk` prompt tokens: prompts under way
    first, then new ones in queue order."""
    name = "decode_first"
    config_class = DecodeFirstConfig

    def schedule(self, now):
        out = SchedulerOutput()
        self.schedule_decodes(out, [r for r in self.running if r.is_decoding])
        budget = Budget(self.cfg.prefill_chunk)   # each entry costs what it computes
        for req in self.running:   # prompts under way: their KV blocks are held since admission
            if budget and not req.is_decoding:
                n = budget.chunk(req)
                self.kv.allocate_slots(req, n)
                budget.add(out, req, n)
        self.admit_waiting(out, budget)   # the queue's head first; none overtakes it
        return out


class Alternate(Sarathi):
    """Sarathi, except that while every running request decodes and none waits, an iteration
    decodes every other running request, the two halves taking turns."""
    name = "alternate"
    turn = 0

    def schedule(self, now):
        if self.waiting or not all(r.is_decoding for r in self.running):
            return super().schedule(now)
        out, self.turn = SchedulerOutput(), 1 - self.turn
        self.schedule_decodes(out, self.running[self.turn::2] or self.running)
        return out
