"""The adaptive release threshold of paged pools (csrc/paging.c, "how much
is kept"; Pool/Device(release_threshold_max=...)): granules given back past
the threshold and mapped again raise it, as glibc raises its mmap threshold
when a program frees an mmapped chunk; kept granules a period of
allocations did not need bring it back down to release_threshold."""
import pytest

import ascmem
from ascmem.errors import InvalidArgumentError
from conftest import MiB

G = 64 << 10
BASE = 1 << 32


def pool(floor=4 * G, cap=32 * G):
    return ascmem.Pool(64 * MiB, base=BASE, granule=G, release_threshold=floor,
                       release_threshold_max=cap)


def churn(p, size=16 * G):
    """One step of a loop that allocates a large block and frees it."""
    p.free(p.alloc(size))


def test_memory_freed_and_asked_for_again_is_kept_from_then_on():
    p = pool()
    churn(p)                            # 16 granules mapped, 12 given back
    assert p.stats()["mapped"] == 4 * G
    churn(p)                            # the 12 are mapped again: the threshold takes them
    s = p.stats()
    assert s["release_threshold"] == 16 * G
    assert s["mapped"] == 16 * G        # kept, whole
    calls = s["map_calls"], s["unmap_calls"]
    for _ in range(20):                 # many periods: each takes every kept granule
        churn(p)
    s = p.stats()
    assert (s["map_calls"], s["unmap_calls"]) == calls
    assert s["release_threshold"] == 16 * G
    p.check()


def test_a_fixed_threshold_maps_every_step():
    p = ascmem.Pool(64 * MiB, base=BASE, granule=G, release_threshold=4 * G)
    churn(p)
    calls = p.stats()["map_calls"]
    for _ in range(5):
        churn(p)
    s = p.stats()
    assert s["map_calls"] == calls + 5 and s["mapped"] == 4 * G
    assert s["release_threshold"] == 4 * G


def test_memory_freed_once_is_given_back():
    p = pool()
    small = p.alloc(G)                  # the program goes on, with little
    churn(p)
    s = p.stats()
    assert s["release_threshold"] == 4 * G
    assert s["mapped"] == 4 * G + G     # the floor and `small`
    p.free(small)
    p.check()


def test_the_threshold_stops_at_the_cap():
    p = pool(cap=8 * G)
    for _ in range(6):
        churn(p)
        assert p.stats()["mapped"] <= 8 * G
        p.check()
    assert p.stats()["release_threshold"] == 8 * G


def test_kept_memory_a_smaller_working_set_does_not_need_goes_back():
    p = pool()
    churn(p)
    churn(p)
    assert p.stats()["mapped"] == 16 * G
    for _ in range(64):                 # now the steps are 2 granules: 14 kept ones idle
        churn(p, 2 * G)
    s = p.stats()
    assert s["release_threshold"] == 4 * G
    assert s["mapped"] == 4 * G
    calls = s["map_calls"], s["unmap_calls"]
    for _ in range(10):                 # the floor holds the small step
        churn(p, 2 * G)
    assert (p.stats()["map_calls"], p.stats()["unmap_calls"]) == calls
    p.check()


def test_a_step_whose_phases_need_different_granules_stops_mapping():
    """Small blocks cycle through one granule, then a large block takes the
    rest: at no moment are all kept granules in use, yet every one is needed
    in every step.  Periods shorter than the step used to lower the threshold
    by the granule idle at the large block's peak, and the next step mapped
    it again, for good."""
    p = pool(cap=64 * G)

    def step():
        for _ in range(40):
            p.free(p.alloc(G))
        p.free(p.alloc(16 * G))

    for _ in range(10):
        step()
    s = p.stats()
    calls = s["map_calls"], s["unmap_calls"]
    for _ in range(40):
        step()
    s = p.stats()
    assert (s["map_calls"], s["unmap_calls"]) == calls
    assert s["release_threshold"] == 17 * G
    p.check()


def test_a_large_step_again_after_the_decay_raises_it_again():
    p = pool()
    churn(p)
    churn(p)
    for _ in range(64):
        churn(p, 2 * G)
    assert p.stats()["release_threshold"] == 4 * G
    churn(p)
    churn(p)
    assert p.stats()["release_threshold"] == 16 * G
    assert p.stats()["mapped"] == 16 * G


def test_trim_gives_the_kept_back_and_reset_forgets_what_was_learnt():
    p = pool()
    churn(p)
    churn(p)
    assert p.trim() == 16 * G
    assert p.stats()["mapped"] == 0
    assert p.stats()["release_threshold"] == 16 * G  # trim is one call, not a new working set
    churn(p)
    assert p.stats()["mapped"] == 16 * G
    p.reset()
    assert p.stats()["release_threshold"] == 4 * G
    churn(p)
    assert p.stats()["mapped"] == 4 * G
    p.check()


def test_a_floor_of_zero_adapts_too():
    p = pool(floor=0)
    churn(p)
    assert p.stats()["mapped"] == 0
    churn(p)
    assert p.stats()["mapped"] == 16 * G
    for _ in range(64):
        churn(p, 2 * G)
    p.check()
    # the idle part halves (rounded down) each period: one idle granule may stay
    assert p.stats()["release_threshold"] <= 2 * G + G


@pytest.mark.parametrize("kw", [dict(release_threshold=8 * G, release_threshold_max=4 * G),
                                dict(release_threshold_max=-1),
                                dict(release_threshold_max="8")])
def test_bad_caps_are_refused(kw):
    with pytest.raises((InvalidArgumentError, TypeError, OverflowError, ValueError)):
        ascmem.Pool(64 * MiB, base=BASE, granule=G, **kw)


def test_a_cap_needs_a_paged_pool_or_device():
    with pytest.raises(InvalidArgumentError, match="paged"):
        ascmem.Pool(64 * MiB, base=BASE, release_threshold_max=8 * G)
    with pytest.raises(InvalidArgumentError, match="paged"):
        ascmem.Device("atlas-a2-training", memory=8 << 30, release_threshold_max=8 * MiB)
    with pytest.raises(InvalidArgumentError, match="below"):
        ascmem.Device("atlas-a2-training", memory=8 << 30, paged=True, release_threshold=8 * MiB,
                      release_threshold_max=4 * MiB)


@pytest.mark.parametrize("backend", ["sim", "host"])
def test_a_paged_device_adapts_per_kind(backend):
    d = ascmem.Device("atlas-a2-training", memory=8 << 30, backend=backend, paged=True,
                      release_threshold=8 * MiB, release_threshold_max=256 * MiB)
    try:
        def step():
            d.free(d.malloc(64 * MiB))

        step()
        assert d.stats()["huge"]["mapped"] == 8 * MiB
        step()
        s = d.stats()["huge"]
        assert s["mapped"] >= 64 * MiB and s["release_threshold"] >= 64 * MiB
        calls = s["map_calls"]
        for _ in range(5):
            step()
        assert d.stats()["huge"]["map_calls"] == calls
        d.check()
        d.empty_cache()
        assert d.stats()["huge"]["mapped"] == 0
    finally:
        d.close()


def test_an_acl_device_unmaps_what_the_decay_lowers_during_an_allocation():
    """The lowering happens inside an allocation (paging.c, end_period): on
    the acl backend its unmaps are queued by the map hook and applied after
    the call, as a free's are; the runtime's mappings follow the counts."""
    import fake_acl
    acl = fake_acl.make()
    d = ascmem.Device("atlas-a2-training", backend="acl", acl_module=acl, paged=True,
                      release_threshold=8 * MiB, release_threshold_max=256 * MiB)
    try:
        for _ in range(3):
            d.free(d.malloc(64 * MiB, ascmem.Policy.HUGE_ONLY))
        kept = d.stats()["huge"]["mapped"]
        assert kept >= 64 * MiB
        assert len(acl.mapped) * 2 * MiB == kept + d.stats()["normal"]["mapped"]
        for _ in range(200):  # small steps: the kept 64 MiB sit idle
            d.free(d.malloc(2 * MiB, ascmem.Policy.HUGE_ONLY))
        s = d.stats()
        assert s["huge"]["mapped"] <= 16 * MiB
        assert len(acl.mapped) * 2 * MiB == s["huge"]["mapped"] + s["normal"]["mapped"]
        d.check()
    finally:
        d.close()
    assert not acl.mapped and not acl.reserved
