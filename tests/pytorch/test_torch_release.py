"""What ascmem.torch's default Device keeps after torch frees 1 GiB, set
against torch's own allocator (glibc's malloc): the first time, the memory
goes back to the OS (RSS within 64 MiB of torch's); once the same step
repeats, it is kept and not faulted in again, as glibc keeps it in its heap
(the adaptive release threshold, csrc/paging.c "how much is kept").  Real
torch, real mapped memory, each case in a fresh process."""
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("ninja")  # torch.utils.cpp_extension builds the shim with it

from conftest import MiB, run_child  # noqa: E402


def last_json(r):
    return json.loads(r.stdout.splitlines()[-1])


def test_rss_after_freeing_1GiB_once_is_within_64MiB_of_torchs():
    from ascmem.torch import bench
    # the bench's free_1GiB_once row: free_1GiB's step once, in a fresh
    # process for each allocator (python -m ascmem.torch.bench --once-child)
    row = bench._once_row()
    assert row["ascmem_idle_rss_mib"] <= row["torch_idle_rss_mib"] + 64, row
    assert row["torch_faults"] > 0 and row["ascmem_faults"] > 0  # both mapped it fresh


def test_a_repeated_1GiB_step_maps_nothing_after_its_second_time():
    import ascmem.torch as at
    if at.RELEASE_THRESHOLD_MAX < 1100 * MiB:  # an eighth of the machine: 9 GiB of memory or more
        pytest.skip(f"the default Device keeps at most {at.RELEASE_THRESHOLD_MAX // MiB} MiB per kind here")
    r = run_child("""
        import json
        import ascmem.torch as at
        from ascmem.torch import bench
        dev = at.install()
        step = bench._big_tensors()
        seen = []
        for i in range(6):
            step()
            s = dev.stats()["huge"]
            seen.append((s["map_calls"], s["mapped"], bench._status("VmRSS")))
        print(json.dumps(seen))
    """, timeout=600)
    seen = last_json(r)
    calls = [c for c, _, _ in seen]
    assert calls[2:] == [calls[1]] * 4, calls      # the third step on: all of it kept
    assert seen[-1][1] >= 1024 * MiB               # the step's memory stays mapped...
    assert seen[-1][2] >= seen[0][2] + 900 * MiB   # ...and resident, as torch's would
