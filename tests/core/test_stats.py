"""Statistics in PyTorch's and RMM's shapes (ascmem.stats)."""
import pytest

import ascmem
from ascmem import Policy
from conftest import MiB


# the keys torch.cuda.memory_stats() has (PyTorch 2.x), which dashboards read
TORCH_KEYS = [f"{m}.{g}.{s}" for m in ("allocated_bytes", "reserved_bytes", "active_bytes",
                                       "requested_bytes", "inactive_split_bytes", "allocation",
                                       "segment", "active", "inactive_split")
              for g in ("all", "small_pool", "large_pool")
              for s in ("current", "peak", "allocated", "freed")] + [
    "num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
    "num_device_free", "max_split_size"]


def test_memory_stats_has_pytorchs_keys_and_adds_up():
    d = ascmem.Device("atlas-a2-training")
    small = d.malloc(1000)                       # normal pages: the small pool
    big = d.malloc(8 * MiB, Policy.HUGE_ONLY)    # huge pages: the large pool
    d.free(d.malloc(3 * MiB, Policy.HUGE_ONLY))
    s = d.memory_stats()
    assert set(TORCH_KEYS) <= set(s)
    assert s["allocation.all.current"] == 2 and s["allocation.all.allocated"] == 3
    assert s["allocation.all.freed"] == 1 and s["allocation.all.peak"] == 3
    for stat in ("current", "peak", "allocated", "freed"):
        assert s[f"allocated_bytes.all.{stat}"] == (s[f"allocated_bytes.small_pool.{stat}"] +
                                                    s[f"allocated_bytes.large_pool.{stat}"])
    assert s["allocated_bytes.all.current"] == d.usable_size(small) + d.usable_size(big) or \
        s["allocated_bytes.all.current"] >= 8 * MiB
    assert (s["allocated_bytes.all.allocated"] - s["allocated_bytes.all.freed"] ==
            s["allocated_bytes.all.current"])
    assert s["requested_bytes.large_pool.current"] == d.usable_size(big)
    # reserved: the pages charged to the device budget
    b = d.budget()
    assert s["reserved_bytes.all.current"] == b["huge_used"] + b["normal_used"]
    assert s["reserved_bytes.large_pool.peak"] >= 12 * MiB
    with pytest.raises(ascmem.OutOfMemoryError):
        d.malloc(1 << 40, Policy.HUGE_ONLY)
    assert d.memory_stats()["num_ooms"] == 1
    d.synchronize()
    assert d.memory_stats()["num_sync_all_streams"] == 1


def test_a_block_taken_back_at_once_never_gave_its_pages():
    """A block freed and asked for again at once (the same shape in a loop)
    keeps its pages charged in between (pool.c, "Deferred discharge"), as
    PyTorch's cache keeps a segment: reserved bytes stay, and their
    allocated / freed totals do not count the round trip.  Anything that
    reads in between sees them given: the budget, stats, another kind."""
    d = ascmem.Device("atlas-a2-training")
    a = d.malloc(3 * MiB, Policy.HUGE_ONLY)
    d.free(a)
    assert d.malloc(3 * MiB, Policy.HUGE_ONLY) == a
    before = d.memory_stats()
    for _ in range(10):
        d.free(a)
        assert d.malloc(3 * MiB, Policy.HUGE_ONLY) == a
    after = d.memory_stats()
    for key in ("reserved_bytes.large_pool.allocated", "reserved_bytes.large_pool.freed",
                "reserved_bytes.large_pool.current", "reserved_bytes.large_pool.peak"):
        assert after[key] == before[key], key
    assert after["allocation.large_pool.allocated"] == before["allocation.large_pool.allocated"] + 10
    d.free(a)
    assert d.budget()["huge_used"] == 0  # read: given
    assert d.memory_stats()["reserved_bytes.large_pool.current"] == 0
    d.malloc(1000)                        # another kind after the free: the pages are given
    assert d.budget()["huge_used"] == 0
    d.check()


def test_memory_stats_of_a_paged_device_count_mapped_memory():
    d = ascmem.Device("atlas-a3", memory=8 << 30, paged=True, release_threshold=4 * MiB)
    d.free(d.malloc(10 * MiB, Policy.HUGE_ONLY))
    s = d.memory_stats()
    assert s["reserved_bytes.large_pool.current"] == 4 * MiB  # kept granules stay reserved
    assert s["reserved_bytes.large_pool.peak"] == 12 * MiB


def test_memory_summary_is_a_table_of_the_same_figures():
    d = ascmem.Device("atlas-a2-training")
    d.malloc(8 * MiB, Policy.HUGE_ONLY)
    text = d.memory_summary()
    assert "Allocated memory" in text and "from large pool" in text and "OOMs: 0" in text
    assert "8.00 MiB" in text
    assert len({len(line) for line in text.splitlines()}) == 1  # aligned


def test_statistics_block_on_a_pool():
    p = ascmem.Pool(64 * MiB, base=1 << 32)
    keep = p.alloc(4096)
    with ascmem.statistics(p) as s:
        a = p.alloc(1 * MiB)
        b = p.alloc(2 * MiB)
        p.free(a)
    assert s.total_count == 2 and s.total_bytes == 3 * MiB
    assert s.current_count == 1 and s.current_bytes == 2 * MiB
    assert s.peak_bytes == 3 * MiB and s.peak_count == 2
    p.free(b)
    p.free(keep)


def test_statistics_block_on_a_device():
    d = ascmem.Device("atlas-a2-training")
    with ascmem.statistics(d) as s:
        d.free(d.malloc(5 * MiB, Policy.HUGE_ONLY))
    assert s.total_count == 1 and s.current_bytes == 0 and s.peak_bytes >= 5 * MiB
