"""PyTorch memory-snapshot export, checked with PyTorch's own tool."""
import pickle

import pytest

import ascmem
from ascmem import snapshot
from ascmem import trace as tr
from ascmem.rules import MiB


def test_snapshot_structure():
    d = ascmem.Device("atlas-inference")
    a = d.malloc(5 * MiB, ascmem.Policy.HUGE_ONLY)
    b = d.dvpp_malloc(3_110_400)
    snap = snapshot.to_torch(d, [("alloc", a, 5 * MiB + 32), ("alloc", b, 3_110_432)])
    segs = {s["memory_kind"]: s for s in snap["segments"]}
    assert set(segs) == {"huge", "dvpp"}
    for s in segs.values():
        assert sum(blk["size"] for blk in s["blocks"]) == s["total_size"]
        assert s["total_size"] % (2 * MiB) == 0
    active = [blk for s in snap["segments"] for blk in s["blocks"] if blk["state"] == "active_allocated"]
    assert {blk["address"] for blk in active} == {a, b}
    assert [e["action"] for e in snap["device_traces"][0]] == ["alloc", "alloc"]


def test_rendered_by_torch_memory_viz(tmp_path):
    mv = pytest.importorskip("torch.cuda._memory_viz")
    path = tmp_path / "snap.pickle"
    t = tr.example("video_pipeline")
    tr.replay(t, ascmem.Device("atlas-inference"), snapshot=path)
    data = pickle.loads(path.read_bytes())
    summary = mv.segsum(data)
    # a run of held pages per segment: here one of huge pages, one of media, one of host
    assert "segments: 3" in summary and "total_allocated" in summary
    assert [s["memory_kind"] for s in data["segments"]] == ["huge", "dvpp", "host"]
    text = mv.trace(data)
    assert "entries" in text and "3.0MiB" in text  # the 3,110,400-byte media frames
    assert "seg_0" in text and "del " in text
    html = mv.segment_plot(data)
    assert "snapshot.pickle" in html
