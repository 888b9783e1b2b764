"""The KV-cache manager: which blocks each request holds, paged or reserved up front."""
from __future__ import annotations

import itertools
from operator import attrgetter
from types import MappingProxyType

import numpy as np

from sarathi_lab.kv.block_pool import Block, BlockPool, PlainBlockPool
from sarathi_lab.request import Request, Status

ROOT = (-1, 0)  # parent of a request's first block
_ID = attrgetter("request_id")
_BLOCK_ID = attrgetter("block_id")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Paged mode allocates blocks on demand as tokens are computed (vLLM). Reservation mode
    holds a request's maximum possible length from its first allocation (Orca,
    FasterTransformer): prompt + its `max_tokens` cap, or `max_model_len` without one.

    With `num_host_blocks`, a swap space in host memory (vLLM's `swap_space`): `swap_out` moves
    the blocks that hold a request's computed tokens to host blocks and frees its device blocks;
    `swap_in` gives it device blocks again, the first of them receiving exactly the host blocks'
    contents. Both return the (source, destination) block pairs the executor copies before the
    iteration runs."""

    #: the sliding window whose out-of-reach blocks are freed (`kv/window.py`); None: none
    window: int | None = None

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = False,
                 reserve: bool = False, max_model_len: int | None = None,
                 num_host_blocks: int = 0):
        if block_size < 1 or block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {block_size}")
        if reserve and enable_prefix_caching:
            raise ValueError("enable_prefix_caching needs paged KV; reservation mode "
                             "(request_level, orca) holds whole sequences")
        if reserve and not max_model_len:
            raise ValueError("reservation mode needs max_model_len")
        if num_host_blocks < 0:
            raise ValueError(f"num_host_blocks={num_host_blocks}: must be >= 0")
        if reserve and num_host_blocks:
            raise ValueError("swap space needs paged KV; reservation mode (request_level, orca) "
                             "never preempts")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        # host blocks are never shared nor cached: a plain stack
        self.host = PlainBlockPool(num_host_blocks) if num_host_blocks else None
        self.host_blocks: dict[object, list[Block]] = {}   # swapped request id -> its host blocks
        self.num_host_tokens = 0   # computed tokens whose KV sits in host blocks
        self.reserve = reserve
        self.max_model_len = max_model_len
        self.enable_prefix_caching = enable_prefix_caching
        self.req_blocks: dict[object, list[Block]] = {}
        self._counts_view = MappingProxyType(self.req_blocks)
        # logical tokens whose KV is held (shared ones counted per request); a request holds
        # exactly its num_computed_tokens whenever it is freed
        self.num_stored_tokens = 0
        # prefix-cache hit rate: prompt tokens of each admission (first allocation of a request
        # with token ids, counted on success only, so a failed and retried admission counts
        # once) and how many of them came from the cache
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0
        # disaggregated prefill: requests whose blocks outlive their end here (`retain`), and
        # the blocks (with their token count) of those that ended, until `release`
        self._retain: set = set()
        self._retained: dict[object, tuple[list[Block], int]] = {}

    # -- sizes ---------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used

    def reserved_len(self, req: Request) -> int:
        cap = self.max_model_len
        if req.max_tokens is not None:
            cap = min(cap, req.num_prompt_tokens + req.max_tokens)
        return cap

    def blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def min_blocks(self, req: Request) -> int:
        """Blocks a request holds at the least to make progress (for admission checks)."""
        n = self.reserved_len(req) if self.reserve else req.num_prompt_tokens + 1
        return self.blocks_needed(n)

    def admission_blocks(self, req: Request, hit: list[Block] = ()) -> int:
        """Free blocks that admitting the waiting `req` takes: its whole prompt (its reserved
        length in reservation mode), less a prefix hit's blocks, plus the hit blocks that sit
        in the free queue (shared, they stop being free)."""
        assert req.request_id not in self.req_blocks
        upto = req.num_tokens
        if self.reserve:
            upto = max(upto, self.reserved_len(req))
        busy = sum(1 for b in hit if b.ref_cnt == 0) if hit else 0
        return cdiv(upto, self.block_size) - len(hit) + busy

    def decode_growth_list(self, reqs: list[Request], contexts: list[int], k: int) -> list[int]:
        """Blocks the running `reqs` (with `contexts` tokens computed) hold beyond today's after
        each of k decode steps (one token each per step): entry j is for j + 1 steps. In lists:
        the fast-forward asks it once per skipped run, of a few dozen requests and steps, where
        numpy's per-call cost would be most of the work."""
        if self.reserve:
            return [0] * k
        grows = self._decode_growth_counts(reqs, contexts, k)
        if grows is None:
            return self._decode_growth_arrays(reqs, np.array(contexts, np.int64), k).tolist()
        return grows

    def _decode_growth_counts(self, reqs: list[Request], contexts: list[int],
                              k: int) -> list[int] | None:
        # Request i, with room for r_i = held_i * block_size - context_i more tokens in its
        # blocks, needs ceil((s - r_i) / block_size) more blocks after s steps (none while
        # s <= r_i): one more at steps r_i + 1, r_i + 1 + block_size, ... None for a request
        # already short of blocks (not a running request's state): the array formula counts it.
        bs, table = self.block_size, self.req_blocks
        grows = [0] * k   # grows[s - 1]: blocks first needed at step s
        for r, c in zip(reqs, contexts):
            first = len(table[r.request_id]) * bs - c   # the step before its first new block
            if first < k:   # most requests need no block within a short run
                if first < 0:
                    return None
                grows[first] += 1
                if first + bs < k:
                    for s in range(first + bs, k, bs):
                        grows[s] += 1
        return list(itertools.accumulate(grows))

    def _decode_growth_arrays(self, reqs: list[Request], contexts: np.ndarray,
                              k: int) -> np.ndarray:
        held = np.fromiter(map(len, map(self.req_blocks.__getitem__, map(_ID, reqs))),
                           np.int64, len(reqs))
        need = -(-(contexts + np.arange(1, k + 1)[:, None]) // self.block_size) - held
        return np.maximum(need, 0).sum(axis=1)

    # -- prefix cache ----------------------------------------------------------------------
    def get_computed_blocks(self, req: Request) -> tuple[list[Block], int]:
        """Longest cached prefix of a new request's prompt, in full blocks. The last prompt
        token is always left to compute: the model must run on it to sample."""
        if not self.enable_prefix_caching or req.prompt_token_ids is None:
            return [], 0
        assert req.num_computed_tokens == 0 and req.request_id not in self.req_blocks
        bs, ids = self.block_size, req.prompt_token_ids
        hits, parent = [], ROOT
        for i in range((req.num_prompt_tokens - 1) // bs):
            b = self.pool.lookup((parent, tuple(ids[i * bs:(i + 1) * bs])))
            if b is None:
                break
            hits.append(b)
            parent = (b.block_id, b.gen)
        return hits, len(hits) * bs

    def cached_prefix_len(self, req: Request) -> int:
        """Tokens of a not yet admitted request's prompt that the cache holds now: what
        `get_computed_blocks` would find, changing nothing (a router asks every replica)."""
        return self.get_computed_blocks(req)[1]

    # -- allocation --------------------------------------------------------------------------
    def allocate_slots(self, req: Request, num_new_tokens: int,
                       computed: list[Block] | None = None,
                       lookahead: int = 0) -> list[int] | None:
        """Make room for `num_new_tokens` after the request's computed tokens (plus `computed`,
        the blocks of a prefix hit, which become the head of its table), and for `lookahead`
        tokens beyond them that later steps will compute (a prompt's remaining chunks). Returns
        the ids of the newly allocated blocks (possibly empty) or None, with nothing changed,
        when they don't fit."""
        new = self.allocate_blocks(req, num_new_tokens, computed, lookahead)
        return None if new is None else list(map(_BLOCK_ID, new)) if new else []

    def allocate_blocks(self, req: Request, num_new_tokens: int,
                        computed: list[Block] | None = None,
                        lookahead: int = 0) -> list[Block] | None:
        """`allocate_slots`, returning the new blocks themselves (possibly none) or None: for
        callers that only ask whether they fit (admission, whose blocks are a whole prompt's,
        need no list of their ids)."""
        rid = req.request_id
        held = self.req_blocks.get(rid)
        if held is not None and computed is None and not self.enable_prefix_caching \
                and req.num_computed_tokens + num_new_tokens <= len(held) * self.block_size:
            self.num_stored_tokens += num_new_tokens   # hot path: the last block has room
            return []
        first = held is None
        if first:
            held = self.req_blocks[rid] = []
        n_hit = len(computed) * self.block_size if computed else 0
        upto = req.num_computed_tokens + n_hit + num_new_tokens + lookahead
        if self.reserve:
            upto = max(upto, self.reserved_len(req))
        need = cdiv(upto, self.block_size) - len(held) - (len(computed) if computed else 0)
        if need > 0:
            # cached free blocks we are about to share are not available to allocate
            busy = sum(1 for b in computed if b.ref_cnt == 0) if computed else 0
            if need > self.pool.num_free - busy:
                if not held:
                    del self.req_blocks[rid]
                return None
        if computed:
            self.pool.touch(computed)
            held.extend(computed)
        new = self.pool.allocate(need) if need > 0 else []
        held.extend(new)
        added = n_hit + num_new_tokens
        self.num_stored_tokens += added
        if self.enable_prefix_caching and req.prompt_token_ids is not None:
            self._cache_full_blocks(req, held, req.num_computed_tokens + added)
            if first:
                self.prefix_query_tokens += req.num_prompt_tokens
                self.prefix_hit_tokens += n_hit
        return new

    def allocate_decodes(self, reqs: list[Request], k: int | list[int] = 1) -> bool:
        """Room for `k` more tokens for each request (or k[i] for the i-th: speculative
        decodes), all or nothing: True if done, False (and nothing changed) if the free blocks
        do not cover them all. The bulk form of `allocate_slots(req, k)` for decode batches,
        the simulator's hot path."""
        if self.enable_prefix_caching:   # full blocks must be hashed one request at a time
            return False
        bs, table = self.block_size, self.req_blocks
        grow, total = [], 0
        each = k if isinstance(k, list) else None
        for i, r in enumerate(reqs):
            held = table[r.request_id]
            end = r.num_computed_tokens + (k if each is None else each[i])
            if end > len(held) * bs:   # most decodes fit the blocks they hold
                need = -(-end // bs) - len(held)
                grow.append((held, need))
                total += need
        if grow:
            if total > self.pool.num_free:
                return False
            new, i = self.pool.allocate(total), 0   # one call: the pool hands them out in order
            for held, need in grow:
                held.extend(new[i:i + need])
                i += need
        self.num_stored_tokens += k * len(reqs) if each is None else sum(each)
        return True

    def release_slots(self, req: Request, n: int) -> None:
        """`n` slots allocated past `req`'s computed tokens hold no token (its rejected draft
        tokens): no longer counted as stored, and the blocks wholly past its computed tokens go
        back to the pool (a block table covers exactly its computed tokens between steps, which
        a swap-out relies on)."""
        self.num_stored_tokens -= n
        held = self.req_blocks.get(req.request_id)
        keep = cdiv(req.num_computed_tokens, self.block_size)
        if held is not None and len(held) > keep:
            extra = held[keep:]
            del held[keep:]
            self.pool.release(reversed(extra))

    def _cache_full_blocks(self, req: Request, held: list[Block], num_tokens: int) -> None:
        # Blocks become cacheable once the tokens that fill them are being computed.
        bs = self.block_size
        done = len(req.block_hashes)
        full = num_tokens // bs
        if full <= done:
            return
        ids = req.all_token_ids()
        parent = ROOT if done == 0 else req.block_hashes[done - 1]
        for i in range(done, full):
            b = held[i]
            key = (parent, tuple(ids[i * bs:(i + 1) * bs]))
            if b.key is None:
                self.pool.cache(b, key)
            req.block_hashes.append((b.block_id, b.gen))
            parent = (b.block_id, b.gen)

    def free(self, req: Request) -> None:
        rid = req.request_id
        held = self.req_blocks.pop(rid, None)
        if held is None:
            return
        req.block_hashes = []
        if req.status is Status.FINISHED and rid in self._retain:
            # its KV is still to be sent: held, still counted, until `release`
            self._retain.discard(rid)
            self._retained[rid] = (held, req.num_computed_tokens)
            return
        self.pool.release(reversed(held))
        self.num_stored_tokens -= req.num_computed_tokens

    # -- disaggregated prefill/decode (sarathi_lab/topology/disagg/) ----------------------------------
    def retain(self, req: Request) -> None:
        """When `req` finishes here (its first token, on a prefill replica), keep its blocks in
        use instead of freeing them, until `release(req.request_id)`: the KV waits here for its
        transfer to a decode replica. A preemption or a rejection still frees them."""
        self._retain.add(req.request_id)

    def release(self, request_id) -> None:
        """Free the blocks `retain` kept for a request that ended (its transfer is done), and
        forget the request (also when it never finished here: it was rejected)."""
        self._retain.discard(request_id)
        held = self._retained.pop(request_id, None)
        if held is not None:
            blocks, tokens = held
            self.pool.release(reversed(blocks))
            self.num_stored_tokens -= tokens

    def num_retained(self) -> int:
        """Requests whose blocks `retain` keeps after their end."""
        return len(self._retained)

    def allocate_received(self, req: Request) -> list[int] | None:
        """Blocks for a request whose first `num_computed_tokens` tokens were computed on
        another replica and whose KV is copied in (a decode replica taking a prefill's
        handoff), and for its next token: what admitting it would take (`admission_blocks`).
        The copied tokens count as stored. Returns the new block ids, or None (nothing
        changed) when they do not fit."""
        assert not self.enable_prefix_caching, "received KV is not hashed for the prefix cache"
        assert req.request_id not in self.req_blocks, "the request already holds blocks here"
        new = self.allocate_slots(req, 0, lookahead=req.num_tokens - req.num_computed_tokens)
        if new is not None:
            self.num_stored_tokens += req.num_computed_tokens
        return new

    def prefix_cache_stats(self) -> dict | None:
        """Prompt tokens looked up in the prefix cache and tokens served from it, summed over
        admissions (a request re-admitted after preemption looks up again and counts again);
        None when prefix caching is off. The last prompt token is never served from the cache
        (the model must run on it), so the hit rate stays below 1."""
        if not self.enable_prefix_caching:
            return None
        return {"hit_tokens": self.prefix_hit_tokens, "query_tokens": self.prefix_query_tokens}

    def held_blocks(self, request_id) -> int:
        """Blocks the request holds now (what freeing it gives back, if none is shared)."""
        return len(self.req_blocks.get(request_id, ()))

    def held_slots(self, reqs: list[Request]) -> list[int]:
        """Tokens of KV each request holds room for (0 if none)."""
        table, bs = self.req_blocks, self.block_size
        empty = ()
        return [len(table.get(r.request_id, empty)) * bs for r in reqs]

    def block_counts(self):
        """A read-only view: request id -> the blocks it holds (a sequence; use len()). For
        checks on the hot path, where a call per request would cost too much."""
        return self._counts_view

    def holders(self) -> list:
        """Ids of the requests holding blocks now (those `retain` keeps after their end too)."""
        return list(self.req_blocks) + list(self._retained)

    def block_table(self, req: Request) -> list[int]:
        return [b.block_id for b in self.req_blocks.get(req.request_id, ())]

    # -- swap space ----------------------------------------------------------------------------
    @property
    def num_host_blocks(self) -> int:
        return self.host.num_blocks if self.host else 0

    @property
    def num_free_host_blocks(self) -> int:
        return self.host.num_free if self.host else 0

    @property
    def num_used_host_blocks(self) -> int:
        return self.host.num_used if self.host else 0

    def swap_out_blocks(self, req: Request) -> int:
        """Blocks swapping the running `req` out moves: those holding its computed tokens (the
        empty blocks a prompt holds ahead of its chunks are freed, not copied)."""
        return cdiv(req.num_computed_tokens, self.block_size)

    def can_swap_out(self, req: Request) -> bool:
        n = self.swap_out_blocks(req)
        return 0 < n <= self.num_free_host_blocks and req.request_id in self.req_blocks

    def swap_out(self, req: Request) -> list[tuple[int, int]]:
        """Move the running `req`'s computed KV to host blocks and free its device blocks.
        Returns the (device block, host block) pairs to copy, in block-table order."""
        assert self.can_swap_out(req), "swap_out needs can_swap_out"
        rid = req.request_id
        held = self.req_blocks.pop(rid)
        n = self.swap_out_blocks(req)
        host = self.host_blocks[rid] = self.host.allocate(n)
        pairs = [(d.block_id, h.block_id) for d, h in zip(held, host)]
        # released device blocks keep their prefix-cache keys: another request may still hit
        self.pool.release(reversed(held))
        self.num_stored_tokens -= req.num_computed_tokens
        self.num_host_tokens += req.num_computed_tokens
        req.block_hashes = []   # its chain named device blocks; swap_in hashes the new ones
        return pairs

    def swap_in_blocks(self, req: Request) -> int:
        """Device blocks swapping the swapped `req` in takes: room for every token it holds,
        so that it can compute up to its next sample (the rest of its prompt, or its decode)
        without allocating again, as admission takes a whole prompt's blocks."""
        return cdiv(req.num_tokens, self.block_size)

    def swap_in(self, req: Request) -> list[tuple[int, int]]:
        """Give the swapped `req` device blocks again. Returns the (host block, device block)
        pairs to copy: its host blocks in order, into the head of its new block table."""
        rid = req.request_id
        host = self.host_blocks.pop(rid)
        need = self.swap_in_blocks(req)
        assert rid not in self.req_blocks and len(host) <= need <= self.pool.num_free, \
            "swap_in needs swap_in_blocks(req) free device blocks"
        held = self.req_blocks[rid] = self.pool.allocate(need)
        pairs = [(h.block_id, d.block_id) for h, d in zip(host, held)]
        self.host.release(host)
        self.num_host_tokens -= req.num_computed_tokens
        self.num_stored_tokens += req.num_computed_tokens
        if self.enable_prefix_caching and req.prompt_token_ids is not None:
            self._cache_full_blocks(req, held, req.num_computed_tokens)
        return pairs

    def drop_swapped(self, req: Request) -> None:
        """Free a swapped request's host blocks (it will never be swapped in: rejected)."""
        host = self.host_blocks.pop(req.request_id, None)
        if host is not None:
            self.host.release(host)
            self.num_host_tokens -= req.num_computed_tokens

    def host_block_table(self, req: Request) -> list[int]:
        return [b.block_id for b in self.host_blocks.get(req.request_id, ())]

    def host_holders(self) -> list:
        """Ids of the requests holding host blocks now."""
        return list(self.host_blocks)

    def usage(self) -> dict:
        used = self.pool.num_used
        slots = used * self.block_size
        return {
            "kv_blocks_total": self.pool.num_blocks,
            "kv_blocks_used": used,
            "kv_tokens_stored": self.num_stored_tokens,
            # slots held but holding no token; negative with prefix sharing, so clip
            "kv_internal_waste": max(0.0, 1 - self.num_stored_tokens / slots) if slots else 0.0,
        }
