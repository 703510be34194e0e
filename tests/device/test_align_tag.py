"""Aligned groups (issue 49): Device.align_tag(tag, alignment) places every
later block of the tag at a multiple of alignment with a usable size that is
a multiple of it, leaves everything else as it was, and reports its cost."""
import pytest
from hypothesis import given, settings, strategies as st

import ascmem
from ascmem.errors import ArgumentTypeError, InvalidArgumentError

import fake_acl
from conftest import KiB, MiB

CALLS = ("malloc", "malloc_align32")


def devices():
    yield ascmem.Device(backend="sim")
    yield ascmem.Device(backend="host")
    yield ascmem.Device(backend="acl", acl_module=fake_acl.make(),
                        pool_sizes={"normal": 64 * MiB, "huge": 64 * MiB})


@pytest.mark.parametrize("alignment", [64, 4 * KiB, 64 * KiB, 2 * MiB])
def test_start_and_usable_size_are_multiples(alignment):
    for d in devices():
        d.align_tag("hccl", alignment)
        blocks = []
        for call in CALLS:
            for policy in (0, 1, 2):
                for size in (1, 100, 4000, 40_000, 1 * MiB + 3, 3 * MiB):
                    a = getattr(d, call)(size, policy, tag="hccl")
                    assert a % alignment == 0, (d.backend, call, policy, size)
                    assert d.usable_size(a) % alignment == 0
                    assert d.usable_size(a) >= size
                    blocks.append(a)
        d.check()
        for a in blocks:
            d.free(a)
        d.check()
        d.close()


def test_acl_alignment_is_bounded_by_the_runtimes_chunks():
    """A pool aligns relative to its chunk: on acl, no more than the chunks
    the runtime handed out are aligned."""
    f = fake_acl.make()
    f.rt.malloc(4 * KiB, 0)                     # the chunks after it are 4 KiB-aligned
    d = ascmem.Device(backend="acl", acl_module=f, pool_sizes={"normal": 64 * MiB})
    with pytest.raises(InvalidArgumentError, match="chunks"):
        d.align_tag("hccl", 2 * MiB)
    d.align_tag("hccl", 4 * KiB)
    assert d.malloc(100, tag="hccl") % (4 * KiB) == 0


def test_a_grown_chunk_less_aligned_than_the_tag_is_a_clear_error():
    """acl chunks come from the runtime as it aligns them: a chunk taken
    later (growth) may be less aligned than the tag asked; the request is
    refused with MisalignedError, not taken misaligned."""
    f = fake_acl.make()
    d = ascmem.Device(backend="acl", acl_module=f, pool_sizes={"normal": (2 * MiB, 64 * MiB)})
    d.align_tag("hccl", 2 * MiB)
    normal_only = ascmem.Policy.NORMAL_ONLY
    d.malloc(1 * MiB, normal_only)             # the first 2 MiB chunk has no aligned room left
    f.rt.malloc(4 * KiB, 0)                    # the next chunk starts 4 KiB-aligned only
    with pytest.raises(ascmem.MisalignedError):
        d.malloc(1 * MiB, normal_only, tag="hccl")
    d.check()


def test_other_tags_and_untagged_blocks_are_placed_as_before():
    """An aligned group costs only its own blocks: the same sequence of
    untagged and other-tag requests gets the same usable sizes with or
    without it, and no padding is charged to them."""
    sizes = [100, 5000, 70_000, 1 * MiB + 7, 33, 3 * MiB]

    def run(aligned):
        d = ascmem.Device(backend="sim")
        if aligned:
            d.align_tag("hccl", 2 * MiB)
        used = []
        for n in sizes:
            used.append(d.usable_size(d.malloc(n)))
            used.append(d.usable_size(d.malloc(n, tag="kv")))
            if aligned:
                d.malloc(n, tag="hccl")
        return d, used

    d0, plain = run(False)
    d1, mixed = run(True)
    assert plain == mixed
    stats = d1.stats()["aligned"]
    assert set(stats) == {"hccl"} and stats["hccl"]["blocks"] == len(sizes)
    assert "aligned" not in d0.stats()


def test_memory_stats_show_what_alignment_costs():
    d = ascmem.Device(backend="sim")
    d.align_tag("hccl", 2 * MiB)
    a = d.malloc(100, tag="hccl")              # 2 MiB for 100 bytes
    other = ascmem.Device(backend="sim")
    other.malloc(100)
    plain = other.memory_stats()["allocated_bytes.all.current"]  # the pool's bytes for it
    m = d.memory_stats()
    assert m["alignment_padding_bytes.all.current"] == 2 * MiB - plain
    assert m["alignment_padding_bytes.tag:hccl.current"] == 2 * MiB - plain
    d.free(a)
    m = d.memory_stats()
    assert m["alignment_padding_bytes.all.current"] == 0
    assert m["alignment_padding_bytes.all.peak"] == 2 * MiB - plain
    assert d.stats()["aligned"]["hccl"] == {"alignment": 2 * MiB, "padding_bytes": 0,
                                            "peak_padding_bytes": 2 * MiB - plain, "blocks": 0,
                                            "shareable": False}


def test_bad_alignments_are_typed_errors():
    d = ascmem.Device(backend="sim")
    for bad in (0, 3, 3 * MiB, 2 << 30):
        with pytest.raises(InvalidArgumentError):
            d.align_tag("t", bad)
    for bad in (-1,):
        with pytest.raises(InvalidArgumentError):
            d.align_tag("t", bad)
    for bad in (1.5, "2MiB", [64]):
        with pytest.raises(ArgumentTypeError):
            d.align_tag("t", bad)
    with pytest.raises(ArgumentTypeError):
        d.align_tag(["unhashable"], 64)
    with pytest.raises(InvalidArgumentError):
        d.align_tag(None, 64)
    a = d.malloc(100, tag="t")                 # nothing was set
    assert d.usable_size(a) < 4096
    d.check()


def test_a_growing_pool_grows_enough_for_an_aligned_block():
    """A 2 MiB-aligned block of 2 MiB needs up to 4 MiB - 4 KiB of free range
    to slide to its alignment: growth takes that much, not just 2 MiB."""
    d = ascmem.Device(backend="host", pool_sizes={"normal": (2 * MiB, 64 * MiB)})
    d.align_tag("hccl", 2 * MiB)
    a = d.malloc(1 * MiB, ascmem.Policy.NORMAL_ONLY, tag="hccl")
    assert a % (2 * MiB) == 0 and d.usable_size(a) == 2 * MiB
    d.free(a)
    d.check()
    d.close()


def test_alignment_can_be_dropped_and_survives_reset():
    d = ascmem.Device(backend="host")
    d.align_tag("t", 64 * KiB)
    d.reset()
    a = d.malloc(100, tag="t")
    assert a % (64 * KiB) == 0
    d.align_tag("t", None)
    b = d.malloc(100, tag="t")
    assert d.usable_size(b) < 64 * KiB
    d.free(a)
    d.free(b)
    d.check()
    d.close()


def test_aligned_block_freed_on_a_stream_is_not_reused_unaligned():
    d = ascmem.Device(backend="sim")
    d.align_tag("t", 2 * MiB)
    a = d.malloc(3 * MiB, tag="t")
    d.free(a, stream="s")
    b = d.malloc(1000, stream="s", tag="t")
    assert b % (2 * MiB) == 0 and d.usable_size(b) % (2 * MiB) == 0
    d.synchronize()
    d.free(b)
    d.check()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, "a", "b"]), st.integers(1, 5 * MiB),
                          st.booleans()), min_size=1, max_size=30),
       st.sampled_from([4 * KiB, 64 * KiB, 2 * MiB]))
def test_mixed_workload_keeps_the_invariants(ops, alignment):
    d = ascmem.Device(backend="sim")
    d.align_tag("a", alignment)
    live = []
    for tag, size, free_one in ops:
        try:
            a = d.malloc(size, tag=tag)
        except ascmem.OutOfMemoryError:
            continue
        if tag == "a":
            assert a % alignment == 0 and d.usable_size(a) % alignment == 0
        live.append(a)
        if free_one and live:
            d.free(live.pop(0))
    d.check()
    for a in live:
        d.free(a)
    d.check()
    assert d.stats()["aligned"]["a"]["padding_bytes"] == 0
