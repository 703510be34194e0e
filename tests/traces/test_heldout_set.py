"""The held-out set is what its recorder and docs/TRACES.md say it is: every
file of tests/data/heldout/ is a family scripts/record_heldout_traces.py
registers and describes, and docs/TRACES.md lists, and every registered
family has its file, which loads as a trace.  (The recorder is read, not
imported, so that these checks need no torch.)"""
import ast
import glob
import os

import pytest

from ascmem import trace as tr
from conftest import ROOT, TESTS

HELDOUT = os.path.join(TESTS, "data", "heldout")
FILES = sorted(os.path.basename(p)[:-len(".csv.gz")] for p in glob.glob(os.path.join(HELDOUT, "*.csv.gz")))


def _recorder():
    with open(os.path.join(ROOT, "scripts", "record_heldout_traces.py"), encoding="utf-8") as f:
        return ast.parse(f.read())


def _registered():
    """The names of the recorder's RECORDERS tuple, in its order."""
    for node in _recorder().body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["RECORDERS"]:
            return [pair.elts[0].value for pair in node.value.elts]
    raise AssertionError("no RECORDERS in scripts/record_heldout_traces.py")


def _held_out_section():
    with open(os.path.join(ROOT, "docs", "TRACES.md"), encoding="utf-8") as f:
        return f.read().split("## Held-out traces", 1)[1].split("\n## ", 1)[0]


def test_every_held_out_file_is_a_registered_family_and_every_family_has_its_file():
    registered = _registered()
    assert len(registered) == len(set(registered))
    assert sorted(registered) == FILES


def test_the_recorder_and_the_docs_describe_every_held_out_family():
    described = ast.get_docstring(_recorder())
    listed = _held_out_section()
    assert [n for n in FILES if f"\n  {n} " not in described] == []
    assert [n for n in FILES if f"- `{n}`:" not in listed] == []


@pytest.mark.parametrize("name", FILES)
def test_a_held_out_trace_loads_with_allocations_and_frees(name):
    t = tr.load(os.path.join(HELDOUT, name + ".csv.gz"))
    ops = {e.op for e in t.events}
    assert ops == {"a", "f"}
    assert t.peak_live() > 0
