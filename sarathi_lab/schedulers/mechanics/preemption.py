"""Preemption: what happens when a running request needs a KV block and none is free.

`allocate_or_preempt` (and `schedule_decodes`, one decode each, which uses it when KV runs
short) preempt the victims the policy chooses (`preemption_victim`), by the mode it chooses
(`preemption_mode_for`). Recompute drops the victim's KV: it starts over from token 0 in the
waiting queue. Swap (vLLM v0) copies its KV to host blocks: it waits in `swapped`, its progress
kept, and `swap_in_waiting` brings it back before any new admission. A mixin of `Policy`.
"""
from __future__ import annotations

from bisect import insort
from operator import attrgetter

from sarathi_lab.request import Request, Status
from sarathi_lab.schedulers.mechanics.budget import Budget, check_budget
from sarathi_lab.schedulers.output import SchedulerOutput

# vLLM's default swap_space: 4 GiB of host memory per GPU
DEFAULT_SWAP_SPACE_GIB = 4.0
_ARRIVAL = attrgetter("arrival_time")


def swap_blocks(cfg, block_bytes: int | None) -> int:
    """Host swap blocks of the scheduler settings `cfg` (0 unless preemption_mode=swap), given
    the bytes of one KV block on one GPU (None: unknown, then num_swap_blocks must be set)."""
    if cfg.preemption_mode != "swap":
        return 0
    if cfg.num_swap_blocks is not None:
        return cfg.num_swap_blocks
    if not block_bytes:
        raise ValueError("scheduler.preemption_mode=swap: the executor does not know the bytes "
                         "of a KV block, so scheduler.swap_space_gib cannot be converted; set "
                         "scheduler.num_swap_blocks")
    gib = cfg.swap_space_gib if cfg.swap_space_gib is not None else DEFAULT_SWAP_SPACE_GIB
    n = int(gib * 2**30 // block_bytes)
    if n < 1:
        raise ValueError(f"scheduler.swap_space_gib={gib}: holds no KV block of "
                         f"{block_bytes} bytes; raise it")
    return n


class Preemption:
    swap_blocks = staticmethod(swap_blocks)

    def preempt(self, req: Request, out: SchedulerOutput, mode: str | None = None) -> None:
        """Preempt the running `req`, by `mode` (None: `preemption_mode_for(req)`).
        Recompute: drop the KV, start over from token 0 in the waiting queue. Swap: its
        computed KV to host blocks, into the swapped queue with its progress kept; when the
        host blocks do not hold it, recompute (counted in `num_swap_fallbacks`). A request
        with nothing computed has nothing to swap: it is recomputed (nothing is lost)."""
        if mode is None:
            mode = self.preemption_mode_for(req)
        if mode == "swap":
            if not self.kv.num_host_blocks:
                raise ValueError(f"preemption mode 'swap' for request {req.request_id!r}, but "
                                 "there is no swap space (scheduler.preemption_mode="
                                 f"{self.cfg.preemption_mode})")
            if req.num_computed_tokens:
                if self.kv.can_swap_out(req):
                    self._swap_out(req, out)
                    return
                req.num_swap_fallbacks += 1
                out.swap_fallbacks.append(req)
        elif mode != "recompute":
            raise ValueError(f"preemption mode {mode!r} for request {req.request_id!r}: must be "
                             "'recompute' or 'swap'")
        self.kv.free(req)
        self.running.remove(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = Status.WAITING
        self.waiting.push_preempted(req)
        out.preempted.append(req)

    def _swap_out(self, req: Request, out: SchedulerOutput) -> None:
        pairs = self.kv.swap_out(req)
        self.running.remove(req)
        req.status = Status.SWAPPED
        req.num_preemptions += 1
        req.num_swap_outs += 1
        req.num_swapped_blocks += len(pairs)
        insort(self.swapped, req, key=_ARRIVAL)
        out.preempted.append(req)
        out.swapped_out.append((req, pairs))

    def swap_in_waiting(self, out: SchedulerOutput, budget: Budget, whole: bool = False) -> int:
        """Swap requests back in, oldest arrival first, while they fit (max_num_seqs, `budget`'s
        tokens left, their blocks above the watermark: vLLM v0's can_swap_in), each with its
        next tokens (up to what is left; all of them if `whole`) added to `out` and charged to
        `budget`; return what is left.
        Nothing is swapped in by a batch that preempted (vLLM: it means there is no room). A
        swapped request that could never get its blocks back is rejected."""
        check_budget(budget, "swap_in_waiting")
        if not self.swapped or out.preempted:
            return budget.left
        kv, seats = self.kv, self.cfg.max_num_seqs
        while self.swapped and budget:
            req = self.swapped[0]
            need = kv.swap_in_blocks(req)
            if need > kv.num_blocks - self.watermark:
                self.swapped.pop(0)
                kv.drop_swapped(req)
                self.reject(req, f"swapped out at {req.num_tokens} tokens; swapping it in needs "
                                 f"{need} KV blocks, but only {kv.num_blocks - self.watermark} "
                                 f"of the cache's {kv.num_blocks} may be taken "
                                 f"(scheduler.kv_watermark={self.cfg.kv_watermark})")
                out.rejected.append(req)
                continue
            todo = req.num_tokens_to_compute
            if len(self.running) >= seats or need > kv.num_free_blocks - self.watermark \
                    or (whole and todo > budget.left):
                break
            pairs = kv.swap_in(req)
            self.swapped.pop(0)
            req.status = Status.RUNNING
            req.num_swap_ins += 1
            self.running.append(req)
            out.swapped_in.append((req, pairs))
            decode = req.is_decoding
            budget.add(out, req, budget.chunk(req))
            if decode and out.num_decodes is not None:
                out.num_decodes += 1
        return budget.left

    def swap_in_possible(self) -> bool:
        """Whether the swapped queue's head could be swapped in now (seats and KV blocks): a
        decode run may not be skipped past it. Both only tighten while running requests grow."""
        if not self.swapped:
            return False
        kv = self.kv
        return len(self.running) < self.cfg.max_num_seqs \
            and kv.swap_in_blocks(self.swapped[0]) <= kv.num_free_blocks - self.watermark

    def allocate_or_preempt(self, req: Request, n: int, out: SchedulerOutput,
                            granted: list[Request] = ()) -> bool:
        """Room for `n` more tokens of the running `req`, preempting running requests that hold
        no tokens in this batch yet (not in `out`, nor in `granted`) until it fits; the victim is
        chosen by `preemption_victim` among them and `req` itself. False if `req` had to go
        (or, alone, can never fit)."""
        allocate = self.kv.allocate_slots
        while allocate(req, n) is None:
            busy = {id(r) for r in out.reqs}
            busy.update(id(r) for r in granted)
            candidates = [r for r in self.running if r is req or id(r) not in busy]
            victim = self.preemption_victim(candidates)
            assert victim in candidates, "preemption_victim must return one of the candidates"
            if victim is req and len(self.running) == 1:
                # alone and still no room: its length outgrew the whole cache
                self.kv.free(req)
                self.running.remove(req)
                self.reject(req, f"grew to {req.num_tokens} tokens, more than the "
                                 f"{self.kv.num_blocks} KV blocks hold")
                out.rejected.append(req)
                return False
            self.preempt(victim, out)
            if victim is req:
                return False
        return True

    def speculation_length(self) -> int:
        """k, the draft tokens of this iteration's decodes: scheduler.num_speculative_tokens (a
        budget controller may choose fewer per iteration: controllers/consult.py)."""
        return self.cfg.num_speculative_tokens

    def iteration_token_limit(self) -> int | None:
        """The tokens this iteration's batch may hold: `token_limit()` (a budget controller's
        budget for the iteration where one is consulted)."""
        return self.token_limit()

    def schedule_decodes(self, out: SchedulerOutput, decodes: list[Request]) -> None:
        """One decode for each of `decodes` (running requests), as the batch's first entries;
        when KV runs short, one by one, preempting as `allocate_or_preempt` does. With
        k = `speculation_length()` > 0, each gets 1 + k tokens (its drafts, `speculative_lens`,
        within the iteration's `iteration_token_limit()`: the decodes come first) where
        the free KV blocks hold them all, else one token each."""
        k = self.speculation_length()
        if k:
            spec = speculative_lens(decodes, k, self.iteration_token_limit(), self.max_model_len)
            if any(spec) and self.kv.allocate_decodes(decodes, [1 + s for s in spec]):
                out.add_decodes(decodes, spec)
                return
            # drafts never preempt a request: short of KV (or with prefix caching, whose
            # blocks are hashed one request at a time), this iteration decodes one token each
        if not self.kv.allocate_decodes(decodes):
            granted: list[Request] = []
            for r in decodes:
                if r.status is Status.RUNNING and self.allocate_or_preempt(r, 1, out, granted):
                    granted.append(r)
            decodes = granted
        out.add_decodes(decodes)


def speculative_lens(decodes: list[Request], k: int, budget: int | None,
                     max_model_len: int) -> list[int]:
    """The draft tokens of each decode: k, fewer where the token budget left after one token
    for every decode runs out (in the decodes' order), where max_model_len leaves less room, or
    where the request's max_tokens (its user's cap, which a real scheduler sees) does."""
    room = len(decodes) * k if budget is None else budget - len(decodes)
    spec = []
    for r in decodes:
        s = min(k, room, max_model_len - r.num_computed_tokens - 1)
        if r.max_tokens is not None:
            s = min(s, r.max_tokens - r.num_output_tokens - 1)
        s = max(s, 0)
        room -= s
        spec.append(s)
    return spec
