"""Admission: a request's way from arrival to the running batch.

An arrival is refused at once if it can never be served (`rejection_reason`) or admission
control refuses it (`schedulers/admission.py`), else it waits in the policy's queue. A waiting
request starts when `admission_blocker` finds nothing in its way: the one rule set of admission,
applied by `admit` and asked about the queue's head by `head_blocked`. `admit_waiting` admits
from the head in queue order and stops at the first that does not fit (as vLLM: no
overtaking). A mixin of `Policy` (it reads the policy's `cfg`, `kv`, `waiting`, `running`,
`swapped` and `watermark`).
"""
from __future__ import annotations

from sarathi_lab.request import Request, Status
from sarathi_lab.schedulers.mechanics.budget import Budget, check_budget
from sarathi_lab.schedulers.output import SchedulerOutput


class Admission:
    def add_request(self, req: Request) -> bool:
        """A request arrives: queue it, or reject it (with its reason) and return False."""
        reason = self.rejection_reason(req)
        if reason is None and self.admission is not None:
            reason = self.admission.refusal(req, self)
        if reason is not None:
            self.reject(req, reason)
            return False
        self.waiting.push(req)
        return True

    @staticmethod
    def reject(req: Request, reason: str) -> None:
        req.status = Status.REJECTED
        req.rejection_reason = reason

    def abort(self, req: Request, reason: str) -> bool:
        """Take `req` out of the policy wherever it is (waiting, running or swapped) and free
        its KV, device and host: its client went away (`sarathi-lab-serve`). It ends rejected
        with `reason`. False if it had already ended (nothing to do)."""
        if req.status in (Status.FINISHED, Status.REJECTED):
            return False
        if req.status is Status.RUNNING:
            self.running.remove(req)
        elif req.status is Status.SWAPPED:
            self.swapped.remove(req)
            self.kv.drop_swapped(req)
        else:
            self.waiting.remove(req)
        self.kv.free(req)   # a waiting request preempted by recompute holds none: no-op
        self.reject(req, reason)
        assert req not in self.running and req not in self.swapped and req not in self.waiting \
            and not self.kv.held_slots([req])[0] and not self.kv.host_block_table(req), \
            f"abort left request {req.request_id!r} in the policy or holding KV"
        return True

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def never_fits(self, req: Request) -> str | None:
        """Why the waiting `req` can never be admitted, or None."""
        kv = self.kv
        need = kv.min_blocks(req)
        if need > kv.num_blocks:
            return (f"needs {need} KV blocks, the cache has {kv.num_blocks} "
                    f"(block_size={kv.block_size})")
        # admission takes the whole prompt's blocks and leaves the watermark's free
        need = kv.admission_blocks(req)
        if need > kv.num_blocks - self.watermark:
            return (f"needs {need} KV blocks to start, but only {kv.num_blocks - self.watermark} "
                    f"of the cache's {kv.num_blocks} may be taken at admission: "
                    f"scheduler.kv_watermark={self.cfg.kv_watermark} keeps {self.watermark} free")
        return None

    def admission_blocker(self, req: Request, max_tokens: int, whole: bool = False,
                          hit: list = (), hit_tokens: int = 0) -> str | None:
        """Why the waiting `req` cannot start now with up to `max_tokens` tokens (all it needs if
        `whole`), or None if it can. The one rule set of admission: `admit` applies it, and
        `head_blocked` asks it about the queue's head."""
        if self.swapped:
            return "swapped requests first"   # vLLM v0: no new prompt while any is swapped
        if len(self.running) >= self.cfg.max_num_seqs:
            return "max_num_seqs"
        todo = req.num_tokens_to_compute - hit_tokens
        if max_tokens <= 0 or todo <= 0 or (whole and todo > max_tokens):
            return "token budget"
        # blocks for the whole prompt are taken at admission (Sarathi-Serve, vLLM), so later
        # chunks cannot be starved by decodes; the watermark keeps room for running requests
        need = self.kv.admission_blocks(req, hit)
        if need > self.kv.num_free_blocks - self.watermark:
            return "KV blocks"
        return None

    def admit(self, req: Request, max_tokens: int, whole: bool = False) -> int:
        """Start the waiting `req` (the queue's head) with up to `max_tokens` tokens (all it needs
        if `whole`). On success it moves to `running` and the number of tokens to schedule is
        returned; on failure 0 and nothing changes."""
        kv = self.kv
        hit, n_hit = kv.get_computed_blocks(req)
        if self.admission_blocker(req, max_tokens, whole, hit, n_hit) is not None:
            return 0
        todo = req.num_tokens_to_compute - n_hit
        n = min(todo, max_tokens)
        ok = kv.allocate_blocks(req, n, hit, lookahead=todo - n)
        assert ok is not None, "admission_blocker and the KV manager disagree"
        req.num_computed_tokens += n_hit
        req.status = Status.RUNNING
        popped = self.waiting.pop()
        assert popped is req, "admit() takes the queue's head"
        self.running.append(req)
        return n

    def adopt(self, req: Request) -> None:
        """Take over a request whose first token came out elsewhere and whose KV for its first
        `num_computed_tokens` tokens this policy's cache already holds (a disaggregated prefill
        handed it over; `KVCacheManager.allocate_received`): it joins `running`, decoding, as
        an admitted request would. The end the prefill replica recorded was a handoff, so it is
        cleared. The caller checks the seats and the KV (`admission_blocker`) first."""
        held = self.kv.held_slots([req])[0]
        assert held >= req.num_tokens and req.is_decoding, \
            f"request {req.request_id!r}: adopt needs its KV held and its first token out"
        req.status = Status.RUNNING
        req.finish_time = None
        req.finish_reason = None
        self.running.append(req)

    def admit_waiting(self, out: SchedulerOutput, budget: Budget, whole: bool = False) -> int:
        """Admit waiting requests in queue order while they fit (`budget`'s tokens left,
        max_num_seqs, KV); add their tokens to `out`, charged to `budget`; return what is left.
        Stops at the first that does not fit: no request overtakes the queue's head. Swapped
        requests come first (`swap_in_waiting`): none is admitted while any stays swapped."""
        check_budget(budget, "admit_waiting")
        self.swap_in_waiting(out, budget, whole)
        while self.waiting:
            req = self.waiting.peek()
            n = self.admit(req, budget.left, whole)
            if not n:
                # a preempted request that has grown may no longer fit at all: it would wait
                # forever at the head of the queue
                reason = self.never_fits(req)
                if reason is None:
                    break
                self.reject(self.waiting.pop(), reason)
                out.rejected.append(req)
                continue
            budget.add(out, self.running[-1], n)
        return budget.left

    def head_blocked(self, max_tokens: int, whole: bool = False) -> bool:
        """True if admitting the queue's head with `max_tokens` would fail now and keep failing
        while running requests only grow (each rule only tightens: running count, budget, free
        blocks). Conservative: False with prefix caching, where hits can change, and with a
        sliding-window cache, where decodes free the blocks that leave the window."""
        if not self.waiting or self.kv.enable_prefix_caching or self.kv.window is not None:
            return False
        return self.admission_blocker(self.waiting.peek(), max_tokens, whole) is not None
