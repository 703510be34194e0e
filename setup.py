"""Builds the one extension, ascmem._core, from the Cython bindings and the C
core, and installs the public C header beside the package (get_include())."""

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

# The compiled fast path of the CSV trace reader (src/ascmem/trace_csv.py).
tracecsv = Extension(
    "ascmem._tracecsv",
    sources=["src/ascmem/_tracecsv.pyx"],
    extra_compile_args=[a for a in compile_args if a != "-flto"],
    extra_link_args=[a for a in link_args if a not in ("-flto", "-O3")],
)

# The profiler-trace (JSON) scanner and the pairing by address of the
# PyTorch trace importer (src/ascmem/trace_import.py).
tracejson = Extension(
    "ascmem._tracejson",
    sources=["src/ascmem/_tracejson.pyx"],
    extra_compile_args=[a for a in compile_args if a != "-flto"],
    extra_link_args=[a for a in link_args if a not in ("-flto", "-O3")],
)
tracepair = Extension(
    "ascmem._tracepair",
    sources=["src/ascmem/_tracepair.pyx"],
    extra_compile_args=[a for a in compile_args if a != "-flto"],
    extra_link_args=[a for a in link_args if a not in ("-flto", "-O3")],
)

# The compiled peers of replay, fit and plan (best fit, torch_npu's caching
# allocator and expandable segments): C++ for its ordered sets, which keep
# free blocks in the order the Python references keep them with bisect.
replay_peers = Extension(
    "ascmem._replay_peers",
    sources=["src/ascmem/_replay_peers.pyx"],
    language="c++",
    extra_compile_args=[a for a in compile_args if a != "-flto"],
    extra_link_args=[a for a in link_args if a not in ("-flto", "-O3")],
)

setup(
    ext_modules=cythonize([ext, tracecsv, tracejson, tracepair, replay_peers], compiler_directives={"language_level": 3}),
    cmdclass={"build_py": build_py_with_header},
)
