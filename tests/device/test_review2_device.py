"""The second adversarial review (issue 45) and issue 43 item 7: sleep and
streams, block buffers, paged pools' granules and spares, batch and
argument checks.  One test (or a few) per item, named after it.  Crashes
run in a child process with a time limit (conftest.run_child)."""
import numpy as np
import pytest

import ascmem
from ascmem.errors import ArgumentTypeError, InvalidArgumentError, OutOfMemoryError

from conftest import BASE, MiB, run_child


def paged_device(backend="host", **kw):
    return ascmem.Device("atlas-a2-training", memory=8 << 30, backend=backend, paged=True, **kw)


# ---- 45.1: a sleeping block freed on a stream --------------------------------------

def test_45_1_sleeping_block_freed_on_a_stream_is_not_reused_unmapped_host():
    """The stream's next allocation of the same size used to get the
    sleeping block back as it was, nothing mapped under it: writing to it
    was a SIGSEGV."""
    r = run_child("""
        import ascmem
        MiB = 1 << 20
        d = ascmem.Device("atlas-a2-training", memory=8 << 30, backend="host", paged=True)
        p = d.malloc(8 * MiB, tag="w")
        d.as_array(p, 8 * MiB)[:] = 7
        assert d.sleep("w") >= 8 * MiB
        d.free(p, stream="s")
        q = d.malloc(8 * MiB, stream="s")
        a = d.as_array(q, 8 * MiB)
        a[:] = 1                       # the crash was here
        assert int(a.sum()) == 8 * MiB
        del a
        d.check()
        d.free(q)
        d.synchronize()
        d.check()
        b = d.budget()
        assert b["huge_used"] + b["normal_used"] == 0, b
        print("ok")
    """, timeout=120)
    assert r.stdout.strip() == "ok"


def test_45_1_sleeping_block_freed_on_a_stream_sim_books_are_exact():
    """Sim: the reused block was live and awake with 0 bytes mapped or
    charged.  Now the stream's next allocation is a block of its own, charged
    in full, and once everything is freed nothing stays charged."""
    d = paged_device("sim")
    p = d.malloc(8 * MiB, tag="w")
    charged = d.budget()["huge_used"]
    assert d.sleep("w") == charged
    assert d.budget()["huge_used"] == 0
    d.free(p, stream="s")
    q = d.malloc(8 * MiB, stream="s")
    assert q != p  # the sleeping block waits for its stream, then is freed whole
    assert d.budget()["huge_used"] >= 8 * MiB
    d.check()
    d.synchronize("s")
    d.check()
    d.free(q)
    d.check()
    assert d.budget()["huge_used"] == 0
    s = d.stats()["device"]
    assert s["asleep_bytes"] == 0


# ---- 45.2: the bytes of a block are out of reach once it is gone -------------------

def test_45_2_buffer_obj_refused_after_free_sleep_and_reset():
    r = run_child("""
        import ascmem
        from ascmem.errors import InvalidArgumentError
        MiB = 1 << 20
        d = ascmem.Device("atlas-a2-training", memory=8 << 30, backend="host", paged=True)

        def refused(obj):
            try:
                memoryview(obj)
            except InvalidArgumentError:
                return True
            return False

        p = d.malloc(4096)
        o = d.buffer(p).obj            # the view is gone at once: the block may be freed
        d.free(p)
        assert refused(o)              # was: a writable view of freed memory

        big = d.malloc(8 * MiB, tag="kv")
        o = d.buffer(big).obj
        d.sleep("kv")
        assert refused(o)              # was: a SIGSEGV on write
        d.wake("kv")
        assert refused(o)              # released for good, awake again or not

        q = d.malloc(8 * MiB)
        o = d.buffer(q).obj
        d.reset()
        assert refused(o)              # was: a SIGSEGV on write

        # while one export lives the block is held, and the buffer re-exports
        q = d.malloc(4096)
        m = d.buffer(q)
        m2 = memoryview(m.obj)
        m2[0] = 5
        try:
            d.free(q)
        except ascmem.InvalidFreeError:
            pass
        else:
            raise AssertionError("freed under a live view")
        obj = m.obj
        m.release(); m2.release()
        assert refused(obj)
        d.free(q)
        d.check()
        print("ok")
    """, timeout=120)
    assert r.stdout.strip() == "ok"


def test_45_2_array_and_view_still_work_while_alive():
    d = ascmem.Device("atlas-a2-training", memory=8 << 30, backend="host")
    p = d.malloc(1024)
    a = d.as_array(p, 1024)
    a[:] = 3
    b = np.frombuffer(memoryview(d.buffer(p)), dtype=np.uint8)
    assert int(b.sum()) == 3 * 1024
    del a, b
    d.free(p)
    d.check()
    d.close()


# ---- 45.5: a granule must fit the pool's range -------------------------------------

@pytest.mark.parametrize("size,granule", [(16 * MiB, 32 * MiB), (64 * MiB, 2 ** 55),
                                          (48 * MiB, 32 * MiB)])
def test_45_5_granule_reaching_past_the_range_is_invalid(size, granule):
    with pytest.raises(InvalidArgumentError, match="multiple of the granule"):
        ascmem.Pool(size, base=BASE, granule=granule)


def test_45_5_whole_granules_still_accepted():
    p = ascmem.Pool(64 * MiB, base=BASE, granule=32 * MiB)
    a = p.alloc(40 * MiB)
    assert p.stats()["mapped"] == 64 * MiB
    p.free(a)
    p.check()


# ---- 45.10: release_threshold=0 keeps nothing mapped -------------------------------

SMALL = (100, 5000, 20000, 3000, 700, 32000, 9000)


@pytest.mark.parametrize("granule", [4096, 64 << 10, 2 * MiB])
def test_45_10_paged_pool_threshold_0_maps_nothing_once_empty(granule):
    p = ascmem.Pool(64 * MiB, base=BASE, granule=granule)
    live = [p.alloc(n) for n in SMALL * 30]
    for a in live:
        p.free(a)
    s = p.stats()
    assert s["mapped"] == 0 and s["cached_bytes"] == 0
    p.check()


def test_45_10_threshold_still_keeps_granules_up_to_it():
    p = ascmem.Pool(64 * MiB, base=BASE, granule=4096, release_threshold=64 << 10)
    live = [p.alloc(n) for n in SMALL * 30]
    for a in live:
        p.free(a)
    assert 0 < p.stats()["mapped"] <= 64 << 10
    p.trim()
    assert p.stats()["mapped"] == 0


def test_45_10_paged_device_gives_everything_back():
    d = paged_device("host")  # 4 KiB granules for normal pages: its slabs are larger
    attr = ascmem.MemAttr.HBM_MEM
    before = d.get_mem_info(attr)
    live = [d.malloc(n, ascmem.Policy.NORMAL_ONLY) for n in SMALL * 30]
    for a in live:
        d.free(a)
    b = d.budget()
    assert b["huge_used"] == 0 and b["normal_used"] == 0, b
    assert d.get_mem_info(attr) == before
    assert d.stats()["normal"]["cached_bytes"] == 0
    d.check()
    d.close()


# ---- 45.11: a refused alloc_many changes nothing -----------------------------------

def test_45_11_refused_alloc_many_moves_no_counter():
    p = ascmem.Pool(4 * MiB, base=BASE)
    keep = p.alloc(1000)
    before = p.stats()
    with pytest.raises(OutOfMemoryError):
        p.alloc_many([1000, 2000, 3 * MiB, 2 * MiB])
    with pytest.raises(InvalidArgumentError):
        p.alloc_many([1000, 0])
    after = p.stats()
    for k in ("alloc_count", "free_count", "alloc_bytes", "freed_bytes", "alloc_requested",
              "freed_requested", "live_count", "used", "requested"):
        assert after[k] == before[k], k
    assert after["failed_count"] == before["failed_count"] + 1  # the one refused for room
    p.free(keep)
    p.check()


# ---- 45.12: Device(release_threshold=...) is always checked ------------------------

@pytest.mark.parametrize("value,exc", [("x", ArgumentTypeError), (-1, InvalidArgumentError),
                                       (2 ** 70, InvalidArgumentError), (1.5, ArgumentTypeError),
                                       (MiB, InvalidArgumentError)])
def test_45_12_release_threshold_checked_without_paged(value, exc):
    with pytest.raises(exc):
        ascmem.Device("atlas-a2-training", memory=8 << 30, release_threshold=value)


@pytest.mark.parametrize("value,exc", [("x", ArgumentTypeError), (-1, InvalidArgumentError),
                                       (2 ** 70, InvalidArgumentError)])
def test_45_12_release_threshold_checked_with_paged(value, exc):
    with pytest.raises(exc):
        paged_device("sim", release_threshold=value)


def test_45_12_zero_threshold_fine_without_paged():
    ascmem.Device("atlas-a2-training", memory=8 << 30, release_threshold=0).close()


# ---- 45.16: sleep of a tag ----------------------------------------------------------

def test_45_16_sleep_of_an_unknown_tag_is_an_error():
    d = paged_device("sim")
    a = d.malloc(4 * MiB, tag="weights")
    with pytest.raises(InvalidArgumentError, match="no block was ever allocated"):
        d.sleep("wieghts")
    b = d.malloc(4 * MiB, tag="wieghts_not_yet")  # a name never slept is not blocked
    d.free(b)
    d.free(a)
    d.check()


def test_45_16_known_tag_with_no_blocks_may_sleep_and_waits_for_wake():
    d = paged_device("sim")
    d.free(d.malloc(4 * MiB, tag="kv"))
    assert d.sleep("kv") == 0
    with pytest.raises(InvalidArgumentError, match="asleep"):
        d.malloc(4 * MiB, tag="kv")
    assert d.wake("kv") == 0
    d.free(d.malloc(4 * MiB, tag="kv"))
    d.check()


# ---- 43.7: a Pool counts a request larger than itself as failed --------------------

def test_43_7_pool_counts_request_larger_than_itself():
    p = ascmem.Pool(4 * MiB, base=BASE)
    with pytest.raises(OutOfMemoryError):
        p.alloc(8 * MiB)
    assert p.stats()["failed_count"] == 1
    d = ascmem.Device("atlas-a2-training", memory=8 << 30)
    with pytest.raises(OutOfMemoryError):
        d.malloc(1 << 40)
    s = d.stats()
    assert sum(s[k]["failed_count"] for k in s if k != "device") == 1  # as the Pool now
    d.close()


def test_a_python_block_freed_through_the_pluggable_free_does_not_block_close_or_hide_later_ones():
    """The handed-out count is per path: a block Python allocated and the
    pluggable free released took it to -1, and close() refused with "-1
    blocks handed out" (found by fuzz_python). Below zero it is set back to
    zero when the gate is shut, so a later C block is still counted."""
    from ascmem import pluggable
    raw = pluggable.functions()
    index = 5
    dev = ascmem.Device("atlas-a2-training", backend="host", memory=1 << 30)
    pluggable.configure(dev, index)
    try:
        raw[pluggable.FREE](dev.malloc(4096), 0, index, None)
        dev.reset()                                    # the count goes back to zero here
        c_block = raw[pluggable.ALLOC](4096, index, None)
        with pytest.raises(ascmem.InUseError, match="1 blocks handed out"):
            dev.close()                                # not hidden by the earlier -1
        raw[pluggable.FREE](c_block, 0, index, None)
        dev.close()
    finally:
        pluggable.unconfigure(index)
