"""Speculative decoding: the shared accounting (settings, batch entries of 1 + k tokens, the
guard's rules, the engine's and the policy's update by 1 + accepted tokens, stops mid-way) and
the simulator's drafts, verification and acceptance models, checked by hand."""
import json

import pandas as pd
import pytest
from conftest import LinearCost, make_policy, req
from helpers import cli, composed

from sarathi_lab.cli.main import check_config
from sarathi_lab.engine import Engine
from sarathi_lab.engine.guard import RuleViolation
from sarathi_lab.executors.sim import SimExecutor
from sarathi_lab.request import Request
from sarathi_lab.schedulers.mechanics.preemption import speculative_lens
from sarathi_lab.schedulers.sarathi import Sarathi
from sarathi_lab.settings import ConfigError


class Scripted(LinearCost):
    """LinearCost that speculates: the target accepts the scripted number of drafts of each
    speculative entry, per request id, in order (then all of them)."""
    supports_speculation = True

    def __init__(self, script=None, **kw):
        super().__init__(**kw)
        self.script = {k: list(v) for k, v in (script or {}).items()}

    def execute(self, out):
        step = super().execute(out)
        if out.spec_lens:
            step.accepted = [min(s, self.script.get(r.request_id, []).pop(0))
                             if s and self.script.get(r.request_id) else s
                             for r, s in zip(out.reqs, out.spec_lens)]
        return step


def run(ex, reqs, fast_forward=True, **kw):
    p = make_policy("sarathi", **kw)
    e = Engine(p, ex, fast_forward=fast_forward)
    e.run(reqs)
    return p, e


def sim(model="mistral-7b", **spec):
    cfg = composed("executor=sim", f"model={model}")
    node = {**cfg["executor"], **spec}
    return SimExecutor.from_config(node, cfg["model"], cfg["hardware"])


# -- the shared accounting ----------------------------------------------------------------------

def test_accepted_tokens_advance_a_decode_and_a_stop_cuts_them():
    # prompt 4, output 7, k = 3: the first token comes with the prompt; then steps of
    # 1 + accepted tokens: 1 + 2 = 3 (4 out), 1 + 0 = 1 (5 out), 1 + 3 = 4 cut at 7 (2 dropped)
    r = req(0, 4, 7)
    p, e = run(Scripted({0: [2, 0, 3]}), [r], token_budget=64, num_speculative_tokens=3)
    assert r.num_output_tokens == 7 and r.finish_reason == "stop"
    assert len(r.token_times) == 7 and len(set(r.token_times)) == 4   # 4 emission events
    assert (r.spec_proposed, r.spec_accepted) == (9, 5)   # 3 steps of 3 drafts; 2 + 0 + 3
    assert e.num_iterations == 4 and not e.fast_forward   # speculation steps every iteration
    assert p.kv.num_used_blocks == 0 and p.kv.num_stored_tokens == 0
    cols = e.iteration_columns()
    assert cols["spec_proposed"].tolist() == [0, 3, 3, 3]
    assert cols["spec_accepted"].tolist() == [0, 2, 0, 3]
    assert cols["spec_tokens"].tolist() == [0, 3, 1, 2]
    assert cols["decode_tokens"].tolist() == [0, 4, 4, 4]   # 1 + k verified tokens each


def test_a_speculative_step_emits_the_planned_ids_it_keeps():
    # as above (steps of 3, 1 and 4 cut to 2 tokens), with the answer planned: the request's
    # output ids are exactly its planned ones, none of the 2 dropped past its stop
    planned = list(range(100, 107))
    r = Request(0, 0.0, 4, 7, prompt_token_ids=[1, 2, 3, 4], planned_output_ids=planned)
    run(Scripted({0: [2, 0, 3]}), [r], token_budget=64, num_speculative_tokens=3)
    assert r.output_token_ids == planned and r.all_token_ids() == [1, 2, 3, 4] + planned


def test_the_policy_counts_the_drafts_the_target_judged():
    # k = 3, accepted 2, 0, 3 (as above): judged 2 + 1 rejected, 0 + 1, 3 (none rejected) --
    # what a budget controller's View shows (slo_dp's acceptance estimate)
    p, _ = run(Scripted({0: [2, 0, 3]}), [req(0, 4, 7)], token_budget=64,
               num_speculative_tokens=3)
    assert (p.drafts_accepted, p.drafts_judged) == (5, 7)
    p = make_policy("sarathi", token_budget=64, num_speculative_tokens=3,
                    controller="plugins:Fraction")
    p.drafts_accepted, p.drafts_judged = 5, 7
    v = p.view(0.0)
    assert (v.drafts_accepted, v.drafts_judged) == (5, 7)


def test_rejected_drafts_release_their_kv_slots():
    # block_size 4, prompt 4: a step of 1 + 3 tokens needs slots 4..7 (a second block); none
    # accepted, the request holds 5 tokens, so 2 blocks, and 5 stored tokens, not 8
    r = req(0, 4, 20)
    p = make_policy("sarathi", token_budget=64, num_speculative_tokens=3)
    e = Engine(p, Scripted({0: [0, 0]}), fast_forward=False)
    e.add_request(r)
    e.advance()
    e.advance()
    assert (r.num_computed_tokens, r.num_output_tokens) == (5, 2)
    assert p.kv.num_stored_tokens == 5 and len(p.kv.block_table(r)) == 2
    e.advance()   # 6 computed: still 2 blocks; slots 6..9 were allocated, 3 given back
    assert p.kv.num_stored_tokens == 6 and len(p.kv.block_table(r)) == 2


def decoding(rid, computed, out, max_tokens=None):
    r = Request(rid, 0.0, computed + 1 - out, 100, max_tokens=max_tokens)
    r.num_computed_tokens, r.num_output_tokens = computed, out
    assert r.is_decoding
    return r


def test_drafts_fit_the_budget_max_tokens_and_max_model_len():
    # budget 8 for 3 decodes: 5 left after one token each, handed out in order; b's user cap
    # of 3 tokens leaves it 1 draft (1 out, +1 now, +1 draft); c's max_model_len of 64 after
    # 60 computed would leave 3, the budget leaves 1
    a, b, c = decoding(0, 10, 3), decoding(1, 10, 1, max_tokens=3), decoding(2, 60, 5)
    assert speculative_lens([a, b, c], 3, 8, 64) == [3, 1, 1]
    assert speculative_lens([a, b, c], 3, None, 62) == [3, 1, 1]   # c: 62 - 60 - 1 = 1
    assert speculative_lens([a, b, c], 3, 3, 64) == [0, 0, 0]      # the budget: 1 each
    # in a run: max_model_len 10 after 8 computed leaves 1 token and 1 draft
    cap = make_policy("sarathi", token_budget=64, num_speculative_tokens=3, max_model_len=10)
    e = Engine(cap, Scripted(), fast_forward=False)
    r = req(0, 8, 2)
    e.add_request(r)
    e.advance()
    out = e.advance().batch
    assert out.spec_lens == [1] and out.num_new_tokens == [2]


def test_the_guard_catches_abuse_of_speculative_entries():
    class TooMany(Sarathi):
        def schedule(self, now):
            out = super().schedule(now)
            if out.spec_lens:
                out.spec_lens[0] += 1
                out.num_new_tokens[0] += 1
            return out

    class OnAPrompt(Sarathi):
        def schedule(self, now):
            out = super().schedule(now)
            if out.reqs and not out.reqs[0].is_decoding:
                out.spec_lens = [2] + [0] * (len(out.reqs) - 1)
            return out

    for cls, rule in ((TooMany, "within scheduler.num_speculative_tokens"),
                      (OnAPrompt, "a speculative entry is a decode of 1 \\+ k tokens")):
        base = make_policy("sarathi", token_budget=64, num_speculative_tokens=2)
        with pytest.raises(RuleViolation, match=rule):
            Engine(cls(base.cfg, base.kv), Scripted(), fast_forward=False).run([req(0, 4, 9)])


def test_the_executor_must_speculate():
    p = make_policy("sarathi", token_budget=64, num_speculative_tokens=2)
    with pytest.raises(ConfigError, match="num_speculative_tokens=2.*LinearCost.*"
                                          "supports_speculation"):
        Engine(p, LinearCost())


# -- the simulator, by hand -----------------------------------------------------------------

def test_two_requests_by_hand_tokens_times_and_budget():
    """Budget 8, k = 3, geometric rates [1, 1, 0] (a step accepts 2 of 3 drafts), draft steps at
    0.2 of the target's decode step. A: prompt 8, output 6; B: prompt 12, output 2.
    1: A's prompt (8 tokens, first token).  2: A verifies 1 + 3 at context 8 (accepts 2: 3
    tokens out), B's first chunk of 4.  3: A verifies 1 + 3 at 11, accepts 2, but its stop at 6
    tokens cuts the 3 to 2; B's second chunk.  4: B's last chunk (first token).  5: B verifies
    1 + 3 at 12; its stop at 2 keeps 1 token of 3."""
    ex = sim(draft_cost_ratio=0.2, acceptance="geometric", acceptance_rates=[1.0, 1.0, 0.0])
    cm = ex.cost_model
    it = cm.iteration_time
    p = make_policy("sarathi", token_budget=8, num_speculative_tokens=3, block_size=4)
    e = Engine(p, ex, fast_forward=False)
    a, b = Request("A", 0.0, 8, 6), Request("B", 0.0, 12, 2)
    e.run([a, b])

    def draft(ctx):   # three draft steps of one decode at ctx, ctx + 1, ctx + 2
        return 0.2 * sum(it([], [ctx + j]) for j in range(3))

    # a verification of 1 + 3 tokens at context c: a 4-token chunk there, logits at all 4
    durs = [it([(8, 0)], [], 1),
            it([(4, 8), (4, 0)], [], 4) + draft(8),
            it([(4, 11), (4, 4)], [], 4) + draft(11),
            it([(4, 8)], [], 1),
            it([(4, 12)], [], 4) + draft(12)]
    cols = e.iteration_columns()
    assert cols["duration"].tolist() == pytest.approx(durs, rel=1e-12)
    ends = pd.Series(durs).cumsum().tolist()
    assert a.token_times == pytest.approx([ends[0]] + [ends[1]] * 3 + [ends[2]] * 2)
    assert b.token_times == pytest.approx([ends[3], ends[4]])
    assert (a.spec_proposed, a.spec_accepted, b.spec_proposed, b.spec_accepted) == (6, 4, 3, 2)
    # budget use: the verification tokens count as decode tokens, within the budget of 8
    assert cols["decode_tokens"].tolist() == [0, 4, 4, 0, 4]
    assert cols["prefill_tokens"].tolist() == [8, 4, 4, 4, 0]
    assert cols["spec_tokens"].tolist() == [0, 3, 2, 0, 1]


def ff_case(k, rate, fast_forward, n=12):
    ex = sim(draft_cost_ratio=0.1, acceptance_rate=rate) if k else sim()
    reqs = [Request(i, 0.0, 30 + 7 * i, 20 + 3 * i) for i in range(n)]
    # all at once and a budget no batch fills: the same batches with and without drafts
    p, e = run(ex, reqs, fast_forward=fast_forward, token_budget=4096,
               num_speculative_tokens=k)
    return reqs, e


def test_acceptance_one_finishes_in_a_fifth_of_the_steps():
    r = Request(0, 0.0, 16, 41)
    p, e = run(sim(draft_cost_ratio=0.1, acceptance_rate=1.0), [r], token_budget=64,
               num_speculative_tokens=4)
    # the prompt's step emits the first token; then 5 tokens a step: 40 in 8 steps, not 40
    assert e.num_iterations == 1 + 8 and r.num_output_tokens == 41
    assert (r.spec_proposed, r.spec_accepted) == (32, 32)


def test_acceptance_zero_is_plain_decoding_at_a_higher_cost():
    plain, e0 = ff_case(0, None, False)
    spec, e1 = ff_case(3, 0.0, False)
    assert [r.num_output_tokens for r in spec] == [r.num_output_tokens for r in plain]
    assert e1.num_iterations == e0.num_iterations
    d0, d1 = e0.iteration_columns()["duration"], e1.iteration_columns()["duration"]
    dec = e1.iteration_columns()["spec_steps"] > 0
    assert dec.any() and (d1[dec] > d0[dec]).all() and (d1[~dec] == d0[~dec]).all()
    assert sum(r.spec_accepted for r in spec) == 0


def test_fast_forward_is_off_with_speculation_and_changes_nothing():
    on, e_on = ff_case(3, 0.6, True)
    off, e_off = ff_case(3, 0.6, False)
    assert not e_on.fast_forward
    assert [r.token_times for r in on] == [r.token_times for r in off]


def test_acceptance_is_seeded_and_follows_the_rate():
    def accepted(seed, rate=0.6):
        reqs = [Request(i, 0.0, 20, 200) for i in range(8)]
        run(sim(draft_cost_ratio=0.1, acceptance_rate=rate, acceptance_seed=seed), reqs,
            token_budget=512, num_speculative_tokens=4)
        return [(r.spec_proposed, r.spec_accepted) for r in reqs]

    assert accepted(1) == accepted(1) != accepted(2)
    prop, acc = map(sum, zip(*accepted(3)))
    # i.i.d. drafts at p, leading successes: E[accepted] = p + p^2 + p^3 + p^4 of 4 proposed
    expect = sum(0.6 ** i for i in range(1, 5)) / 4
    assert acc / prop == pytest.approx(expect, abs=0.04)


def test_a_draft_preset_is_priced_by_the_roofline():
    ex = sim(draft="tiny-llama", acceptance_rate=0.5)
    from sarathi_lab.costmodels.roofline import RooflineCostModel
    draft = ex._spec.draft
    assert isinstance(draft, RooflineCostModel) and draft.model.num_layers == 2
    # the draft step at one decode is cheaper than the target's
    assert draft.iteration_time([], [100]) < ex.cost_model.iteration_time([], [100])
    with pytest.raises(ConfigError, match="executor.draft=nope: no such model preset"):
        sim(draft="nope", acceptance_rate=0.5)


def test_a_layers_draft_is_priced_as_the_target_cut_to_n_layers():
    """executor.draft=layers:N, as on the torch executor: the target's first N layers with its
    embedding, final norm and LM head, priced by the roofline: a decode step's time is the
    target's with N of its L layers' terms, the rest (LM head, overheads) unchanged."""
    ex = sim(draft="layers:8", draft_cost_ratio=None, acceptance_rate=0.5)
    d, t = ex._spec.draft, ex.cost_model
    assert d.model.num_layers == 8 and t.model.num_layers == 32
    assert d.model.hidden_size == t.model.hidden_size
    assert d.weight_bytes < t.weight_bytes
    # per-layer terms scale with the layers; what is outside them (LM head, overheads) does
    # not: t(L layers) - t(N layers) = (L - N) x one layer's time, for any batch
    one = (t.iteration_time([], [500, 900]) - d.iteration_time([], [500, 900])) / 24
    full = sim(draft="layers:32", acceptance_rate=0.5)._spec.draft
    assert full.iteration_time([], [500, 900]) == pytest.approx(
        t.iteration_time([], [500, 900]), rel=1e-12)   # all 32 layers: the target itself
    half = sim(draft="layers:16", acceptance_rate=0.5)._spec.draft
    assert half.iteration_time([], [500, 900]) == pytest.approx(
        d.iteration_time([], [500, 900]) + 8 * one, rel=1e-9)
    for bad, match in (("layers:33", "executor.draft=layers:33: model 'mistral-7b' has 32 "
                                     "layers; the draft takes its first N, 1 <= N <= 32"),
                       ("layers:0", "expected layers:N with N >= 1")):
        with pytest.raises(ConfigError, match=match):
            ov = ["scheduler.num_speculative_tokens=2", f"executor.draft={bad}",
                  "executor.acceptance_rate=0.5"]
            check_config(composed(*ov), ov)


def test_the_predictor_prices_a_speculating_batch_as_the_simulator_does():
    """A budget controller's predictor with spec_len=k prices the draft's k steps and the
    verification of 1 + k tokens per decode: what the executor then charges for that batch."""
    for draft in ({"draft_cost_ratio": 0.3}, {"draft": "layers:4"}):
        ex = sim(**draft, acceptance_rate=0.5)
        p = make_policy("sarathi", token_budget=64, num_speculative_tokens=2, block_size=4)
        e = Engine(p, ex, fast_forward=False)
        for r in (Request(0, 0.0, 9, 50), Request(1, 0.0, 5, 50)):
            e.add_request(r)
        e.advance()   # both prompts: each decodes next
        a, b = p.running
        ctx = [a.num_computed_tokens, b.num_computed_tokens]
        predicted = ex.predictor()([], ctx, spec_len=2)
        out = e.advance().batch
        assert out.spec_lens == [2, 2]
        assert e.iteration_columns()["duration"].tolist()[-1] == pytest.approx(predicted,
                                                                                rel=1e-12)
        # and the draft is in it: more than the verification alone
        assert predicted > ex.cost_model.iteration_time([(3, c) for c in ctx], [], 6)
        assert ex.predictor()([], ctx) == ex.cost_model.iteration_time([], ctx)


def test_rates_from_a_trace_column(tmp_path):
    path = tmp_path / "t.csv"
    pd.DataFrame({"arrived_at": [0.0, 0.0], "num_prefill_tokens": [16, 16],
                  "num_decode_tokens": [60, 60], "acceptance_rate": [1.0, 0.0]}
                 ).to_csv(path, index=False)
    out = tmp_path / "run"
    res = cli(f"trace.path={path}", "scheduler.num_speculative_tokens=3",
              "executor.draft_cost_ratio=0.1", "executor.acceptance=trace", "progress=false",
              f"hydra.run.dir={out}")
    assert res.returncode == 0, res.stderr[-3000:]
    df = pd.read_parquet(out / "requests.parquet")
    # request 0 accepts every draft (4 tokens a step), request 1 none
    assert df["spec_accepted"].tolist()[1] == 0
    assert df["spec_accepted"].tolist()[0] == df["spec_proposed"].tolist()[0] > 0


# -- settings and the command line ----------------------------------------------------------

@pytest.mark.parametrize("overrides, match", [
    (["executor.acceptance_rate=0.5"], "executor.acceptance_rate: read only with "
                                       "scheduler.num_speculative_tokens > 0"),
    (["executor.draft_cost_ratio=0.5"], "executor.draft_cost_ratio: read only with"),
    (["scheduler.num_speculative_tokens=2", "executor.acceptance_rate=0.5"],
     "set one of executor.draft .* or executor.draft_cost_ratio"),
    (["scheduler.num_speculative_tokens=2", "executor.draft_cost_ratio=0.5"],
     "executor.acceptance=fixed: set executor.acceptance_rate"),
    (["scheduler.num_speculative_tokens=3", "executor.draft_cost_ratio=0.5",
      "executor.acceptance=geometric", "executor.acceptance_rates=[0.9,0.8]"],
     "2 rates for scheduler.num_speculative_tokens=3"),
    (["scheduler.num_speculative_tokens=2", "executor.draft_cost_ratio=0.5",
      "executor.acceptance_rate=0.5", "executor.acceptance=geometric"],
     "executor.acceptance_rate=0.5: read only with executor.acceptance=fixed"),
    (["scheduler.num_speculative_tokens=2", "+executor.draft_model=llama-3.2-1b",
      "executor.acceptance_rate=0.5"], "executor.draft_model: renamed; set executor.draft "
                                       "\\(layers:N"),
    (["scheduler.num_speculative_tokens=2", "executor.draft=layers:2",
      "executor.acceptance_rate=0.5", "scheduler.controller=slo_dp",
      "+scheduler.acceptance_rate=0.5"],
     "scheduler.acceptance_rate: renamed; set scheduler.assumed_acceptance \\(slo_dp's prior"),
    (["scheduler.controller=slo_dp", "scheduler.assumed_acceptance=0.5"],
     "scheduler.assumed_acceptance: read only with scheduler.num_speculative_tokens > 0"),
    (["scheduler.num_speculative_tokens=2", "executor.draft_cost_ratio=0.5",
      "executor.acceptance_rate=0.5", "scheduler.controller=slo_dp",
      "scheduler.learn_acceptance=false", "scheduler.acceptance_prior_drafts=10"],
     "acceptance_prior_drafts=10: read only with learn_acceptance=true"),
    (["scheduler=orca", "scheduler.num_speculative_tokens=2", "executor.draft_cost_ratio=0.5",
      "executor.acceptance_rate=0.5"], "does not schedule speculative decodes"),
    (["executor=custom", "executor.name=plugins:FixedStep", "+executor.step_s=0.5",
      "scheduler.num_speculative_tokens=2"],
     "num_speculative_tokens=2: executor FixedStep does not run speculative decodes"),
    (["scheduler.num_speculative_tokens=2", "scheduler.enable_prefix_caching=true",
      "executor.draft_cost_ratio=0.5", "executor.acceptance_rate=0.5"],
     "not implemented with prefix caching"),
])
def test_settings_without_their_use_are_errors(overrides, match):
    with pytest.raises(ConfigError, match=match):
        check_config(composed(*overrides), overrides)


@pytest.mark.parametrize("args, message", [
    (["scheduler.num_speculative_tokens=2", "executor.draft_model=llama-3.2-1b"],
     "executor.draft_model: renamed; set executor.draft (layers:N, the target's first N "
     "layers, or a model preset; as the torch executor's)"),
    (["scheduler.controller=slo_dp", "scheduler.acceptance_rate=0.7"],
     "scheduler.acceptance_rate: renamed; set scheduler.assumed_acceptance (slo_dp's prior of "
     "the acceptance it plans with; the simulator's true rate is executor.acceptance_rate)"),
])
def test_an_old_name_fails_naming_the_new_one_before_any_run(args, message, tmp_path):
    out = tmp_path / "run"
    res = cli(*args, f"hydra.run.dir={out}")
    assert res.returncode != 0
    assert f"sarathi-lab: error: {message}" in res.stderr
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-llama", "mistral-7b"])
def test_cli_runs_with_speculation(model, tmp_path):
    out = tmp_path / "run"
    res = cli(f"model={model}", "trace.num_requests=40", "scheduler.num_speculative_tokens=3",
              "executor.draft_cost_ratio=0.1", "executor.acceptance_rate=0.7", "progress=false",
              f"hydra.run.dir={out}")
    assert res.returncode == 0, res.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    sp = s["speculation"]
    assert set(sp) == {"proposed", "accepted", "acceptance_rate", "steps", "tokens_per_step",
                       "drafts_per_step"}
    assert 0 < sp["acceptance_rate"] < 1 and 1 < sp["tokens_per_step"] <= 4
    assert "speculation:" in res.stdout
    it = pd.read_parquet(out / "iterations.parquet")
    assert int(it["spec_proposed"].sum()) == sp["proposed"]
    df = pd.read_parquet(out / "requests.parquet")
    assert int(df["spec_accepted"].sum()) == sp["accepted"]


def test_an_executor_that_emits_more_than_it_computed_is_stopped():
    class Greedy(Scripted):
        def execute(self, out):
            step = super().execute(out)
            if step.accepted is not None:   # claims one token more than 1 + accepted
                step.emitted = [1 + a + 1 for a in step.accepted]
                step.finished = []
            return step

    with pytest.raises(ValueError, match="Greedy.execute.*StepResult.emitted=.*at most 1 \\+ "
                                         "its accepted drafts"):
        run(Greedy({0: [1]}), [req(0, 4, 20)], token_budget=64, num_speculative_tokens=2)


def test_the_summary_s_speculation_figures_by_hand():
    """The scenario of `test_two_requests_by_hand_tokens_times_and_budget`: three speculative
    steps of k = 3 drafts, each accepting 2 (rates [1, 1, 0]). Proposed 3 + 3 + 3 = 9, accepted
    2 + 2 + 2 = 6 (B's 2 past its end count: they measure the draft): acceptance_rate 6 / 9.
    Emitted 3 (A), 2 (A's stop cuts 3 to 2), 1 (B's stop keeps 1 of 3): tokens_per_step
    (3 + 2 + 1) / 3 = 2, drafts_per_step 9 / 3 = 3 -- not the 1 + accepted / steps = 3 that
    ignores the stops, nor the accepted / judged of the controller's estimate."""
    from sarathi_lab.metrics.summary import summarize
    from sarathi_lab.metrics.tables import requests_table
    ex = sim(draft_cost_ratio=0.2, acceptance="geometric", acceptance_rates=[1.0, 1.0, 0.0])
    p = make_policy("sarathi", token_budget=8, num_speculative_tokens=3, block_size=4)
    e = Engine(p, ex, fast_forward=False)
    reqs = [Request("A", 0.0, 8, 6), Request("B", 0.0, 12, 2)]
    e.run(reqs)
    s = summarize(requests_table(reqs), pd.DataFrame(e.iteration_columns()))["speculation"]
    assert s == {"proposed": 9, "accepted": 6, "acceptance_rate": pytest.approx(6 / 9),
                 "steps": 3, "tokens_per_step": 2.0, "drafts_per_step": 3.0}
    # acceptance 1: every step keeps its 4 drafts, 5 tokens a step: 41 tokens = the prompt
    # step's 1 + 8 steps of 5
    r = Request(0, 0.0, 16, 41)
    e = run(sim(draft_cost_ratio=0.1, acceptance_rate=1.0), [r], token_budget=64,
            num_speculative_tokens=4)[1]
    s = summarize(requests_table([r]), pd.DataFrame(e.iteration_columns()))["speculation"]
    assert (s["acceptance_rate"], s["steps"], s["tokens_per_step"]) == (1.0, 8, 5.0)
