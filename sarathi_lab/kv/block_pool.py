"""Fixed-size KV blocks: ref counts, a free queue in eviction order, and a prefix-cache index."""
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
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached: dict[tuple, Block] = {}

    def is_free(self, block: Block) -> bool:
        return block.block_id in self.free

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def allocate(self, n: int) -> list[Block]:
        assert n <= len(self.free), (n, len(self.free))
        pop = self.free.popitem
        out = [pop(last=False)[1] for _ in range(n)]
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
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: list[Block] = self.blocks[::-1]   # lowest ids first
        self.cached = {}

    def is_free(self, block: Block) -> bool:
        return block in self.free

    def allocate(self, n: int) -> list[Block]:
        free = self.free
        assert n <= len(free), (n, len(free))
        if n <= 0:
            return []
        out = free[-n:]
        del free[-n:]
        out.reverse()
        return out

    def touch(self, blocks: list[Block]) -> None:
        raise AssertionError("blocks are shared only with prefix caching")

    def release(self, blocks) -> None:
        self.free.extend(blocks)
