"""ascmem.torch chooses how torch allocates from a Device by what its backend
declares (_core.backends(): readable, from_runtime, ...), never by the
backend's name, as the Device itself does (tests/test_backends.py)."""
import os
import re

import pytest

pytest.importorskip("torch")
pytest.importorskip("ninja")

import ascmem  # noqa: E402
import ascmem.torch as at  # noqa: E402
from conftest import ROOT

SRC = os.path.join(ROOT, "src", "ascmem", "torch")


def test_no_backend_name_is_compared_in_ascmem_torch():
    pattern = re.compile(r"""(backend|\.name)\s*(==|!=|in)\s*[("'\[]+(sim|host|acl)["']""")
    found = []
    for fname in sorted(os.listdir(SRC)):
        if fname.endswith(".py"):
            with open(os.path.join(SRC, fname)) as f:
                found += [f"{fname}:{i}" for i, line in enumerate(f, 1) if pattern.search(line)]
    assert not found, found


def test_install_follows_the_declared_capabilities(monkeypatch):
    monkeypatch.setattr(at._state, "last", at._state.last)  # later tests' install() gets theirs
    dev = ascmem.Device("atlas-a2-training", backend="host", paged=True, memory=1 << 30)
    declared = dict(ascmem._core.backends()["host"])
    assert declared["readable"] and not declared["from_runtime"]
    # the same backend declaring memory the CPU cannot read: refused, whatever its name
    monkeypatch.setitem(at._backend_caps, "host", dict(declared, readable=False))
    with pytest.raises(ascmem.UnsupportedError, match="no memory the CPU can use"):
        at.install(dev)
    assert not at.installed()
    monkeypatch.setitem(at._backend_caps, "host", declared)
    assert at.install(dev) is dev
    at.uninstall()
