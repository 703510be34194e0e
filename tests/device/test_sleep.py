"""Sleep and wake by tag on a paged Device: the tag's physical memory goes
back while its blocks keep their addresses, and comes back with the same
contents (vLLM's sleep mode for weights and KV cache)."""
import ctypes
import os

import pytest

import ascmem
from ascmem import Policy
from conftest import MiB


def resident(addr, size):
    """Bytes of [addr, addr + size) in memory now (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = os.sysconf("SC_PAGE_SIZE")
    n = (size + page - 1) // page
    vec = (ctypes.c_ubyte * n)()
    assert libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0
    return sum(v & 1 for v in vec) * page


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.fixture
def dev():
    d = ascmem.Device("atlas-a2-training", memory=8 << 30, backend="host", paged=True)
    yield d
    d.close()


def fill(d, addr, n, byte):
    d.as_array(addr, n)[:] = byte


def test_sleep_and_wake_keep_addresses_and_contents(dev):
    kv = [dev.malloc(16 * MiB, tag="kv") for _ in range(4)]
    weights = dev.malloc(32 * MiB, tag="weights")
    small = dev.malloc(200, tag="kv")  # a slab slot: stays resident
    for i, a in enumerate(kv):
        fill(dev, a, 16 * MiB, i + 1)
    fill(dev, weights, 32 * MiB, 9)
    fill(dev, small, 200, 5)
    before = dev.budget()["huge_used"]
    released = dev.sleep("kv")
    assert released >= 64 * MiB and dev.budget()["huge_used"] == before - released
    # the pages are gone, but for a granule shared with the awake weights block
    assert sum(resident(a, 16 * MiB) for a in kv) <= 2 * MiB
    assert dev.stats()["device"]["asleep_bytes"] >= 64 * MiB
    other = dev.malloc(8 * MiB, tag="scratch")  # other tags go on
    fill(dev, other, 8 * MiB, 3)
    dev.free(other)
    assert dev.wake("kv") == released
    for i, a in enumerate(kv):  # same addresses, same bytes
        arr = dev.as_array(a, 16 * MiB)
        assert arr.min() == arr.max() == i + 1
    assert dev.as_array(small, 200).min() == 5 and dev.as_array(weights, 32 * MiB).max() == 9
    dev.check()


def test_sleep_without_keep_gives_host_memory_back(dev):
    blocks = [dev.malloc(32 * MiB, tag="weights") for _ in range(3)]
    for a in blocks:
        fill(dev, a, 32 * MiB, 1)
    start = rss()
    dev.sleep("weights", keep=False)
    assert start - rss() >= 90 * MiB  # RSS follows
    dev.wake("weights")
    assert [dev.usable_size(a) for a in blocks] == [32 * MiB + 32] * 3
    fill(dev, blocks[0], 32 * MiB, 2)  # mapped again, writable
    dev.check()


def test_sleep_gives_memory_back_past_the_release_threshold():
    """A release threshold keeps freed granules mapped for the next
    allocation; a sleeping tag's owner wants its memory back now, so sleep
    unmaps past the threshold (it used to keep up to the threshold mapped,
    and gave nothing back).  check() counts the kept granules as charged."""
    d = ascmem.Device("atlas-a2-training", memory=8 << 30, backend="host", paged=True,
                      release_threshold=256 * MiB)
    scratch = d.malloc(64 * MiB)
    d.free(scratch)  # its granules stay mapped and charged: kept for reuse
    d.check()
    kept = d.budget()["huge_used"]
    assert kept >= 64 * MiB
    kv = [d.malloc(16 * MiB - 32, tag="kv") for _ in range(4)]  # whole granules each
    for i, a in enumerate(kv):
        fill(d, a, 16 * MiB - 32, i + 1)
    before = d.budget()["huge_used"]
    assert d.sleep("kv") == 64 * MiB  # (RSS does not drop: keep=True copied 64 MiB to the host)
    assert d.budget()["huge_used"] == before - 64 * MiB
    assert sum(resident(a, 16 * MiB) for a in kv) == 0
    d.check()
    assert d.wake("kv") == 64 * MiB
    for i, a in enumerate(kv):
        arr = d.as_array(a, 16 * MiB - 32)
        assert arr.min() == arr.max() == i + 1
    del arr
    d.check()
    d.close()


def test_sleep_and_wake_count_their_own_granules_while_raw_callers_allocate():
    """The bytes sleep and wake return are the granules their own blocks
    gave back and took again, counted under the pool lock: callers without
    the GIL (the pluggable functions, here through ctypes) allocating in
    the same pool at the same time do not change them.  (They were the
    budget's change over the whole call, which other threads moved.)"""
    import threading
    import ascmem.pluggable as pl
    d = ascmem.Device("atlas-a2-training", memory=4 << 30, backend="host", paged=True)
    pl.configure(d, 0)
    fns = pl.functions()
    alloc, free = fns[pl.ALLOC], fns[pl.FREE]
    stop = threading.Event()

    def raw(seed):
        import random
        rng, live = random.Random(seed), []
        while not stop.is_set():
            if live and (rng.random() < 0.5 or len(live) > 16):
                p, n = live.pop()
                free(p, n, 0, None)
            else:
                n = rng.choice((1 * MiB, 6 * MiB, 20 * MiB))
                p = alloc(n, 0, None)
                if p:
                    live.append((p, n))
        for p, n in live:
            free(p, n, 0, None)

    threads = [threading.Thread(target=raw, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    try:
        kv = [d.malloc(8 * MiB - 32, tag="kv") for _ in range(8)]  # 4 whole granules each
        # keep=True: the copies make each call long enough for the raw
        # callers to allocate and free while it runs
        counts = [(d.sleep("kv"), d.wake("kv")) for _ in range(30)]
    finally:
        stop.set()
        for t in threads:
            t.join()
        pl.unconfigure(0)
    assert set(counts) == {(64 * MiB, 64 * MiB)}
    for a in kv:
        d.free(a)
    d.check()
    d.close()


def test_sleeping_blocks_refuse_views_and_new_members_but_may_be_freed(dev):
    a = dev.malloc(4 * MiB, tag="kv")
    b = dev.malloc(4 * MiB, tag="kv")
    dev.sleep("kv")
    with pytest.raises(ascmem.InvalidArgumentError, match="asleep"):
        dev.buffer(a)
    with pytest.raises(ascmem.InvalidArgumentError, match="asleep"):
        dev.malloc(100, tag="kv")
    with pytest.raises(ascmem.InvalidArgumentError, match="asleep already"):
        dev.sleep("kv")
    dev.free(b)  # freeing a sleeping block is allowed
    dev.check()
    dev.wake("kv")
    with pytest.raises(ascmem.InvalidArgumentError, match="not asleep"):
        dev.wake("kv")
    dev.free(a)
    assert dev.stats()["huge"]["live_count"] == 0
    dev.check()


def test_sleep_refuses_a_tag_with_live_views(dev):
    a = dev.malloc(4 * MiB, tag="kv")
    view = dev.buffer(a)
    with pytest.raises(ascmem.InvalidArgumentError, match="view"):
        dev.sleep("kv")
    del view
    dev.sleep("kv")
    dev.wake("kv")
    dev.check()


def test_wake_is_all_or_nothing():
    d = ascmem.Device("atlas-a3", memory=8 << 30, paged=True)  # sim: counted
    kv = [d.malloc(64 * MiB, Policy.HUGE_ONLY, tag="kv") for _ in range(4)]
    d.sleep("kv")
    d.set_limit(d.budget()["huge_used"] + 100 * MiB)  # room for one block of four
    with pytest.raises(ascmem.OutOfMemoryError, match="wake"):
        d.wake("kv")
    d.check()
    assert d.stats()["device"]["asleep_bytes"] >= 256 * MiB  # still asleep, every block
    assert d.budget()["huge_used"] < 100 * MiB
    d.set_limit(0)
    d.wake("kv")
    assert d.budget()["huge_used"] >= 256 * MiB
    for a in kv:
        d.free(a)
    d.check()


def test_sleep_needs_a_paged_device():
    d = ascmem.Device("atlas-a2-training")
    d.malloc(4 * MiB, tag="kv")
    with pytest.raises(ascmem.UnsupportedError, match="paged"):
        d.sleep("kv")


def test_reset_forgets_tags():
    d = ascmem.Device("atlas-a3", memory=8 << 30, paged=True)
    d.malloc(4 * MiB, tag="kv")
    d.sleep("kv")
    d.reset()
    with pytest.raises(ascmem.InvalidArgumentError):
        d.wake("kv")
    d.malloc(4 * MiB, tag="kv")
    d.check()


def test_tags_must_be_hashable():
    d = ascmem.Device("atlas-a3", paged=True)
    with pytest.raises(ascmem.ArgumentTypeError):
        d.malloc(100, tag=["kv"])
    assert d.stats()["normal"]["live_count"] == 0
