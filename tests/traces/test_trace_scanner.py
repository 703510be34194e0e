"""Issue 44, item 1: profiler (Chrome) traces stream through ascmem's own
compiled JSON scanner (_tracejson.ChromeScanner) and read as json reads the
whole text -- the same events, the same source facts, the same errors --
whatever the chunking; the compiled pairing by address pairs as the Python
one does; snapshots read as before."""
import gc
import gzip
import io
import json
import pickle

import numpy as np
import pytest

from ascmem import trace as tr
from ascmem.trace import profiler as ti
from ascmem.trace.data import TraceError

EXAMPLES = tr.example_names()


def whole(data, device=None, name="t.json"):
    """json's reading of the whole text (the reader without the scanner)."""
    return tr._load_torch(data, name, "chrome", device)


def streamed(data, device=None, name="t.json", chunk=None):
    """The scanner's reading, the text given chunk bytes at a time."""
    chunks = [data] if chunk is None else [data[i:i + chunk] for i in range(0, len(data), chunk)]
    try:
        got = ti.from_chrome_chunks(iter(chunks), name, device)
    except ti.InvalidArgumentError as exc:
        raise TraceError(str(exc)) from None
    return tr._imported(got, name, "chrome")


def assert_same(a, b):
    assert a.source == b.source
    assert a.origin == b.origin
    assert list(a.events) == list(b.events)
    assert [a.where(i) for i in range(0, len(a), max(1, len(a) // 50))] == \
        [b.where(i) for i in range(0, len(b), max(1, len(b) // 50))]


def as_profiler_json(trace, seed=0):
    """A shipped trace written as the profiler writes it: [memory] events
    (an address per block, signed Bytes), operator events between them with
    nested args, strings with escapes and non-ASCII text."""
    rng = np.random.default_rng(seed)
    addr_of = {}
    out, ts = [], 1.7e12
    for k, e in enumerate(trace.events):
        ts += float(rng.integers(1, 2000)) / 1000
        if k % 7 == 0:
            ts = float(int(ts) + 1)  # a whole ts at times, still in order
        if k % 3 == 0:
            out.append({"ph": "X", "cat": "cpu_op", "name": "aten::matmul\u00e9\"\\n",
                        "pid": 1, "tid": 2, "ts": ts, "dur": 1.25,
                        "args": {"Input Dims": [[4, 8], [8, 16]], "Input type": ["float", ""],
                                 "Sequence number": 10 ** 20, "ok": True, "x": None}})
        if e.op == "a":
            addr_of[e.id] = 0x7F0000000000 + 0x200000 * len(addr_of)
        addr = addr_of[e.id]
        out.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                    "pid": 1, "tid": 2, "ts": int(ts) if k % 7 == 0 else ts,
                    "args": {"Total Reserved": 0, "Total Allocated": 0,
                             "Bytes": e.size if e.op == "a" else -e.size, "Addr": addr,
                             "Device Id": 0, "Device Type": 20}})
    return json.dumps({"schemaVersion": 1, "deviceProperties": [{"name": "\u00b5NPU"}],
                       "traceEvents": out, "traceName": "t"}, indent=0).encode()


@pytest.mark.parametrize("name", EXAMPLES[::3])
def test_a_shipped_trace_as_profiler_json_streams_into_the_whole_reads_columns(name):
    t = tr.example(name)
    data = as_profiler_json(t)
    s = streamed(data, chunk=65536)
    assert_same(s, whole(data))
    # and into the events it was written from: the same allocations and frees in order
    assert [(e.op, e.size) for e in s.events] == [(e.op, e.size) for e in t.events]
    assert s.source["device"] == "npu:0" and s.source["skipped_frees"] == 0


def test_the_chunking_does_not_change_the_reading():
    data = as_profiler_json(tr.example("many_small"))[:]
    first = streamed(data)
    for chunk in (1, 2, 3, 7, 64, 4093):
        if chunk < 7:  # byte by byte on a part (the scanner waits for whole events)
            part = as_profiler_json(tr.Trace(list(tr.example("many_small").events)[:60]))
            assert_same(streamed(part, chunk=chunk), streamed(part))
        else:
            assert_same(streamed(data, chunk=chunk), first)


def test_a_real_profiler_trace_streams_into_the_whole_reads_columns(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        for _ in range(3):
            model(torch.randn(32, 64)).sum().backward()
    path = tmp_path / "real.json"
    prof.export_chrome_trace(str(path))
    data = path.read_bytes()
    s = tr.load(path)
    assert len(s) > 10 and s.source["format"] == "chrome"
    assert_same(streamed(data, name=str(path)), whole(data, name=str(path)))
    for chunk in (5, 1000):
        assert_same(streamed(data, chunk=chunk), whole(data))


def mem(ts, addr, nbytes, dtype=20, did=0):
    return {"ph": "i", "name": "[memory]", "ts": ts,
            "args": {"Addr": addr, "Bytes": nbytes, "Device Type": dtype, "Device Id": did}}


PLAIN = [mem(1, 0x1000, 512), mem(2, 0x2000, 64), mem(3, 0x1000, -512), mem(4, 0x2000, -64)]

# texts the scanner's fast form does not cover: each must read as json reads it
FORMS = {
    "a list document": json.dumps(PLAIN),
    "escapes in the name": json.dumps({"traceEvents": PLAIN}).replace(
        '"[memory]"', '"\\u005bmemory]"', 1),
    "escapes in keys": json.dumps({"traceEvents": PLAIN}).replace('"Bytes"', '"B\\u0079tes"', 1)
                       .replace('"traceEvents"', '"trace\\u0045vents"'),
    "a name that is not [memory]": json.dumps({"traceEvents": PLAIN}).replace(
        '"[memory]"', '"[memory] "', 1),
    "duplicate keys: the last counts": '{"traceEvents": [{"name": "[memory]", "ts": 1, "args": '
                                       '{"Addr": 1, "Bytes": 8, "Bytes": 16}, "name": "[memory]",'
                                       ' "ts": 0.5}, {"name": "[memory]", "name": "op", "ts": 1,'
                                       ' "args": {"Addr": 9, "Bytes": 1}}]}',
    "two traceEvents lists: the last counts": '{"traceEvents": [{"name": "[memory]", "ts": 1, '
                                              '"args": {"Addr": 1, "Bytes": 8}}], "traceEvents":'
                                              ' [{"name": "[memory]", "ts": 1, "args": {"Addr": '
                                              '2, "Bytes": 32}}]}',
    "a malformed event in a list a later traceEvents replaces": '{"traceEvents": [{"name": '
                                                                '"[memory]", "ts": 1, "args": '
                                                                '{"Adr": 1}}], "traceEvents": '
                                                                '[{"name": "[memory]", "ts": 1, '
                                                                '"args": {"Addr": 2, "Bytes": 3}}]}',
    "addresses past 2**63 and negative": json.dumps({"traceEvents": [
        mem(1, 2**64 - 4096, 64), mem(2, -4096, 32), mem(3, 2**63, 16), mem(4, 2**64 - 4096, -64),
        mem(5, -4096, -32)]}),
    "Bytes past int64": json.dumps({"traceEvents": [mem(1, 16, 2**63 + 4096), mem(2, 16, -1),
                                                    mem(3, 32, 4096)]}),
    "whole, fractional and exponent ts": json.dumps({"traceEvents": [
        mem(1e3, 16, 64), mem(999.5, 32, 64), mem(10**15 + 1, 48, 64), mem(2**53, 64, 64),
        mem(-5, 80, 64), mem(0.1, 96, 64)]}),
    "devices: missing fields, several": json.dumps({"traceEvents": [
        {"name": "[memory]", "ts": 1, "args": {"Addr": 1, "Bytes": 8}},
        mem(2, 2, 8, 1, 1), mem(3, 3, 8, 1, 1), mem(4, 4, 8, 1, -1), mem(5, 5, 8, 0, 7)]}),
    "entries that are not events": json.dumps({"traceEvents": [1, "x", None, [mem(1, 1, 8)],
                                                               {}, mem(1, 1, 8)]}),
    "a BOM and odd whitespace": "\ufeff \r\n\t" + json.dumps({"traceEvents": PLAIN}, indent="\t")
                                + " \n",
    "other top-level values": json.dumps({"a": [1, {"b": "c"}], "traceEvents": PLAIN,
                                          "z": {"y": [True, False, None, -0.5e-3]}}),
    "non-ASCII text": json.dumps({"traceEvents": [{"name": "op \u4e2d \U0001F600", "ts": 1}]
                                  + PLAIN}, ensure_ascii=False),
    "args that are not an object on an op": json.dumps({"traceEvents": [
        {"name": "op", "args": [1, 2]}] + PLAIN}),
    # the first event read by Python (an escape in a key), the second by the
    # scanner: one device, whichever reads it (Device Id + 1 overflowed a C int)
    "the largest device, read both ways": json.dumps({"traceEvents": [
        mem(1, 16, 64, 2**31 - 1, 2**31 - 1), mem(2, 16, -64, 2**31 - 1, 2**31 - 1)]}).replace(
        '"Bytes"', '"B\\u0079tes"', 1),
}


@pytest.mark.parametrize("case", sorted(FORMS))
def test_forms_beyond_the_plain_one_read_as_json_reads_them(case):
    data = FORMS[case].encode()
    for device in (None, "cuda", "npu:0"):
        try:
            expected = whole(data, device)
        except TraceError as exc:
            with pytest.raises(TraceError) as got:
                streamed(data, device)
            assert str(got.value) == str(exc)
            continue
        for chunk in (None, 1, 5):
            assert_same(streamed(data, device, chunk=chunk), expected)


BAD_FIELDS = {
    "ts a word": mem("abc", 16, 64),
    "ts a list": mem([1], 16, 64),
    "ts past 2**53": mem(2**53 + 1, 16, 64),
    "ts of 400 digits": mem(10**400, 16, 64),
    "ts 1e999": "1e999",
    "Bytes 2**64": mem(1, 16, 2**64),
    "Bytes a float": mem(1, 16, 12.5),
    "Bytes 1e3": mem(1, 16, 1e3),
    "Addr true": mem(1, True, 64),
    "Device Type 2**31": mem(1, 16, 64, dtype=2**31),
    "Device Id -2": mem(1, 16, 64, did=-2),
    "args a list": {"name": "[memory]", "ts": 1, "args": [1]},
    "no Addr": {"name": "[memory]", "ts": 1, "args": {"Bytes": 64}},
}


@pytest.mark.parametrize("case", sorted(BAD_FIELDS))
def test_a_malformed_memory_event_is_the_same_trace_error_both_ways(case):
    event = BAD_FIELDS[case]
    if isinstance(event, str):
        data = ('{"traceEvents": [{"name": "[memory]", "ts": %s, "args": {"Addr": 1, '
                '"Bytes": 8}}]}' % event).encode()
    else:
        data = json.dumps({"traceEvents": [mem(0, 8, 8), event]}).encode()
    with pytest.raises(TraceError) as expected:
        whole(data)
    with pytest.raises(TraceError) as got:
        streamed(data)
    assert str(got.value) == str(expected.value)
    assert "traceEvents[" in str(got.value)


NOT_JSON = {
    "Infinity": b'{"traceEvents":[{"name":"[memory]","ts":1,"args":{"Addr":1,"Bytes":Infinity}}]}',
    "NaN in an op": b'{"traceEvents":[{"name":"op","ts":NaN}]}',
    "a trailing comma": b'{"traceEvents":[{"name":"op"},]}',
    "a trailing comma in an object": b'{"traceEvents":[{"name":"op",}]}',
    "a leading zero": b'{"traceEvents":[{"name":"op","ts":01}]}',
    "a bare point": b'{"traceEvents":[{"name":"op","ts":1.}]}',
    "an exponent without digits": b'{"traceEvents":[{"name":"op","ts":1e}]}',
    "a plus sign": b'{"traceEvents":[{"name":"op","ts":+1}]}',
    "single quotes": b"{'traceEvents':[]}",
    "a raw newline in a string": b'{"traceEvents":[{"name":"a\nb"}]}',
    "a bad escape": b'{"traceEvents":[{"name":"a\\xb"}]}',
    "a short \\u escape": b'{"traceEvents":[{"name":"a\\u12"}]}',
    "invalid UTF-8": b'{"traceEvents":[{"name":"a\xff"}]}',
    "an overlong UTF-8 form": b'{"traceEvents":[{"name":"a\xc0\xaf"}]}',
    "a UTF-8 surrogate": b'{"traceEvents":[{"name":"a\xed\xa0\x80"}]}',
    "UTF-8 past U+10FFFF": b'{"traceEvents":[{"name":"a\xf4\x90\x80\x80"}]}',
    "an integer of 5000 digits in an op": b'{"traceEvents":[{"name":"op","x":' + b"7" * 5000
                                          + b"}]}",
    "extra data": b'{"traceEvents":[]} {}',
    "two documents": b'[][]',
    "an unclosed list": b'{"traceEvents":[{"name":"op"}',
    "an unclosed string": b'{"traceEvents":[{"name":"op',
    "a missing colon": b'{"traceEvents" []}',
    "a key that is not a string": b'{"traceEvents":[{1:2}]}',
    "tru": b'{"traceEvents":[{"a":tru}]}',
    "a second BOM": b"\xef\xbb\xbf\xef\xbb\xbf[]",
    "a control character outside strings": b'{"traceEvents":[\x01]}',
    "no traceEvents": b'{"events":[]}',
    "traceEvents not a list": b'{"traceEvents":{"a":1}}',
    "a later traceEvents not a list": b'{"traceEvents":[], "traceEvents": 5}',
    "empty": b"[]",
}


@pytest.mark.parametrize("case", sorted(NOT_JSON))
def test_text_json_refuses_is_a_trace_error(case):
    data = NOT_JSON[case]
    with pytest.raises(TraceError):
        whole(data)
    for chunk in (None, 1, 3):
        with pytest.raises(TraceError, match="t.json: "):
            streamed(data, chunk=chunk)


def test_nesting_is_refused_where_it_passes_the_limit_not_at_the_end():
    head = b'{"traceEvents": [{"name": "op", "args": '
    # the document, traceEvents and the event are three levels: the 62nd bracket is the 65th
    with pytest.raises(TraceError, match=f"nested deeper than 64 at byte {len(head) + 61}\\)"):
        streamed(head + b"[" * 100000, chunk=4096)
    ok = head + b"[" * 61 + b"]" * 61 + b"}]}"
    with pytest.raises(TraceError, match="no memory events"):
        streamed(ok)


def test_every_truncation_of_a_trace_is_a_trace_error():
    data = json.dumps({"traceEvents": PLAIN + [{"name": "op", "args": {"s": "\u00e9x"}}]},
                      ensure_ascii=False).encode()
    for cut in range(len(data)):
        with pytest.raises(TraceError):
            streamed(data[:cut], chunk=7)


def test_a_huge_value_is_not_scanned_once_per_chunk(monkeypatch):
    """A value larger than many chunks (a long string in one event) is
    read again only when the text has doubled past its start, so the scan
    stays linear; the reading is the same."""
    big = {"name": "op", "args": {"s": "x" * 3_000_000}}
    data = json.dumps({"traceEvents": [mem(1, 16, 64), big, mem(2, 16, -64)]}).encode()
    assert_same(streamed(data, chunk=4096), whole(data))


def test_the_file_loader_streams_gzip_through_the_scanner(tmp_path):
    data = as_profiler_json(tr.example("batch_inference"))
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(data))
    assert ti.streaming()
    assert list(tr.load(path).events) == list(whole(data).events)


def test_the_compiled_pairing_pairs_as_the_python_one():
    rng = np.random.default_rng(3)
    for n in (0, 1, 50, 5000):
        addr = rng.integers(0, 12, n).astype(np.uint64) * 4096
        delta = rng.integers(1, 1000, n) * np.where(rng.random(n) < 0.5, -1, 1)
        delta[rng.random(n) < 0.05] = 0
        stream = rng.integers(0, 3, n)
        where = np.arange(n) * 2
        fast, fast_skipped = ti._pair_arrays(addr, delta, stream, where)
        slow, slow_skipped = ti._pair(zip(addr.tolist(), delta.tolist(), stream.tolist(),
                                          where.tolist()))
        assert fast_skipped == slow_skipped
        a, b = fast.columns(), slow.columns()
        for col in ("alloc", "ids", "size", "line"):
            assert getattr(a, col).tolist() == getattr(b, col).tolist()
        assert (a.stream is None) == (b.stream is None)
        if a.stream is not None:
            assert a.stream.tolist() == b.stream.tolist()


def snapshot_bytes(entries):
    return pickle.dumps({"segments": [], "device_traces": [entries]})


def test_a_snapshot_reads_as_the_python_pairing_reads_it_and_leaves_the_collector_on():
    rng = np.random.default_rng(5)
    entries, live = [], []
    for i in range(3000):
        if live and rng.random() < 0.45:
            a, s = live.pop(int(rng.integers(0, len(live))))
            entries.append({"action": "free_requested", "addr": a, "size": s, "stream": 1})
            entries.append({"action": "free_completed", "addr": a, "size": s, "stream": 1})
        else:
            a, s = 0x1000 * int(rng.integers(1, 200)), int(rng.integers(1, 64)) * 512
            entries.append({"action": "alloc", "addr": a, "size": s, "stream": i % 3,
                            "frames": [{"filename": "x.py", "line": 1}]})
            live.append((a, s))
        if i % 500 == 0:
            entries.append({"action": "segment_alloc", "addr": 0, "size": 1 << 21})
    entries.append({"action": "free_completed", "addr": 0xdead000, "size": 8})  # from before
    data = snapshot_bytes(entries)
    assert gc.isenabled()
    got = ti.from_snapshot(data, "s.pickle")
    assert gc.isenabled()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ti, "_pair_arrays", lambda a, d, s, w: ti._pair(zip(a.tolist(), d.tolist(),
                                                                      s.tolist(), w.tolist())))
        slow = ti.from_snapshot(data, "s.pickle")
    a, b = got.events.columns(), slow.events.columns()
    for col in ("alloc", "ids", "size", "line", "stream"):
        assert getattr(a, col).tolist() == getattr(b, col).tolist()
    assert got.skipped_frees == slow.skipped_frees >= 1
    assert got.reserved_peak == slow.reserved_peak
    with pytest.raises(ti.InvalidArgumentError):
        ti.from_snapshot(b"\x80\x04not a pickle", "s.pickle")
    assert gc.isenabled()


def test_a_snapshot_size_past_int64_is_paired_exactly():
    entries = [{"action": "alloc", "addr": 16, "size": 2**63 + 512},
               {"action": "free_completed", "addr": 16, "size": 2**63 + 512}]
    got = ti.from_snapshot(snapshot_bytes(entries), "s.pickle")
    assert got.events.size == [2**63 + 512] * 2
