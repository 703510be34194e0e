"""The C++ shim that makes an ascmem Device torch's CPU allocator: its
source ships beside this file and is compiled against the torch in use on
first use, with torch.utils.cpp_extension (ninja and a C++ compiler), then
cached: a later process with the same torch and the same source loads the
built library at once."""

import ctypes
import hashlib
import os
import threading

import torch  # absolute: the real torch, never this package

from ascmem import pluggable as _pl

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ascmem_torch_shim.cpp")
_lock = threading.Lock()
_lib = None


def cache_dir():
    """Where the built shim is kept: $ASCMEM_TORCH_CACHE, else
    ~/.cache/ascmem/torch, in a folder per torch version and source."""
    root = os.environ.get("ASCMEM_TORCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "ascmem", "torch")
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    return os.path.join(root, f"torch-{torch.__version__}-{digest}")


def load():
    """The shim as a ctypes library, built first if this torch has none yet
    (a few seconds; several processes building at once wait for one)."""
    global _lib
    with _lock:
        if _lib is None:
            build = cache_dir()
            path = os.path.join(build, "ascmem_torch_shim.so")
            try:  # built before for this torch and source (the folder's name says so)
                lib = ctypes.CDLL(path)
            except OSError:  # not yet, or another process is still writing it
                from torch.utils import cpp_extension  # imports setuptools: only to build
                os.makedirs(build, exist_ok=True)
                cpp_extension.load("ascmem_torch_shim", [SOURCE], extra_cflags=["-O2"],
                                   build_directory=build, is_python_module=False, verbose=False)
                lib = ctypes.CDLL(path)
            lib.ascmem_torch_bind.argtypes = [ctypes.c_uint64] * 3
            lib.ascmem_torch_set_index.argtypes = [ctypes.c_int]
            lib.ascmem_torch_use_index.argtypes = [ctypes.c_int]
            lib.ascmem_torch_use_index.restype = ctypes.c_int
            lib.ascmem_torch_installed.restype = ctypes.c_int
            lib.ascmem_torch_allocated.restype = ctypes.c_int64
            core = ctypes.CDLL(_pl.library_path())
            lib.ascmem_torch_bind(*(ctypes.cast(getattr(core, name), ctypes.c_void_p).value
                                    for name in ("ascmem_pluggable_try_alloc_cpu",
                                                 "ascmem_pluggable_free_requested",
                                                 "ascmem_pluggable_status_message")))
            _lib = lib
        return _lib
