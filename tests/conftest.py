"""What every test directory shares: size units, the base address of test
pools, the repository's paths, a child-interpreter runner, and the fixtures.
Test files import these (`from conftest import MiB, run_child`): pytest puts
this directory on sys.path, which also makes fake_acl importable everywhere."""
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

import ascmem


KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
BASE = 1 << 32  # a non-zero base, so that address 0 is never a valid block

TESTS = os.path.dirname(os.path.abspath(__file__))  # fake_acl.py, data/, torch_npu_standin/
ROOT = os.path.dirname(TESTS)  # the repository: README.md, docs/, scripts/, src/


def make_pool(size=64 * MiB):
    return ascmem.Pool(size, base=BASE)


def make_buddy(size=64 * MiB):
    return ascmem.BuddyAllocator(size, base=BASE)


def load_script(name):
    """scripts/NAME.py as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_child(code, timeout=120, env=None):
    """Runs code in a fresh interpreter, with this directory importable
    (fake_acl); returns its CompletedProcess.  A crash shows as a negative
    return code, a hang as TimeoutExpired, not as a killed or stuck suite."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([TESTS] + sys.path)
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)],
                       capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"child exited {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture
def acl_a2_device():
    """An Atlas A2 training Device behind the ascmem.acl drop-in (stream pools
    exist on A2 only), taken off again after the test."""
    from ascmem import acl
    d = ascmem.Device("atlas-a2-training")
    acl.use(d)
    yield d
    acl.use(None)


@pytest.fixture(params=["pool", "buddy"])
def allocator(request):
    """One contract suite over every allocator variant."""
    return make_pool() if request.param == "pool" else make_buddy()


def _leaves_slow_out(config):
    """Whether the -m expression deselects a test marked only slow."""
    from _pytest.mark.expression import Expression
    expr = config.option.markexpr
    try:
        return bool(expr) and not Expression.compile(expr).evaluate(lambda m: m == "slow")
    except Exception:  # pytest's private parser changed: collect everything
        return False


def pytest_ignore_collect(collection_path, config):
    """Under -m "not slow" the files slow_tests.py lists whole are not
    imported at all (importing torch alone costs seconds)."""
    from slow_tests import SLOW_FILES
    path = os.path.relpath(str(collection_path), ROOT).replace(os.sep, "/")
    return True if path in SLOW_FILES and _leaves_slow_out(config) else None


def pytest_collection_modifyitems(config, items):
    """Marks the tests slow_tests.py lists as slow (see pyproject's markers)."""
    from slow_tests import SLOW_FILES, SLOW_TESTS
    for item in items:
        path = os.path.relpath(str(item.path), ROOT).replace(os.sep, "/")
        test = path + "::" + item.nodeid.split("[")[0].split("::")[1] if "::" in item.nodeid else path
        if path in SLOW_FILES or test in SLOW_TESTS:
            item.add_marker("slow")
