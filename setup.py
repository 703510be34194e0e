"""Builds the extensions -- ascmem._core from the hot path's bindings and the
C core, the modules off the hot path from their Cython sources alone -- and
installs the public C header beside the package (get_include())."""

import glob
import os
import shutil

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("csrc")

compile_args = ["-O3", "-fno-strict-aliasing", "-Wall", "-Wno-unused-function"]
link_args = []
if os.environ.get("ASCMEM_SANITIZE"):  # an ASan/UBSan build of the extension, for CI
    san = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-O1", "-g"]
    compile_args += san
    link_args += san
else:
    # No debug information (Python's CFLAGS ask for -g) and a stripped
    # symbol table: 5.9 MB -> about 1 MB, and a faster build.  The exported
    # pluggable functions stay in the dynamic symbol table.
    compile_args += ["-g0"]
    link_args += ["-s"]
if not os.environ.get("ASCMEM_SANITIZE") and os.environ.get("ASCMEM_NO_LTO") is None:
    # The hot path crosses pool.c, fit.c, slab.c and the bindings; link-time
    # optimisation inlines across them (13% fewer instructions per pair in the
    # C benchmark).  ASCMEM_NO_LTO=1 turns it off for toolchains without it.
    compile_args += ["-flto"]
    link_args += ["-flto", "-O3"]


class build_py_with_header(build_py):
    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "ascmem", "include")
        os.makedirs(dest, exist_ok=True)
        for header in ("ascmem.h", "ascmem_capi.h", "ascmem_acl_allocator.h",
                       os.path.join("torch_npu", "ascmem_npu_snapshot.cpp"),
                       os.path.join("torch_npu", "ascmem_npu_streams.cpp")):
            shutil.copy(os.path.join(HERE, CSRC, header), dest)


ext = Extension(
    "ascmem._core",
    sources=["src/ascmem/_core.pyx"] + sorted(glob.glob(os.path.join(CSRC, "*.c"))),
    include_dirs=[CSRC],
    extra_compile_args=compile_args,
    extra_link_args=link_args,
)

# The modules off the hot path need no link-time optimisation.
plain_compile_args = [a for a in compile_args if a != "-flto"]
plain_link_args = [a for a in link_args if a not in ("-flto", "-O3")]


def off_hot_path(name):
    """An extension of one Cython source.  It is never linked with csrc: the
    C core's state exists once in a process, in ascmem._core, and a module
    that needs the C core cimports the core_* functions _core.pxd exports."""
    return Extension(f"ascmem.{name}", sources=[f"src/ascmem/{name}.pyx"], include_dirs=[CSRC],
                     extra_compile_args=plain_compile_args, extra_link_args=plain_link_args)


modules = [
    off_hot_path("_upstream"),  # the backend contract (_Upstream), cimported by _core
    off_hot_path("_backend_sim"),  # the sim backend
    off_hot_path("_backend_host"),  # the host backend (mmap, through _core's CoreCalls)
    off_hot_path("_backend_acl"),  # the acl backend (pyACL)
    off_hot_path("_growth"),  # taking chunks and giving them back, cimported by _core
    off_hot_path("_streams"),  # the stream ledger, cimported by _core
    off_hot_path("_acl_paging"),  # acl physical memory under paged kinds, cimported by _core
    off_hot_path("_tags"),  # tagged blocks: sleep, wake, alignment, sharing; cimported by _core
    off_hot_path("_views"),  # a Device's block views and guard bytes, cimported by _core
    off_hot_path("_handed_sleep"),  # sleep and wake of blocks handed out to C callers
    off_hot_path("_acl_allocator"),  # the external allocator's slots bound to Devices
    off_hot_path("_tracecsv"),  # the compiled fast path of the CSV trace reader (trace/csvfile.py)
    off_hot_path("_tracejson"),  # the profiler-trace JSON scanner (trace/profiler.py)
    off_hot_path("_tracepair"),  # a PyTorch trace's allocations and frees paired by address
]

# The compiled peers of replay, fit and plan (best fit, torch_npu's caching
# allocator and expandable segments): C++ for its ordered sets, which keep
# free blocks in the order the Python references keep them with bisect.
replay_peers = Extension(
    "ascmem._replay_peers",
    sources=["src/ascmem/_replay_peers.pyx"],
    language="c++",
    extra_compile_args=plain_compile_args,
    extra_link_args=plain_link_args,
)

setup(
    ext_modules=cythonize([ext] + modules + [replay_peers], compiler_directives={"language_level": 3}),
    cmdclass={"build_py": build_py_with_header},
)
