"""Pool.alloc, Pool.free, Device.malloc and Device.free called positionally,
by keyword or both: every form gives the same block and the same error, and
the methods keep their names, signatures and documentation."""

import inspect

import pytest

import ascmem
from ascmem import MemKind, Policy


@pytest.fixture
def dev():  # sim backend: addresses only
    d = ascmem.Device("atlas-training")
    yield d
    d.check()
    d.close()


def test_every_way_of_calling_malloc_gives_the_same_block(dev):
    calls = [
        lambda: dev.malloc(1000),
        lambda: dev.malloc(1000, 0),
        lambda: dev.malloc(1000, 0, None),
        lambda: dev.malloc(1000, 0, None, None),
        lambda: dev.malloc(size=1000),
        lambda: dev.malloc(1000, policy=0),
        lambda: dev.malloc(1000, tag=None),
    ]
    for call in calls:
        p = call()
        assert dev.usable_size(p) == 1056  # ALIGN_UP(1000, 32) + 32
        assert dev.kind_of(p) == MemKind.NORMAL
        dev.free(p)
    assert dev.memory_stats()["allocation.all.current"] == 0


def test_a_positional_policy_is_honoured(dev):
    huge = dev.malloc(64, Policy.HUGE_ONLY)
    normal = dev.malloc(64)
    assert dev.kind_of(huge) == MemKind.HUGE
    assert dev.kind_of(normal) == MemKind.NORMAL
    dev.free(huge)
    dev.free(normal)


def test_a_positional_stream_on_free_still_waits_for_it(dev):
    p = dev.malloc(1 << 20)
    dev.free(p, "s1")  # two positional arguments: the general wrapper
    assert dev.pending_bytes() > 0
    dev.synchronize("s1")
    assert dev.pending_bytes() == 0


def test_positional_stream_and_tag_on_malloc_still_count():
    d = ascmem.Device("atlas-a2-training", memory=8 << 30, paged=True)
    p = d.malloc(4 << 20, 0, None, "kv")  # four positional arguments: the general wrapper
    assert d.sleep("kv") > 0  # the tag took it
    d.wake("kv")
    q = d.malloc(4 << 20, 0, "s1")
    d.free(q, "s1")
    assert d.malloc(4 << 20, 0, "s1") == q  # the same stream's freed block, at once
    d.free(p)
    d.check()
    d.close()


def _raised(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the type and text are compared
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize("fast, general", [
    (lambda d: d.malloc("x"), lambda d: d.malloc(size="x")),
    (lambda d: d.malloc(-1), lambda d: d.malloc(size=-1)),
    (lambda d: d.malloc(0), lambda d: d.malloc(size=0)),
    (lambda d: d.malloc(1 << 70), lambda d: d.malloc(size=1 << 70)),
    (lambda d: d.malloc(64, -5), lambda d: d.malloc(64, policy=-5)),
    (lambda d: d.malloc(64, "huge"), lambda d: d.malloc(64, policy="huge")),
    (lambda d: d.malloc(64, Policy.HUGE1G_ONLY), lambda d: d.malloc(64, policy=Policy.HUGE1G_ONLY)),
    (lambda d: d.free("x"), lambda d: d.free(ptr="x")),
    (lambda d: d.free(12345), lambda d: d.free(ptr=12345)),
    (lambda d: d.free(-1), lambda d: d.free(ptr=-1)),
])
def test_bad_arguments_raise_as_through_keywords(dev, fast, general):
    got = _raised(lambda: fast(dev))
    assert got is not None
    assert got == _raised(lambda: general(dev))


@pytest.mark.parametrize("call", [
    lambda d: d.malloc(),
    lambda d: d.malloc(1, 2, 3, 4, 5),
    lambda d: d.malloc(1, nonsense=2),
    lambda d: d.free(),
    lambda d: d.free(1, 2, 3),
])
def test_wrong_argument_counts_are_type_errors(dev, call):
    with pytest.raises(TypeError):
        call(dev)


def test_a_closed_device_refuses_either_way():
    d = ascmem.Device("atlas-training")
    p = d.malloc(64)
    d.close()
    assert _raised(lambda: d.malloc(64)) == _raised(lambda: d.malloc(size=64))
    assert _raised(lambda: d.malloc(64))[0] is ascmem.DeviceClosedError
    assert _raised(lambda: d.free(p)) == _raised(lambda: d.free(ptr=p))


def test_the_methods_keep_their_names_signatures_and_docs():
    assert ascmem.Device.malloc.__name__ == "malloc"
    assert ascmem.Device.malloc.__qualname__ == "Device.malloc"
    assert str(inspect.signature(ascmem.Device.malloc)) == \
        "(self, /, size, policy=0, stream=None, tag=None)"
    assert str(inspect.signature(ascmem.Device.free)) == "(self, /, ptr, stream=None)"
    assert ascmem.Device.malloc.__doc__.startswith("aclrtMalloc")
    assert ascmem.Device.free.__doc__.startswith("aclrtFree")


@pytest.mark.parametrize("call", [
    lambda: ascmem.Device.malloc(object(), 64),
    lambda: ascmem.Device.malloc(ascmem.Pool(1 << 20), 64),
    lambda: ascmem.Device.free(object(), 64),
    lambda: ascmem.Device.malloc(),
])
def test_the_unbound_methods_refuse_anything_but_a_device(call):
    with pytest.raises(TypeError):
        call()


def test_a_bound_method_keeps_its_device_alive():
    d = ascmem.Device("atlas-training")
    malloc, free = d.malloc, d.free
    del d
    import gc
    gc.collect()
    free(malloc(64))


# ---- Pool.alloc and Pool.free

@pytest.fixture
def pool():
    p = ascmem.Pool(64 << 20, base=1 << 32)
    yield p
    p.check()
    p.close()


@pytest.mark.parametrize("nbytes", [1, 64, 1000, 40 << 10, 3 << 20])
def test_every_way_of_calling_alloc_gives_the_same_block(pool, nbytes):
    calls = [
        lambda: pool.alloc(nbytes),
        lambda: pool.alloc(nbytes, 64),
        lambda: pool.alloc(nbytes=nbytes),
        lambda: pool.alloc(nbytes, align=64),
        lambda: ascmem.Pool.alloc(pool, nbytes),
    ]
    frees = [
        lambda a: pool.free(a),
        lambda a: pool.free(addr=a),
        lambda a: ascmem.Pool.free(pool, a),
    ]
    seen = set()
    for i, call in enumerate(calls):
        a = call()
        seen.add((a, pool.usable_size(a)))
        assert a % 64 == 0
        frees[i % len(frees)](a)
    assert len(seen) == 1  # the same block each time
    assert pool.stats()["live_count"] == 0


@pytest.mark.parametrize("align", [4096, 1 << 20])
def test_a_positional_align_is_honoured(pool, align):
    blocks = [pool.alloc(100, align) for _ in range(3)]
    assert all(a % align == 0 for a in blocks)
    for a in blocks:
        pool.free(a)


@pytest.mark.parametrize("fast, general", [
    (lambda p: p.alloc("x"), lambda p: p.alloc(nbytes="x")),
    (lambda p: p.alloc(-1), lambda p: p.alloc(nbytes=-1)),
    (lambda p: p.alloc(0), lambda p: p.alloc(nbytes=0)),
    (lambda p: p.alloc(1 << 70), lambda p: p.alloc(nbytes=1 << 70)),
    (lambda p: p.alloc(128 << 20), lambda p: p.alloc(nbytes=128 << 20)),
    (lambda p: p.alloc(64, 3), lambda p: p.alloc(64, align=3)),
    (lambda p: p.alloc(64, -64), lambda p: p.alloc(64, align=-64)),
    (lambda p: p.alloc(64, 1.5), lambda p: p.alloc(64, align=1.5)),
    (lambda p: p.free("x"), lambda p: p.free(addr="x")),
    (lambda p: p.free(12345), lambda p: p.free(addr=12345)),
    (lambda p: p.free(-1), lambda p: p.free(addr=-1)),
    (lambda p: p.free(None), lambda p: p.free(addr=None)),
])
def test_pool_bad_arguments_raise_as_through_keywords(pool, fast, general):
    got = _raised(lambda: fast(pool))
    assert got is not None
    assert got == _raised(lambda: general(pool))


def test_a_double_free_raises_the_same_either_way(pool):
    a = pool.alloc(64)
    pool.free(a)
    assert _raised(lambda: pool.free(a)) == _raised(lambda: pool.free(addr=a))
    assert _raised(lambda: pool.free(a))[0] is ascmem.InvalidFreeError


@pytest.mark.parametrize("call", [
    lambda p: p.alloc(),
    lambda p: p.alloc(1, 64, 3),
    lambda p: p.alloc(1, nonsense=2),
    lambda p: p.free(),
    lambda p: p.free(1, 2),
    lambda p: p.free(1, addr=1),
])
def test_pool_wrong_argument_counts_are_type_errors(pool, call):
    with pytest.raises(TypeError):
        call(pool)


def test_a_closed_pool_refuses_either_way():
    p = ascmem.Pool(1 << 20)
    a = p.alloc(64)
    p.close()
    assert _raised(lambda: p.alloc(64)) == _raised(lambda: p.alloc(nbytes=64))
    assert _raised(lambda: p.alloc(64))[0] is ascmem.ClosedError
    assert _raised(lambda: p.free(a)) == _raised(lambda: p.free(addr=a))
    assert _raised(lambda: p.free(a))[0] is ascmem.ClosedError


def test_the_pool_methods_keep_their_names_signatures_and_docs():
    assert ascmem.Pool.alloc.__name__ == "alloc"
    assert ascmem.Pool.alloc.__qualname__ == "Pool.alloc"
    assert str(inspect.signature(ascmem.Pool.alloc)) == "(self, /, nbytes, align=64)"
    assert str(inspect.signature(ascmem.Pool.free)) == "(self, /, addr)"
    assert ascmem.Pool.alloc.__doc__.startswith("Allocates nbytes")
    assert ascmem.Pool.free.__doc__.startswith("Frees the block")


@pytest.mark.parametrize("call", [
    lambda: ascmem.Pool.alloc(object(), 64),
    lambda: ascmem.Pool.alloc(ascmem.Device("atlas-training"), 64),
    lambda: ascmem.Pool.free(object(), 64),
    lambda: ascmem.Pool.alloc(),
])
def test_the_unbound_pool_methods_refuse_anything_but_a_pool(call):
    with pytest.raises(TypeError):
        call()


def test_a_bound_method_keeps_its_pool_alive():
    p = ascmem.Pool(1 << 20)
    alloc, free = p.alloc, p.free
    del p
    import gc
    gc.collect()
    free(alloc(64))
