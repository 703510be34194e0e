"""Thread caches from Python (csrc/tcache.c; the C tests in
csrc/tests/test_tcache.c drive them from native threads): blocks allocated
on one thread and freed on another, statistics and check() exact, bad frees
refused, the modes."""
import threading

import pytest

import ascmem
from ascmem.errors import InvalidArgumentError, InvalidFreeError, OutOfMemoryError


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


def test_bad_modes_are_refused():
    with pytest.raises(InvalidArgumentError):
        ascmem.Pool(1 << 20, thread_caches="sometimes")
