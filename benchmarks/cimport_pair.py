"""ns per allocate+free pair through `from ascmem._core cimport Pool` (the
C-level methods another Cython extension calls) against the same pair through
the Python methods, in one process.  Builds a small Cython extension in a
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
        c_ns, py_ns = [], []
        for _ in range(repeat):  # alternating, so drifts hit both
            t = time.perf_counter()
            cimport_bench.churn(pool, 64, n)
            c_ns.append((time.perf_counter() - t) / n * 1e9)
            m = n // 10
            alloc, free = pool.alloc, pool.free
            t = time.perf_counter()
            for _ in range(m):
                free(alloc(64))
            py_ns.append((time.perf_counter() - t) / m * 1e9)
        c, py = statistics.median(c_ns), statistics.median(py_ns)
        print(f"64 B allocate+free pair, median of {repeat}: cimport {c:.1f} ns, "
              f"Python methods {py:.1f} ns (with the for loop), {py / c:.1f}x")


if __name__ == "__main__":
    main()
