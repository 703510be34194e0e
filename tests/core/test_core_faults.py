"""Faults and bad input of the pools themselves (Pool, BuddyAllocator):
forks during GIL-free batch calls, integers that lie, batch arguments,
messages, pickling.  Crashes and hangs run in a child process (run_child)."""
import numpy as np
import pytest

import ascmem
from ascmem.errors import (ArgumentTypeError, InvalidArgumentError, InvalidFreeError, OutOfMemoryError,
                           )

from conftest import BASE, MiB, run_child


def test_fork_during_gil_free_batch_calls_and_check():
    run_child("""
        import os, threading, time, numpy as np, ascmem
        pool = ascmem.Pool(1 << 30, base=1 << 32)
        dev = ascmem.Device("atlas-training")
        stop = False
        def batches():
            sizes = np.full(20000, 200)
            while not stop:
                pool.free_many(pool.alloc_many(sizes))
                pool.check()
        threads = [threading.Thread(target=batches) for _ in range(2)]
        for t in threads: t.start()
        time.sleep(0.05)
        for i in range(20):
            pid = os.fork()
            if pid == 0:
                p = pool.alloc(4096); pool.free(p); pool.check()
                q = dev.malloc(4096); dev.free(q); dev.check()
                os._exit(0)
            deadline = time.time() + 20
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    assert os.waitstatus_to_exitcode(status) == 0, status
                    break
                if time.time() > deadline:
                    os.kill(pid, 9)
                    raise SystemExit(f"child {i} hung on an inherited lock")
                time.sleep(0.005)
        stop = True
        for t in threads: t.join()
        print("ok")
    """, timeout=120)


def test_out_of_memory_messages_keep_the_fraction():
    pool = ascmem.Pool(64 * MiB, base=BASE)
    pool.alloc(int(18.5 * MiB))
    with pytest.raises(OutOfMemoryError, match=r"45\.50 MiB free"):
        pool.alloc(60 * MiB)


def test_a_pool_with_nothing_live_is_whole_again():
    import random
    rng = random.Random(19)
    pool = ascmem.Pool(256 * MiB, base=BASE)
    live = []
    for _ in range(20_000):
        if live and rng.random() < 0.5:
            pool.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice((rng.randint(1, 4096), rng.randint(4097, 40_000),
                               rng.randint(40_001, 1 << 20)))
            try:
                live.append(pool.alloc(size))
            except OutOfMemoryError:
                pass
    for p in live:
        pool.free(p)
    s = pool.stats()
    assert s["live_count"] == 0
    assert s["largest_free"] == s["free"] == s["capacity"]
    assert s["cached_bytes"] <= s["slab_bytes"]
    big = pool.alloc(s["capacity"])
    pool.free(big)
    pool.check()


@pytest.mark.parametrize("make", [lambda: ascmem.Pool(64 * MiB, base=BASE),
                                  lambda: ascmem.BuddyAllocator(64 * MiB, base=BASE)])
def test_align_is_checked_like_every_other_integer(make):
    a = make()
    for bad, err in ((-1, InvalidArgumentError), (2**64, InvalidArgumentError),
                     (None, ArgumentTypeError), ("64", ArgumentTypeError),
                     (64.9, ArgumentTypeError)):
        with pytest.raises(err):
            a.alloc(100, align=bad)
        with pytest.raises(err):
            a.alloc_many([100, 200], align=bad)
    a.check()


class _Index:
    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


def test_index_objects_that_lie():
    pool = ascmem.Pool(64 * MiB, base=BASE)
    for bad in (3.5, "x", None):
        with pytest.raises(ArgumentTypeError):
            pool.alloc(_Index(bad))
    with pytest.raises(InvalidFreeError):
        pool.free(_Index(BASE + 12345))  # message formats the number, not the object
    d = ascmem.Device("atlas-inference")
    with pytest.raises(InvalidFreeError):
        d.free(_Index(12345))
    pool.check()


def test_batch_calls_take_read_only_arrays_and_name_bad_items():
    pool = ascmem.Pool(64 * MiB, base=BASE)
    sizes = np.full(10, 100, dtype=np.uint64)
    sizes.flags.writeable = False
    addrs = pool.alloc_many(sizes)
    addrs.flags.writeable = False
    pool.free_many(addrs)
    for bad in ([[1, 2], [3]], [1, "a"], [1.5, 2], None, 3.5, 5, b"x"):  # scalars: were bare TypeErrors
        with pytest.raises(ArgumentTypeError):
            pool.alloc_many(bad)
        with pytest.raises(ArgumentTypeError):
            pool.free_many(bad)
    addrs = pool.alloc_many(n for n in (100, 200))  # iterators are sequences enough
    pool.free_many(int(a) for a in addrs)
    with pytest.raises(OutOfMemoryError):
        pool.alloc_many([2**63, 1])  # an integer too large, not "float64"
    with pytest.raises(InvalidFreeError):
        pool.free_many([2**63, 1])
    with pytest.raises(InvalidArgumentError, match=r"sizes\[0\]"):
        pool.alloc_many([2**64, 1])
    assert pool.stats()["live_count"] == 0
    pool.check()


@pytest.mark.parametrize("make", [lambda: ascmem.Pool(1 << 20, base=1 << 32),
                                  lambda: ascmem.BuddyAllocator(1 << 20),
                                  lambda: ascmem.Device("atlas-training")])
def test_pickling_or_copying_an_allocator_says_why_not(make):
    """Probed (twelfth session): pickle (a spawn worker's argument) and copy
    raised Cython's "no default __reduce__ due to non-trivial __cinit__".
    The refusal now says what to do, and the allocator is left intact."""
    import copy
    import pickle
    a = make()
    for call in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="cannot be pickled or copied.*each process"):
            call(a)
    a.check()
