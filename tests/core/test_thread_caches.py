"""Thread caches from Python (csrc/tcache.c; the C tests in
csrc/tests/test_tcache.c drive them from native threads): blocks allocated
on one thread and freed on another, statistics and check() exact, bad frees
refused, the modes; a Device's caches under GIL-free callers (the pluggable
functions through ctypes), with resets and close racing them."""
import threading
import time

import pytest

import ascmem
from ascmem.errors import InvalidArgumentError, InvalidFreeError, OutOfMemoryError, UnsupportedError
from conftest import run_child


@pytest.mark.parametrize("mode", ["on", "auto", "off"])
def test_blocks_cross_threads_and_statistics_stay_exact(mode):
    # a range that holds every block at once: the consumer may lag behind
    pool = ascmem.Pool(1 << 30, base=1 << 32, thread_caches=mode)
    assert pool.thread_caches == mode
    handed, errors = [], []
    lock = threading.Lock()

    def produce(seed):
        try:
            for i in range(3000):
                addr = pool.alloc(1 + (i * 2654435761 + seed) % 20000)
                with lock:
                    handed.append(addr)
        except Exception as e:  # reported below; the consumer must not wait for it
            errors.append(e)

    producers = [threading.Thread(target=produce, args=(s,)) for s in (1, 2)]

    def consume():
        try:
            while True:
                done = not any(t.is_alive() for t in producers)
                with lock:
                    batch, handed[:] = handed[:], []
                for addr in batch:
                    pool.free(addr)
                if done and not batch:
                    return
        except Exception as e:
            errors.append(e)

    consumer = threading.Thread(target=consume)
    for t in producers + [consumer]:
        t.start()
    for t in producers + [consumer]:
        t.join()
    assert not errors
    st = pool.stats()
    assert st["live_count"] == 0 and st["used"] == 0
    assert st["alloc_count"] == st["free_count"] == 6000
    pool.check()
    pool.trim()
    assert pool.stats()["free"] == pool.capacity  # every cached block came back


def test_a_cached_block_is_free_to_no_one():
    pool = ascmem.Pool(1 << 24, base=1 << 32, thread_caches="on")
    a = pool.alloc(100)
    pool.free(a)  # into this thread's cache
    with pytest.raises(InvalidFreeError):
        pool.free(a)
    errors = []

    def again():
        try:
            pool.free(a)
        except InvalidFreeError as e:
            errors.append(e)

    t = threading.Thread(target=again)
    t.start()
    t.join()
    assert len(errors) == 1
    with pytest.raises(InvalidFreeError):
        pool.usable_size(a)
    pool.check()
    assert pool.stats()["live_count"] == 0


def test_a_full_pool_takes_back_what_caches_hold():
    pool = ascmem.Pool(1 << 20, base=1 << 32, thread_caches="on")
    blocks = []
    while True:
        try:
            blocks.append(pool.alloc(4096))
        except OutOfMemoryError:
            break
    for b in blocks:
        pool.free(b)
    whole = pool.alloc(1 << 20)  # fits only once this thread's cache is flushed
    pool.free(whole)
    pool.check()


def test_default_mode_is_auto_but_off_when_paged():
    assert ascmem.Pool(1 << 20).thread_caches == "auto"
    assert ascmem.Pool(1 << 22, granule=1 << 21).thread_caches == "off"
    assert ascmem.Pool(1 << 20, thread_caches=None).thread_caches == "auto"


def test_default_pool_turns_caches_on_when_threads_meet_and_stays_exact():
    # batch calls release the GIL, so two Python threads meet at the lock
    pool = ascmem.Pool(1 << 30, base=1 << 32)
    for _ in range(50):  # one thread alone, batches included: never on
        pool.free_many(pool.alloc_many([64 + 8 * i for i in range(500)]))
    assert not pool.thread_caches_on
    errors, stop = [], threading.Event()

    def churn(seed):
        try:
            n = 0
            while not stop.is_set() and n < 20000:
                addrs = pool.alloc_many([64 + (seed * 7 + i) % 4000 for i in range(2000)])
                pool.free_many(addrs[::2])
                pool.free_many(addrs[1::2])
                n += 1
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=churn, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while not pool.thread_caches_on and time.monotonic() < deadline and not errors:
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    assert pool.thread_caches_on
    st = pool.stats()
    assert st["live_count"] == 0 and st["used"] == 0 and st["alloc_count"] == st["free_count"]
    pool.check()
    # the cached path from Python: exact counts, and a double free still refused
    a = pool.alloc(100)
    pool.free(a)
    with pytest.raises(InvalidFreeError):
        pool.free(a)
    assert pool.stats()["live_count"] == 0
    pool.check()


def test_bad_modes_are_refused():
    with pytest.raises(InvalidArgumentError):
        ascmem.Pool(1 << 20, thread_caches="sometimes")
    with pytest.raises(InvalidArgumentError):
        ascmem.Pool(1 << 20, thread_caches=["on"])  # unhashable: the same error, not a TypeError


# ---- a Device's caches (ascm_device_set_thread_caches) ------------------------------

@pytest.mark.parametrize("mode", ["on", "auto", "off"])
def test_device_caches_serve_gil_free_threads_exactly(mode):
    """Threads in the pluggable functions (ctypes drops the GIL) on a host-
    backed Device with thread caches: each block is stamped with its owner
    and checked before its free (a block handed to two callers shows), while
    the main thread reads statistics, checks and empties the caches."""
    r = run_child(f"""
        import ctypes, threading, ascmem
        from ascmem import pluggable as pl
        d = ascmem.Device("atlas-training", backend="host", device_id=12, thread_caches={mode!r},
                          pool_sizes={{"normal": 64 << 20, "huge": 64 << 20}})
        assert d.thread_caches == {mode!r}
        pl.configure(d)
        fns = pl.functions()
        alloc, free = fns[pl.ALLOC], fns[pl.FREE]
        errors, stop = [], False
        def churn(seed):
            live = []
            try:
                for i in range(10000):
                    size = 8 + (seed * 7919 + i * 104729) % 6000
                    p = alloc(size, 12, None)
                    assert p, "refused"
                    ctypes.c_uint64.from_address(p).value = seed << 32 | i
                    live.append((p, seed << 32 | i))
                    if len(live) > 40:
                        p, stamp = live.pop((i * 31) % len(live))
                        assert ctypes.c_uint64.from_address(p).value == stamp, "shared block"
                        free(p, 0, 12, None)
                for p, stamp in live:
                    assert ctypes.c_uint64.from_address(p).value == stamp, "shared block"
                    free(p, 0, 12, None)
            except Exception as e:
                errors.append(repr(e))
        threads = [threading.Thread(target=churn, args=(s,)) for s in (1, 2, 3)]
        for t in threads: t.start()
        while any(t.is_alive() for t in threads):
            d.check()
            st = d.stats()["normal"]
            assert st["alloc_count"] - st["free_count"] == st["live_count"]
            d.empty_cache()
        for t in threads: t.join()
        assert not errors, errors
        st = d.stats()["normal"]
        assert st["live_count"] == 0 and st["used"] == 0 and st["alloc_count"] == 30000
        d.check()
        d.empty_cache()
        pl.unconfigure(12)
        d.close()
        print("ok")
    """)
    assert r.stdout.startswith("ok")


@pytest.mark.parametrize("mode", ["on", "auto"])
def test_device_caches_survive_reset_and_close_under_gil_free_callers(mode):
    """As test_reset_and_close_while_raw_callers_run (device/
    test_device_faults.py), with thread caches on (with AUTO, coming on
    while the resets race): resets drop the pools (and their
    caches) while threads are inside the pluggable functions; every call is
    served or waits, none crashes or hangs.  A reset while a thread holds a
    block is refused (InUseError, issue 43): the threads free each block
    at once, so resets go ahead between their blocks."""
    r = run_child("""
        import threading, time, ascmem
        from ascmem import pluggable as pl
        MiB = 1 << 20
        d = ascmem.Device("atlas-training", backend="host", device_id=13, thread_caches=MODE,
                          pool_sizes={"normal": (4 * MiB, 64 * MiB), "huge": (8 * MiB, 64 * MiB),
                                      "dvpp": 2 * MiB, "host": 2 * MiB})
        pl.configure(d)
        fns = pl.functions()
        alloc, free = fns[pl.ALLOC], fns[pl.FREE]
        stop, served = False, [0]
        def raw(seed):
            live, i = [], 0
            while not stop:
                i += 1
                p = alloc(64 + (seed * 7919 + i * 104729) % 20000, 13, None)
                if p:
                    live.append(p); served[0] += 1
                if live:
                    free(live.pop(0), 0, 13, None)
        threads = [threading.Thread(target=raw, args=(s,)) for s in range(3)]
        for t in threads: t.start()
        t0, resets, refused = time.time(), 0, 0
        try:
            while time.time() - t0 < 1.0:
                try:
                    d.reset(); resets += 1
                except ascmem.InUseError:
                    refused += 1
                d.check()
        finally:
            stop = True
            for t in threads: t.join()
        d.reset(); d.check()
        d.close()
        assert alloc(100, 13, None) is None
        pl.unconfigure(13)
        assert resets + refused > 0 and served[0] > 0
        print("ok")
    """.replace("MODE", repr(mode)))
    assert r.stdout.startswith("ok")


def test_device_caches_modes():
    # the default: on from the first time two threads meet at a lock; off when paged
    assert ascmem.Device("atlas-training").thread_caches == "auto"
    assert ascmem.Device("atlas-a2-training", paged=True).thread_caches == "off"
    with pytest.raises(InvalidArgumentError):
        ascmem.Device("atlas-training", thread_caches="sometimes")
    with pytest.raises(UnsupportedError):
        ascmem.Device("atlas-a2-training", paged=True, thread_caches="on")
    assert ascmem.Device("atlas-a2-training", paged=True, thread_caches="off").thread_caches == "off"
    d = ascmem.Device("atlas-training", thread_caches="on")
    blocks = [d.malloc(100 + i) for i in range(500)]
    for b in blocks:
        d.free(b)
    st = d.stats()["normal"]
    assert st["live_count"] == 0 and st["alloc_count"] == st["free_count"] == 500
    d.check()
    d.reset()  # the new pools keep the device's caches
    blocks = [d.malloc(100) for _ in range(100)]
    for b in blocks:
        d.free(b)
    d.check()
    assert d.stats()["normal"]["live_count"] == 0
