"""The KV manager for a model whose every layer attends through a sliding window
(`scheduler.sliding_window_kv`; vLLM V1's SlidingWindowManager does the same).

A query at position p reads the keys at p - window + 1 .. p only (Hugging Face's mask, and
`kernels/`). A step that computes a request's positions c .. c + n - 1 therefore reads no key
before c - window + 1, nor does any later step: every block wholly before that position is
freed before the step's blocks are allocated (so they can be re-used at once), and its place in
the block table is kept by `NULL` (the table's index stays the logical block index, which the
guard's and the policies' arithmetic rely on). A block is a block of every layer, so this is
exact only when every layer is windowed: a model with global layers is refused by the run
layer (`runner.window_of`).

How many blocks a request holds at most. A step computing positions c .. c + n - 1 reads the
positions max(0, c - window + 1) .. c + n - 1. While c < window that is the aligned run 0 ..
c + n - 1: cdiv(c + n, block_size) <= cdiv(window - 1 + n, block_size) blocks. Past it, a run
of window + n - 1 positions, which touches at most cdiv(window + n - 2, block_size) + 1 blocks
(a run of L positions touches floor((L - 1 + block_size - 1) / block_size) + 1 of them: the worst
alignment starts it at a block's last slot). The second bound is never below the first. With
chunks of at most `max_chunk` tokens (the policy's batch cap) a request therefore never holds
more than `cap = cdiv(window + max_chunk - 2, block_size) + 1` blocks, nor more than its whole
context's cdiv(num_tokens, block_size); a decode (n = 1) at most cdiv(window - 1,
block_size) + 1. (The looser ceil((window + block_size) / block_size) + 1 is the decode bound
rounded up.)

Admission takes a prompt's footprint `min(cdiv(num_tokens, block_size), cap)` at once, as the
paged manager takes its whole prompt: the blocks the first chunk needs go into the table, the
rest are kept aside for the prompt's later chunks (`_ahead`), so that later chunks are never
starved by decodes (the policies assert no chunk allocates). While chunks remain, the blocks
that leave the window go aside too (the request keeps its footprint); once its last prompt
token is scheduled, what is left aside goes back to the pool, and decodes grow and shrink by
one block at a time on demand, as paged decodes do.

Not supported, refused at construction: prefix caching (a cached block's prefix would have
holes), reservation mode (it holds whole sequences), a swap space (swapping would have to copy
a table with holes), and a disaggregated handoff (`allocate_received`, `retain`).
"""
from __future__ import annotations

from sarathi_lab.kv.block_pool import Block
from sarathi_lab.kv.manager import KVCacheManager, cdiv
from sarathi_lab.request import Request

#: the place of a freed block in a block table (its id, -1, names no block)
NULL = Block(-1)


class WindowedKVCacheManager(KVCacheManager):
    """`KVCacheManager` whose requests hold only the blocks their window still reads."""

    def __init__(self, num_blocks: int, block_size: int, *, window: int,
                 max_model_len: int, max_chunk: int | None = None,
                 enable_prefix_caching: bool = False, reserve: bool = False,
                 num_host_blocks: int = 0):
        key = "scheduler.sliding_window_kv=true"
        if enable_prefix_caching:
            raise ValueError(f"{key} with scheduler.enable_prefix_caching=true: a cached "
                             "prefix would lose the blocks that left the window; set one off")
        if reserve:
            raise ValueError(f"{key}: the policy reserves each request's whole length up front "
                             "(request_level, orca); use a paged policy (vllm, sarathi, ...)")
        if num_host_blocks:
            raise ValueError(f"{key} with scheduler.preemption_mode=swap: swapping a block "
                             "table with freed blocks is not implemented; use "
                             "preemption_mode=recompute")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"{key}: window={window!r} must be a positive whole number")
        super().__init__(num_blocks, block_size, max_model_len=max_model_len)
        self.window = window
        self.max_chunk = max_chunk or max_model_len
        # request id -> blocks freed from the head of its table (each an entry NULL there)
        self.dropped: dict[object, int] = {}
        # request id -> (blocks kept aside for its prompt's later chunks, the token count
        # they are kept up to)
        self._ahead: dict[object, tuple[list[Block], int]] = {}

    # -- sizes ---------------------------------------------------------------------------
    @property
    def cap(self) -> int:
        """The most blocks a request holds at once with chunks of at most `max_chunk` tokens
        (module docstring)."""
        return cdiv(self.window + self.max_chunk - 2, self.block_size) + 1

    def footprint(self, num_tokens: int) -> int:
        """Blocks a request computing up to `num_tokens` tokens holds at most at once."""
        return min(cdiv(num_tokens, self.block_size), self.cap)

    def min_blocks(self, req: Request) -> int:
        return self.footprint(req.num_prompt_tokens + 1)

    def admission_blocks(self, req: Request, hit=()) -> int:
        assert req.request_id not in self.req_blocks and not hit
        return self.footprint(req.num_tokens)

    def held_blocks(self, request_id) -> int:
        held = self.req_blocks.get(request_id)
        if held is None:
            return 0
        aside = self._ahead.get(request_id)
        return len(held) - self.dropped.get(request_id, 0) + (len(aside[0]) if aside else 0)

    def decode_growth_list(self, reqs, contexts, k):
        raise NotImplementedError("decode runs are not fast-forwarded with "
                                  "scheduler.sliding_window_kv (blocks leave the window)")

    # -- allocation ------------------------------------------------------------------------
    def _plan(self, req: Request, n: int, lookahead: int):
        """(blocks leaving the window, the table's growth, blocks to keep aside, the pool's
        net change) of room for `n` tokens after `req`'s computed ones, `lookahead` more to
        come in later chunks."""
        rid, bs = req.request_id, self.block_size
        held = self.req_blocks.get(rid, ())
        c = req.num_computed_tokens
        end = c + n
        dropped = self.dropped.get(rid, 0)
        first = max(dropped, max(0, c - self.window + 1) // bs)
        aside, until = self._ahead.get(rid, ((), 0))
        until = max(until, end + lookahead)
        size = max(len(held), cdiv(end, bs))
        grow = size - len(held)
        live = size - first
        keep = max(self.footprint(until), live) - live if end < until else 0
        net = grow + keep - (first - dropped) - len(aside)
        return first, grow, keep, until, net

    def allocate_blocks(self, req: Request, num_new_tokens: int,
                        computed: list[Block] | None = None,
                        lookahead: int = 0) -> list[Block] | None:
        assert not computed, "no prefix cache with a sliding window"
        first, grow, keep, until, net = self._plan(req, num_new_tokens, lookahead)
        if net > self.pool.num_free:
            return None
        return self._apply(req, num_new_tokens, first, grow, keep, until)

    def _apply(self, req: Request, n: int, first: int, grow: int, keep: int,
               until: int) -> list[Block]:
        """Carry out a `_plan` that fits. Returns the blocks the table took from the pool."""
        rid, bs = req.request_id, self.block_size
        held = self.req_blocks.setdefault(rid, [])
        dropped = self.dropped.get(rid, 0)
        # blocks already the request's: those leaving the window, then those kept aside
        spare = held[dropped:first]
        held[dropped:first] = [NULL] * (first - dropped)
        if first:
            self.dropped[rid] = first
        self.num_stored_tokens -= (first - dropped) * bs
        aside = self._ahead.pop(rid, None)
        if aside:
            spare += aside[0]
        take = grow + keep
        if take < len(spare):   # more than it needs: the rest goes back to the pool
            self.pool.release(spare[take:])
            del spare[take:]
        reused = len(spare)
        blocks = spare + self.pool.allocate(take - reused) if take > reused else spare
        held.extend(blocks[:grow])
        if req.num_computed_tokens + n < until:   # chunks to come: remember up to where
            self._ahead[rid] = (blocks[grow:], until)
        self.num_stored_tokens += n
        return blocks[reused:grow]

    def allocate_decodes(self, reqs: list[Request], k: int | list[int] = 1) -> bool:
        each = k if isinstance(k, list) else [k] * len(reqs)
        plans = [self._plan(r, n, 0) for r, n in zip(reqs, each)]
        if sum(p[4] for p in plans) > self.pool.num_free:
            return False
        # those that give blocks back first, so that the others can take them
        for i in sorted(range(len(reqs)), key=lambda i: plans[i][4]):
            self._apply(reqs[i], each[i], *plans[i][:4])
        return True

    def release_slots(self, req: Request, n: int) -> None:
        assert req.request_id not in self._ahead, "drafts are decodes: no prompt chunk ahead"
        super().release_slots(req, n)

    def free(self, req: Request) -> None:
        rid = req.request_id
        held = self.req_blocks.pop(rid, None)
        if held is None:
            return
        dropped = self.dropped.pop(rid, 0)
        aside = self._ahead.pop(rid, None)
        if aside:
            self.pool.release(aside[0])
        self.pool.release(reversed(held[dropped:]))
        self.num_stored_tokens -= req.num_computed_tokens - dropped * self.block_size

    # -- what it does not support -----------------------------------------------------------
    def retain(self, req: Request) -> None:
        raise NotImplementedError("scheduler.sliding_window_kv: a disaggregated handoff is "
                                  "not supported")

    def allocate_received(self, req: Request):
        raise NotImplementedError("scheduler.sliding_window_kv: a disaggregated handoff is "
                                  "not supported")
