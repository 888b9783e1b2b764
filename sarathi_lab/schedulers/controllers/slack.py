"""`slack`: the chunk from the tightest deadline's slack, class-aware prompt order and eager
relegation (Niyama, 2025: "Niyama: breaking the silos of LLM inference serving" -- QoS classes,
dynamic chunking, hybrid prioritisation and relegation under overload).

Each iteration:
- the budget is the largest whose predicted iteration time fits the tightest slack among running
  decodes: the time left until the next token of each is due (its last token's time + its TBT
  target; decodes of a class without one constrain nothing), never below the decodes plus
  `min_chunk` prompt tokens;
- prompts under way get their chunks in class order (`priority`, lower first), then by the
  slack of their TTFT deadline (deadline - now), least first;
- a prompt (under way or waiting) whose deadline cannot be met even if it ran alone, all of it
  in one iteration now (`predict([(left, context)], [])`), is relegated: the policy serves it
  after every other request (never dropped), and records when (requests table `relegated_at`).

Simplified from the paper: the slack comes from decodes only (a prompt's TTFT slack orders the
prompts but does not size the chunk), no per-class chunk limits and no admission control (pair
it with scheduler.deadline_admission for that).
"""
from sarathi_lab.schedulers.controllers.base import BudgetController, Decision, largest_within
from sarathi_lab.schedulers.controllers.targets import NeedsTBTTarget, TargetConfig, tightest

_INF = float("inf")


class Slack(NeedsTBTTarget, BudgetController):
    name = "slack"
    config_class = TargetConfig
    needs_predictor = True
    relegates = True

    def __init__(self, cfg):
        super().__init__(cfg)
        # (left, context) -> the prompt's time alone: asked for every waiting prompt each
        # iteration, and a waiting prompt's pair does not change; kept while the predictor's
        # prices do (the learned one's change with every step it observes)
        self._alone: dict = {}
        self._priced_by = None

    def alone(self, p, predict) -> float:
        version = getattr(predict, "version", None)
        if version != self._priced_by:
            self._alone.clear()
            self._priced_by = version
        key = (p.left, p.context)
        t = self._alone.get(key)
        if t is None:
            t = self._alone[key] = predict([key], [])
        return t

    def decide(self, view, predict):
        now = view.now
        # a price of +inf is a predictor that cannot tell yet (a learned one's cold start):
        # no ground to relegate on
        hopeless = tuple(p.request_id for p in (*view.prefills, *view.waiting)
                         if not p.relegated and p.deadline is not None
                         and p.deadline < now + self.alone(p, predict) < _INF)
        last = {p.request_id for p in (*view.prefills, *view.waiting)
                if p.relegated or p.request_id in hopeless}
        ordered = sorted(view.prefills, key=lambda p: (
            p.request_id in last, p.priority, _INF if p.deadline is None else p.deadline - now))
        order = tuple(p.request_id for p in ordered)
        # the chunks as the policy will give them: in this order, then the waiting ones
        prompts = [*ordered, *(p for p in view.waiting if p.request_id not in last),
                   *(p for p in view.waiting if p.request_id in last)]
        n_dec, cap = len(view.decodes), view.max_budget
        budget = cap
        slack = tightest(self, view.decodes, lambda d, t: (
            d.last_token_time if d.last_token_time is not None else now) + t - now)
        if slack is not None and n_dec < cap:
            ctx = view.decode_contexts()

            def fits(b: int) -> bool:
                return predict(view.chunks(b - n_dec, prompts), ctx) <= slack
            budget = largest_within(min(cap, n_dec + self.cfg.min_chunk), cap, fits)
        return Decision(budget, relegate=hopeless, prefill_order=order)
