"""The policy contract, and what every policy shares: the waiting queue, admission, preemption,
and the one place where request progress changes (`update`, `advance_decodes`).

A plug-in policy subclasses `Policy` (or a built-in one), sets `name`, declares its settings as a
dataclass subclassing `SchedulerConfig` (`config_class`) and writes `schedule()`. It needs only
this module, `schedulers.output` and `request`.
"""
from __future__ import annotations

import abc
from bisect import insort
from dataclasses import dataclass
from operator import attrgetter
from typing import ClassVar

from sarathi_lab.kv import KVCacheManager
from sarathi_lab.request import Request, Status
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.schedulers.queues import RequestQueue
from sarathi_lab.settings import setting


@dataclass
class SchedulerConfig:
    """Settings every policy reads (the KV cache and the queue are shared machinery)."""
    max_num_seqs: int = setting(128, ge=1, help="cap on running requests")
    block_size: int = setting(16, ge=1, le=4096, help="tokens per KV block, a power of two")
    num_kv_blocks: int | None = setting(None, ge=1,
                                        help="null: what fits the executor's memory")
    enable_prefix_caching: bool = setting(False, help="share cached prompt blocks (paged KV)")
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

    def validate(self) -> None:
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size={self.block_size}: must be a power of two")
        if self.swap_space_gib is not None and self.num_swap_blocks is not None:
            raise ValueError(f"swap_space_gib={self.swap_space_gib} and num_swap_blocks="
                             f"{self.num_swap_blocks}: set one of them (both size the host swap "
                             "space)")


# vLLM's default swap_space: 4 GiB of host memory per GPU
DEFAULT_SWAP_SPACE_GIB = 4.0
_ARRIVAL = attrgetter("arrival_time")


class Policy(abc.ABC):
    """A scheduling policy. Subclasses write `schedule()`; the rest is shared.

    Class attributes a policy may set:
      name            registry name
      config_class    its settings (a SchedulerConfig subclass)
      reserves_kv     True: the KV manager reserves each request's max length up front
      whole_prompts   True: prompts are never chunked
      oracle          True: may read true output lengths (`self.oracle_output_len(req)`)

    Hooks a policy may override: `schedule` (must), `steady_decode` and `steady_chunks` (let
    the simulator skip ahead through decode runs and chunked prefills), `rejection_reason`,
    `preemption_victim`, `preemption_mode_for` (recompute or swap, per victim). `update`,
    `advance_decodes` and `advance_chunks` change request progress; a policy that overrides
    `update` without `advance_decodes` (or `schedule` without `steady_decode`) runs with the
    simulator's fast-forward off, and one that overrides `update` or `schedule` below the class
    that wrote its `steady_chunks` and `advance_chunks` is stepped through its prefills, so
    skipping can never bypass it.
    """

    name: ClassVar[str] = "base"
    config_class: ClassVar[type] = SchedulerConfig
    reserves_kv: ClassVar[bool] = False
    whole_prompts: ClassVar[bool] = False
    oracle: ClassVar[bool] = False

    def __init__(self, cfg: SchedulerConfig, kv: KVCacheManager, queue: RequestQueue | None = None):
        self.cfg = cfg
        self.kv = kv
        self.max_model_len = kv.max_model_len
        if queue is None:   # built in code: the same names and dotted paths as the CLI's
            from sarathi_lab.registry import queue_class
            queue = queue_class(cfg.queue)()
        self.waiting: RequestQueue = queue
        self.running: list[Request] = []
        # preempted by swap, in arrival order: swapped back in before any new admission
        self.swapped: list[Request] = []
        # admissions leave this many blocks free, so running requests can grow without
        # preempting each other at once (reserved KV never grows)
        self.watermark = 0 if kv.reserve else int(cfg.kv_watermark * kv.num_blocks)
        self._output_len = None   # given by the engine to oracle policies only
        self.admission = None
        if cfg.max_queue_len is not None or cfg.deadline_admission:
            from sarathi_lab.schedulers.admission import AdmissionControl
            self.admission = AdmissionControl(cfg.max_queue_len, cfg.deadline_admission)

    @classmethod
    def parse_config(cls, values: dict, where: str = "scheduler") -> SchedulerConfig:
        """Typed settings from the ``scheduler`` config node (without its ``name``)."""
        from sarathi_lab.settings import parse
        return parse(cls.config_class, values, where, f"policy {cls.name!r}")

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
        return why

    @staticmethod
    def swap_blocks(cfg: SchedulerConfig, block_bytes: int | None) -> int:
        """Host swap blocks of `cfg` (0 unless preemption_mode=swap), given the bytes of one KV
        block on one GPU (None: unknown, then num_swap_blocks must be set)."""
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

    # -- hooks --------------------------------------------------------------------------------
    @abc.abstractmethod
    def schedule(self, now: float) -> SchedulerOutput:
        """The batch of this iteration: which requests advance, by how many tokens."""

    def token_limit(self) -> int | None:
        """The most tokens a batch of this policy may hold (None: no cap). The engine checks
        every batch against it."""
        return None

    def steady_decode(self) -> bool:
        """True if, while nothing arrives and nothing finishes, the next `schedule()` would be
        exactly one decode of every running request. Asked only when every running request is
        decoding (its prompt done, its last token emitted), after any batch: a decode batch, one
        in which requests finished, or one that completed prompts. Lets the simulator skip
        ahead; False is always safe."""
        return False

    def steady_chunks(self) -> tuple[Request, int] | None:
        """(req, chunk) if, while nothing arrives, nothing finishes and KV suffices, the next
        `schedule()` calls would each be one decode of every other running request plus `chunk`
        tokens of the running `req`'s prompt (what is left of it, if fewer), and admit nothing
        while it lasts, the last chunk included if no request waits; else None. Asked after
        batches that left a prompt under way. Lets the simulator skip ahead through a chunked
        prefill (`advance_chunks`); None is always safe."""
        return None

    def rejection_reason(self, req: Request) -> str | None:
        """Why `req` can never be served under this configuration, or None."""
        if req.num_prompt_tokens + 1 > self.max_model_len:
            return (f"prompt of {req.num_prompt_tokens} tokens leaves no room to generate "
                    f"within max_model_len={self.max_model_len}")
        return self._never_fits(req)

    def _never_fits(self, req: Request) -> str | None:
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

    # -- queue and admission -----------------------------------------------------------------------
    def add_request(self, req: Request) -> bool:
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

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

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

    def admit_waiting(self, out: SchedulerOutput, budget: int, whole: bool = False) -> int:
        """Admit waiting requests in queue order while they fit (`budget` tokens, max_num_seqs,
        KV); add their tokens to `out`; return the budget left. Stops at the first that does
        not fit: no request overtakes the queue's head. Swapped requests come first
        (`swap_in_waiting`): none is admitted while any stays swapped."""
        budget = self.swap_in_waiting(out, budget, whole)
        while self.waiting:
            req = self.waiting.peek()
            n = self.admit(req, budget, whole)
            if not n:
                # a preempted request that has grown may no longer fit at all: it would wait
                # forever at the head of the queue
                reason = self._never_fits(req)
                if reason is None:
                    break
                self.reject(self.waiting.pop(), reason)
                out.rejected.append(req)
                continue
            out.add(self.running[-1], n)
            budget -= n
        return budget

    def head_blocked(self, max_tokens: int, whole: bool = False) -> bool:
        """True if admitting the queue's head with `max_tokens` would fail now and keep failing
        while running requests only grow (each rule only tightens: running count, budget, free
        blocks). Conservative: False with prefix caching, where hits can change."""
        if not self.waiting or self.kv.enable_prefix_caching:
            return False
        return self.admission_blocker(self.waiting.peek(), max_tokens, whole) is not None

    def decode_reserved(self, out: SchedulerOutput) -> None:
        """One decode for every running request whose KV was reserved up front (no growth, so
        no preemption; whole-prompt admission leaves no partial prefill behind)."""
        ok = self.kv.reserve and self.kv.allocate_decodes(self.running)
        assert ok, "decode_reserved needs reserved KV"
        out.add_decodes(list(self.running))

    # -- preemption ------------------------------------------------------------------------------
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

    def swap_in_waiting(self, out: SchedulerOutput, budget: int, whole: bool = False) -> int:
        """Swap requests back in, oldest arrival first, while they fit (max_num_seqs, `budget`
        tokens, their blocks above the watermark: vLLM v0's can_swap_in), each with its next
        tokens (up to `budget`; all of them if `whole`) added to `out`; return the budget left.
        Nothing is swapped in by a batch that preempted (vLLM: it means there is no room). A
        swapped request that could never get its blocks back is rejected."""
        if not self.swapped or out.preempted:
            return budget
        kv, seats = self.kv, self.cfg.max_num_seqs
        while self.swapped and budget > 0:
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
                    or (whole and todo > budget):
                break
            pairs = kv.swap_in(req)
            self.swapped.pop(0)
            req.status = Status.RUNNING
            req.num_swap_ins += 1
            self.running.append(req)
            out.swapped_in.append((req, pairs))
            n = min(todo, budget)
            decode = req.is_decoding
            out.add(req, n)
            if decode and out.num_decodes is not None:
                out.num_decodes += 1
            budget -= n
        return budget

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

    def schedule_decodes(self, out: SchedulerOutput, decodes: list[Request]) -> None:
        """One decode for each of `decodes` (running requests), as the batch's first entries;
        when KV runs short, one by one, preempting as `allocate_or_preempt` does."""
        if not self.kv.allocate_decodes(decodes):
            granted: list[Request] = []
            for r in decodes:
                if r.status is Status.RUNNING and self.allocate_or_preempt(r, 1, out, granted):
                    granted.append(r)
            decodes = granted
        out.add_decodes(decodes)

    # -- progress: the one place it changes ---------------------------------------------------------
    def update(self, out: SchedulerOutput, step, start: float, end: float) -> list[Request]:
        """Apply an executed batch (`step`, a StepResult): advance counters, emit tokens, end the
        requests the executor ended, free their KV. Returns the requests that finished."""
        if self.admission is not None:
            self.admission.observe(out.split_counts()[0], start, end)
        done = []
        sampled = step.sampled
        ended = set(step.finished) if step.finished else ()
        for i, (req, n) in enumerate(zip(out.reqs, out.num_new_tokens)):
            if req.first_scheduled_time is None:
                req.first_scheduled_time = start
            done_n = req.num_computed_tokens + n
            req.num_computed_tokens = done_n
            out_n = req.num_output_tokens
            if done_n == req.num_prompt_tokens + out_n:
                req.num_output_tokens = out_n + 1
                req.token_times.append(end)
                if sampled is not None:
                    req.output_token_ids.append(sampled[i])
                if i in ended:
                    req.status = Status.FINISHED
                    req.finish_time = end
                    self.kv.free(req)
                    done.append(req)
        if done:
            self.running = [r for r in self.running if r.status is Status.RUNNING]
        if out.swapped_out or out.swapped_in:
            self._charge_swap_time(out, step.swap_s)
        return done

    @staticmethod
    def _charge_swap_time(out: SchedulerOutput, seconds: float) -> None:
        """Each swapped request's share of the iteration's swap time, by the blocks it moved."""
        moves = out.swapped_out + out.swapped_in
        total = sum(len(p) for _, p in moves)
        if total and seconds:
            for r, pairs in moves:
                r.swap_time_s += seconds * len(pairs) / total

    def advance_chunks(self, times: list[float], req: Request, chunks: list[int]) -> None:
        """What len(times) `update()` calls would do for the batches `steady_chunks` offered:
        one decode of every running request but `req` and `chunks[j]` tokens of `req`'s prompt
        in batch j, which ends at times[j]. If the last chunk completes the prompt, `req` emits
        its first token then. Nothing ends."""
        decodes = [r for r in self.running if r is not req]
        k = len(times)
        kv = self.kv
        ok = kv.allocate_decodes(decodes, k)
        assert ok, "fast-forward checked the KV blocks first"
        for r in decodes:
            r.num_computed_tokens += k
            r.num_output_tokens += k
            r.token_times.extend(times)
        for c in chunks:
            new = kv.allocate_blocks(req, c)
            assert new == [], "prompt blocks are held from admission"
            req.num_computed_tokens += c
        if req.num_computed_tokens == req.num_prompt_tokens + req.num_output_tokens:
            req.num_output_tokens += 1
            req.token_times.append(times[-1])

    def advance_decodes(self, times: list[float], ended: list[Request] = ()) -> list[Request]:
        """What len(times) `update()` calls would do for as many decode-only batches of every
        running request: the fast-forward's one entry point. `ended` (running requests, in
        `running` order): those the executor ends in the last of these batches, as `update`
        ends them; none ends before. Returns them, finished (as `update` returns its batch's).
        An override that takes no `ended` is never given one (the engine then steps every
        batch that ends a request)."""
        k = len(times)
        running = self.running
        if self.admission is not None:
            self.admission.clock = times[-1]
        if not self.kv.allocate_decodes(running, k):
            for r in running:   # prefix caching hashes full blocks one request at a time
                ok = self.kv.allocate_slots(r, k)
                assert ok is not None, "fast-forward checked the KV blocks first"
        for r in running:
            r.num_computed_tokens += k
            r.num_output_tokens += k
            r.token_times.extend(times)
        if not ended:
            return []
        end = times[-1]
        for r in ended:
            r.status = Status.FINISHED
            r.finish_time = end
            self.kv.free(r)
        self.running = [r for r in running if r.status is Status.RUNNING]
        return list(ended)
