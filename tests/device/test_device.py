"""The CANN memory rules, one test per rule (names say which)."""
import warnings

import pytest

import ascmem
from ascmem import MemAttr, MemKind, Policy, profiles
from ascmem.rules import GiB, MiB

P = Policy


def dev(model="atlas-inference", **kw):
    return ascmem.Device(model, **kw)


# ---- profiles -------------------------------------------------------------------

def test_profiles_known_names_and_aliases():
    assert "atlas-inference" in profiles.names() and "atlas-training" in profiles.names()
    for alias in ("atlas-300i", "atlas-500"):
        assert profiles.get(alias).name == "atlas-inference"
    assert profiles.get("atlas-200dk").name == "atlas-200"
    assert profiles.get("atlas-300t").name == "atlas-training"


def test_profiles_unknown_name_lists_the_known_ones():
    with pytest.raises(ascmem.InvalidArgumentError, match="atlas-inference"):
        profiles.get("atlas-9000")


def test_profile_inference_free_os_memory_matches_the_1940_mb_reserve():
    p = profiles.get("atlas-inference")
    assert p.huge_reserve() // MiB == 1940  # the seed's "about 1940 MB"


# ---- budgets ---------------------------------------------------------------------

def test_rule_huge_reserve_is_25_percent_of_free_os_memory_2mib_rounded():
    d = dev(free_os_memory=1001 * MiB)
    assert d.budget()["reserve"] == (1001 * MiB // 4) // (2 * MiB) * (2 * MiB)


def test_rule_ep_mode_grows_huge_memory_past_the_reserve_and_shrinks_it():
    d = dev(free_os_memory=400 * MiB, mode="EP")
    reserve = d.budget()["reserve"]
    a = d.malloc(reserve + 10 * MiB, P.HUGE_ONLY)
    b = d.budget()
    assert b["ep_growth"] > 0 and d.get_mem_info(MemAttr.DDR_MEM_HUGE)[1] > reserve
    d.free(a)
    assert d.budget()["ep_growth"] == 0
    assert d.get_mem_info(MemAttr.DDR_MEM_HUGE)[1] == reserve


def test_rule_rc_mode_never_grows_past_the_reserve():
    d = dev("atlas-200", free_os_memory=400 * MiB, mode="RC")
    reserve = d.budget()["reserve"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ascmem.OutOfMemoryError):
            d.malloc(reserve + 2 * MiB, P.HUGE_ONLY)
    d.malloc(reserve - 64 * 1024, P.HUGE_ONLY)
    d.check()


def test_rule_training_first_job_takes_the_aicpu_cache_once():
    d2 = dev("atlas-training", aicpu_cache=150 * MiB)
    assert d2.begin_job() == 150 * MiB
    assert d2.begin_job() == 0  # later jobs take nothing
    assert d2.budget()["fixed"] == 150 * MiB
    assert d2.stats()["device"]["aicpu_cache"] == 150 * MiB


def test_rule_aicpu_cache_default_is_the_upper_bound():
    d = dev("atlas-training")
    assert d.begin_job() == profiles.get("atlas-training").aicpu_cache[1]


def test_rule_aicpu_cache_must_lie_in_its_range():
    with pytest.raises(ascmem.InvalidArgumentError):
        dev("atlas-training", aicpu_cache=300 * MiB)
    with pytest.raises(ascmem.InvalidArgumentError):
        dev("atlas-inference", aicpu_cache=150 * MiB)


def test_rule_reset_invalidates_pointers_but_keeps_the_cache_until_a_restart():
    """shared/seed/memory-precautions.txt line 7: the AI CPU operator buffer
    is released when the device is restarted (not by aclrtResetDevice)."""
    d = dev("atlas-training")
    taken = d.begin_job()
    assert taken > 0
    a = d.malloc(4096)
    d.reset()
    assert d.budget()["fixed"] == taken and d.stats()["device"]["aicpu_cache"] == taken
    b = d.malloc(4096)
    assert b != a
    with pytest.raises(ascmem.InvalidFreeError):
        d.free(a)
    assert d.begin_job() == 0  # the cache is still there
    d.restart()
    assert d.budget()["fixed"] == 0
    with pytest.raises(ascmem.InvalidFreeError):
        d.free(b)
    assert d.begin_job() == taken  # the first job after a restart takes it again
    d.check()


# ---- policies --------------------------------------------------------------------

def test_policy_huge_first_threshold_compares_the_rounded_size():
    # the runtime compares what it is asked for, ALIGN_UP(size, 32) + 32 for
    # aclrtMalloc, with 1 MiB (hicann/runtime npu_driver_mem.cc 1035-1039)
    d = dev()
    assert d.kind_of(d.malloc(MiB - 64, P.HUGE_FIRST)) == MemKind.NORMAL   # 1 MiB - 32: not above
    assert d.kind_of(d.malloc(MiB - 32, P.HUGE_FIRST)) == MemKind.NORMAL   # exactly 1 MiB
    assert d.kind_of(d.malloc(MiB - 31, P.HUGE_FIRST)) == MemKind.HUGE     # 1 MiB + 32
    assert d.kind_of(d.malloc(MiB, P.HUGE_FIRST)) == MemKind.HUGE
    # aclrtMallocAlign32 asks for ALIGN_UP(size, 32): 1 MiB is not above
    assert d.kind_of(d.malloc_align32(MiB, P.HUGE_FIRST)) == MemKind.NORMAL
    assert d.kind_of(d.malloc_align32(MiB + 1, P.HUGE_FIRST)) == MemKind.HUGE


def test_policy_huge_first_falls_back_to_normal_with_a_warning():
    d = dev("atlas-200", free_os_memory=400 * MiB, mode="RC")
    reserve = d.budget()["reserve"]
    with pytest.warns(ascmem.PrecautionWarning):
        a = d.malloc(reserve + 4 * MiB, P.HUGE_FIRST)
    assert d.kind_of(a) == MemKind.NORMAL
    assert d.stats()["device"]["huge_fallbacks"] == 1


def test_policy_huge_only_raises_when_huge_runs_out():
    d = dev("atlas-200", free_os_memory=400 * MiB, mode="RC")
    with pytest.warns(ascmem.PrecautionWarning, match="reserve"):
        with pytest.raises(ascmem.OutOfMemoryError, match="HUGE"):
            d.malloc(300 * MiB, P.HUGE_ONLY)


def test_policy_normal_only():
    d = dev()
    assert d.kind_of(d.malloc(8 * MiB, P.NORMAL_ONLY)) == MemKind.NORMAL


def test_policy_p2p_unsupported_on_inference():
    d = dev()
    for p in (P.HUGE_FIRST_P2P, P.HUGE_ONLY_P2P, P.NORMAL_ONLY_P2P):
        with pytest.raises(ascmem.UnsupportedError):
            d.malloc(4096, p)


def test_policy_p2p_supported_on_training():
    d = dev("atlas-training")
    assert d.kind_of(d.malloc(4 * MiB, P.HUGE_ONLY_P2P)) == MemKind.HUGE
    assert d.kind_of(d.malloc(4096, P.NORMAL_ONLY_P2P)) == MemKind.NORMAL


def test_policy_huge1g_only_where_supported():
    with pytest.raises(ascmem.UnsupportedError):
        dev("atlas-training").malloc(4096, P.HUGE1G_ONLY)
    d = dev("atlas-a2-training")
    a = d.malloc(100, P.HUGE1G_ONLY)
    assert d.kind_of(a) == MemKind.HUGE1G
    assert d.usable_size(a) == 128  # 1G pages: 32-byte rounding, no extra 32 bytes
    assert d.budget()["huge_used"] == GiB


def test_policy_bandwidth_flags_alone_mean_huge_first():
    d = dev()
    for flag in (P.LOW_BAND_WIDTH, P.HIGH_BAND_WIDTH):
        assert d.kind_of(d.malloc(4 * MiB, flag)) == MemKind.HUGE
        assert d.kind_of(d.malloc(4096, flag)) == MemKind.NORMAL


def test_policy_with_a_flag_or_out_of_range_takes_the_default_route():
    # aclMallocMemInner compares the policy whole: anything but the eight
    # named values is RT_MEMORY_DEFAULT, huge pages first above 1 MiB with a
    # fallback to normal pages (hicann/runtime memory.cpp 320-342)
    d = dev()
    for policy in (P.HUGE_ONLY | P.HIGH_BAND_WIDTH, P.NORMAL_ONLY | P.LOW_BAND_WIDTH,
                   P.HUGE_ONLY | P.ACCESS_USER_SPACE_READONLY, 99, 0x7777, 0xFFFFFFFF):
        assert d.kind_of(d.malloc(4096, policy)) == MemKind.NORMAL, policy
        assert d.kind_of(d.malloc(4 * MiB, policy)) == MemKind.HUGE, policy
    # and falls back to normal pages when the huge ones run out
    rc = dev("atlas-200", free_os_memory=400 * MiB, mode="RC")
    reserve = rc.budget()["reserve"]
    rc.malloc(reserve - 64, P.HUGE_ONLY)
    with pytest.warns(ascmem.PrecautionWarning):
        assert rc.kind_of(rc.malloc(4 * MiB, P.HUGE_ONLY | P.LOW_BAND_WIDTH)) == MemKind.NORMAL


def test_policy_negative_is_an_invalid_argument():
    with pytest.raises(ascmem.InvalidArgumentError):
        dev().malloc(64, -1)


# ---- sizes and alignment ----------------------------------------------------------

@pytest.mark.parametrize("size", [1, 31, 32, 33, 100, 4096, 3 * MiB + 7])
def test_size_malloc_rounds_to_32_plus_32_at_64_alignment(size):
    d = dev()
    a = d.malloc(size)
    assert a % 64 == 0 and d.usable_size(a) == (size + 31) // 32 * 32 + 32


@pytest.mark.parametrize("size", [1, 32, 33, 4096, 3 * MiB + 7])
def test_size_malloc_align32_rounds_to_32(size):
    d = dev()
    a = d.malloc_align32(size)
    assert a % 64 == 0 and d.usable_size(a) == (size + 31) // 32 * 32


@pytest.mark.parametrize("size", [1, 100, 3_110_400, 5 * MiB])
def test_size_dvpp_rounds_to_32_plus_32_at_128_alignment_in_huge_pages(size):
    d = dev()
    a = d.dvpp_malloc(size)
    assert a % 128 == 0 and d.kind_of(a) == MemKind.DVPP
    assert d.usable_size(a) == (size + 31) // 32 * 32 + 32
    assert d.budget()["huge_used"] >= 2 * MiB and d.budget()["normal_used"] == 0


def test_size_zero_is_an_error_everywhere():
    d = dev()
    for call in (d.malloc, d.malloc_align32, d.dvpp_malloc, d.malloc_host):
        with pytest.raises(ascmem.InvalidArgumentError):
            call(0)


@pytest.mark.parametrize("model,window", [("atlas-a2-training", 16 * GiB),
                                          ("atlas-training", 4 * GiB)])
def test_media_window_exhaustion_while_other_memory_is_free(model, window):
    d = dev(model)  # more device memory than the media window
    assert d.profile.media_window == window
    blocks = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ascmem.OutOfMemoryError, match="DVPP"):
            for _ in range(window // GiB + 1):
                blocks.append(d.dvpp_malloc(GiB - 64))
    assert len(blocks) == window // GiB
    assert d.get_mem_info(MemAttr.HBM_MEM)[0] > 8 * GiB  # plenty left outside the window
    d.malloc(GiB)


def test_media_window_90_percent_warns_once():
    d = dev("atlas-a2-training")
    with pytest.warns(ascmem.PrecautionWarning, match="90%"):
        for _ in range(15):
            d.dvpp_malloc(GiB - 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d.dvpp_malloc(64)  # once per device and cause


def test_media_window_per_product_and_where_the_figure_comes_from():
    # [W] acldvppMalloc's page: 16 GB on A3, A2 and the inference series;
    # [W4] the others: the driver's 4 GB heap, an assumption
    for model, window, documented in [("atlas-a3", 16, True), ("atlas-a2-inference", 16, True),
                                      ("atlas-inference-series", 16, True),
                                      ("atlas-inference", 4, False), ("atlas-training", 4, False),
                                      ("atlas-200i-a2", 4, False)]:
        p = profiles.get(model)
        assert p.media_window == window * GiB, model
        text = " ".join(dev(model).precautions())
        assert f"({window} GB per process, " in text
        assert ("documented" in text) == documented and ("assumption" in text) != documented


def test_host_memory_comes_from_its_own_pool():
    d = dev()  # EP mode: the host's memory, not the device's
    h = d.malloc_host(1000)
    assert d.kind_of(h) == MemKind.HOST and h % 64 == 0 and d.usable_size(h) == 1000
    assert d.budget()["huge_used"] == d.budget()["normal_used"] == 0
    with pytest.raises(ascmem.InvalidFreeError):
        d.free(h)  # host memory goes back with free_host
    d.free_host(h)


def test_rc_mode_host_memory_is_device_memory():
    # RC: host and device are one; aclrtMallocHost takes the device's normal
    # pages, and a piece of a larger block needs ALIGN_UP(len, 32) + 32 at a
    # 64-byte start (hicann/runtime docs/zh/api_ref/11-02_host_memory_management.md 71-77)
    d = dev("atlas-200", mode="RC")
    before = d.get_mem_info(MemAttr.DDR_MEM_NORMAL)[0]
    h = d.malloc_host(1000)
    assert d.kind_of(h) == MemKind.HOST and h % 64 == 0
    assert d.usable_size(h) == 1056
    used = d.budget()["normal_used"]  # the host pool's pages, charged as normal ones
    assert used == d.stats()["host"]["pages_in_use"] * 4096 > 0
    assert d.get_mem_info(MemAttr.DDR_MEM_NORMAL)[0] == before - used
    d.free_host(h)
    d.empty_cache()
    assert d.budget()["normal_used"] == 0
    d.check()


# ---- media -> inference reuse -------------------------------------------------------

def test_reuse_media_output_as_model_input_same_address():
    d = dev()
    a = d.dvpp_malloc(3_110_400)
    assert d.as_model_input(a, 3_110_400) == a
    assert d.stats()["device"]["reused_bytes"] == 3_110_400


def test_reuse_refuses_host_freed_and_too_long():
    d = dev()
    a = d.dvpp_malloc(1000)
    with pytest.raises(ascmem.InvalidArgumentError, match="length"):
        d.as_model_input(a, 2000)
    h = d.malloc_host(1000)
    with pytest.raises(ascmem.InvalidArgumentError, match="host"):
        d.as_model_input(h, 100)
    d.dvpp_free(a)
    with pytest.raises(ascmem.InvalidArgumentError, match="live"):
        d.as_model_input(a, 100)


def test_reuse_refuses_a_start_not_128_aligned():
    d = dev()
    # 100 bytes take 160, a 192-byte slab slot: every other slot starts at 64 mod 128
    blocks = [d.malloc(100) for _ in range(4)]
    odd = [a for a in blocks if a % 128 == 64]
    even = [a for a in blocks if a % 128 == 0]
    assert odd and even
    with pytest.raises(ascmem.MisalignedError):
        d.as_model_input(odd[0], 100)
    assert d.as_model_input(even[0], 100) == even[0]


# ---- get_mem_info ----------------------------------------------------------------

def test_get_mem_info_free_plus_used_is_total_at_every_step():
    d = dev(free_os_memory=600 * MiB)
    addrs = []
    for i, (size, pol) in enumerate([(50 * MiB, 1), (1000, 2), (200 * MiB, 0), (120 * MiB, 1)]):
        addrs.append(d.malloc(size, pol))
        b = d.budget()
        free, total = d.get_mem_info(MemAttr.DDR_MEM)
        assert total - free == b["huge_used"] + b["normal_used"]
        hf, ht = d.get_mem_info(MemAttr.DDR_MEM_HUGE)
        assert ht - hf == b["huge_used"]
        nf, nt = d.get_mem_info(MemAttr.DDR_MEM_NORMAL)
        assert nt - nf == b["normal_used"]
        assert hf >= 0 and nf >= 0


def test_get_mem_info_on_ddr_chips_answers_hbm_attributes_with_ddr_figures():
    # hicann/runtime npu_driver_mem.cc 1622-1633 (g_memInfoTypeMap), 1893-1898
    for model in ("atlas-inference", "atlas-inference-series", "atlas-200i-a2"):
        d = dev(model)
        d.malloc(100_000, Policy.NORMAL_ONLY)
        for hbm, ddr in ((MemAttr.HBM_MEM, MemAttr.DDR_MEM), (MemAttr.HBM_MEM_HUGE, MemAttr.DDR_MEM_HUGE),
                         (MemAttr.HBM_MEM_NORMAL, MemAttr.DDR_MEM_NORMAL),
                         (MemAttr.HBM_MEM_P2P_HUGE, MemAttr.DDR_MEM_P2P_HUGE)):
            assert d.get_mem_info(hbm) == d.get_mem_info(ddr), (model, hbm)
        # attributes the runtime's table lacks read as DDR_MEM (std::map::operator[])
        for attr in (MemAttr.HBM_MEM_HUGE1G, MemAttr.MEM_NORMAL, MemAttr.MEM_HUGE1G):
            assert d.get_mem_info(attr) == d.get_mem_info(MemAttr.DDR_MEM), (model, attr)


def test_get_mem_info_on_hbm_chips():
    t = dev("atlas-training")
    assert t.get_mem_info(MemAttr.HBM_MEM)[1] == 32 * GiB
    assert t.get_mem_info(MemAttr.MEM_HUGE) == t.get_mem_info(MemAttr.HBM_MEM_HUGE)
    assert t.get_mem_info(MemAttr.DDR_MEM_HUGE) == (0, 0)  # the driver's answer is not public
    for attr in (MemAttr.HBM_MEM_HUGE1G, MemAttr.HBM_MEM_P2P_HUGE1G, MemAttr.MEM_HUGE1G,
                 MemAttr.MEM_P2P_HUGE1G):
        with pytest.raises(ascmem.UnsupportedError) as e:  # no 1 GiB pages on the 910
            t.get_mem_info(attr)
        assert e.value.code == 207000
    a2 = dev("atlas-a2-training")
    assert a2.get_mem_info(MemAttr.HBM_MEM_HUGE1G)[1] > 0
    assert dev().get_mem_info(MemAttr.DDR_MEM_P2P_HUGE) == (0, 0)  # no P2P on the 310


def test_get_mem_info_rejects_unknown_attribute_with_the_runtimes_code():
    for bad in (99, -1, 18):
        with pytest.raises(ascmem.InvalidArgumentError) as e:
            dev().get_mem_info(bad)
        assert e.value.code == 107016  # ACL_ERROR_RT_INVALID_MEMORY_TYPE
    for bad in ("HBM", 1.0, None, True):  # not an int: pyACL's own argument check
        with pytest.raises(ascmem.ArgumentTypeError):
            dev().get_mem_info(bad)
    from ascmem import acl
    acl.use(dev())
    try:
        assert acl.rt.get_mem_info(99) == (0, 0, 107016)
        assert acl.rt.get_mem_info(1)[2] == 0
    finally:
        acl.use(None)


# ---- precautions, devices, stats --------------------------------------------------------

def test_precautions_per_product_and_mode():
    inf = " ".join(dev().precautions())
    assert "1940 MB" in inf and "EP mode" in inf and "Media" in inf
    assert "RC mode" in " ".join(dev("atlas-200", mode="RC").precautions())
    assert "AI CPU" in " ".join(dev("atlas-training").precautions())
    assert "AI CPU" not in inf
    for model in ("atlas-a2-training", "atlas-a2-910b4", "atlas-a3"):  # [G]
        text = " ".join(dev(model).precautions())
        assert "reserves huge-page memory in advance" in text and "aclrtGetMemInfo" in text
        assert "300 MB" in text and "restart" in text
    assert "in advance" not in " ".join(dev("atlas-inference-series").precautions())


def test_products_from_the_platform_configs():
    # hicann/runtime src/platform/platform_config/cann/*.ini, memory_size
    assert profiles.get("atlas-inference-series").memory == 24_000_000_000
    assert profiles.get("ascend-910b4").memory == 34_359_738_368
    assert profiles.get("atlas-a2-training").memory == profiles.get("atlas-a3").memory == 64 * GiB
    duo = profiles.get("atlas-300i-duo")
    assert duo.memory == 48 * GiB and duo.media_window == 16 * GiB and duo.memory_type == "DDR"
    d = dev("atlas-a2-910b4")
    assert d.get_mem_info(MemAttr.HBM_MEM)[1] == 32 * GiB and d.profile.virtual_memory
    # RC is the Atlas 200 module's and DK's, not the 300I's or 500's
    assert profiles.get("atlas-200dk").modes == ("EP", "RC")
    for alias in ("atlas-inference", "atlas-300i", "atlas-500"):
        with pytest.raises(ascmem.UnsupportedError):
            dev(alias, mode="RC")
    # every source string names a source, or says assumption
    for name in profiles.names():
        src = profiles.get(name).source
        assert "[" in src or "assumption" in src, name


def test_mode_must_exist_on_the_product():
    with pytest.raises(ascmem.UnsupportedError):
        dev("atlas-training", mode="RC")


def test_multi_device_ranges_and_budgets_are_disjoint():
    d0, d1 = dev(device_id=0), dev(device_id=1)
    a = d0.malloc(5 * MiB)
    assert d1.budget()["huge_used"] == 0
    for k in MemKind:
        r0, r1 = d0.range_of(k), d1.range_of(k)
        if r0 and r1:
            assert r0[0] + r0[1] <= r1[0] or r1[0] + r1[1] <= r0[0]
    with pytest.raises(ascmem.InvalidFreeError):
        d1.free(a)


def test_stats_and_snapshot():
    d = dev()
    a = d.malloc(100)
    b = d.dvpp_malloc(5000)
    s = d.stats()
    assert s["normal"]["live_count"] == 1 and s["dvpp"]["live_count"] == 1
    assert {"reserve", "reserve_used", "ep_growth", "aicpu_cache", "reused_bytes"} <= set(s["device"])
    snap = d.snapshot()
    assert [(x["address"], x["kind"], x["requested"]) for x in snap] == sorted(
        [(a, MemKind.NORMAL, 160), (b, MemKind.DVPP, 5056)])


def test_bad_pointers_to_a_device():
    d = dev()
    a = d.malloc(1000)
    for bad in (a + 64, 12345, a + 1):
        with pytest.raises(ascmem.InvalidFreeError):
            d.free(bad)
    d.free(a)
    with pytest.raises(ascmem.InvalidFreeError):
        d.free(a)
    d.check()


def test_peaks_reset_and_the_limit_reads_back():
    d = ascmem.Device("atlas-training")
    p = d.malloc(8 << 20)
    d.free(p)
    assert d.stats()["huge"]["peak_used"] > 0
    d.reset_peak_memory_stats()
    assert d.stats()["huge"]["peak_used"] == 0 and d.budget()["peak_huge"] == 0
    assert d.get_limit() == 0 and d.get_memory_fraction() == 1.0
    d.set_memory_fraction(0.25)
    assert d.get_limit() == int(d.budget()["total"] * 0.25)
    assert abs(d.get_memory_fraction() - 0.25) < 1e-9
    pool = ascmem.Pool(1 << 26, base=1 << 32)
    pool.free(pool.alloc(1 << 20))
    assert pool.stats()["peak_used"] == 1 << 20
    pool.reset_peak_memory_stats()
    assert pool.stats()["peak_used"] == 0 and pool.stats()["peak_live_count"] == 0


@pytest.mark.parametrize("call", ["malloc_align32", "huge1g"])
def test_sub_allocated_blocks_keep_the_32_byte_tail(call):
    """hicann/runtime docs/api_docs/aclrtMallocAlign32.md lines 43-45: every
    piece cut from a larger block needs ALIGN_UP(len, 32) + 32 bytes at a
    64-byte start, whichever call made the block.  aclrtMallocAlign32 and
    the 1 GiB-page policies still report ALIGN_UP(len, 32)."""
    d = ascmem.Device("atlas-a2-training")
    alloc = (d.malloc_align32 if call == "malloc_align32" else
             lambda n: d.malloc(n, ascmem.Policy.HUGE1G_ONLY))
    for n in (1, 100, 4000, 40_000, 3 * MiB + 5):
        blocks = sorted(alloc(n) for _ in range(3))
        for a, b in zip(blocks, blocks[1:]):
            assert d.usable_size(a) == (n + 31) // 32 * 32  # the API-level rounding
            assert b - a >= d.usable_size(a) + 32            # and the tail before the next piece
            assert a % 64 == 0
    d.check()
