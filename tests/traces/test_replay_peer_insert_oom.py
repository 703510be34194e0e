"""A compiled peer whose std::set insert (or vector push_back) runs out of
host memory: the guards of _replay_peers.pyx must see the std::bad_alloc.
Cython catches the exception of a call declared `except +` itself and, in a
noexcept method, prints "Exception ignored" and carries on with the insert
lost: the peer's free lists then disagree and a replay goes on with wrong
figures.  The failure is injected exactly there, by an operator new
(LD_PRELOAD, in a child) that throws for the n-th set node."""
import os
import shutil
import subprocess

import pytest

from conftest import run_child

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or "asan" in os.environ.get("LD_PRELOAD", ""),
                                reason="needs g++ for the failing operator new; not under ASan")

FAILING_NEW = r"""
#include <cstdlib>
#include <new>
static long countdown = -1;
static std::size_t target;
extern "C" void ascm_test_fail_new(long n, std::size_t size) { countdown = n; target = size; }
void *operator new(std::size_t n) {
    if (countdown >= 0 && n == target && countdown-- == 0) throw std::bad_alloc();
    void *p = std::malloc(n ? n : 1);
    if (!p) throw std::bad_alloc();
    return p;
}
void operator delete(void *p) noexcept { std::free(p); }
void operator delete(void *p, std::size_t) noexcept { std::free(p); }
"""

# a std::set<pair<uint64_t, uint64_t>> node: the tree node's header and the pair
SET_NODE = 48

CHILD = """
    import ctypes
    from ascmem import _replay_peers as P
    fail = ctypes.CDLL(None).ascm_test_fail_new
    fail.argtypes = (ctypes.c_long, ctypes.c_size_t)
    peer = P.{make}
    a, b, c = peer.alloc(4096), peer.alloc(4096), peer.alloc(4096)
    fail(0, {node})   # the next set node: the free of a, kept apart by b, lists it
    try:
        peer.free(a)
        print("free: ok")
    except MemoryError as exc:
        print("free:", exc)
    try:
        peer.alloc(4096)
        print("then: ok")
    except MemoryError as exc:
        print("then:", exc)
    """


@pytest.fixture(scope="module")
def failing_new(tmp_path_factory):
    d = tmp_path_factory.mktemp("failing_new")
    (d / "failing_new.cpp").write_text(FAILING_NEW)
    lib = d / "libfailing_new.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", "-o", str(lib), str(d / "failing_new.cpp")],
                   check=True, capture_output=True)
    return str(lib)


@pytest.mark.parametrize("make", ["BestFit(1 << 20)", "TorchCachingAllocator(1 << 50)",
                                  "TorchExpandableSegments(1 << 50)"])
def test_a_set_insert_that_runs_out_of_memory_is_memory_error_and_the_peer_is_lost(failing_new, make):
    env = dict(os.environ, LD_PRELOAD=failing_new)
    r = run_child(CHILD.format(node=SET_NODE, make=make), env=env)
    assert "Exception ignored" not in r.stderr, r.stderr
    name = make.split("(")[0]
    assert f"free: the host ran out of memory inside {name}" in r.stdout, r.stdout + r.stderr
    assert "then: " in r.stdout and "refuses further calls" in r.stdout, r.stdout
