"""The drop-in against the runtime's source, second review (issues 45 and
46): stream-ordered pools count 2 MB blocks, refused calls change nothing,
the external allocator answers codes, and the recording stand-in is no
stricter than the runtime.  Sources are cited next to each rule in
ascmem/stream_pools.py, ascmem/acl_allocator.py and tests/fake_acl.py."""
import fractions

import pytest

import ascmem
from ascmem import acl, acl_soma, stream_pools as sp
from ascmem.errors import (ACL_ERROR_INVALID_PARAM, ACL_ERROR_RT_INTERNAL_ERROR,
                           ACL_ERROR_RT_PARAM_INVALID, ACL_SUCCESS)

import fake_acl
from conftest import MiB


@pytest.fixture
def dev(acl_a2_device):
    return acl_a2_device


@pytest.fixture
def stream():
    s, ret = acl.rt.create_stream()
    assert ret == ACL_SUCCESS
    yield s
    acl.rt.destroy_stream(s)


def make_pool(max_size):
    props = {"allocType": 0, "handleType": 0, "location": {"id": 0, "type": 1},
             "maxSize": max_size}
    handle, ret = acl.rt.mem_pool_create(props)
    assert ret == ACL_SUCCESS
    return handle


def attr(pool, a):
    value, ret = acl.rt.mem_pool_get_attr(pool, a)
    assert ret == ACL_SUCCESS
    return value


def books(pool):
    s = acl_soma.pool_stats(pool)
    return s["used"], s["reserved"], s["live_blocks"], s["cached_blocks"]


# ---- issue 46.1: every allocation of a stream-ordered pool is 2 MB ---------------------

def test_a_4_kib_request_uses_and_reserves_2_mib(dev, stream):
    pool = make_pool(64 * MiB)
    p, ret = acl.rt.mem_pool_malloc_async(4096, pool, stream)
    assert ret == ACL_SUCCESS
    assert attr(pool, sp.ATTR_USED_MEM_CURRENT) == attr(pool, sp.ATTR_RESERVED_MEM_CURRENT) \
        == 2 * MiB
    assert dev.usable_size(p) == 2 * MiB  # the Device charges what the pool counts
    acl.rt.mem_pool_free_async(p, stream)
    acl_soma._pools[pool].check()
    assert acl.rt.mem_pool_destroy(pool) == ACL_SUCCESS


def test_a_4_mib_pool_holds_two_small_allocations_not_three(dev, stream):
    pool = make_pool(4 * MiB)
    got = [acl.rt.mem_pool_malloc_async(4096, pool, stream) for _ in range(3)]
    assert [ret for _, ret in got[:2]] == [ACL_SUCCESS, ACL_SUCCESS]
    assert got[2] == (0, ACL_ERROR_RT_INTERNAL_ERROR)  # RT_ERROR_MEM_POOL_ALLOC: no room
    for p, _ in got[:2]:
        assert acl.rt.mem_pool_free_async(p, stream) == ACL_SUCCESS
    assert acl.rt.mem_pool_destroy(pool) == ACL_SUCCESS


def test_the_device_charges_what_the_pool_reserves(dev, stream):
    """Pool memory is mapped in whole 2 MB granules, not cut from an
    aclrtMalloc block: no 32-byte tail after each block, so blocks sit on
    granule boundaries and cost the device exactly the pool's RESERVED, even
    among other allocations."""
    pool = make_pool(64 * MiB)
    huge_before = dev.budget()["huge_used"]
    other = dev.malloc(3 * MiB)  # a block with the aclrtMalloc tail in between
    other_cost = dev.budget()["huge_used"] - huge_before
    got = [acl.rt.mem_pool_malloc_async(n, pool, stream)[0] for n in (4096, 2 * MiB, 3 * MiB)]
    assert all(p % (2 * MiB) == 0 for p in got)
    reserved, _ = acl.rt.mem_pool_get_attr(pool, sp.ATTR_RESERVED_MEM_CURRENT)
    assert reserved == 8 * MiB
    assert dev.budget()["huge_used"] - huge_before - other_cost == reserved
    for p in got:
        assert acl.rt.mem_pool_free_async(p, stream) == ACL_SUCCESS
    assert acl.rt.synchronize_stream(stream) == ACL_SUCCESS
    assert acl.rt.mem_pool_destroy(pool) == ACL_SUCCESS
    dev.free(other)
    dev.check()
    assert dev.budget()["huge_used"] == huge_before


def test_a_size_whose_2_mb_rounding_overflows_is_refused(dev, stream):
    pool = make_pool(4 * MiB)
    assert acl.rt.mem_pool_malloc_async((1 << 64) - 1, pool, stream) == \
        (0, ACL_ERROR_RT_PARAM_INVALID)
    assert books(pool) == (0, 0, 0, 0)
    assert acl.rt.mem_pool_destroy(pool) == ACL_SUCCESS


# ---- issue 46.6: the _HIGH attributes reset to 0 -----------------------------------------

@pytest.mark.parametrize("high", [sp.ATTR_USED_MEM_HIGH, sp.ATTR_RESERVED_MEM_HIGH])
def test_resetting_a_high_attribute_sets_it_to_zero_not_to_the_current_value(dev, stream, high):
    pool = make_pool(64 * MiB)
    p, _ = acl.rt.mem_pool_malloc_async(4096, pool, stream)
    assert acl.rt.mem_pool_set_attr(pool, high, 0) == ACL_SUCCESS
    assert attr(pool, high) == 0            # stream_mem_pool.cc lines 511, 519
    q, _ = acl.rt.mem_pool_malloc_async(4096, pool, stream)
    assert attr(pool, high) == 4 * MiB      # the next allocation raises it again
    for ptr in (p, q):
        acl.rt.mem_pool_free_async(ptr, stream)
    assert acl.rt.mem_pool_destroy(pool) == ACL_SUCCESS


# ---- issue 45.3: a refused free changes nothing ------------------------------------------

@pytest.mark.parametrize("bad_stream", [[1], {"s": 1}, bytearray(b"s")])
def test_free_async_with_an_unhashable_stream_is_refused_and_changes_nothing(dev, stream,
                                                                             bad_stream):
    pool = make_pool(64 * MiB)
    p, _ = acl.rt.mem_pool_malloc_async(4096, pool, stream)
    before = books(pool)
    assert acl.rt.mem_pool_free_async(p, bad_stream) == ACL_ERROR_INVALID_PARAM
    assert books(pool) == before == (2 * MiB, 2 * MiB, 1, 0)
    acl_soma._pools[pool].check()
    dev.check()
    assert acl.rt.mem_pool_free_async(p, stream) == ACL_SUCCESS  # still freeable
    assert acl.rt.mem_pool_destroy(pool) == ACL_SUCCESS


# ---- issue 45.13: the streams malloc_async refuses, the interior free's code --------------

@pytest.mark.parametrize("bad_stream", [None, 0, [1], {"s": 1}])
def test_malloc_async_refuses_a_null_or_unhashable_stream(dev, bad_stream):
    pool = make_pool(64 * MiB)
    # a null stream: memory.cpp line 2150 (ACL_ERROR_INVALID_PARAM)
    assert acl.rt.mem_pool_malloc_async(4096, pool, bad_stream) == (0, ACL_ERROR_INVALID_PARAM)
    assert books(pool) == (0, 0, 0, 0)
    assert acl.rt.mem_pool_destroy(pool) == ACL_SUCCESS


def test_an_interior_pointer_freed_to_the_pool_answers_107000_and_changes_nothing(dev, stream):
    pool = make_pool(64 * MiB)
    p, _ = acl.rt.mem_pool_malloc_async(4096, pool, stream)
    before = books(pool)
    # RT_ERROR_INVALID_VALUE (api_impl_soma.cc line 134) -> ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.mem_pool_free_async(p + 4096, stream) == ACL_ERROR_RT_PARAM_INVALID
    assert books(pool) == before
    assert acl.rt.mem_pool_free_async(p, stream) == ACL_SUCCESS
    # inside a cached block too
    assert acl.rt.mem_pool_free_async(p + 64, stream) == ACL_ERROR_RT_PARAM_INVALID
    dev.check()
    assert acl.rt.mem_pool_destroy(pool) == ACL_SUCCESS


# ---- issue 45.14 and 46.7: the external allocator answers codes --------------------------

@pytest.mark.parametrize("stream,device", [(7, "dev"), (7, 3), (None, None), (0, None),
                                           ([1], None)])
def test_register_allocator_with_bad_arguments_answers_a_code(dev, stream, device):
    fake = fake_acl.make()
    assert acl.register_allocator(stream, device, module=fake) == ACL_ERROR_INVALID_PARAM
    assert not fake.registered and not fake.descs


@pytest.mark.parametrize("stream", [[1], {"a": 1}, None, 0])
def test_unregister_allocator_with_a_bad_stream_answers_a_code(stream):
    assert acl.unregister_allocator(stream) == ACL_ERROR_INVALID_PARAM


def test_unregister_of_a_stream_never_registered_or_twice_succeeds(dev):
    fake = fake_acl.make()
    assert acl.unregister_allocator("never") == ACL_SUCCESS
    assert acl.register_allocator("s", dev, module=fake) == ACL_SUCCESS
    assert acl.unregister_allocator("s") == ACL_SUCCESS
    assert acl.unregister_allocator("s") == ACL_SUCCESS
    assert not fake.descs
    # the stand-in answers as the runtime does (allocator.cpp lines 179-186)
    assert fake.rt.allocator_unregister("never") == ACL_SUCCESS
    assert fake.rt.allocator_unregister(0) == ACL_ERROR_INVALID_PARAM


# ---- issue 46.8: the stand-in is no stricter than the runtime -----------------------------

def test_the_stand_in_registers_a_descriptor_without_an_alloc_advise_function():
    fake = fake_acl.make()
    desc = fake.rt.allocator_create_desc()
    assert fake.rt.allocator_set_obj_to_desc(desc, 0x1234) == ACL_SUCCESS
    assert fake.rt.allocator_set_alloc_func_to_desc(desc, lambda a, n: 0) == ACL_SUCCESS
    assert fake.rt.allocator_set_free_func_to_desc(desc, lambda a, b: None) == ACL_SUCCESS
    # no alloc-advise function: optional (allocator.cpp lines 121-131)
    assert fake.rt.allocator_register("s", desc) == ACL_ERROR_INVALID_PARAM  # get-addr missing
    assert fake.rt.allocator_set_get_addr_from_block_func_to_desc(desc, lambda b: b) == \
        ACL_SUCCESS
    assert fake.rt.allocator_register("s", desc) == ACL_SUCCESS
    assert fake.rt.allocator_get_by_stream("s")[4] is None


def test_the_stand_in_defers_freeing_a_mapped_handle_to_its_unmap():
    fake = fake_acl.make()
    prop = {"handleType": 0, "allocationType": 0, "location": {"type": 1, "id": 0},
            "memAttr": 4}
    base, _ = fake.rt.reserve_mem_address(2 * MiB, 0, 0, 0)
    h, _ = fake.rt.malloc_physical(2 * MiB, prop, 0)
    assert fake.rt.map_mem(base, 2 * MiB, 0, h, 0) == ACL_SUCCESS
    # 11-04_virtual_memory_management.md line 180: accepted, released at the unmap
    assert fake.rt.free_physical(h) == ACL_SUCCESS
    assert h in fake.physical
    assert fake.rt.free_physical(h) == ACL_ERROR_INVALID_PARAM  # once only
    assert fake.rt.unmap_mem(base) == ACL_SUCCESS
    assert h not in fake.physical
    assert fake.rt.release_mem_address(base) == ACL_SUCCESS


# ---- issue 46.3: the sim paged backend maps what the acl backend would -------------------

@pytest.mark.parametrize("sizes", [[4096], [100, 4096, 70000], [3 * MiB + 5, 100]])
def test_sim_paged_maps_normal_memory_in_2_mb_granules_as_acl_does(sizes):
    sim = ascmem.Device("atlas-a2-training", paged=True)
    fake = fake_acl.make()
    real = ascmem.Device("atlas-a2-training", backend="acl", acl_module=fake, paged=True)
    blocks = {}
    for d in (sim, real):
        blocks[d] = [d.malloc(n, ascmem.Policy.NORMAL_ONLY) for n in sizes]
        d.check()
    # devmm_svm.c lines 60-61, 6971-6978: device memory of any page type maps
    # in 2 MB granules
    assert sim.stats()["normal"]["mapped"] == real.stats()["normal"]["mapped"] \
        == sum(fake.physical.values())
    assert sim.stats()["normal"]["mapped"] % (2 * MiB) == 0
    for d in (sim, real):
        for p in blocks[d]:
            d.free(p)
        d.close()


# ---- found by fuzz/fuzz_stream_pools.py: a pointer that only compares equal --------------

@pytest.mark.parametrize("as_other", [float, fractions.Fraction])
def test_a_float_equal_to_a_pool_block_is_not_that_block(dev, stream, as_other):
    """pyACL's pointers are ints.  A float equal to a block's address once
    freed it to the pool, the pool then handed the float out as a pointer,
    and giving it back to the Device failed part-way: the block left the
    pool's books but stayed allocated on the Device after the pool was
    destroyed (a leak), and a synchronize answered 100000."""
    pool = make_pool(64 * MiB)
    p, _ = acl.rt.mem_pool_malloc_async(4096, pool, stream)
    before = books(pool)
    assert acl.rt.mem_pool_free_async(as_other(p), stream) != ACL_SUCCESS
    assert books(pool) == before
    assert acl.rt.free(as_other(p)) != ACL_SUCCESS
    assert books(pool) == before
    assert acl.rt.mem_pool_free_async(p, stream) == ACL_SUCCESS
    q, ret = acl.rt.mem_pool_malloc_async(4096, pool, stream)
    assert ret == ACL_SUCCESS and type(q) is int
    assert acl.rt.mem_pool_free_async(q, stream) == ACL_SUCCESS
    other, _ = acl.rt.create_stream()
    assert acl.rt.synchronize_stream(other) == ACL_SUCCESS
    assert acl.rt.mem_pool_destroy(pool) == ACL_SUCCESS
    acl.rt.destroy_stream(other)
    dev.synchronize()
    dev.check()
    assert dev.stats()["huge"]["live_count"] == 0


def test_an_integer_like_pointer_frees_its_block(dev, stream):
    """An object with __index__ (a numpy integer) is the int it stands for,
    as in pyACL's argument parsing."""
    np = pytest.importorskip("numpy")
    pool = make_pool(64 * MiB)
    p, _ = acl.rt.mem_pool_malloc_async(4096, pool, stream)
    assert acl.rt.mem_pool_free_async(np.uint64(p), stream) == ACL_SUCCESS
    assert books(pool) == (0, 2 * MiB, 0, 1)
    q, _ = acl.rt.mem_pool_malloc_async(4096, pool, stream)
    assert type(q) is int and q == p
    assert acl.rt.free(np.int64(q)) == ACL_SUCCESS
    assert books(pool) == (0, 0, 0, 0)
    assert acl.rt.mem_pool_destroy(pool) == ACL_SUCCESS
    dev.check()
