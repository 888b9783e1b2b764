"""A request and its one progress counter.

There is no prefill or decode phase: ``num_computed_tokens`` catches up with ``num_tokens``
(prompt + output so far). A prefill chunk, a whole prompt, a decode step and the recompute after a
preemption are all "compute the next n tokens"; whenever the counter reaches ``num_tokens`` the
model emits one output token.
"""
from __future__ import annotations

import enum
import math


class Status(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    FINISHED = 2
    REJECTED = 3
    SWAPPED = 4     # preempted by swap: its KV in host memory, waiting to be swapped back in


class Request:
    __slots__ = (
        "request_id", "arrival_time", "num_prompt_tokens", "prompt_token_ids", "max_tokens",
        "_output_len", "num_output_tokens", "output_token_ids", "num_computed_tokens", "status",
        "first_scheduled_time", "finish_time", "token_times", "num_preemptions",
        "rejection_reason", "block_hashes", "extra", "finish_reason",
        "priority", "tenant", "deadline", "slo_class",
        "num_swap_outs", "num_swap_ins", "num_swap_fallbacks", "num_swapped_blocks", "swap_time_s",
        "spec_proposed", "spec_accepted", "_planned_ids",
    )

    def __init__(self, request_id, arrival_time: float, num_prompt_tokens: int,
                 output_len: int | None = None,
                 prompt_token_ids: list[int] | None = None, max_tokens: int | None = None, *,
                 priority: int = 0, tenant: str = "default", deadline: float | None = None,
                 slo_class: str = "default", planned_output_ids: list[int] | None = None):
        self.request_id = request_id
        self.arrival_time = float(arrival_time)
        self.num_prompt_tokens = int(num_prompt_tokens)
        self.prompt_token_ids = prompt_token_ids
        # The user's cap, as a real API call carries it; schedulers may read it.
        self.max_tokens = max_tokens
        # The workload's output length (the trace's; in effect where its EOS falls). The engine
        # hands it to the executor on arrival (`take_output_len`), which decides when the
        # request ends: no policy can read it, as no real scheduler knows it.
        self._output_len = None if output_len is None else int(output_len)
        self.num_output_tokens = 0
        self.output_token_ids: list[int] = []
        # The workload's answer as token ids (a session's, which the next turn's prompt repeats):
        # where the executor samples none (the simulator), the request emits these, so the KV
        # blocks its decodes fill are hashed like prompt blocks and a later prompt that repeats
        # them hits the prefix cache (`emit_planned`). A real executor's own tokens go first.
        # Private like `_output_len`: no policy may read it (its length is the output length).
        if planned_output_ids is not None and output_len is not None \
                and len(planned_output_ids) < output_len:
            raise ValueError(f"request {request_id!r}: {len(planned_output_ids)} planned output "
                             f"token ids for an output of {output_len} tokens")
        self._planned_ids = planned_output_ids
        self.num_computed_tokens = 0
        self.status = Status.WAITING
        self.first_scheduled_time: float | None = None
        self.finish_time: float | None = None
        self.token_times: list[float] = []
        self.num_preemptions = 0      # by recompute and by swap
        # preemption by swap (schedulers/base.py): times its KV went to host memory and came
        # back, swaps the policy chose that fell back to recompute (host space full), KV blocks
        # moved out (each comes back as one block), and its share of the iterations' swap time
        self.num_swap_outs = 0
        self.num_swap_ins = 0
        self.num_swap_fallbacks = 0
        self.num_swapped_blocks = 0
        self.swap_time_s = 0.0
        # speculative decoding: draft tokens proposed for it and accepted by the target, summed
        # over its speculative steps (accepted ones past its stop included: they measure the
        # draft, though dropped from its output)
        self.spec_proposed = 0
        self.spec_accepted = 0
        self.rejection_reason: str | None = None
        # "stop" (its trace length), "max_tokens", "max_model_len"; the torch executor with
        # stop_at_eos: "eos" (sampled its EOS) or "length" (the trace length capped it)
        self.finish_reason: str | None = None
        self.block_hashes: list = []  # prefix-cache hashes of full blocks, filled lazily
        self.extra: dict = {}         # policy plugins keep per-request state here
        # Service attributes a trace may set (columns of the same names); policies may read them.
        self.priority = int(priority)   # lower value = more urgent (0 is the default class)
        self.tenant = str(tenant)
        self.deadline = None if deadline is None else float(deadline)  # absolute time, seconds
        if self.deadline is not None and not math.isfinite(self.deadline):
            raise ValueError(f"request {request_id!r}: deadline={deadline!r} must be finite")
        self.slo_class = str(slo_class)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_tokens_to_compute(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """True when the next step computes exactly the last emitted token."""
        return self.num_computed_tokens == self.num_prompt_tokens + self.num_output_tokens - 1 \
            and self.num_output_tokens > 0

    def take_output_len(self) -> int | None:
        """The workload's output length, handed over once (by the engine, to the executor)."""
        n, self._output_len = self._output_len, None
        return n

    def emit_planned(self, n: int) -> None:
        """The next `n` output tokens are the planned ones (a simulated step that emits `n`
        tokens; nothing without planned ids): called where a request's tokens are emitted,
        before the KV blocks of the step are hashed."""
        if self._planned_ids is not None:
            out = self.output_token_ids
            out += self._planned_ids[len(out):len(out) + n]

    def all_token_ids(self) -> list[int]:
        assert self.prompt_token_ids is not None
        return self.prompt_token_ids + self.output_token_ids

    def __repr__(self):
        return (f"Request({self.request_id}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}, computed={self.num_computed_tokens}, "
                f"{self.status.name})")
