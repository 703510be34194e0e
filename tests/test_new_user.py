"""What a new user meets (issue 47): a live Device's snapshot, the
out-of-memory message, statistics that agree with each other, torch's
names, the bench and the command line."""
import pickle
import random

import pytest

import ascmem
from ascmem import Policy, snapshot, stats
from ascmem.rules import MiB


# ---- 47.1: a snapshot of a live Device holds what the device holds ----------------


def _reserved_by_kind(dev):
    """What memory_stats counts as reserved, per kind (stats._reserved)."""
    return {name: stats._reserved(k)[0] for name, k in dev.stats().items() if name != "device"}


def _segment_bytes_by_kind(snap):
    out = {}
    for seg in snap["segments"]:
        out[seg["memory_kind"]] = out.get(seg["memory_kind"], 0) + seg["total_size"]
    return out


def _check_snapshot(dev, asleep=()):
    snap = snapshot.to_torch(dev)
    by_kind = _segment_bytes_by_kind(snap)
    for name, reserved in _reserved_by_kind(dev).items():
        assert by_kind.get(name, 0) == reserved, name
    live = {b["address"]: b for b in dev.snapshot()}
    seen = set()
    for seg in snap["segments"]:
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        at = seg["address"]
        for b in seg["blocks"]:  # contiguous, in order, inside the segment
            assert b["address"] == at
            at += b["size"]
            if b["state"] == "active_allocated":
                assert live[b["address"]]["size"] == b["size"]
                seen.add(b["address"])
    assert seen == set(live) - set(asleep)  # every awake live block is in a segment
    return snap


@pytest.mark.parametrize("model", ["atlas-a2-training", "atlas-inference"])
def test_live_snapshot_reserved_is_memory_stats(model, tmp_path):
    mv = pytest.importorskip("torch.cuda._memory_viz")
    dev = ascmem.Device(model)
    dev.malloc(4096)
    path = snapshot.save_torch(dev, tmp_path / "s.pickle")
    data = pickle.loads(path.read_bytes())
    reserved = dev.memory_stats()["reserved_bytes.all.current"]
    assert reserved == 24576 if model == "atlas-a2-training" else reserved > 0
    assert sum(s["total_size"] for s in data["segments"]) == reserved
    # torch's own reading of the file (was 64.0GiB: base of the range to the block)
    assert f"total_reserved: {mv.Bytes(reserved)}\n" in mv.segsum(data)
    _check_snapshot(dev)


@pytest.mark.parametrize("paged", [False, True])
def test_live_snapshot_follows_a_random_workload(paged):
    mv = pytest.importorskip("torch.cuda._memory_viz")
    rng = random.Random(47)
    kw = dict(backend="host", paged=True, release_threshold=8 * MiB) if paged else {}
    dev = ascmem.Device("atlas-a2-training", **kw)
    live = []
    for step in range(400):
        if live and rng.random() < 0.45:
            dev.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice([rng.randint(1, 4096), rng.randint(4096, 1 << 20),
                               rng.randint(1 << 20, 24 * MiB)])
            live.append(dev.malloc(size, rng.choice([Policy.HUGE_FIRST, Policy.NORMAL_ONLY])))
        if step % 50 == 0:
            mv.segsum(_check_snapshot(dev))  # torch checks each segment's blocks add up
    for p in live:
        dev.free(p)
    snap = _check_snapshot(dev)
    if paged:  # freed granules kept under the release threshold are still mapped
        assert sum(s["total_size"] for s in snap["segments"]) == \
            dev.memory_stats()["reserved_bytes.all.current"]
    dev.close()


def test_snapshot_leaves_out_a_sleeping_block():
    dev = ascmem.Device("atlas-a2-training", backend="host", paged=True)
    a = dev.malloc(6 * MiB, tag="kv")
    b = dev.malloc(3 * MiB)
    dev.sleep("kv")
    snap = _check_snapshot(dev, asleep={a})
    active = [blk["address"] for s in snap["segments"] for blk in s["blocks"]
              if blk["state"] == "active_allocated"]
    assert active == [b]
    dev.wake("kv")
    _check_snapshot(dev)
    dev.free(a)
    dev.free(b)
    dev.close()


# ---- 47.3: statistics that agree with each other ------------------------------

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

_METRICS = ("allocated_bytes", "requested_bytes", "active_bytes", "inactive_split_bytes",
            "reserved_bytes", "allocation", "active", "inactive_split", "segment")
_GROUPS = ("all", "small_pool", "large_pool")
_BYTES_AND_BLOCKS = (("allocated_bytes", "allocation"), ("active_bytes", "active"),
                     ("inactive_split_bytes", "inactive_split"), ("reserved_bytes", "segment"))


def check_stats_agree(dev):
    s = dev.memory_stats()
    for m in _METRICS:
        for g in _GROUPS:
            cur, peak, alloc, freed = (s[f"{m}.{g}.{x}"] for x in
                                       ("current", "peak", "allocated", "freed"))
            assert min(cur, peak, alloc, freed) >= 0, (m, g)
            assert peak >= cur, (m, g, cur, peak)
            assert alloc - freed == cur, (m, g, cur, alloc, freed)
        for x in ("current", "allocated", "freed"):
            assert s[f"{m}.all.{x}"] == s[f"{m}.small_pool.{x}"] + s[f"{m}.large_pool.{x}"], (m, x)
    for g in _GROUPS:
        for size, count in _BYTES_AND_BLOCKS:
            if s[f"{size}.{g}.current"]:
                assert s[f"{count}.{g}.current"], (size, g)
        for size, count in _BYTES_AND_BLOCKS[:3]:  # a block has bytes
            if s[f"{count}.{g}.current"]:
                assert s[f"{size}.{g}.current"], (count, g)
        assert s[f"requested_bytes.{g}.current"] <= s[f"allocated_bytes.{g}.current"]
        # what is held is either allocated or an inactive split block
        assert s[f"reserved_bytes.{g}.current"] == \
            s[f"allocated_bytes.{g}.current"] + s[f"inactive_split_bytes.{g}.current"], g
    # memory_summary shows the same figures: its peak column is never below the current one
    rows = [r for r in dev.memory_summary().splitlines() if r.startswith("| Non-releasable")]
    assert len(rows) == 1
    return s


_OPS = st.lists(st.tuples(st.sampled_from(["malloc", "free", "reset"]),
                          st.sampled_from([1, 512, 4096, 5000, 70_000, 1 << 20, 3 * MiB,
                                           9 * MiB + 17]),
                          st.sampled_from([Policy.HUGE_FIRST, Policy.HUGE_ONLY,
                                           Policy.NORMAL_ONLY]),
                          st.integers(0, 1 << 16)), max_size=60)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS, model=st.sampled_from(["atlas-a2-training", "atlas-inference"]),
       paged=st.booleans())
def test_memory_stats_invariants_over_random_workloads(ops, model, paged):
    kw = dict(paged=True, release_threshold=4 * MiB) if paged and model == "atlas-a2-training" \
        else {}
    dev = ascmem.Device(model, **kw)
    live = []
    for op, size, policy, pick in ops:
        if op == "malloc":
            live.append(dev.malloc(size, policy))
        elif op == "free" and live:
            dev.free(live.pop(pick % len(live)))
        elif op == "reset":
            dev.reset_peaks()
        check_stats_agree(dev)
    for p in live:
        dev.free(p)
    s = check_stats_agree(dev)
    assert s["allocated_bytes.all.current"] == 0
    dev.check()


def test_issue_report_non_releasable_memory_has_blocks_and_a_peak():
    """The report: 2,106,368 inactive bytes with a peak of 0 and a count of 0."""
    dev = ascmem.Device("atlas-a2-training")
    dev.malloc(4096)
    dev.malloc(3 * MiB, Policy.HUGE_ONLY)
    s = check_stats_agree(dev)
    assert s["inactive_split_bytes.all.current"] > 0
    assert s["inactive_split.all.current"] >= 1
    row = next(r for r in dev.memory_summary().splitlines() if r.startswith("| Non-releasable"))
    cells = [c.strip() for c in row.split("|")[2:4]]
    assert cells[0] == cells[1] and cells[0] != "0 B"
