"""ascmem: a memory pool allocator for Huawei Ascend pipelines.

A C core (buddy, slabs, best fit) manages address ranges with out-of-band
metadata; Device applies the CANN memory rules on top.
"""

import os as _os

from ascmem.errors import (AscmemError, ArgumentTypeError, CorruptionError, InvalidArgumentError,
                           InvalidFreeError, OutOfMemoryError, PrecautionWarning,
                           UnsupportedError)
from ascmem.rules import MemAttr, MemKind, Policy
from ascmem._core import BuddyAllocator, Device, Pool
from ascmem import profiles

__version__ = "0.1.0"


def get_include():
    """Directory holding ascmem.h, for C extensions that embed the core."""
    return _os.path.join(_os.path.dirname(__file__), "include")


__all__ = [
    "AscmemError", "ArgumentTypeError", "BuddyAllocator", "CorruptionError", "Device",
    "InvalidArgumentError", "InvalidFreeError", "MemAttr", "MemKind", "OutOfMemoryError",
    "Policy", "Pool", "PrecautionWarning", "UnsupportedError", "get_include", "profiles",
]
