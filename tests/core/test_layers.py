"""The seams between the layers: the one kind table, the layout arithmetic in
profiles.py, the aclrtGetMemInfo table in rules.py, and what the installed
.pxd shows embedders."""
import os
import re

import pytest

import ascmem
from ascmem import profiles, rules
from ascmem._core import kind_table
from ascmem.errors import InvalidArgumentError
from ascmem.rules import GiB, MemAttr, MemKind, MiB, Policy


def test_kind_table_names_every_memkind():
    table = kind_table()
    assert list(table) == list(MemKind)
    for kind, info in table.items():
        assert info["name"] == kind.name.lower()


def test_kind_table_is_what_the_device_does():
    """Page size, huge charge and free call as a device applies them."""
    table = kind_table()
    dev = ascmem.Device("atlas-a2-training", memory=4 * GiB)
    calls = {MemKind.HUGE: lambda: dev.malloc(100, Policy.HUGE_ONLY),
             MemKind.NORMAL: lambda: dev.malloc(100, Policy.NORMAL_ONLY),
             MemKind.DVPP: lambda: dev.dvpp_malloc(100),
             MemKind.HOST: lambda: dev.malloc_host(100),
             MemKind.HUGE1G: lambda: dev.malloc(100, Policy.HUGE1G_ONLY)}
    frees = {"free": dev.free, "dvpp_free": dev.dvpp_free, "free_host": dev.free_host}
    for kind, info in table.items():
        assert dev.stats()[kind.name.lower()]["page_size"] == info["page_size"]
        before = dev.budget()
        addr = calls[kind]()
        after = dev.budget()
        charged_huge = after["huge_used"] - before["huge_used"]
        charged_normal = after["normal_used"] - before["normal_used"]
        if not info["device"]:
            assert charged_huge == charged_normal == 0
        else:  # whole pages of the kind's size (a small block's slab may span two)
            charged, other = (charged_huge, charged_normal) if info["huge"] else \
                (charged_normal, charged_huge)
            assert charged > 0 and charged % info["page_size"] == 0 and other == 0
        for name, free in frees.items():  # only its own call frees it
            if name != info["freed_by"]:
                with pytest.raises(ascmem.InvalidFreeError):
                    free(addr)
        frees[info["freed_by"]](addr)
    dev.check()


def test_layout_follows_the_profile():
    inf = profiles.get("atlas-200")
    ep = profiles.layout(inf, "EP")
    rc = profiles.layout(inf, "RC")
    assert ep.reserve == rc.reserve == inf.huge_reserve() > 0
    assert ep.sizes[MemKind.HUGE] == ep.reserve + ep.shared  # EP: huge may grow into shared
    assert rc.sizes[MemKind.HUGE] == rc.reserve              # RC: the reserve only
    assert ep.sizes[MemKind.HUGE1G] == 0 and ep.aicpu_cache == 0
    a2 = profiles.layout(profiles.get("atlas-a2-training"), "EP", memory=4 * GiB)
    assert a2.sizes[MemKind.HUGE1G] == 4 * GiB
    small = profiles.layout(profiles.get("atlas-a2-training"), "EP", runtime_sized=True)
    assert small.sizes[MemKind.HUGE1G] == 0 and small.sizes[MemKind.HOST] <= GiB
    with pytest.raises(InvalidArgumentError):
        profiles.layout(inf, "EP", free_os_memory=4 * MiB)
    with pytest.raises(InvalidArgumentError):
        profiles.layout(inf, "EP", aicpu_cache=1)  # atlas-inference has no AI CPU cache


def test_device_stats_agree_with_layout():
    prof = profiles.get("atlas-training")
    lay = profiles.layout(prof, "EP", host_memory=GiB)
    dev = ascmem.Device(prof.name, host_memory=GiB)
    stats = dev.stats()
    for kind in MemKind:
        if lay.sizes[kind]:
            assert stats[kind.name.lower()]["capacity"] == lay.sizes[kind]
        else:
            assert kind.name.lower() not in stats


@pytest.mark.parametrize("attr", list(MemAttr))
def test_mem_info_table_covers_every_attribute(attr):
    assert attr in rules.MEM_ATTR_POOL
    budget = ascmem.Device("atlas-a2-training").budget()
    free, total = rules.mem_info(attr, budget, "HBM", True, True)
    assert 0 <= free <= total


def test_policy_names():
    assert rules.policy_name(Policy.HUGE_FIRST | Policy.LOW_BAND_WIDTH) == "HUGE_FIRST|LOW_BAND_WIDTH"
    assert rules.policy_name(None) == "-"
    assert rules.policy_name(0x77) == "119"


def test_installed_pxd_shows_raw_methods_not_private_fields():
    pxd = open(os.path.join(os.path.dirname(ascmem._core.__file__), "_core.pxd")).read()
    body = pxd.split("cdef class _DeviceReadout:")[1].split("\ncdef class Pool")[0]
    body = body.split("\ncdef class BuddyAllocator")[0].replace("cdef class Device(_DeviceReadout):", "")
    declared = re.findall(r"^\s+cdef\s+(?:readonly\s+)?[\w *]+?\b(\w+)\s*(?:\(|$|,)", body, re.M)
    assert set(declared) <= {"_d", "_parts", "device_id", "profile", "mode", "backend",
                             "__weakref__", "malloc_raw", "free_raw"}, declared
    assert "malloc_raw" in declared and "free_raw" in declared


def test_buddy_ranges_are_limited_to_32_bit_units():
    with pytest.raises(InvalidArgumentError):
        ascmem.BuddyAllocator((1 << 32) * 4096, min_block=4096)
    b = ascmem.BuddyAllocator(1 << 40, min_block=1 << 20)  # 2^20 units: fine
    b.free(b.alloc(5 << 20))
    b.check()
