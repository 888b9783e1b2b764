"""What the layers above use of a policy, and nothing else: the engine, the topologies, the
run layer and the server hold a policy through this interface. `Policy` (base.py) implements
it together with the toolkit a policy composes (mechanics/); a name of the toolkit that is not
here is the policy's own business, so it can change without the engine noticing.

tests/test_contracts.py scans every module outside `schedulers/` and fails on a policy name
read or called there that this interface does not list.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:   # types only: the interface imports nothing at run time
    from sarathi_lab.kv import KVCacheManager
    from sarathi_lab.request import Request
    from sarathi_lab.schedulers.output import SchedulerOutput


class PolicyInterface(Protocol):
    # -- the engine's calls, each iteration and on each arrival ---------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        """The batch of this iteration."""

    def update(self, out: SchedulerOutput, step, start: float, end: float) -> list[Request]:
        """Progress after the batch ran; the requests it finished."""

    def add_request(self, req: Request) -> bool:
        """Queue an arrival, or reject it (False)."""

    def adopt(self, req: Request) -> None:
        """A request whose first token came out elsewhere joins the running batch."""

    def abort(self, req: Request) -> None:
        """A served request whose client went away: free it wherever it is."""

    def reject(self, req: Request, reason: str) -> None:
        """Mark a request rejected, with its reason."""

    def has_work(self) -> bool:
        """Whether anything waits, runs or is swapped out."""

    def swap_in_possible(self) -> bool:
        """Whether the swapped queue's head could come back now."""

    def token_limit(self) -> int | None:
        """The most tokens a batch may hold (the guard checks every batch)."""

    def rejection_reason(self, req: Request) -> str | None:
        """Why a request can never be served here, or None."""

    def admission_blocker(self, req: Request, max_tokens: int, whole: bool = False) -> str | None:
        """What stops `req` from being admitted now (a router asks before it sends)."""

    # -- once, when a run is built ---------------------------------------------------------------
    def bind_engine(self, clock, output_len) -> None:
        """The engine's clock, and (for an oracle policy) the true output lengths."""

    def bind_predictor(self, predictor, slo=None) -> None:
        """The executor's predictor of iteration time and the run's SLO."""

    # -- the run layer's, on the class -----------------------------------------------------------
    @classmethod
    def parse_config(cls, values: dict, where: str = "scheduler"): ...
    @classmethod
    def setting_classes(cls, values: dict) -> tuple[type, ...]: ...
    @classmethod
    def needs_predictor(cls, cfg) -> str | None: ...
    @classmethod
    def unread_settings(cls, cfg) -> dict[str, str]: ...

    # -- state the layers above read (never write) -----------------------------------------------
    name: ClassVar[str]
    oracle: ClassVar[bool]
    whole_prompts: ClassVar[bool]
    fast_forward: ClassVar[object]     # the policy's FastForward declaration, or None
    fast_forward_off: str | None       # why an instance turned its class's declaration off
    cfg: object                        # its typed settings
    kv: KVCacheManager
    max_model_len: int
    running: list[Request]
    waiting: object                    # its RequestQueue
    swapped: list[Request]


#: every name of the interface (the test's list)
NAMES = frozenset(n for n in {**PolicyInterface.__dict__, **PolicyInterface.__annotations__}
                  if not n.startswith("_"))
