"""The backend contract: each backend is a module with an upstream class that
declares what it can do (src/ascmem/_upstream.pyx, the top of the file), and
the Device reads those capabilities, never the backend's name.  Adding a
backend is its module, one line of the registry (_backends.py) and one line
here."""
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
        assert set(c) == {"holds_memory", "readable", "from_runtime", "paging", "chunk_alignment",
                          "sharing"}
        assert c["paging"] in ("counted", "os", "runtime"), name
        assert c["sharing"] in ("local", "os", "runtime"), name
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
    (_backends.py) turns a name into a backend, and only a backend's own
    module names it.  Neither compared nor used as a key."""
    compared = re.compile(r"""(backend|\.name)\s*(==|!=)\s*["'](sim|host|acl)["']""")
    keyed = re.compile(r"""\{\s*["'](sim|host|acl)["']\s*:""")
    own = {"_backends.py", "_backend_sim.pyx", "_backend_host.pyx", "_backend_acl.pyx"}
    found = []
    for fname in sorted(os.listdir(SRC)):
        if fname.endswith((".pxi", ".pyx", ".pxd", ".py")) and fname not in own:
            with open(os.path.join(SRC, fname)) as f:
                found += [f"{fname}:{i}" for i, line in enumerate(f, 1)
                          if compared.search(line) or keyed.search(line)]
    assert not found, found


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_each_backend_is_a_module_of_its_own(name):
    """One module per backend, made by the registry's line for it."""
    from ascmem import _backends
    module = _backends.BACKENDS[name].__module__
    assert module == f"ascmem._backend_{name}", module
    up = _backends.make_upstream(name, 0, fake_acl.make())
    assert type(up).__module__ == module and up.name == name
    up.close()


def test_the_c_core_is_linked_into_one_module_only():
    """The C core's state (the pluggable and external allocator registries,
    the fork handler) exists once in a process: only ascmem._core defines its
    functions; the other extension modules call it through _core's table."""
    import glob
    import shutil
    import subprocess
    nm = shutil.which("nm")
    if not nm:
        pytest.skip("no nm")
    here = os.path.dirname(_core.__file__)
    suffix = os.path.splitext(_core.__file__)[1]
    defines = {}
    for path in glob.glob(os.path.join(here, "_*" + suffix)):
        out = subprocess.run([nm, "-D", "--defined-only", path], capture_output=True,
                             text=True, check=True).stdout
        defines[os.path.basename(path).split(".")[0]] = {l.split()[-1] for l in out.splitlines()
                                                         if l.split()[-1].startswith("ascm_")}
    assert len(defines) > 5, defines  # the modules are built
    assert "ascm_pool_create" in defines["_core"]
    assert {m for m, names in defines.items() if names} == {"_core"}, defines
