"""CANN memory enums, policy names and the aclrtGetMemInfo attribute table.

Values are CANN's own (CANN API reference: ``aclrtMemMallocPolicy``,
``aclrtMemAttr``, ``aclrtMalloc``, ``aclrtMallocAlign32``, ``acldvppMalloc``),
so a pyACL caller's integers mean the same here.
"""

import enum

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Page sizes, request rounding and alignment are the C core's (csrc/kinds.c,
# ascm_device_route in csrc/device.c); ascmem._core.kind_table() shows them.
MEDIA_ALIGN = 128          # acldvppMalloc / hi_mpi_dvpp_malloc start address: model input rule


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


def policy_name(policy):
    """An aclrtMemMallocPolicy value as its names ("HUGE_FIRST|LOW_BAND_WIDTH");
    None: "-" (calls that take no policy); anything else: its repr."""
    if policy is None:
        return "-"
    try:
        p = int(policy)
        base = Policy(p & POLICY_BASE_MASK).name
        flags = [f.name for f in (Policy.LOW_BAND_WIDTH, Policy.HIGH_BAND_WIDTH,
                                  Policy.ACCESS_USER_SPACE_READONLY) if p & f]
        return "|".join([base] + flags)
    except (ValueError, TypeError):
        return repr(policy)


# aclrtGetMemInfo: which memory each aclrtMemAttr reports on.  The DDR_* and
# HBM_* attributes (0-11) apply to chips of that memory type only; the CANN
# 9.0 ones (12-17) to whichever the chip has.  "p2p_" ones need a product with
# P2P, "huge1g" ones one with 1 GiB pages.
MEM_ATTR_TYPE = {a: ("HBM" if a in (1, 4, 5, 8, 9, 10, 11) else "DDR") for a in range(12)}
MEM_ATTR_POOL = {0: "all", 1: "all", 2: "huge", 3: "normal", 4: "huge", 5: "normal",
                 6: "p2p_huge", 7: "p2p_normal", 8: "p2p_huge", 9: "p2p_normal", 10: "huge1g",
                 11: "p2p_huge1g", 12: "normal", 13: "huge", 14: "huge1g", 15: "p2p_normal",
                 16: "p2p_huge", 17: "p2p_huge1g"}
# Chips whose memory is DDR (Ascend 310, 310P, 310B: MAP_WHEN_GET_INFO in
# hicann/runtime src/runtime/config/{mini,dc,mini_v3}/dev_info_reg.cc) answer
# an HBM attribute with its DDR twin (g_memInfoTypeMap, npu_driver_mem.cc
# lines 1622-1633, applied at 1893-1898).  The table is read with
# std::map::operator[], so an attribute it lacks (10, 11 and 12-17) reads as
# 0, DDR_MEM: the whole memory.
DDR_TWIN = {0: 0, 1: 0, 2: 2, 3: 3, 4: 2, 5: 3, 6: 6, 7: 7, 8: 6, 9: 7}


def mem_info(attr, budget, memory_type, p2p, huge1g):
    """(free, total) bytes aclrtGetMemInfo reports for attr on a device with
    this budget (Device.budget()).  An attribute outside aclrtMemAttr raises
    InvalidMemoryTypeError (107016); a 1 GiB-page one on an HBM chip without
    1 GiB pages UnsupportedError (207000: CheckIfSupport1GHugePage,
    npu_driver_mem.cc lines 1920-1927 and 2447-2457); DDR chips answer HBM
    attributes with DDR figures (DDR_TWIN).  Memory the chip lacks otherwise
    (DDR attributes on an HBM chip, P2P without P2P) reports (0, 0): the
    driver's answer there is not in the public sources."""
    from ascmem.errors import ArgumentTypeError, InvalidMemoryTypeError, UnsupportedError
    if isinstance(attr, bool) or not isinstance(attr, int):
        raise ArgumentTypeError(f"aclrtMemAttr is an int, not {attr!r}")
    try:
        a = int(MemAttr(attr))
    except (ValueError, TypeError):
        raise InvalidMemoryTypeError(f"unknown aclrtMemAttr value {attr!r} (the runtime takes "
                                     f"{MemAttr.DDR_MEM.value}-{MemAttr.MEM_P2P_HUGE1G.value})") \
            from None
    if memory_type == "DDR":
        a = DDR_TWIN.get(a, MemAttr.DDR_MEM)
    elif MEM_ATTR_POOL[a].endswith("huge1g") and not huge1g:
        raise UnsupportedError(f"aclrtGetMemInfo({MemAttr(a).name}): this chip has no 1 GiB pages")
    if a in MEM_ATTR_TYPE and MEM_ATTR_TYPE[a] != memory_type:
        return (0, 0)
    which = MEM_ATTR_POOL[a]
    if which.startswith("p2p_"):
        if not p2p:
            return (0, 0)
        which = which[4:]
    if which == "huge1g" and not huge1g:
        return (0, 0)
    b = budget
    growth = b["ep_growth"]
    left = b["shared"] - b["fixed"] - b["normal_used"] - growth
    if which == "all":
        total = b["total"] if not b["limit"] else min(b["total"], b["limit"])
        used = b["huge_used"] + b["normal_used"] + b["fixed"]
    elif which == "normal":
        total = b["shared"] - b["fixed"] - growth
        used = b["normal_used"]
    elif b["reserve"]:
        # a reserve product reports the huge-page pool as it is now: the
        # reserve plus whatever EP mode grew it by
        total = b["reserve"] + growth
        used = b["huge_used"]
    else:
        total = b["huge_used"] + left
        used = b["huge_used"]
    total = max(total, used)
    return (total - used, total)
