"""Edge cases of the placement choice (ascmem.trace.choose_placement and
`ascmem fit --paged`) found in review."""
import subprocess
import sys

import pytest

from ascmem import trace as tr
from ascmem.errors import OutOfMemoryError


def _empty_trace(tmp_path):
    p = tmp_path / "empty.csv"
    p.write_text("op,id,size\n")
    return p


def test_a_trace_that_maps_nothing_gets_a_placement_not_a_zero_division(tmp_path):
    # a paged pool replaying no allocation maps nothing: nothing is wasted
    # (efficiency 1.0, as `ascmem fit`'s bound says for a peak of 0)
    t = tr.load(str(_empty_trace(tmp_path)))
    assert tr.physical_efficiency(t) == (1.0, 0)
    assert tr.choose_placement(t) == ("granules", 1.0, 0)


def test_fit_paged_on_a_trace_that_maps_nothing_exits_0(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ascmem", "fit", "--paged", "--json",
                        str(_empty_trace(tmp_path))], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert '"placement": "granules"' in r.stdout


def test_a_range_too_small_for_the_trace_is_out_of_memory_not_a_figure():
    # a replay whose allocations fail holds fewer blocks live: its peak
    # mapped is another run's, and a placement chosen by it means nothing
    t = tr.example(tr.example_names()[0])
    with pytest.raises(OutOfMemoryError, match="larger range_size"):
        tr.physical_efficiency(t, range_size=2 << 20)
    with pytest.raises(OutOfMemoryError):
        tr.choose_placement(t, range_size=2 << 20)
