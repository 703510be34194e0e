"""The backend contract: each backend is an upstream class that declares what
it can do (src/ascmem/_upstream.pxi, the top of the file), and the Device
reads those capabilities, never the backend's name.  Adding a backend is its
class, one line of the registry and one line here."""
import os
import re

import pytest

import ascmem
from ascmem import _core
from ascmem.errors import InvalidArgumentError, UnsupportedError

import fake_acl
from conftest import MiB, ROOT

SRC = os.path.join(ROOT, "src", "ascmem")

# one line per backend: its name and how a test makes a Device of it here
MAKERS = {
    "sim": lambda **kw: ascmem.Device("atlas-a2-training", backend="sim", **kw),
    "host": lambda **kw: ascmem.Device("atlas-a2-training", backend="host", memory=1 << 30, **kw),
    "acl": lambda **kw: ascmem.Device("atlas-a2-training", backend="acl", acl_module=fake_acl.make(),
                                      **kw),
}


def test_every_registered_backend_is_tested_and_declares_every_capability():
    caps = _core.backends()
    assert set(caps) == set(MAKERS)
    for name, c in caps.items():
        assert set(c) == {"holds_memory", "readable", "from_runtime", "paging", "chunk_alignment"}
        assert c["paging"] in ("counted", "os", "runtime"), name
        assert c["chunk_alignment"] == 0 or c["chunk_alignment"] & (c["chunk_alignment"] - 1) == 0
        assert not c["readable"] or c["holds_memory"], name  # host-readable memory is memory


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_a_device_behaves_as_its_backend_declares(name):
    c = _core.backends()[name]
    dev = MAKERS[name]()
    p = dev.malloc(4096)
    if c["readable"]:
        view = dev.buffer(p, 16)
        view[:4] = b"abcd"
        assert bytes(view[:4]) == b"abcd"
        view.release()
    else:
        with pytest.raises(UnsupportedError):
            dev.buffer(p, 16)
    dev.free(p)
    dev.check()
    # a pool grows from an upstream only where the chunks are memory
    grow = {"normal": (4 * MiB, 64 * MiB)}
    if c["holds_memory"]:
        grown = MAKERS[name](pool_sizes=grow)
        grown.free(grown.malloc(16 * MiB, ascmem.Policy.NORMAL_ONLY))
        grown.check()
        grown.close()
    else:
        with pytest.raises(InvalidArgumentError):
            MAKERS[name](pool_sizes=grow)
    dev.close()


def test_no_backend_name_is_compared_outside_the_registry():
    """The Device's parts ask the upstream's capabilities; only the registry
    (_upstream.pxi's _make_upstream) turns a name into a backend."""
    pattern = re.compile(r"""(backend|\.name)\s*(==|!=)\s*["'](sim|host|acl)["']""")
    found = []
    for fname in sorted(os.listdir(SRC)):
        if fname.endswith((".pxi", ".pyx")) and fname != "_upstream.pxi":
            with open(os.path.join(SRC, fname)) as f:
                found += [f"{fname}:{i}" for i, line in enumerate(f, 1) if pattern.search(line)]
    assert not found, found
