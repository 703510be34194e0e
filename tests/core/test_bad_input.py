"""Bad input gets a specific exception and leaves the allocator as it was."""
import numpy as np
import pytest

import ascmem
from conftest import BASE, MiB


def snapshot(allocator):
    s = allocator.stats()
    s.pop("metadata_bytes")
    return s


@pytest.fixture
def loaded(allocator):
    allocator.alloc(100)
    allocator.alloc(2 * MiB)
    return allocator


BAD_ALLOCS = [
    ("size zero", (0,), ascmem.InvalidArgumentError),
    ("negative size", (-1,), ascmem.InvalidArgumentError),
    ("absurd size", (1 << 70,), ascmem.InvalidArgumentError),
    ("larger than the range", (65 * MiB,), ascmem.OutOfMemoryError),
    ("float size", (10.5,), ascmem.ArgumentTypeError),
    ("string size", ("10",), ascmem.ArgumentTypeError),
    ("None size", (None,), ascmem.ArgumentTypeError),
    ("alignment not a power of two", (64, 48), ascmem.InvalidArgumentError),
    ("alignment zero", (64, 0), ascmem.InvalidArgumentError),
]


@pytest.mark.parametrize("name,args,exc", BAD_ALLOCS, ids=[b[0] for b in BAD_ALLOCS])
def test_bad_alloc(loaded, name, args, exc):
    before = snapshot(loaded)
    with pytest.raises(exc):
        loaded.alloc(*args)
    if exc is ascmem.OutOfMemoryError:  # a request refused for room counts as failed (issue 43.7)
        before["failed_count"] += 1
    assert snapshot(loaded) == before
    loaded.check()


def test_bad_alloc_many(loaded):
    before = snapshot(loaded)
    with pytest.raises(ascmem.InvalidArgumentError):
        loaded.alloc_many(np.array([10, -5]))
    with pytest.raises(ascmem.ArgumentTypeError):
        loaded.alloc_many(np.array([1.5]))
    with pytest.raises(ascmem.InvalidArgumentError):
        loaded.alloc_many([10, 0, 10])
    assert snapshot(loaded) == before
    loaded.check()


def test_bad_frees(loaded):
    a = loaded.alloc(1000)
    b = loaded.alloc(3 * MiB)
    before = snapshot(loaded)
    for bad in (a + 64, b + 4096, BASE - 64, BASE + 200 * MiB, 0, a + 1):
        with pytest.raises(ascmem.InvalidFreeError):
            loaded.free(bad)
    with pytest.raises(ascmem.InvalidArgumentError):
        loaded.free(-1)
    with pytest.raises(ascmem.ArgumentTypeError):
        loaded.free("0x1000")
    assert snapshot(loaded) == before
    loaded.free(a)
    with pytest.raises(ascmem.InvalidFreeError):  # double free
        loaded.free(a)
    loaded.check()


def test_free_after_reset(loaded):
    a = loaded.alloc(5000)
    loaded.reset()
    before = snapshot(loaded)
    with pytest.raises(ascmem.InvalidFreeError):
        loaded.free(a)
    assert snapshot(loaded) == before
    loaded.check()


def test_free_many_with_a_bad_address_frees_the_good_ones(loaded):
    a, b = loaded.alloc(10), loaded.alloc(20)
    with pytest.raises(ascmem.InvalidFreeError):
        loaded.free_many([a, 12345, b])
    with pytest.raises(ascmem.InvalidFreeError):
        loaded.free(a)
    loaded.check()


def test_errors_carry_cann_codes():
    assert ascmem.OutOfMemoryError.code == 207001
    assert ascmem.InvalidArgumentError.code == 100000
    assert ascmem.InvalidFreeError.code == 207002
    assert ascmem.UnsupportedError.code == 207000
    assert issubclass(ascmem.OutOfMemoryError, MemoryError)
    assert issubclass(ascmem.InvalidArgumentError, ValueError)
    assert issubclass(ascmem.InvalidFreeError, ValueError)


@pytest.mark.parametrize("kwargs", [
    dict(size=0), dict(size=5000), dict(size=MiB, min_block=3000), dict(size=MiB, base=100),
    dict(size=-1), dict(size=MiB, min_block=0),
])
@pytest.mark.parametrize("cls", [ascmem.Pool, ascmem.BuddyAllocator])
def test_bad_construction(cls, kwargs):
    kwargs = dict(kwargs)
    size = kwargs.pop("size")
    with pytest.raises(ascmem.InvalidArgumentError):
        cls(size, **kwargs)


class _Int(int):
    """An int subclass, as IntEnum members are."""


@pytest.mark.parametrize("value,exc", [(_Int(-1), ascmem.InvalidArgumentError),
                                       (_Int(1 << 64), ascmem.InvalidArgumentError),
                                       (True, ascmem.ArgumentTypeError)])
def test_int_subclasses_are_checked_like_ints(allocator, value, exc):
    before = snapshot(allocator)
    with pytest.raises(exc):
        allocator.alloc(value)
    assert snapshot(allocator) == before


def test_int_subclasses_are_sizes_and_policies():
    pool = ascmem.Pool(64 * MiB, base=BASE)
    a = pool.alloc(_Int(4096))
    assert pool.usable_size(a) == 4096
    pool.free(_Int(a))
    dev = ascmem.Device("atlas-training")
    p = dev.malloc(4 * MiB, ascmem.Policy.NORMAL_ONLY)
    assert dev.kind_of(p) == ascmem.MemKind.NORMAL
    with pytest.raises(ascmem.InvalidArgumentError):
        dev.malloc(64, _Int(-1))
    dev.free(p)
    assert pool.check() is None and dev.check() is None


def test_importing_ascmem_does_not_import_numpy():
    import subprocess
    import sys
    code = "import sys, ascmem; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
