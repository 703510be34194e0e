"""CANN's stream-ordered memory pools through the drop-in (acl.rt.mem_pool_*):
every attribute, every reuse mode, the release threshold, trimming, and the
runtime's error codes for misuse.  Rules: hicann/runtime's
src/runtime/feature/soma/ (cited in ascmem/stream_pools.py)."""
import threading

import pytest

import ascmem
from ascmem import acl, acl_soma, stream_pools as sp
from ascmem.errors import (ACL_ERROR_INVALID_PARAM, ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                           ACL_ERROR_RT_INTERNAL_ERROR, ACL_ERROR_RT_MEMORY_FREE,
                           ACL_ERROR_RT_PARAM_INVALID, ACL_SUCCESS)

import fake_acl
from conftest import GiB, MiB


def props(max_size=1 * GiB, device_id=0, **extra):
    p = {"allocType": 0, "handleType": 0, "location": {"id": device_id, "type": 1},
         "maxSize": max_size}
    p.update(extra)
    return p


@pytest.fixture
def dev(acl_a2_device):
    return acl_a2_device


@pytest.fixture
def pool(dev):
    handle, ret = acl.rt.mem_pool_create(props())
    assert ret == ACL_SUCCESS and handle
    yield handle
    acl.rt.mem_pool_destroy(handle)


def streams(n):
    return [acl.rt.create_stream()[0] for _ in range(n)]


def malloc(pool, size, stream):
    ptr, ret = acl.rt.mem_pool_malloc_async(size, pool, stream)
    assert ret == ACL_SUCCESS, ret
    return ptr


def attr(pool, a):
    value, ret = acl.rt.mem_pool_get_attr(pool, a)
    assert ret == ACL_SUCCESS
    return value


def check(dev, pool):
    acl_soma._pools[pool].check()
    dev.check()


# ---- creation -----------------------------------------------------------------------

def test_create_rounds_the_size_up_to_2mb_and_zero_means_the_whole_device(dev):
    handle, ret = acl.rt.mem_pool_create(props(max_size=3 * MiB + 1))
    assert ret == ACL_SUCCESS and acl_soma.pool_stats(handle)["max_size"] == 4 * MiB
    whole, ret = acl.rt.mem_pool_create(props(max_size=0))
    _, total = dev.get_mem_info(ascmem.rules.MemAttr.HBM_MEM)
    assert acl_soma.pool_stats(whole)["max_size"] == total // (2 * MiB) * (2 * MiB)
    for h in (handle, whole):
        assert acl.rt.mem_pool_destroy(h) == ACL_SUCCESS


@pytest.mark.parametrize("bad,code", [
    ("not a dict", ACL_ERROR_INVALID_PARAM),
    (props(allocType=1), ACL_ERROR_INVALID_PARAM),                      # only pinned memory
    (props(location={"id": 0, "type": 2}), ACL_ERROR_INVALID_PARAM),    # only device memory
    (props(reserved=[0] * 31 + [1]), ACL_ERROR_INVALID_PARAM),          # reserved must be zero
    (props(max_size=-1), ACL_ERROR_INVALID_PARAM),
    (props(max_size=1 << 40), ACL_ERROR_RT_PARAM_INVALID),              # more than the device
    (props(device_id=7), ACL_ERROR_RT_PARAM_INVALID),                   # no such device set
])
def test_create_refuses_bad_props(dev, bad, code):
    handle, ret = acl.rt.mem_pool_create(bad)
    assert (handle, ret) == (0, code)


@pytest.mark.parametrize("model", ["atlas-inference", "atlas-training", "atlas-a3",
                                   "atlas-200i-a2", "atlas-inference-series"])
def test_products_without_stream_pools_say_not_supported(model):
    acl.use(ascmem.Device(model))
    try:
        assert acl.rt.mem_pool_create(props(max_size=64 * MiB)) == \
            (0, ACL_ERROR_RT_FEATURE_NOT_SUPPORT)
    finally:
        acl.use(None)


# ---- attributes -----------------------------------------------------------------------

def test_attribute_defaults(pool):
    assert [attr(pool, a) for a in range(1, 9)] == [0, 0, 0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize("a", [sp.REUSE_FOLLOW_EVENT_DEPENDENCIES, sp.REUSE_ALLOW_OPPORTUNISTIC,
                               sp.REUSE_ALLOW_INTERNAL_DEPENDENCIES])
def test_reuse_attributes_are_flags(pool, a):
    assert acl.rt.mem_pool_set_attr(pool, a, 7) == ACL_SUCCESS
    assert attr(pool, a) == 1  # any non-zero value is 1
    assert acl.rt.mem_pool_set_attr(pool, a, 0) == ACL_SUCCESS
    assert attr(pool, a) == 0


def test_release_threshold_up_to_the_pool_size(pool):
    assert acl.rt.mem_pool_set_attr(pool, sp.ATTR_RELEASE_THRESHOLD, 64 * MiB) == ACL_SUCCESS
    assert attr(pool, sp.ATTR_RELEASE_THRESHOLD) == 64 * MiB
    assert acl.rt.mem_pool_set_attr(pool, sp.ATTR_RELEASE_THRESHOLD, 2 * GiB) == \
        ACL_ERROR_RT_INTERNAL_ERROR
    assert attr(pool, sp.ATTR_RELEASE_THRESHOLD) == 64 * MiB  # unchanged


def test_current_attributes_count_used_and_reserved_bytes(dev, pool):
    s, = streams(1)
    a = malloc(pool, 1000, s)
    b = malloc(pool, 5 * MiB, s)
    need = 2 * MiB + 6 * MiB  # each rounded up to 2 MB, as the runtime counts them
    assert attr(pool, sp.ATTR_USED_MEM_CURRENT) == attr(pool, sp.ATTR_RESERVED_MEM_CURRENT) == need
    assert acl.rt.mem_pool_free_async(b, s) == ACL_SUCCESS
    assert attr(pool, sp.ATTR_USED_MEM_CURRENT) == 2 * MiB
    assert attr(pool, sp.ATTR_RESERVED_MEM_CURRENT) == need  # a free keeps the memory
    assert attr(pool, sp.ATTR_USED_MEM_HIGH) == attr(pool, sp.ATTR_RESERVED_MEM_HIGH) == need
    acl.rt.mem_pool_free_async(a, s)
    check(dev, pool)


@pytest.mark.parametrize("a", [sp.ATTR_RESERVED_MEM_CURRENT, sp.ATTR_USED_MEM_CURRENT])
def test_current_attributes_are_read_only(pool, a):
    assert acl.rt.mem_pool_set_attr(pool, a, 0) == ACL_ERROR_RT_PARAM_INVALID


@pytest.mark.parametrize("high,current", [(sp.ATTR_USED_MEM_HIGH, sp.ATTR_USED_MEM_CURRENT),
                                          (sp.ATTR_RESERVED_MEM_HIGH,
                                           sp.ATTR_RESERVED_MEM_CURRENT)])
def test_high_attributes_reset_with_zero_only(dev, pool, high, current):
    s, = streams(1)
    big = malloc(pool, 8 * MiB, s)
    small = malloc(pool, 1 * MiB, s)
    acl.rt.mem_pool_free_async(big, s)
    acl.rt.synchronize_stream(s)  # the threshold is 0: the freed block goes back
    assert attr(pool, high) > attr(pool, current)
    assert acl.rt.mem_pool_set_attr(pool, high, 5) == ACL_ERROR_RT_INTERNAL_ERROR
    assert acl.rt.mem_pool_set_attr(pool, high, 0) == ACL_SUCCESS
    # to 0, not to the current value (stream_mem_pool.cc lines 511, 519)
    assert attr(pool, high) == 0 < attr(pool, current)
    acl.rt.mem_pool_free_async(small, s)
    check(dev, pool)


@pytest.mark.parametrize("call", ["set", "get"])
def test_unknown_attribute_and_bad_values(pool, call):
    if call == "set":
        assert acl.rt.mem_pool_set_attr(pool, 9, 0) == ACL_ERROR_RT_INTERNAL_ERROR
        assert acl.rt.mem_pool_set_attr(pool, 0, 0) == ACL_ERROR_RT_INTERNAL_ERROR
        assert acl.rt.mem_pool_set_attr(pool, sp.ATTR_RELEASE_THRESHOLD, None) == \
            ACL_ERROR_RT_PARAM_INVALID
        assert acl.rt.mem_pool_set_attr(pool, sp.ATTR_RELEASE_THRESHOLD, 1.5) == \
            ACL_ERROR_RT_PARAM_INVALID
    else:
        assert acl.rt.mem_pool_get_attr(pool, 9) == (0, ACL_ERROR_RT_INTERNAL_ERROR)


def test_attributes_of_a_pool_that_is_not_there(dev):
    handle, _ = acl.rt.mem_pool_create(props())
    assert acl.rt.mem_pool_destroy(handle) == ACL_SUCCESS
    for h in (handle, 12345):
        assert acl.rt.mem_pool_set_attr(h, 1, 1) == ACL_ERROR_RT_PARAM_INVALID
        assert acl.rt.mem_pool_get_attr(h, 1) == (0, ACL_ERROR_RT_PARAM_INVALID)
    assert acl.rt.mem_pool_set_attr(0, 1, 1) == ACL_ERROR_INVALID_PARAM  # the ACL layer's check


# ---- reuse ------------------------------------------------------------------------------

def test_same_stream_reuses_at_once_without_any_mode(dev, pool):
    s, = streams(1)
    a = malloc(pool, 4096, s)
    acl.rt.mem_pool_free_async(a, s)
    assert malloc(pool, 4000, s) == a
    assert acl_soma.pool_stats(pool)["served"]["same_stream"] == 1
    acl.rt.mem_pool_free_async(a, s)
    check(dev, pool)


def test_another_stream_gets_fresh_memory_without_a_mode(dev, pool):
    s1, s2 = streams(2)
    a = malloc(pool, 4096, s1)
    acl.rt.mem_pool_free_async(a, s1)
    b = malloc(pool, 4096, s2)
    assert b != a and acl_soma.pool_stats(pool)["served"]["fresh"] == 2
    acl.rt.mem_pool_free_async(b, s2)
    check(dev, pool)


def test_a_cached_block_far_larger_than_the_request_is_not_used(dev, pool):
    s, = streams(1)
    big = malloc(pool, 5 * MiB, s)  # 6 MiB in the pool's books
    acl.rt.mem_pool_free_async(big, s)
    small = malloc(pool, 1000, s)   # 2 MiB
    assert small != big  # it would waste most of the block: the Device has a better fit
    acl.rt.mem_pool_free_async(small, s)
    check(dev, pool)


def test_follow_event_dependencies(dev, pool):
    s1, s2 = streams(2)
    assert acl.rt.mem_pool_set_attr(pool, sp.REUSE_FOLLOW_EVENT_DEPENDENCIES, 1) == ACL_SUCCESS
    early, _ = acl.rt.create_event()
    acl.rt.record_event(early, s1)  # before the free: orders nothing about it
    a = malloc(pool, 4096, s1)
    acl.rt.mem_pool_free_async(a, s1)
    acl.rt.stream_wait_event(s2, early)
    b = malloc(pool, 4096, s2)
    assert b != a
    late, _ = acl.rt.create_event()
    acl.rt.record_event(late, s1)
    assert acl.rt.stream_wait_event(s2, late) == ACL_SUCCESS
    c = malloc(pool, 4096, s2)
    assert c == a and acl_soma.pool_stats(pool)["served"]["event"] == 1
    for p in (b, c):
        acl.rt.mem_pool_free_async(p, s2)
    check(dev, pool)


def test_event_order_is_ignored_when_the_mode_is_off(dev, pool):
    s1, s2 = streams(2)
    a = malloc(pool, 4096, s1)
    acl.rt.mem_pool_free_async(a, s1)
    ev, _ = acl.rt.create_event()
    acl.rt.record_event(ev, s1)
    acl.rt.stream_wait_event(s2, ev)
    b = malloc(pool, 4096, s2)
    assert b != a
    acl.rt.mem_pool_free_async(b, s2)
    check(dev, pool)


def test_opportunistic_reuse_once_the_freeing_stream_is_known_complete(dev, pool):
    s1, s2 = streams(2)
    assert acl.rt.mem_pool_set_attr(pool, sp.REUSE_ALLOW_OPPORTUNISTIC, 1) == ACL_SUCCESS
    a = malloc(pool, 4096, s1)
    acl.rt.mem_pool_free_async(a, s1)
    ev, _ = acl.rt.create_event()
    acl.rt.record_event(ev, s1)
    assert acl.rt.query_event_status(ev) == (acl_soma.EVENT_RECORDED_STATUS_NOT_READY,
                                             ACL_SUCCESS)
    b = malloc(pool, 4096, s2)
    assert b != a  # s1's work may still use it
    assert acl.rt.synchronize_event(ev) == ACL_SUCCESS
    assert acl.rt.query_event_status(ev) == (acl_soma.EVENT_RECORDED_STATUS_COMPLETE, ACL_SUCCESS)
    c = malloc(pool, 4096, s2)
    assert c == a and acl_soma.pool_stats(pool)["served"]["opportunistic"] == 1
    for p in (b, c):
        acl.rt.mem_pool_free_async(p, s2)
    check(dev, pool)


def test_opportunistic_reuse_after_a_stream_synchronization_keeps_what_the_threshold_allows(
        dev, pool):
    s1, s2 = streams(2)
    acl.rt.mem_pool_set_attr(pool, sp.REUSE_ALLOW_OPPORTUNISTIC, 1)
    acl.rt.mem_pool_set_attr(pool, sp.ATTR_RELEASE_THRESHOLD, 64 * MiB)
    a = malloc(pool, 4096, s1)
    acl.rt.mem_pool_free_async(a, s1)
    assert acl.rt.synchronize_stream(s1) == ACL_SUCCESS
    assert malloc(pool, 4096, s2) == a
    acl.rt.mem_pool_free_async(a, s2)
    check(dev, pool)


def test_internal_dependencies_reuse_at_once_and_order_the_streams(dev, pool):
    s1, s2, s3 = streams(3)
    acl.rt.mem_pool_set_attr(pool, sp.REUSE_ALLOW_INTERNAL_DEPENDENCIES, 1)
    a = malloc(pool, 4096, s1)
    acl.rt.mem_pool_free_async(a, s1)
    assert malloc(pool, 4096, s2) == a
    assert acl_soma.pool_stats(pool)["served"]["internal"] == 1
    # the wait the pool inserted: s2 is now ordered after s1's free, which
    # the event mode can build on
    assert acl_soma.order.ordered(s2, s1, acl_soma.order.queued[s1])
    assert not acl_soma.order.ordered(s3, s1, acl_soma.order.queued[s1])
    acl.rt.mem_pool_free_async(a, s2)
    check(dev, pool)


def test_preference_same_stream_before_other_modes(dev, pool):
    s1, s2 = streams(2)
    acl.rt.mem_pool_set_attr(pool, sp.REUSE_ALLOW_INTERNAL_DEPENDENCIES, 1)
    theirs = malloc(pool, 4096, s1)
    mine = malloc(pool, 4096, s2)
    acl.rt.mem_pool_free_async(theirs, s1)
    acl.rt.mem_pool_free_async(mine, s2)
    assert malloc(pool, 4096, s2) == mine
    acl.rt.mem_pool_free_async(mine, s2)
    check(dev, pool)


# ---- giving memory back ------------------------------------------------------------------

def test_synchronize_gives_back_free_memory_above_the_threshold(dev, pool):
    s, = streams(1)
    blocks = [malloc(pool, 4 * MiB, s) for _ in range(4)]
    one = dev.usable_size(blocks[0])
    huge_before = dev.stats()["huge"]["used"]
    for b in blocks:
        acl.rt.mem_pool_free_async(b, s)
    assert dev.stats()["huge"]["used"] == huge_before  # the pool still holds them
    acl.rt.mem_pool_set_attr(pool, sp.ATTR_RELEASE_THRESHOLD, 2 * one)
    assert acl.rt.synchronize_stream(s) == ACL_SUCCESS
    assert attr(pool, sp.ATTR_RESERVED_MEM_CURRENT) == 2 * one
    assert dev.stats()["huge"]["used"] == huge_before // 2  # two of the four went back
    acl.rt.mem_pool_set_attr(pool, sp.ATTR_RELEASE_THRESHOLD, 0)
    acl.rt.synchronize_stream(s)
    assert attr(pool, sp.ATTR_RESERVED_MEM_CURRENT) == 0
    check(dev, pool)


def test_a_block_given_back_before_its_stream_is_done_waits_in_the_device_ledger(dev, pool):
    s1, s2 = streams(2)
    a = malloc(pool, 4 * MiB, s1)
    acl.rt.mem_pool_free_async(a, s1)
    acl.rt.synchronize_stream(s2)  # gives a back, but s1 has not been synchronized
    assert attr(pool, sp.ATTR_RESERVED_MEM_CURRENT) == 0
    assert dev.pending_bytes() == dev.stats()["device"]["pending_bytes"] > 0
    acl.rt.synchronize_stream(s1)
    assert dev.pending_bytes() == 0
    check(dev, pool)


def test_trim_to(dev, pool):
    s, = streams(1)
    keep = malloc(pool, 4 * MiB, s)
    freed = [malloc(pool, 4 * MiB, s) for _ in range(3)]
    one = dev.usable_size(keep)
    for b in freed:
        acl.rt.mem_pool_free_async(b, s)
    assert acl.rt.mem_pool_trim_to(pool, 2 * GiB) == ACL_ERROR_RT_INTERNAL_ERROR  # above the size
    assert acl.rt.mem_pool_trim_to(pool, one - 1) == ACL_ERROR_RT_INTERNAL_ERROR  # below used
    assert acl.rt.mem_pool_trim_to(pool, 8 * one) == ACL_SUCCESS                  # nothing to do
    assert attr(pool, sp.ATTR_RESERVED_MEM_CURRENT) == 4 * one
    assert acl.rt.mem_pool_trim_to(pool, 2 * one) == ACL_SUCCESS
    assert attr(pool, sp.ATTR_RESERVED_MEM_CURRENT) == 2 * one
    assert acl.rt.mem_pool_trim_to(pool, one) == ACL_SUCCESS
    assert attr(pool, sp.ATTR_RESERVED_MEM_CURRENT) == one == attr(pool, sp.ATTR_USED_MEM_CURRENT)
    acl.rt.synchronize_stream(s)
    acl.rt.mem_pool_free_async(keep, s)
    check(dev, pool)


def test_physical_memory_follows_the_pool_on_a_paged_device():
    dev = ascmem.Device("atlas-a2-training", paged=True)
    acl.use(dev)
    try:
        pool, _ = acl.rt.mem_pool_create(props())
        s, = streams(1)
        blocks = [malloc(pool, 6 * MiB, s) for _ in range(4)]
        mapped = dev.stats()["huge"]["mapped"]
        assert mapped >= 24 * MiB
        for b in blocks:
            acl.rt.mem_pool_free_async(b, s)
        assert dev.stats()["huge"]["mapped"] == mapped  # cached in the pool: still mapped
        acl.rt.synchronize_stream(s)
        assert dev.stats()["huge"]["mapped"] < 2 * MiB
        assert acl.rt.mem_pool_destroy(pool) == ACL_SUCCESS
        dev.check()
    finally:
        acl.use(None)


# ---- misuse -------------------------------------------------------------------------------

def test_destroy_with_live_blocks_is_refused_and_loses_nothing(dev, pool):
    s, = streams(1)
    a = malloc(pool, 4096, s)
    assert acl.rt.mem_pool_destroy(pool) == ACL_ERROR_RT_INTERNAL_ERROR
    check(dev, pool)
    assert acl.rt.mem_pool_free_async(a, s) == ACL_SUCCESS
    assert acl.rt.mem_pool_destroy(pool) == ACL_SUCCESS
    dev.check()
    assert dev.pending_bytes() > 0  # back to the Device, once s is done with it
    acl.rt.synchronize_stream(s)
    assert dev.stats()["huge"]["live_count"] + dev.stats()["normal"]["live_count"] == 0


def test_calls_on_a_destroyed_or_null_pool(dev):
    s, = streams(1)
    pool, _ = acl.rt.mem_pool_create(props())
    assert acl.rt.mem_pool_destroy(pool) == ACL_SUCCESS
    assert acl.rt.mem_pool_destroy(pool) == ACL_ERROR_RT_INTERNAL_ERROR
    assert acl.rt.mem_pool_malloc_async(64, pool, s) == (0, ACL_ERROR_RT_INTERNAL_ERROR)
    assert acl.rt.mem_pool_trim_to(pool, 0) == ACL_ERROR_RT_INTERNAL_ERROR
    assert acl.rt.mem_pool_malloc_async(64, None, s) == (0, ACL_ERROR_INVALID_PARAM)
    assert acl.rt.mem_pool_destroy(None) == ACL_ERROR_INVALID_PARAM
    assert acl.rt.mem_pool_trim_to(0, 0) == ACL_ERROR_INVALID_PARAM


def test_bad_malloc_arguments(dev, pool):
    s, = streams(1)
    assert acl.rt.mem_pool_malloc_async(0, pool, s) == (0, ACL_SUCCESS)  # nothing allocated
    assert acl.rt.mem_pool_malloc_async(64, pool, None) == (0, ACL_ERROR_INVALID_PARAM)
    assert acl.rt.mem_pool_malloc_async(-1, pool, s) == (0, ACL_ERROR_INVALID_PARAM)
    assert acl.rt.mem_pool_malloc_async(1.5, pool, s) == (0, ACL_ERROR_INVALID_PARAM)
    assert attr(pool, sp.ATTR_USED_MEM_CURRENT) == 0
    check(dev, pool)


def test_bad_frees(dev, pool):
    s, = streams(1)
    a = malloc(pool, 4096, s)
    assert acl.rt.mem_pool_free_async(a, s) == ACL_SUCCESS
    assert acl.rt.mem_pool_free_async(a, s) == ACL_ERROR_RT_PARAM_INVALID   # already freed
    # interior: RT_ERROR_INVALID_VALUE (api_impl_soma.cc line 134), 107000
    assert acl.rt.mem_pool_free_async(a + 64, s) == ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.mem_pool_free_async(0, s) == ACL_ERROR_INVALID_PARAM
    check(dev, pool)


def test_a_full_pool_refuses_and_recovers(dev):
    pool, _ = acl.rt.mem_pool_create(props(max_size=8 * MiB))
    s1, s2 = streams(2)
    a = malloc(pool, 5 * MiB, s1)
    assert acl.rt.mem_pool_malloc_async(5 * MiB, pool, s2) == (0, ACL_ERROR_RT_INTERNAL_ERROR)
    acl.rt.mem_pool_free_async(a, s1)
    # cached for s1, not reusable by s2: still full until s1 is known done
    assert acl.rt.mem_pool_malloc_async(5 * MiB, pool, s2) == (0, ACL_ERROR_RT_INTERNAL_ERROR)
    ev, _ = acl.rt.create_event()
    acl.rt.record_event(ev, s1)
    acl.rt.synchronize_event(ev)
    b = malloc(pool, 5 * MiB, s2)  # the complete block went back to the Device to make room
    acl.rt.mem_pool_free_async(b, s2)
    check(dev, pool)
    assert acl.rt.mem_pool_destroy(pool) == ACL_SUCCESS


def test_free_async_of_an_aclrtmalloc_pointer_waits_for_the_stream(dev, pool):
    s, = streams(1)
    p, ret = acl.rt.malloc(1 * MiB, 0)
    assert acl.rt.mem_pool_free_async(p, s) == ACL_SUCCESS
    assert dev.pending_bytes() > 0
    acl.rt.synchronize_stream(s)
    assert dev.pending_bytes() == 0
    dev.check()


def test_a_device_reset_takes_its_pools_with_it():
    dev = ascmem.Device("atlas-a2-training", device_id=3)
    acl.use(None)
    acl._devices[3] = dev
    try:
        pool, _ = acl.rt.mem_pool_create(props(device_id=3))
        s, = streams(1)
        malloc(pool, 4096, s)
        assert acl.rt.reset_device(3) == ACL_SUCCESS
        assert acl.rt.mem_pool_malloc_async(64, pool, s) == (0, ACL_ERROR_RT_INTERNAL_ERROR)
        dev.check()
    finally:
        acl._devices.pop(3, None)
        acl.use(None)


def test_threads_on_their_own_streams(dev, pool):
    acl.rt.mem_pool_set_attr(pool, sp.REUSE_ALLOW_INTERNAL_DEPENDENCIES, 1)
    errors = []

    def work(seed):
        s, = streams(1)
        live = []
        try:
            for i in range(400):
                if live and (i * seed) % 3 == 0:
                    assert acl.rt.mem_pool_free_async(live.pop(), s) == ACL_SUCCESS
                else:
                    live.append(malloc(pool, 256 + (i * seed) % 70_000, s))
                if i % 97 == 0:
                    assert acl.rt.synchronize_stream(s) == ACL_SUCCESS
            for p in live:
                assert acl.rt.mem_pool_free_async(p, s) == ACL_SUCCESS
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in (3, 5, 7, 11)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert attr(pool, sp.ATTR_USED_MEM_CURRENT) == 0
    check(dev, pool)


# ---- with a real pyACL module installed (the recording stand-in) ---------------------------

def test_installed_event_calls_feed_the_pools(dev, pool):
    fake = fake_acl.make()
    acl.install(fake)
    try:
        acl.rt.mem_pool_set_attr(pool, sp.REUSE_FOLLOW_EVENT_DEPENDENCIES, 1)
        s1, s2 = "stream-1", "stream-2"
        a = malloc(pool, 4096, s1)
        acl.rt.mem_pool_free_async(a, s1)
        ev, _ = fake.rt.create_event()
        assert fake.rt.record_event(ev, s1) == ACL_SUCCESS        # the wrapped runtime calls
        assert fake.rt.stream_wait_event(s2, ev) == ACL_SUCCESS
        assert ("rt.stream_wait_event", s2, ev) in fake.calls      # the runtime saw it too
        assert malloc(pool, 4096, s2) == a
        acl.rt.mem_pool_free_async(a, s2)
        assert fake.rt.synchronize_stream(s2) == ACL_SUCCESS
        assert attr(pool, sp.ATTR_RESERVED_MEM_CURRENT) == 0     # threshold 0: given back
    finally:
        acl.uninstall()
    assert not hasattr(fake.rt.record_event, "__wrapped__")
    check(dev, pool)


def test_a_reset_of_the_device_itself_also_ends_its_pools(dev, pool):
    s, = streams(1)
    a = malloc(pool, 4096, s)
    acl.rt.mem_pool_free_async(malloc(pool, 8192, s), s)
    dev.reset()  # not through acl.rt.reset_device: the pool finds out on its next call
    assert acl.rt.mem_pool_free_async(a, s) == ACL_ERROR_RT_MEMORY_FREE  # a stale pointer
    assert acl.rt.synchronize_stream(s) == ACL_SUCCESS                   # nothing to give back
    assert acl.rt.mem_pool_malloc_async(64, pool, s) == (0, ACL_ERROR_RT_INTERNAL_ERROR)
    assert acl.rt.mem_pool_get_attr(pool, sp.ATTR_USED_MEM_CURRENT) == \
        (0, ACL_ERROR_RT_PARAM_INVALID)
    assert dev.resets == 1
    dev.check()


def test_aclrtfree_of_a_pool_block_takes_it_out_of_the_pool(dev, pool):
    s, = streams(1)
    a = malloc(pool, 4096, s)
    b = malloc(pool, 4096, s)
    assert acl.rt.free(a) == ACL_SUCCESS  # the runtime's DevFree frees it from its pool
    assert attr(pool, sp.ATTR_USED_MEM_CURRENT) == attr(pool, sp.ATTR_RESERVED_MEM_CURRENT) == \
        dev.usable_size(b)
    assert acl.rt.free(a) == ACL_ERROR_RT_MEMORY_FREE  # gone: the device's double free
    acl.rt.mem_pool_free_async(b, s)
    assert acl.rt.free(b) == ACL_ERROR_RT_INTERNAL_ERROR  # freed to the pool already
    check(dev, pool)


def test_a_free_behind_the_pools_back_is_refused(dev, pool):
    """A pool block freed to its pool stays a live Device block, handed out
    again later; a GIL-free free of it (torch's pluggable free, here through
    ctypes) would make the next owner share it with whoever the Device gives
    its place to.  The Device refuses that free: the stream pool guards its
    blocks until it gives them back itself."""
    import ascmem.pluggable as pl
    s, = streams(1)
    p = malloc(pool, 4 * MiB, s)
    assert acl.rt.mem_pool_free_async(p, s) == ACL_SUCCESS
    pl.configure(dev, 0)
    try:
        fns = pl.functions()
        fns[pl.FREE](p, 4 * MiB, 0, None)  # refused: still the pool's
        other = fns[pl.ALLOC](4 * MiB, 0, None)
        assert other != p
        assert malloc(pool, 4 * MiB, s) == p  # the same stream takes it back, as it should
        assert dev.usable_size(p) >= 4 * MiB and dev.usable_size(other) >= 4 * MiB
        fns[pl.FREE](other, 4 * MiB, 0, None)
    finally:
        pl.unconfigure(0)
    assert acl.rt.mem_pool_free_async(p, s) == ACL_SUCCESS
    assert acl.rt.synchronize_stream(s) == ACL_SUCCESS
    assert acl.rt.mem_pool_trim_to(pool, 0) == ACL_SUCCESS  # given back to the Device, guard gone
    check(dev, pool)
    assert dev.stats()["huge"]["live_count"] == 0
