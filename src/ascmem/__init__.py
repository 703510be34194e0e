"""ascmem: a memory pool allocator for Huawei Ascend pipelines.

A C core (buddy, slabs, best fit) manages address ranges with out-of-band
metadata; Device applies the CANN memory rules on top.
"""

import os as _os

from ascmem import _moved

_moved.install()  # the module paths from before the subpackages keep working

from ascmem.errors import (AscmemError, ArgumentTypeError, ClosedError, CorruptionError,
                           DeviceClosedError, InUseError,
                           InvalidArgumentError, InvalidFreeError, IpcBusyError, IpcKeyError,
                           IpcPermissionError, MisalignedError, OutOfMemoryError,
                           PrecautionWarning, UnsupportedError)
from ascmem.rules import MemAttr, MemKind, Policy
from ascmem._core import BuddyAllocator, Device, Pool
from ascmem import profiles
from ascmem.stats import Statistics, statistics
from ascmem.tools.planner import plan

from ascmem._version import __version__


def get_include():
    """Directory holding ascmem.h and ascmem_capi.h, for C and Cython
    extensions that embed the core."""
    here = _os.path.dirname(__file__)
    installed = _os.path.join(here, "include")
    if _os.path.exists(_os.path.join(installed, "ascmem_capi.h")):
        return installed
    return _os.path.normpath(_os.path.join(here, "..", "..", "csrc"))  # a source checkout


__all__ = [
    "AscmemError", "ArgumentTypeError", "BuddyAllocator", "ClosedError", "CorruptionError",
    "Device",
    "DeviceClosedError", "InUseError",
    "InvalidArgumentError", "InvalidFreeError", "IpcBusyError", "IpcKeyError", "IpcPermissionError",
    "MemAttr", "MemKind", "MisalignedError",
    "OutOfMemoryError",
    "Policy", "Pool", "PrecautionWarning", "Statistics", "UnsupportedError", "get_include",
    "plan", "profiles", "statistics",
]
