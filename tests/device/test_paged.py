"""Paged pools: a virtual range with physical memory mapped in granules only
where live bytes are (csrc/paging.c)."""
import os
import random
import subprocess
import sys

import pytest

import ascmem
from ascmem import trace as tr
from ascmem.errors import InvalidArgumentError, OutOfMemoryError
from conftest import BASE, MiB, ROOT

G = 64 << 10


def granules_touched(live, g):
    """Granules holding a live byte, computed from the blocks themselves."""
    touched = set()
    for addr, size in live.items():
        touched.update(range((addr - BASE) // g, (addr - BASE + size - 1) // g + 1))
    return len(touched)


def test_mapped_follows_the_live_blocks():
    p = ascmem.Pool(256 * MiB, base=BASE, granule=G)
    assert p.granule == G and p.page_size == G
    rng = random.Random(5)
    live = {}
    for i in range(3000):
        if live and rng.random() < 0.48:
            addr = rng.choice(list(live))
            del live[addr]
            p.free(addr)
        else:
            n = rng.choice((rng.randrange(1, 2000), rng.randrange(1, 400_000)))
            addr = p.alloc(n)
            live[addr] = p.usable_size(addr)
        if i % 97 == 0:
            s = p.stats()
            # slab storage counts as a block: mapped covers at least the live blocks
            assert s["mapped"] >= granules_touched(live, G) * G
            assert s["mapped"] == s["pages_in_use"] * G  # no threshold: nothing kept
    p.check()
    for addr in live:
        p.free(addr)
    p.trim()  # spare slabs give their granules back
    s = p.stats()
    assert s["mapped"] == 0 and s["map_calls"] > 0 and s["unmap_calls"] > 0
    assert s["peak_mapped"] >= G


@pytest.mark.parametrize("size", [4 * MiB, 64 * MiB])
def test_release_threshold_keeps_free_granules_mapped_until_trim(size):
    p = ascmem.Pool(size, base=BASE, granule=G, release_threshold=4 * G)
    a = p.alloc(5 * G)  # under six granules: at the low end of its region (fit.c)
    assert p.stats()["mapped"] == 5 * G
    p.free(a)
    s = p.stats()
    assert s["mapped"] == 4 * G and s["pages_in_use"] == 0  # four kept, one unmapped
    calls = s["map_calls"]
    b = p.alloc(5 * G)  # the same region, where the kept granules are: they serve
    assert p.stats()["map_calls"] == calls + 1 and p.stats()["mapped"] == 5 * G
    p.free(b)
    c = p.alloc(3 * G)  # in the large blocks' region, in the kept granules: no map call
    assert p.stats()["map_calls"] == calls + 1
    p.free(c)
    assert p.trim() >= 4 * G
    assert p.stats()["mapped"] == 0
    p.check()


def test_paged_pools_place_small_and_large_blocks_in_two_regions():
    """Blocks under a granule go to the lower region of the range, blocks of
    a granule or more to the upper one (pool_lifecycle.c); a request larger
    than a region joins free regions; a range of under 4 granules keeps one."""
    p = ascmem.Pool(64 * MiB, base=BASE, granule=G)  # 1024 granules: two regions of 32 MiB
    region = lambda addr: (addr - BASE) // (32 * MiB)
    blocks = {n: p.alloc(n) for n in (100, G // 2, G, 3 * G // 2, 2 * G, 5 * G, 40 * G)}
    assert [region(a) for a in blocks.values()] == [0, 0, 1, 1, 1, 1, 1]
    for a in list(blocks.values())[2:]:
        p.free(a)
    big = p.alloc(40 * MiB)  # over two regions
    assert p.usable_size(big) == 40 * MiB and region(big) == 0
    p.check()
    for a in list(blocks.values())[:2] + [big]:
        p.free(a)
    p.trim()  # a spare slab of the 32 KiB class (larger than a granule)
    assert p.stats()["largest_free"] == 64 * MiB and p.stats()["mapped"] == 0
    whole = p.alloc(64 * MiB)
    assert whole == BASE
    p.free(whole)
    small = ascmem.Pool(3 * G, base=BASE, granule=G)  # 3 granules: one region, best fit
    assert [small.alloc(n) - BASE for n in (G, G // 2)] == [0, G]


def test_contiguous_pools_report_no_mapping():
    p = ascmem.Pool(64 * MiB, base=BASE)
    assert p.granule == 0 and "mapped" not in p.stats()


@pytest.mark.parametrize("kw", [dict(granule=3 * G), dict(granule=1024), dict(granule=0),
                                dict(release_threshold=G),
                                dict(granule=G, page_size=2 * G)])
def test_bad_paged_configurations_are_refused(kw):
    with pytest.raises(InvalidArgumentError):
        ascmem.Pool(64 * MiB, base=BASE, **kw)


def test_running_out_of_range_leaves_mapping_intact():
    p = ascmem.Pool(4 * MiB, base=BASE, granule=G)
    a = p.alloc(3 * MiB)
    before = p.stats()
    with pytest.raises(OutOfMemoryError):
        p.alloc(2 * MiB)
    assert p.stats()["mapped"] == before["mapped"]
    p.free(a)
    p.check()


def test_reset_unmaps_everything():
    p = ascmem.Pool(64 * MiB, base=BASE, granule=G, release_threshold=G)
    p.alloc(5 * G)
    p.free(p.alloc(G))
    p.reset()
    assert p.stats()["mapped"] == 0
    p.check()


def test_physical_efficiency_of_the_real_traces():
    """The figures BENCHMARKS.md quotes, pinned so that a placement change
    that loses physical efficiency on a real trace is seen."""
    floor = {"resnet50_multires": (0.97, 0.995), "encoder_varlen": (0.96, 0.995),
             # 0.985 at 64 KiB since blocks of six granules and more go to the
             # top of their hole (0.990 before; fit.c, large blocks from the top)
             "decoder_kvcache": (0.93, 0.98),
             "unet_multires": (0.99, 0.995),
             # 0.979 at 2 MiB in two regions (0.981 in 16 class regions of a
             # 64 GiB range, 0.979 in a range of 4x its peak)
             "vit_train": (0.975, 0.995),
             # below the 0.95 at 2 MiB (bound 0.936): 7.5 MiB live, in
             # many small blocks; 0.99 at 64 KiB since the position rule
             # covers its blocks of 9 granules (fit.c)
             "seq2seq_generate": (0.62, 0.99),
             "resnet18_train": (0.965, 0.995), "gru_lm": (0.99, 0.995),
             "mobilenet_multires": (0.97, 0.995), "bert_train": (0.96, 0.995),
             # at its bound at 2 MiB: 19.0 MiB live in 10 granules, since
             # sizes freed before go to mapped granules first (0.864 before)
             "decoder_static_cache": (0.95, 0.995),
             # recorded after the rule above, held out to judge it; the speech
             # model is below 0.95 at 2 MiB (bound 0.977), nothing tuned on it
             "diffusion_denoise": (0.96, 0.995), "speech_to_text": (0.905, 0.995),
             # recorded in the sixteenth session, after every rule in the code
             "convnext_multires": (0.98, 0.995), "lstm_tagger_train": (0.99, 0.995),
             # recorded in the eighteenth session, after every rule in the code:
             # both below 0.95 at 2 MiB (bounds 0.9995 and 0.989), and the serving
             # trace's KV caches grown by torch.cat below 0.99 at 64 KiB (0.989)
             "moe_train": (0.925, 0.994), "llm_serving": (0.915, 0.985)}
    for name, (at_2m, at_64k) in floor.items():
        t = tr.example(name)
        eff2, mapped2 = tr.physical_efficiency(t, 2 * MiB)
        eff64, mapped64 = tr.physical_efficiency(t, 64 << 10)
        assert eff2 >= at_2m and eff64 >= at_64k, (name, eff2, eff64)
        assert mapped64 <= mapped2 and mapped64 >= t.peak_live()


def test_replay_reports_the_physical_side():
    t = tr.example("encoder_varlen")
    report = tr.replay(t, tr.paged_pool(t, 2 * MiB))
    assert report["granule"] == 2 * MiB
    assert report["peak_mapped"] >= report["peak_live"]
    assert report["physical_efficiency"] == report["peak_live"] / report["peak_mapped"]
    assert report["map_calls"] > 0


# ---- Device(paged=True) -----------------------------------------------------------

def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_paged_device_gives_pages_back_to_the_os():
    """Host backend: RSS and the budget follow the live blocks, not the range."""
    d = ascmem.Device("atlas-a2-training", memory=8 << 30, backend="host", paged=True)
    assert d.paged and d.budget()["huge_used"] == 0
    before = _rss()
    blocks = [d.malloc(32 * MiB, ascmem.Policy.HUGE_ONLY) for _ in range(4)]
    for b in blocks:
        d.as_array(b, 32 * MiB)[:] = 7  # touch every page
    grown = _rss() - before
    assert grown >= 120 * MiB
    assert d.budget()["huge_used"] == d.stats()["huge"]["mapped"] >= 128 * MiB
    for b in blocks:
        d.free(b)
    assert _rss() - before < 16 * MiB  # the pages went back at unmap
    assert d.budget()["huge_used"] == 0 and d.stats()["huge"]["mapped"] == 0
    d.check()
    d.close()


def test_paged_device_unmapped_memory_is_inaccessible():
    """Granules with no live block are PROT_NONE: a stray write through an old
    pointer faults instead of landing in memory another block will get."""
    import subprocess
    import sys
    code = ("import ascmem, ctypes\n"
            "d = ascmem.Device('atlas-a2-training', memory=8 << 30, backend='host', paged=True)\n"
            "a = d.malloc(8 << 20, 1); d.free(a)\n"
            "ctypes.memset(a, 1, 16)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    # killed by SIGSEGV (under AddressSanitizer: its report of the SEGV, exit 1)
    assert r.returncode < 0 or (r.returncode != 0 and b"SEGV" in r.stderr), r.stderr[-2000:]


def test_paged_sim_device_counts_mapped_memory():
    d = ascmem.Device("atlas-a3", memory=8 << 30, paged=True)
    a = d.malloc(5 * MiB, ascmem.Policy.HUGE_ONLY)
    s = d.stats()["huge"]
    assert s["mapped"] == 6 * MiB and s["map_calls"] == 1
    assert d.budget()["huge_used"] == 6 * MiB
    free, total = d.get_mem_info(ascmem.MemAttr.HBM_MEM_HUGE)
    assert total - free == 6 * MiB
    d.free(a)
    assert d.stats()["huge"]["mapped"] == 0
    assert "mapped" not in d.stats()["dvpp"]  # media memory stays contiguous
    d.check()


def test_paged_device_release_threshold_and_empty_cache():
    d = ascmem.Device("atlas-a2-inference", memory=8 << 30, paged=True,
                      release_threshold=8 * MiB)
    d.free(d.malloc(20 * MiB, ascmem.Policy.HUGE_ONLY))
    assert d.stats()["huge"]["mapped"] == 8 * MiB == d.budget()["huge_used"]
    assert d.empty_cache() >= 8 * MiB
    assert d.stats()["huge"]["mapped"] == 0
    d.check()


@pytest.mark.parametrize("model, backend, mode", [("atlas-inference", "sim", None),
                                                  ("atlas-200", "host", "EP"),
                                                  ("atlas-200i-a2", "sim", "RC")])
def test_paged_needs_virtual_memory(model, backend, mode):
    """The Ascend 310 products have no virtual memory calls, and the Atlas
    200I/500 A2 refuses them in RC mode (hicann/runtime
    docs/zh/api_ref/11-04_virtual_memory_management.md, profiles [V])."""
    with pytest.raises(ascmem.UnsupportedError) as e:
        ascmem.Device(model, backend=backend, mode=mode, paged=True)
    assert e.value.code == 207000 and "virtual memory" in str(e.value)
    assert ("RC mode" in str(e.value)) == (mode == "RC")


@pytest.mark.parametrize("model, mode", [("atlas-training", None), ("atlas-inference-series", None),
                                         ("atlas-300i-duo", None), ("atlas-200i-a2", "EP"),
                                         ("atlas-a2-910b4", None), ("atlas-a3", None)])
def test_paged_on_every_product_the_runtime_documents(model, mode):
    """[V]: the seven calls' product tables list the Atlas training series
    (910) and inference series (310P) and the 200I/500 A2 beside A2, A3 and
    950 (the older page named A2, A3 and 950 only)."""
    d = ascmem.Device(model, mode=mode, paged=True)
    assert d.paged and d.profile.virtual_memory_in(d.mode)
    a = d.malloc(5 * MiB, ascmem.Policy.HUGE_ONLY)
    assert d.stats()["huge"]["mapped"] == 6 * MiB
    d.free(a)
    assert d.stats()["huge"]["mapped"] == 0
    d.check()


def test_a_runtime_without_virtual_memory_is_unsupported_not_an_upstream_failure():
    """A driver without the calls makes the runtime answer 207000
    (ACL_ERROR_RT_FEATURE_NOT_SUPPORT) at aclrtReserveMemAddress: paged=True
    is UnsupportedError, and what the constructor had taken goes back."""
    import fake_acl
    acl = fake_acl.make()
    acl.fail = lambda name, size: 207000 if name == "rt.reserve_mem_address" else 0
    with pytest.raises(ascmem.UnsupportedError) as e:
        ascmem.Device("atlas-a2-training", backend="acl", acl_module=acl, paged=True)
    assert e.value.code == 207000 and "virtual memory" in str(e.value)
    assert not acl.live and not acl.reserved


def _acl_paged(**kw):
    import fake_acl
    acl = fake_acl.make()
    return acl, ascmem.Device("atlas-a2-training", backend="acl", acl_module=acl, paged=True, **kw)


def test_paged_acl_device_maps_runtime_memory_under_live_blocks():
    """The recording stand-in: aclrtReserveMemAddress for the ranges, one
    aclrtMallocPhysical + aclrtMapMem per 2 MB granule, undone at free."""
    acl, d = _acl_paged()
    assert acl.reserved and not acl.physical
    a = d.malloc(5 * MiB, ascmem.Policy.HUGE_ONLY)
    b = d.malloc(100)  # normal pages: mapped in 2 MB granules too
    assert len(acl.mapped) == len(acl.physical) == 3 + 1
    assert d.stats()["huge"]["mapped"] == 6 * MiB and d.budget()["huge_used"] == 6 * MiB
    d.check()
    d.free(a)
    d.free(b)
    assert not acl.mapped and not acl.physical
    d.check()
    d.close()
    assert not acl.reserved  # every range released


def test_paged_acl_physical_memory_is_asked_for_with_the_runtimes_props():
    """aclrtMallocPhysical takes an aclrtPhysicalMemProp that must not be null:
    handle type NONE, allocation PINNED, location DEVICE and the device id,
    and a memory attribute the runtime accepts for device memory (the
    stand-in checks what hicann/runtime's memory.cpp checks).  Each kind
    asks for its own pages: ACL_MEM_HUGE, ACL_MEM_NORMAL, and ACL_MEM_HUGE1G
    in whole 1 GB pieces.  (ascmem passed no prop at all before, which the
    stand-in did not check and the runtime refuses.)"""
    import fake_acl
    acl = fake_acl.make(granule=4 * MiB)  # what aclrtMemGetAllocationGranularity recommends
    d = ascmem.Device("atlas-a2-training", backend="acl", acl_module=acl, paged=True,
                      device_id=3, pool_sizes={"huge1g": 2 << 30})
    a = d.malloc(3 * MiB, ascmem.Policy.HUGE_ONLY)
    b = d.malloc(3 * MiB, ascmem.Policy.NORMAL_ONLY)
    c = d.malloc(5 * MiB, ascmem.Policy.HUGE1G_ONLY)
    attrs = [(p["memAttr"], p["location"]["id"]) for p in acl.physical_props]
    assert attrs == [(13, 3), (12, 3), (14, 3)]
    # the granularity query was answered (a valid prop: memAttr 0 is not one), so
    # the huge and normal kinds map 4 MB pieces, the 1 GiB kind one whole page
    assert sorted(acl.physical.values()) == [4 * MiB] * 2 + [1 << 30]
    assert d.stats()["huge1g"]["mapped"] == 1 << 30
    d.check()
    for p in (a, b, c):
        d.free(p)
    assert not acl.mapped and not acl.physical
    d.check()
    d.close()
    assert not acl.reserved


def test_paged_acl_refusal_leaves_nothing_mapped():
    acl, d = _acl_paged()
    keep = d.malloc(3 * MiB, ascmem.Policy.HUGE_ONLY)
    granules = len(acl.mapped)
    count = [0]

    def fail(name, size):  # the runtime runs out on the third granule
        if name == "rt.malloc_physical":
            count[0] += 1
            return 207001 if count[0] == 3 else 0
        return 0
    acl.fail = fail
    with pytest.raises(ascmem.OutOfMemoryError, match="refused physical memory"):
        d.malloc(9 * MiB, ascmem.Policy.HUGE_ONLY)
    assert len(acl.mapped) == len(acl.physical) == granules
    assert d.stats()["huge"]["live_count"] == 1
    d.check()
    acl.fail = lambda name, size: 207000 if name == "rt.map_mem" else 0
    with pytest.raises(ascmem.OutOfMemoryError):
        d.malloc(4 * MiB, ascmem.Policy.HUGE_ONLY)
    assert len(acl.mapped) == len(acl.physical) == granules
    acl.fail = None
    d.free(keep)
    d.check()


def test_paged_acl_sleep_wake_reset():
    acl, d = _acl_paged()
    kv = d.malloc(8 * MiB, ascmem.Policy.HUGE_ONLY, tag="kv")
    d.sleep("kv", keep=False)
    assert not acl.mapped
    acl.fail = lambda name, size: 207001 if name == "rt.malloc_physical" else 0
    with pytest.raises(ascmem.OutOfMemoryError):
        d.wake("kv")
    assert not acl.mapped and not acl.physical  # still asleep, nothing half mapped
    acl.fail = None
    d.wake("kv")
    assert len(acl.mapped) == 5
    d.check()
    d.reset()  # the old ranges' memory and the ranges go; fresh ones come
    assert not acl.mapped and not acl.physical and acl.reserved
    d.free(d.malloc(MiB))
    d.check()


def test_paged_acl_sleep_keeps_contents_through_aclrtmemcpy():
    """keep=True on acl: the blocks go to the host (aclrtMemcpy device to
    host) before their granules are unmapped, and back (host to device)
    once wake has mapped them again -- at the same addresses."""
    import ctypes
    acl, d = _acl_paged()
    kv = d.malloc(5 * MiB, ascmem.Policy.HUGE_ONLY, tag="kv")
    # awake all along; of kv's size class, so placed next to it, sharing a granule
    other = d.malloc(5 * MiB - 8192, ascmem.Policy.HUGE_ONLY)
    pattern = bytes(range(256)) * (5 * MiB // 256)
    src = ctypes.create_string_buffer(pattern, len(pattern))
    assert acl.rt.memcpy(kv, len(pattern), ctypes.addressof(src), len(pattern), 1) == 0
    acl.fail = lambda name, size: 507899 if name == "rt.memcpy" else 0
    with pytest.raises(ascmem.OutOfMemoryError, match="nothing was given back"):
        d.sleep("kv")                      # a refused copy: the tag stays awake and mapped
    assert d.stats()["huge"]["mapped"] == 10 * MiB
    acl.fail = None
    given = d.sleep("kv")
    assert given == 4 * MiB and len(acl.mapped) == 3  # other's, one of them shared with kv
    acl.fail = lambda name, size: 507899 if name == "rt.memcpy" else 0
    with pytest.raises(ascmem.OutOfMemoryError, match="stays asleep"):
        d.wake("kv")                       # mapped, then the copy back refused: asleep again
    assert len(acl.mapped) == 3
    acl.fail = None
    d.wake("kv")
    back = ctypes.create_string_buffer(len(pattern))
    assert acl.rt.memcpy(ctypes.addressof(back), len(pattern), kv, len(pattern), 2) == 0
    assert back.raw == pattern
    d.free(kv)
    d.free(other)
    d.check()
    assert not acl.mapped


def test_paged_acl_device_is_not_for_the_pluggable_functions():
    from ascmem import pluggable
    _, d = _acl_paged()
    with pytest.raises(ascmem.UnsupportedError, match="pluggable"):
        pluggable.configure(d)


def test_a_closed_paged_device_never_touches_its_old_range():
    """Regression: destroying a closed paged device unmapped its whole range
    again, after the OS had handed those addresses to Python's own heap
    (seen as a crash in the garbage collector)."""
    import subprocess
    import sys
    code = ("import gc, ascmem\n"
            "d = ascmem.Device('atlas-a2-training', memory=8 << 30, backend='host', paged=True)\n"
            "blocks = [d.malloc(16 << 20) for _ in range(4)]\n"
            "d.close()\n"
            "junk = [list(range(100)) for _ in range(200000)]\n"
            "del d\n"
            "gc.collect()\n"
            "print(sum(len(j) for j in junk))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "20000000", r.stderr[-2000:]


def test_growing_paged_kind_gives_kept_granules_back_with_idle_chunks():
    d = ascmem.Device("atlas-a2-training", memory=8 << 30, backend="host", paged=True,
                      release_threshold=8 * MiB, pool_sizes={"normal": (4 * MiB, 64 * MiB)})
    a = d.malloc(6 * MiB, ascmem.Policy.NORMAL_ONLY)  # a second chunk
    d.free(a)
    d.empty_cache()  # idle chunks go back: their kept granules must leave the budget
    assert d.budget()["normal_used"] == 0
    d.check()


@pytest.mark.parametrize("answer,granule", [((4 * MiB, 0), 4 * MiB), ((8 * MiB, 0), 8 * MiB),
                                            ((3 * MiB, 0), 2 * MiB),   # not a power of two
                                            ((4 * MiB, 507000), 2 * MiB),  # the runtime refused
                                            (None, 2 * MiB)])              # no such call
def test_paged_acl_maps_in_the_granularity_the_runtime_recommends(answer, granule):
    """aclrtMemGetAllocationGranularity (pyACL mem_get_allocation_granularity,
    the recommended option): its answer is the granule, when it is a power-of-two
    multiple of 2 MB; ranges hold whole granules."""
    import fake_acl
    acl = fake_acl.make(granule=granule)  # the stand-in checks maps against the expected granule
    if answer is None:
        del acl.rt.mem_get_allocation_granularity
    else:
        acl.rt.mem_get_allocation_granularity = lambda prop, option: answer
    d = ascmem.Device("atlas-a2-training", backend="acl", acl_module=acl, paged=True,
                      pool_sizes={"huge": (1 << 30, 1 << 30), "normal": (250 * MiB, 250 * MiB),
                                  "dvpp": (64 * MiB, 64 * MiB), "host": (64 * MiB, 64 * MiB)})
    assert d.stats()["normal"]["capacity"] == 250 * MiB // granule * granule
    a = d.malloc(5 * MiB, ascmem.Policy.HUGE_ONLY)
    b = d.malloc(100, ascmem.Policy.NORMAL_ONLY)
    maps = [c for c in acl.calls if c[0] == "rt.map_mem"]
    assert maps and all(c[2] == granule and c[1] % granule == 0 for c in maps)
    assert d.stats()["huge"]["mapped"] == (5 * MiB + granule - 1) // granule * granule
    d.check()
    d.free(a)
    d.free(b)
    assert not acl.mapped
    d.close()


def test_placement_model_shows_the_worst_moment():
    """scripts/paged_placement_sim.py --worst: the layout when the mapped
    granules first peak, which is how placement misses are found."""
    script = os.path.join(ROOT, "scripts", "paged_placement_sim.py")
    trace_path = os.path.join(os.path.dirname(ascmem.__file__), "examples", "decoder_static_cache.csv.gz")
    def worst(*rule):
        r = subprocess.run([sys.executable, script, "--worst", str(2 * MiB), *rule, trace_path],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        head, columns, *rows = r.stdout.splitlines()
        return head, [int(line.split()[2]) for line in rows]

    # the rules before mapped granules first: 11 granules where 10 would do
    head, spans = worst("--rule", "granules")
    assert "11 granules mapped" in head and "9.50 granules of live bytes" in head
    assert len(spans) == 20 and spans.count(2) == 7  # blocks that straddle a granule boundary
    # the code's rules (the default): 10, the bound, straddling or not
    head, spans = worst()
    assert "rule mapped" in head and "10 granules mapped" in head and len(spans) == 20
