"""A paged pool's placement, either of them, does not move with the size of
its virtual range (issue 42, item 2): the memory a trace maps is the same in
a range of four times its peak and in one of 64 GiB."""
import pytest

import ascmem.trace as tr

TRACES = tr.example_names()


@pytest.mark.parametrize("placement", tr.PLACEMENTS)
@pytest.mark.parametrize("granule", [2 << 20, 64 << 10])
@pytest.mark.parametrize("name", TRACES)
def test_the_memory_mapped_does_not_depend_on_the_range(name, granule, placement):
    t = tr.example(name)
    small = tr.physical_efficiency(t, granule, range_size=4 * t.peak_live(), placement=placement)[0]
    large = tr.physical_efficiency(t, granule, range_size=64 << 30, placement=placement)[0]
    assert abs(small - large) <= 0.005, (small, large)
