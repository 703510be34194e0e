"""The columnar trace and its compiled CSV reader: whatever the fast path
takes it reads as the csv module reader does (event for event, line for
line), and what it leaves to that reader still loads or fails the same way."""
import gzip
import io

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ascmem import trace as tr
from ascmem import trace_csv
from ascmem.trace_data import Columns, Event, Trace


def both(text):
    """The trace through load() (fast path when it can) and through the
    csv module reader alone."""
    data = text.encode() if isinstance(text, str) else text
    fast = tr.load(io.BytesIO(data))
    slow = trace_csv.parse_text(data, "t")
    return fast, slow


def same(a, b):
    assert list(a.events) == list(b.events)
    assert a.has_kinds == b.has_kinds and a.has_policies == b.has_policies
    assert a.has_streams == b.has_streams
    assert a.peak_live() == b.peak_live() and a.peak_index() == b.peak_index()


@st.composite
def trace_texts(draw):
    n = draw(st.integers(0, 40))
    kinds = draw(st.booleans())
    policies = draw(st.booleans())
    streams = draw(st.booleans())
    lines = ["op,id,size" + (",kind" if kinds else "") + (",policy" if policies else "")
             + (",stream" if streams else "")]
    live, next_id = [], draw(st.integers(0, 2**62))
    for _ in range(n):
        if live and draw(st.booleans()):
            ident = live.pop(draw(st.integers(0, len(live) - 1)))
            row = ["f", str(ident), ""]
        else:
            ident, next_id = next_id, next_id + draw(st.integers(1, 1000))
            live.append(ident)
            row = ["a", str(ident), str(draw(st.integers(1, 2**64 - 1)))]
        if kinds:
            row.append(draw(st.sampled_from(["", "huge", "NORMAL", " dvpp ", "Host"]))
                       if row[0] == "a" else "")
        if policies:
            row.append(draw(st.sampled_from(["", "0", "1", "0x100", " 7 ", "4294967295"]))
                       if row[0] == "a" else "")
        if streams:
            row.append(draw(st.sampled_from(["", "0", "3", " 12 ", "9223372036854775807"]))
                       if row[0] == "a" else "")
        pad = draw(st.sampled_from(["", " "]))
        lines.append(",".join(pad + f + pad if f else f for f in row))
        if draw(st.integers(0, 9)) == 0:
            lines.append(draw(st.sampled_from(["", " ", ",,", " , "])))  # skipped lines
    end = draw(st.sampled_from(["\n", "\r\n"]))
    return end.join(lines) + draw(st.sampled_from(["", end]))


@settings(max_examples=300, deadline=None)
@given(trace_texts())
def test_the_fast_path_reads_what_the_csv_reader_reads(text):
    fast, slow = both(text)
    same(fast, slow)


@pytest.mark.parametrize("text", [
    'op,id,size\na,1,"100"\nf,1,\n',            # quotes: the csv reader's
    "op,id,size\na,1_000,100\nf,1_000,\n",       # what int() accepts
    "op,id,size\na,-5,100\nf,-5,\n",             # negative ids
    "op,id,size,policy\na,1,100,0b1\nf,1,,\n",   # int(x, 0)'s prefixes
    "\ufeffop,id,size\na,1,100\n",               # a byte-order mark
])
def test_forms_the_fast_path_leaves_still_load(text):
    fast, slow = both(text)
    same(fast, slow)


@pytest.mark.parametrize("text,message", [
    ("op,id,size\na,1,100\na,1,5\n", ":3: id 1 was allocated before"),
    ("op,id,size\nf,1,\na,1,100\n", ":2: free of id 1"),
    ("op,id,size\na,1,100\nf,1,\nf,1,\n", ":4: free of id 1"),
    ("op,id,size\na,1,0\n", ":2: size must be positive"),
    ("op,id,size,kind\na,1,5,warm\n", ":2: unknown kind 'warm'"),
    ("op,id,size,policy\na,1,5,01\n", ":2: policy '01' is not an integer"),
    ("op,id,size,policy\na,1,5,4294967296\n", "not an aclrtMemMallocPolicy"),
    ("op,id,size\nx,1,5\n", ":2: unknown op 'x'"),
    ("op,id,size\n\n\na,1\n", ":4: expected op,id,size"),
])
def test_errors_name_the_line_whichever_path_finds_them(text, message):
    with pytest.raises(tr.TraceError, match=message):
        tr.load(io.BytesIO(text.encode()))


def test_blank_lines_keep_line_numbers_and_plain_files_need_none():
    t = tr.load(io.BytesIO(b"op,id,size\na,1,10\n\n,,\na,2,10\n"))
    assert [e.line for e in t.events] == [2, 5]
    plain = tr.load(io.BytesIO(b"op,id,size\na,1,10\na,2,10\n"))
    assert plain.columns.line is None and [e.line for e in plain.events] == [2, 3]


def test_streaming_gzip_members_and_chunk_edges(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_csv, "CHUNK", 7)  # lines cut at every place
    rows = "".join(f"a,{i},{i + 1},huge\n" for i in range(200)) + \
        "".join(f"f,{i},,\n" for i in range(200))
    text = "op,id,size,kind\n" + rows
    path = tmp_path / "t.csv.gz"
    half = len(text) // 2
    path.write_bytes(gzip.compress(text[:half].encode()) + gzip.compress(text[half:].encode()))
    t = tr.load(path)
    assert len(t) == 400 and t.peak_live() == sum(range(1, 201))
    assert t.columns.kind.tolist() == [1] * 400


def test_truncated_gzip_is_a_trace_error(tmp_path):
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(b"op,id,size\n" + b"a,1,10\n" * 1000)[:-20])
    with pytest.raises(tr.TraceError, match="truncated or corrupt"):
        tr.load(path)


def test_a_pipe_is_read_once_and_kept_for_the_csv_reader():
    class Pipe(io.RawIOBase):
        def __init__(self, data):
            self._b = io.BytesIO(data)

        def readable(self):
            return True

        def seekable(self):
            return False

        def readinto(self, b):
            chunk = self._b.read(len(b))
            b[:len(chunk)] = chunk
            return len(chunk)

    t = tr.load(io.BufferedReader(Pipe(b'op,id,size\na,1,"5"\nf,1,\n')))  # quotes: both paths
    assert [e.size for e in t.events] == [5, 5]


def test_columns_from_events_and_back():
    events = [Event("a", 1, 10, "huge", 1, 2), Event("a", 2**70, 5, "", 0, 3),
              Event("f", 1, 10, "huge", 1, 4)]
    t = Trace(events)
    assert t.columns.ids.dtype == object  # an id beyond int64 (an address) stays exact
    assert list(t.events) == events and t.events[-1] == events[-1] and t.events[1:2] == events[1:2]
    assert t.peak_live() == 15 and t.peak_index() == 1 and t.allocations == 2
    c = Columns(np.array([1], np.uint8), np.array([7]), np.array([2**63], np.uint64),
                np.zeros(1, np.uint8), np.zeros(1, np.uint32))
    assert Trace(columns=c).peak_live() == 2**63  # beyond int64: the exact slow sum
