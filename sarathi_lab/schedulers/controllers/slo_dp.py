"""`slo_dp`: the chunk (and speculation length) that maximises the requests meeting their SLO
over a short horizon (SLOs-Serve, 2025: "SLOs-Serve: optimized serving of multi-SLO LLMs" --
a dynamic program over chunk sizes and speculation lengths per iteration, with soft admission).

Candidates: every speculation length k in 0 .. scheduler.num_speculative_tokens (0 only when
speculation is off) and every prefill chunk in `chunk_sizes` (capped by the budget left after
the decodes' 1 + k tokens each, and by the prompt tokens there are). For each, the batch is
priced once (`predict`, with ``spec_len=k``: the draft's k steps and the verification of 1 + k
tokens per decode, the whole iteration) and repeated for `horizon` iterations:
- a decode meets its SLO if its time per token, t / (1 + a + a^2 + ... + a^k), stays within its
  TBT target (one without a target counts for none);
- a prompt with a deadline meets it if the repeated chunks finish it (in the policy's fill order)
  within the horizon by its deadline; one that cannot finish by its deadline within the horizon
  counts as missed either way (it adds to no candidate); prompts without a deadline count for
  none.
The candidate meeting the most wins; ties go to the most tokens per second, then the smaller
budget.

The acceptance a is an estimate, learnt online as AdaServe and SpecServe track it: the view's
drafts accepted and judged so far (a judged draft: an accepted one, or the first rejected of a
step), with `assumed_acceptance` as the prior, worth `acceptance_prior_drafts` judged drafts:
a = (prior x weight + accepted) / (weight + judged), the per-token rate's posterior mean
(`learn_acceptance=false`: the prior throughout). While slo_dp chooses k = 0 nothing is judged,
so a prior too low to ever speculate is never corrected.

Simplified from the paper: an enumeration over a few candidates instead of its DP over request
subsets, contexts frozen over the horizon, one acceptance estimate for the whole run (not one
per request or per position), no admission control.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from sarathi_lab.schedulers.controllers.base import BudgetController, Decision
from sarathi_lab.schedulers.controllers.targets import NeedsTBTTarget, TargetConfig, tbt_target
from sarathi_lab.settings import setting


@dataclass
class SLODPConfig(TargetConfig):
    horizon: int = setting(4, ge=1, help="iterations each candidate is played forward")
    chunk_sizes: list[int] = setting([0, 64, 128, 256, 512, 1024, 2048],
                                     help="prefill chunks tried (capped by the budget)")
    assumed_acceptance: float = setting(0.7, ge=0, le=1, help="the prior of slo_dp's estimate "
                                        "of each draft token's acceptance (its planning "
                                        "assumption; the simulator's true rate is "
                                        "executor.acceptance_rate)")
    learn_acceptance: bool = setting(True, help="update the estimate from the drafts the "
                                     "target judged so far; false: plan with "
                                     "assumed_acceptance throughout")
    acceptance_prior_drafts: float = setting(100, ge=0, help="judged drafts the prior is worth "
                                             "against the run's observed ones (0: the observed "
                                             "rate once any draft is judged)")

    #: read only when the run speculates (scheduler.num_speculative_tokens > 0)
    speculation_settings: ClassVar[tuple] = ("assumed_acceptance", "learn_acceptance",
                                             "acceptance_prior_drafts")
    #: old names, refused with the new one
    renamed: ClassVar[dict] = {
        "acceptance_rate": "assumed_acceptance (slo_dp's prior of the acceptance it plans with; "
                           "the simulator's true rate is executor.acceptance_rate)"}

    def validate(self) -> None:
        super().validate()
        if not self.chunk_sizes or min(self.chunk_sizes) < 0:
            raise ValueError(f"chunk_sizes={self.chunk_sizes}: must be a non-empty list of "
                             "integers >= 0")
        default = type(self).__dataclass_fields__["acceptance_prior_drafts"].default
        if not self.learn_acceptance and self.acceptance_prior_drafts != default:
            raise ValueError(f"acceptance_prior_drafts={self.acceptance_prior_drafts:g}: read only "
                             "with learn_acceptance=true (false plans with assumed_acceptance "
                             "throughout)")


def expected_tokens(k: int, a: float) -> float:
    """Tokens a decode emits per step with k draft tokens each accepted with rate a (geometric:
    the i-th is kept only if all before it were)."""
    return 1 + sum(a ** i for i in range(1, k + 1))


class SLODP(NeedsTBTTarget, BudgetController):
    name = "slo_dp"
    config_class = SLODPConfig
    needs_predictor = True

    def acceptance(self, view) -> float:
        """The acceptance planned with: the prior, updated by the drafts judged so far."""
        prior, w = self.cfg.assumed_acceptance, self.cfg.acceptance_prior_drafts
        if not self.cfg.learn_acceptance or view.drafts_judged == 0:
            return prior
        return (prior * w + view.drafts_accepted) / (w + view.drafts_judged)

    def decide(self, view, predict):
        a = self.acceptance(view)
        best = None
        for k in range(view.max_spec_len + 1):
            for c in sorted(set(self.cfg.chunk_sizes)):
                cand = self.score(view, predict, k, c, a)
                if cand is not None and (best is None or cand[0] > best[0]):
                    best = cand
        if best is None:   # the decodes alone fill the budget
            return Decision(view.max_budget, spec_len=0 if view.max_spec_len else None)
        _, budget, k = best
        return Decision(budget, spec_len=k if view.max_spec_len else None)

    def score(self, view, predict, k: int, chunk: int, a: float):
        """((met, tokens/s, -budget), budget, k) of one candidate; None if it does not fit."""
        n_dec = len(view.decodes)
        dec_tokens = n_dec * (1 + k)
        room = min(dec_tokens + chunk, view.max_budget) - dec_tokens
        if room < 0:   # the decodes alone overflow the budget
            return None
        # only the prompt tokens there are: a chunk larger than the prompts left would otherwise
        # count tokens no batch holds (and beat speculation on tokens/s with none waiting)
        chunks = view.chunks(room)
        prefill = sum(n for n, _ in chunks)
        budget = dec_tokens + prefill
        # an empty batch, or a chunk the cap (or the prompts left) cut to 0: chunk 0's candidate
        if budget < 1 or (chunk > 0 and prefill == 0):
            return None
        # k > 0 only in a speculating run, whose predictor prices the drafts (a plug-in's
        # two-argument predictor serves a run without speculation)
        t = predict(chunks, view.decode_contexts(), spec_len=k) if k else \
            predict(chunks, view.decode_contexts())
        per_token = t / expected_tokens(k, a)
        met = sum(t is not None and per_token <= t
                  for t in (tbt_target(self, d) for d in view.decodes))
        done = 0   # prompt tokens ahead of each prompt, in fill order
        for p in (*view.prefills, *view.waiting):
            done += p.left
            if p.deadline is None or prefill == 0:
                continue
            iters = math.ceil(done / prefill)
            if iters <= self.cfg.horizon and view.now + iters * t <= p.deadline:
                met += 1
        rate = (prefill + n_dec * expected_tokens(k, a)) / t
        return (met, rate, -budget), budget, k
