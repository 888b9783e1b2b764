"""The engine's guard: a plug-in policy that breaks a rule stops the run with an error naming the
plug-in class, the rule, the request and the iteration -- never a plausible wrong number."""
import pytest
from conftest import LinearCost, make_policy, req

from sarathi_lab.engine import Engine
from sarathi_lab.engine.guard import RuleViolation
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
    def __init__(self, *args):
        super().__init__(*args)
        self.done = []   # its own: a list on the class would carry over from an earlier run

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
    """Gives the last entry of a batch of several no token (the first is a decode of 1)."""
    def schedule(self, now):
        out = super().schedule(now)
        if len(out) > 1:
            out.num_new_tokens[-1] = 0
        return out


class Uncounted(Sarathi):
    """Adds a request to the batch without its token count."""
    def schedule(self, now):
        out = super().schedule(now)
        if out.reqs and out.reqs[0].is_decoding:
            out.reqs.append(out.reqs[0])
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


# the hint of the rule a plug-in that moves a request's progress itself breaks
MOVED = (" (its num_computed_tokens is {}; only the engine's update() may move it, never "
         "schedule())")


@pytest.mark.parametrize("cls,rule,kw,where,detail", [
    (FinishedAgain, "only running requests", {}, "at iteration 3 (t=0.065s)",
     "request 0 is finished"),
    (Twice, "each request once per batch", {}, "at iteration 1 (t=0.030s)",
     "request 0 appears more than once"),
    (OverBudget, "token limit", {"token_budget": 8}, "at iteration 0 (t=0.000s)",
     "the batch holds 20 tokens, the policy's limit is 8"),
    (ZeroTokens, "at least one token per entry", {}, "at iteration 1 (t=0.030s)",
     "request 1 is given 0 tokens"),
    (Uncounted, "one token count per request", {}, "at iteration 1 (t=0.030s)",
     "3 requests, 2 counts"),
    (TooMany, "no more tokens than a request has left", {}, "at iteration 1 (t=0.030s)",
     "request 0 is given 2 tokens with 1 left to compute" + MOVED.format(20)),
    (NoSlots, "KV slots for every token", {}, "at iteration 0 (t=0.000s)",
     "request 0 is given 20 tokens after 0 but holds KV slots for 0"),
    (Leaky, "every KV block is freed", {}, "at the end",
     "10 blocks still held, by requests [0, 1]"),
    (Forever, "progress", {"max_model_len": 32, "token_budget": 4},
     "at iteration 1065 (t=14.910s)", "1065 iterations in a row emitted no token and ended no "
     "request (1 waiting, 1 running); it would never finish"),
])
def test_each_rule_names_the_plugin_the_rule_and_the_request(cls, rule, kw, where, detail):
    reqs = [req(0, 20, 3), req(1, 12, 4, t=0.001)]
    with pytest.raises(RuleViolation) as e:
        run(cls, reqs, **kw)
    # the batch comes from schedule(); the end-of-run check names no method
    method = "" if where == "at the end" else ".schedule()"
    assert str(e.value) == \
        f"test_guard.{cls.__qualname__}{method} broke the rule '{rule}' {where}: {detail}"


class DuplicatesTheLast(Sarathi):
    def schedule(self, now):
        out = super().schedule(now)
        if out.reqs and out.reqs[-1].is_decoding:
            out.reqs.append(out.reqs[-1])
            out.num_new_tokens.append(1)
        return out


@pytest.mark.parametrize("n", [1, 2])
def test_a_duplicate_is_caught_and_named_in_any_batch(n):
    # one request: a batch of two entries, both the same; two: the second appears twice
    with pytest.raises(RuleViolation, match=f"'each request once per batch' at iteration 1 "
                       rf"\(t=0\.\d+s\): request {n - 1} appears more than once$"):
        run(DuplicatesTheLast, [req(i, 4, 3) for i in range(n)])


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
    with pytest.raises(RuleViolation, match=r"'max_num_seqs' at iteration 0 \(t=0\.000s\): 2 "
                       r"requests running, scheduler\.max_num_seqs=1$"):
        Engine(p, LinearCost()).run([req(0, 4, 3), req(1, 4, 3)])


def test_a_well_behaved_run_passes_every_check():
    p = run(Sarathi, [req(i, 5 + i, 3, t=0.01 * i) for i in range(8)], token_budget=8)
    assert not p.running and not p.waiting and p.kv.num_used_blocks == 0


class ForgetsTheQueue(Sarathi):
    """Says it has no work while requests still wait."""
    overrides = ("has_work",)
    def has_work(self):
        return bool(self.running)


def test_a_run_that_ends_with_requests_left_is_an_error():
    with pytest.raises(RuleViolation) as e:
        run(ForgetsTheQueue, [req(0, 4, 3)])
    assert str(e.value) == (
        "test_guard.ForgetsTheQueue broke the rule 'every request ends' at the end: 1 waiting "
        "and 0 running requests were left when the run ended")


def test_a_leak_names_the_first_ten_holders_whatever_their_ids():
    # ids of mixed types: sorted as text, so the message never fails to be written
    ids = [f"r{i:02d}" for i in range(11)] + [7]
    with pytest.raises(RuleViolation) as e:
        run(Leaky, [req(i, 4, 1) for i in ids])
    msg = str(e.value)
    assert "'every KV block is freed' at the end: 12 blocks still held" in msg
    assert msg.endswith("by requests [7, 'r00', 'r01', 'r02', 'r03', 'r04', 'r05', 'r06', "
                        "'r07', 'r08']")


class StallsAfterTheFirstToken(Sarathi):
    """Runs normally until a token is emitted, then preempts everything at every iteration."""
    def schedule(self, now):
        if any(r.num_output_tokens for r in self.running):
            for r in list(self.running):
                self.preempt(r, SchedulerOutput())
        return super().schedule(now)


def test_a_livelock_is_counted_from_the_last_iteration_that_emitted():
    base = make_policy("sarathi", max_model_len=32, token_budget=4)
    p = StallsAfterTheFirstToken(base.cfg, base.kv)
    eng = Engine(p, LinearCost(), fast_forward=False)
    with pytest.raises(RuleViolation) as e:
        eng.run([req(0, 20, 3)])
    # a prompt of 20 in chunks of 4 emits at iteration 5; its recompute (21 tokens) never
    # ends, so the guard gives up after its patience, counted from there
    n = eng.guard.patience + 1
    assert str(e.value) == (
        f"test_guard.StallsAfterTheFirstToken.schedule() broke the rule 'progress' at iteration "
        f"{5 + n} "
        f"(t={eng.now:.3f}s): {n} iterations in a row emitted no token and ended no request "
        "(0 waiting, 1 running); it would never finish")


class ChunksButDeclaresWhole(Sarathi):
    """Sarathi's chunked prompts under a declaration that prompts are never chunked."""
    whole_prompts = True


def test_a_policy_that_declares_whole_prompts_and_chunks_one_is_stopped():
    # a 200-token prompt, budget 128: sarathi's first batch gives it a chunk of 128
    with pytest.raises(RuleViolation, match=r"ChunksButDeclaresWhole.schedule\(\) broke the rule "
                       r"'whole prompts' at iteration 0 .*request 0 is given 128 of the 200 "
                       r"tokens it has left"):
        run(ChunksButDeclaresWhole, [req(0, 200, 2)], token_budget=128)


def test_whole_prompt_policies_keep_their_declaration():
    """vllm, orca and request_level declare whole prompts and compute every prompt at once: the
    guard lets every batch through (the reference runs cover them on a real trace)."""
    for name in ("vllm", "orca", "request_level"):
        p = make_policy(name, num_kv_blocks=16, block_size=16)
        assert p.whole_prompts
        reqs = [req(i, 60 + 10 * i, 80, t=0.001 * i) for i in range(6)]
        Engine(p, LinearCost(), fast_forward=False).run(reqs)
        assert all(r.status is Status.FINISHED for r in reqs)
