"""torch_npu's expandable segments, emulated (ascmem.torch_expandable), and
the caching allocator's rules of issue 46.5: each rule against the numbers
torch_npu's source gives (Ascend/pytorch NPUCachingAllocator.cpp and
NPUAllocatorConfig.cpp, cited in the modules)."""
import random

import pytest

from ascmem import trace as tr
from ascmem.errors import InvalidArgumentError, OutOfMemoryError
from ascmem.torch_caching import TorchCachingAllocator as T, parse_conf
from ascmem.torch_expandable import TorchExpandableSegments as E
from conftest import KiB, MiB


def mapped_by_walk(a):
    """Mapped bytes from the blocks themselves, checking that they tile each
    pool's segment and that free neighbours in one state are merged."""
    total = 0
    for small in (True, False):
        b = a._blocks.get(a._base[small])
        end = b.addr if b else 0
        while b is not None:
            assert b.addr == end
            end += b.size
            total += b.size if b.mapped else 0
            if not b.allocated and b.next is not None and not b.next.allocated:
                assert b.mapped != b.next.mapped
            b = b.next
    return total


def test_sizes_are_the_caching_allocators_and_pad_is_optional():
    assert E(1 << 30).round_size(100) == 512
    assert E(1 << 30).round_size(MiB) == MiB + 512          # 32-byte pad, then 512
    assert E(1 << 30, pad=0).round_size(MiB) == MiB         # Ascend 950, CANN >= 9.1.0
    assert T(1 << 30, pad=0).round_size(MiB) == MiB


def test_requests_of_2_mib_and_more_start_on_a_16_kib_boundary():
    a = E(1 << 30)
    x = a.alloc(MiB + 100)                    # large pool, below 2 MiB: not aligned
    y = a.alloc(3 * MiB)
    assert y % (16 * KiB) == 0 and y > x + a.usable_size(x)
    gap = y - (x + a.usable_size(x))
    assert 0 < gap < 16 * KiB
    assert (gap, x + a.usable_size(x)) in a._free[False]  # the gap stays a free block
    for p in (x, y):
        a.free(p)
    assert mapped_by_walk(a) == a.reserved == 20 * MiB


def test_never_emptying_keeps_free_pages_mapped_until_the_last_retry():
    a = E(100 * MiB)
    x = a.alloc(50 * MiB)                     # three 20 MiB pages
    y = a.alloc(5 * MiB)
    assert a.reserved == 60 * MiB
    a.free(x)
    assert a.reserved == 60 * MiB             # cached, not unmapped
    big = a.alloc(70 * MiB)                   # past 100 MiB: unmap what is free, then map
    assert a.retries == 1 and a.reserved <= 100 * MiB
    assert mapped_by_walk(a) == a.reserved
    a.free(big)
    a.free(y)


def test_the_last_retry_unmaps_free_pages_inside_the_segment_not_only_at_its_end():
    a = E(80 * MiB)
    x = a.alloc(30 * MiB)                     # pages 0-1
    keep = a.alloc(5 * MiB)                   # page 1-2
    assert a.reserved == 40 * MiB
    a.free(x)                                 # page 0 is wholly free, inside the segment
    small = [a.alloc(MiB - 32) for _ in range(2 * 21)]  # 42 MiB of small pages: no room
    assert a.retries == 1                     # page 0 went back so they fit
    assert mapped_by_walk(a) == a.reserved <= 80 * MiB
    for p in small + [keep]:
        a.free(p)


def test_eager_unmaps_whole_free_pages_at_once_and_maps_them_again():
    a = E(1 << 30, eager=True)
    x = a.alloc(50 * MiB)
    assert a.reserved == 60 * MiB
    a.free(x)
    assert a.reserved == 0 and a.peak_reserved == 60 * MiB
    y = a.alloc(100)
    z = a.alloc(100)
    a.free(y)
    assert a.reserved == 2 * MiB              # z holds its page
    a.free(z)
    assert a.reserved == 0 and mapped_by_walk(a) == 0


@pytest.mark.parametrize("eager", [False, True])
def test_random_runs_keep_the_books(eager):
    rnd = random.Random(7)
    a = E(300 * MiB, eager=eager)
    live = []
    for _ in range(1500):
        if live and rnd.random() < 0.45:
            a.free(live.pop(rnd.randrange(len(live))))
        else:
            n = rnd.choice([rnd.randint(1, 4096), rnd.randint(1, MiB), rnd.randint(1, 30 * MiB)])
            try:
                live.append(a.alloc(n))
            except OutOfMemoryError:
                pass
        assert mapped_by_walk(a) == a.reserved <= 300 * MiB
    for p in live:
        a.free(p)
    a.empty_cache()
    assert a.reserved == 0 and a.allocated == 0


# ---- the caching allocator's configuration rules (issue 46.5) -----------------------------

@pytest.mark.parametrize("conf", ["expandable_segments:True,max_split_size_mb:40",
                                  "expandable_segments:True,garbage_collection_threshold:0.5"])
def test_expandable_segments_refuse_max_split_size_and_garbage_collection(conf):
    with pytest.raises(InvalidArgumentError, match="cannot be enabled with"):
        parse_conf(conf)  # NPUAllocatorConfig.cpp lines 306-312


def test_max_split_size_mb_is_at_least_20():
    with pytest.raises(InvalidArgumentError, match="at least 20"):
        parse_conf("max_split_size_mb:19")
    assert parse_conf("max_split_size_mb:20") == {"max_split_size": 20 * MiB}


def test_garbage_collection_frees_only_large_pool_segments():
    a = T(100 * MiB, garbage_collection_threshold=0.1)
    smalls = [a.alloc(MiB - 32) for _ in range(8)]   # four 2 MiB small segments
    for p in smalls:
        a.free(p)
    reserved = a.reserved
    assert reserved == 8 * MiB                       # above 10 MiB? no: add a large one
    big = a.alloc(15 * MiB)                          # a new 16 MiB segment: GC runs first
    assert a.reserved == reserved + 16 * MiB         # the idle small segments stayed
    a.free(big)
    other = a.alloc(40 * MiB)                        # GC again: now the idle large one goes
    assert a.reserved == reserved + 42 * MiB         # (40 MiB + 512 in a 2 MiB multiple)
    a.free(other)


# ---- the peers in replay, fit and plan (issue 42.3) ---------------------------------------

@pytest.mark.parametrize("name", ["torch-expandable", "torch-expandable-eager"])
def test_the_peers_replay_and_fit(name):
    t = tr.example("resnet50_multires")
    r = tr.replay(t, name, capacity=1 << 30)
    assert r["failures"] == 0 and r["peak_reserved"] >= r["peak_live"]
    assert name in tr.ALLOCATORS
    cap = tr.min_capacity(t, name, resolution=4 * MiB)
    assert t.peak_live() <= cap <= r["peak_reserved"] + 4 * MiB


def test_eager_never_maps_more_than_never_emptying():
    t = tr.example("decoder_kvcache")
    peaks = {}
    for name in ("torch-expandable", "torch-expandable-eager"):
        a = tr.make_allocator(name, 1 << 30)
        tr.replay(t, a)
        peaks[name] = a.peak_reserved
    assert peaks["torch-expandable-eager"] <= peaks["torch-expandable"]
