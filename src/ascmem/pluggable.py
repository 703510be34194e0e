"""ascmem as the allocator of PyTorch / torch_npu, through their pluggable
allocator interfaces, which load C functions by name from a shared library.

    import ascmem, ascmem.pluggable as pl
    dev = ascmem.Device("atlas-a2-training")
    pl.configure(dev)                     # device index 0 -> dev
    alloc = torch_npu.npu.NPUPluggableAllocator(pl.library_path(), pl.ALLOC, pl.FREE)
    pl.set_hooks(alloc.allocator())       # init, reset, memory fraction, peaks
    torch_npu.npu.memory.change_current_allocator(alloc)

torch_npu's record_stream hook receives a c10_npu::NPUStream, which only C++
built against torch_npu can read; to honour record_stream, build the stream
shim and take alloc and free from it:

    shim = pl.build_stream_shim("libascmem_npu_streams.so")
    alloc = torch_npu.npu.NPUPluggableAllocator(shim, pl.STREAM_ALLOC, pl.STREAM_FREE)
    pl.set_hooks(alloc.allocator(), stream_shim=shim)

torch_npu is not available where ascmem is built and tested: the functions
are exercised through ctypes (tests/core/test_embedding.py), not through torch_npu.
"""

import ctypes
import os
import shutil
import subprocess
import warnings

import ascmem
from ascmem import _core

ALLOC = "ascmem_pluggable_alloc"
FREE = "ascmem_pluggable_free"
HOOKS = {
    "set_init_fn": "ascmem_pluggable_init",
    "set_reset_fn": "ascmem_pluggable_reset",
    "set_memory_fraction_fn": "ascmem_pluggable_memory_fraction",
    "set_base_alloc_fn": "ascmem_pluggable_base_alloc",
    "set_reset_peak_status_fn": "ascmem_pluggable_reset_peak_status",
    "set_get_device_stats_fn": "ascmem_pluggable_get_device_stats",
}
# get_device_stats returns torch_npu's DeviceStats by value, whose size
# depends on the build: 952 bytes (every released branch that has the hook,
# the default here) or 976 (master only, which adds num_sync_all_streams, num_device_alloc
# and num_device_free).  Pick with set_hooks(..., stats_layout=...): the
# smaller one is safe on both (the three newer counters then read wrong),
# the larger one on a 952-byte build would write past the caller's struct.
STATS_LAYOUTS = {"952": "ascmem_pluggable_get_device_stats",
                 "976": "ascmem_pluggable_get_device_stats_ext"}
# The snapshot hook returns SnapshotInfo, with std::vector members, which
# only C++ built against the user's torch_npu can make: a small C++ shim
# (snapshot_shim_source()) is compiled against it (build_snapshot_shim()) and
# handed over with set_hooks(..., snapshot_shim=path).
WALK = "ascmem_pluggable_walk"
# The record/erase-stream hooks take a c10_npu::NPUStream by value
# (Ascend/pytorch torch_npu/csrc/npu/Module.cpp lines 400, 407), which the
# Itanium C++ ABI passes by hidden reference (the class declares its own
# destructor, NPUStream.h line 27): only C++ built against torch_npu reads it.
# The stream shim (stream_shim_source()) does, and serves alloc and free so
# that a block freed while a recorded stream may still read it waits.
STREAM_ALLOC = "ascmem_npu_alloc"
STREAM_FREE = "ascmem_npu_free"
STREAM_HOOKS = {"set_record_stream_fn": "ascmem_npu_record_stream",
                "set_erase_stream_fn": "ascmem_npu_erase_stream"}

_configured = {}


def library_path():
    """The shared library that exports the pluggable functions."""
    return _core.__file__


def configure(device, index=None):
    """Makes the pluggable functions for a device index use this Device
    (index: the Device's device_id by default)."""
    index = device.device_id if index is None else index
    _core._pluggable_register(index, device)
    _configured[index] = device  # keeps it alive while registered


def unconfigure(index):
    _core._pluggable_register(index, None)
    _configured.pop(index, None)


def functions():
    """The exported functions through ctypes, with their prototypes."""
    lib = ctypes.CDLL(library_path())
    vp, sz, i, b, d = ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_bool, ctypes.c_double
    protos = {
        ALLOC: (vp, [sz, i, vp]), FREE: (None, [vp, sz, i, vp]),
        "ascmem_pluggable_init": (None, [i]), "ascmem_pluggable_reset": (None, [b]),
        "ascmem_pluggable_memory_fraction": (None, [d, i]),
        "ascmem_pluggable_base_alloc": (vp, [vp, ctypes.POINTER(ctypes.c_size_t)]),
        "ascmem_pluggable_record_stream": (None, [vp, vp]),
        "ascmem_pluggable_erase_stream": (None, [vp, vp]),
        # c10::DeviceIndex, int8_t (Module.cpp line 421)
        "ascmem_pluggable_reset_peak_status": (None, [ctypes.c_int8]),
    }
    return bind(lib, protos)


def bind(lib, protos):
    """{name: lib's exported function with its prototype} for protos,
    {name: (restype, argtypes)}."""
    out = {}
    for name, (res, args) in protos.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
        out[name] = fn
    return out


# Which torch_npu releases have which setter (their NPUPluggableAllocator):
# set_get_device_stats_fn and set_reset_peak_status_fn are missing from
# 2.2.0, 2.3.1, 2.4.0 and 2.5.1 up to 7.0.0; set_snapshot_fn exists on the
# 2.1 line only.  set_hooks looks at the object it is given, not at version
# numbers, so a release not listed here works the same way.


def set_hooks(allocator, stats_layout="952", snapshot_shim=None, stream_shim=None):
    """Hands every exported hook that a torch_npu NPUPluggableAllocator's
    allocator() object has a setter for (its set_*_fn methods take function
    addresses).  stats_layout: the size of DeviceStats in that torch_npu
    build (see STATS_LAYOUTS); snapshot_shim: a library built by
    build_snapshot_shim(), for the snapshot hook; stream_shim: one built by
    build_stream_shim(), for the record/erase-stream hooks (without it they
    are not set, and torch_npu's record_stream has no effect: allocate from
    the shim's STREAM_ALLOC and STREAM_FREE to honour it).  Setters the
    object lacks (older or newer torch_npu) are skipped, never an
    AttributeError: the names skipped are returned and said in one
    RuntimeWarning."""
    if stats_layout not in STATS_LAYOUTS:
        raise ValueError(f"stats_layout must be one of {sorted(STATS_LAYOUTS)}")
    lib = ctypes.CDLL(library_path())
    hooks = dict(HOOKS, set_get_device_stats_fn=STATS_LAYOUTS[stats_layout])
    skipped = []
    for setter, name in hooks.items():
        set_fn = getattr(allocator, setter, None)
        if set_fn is None:
            skipped.append(setter)
            continue
        set_fn(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)
    if stream_shim is not None:
        addresses = load_stream_shim(stream_shim)
        for setter in STREAM_HOOKS:
            set_fn = getattr(allocator, setter, None)
            if set_fn is None:
                skipped.append(setter)
            else:
                set_fn(addresses[setter])
    if snapshot_shim is not None:
        if hasattr(allocator, "set_snapshot_fn"):
            allocator.set_snapshot_fn(load_snapshot_shim(snapshot_shim))
        else:
            skipped.append("set_snapshot_fn")
    if skipped:
        warnings.warn(f"this torch_npu allocator has no {', '.join(skipped)}: those hooks are not "
                      f"set (torch's own answers stand for them)", RuntimeWarning, stacklevel=2)
    return skipped


def _shim_source(name):
    inc = ascmem.get_include()
    for path in (os.path.join(inc, name), os.path.join(inc, "torch_npu", name)):
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"{name} is not installed with ascmem")


def snapshot_shim_source():
    """Path of the C++ source of the snapshot hook (ascmem_npu_snapshot.cpp)."""
    return _shim_source("ascmem_npu_snapshot.cpp")


def stream_shim_source():
    """Path of the C++ source of the stream hooks (ascmem_npu_streams.cpp)."""
    return _shim_source("ascmem_npu_streams.cpp")


def build_snapshot_shim(output, include_dirs=None, header=None, cxx=None):
    """Compiles the snapshot hook into a shared library at output.
    include_dirs: torch's and torch_npu's include directories (by default
    taken from torch.utils.cpp_extension and the installed torch_npu);
    header: another header declaring c10_npu::NPUCachingAllocator's
    SnapshotInfo, SegmentInfo and BlockInfo (tests use a stand-in)."""
    return _build_shim(snapshot_shim_source(), "ASCMEM_NPU_HEADER", output, include_dirs,
                       header, cxx)


def build_stream_shim(output, include_dirs=None, header=None, cxx=None):
    """Compiles the stream hooks, with the alloc and free that honour them,
    into a shared library at output; the arguments as build_snapshot_shim's
    (header: another header declaring c10_npu::NPUStream)."""
    return _build_shim(stream_shim_source(), "ASCMEM_NPU_STREAM_HEADER", output, include_dirs,
                       header, cxx)


def _build_shim(source, header_macro, output, include_dirs, header, cxx):
    cxx = cxx or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise RuntimeError("no C++ compiler found")
    if include_dirs is None:
        from torch.utils import cpp_extension  # only where torch is installed
        import torch_npu
        include_dirs = list(cpp_extension.include_paths()) + [
            os.path.join(os.path.dirname(torch_npu.__file__), "include")]
    cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-o", os.fspath(output),
           source] + [f"-I{d}" for d in include_dirs]
    if header:
        cmd.append(f'-D{header_macro}="{header}"')
    subprocess.run(cmd, check=True)
    return os.fspath(output)


def load_snapshot_shim(path):
    """Loads a built shim, points it at ascmem's devices, and returns the
    address of its snapshot function (for set_snapshot_fn)."""
    shim = ctypes.CDLL(os.fspath(path))
    shim.ascmem_npu_snapshot_bind.argtypes = [ctypes.c_uint64]
    shim.ascmem_npu_snapshot_fn.restype = ctypes.c_uint64
    walk = ctypes.cast(getattr(ctypes.CDLL(library_path()), WALK), ctypes.c_void_p).value
    shim.ascmem_npu_snapshot_bind(walk)
    _shims.append(shim)  # keeps it loaded
    return shim.ascmem_npu_snapshot_fn()


def load_stream_shim(path):
    """Loads a built stream shim, points its alloc and free at ascmem's, and
    returns the addresses of its functions: {setter name: address} for
    STREAM_HOOKS, and STREAM_ALLOC / STREAM_FREE."""
    shim = ctypes.CDLL(os.fspath(path))
    shim.ascmem_npu_streams_bind.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    ours = ctypes.CDLL(library_path())
    shim.ascmem_npu_streams_bind(*(ctypes.cast(getattr(ours, n), ctypes.c_void_p).value
                                   for n in (ALLOC, FREE)))
    _shims.append(shim)
    names = dict(STREAM_HOOKS, alloc=STREAM_ALLOC, free=STREAM_FREE)
    return {k: ctypes.cast(getattr(shim, n), ctypes.c_void_p).value for k, n in names.items()}


_shims = []
