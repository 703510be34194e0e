"""Threads: many Python threads on one pool and one device, cross-thread frees,
batch calls that release the GIL; leaks reported at destruction."""
import gc
import queue
import random
import threading
import warnings

import numpy as np
import pytest

import ascmem
from conftest import BASE

THREADS, OPS = 8, 50_000


def run_for(seconds, stop, threads):
    """Starts threads, lets them run for seconds, then sets stop and joins them."""
    for th in threads:
        th.start()
    stop.wait(seconds)
    stop.set()
    for th in threads:
        th.join()


def test_eight_threads_fifty_thousand_ops_each_with_cross_thread_frees():
    pool = ascmem.Pool(16 << 30, base=BASE)
    handoff = queue.Queue()  # blocks allocated by one thread, freed by another
    counts = [[0, 0] for _ in range(THREADS)]
    errors = []

    def work(t):
        rng = random.Random(t)
        mine = []
        try:
            for i in range(OPS):
                r = rng.random()
                if len(mine) > 300:  # keep each thread's live set bounded
                    r = 0.9
                if r < 0.4 or not mine:
                    size = rng.choice((rng.randint(1, 512), rng.randint(513, 40_000),
                                       rng.randint(40_001, 3 << 20)))
                    mine.append(pool.alloc(size))
                    counts[t][0] += 1
                elif r < 0.5:
                    handoff.put(mine.pop(rng.randrange(len(mine))))
                elif r < 0.7:
                    try:
                        pool.free(handoff.get_nowait())
                        counts[t][1] += 1
                    except queue.Empty:
                        pass
                else:
                    pool.free(mine.pop(rng.randrange(len(mine))))
                    counts[t][1] += 1
                if i % 10_000 == 0:  # a batch call, GIL released inside
                    addrs = pool.alloc_many(np.full(50, 256))
                    pool.free_many(addrs)
                    counts[t][0] += 50
                    counts[t][1] += 50
            for a in mine:
                pool.free(a)
                counts[t][1] += 1
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:3]
    while not handoff.empty():
        pool.free(handoff.get())
        counts[0][1] += 1
    s = pool.stats()
    assert s["alloc_count"] == sum(c[0] for c in counts)
    assert s["free_count"] == sum(c[1] for c in counts)
    assert s["live_count"] == 0 and s["used"] == 0 and s["requested"] == 0
    pool.check()


def test_threads_on_one_device():
    d = ascmem.Device("atlas-training")
    errors = []

    def work(t):
        rng = random.Random(100 + t)
        live = []
        try:
            for _ in range(5000):
                if live and rng.random() < 0.5:
                    p, kind = live.pop(rng.randrange(len(live)))
                    (d.dvpp_free if kind else d.free)(p)
                elif rng.random() < 0.3:
                    live.append((d.dvpp_malloc(rng.randint(1, 4 << 20)), True))
                else:
                    live.append((d.malloc(rng.randint(1, 8 << 20), rng.choice((0, 1, 2))), False))
            for p, kind in live:
                (d.dvpp_free if kind else d.free)(p)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:3]
    d.empty_cache()  # spare slabs hold a few normal pages until then
    b = d.budget()
    assert b["huge_used"] == 0 and b["normal_used"] == 0
    d.check()


def test_leaked_blocks_are_reported_when_a_pool_goes():
    pool = ascmem.Pool(1 << 26, base=BASE)
    pool.alloc(3 << 20)
    pool.alloc(100)
    with pytest.warns(ResourceWarning, match=r"2 live blocks.*3.00 MiB at 0x"):
        del pool
        gc.collect()


def test_leaked_device_blocks_are_reported():
    d = ascmem.Device("atlas-inference")
    d.dvpp_malloc(5000)
    with pytest.warns(ResourceWarning, match="DVPP"):
        del d
        gc.collect()


def test_no_warning_for_a_clean_pool():
    pool = ascmem.Pool(1 << 20, base=BASE)
    pool.free(pool.alloc(10))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del pool
        gc.collect()


@pytest.mark.filterwarnings("ignore::ascmem.PrecautionWarning")
def test_threads_allocate_with_streams_while_others_reset_walk_and_trim():
    """Python threads allocate, free on streams, record streams and
    synchronize on one host device while one thread resets it, another
    snapshots and empties its cache: the only error allowed is a pointer
    made stale by a reset, and the device is whole at the end."""
    d = ascmem.Device("atlas-training", backend="host",
                      pool_sizes={"huge": (8 << 20, 128 << 20), "normal": (4 << 20, 64 << 20),
                                  "dvpp": 4 << 20, "host": 4 << 20})
    stop = threading.Event()
    errors = []

    def user(t):
        rng = random.Random(200 + t)
        live = []
        try:
            while not stop.is_set():
                try:
                    if live and rng.random() < 0.5:
                        p = live.pop(rng.randrange(len(live)))
                        d.free(p, stream=rng.choice((None, "s1", "s2")))
                    elif live and rng.random() < 0.1:
                        d.record_stream(live[-1], "s3")
                    elif rng.random() < 0.05:
                        d.synchronize(rng.choice((None, "s1", "s2", "s3")))
                    else:
                        live.append(d.malloc(rng.randint(1, 3 << 20), stream=rng.choice((None, "s1"))))
                except ascmem.InvalidFreeError:
                    live.clear()  # a reset made them stale
                except ascmem.OutOfMemoryError:
                    pass
        except Exception as exc:
            errors.append(exc)

    def resetter():
        try:
            while not stop.is_set():
                d.reset()
        except Exception as exc:
            errors.append(exc)

    def walker():
        try:
            while not stop.is_set():
                d.snapshot()
                d.empty_cache()
                d.stats()
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=user, args=(t,)) for t in range(4)]
    threads += [threading.Thread(target=resetter), threading.Thread(target=walker)]
    run_for(2.0, stop, threads)
    assert not errors, errors[:3]
    d.check()
    d.reset()
    d.check()
    assert d.stats()["device"]["huge_used"] == 0
    d.close()


@pytest.mark.parametrize("config", ["paged, sleeping tags", "growing and giving chunks back"])
@pytest.mark.filterwarnings("ignore::ascmem.PrecautionWarning")
def test_check_while_other_threads_allocate_is_never_a_false_alarm(config):
    """Device.check() compares figures several locks guard (the page budget
    against the pools' pages, the upstream's chunks against the device's):
    read one after the other, another thread's allocation in between made
    a whole device look corrupt.  Here one thread checks in a loop while
    others allocate, free, sleep and wake tags, empty the cache and grow."""
    if config.startswith("paged"):
        d = ascmem.Device("atlas-a2-training", memory=2 << 30, backend="host", paged=True)
    else:
        d = ascmem.Device("atlas-training", backend="host",
                          pool_sizes={"huge": (4 << 20, 256 << 20), "normal": (4 << 20, 64 << 20),
                                      "dvpp": 4 << 20, "host": 4 << 20})
    paged = config.startswith("paged")
    stop = threading.Event()
    errors, checks = [], [0]

    def user(t):
        rng = random.Random(300 + t)
        live = []
        try:
            while not stop.is_set():
                try:
                    r = rng.random()
                    if live and r < 0.45:
                        d.free(live.pop(rng.randrange(len(live))))
                    elif r < 0.5:
                        d.empty_cache()
                    elif paged and r < 0.55:
                        tag = rng.choice(("kv", "w"))
                        d.sleep(tag) if rng.random() < 0.5 else d.wake(tag)
                    else:
                        size = rng.choice((100, 5000, 300_000, 1 << 20, 3 << 20))
                        tag = rng.choice(("kv", "w", None)) if paged else None
                        live.append(d.malloc(size, tag=tag))
                except ascmem.OutOfMemoryError:
                    pass
                except ascmem.InvalidArgumentError as exc:  # sleeping twice, waking an awake tag
                    if "asleep" not in str(exc):
                        raise
            for p in live:
                d.free(p)
        except Exception as exc:
            errors.append(exc)

    def checker():
        try:
            while not stop.is_set():
                d.check()
                checks[0] += 1
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=user, args=(t,)) for t in range(3)]
    run_for(1.5, stop, threads + [threading.Thread(target=checker)])
    assert not errors, errors[:3]
    assert checks[0] > 10
    d.check()
    d.close()


def test_batches_racing_resets_return_only_live_blocks_and_let_others_in():
    """alloc_many and free_many release the GIL and hand the pool lock to a
    waiting thread every 256 blocks (the C test test_batches.c shows that the
    waiter gets in mid-batch).  Here one thread runs batches, one resets the
    pool now and then and one makes single pairs: every batch that returns
    holds distinct blocks (a reset in the middle restarts it), and the pool
    is whole at the end.

    No thread may free an address a reset made stale: after a reset the same
    address is another block, and freeing it frees someone else's block (a
    batch then got that address twice: seen once in CI, under ASan).  So a
    reset never falls inside a single pair or a free_many (the Python lock
    `epoch`), and a batch frees its blocks only if no reset came since it
    began; resets inside alloc_many, the case under test, stay free to come.
    Blocks a batch does not free wait for the next reset: room for a few
    batches of about 2 GiB each."""
    pool = ascmem.Pool(32 << 30, base=BASE)
    stop, epoch = threading.Event(), threading.Lock()
    errors, singles, resets, batches = [], [0], [0], [0]
    sizes = np.random.default_rng(21).integers(64, 200_000, 20_000)

    def batcher():
        try:
            while not stop.is_set():
                before = resets[0]
                addrs = pool.alloc_many(sizes)
                assert len(np.unique(addrs)) == len(addrs)
                with epoch:
                    if resets[0] == before:  # else the next reset frees them
                        pool.free_many(addrs)
                batches[0] += 1
        except Exception as exc:
            errors.append(exc)

    def resetter():
        while not stop.is_set():
            stop.wait(0.01)
            with epoch:
                pool.reset()
                resets[0] += 1

    def single():
        try:
            while not stop.is_set():
                with epoch:
                    pool.free(pool.alloc(100))
                singles[0] += 1
        except Exception as exc:
            errors.append(exc)

    run_for(1.0, stop, [threading.Thread(target=f) for f in (batcher, resetter, single)])
    assert not errors, errors
    assert batches[0] > 0 and resets[0] > 0 and singles[0] > 0
    pool.reset()
    pool.check()
    assert pool.stats()["live_count"] == 0


def test_close_while_another_thread_runs_batches_closes_the_pool():
    """close() frees every block and closes the pool in one step.  It was a
    reset and then a close-if-empty: a batch of another thread, handed the
    lock between the two, allocated again and the pool stayed open, though
    the Python object said closed.  Now the batch fails with ClosedError and
    nothing stays allocated."""
    sizes = np.random.default_rng(5).integers(64, 200_000, 50_000)
    for _ in range(3):
        pool = ascmem.Pool(8 << 30, base=BASE)
        started, outcome = threading.Event(), []

        def batcher():
            try:
                while True:
                    started.set()
                    pool.free_many(pool.alloc_many(sizes))
            except ascmem.ClosedError:
                outcome.append("closed")
            except Exception as exc:
                outcome.append(exc)

        th = threading.Thread(target=batcher)
        th.start()
        started.wait()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)  # the batch's blocks, if any, are dropped
            pool.close()
        th.join()
        assert outcome == ["closed"]
        assert pool.stats()["live_count"] == 0
        with pytest.raises(ascmem.ClosedError):
            pool.alloc(64)
