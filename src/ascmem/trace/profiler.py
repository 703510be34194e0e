"""Traces from PyTorch: profiler Chrome traces and memory snapshots, turned
into ascmem's events (docs/TRACES.md).

- A Chrome trace (``torch.profiler.profile(profile_memory=True)`` then
  ``export_chrome_trace``): the ``[memory]`` instant events, in the
  profiler's order, allocations (positive ``Bytes``) paired with frees
  (negative) by ``Addr``; one device, by default the one with the most
  events.  Frees of blocks allocated before recording are skipped, and
  counted.
- A memory snapshot (``torch.cuda.memory._dump_snapshot``, and torch_npu's,
  which writes the same format): the ``device_traces`` of one device,
  ``alloc`` paired with ``free_completed`` (``free_requested`` when the
  trace has no completions) by address; ``segment_alloc`` /
  ``segment_free`` give what the caching allocator reserved.

Snapshots are pickles: they are read by an unpickler that builds only plain
containers and numbers, so a snapshot from elsewhere cannot run code.
"""

import gc
import io
import json
import math
import pickle
import reprlib

from ascmem.errors import InvalidArgumentError

# c10::DeviceType values the profiler writes as "Device Type"
DEVICE_TYPES = {0: "cpu", 1: "cuda", 20: "npu"}  # 20: PrivateUse1, torch_npu's


class ImportedTrace:
    """What an importer found: the events (op, size, address-free ids) and
    what it had to leave out."""

    def __init__(self, events, device, skipped_frees=0, reserved_peak=None):
        self.events = events              # _Paired: the event columns, where indexes the source
        self.device = device              # "cpu", "cuda:0", ...
        self.skipped_frees = skipped_frees
        self.reserved_peak = reserved_peak


def _malformed(where, what):
    from ascmem.trace.data import TraceError
    return TraceError(f"{where}: {what}")


def _shown(value):
    """A value of a malformed field, short and safe to print: reprlib stops
    at a few levels of nesting (a plain repr of a deeply nested list from a
    pickle overflows the stack) and a number of thousands of digits is shown
    by its size (str() refuses past 4,300 digits)."""
    if type(value) is int and value.bit_length() > 128:
        return f"{'-' if value < 0 else ''}(a number of {value.bit_length()} bits)"
    return _REPR.repr(value)


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60


def _whole(value, field, where, lo, hi):
    """value, if it is an int (not a bool, not a string, not a float) in
    [lo, hi); else a TraceError naming the field and where it is."""
    if type(value) is not int:
        raise _malformed(where, f"{field} {_shown(value)} is not a whole number "
                                f"({type(value).__name__})")
    if not lo <= value < hi:
        raise _malformed(where, f"{field} {_shown(value)} is out of range ({lo} to {hi - 1})")
    return value


U64 = 1 << 64


def detect(data):
    """The format of a trace's bytes: "snapshot", "chrome" or "csv"."""
    if data[:1] == b"\x80":
        return "snapshot"
    head = data[:256].lstrip(b"\xef\xbb\xbf \t\r\n")
    if head[:1] in (b"{", b"["):
        return "chrome"
    return "csv"


def _device_name(dtype, did):
    name = DEVICE_TYPES.get(dtype, f"device-type-{dtype}")
    return name if name == "cpu" else f"{name}:{max(did, 0)}"


def _pick_device(counts, device, name, what):
    if not counts:
        raise InvalidArgumentError(f"{name}: {what} holds no memory events (was the profiler "
                                   f"run with profile_memory=True?)")
    if device is None:
        return max(counts, key=lambda d: (counts[d], d))
    want = str(device).lower()
    if want in counts:
        return want
    matches = [d for d in counts if d.split(":")[0] == want]
    if len(matches) == 1:
        return matches[0]
    raise InvalidArgumentError(f"{name}: no memory events of device {device!r}; the trace has "
                               f"{', '.join(f'{d} ({n} events)' for d, n in sorted(counts.items()))}")


class _Paired:
    """Events as lists, one per column: alloc (1/0), id, size, stream, and
    where (the index of the source entry each came from)."""

    def __init__(self):
        self.alloc, self.ids, self.size, self.stream, self.where = [], [], [], [], []

    def add(self, is_alloc, ident, size, stream, where):
        self.alloc.append(is_alloc)
        self.ids.append(ident)
        self.size.append(size)
        self.stream.append(stream)
        self.where.append(where)

    def __len__(self):
        return len(self.alloc)

    def columns(self):
        """ascmem.trace.data.Columns of the events."""
        import numpy as np
        from ascmem.trace.data import Columns
        n = len(self.alloc)
        stream = np.array(self.stream, np.int64)
        return Columns(np.array(self.alloc, np.uint8), np.array(self.ids, np.int64),
                       np.array(self.size, np.uint64), np.zeros(n, np.uint8),
                       np.zeros(n, np.uint32), np.array(self.where, np.int64),
                       stream if stream.any() else None)


def _pair(steps):
    """Pairs (addr, delta, stream, where) steps by address into ascmem events
    (a _Paired); a free carries its allocation's stream."""
    live, out, next_id, skipped = {}, _Paired(), 0, 0
    add = out.add
    for addr, delta, stream, where in steps:
        if delta > 0:
            if addr in live:  # the profiler missed a free: the old block ends here
                old_id, old_size, old_stream = live.pop(addr)
                add(0, old_id, old_size, old_stream, where)
            live[addr] = (next_id, delta, stream)
            add(1, next_id, delta, stream, where)
            next_id += 1
        elif delta < 0:
            block = live.pop(addr, None)
            if block is None:
                skipped += 1  # allocated before recording started
                continue
            add(0, block[0], block[1], block[2], where)
    return out, skipped


def _reject_constant(word):
    raise ValueError(f"{word} is not a JSON number")


def parse_json(data, name):
    """The document in a Chrome trace's bytes; anything JSON does not allow
    (Infinity, NaN, integers of thousands of digits, nesting deeper than the
    parser goes) is a TraceError."""
    from ascmem.trace.data import TraceError
    try:
        return json.loads(data.decode("utf-8-sig"), parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise TraceError(f"{name}: not a Chrome trace (not UTF-8: {exc.reason} at byte "
                         f"{exc.start})") from None
    except ValueError as exc:  # JSONDecodeError, a constant, too many digits
        raise TraceError(f"{name}: not a Chrome trace (invalid JSON: {exc})") from None
    except RecursionError:
        raise TraceError(f"{name}: not a Chrome trace (nested deeper than the JSON "
                         f"reader goes)") from None


_DEVICE_NAMES = {}  # (type, id) -> name, made once each

# Events are put in order by ts as doubles: a whole ts farther from 0 than
# this would be rounded, and one past 1e308 cannot be one (2**53 microseconds
# are 285 years).
TS_EXACT = 1 << 53


def _chrome_event(e, name, i):
    """(ts, device, addr, bytes) of a [memory] event, each field checked:
    the common case in one test, anything else by _chrome_event_checked,
    which says what is wrong."""
    args = e.get("args")
    if type(args) is dict:
        ts, addr, nbytes = e.get("ts", 0), args.get("Addr"), args.get("Bytes")
        dtype, did = args.get("Device Type", 0), args.get("Device Id", -1)
        if type(addr) is int and type(nbytes) is int and type(dtype) is int and \
                type(did) is int and (type(ts) is float or
                                      type(ts) is int and -TS_EXACT <= ts <= TS_EXACT) and \
                ts - ts == 0 and -(1 << 63) <= addr < U64 and -U64 < nbytes < U64 and \
                0 <= dtype < 1 << 31 and -1 <= did < 1 << 31:  # ts - ts: NaN for inf and NaN
            dev = _DEVICE_NAMES.get((dtype, did))
            if dev is None:
                dev = _DEVICE_NAMES[(dtype, did)] = _device_name(dtype, did)
            return ts, dev, addr, nbytes
    return _chrome_event_checked(e, name, i)


def _chrome_event_checked(e, name, i):
    where = f"{name}: traceEvents[{i}]"
    args = e.get("args")
    if not isinstance(args, dict) or "Addr" not in args or "Bytes" not in args:
        raise _malformed(where, "a [memory] event without Addr and Bytes")
    ts = e.get("ts", 0)
    if type(ts) is int and not -TS_EXACT <= ts <= TS_EXACT:
        raise _malformed(where, f"ts {_shown(ts)} is out of range (a whole ts is at most "
                                f"2**53 from 0, the most a double holds exactly)")
    if type(ts) not in (int, float) or not math.isfinite(ts):
        raise _malformed(where, f"ts {_shown(ts)} is not a finite number")
    addr = _whole(args["Addr"], "Addr", where, -(1 << 63), U64)
    nbytes = _whole(args["Bytes"], "Bytes", where, 1 - U64, U64)
    dtype = _whole(args.get("Device Type", 0), "Device Type", where, 0, 1 << 31)
    did = _whole(args.get("Device Id", -1), "Device Id", where, -1, 1 << 31)
    return ts, _device_name(dtype, did), addr, nbytes


def from_chrome(data, name, device=None):
    return from_chrome_doc(parse_json(data, name), name, device)


# A Chrome trace nests four deep (the document, traceEvents, an event, its
# args); the streaming parser is refused anything past this before it sees it.
MAX_DEPTH = 64


def streaming():
    """Whether Chrome traces stream (the compiled scanner is built)."""
    try:
        from ascmem import _tracejson  # noqa: F401
    except ImportError:
        return False
    return True


# The parser: ascmem's own scanner (_tracejson.ChromeScanner), chosen by
# measurement over ijson's yajl stream, json, orjson and pysimdjson (the
# table is in ARCHITECTURE.md): it alone streams in bounded memory without a
# Python object per event -- each library builds either the whole document
# or a dict for every event, and most of a profiler trace is operator events.
def from_chrome_chunks(chunks, name, device=None):
    """An ImportedTrace from a Chrome trace's decompressed chunks, parsed as
    they come: memory follows the number of memory events, not the size of
    the JSON.  Each [memory] event is checked as from_chrome_doc checks it
    (an event outside the scanner's plain form goes through the same
    _chrome_event)."""
    from ascmem._tracejson import ChromeScanner, ScanError
    from ascmem.trace.data import TraceError

    def slow_event(scanner, text, index):
        e = json.loads(text.decode("utf-8"), parse_constant=_reject_constant)
        if type(e) is dict and e.get("name") == "[memory]":
            try:
                ts, _, addr, nbytes = _chrome_event(e, name, index)
            except TraceError as exc:
                # raised once the text is read: a later traceEvents list replaces this one
                # (as in json), and JSON that is not JSON anywhere is the error to tell first
                if scanner.pending is None:
                    scanner.pending = exc
                return
            args = e["args"]
            scanner.add(ts, index, addr, nbytes, args.get("Device Type", 0),
                        args.get("Device Id", -1))

    scanner = ChromeScanner(MAX_DEPTH, slow_event)
    try:
        for chunk in chunks:
            scanner.feed(chunk)
        scanner.finish()
    except ScanError as exc:
        if exc.nesting:
            raise TraceError(f"{name}: not a Chrome trace (nested deeper than {MAX_DEPTH} "
                             f"at byte {exc.offset:,})") from None
        where = f"traceEvents[{exc.index}], " if exc.index >= 0 else ""
        raise TraceError(f"{name}: not a Chrome trace (invalid JSON at {where}byte "
                         f"{exc.offset:,}: {exc})") from None
    if scanner.pending is not None:
        raise scanner.pending
    if scanner.is_object and not scanner.has_list:
        raise InvalidArgumentError(f"{name}: not a Chrome trace (no traceEvents list)")
    return _chrome_imported(scanner, name, device)


# A Chrome trace nests four deep (the document, traceEvents, an event, its
# args); the scanner refuses anything past this where it starts.
MAX_DEPTH = 64


def _chrome_imported(scanner, name, device):
    """The ImportedTrace of a scanner's [memory] columns: the chosen
    device's events in the profiler's order, paired by address."""
    import numpy as np
    ts, index, addr, nbytes, dev = scanner.columns()
    keys = np.unique(dev)
    names = [_device_name(int(k) >> 32, (int(k) & 0xFFFFFFFF) - 1) for k in keys]
    counts = {}
    for k, d in zip(keys, names):
        counts[d] = counts.get(d, 0) + int(np.count_nonzero(dev == k))
    chosen = _pick_device(counts, device, name, "the Chrome trace")
    keep = np.flatnonzero(np.isin(dev, keys[[d == chosen for d in names]]))
    order = keep[np.lexsort((index[keep], ts[keep]))]  # the profiler's order; ties keep file order
    if scanner.big:  # a size past 64 bits: the exact rules in Python
        where = index[order].tolist()
        steps = zip(addr[order].tolist(), [scanner.big.get(w, b) for w, b in
                                           zip(where, nbytes[order].tolist())],
                    [0] * len(where), where)
        events, skipped = _pair(steps)
        return ImportedTrace(events, chosen, skipped)
    events, skipped = _pair_arrays(addr[order], nbytes[order], np.zeros(len(order), np.int64),
                                   index[order])
    return ImportedTrace(events, chosen, skipped)


class _PairedColumns:
    """Paired events already in arrays (what _Paired gives in lists)."""

    def __init__(self, alloc, ids, size, stream, where):
        self.alloc, self.ids, self.size, self.stream, self.where = alloc, ids, size, stream, where

    def __len__(self):
        return len(self.alloc)

    def columns(self):
        import numpy as np
        from ascmem.trace.data import Columns
        n = len(self.alloc)
        return Columns(self.alloc, self.ids, self.size, np.zeros(n, np.uint8),
                       np.zeros(n, np.uint32), self.where,
                       self.stream if self.stream.any() else None)


def _pair_arrays(addr, delta, stream, where):
    """_pair over arrays, compiled: (a _PairedColumns, skipped)."""
    from ascmem._tracepair import pair_by_address
    alloc, ids, size, stream, where, skipped = pair_by_address(addr, delta, stream, where)
    return _PairedColumns(alloc, ids, size, stream, where), skipped


def from_chrome_doc(obj, name, device=None):
    """An ImportedTrace from a parsed Chrome trace."""
    events = obj.get("traceEvents") if isinstance(obj, dict) else obj
    if not isinstance(events, list):
        raise InvalidArgumentError(f"{name}: not a Chrome trace (no traceEvents list)")
    mem, counts = [], {}
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("name") != "[memory]":
            continue
        ts, dev, addr, nbytes = _chrome_event(e, name, i)
        mem.append((ts, i, dev, addr, nbytes))
        counts[dev] = counts.get(dev, 0) + 1
    chosen = _pick_device(counts, device, name, "the Chrome trace")
    mem.sort(key=lambda m: (m[0], m[1]))  # the profiler's order; ties keep file order
    # an address by its 64 bits: the profiler's signed form and the unsigned one are one block
    events, skipped = _pair((m[3] & (U64 - 1), m[4], 0, m[1]) for m in mem if m[2] == chosen)
    return ImportedTrace(events, chosen, skipped)


def _stream_of(entry, where):
    """A snapshot entry's stream (an int: the handle's value), 0 if none."""
    stream = entry.get("stream")
    if stream is None:
        return 0
    return _whole(stream, "stream", where, -(1 << 63), U64) & 0x7FFFFFFFFFFFFFFF


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers only."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing {module}.{name}: a memory snapshot holds plain "
                                     f"data only")


_ADDRESSED = ("alloc", "free_requested", "free_completed")
_SEGMENT_UP = ("segment_alloc", "segment_map")
_SEGMENT_DOWN = ("segment_free", "segment_unmap")


def _unpickled(data, name):
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # a pickle can fail in many ways; all mean the same here
        raise InvalidArgumentError(f"{name}: not a PyTorch memory snapshot ({exc})") from None


class _CollectorHeld:
    """The cyclic garbage collector held off: a snapshot is millions of
    small dicts, each of which counts towards collections that traverse
    them all and find nothing (an unpickler's plain data and the loop over
    it make no garbage cycles); refcounting still frees them."""

    def __enter__(self):
        self.enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc):
        if self.enabled:
            gc.enable()


def from_snapshot(data, name, device=None):
    with _CollectorHeld():
        return _from_snapshot(data, name, device)


def _from_snapshot(data, name, device):
    obj = _unpickled(data, name)
    traces = obj.get("device_traces") if isinstance(obj, dict) else None
    if not isinstance(traces, list):
        raise InvalidArgumentError(f"{name}: not a PyTorch memory snapshot (no device_traces "
                                   f"list)")
    counts = {f"device:{i}": sum(1 for e in t if isinstance(e, dict) and e.get("action") == "alloc")
              for i, t in enumerate(traces) if isinstance(t, list)}
    counts = {d: n for d, n in counts.items() if n}
    chosen = _pick_device(counts, None if device is None else
                          (device if ":" in str(device) else f"device:{device}"), name,
                          "the snapshot")
    index = int(chosen.split(":")[1])
    trace = traces[index]
    completes = any(e.get("action") == "free_completed" for e in trace if isinstance(e, dict))
    free_action = "free_completed" if completes else "free_requested"
    addrs, deltas, streams, wheres = [], [], [], []
    small = True  # every size fits int64: the compiled pairing
    reserved, reserved_peak = 0, 0
    for i, e in enumerate(trace):
        if not isinstance(e, dict):
            continue
        action = e.get("action")
        if action == "alloc" or action == free_action:
            # the common case in one test; anything else is worded below
            size, addr = e.get("size", 0), e.get("addr")
            stream = e.get("stream") if action == "alloc" else None
            if type(size) is int and type(addr) is int and 0 <= size < U64 and \
                    0 <= addr < U64 and (stream is None or type(stream) is int and
                                         -(1 << 63) <= stream < U64):
                addrs.append(addr)
                deltas.append(size if action == "alloc" else -size or -1)
                streams.append(0 if stream is None else stream & 0x7FFFFFFFFFFFFFFF)
                wheres.append(i)
                small = small and size < 1 << 63
                continue
        if action not in _ADDRESSED and action not in _SEGMENT_UP and action not in _SEGMENT_DOWN:
            continue
        where = f"{name}: device_traces[{index}][{i}] ({action})"
        size = _whole(e.get("size", 0), "size", where, 0, U64)
        if action == "alloc":
            addr = _whole(e.get("addr"), "addr", where, 0, U64)
            addrs.append(addr)
            deltas.append(size)
            streams.append(_stream_of(e, where))
            wheres.append(i)
            small = small and size < 1 << 63
        elif action == free_action:
            addr = _whole(e.get("addr"), "addr", where, 0, U64)
            addrs.append(addr)
            deltas.append(-size or -1)
            streams.append(0)
            wheres.append(i)
            small = small and size < 1 << 63
        elif action in _SEGMENT_UP:
            reserved += size
            reserved_peak = max(reserved_peak, reserved)
        elif action in _SEGMENT_DOWN:
            reserved -= size
    if small:
        import numpy as np
        events, skipped = _pair_arrays(np.array(addrs, np.uint64), np.array(deltas, np.int64),
                                       np.array(streams, np.int64), np.array(wheres, np.int64))
    else:  # a size past int64: the exact rules in Python
        events, skipped = _pair(zip(addrs, deltas, streams, wheres))
    return ImportedTrace(events, chosen, skipped, reserved_peak or None)
