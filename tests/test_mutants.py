"""Tests written for mutants that survived the rest of the suite (experiments/mutation/): each
pins down a behaviour of the engine or the policies that no other test checked."""
import pytest
from conftest import LinearCost, make_policy, req
from helpers import add, engine, step

from sarathi_lab.engine import Engine
from sarathi_lab.engine.guard import RuleViolation
from sarathi_lab.metrics import iterations_table, requests_table, summarize
from sarathi_lab.request import Status
from sarathi_lab.schedulers.mechanics.budget import Budget
from sarathi_lab.schedulers.mechanics.fast_forward import FastForward
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.schedulers.queues import PriorityQueue
from sarathi_lab.schedulers.sarathi import Sarathi
from sarathi_lab.schedulers.vllm import VLLM

POLICIES = ["request_level", "orca", "vllm", "sarathi"]


# -- fast-forward: how much it skips --------------------------------------------------------------
# Upper bounds on schedule() calls: a skip that stops short, or never starts, changes no number
# of the run, only how long it takes.
def schedule_calls(p, spec):
    """Runs requests of (prompt, output) lengths, all at t=0, with fast-forward; returns
    (schedule() calls, iterations, the requests)."""
    reqs = [req(i, prompt, out) for i, (prompt, out) in enumerate(spec)]
    eng = Engine(p, LinearCost(per_ctx=1e-5))
    calls, schedule = [], p.schedule
    p.schedule = lambda now: calls.append(now) or schedule(now)
    eng.run(reqs)
    return len(calls), eng.num_iterations, reqs


@pytest.mark.parametrize("out_len", [10, 5])
def test_fast_forward_leaves_only_the_first_decode_and_the_last_to_single_steps(out_len):
    # prefill (first token), one decode that shows the run is steady, the skip (of 2 decodes
    # or more), then the last token stepped on its own (it ends the request)
    calls, iterations, _ = schedule_calls(make_policy("sarathi", max_model_len=64),
                                          [(4, out_len)])
    assert iterations == out_len and calls <= 3


def test_fast_forward_skips_up_to_the_last_free_block():
    # 3 blocks of 4 hold tokens 0..11: the decode that needs a 4th block is stepped, and finds
    # none: the request, alone, outgrew the cache
    calls, iterations, (r,) = schedule_calls(make_policy("sarathi", num_blocks=3,
                                                         max_model_len=64), [(4, 20)])
    assert r.status is Status.REJECTED and r.num_output_tokens == 9
    # prefill, first decode, the skip to 12 computed tokens, the decode that does not fit
    assert iterations == 9 and calls <= 3


@pytest.mark.parametrize("name,kw,spec,most_calls", [
    # max_num_seqs=1: the second request waits for the first to end
    ("sarathi", {"max_num_seqs": 1}, [(4, 20), (4, 20)], 6),
    ("vllm", {"max_num_seqs": 1}, [(4, 20), (4, 20)], 6),
    # two decodes spend the whole budget of 2: the third request waits
    ("sarathi", {"token_budget": 2}, [(1, 20), (1, 20), (1, 20)], 6),
    # 2 decodes + a whole prompt of 31 exceed orca's 32 tokens; orca never chunks it
    ("orca", {"max_model_len": 32, "max_num_batched_tokens": 32}, [(4, 20), (4, 20), (31, 1)],
     4),
])
def test_fast_forward_skips_while_the_queue_head_is_blocked(name, kw, spec, most_calls):
    calls, iterations, reqs = schedule_calls(make_policy(name, **kw), spec)
    assert all(r.status is Status.FINISHED for r in reqs)
    assert iterations == (21 if name == "orca" else 40)
    assert calls <= most_calls        # stepping the waiting time one by one takes 20 more


def test_fast_forward_is_turned_off_for_a_policy_that_would_bypass_its_own_update(caplog):
    class OwnUpdate(Sarathi):
        def update(self, out, step, start, end):
            return super().update(out, step, start, end)

    base = make_policy("sarathi")
    with caplog.at_level("INFO", logger="sarathi_lab.engine"):
        eng = Engine(OwnUpdate(base.cfg, base.kv), LinearCost())
    assert not eng.fast_forward
    assert caplog.messages == ["test_fast_forward_is_turned_off_for_a_policy_that_would_bypass_"
                               "its_own_update.<locals>.OwnUpdate declares no fast_forward "
                               "(schedulers/mechanics/fast_forward.py): stepped one iteration "
                               "at a time"]


# -- the engine loop ------------------------------------------------------------------------------
class WaitsForAPair(Sarathi):
    """Schedules nothing until two requests are queued (a plug-in may wait for arrivals)."""

    def schedule(self, now):
        if not self.running and len(self.waiting) < 2:
            return SchedulerOutput()
        return super().schedule(now)


def test_a_policy_that_waits_for_arrivals_moves_the_clock_to_the_next_one():
    base = make_policy("sarathi")
    p = WaitsForAPair(base.cfg, base.kv)
    a, b = req(0, 4, 2, t=0.0), req(1, 4, 2, t=1.0)
    Engine(p, LinearCost(), fast_forward=False).run([a, b])
    assert a.status is b.status is Status.FINISHED
    assert a.first_scheduled_time == b.first_scheduled_time == 1.0


@pytest.mark.parametrize("name", ["vllm", "sarathi"])
def test_progress_counts_requests_done_and_tokens_computed(name):
    # 0 outgrows the 4 blocks after 7 tokens (vllm rejects it in a batch of its own, sarathi
    # beside 2's prefill), 1 and 3 are rejected on arrival, 2 finishes
    p = make_policy(name, num_blocks=4, max_model_len=64, max_num_batched_tokens=64)
    calls = []
    eng = Engine(p, LinearCost(), fast_forward=False,
                 progress=lambda done, tokens: calls.append((done, tokens)))
    reqs = [req(0, 10, 30), req(1, 70, 3), req(2, 2, 2, t=0.05), req(3, 80, 1)]
    eng.run(reqs)
    assert [r.status for r in reqs] == [Status.REJECTED, Status.REJECTED, Status.FINISHED,
                                        Status.REJECTED]
    assert calls == [(2, 10), (2, 11), (2, 12), (2, 13), (2, 14), (2, 15), (2, 16), (3, 18),
                     (4, 19)]


def test_a_step_that_schedules_nothing_computes_no_token():
    adv = Engine(make_policy("sarathi"), LinearCost()).advance()
    out, done, n_pre, n_dec = adv.batch, adv.finished, adv.prefill_tokens, adv.decode_tokens
    assert not out and done == [] and (n_pre, n_dec) == (0, 0)


def test_an_executor_with_its_own_stop_rule_ends_requests_where_it_says():
    class FirstTokenOnly(LinearCost):
        def finished(self, out):
            return [i for i, (r, n) in enumerate(zip(out.reqs, out.num_new_tokens))
                    if r.num_computed_tokens + n == r.num_tokens]

    reqs = [req(0, 4, 5), req(1, 6, 9, t=0.001)]
    Engine(make_policy("sarathi"), FirstTokenOnly()).run(reqs)
    assert all(r.status is Status.FINISHED and r.num_output_tokens == 1 for r in reqs)


def test_an_unknown_overlong_mode_is_named():
    with pytest.raises(ValueError, match="^overlong='drop': must be reject or cap$"):
        Engine(make_policy("sarathi"), LinearCost(), overlong="drop")


def test_add_request_says_whether_the_request_was_queued():
    eng = Engine(make_policy("sarathi", max_model_len=16), LinearCost())
    assert eng.add_request(req(0, 4, 3)) is True
    assert eng.add_request(req(1, 16, 3)) is False     # the policy's: no room to generate
    assert eng.add_request(req(2, 10, 50)) is False    # the engine's: the output cannot fit


@pytest.mark.parametrize("prompt,out_len,max_tokens,served,reason", [
    (15, 1, None, 1, None),                            # exactly one token of room
    (15, 5, None, 0, "prompt of 15 + output of 5 tokens exceeds max_model_len=16"),
    (10, 20, None, 0, "prompt of 10 + output of 20 tokens exceeds max_model_len=16"),
    (10, 50, 6, 6, None),                              # max_tokens fills the room exactly
    (16, 5, None, 0, "prompt of 16 tokens leaves no room to generate within max_model_len=16"),
])
def test_what_fits_max_model_len(prompt, out_len, max_tokens, served, reason):
    r = req(0, prompt, out_len, max_tokens=max_tokens)
    Engine(make_policy("sarathi", max_model_len=16), LinearCost()).run([r])
    assert r.num_output_tokens == served
    if reason is None:
        assert r.status is Status.FINISHED
    else:
        assert r.status is Status.REJECTED and r.rejection_reason.startswith(reason)


# -- the policies' batches ------------------------------------------------------------------------
def test_sarathi_gives_the_last_token_of_its_budget_to_the_ongoing_prefill():
    p, ex = make_policy("sarathi", token_budget=3, max_model_len=64), LinearCost()
    for i, n in enumerate([1, 1, 10]):
        add(p, ex, req(i, n, 8))
    assert step(p, ex) == [(0, 1), (1, 1), (2, 1)]
    assert step(p, ex) == [(0, 1), (1, 1), (2, 1)]     # two decodes, then 1 token of the chunk


def test_orca_never_chunks_a_prompt_that_does_not_fit_beside_the_decodes():
    p, ex = make_policy("orca", max_model_len=32, max_num_batched_tokens=32), LinearCost()
    add(p, ex, req(0, 4, 3))
    add(p, ex, req(1, 4, 3))
    assert step(p, ex) == [(0, 4), (1, 4)]
    add(p, ex, req(2, 31, 1))
    assert step(p, ex) == [(0, 1), (1, 1)]            # 2 + 31 > 32: the prompt waits whole
    assert step(p, ex) == [(0, 1), (1, 1)]
    assert step(p, ex) == [(2, 31)]


@pytest.mark.parametrize("name,max_model_len,cap", [("orca", 256, 2048), ("vllm", 4096, 4096)])
def test_whole_prompt_token_cap_defaults_to_max_of_max_model_len_and_2048(name, max_model_len,
                                                                           cap):
    assert make_policy(name, max_model_len=max_model_len).token_limit() == cap


@pytest.mark.parametrize("name", POLICIES)
def test_a_policy_uses_the_queue_it_is_given(name):
    base = make_policy(name, max_model_len=64, max_num_seqs=1)
    q = PriorityQueue()
    p = type(base)(base.cfg, base.kv, q)     # the config says fcfs; the queue given wins
    assert p.waiting is q
    reqs = [req(0, 4, 2), req(1, 4, 2), req(2, 4, 2)]
    reqs[2].priority = -1
    Engine(p, LinearCost(), fast_forward=False).run(reqs)
    # 0 is admitted alone at t=0; then the urgent 2 overtakes 1
    assert reqs[2].first_scheduled_time < reqs[1].first_scheduled_time


def test_vllm_admits_a_prompt_beside_another_on_its_prefix_hit():
    # B repeats A's 24-token prompt: 20 tokens (5 blocks) are hits, so B computes 4 tokens and
    # takes 1 new block, beside C's 10 tokens, within the cap of 32 and the 3 free blocks
    p = make_policy("vllm", num_blocks=12, max_model_len=32, max_num_batched_tokens=32,
                    enable_prefix_caching=True)
    ex, ids = LinearCost(), list(range(100, 124))
    add(p, ex, req(0, 24, 8, ids=ids))
    assert step(p, ex) == [(0, 24)]
    add(p, ex, req(1, 10, 8, ids=list(range(500, 510))))
    add(p, ex, req(2, 24, 8, ids=list(ids)))
    assert step(p, ex) == [(1, 10), (2, 4)]
    assert p.kv.num_free_blocks == 12 - 6 - 3 - 1


def test_admission_goes_on_past_a_head_rejected_for_good():
    # B grows until it is preempted; it then needs 6 blocks to start again, more than the 5 the
    # watermark leaves: rejected at the head of the queue, and C behind it starts at once
    p = make_policy("vllm", num_blocks=7, max_model_len=64, max_num_batched_tokens=64,
                    kv_watermark=0.3)
    ex = LinearCost()
    add(p, ex, req(0, 3, 23))
    add(p, ex, req(1, 15, 34))
    for _ in range(3):
        step(p, ex)
    add(p, ex, req(2, 5, 6))
    for _ in range(3):
        assert step(p, ex) == [(0, 1), (1, 1)]
    out = engine(p, ex).advance().batch
    assert [r.request_id for r in out.preempted] == [1]
    out = engine(p, ex).advance().batch
    assert [r.request_id for r in out.rejected] == [1] and "kv_watermark" in \
        out.rejected[0].rejection_reason
    assert [(r.request_id, n) for r, n in zip(out.reqs, out.num_new_tokens)] == [(2, 5)]


def test_admit_without_whole_starts_a_chunk_and_admit_waiting_returns_the_budget_left():
    p = make_policy("sarathi", max_num_seqs=2)
    for i in range(3):
        p.add_request(req(i, 10, 2))
    out = SchedulerOutput()
    assert p.admit(p.waiting.peek(), 4) == 4          # a plug-in's own chunk of the prompt
    out.add(p.running[-1], 4)
    # the second takes its 10 tokens of 13; the third finds max_num_seqs reached
    budget = Budget(13)
    assert p.admit_waiting(out, budget) == 3 == budget.left
    assert [r.request_id for r in p.running] == [0, 1]
    with pytest.raises(TypeError, match=r"admit_waiting\(out, budget\): budget must be a Budget"):
        p.admit_waiting(out, 13)   # a plug-in that passes a number is told what to pass


def test_sampled_tokens_become_the_output_token_ids():
    class Samples(LinearCost):
        def execute(self, out):
            step = super().execute(out)
            step.sampled = [1000 + r.num_computed_tokens for r in out.reqs]
            return step

    r = req(0, 4, 3)
    Engine(make_policy("sarathi"), Samples(), fast_forward=False).run([r])
    # each token is sampled in the step that computes the tokens before it: after 0, 4, 5
    assert r.output_token_ids == [1000, 1004, 1005]


@pytest.mark.parametrize("name", ["orca", "request_level"])
def test_reserved_kv_keeps_no_watermark(name):
    # the request reserves max_model_len = 64 tokens, all 16 blocks: the watermark's 4 blocks
    # are for growth that reserved KV never has
    r = req(0, 40, 24)
    Engine(make_policy(name, num_blocks=16, max_model_len=64, kv_watermark=0.3),
           LinearCost()).run([r])
    assert r.status is Status.FINISHED and r.num_output_tokens == 24


# -- preemption -----------------------------------------------------------------------------------
def test_a_request_preempted_twice_counts_two_preemptions():
    # 5 blocks of 4 for three requests of 4 + 10 tokens: the newest is preempted twice
    p = make_policy("vllm", num_blocks=5, max_model_len=32, max_num_batched_tokens=32)
    reqs = [req(i, 4, 10) for i in range(3)]
    eng = Engine(p, LinearCost(), fast_forward=False)
    eng.run(reqs)
    assert [r.num_preemptions for r in reqs] == [0, 1, 2]
    it = iterations_table(eng.iterations())
    assert it["preemptions"].sum() == 3
    assert summarize(requests_table(reqs), it)["preemptions"] == 3


class NewestFirst(VLLM):
    """Grants decodes newest first, protecting those already in the batch through `out`."""
    overrides = ("schedule_decodes",)

    def schedule_decodes(self, out, decodes):
        for r in reversed(decodes):
            if r.status is Status.RUNNING and self.allocate_or_preempt(r, 1, out):
                out.add(r, 1)


def test_preemption_spares_the_requests_already_in_the_batch():
    base = make_policy("vllm", num_blocks=5, max_model_len=32, max_num_batched_tokens=32)
    p = NewestFirst(base.cfg, base.kv)
    reqs = [req(i, 4, 10) for i in range(3)]
    Engine(p, LinearCost(), fast_forward=False).run(reqs)   # no rule broken
    assert all(r.status is Status.FINISHED and r.num_output_tokens == 10 for r in reqs)
    # the oldest, granted last, is the one that gives way
    assert reqs[0].num_preemptions >= 1 and reqs[2].num_preemptions == 0


class OneByOne(Sarathi):
    """Adds its decodes to the batch one at a time, as a plug-in may."""
    overrides = ("schedule_decodes",)

    def schedule_decodes(self, out, decodes):
        for r in decodes:
            if r.status is Status.RUNNING and self.allocate_or_preempt(r, 1, out):
                out.add(r, 1)


def test_decodes_added_one_by_one_are_counted_as_decodes():
    base = make_policy("sarathi", token_budget=8)
    p = OneByOne(base.cfg, base.kv)
    reqs = [req(0, 5, 4), req(1, 9, 6), req(2, 3, 2, t=0.02)]
    eng = Engine(p, LinearCost(), fast_forward=False)
    eng.run(reqs)
    it = iterations_table(eng.iterations())
    # no preemption, no prefix cache: each prompt once, then a decode per later token
    assert it["prefill_tokens"].sum() == 5 + 9 + 3
    assert it["decode_tokens"].sum() == 3 + 5 + 1


# -- errors ---------------------------------------------------------------------------------------
class FailingAdd(Sarathi):
    overrides = ("add_request",)
    def add_request(self, r):
        raise KeyError("lost")


class FailingExecutorAdd(LinearCost):
    def add_request(self, r, out_len):
        raise KeyError("lost")


class FailingUpdate(Sarathi):
    def update(self, out, step, start, end):
        raise KeyError("lost")


class FailingExecute(LinearCost):
    def execute(self, out):
        raise KeyError("lost")


@pytest.mark.parametrize("policy_cls,ex_cls,where", [
    (FailingUpdate, LinearCost, "test_mutants.FailingUpdate.update()"),
    (Sarathi, FailingExecute, "test_mutants.FailingExecute.execute()"),
    (FailingAdd, LinearCost, "test_mutants.FailingAdd.add_request()"),
    (Sarathi, FailingExecutorAdd, "test_mutants.FailingExecutorAdd.add_request()"),
])
def test_a_failing_plugin_hook_is_named(policy_cls, ex_cls, where):
    base = make_policy("sarathi")
    with pytest.raises(KeyError) as e:
        Engine(policy_cls(base.cfg, base.kv), ex_cls()).run([req(0, 4, 3)])
    assert e.value.args == (f"{where} at t=0.000s (iteration 0): 'lost'",)


class TwoArgs(Exception):
    def __init__(self, code, why):
        super().__init__(f"{code}: {why}")


class RaisesTwoArgs(Sarathi):
    def schedule(self, now):
        raise TwoArgs("E1", "bad state")


def test_a_plugin_exception_that_takes_other_arguments_is_named_too():
    base = make_policy("sarathi")
    p = RaisesTwoArgs(base.cfg, base.kv)
    with pytest.raises(RuntimeError, match=r"test_mutants\.RaisesTwoArgs\.schedule\(\) at "
                       r"t=0\.000s \(iteration 0\) raised TwoArgs: E1: bad state"):
        Engine(p, LinearCost()).run([req(0, 4, 3)])


def test_reading_the_true_output_length_names_the_policy():
    p = make_policy("sarathi")
    with pytest.raises(PermissionError) as e:
        p.oracle_output_len(req(0, 4, 3))
    assert str(e.value) == ("Sarathi read a request's true output length; only a policy that "
                            "declares `oracle = True` may (no real scheduler knows it)")


class NoDecodeSlots(Sarathi):
    """Schedules decodes without asking the KV manager for their slots."""
    overrides = ("schedule_decodes",)

    def schedule_decodes(self, out, decodes):
        out.add_decodes(decodes)


def test_a_decode_without_kv_slots_is_named_as_such():
    base = make_policy("sarathi", block_size=4)
    p = NoDecodeSlots(base.cfg, base.kv)
    # the prompt fills its one block; the first decode needs a second block (stepped: a
    # skipped run's batches are the engine's own, through advance_decodes, not this schedule)
    with pytest.raises(RuleViolation, match=r"'KV slots for every token' at iteration 1 "
                       r"\(t=0\.\d+s\): request 0 is given 1 tokens after 4 but holds KV "
                       r"slots for 4$"):
        Engine(p, LinearCost(), fast_forward=False).run([req(0, 4, 3)])


def _fails(policy, times, ended=()):
    raise ValueError(f"cannot skip {len(times)} steps")


class SkipFails(Sarathi):
    """Its fast-forward declaration's advance_decodes fails."""
    fast_forward = FastForward(steady_decode=Sarathi.fast_forward.steady_decode,
                               advance_decodes=_fails)


def test_a_failing_fast_forward_hook_is_named():
    base = make_policy("sarathi")
    p = SkipFails(base.cfg, base.kv)
    with pytest.raises(ValueError, match=r"^test_mutants\.SkipFails\.fast_forward\."
                       r"advance_decodes\(\) at t=0\.\d+s \(iteration 1\): cannot skip 9 steps$"):
        Engine(p, LinearCost()).run([req(0, 4, 10)])
