"""Hypothesis state machines: Pool and BuddyAllocator against a reference
model that only knows which blocks are live and what was asked."""
import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

import ascmem
from conftest import BASE

CAPACITY = 4 << 20  # a power of two, so "whole again" means largest_free == capacity
sizes = st.one_of(st.integers(1, 512), st.integers(513, 40_000), st.integers(40_001, 1_500_000))
aligns = st.sampled_from([1, 32, 64, 128, 4096, 65536])


class AllocatorModel(RuleBasedStateMachine):
    make = None
    blocks = Bundle("blocks")

    def __init__(self):
        super().__init__()
        self.a = self.make()
        self.live = {}  # addr -> (requested, usable)
        self.allocs = self.frees = 0

    @rule(target=blocks, size=sizes, align=aligns)
    def alloc(self, size, align):
        try:
            addr = self.a.alloc(size, align)
        except ascmem.OutOfMemoryError:
            return None
        usable = self.a.usable_size(addr)
        assert addr % align == 0 and usable >= size
        assert BASE <= addr and addr + usable <= BASE + CAPACITY
        for other, (_, n) in self.live.items():
            assert addr + usable <= other or other + n <= addr, "overlap"
        self.live[addr] = (size, usable)
        self.allocs += 1
        return addr

    @rule(addr=consumes(blocks))
    def free(self, addr):
        if addr is None:
            return
        self.a.free(addr)
        del self.live[addr]
        self.frees += 1

    @rule(addr=consumes(blocks))
    def free_and_take_the_same_size_again(self, addr):
        # The pool keeps the last freed large block whole for this, and stats()
        # (run by the invariant) hands it back to best fit: so check in here.
        # The new block stays live until teardown.
        if addr is None:
            return
        size, _ = self.live[addr]
        self.free(addr)
        self.a.check()
        self.alloc(size, 64)

    @rule(data=st.lists(sizes, min_size=1, max_size=30))
    def batch(self, data):
        # alloc_many puts large blocks into the address map a few allocations
        # late: all of them must be findable when it returns
        before = self.a.stats()["alloc_count"]
        try:
            addrs = self.a.alloc_many(data)
        except ascmem.OutOfMemoryError:
            addrs = None  # all or nothing: what it took is given back
        self.a.check()
        if addrs is not None:
            for addr, size in zip(addrs.tolist(), data):
                assert self.a.requested_size(addr) == size
            self.a.free_many(addrs)
        done = self.a.stats()["alloc_count"] - before
        self.allocs += done
        self.frees += done

    @rule(addr=blocks)
    def free_twice_is_refused(self, addr):
        if addr is None or addr in self.live:
            return
        try:
            self.a.free(addr)
        except ascmem.InvalidFreeError:
            return
        raise AssertionError("a freed block was freed again")

    @rule(offset=st.integers(1, 63))
    def interior_pointer_is_refused(self, offset):
        for addr, (_, used) in self.live.items():
            if offset >= used:  # past the block: maybe the next block's start, not an interior
                return
            try:
                self.a.free(addr + offset)
            except ascmem.InvalidFreeError:
                pass
            else:
                raise AssertionError("interior pointer accepted")
            return

    @invariant()
    def stats_match_the_model(self):
        s = self.a.stats()
        assert s["live_count"] == len(self.live)
        assert s["requested"] == sum(r for r, _ in self.live.values())
        assert s["used"] == sum(u for _, u in self.live.values())
        assert s["alloc_count"] == self.allocs and s["free_count"] == self.frees
        self.a.check()

    def teardown(self):
        for addr in list(self.live):
            self.a.free(addr)
        if isinstance(self.a, ascmem.Pool):
            self.a.trim()
        s = self.a.stats()
        assert s["used"] == 0 and s["largest_free"] == CAPACITY
        self.a.check()


class PoolModel(AllocatorModel):
    make = staticmethod(lambda: ascmem.Pool(CAPACITY, base=BASE, page_size=1 << 21))


class CachedPoolModel(AllocatorModel):
    """The same rules through a thread cache: frees go to the cache, its
    slots serve later allocations, stats and check() flush it first."""
    make = staticmethod(lambda: ascmem.Pool(CAPACITY, base=BASE, page_size=1 << 21,
                                            thread_caches="on"))


class BuddyModel(AllocatorModel):
    make = staticmethod(lambda: ascmem.BuddyAllocator(CAPACITY, base=BASE))


TestPool = PoolModel.TestCase
TestPool.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestCachedPool = CachedPoolModel.TestCase
TestCachedPool.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestBuddy = BuddyModel.TestCase
TestBuddy.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
