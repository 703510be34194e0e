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

static PyMethodDef methods[] = {
    {"roundtrip", roundtrip, METH_VARARGS, NULL},
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
    p.check()


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
