"""Pools that take their memory from an upstream (the Ascend runtime through
pyACL's recording stand-in, or the OS for the host backend): an initial and a
maximum size, growth by chunks, empty chunks given back when the pool is at
its maximum or the upstream is short, and upstream failures under threads."""
import random
import threading

import pytest

import ascmem
from ascmem import MemKind, Policy
from ascmem.errors import InvalidArgumentError, OutOfMemoryError

import fake_acl

NORMAL = int(Policy.NORMAL_ONLY)


def acl_device(acl, **sizes):
    return ascmem.Device("atlas-training", backend="acl", acl_module=acl,
                         pool_sizes={"huge": 4 * MiB, "dvpp": 4 * MiB, "host": 4 * MiB, **sizes})


def upstream_bytes(acl):
    return sum(acl.live.values())


def test_pool_starts_at_its_initial_size_and_grows_by_chunks():
    acl = fake_acl.make()
    dev = acl_device(acl, normal=(8 * MiB, 64 * MiB))
    assert dev.chunks(MemKind.NORMAL) == [(dev.range_of(MemKind.NORMAL)[0], 8 * MiB)]
    ptrs = [dev.malloc(6 * MiB, NORMAL) for _ in range(5)]
    chunks = dev.chunks(MemKind.NORMAL)
    assert len(chunks) == 5  # one 6 MiB block per 8 MiB chunk
    for p in ptrs:  # every block lies in a chunk the runtime handed out
        assert any(base <= p and p + 6 * MiB <= base + size for base, size in chunks)
    s = dev.stats()["normal"]
    assert s["chunks"] == 5 and s["upstream_bytes"] == 40 * MiB and s["max_pool_size"] == 64 * MiB
    assert upstream_bytes(acl) == 40 * MiB + 12 * MiB  # and the three fixed 4 MiB pools
    dev.check()
    for p in ptrs:
        dev.free(p)
    assert dev.empty_cache() >= 40 * MiB  # every empty chunk goes back
    assert dev.chunks(MemKind.NORMAL) == [] and upstream_bytes(acl) == 12 * MiB
    p = dev.malloc(1 * MiB, NORMAL)  # and the pool grows again on demand
    assert len(dev.chunks(MemKind.NORMAL)) == 1
    dev.free(p)
    dev.check()
    dev.close()
    assert acl.live == {}


@pytest.mark.parametrize("backend", ["acl", "host"])
def test_initial_size_then_the_whole_maximum_in_one_block(backend):
    acl = fake_acl.make()
    sizes = {"normal": (16 * MiB, 64 * MiB)}
    if backend == "acl":
        dev = acl_device(acl, **sizes)
    else:
        dev = ascmem.Device("atlas-training", backend="host", host_memory=4 * MiB,
                            pool_sizes={"huge": 4 * MiB, "dvpp": 4 * MiB, **sizes})
    small = dev.malloc(1 * MiB, NORMAL)
    dev.free(small)
    # aclrtMalloc rounds to ALIGN_UP(size, 32) + 32: this asks for exactly 64 MiB
    whole = dev.malloc(64 * MiB - 32, NORMAL)
    assert dev.chunks(MemKind.NORMAL) == [(whole, 64 * MiB)]  # the idle 16 MiB chunk went back
    with pytest.raises(OutOfMemoryError) as e:
        dev.malloc(1, NORMAL)
    assert "at its maximum" in str(e.value) and "NORMAL" in str(e.value)
    if backend == "host":
        dev.buffer(whole)[-1] = 7  # real memory, to its last byte
    dev.free(whole)
    dev.check()
    del dev


def test_grow_is_refused_on_the_sim_backend_and_below_the_initial_size():
    with pytest.raises(InvalidArgumentError, match="upstream"):
        ascmem.Device("atlas-training", pool_sizes={"normal": (8 * MiB, 64 * MiB)})
    with pytest.raises(InvalidArgumentError, match="below the initial"):
        ascmem.Device("atlas-training", backend="acl", acl_module=fake_acl.make(),
                      pool_sizes={"normal": (64 * MiB, 8 * MiB)})


def test_upstream_short_gives_back_cached_chunks_and_retries_once():
    # the runtime has 48 MiB: 12 for the fixed pools, 36 for NORMAL and HUGE
    acl = fake_acl.make(capacity=50 * MiB)
    dev = acl_device(acl, normal=(8 * MiB, 32 * MiB), huge=(4 * MiB, 32 * MiB))
    h = dev.malloc(20 * MiB, int(Policy.HUGE_ONLY))  # HUGE grows by a 20 MiB chunk
    dev.free(h)  # ... which now sits empty, cached
    assert len(dev.chunks(MemKind.HUGE)) == 2
    acl.calls.clear()
    p = dev.malloc(16 * MiB, NORMAL)  # needs a chunk the runtime cannot give at first
    names = [c[0] for c in acl.calls]
    assert names[0] == "rt.malloc" and "rt.free" in names and names[-1] == "rt.malloc"
    assert dev.stats()["device"]["upstream_failures"] == 1
    assert dev.stats()["device"]["chunks_given_back"] >= 1
    dev.free(p)
    dev.check()


def test_upstream_refusal_after_give_back_is_out_of_memory_with_the_code():
    acl = fake_acl.make(fail=lambda name, size: fake_acl.ACL_ERROR_BAD_ALLOC if size > 8 * MiB else 0)
    dev = acl_device(acl, normal=(8 * MiB, 64 * MiB))
    keep = dev.malloc(7 * MiB, NORMAL)
    with pytest.raises(OutOfMemoryError) as e:
        dev.malloc(30 * MiB, NORMAL)
    msg = str(e.value)
    assert "200000" in msg and "NORMAL" in msg and "largest free block" in msg
    assert "waiting on streams" in msg
    dev.free(keep)
    dev.check()


def test_oom_callback_runs_after_the_upstream_gave_up():
    acl = fake_acl.make(capacity=50 * MiB)
    dev = acl_device(acl, normal=(8 * MiB, 64 * MiB))
    held = [dev.malloc(7 * MiB, NORMAL) for _ in range(4)]  # four 8 MiB chunks: 44 of 50 MiB taken
    seen = []

    def on_oom(info):
        seen.append(info)
        dev.free(held.pop())
        dev.free(held.pop())
        dev.empty_cache()  # their chunks go back to the runtime
        return True

    dev.on_out_of_memory(on_oom)
    p = dev.malloc(20 * MiB, NORMAL)
    assert len(seen) == 1 and seen[0]["kind"] == MemKind.NORMAL
    dev.free(p)
    for q in held:
        dev.free(q)
    dev.check()


@pytest.mark.parametrize("code", [fake_acl.ACL_ERROR_RT_MEMORY_ALLOCATION, fake_acl.ACL_ERROR_BAD_ALLOC])
def test_injected_upstream_failures_under_threads_lose_nothing(code):
    lock = threading.Lock()
    rng = random.Random(code)

    def flaky(name, size):
        with lock:
            return code if rng.random() < 0.75 else 0

    acl = fake_acl.make(capacity=256 * MiB, fail=None)
    dev = acl_device(acl, normal=(4 * MiB, 96 * MiB))
    acl.fail = flaky
    errors, failures = [], [0]

    def work(t):
        r = random.Random(t)
        mine = []
        try:
            for _ in range(400):
                if mine and (len(mine) > 12 or r.random() < 0.45):
                    dev.free(mine.pop(r.randrange(len(mine))))
                    continue
                try:
                    mine.append(dev.malloc(r.choice((r.randint(1, 4096), r.randint(1, 6 * MiB))),
                                           NORMAL))
                except OutOfMemoryError:
                    with lock:
                        failures[0] += 1
            for p in mine:
                dev.free(p)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:3]
    # the injected failures happened; a request raises OutOfMemoryError only
    # when every try failed (upstream twice per growth, growth twice per request)
    assert dev.stats()["device"]["upstream_failures"] > 0
    assert dev.stats()["normal"]["failed_count"] >= failures[0]
    s = dev.stats()["normal"]
    assert s["live_count"] == 0 and s["used"] == 0
    assert s["alloc_count"] == s["free_count"]
    dev.check()  # chunks the device holds == chunks the runtime handed out, per kind
    held = sum(size for _, size in dev.chunks(MemKind.NORMAL))
    assert held == s["upstream_bytes"] <= 96 * MiB
    assert upstream_bytes(acl) == held + 12 * MiB
    acl.fail = None
    dev.empty_cache()
    assert upstream_bytes(acl) == 12 * MiB  # nothing leaked upstream
    dev.close()
    assert acl.live == {}


# ---- the acl backend maps stream completion onto runtime events ----------------

def test_acl_free_on_a_stream_waits_for_the_runtime_event():
    acl = fake_acl.make()
    dev = acl_device(acl, normal=64 * MiB)
    a = dev.malloc(4 * MiB, NORMAL, stream="s1")
    dev.free(a, stream="s1")
    names = [c[0] for c in acl.calls]
    assert names[-2:] == ["rt.create_event", "rt.record_event"] and acl.calls[-1][2] == "s1"
    assert dev.process_events() == 0  # s1's queued work has not passed the free yet
    assert dev.malloc(4 * MiB, NORMAL, stream="s2") != a
    acl.finish("s1")  # the runtime reports the event complete
    assert dev.process_events() == 1 and dev.pending_bytes() == 0
    assert dev.malloc(4 * MiB, NORMAL, stream="s2") == a
    assert acl.events == {}  # every event was destroyed


def test_acl_allocation_that_would_fail_polls_the_events_first():
    acl = fake_acl.make()
    dev = acl_device(acl, normal=16 * MiB)
    a = dev.malloc(12 * MiB, NORMAL, stream="s1")
    dev.free(a, stream="s1")
    acl.finish("s1")
    assert dev.malloc(12 * MiB, NORMAL, stream="s2") == a  # no explicit call needed
    dev.free(a, stream="s2")
    dev.synchronize("s2")  # waits on the runtime, then frees
    assert ("rt.synchronize_stream", "s2") in acl.calls and dev.pending_bytes() == 0
    dev.check()


# ---- a state machine: a growing acl pool with a flaky runtime --------------------

import hypothesis.strategies as st  # noqa: E402
from hypothesis import settings  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule  # noqa: E402
from conftest import MiB


class GrowingPoolMachine(RuleBasedStateMachine):
    """Random mallocs (some larger than any chunk), frees, empty_cache and
    runtime refusals; after every step the device's chunks are exactly what
    the runtime handed out, no block overlaps another, and check() passes."""

    def __init__(self):
        super().__init__()
        self.acl = fake_acl.make(capacity=72 * MiB)
        self.dev = acl_device(self.acl, normal=(4 * MiB, 48 * MiB))
        self.refuse = False
        self.acl.fail = lambda name, size: (fake_acl.ACL_ERROR_RT_MEMORY_ALLOCATION
                                           if self.refuse else 0)
        self.live = {}

    @rule(size=st.one_of(st.integers(1, 4096), st.integers(4097, 3 * MiB),
                         st.integers(3 * MiB, 40 * MiB)))
    def malloc(self, size):
        try:
            p = self.dev.malloc(size, NORMAL)
        except OutOfMemoryError:
            return
        n = self.dev.usable_size(p)
        for q, m in self.live.items():
            assert p + n <= q or q + m <= p, "overlap"
        self.live[p] = n

    @rule(data=st.data())
    def free(self, data):
        if self.live:
            p = data.draw(st.sampled_from(sorted(self.live)))
            self.dev.free(p)
            del self.live[p]

    @rule()
    def empty_cache(self):
        self.dev.empty_cache()

    @rule(on=st.booleans())
    def runtime_refuses(self, on):
        self.refuse = on

    @invariant()
    def chunks_are_what_the_runtime_handed_out(self):
        self.dev.check()
        chunks = self.dev.chunks(MemKind.NORMAL)
        assert sum(size for _, size in chunks) <= 48 * MiB
        assert upstream_bytes(self.acl) == sum(size for _, size in chunks) + 12 * MiB
        for p, n in self.live.items():
            assert any(b <= p and p + n <= b + s for b, s in chunks)

    def teardown(self):
        for p in list(self.live):
            self.dev.free(p)
        self.dev.close()
        assert self.acl.live == {}


TestGrowingPool = GrowingPoolMachine.TestCase
TestGrowingPool.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
