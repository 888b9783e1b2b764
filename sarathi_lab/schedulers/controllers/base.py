"""The budget-controller contract: what a plug-in that chooses each iteration's token budget (and
speculation length) writes, what it is shown, and what it may return. A plug-in needs only this
module and `settings`.

A chunking policy (`sarathi` and the policies built on it) consults its controller once per
iteration, before it builds the batch: ``controller.decide(view, predict)`` with

- `view`, a read-only `View` of the policy's state (running decodes with their contexts and TBT
  targets, prompts under way, the waiting queue with deadlines and classes, `now`, the cap on
  the budget and the speculation length allowed), and
- `predict`, a `Predictor`: the seconds an iteration of a candidate batch takes, priced by the
  run's cost model (the simulator's; `Executor.predictor`). A policy never imports a cost
  model: the run layer hands this callable in (`Policy.bind_predictor`). With
  ``spec_len=k`` > 0 (only in a run that speculates) every decode drafts k tokens and verifies
  1 + k, and the price is the whole iteration's: the draft's k steps and the verification.

It returns a `Decision`: the token budget of this iteration (1 ..  ``scheduler.token_budget``,
which caps every controller), optionally a speculation length (0 .. the run's
``scheduler.num_speculative_tokens``), and optionally requests to relegate (served after every
other, never dropped; recorded in the requests table's `relegated_at`).

A controller subclasses `BudgetController`, sets `name`, declares its settings as a dataclass
(`config_class`; set flat under ``scheduler`` beside the policy's own, e.g.
``scheduler.controller=my_pkg.ctl:Mine +scheduler.my_knob=3``) and writes `decide`. It sets
`needs_predictor = True` if it calls `predict` (a run whose executor offers none is then an
error naming the setting) and `relegates = True` if it may return relegations (only a policy
whose waiting order it can change accepts it: ``scheduler=sarathi``).
"""
from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

#: (prefill chunks as (tokens, tokens already in KV) pairs, decode contexts, spec_len=0) ->
#: seconds; spec_len=k > 0: each decode drafts k tokens (the draft's steps priced) and verifies
#: 1 + k (a speculating run's predictor only; a controller passes it only when k > 0)
Predictor = Callable[..., float]


@dataclass
class ControllerConfig:
    """Settings every controller reads (none)."""

    #: its settings read only when the run speculates (scheduler.num_speculative_tokens > 0;
    #: one set without is an error, as any unread setting)
    speculation_settings: ClassVar[tuple[str, ...]] = ()
    #: old names of its settings -> the new name (with what it is): an old one set is an error
    #: naming the new one
    renamed: ClassVar[dict[str, str]] = {}


@dataclass(frozen=True, slots=True)
class DecodeView:
    """A running request that decodes this iteration."""
    request_id: object
    context: int                 # tokens in KV before this decode
    tbt_target: float | None     # s between its tokens (its SLO class's), None: no target
    last_token_time: float | None  # when its last token came out
    slo_class: str
    priority: int


@dataclass(frozen=True, slots=True)
class PromptView:
    """A prompt under way (admitted, chunks left) or waiting (not admitted)."""
    request_id: object
    left: int                    # prompt tokens still to compute
    context: int                 # tokens in KV already
    arrival_time: float
    deadline: float | None       # absolute time its first token is due, None: none
    slo_class: str
    priority: int
    relegated: bool              # relegated already: served after every other


@dataclass(frozen=True, slots=True)
class View:
    now: float
    decodes: tuple[DecodeView, ...]
    prefills: tuple[PromptView, ...]   # under way, in the order the policy gives them chunks
    waiting: tuple[PromptView, ...]    # in the queue's order
    max_budget: int                    # scheduler.token_budget: the cap on any decision
    max_spec_len: int                  # scheduler.num_speculative_tokens (0: no speculation)
    # the target's verdicts on drafts so far this run (this engine's): drafts accepted, and
    # drafts judged (the accepted ones and, per step that rejected one, the first rejected;
    # the later ones were never judged). accepted / judged estimates a per-token acceptance
    drafts_accepted: int = 0
    drafts_judged: int = 0

    def chunks(self, prefill_tokens: int, prompts=None) -> list[tuple[int, int]]:
        """The prefill chunks (tokens, context) the policy would build from `prefill_tokens`:
        `prompts` in order (default: those under way, then waiting ones), each up to what it
        has left (KV and seat limits on admission are not foreseen)."""
        out = []
        for p in (*self.prefills, *self.waiting) if prompts is None else prompts:
            if prefill_tokens <= 0:
                break
            n = min(p.left, prefill_tokens)
            out.append((n, p.context))
            prefill_tokens -= n
        return out

    def decode_contexts(self) -> list[int]:
        return [d.context for d in self.decodes]


@dataclass(frozen=True, slots=True)
class Decision:
    token_budget: int
    spec_len: int | None = None          # None: the run's num_speculative_tokens
    relegate: tuple = ()                 # request ids (of `prefills` or `waiting`) to relegate
    prefill_order: tuple = ()            # request ids of prompts under way, served first in
    #                                      this order (the others after them, as they were)


class BudgetController(abc.ABC):
    """Chooses each iteration's token budget. Must write `decide`."""

    name: ClassVar[str] = "base"
    config_class: ClassVar[type] = ControllerConfig
    needs_predictor: ClassVar[bool] = False
    relegates: ClassVar[bool] = False

    def __init__(self, cfg):
        self.cfg = cfg

    def check_targets(self, has_tbt_target: bool) -> None:
        """Called once before the run: raise (naming the setting) if this controller cannot act
        when `has_tbt_target` is False (the run's SLO gives no request a TBT target)."""

    @abc.abstractmethod
    def decide(self, view: View, predict: Predictor | None) -> Decision:
        """This iteration's decision (`predict` is None only when `needs_predictor` is False
        and the run offers none)."""


def check_decision(ctl: BudgetController, d, view: View) -> Decision:
    """`d` if it keeps the contract; else a ValueError naming the controller and the rule."""
    who = f"controller {type(ctl).__module__}:{type(ctl).__qualname__}"
    if not isinstance(d, Decision):
        raise ValueError(f"{who}: decide() returned {d!r}, not a Decision")
    b = d.token_budget
    if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= view.max_budget:
        raise ValueError(f"{who}: token_budget={b!r} breaks the rule 1 <= budget <= "
                         f"scheduler.token_budget={view.max_budget}")
    k = d.spec_len
    if k is not None and (isinstance(k, bool) or not isinstance(k, int)
                          or not 0 <= k <= view.max_spec_len):
        raise ValueError(f"{who}: spec_len={k!r} breaks the rule 0 <= spec_len <= "
                         f"scheduler.num_speculative_tokens={view.max_spec_len}")
    if d.relegate:
        if not ctl.relegates:
            raise ValueError(f"{who}: relegated requests but does not declare relegates = True")
        known = {p.request_id for p in (*view.prefills, *view.waiting)}
        bad = [r for r in d.relegate if r not in known]
        if bad:
            raise ValueError(f"{who}: relegated {bad[0]!r}, not a prompt under way or waiting")
    if d.prefill_order:
        under_way = {p.request_id for p in view.prefills}
        bad = [r for r in d.prefill_order if r not in under_way]
        if bad:
            raise ValueError(f"{who}: prefill_order names {bad[0]!r}, not a prompt under way")
    return d


def largest_within(lo: int, hi: int, fits: Callable[[int], bool]) -> int:
    """The largest b in [lo, hi] with fits(b), fits monotone (true then false); lo if none
    (binary search: a controller prices O(log hi) candidate batches per iteration)."""
    if fits(hi):
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
