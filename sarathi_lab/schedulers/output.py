"""What a policy's `schedule()` returns: the requests that advance this iteration, and by how much."""
from __future__ import annotations

from dataclasses import dataclass, field

from sarathi_lab.request import Request


@dataclass(slots=True)
class SchedulerOutput:
    reqs: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)   # aligned with reqs
    preempted: list[Request] = field(default_factory=list)    # preempted while building this batch
    rejected: list[Request] = field(default_factory=list)     # outgrew the whole KV cache
    num_decodes: int | None = None   # set by policies that know it; else counted on demand
    # preemption by swap: (request, [(device block, host block), ...]) swapped out while
    # building this batch (also in `preempted`), (request, [(host block, device block), ...])
    # swapped back in (also in `reqs`); the executor copies these blocks before the batch runs
    swapped_out: list[tuple[Request, list[tuple[int, int]]]] = field(default_factory=list)
    swapped_in: list[tuple[Request, list[tuple[int, int]]]] = field(default_factory=list)
    # victims the policy chose to swap that were recomputed: the host blocks were full
    swap_fallbacks: list[Request] = field(default_factory=list)

    def add(self, req: Request, n: int) -> None:
        if not n > 0:   # the engine names the plug-in whose schedule() called this
            raise ValueError(f"broke the rule 'at least one token per entry': out.add(request "
                             f"{req.request_id!r}, {n!r}) gives it {n!r} tokens; a request "
                             "with nothing to compute this iteration is left out of the batch")
        self.reqs.append(req)
        self.num_new_tokens.append(n)

    def add_decodes(self, reqs: list[Request]) -> None:
        """One token for each request, all of them decodes (the first entries of the batch)."""
        assert not self.reqs
        self.reqs.extend(reqs)
        self.num_new_tokens.extend([1] * len(reqs))
        self.num_decodes = len(reqs)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def split_counts(self) -> tuple[int, int]:
        """(prefill tokens, decode tokens). A decode computes exactly the last emitted token;
        everything else (prompt chunks, recompute after preemption) counts as prefill."""
        dec = self.num_decodes
        if dec is None:
            dec = sum(1 for r, n in zip(self.reqs, self.num_new_tokens)
                      if n == 1 and r.is_decoding)
        return self.total_tokens - dec, dec

    @property
    def blocks_to_swap_out(self) -> list[tuple[int, int]]:
        """Every (device block, host block) pair of this batch's swap-outs."""
        return [p for _, pairs in self.swapped_out for p in pairs]

    @property
    def blocks_to_swap_in(self) -> list[tuple[int, int]]:
        """Every (host block, device block) pair of this batch's swap-ins."""
        return [p for _, pairs in self.swapped_in for p in pairs]

    def __len__(self) -> int:
        return len(self.reqs)
