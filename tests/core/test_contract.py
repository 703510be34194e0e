"""The allocator contract, run over every variant ascmem has: Pool (contiguous
and paged), BuddyAllocator, each memory kind of a Device on each backend (sim,
host, acl through the recording stand-in), and the paged kinds of a paged
Device (sim, host).  Every variant must hand out aligned,
disjoint blocks at least as large as asked, refuse bad input with a specific
error and stay intact (check() passes), survive running out, and account for
every block.  A new variant joins by adding a line to VARIANTS."""
import dataclasses
import random
import threading
from typing import Any, Callable

import pytest

import ascmem
from ascmem.errors import (ArgumentTypeError, InvalidArgumentError, InvalidFreeError,
                           OutOfMemoryError)
from ascmem.rules import MemKind, Policy

import fake_acl
from conftest import BASE, GiB, MiB


@dataclasses.dataclass
class Variant:
    name: str
    make: Callable[[], Any]
    alloc: Callable[[Any, int], int]
    free: Callable[[Any, int], None]
    align: int                          # every block starts at a multiple of this
    kind: Any = None                    # the Device kind it allocates from, or None
    readable: bool = False              # the host can write the blocks (host backend)

    def live_count(self, a):
        stats = a.stats()
        return (stats[self.kind.name.lower()] if self.kind is not None else stats)["live_count"]

    def usable(self, a, addr):
        return a.usable_size(addr)


def _device(backend, paged=False):
    kw = {"memory": 4 * GiB, "paged": paged}
    if backend == "acl":
        kw.update(acl_module=fake_acl.make(), pool_sizes={k: 64 * MiB for k in
                                                          ("huge", "normal", "dvpp", "host")})
        kw["pool_sizes"]["huge1g"] = GiB  # a paged one maps whole 1 GiB granules
    return lambda: ascmem.Device("atlas-a2-training", backend=backend, **kw)


# kind -> (allocate, free, start alignment)
_KIND_CALLS = {
    MemKind.HUGE: (lambda d, n: d.malloc(n, Policy.HUGE_ONLY), lambda d, a: d.free(a), 64),
    MemKind.NORMAL: (lambda d, n: d.malloc(n, Policy.NORMAL_ONLY), lambda d, a: d.free(a), 64),
    MemKind.DVPP: (lambda d, n: d.dvpp_malloc(n), lambda d, a: d.dvpp_free(a), 128),
    MemKind.HOST: (lambda d, n: d.malloc_host(n), lambda d, a: d.free_host(a), 64),
    MemKind.HUGE1G: (lambda d, n: d.malloc(n, Policy.HUGE1G_ONLY), lambda d, a: d.free(a), 64),
}

VARIANTS = [
    Variant("Pool", lambda: ascmem.Pool(64 * MiB, base=BASE), lambda p, n: p.alloc(n),
            lambda p, a: p.free(a), 64),
    Variant("BuddyAllocator", lambda: ascmem.BuddyAllocator(64 * MiB, base=BASE),
            lambda p, n: p.alloc(n), lambda p, a: p.free(a), 64),
    Variant("Pool-paged-64KiB", lambda: ascmem.Pool(64 * MiB, base=BASE, granule=64 << 10),
            lambda p, n: p.alloc(n), lambda p, a: p.free(a), 64),
    Variant("Pool-paged-2MiB-kept",
            lambda: ascmem.Pool(64 * MiB, base=BASE, granule=2 * MiB, release_threshold=8 * MiB),
            lambda p, n: p.alloc(n), lambda p, a: p.free(a), 64),
] + [
    Variant(f"Device-{backend}-{kind.name.lower()}", _device(backend), calls[0], calls[1],
            calls[2], kind, backend == "host")
    for backend in ("sim", "host", "acl") for kind, calls in _KIND_CALLS.items()
] + [
    Variant(f"Device-paged-{backend}-{kind.name.lower()}", _device(backend, paged=True), calls[0],
            calls[1], calls[2], kind, backend == "host")
    for backend in ("sim", "host", "acl") for kind, calls in _KIND_CALLS.items()
    if kind in (MemKind.HUGE, MemKind.NORMAL, MemKind.HUGE1G)
]


@pytest.fixture(params=VARIANTS, ids=[v.name for v in VARIANTS])
def variant(request):
    return request.param


@pytest.fixture
def alloc(variant):
    a = variant.make()
    yield a
    if hasattr(a, "close"):
        a.close()


def _sizes(rng, count):
    edge = [1, 31, 32, 33, 63, 64, 4095, 4096, 4097, 32768, 32769, MiB + 1]
    return edge + [rng.randrange(1, 200_000) for _ in range(count - len(edge))]


def _tag(variant, a, addr, n, byte):
    if variant.readable:
        a.buffer(addr, n)[:] = bytes([byte]) * n


def _tag_intact(variant, a, addr, n, byte):
    return not variant.readable or bytes(a.buffer(addr, n)) == bytes([byte]) * n


def test_blocks_are_aligned_disjoint_and_large_enough(variant, alloc):
    rng = random.Random(1)
    spans = []
    for n in _sizes(rng, 60):
        addr = variant.alloc(alloc, n)
        usable = variant.usable(alloc, addr)
        assert addr % variant.align == 0, f"{addr:#x} not {variant.align}-aligned"
        assert usable >= n
        spans.append((addr, addr + usable))
    spans.sort()
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start, "two live blocks overlap"
    assert variant.live_count(alloc) == len(spans)
    alloc.check()


def test_freeing_everything_leaves_nothing_live(variant, alloc):
    addrs = [variant.alloc(alloc, n) for n in _sizes(random.Random(2), 40)]
    for addr in reversed(addrs):
        variant.free(alloc, addr)
    assert variant.live_count(alloc) == 0
    alloc.check()


def test_double_free_is_refused_and_harmless(variant, alloc):
    keep = variant.alloc(alloc, 100)
    addr = variant.alloc(alloc, 100)
    variant.free(alloc, addr)
    with pytest.raises(InvalidFreeError):
        variant.free(alloc, addr)
    assert variant.live_count(alloc) == 1
    variant.free(alloc, keep)
    alloc.check()


@pytest.mark.parametrize("size", [100, 1 << 20])
def test_double_free_inside_a_reuse_loop_is_refused(variant, alloc, size):
    """A loop that frees a block and asks for its size again takes the same
    block back (the Pool keeps the last freed large block, and in such a
    loop its address-map entry too): a second free, and a lookup, of the
    freed block must still be refused."""
    keep = variant.alloc(alloc, 64)
    addr = variant.alloc(alloc, size)
    for _ in range(3):
        variant.free(alloc, addr)
        addr = variant.alloc(alloc, size)
    variant.free(alloc, addr)
    with pytest.raises(InvalidFreeError):
        variant.free(alloc, addr)
    with pytest.raises(InvalidFreeError):
        variant.usable(alloc, addr)
    assert variant.live_count(alloc) == 1
    alloc.check()
    again = variant.alloc(alloc, size)
    variant.free(alloc, again)
    variant.free(alloc, keep)
    assert variant.live_count(alloc) == 0
    alloc.check()


@pytest.mark.parametrize("bad, error", [("interior", InvalidFreeError), ("foreign", InvalidFreeError),
                                        (-1, InvalidArgumentError), (1 << 64, InvalidArgumentError),
                                        ("text", ArgumentTypeError), (1.5, ArgumentTypeError),
                                        (None, ArgumentTypeError)])
def test_bad_pointers_are_refused(variant, alloc, bad, error):
    addr = variant.alloc(alloc, 4096)
    ptr = {"interior": addr + 1, "foreign": 8}.get(bad, bad) if isinstance(bad, str) else bad
    with pytest.raises(error):
        variant.free(alloc, ptr)
    assert variant.live_count(alloc) == 1
    variant.free(alloc, addr)
    alloc.check()


@pytest.mark.parametrize("bad, error", [(0, InvalidArgumentError), (-5, InvalidArgumentError),
                                        (1 << 64, InvalidArgumentError), (1.0, ArgumentTypeError),
                                        ("64", ArgumentTypeError), (True, ArgumentTypeError)])
def test_bad_sizes_are_refused(variant, alloc, bad, error):
    with pytest.raises(error):
        variant.alloc(alloc, bad)
    assert variant.live_count(alloc) == 0
    alloc.check()


def test_running_out_keeps_what_was_there(variant, alloc):
    addr = variant.alloc(alloc, 5000)
    _tag(variant, alloc, addr, 5000, 0x5A)
    with pytest.raises(OutOfMemoryError):
        variant.alloc(alloc, 1 << 40)
    assert _tag_intact(variant, alloc, addr, 5000, 0x5A)
    assert variant.live_count(alloc) == 1
    alloc.check()
    variant.free(alloc, addr)
    assert variant.live_count(alloc) == 0


def test_churn_keeps_every_block_to_itself(variant, alloc):
    """Random allocations and frees against a model of the live set; on real
    memory each block carries its own byte, so an overlap would show."""
    rng = random.Random(3)
    live = {}
    for i in range(600):
        if live and (len(live) > 80 or rng.random() < 0.45):
            addr = rng.choice(list(live))
            n, byte = live.pop(addr)
            assert _tag_intact(variant, alloc, addr, n, byte)
            variant.free(alloc, addr)
        else:
            n = rng.choice((rng.randrange(1, 512), rng.randrange(512, 40_000), rng.randrange(1, 300_000)))
            addr = variant.alloc(alloc, n)
            assert addr not in live
            live[addr] = (n, i % 251)
            _tag(variant, alloc, addr, n, i % 251)
    assert variant.live_count(alloc) == len(live)
    for addr, (n, byte) in live.items():
        assert _tag_intact(variant, alloc, addr, n, byte)
    alloc.check()


def test_two_threads_share_one_allocator(variant, alloc):
    errors = []

    def work(seed):
        rng = random.Random(seed)
        mine = []
        try:
            for _ in range(400):
                if mine and rng.random() < 0.5:
                    variant.free(alloc, mine.pop(rng.randrange(len(mine))))
                else:
                    mine.append(variant.alloc(alloc, rng.randrange(1, 50_000)))
            for addr in mine:
                variant.free(alloc, addr)
        except BaseException as e:  # reported below, in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in (10, 11)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert variant.live_count(alloc) == 0
    alloc.check()


def test_reset_frees_everything_and_forgets_old_pointers(variant, alloc):
    addrs = [variant.alloc(alloc, n) for n in (100, 5000, 70_000)]
    alloc.reset()
    assert variant.live_count(alloc) == 0
    with pytest.raises(InvalidFreeError):
        variant.free(alloc, addrs[1])
    alloc.check()
    variant.free(alloc, variant.alloc(alloc, 100))
