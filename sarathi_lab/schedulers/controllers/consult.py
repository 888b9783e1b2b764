"""The policies' side of the controller contract: building settings that name a controller,
the view a policy shows it each iteration, and applying its decision (`Consulting`, a mixin of
`Sarathi`). `static` is not consulted at all: the policy takes ``token_budget`` as before, so its
runs, fast-forward included, are unchanged.
"""
from __future__ import annotations

import dataclasses

from sarathi_lab.request import Request
from sarathi_lab.schedulers.controllers import predictor
from sarathi_lab.schedulers.controllers.base import (
    BudgetController,
    DecodeView,
    PromptView,
    View,
    check_decision,
)
from sarathi_lab.schedulers.controllers.static import Static
from sarathi_lab.schedulers.mechanics.progress import split_running
from sarathi_lab.schedulers.queues import RequestQueue
from sarathi_lab.settings import ConfigError, parse, refuse_renamed, split_node

RELEGATED = "relegated_at"   # Request.extra key: when a controller relegated it


def controller_class(name: str) -> type:
    from sarathi_lab.registry import controller_class as find
    return find(name)


def split_settings(values: dict, own: set[str], where: str, who: str):
    """(the policy's settings, the controller's typed settings) from one flat node: the
    controller named by its ``controller`` key reads the keys its config class declares."""
    name = values.get("controller", "static")
    try:
        cls = controller_class(name)
    except ValueError as e:
        raise ConfigError(f"{where}.controller: {e}") from None
    refuse_renamed(values, getattr(cls.config_class, "renamed", {}), where)   # any dataclass
    theirs = {f.name for f in dataclasses.fields(cls.config_class)}
    clash = sorted(theirs & own)
    if clash:
        raise ConfigError(f"{where}.controller={name}: its setting {clash[0]!r} has the name of "
                          f"a setting of {who}; rename it in {cls.__qualname__}.config_class")
    mine, ctl_values = split_node(values, own, theirs, where, who, f"controller {name!r}",
                                  [("controller", theirs)])
    return mine, parse(cls.config_class, ctl_values, where, f"controller {name!r}")


def slo_targets(slo):
    """slo_class -> (TTFT target, TBT target) in seconds (None: none) from the run's SLO
    settings (a class's own targets replace the top-level ones); None without an SLO. The TBT
    target is request_p99_tbt, else tpot, else the pooled p99_tbt."""
    if slo is None:
        return lambda cls: (None, None)
    top = (slo.ttft, slo.request_p99_tbt or slo.tpot or slo.p99_tbt)
    per = {name: (t.ttft, t.request_p99_tbt or t.tpot or slo.p99_tbt)
           for name, t in (slo.classes or {}).items()}
    return lambda cls: per.get(cls, top)


def has_tbt_target(slo) -> bool:
    """Whether the run's SLO gives any request a TBT target (at top level or in a class)."""
    if slo is None:
        return False
    return any(t is not None for t in (slo.request_p99_tbt, slo.tpot, slo.p99_tbt)) or any(
        c.request_p99_tbt is not None or c.tpot is not None for c in (slo.classes or {}).values())


class RelegatingQueue(RequestQueue):
    """FCFS with relegated requests at the tail: an arrival goes before them, so a relegated
    request is served after every other (never dropped)."""

    name = "fcfs"

    def __init__(self):
        super().__init__()
        self.num_relegated = 0

    def push(self, req: Request) -> None:
        self._q.insert(len(self._q) - self.num_relegated, req)

    def push_preempted(self, req: Request) -> None:
        if RELEGATED in req.extra:   # first of the relegated
            self._q.insert(len(self._q) - self.num_relegated, req)
            self.num_relegated += 1
        else:
            self._q.appendleft(req)

    def _gone(self, req: Request) -> None:
        if RELEGATED in req.extra:
            self.num_relegated -= 1

    def pop(self) -> Request:
        req = self._q.popleft()
        self._gone(req)
        return req

    def remove(self, req: Request) -> None:
        self._q.remove(req)
        self._gone(req)

    def relegate(self, req: Request) -> None:
        self._q.remove(req)
        self._q.append(req)
        self.num_relegated += 1


def executed_batch(out) -> tuple:
    """(prefill chunks as (tokens, context) pairs, decode contexts, k) of a batch about to be
    applied (contexts before it ran): what `IterationPredictor.observe` is told."""
    chunks, decodes = [], []
    spec = out.spec_lens or ()
    k = max(spec, default=0)
    for i, (r, n) in enumerate(zip(out.reqs, out.num_new_tokens)):
        if n == 1 + (spec[i] if spec else 0) and r.is_decoding:
            decodes.append(r.num_computed_tokens)
        else:
            chunks.append((n, r.num_computed_tokens))
    return chunks, decodes, k


class Consulting:
    """Consult `cfg.controller` each iteration (`iteration_budget`). A controller that prices
    batches gets the predictor its settings name (`predictor.py`: the learned one, fed every
    executed step by `update`, or the executor's cost model, which the run layer hands in with
    the SLO: `bind_predictor`); a non-static controller turns fast-forward off (its budget may
    change every iteration)."""

    controller: BudgetController | None = None
    predictor = None
    targets = staticmethod(slo_targets(None))
    prefill_order: dict = {}
    spec_len: int = 0
    budget: int = 0      # the controller's budget of this iteration
    follows_prefill_order = True   # False: the policy orders prompts itself (refuses one)

    def init_controller(self) -> None:
        cfg = self.cfg
        cls = controller_class(cfg.controller)
        if cls is Static:
            return
        self.controller = cls(cfg.controller_settings or cls.config_class())
        self.fast_forward = None   # stepped: the budget may change every iteration
        self.fast_forward_off = (f"scheduler.controller={cfg.controller}: the budget may change "
                                 "every iteration")
        if cls.needs_predictor:   # the learned one now; the oracle once the executor's is bound
            self.predictor = predictor.build(self.controller.cfg)
        if cls.relegates:
            if type(self.waiting) is not RequestQueue:
                raise ValueError(
                    f"scheduler.controller={cfg.controller} relegates requests to the tail of "
                    f"the FCFS queue; policy {self.name!r} with queue "
                    f"{type(self.waiting).__name__} orders its own (use scheduler=sarathi "
                    "scheduler.queue=fcfs)")
            self.waiting = RelegatingQueue()

    def bind_predictor(self, price, slo=None) -> None:
        """The run layer's price of an iteration (the executor's cost model, `Executor.predictor`;
        None: it offers none), read only with ``scheduler.predictor=oracle``, and SLO settings
        (TBT targets and TTFT deadlines shown to the controller)."""
        ctl = self.controller
        if ctl is not None and ctl.needs_predictor and self.predictor is None:   # the oracle
            if price is None:
                raise ConfigError(
                    f"scheduler.predictor=oracle (scheduler.controller={self.cfg.controller}): "
                    "the oracle is the simulator's cost model, and this run's executor has none "
                    "(a real executor measures time); use scheduler.predictor=learned")
            self.predictor = predictor.Oracle(price)
        self.targets = slo_targets(slo)
        if ctl is not None:
            ctl.check_targets(has_tbt_target(slo))

    def update(self, out, step, start: float, end: float):
        """`Policy.update`, and the executed batch and its duration told to the predictor (what a
        real engine observes: the step's time, its swap copies excluded)."""
        if self.predictor is not None:
            self.predictor.observe(*executed_batch(out), step.duration - step.swap_s)
        return super().update(out, step, start, end)

    def predictor_record(self) -> dict | None:
        """The summary's `predictor`: which one priced the controller's batches (None: none)."""
        return None if self.predictor is None else self.predictor.record()

    def view(self, now: float) -> View:
        targets = self.targets
        decodes, prefills = split_running(self.running)

        def prompt(r: Request) -> PromptView:
            deadline = r.deadline
            if deadline is None and (ttft := targets(r.slo_class)[0]) is not None:
                deadline = r.arrival_time + ttft
            return PromptView(r.request_id, r.num_tokens_to_compute, r.num_computed_tokens,
                              r.arrival_time, deadline, r.slo_class, r.priority,
                              RELEGATED in r.extra)
        return View(
            now=now,
            decodes=tuple(DecodeView(r.request_id, r.num_computed_tokens,
                                     targets(r.slo_class)[1],
                                     r.token_times[-1] if r.token_times else None,
                                     r.slo_class, r.priority) for r in decodes),
            prefills=tuple(prompt(r) for r in prefills),
            waiting=tuple(prompt(r) for r in self.waiting),
            max_budget=self.cfg.token_budget,
            max_spec_len=self.cfg.num_speculative_tokens,
            drafts_accepted=self.drafts_accepted, drafts_judged=self.drafts_judged)

    def iteration_budget(self, now: float) -> int:
        """This iteration's token budget: ``token_budget`` (static), else the controller's."""
        ctl = self.controller
        if ctl is None:
            return self.cfg.token_budget
        view = self.view(now)
        try:
            decision = ctl.decide(view, self.predictor)
        except Exception as e:   # a plug-in's bug: named with its class, its cause kept
            raise RuntimeError(f"controller {type(ctl).__module__}:{type(ctl).__qualname__}: "
                               f"decide() raised {type(e).__name__}: {e}") from e
        d = check_decision(ctl, decision, view)
        if d.prefill_order and not self.follows_prefill_order:
            raise ValueError(f"scheduler.controller={self.cfg.controller}: returned a "
                             f"prefill_order, but policy {self.name!r} orders prompts by its "
                             "queue's key (use scheduler=sarathi)")
        if d.relegate:
            self.relegate(set(d.relegate), now)
        self.prefill_order = {rid: i for i, rid in enumerate(d.prefill_order)}
        self.spec_len = view.max_spec_len if d.spec_len is None else d.spec_len
        self.budget = d.token_budget
        return d.token_budget

    def speculation_length(self) -> int:
        """k for this iteration's decodes (read after `iteration_budget`): the controller's
        spec_len, else the run's scheduler.num_speculative_tokens."""
        if self.controller is not None:
            return self.spec_len
        return super().speculation_length()

    def iteration_token_limit(self) -> int | None:
        """The budget of this iteration (`iteration_budget`'s): a speculative decode's drafts
        fit in what the controller chose, not in the cap."""
        if self.controller is not None:
            return self.budget
        return super().iteration_token_limit()

    def relegate(self, ids: set, now: float) -> None:
        for r in self.running:   # a prompt under way gets its chunks last (`chunk_order`)
            if r.request_id in ids and RELEGATED not in r.extra:
                r.extra[RELEGATED] = now
        for r in [r for r in self.waiting if r.request_id in ids and RELEGATED not in r.extra]:
            r.extra[RELEGATED] = now
            self.waiting.relegate(r)

    def chunk_order(self, prefills: list[Request]) -> list[Request]:
        """Prompts under way in the order they get chunks: the controller's order first, the
        others as they were, relegated ones last."""
        if self.controller is None:
            return prefills
        order, n = self.prefill_order, len(prefills)
        return sorted(prefills, key=lambda r: (RELEGATED in r.extra,
                                               order.get(r.request_id, n)))


__all__ = ["Consulting", "RELEGATED", "RelegatingQueue", "controller_class", "split_settings"]
