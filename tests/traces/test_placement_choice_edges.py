"""Edge cases of the placement choice (ascmem.trace.choose_placement and
`ascmem fit --paged`) found in review."""
import subprocess
import sys

from ascmem import trace as tr


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
