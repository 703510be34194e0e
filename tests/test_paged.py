"""Paged pools: a virtual range with physical memory mapped in granules only
where live bytes are (csrc/paging.c)."""
import random

import pytest

import ascmem
from ascmem import trace as tr
from ascmem.errors import InvalidArgumentError, OutOfMemoryError

MiB = 1 << 20
G = 64 << 10
BASE = 1 << 32


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


def test_release_threshold_keeps_free_granules_mapped_until_trim():
    p = ascmem.Pool(64 * MiB, base=BASE, granule=G, release_threshold=4 * G)
    a = p.alloc(10 * G)
    assert p.stats()["mapped"] == 10 * G
    p.free(a)
    s = p.stats()
    assert s["mapped"] == 4 * G and s["pages_in_use"] == 0  # four kept, six unmapped
    calls = s["map_calls"]
    b = p.alloc(3 * G)  # fits in the kept granules: no map call
    assert p.stats()["map_calls"] == calls
    p.free(b)
    assert p.trim() >= 4 * G
    assert p.stats()["mapped"] == 0
    p.check()


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
             "decoder_kvcache": (0.93, 0.985)}
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
