"""Fixed-size KV blocks: ref counts, a free queue in eviction order, and a prefix-cache index.

Blocks are made on first use, not up front: a pool of N blocks costs memory and time for the
blocks a run ever holds at once, not for N (a small model on a large simulated GPU has millions
of blocks, a generous swap space billions; building them one by one ran away). A block never
used sits, in the eviction order, after the freed blocks that hold no cached content and before
the cached ones, lowest id first: exactly where the eager pool kept it, so the order in which
blocks are handed out is unchanged."""
from __future__ import annotations

from collections import OrderedDict


class Block:
    __slots__ = ("block_id", "ref_cnt", "key", "gen")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.key = None   # prefix-cache key while the block holds a cached full block
        self.gen = 0      # bumped on every reuse, so keys that name this block as parent go stale

    def __repr__(self):
        return f"Block({self.block_id}, ref={self.ref_cnt}, cached={self.key is not None})"


class BlockPool:
    """Blocks with ref counts. Free blocks sit in one queue whose head is evicted first: blocks
    that hold no cached content go to the head, cached ones to the tail (LRU), so cached content
    is evicted last.

    Prefix-cache keys are chained: (parent block id, parent generation, token tuple). Equal keys
    mean equal token prefixes, exactly: the tuple is compared, not only hashed, and a parent that
    was evicted and reused has a new generation, so no stale child can match (no collisions)."""

    def __new__(cls, num_blocks: int, enable_caching: bool = False):
        if cls is BlockPool and not enable_caching:
            return super().__new__(PlainBlockPool)
        return super().__new__(cls)

    def __init__(self, num_blocks: int, enable_caching: bool = False):
        assert num_blocks > 0
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks: list[Block] = []   # the blocks made so far; block i is blocks[i]
        # freed blocks: uncached ones at the head (most recently freed first), cached ones
        # behind them (LRU); the blocks not made yet come between the two
        self.free: OrderedDict[int, Block] = OrderedDict()
        self.cached: dict[tuple, Block] = {}

    def is_free(self, block: Block) -> bool:
        return block.block_id in self.free

    @property
    def num_free(self) -> int:
        return len(self.free) + self.num_blocks - len(self.blocks)

    @property
    def num_used(self) -> int:
        return len(self.blocks) - len(self.free)

    def _make(self, n: int) -> list[Block]:
        """`n` blocks never used, lowest ids first."""
        blocks = self.blocks
        first = len(blocks)
        new = [Block(i) for i in range(first, first + n)]
        blocks.extend(new)
        return new

    def allocate(self, n: int) -> list[Block]:
        assert n <= self.num_free, (n, self.num_free)
        free, pop = self.free, self.free.popitem
        out = []
        while free and len(out) < n and next(iter(free.values())).key is None:
            out.append(pop(last=False)[1])   # freed, uncached
        unmade = self.num_blocks - len(self.blocks)
        if len(out) < n and unmade:
            out += self._make(min(n - len(out), unmade))
        out += [pop(last=False)[1] for _ in range(n - len(out))]   # cached: evicted
        for b in out:
            b.ref_cnt = 1
        if self.enable_caching:
            for b in out:
                if b.key is not None:   # evict
                    del self.cached[b.key]
                    b.key = None
                b.gen += 1
        return out

    def touch(self, blocks: list[Block]) -> None:
        """Share cached blocks with one more request (a prefix hit)."""
        for b in blocks:
            if b.ref_cnt == 0:
                del self.free[b.block_id]
            b.ref_cnt += 1

    def release(self, blocks: list[Block]) -> None:
        # Callers pass a request's blocks tail first: its last blocks are the least shared,
        # so among cached blocks they are evicted before the prefix.
        free, caching = self.free, self.enable_caching
        for b in blocks:
            b.ref_cnt -= 1
            assert b.ref_cnt >= 0, b
            if b.ref_cnt == 0:
                free[b.block_id] = b
                if caching and b.key is None:   # without caching, the order does not matter
                    free.move_to_end(b.block_id, last=False)

    def lookup(self, key) -> Block | None:
        return self.cached.get(key)

    def cache(self, block: Block, key) -> bool:
        if key in self.cached:   # someone computed the same content first; keep theirs
            return False
        block.key = key
        self.cached[key] = block
        return True


class PlainBlockPool(BlockPool):
    """The pool without prefix caching: a block is never shared, so no ref counts are kept and
    the free blocks are a stack (allocation and release are list slices, not a step per block:
    a reserving policy takes hundreds of blocks per request)."""

    def __init__(self, num_blocks: int, enable_caching: bool = False):
        assert num_blocks > 0 and not enable_caching
        self.num_blocks = num_blocks
        self.enable_caching = False
        self.blocks: list[Block] = []   # the blocks made so far; block i is blocks[i]
        # freed blocks, the last freed on top: handed out before the blocks not made yet
        self.free: list[Block] = []
        self.cached = {}

    def is_free(self, block: Block) -> bool:
        return block in self.free

    def allocate(self, n: int) -> list[Block]:
        free = self.free
        if n <= 0:
            return []
        if n <= len(free):
            out = free[-n:]
            del free[-n:]
            out.reverse()
            return out
        assert n <= self.num_free, (n, self.num_free)
        out = free[::-1]
        free.clear()
        return out + self._make(n - len(out))

    def touch(self, blocks: list[Block]) -> None:
        raise AssertionError("blocks are shared only with prefix caching")

    def release(self, blocks) -> None:
        self.free.extend(blocks)
