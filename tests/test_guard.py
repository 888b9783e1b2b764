"""The engine's guard: a plug-in policy that breaks a rule stops the run with an error naming the
plug-in class, the rule, the request and the iteration -- never a plausible wrong number."""
import pytest
from conftest import LinearCost, make_policy, req

from sarathi_lab.engine import Engine
from sarathi_lab.guard import RuleViolation
from sarathi_lab.request import Status
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.schedulers.sarathi import Sarathi


def run(policy_cls, reqs, **kw):
    base = make_policy("sarathi", **kw)
    p = policy_cls(base.cfg, base.kv)
    Engine(p, LinearCost(), fast_forward=False).run(reqs)
    return p


class FinishedAgain(Sarathi):
    """Schedules a request again after it finished."""
    done = []

    def schedule(self, now):
        out = super().schedule(now)
        if self.done:
            out.add(self.done[0], 1)
        return out

    def update(self, out, step, start, end):
        finished = super().update(out, step, start, end)
        self.done.extend(finished)
        return finished


class Twice(Sarathi):
    def schedule(self, now):
        out = super().schedule(now)
        if out.reqs and out.reqs[0].is_decoding:
            out.reqs.append(out.reqs[0])
            out.num_new_tokens.append(1)
        return out


class OverBudget(Sarathi):
    def schedule(self, now):
        out = super().schedule(now)
        for i, r in enumerate(out.reqs):
            if not r.is_decoding:
                out.num_new_tokens[i] = r.num_tokens_to_compute   # the whole prompt at once
        return out


class ZeroTokens(Sarathi):
    def schedule(self, now):
        out = super().schedule(now)
        if out.reqs:
            out.num_new_tokens[-1] = 0
        return out


class TooMany(Sarathi):
    """Gives a decode two tokens (it has one left to compute)."""
    def schedule(self, now):
        out = super().schedule(now)
        for i, r in enumerate(out.reqs):
            if r.is_decoding:
                out.num_new_tokens[i] = 2
                break
        return out


class NoSlots(Sarathi):
    """Admits without asking the KV manager."""
    def schedule(self, now):
        out = SchedulerOutput()
        if self.waiting:
            r = self.waiting.pop()
            r.status = Status.RUNNING
            self.running.append(r)
            out.add(r, r.num_tokens_to_compute)
        return out


class Leaky(Sarathi):
    """Forgets to free a finished request's KV."""
    def update(self, out, step, start, end):
        free, self.kv.free = self.kv.free, lambda r: None
        try:
            return super().update(out, step, start, end)
        finally:
            self.kv.free = free


class Forever(Sarathi):
    """Preempts every request it just admitted: nothing is ever emitted."""
    def schedule(self, now):
        for r in list(self.running):
            self.preempt(r, SchedulerOutput())
        return super().schedule(now)


@pytest.mark.parametrize("cls,rule,kw", [
    (FinishedAgain, "only running requests", {}),
    (Twice, "each request once per batch", {}),
    (OverBudget, "token limit", {"token_budget": 8}),
    (ZeroTokens, "at least one token per entry", {}),
    (TooMany, "no more tokens than a request has left", {}),
    (NoSlots, "KV slots for every token", {}),
    (Leaky, "every KV block is freed", {}),
    (Forever, "progress", {"max_model_len": 32, "token_budget": 4}),
])
def test_each_rule_names_the_plugin_the_rule_and_the_request(cls, rule, kw):
    reqs = [req(0, 20, 3), req(1, 12, 4, t=0.001)]
    with pytest.raises(RuleViolation) as e:
        run(cls, reqs, **kw)
    msg = str(e.value)
    assert f"{cls.__module__}.{cls.__qualname__} broke the rule '{rule}'" in msg
    if rule not in ("every KV block is freed", "progress", "token limit"):
        assert "request 0" in msg or "request 1" in msg
        assert "at iteration" in msg
    if rule == "token limit":
        assert "holds 20 tokens, the policy's limit is 8" in msg
    if rule == "every KV block is freed":
        assert "requests [" in msg


def test_max_num_seqs_is_checked():
    class Crowded(Sarathi):
        def schedule(self, now):
            self.cfg.max_num_seqs = 10   # admit past the configured cap
            try:
                return super().schedule(now)
            finally:
                self.cfg.max_num_seqs = 1

    base = make_policy("sarathi", max_num_seqs=1)
    p = Crowded(base.cfg, base.kv)
    with pytest.raises(RuleViolation, match="'max_num_seqs'.*2 requests running.*=1"):
        Engine(p, LinearCost()).run([req(0, 4, 3), req(1, 4, 3)])


def test_a_well_behaved_run_passes_every_check():
    p = run(Sarathi, [req(i, 5 + i, 3, t=0.01 * i) for i in range(8)], token_budget=8)
    assert not p.running and not p.waiting and p.kv.num_used_blocks == 0
