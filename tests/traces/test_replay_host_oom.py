"""The compiled peers (ascmem._replay_peers) when the host runs out of
memory under them: a MemoryError that says so, and a peer that refuses
further calls, not std::terminate ending the process.  Real exhaustion, in a
child process under an address-space limit."""
import os

import pytest

from conftest import run_child

# AddressSanitizer reserves terabytes of shadow address space at start and
# aborts rather than throws when it cannot allocate: no limit means anything
pytestmark = pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", ""),
                                reason="an address-space limit does not hold under ASan")

CHILD = """
    import resource
    import numpy as np
    from ascmem import _replay_peers as P

    n = 6_000_000  # 6M blocks live at once: ~300 MB of C++ nodes
    alloc, slot = np.ones(n, np.uint8), np.arange(n, dtype=np.int64)
    size, kind = np.full(n, 64, np.uint64), np.zeros(n, np.uint8)
    peer = {make}
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + (96 << 20),) * 2)
    try:
        {call}
    except MemoryError as exc:
        print("first:", exc)
    try:
        peer.alloc(64)
    except MemoryError as exc:
        print("then:", exc)
    """


@pytest.mark.parametrize("make", ["P.BestFit(1 << 40)", "P.BestFitWilderness(1 << 40)",
                                  "P.TorchCachingAllocator(1 << 50)",
                                  "P.TorchExpandableSegments(1 << 50)"])
def test_a_replay_that_exhausts_the_host_raises_memory_error_and_the_peer_is_lost(make):
    r = run_child(CHILD.format(make=make, call="P.replay_peer(peer, alloc, slot, size, kind)"))
    name = make.split("(")[0][2:]
    assert f"first: the host ran out of memory inside {name}" in r.stdout, r.stdout + r.stderr
    assert "then: " in r.stdout and "refuses further calls" in r.stdout


def test_bestfit_unmapped_peak_that_exhausts_the_host_raises_memory_error():
    r = run_child(CHILD.format(make="None",
                               call="P.bestfit_unmapped_peak(alloc, slot, size, 2 << 20)")
                  .replace("        peer.alloc(64)", "        raise MemoryError('n/a')"))
    assert "first: the host ran out of memory inside BestFit" in r.stdout, r.stdout + r.stderr
