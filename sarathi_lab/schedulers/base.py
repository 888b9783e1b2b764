"""The policy interface and what every policy shares: queues, admission, preemption, update."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from sarathi_lab.kv import KVCacheManager
from sarathi_lab.request import Request, Status
from sarathi_lab.schedulers.output import SchedulerOutput


@dataclass
class SchedulerConfig:
    name: str = "sarathi"
    max_num_seqs: int = 128
    token_budget: int = 512                    # sarathi: tokens per iteration (the chunk size)
    max_num_batched_tokens: int | None = None  # vllm (and optional cap for orca); None: max(max_model_len, 2048)
    block_size: int = 16
    num_kv_blocks: int | None = None           # None: what fits the executor's memory
    enable_prefix_caching: bool = False
    kv_watermark: float = 0.01                 # share of KV blocks kept free when admitting (vLLM)
    max_model_len: int | None = None           # None: the model's
    extra: dict = field(default_factory=dict)  # plugin settings

    def validate(self) -> None:
        def bad(setting, value, why):
            raise ValueError(f"scheduler.{setting}={value!r}: {why}")
        if self.max_num_seqs < 1:
            bad("max_num_seqs", self.max_num_seqs, "must be >= 1")
        if self.token_budget < 1:
            bad("token_budget", self.token_budget, "must be >= 1")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            bad("max_num_batched_tokens", self.max_num_batched_tokens, "must be >= 1")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            bad("block_size", self.block_size, "must be a power of two")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            bad("num_kv_blocks", self.num_kv_blocks, "must be >= 1")
        if not 0 <= self.kv_watermark < 1:
            bad("kv_watermark", self.kv_watermark, "must be in [0, 1)")
        if self.max_model_len is not None and self.max_model_len < 2:
            bad("max_model_len", self.max_model_len, "must be >= 2")


class Policy:
    """A scheduling policy. Subclasses write `schedule()`; the rest is shared.

    Class attributes a policy may set:
      name            registry name
      reserves_kv     True: the KV manager reserves each request's max length up front
      whole_prompts   True: prompts are never chunked (max_num_batched_tokens >= max_model_len)
      oracle          True: may read true output lengths (`req.oracle_output_len(self)`)
    """

    name = "base"
    reserves_kv = False
    whole_prompts = False
    oracle = False

    def __init__(self, cfg: SchedulerConfig, kv: KVCacheManager):
        self.cfg = cfg
        self.kv = kv
        self.max_model_len = kv.max_model_len
        if self.whole_prompts and cfg.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"scheduler.max_num_batched_tokens={cfg.max_num_batched_tokens} is smaller than "
                f"max_model_len={self.max_model_len}: {self.name} schedules whole prompts, so a "
                "long prompt could never run (raise it or lower scheduler.max_model_len)")
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # admissions leave this many blocks free, so running requests can grow without
        # preempting each other at once (reserved KV never grows)
        self.watermark = 0 if kv.reserve else int(cfg.kv_watermark * kv.num_blocks)

    # -- hooks --------------------------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        raise NotImplementedError

    def steady_decode(self) -> bool:
        """True if, while nothing arrives and nothing finishes, the next `schedule()` would again
        be exactly one decode of every running request (the engine checks that this one was).
        Lets the simulator skip ahead; False is always safe."""
        return False

    def rejection_reason(self, req: Request) -> str | None:
        """Why `req` can never be served under this configuration, or None."""
        if req.num_prompt_tokens + 1 > self.max_model_len:
            return (f"prompt of {req.num_prompt_tokens} tokens leaves no room to generate "
                    f"within max_model_len={self.max_model_len}")
        need = self.kv.min_blocks(req)
        if need > self.kv.num_blocks:
            return (f"needs {need} KV blocks, the cache has {self.kv.num_blocks} "
                    f"(block_size={self.kv.block_size})")
        return None

    # -- shared -------------------------------------------------------------------------------
    def add_request(self, req: Request) -> bool:
        reason = self.rejection_reason(req)
        if reason is not None:
            req.status = Status.REJECTED
            req.rejection_reason = reason
            return False
        stop = req._stop_len
        if req.max_tokens is not None:
            stop = min(stop, req.max_tokens)
        req._stop_at = min(stop, self.max_model_len - req.num_prompt_tokens)
        self.waiting.append(req)
        return True

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def admit(self, req: Request, max_tokens: int, whole: bool = False) -> int:
        """Try to start the waiting request `req` (the head of `waiting`) with up to `max_tokens`
        tokens (all it needs if `whole`). Blocks for its whole prompt are taken now, as
        Sarathi-Serve and vLLM do, so its later chunks cannot be starved by decodes. On success
        it moves to `running` and the number of tokens to schedule is returned; on failure 0
        and nothing changes."""
        kv = self.kv
        hit, n_hit = kv.get_computed_blocks(req)
        todo = req.num_tokens_to_compute - n_hit
        n = todo if whole else min(todo, max_tokens)
        if n <= 0 or n > max_tokens or not self._fits_watermark(req, len(hit)):
            return 0
        if kv.allocate_slots(req, n, hit, lookahead=todo - n) is None:
            return 0
        req.num_computed_tokens += n_hit
        req.status = Status.RUNNING
        self.waiting.popleft()
        self.running.append(req)
        return n

    def decode_reserved(self, out: SchedulerOutput) -> None:
        """One decode for every running request whose KV was reserved up front (no growth, so
        no preemption; whole-prompt admission leaves no partial prefill behind)."""
        ok = self.kv.reserve and self.kv.allocate_decodes(self.running)
        assert ok, "decode_reserved needs reserved KV"
        out.add_decodes(list(self.running))

    def admit_waiting(self, out: SchedulerOutput, budget: int, whole: bool = False) -> int:
        """Admit waiting requests in FCFS order while they fit (`budget` tokens, max_num_seqs,
        KV); add their tokens to `out`; return the budget left."""
        while budget > 0 and self.waiting and len(self.running) < self.cfg.max_num_seqs:
            n = self.admit(self.waiting[0], budget, whole)
            if not n:
                break
            out.add(self.running[-1], n)
            budget -= n
        return budget

    def _fits_watermark(self, req: Request, num_hit_blocks: int) -> bool:
        kv = self.kv
        return not self.watermark or \
            kv.num_free_blocks - kv.blocks_needed(req.num_tokens) + num_hit_blocks >= self.watermark

    def head_blocked(self, max_tokens: int, whole: bool = False) -> bool:
        """True if `admit(self.waiting[0], max_tokens, whole)` would fail now and keep failing
        while running requests only grow (free KV blocks only shrink). Conservative: False
        when unsure (prefix caching, where hits can change)."""
        if not self.waiting or self.kv.enable_prefix_caching:
            return False
        if len(self.running) >= self.cfg.max_num_seqs or max_tokens <= 0:
            return True
        req = self.waiting[0]
        todo = req.num_tokens_to_compute
        if whole and todo > max_tokens:
            return True
        if self.kv.reserve:
            return self.kv.min_blocks(req) > self.kv.num_free_blocks
        return not self._fits_watermark(req, 0) or \
            self.kv.blocks_needed(req.num_tokens) > self.kv.num_free_blocks

    def preempt(self, req: Request, out: SchedulerOutput) -> None:
        """Preemption by recompute: drop the KV, start over from token 0 at the queue head."""
        self.kv.free(req)
        self.running.remove(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = Status.WAITING
        self.waiting.appendleft(req)
        out.preempted.append(req)

    def allocate_or_preempt(self, req: Request, n: int, out: SchedulerOutput) -> bool:
        """Room for `n` more tokens of the running `req`, preempting the newest running requests
        until it fits. False if `req` itself had to go (or can never fit)."""
        allocate = self.kv.allocate_slots
        while allocate(req, n) is None:
            victim = self.running[-1]
            if victim is req and len(self.running) == 1:
                # alone and still no room: its length outgrew the whole cache
                self.kv.free(req)
                self.running.remove(req)
                req.status = Status.REJECTED
                req.rejection_reason = (f"grew to {req.num_tokens} tokens, more than the "
                                        f"{self.kv.num_blocks} KV blocks hold")
                out.rejected.append(req)
                return False
            assert victim not in out.reqs, "victims come from the not-yet-scheduled tail"
            self.preempt(victim, out)
            if victim is req:
                return False
        return True

    def update(self, out: SchedulerOutput, sampled: list[int] | None, start: float,
               end: float) -> list[Request]:
        """Apply an executed batch: advance counters, emit tokens, finish and free."""
        done = []
        for i, (req, n) in enumerate(zip(out.reqs, out.num_new_tokens)):
            if req.first_scheduled_time is None:
                req.first_scheduled_time = start
            req.num_computed_tokens += n
            if req.num_computed_tokens == req.num_prompt_tokens + req.num_output_tokens:
                req.num_output_tokens += 1
                req.token_times.append(end)
                if sampled is not None:
                    req.output_token_ids.append(sampled[i])
                # stop: the trace's length (its EOS, in effect), max_tokens or max_model_len
                if req.num_output_tokens >= req._stop_at:
                    req.status = Status.FINISHED
                    req.finish_time = end
                    self.kv.free(req)
                    done.append(req)
        if done:
            self.running = [r for r in self.running if r.status is Status.RUNNING]
        return done
