"""Budget controllers (issue 25, items 1 and 2): each built-in's choice checked by hand on a small
scenario, the contract's errors, `static` equal to the policy without a controller, relegation
recorded and served, and the CLI with each controller and a plug-in by dotted path."""
import math

import pandas as pd
import pytest
from conftest import LinearCost, make_policy
from helpers import cli, composed

from sarathi_lab.engine import Engine
from sarathi_lab.metrics.tables import requests_table
from sarathi_lab.request import Request
from sarathi_lab.run.config import resolve
from sarathi_lab.schedulers.controllers.base import DecodeView, PromptView, View
from sarathi_lab.schedulers.controllers.slack import Slack
from sarathi_lab.schedulers.controllers.slo_dp import SLODP, SLODPConfig, expected_tokens
from sarathi_lab.schedulers.controllers.targets import TargetConfig
from sarathi_lab.schedulers.controllers.tbt_target import TBTTarget
from sarathi_lab.settings import ConfigError

NOW = 10.0


def decode(i, ctx=1000, tbt=0.05, last=None):
    return DecodeView(f"d{i}", ctx, tbt, last, "default", 0)


def prompt(i, left, ctx=0, deadline=None, priority=0, relegated=False):
    return PromptView(f"p{i}", left, ctx, 0.0, deadline, "default", priority, relegated)


def view(decodes=(), prefills=(), waiting=(), cap=512, spec=0):
    return View(NOW, tuple(decodes), tuple(prefills), tuple(waiting), cap, spec)


def context_aware(prefills, decodes):
    """10 ms + 0.13 ms per prompt token + 0.1 us per prompt token per token of its context
    + 1 us per token of each decode's context."""
    return (0.01 + sum(1.3e-4 * n + 1e-7 * n * c for n, c in prefills)
            + 1e-6 * sum(decodes))


# -- tbt_target ---------------------------------------------------------------------------------

def test_tbt_target_takes_the_largest_chunk_inside_the_tightest_target():
    # decodes: contexts 1000 + 1000 -> 2 ms; targets 50 and 40 ms -> 40 ms binds.
    # a prompt at context 2000: t(P) = 0.012 + P * (1.3e-4 + 2e-4) <= 0.04 -> P <= 84.8 -> 84,
    # budget = 2 decodes + 84 = 86
    ctl = TBTTarget(TargetConfig())
    v = view([decode(0), decode(1, tbt=0.04)], [prompt(0, 1000, ctx=2000)])
    assert ctl.decide(v, context_aware).token_budget == 86
    # the same prompt at context 0 (context-aware: its chunk may be larger): t(P) = 0.012 +
    # 1.3e-4 P <= 0.04 -> P <= 215.4 -> 215, budget 217
    v = view([decode(0), decode(1, tbt=0.04)], [prompt(0, 1000, ctx=0)])
    assert ctl.decide(v, context_aware).token_budget == 217
    # the controller's own target replaces the SLO's: 30 ms -> P <= (0.018 / 1.3e-4) = 138.5
    ctl = TBTTarget(TargetConfig(target_tbt_s=0.03))
    assert ctl.decide(v, context_aware).token_budget == 2 + 138


def test_tbt_target_keeps_min_chunk_when_the_decodes_alone_break_the_target():
    # 20 decodes at context 2000: 0.01 + 20 * 2000 * 1e-6 = 50 ms > 40 ms, with no chunk at
    # all: the budget is the decodes + min_chunk (16) = 36
    ctl = TBTTarget(TargetConfig())
    v = view([decode(i, ctx=2000, tbt=0.04) for i in range(20)], [prompt(0, 1000)])
    assert ctl.decide(v, context_aware).token_budget == 36
    # no decodes: nothing to protect, the cap
    assert ctl.decide(view([], [prompt(0, 1000)]), context_aware).token_budget == 512


def test_a_decode_without_a_target_constrains_nothing_and_a_run_without_any_is_an_error():
    # d0's class has no TBT target (a batch class): only d1's 40 ms binds -> 86 as above;
    # with d0 alone, nothing binds: the cap
    ctl = TBTTarget(TargetConfig())
    v = view([decode(0, tbt=None), decode(1, tbt=0.04)], [prompt(0, 1000, ctx=2000)])
    assert ctl.decide(v, context_aware).token_budget == 86
    v = view([decode(0, tbt=None)], [prompt(0, 1000, ctx=2000)])
    assert ctl.decide(v, context_aware).token_budget == 512
    # no SLO with a TBT target and no scheduler.target_tbt_s: refused before the run
    p = make_policy("sarathi", controller="slack")
    with pytest.raises(ConfigError, match="controller=slack: no request has a TBT target to keep; set "
                                          "scheduler.target_tbt_s"):
        p.bind_predictor(context_aware, None)
    make_policy("sarathi", controller="slack", target_tbt_s=0.1).bind_predictor(context_aware)


# -- slack --------------------------------------------------------------------------------------

def test_slack_sizes_the_chunk_by_the_tightest_decode_slack_orders_by_class_and_relegates():
    # decode d0: last token at 9.99, target 50 ms -> due 10.04, slack 40 ms; d1: 9.95 + 0.1
    # -> slack 100 ms. The tightest, 40 ms, sizes the chunk.
    # prompts under way: p0 class 1; p1 class 0 deadline 12; p2 class 0 deadline 11 -> order
    # p2, p1, p0 (class, then least deadline slack).
    # p2 (context 2000) gets the chunk: t(P) = 0.012 + 3.3e-4 P <= 0.04 -> P = 84, budget 86.
    # waiting: w3, 4000 tokens due at 10.3: alone in one iteration 0.01 + 1.3e-4 * 4000 =
    # 0.53 s -> 10.53 > 10.3: relegated; w4, 100 tokens due at 10.3: 23 ms, kept.
    v = view([decode(0, last=9.99), decode(1, tbt=0.1, last=9.95)],
             [prompt(0, 500, ctx=100, priority=1), prompt(1, 500, ctx=0, deadline=12.0),
              prompt(2, 1000, ctx=2000, deadline=11.0)],
             [prompt(3, 4000, deadline=10.3), prompt(4, 100, deadline=10.3)])
    d = Slack(TargetConfig()).decide(v, context_aware)
    assert d.prefill_order == ("p2", "p1", "p0")
    assert d.relegate == ("p3",)
    assert d.token_budget == 86


# -- slo_dp -------------------------------------------------------------------------------------

def flat(prefills, decodes):
    """10 ms + 0.1 ms per prompt token + 1 us per token of each decode's context."""
    return 0.01 + 1e-4 * sum(n for n, _ in prefills) + 1e-6 * sum(decodes)


def test_slo_dp_chooses_the_chunk_meeting_the_most_slos_over_its_horizon():
    # 2 decodes at context 1000 (2 ms), target 30 ms; a waiting prompt of 300 tokens due in
    # 0.2 s; horizon 2. Candidates (t = 0.012 + 1e-4 * chunk):
    #   chunk   0: budget   2, t 12 ms: decodes met 2; the prompt gets nothing    -> 2
    #   chunk 100: budget 102, t 22 ms: decodes 2; prompt needs 3 iterations > 2 -> 2
    #   chunk 150: budget 152, t 27 ms: decodes 2; prompt done in 2 (54 ms)      -> 3
    #   chunk 400: budget 402, t 52 ms: decodes 0; prompt in 1 (52 ms)           -> 1
    v = view([decode(0, tbt=0.03), decode(1, tbt=0.03)], [], [prompt(0, 300, deadline=NOW + 0.2)])
    cfg = SLODPConfig(horizon=2, chunk_sizes=[0, 100, 150, 400])
    assert SLODP(cfg).decide(v, flat).token_budget == 152
    # a 25 ms target: chunk 150 (27 ms) misses both decodes (1 met); 100 keeps them (2), and
    # beats chunk 0 (also 2) on tokens per second (102 / 0.022 against 2 / 0.012)
    v = view([decode(0, tbt=0.025), decode(1, tbt=0.025)], [],
             [prompt(0, 300, deadline=NOW + 0.2)])
    assert SLODP(cfg).decide(v, flat).token_budget == 102


def test_slo_dp_chooses_the_speculation_length():
    # 2 decodes, target 20 ms, t = 10 ms + 1 ms per token in the batch (no prompts, chunk 0):
    #   k = 0: 2 tokens, 12 ms, 1 token a step             -> 2 / 0.012   = 167 tokens/s
    #   k = 1: 4 tokens, 14 ms, 1.5 tokens (a = 0.5)       -> 3 / 0.014   = 214
    #   k = 2: 6 tokens, 16 ms, 1.75 tokens                -> 3.5 / 0.016 = 219
    # every candidate meets both decodes' TBT: the fastest, k = 2 (budget 6), wins
    # (a free draft: see the next test for one that costs)
    def per_token(prefills, decodes, spec_len=0):
        return 0.01 + 1e-3 * (sum(n for n, _ in prefills) + len(decodes) * (1 + spec_len))
    assert expected_tokens(2, 0.5) == 1.75
    v = view([decode(0, tbt=0.02), decode(1, tbt=0.02)], spec=2)
    d = SLODP(SLODPConfig(chunk_sizes=[0], assumed_acceptance=0.5)).decide(v, per_token)
    assert (d.token_budget, d.spec_len) == (6, 2)
    # acceptance 0.1: k = 1 gives 2.2 / 0.014 = 157, k = 2 2.22 / 0.016 = 139: k = 0 (167)
    d = SLODP(SLODPConfig(chunk_sizes=[0], assumed_acceptance=0.1)).decide(v, per_token)
    assert (d.token_budget, d.spec_len) == (2, 0)
    # the default chunk sizes (up to 2048) with no prompt waiting: a chunk counts only the
    # prompt tokens there are (none), so k = 2 still wins (found by experiments/speculation:
    # 2048 phantom tokens made k = 0 the fastest and slo_dp never speculated)
    d = SLODP(SLODPConfig(assumed_acceptance=0.5)).decide(v, per_token)
    assert (d.token_budget, d.spec_len) == (6, 2)
    # a 3-token prompt waiting: every chunk > 0 holds its 3 tokens and no more: k = 0 gives
    # (3 + 2) / 0.015 = 333 tokens/s, k = 1 (3 + 3) / 0.017 = 353, k = 2 (3 + 3.5) / 0.019 = 342:
    # k = 1, budget 2 * 2 + 3
    v = view([decode(0, tbt=0.02), decode(1, tbt=0.02)], [], [prompt(0, 3)], spec=2)
    d = SLODP(SLODPConfig(assumed_acceptance=0.5)).decide(v, per_token)
    assert (d.token_budget, d.spec_len) == (7, 1)
    # without speculation (the run's num_speculative_tokens 0) no spec_len is returned
    d = SLODP(SLODPConfig(chunk_sizes=[0])).decide(view([decode(0)]), per_token)
    assert d.spec_len is None


def test_slo_dp_prices_the_draft_steps_and_then_does_not_speculate():
    # as above (2 decodes, target 20 ms, 10 ms + 1 ms per verified token, a = 0.5: free drafts
    # make k = 2 the fastest), but each of the draft's k steps costs 8 ms, as the predictor
    # prices a speculating batch (spec_len=k: the draft's steps and the verification):
    #   k = 0: 12 ms                  -> 2 / 0.012   = 167 tokens/s
    #   k = 1: 14 + 8 = 22 ms         -> 3 / 0.022   = 136
    #   k = 2: 16 + 16 = 32 ms        -> 3.5 / 0.032 = 109 (and 18.3 ms a token: met)
    # so k = 0 wins; priced without its draft (verification only), k = 2 would
    calls = []

    def with_draft(prefills, decodes, spec_len=0):
        calls.append(spec_len)
        return (0.01 + 1e-3 * (sum(n for n, _ in prefills) + len(decodes) * (1 + spec_len))
                + 0.008 * spec_len)
    v = view([decode(0, tbt=0.02), decode(1, tbt=0.02)], spec=2)
    d = SLODP(SLODPConfig(chunk_sizes=[0], assumed_acceptance=0.5)).decide(v, with_draft)
    assert (d.token_budget, d.spec_len) == (2, 0)
    assert sorted(set(calls)) == [0, 1, 2]   # each k priced with its drafts
    # a 2 ms draft step: k = 1 16 ms -> 188, k = 2 20 ms -> 175: k = 1
    def cheap(prefills, decodes, spec_len=0):
        return with_draft(prefills, decodes, spec_len) - 0.006 * spec_len
    d = SLODP(SLODPConfig(chunk_sizes=[0], assumed_acceptance=0.5)).decide(v, cheap)
    assert (d.token_budget, d.spec_len) == (4, 1)


def test_slo_dp_learns_the_acceptance_from_the_drafts_judged():
    # the prior 0.5 worth 10 judged drafts; 90 judged, 81 accepted: a = (5 + 81) / 100 = 0.86
    ctl = SLODP(SLODPConfig(assumed_acceptance=0.5, acceptance_prior_drafts=10))
    seen = View(NOW, (), (), (), 512, 2, drafts_accepted=81, drafts_judged=90)
    assert ctl.acceptance(seen) == pytest.approx(0.86)
    assert ctl.acceptance(view(spec=2)) == 0.5   # nothing judged yet: the prior
    # learn_acceptance=false: never learn; a weight of 0: the observed rate
    assert SLODP(SLODPConfig(assumed_acceptance=0.5, learn_acceptance=False)
                 ).acceptance(seen) == 0.5
    assert SLODP(SLODPConfig(acceptance_prior_drafts=0)).acceptance(seen) == pytest.approx(0.9)
    # and it decides with it: with a = 0.1 assumed k = 0 wins (the previous test's numbers,
    # free drafts); the same prior after 90 of 100 judged drafts accepted speculates
    def per_token(prefills, decodes, spec_len=0):
        return 0.01 + 1e-3 * (sum(n for n, _ in prefills) + len(decodes) * (1 + spec_len))
    cfg = SLODPConfig(chunk_sizes=[0], assumed_acceptance=0.1, acceptance_prior_drafts=10)
    decs = (decode(0, tbt=0.02), decode(1, tbt=0.02))
    assert SLODP(cfg).decide(View(NOW, decs, (), (), 512, 2), per_token).spec_len == 0
    learnt = View(NOW, decs, (), (), 512, 2, drafts_accepted=90, drafts_judged=100)
    assert SLODP(cfg).decide(learnt, per_token).spec_len == 2   # a = 91 / 110 = 0.83


# -- the contract, in a policy ------------------------------------------------------------------

def _linear(prefills, decodes):
    # the LinearCost executor's price (base 10 ms, 1 ms per token)
    return 0.01 + 0.001 * (sum(n for n, _ in prefills) + len(decodes))


@pytest.mark.parametrize("plugin, rule", [("plugins:ZeroBudget", "1 <= budget"),
                                          ("plugins:ReturnsInt", "not a Decision")])
def test_a_decision_that_breaks_the_contract_names_the_controller(plugin, rule):
    p = make_policy("sarathi", token_budget=64, controller=plugin)
    p.bind_predictor(_linear)
    eng = Engine(p, LinearCost(), fast_forward=False)
    eng.add_request(Request(0, 0.0, 20, 2))
    with pytest.raises(ValueError, match=f"controller {plugin}: .*{rule}"):
        eng.advance()


def test_the_oracle_without_a_cost_model_is_an_error_naming_the_setting():
    p = make_policy("sarathi", controller="tbt_target", predictor="oracle", target_tbt_s=0.1)
    with pytest.raises(ConfigError, match="scheduler.predictor=oracle .*controller=tbt_target.*"
                                          "use scheduler.predictor=learned"):
        p.bind_predictor(None)
    make_policy("sarathi", controller="plugins:Fraction").bind_predictor(None)   # needs none
    # the learned one (the default) needs no cost model: it learns from the executed steps
    make_policy("sarathi", controller="tbt_target", target_tbt_s=0.1).bind_predictor(None)
    # and before any run directory or model: the executor class offers none
    ov = ["executor=torch", "model=tiny-llama", "scheduler.controller=slo_dp",
          "scheduler.predictor=oracle"]
    with pytest.raises(ConfigError, match="scheduler.predictor=oracle .scheduler.controller="
                                          "slo_dp.: needs a predictor.*executor 'torch' offers "
                                          "none"):
        resolve(composed(*ov), ov)
    resolve(composed(*ov[:3]), ov[:3])   # learned: any executor
    # the learned one's settings are unread with the oracle
    ov = ["scheduler.controller=tbt_target", "scheduler.predictor=oracle",
          "scheduler.predictor_quantile=0.9"]
    with pytest.raises(ConfigError, match="predictor_quantile=0.9: read only with "
                                          "predictor=learned"):
        resolve(composed(*ov), ov)
    ov = ["scheduler.controller=slack", "scheduler.predictor=exact"]
    with pytest.raises(ConfigError, match="scheduler.predictor"):
        resolve(composed(*ov), ov)


def test_config_errors_unknown_controller_unread_and_misplaced_settings():
    with pytest.raises(ConfigError, match="scheduler.controller: unknown controller 'nope'"):
        resolve(composed("scheduler.controller=nope"), ["scheduler.controller=nope"])
    ov = ["scheduler.controller=tbt_target", "scheduler.horizon=3"]   # slo_dp's, not tbt_target's
    with pytest.raises(ConfigError, match="scheduler.horizon: not a setting of policy 'sarathi' "
                                          "nor of its controller 'tbt_target'"):
        resolve(composed(*ov), ov)
    ov = ["scheduler=vllm", "scheduler.controller=tbt_target"]   # vllm takes no budget
    with pytest.raises(ConfigError, match="scheduler.controller"):
        resolve(composed(*ov), ov)
    ov = ["scheduler.min_chunk=8"]   # static reads no controller setting
    with pytest.raises(ConfigError, match="scheduler.min_chunk: not a setting"):
        resolve(composed(*ov), ov)
    with pytest.raises(ConfigError, match="scheduler.horizon=0: must be >= 1"):
        ov = ["scheduler.controller=slo_dp", "scheduler.horizon=0"]
        resolve(composed(*ov), ov)


def test_a_relegating_controller_is_refused_by_a_policy_that_orders_its_own_queue():
    with pytest.raises(ValueError, match="controller=slack relegates.*'edf'"):
        make_policy("edf", controller="slack")
    # a budget-only controller is consulted by the ranked policies too, stepped
    p = make_policy("vtc", controller="tbt_target")
    assert p.controller is not None and p.fast_forward is None
    assert make_policy("vtc").fast_forward is not None   # static keeps fast-forward


def test_relegated_requests_are_served_after_the_others_and_recorded():
    # budget 64, no decodes at first: r0 (40 tokens) and then 24 tokens for the next in line.
    # r1 (500 tokens, due at 0.2 s) cannot make it even alone (0.01 + 0.5 s > 0.2): relegated at
    # t = 0, so r2 (arrived after it) gets those 24 tokens and its first token before r1's
    reqs = [Request(0, 0.0, 40, 3, deadline=1.0), Request(1, 0.0, 500, 2, deadline=0.2),
            Request(2, 0.0, 40, 3, deadline=1.0)]
    p = make_policy("sarathi", token_budget=64, controller="slack", target_tbt_s=0.05,
                    max_model_len=1024, predictor="oracle")   # priced as the executor does
    p.bind_predictor(_linear)
    eng = Engine(p, LinearCost(), fast_forward=False)
    eng.run(reqs)
    df = requests_table(reqs).set_index("request_id")
    assert (df["status"] == "finished").all()   # relegated, not dropped
    assert df.loc[1, "relegated_at"] == 0.0
    assert df[["relegated_at"]].drop(1).isna().all().all()
    assert df.loc[2, "first_token_time"] < df.loc[1, "first_token_time"]
    # without the controller r1 goes before r2 (FCFS)
    reqs2 = [Request(r.request_id, 0.0, r.num_prompt_tokens, n, deadline=r.deadline)
             for r, n in zip(reqs, (3, 2, 3))]
    p = make_policy("sarathi", token_budget=64, max_model_len=1024)
    Engine(p, LinearCost(), fast_forward=False).run(reqs2)
    df2 = requests_table(reqs2).set_index("request_id")
    assert "relegated_at" not in df2
    assert df2.loc[1, "first_scheduled_time"] == 0.0 < df2.loc[2, "first_scheduled_time"]


# -- static = the policy as it was; runs from the command line ----------------------------------

SMALL = ["trace=sharegpt", "trace.num_requests=40", "trace.qps=6", "progress=false", "seed=2"]


@pytest.mark.parametrize("policy", ["sarathi", "edf", "vtc"])
def test_static_equals_a_controller_consulted_every_iteration_that_returns_the_cap(
        policy, tmp_path):
    """`static` (not consulted, fast-forward on) and a plug-in returning token_budget each
    iteration (consulted, stepped) give the same requests and iterations, value for value."""
    from sarathi_lab.run.runner import run
    tables = {}
    for ctl in ("static", "plugins:FullBudget"):
        ov = [f"scheduler={policy}", f"scheduler.controller={ctl}", *SMALL]
        run(composed(*ov), tmp_path / ctl.replace(":", "_"))
        tables[ctl] = [pd.read_parquet(tmp_path / ctl.replace(":", "_") / f)
                       for f in ("requests.parquet", "iterations.parquet")]
    for a, b in zip(tables["static"], tables["plugins:FullBudget"]):
        pd.testing.assert_frame_equal(a, b, check_exact=True)


@pytest.mark.slow
@pytest.mark.parametrize("ctl", ["static", "tbt_target", "slack", "slo_dp", "plugins:Fraction"])
def test_each_controller_runs_from_the_cli(ctl, tmp_path):
    """tiny-llama on the simulator, a tight TBT target: every controller's batches stay within
    token_budget, and the adaptive ones keep the TBT the static budget breaks."""
    extra = ["+scheduler.divisor=4"] if ctl.startswith("plugins") else \
        [] if ctl == "static" else ["scheduler.target_tbt_s=0.004"]
    r = cli("model=tiny-llama", "executor=sim", "hardware=a100-80gb", "trace.num_requests=30",
            "trace.qps=40", "scheduler.token_budget=256", f"scheduler.controller={ctl}",
            *extra, "progress=false", "name=ctl", f"results_root={tmp_path}", cwd=tmp_path,
            timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    run_dir = next(tmp_path.glob("runs/*/requests.parquet")).parent
    it = pd.read_parquet(run_dir / "iterations.parquet")
    tokens = it["prefill_tokens"] + it["decode_tokens"]
    assert tokens.max() <= 256
    if ctl == "plugins:Fraction":
        assert tokens.max() <= 64
    # iterations with decodes and more than min_chunk prompt tokens beside them
    busy = it[(it["decode_tokens"] > 0) & (it["prefill_tokens"] > 16)]
    assert len(busy) > 100
    if ctl == "static":   # the fixed budget breaks 4 ms (4.5 ms measured when written) ...
        assert busy["duration"].max() > 0.004
    if ctl in ("tbt_target", "slack"):   # ... the adaptive ones keep it
        assert (busy["duration"] <= 0.004 + 1e-12).all()
    assert math.isfinite(pd.read_parquet(run_dir / "requests.parquet")["ttft"].max())


def test_the_view_shows_contexts_targets_and_deadlines_from_the_slo():
    from sarathi_lab.run.settings import SLOConfig
    from sarathi_lab.settings import parse
    slo = parse(SLOConfig, {"ttft": 2.0, "request_p99_tbt": 0.1,
                            "classes": {"chat": {"ttft": 0.5, "tpot": 0.03}}}, "slo")
    p = make_policy("sarathi", token_budget=32, controller="plugins:FullBudget",
                    max_model_len=1024)
    p.bind_predictor(_linear, slo)
    eng = Engine(p, LinearCost(), fast_forward=False)
    eng.add_request(Request(0, 0.0, 20, 5))                               # decodes after step 1
    eng.add_request(Request(1, 0.0, 40, 5, slo_class="chat"))             # 12 of 40 in step 1
    eng.add_request(Request(2, 0.0, 10, 5, deadline=0.7))                 # waits
    eng.advance()   # 20 + 12 tokens: t = 0.01 + 0.032 = 0.042
    v = p.view(eng.now)
    assert v.now == pytest.approx(0.042) and v.max_budget == 32 and v.max_spec_len == 0
    (d,) = v.decodes
    assert (d.request_id, d.context, d.tbt_target, d.last_token_time) == (0, 20, 0.1, v.now)
    (pre,) = v.prefills
    # class chat: its own TTFT (0.5 s after arrival) and TBT (its tpot)
    assert (pre.request_id, pre.left, pre.context, pre.deadline) == (1, 28, 12, 0.5)
    (w,) = v.waiting
    assert (w.request_id, w.left, w.context, w.deadline) == (2, 10, 0, 0.7)   # its own deadline
    assert v.chunks(31) == [(28, 12), (3, 0)]
    assert p.speculation_length() == 0


@pytest.mark.slow   # a study at toy scale: 7 runs
def test_adaptive_chunking_study_at_toy_scale(tmp_path):
    from study_scripts import load_study
    study = load_study("adaptive_chunking")
    df = study.study(tmp_path, "test", log=lambda *_: None)
    assert list(df["config"]) == [*(f"static {b}" for b in study.STATIC), *study.CONTROLLERS]
    rows = df.set_index("config")
    # the TBT-keeping controllers hold the strict SLO's 100 ms P99 TBT; the largest static
    # budget breaks it; every relegated request was served
    assert (rows.loc[["tbt_target", "slack"], "p99_tbt_s"] <= 0.1 + 1e-9).all()
    assert rows.loc["static 2048", "p99_tbt_s"] > 0.1
    assert (df["relegated_finished"] == df["relegated"]).all()
    assert "| 3 | best static (" in (tmp_path / "adaptive_chunking.md").read_text()


def test_a_controller_s_speculation_length_is_what_the_decodes_draft(tmp_path):
    """scheduler.num_speculative_tokens=3 caps k; a controller returning spec_len=1 makes every
    speculative decode propose exactly 1 draft, and one returning none keeps the run's 3."""
    from sarathi_lab.run.runner import run
    base = ["scheduler.num_speculative_tokens=3", "executor.draft_cost_ratio=0.05",
            "executor.acceptance_rate=0.6", *SMALL]
    drafts = {}
    for ctl in ("plugins:OneDraft", "plugins:FullBudget"):
        d = tmp_path / ctl.split(":")[1]
        run(composed(f"scheduler.controller={ctl}", *base), d)
        it = pd.read_parquet(d / "iterations.parquet")
        spec = it[it["spec_steps"] > 0]
        assert len(spec) > 0
        drafts[ctl] = (spec["spec_proposed"] / spec["spec_steps"])
    assert (drafts["plugins:OneDraft"] == 1).all()
    # the budget (512) leaves room for 3 drafts per decode in every batch of this small run
    assert (drafts["plugins:FullBudget"] == 3).all()


@pytest.mark.slow   # 3 runs of 40 requests, ~6 s
def test_slo_dp_in_a_run_learns_a_poor_draft_and_prices_a_costly_one(tmp_path):
    """In a run: told 0.9 of a draft whose drafts are accepted at 0.05, slo_dp keeps proposing
    about as many drafts per step when it does not learn, and far fewer once the drafts judged
    pull its estimate down; and a draft as costly as the target itself (layers:32 of
    Mistral-7B's 32) makes it stop speculating."""
    from sarathi_lab.run.runner import run
    # priced by the cost model: what is tested is the acceptance estimate and the draft's price.
    # The learned predictor prices each k from the steps run with it, and slo_dp, which never
    # explores, can keep a k whose few early steps made another look dearer (docs/plugins.md)
    base = ["scheduler.controller=slo_dp", "scheduler.num_speculative_tokens=3",
            "scheduler.predictor=oracle",
            "executor.acceptance_rate=0.05", "scheduler.assumed_acceptance=0.9", *SMALL]

    def proposed(*ov):
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        s = run(composed(*base, *ov), d)
        return (s.get("speculation") or {}).get("proposed", 0), s
    told, _ = proposed("executor.draft_cost_ratio=0.05", "scheduler.learn_acceptance=false")
    learnt, s = proposed("executor.draft_cost_ratio=0.05", "scheduler.acceptance_prior_drafts=20")
    assert told > 0 and learnt < 0.5 * told
    assert s["speculation"]["acceptance_rate"] < 0.15
    full, _ = proposed("executor.draft=layers:32", "scheduler.learn_acceptance=false")
    assert full < 0.1 * told   # a draft step as dear as a target step: speculation never pays


# -- the learned predictor against the oracle (issue 35, item 3) -------------------------------

MIX = ["model=mistral-7b", "hardware=a100-80gb", "trace=mix", "slo=chat-batch",
       "slo.classes.interactive.tpot=null", "slo.classes.interactive.request_p99_tbt=0.1",
       "trace.qps=2", "progress=false", "seed=0"]


def attainment(*ov, n=120):
    from sarathi_lab.run.runner import run
    s = run(composed(*MIX, f"trace.num_requests={n}", *ov), None, write=False)
    return s["slo"]["attainment"], s["predictor"]


def controller_against_static(ctl, n):
    """(oracle, learned) at zero noise and (learned, static 512) at executor.step_jitter=0.1
    (which no predictor is told): the learned predictor within 5 points of the oracle, and
    never below the static budget under noise."""
    c = ["scheduler.token_budget=2048", f"scheduler.controller={ctl}"]
    oracle, rec = attainment(*c, "scheduler.predictor=oracle", n=n)
    assert rec["name"] == "oracle"
    learned, rec = attainment(*c, n=n)
    assert rec["name"] == "learned" and rec["quantile"] == 0.99 and rec["pooled"]["steps"] > 0
    assert learned >= oracle - 0.05
    noisy, _ = attainment(*c, "executor.step_jitter=0.1", n=n)
    static, rec = attainment("executor.step_jitter=0.1", n=n)
    assert rec is None   # static prices nothing
    assert noisy >= static
    return oracle, learned, noisy, static


def test_a_learned_predictor_keeps_the_oracle_s_attainment_and_degrades_gracefully():
    """tbt_target on the mix (120 requests, 2 req/s, Mistral-7B A100): at zero noise the
    learned predictor's attainment is the oracle's (99.2% both when written); with step jitter
    0.1 the oracle, planning at exactly 100 ms, falls to 29% while the learned one, planning
    with the margin it observes, stays at 99% above static 512's 97.5%."""
    oracle, learned, noisy, static = controller_against_static("tbt_target", 120)
    c = ["scheduler.token_budget=2048", "scheduler.controller=tbt_target",
         "scheduler.predictor=oracle", "executor.step_jitter=0.1"]
    assert attainment(*c)[0] < static - 0.3   # what the oracle assumption hides


@pytest.mark.slow   # 12 runs of 300 requests, ~30 s
@pytest.mark.parametrize("ctl", ["tbt_target", "slack", "slo_dp"])
def test_every_controller_with_the_learned_predictor_at_300_requests(ctl):
    controller_against_static(ctl, 300)
