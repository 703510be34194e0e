"""Planning at real scale (issue 44): the compiled replay gives the figures
the replay in Python gives, event for event; what the tools print on the
shipped traces stays the same."""
import numpy as np
import pytest

import ascmem
from ascmem import trace as tr
from ascmem.trace_data import Event, Trace
from conftest import MiB

EXAMPLES = tr.example_names()


def python_replay(monkeypatch, *args, **kw):
    with monkeypatch.context() as m:
        m.setattr(tr, "_compiled", lambda *a: False)
        return tr.replay(*args, **kw)


def same(a, b):
    for key in ("ops_per_sec", "seconds"):
        a.pop(key), b.pop(key)
    assert a == b


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_compiled_replay_gives_the_python_replays_figures(monkeypatch, name):
    t = tr.example(name)
    peak = t.peak_live()
    for make, cap in ((lambda c: ascmem.Pool(c, base=1 << 32), 2 * peak),
                      (lambda c: ascmem.Pool(c, base=1 << 32), peak * 9 // 10),  # failures
                      (lambda c: ascmem.BuddyAllocator(c, base=1 << 32), 4 * peak)):
        cap = max(cap // 4096 * 4096, 1 << 20)
        for stop in (False, True):
            fast = tr.replay(t, make(cap), stop_at_failure=stop)
            slow = python_replay(monkeypatch, t, make(cap), stop_at_failure=stop)
            same(fast, slow)


@pytest.mark.parametrize("name", EXAMPLES[::4])
def test_paged_replays_and_min_capacity_agree(monkeypatch, name):
    t = tr.example(name)
    same(tr.replay(t, tr.paged_pool(t, 64 << 10)),
         python_replay(monkeypatch, t, tr.paged_pool(t, 64 << 10)))
    fast = tr.min_capacity(t, "pool")
    with monkeypatch.context() as m:
        m.setattr(tr, "_compiled", lambda *a: False)
        assert tr.min_capacity(t, "pool") == fast


def test_slots_pair_frees_with_the_live_allocation_of_their_id():
    t = Trace([Event("a", 5, 64), Event("a", 7, 64), Event("f", 5, 64), Event("a", 5, 128),
               Event("f", 7, 64), Event("f", 5, 128)])
    assert t.slots().tolist() == [0, 1, 0, 2, 1, 2]


def test_a_failed_allocations_free_is_skipped_and_the_first_error_is_the_apis(monkeypatch):
    t = Trace([Event("a", 1, 3 * MiB), Event("a", 2, 3 * MiB), Event("f", 2, 3 * MiB),
               Event("f", 1, 3 * MiB)])
    pool = ascmem.Pool(4 * MiB, base=1 << 32)
    r = tr.replay(t, pool)
    assert r["failures"] == 1 and r["first_failure"]["event"] == 1 and r["peak_live"] == 3 * MiB
    slow = python_replay(monkeypatch, t, ascmem.Pool(4 * MiB, base=1 << 32))
    assert r["first_failure"] == slow["first_failure"]
    assert r["first_failure"]["error"].startswith("cannot allocate 3.00 MiB")
    assert pool.stats()["live_count"] == 0
    pool.check()


def test_a_closed_pool_raises_as_it_does_through_the_api():
    pool = ascmem.Pool(4 * MiB, base=1 << 32)
    pool.close()
    with pytest.raises(ascmem.ClosedError):
        tr.replay(Trace([Event("a", 1, 64), Event("f", 1, 64)]), pool)


def test_progress_is_called_between_blocks_only():
    t = tr.example("many_small")
    seen = []
    tr.replay(t, ascmem.Pool(1 << 30, base=1 << 32), progress=lambda i, n: seen.append((i, n)))
    assert seen and seen[-1] == (len(t), len(t)) and len(seen) <= len(t) // 4096 + 2


def test_a_chrome_trace_streams_into_the_columns_the_whole_read_gives(tmp_path, monkeypatch):
    import json
    from ascmem import trace_import
    events = []
    for i in range(3000):  # allocations, frees, a reused address, frees from before
        events.append({"name": "[memory]", "ph": "i", "ts": i // 3,
                       "args": {"Addr": 0x1000 * (i % 97), "Bytes": (i % 13 + 1) * 512 *
                                (1 if i % 3 else -1), "Device Type": 20, "Device Id": i % 2}})
        events.append({"name": "aten::add", "ph": "X", "ts": i, "args": {"x": [1, {"y": 2}]}})
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, "after": [1]}))
    streamed = tr.load(path, device="npu:1")
    monkeypatch.setattr(trace_import, "streaming", lambda: False)
    whole = tr.load(path, device="npu:1")
    assert streamed.source == whole.source and streamed.source["skipped_frees"] > 0
    assert list(streamed.events) == list(whole.events) and len(whole) > 1000
