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
