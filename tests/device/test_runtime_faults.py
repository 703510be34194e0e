"""An acl Device when the Ascend runtime (the recording stand-in,
fake_acl) refuses, raises instead of returning a code, or is inherited
through fork(): every refusal leaves the Device whole (check() passes) and
nothing the runtime handed out is lost.  Crashes run in a child process."""
import ctypes
import gc

import pytest

import ascmem
from ascmem import Policy
from ascmem.errors import DeviceClosedError, OutOfMemoryError

import fake_acl
from conftest import MiB, run_child


def test_acl_close_fails_every_later_call():
    acl = fake_acl.make()
    d = ascmem.Device("atlas-inference", backend="acl", acl_module=acl)
    p = d.malloc(1000)
    d.free(p)
    q = d.malloc(1000)
    d.close()
    assert not acl.live
    for call in (lambda: d.malloc(1000), lambda: d.free(q), lambda: d.dvpp_malloc(10),
                 lambda: d.malloc_host(10), lambda: d.free(q, stream="s"),
                 lambda: d.record_stream(q, "s"), lambda: d.usable_size(q), lambda: d.reset()):
        with pytest.raises(DeviceClosedError) as info:
            call()
        assert info.value.code == 107002
    d.close()  # idempotent
    assert d.stats()["device"]["closed"]


def test_acl_reset_refused_half_way_leaves_the_device_as_it_was():
    acl = fake_acl.make()
    d = ascmem.Device("atlas-inference", backend="acl", acl_module=acl)
    p = d.malloc(5000)
    before = dict(acl.live)
    acl.fail = lambda name, size: 207001 if name == "media.dvpp_malloc" else 0
    with pytest.raises(OutOfMemoryError):
        d.reset()
    assert acl.live == before  # the fresh chunks taken before the refusal went back
    d.check()
    assert d.usable_size(p) >= 5000  # blocks survive a reset that did not happen
    d.free(p)
    acl.fail = None
    d.reset()
    d.check()
    assert set(acl.live).isdisjoint(before)
    d.close()
    assert not acl.live


@pytest.mark.parametrize("drop", ["del", "cycle"])
def test_a_device_collected_without_close_destroys_its_stream_events(drop):
    """Found by probing (eleventh session): close() destroys the runtime
    events of frees still waiting on a stream, but a Device collected
    without close() left them to the runtime (aclrtDestroyEvent was never
    called).  Its parts now do what close() does when they are collected."""
    acl = fake_acl.make()
    d = ascmem.Device("atlas-a2-training", backend="acl", acl_module=acl)
    d.free(d.malloc(1000), stream=0x77)  # waits for an event on the stream
    assert acl.events
    if drop == "cycle":
        d.on_out_of_memory(d.check)
    del d
    gc.collect()
    assert not acl.events and not acl.live


@pytest.mark.parametrize("call", ["rt.malloc_physical", "rt.map_mem", "rt.unmap_mem"])
def test_a_runtime_call_that_raises_is_a_refusal(call):
    """Found by probing (eleventh session): on a paged acl device, pyACL
    raising (a MemoryError, say) instead of returning a code in the middle
    of the map runs left the granules the pools counted as mapped and the
    runtime's handles apart, and check() reported corruption.  A raise is
    now a refusal like a failure code: the allocation (or wake) is undone and
    raises OutOfMemoryError; an unmap that raises forgets the granule."""
    acl = fake_acl.make()
    d = ascmem.Device("atlas-a2-training", backend="acl", acl_module=acl, paged=True)
    kv = [d.malloc(3 * MiB, tag="kv") for _ in range(4)]
    d.sleep("kv")
    calls = [0]

    def fail(name, arg):
        if name == call:
            calls[0] += 1
            if calls[0] == 3:
                raise MemoryError("injected")
        return 0
    acl.fail = fail
    for step in (lambda: d.malloc(9 * MiB), lambda: d.wake("kv"),
                 lambda: d.free(d.malloc(9 * MiB))):
        try:
            step()
        except ascmem.OutOfMemoryError as e:
            assert "MemoryError" in str(e) or "refused" in str(e)
        d.check()
    acl.fail = None
    try:
        d.wake("kv")  # if the injected raise kept it asleep, it wakes now
    except ascmem.InvalidArgumentError:
        pass          # awake already
    for a in kv:
        d.free(a)
    d.check()


def _raise_once(ns, name):
    """Makes the stand-in's ns.name raise (as pyACL might, instead of
    returning a code) on its next call only."""
    orig = getattr(ns, name)

    def raising(*args):
        setattr(ns, name, orig)
        raise MemoryError("injected")
    setattr(ns, name, raising)


@pytest.mark.parametrize("call", ["rt.free", "media.dvpp_free"])
def test_a_chunk_free_that_raises_is_a_refused_free(call):
    """Found by probing (eleventh session): pyACL raising in the free of a
    chunk given back (empty_cache, reset) left the growth accounting wrong
    (check() raised CorruptionError).  It is now what a failure code is: a
    ResourceWarning, and the chunk is the runtime's problem."""
    acl = fake_acl.make()
    d = ascmem.Device("atlas-a2-training", backend="acl", acl_module=acl,
                      pool_sizes={"normal": (64 * MiB, 512 * MiB)})
    d.free(d.malloc(100 * MiB, Policy.NORMAL_ONLY))  # a second chunk, idle now
    ns, name = call.split(".")
    _raise_once(getattr(acl, ns), name)
    with pytest.warns(ResourceWarning, match="injected"):
        d.empty_cache() if call == "rt.free" else d.reset()
    d.check()
    d.free(d.malloc(100 * MiB, Policy.NORMAL_ONLY))
    d.check()


def test_an_event_call_that_raises_leaks_no_event():
    acl = fake_acl.make()
    d = ascmem.Device("atlas-a2-training", backend="acl", acl_module=acl)
    _raise_once(acl.rt, "record_event")
    d.free(d.malloc(1000), stream=0x77)  # no event: the free waits for a synchronize
    assert not acl.events
    d.synchronize(0x77)
    d.check()
    assert d.stats()["normal"]["live_count"] == 0


@pytest.mark.parametrize("threshold", [0, 4 * MiB, 64 * MiB])
@pytest.mark.parametrize("refused", [1, 3, 5])
def test_granules_the_runtime_refused_are_never_kept_as_mapped(threshold, refused):
    """Found by the Python fuzzer once it had the acl stand-in (eleventh
    session): on a paged acl device with a release threshold, an allocation
    whose physical memory the runtime refused was undone by a free that kept
    the block's granules as mapped -- those never mapped among them -- and
    the next block placed there was handed out over unmapped device memory
    (check() said so too).  Now every kept granule is unmapped on that path."""
    G = 2 * MiB
    acl = fake_acl.make()
    d = ascmem.Device("atlas-a2-training", backend="acl", acl_module=acl, paged=True,
                      release_threshold=threshold)
    d.malloc(3 * MiB)
    calls = [0]

    def fail(name, size):
        if name == "rt.malloc_physical":
            calls[0] += 1
            if calls[0] == refused:
                return 207001
        return 0
    acl.fail = fail
    with pytest.raises(ascmem.OutOfMemoryError, match="refused physical memory"):
        d.malloc(14 * MiB)
    d.check()
    acl.fail = None
    b = d.malloc(14 * MiB)
    assert all(g in acl.mapped for g in range(b - b % G, b + 14 * MiB, G))
    d.check()


@pytest.mark.parametrize("step", ["sleep", "wake"])
def test_a_copy_that_raises_is_a_refused_copy(step):
    """Found by the Python fuzzer (twelfth session): aclrtMemcpy raising
    (instead of returning a code) while sleep(keep=True) saved a tag or
    wake put it back escaped as the bare exception.  It is now the
    OutOfMemoryError a failure code gives, naming the exception, and the
    tag stays as it was: awake after a refused sleep, asleep with its
    contents kept after a refused wake (a later wake restores them)."""
    acl = fake_acl.make()
    d = ascmem.Device("atlas-a2-training", backend="acl", acl_module=acl, paged=True)
    kv = [d.malloc(3 * MiB, tag="kv") for _ in range(2)]
    for i, a in enumerate(kv):
        src = ctypes.create_string_buffer(bytes([i + 1]) * 64, 64)
        assert acl.rt.memcpy(a, 64, ctypes.addressof(src), 64, 1) == 0
    if step == "wake":
        d.sleep("kv")
    _raise_once(acl.rt, "memcpy")
    with pytest.raises(ascmem.OutOfMemoryError, match="MemoryError"):
        d.sleep("kv") if step == "sleep" else d.wake("kv")
    d.check()
    if step == "sleep":
        d.sleep("kv")  # nothing was given back: it can go to sleep now
    d.wake("kv")
    for i, a in enumerate(kv):
        back = ctypes.create_string_buffer(64)
        assert acl.rt.memcpy(ctypes.addressof(back), 64, a, 64, 2) == 0
        assert back.raw == bytes([i + 1]) * 64
        d.free(a)
    d.check()


def test_an_acl_device_in_a_fork_child_never_calls_the_runtime():
    """Probed (twelfth session): an acl Device inherited through fork()
    gave the parent's chunks and granules back through the runtime when the
    child closed or collected it -- memory the parent still uses, through a
    runtime whose threads are not in the child.  Now the copy is closed in
    the child, its calls say why, and closing or collecting it calls
    nothing; the parent's device is untouched."""
    run_child("""
        import gc, os, fake_acl, ascmem
        acl = fake_acl.make()
        plain = ascmem.Device("atlas-a2-training", backend="acl", acl_module=acl)
        paged = ascmem.Device("atlas-a2-training", backend="acl", acl_module=acl, paged=True,
                              device_id=1)
        blocks = [(d, d.malloc(3 << 20)) for d in (plain, paged)]
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                for d, a in blocks:
                    for call in (lambda: d.malloc(4096), lambda: d.free(a)):
                        try:
                            call()
                            code = 2
                        except ascmem.DeviceClosedError as e:
                            if "fork()" not in str(e):
                                code = 3
                n = len(acl.calls)
                for d, _ in blocks:
                    d.close()
                del d, blocks, plain, paged
                gc.collect()
                if len(acl.calls) != n:
                    code = 4
            except BaseException:
                code = 5
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        for d, a in blocks:
            d.free(a)
            d.check()
            d.close()
        assert not acl.live and not acl.mapped and not acl.physical and not acl.reserved
        print("ok")
    """)
