"""CANN memory enums and the size/alignment rules of its allocation calls.

Values are CANN's own (CANN API reference: ``aclrtMemMallocPolicy``,
``aclrtMemAttr``, ``aclrtMalloc``, ``aclrtMallocAlign32``, ``acldvppMalloc``),
so a pyACL caller's integers mean the same here.
"""

import enum

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

HUGE_PAGE = 2 * MiB        # huge pages are granted in 2 MiB units
HUGE_PAGE_1G = 1 * GiB     # by the HUGE1G policies
NORMAL_PAGE = 4 * KiB
HUGE_FIRST_SMALL_LIMIT = 1 * MiB  # HUGE_FIRST: at most this many bytes go to normal pages

DEVICE_ALIGN = 64          # aclrtMalloc start address
MEDIA_ALIGN = 128          # acldvppMalloc / hi_mpi_dvpp_malloc start address
HOST_ALIGN = 64            # aclrtMallocHost start address


class Policy(enum.IntEnum):
    """``aclrtMemMallocPolicy``: base values in the low byte, flags above."""

    HUGE_FIRST = 0
    HUGE_ONLY = 1
    NORMAL_ONLY = 2
    HUGE_FIRST_P2P = 3
    HUGE_ONLY_P2P = 4
    NORMAL_ONLY_P2P = 5
    HUGE1G_ONLY = 6
    HUGE1G_ONLY_P2P = 7
    LOW_BAND_WIDTH = 0x100
    HIGH_BAND_WIDTH = 0x1000
    ACCESS_USER_SPACE_READONLY = 0x100000


POLICY_BASE_MASK = 0xFF
POLICY_FLAG_MASK = Policy.LOW_BAND_WIDTH | Policy.HIGH_BAND_WIDTH | Policy.ACCESS_USER_SPACE_READONLY
P2P_POLICIES = frozenset({Policy.HUGE_FIRST_P2P, Policy.HUGE_ONLY_P2P, Policy.NORMAL_ONLY_P2P,
                          Policy.HUGE1G_ONLY_P2P})
HUGE1G_POLICIES = frozenset({Policy.HUGE1G_ONLY, Policy.HUGE1G_ONLY_P2P})


class MemAttr(enum.IntEnum):
    """``aclrtMemAttr`` for ``aclrtGetMemInfo`` (CANN runtime API reference,
    ``aclcppdevg_03_1398``; pyACL ``aclpythondevg_01_0966``)."""

    DDR_MEM = 0
    HBM_MEM = 1
    DDR_MEM_HUGE = 2
    DDR_MEM_NORMAL = 3
    HBM_MEM_HUGE = 4
    HBM_MEM_NORMAL = 5
    DDR_MEM_P2P_HUGE = 6
    DDR_MEM_P2P_NORMAL = 7
    HBM_MEM_P2P_HUGE = 8
    HBM_MEM_P2P_NORMAL = 9
    HBM_MEM_HUGE1G = 10
    HBM_MEM_P2P_HUGE1G = 11
    # CANN 9.0 (pyACL page aclpythondevg_01_0966): chosen by the runtime, DDR or HBM
    MEM_NORMAL = 12
    MEM_HUGE = 13
    MEM_HUGE1G = 14
    MEM_P2P_NORMAL = 15
    MEM_P2P_HUGE = 16
    MEM_P2P_HUGE1G = 17


class MemKind(enum.IntEnum):
    """Which pool of a device a block lives in."""

    HUGE = 0
    NORMAL = 1
    DVPP = 2
    HOST = 3
    HUGE1G = 4  # 1 GiB pages (HUGE1G policies), only on products that have them


def align_up(n, a):
    return (n + a - 1) // a * a


def malloc_size(size):
    """aclrtMalloc / acldvppMalloc: round up to 32 bytes, then add 32."""
    return align_up(size, 32) + 32


def malloc_align32_size(size):
    """aclrtMallocAlign32: round up to 32 bytes, nothing added."""
    return align_up(size, 32)
