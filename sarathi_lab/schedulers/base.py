"""The policy contract: what a scheduling policy must write, what it may override, and what the
engine calls. A plug-in needs only this module, `schedulers.output`, `request` and `settings`.

A policy subclasses `Policy` (or a built-in one), sets `name`, declares its settings as a
dataclass subclassing `SchedulerConfig` (`config_class`) and writes `schedule()`. The shared
mechanics a `schedule()` composes -- admission (`mechanics/admit.py`), preemption by recompute
or swap (`mechanics/preemption.py`), progress and KV bookkeeping (`mechanics/progress.py`) --
are inherited from the classes `Policy` lists; each module says what its methods do. The
simulator's skip through steady runs is an opt-in declaration (`fast_forward`,
`mechanics/fast_forward.py`); a policy without one is stepped one iteration at a time.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

from sarathi_lab.kv import KVCacheManager
from sarathi_lab.request import Request
from sarathi_lab.schedulers.admission import AdmissionControl
from sarathi_lab.schedulers.mechanics.admit import Admission
from sarathi_lab.schedulers.mechanics.fast_forward import FastForward, bind
from sarathi_lab.schedulers.mechanics.preemption import DEFAULT_SWAP_SPACE_GIB, Preemption
from sarathi_lab.schedulers.mechanics.progress import Progress
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.schedulers.queues import RequestQueue, builtin_queue
from sarathi_lab.settings import parse, setting

__all__ = ["DEFAULT_SWAP_SPACE_GIB", "FastForward", "Policy", "SchedulerConfig"]


@dataclass
class SchedulerConfig:
    """Settings every policy reads (the KV cache and the queue are shared machinery)."""
    max_num_seqs: int = setting(128, ge=1, help="cap on running requests")
    block_size: int = setting(16, ge=1, le=4096, help="tokens per KV block, a power of two")
    num_kv_blocks: int | None = setting(None, ge=1,
                                        help="null: what fits the executor's memory")
    enable_prefix_caching: bool = setting(False, help="share cached prompt blocks (paged KV)")
    sliding_window_kv: bool = setting(
        False, help="a model whose every layer is windowed (model.sliding_window): free the "
                    "blocks a request's window no longer reads (kv/window.py)")
    kv_watermark: float = setting(0.01, ge=0, lt=1,
                                  help="share of KV blocks kept free when admitting (vLLM)")
    max_model_len: int | None = setting(None, ge=2, help="null: the model's")
    queue: str = setting("fcfs", help="waiting order: fcfs | priority | edf | spf | a dotted path")
    # admission control (schedulers/admission.py), for every policy
    max_queue_len: int | None = setting(None, ge=1, help="reject arrivals that find this many "
                                        "requests waiting; null: no bound")
    deadline_admission: bool = setting(False, help="reject arrivals whose predicted TTFT "
                                       "exceeds their deadline")
    # preemption (when a running request needs a KV block and none is free)
    preemption_mode: str = setting(
        "recompute", choices=("recompute", "swap"),
        help="recompute: drop the victim's KV, recompute it on re-admission | swap: copy it to "
             "host memory, copy it back before the victim runs again (vLLM v0)")
    swap_space_gib: float | None = setting(
        None, gt=0, help="host memory per GPU for swapped KV (vLLM's swap_space), in GiB of "
                         "KV blocks; null: 4 (vLLM's default) with preemption_mode=swap")
    num_swap_blocks: int | None = setting(
        None, ge=1, help="host swap space in KV blocks, in place of swap_space_gib")
    # speculative decoding (vLLM's name): a scheduling decision, since the k draft tokens a
    # decode verifies count against the token budget like a prompt chunk's
    num_speculative_tokens: int = setting(
        0, ge=0, le=64, help="draft tokens each decode proposes and the target verifies in one "
                             "iteration (1 + k tokens of the budget); 0: off; needs an executor "
                             "that speculates (executor.supports_speculation)")

    def validate(self) -> None:
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size={self.block_size}: must be a power of two")
        if self.num_speculative_tokens and self.enable_prefix_caching:
            # prefix caching hashes a block as its tokens are computed; a draft's slot holds no
            # known token yet (and the bulk decode allocation that drafts take is not hashed)
            raise ValueError(f"num_speculative_tokens={self.num_speculative_tokens} with "
                             "enable_prefix_caching=true: speculative decoding is not "
                             "implemented with prefix caching; set one of them off")
        if self.sliding_window_kv and self.enable_prefix_caching:
            raise ValueError("sliding_window_kv=true with enable_prefix_caching=true: a cached "
                             "prefix would lose the blocks that left the window; set one off")
        if self.sliding_window_kv and self.preemption_mode == "swap":
            raise ValueError("sliding_window_kv=true with preemption_mode=swap: swapping a "
                             "block table with freed blocks is not implemented; use "
                             "preemption_mode=recompute")
        if self.swap_space_gib is not None and self.num_swap_blocks is not None:
            raise ValueError(f"swap_space_gib={self.swap_space_gib} and num_swap_blocks="
                             f"{self.num_swap_blocks}: set one of them (both size the host swap "
                             "space)")


#: The toolkit a `schedule()` composes: the mixins `Policy` inherits (mechanics/), whose methods
#: call each other and are called by the engine. A subclass that defines one of their names
#: (method or attribute, private ones included) replaces what the mechanics rely on: it must
#: say so (`overrides`), else the class is refused when it is created.
TOOLKIT = (Admission, Preemption, Progress)
#: The toolkit's hooks, meant to be overridden (each documented where it is defined): no
#: `overrides` entry needed.
HOOKS = frozenset({"update", "iteration_token_limit", "speculation_length"})


def check_overrides(cls: type) -> None:
    """TypeError if the policy class `cls` (or a mixin of it) defines a toolkit name that is
    not a hook and that no class of it lists in `overrides`."""
    declared = set()
    for klass in cls.__mro__:
        declared.update(vars(klass).get("overrides", ()))
    base = {Policy, *TOOLKIT, object, abc.ABC}
    for klass in cls.__mro__:
        if klass in base:
            continue
        for name in vars(klass):
            if name in HOOKS or name in declared or name.startswith("__"):
                continue
            owner = next((t for t in TOOLKIT if name in vars(t)), None)
            if owner is not None:
                raise TypeError(
                    f"policy class {cls.__module__}.{cls.__qualname__}: {klass.__qualname__} "
                    f"defines {name!r}, a name of the policy toolkit ({owner.__module__}."
                    f"{owner.__name__}) that the mechanics and the engine rely on; rename "
                    f"yours, or replace it knowingly with `overrides = ({name!r},)` in the "
                    "class body")


class Policy(Admission, Preemption, Progress, abc.ABC):
    """A scheduling policy.

    Must write:
      schedule(now)          the batch of this iteration (a SchedulerOutput)

    May set (class attributes):
      name                   registry name
      config_class           its settings (a SchedulerConfig subclass)
      reserves_kv            True: the KV manager reserves each request's max length up front
      whole_prompts          True: every entry computes all its request has left (no prompt
                             is chunked); the engine's guard checks every batch
      oracle                 True: may read true output lengths (`oracle_output_len`)
      speculates             True: its decodes take `schedule_decodes`'s speculation
                             (scheduler.num_speculative_tokens)
      fast_forward           a FastForward: the simulator may skip through its steady runs
                             (mechanics/fast_forward.py, with the rule for subclasses); None
                             (the default): stepped one iteration at a time
      fast_forward_off       (set on an instance that turns its class's declaration off,
                             with `fast_forward = None`) why: the summary's reason

    May override:
      token_limit()          the most tokens a batch may hold (the engine checks every batch)
      rejection_reason(req)  why an arrival can never be served
      preemption_victim(cs)  which running request to preempt
      preemption_mode_for(r) recompute or swap, per victim
      update(...)            with `super()`: e.g. counters of service (then declare a
                             fast_forward whose advance_decodes does the same, or be stepped)

    The toolkit at hand for `schedule()` (mechanics/, the mixins in TOOLKIT): `running`,
    `waiting` (a RequestQueue), `swapped`, `kv`; `admit_waiting`, `admit`,
    `admission_blocker`, `head_blocked`, `never_fits`; `schedule_decodes`,
    `allocate_or_preempt`, `preempt`, `swap_in_waiting`; `decode_reserved`;
    `mechanics.progress.split_running`; a token budget as an object, `Budget`
    (mechanics/budget.py: each entry charged what it computes). Its names are not to be
    redefined unknowingly: a class that does is refused unless it lists the name in
    `overrides` (HOOKS, meant to be overridden, need no entry).

    What the layers above use of a policy is `PolicyInterface` (interface.py), and only that:
    the engine's calls (`schedule`, `update`, `add_request`, `adopt`, `abort`, `reject`,
    `has_work`, `swap_in_possible`, `token_limit`, `rejection_reason`, `admission_blocker`),
    `bind_engine` and `bind_predictor` once, the run layer's classmethods, and a few views of
    state (`running`, `waiting`, `swapped`, `kv`, `cfg`, ...). tests/test_contracts.py checks
    that no module outside schedulers/ uses any other name.
    """

    name: ClassVar[str] = "base"
    config_class: ClassVar[type] = SchedulerConfig
    reserves_kv: ClassVar[bool] = False
    whole_prompts: ClassVar[bool] = False
    oracle: ClassVar[bool] = False
    #: toolkit names (mechanics/) this class replaces knowingly (`check_overrides`)
    overrides: ClassVar[tuple[str, ...]] = ()
    fast_forward: ClassVar[FastForward | None] = None
    fast_forward_off: str | None = None
    #: True when its decodes go through `schedule_decodes`, which gives each 1 + k tokens with
    #: scheduler.num_speculative_tokens = k; False: that setting is an error
    speculates: ClassVar[bool] = False
    _fast_forward_for: ClassVar[tuple] = ()   # the schedule and update it was declared for

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        bind(cls)   # the opt-in holds only for what it was declared for (fast_forward.py)
        check_overrides(cls)   # no toolkit name replaced unknowingly

    def __init__(self, cfg: SchedulerConfig, kv: KVCacheManager, queue: RequestQueue | None = None):
        self.cfg = cfg
        self.kv = kv
        self.max_model_len = kv.max_model_len
        # the run layer resolves plug-in queues by name or dotted path and passes one; built in
        # code without one, a policy takes the built-in queue its settings name
        self.waiting: RequestQueue = builtin_queue(cfg.queue) if queue is None else queue
        self.running: list[Request] = []
        # preempted by swap, in arrival order: swapped back in before any new admission
        self.swapped: list[Request] = []
        # admissions leave this many blocks free, so running requests can grow without
        # preempting each other at once (reserved KV never grows)
        self.watermark = 0 if kv.reserve else int(cfg.kv_watermark * kv.num_blocks)
        self._output_len = None   # given by the engine to oracle policies only
        if kv.window is not None:   # a decode run frees blocks: growth_list cannot count it
            self.fast_forward = None
            self.fast_forward_off = ("scheduler.sliding_window_kv=true: blocks leave the window "
                                     "during a decode run, which the fast-forward does not count")
        self.admission = None
        if cfg.max_queue_len is not None or cfg.deadline_admission:
            self.admission = AdmissionControl(cfg.max_queue_len, cfg.deadline_admission)

    @classmethod
    def parse_config(cls, values: dict, where: str = "scheduler") -> SchedulerConfig:
        """Typed settings from the ``scheduler`` config node (without its ``name``)."""
        return parse(cls.config_class, values, where, f"policy {cls.name!r}")

    @classmethod
    def setting_classes(cls, values: dict) -> tuple[type, ...]:
        """The settings classes whose fields the ``scheduler`` node `values` may set: the
        policy's, and those of the components it names there (a chunking policy's budget
        controller)."""
        return (cls.config_class,)

    @classmethod
    def needs_predictor(cls, cfg: SchedulerConfig) -> str | None:
        """The setting that makes this policy need a predictor of iteration time (a budget
        controller that prices batches), or None; checked against the executor at start-up."""
        return None

    def bind_engine(self, clock, output_len) -> None:
        """Called once by the engine that runs this policy: its clock (`Engine.clock`, which
        admission control reads) and, for a policy that declares ``oracle = True``, the
        executor's true output lengths (`oracle_output_len`; None for the others)."""
        self._output_len = output_len
        if self.admission is not None:
            self.admission.bind_clock(clock)

    def bind_predictor(self, predictor, slo=None) -> None:
        """Called once by the run layer: the executor's predictor of iteration time
        (`Executor.predictor`; None if it offers none) and the run's SLO settings (None: none).
        The policies that consult a budget controller hand them to it; others read neither."""

    @classmethod
    def unread_settings(cls, cfg: SchedulerConfig) -> dict[str, str]:
        """Settings of `cfg` that this policy does not read given the others: {key: why}. One
        the user set is an error (in a multirun, noted and left at its default)."""
        why = {}
        if cls.reserves_kv:
            why["preemption_mode"] = (f"policy {cls.name!r} reserves each request's KV up front "
                                      "and never preempts")
        if cls.reserves_kv or cfg.preemption_mode == "recompute":
            for k in ("swap_space_gib", "num_swap_blocks"):
                why[k] = why.get("preemption_mode") \
                    or "read only with scheduler.preemption_mode=swap"
        if not cls.speculates:
            why["num_speculative_tokens"] = (f"policy {cls.name!r} does not schedule "
                                             "speculative decodes")
        return why

    # -- what a policy writes, and what it may override ------------------------------------------
    @abc.abstractmethod
    def schedule(self, now: float) -> SchedulerOutput:
        """The batch of this iteration: which requests advance, by how many tokens."""

    def token_limit(self) -> int | None:
        """The most tokens a batch of this policy may hold (None: no cap). The engine checks
        every batch against it."""
        return None

    def rejection_reason(self, req: Request) -> str | None:
        """Why `req` can never be served under this configuration, or None."""
        if req.num_prompt_tokens + 1 > self.max_model_len:
            return (f"prompt of {req.num_prompt_tokens} tokens leaves no room to generate "
                    f"within max_model_len={self.max_model_len}")
        return self.never_fits(req)

    def preemption_victim(self, candidates: list[Request]) -> Request:
        """Which of `candidates` (running, not yet in this batch, in admission order) to preempt.
        Default: the queue's choice (FCFS: the latest admitted, as vLLM)."""
        return self.waiting.victim(candidates)

    def preemption_mode_for(self, req: Request) -> str:
        """How to preempt the victim `req`: "recompute" or "swap" (needs
        scheduler.preemption_mode=swap, which sizes the host swap space). Default: the
        setting. A swap that does not fit the free host blocks falls back to recompute."""
        return self.cfg.preemption_mode

    def oracle_output_len(self, req: Request) -> int:
        """The true output length, for research policies that declare ``oracle = True``."""
        if not self.oracle or self._output_len is None:
            raise PermissionError(
                f"{type(self).__name__} read a request's true output length; only a policy that "
                "declares `oracle = True` may (no real scheduler knows it)")
        return self._output_len(req)
