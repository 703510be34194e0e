"""The host backend (real memory), the ascmem.acl drop-in, and install() into
a pyACL module (a recording stand-in: the Ascend runtime is not available)."""
import gc
import os
import subprocess
import sys

import numpy as np
import pytest

import ascmem
from ascmem import MemKind, Policy
from ascmem import acl as aacl
from ascmem.rules import MiB

import fake_acl
from conftest import ROOT


@pytest.fixture
def host():
    return ascmem.Device("atlas-inference", backend="host")


def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024


@pytest.mark.parametrize("alloc,free,kind", [
    ("malloc", "free", MemKind.NORMAL), ("dvpp_malloc", "dvpp_free", MemKind.DVPP),
    ("malloc_host", "free_host", MemKind.HOST)])
def test_write_and_read_every_kind(host, alloc, free, kind):
    p = getattr(host, alloc)(10_000)
    assert host.kind_of(p) == kind
    view = host.buffer(p)
    view[:] = bytes(range(256)) * (len(view) // 256) + bytes(len(view) % 256)
    assert bytes(host.buffer(p, 256)) == bytes(range(256))
    del view
    getattr(host, free)(p)


def test_huge_kinds_are_2mib_aligned_and_report_their_pages(host):
    base, _ = host.range_of(MemKind.HUGE)
    assert base % (2 * MiB) == 0
    pages = host.pages()
    assert "huge pages" in pages["huge"] and pages["normal"] == "normal pages"
    a = host.malloc(4 * MiB, Policy.HUGE_ONLY)
    arr = host.as_array(a, 4 * MiB)
    arr[:] = 1
    assert int(arr.sum()) == 4 * MiB
    del arr
    host.free(a)


def test_numpy_and_dlpack_views_alias_the_block(host):
    p = host.dvpp_malloc(1920 * 1080)
    a = host.as_array(p, (1080, 1920))
    b = np.from_dlpack(a)
    a[5, 7] = 42
    assert b[5, 7] == 42 and b.ctypes.data == p and a.ctypes.data == p
    mv = host.buffer(p)
    assert mv[5 * 1920 + 7] == 42
    del a, b, mv


def test_a_block_with_live_views_cannot_be_freed(host):
    p = host.malloc(5000)
    arr = host.as_array(p, 100, np.float32)
    with pytest.raises(ascmem.InvalidFreeError, match="view"):
        host.free(p)
    arr[0] = 1.5
    del arr
    gc.collect()
    host.free(p)  # once the views are gone
    host.check()


def test_views_need_a_live_block_and_a_host_backend(host):
    p = host.malloc(100)
    with pytest.raises(ascmem.InvalidArgumentError):
        host.buffer(p, 10_000)
    host.free(p)
    with pytest.raises(ascmem.InvalidFreeError):
        host.buffer(p)
    with pytest.raises(ascmem.UnsupportedError):
        ascmem.Device().buffer(ascmem.Device().malloc(10))
    q = host.malloc(4096)
    for dtype in ("object", [("a", "O"), ("b", "u8")]):  # numpy's bare ValueError before
        with pytest.raises(ascmem.InvalidArgumentError, match="Python objects"):
            host.as_array(q, 2, dtype)
    host.free(q)  # no view is left behind


def test_empty_cache_really_lowers_resident_memory(host):
    p = host.malloc(64 * MiB, Policy.NORMAL_ONLY)
    arr = host.as_array(p, 64 * MiB)
    arr[:] = 1  # touch every page
    del arr
    touched = rss()
    host.free(p)
    host.empty_cache()
    assert rss() < touched - 48 * MiB


def test_reset_moves_host_ranges(host):
    p = host.malloc(1000)
    host.reset()
    with pytest.raises(ascmem.InvalidFreeError):
        host.free(p)
    q = host.malloc(1000)
    host.buffer(q)[:4] = b"ok!!"
    host.free(q)


def test_debug_mode_reports_an_overrun_at_free(monkeypatch):
    monkeypatch.setenv("ASCMEM_DEBUG", "1")
    d = ascmem.Device("atlas-inference", backend="host")
    a = d.malloc(100)
    v = d.buffer(a)
    assert len(v) == 100  # the guard is not part of the caller's view
    v[99] = 1             # the last byte is fine
    del v
    d.free(a)
    b = d.dvpp_malloc(1000)
    d.as_array(b, 1000)  # views stay inside the block...
    import ctypes
    ctypes.memset(b + 1000, 0, 3)  # ...but a raw write runs past its end
    gc.collect()
    with pytest.raises(ascmem.CorruptionError, match=f"{b:#x} of 1000 bytes"):
        d.dvpp_free(b)
    d.check()  # the block was freed all the same; the pool is whole


def test_example_media_to_inference_runs():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "media_to_inference.py"),
                        "30"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "30 frames" in r.stdout and "no copies" in r.stdout


# ---- the drop-in --------------------------------------------------------------------

@pytest.fixture
def dropin():
    d = ascmem.Device("atlas-inference")
    aacl.use(d)
    yield d
    aacl.use(None)


def test_himpi_where_the_product_has_it():
    """pyACL's dvpp_malloc page (aclpythondevg_01_0416): acl.himpi.dvpp_malloc
    on the inference series (310P) and A2, not on the training series."""
    for model, has in (("atlas-inference-series", True), ("atlas-a2-inference", True),
                       ("atlas-training", False), ("atlas-inference", False)):
        d = ascmem.Device(model)
        aacl.use(d)
        try:
            ptr, ret = aacl.himpi.dvpp_malloc(0, 100)
            assert (ret == 0) == has and (ret == 207000) == (not has)
            if has:
                assert ptr % 128 == 0 and aacl.himpi.dvpp_free(ptr) == 0
            text = " ".join(d.precautions())
            assert ("hi_mpi_dvpp_malloc" in text) == has
        finally:
            aacl.use(None)


def test_dropin_return_conventions(dropin):
    ptr, ret = aacl.rt.malloc(1000, 0)
    assert ret == 0 and dropin.usable_size(ptr) == 1056
    assert aacl.rt.free(ptr) == 0
    assert aacl.rt.free(ptr) == 207002  # double free: a code, not an exception
    assert aacl.rt.malloc(0, 0) == (0, 100000)
    assert aacl.rt.malloc(4096, 4) == (0, 207000)  # P2P unsupported on this product
    assert aacl.rt.malloc(1 << 40, 1)[1] == 207001
    ptr, ret = aacl.media.dvpp_malloc(3_110_400)
    assert ret == 0 and ptr % 128 == 0 and aacl.media.dvpp_free(ptr) == 0
    # hi_mpi_dvpp_malloc does not exist on the Atlas 200/300/500 (profiles [D])
    assert aacl.himpi.dvpp_malloc(0, 100) == (0, 207000)
    h, ret = aacl.rt.malloc_host(64)
    assert ret == 0 and aacl.rt.free_host(h) == 0
    free, total, ret = aacl.rt.get_mem_info(ascmem.MemAttr.DDR_MEM)
    assert ret == 0 and 0 < free <= total
    assert aacl.rt.get_mem_info(99)[2] == 107016  # ACL_ERROR_RT_INVALID_MEMORY_TYPE
    assert aacl.rt.malloc("x", 0)[1] == 100000
    assert aacl.init() == 0 and aacl.finalize() == 0


def test_dropin_reset_device(dropin):
    assert aacl.rt.set_device(5) == 0
    ptr, _ = aacl.rt.malloc(100, 0)
    assert aacl.rt.reset_device(5) == 0
    assert aacl.rt.free(ptr) == 207002
    assert aacl.rt.set_device(-1) == 100000


def test_dropin_default_device_from_the_environment():
    code = ("import os; os.environ['ASCMEM_MODEL'] = 'atlas-training';"
            "from ascmem import acl; p, r = acl.rt.malloc(10, 0);"
            "print(acl.device().profile.name, r)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["atlas-training", "0"]


def test_install_routes_an_unchanged_pipeline_and_uninstall_restores(dropin):
    acl = fake_acl.make()
    original = (acl.rt.malloc, acl.rt.free, acl.media.dvpp_malloc)
    foreign, _ = acl.rt.malloc(4096, 0)  # allocated by the runtime before install

    def pipeline(acl):  # the user's code, unchanged
        frame, ret = acl.media.dvpp_malloc(3_110_400)
        assert ret == 0
        out, ret = acl.rt.malloc(1000, 0)
        assert ret == 0
        assert acl.rt.free(out) == 0
        assert acl.media.dvpp_free(frame) == 0
        return frame

    aacl.install(acl)
    try:
        calls_before = len(acl.calls)
        frame = pipeline(acl)
        assert dropin.kind_of(frame) == MemKind.DVPP   # came from ascmem
        assert len(acl.calls) == calls_before           # the runtime saw nothing
        assert acl.rt.free(foreign) == 0                # a runtime pointer goes to its free
        assert ("rt.free", foreign) in acl.calls
    finally:
        aacl.uninstall()
    assert (acl.rt.malloc, acl.rt.free, acl.media.dvpp_malloc) == original
    ptr, ret = acl.rt.malloc(10, 0)
    assert ret == 0 and ptr in acl.live


# ---- the acl backend, against the recording stand-in ------------------------------

def test_acl_backend_takes_big_chunks_and_gives_them_back():
    acl = fake_acl.make()
    d = ascmem.Device("atlas-inference", backend="acl", acl_module=acl)
    names = [c[0] for c in acl.calls]
    assert names == ["rt.malloc", "rt.malloc", "media.dvpp_malloc", "rt.malloc_host"]
    assert [c[2] for c in acl.calls[:2]] == [1, 2]  # HUGE_ONLY, NORMAL_ONLY
    taken = len(acl.calls)
    ptrs = [d.malloc(1000), d.dvpp_malloc(3_110_400), d.malloc(5 << 20, Policy.HUGE_ONLY)]
    assert len(acl.calls) == taken  # sub-allocated: no runtime call per block
    for p in ptrs:
        assert d.kind_of(p) in (MemKind.NORMAL, MemKind.DVPP, MemKind.HUGE)
    d.free(ptrs[0]); d.dvpp_free(ptrs[1]); d.free(ptrs[2])
    d.close()
    assert not acl.live  # every chunk went back


def test_acl_backend_maps_runtime_errors():
    acl = fake_acl.make()
    acl.media.dvpp_malloc = lambda size: (0, 207001)
    with pytest.raises(ascmem.OutOfMemoryError) as info:
        ascmem.Device("atlas-inference", backend="acl", acl_module=acl)
    assert info.value.code == 207001 and "DVPP" in str(info.value)
    assert not acl.live  # the chunks already taken were given back


def test_acl_backend_without_pyacl_says_so():
    with pytest.raises(ascmem.UnsupportedError, match="pyACL"):
        ascmem.Device("atlas-inference", backend="acl")


def test_installed_job_calls_charge_the_first_jobs_runtime_memory():
    """The first model or operator execution after the device starts takes
    the AI CPU operator cache (training series, EP) or the system package
    (A2/A3) -- the precautions page; install() makes pyACL's job calls do it."""
    import types
    for model, taken in (("atlas-training", None), ("atlas-a2-training", 300 * MiB)):
        fake = fake_acl.make()
        runs = []
        fake.mdl = types.SimpleNamespace(execute=lambda *a: runs.append(a) or 0,
                                         execute_async=lambda *a: runs.append(a) or 0)
        fake.op = types.SimpleNamespace(execute_v2=lambda *a: runs.append(a) or 0)
        dev = ascmem.Device(model)
        aacl.use(dev)
        aacl.install(fake)
        try:
            assert dev.budget()["fixed"] == 0
            assert fake.mdl.execute(1, "in", "out") == 0
            fixed = dev.budget()["fixed"]
            if taken is None:
                lo, hi = dev.profile.aicpu_cache
                assert lo <= fixed <= hi
            else:
                assert fixed == taken
            assert fake.op.execute_v2("add") == 0 and fake.mdl.execute_async(1, "in", "out", 7) == 0
            assert dev.budget()["fixed"] == fixed  # only the first job takes it
            assert len(runs) == 3
        finally:
            aacl.uninstall()
            aacl.use(None)
        assert not hasattr(fake.mdl.execute, "__wrapped__")


def test_a_first_job_that_finds_no_room_fails_with_the_code():
    import types
    fake = fake_acl.make()
    fake.mdl = types.SimpleNamespace(execute=lambda *a: 0)
    dev = ascmem.Device("atlas-a2-training", memory=512 * MiB)
    dev.malloc(400 * MiB)  # the 300 MB package no longer fits
    aacl.use(dev)
    aacl.install(fake)
    try:
        assert fake.mdl.execute(1, "in", "out") == 207001
        assert dev.budget()["fixed"] == 0
    finally:
        aacl.uninstall()
        aacl.use(None)
