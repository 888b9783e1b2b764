"""Chunked prefills without hybrid batching: the "chunked-prefills only" arm of Sarathi-Serve's
ablation (their `simple_chunking` scheduler), written as a user's plug-in policy.

A prefill iteration holds up to `token_budget` prompt tokens (prompts under way first, then new
ones in queue order) and no decode; a decode iteration holds one decode of every running request
and no prompt token. While prompts wait or are under way the two kinds alternate, so a running
decode waits for at most one chunk, but never shares an iteration with one.

    PYTHONPATH=experiments/ablation sarathi-lab scheduler=custom \
        scheduler.name=simple_chunking:SimpleChunking scheduler.token_budget=512
"""
from sarathi_lab.schedulers import FastForward, Policy, SchedulerOutput
from sarathi_lab.schedulers.mechanics.budget import Budget
from sarathi_lab.schedulers.mechanics.fast_forward import advance_decodes
from sarathi_lab.schedulers.sarathi import SarathiConfig


def steady_decode(policy):
    # every running request decodes and no prompt can start: either turn runs the decodes
    return not policy.waiting or policy.head_blocked(policy.cfg.token_budget)


def advance(policy, times, ended=()):
    done = advance_decodes(policy, times, ended)
    policy.prefill_turn = True   # as a decode iteration leaves it
    return done


class SimpleChunking(Policy):
    name = "simple_chunking"
    config_class = SarathiConfig   # the same knob: token_budget, here a prefill iteration's
    # the simulator may skip through its decode runs (schedulers/mechanics/fast_forward.py)
    fast_forward = FastForward(steady_decode=steady_decode, advance_decodes=advance)

    def __init__(self, cfg, kv, queue=None):
        super().__init__(cfg, kv, queue)
        self.prefill_turn = True   # the next iteration is a prefill one, if any prompt can go

    def schedule(self, now):
        out = SchedulerOutput()
        decodes = [r for r in self.running if r.is_decoding]
        if self.prefill_turn or not decodes:   # no decode to run: no reason to idle
            self._prefill(out, self.cfg.token_budget)
            if out:
                self.prefill_turn = False
                return out
        self.schedule_decodes(out, decodes)
        self.prefill_turn = True
        return out

    def _prefill(self, out: SchedulerOutput, tokens: int) -> None:
        budget = Budget(tokens)
        for req in self.running:   # prompts under way: their KV blocks are held since admission
            if not budget:
                break
            if not req.is_decoding:
                n = budget.chunk(req)
                assert self.kv.allocate_slots(req, n) == [], "prompt blocks are held from admission"
                budget.add(out, req, n)
        self.admit_waiting(out, budget)

    def token_limit(self):
        return self.cfg.token_budget
