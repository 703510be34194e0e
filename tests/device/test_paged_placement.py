"""A paged pool's placement choice (issue 42, item 2): "granules" (the
granule rules, the default) or "packed" (every block at the low end of the
hole best fit chose, end to end with the block below it), and
ascmem.trace.choose_placement, which keeps whichever maps fewer bytes when a
recorded run replays.  Neither wins on every workload (docs/ARCHITECTURE.md,
Note [Packed placement])."""
import json
import os
import subprocess
import sys

import pytest

import ascmem
import ascmem.trace as tr
from ascmem.errors import InvalidArgumentError
from conftest import TESTS

G = 64 << 10


def chain(n=8, size=G * 7 // 4):
    """n blocks of 1.75 granules allocated in a row, all live at the end."""
    return tr.Trace([tr.Event("a", i, size) for i in range(n)], name="chain")


def test_packed_blocks_share_their_edge_granules():
    mapped = {}
    for placement in ("granules", "packed"):
        pool = ascmem.Pool(128 << 20, base=1 << 36, granule=G, placement=placement)
        addrs = [pool.alloc(G * 7 // 4) for _ in range(8)]
        steps = {b - a for a, b in zip(addrs, addrs[1:])}
        assert steps == ({G * 7 // 4} if placement == "packed" else {2 * G})
        mapped[placement] = pool.stats()["mapped"]
        pool.check()
        assert pool.placement == placement
        pool.reset()  # the placement is the pool's configuration: a reset keeps it
        again = [pool.alloc(G * 7 // 4) for _ in range(8)]
        assert again == addrs
    assert mapped == {"granules": 16 * G, "packed": 14 * G}


def test_the_default_is_the_granule_rules():
    assert ascmem.Pool(64 << 20, granule=G).placement == "granules"
    assert ascmem.Pool(64 << 20).placement == "kept-in-place"  # contiguous: its own default


@pytest.mark.parametrize("kwargs", [
    {"placement": "packed"},  # not paged
    {"placement": "granules"},
    {"granule": G, "placement": "tight"},
    {"granule": G, "placement": 1},
])
def test_a_placement_a_pool_cannot_take_is_refused(kwargs):
    with pytest.raises(InvalidArgumentError, match="placement"):
        ascmem.Pool(64 << 20, **kwargs)


def test_choose_placement_keeps_the_winner():
    placement, eff, mapped = tr.choose_placement(chain(), G)
    assert (placement, mapped) == ("packed", 14 * G)
    assert eff == pytest.approx(14 / 14)
    # a multi-resolution CNN: the granule rules map a granule less at 2 MiB
    t = tr.example("mobilenet_multires")
    placement, eff, mapped = tr.choose_placement(t)
    assert placement == "granules"
    assert mapped < tr.physical_efficiency(t, placement="packed")[1]


def test_a_tie_keeps_the_default():
    whole = tr.Trace([tr.Event("a", 0, 2 * G)], name="whole")
    assert tr.choose_placement(whole, G)[0] == "granules"


def test_fit_names_the_placement_that_maps_least():
    """detector_boxes (held out) at 2 MiB: packing maps a granule less than
    the granule rules, plain best fit a granule less again
    (test_best_fit_placement.py)."""
    path = os.path.join(TESTS, "data", "heldout", "detector_boxes.csv.gz")
    r = subprocess.run([sys.executable, "-m", "ascmem", "fit", path,
                        "--allocator", "pool", "--granule", "2MiB", "--resolution", "4MiB",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (paged,) = json.loads(r.stdout)["paged"]
    assert paged["placement"] == "best-fit"
    assert paged["packed_efficiency"] > paged["physical_efficiency"]
    assert paged["best_fit_peak_mapped"] < paged["packed_peak_mapped"] < paged["peak_mapped"]
    assert paged["placements"]["packed"] == {"peak_mapped": paged["packed_peak_mapped"],
                                             "efficiency": paged["packed_efficiency"]}
    assert list(paged["placements"]) == list(tr.PLACEMENTS)


def test_a_paged_device_takes_a_placement_for_its_pools():
    """Eight blocks of 3.5 MiB on 2 MiB granules: end to end they map 15
    granules, from granule boundaries 16; a reset keeps the placement."""
    mapped = {}
    for placement in (None, "packed"):
        d = ascmem.Device("atlas-a3", memory=8 << 30, paged=True, placement=placement)
        assert d.placement == (placement or "granules")
        for _ in range(2):
            blocks = [d.malloc(7 << 19, ascmem.Policy.HUGE_ONLY) for _ in range(8)]
            mapped.setdefault(placement, set()).add(d.stats()["huge"]["mapped"])
            for b in blocks:
                d.free(b)
            d.check()
            d.reset()
        d.close()
    assert mapped == {None: {32 << 20}, "packed": {30 << 20}}


def test_a_device_that_is_not_paged_refuses_a_placement():
    with pytest.raises(InvalidArgumentError, match="paged=True"):
        ascmem.Device("atlas-a3", memory=8 << 30, placement="packed")
    with ascmem.Device("atlas-a3", memory=8 << 30) as d:
        assert d.placement == "kept-in-place"  # a contiguous pool's default (test_device_placement.py)
