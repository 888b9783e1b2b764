import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sarathi_lab.kv import KVCacheManager
from sarathi_lab.request import Request


def R(i, n, ids=None, max_tokens=None):
    return Request(i, 0.0, n, 10, prompt_token_ids=ids, max_tokens=max_tokens)


def test_allocate_free_no_leak():
    kv = KVCacheManager(10, 4)
    a = R(0, 9)
    assert kv.allocate_slots(a, 9) == [0, 1, 2]
    a.num_computed_tokens = 9
    assert kv.allocate_slots(a, 3) == []          # fits in block 2
    a.num_computed_tokens = 12
    assert kv.allocate_slots(a, 4) == [3]
    a.num_computed_tokens = 16
    assert kv.num_used_blocks == 4 and kv.num_stored_tokens == 16
    kv.free(a)
    assert kv.num_free_blocks == 10 and kv.num_stored_tokens == 0 and not kv.req_blocks


def test_allocation_that_does_not_fit_changes_nothing():
    kv = KVCacheManager(3, 4)
    a, b = R(0, 8), R(1, 8)
    assert kv.allocate_slots(a, 8) == [0, 1]
    assert kv.allocate_slots(b, 8) is None
    assert kv.num_free_blocks == 1 and b.request_id not in kv.req_blocks


def test_prefix_hit_shares_blocks():
    kv = KVCacheManager(16, 4, enable_prefix_caching=True)
    ids = list(range(100, 113))  # 13 tokens: 3 full blocks
    a = R(0, 13, ids)
    kv.allocate_slots(a, 13)
    a.num_computed_tokens = 13
    b = R(1, 13, list(ids))
    hit, n = kv.get_computed_blocks(b)
    assert n == 12 and [x.block_id for x in hit] == kv.block_table(a)[:3]
    kv.allocate_slots(b, 1, hit)
    assert kv.block_table(b)[:3] == kv.block_table(a)[:3]
    assert all(x.ref_cnt == 2 for x in hit)
    assert kv.block_table(b)[3] != kv.block_table(a)[3]
    # a different first block breaks the chain even if later blocks match
    c = R(2, 13, [0] + ids[1:])
    assert kv.get_computed_blocks(c)[1] == 0


def test_last_prompt_token_is_never_a_hit():
    kv = KVCacheManager(8, 4, enable_prefix_caching=True)
    ids = list(range(8))
    a = R(0, 8, ids)
    kv.allocate_slots(a, 8)
    assert kv.get_computed_blocks(R(1, 8, list(ids)))[1] == 4


def test_eviction_order_uncached_first_then_lru_tail_first():
    kv = KVCacheManager(6, 2, enable_prefix_caching=True)
    a = R(0, 4, [1, 2, 3, 4])          # 2 full blocks, both cached
    kv.allocate_slots(a, 4)
    b = R(1, 3, [9, 9, 9])             # 1 full (cached) + 1 partial (uncached)
    kv.allocate_slots(b, 3)
    ta, tb = kv.block_table(a), kv.block_table(b)
    kv.free(a)
    kv.free(b)
    order = list(kv.pool.free)
    # uncached blocks (b's partial one, and the never-used ones) are handed out before cached ones
    assert order.index(tb[1]) < order.index(tb[0])
    cached_order = [i for i in order if kv.pool.blocks[i].key is not None]
    # a freed before b; each request's tail block is evicted before its head
    assert cached_order == [ta[1], ta[0], tb[0]]
    # allocating everything evicts, and the cache index forgets evicted blocks
    c = R(2, 12)
    kv.allocate_slots(c, 12)
    assert not kv.pool.cached


def test_evicted_parent_makes_children_unreachable():
    kv = KVCacheManager(4, 2, enable_prefix_caching=True)
    a = R(0, 5, [1, 2, 3, 4, 5])
    kv.allocate_slots(a, 5)
    kv.free(a)
    x = R(1, 8)                        # takes every block: all cached content evicted
    kv.allocate_slots(x, 8)
    kv.free(x)
    assert kv.get_computed_blocks(R(2, 5, [1, 2, 3, 4, 5]))[1] == 0


def test_reservation_mode_holds_max_length():
    kv = KVCacheManager(100, 4, reserve=True, max_model_len=64)
    a = R(0, 10, max_tokens=6)
    assert len(kv.allocate_slots(a, 10)) == 4      # 16 tokens reserved
    a.num_computed_tokens = 10
    assert kv.allocate_slots(a, 1) == []
    b = R(1, 10)                                   # no cap: max_model_len
    assert len(kv.allocate_slots(b, 10)) == 16
    u = kv.usage()
    assert u["kv_blocks_used"] == 20 and u["kv_tokens_stored"] == 21
    assert u["kv_internal_waste"] == pytest.approx(1 - 21 / 80)


def test_config_errors():
    with pytest.raises(ValueError, match="power of two"):
        KVCacheManager(10, 6)
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        KVCacheManager(10, 4, reserve=True, enable_prefix_caching=True, max_model_len=8)


class KVMachine(RuleBasedStateMachine):
    """Random allocate / append / free / prefix-hit sequences keep the pool consistent."""

    caching = True

    def __init__(self):
        super().__init__()
        self.kv = KVCacheManager(24, 4, enable_prefix_caching=self.caching)
        self.live: dict[int, Request] = {}
        self.next_id = 0

    @rule(prefix=st.sampled_from([[1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8], [7, 7, 7, 7], []]),
          tail=st.lists(st.integers(0, 3), min_size=1, max_size=10))
    def start(self, prefix, tail):
        ids = prefix + tail
        r = Request(self.next_id, 0.0, len(ids), 50, prompt_token_ids=ids)
        self.next_id += 1
        hit, n = self.kv.get_computed_blocks(r)
        if self.kv.allocate_slots(r, len(ids) - n, hit) is not None:
            r.num_computed_tokens = len(ids)
            self.live[r.request_id] = r

    @precondition(lambda self: self.live)
    @rule(data=st.data(), n=st.integers(1, 6))
    def append(self, data, n):
        r = data.draw(st.sampled_from(sorted(self.live)))
        r = self.live[r]
        if self.kv.allocate_slots(r, n) is not None:
            r.output_token_ids.extend([5] * n)
            r.num_output_tokens += n
            r.num_computed_tokens += n

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        rid = data.draw(st.sampled_from(sorted(self.live)))
        self.kv.free(self.live.pop(rid))

    @invariant()
    def consistent(self):
        pool = self.kv.pool
        owners: dict[int, int] = {}
        for blocks in self.kv.req_blocks.values():
            ids = [b.block_id for b in blocks]
            assert len(ids) == len(set(ids)), "a request holds a block twice"
            for i in ids:
                owners[i] = owners.get(i, 0) + 1
        for b in pool.blocks:
            if pool.enable_caching:   # without caching no block is shared: no ref counts kept
                assert b.ref_cnt == owners.get(b.block_id, 0) >= 0
            assert (owners.get(b.block_id, 0) == 0) == pool.is_free(b)
        assert pool.num_free + len(owners) == pool.num_blocks
        for key, b in pool.cached.items():
            assert b.key == key
        for r in self.live.values():
            assert len(self.kv.block_table(r)) * 4 >= r.num_computed_tokens

    def teardown(self):
        for r in list(self.live.values()):
            self.kv.free(r)
        assert self.kv.num_free_blocks == 24 and self.kv.num_stored_tokens == 0


TestKVMachine = KVMachine.TestCase
TestKVMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


class PlainKVMachine(KVMachine):
    """The same sequences on the pool without prefix caching (a stack of free blocks)."""
    caching = False


TestPlainKVMachine = PlainKVMachine.TestCase
TestPlainKVMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_a_reused_block_never_lets_a_stale_child_match():
    # x's first block fills with an output token and duplicates w's cached block, so it stays
    # uncached while its second block is cached as its child; x's first block is then reused
    # by y for other content, and z, whose prompt is y's block followed by x's second block's
    # tokens, must hit y's block only: x's second block holds KV computed after [1, 2], not
    # after [5, 6]
    kv = KVCacheManager(8, 2, enable_prefix_caching=True)
    w = R(0, 3, [1, 2, 9])
    kv.allocate_slots(w, 3)
    x = R(1, 1, [1])
    assert kv.allocate_slots(x, 1) is not None
    x.num_computed_tokens = 1
    for tok in (2, 3, 4):   # each decode computes the token sampled before it
        x.output_token_ids.append(tok)
        x.num_output_tokens += 1
        assert kv.allocate_slots(x, 1) is not None
        x.num_computed_tokens += 1
    x_first, x_second = kv.block_table(x)[:2]
    assert kv.pool.blocks[x_first].key is None and kv.pool.blocks[x_second].key is not None
    kv.free(x)
    y = R(2, 3, [5, 6, 9])
    kv.allocate_slots(y, 3)
    assert kv.block_table(y)[0] == x_first       # the uncached block is reused first
    hit, n = kv.get_computed_blocks(R(3, 5, [5, 6, 3, 4, 9]))
    assert n == 2 and [b.block_id for b in hit] == [x_first]


def test_decode_growth_by_hand():
    """Blocks of 4: a request with 2 blocks and 6 tokens (room for 2) needs one more at its
    3rd decode step and another at its 7th; one with 1 block full (4 tokens) at its 1st, 5th
    and 9th; one reserving ahead (3 blocks, 5 tokens) at its 8th."""
    import numpy as np
    kv = KVCacheManager(num_blocks=20, block_size=4)
    reqs = [Request(f"r{i}", arrival_time=0.0, num_prompt_tokens=n, max_tokens=50)
            for i, n in enumerate((6, 4, 5))]
    for r, blocks in zip(reqs, (2, 1, 3)):
        kv.req_blocks[r.request_id] = kv.pool.allocate(blocks)
    growth = kv.decode_growth_list(reqs, [6, 4, 5], 9)
    assert growth == [1, 1, 2, 2, 3, 3, 4, 5, 6]
    assert growth == kv._decode_growth_arrays(reqs, np.array([6, 4, 5]), 9).tolist()


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([1, 2, 4, 16, 32]),
       st.lists(st.tuples(st.integers(0, 12), st.integers(-40, 40)),
                     min_size=1, max_size=30), st.integers(1, 70))
def test_decode_growth_equals_the_array_formula(block_size, held_and_room, k):
    """Counted step by step (`decode_growth_list`) or over a (steps x requests) array, the same
    blocks beyond today's after each of k decode steps, including requests whose context
    already exceeds their blocks."""
    import numpy as np
    kv = KVCacheManager(num_blocks=400, block_size=block_size)
    reqs, ctx = [], []
    for i, (held, room) in enumerate(held_and_room):
        r = Request(f"r{i}", arrival_time=0.0, num_prompt_tokens=1, max_tokens=1)
        kv.req_blocks[r.request_id] = kv.pool.allocate(held)
        reqs.append(r)
        ctx.append(max(0, held * block_size - room))
    ctx = np.array(ctx, np.int64)
    b = kv._decode_growth_arrays(reqs, ctx, k)
    assert kv.decode_growth_list(reqs, ctx.tolist(), k) == b.tolist()
