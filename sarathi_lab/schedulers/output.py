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
    # speculative decoding (scheduler.num_speculative_tokens): the draft tokens k of each entry,
    # aligned with reqs (0 for every ordinary entry) once any entry speculates; empty while none
    # does (no list to keep in the common case). A speculative entry is a decode given 1 + k
    # tokens: its last emitted token and k drafts the target verifies in this iteration.
    spec_lens: list[int] = field(default_factory=list)

    def add(self, req: Request, n: int, spec: int = 0) -> None:
        if not n > 0:   # the engine names the plug-in whose schedule() called this
            raise ValueError(f"broke the rule 'at least one token per entry': out.add(request "
                             f"{req.request_id!r}, {n!r}) gives it {n!r} tokens; a request "
                             "with nothing to compute this iteration is left out of the batch")
        if spec or self.spec_lens:
            self._spec_aligned().append(spec)
        self.reqs.append(req)
        self.num_new_tokens.append(n)

    def add_decodes(self, reqs: list[Request], spec: list[int] | None = None) -> None:
        """One token for each request, all of them decodes (the first entries of the batch);
        with `spec` (aligned with `reqs`), 1 + spec[i] tokens for the i-th: its drafts."""
        assert not self.reqs
        self.reqs.extend(reqs)
        if spec and any(spec):
            assert len(spec) == len(reqs)
            self.spec_lens = list(spec)
            self.num_new_tokens.extend([1 + s for s in spec])
        else:
            self.num_new_tokens.extend([1] * len(reqs))
        self.num_decodes = len(reqs)

    def _spec_aligned(self) -> list[int]:
        """spec_lens, padded with zeros for the entries added before the first speculative one."""
        lens = self.spec_lens
        if len(lens) < len(self.reqs):
            lens.extend([0] * (len(self.reqs) - len(lens)))
        return lens

    def spec_len(self, i: int) -> int:
        """The draft tokens of entry i (0: an ordinary entry)."""
        return self.spec_lens[i] if self.spec_lens else 0

    @property
    def total_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def split_counts(self) -> tuple[int, int]:
        """(prefill tokens, decode tokens). A decode computes exactly the last emitted token,
        and a speculative one its drafts too (1 + k decode tokens); everything else (prompt
        chunks, recompute after preemption) counts as prefill."""
        dec = self.num_decodes
        spec = self.spec_lens
        if dec is None:
            if spec:
                dec = sum(n for r, n, s in zip(self.reqs, self.num_new_tokens, spec)
                          if n == 1 + s and r.is_decoding)
            else:
                dec = sum(1 for r, n in zip(self.reqs, self.num_new_tokens)
                          if n == 1 and r.is_decoding)
        elif spec:
            dec += sum(spec)
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
