"""`slo_dp`: the chunk (and speculation length) that maximises the requests meeting their SLO
over a short horizon (SLOs-Serve, 2025: "SLOs-Serve: optimized serving of multi-SLO LLMs" --
a dynamic program over chunk sizes and speculation lengths per iteration, with soft admission).

Candidates: every speculation length k in 0 .. scheduler.num_speculative_tokens (0 only when
speculation is off) and every prefill chunk in `chunk_sizes` (capped by the budget left after
the decodes' 1 + k tokens each, and by the prompt tokens there are). For each, the batch is priced once (`predict`; a decode
verifying 1 + k tokens is priced as a chunk of 1 + k tokens at its context) and repeated for
`horizon` iterations:
- a decode meets its SLO if its time per token, t / (1 + a + a^2 + ... + a^k) with a =
  `acceptance_rate`, stays within its TBT target (one without a target counts for none);
- a prompt with a deadline meets it if the repeated chunks finish it (in the policy's fill order)
  within the horizon by its deadline; one that cannot finish by its deadline within the horizon
  counts as missed either way (it adds to no candidate); prompts without a deadline count for
  none.
The candidate meeting the most wins; ties go to the most tokens per second, then the smaller
budget. Simplified from the paper: an enumeration over a few candidates instead of its DP over
request subsets, contexts frozen over the horizon, draft steps not priced, no admission control.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from sarathi_lab.schedulers.controllers.base import BudgetController, Decision
from sarathi_lab.schedulers.controllers.targets import NeedsTBTTarget, TargetConfig, tbt_target
from sarathi_lab.settings import setting


@dataclass
class SLODPConfig(TargetConfig):
    horizon: int = setting(4, ge=1, help="iterations each candidate is played forward")
    chunk_sizes: list[int] = setting([0, 64, 128, 256, 512, 1024, 2048],
                                     help="prefill chunks tried (capped by the budget)")
    acceptance_rate: float = setting(0.7, ge=0, le=1, help="expected acceptance of each draft "
                                     "token (geometric), for the choice of spec_len")

    def validate(self) -> None:
        if not self.chunk_sizes or min(self.chunk_sizes) < 0:
            raise ValueError(f"chunk_sizes={self.chunk_sizes}: must be a non-empty list of "
                             "integers >= 0")


def expected_tokens(k: int, a: float) -> float:
    """Tokens a decode emits per step with k draft tokens each accepted with rate a (geometric:
    the i-th is kept only if all before it were)."""
    return 1 + sum(a ** i for i in range(1, k + 1))


class SLODP(NeedsTBTTarget, BudgetController):
    name = "slo_dp"
    config_class = SLODPConfig
    needs_predictor = True

    def decide(self, view, predict):
        best = None
        for k in range(view.max_spec_len + 1):
            for c in sorted(set(self.cfg.chunk_sizes)):
                cand = self.score(view, predict, k, c)
                if cand is not None and (best is None or cand[0] > best[0]):
                    best = cand
        if best is None:   # the decodes alone fill the budget
            return Decision(view.max_budget, spec_len=0 if view.max_spec_len else None)
        _, budget, k = best
        return Decision(budget, spec_len=k if view.max_spec_len else None)

    def score(self, view, predict, k: int, chunk: int):
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
        if k:
            t = predict([*chunks, *((1 + k, d.context) for d in view.decodes)], [])
        else:
            t = predict(chunks, view.decode_contexts())
        per_token = t / expected_tokens(k, self.cfg.acceptance_rate)
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
        rate = (prefill + n_dec * expected_tokens(k, self.cfg.acceptance_rate)) / t
        return (met, rate, -budget), budget, k
