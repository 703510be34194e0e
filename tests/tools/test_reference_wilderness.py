"""Best fit with the untouched end kept for last (the "wilderness" rule), the
peer of `ascmem fit`, `plan` and `bench` (issue 42 item 3), and best fit +
unmapping, the reference of paged pools."""
import json
import subprocess
import sys

import pytest

from ascmem import OutOfMemoryError, planner
from ascmem import trace as tr
from ascmem.reference import BestFit, BestFitWilderness, bestfit_unmapped_peak
from ascmem.trace_data import Event, Trace

U = 64  # the references' unit


def shaped(cls):
    """An arena of 20 units with a hole of 10 at the start and the untouched
    end of 3: [hole 10][b 1][c 6][end 3]."""
    a = cls(20 * U)
    first = a.alloc(10 * U)
    a.alloc(1 * U)
    a.alloc(6 * U)
    a.free(first)
    return a


def test_the_untouched_end_comes_last_even_when_it_fits_best():
    assert shaped(BestFit).alloc(3 * U) == 17 * U            # best fit: the exact fit at the end
    assert shaped(BestFitWilderness).alloc(3 * U) == 0       # wilderness: the hole first


def test_the_end_serves_when_no_other_block_fits_and_grows_the_high_water():
    a = shaped(BestFitWilderness)
    assert a.high_water == 17 * U
    assert a.alloc(3 * U) == 0
    assert a.alloc(7 * U) == 3 * U                             # the rest of the hole
    assert a.alloc(2 * U) == 17 * U and a.high_water == 19 * U  # only the end is left
    with pytest.raises(OutOfMemoryError):
        a.alloc(2 * U)


def test_a_block_freed_next_to_the_end_joins_it():
    a = BestFitWilderness(20 * U)
    x = a.alloc(4 * U)
    y = a.alloc(4 * U)
    a.free(y)                     # joins the end: [x 4][end 16]
    a.alloc(2 * U)
    assert a.free_end[20 * U] == 6 * U and a.usable_size(x) == 4 * U


def test_its_smallest_arena_is_its_high_water_mark():
    t = tr.example("resnet50_multires")
    peer = BestFitWilderness(1 << 40)
    tr.replay(t, peer)
    res = 64 << 10
    assert tr.min_capacity(t, "bestfit-wilderness", res) == -(-peer.high_water // res) * res


def test_bestfit_unmapped_peak_counts_granules_live_blocks_touch():
    g = 4096
    t = Trace([Event("a", 1, g), Event("a", 2, 100), Event("f", 1, g), Event("a", 3, 2 * g),
               Event("f", 2, 100), Event("f", 3, 2 * g)])
    # 1 at [0, 4096) and 2 at [4096, 4224): 2 granules; 1 freed, 3 does not fit its hole and
    # goes past 2, to [4224, 12416): granules 1-3 live at once
    assert bestfit_unmapped_peak(t, g) == 3 * g


def test_the_commands_take_it():
    def run(*args):
        return subprocess.run([sys.executable, "-m", "ascmem", *args], capture_output=True,
                              text=True)
    r = run("fit", "--example", "video_pipeline", "--allocator", "bestfit-wilderness", "--json")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)["allocators"]
    assert row["allocator"] == "bestfit-wilderness" and 0 < row["efficiency"] <= 1
    r = run("plan", "--example", "video_pipeline", "--allocator", "bestfit-wilderness",
            "--allocator", "ascmem", "--json", "--model", "atlas-inference")
    assert r.returncode == 0, r.stderr
    assert {fp["allocator"] for fp in json.loads(r.stdout)["footprints"]} == {
        "bestfit-wilderness", "ascmem"}
    assert run("plan", "--example", "video_pipeline", "--allocator", "mimalloc").returncode == 2


def test_planner_footprint_is_its_arena_in_whole_pages():
    t = Trace([Event("a", 1, 100 << 20), Event("f", 1, 100 << 20)], name="one")
    (fp,) = planner.footprints(t, allocators=["bestfit-wilderness"])
    assert fp.peak == 100 << 20 and fp.complete


def test_a_paged_pool_of_a_given_virtual_range():
    t = tr.example("resnet50_multires")
    pool = tr.paged_pool(t, 2 << 20, range_size=4 * t.peak_live())
    assert pool.capacity == -(-4 * t.peak_live() // (2 << 20)) * (2 << 20)
    eff, mapped = tr.physical_efficiency(t, 2 << 20, range_size=4 * t.peak_live())
    assert 0 < eff <= 1 and mapped >= t.peak_live()
