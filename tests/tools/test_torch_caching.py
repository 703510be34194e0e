"""The torch_npu caching allocator emulation: each rule it follows, tested
against the numbers torch_npu's source gives (Ascend/pytorch
torch_npu/csrc/core/npu/NPUCachingAllocator.cpp, cited in the module)."""
import pytest

from ascmem import trace as tr
from ascmem.errors import InvalidArgumentError, OutOfMemoryError
from ascmem.torch_caching import TorchCachingAllocator as T, parse_conf
from ascmem.torch_expandable import TorchExpandableSegments as E
from conftest import MiB


@pytest.mark.parametrize("size,rounded", [(1, 512), (480, 512), (481, 1024), (1000, 1536),
                                          (MiB, MiB + 512)])
def test_round_size_adds_the_32_byte_pad_then_512_multiples(size, rounded):
    assert T(1 << 30).round_size(size) == rounded


def test_roundup_power2_divisions():
    from ascmem.torch_caching import _next_division
    assert _next_division(1200, 4) == 1280            # the source's own example: 1024..2048 in 4
    a = T(1 << 30, roundup_power2_divisions=4)
    assert a.round_size(1200 - 32) == 1536            # at most 512 x divisions: 512 multiples
    assert a.round_size(3 * MiB - 32) == 3 * MiB      # on a division already
    assert a.round_size(5 * MiB) == 6 * MiB           # 4 MiB..8 MiB in steps of 1 MiB
    assert a.round_size(4 * MiB - 32) == 4 * MiB      # a power of two stays


@pytest.mark.parametrize("size,segment", [(100, 2 * MiB), (MiB - 32, 2 * MiB),
                                          (MiB, 20 * MiB), (9 * MiB, 20 * MiB),
                                          (12 * MiB, 14 * MiB)])
def test_segment_sizes_by_request(size, segment):
    a = T(1 << 30)
    a.alloc(size)
    assert a.reserved == segment


def test_small_pool_splits_and_large_pool_keeps_small_remainders():
    a = T(1 << 30)
    x = a.alloc(1000)
    y = a.alloc(1000)          # split from the same 2 MiB segment
    assert a.reserved == 2 * MiB and y == x + 1536
    big = a.alloc(19 * MiB)    # 20 MiB segment; the 1 MiB - 512 rest is not > 1 MiB: no split
    assert a.usable_size(big) == 20 * MiB
    a.alloc(2 * MiB)           # a new segment, not the rest of the 20 MiB one
    assert a.reserved == 2 * MiB + 20 * MiB + 20 * MiB


def test_best_fit_by_size_then_address_and_merging():
    a = T(1 << 30)
    blocks = [a.alloc(100_000) for _ in range(6)]
    a.free(blocks[1])
    a.free(blocks[4])
    assert a.alloc(100_000) == blocks[1]  # equal sizes: the lower address
    a.free(blocks[2])
    a.free(blocks[3])                     # merges with 2 and 4
    assert a.alloc(300_000) == blocks[2]
    assert a.reserved == 2 * MiB


def test_max_split_size_keeps_oversized_blocks_for_large_requests():
    a = T(1 << 30, max_split_size=40 * MiB)
    big = a.alloc(60 * MiB)
    a.free(big)
    small = a.alloc(15 * MiB)   # below max_split_size: the 62 MiB block is not used
    assert small != big and a.reserved == 62 * MiB + 16 * MiB  # (+32, 512, then 2 MiB rounding)
    again = a.alloc(50 * MiB)   # at or above it, within 20 MiB of rounding: it is
    assert again == big


def test_out_of_memory_releases_cached_segments_and_retries():
    a = T(30 * MiB)
    x = a.alloc(12 * MiB)       # a 14 MiB segment
    a.free(x)
    y = a.alloc(20 * MiB)       # its 22 MiB segment does not fit beside the cached 14: released
    assert a.reserved == 22 * MiB and a.retries == 1 and y
    with pytest.raises(OutOfMemoryError):
        a.alloc(20 * MiB)
    assert a.reserved == 22 * MiB  # the failure lost nothing


def test_garbage_collection_threshold_gives_back_idle_segments_early():
    a = T(100 * MiB, garbage_collection_threshold=0.5)
    olds = [a.alloc(12 * MiB) for _ in range(4)]   # 56 MiB reserved
    for p in olds:
        a.free(p)
    a.alloc(30 * MiB)    # above 50 MiB reserved: idle segments go back before a new one
    assert a.reserved <= 50 * MiB + 30 * MiB and a.retries == 0


def test_parse_conf():
    assert parse_conf("max_split_size_mb:128, roundup_power2_divisions:4,"
                      "garbage_collection_threshold:0.6,expandable_segments:False") == {
        "max_split_size": 128 * MiB, "roundup_power2_divisions": 4,
        "garbage_collection_threshold": 0.6, "expandable_segments": False}
    for bad in ("max_split_size_mb:1", "roundup_power2_divisions:3",
                "garbage_collection_threshold:1.5", "expandable_segments:maybe", "colour:blue"):
        with pytest.raises(InvalidArgumentError):
            parse_conf(bad)


def test_a_replay_and_fit_through_it(monkeypatch):
    t = tr.example("decoder_kvcache")
    r = tr.replay(t, "torch-caching", capacity=1 << 30)
    assert r["failures"] == 0 and r["peak_reserved"] >= r["peak_used"] >= r["peak_live"]
    monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", "max_split_size_mb:20")
    assert tr.make_allocator("torch-caching", 1 << 30).max_split_size == 20 * MiB


def test_expandable_segments_map_pages_at_the_end_as_needed():
    a = E(1 << 30)
    x = a.alloc(100)                   # small pool: one 2 MiB page
    assert a.reserved == 2 * MiB and a.segments == 1
    y = a.alloc(3 * MiB)               # large pool: one 20 MiB page
    z = a.alloc(30 * MiB)              # the free end of the large segment grows by one page
    # a request of 2 MiB or more starts on a 16 KiB boundary ([C] 1396-1421)
    assert a.reserved == 2 * MiB + 40 * MiB and z == y + 3 * MiB + 16 * 1024
    assert a.usable_size(y) == 3 * MiB + 512
    a.free(y)
    a.free(z)                          # one free block again: the whole mapped large segment
    w = a.alloc(35 * MiB)
    assert w == y and a.reserved == 42 * MiB  # reused, nothing new mapped
    a.free(w)
    a.free(x)
    assert parse_conf("expandable_segments:True") == {"expandable_segments": True}
    assert isinstance(T.from_conf(1 << 30, "expandable_segments:True"), E)


def test_expandable_segments_unmap_the_free_end_when_out_of_memory():
    a = E(60 * MiB)
    big = a.alloc(35 * MiB)            # two 20 MiB pages of the large pool
    a.free(big)
    a.alloc(100)                       # the small pool's page
    small_big = a.alloc(MiB - 32)      # more small pages: 2 MiB each
    assert a.reserved == 40 * MiB + 2 * MiB
    a.free(small_big)
    more = [a.alloc(MiB - 32) for _ in range(20)]  # 20 MiB more of small pages: past 60 MiB,
    assert a.retries == 1                           # so the large pool's free pages went back
    assert len(more) == 20 and a.reserved == 22 * MiB  # 20 MiB and the first block: 11 pages
