"""ns per allocate+free pair through `from ascmem._core cimport Pool` (the
C-level methods another Cython extension calls, by address and by handle)
against the same pair through the Python methods, in one process.  Builds a small Cython extension in a
temporary directory against the installed ascmem.

    python benchmarks/cimport_pair.py
"""
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import ascmem

PYX = """
# cython: language_level=3
from libc.stdint cimport uint64_t
from ascmem._core cimport Pool

def churn(Pool pool, uint64_t size, int n):
    cdef uint64_t addr = 0
    cdef int i
    for i in range(n):
        if pool.alloc_raw(size, 64, &addr) != 0 or pool.free_raw(addr) != 0:
            raise RuntimeError("allocation failed")

def churn_by_handle(Pool pool, uint64_t size, int n):
    cdef uint64_t addr = 0, handle = 0
    cdef int i
    for i in range(n):
        if pool.alloc_handle_raw(size, 64, &addr, &handle) != 0 or pool.free_handle_raw(handle) != 0:
            raise RuntimeError("allocation failed")
"""

SETUP = """
import os
from setuptools import Extension, setup
from Cython.Build import cythonize
import ascmem
site = os.path.dirname(os.path.dirname(ascmem.__file__))
setup(name="cimport_bench", script_args=["build_ext", "--inplace", "-q"],
      ext_modules=cythonize([Extension("cimport_bench", ["cimport_bench.pyx"],
                                       include_dirs=[ascmem.get_include()])],
                            include_path=[site], quiet=True))
"""


def main(n=1_000_000, repeat=7):
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "cimport_bench.pyx"), "w") as f:
            f.write(PYX)
        with open(os.path.join(d, "setup.py"), "w") as f:
            f.write(textwrap.dedent(SETUP))
        subprocess.run([sys.executable, "setup.py"], cwd=d, check=True, capture_output=True)
        sys.path.insert(0, d)
        import cimport_bench
        pool = ascmem.Pool(1 << 30, base=1 << 32)
        for size in (64, 1 << 20):
            c_ns, h_ns, py_ns = [], [], []
            for _ in range(repeat):  # alternating, so drifts hit all three
                t = time.perf_counter()
                cimport_bench.churn(pool, size, n)
                c_ns.append((time.perf_counter() - t) / n * 1e9)
                t = time.perf_counter()
                cimport_bench.churn_by_handle(pool, size, n)
                h_ns.append((time.perf_counter() - t) / n * 1e9)
                m = n // 10
                alloc, free = pool.alloc, pool.free
                t = time.perf_counter()
                for _ in range(m):
                    free(alloc(size))
                py_ns.append((time.perf_counter() - t) / m * 1e9)
            c, h, py = statistics.median(c_ns), statistics.median(h_ns), statistics.median(py_ns)
            print(f"{size} B allocate+free pair, median of {repeat}: cimport {c:.1f} ns, by "
                  f"handle {h:.1f} ns, Python methods {py:.1f} ns (with the for loop), "
                  f"{py / c:.1f}x")

if __name__ == "__main__":
    main()
