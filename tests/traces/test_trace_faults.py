"""Bad input to the trace tools: numbers out of range, undecodable files,
NUL paths, arguments that are not what they should be, a non-positive
resolution (in the library and on the command line)."""
import subprocess
import sys

import pytest

import ascmem
from ascmem import trace as tr
from ascmem.errors import ArgumentTypeError, InvalidArgumentError


def test_fit_resolution_must_be_positive():
    t = tr.Trace([tr.Event("a", 1, 100), tr.Event("f", 1, 100)])
    for bad in (-4096, 0, 1.5):
        with pytest.raises(InvalidArgumentError):
            tr.min_capacity(t, resolution=bad)
    for bad in ("-4096", "0"):
        r = subprocess.run([sys.executable, "-m", "ascmem", "fit", "--example", "video_pipeline",
                            "--resolution", bad], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "resolution" in r.stderr


@pytest.mark.parametrize("text,where", [
    ("op,id,size\na,1,18446744073709551616\n", ":2:"),
    ("op,id,size,policy\na,1,100,-1\n", ":2:"),
    ("op,id,size,policy\na,1,100,18446744073709551616\n", ":2:"),
])
def test_traces_refuse_out_of_range_numbers_with_the_line(tmp_path, text, where):
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(tr.TraceError, match=where):
        tr.load(str(path))


def test_traces_bom_undecodable_and_nul_paths(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbfop,id,size\na,1,100\nf,1,\n")
    assert len(tr.load(str(path)).events) == 2
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"op,id,size\na,1,\xff\xfe\n")
    with pytest.raises(tr.TraceError, match="bad.csv"):
        tr.load(str(bad))
    with open(bad, encoding="utf-8") as f:
        with pytest.raises(tr.TraceError):
            tr.load(f)
    with pytest.raises(tr.TraceError):
        tr.load("a\0b.csv")


def test_trace_functions_name_what_they_were_given():
    """Replays, capacities, efficiencies and plans of something that is not a
    trace, with an allocator that is not one, or with a granule of 0 raised
    AttributeError, TypeError or ZeroDivisionError from deep inside."""
    from ascmem import trace as tr
    t = tr.example("many_small")
    for call in (lambda: tr.replay(None), lambda: tr.min_capacity("x"), lambda: tr.efficiency(5),
                 lambda: tr.physical_efficiency([("a", 1, 100)]), lambda: ascmem.plan(None),
                 lambda: tr.replay(t, 3), lambda: tr.replay(t, True)):
        with pytest.raises(ArgumentTypeError):
            call()
    for call in (lambda: tr.physical_efficiency(t, 0), lambda: tr.paged_pool(t, 3 << 20),
                 lambda: tr.paged_pool(t, "2M"), lambda: tr.replay(t, "pool", -1),
                 lambda: tr.replay(t, "bestfit", "bestfit")):
        with pytest.raises(InvalidArgumentError):
            call()
