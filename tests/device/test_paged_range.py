"""A paged pool's placement, either of them, does not move with the size of
its virtual range (issue 42, item 2): the memory a trace maps is the same in
a range of four times its peak and in one of 64 GiB.  The held-out
speculative_decoding mapped 14 granules of 2 MiB in the small range and 13
in the large one while best fit compared the region's never-used end by its
size (fit.c, find_wild_last)."""
import os

import pytest

import ascmem.trace as tr

HELDOUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "heldout")
TRACES = tr.example_names() + ["speculative_decoding"]


def load(name):
    path = os.path.join(HELDOUT, name + ".csv.gz")
    return tr.load(path) if os.path.exists(path) else tr.example(name)


@pytest.mark.parametrize("placement", tr.PLACEMENTS)
@pytest.mark.parametrize("granule", [2 << 20, 64 << 10])
@pytest.mark.parametrize("name", TRACES)
def test_the_memory_mapped_does_not_depend_on_the_range(name, granule, placement):
    t = load(name)
    small = tr.physical_efficiency(t, granule, range_size=4 * t.peak_live(), placement=placement)[0]
    large = tr.physical_efficiency(t, granule, range_size=64 << 30, placement=placement)[0]
    assert abs(small - large) <= 0.005, (small, large)


@pytest.mark.parametrize("size", [3, 4, 6, 8, 16])
def test_a_block_goes_to_an_older_hole_before_the_region_s_never_used_end(size):
    """The shape of speculative_decoding's first difference: a hole left in
    the small blocks' region and the end of that region past the last live
    block, the end the smaller in a small range.  Best fit takes the hole
    in any range, as it would with the end unbounded."""
    import ascmem
    G = 2 << 20
    peak = 24 << 20
    k = 600 << 10  # a small block (under a granule: the first region)
    pool = ascmem.Pool(size * peak // G * G, base=1 << 44, granule=G, release_threshold=0)
    blocks = [pool.alloc(k) for _ in range(36)]  # 21.1 MiB of the region
    for b in blocks[6:26]:  # a hole of 11.7 MiB among them
        pool.free(b)
    hole = blocks[6]
    assert pool.alloc(300 << 10) == hole
    pool.check()
