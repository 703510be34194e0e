"""Which kept granules a paged pool gives back when its release threshold is
full (csrc/paging.c, "which kept granules go first"): those kept longest ago,
so that granules a workload stopped using do not hold the threshold while
the granules it keeps reusing are mapped and unmapped on every step."""
import random

import pytest

import ascmem
from conftest import MiB

G = 64 << 10
BASE = 1 << 32


def test_a_repeating_step_stops_mapping_once_it_has_run():
    p = ascmem.Pool(64 * MiB, base=BASE, granule=G, release_threshold=4 * G)
    old = p.alloc(4 * G)     # size class 4-8 granules: a region of its own
    pin = p.alloc(4 * G)     # keeps `old` from joining a larger free block
    p.free(old)              # the threshold is full of granules nobody asks for again
    assert p.stats()["mapped"] == 8 * G

    def step():              # 1-2 granules: another region, never where `old` was
        p.free(p.alloc(2 * G))

    step()
    calls = p.stats()["map_calls"], p.stats()["unmap_calls"]
    for _ in range(10):
        step()
    s = p.stats()
    assert (s["map_calls"], s["unmap_calls"]) == calls  # the step's granules stayed mapped
    assert s["mapped"] <= 4 * G + 4 * G                 # the threshold and `pin`, no more
    p.free(pin)
    p.check()


@pytest.mark.parametrize("cap", [None, 24 * G])  # fixed; adaptive (test_paged_adaptive.py)
def test_the_threshold_holds_whatever_the_order_of_frees(cap):
    rng = random.Random(3)
    p = ascmem.Pool(64 * MiB, base=BASE, granule=G, release_threshold=6 * G, release_threshold_max=cap)
    live = []
    for i in range(4000):
        if live and rng.random() < 0.5:
            p.free(live.pop(rng.randrange(len(live))))
        else:
            live.append(p.alloc(rng.choice((rng.randrange(1, 5000), rng.randrange(G // 2, 12 * G)))))
        if i % 199 == 0:
            s = p.stats()
            assert 6 * G <= s["release_threshold"] <= (cap or 6 * G)
            assert s["mapped"] - s["pages_in_use"] * G <= s["release_threshold"]  # kept, within it
            p.check()  # the kept bitmap, pending run and count agree
    for a in live:
        p.free(a)
    s = p.stats()
    assert s["mapped"] <= s["release_threshold"] + 2 * MiB  # kept granules and spare slabs' storage
    p.trim()
    assert p.stats()["mapped"] == 0
    p.check()
