"""CPU tensors on ascmem are sized as torch's own CPU allocator sizes them:
the bytes asked for at a 64-byte start, with no aclrtMalloc tail
(ascmem_pluggable_try_alloc_cpu, ASCM_SIZE_EXACT).  With the tail, a tensor
of a whole number of 2 MiB granules -- 16 MiB, say -- reached into one
granule more of the default paged Device, and two 1 MiB tensors could not
share a granule.  The kinds stay aclrtMalloc's (huge pages above 1 MiB once
rounded, so a 1 MiB tensor too)."""
import gc

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ninja")  # torch.utils.cpp_extension builds the shim with it

import ascmem  # noqa: E402
import ascmem.torch as at  # noqa: E402
from conftest import MiB  # noqa: E402


@pytest.fixture
def dev():
    """A default Device of its own (installed for the test), so that no other
    test's blocks or kept granules are in its counts or its placement."""
    at.uninstall()
    d = at.default_device(device_id=7)
    at.install(d)
    yield d
    at.uninstall()
    gc.collect()


def _block(dev, t):
    (b,) = [b for b in dev.snapshot() if b["address"] == t.data_ptr()]
    return b


def test_a_tensor_of_whole_granules_holds_exactly_them(dev):
    t = torch.empty(4 << 20, dtype=torch.float32)  # 16 MiB: eight 2 MiB granules
    s = dev.stats()["huge"]
    assert dev.kind_of(t.data_ptr()) == ascmem.MemKind.HUGE
    assert s["pages_in_use"] * s["page_size"] == 16 * MiB  # not 18: no tail in a ninth
    assert _block(dev, t)["size"] == 16 * MiB
    del t


def test_two_half_granule_tensors_share_one_granule(dev):
    a = torch.empty(1 << 18, dtype=torch.float32)  # 1 MiB each: huge pages, as aclrtMalloc routes it
    b = torch.empty(1 << 18, dtype=torch.float32)
    assert dev.kind_of(a.data_ptr()) == dev.kind_of(b.data_ptr()) == ascmem.MemKind.HUGE
    assert dev.stats()["huge"]["pages_in_use"] == 1  # not 2: no tail past the first granule's half
    del a, b


def test_requested_is_the_size_asked_and_the_start_64_byte_aligned(dev):
    # one Device for every size: a process has 32 pluggable indices for torch, kept for good
    for nbytes in (1, 33, 4096, 100_000, MiB + 4, 5 * MiB + 100):
        t = torch.empty(nbytes, dtype=torch.uint8)
        b = _block(dev, t)
        assert b["requested"] == nbytes and b["size"] >= nbytes
        assert t.data_ptr() % 64 == 0
        assert at.memory_stats()["requested_bytes.all.current"] == nbytes
        del t
        assert at.memory_stats()["requested_bytes.all.current"] == 0
    dev.check()
