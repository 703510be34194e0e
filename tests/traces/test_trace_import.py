"""PyTorch traces as ascmem traces: profiler Chrome traces (recorded with real
torch when it is installed) and memory snapshots (built from torch's
documented format, checked to render in torch.cuda._memory_viz)."""
import dataclasses
import gzip
import io
import json
import pickle

import pytest

import ascmem
from ascmem import trace
from ascmem.trace import TraceError
from conftest import MiB


def mem(ts, addr, nbytes, dtype=0, did=-1):
    return {"ph": "i", "name": "[memory]", "ts": ts, "pid": 1, "tid": 1,
            "args": {"Addr": addr, "Bytes": nbytes, "Device Type": dtype, "Device Id": did,
                     "Total Allocated": 0, "Total Reserved": 0}}


def write_json(path, events, gz=False):
    data = json.dumps({"traceEvents": events}).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_chrome_trace_pairs_by_address_and_skips_frees_from_before(tmp_path):
    events = [mem(1, 0x1000, -64),                 # allocated before recording
              mem(2, 0x2000, 1000), mem(3, 0x3000, 5000),
              {"ph": "X", "name": "aten::add", "ts": 3},
              mem(4, 0x2000, -1000), mem(5, 0x2000, 300),   # the address is reused
              mem(6, 0x3000, -5000), mem(7, 0x2000, -300)]
    t = trace.load(write_json(tmp_path / "prof.json", events, gz=True))
    assert [(e.op, e.size) for e in t.events] == [("a", 1000), ("a", 5000), ("f", 1000),
                                                  ("a", 300), ("f", 5000), ("f", 300)]
    assert t.source == {"format": "chrome", "device": "cpu", "skipped_frees": 1,
                        "reserved_peak": None}
    assert t.peak_live() == 6000 and t.name == "prof"


def test_chrome_trace_device_choice(tmp_path):
    events = [mem(1, 0x10, 100), mem(2, 0x20, 200, dtype=1, did=0), mem(3, 0x30, 300, 1, 0),
              mem(4, 0x40, 400, dtype=20, did=1)]
    path = write_json(tmp_path / "mixed.json", events)
    assert trace.load(path).source["device"] == "cuda:0"  # the most events
    assert trace.load(path, device="npu").peak_live() == 400
    assert trace.load(path, device="cpu").peak_live() == 100
    with pytest.raises(TraceError, match="no memory events of device 'xpu'.*cuda:0 \\(2 events\\)"):
        trace.load(path, device="xpu")


def test_chrome_trace_without_memory_events(tmp_path):
    path = write_json(tmp_path / "cpu_only.json", [{"ph": "X", "name": "aten::mm", "ts": 1}])
    with pytest.raises(TraceError, match="profile_memory=True"):
        trace.load(path)


def test_broken_json_is_a_trace_error(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"traceEvents": [')
    with pytest.raises(TraceError, match="broken.json: not a Chrome trace"):
        trace.load(path)


def test_unknown_format_names_what_is_read(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello,world\n")
    with pytest.raises(TraceError, match="notes.txt:1: not a trace ascmem reads.*Chrome trace.*snapshot"):
        trace.load(path)


def test_real_profiler_trace_from_torch(tmp_path):
    torch = pytest.importorskip("torch")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        a = torch.ones(512, 1024)   # 2 MiB
        b = a * 2
        del a
        c = torch.empty(3 * MiB, dtype=torch.uint8)
        del b, c
    path = tmp_path / "torch_trace.json"
    prof.export_chrome_trace(str(path))
    t = trace.load(path)
    sizes = sorted(e.size for e in t.events if e.op == "a")
    assert 2 * MiB in sizes and 3 * MiB in sizes
    assert t.source["device"] == "cpu"
    report = trace.replay(t, ascmem.Pool(64 * MiB, base=1 << 32))
    assert report["failures"] == 0 and report["peak_live"] >= 4 * MiB


def snapshot(base=0x7F0000000000):
    """A memory snapshot in the format torch.cuda.memory._snapshot() returns."""
    seg = 2 * MiB
    return {
        "segments": [{"device": 0, "address": base, "total_size": seg, "allocated_size": 1024,
                      "active_size": 1024, "requested_size": 1000, "stream": 0,
                      "segment_type": "small", "segment_pool_id": (0, 0), "is_expandable": False,
                      "frames": [],
                      "blocks": [{"address": base, "size": 512, "requested_size": 500,
                                  "state": "inactive", "frames": []},
                                 {"address": base + 512, "size": 1024, "requested_size": 1000,
                                  "state": "active_allocated", "frames": []}]}],
        "device_traces": [[
            {"action": "segment_alloc", "addr": base, "size": seg, "stream": 0, "time_us": 1,
             "frames": []},
            {"action": "alloc", "addr": base, "size": 512, "stream": 0, "time_us": 2, "frames": []},
            {"action": "alloc", "addr": base + 512, "size": 1024, "stream": 0, "time_us": 3,
             "frames": []},
            {"action": "free_requested", "addr": base, "size": 512, "stream": 0, "time_us": 4,
             "frames": []},
            {"action": "free_completed", "addr": base, "size": 512, "stream": 0, "time_us": 5,
             "frames": []},
        ]],
    }


def test_snapshot_device_traces(tmp_path):
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snapshot()))
    t = trace.load(path)
    assert [(e.op, e.size) for e in t.events] == [("a", 512), ("a", 1024), ("f", 512)]
    assert t.source["format"] == "snapshot" and t.source["reserved_peak"] == 2 * MiB
    assert t.name == "snap"


def test_snapshot_renders_in_torch_memory_viz():
    torch = pytest.importorskip("torch")
    from torch.cuda import _memory_viz
    assert "<html" in _memory_viz.trace_plot(snapshot()).lower()


def test_a_pickle_that_is_not_plain_data_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("ran",))
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"device_traces": [[Evil()]]}))
    with pytest.raises(TraceError, match="not a PyTorch memory snapshot"):
        trace.load(path)


def test_cli_replays_a_chrome_trace(tmp_path):
    import subprocess
    import sys
    path = write_json(tmp_path / "p.json.gz", [mem(1, 0x10, 3 * MiB), mem(2, 0x10, -3 * MiB)],
                      gz=True)
    r = subprocess.run([sys.executable, "-m", "ascmem", "replay", str(path), "--allocator", "pool"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "3.0 MiB" in r.stdout, r.stderr


def test_snapshot_events_keep_their_streams_through_csv_and_replay(tmp_path):
    snap = snapshot()
    s1 = 0x5A5A00  # a second stream's handle, as torch writes it (an int)
    snap["device_traces"][0] += [
        {"action": "alloc", "addr": 0x7F0000100000, "size": 4096, "stream": s1, "time_us": 6,
         "frames": []},
        {"action": "free_completed", "addr": 0x7F0000100000, "size": 4096, "stream": s1,
         "time_us": 7, "frames": []}]
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snap))
    t = trace.load(path)
    assert [e.stream for e in t.events] == [0, 0, 0, s1, s1] and t.has_streams
    assert t.stream_peaks() == {0: 1536, s1: 4096}
    report = trace.replay(t, ascmem.Pool(64 * MiB, base=1 << 32))
    assert report["per_stream_peak_live"] == {"0": 1536, str(s1): 4096}
    out = tmp_path / "t.csv.gz"
    trace.save(t, out)
    again = trace.load(out)  # the stream column, read by the compiled reader
    assert list(again.events) == [dataclasses.replace(e, line=i + 2)
                                  for i, e in enumerate(t.events)]
    from ascmem import trace_csv

    slow = trace_csv.parse_text(gzip.decompress(out.read_bytes()), "t")
    assert [e.stream for e in slow.events] == [e.stream for e in again.events]
    with pytest.raises(trace.TraceError, match="stream 'x' is not an integer"):
        trace.load(io.BytesIO(b"op,id,size,stream\na,1,5,x\n"))
