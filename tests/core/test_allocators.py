"""The contract every allocator keeps: Pool and BuddyAllocator alike."""
import numpy as np
import pytest

import ascmem
from conftest import BASE, MiB, make_buddy, make_pool


def test_alloc_returns_aligned_addresses_in_range(allocator):
    for size in (1, 31, 64, 100, 4096, 5000, MiB, 5 * MiB):
        for align in (1, 64, 128, 4096):
            a = allocator.alloc(size, align)
            assert a % align == 0
            assert BASE <= a and a + size <= BASE + allocator.capacity
            assert allocator.usable_size(a) >= size
            assert allocator.requested_size(a) == size
    allocator.check()


def test_live_blocks_never_overlap(allocator):
    rng = np.random.default_rng(1)
    live = {}
    for _ in range(3000):
        if live and rng.random() < 0.45:
            a = list(live)[rng.integers(len(live))]
            allocator.free(a)
            del live[a]
        else:
            size = int(rng.integers(1, 300_000))
            try:
                a = allocator.alloc(size)
            except ascmem.OutOfMemoryError:
                continue
            live[a] = allocator.usable_size(a)
    spans = sorted(live.items())
    for (a, n), (b, _) in zip(spans, spans[1:]):
        assert a + n <= b
    allocator.check()


def test_statistics_are_exact(allocator):
    a = allocator.alloc(100)
    b = allocator.alloc(3 * MiB + 1)
    s = allocator.stats()
    assert s["requested"] == 100 + 3 * MiB + 1
    assert s["used"] == allocator.usable_size(a) + allocator.usable_size(b)
    assert s["live_count"] == 2 and s["alloc_count"] == 2 and s["free_count"] == 0
    allocator.free(a)
    s = allocator.stats()
    assert s["requested"] == 3 * MiB + 1 and s["peak_requested"] == 100 + 3 * MiB + 1
    assert s["live_count"] == 1 and s["free_count"] == 1
    for key in ("capacity", "used", "requested", "peak_used", "peak_requested", "free",
                "largest_free", "live_count", "alloc_count", "free_count", "failed_count"):
        assert key in s


def test_whole_again_after_everything_is_freed(allocator):
    addrs = [allocator.alloc(n) for n in (10, 1000, 70_000, 2 * MiB, 9 * MiB, 33)]
    for a in addrs:
        allocator.free(a)
    if isinstance(allocator, ascmem.Pool):
        allocator.trim()  # the pool keeps one empty slab per class until trimmed
    s = allocator.stats()
    assert s["used"] == 0 and s["largest_free"] == s["capacity"] == 64 * MiB
    allocator.check()


def test_batch_calls(allocator):
    sizes = np.random.default_rng(2).integers(1, 40_000, size=2000)
    addrs = allocator.alloc_many(sizes)
    assert addrs.dtype == np.uint64 and len(addrs) == 2000 and len(set(addrs.tolist())) == 2000
    assert allocator.stats()["requested"] == int(sizes.sum())
    allocator.free_many(addrs)
    assert allocator.stats()["live_count"] == 0
    allocator.check()


def test_alloc_many_is_all_or_nothing(allocator):
    before = allocator.stats()
    with pytest.raises(ascmem.OutOfMemoryError):
        allocator.alloc_many([MiB] * 100)  # 100 MiB into 64 MiB
    after = allocator.stats()
    assert after["live_count"] == 0 and after["used"] == before["used"]
    allocator.check()


def test_exact_size_large_allocations():
    b = ascmem.BuddyAllocator(16 * MiB, base=BASE, min_block=MiB)
    a = b.alloc(5 * MiB)
    assert b.stats()["used"] == 5 * MiB  # not 8: the tail went back as buddies
    c = b.alloc(3 * MiB)                 # ... and is usable
    b.free(a)
    b.free(c)
    assert b.stats()["largest_free"] == 16 * MiB
    b.check()


def test_buddy_range_need_not_be_a_power_of_two():
    b = ascmem.BuddyAllocator(12 * MiB, base=BASE, min_block=4096)
    assert b.stats()["largest_free"] == 8 * MiB
    a = b.alloc(8 * MiB)
    c = b.alloc(4 * MiB)
    b.free(a)
    b.free(c)
    b.check()


def test_buddy_metadata_budget():
    """At most about 2 bytes per minimum block (64 GiB on 4 KiB: ~32 MiB)."""
    b = ascmem.BuddyAllocator(64 << 30, min_block=4096)
    units = (64 << 30) // 4096
    assert b.stats()["metadata_bytes"] <= 2 * units


def test_pool_fills_to_the_last_byte_and_recovers():
    p = make_pool(8 * MiB)
    a = p.alloc(8 * MiB)
    with pytest.raises(ascmem.OutOfMemoryError):
        p.alloc(64)
    p.free(a)
    small = [p.alloc(64) for _ in range(1000)]
    for x in small:
        p.free(x)
    p.trim()
    b = p.alloc(8 * MiB)
    p.free(b)
    assert p.stats()["failed_count"] == 1
    p.check()


def test_pool_spare_slabs_make_way_for_a_large_request():
    p = make_pool(4 * MiB)
    xs = [p.alloc(n) for n in (32, 100, 300, 1000, 5000, 20_000)]
    for x in xs:
        p.free(x)
    assert p.stats()["slab_bytes"] > 0
    a = p.alloc(4 * MiB)  # succeeds: the empty slabs are given back on the way
    p.free(a)
    p.check()


def test_slab_rounding_waste_is_at_most_a_quarter():
    p = make_pool()
    for size in range(1, 32 * 1024, 97):
        a = p.alloc(size, 32)
        usable = p.usable_size(a)
        assert usable % 32 == 0
        if size > 256:
            assert usable <= size * 1.25
        p.free(a)
    p.check()


def test_page_accounting_counts_pages_touched_by_live_blocks():
    p = ascmem.Pool(64 * MiB, base=BASE, page_size=2 * MiB)
    a = p.alloc(5 * MiB)          # pages 0..2
    assert p.stats()["pages_in_use"] == 3
    b = p.alloc(MiB)              # shares page 2, adds nothing
    assert p.stats()["pages_in_use"] == 3
    p.free(a)
    assert p.stats()["pages_in_use"] == 1
    p.free(b)
    assert p.stats()["pages_in_use"] == 0


def test_reset_frees_everything(allocator):
    a = allocator.alloc(1000)
    allocator.alloc(2 * MiB)
    allocator.reset()
    assert allocator.stats()["live_count"] == 0
    with pytest.raises(ascmem.InvalidFreeError):
        allocator.free(a)
    allocator.check()


def test_with_pool_closes_it():
    import warnings
    with ascmem.Pool(64 * MiB, base=BASE) as p:
        a = p.alloc(1000)
        p.free(a)
    for call in (lambda: p.alloc(10), lambda: p.free(a), lambda: p.alloc_many([64, 64]),
                 lambda: p.free_many([a]), p.reset):
        with pytest.raises(ascmem.ClosedError) as e:
            call()
        assert e.value.code == 107002
    assert p.stats()["live_count"] == 0  # statistics stay readable
    p.close()  # idempotent
    q = ascmem.Pool(64 * MiB, base=BASE)
    q.alloc(100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        q.close()  # a live block is reported, as when a pool is collected with one
    assert any(issubclass(w.category, ResourceWarning) for w in caught)
    assert isinstance(ascmem.DeviceClosedError("x"), ascmem.ClosedError)
