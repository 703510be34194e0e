"""Random work on a paged Device placing by "best-fit" in 1 KiB units
(the plan choose_paged_plan can deploy): allocations of every path (slabs of
1 KiB or less, best fit above it, huge pages, DVPP), frees now and on
streams, same-stream reuse, sleep and wake by tag, reset, empty_cache, with
check() after every step -- and the paged plan's refusal of a granule no
unit fits (a typed error, as choose_placement's)."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ascmem
import ascmem.trace as tr
from ascmem.errors import AscmemError, InvalidArgumentError

SIZES = st.one_of(st.integers(1, 1024), st.integers(1025, 64 << 10), st.integers(64 << 10, 8 << 20))
OPS = st.lists(st.tuples(st.sampled_from(["malloc", "malloc", "malloc", "free", "free", "free_on",
                                          "sync", "sleep", "wake", "reset", "empty", "dvpp"]),
                         SIZES, st.integers(0, 63)), max_size=60)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_random_work_keeps_a_best_fit_device_whole(ops):
    with ascmem.Device("atlas-a3", memory=1 << 30, paged=True, placement="best-fit",
                       min_block=1024) as d:
        live = []  # (addr, dvpp)
        for op, size, k in ops:
            try:
                if op == "malloc":
                    policy = ascmem.Policy.HUGE_ONLY if k % 4 == 0 else 0
                    live.append((d.malloc(size, policy, stream=f"s{k % 2}" if k % 3 == 0 else None,
                                          tag=f"t{k % 2}" if k % 5 == 0 else None), False))
                elif op == "dvpp":
                    live.append((d.dvpp_malloc(size), True))
                elif op in ("free", "free_on") and live:
                    addr, dvpp = live.pop(k % len(live))
                    if dvpp:
                        d.dvpp_free(addr)
                    else:
                        d.free(addr, stream=f"s{k % 2}" if op == "free_on" else None)
                elif op == "sync":
                    d.synchronize()
                elif op == "sleep":
                    d.sleep(f"t{k % 2}", keep=bool(k & 1))
                elif op == "wake":
                    d.wake(f"t{k % 2}")
                elif op == "reset":
                    d.reset()
                    live.clear()
                elif op == "empty":
                    d.empty_cache()
            except AscmemError:
                pass  # out of memory, asleep, not asleep: refused, the device whole
            d.check()
        assert d.placement == "best-fit" and d.min_block == 1024
        for addr, dvpp in live:
            try:
                d.dvpp_free(addr) if dvpp else d.free(addr)
            except AscmemError:
                pass
        d.synchronize()
        d.check()


def test_a_granule_under_every_paged_unit_is_refused_as_a_pool_refuses_it():
    t = tr.example("decoder_kvcache")
    with pytest.raises(InvalidArgumentError, match="granule"):
        tr.choose_placement(t, 512)
    with pytest.raises(InvalidArgumentError, match="granule"):
        tr.choose_paged_plan(t, 512)
