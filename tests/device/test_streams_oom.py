"""Stream-ordered reuse, limits, out-of-memory handling, and fragmentation
cases reported from the field."""
import warnings

import pytest

import ascmem
from ascmem import MemAttr, Policy
from ascmem.rules import GiB, MiB

S1, S2 = "stream-1", "stream-2"


def dev(**kw):
    kw.setdefault("memory", 512 * MiB)
    return ascmem.Device("atlas-training", **kw)


# ---- stream-ordered reuse ---------------------------------------------------------

def test_same_stream_reuses_the_freed_block_at_once():
    d = dev()
    a = d.malloc(4 * MiB, stream=S1)
    d.free(a, stream=S1)
    assert d.pending_bytes() > 0
    assert d.malloc(4 * MiB, stream=S1) == a


def test_an_allocation_on_the_stream_does_not_free_its_other_blocks_for_other_streams():
    # S1 frees a; S1 then asks for a different size: a must stay S1's until
    # S1 is done, or S2 could get it while S1's queued work still reads it
    d = dev()
    a = d.malloc(4 * MiB, stream=S1)
    d.free(a, stream=S1)
    c = d.malloc(8 * MiB, stream=S1)
    assert c != a
    assert d.malloc(4 * MiB, stream=S2) != a
    d.synchronize(S1)
    assert d.malloc(4 * MiB, stream=S2) == a


def test_same_stream_reuse_keeps_statistics_exact():
    d = dev()
    a = d.malloc(1000, stream=S1)
    d.free(a, stream=S1)
    assert d.malloc(1010, stream=S1) == a  # rounded to 1056 again: the same 1280-byte slot
    s = d.stats()["normal"]
    assert s["live_count"] == 1 and s["requested"] == 1056
    assert s["alloc_count"] - s["free_count"] == 1
    d.check()


def test_a_block_shared_with_another_stream_is_not_reused_on_the_first():
    d = dev()
    a = d.malloc(4 * MiB, stream=S1)
    d.record_stream(a, S2)
    d.free(a, stream=S1)
    assert d.malloc(4 * MiB, stream=S1) != a  # S2 may still read it
    d.synchronize()


def test_other_streams_wait_until_the_stream_is_synchronized():
    d = dev()
    a = d.malloc(4 * MiB, stream=S1)
    d.free(a, stream=S1)
    b = d.malloc(4 * MiB, stream=S2)
    assert b != a  # S1's work may still read a
    d.synchronize(S1)
    assert d.pending_bytes() == 0
    assert d.malloc(4 * MiB, stream=S2) == a


def test_event_completion_frees_what_was_freed_before_it():
    d = dev()
    a = d.malloc(MiB * 2, stream=S1)
    d.free(a, stream=S1)
    ev = d.record_event(S1)
    b = d.malloc(MiB * 2, stream=S2)
    d.free(b, stream=S1)  # after the event
    d.complete_event(ev)
    assert d.pending_bytes() > 0  # b waits: it was freed after the event
    assert d.malloc(MiB * 2, stream=S2) == a
    d.synchronize()
    assert d.pending_bytes() == 0


def test_record_stream_keeps_a_block_until_every_stream_is_done():
    d = dev()
    a = d.malloc(MiB * 3, stream=S1)
    d.record_stream(a, S2)
    d.free(a, stream=S1)
    d.synchronize(S1)
    assert d.pending_bytes() > 0  # S2 still uses it
    assert d.malloc(MiB * 3) != a
    d.synchronize(S2)
    assert d.pending_bytes() == 0


def test_pending_blocks_count_as_used_and_are_reported_apart():
    d = dev()
    a = d.malloc(8 * MiB, Policy.HUGE_ONLY)
    used = d.budget()["huge_used"]
    d.free(a, stream=S1)
    assert d.budget()["huge_used"] == used
    assert d.stats()["device"]["pending_bytes"] == d.pending_bytes() >= 8 * MiB
    free, total = d.get_mem_info(MemAttr.HBM_MEM)
    assert total - free >= 8 * MiB


def test_double_free_of_a_pending_block_is_refused():
    d = dev()
    a = d.malloc(1000)
    d.free(a, stream=S1)
    with pytest.raises(ascmem.InvalidFreeError):
        d.free(a, stream=S1)
    with pytest.raises(ascmem.InvalidFreeError):
        d.free(a)
    d.synchronize()
    d.check()


def test_dvpp_blocks_wait_on_streams_too():
    d = ascmem.Device("atlas-inference")
    f = d.dvpp_malloc(3_110_400, stream=S1)
    d.dvpp_free(f, stream=S1)
    assert d.dvpp_malloc(3_110_400, stream=S2) != f
    d.synchronize(S1)
    assert d.dvpp_malloc(3_110_400, stream=S2) == f


# ---- limits -----------------------------------------------------------------------

def test_limit_is_respected_by_every_kind():
    d = dev(limit=64 * MiB)
    d.malloc(40 * MiB, Policy.HUGE_ONLY)
    with pytest.raises(ascmem.OutOfMemoryError):
        d.malloc(30 * MiB, Policy.NORMAL_ONLY)
    with pytest.raises(ascmem.OutOfMemoryError):
        d.dvpp_malloc(30 * MiB)
    d.malloc(20 * MiB, Policy.NORMAL_ONLY)


def test_set_memory_fraction():
    d = dev()
    d.set_memory_fraction(0.25)
    assert d.budget()["limit"] == d.budget()["total"] // 4
    with pytest.raises(ascmem.OutOfMemoryError):
        d.malloc(200 * MiB)
    d.set_memory_fraction(1.0)
    d.malloc(200 * MiB)
    with pytest.raises(ascmem.InvalidArgumentError):
        d.set_memory_fraction(0)


# ---- out of memory --------------------------------------------------------------------

def test_oom_message_tells_fragmentation_from_shortage():
    d = dev()
    with pytest.raises(ascmem.OutOfMemoryError) as info:
        d.malloc(600 * MiB, Policy.HUGE_ONLY)
    msg = str(info.value)
    for part in ("HUGE", "free", "largest free block", "waiting on streams", "device budget"):
        assert part in msg


def test_oom_callback_may_free_memory_and_retry_once():
    d = dev()
    hog = d.malloc(400 * MiB, Policy.HUGE_ONLY)
    seen = []

    def release(info):
        seen.append(info)
        d.free(hog)
        return True

    d.on_out_of_memory(release)
    a = d.malloc(300 * MiB, Policy.HUGE_ONLY)
    assert len(seen) == 1 and seen[0]["size"] == 300 * MiB and seen[0]["kind"] == ascmem.MemKind.HUGE
    assert d.stats()["device"]["oom_retries"] == 1
    d.on_out_of_memory(lambda info: False)
    with pytest.raises(ascmem.OutOfMemoryError):
        d.malloc(300 * MiB, Policy.HUGE_ONLY)
    d.free(a)


def test_oom_gives_back_spare_slabs_first():
    d = dev(memory=64 * MiB)
    small = [d.malloc(n, Policy.NORMAL_ONLY) for n in (100, 1000, 3000, 9000, 20000) * 20]
    for x in small:
        d.free(x)
    assert d.stats()["normal"]["slab_bytes"] > 0
    whole = d.budget()["shared"]
    big = d.malloc(whole - 64 * 1024, Policy.NORMAL_ONLY)  # needs the slabs' pages back
    d.free(big)
    d.check()


# ---- fragmentation cases from the field ------------------------------------------------

def test_large_blocks_around_a_live_small_one_do_not_grow_or_fail():
    d = dev(memory=1 * GiB)
    peaks = []
    for _ in range(50):
        a = d.malloc(91 * MiB)
        keep = d.malloc(2 * MiB)
        b = d.malloc(int(45.5 * MiB))
        d.free(a)
        d.free(b)
        peaks.append(d.budget()["peak_huge"])
        d.free(keep)
    assert max(peaks) == peaks[0]  # the footprint does not creep
    d.check()


def test_a_request_that_fits_a_free_block_succeeds_while_full():
    d = dev(memory=256 * MiB)
    blocks = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while True:
            try:
                blocks.append(d.malloc(10 * MiB))
            except ascmem.OutOfMemoryError:
                break
    d.free(blocks[len(blocks) // 2])
    assert d.malloc(9 * MiB)  # fits the hole


def test_the_whole_memory_in_one_block():
    d = dev(memory=256 * MiB)
    total = d.budget()["shared"]
    a = d.malloc(total - 64, Policy.HUGE_ONLY)
    d.free(a)
    d.check()
