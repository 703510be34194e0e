"""The subpackages (acl, trace, tools, emulations) and the module paths from
before them: each old path is the moved module itself."""

import importlib
import pickle
import subprocess
import sys

import pytest

import ascmem
from ascmem._moved import MOVED


@pytest.mark.parametrize("old,new", sorted(MOVED.items()))
def test_an_old_path_is_the_moved_module_itself(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)
    assert sys.modules[old] is sys.modules[new]


def test_from_ascmem_import_an_old_name():
    from ascmem import cli, stream_pools, trace_data  # noqa: F401  (old names)
    assert cli.__name__ == "ascmem.tools.cli"
    assert stream_pools.__name__ == "ascmem.acl.stream_pools"
    assert trace_data.__name__ == "ascmem.trace.data"


def test_a_patch_through_the_old_name_is_seen_through_the_new(monkeypatch):
    import ascmem.reference as old
    from ascmem.emulations import reference as new
    monkeypatch.setattr(old, "GRANULE_FOR_TEST", 7, raising=False)
    assert new.GRANULE_FOR_TEST == 7


def test_an_event_pickled_loads_under_either_path():
    from ascmem.trace_data import Event
    ev = Event("a", 1, 64)
    assert pickle.loads(pickle.dumps(ev)) == ev


def test_an_unknown_name_is_still_an_import_error():
    with pytest.raises(ImportError):
        importlib.import_module("ascmem.no_such_module")


def test_python_dash_m_ascmem_runs_the_cli():
    out = subprocess.run([sys.executable, "-m", "ascmem", "--version"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and ascmem.__version__ in out.stdout
