"""torch_npu's hooks with the argument types torch_npu passes (Ascend/pytorch
torch_npu/csrc/npu/Module.cpp lines 397-424): record/erase-stream take a
c10_npu::NPUStream by value -- a hidden reference under the Itanium C++ ABI
-- and the statistics hooks a c10::DeviceIndex, int8_t.  The stream shim is
built against a stand-in of torch_npu's NPUStream.h and called from C++ the
way NPUPluggableAllocator calls it (tests/torch_npu_standin)."""
import ctypes
import os
import shutil
import subprocess

import pytest

import ascmem
import ascmem.pluggable as pl
from conftest import MiB, TESTS

STANDIN = os.path.join(TESTS, "torch_npu_standin")
CXX = shutil.which("c++") or shutil.which("g++")
needs_cxx = pytest.mark.skipif(not CXX, reason="no C++ compiler")


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    """The library playing torch_npu (NPUStream's members over a pretend
    runtime; NPUPluggableAllocator's calls), loaded globally as torch_npu's
    own library is, and the stream shim built against its header."""
    out = tmp_path_factory.mktemp("npu")
    lib = out / "libnpu_standin.so"
    subprocess.run([CXX, "-O1", "-std=c++17", "-shared", "-fPIC", f"-I{STANDIN}", "-o", str(lib),
                    os.path.join(STANDIN, "npu_stream_caller.cpp")], check=True)
    npu = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    npu.standin_malloc.restype = ctypes.c_void_p
    npu.standin_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    for name in ("standin_free",):
        getattr(npu, name).argtypes = [ctypes.c_void_p]
    for name in ("standin_record_stream", "standin_erase_stream"):
        getattr(npu, name).argtypes = [ctypes.c_void_p, ctypes.c_int]
    npu.standin_set_hooks.argtypes = [ctypes.c_uint64] * 4
    shim = pl.build_stream_shim(out / "libascmem_npu_streams.so", include_dirs=[STANDIN],
                                header="npu_stream.h")
    return npu, shim


class _Allocator:
    """An NPUPluggableAllocator's allocator() object: records the setters' addresses."""

    def __init__(self):
        self.given = {}

    def __getattr__(self, name):
        if name.startswith("set_"):
            return lambda address: self.given.__setitem__(name, address)
        raise AttributeError(name)


@pytest.fixture
def npu(standin):
    npu, shim = standin
    d = ascmem.Device("atlas-training", device_id=2, memory=64 * MiB)
    pl.configure(d)
    alloc = _Allocator()
    assert pl.set_hooks(alloc, stream_shim=shim) == []
    fns = pl.load_stream_shim(shim)
    npu.standin_set_hooks(fns["alloc"], fns["free"], alloc.given["set_record_stream_fn"],
                          alloc.given["set_erase_stream_fn"])
    lib = ctypes.CDLL(shim)
    lib.ascmem_npu_streams_waiting.restype = ctypes.c_uint64
    yield npu, d, lib.ascmem_npu_streams_waiting
    for s in range(8):
        npu.standin_set_busy(s, 0)
    pl.unconfigure(2)


@needs_cxx
def test_a_block_recorded_on_a_busy_stream_is_not_reused_until_that_stream_is_done(npu):
    npu, d, waiting = npu
    a = npu.standin_malloc(MiB, 2, 1)            # allocated on stream 1
    npu.standin_record_stream(a, 3)              # stream 3 reads it too
    npu.standin_set_busy(3, 1)
    npu.standin_free(a)
    assert waiting() == 1
    assert d.usable_size(a) >= MiB               # still live in ascmem: not reusable
    b = npu.standin_malloc(MiB, 2, 1)
    assert b != a
    npu.standin_set_busy(3, 0)                   # stream 3 finished its work
    c = npu.standin_malloc(MiB, 2, 1)            # the next call gives a back first
    assert waiting() == 0
    assert c == a                                # and it is reused
    for p in (b, c):
        npu.standin_free(p)
    d.check()
    assert d.stats()["huge"]["live_count"] + d.stats()["normal"]["live_count"] == 0


@needs_cxx
def test_the_allocating_stream_and_erased_streams_do_not_hold_a_block(npu):
    npu, d, waiting = npu
    npu.standin_set_busy(1, 1)
    npu.standin_set_busy(4, 1)
    a = npu.standin_malloc(MiB, 2, 1)
    npu.standin_record_stream(a, 1)              # its own stream orders itself
    npu.standin_record_stream(a, 4)
    npu.standin_erase_stream(a, 4)               # torch_npu's erase_stream takes it back
    npu.standin_free(a)
    assert waiting() == 0
    assert d.stats()["huge"]["live_count"] + d.stats()["normal"]["live_count"] == 0


@needs_cxx
def test_an_allocation_ascmem_cannot_serve_waits_for_the_recorded_streams_first(npu):
    npu, d, waiting = npu
    a = npu.standin_malloc(40 * MiB, 2, 1)
    npu.standin_record_stream(a, 5)
    npu.standin_set_busy(5, 1)
    npu.standin_free(a)
    syncs = npu.standin_syncs()
    b = npu.standin_malloc(40 * MiB, 2, 1)       # only fits once a is back
    assert b and npu.standin_syncs() == syncs + 1 and waiting() == 0
    npu.standin_free(b)
    d.check()


def test_set_hooks_hands_no_record_stream_hook_without_the_stream_shim():
    alloc = _Allocator()
    pl.set_hooks(alloc)
    assert "set_record_stream_fn" not in alloc.given and "set_erase_stream_fn" not in alloc.given


# ---- c10::DeviceIndex is int8_t (Module.cpp lines 414, 421) ------------------------------

def test_reset_peak_status_reads_only_the_low_byte_of_the_device_index():
    """A caller passing an int8_t leaves the register's upper bits undefined
    (AArch64 and x86-64 alike): here they are set on purpose."""
    d = ascmem.Device("atlas-training", device_id=5)
    pl.configure(d)
    try:
        p = d.malloc(8 * MiB)
        d.free(p)
        assert d.stats()["huge"]["peak_used"] > 0
        fn = ctypes.CFUNCTYPE(None, ctypes.c_int64)(
            ctypes.cast(ctypes.CDLL(pl.library_path()).ascmem_pluggable_reset_peak_status,
                        ctypes.c_void_p).value)
        fn(0x7EADBE00 | 5)                       # garbage above device index 5
        assert d.stats()["huge"]["peak_used"] == 0
    finally:
        pl.unconfigure(5)


def test_get_device_stats_reads_only_the_low_byte_of_the_device_index():
    class Stats(ctypes.Structure):  # the 952-byte DeviceStats (csrc/pluggable.c)
        _fields_ = [("v", ctypes.c_int64 * (952 // 8))]
    d = ascmem.Device("atlas-training", device_id=6)
    pl.configure(d)
    try:
        p = d.malloc(3 * MiB)
        fn = ctypes.CFUNCTYPE(Stats, ctypes.c_int64)(
            ctypes.cast(ctypes.CDLL(pl.library_path()).ascmem_pluggable_get_device_stats,
                        ctypes.c_void_p).value)
        stats = fn(0x7EADBE00 | 6)
        assert stats.v[0] == 1                   # allocation[ALL].current: the one block
        d.free(p)
    finally:
        pl.unconfigure(6)
