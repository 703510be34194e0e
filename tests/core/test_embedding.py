"""Embedding: a Cython extension that cimports the pool, a C extension that
uses the capsule API, and the pluggable-allocator functions through ctypes
from several threads.  The extensions are really compiled, in a temporary
directory, against the installed package."""
import os
import subprocess
import sys
import textwrap
import threading

import pytest

import ascmem
import ascmem.pluggable as pl
from conftest import TESTS

CYTHON_EXT = """
# cython: language_level=3
from libc.stdint cimport uint64_t
from ascmem._core cimport Pool, Device

def churn(Pool pool, uint64_t size, int n):
    \"\"\"n allocate+free pairs at C level; returns the last address.\"\"\"
    cdef uint64_t addr = 0
    cdef int i, bad = 0
    with nogil:
        for i in range(n):
            if pool.alloc_raw(size, 64, &addr) != 0 or pool.free_raw(addr) != 0:
                bad = 1
                break
    return -1 if bad else addr

def churn_by_handle(Pool pool, uint64_t size, int n):
    \"\"\"As churn, through the handle entry points; returns the last handle.\"\"\"
    cdef uint64_t addr = 0, handle = 0
    cdef int i, bad = 0
    with nogil:
        for i in range(n):
            if pool.alloc_handle_raw(size, 64, &addr, &handle) != 0 or pool.free_handle_raw(handle) != 0:
                bad = 1
                break
    return -1 if bad else handle

def keep_by_handle(Pool pool, uint64_t size):
    cdef uint64_t addr, handle
    if pool.alloc_handle_raw(size, 64, &addr, &handle) != 0:
        raise MemoryError()
    return addr, handle

def free_by_handle(Pool pool, uint64_t handle):
    return pool.free_handle_raw(handle)

def keep(Pool pool, uint64_t size):
    cdef uint64_t addr
    if pool.alloc_raw(size, 64, &addr) != 0:
        raise MemoryError()
    return addr

def device_malloc(Device dev, uint64_t size):
    cdef uint64_t addr
    if dev.malloc_raw(size, 0, &addr) != 0:
        raise MemoryError()
    return addr
"""

C_EXT = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "ascmem_capi.h"

static PyObject *roundtrip(PyObject *self, PyObject *args) {
    PyObject *pool_obj;
    unsigned long long size;
    if (!PyArg_ParseTuple(args, "OK", &pool_obj, &size)) return NULL;
    ascm_pool *p = ascm_api->pool_of(pool_obj);
    if (!p) { PyErr_SetString(PyExc_TypeError, "not an ascmem.Pool"); return NULL; }
    uint64_t addr, usable;
    int st = ascm_api->pool_alloc(p, size, 64, &addr);
    if (st) return PyErr_Format(PyExc_MemoryError, "%s", ascm_api->status_str(st));
    ascm_api->pool_usable_size(p, addr, &usable);
    return Py_BuildValue("KK", (unsigned long long)addr, (unsigned long long)usable);
}

static PyObject *release(PyObject *self, PyObject *args) {
    PyObject *pool_obj;
    unsigned long long addr;
    if (!PyArg_ParseTuple(args, "OK", &pool_obj, &addr)) return NULL;
    return PyLong_FromLong(ascm_api->pool_free(ascm_api->pool_of(pool_obj), addr));
}

/* a pool of the extension's own, made and destroyed in C */
static PyObject *own_pool(PyObject *self, PyObject *noargs) {
    ascm_pool_config cfg = {0};
    cfg.base = 1ull << 36; cfg.size = 1u << 24; cfg.min_block = 4096;
    ascm_pool *p;
    if (ascm_api->pool_create(&cfg, &p)) return PyErr_NoMemory();
    uint64_t a, b;
    ascm_api->pool_alloc(p, 1000, 64, &a);
    ascm_api->pool_alloc(p, 3u << 20, 64, &b);
    ascm_stats st;
    ascm_api->pool_stats(p, &st);
    ascm_api->pool_free(p, a);
    ascm_api->pool_free(p, b);
    int ok = ascm_api->pool_check(p, NULL, 0);
    ascm_api->pool_destroy(p);
    return Py_BuildValue("KKi", (unsigned long long)st.live_count, (unsigned long long)st.requested, ok);
}

/* allocate by handle, then free by handle twice: (addr, handle, first, second) */
static PyObject *handle_roundtrip(PyObject *self, PyObject *args) {
    PyObject *pool_obj;
    unsigned long long size;
    if (!PyArg_ParseTuple(args, "OK", &pool_obj, &size)) return NULL;
    ascm_pool *p = ascm_api->pool_of(pool_obj);
    if (!p) { PyErr_SetString(PyExc_TypeError, "not an ascmem.Pool"); return NULL; }
    uint64_t addr;
    ascm_handle h;
    int st = ascm_api->pool_alloc_handle(p, size, 64, &addr, &h);
    if (st) return PyErr_Format(PyExc_MemoryError, "%s", ascm_api->status_str(st));
    int first = ascm_api->pool_free_handle(p, h), second = ascm_api->pool_free_handle(p, h);
    return Py_BuildValue("KKii", (unsigned long long)addr, (unsigned long long)h, first, second);
}

/* threads of its own, without the GIL, on a Python pool with thread caches
 * on: each allocates and frees small blocks, and some of another's; returns
 * the number of calls that failed */
#include <pthread.h>
typedef struct { ascm_pool *p; uint64_t seed; uint64_t *shared; int failed; } churner;
static void *churn(void *arg) {
    churner *c = arg;
    uint64_t live[256] = {0}, s = c->seed;
    for (int i = 0; i < 200000; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        int v = (int)(s % 256);
        if (live[v] && ascm_api->pool_free(c->p, live[v])) c->failed++;
        live[v] = 0;
        if (ascm_api->pool_alloc(c->p, 1 + (s >> 20) % 32768, 16, &live[v])) c->failed++;
        if (i % 64 == 0) { /* hand one over: another thread frees it */
            uint64_t old = __atomic_exchange_n(c->shared, live[v], __ATOMIC_ACQ_REL);
            live[v] = 0;
            if (old && ascm_api->pool_free(c->p, old)) c->failed++;
        }
    }
    for (int v = 0; v < 256; v++)
        if (live[v] && ascm_api->pool_free(c->p, live[v])) c->failed++;
    return NULL;
}
/* churn_threads(pool, n, mode): n threads churn the pool, with its thread
 * caches set to mode first (-1: as the pool has them); returns (failed
 * calls, whether the caches were on at the end). */
static PyObject *churn_threads(PyObject *self, PyObject *args) {
    PyObject *pool_obj;
    int n, mode;
    if (!PyArg_ParseTuple(args, "Oii", &pool_obj, &n, &mode) || n < 1 || n > 16) return NULL;
    ascm_pool *p = ascm_api->pool_of(pool_obj);
    if (!p || (mode >= 0 && ascm_api->pool_set_thread_caches(p, mode))) return NULL;
    pthread_t t[16];
    churner c[16];
    uint64_t shared = 0;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < n; i++) {
        c[i] = (churner){p, 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1), &shared, 0};
        pthread_create(&t[i], NULL, churn, &c[i]);
    }
    for (int i = 0; i < n; i++) { pthread_join(t[i], NULL); failed += c[i].failed; }
    if (shared && ascm_api->pool_free(p, shared)) failed++;
    Py_END_ALLOW_THREADS
    return Py_BuildValue("ii", failed, ascm_api->pool_thread_caches_on(p));
}

/* set_placement(pool or device, placement): the capsule's setter, then its
 * getter: (status, placement read back) */
static PyObject *set_placement(PyObject *self, PyObject *args) {
    PyObject *obj;
    int placement, st, now;
    if (!PyArg_ParseTuple(args, "Oi", &obj, &placement)) return NULL;
    ascm_pool *p = ascm_api->pool_of(obj);
    ascm_device *d = p ? NULL : ascm_api->device_of(obj);
    if (!p && !d) { PyErr_SetString(PyExc_TypeError, "not an ascmem.Pool or Device"); return NULL; }
    Py_BEGIN_ALLOW_THREADS
    st = p ? ascm_api->pool_set_placement(p, placement) : ascm_api->device_set_placement(d, placement);
    now = p ? ascm_api->pool_placement(p) : ascm_api->device_placement(d);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("ii", st, now);
}

/* set_slab_max(pool or device, bytes): the capsule's setter, then its
 * getter: (status, slab_max read back) */
static PyObject *set_slab_max(PyObject *self, PyObject *args) {
    PyObject *obj;
    unsigned long long bytes, now;
    int st;
    if (!PyArg_ParseTuple(args, "OK", &obj, &bytes)) return NULL;
    ascm_pool *p = ascm_api->pool_of(obj);
    ascm_device *d = p ? NULL : ascm_api->device_of(obj);
    if (!p && !d) { PyErr_SetString(PyExc_TypeError, "not an ascmem.Pool or Device"); return NULL; }
    Py_BEGIN_ALLOW_THREADS
    st = p ? ascm_api->pool_set_slab_max(p, bytes) : ascm_api->device_set_slab_max(d, bytes);
    now = p ? ascm_api->pool_slab_max(p) : ascm_api->device_slab_max(d);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("iK", st, now);
}

static PyMethodDef methods[] = {
    {"set_placement", set_placement, METH_VARARGS, NULL},
    {"set_slab_max", set_slab_max, METH_VARARGS, NULL},
    {"churn_threads", churn_threads, METH_VARARGS, NULL},
    {"roundtrip", roundtrip, METH_VARARGS, NULL},
    {"handle_roundtrip", handle_roundtrip, METH_VARARGS, NULL},
    {"release", release, METH_VARARGS, NULL},
    {"own_pool", own_pool, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "capi_user", NULL, -1, methods};

PyMODINIT_FUNC PyInit_capi_user(void) {
    if (ascm_import_capi() < 0) return NULL;
    return PyModule_Create(&mod);
}
"""

SETUP = """
from setuptools import Extension, setup
from Cython.Build import cythonize
import ascmem, os
site = os.path.dirname(os.path.dirname(ascmem.__file__))
setup(name="embedders", script_args=["build_ext", "--inplace", "-q"], ext_modules=cythonize(
    [Extension("cy_user", ["cy_user.pyx"], include_dirs=[ascmem.get_include()]),
     Extension("capi_user", ["capi_user.c"], include_dirs=[ascmem.get_include()])],
    include_path=[site], quiet=True))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("Cython")
    d = tmp_path_factory.mktemp("embed")
    (d / "cy_user.pyx").write_text(CYTHON_EXT)
    (d / "capi_user.c").write_text(C_EXT)
    (d / "setup.py").write_text(textwrap.dedent(SETUP))
    r = subprocess.run([sys.executable, "setup.py"], cwd=d, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    sys.path.insert(0, str(d))
    try:
        import capi_user
        import cy_user
        yield cy_user, capi_user
    finally:
        sys.path.remove(str(d))


def test_cython_extension_cimports_the_pool(built):
    cy_user, _ = built
    p = ascmem.Pool(1 << 26, base=1 << 32)
    assert cy_user.churn(p, 256, 10000) >= 1 << 32
    a = cy_user.keep(p, 5000)
    assert p.usable_size(a) >= 5000  # the Python view sees the C-level block
    p.free(a)
    s = p.stats()
    assert s["alloc_count"] == 10001 and s["live_count"] == 0
    p.check()
    d = ascmem.Device("atlas-inference")
    x = cy_user.device_malloc(d, 100)
    assert d.usable_size(x) == 160
    d.free(x)


@pytest.mark.parametrize("size", [100, 5000, 3 << 20])  # a slab slot, a 2-unit block, a large one
def test_cython_extension_allocates_by_handle(built, size):
    cy_user, _ = built
    p = ascmem.Pool(1 << 26, base=1 << 32)
    assert cy_user.churn_by_handle(p, size, 10000) > 0
    addr, handle = cy_user.keep_by_handle(p, size)
    s = p.stats()
    assert s["live_count"] == 1 and s["requested"] == size  # statistics count it
    p.check()
    if size > 32768:  # a large block by handle is not known by its address
        with pytest.raises(ascmem.InvalidFreeError):
            p.free(addr)
        p.check()
    assert cy_user.free_by_handle(p, handle) == 0
    assert cy_user.free_by_handle(p, handle) != 0  # twice: refused, nothing changed
    assert cy_user.free_by_handle(p, 12345) != 0
    assert p.stats()["live_count"] == 0
    p.check()


def test_c_extension_uses_the_capsule(built):
    _, capi_user = built
    p = ascmem.Pool(1 << 26, base=1 << 32)
    addr, usable = capi_user.roundtrip(p, 3000)
    assert p.requested_size(addr) == 3000 and usable == p.usable_size(addr)
    assert capi_user.release(p, addr) == 0
    assert capi_user.release(p, addr) != 0  # double free: a status, not a crash
    with pytest.raises(TypeError):
        capi_user.roundtrip(object(), 10)
    assert capi_user.own_pool() == (2, 1000 + (3 << 20), 0)
    for size in (64, 3 << 20):
        addr, handle, first, second = capi_user.handle_roundtrip(p, size)
        assert handle != 0 and first == 0 and second != 0
    assert p.stats()["live_count"] == 0
    p.check()


@pytest.mark.parametrize("mode", ["on", "default"])
def test_c_extension_threads_share_a_pool_through_thread_caches(built, mode):
    # "default": the Pool's own AUTO, which the threads' meeting turns on
    _, capi_user = built
    p = ascmem.Pool(1 << 28, base=1 << 32)
    assert not p.thread_caches_on
    assert capi_user.churn_threads(p, 4, 1 if mode == "on" else -1) == (0, 1)
    assert p.thread_caches_on
    st = p.stats()
    assert st["live_count"] == 0 and st["used"] == 0
    assert st["alloc_count"] == st["free_count"] == 4 * 200000
    p.check()


def test_c_extension_sets_a_placement_through_the_capsule(built):
    """ASCM_PLACE_* as ascmem.h numbers them; the Python objects read what
    the embedder set.  A Device takes it for its pools: a request of the
    kept block's size lands lower under best fit's choice
    (tests/device/test_device_placement.py's layout)."""
    _, capi_user = built
    granules, packed, kept_in_place, kept_to_best_fit, lowest_equal = range(5)
    p = ascmem.Pool(1 << 26, base=1 << 32)
    assert capi_user.set_placement(p, lowest_equal) == (0, lowest_equal)
    assert p.placement == "lowest-equal"
    assert capi_user.set_placement(p, packed)[1] == lowest_equal  # refused: unchanged
    assert capi_user.set_placement(p, packed)[0] != 0
    assert capi_user.set_placement(p, 7)[0] != 0 and p.placement == "lowest-equal"
    paged = ascmem.Pool(1 << 26, base=1 << 36, granule=64 << 10)
    assert capi_user.set_placement(paged, packed) == (0, packed) and paged.placement == "packed"
    best_fit = 5  # a paged pool's (test_best_fit_placement.py)
    assert capi_user.set_placement(paged, best_fit) == (0, best_fit) and paged.placement == "best-fit"
    assert capi_user.set_placement(p, best_fit)[0] != 0 and p.placement == "lowest-equal"
    assert capi_user.set_placement(paged, kept_to_best_fit)[0] != 0
    with ascmem.Device("atlas-a2-training", memory=8 << 30) as d:
        assert capi_user.set_placement(d, granules)[0] != 0 and d.placement == "kept-in-place"
        assert capi_user.set_placement(d, kept_to_best_fit) == (0, kept_to_best_fit)
        assert d.placement == "kept-to-best-fit"
        a = [d.malloc(1 << 20, ascmem.Policy.NORMAL_ONLY) for _ in range(4)]
        d.free(a[0])
        d.free(a[2])
        assert d.malloc(1 << 20, ascmem.Policy.NORMAL_ONLY) == a[0]
        d.reset()
        assert d.placement == "kept-to-best-fit"
        d.check()
    assert capi_user.set_placement(d, lowest_equal)[0] != 0  # closed: refused
    with pytest.raises(TypeError):
        capi_user.set_placement(object(), 2)


def test_c_extension_sets_slab_max_through_the_capsule(built):
    """A plan's slab_max deployed from C: the Python objects read what the
    embedder set, a request under it then comes from best fit in whole
    units, and a closed device refuses."""
    _, capi_user = built
    p = ascmem.Pool(1 << 26, base=1 << 32)
    assert capi_user.set_slab_max(p, 0) == (0, 0) and p.slab_max == 0
    a = p.alloc(100)
    assert p.usable_size(a) == p.min_block
    p.free(a)
    assert capi_user.set_slab_max(p, 1 << 40) == (0, 32 << 10)  # the largest class
    with ascmem.Device("atlas-a2-training", memory=8 << 30) as d:
        assert capi_user.set_slab_max(d, 0) == (0, 0) and d.slab_max == 0
        d.reset()
        assert d.slab_max == 0
        d.check()
    assert capi_user.set_slab_max(d, 0)[0] != 0  # closed: refused


def test_pluggable_functions_from_threads():
    d = ascmem.Device("atlas-training", device_id=3)
    pl.configure(d)
    fns = pl.functions()
    alloc, free = fns[pl.ALLOC], fns[pl.FREE]
    errors, kept = [], []

    def work(seed):
        try:
            live = []
            for i in range(2000):
                size = 64 + (seed * 7919 + i * 104729) % (3 << 20)
                p = alloc(size, 3, None)
                assert p, "allocation failed"
                live.append(p)
                if len(live) > 20:
                    free(live.pop(0), 0, 3, None)
            kept.extend(live)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    snap = {b["address"] for b in d.snapshot()}
    assert snap == set(kept)  # the Python view of the same device agrees
    size = pl.functions()["ascmem_pluggable_base_alloc"]
    import ctypes
    n = ctypes.c_size_t()
    assert size(kept[0], ctypes.byref(n)) == kept[0] and n.value >= 64
    for p in kept:
        free(p, 0, 3, None)
    assert d.stats()["device"]["huge_used"] == 0
    fns["ascmem_pluggable_memory_fraction"](0.5, 3)
    assert d.budget()["limit"] == d.budget()["total"] // 2
    fns["ascmem_pluggable_reset_peak_status"](3)
    assert d.budget()["peak_huge"] == 0
    assert alloc(1 << 40, 3, None) is None  # out of memory: NULL, as the API expects
    assert alloc(64, 9, None) is None       # an unconfigured device index
    pl.unconfigure(3)
    d.check()


def test_get_include_has_the_headers():
    inc = ascmem.get_include()
    assert os.path.exists(os.path.join(inc, "ascmem.h"))
    assert os.path.exists(os.path.join(inc, "ascmem_capi.h"))


# A C++ caller of the get_device_stats hook, as torch_npu calls it: through a
# std::function returning the DeviceStats aggregate by value.  The struct is
# declared here member by member as torch_npu declares it (its header is not
# available here), in both sizes; the caller surrounds it with canaries so an
# overrun would show.
STATS_CALLER = r"""
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <new>
struct Stat { int64_t current = 0, peak = 0, allocated = 0, freed = 0; };
using StatArray = std::array<Stat, 3>;
struct DeviceStats {
    StatArray allocation, segment, active, inactive_split, allocated_bytes, reserved_bytes,
        active_bytes, inactive_split_bytes, requested_bytes;
    int64_t num_alloc_retries = 0, num_ooms = 0;
    Stat oversize_allocations, oversize_segments;
    int64_t max_split_size = 0;
};
struct DeviceStatsExt {
    StatArray allocation, segment, active, inactive_split, allocated_bytes, reserved_bytes,
        active_bytes, inactive_split_bytes, requested_bytes;
    int64_t num_alloc_retries = 0, num_ooms = 0;
    Stat oversize_allocations, oversize_segments;
    int64_t num_sync_all_streams = 0, num_device_alloc = 0, num_device_free = 0;
    int64_t max_split_size = 0;
};
template <class T> static int call(uint64_t fn_addr, int device, int64_t *out) {
    struct { int64_t before[4]; T stats; int64_t after[4]; } frame;
    for (auto &c : frame.before) c = 0x5A5A5A5A;
    for (auto &c : frame.after) c = 0x5A5A5A5A;
    std::function<T(int)> fn = reinterpret_cast<T (*)(int)>(fn_addr);
    new (&frame.stats) T(fn(device));  // the result lands between the canaries
    for (auto c : frame.before) if (c != 0x5A5A5A5A) return -1;
    for (auto c : frame.after) if (c != 0x5A5A5A5A) return -1;
    out[0] = frame.stats.allocation[0].current;
    out[1] = frame.stats.allocation[0].allocated;
    out[2] = frame.stats.allocated_bytes[0].current;
    out[3] = frame.stats.allocated_bytes[1].current;   // small pool
    out[4] = frame.stats.allocated_bytes[2].current;   // large pool
    out[5] = frame.stats.reserved_bytes[0].current;
    out[6] = frame.stats.requested_bytes[0].current;
    out[7] = frame.stats.allocated_bytes[0].peak;
    out[8] = frame.stats.max_split_size;
    return (int)sizeof(T);
}
extern "C" int call_952(uint64_t f, int d, int64_t *o) { return call<DeviceStats>(f, d, o); }
extern "C" int call_976(uint64_t f, int d, int64_t *o) { return call<DeviceStatsExt>(f, d, o); }
"""


def test_get_device_stats_hook_called_the_way_torch_npu_calls_it(tmp_path):
    import ctypes
    import shutil
    cxx = shutil.which("c++") or shutil.which("g++")
    if not cxx:
        pytest.skip("no C++ compiler")
    src = tmp_path / "caller.cpp"
    src.write_text(STATS_CALLER)
    lib_path = tmp_path / "libcaller.so"
    subprocess.run([cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-o", str(lib_path), str(src)],
                   check=True)
    caller = ctypes.CDLL(str(lib_path))
    d = ascmem.Device("atlas-training", device_id=5)
    pl.configure(d)
    alloc, free = pl.functions()[pl.ALLOC], pl.functions()[pl.FREE]
    small = alloc(1000, 5, None)    # NORMAL: torch's small pool
    big = alloc(8 << 20, 5, None)   # HUGE: the large pool
    lib = ctypes.CDLL(pl.library_path())
    out = (ctypes.c_int64 * 9)()
    s = d.stats()
    for layout, name in pl.STATS_LAYOUTS.items():
        fn = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
        size = getattr(caller, f"call_{layout}")(ctypes.c_uint64(fn), 5, out)
        assert size == int(layout)  # the right struct, and no canary touched
        assert out[0] == 2 and out[1] == 2
        assert out[3] == s["normal"]["used"] and out[4] == s["huge"]["used"]
        assert out[2] == out[3] + out[4]
        assert out[5] == s["normal"]["capacity"] + s["huge"]["capacity"]
        assert out[6] == 1000 + (8 << 20)  # what torch asked for, before CANN's rounding
        assert out[7] >= out[2] and out[8] == 2**63 - 1
    free(small, 1000, 5, None)
    free(big, 8 << 20, 5, None)
    assert d.stats()["normal"]["live_count"] == 0
    pl.unconfigure(5)


# Calls the snapshot hook as torch_npu does (a SnapshotInfo() function
# pointer) and flattens the result into int64s for the test.
SNAPSHOT_CALLER = r"""
#include <cstdint>
#include <functional>
#include "npu_snapshot_types.h"
using namespace c10_npu::NPUCachingAllocator;
extern "C" int flatten(uint64_t fn_addr, int64_t *out, int cap) {
    std::function<SnapshotInfo()> fn = reinterpret_cast<SnapshotInfo (*)()>(fn_addr);
    SnapshotInfo info = fn();
    int n = 0;
    auto put = [&](int64_t v) { if (n < cap) out[n] = v; n++; };
    put((int64_t)info.segments.size());
    for (const auto &s : info.segments) {
        put(s.device); put((int64_t)s.address); put(s.total_size); put(s.allocated_size);
        put(s.requested_size); put(s.is_large); put((int64_t)s.blocks.size());
        for (const auto &b : s.blocks) { put(b.size); put(b.requested_size); put(b.allocated); }
    }
    return n;
}
"""


def test_snapshot_hook_built_against_torch_npu_types(tmp_path):
    import ctypes
    import shutil
    if not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("no C++ compiler")
    standin = os.path.join(TESTS, "torch_npu_standin")
    shim = pl.build_snapshot_shim(tmp_path / "libshim.so", include_dirs=[standin],
                                  header="npu_snapshot_types.h")
    src = tmp_path / "caller.cpp"
    src.write_text(SNAPSHOT_CALLER)
    caller_path = tmp_path / "libcaller.so"
    subprocess.run([shutil.which("c++") or shutil.which("g++"), "-O1", "-std=c++17", "-shared",
                    "-fPIC", f"-I{standin}", "-o", str(caller_path), str(src)], check=True)
    caller = ctypes.CDLL(str(caller_path))
    d = ascmem.Device("atlas-training", device_id=6, memory=256 << 20)
    pl.configure(d)
    live = [d.malloc(n) for n in (100, 5000, 3 << 20, 40 << 20)]
    d.free(live.pop(1))
    fn = pl.load_snapshot_shim(shim)
    out = (ctypes.c_int64 * 4096)()
    n = caller.flatten(ctypes.c_uint64(fn), out, 4096)
    vals = list(out[:n])
    nseg, i, segs = vals[0], 1, []
    for _ in range(nseg):
        dev, addr, total, allocated, requested, large, nblocks = vals[i:i + 7]
        blocks = [tuple(vals[i + 7 + 3 * j:i + 10 + 3 * j]) for j in range(nblocks)]
        i += 7 + 3 * nblocks
        segs.append((dev, addr, total, allocated, requested, large, blocks))
    ours = [s for s in segs if s[0] == 6]
    assert len(ours) == 2  # the HUGE and NORMAL chunks of device 6
    snap = d.snapshot()
    for dev, addr, total, allocated, requested, large, blocks in ours:
        assert sum(b[0] for b in blocks) == total  # blocks cover the segment
        inside = [b for b in snap if addr <= b["address"] < addr + total]
        assert allocated == sum(b["size"] for b in inside)
        assert requested == sum(b["requested"] for b in inside)
        assert sorted(b[0] for b in blocks if b[2]) == sorted(b["size"] for b in inside)
    assert {s[5] for s in ours} == {0, 1}  # NORMAL is the small pool, HUGE the large
    for p in live:
        d.free(p)
    pl.unconfigure(6)


class _AllocatorOf:
    """The setters a torch_npu release's NPUPluggableAllocator.allocator()
    object has; records what each was given."""

    def __init__(self, setters):
        self.given = {}
        for name in setters:
            setattr(self, name, (lambda n: lambda address: self.given.__setitem__(n, address))(name))


_ALL_BUT_STATS = [s for s in pl.HOOKS if s not in ("set_get_device_stats_fn",
                                                   "set_reset_peak_status_fn")]


@pytest.mark.parametrize("release,setters,missing", [
    ("2.1", list(pl.HOOKS) + ["set_snapshot_fn"], []),
    ("2.2.0 .. 2.4.0, 2.5.1 .. 7.0.0", _ALL_BUT_STATS,
     ["set_reset_peak_status_fn", "set_get_device_stats_fn"]),
])
def test_set_hooks_sets_what_the_release_has_and_says_what_it_skipped(release, setters, missing):
    alloc = _AllocatorOf(setters)
    if missing:
        with pytest.warns(RuntimeWarning, match="set_get_device_stats_fn"):
            skipped = pl.set_hooks(alloc)
    else:
        skipped = pl.set_hooks(alloc)
    assert sorted(skipped) == sorted(missing)
    assert set(alloc.given) == set(setters) - {"set_snapshot_fn"}
    assert all(isinstance(a, int) and a for a in alloc.given.values())


def test_set_hooks_skips_the_snapshot_hook_where_there_is_no_setter():
    alloc = _AllocatorOf(_ALL_BUT_STATS)
    with pytest.warns(RuntimeWarning, match="set_snapshot_fn"):
        skipped = pl.set_hooks(alloc, snapshot_shim="/nonexistent/never/loaded.so")
    assert "set_snapshot_fn" in skipped
