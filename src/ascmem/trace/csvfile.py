"""ascmem's CSV trace format: reading (streaming, into columns) and writing.

A header ``op,id,size`` with optional further columns ``kind`` (huge, normal,
dvpp, host) and ``policy`` (an aclrtMemMallocPolicy number); ``op`` is ``a``
(allocate) or ``f`` (free); ``id`` pairs a free with its allocation.

Reading takes the decompressed text in chunks through the compiled fast
path (ascmem._tracecsv) and pairs frees with their allocations with numpy
sorts: ten million events in a few seconds and a few hundred MB.  Anything
the fast path does not take -- quotes, ids such as ``1_000``, a duplicate id,
a free of an id that is not live -- sends the whole text to the csv module
reader below, which accepts what Python's int() does and names the line of
any error.
"""

import csv
import ctypes
import gzip
import io
import os
import zlib

import numpy as np

from ascmem.trace.data import KINDS, Columns, Event, Trace, TraceError

CHUNK = 8 << 20   # compressed or plain bytes read at a time
BLOCK = 1 << 20   # rows the fast path fills before starting another block
# No line of a trace is longer (one has at most 32 short fields): a line
# that does not end by then is refused at once, rather than carried from
# chunk to chunk and scanned again with each.
MAX_LINE = 1 << 20


# ---- the fast path ------------------------------------------------------------------

def read_columns(chunks, name):
    """Columns from the trace's decompressed byte chunks (the header
    included), or None when something needs the csv reader's judgement."""
    from ascmem import _tracecsv
    chunks = iter(chunks)
    buf = b""
    for chunk in chunks:  # the header line
        buf += chunk
        if b"\n" in buf:
            break
        _check_line(buf, 1, name)
    head, sep, buf = buf.partition(b"\n")
    try:
        header = next(csv.reader([head.decode("utf-8-sig").rstrip("\r")]), [])
    except (UnicodeDecodeError, csv.Error):
        return None
    cols = [h.strip() for h in header]
    if cols[:3] != ["op", "id", "size"] or not sep:
        return None
    kind_col = cols.index("kind") if "kind" in cols else -1
    policy_col = cols.index("policy") if "policy" in cols else -1
    stream_col = cols.index("stream") if "stream" in cols else -1
    blocks, out = [], _empty(BLOCK, stream_col >= 0)  # rows fill blocks of BLOCK; joined column by column
    n, line = 0, 2

    def feed(data):
        nonlocal n, line, out
        if data and max(data) >= 0x80:
            try:
                data.decode("utf-8")  # a text that is not UTF-8 is the csv reader's error
            except UnicodeDecodeError:
                return None
        view = memoryview(data)
        pos = 0
        while True:
            status, n, used, line = _tracecsv.parse(view[pos:], line, 1, 2, kind_col, policy_col,
                                                    stream_col, *out, n)
            pos += used
            if status == _tracecsv.FULL:
                blocks.append(out)
                out, n = _empty(BLOCK, stream_col >= 0), 0
                continue
            if status == _tracecsv.OTHER:
                return None
            _check_line(view[pos:], line, name)
            return data[pos:]

    buf = feed(buf)  # what came with the header
    for chunk in chunks:
        if buf is None:
            return None
        buf = feed(buf + chunk)
    if buf is None:
        return None
    if buf.strip(b" \t\r,"):  # a last line with no newline
        if feed(buf + b"\n") is None:
            return None
    blocks.append([a[:n] for a in out])  # (a stream dummy is never joined)
    del out
    total = sum(len(b[0]) for b in blocks)
    skipped = line - 2 != total  # blank lines: keep each event's line number
    wanted = [0, 1, 2, 3, 4] + ([6] if stream_col >= 0 else []) + ([5] if skipped else [])
    columns = {}
    for i in wanted:  # a column at a time, each block let go once copied
        columns[i] = np.concatenate([b[i] for b in blocks])
        for b in blocks:
            b[i] = None
        _give_back()
    del blocks
    op, ids, size, kind, policy = (columns.pop(i) for i in (0, 1, 2, 3, 4))
    stream = columns.pop(6) if stream_col >= 0 else np.zeros(1, np.int64)
    lines = columns.pop(5).astype(np.int64) if skipped else None
    if not _pair(op, ids, size, kind, policy, stream):
        return None
    return Columns(op, ids, size, kind, policy, lines, stream if stream_col >= 0 and
                   bool(stream.any()) else None)


def _check_line(partial, line, name):
    """Refuses a line that has not ended within MAX_LINE bytes."""
    if len(partial) > MAX_LINE:
        raise TraceError(f"{name}:{line}: a line longer than {MAX_LINE:,} bytes (a trace's lines "
                         f"are short; is this a CSV trace?)")


def _give_back():
    """Hands the heap's free pages back to the OS (glibc's malloc_trim): the
    blocks just dropped were heap memory, which glibc keeps by default; RSS
    would stay at the sum of blocks and columns.  Elsewhere: nothing."""
    global _trim
    if _trim is None:
        try:
            _trim = ctypes.CDLL(None).malloc_trim
            _trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _trim = False
    if _trim:
        _trim(0)


_trim = None


def _empty(cap, streams):
    return [np.empty(cap, np.uint8), np.empty(cap, np.int64), np.empty(cap, np.uint64),
            np.empty(cap, np.uint8), np.empty(cap, np.uint32), np.empty(cap, np.uint32),
            np.empty(cap if streams else 1, np.int64)]


def _pair(op, ids, size, kind, policy, stream):
    """Each free finds its allocation earlier in the trace, no id is
    allocated twice (even after its free) or freed twice; frees take their
    allocation's size, kind and policy.  False if any of that fails (the
    csv reader says where)."""
    from ascmem import _tracecsv
    if _tracecsv.pair(op, ids, size, kind, policy, stream) != -1:
        return False
    alloc_ids = ids[op.view(bool)]  # an id reused after its free: one sort finds it
    alloc_ids.sort()
    reused = len(alloc_ids) > 1 and bool(np.any(alloc_ids[1:] == alloc_ids[:-1]))
    del alloc_ids
    _give_back()
    return not reused


# ---- the csv module reader (what the fast path leaves) ------------------------------------

def parse_text(data, name):
    """A Trace from the whole text (bytes or str), with the csv module."""
    text = _text(data, name)
    reader = csv.reader(text)
    try:
        return _parse(reader, name)
    except csv.Error as exc:  # e.g. a stray carriage return inside a field
        raise TraceError(f"{name}:{reader.line_num}: not valid CSV ({exc})") from None


def _text(data, name):
    if isinstance(data, str):
        return io.StringIO(data.lstrip("\ufeff"), newline="")
    try:  # utf-8-sig: a byte-order mark (spreadsheet exports write one) is not part of the header
        return io.StringIO(data.decode("utf-8-sig"), newline="")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{name}: not a text CSV file (not UTF-8: {exc.reason} at byte "
                         f"{exc.start})") from None


def _parse(reader, name):
    header = next(reader, None)
    if not header or [h.strip() for h in header[:3]] != ["op", "id", "size"]:
        raise TraceError(f"{name}:1: not a trace ascmem reads: the header must start with "
                         f"op,id,size (got {header!r}); a PyTorch profiler Chrome trace (JSON) "
                         f"and a PyTorch memory snapshot (pickle) are read too")
    cols = [h.strip() for h in header]
    kind_col = cols.index("kind") if "kind" in cols else None
    policy_col = cols.index("policy") if "policy" in cols else None
    stream_col = cols.index("stream") if "stream" in cols else None
    events, open_ids, seen = [], {}, set()
    for lineno, row in enumerate(reader, start=2):
        if not row or not "".join(row).strip():
            continue
        where = f"{name}:{lineno}"
        if len(row) < 3:
            raise TraceError(f"{where}: expected op,id,size, got {','.join(row)!r}")
        op = row[0].strip()
        try:
            ident = int(row[1])
        except ValueError:
            raise TraceError(f"{where}: id {row[1]!r} is not an integer") from None
        if op == "a":
            try:
                size = int(row[2])
            except ValueError:
                raise TraceError(f"{where}: size {row[2]!r} is not an integer") from None
            if size <= 0 or size >= 1 << 64:
                raise TraceError(f"{where}: size must be positive and below 2**64 (got {size})")
            if ident in seen:
                raise TraceError(f"{where}: id {ident} was allocated before (duplicate id)")
            kind = row[kind_col].strip().lower() if kind_col is not None and kind_col < len(row) else ""
            if kind and kind not in KINDS:
                raise TraceError(f"{where}: unknown kind {kind!r} (known: {', '.join(KINDS)})")
            policy = 0
            if policy_col is not None and policy_col < len(row) and row[policy_col].strip():
                try:
                    policy = int(row[policy_col], 0)
                except ValueError:
                    raise TraceError(f"{where}: policy {row[policy_col]!r} is not an integer") from None
                if not 0 <= policy < 1 << 32:
                    raise TraceError(f"{where}: policy {policy} is not an aclrtMemMallocPolicy "
                                     f"value (0 to 2**32 - 1)")
            stream = 0
            if stream_col is not None and stream_col < len(row) and row[stream_col].strip():
                try:
                    stream = int(row[stream_col])
                except ValueError:
                    raise TraceError(f"{where}: stream {row[stream_col]!r} is not an integer") from None
                if not 0 <= stream < 1 << 63:
                    raise TraceError(f"{where}: stream {stream} is out of range (0 to 2**63 - 1)")
            seen.add(ident)
            ev = Event("a", ident, size, kind, policy, lineno, stream)
            open_ids[ident] = ev
            events.append(ev)
        elif op == "f":
            alloc = open_ids.pop(ident, None)
            if alloc is None:
                raise TraceError(f"{where}: free of id {ident}, which is not live "
                                 f"(never allocated, or freed twice)")
            events.append(Event("f", ident, alloc.size, alloc.kind, alloc.policy, lineno,
                                alloc.stream))
        else:
            raise TraceError(f"{where}: unknown op {op!r} (expected 'a' or 'f')")
    return Trace(events, name=name)


# ---- streams of bytes ----------------------------------------------------------------------

def chunks_of(stream, first=b""):
    """The decompressed bytes of a binary stream, CHUNK at a time (gzip told
    by its magic; members after the first followed, as gzip does).  first:
    bytes already read from the stream's start."""
    data = first + stream.read(max(CHUNK - len(first), 2))
    if data[:2] != b"\x1f\x8b":
        while data:
            yield data
            data = stream.read(CHUNK)
        return
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    while True:
        if not data:
            if not inflate.eof:
                raise EOFError("the gzip stream ends before its end marker")
            return
        out = inflate.decompress(data, CHUNK)
        while out and not inflate.eof:  # output beyond CHUNK waits in zlib
            yield out
            out = inflate.decompress(inflate.unconsumed_tail, CHUNK)
        if out:
            yield out
        # never call an ended member's decompress again: each such call appends
        # the input it is given to unused_data, which then doubles per member
        if inflate.eof:  # another gzip member may follow, in what is left or still unread
            rest = inflate.unused_data or stream.read(CHUNK)
            while rest and not rest.strip(b"\x00"):  # zero padding after the last member
                rest = stream.read(CHUNK)
            if not rest:
                return
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            data = rest
            continue
        data = inflate.unconsumed_tail or stream.read(CHUNK)


# ---- writing --------------------------------------------------------------------------------

def save(trace, path):
    """Writes a trace; gzip when the name ends in .gz."""
    opener = gzip.open if os.fspath(path).endswith(".gz") else open
    with opener(path, "wt", newline="") as f:
        w = csv.writer(f)
        streams = trace.columns.stream
        extra = (["kind"] if trace.has_kinds else []) + (["policy"] if trace.has_policies else []) \
            + (["stream"] if streams is not None else [])
        w.writerow(["op", "id", "size"] + extra)
        stream_of = streams.tolist() if streams is not None else None
        for i, (alloc, ident, size, kind, policy) in enumerate(trace.rows()):
            row = ["a" if alloc else "f", ident, size if alloc else ""]
            if trace.has_kinds:
                row.append(kind if alloc else "")
            if trace.has_policies:
                row.append(policy if alloc else "")
            if stream_of is not None:
                row.append(stream_of[i] if alloc else "")
            w.writerow(row)

