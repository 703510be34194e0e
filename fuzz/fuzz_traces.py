"""atheris harness over the trace loaders (ascmem.trace.load): PyTorch
profiler Chrome traces, memory-snapshot pickles and ascmem's CSV.
    python fuzz/fuzz_traces.py -max_total_time=600
The first byte picks the input's form:
- 0: the rest is a trace file as it is (reproducers in regressions/trace-*
  are written this way, so that they can be read);
- 1, 2, 3: the rest drives a generator of a Chrome trace, a snapshot or a
  CSV trace whose fields (sizes, addresses, times, streams, devices, actions)
  take hostile values -- negative, 2**64, 2**70, 10**5000, floats,
  Infinity, NaN, strings, None, lists, deep nesting -- and which is then
  truncated, prefixed with a BOM or gzipped (twice at times).
The oracle: load returns a Trace whose events can be read, or raises
TraceError; a profiler trace reads as json reads the whole text (the same
events or a TraceError from both).  Any other exception is a finding, as is a snapshot that loads
although an alloc, free or segment entry of the device it read has a
negative size or one of 2**64 or more (issue 45: such an alloc was read as
a free, such a free as an allocation).

FUZZ_COLLECT=DIR: a finding is written to DIR (one file per exception type
and place, in the raw form above) instead of stopping the run, so that one
run lists every distinct finding."""
import atexit
import collections
import gzip
import io
import json
import os
import pickle
import sys
import tempfile
import traceback

import atheris

with atheris.instrument_imports():
    from ascmem import trace as tr
    from ascmem.trace.data import TraceError

COLLECT = os.environ.get("FUZZ_COLLECT")
RAW, CHROME, SNAPSHOT, CSV = range(4)
DEEP = "\x00deep\x00"  # a sentinel replaced by a deeply nested value after serialising
HUGE = "\x00huge\x00"  # in JSON: replaced by an integer of more digits than int() reads
UINT64_END = 1 << 64


class Hostile:
    """A value a field of a trace should not hold, and whether it is a size
    an allocator can be asked for (an int in 1..2**64-1)."""

    VALUES = (-1, 0, 1, 4096, 512, 1 << 63, UINT64_END - 1, UINT64_END, 1 << 70, -(1 << 70),
              1.5, 1e308, float("inf"), float("-inf"), float("nan"), "abc", "12", "", None, [],
              {}, [1], True, False, DEEP, HUGE, "1e3", 10 ** 30, 10 ** 5000)


def hostile(fdp):
    if fdp.ConsumeIntInRange(0, 3) == 0:
        return fdp.ConsumeIntInRange(-(1 << 66), 1 << 66)
    return Hostile.VALUES[fdp.ConsumeIntInRange(0, len(Hostile.VALUES) - 1)]


def a_size(fdp):
    """Mostly a plausible size, sometimes a hostile one."""
    if fdp.ConsumeIntInRange(0, 2):
        return fdp.ConsumeIntInRange(1, 1 << 24)
    return hostile(fdp)


def sane_size(value):
    return type(value) is int and 0 < value < UINT64_END


def field(fdp, plausible):
    return plausible if fdp.ConsumeIntInRange(0, 4) else hostile(fdp)


# ---- generators ----------------------------------------------------------------------

def chrome(fdp):
    """A profiler trace: [memory] instant events, some others."""
    events = []
    addrs = [fdp.ConsumeIntInRange(1, 1 << 48) for _ in range(3)]
    for _ in range(fdp.ConsumeIntInRange(0, 12)):
        shape = fdp.ConsumeIntInRange(0, 9)
        if shape == 0:
            events.append(hostile(fdp))
            continue
        if shape == 1:
            events.append({"ph": "X", "name": "aten::empty", "ts": 1, "dur": 2})
            continue
        nbytes = fdp.ConsumeIntInRange(1, 1 << 24) * (-1 if fdp.ConsumeBool() else 1) \
            if fdp.ConsumeIntInRange(0, 3) else hostile(fdp)
        args = {"Addr": field(fdp, addrs[fdp.ConsumeIntInRange(0, 2)]), "Bytes": nbytes,
                "Device Type": field(fdp, (0, 1, 20)[fdp.ConsumeIntInRange(0, 2)]),
                "Device Id": field(fdp, fdp.ConsumeIntInRange(-1, 3)),
                "Total Allocated": 0, "Total Reserved": 0}
        if fdp.ConsumeIntInRange(0, 9) == 0:
            del args[("Addr", "Bytes", "Device Type", "Device Id")[fdp.ConsumeIntInRange(0, 3)]]
        e = {"ph": "i", "name": "[memory]", "ts": field(fdp, fdp.ConsumeIntInRange(0, 1000)),
             "pid": 1, "tid": 1, "args": args if fdp.ConsumeIntInRange(0, 9) else hostile(fdp)}
        if fdp.ConsumeIntInRange(0, 9) == 0:
            del e["ts"]
        events.append(e)
    shape = 0 if fdp.ConsumeIntInRange(0, 7) < 5 else fdp.ConsumeIntInRange(1, 3)
    top = ({"traceEvents": events}, events, {"traceEvents": hostile(fdp)}, hostile(fdp))[shape]
    text = json.dumps(_no_long_ints(top), allow_nan=True)
    return _deepen_json(text, fdp)


def _no_long_ints(value):
    """value with integers json.dumps cannot write (more than 4300 digits)
    as the HUGE sentinel: written back as digits after dumping."""
    if isinstance(value, dict):
        return {k: _no_long_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_long_ints(v) for v in value]
    return HUGE if type(value) is int and value.bit_length() > 4000 else value


def _deepen_json(text, fdp):
    depth = _depth(fdp)
    open_, close = ("[", "]") if fdp.ConsumeBool() else ('{"a":', "}")
    text = text.replace(json.dumps(HUGE), "9" * fdp.ConsumeIntInRange(4000, 6000))
    return text.replace(json.dumps(DEEP), open_ * depth + "1" + close * depth).encode()


def _depth(fdp):
    return (1, 50, 999, 5000, 100_000)[fdp.ConsumeIntInRange(0, 4)]


SNAPSHOT_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                    "segment_map", "segment_unmap", "snapshot", "oom")


def snapshot(fdp):
    """A memory snapshot's pickle."""
    traces = []
    for _ in range(fdp.ConsumeIntInRange(0, 3)):
        trace, addrs = [], [fdp.ConsumeIntInRange(1, 1 << 48) for _ in range(3)]
        for _ in range(fdp.ConsumeIntInRange(0, 10)):
            if fdp.ConsumeIntInRange(0, 11) == 0:
                trace.append(hostile(fdp))
                continue
            action = SNAPSHOT_ACTIONS[fdp.ConsumeIntInRange(0, len(SNAPSHOT_ACTIONS) - 1)] \
                if fdp.ConsumeIntInRange(0, 9) else hostile(fdp)
            size = a_size(fdp)
            e = {"action": action, "addr": field(fdp, addrs[fdp.ConsumeIntInRange(0, 2)]),
                 "size": size, "stream": field(fdp, fdp.ConsumeIntInRange(0, 3)),
                 "time_us": fdp.ConsumeIntInRange(0, 100), "frames": []}
            if fdp.ConsumeIntInRange(0, 9) == 0:
                del e[("addr", "size", "stream", "action")[fdp.ConsumeIntInRange(0, 3)]]
            trace.append(e)
        traces.append(trace if fdp.ConsumeIntInRange(0, 9) else hostile(fdp))
    top = {"segments": [], "device_traces": traces}
    shape = fdp.ConsumeIntInRange(0, 9)
    if shape == 0:
        top = hostile(fdp)
    elif shape == 1:
        top["device_traces"] = hostile(fdp)
    elif shape == 2:  # a class in the pickle: refused, never imported
        top = collections.OrderedDict(top)
    data = pickle.dumps(top, protocol=fdp.ConsumeIntInRange(2, 5))
    return _deepen_pickle(data, fdp)


def _deepen_pickle(data, fdp):
    """The sentinel's string replaced by lists nested depth deep
    (EMPTY_LIST depth times, then APPEND depth - 1 times)."""
    encoded = DEEP.encode()
    for op in (b"\x8c" + bytes([len(encoded)]), b"X" + len(encoded).to_bytes(4, "little")):
        at = data.find(op + encoded)
        if at >= 0:
            depth = _depth(fdp)
            return data[:at] + b"]" * depth + b"a" * (depth - 1) + data[at + len(op + encoded):]
    return data


def csv(fdp):
    """An ascmem CSV trace with hostile fields (its reader's own size rules
    are its tests'; here: that it raises nothing but TraceError)."""
    header = ("op,id,size", "op,id,size,kind,policy", "op,id,size,kind", "id,op,size", "",
              "op,id,size,stream")[fdp.ConsumeIntInRange(0, 5) if fdp.ConsumeIntInRange(0, 3) else 0]
    lines, ids = [header], []
    for _ in range(fdp.ConsumeIntInRange(0, 12)):
        if ids and fdp.ConsumeBool():
            op, ident = "f", ids.pop(fdp.ConsumeIntInRange(0, len(ids) - 1))
        else:
            op, ident = "a", fdp.ConsumeIntInRange(0, 20)
            ids.append(ident)
        op = field(fdp, op)
        ident = field(fdp, ident)
        size = a_size(fdp)
        row = [op, ident, size, ("", "huge", "normal", "dvpp", "host", "x")[
            fdp.ConsumeIntInRange(0, 5)], field(fdp, fdp.ConsumeIntInRange(0, 3))]
        row = row[:fdp.ConsumeIntInRange(1, 6)]
        lines.append(",".join(_cell(v) for v in row))
    end = ("\n", "\r\n", "\r")[fdp.ConsumeIntInRange(0, 2)]
    text = end.join(lines) + end
    if fdp.ConsumeIntInRange(0, 9) == 0:  # one long line
        text += "a,1," + "9" * (1 << fdp.ConsumeIntInRange(4, 16)) + end
    return text.encode()


def _cell(value):
    if value is None:
        return ""
    return "9" * 5000 if type(value) is int and value.bit_length() > 4000 else str(value)


def wrap(data, fdp):
    """Truncated, BOM-prefixed or gzipped (once or twice; a gzip truncated at times)."""
    if fdp.ConsumeIntInRange(0, 5) == 0 and data:
        data = data[:fdp.ConsumeIntInRange(0, len(data) - 1)]
    if fdp.ConsumeIntInRange(0, 9) == 0:
        data = b"\xef\xbb\xbf" + data
    for _ in range(fdp.ConsumeIntInRange(0, 5) // 3):
        data = gzip.compress(data, compresslevel=1)
        if fdp.ConsumeIntInRange(0, 7) == 0:
            data = data[:fdp.ConsumeIntInRange(0, len(data) - 1)]
    return data


def a_device(fdp):
    return (None, None, None, "cpu", "cuda", "npu:1", 0, 1, "device:0", -1, [], 1.5, "",
            ":")[fdp.ConsumeIntInRange(0, 13)]


class Unseekable(io.RawIOBase):
    """A pipe's reading end: read, but no seek."""

    def __init__(self, data):
        self.inner = io.BytesIO(data)

    def readable(self):
        return True

    def readinto(self, buf):
        return self.inner.readinto(buf)


PATH = os.path.join(tempfile.gettempdir(), f"fuzz_traces.{os.getpid()}.trace")
atexit.register(lambda: os.path.exists(PATH) and os.remove(PATH))


def source(blob, how):
    """blob as load is given it: a binary file, a pipe, a text-mode file or a path."""
    if how == 1:
        return io.BufferedReader(Unseekable(blob))
    if how == 2:
        return io.TextIOWrapper(io.BytesIO(blob), encoding="utf-8", newline="")
    if how == 3:
        with open(PATH, "wb") as f:
            f.write(blob)
        return PATH
    return io.BytesIO(blob)


def one_input(data):
    if not data:
        return
    form, rest = data[0] % 4, data[1:]
    device, how = None, 0
    if form == RAW:
        blob = rest
    else:
        fdp = atheris.FuzzedDataProvider(rest)
        blob = (chrome, snapshot, csv)[form - 1](fdp)
        blob = wrap(blob, fdp)
        device = a_device(fdp)
        how = max(0, fdp.ConsumeIntInRange(0, 5) - 2)  # half the time a BytesIO
    try:
        load_and_read(blob, device, how)
    except Exception as exc:
        if not COLLECT:
            raise
        collect(exc, blob, device)


def load_and_read(blob, device, how=0):
    try:
        t = tr.load(source(blob, how), device=device)
    except TraceError as exc:
        if how != 2:
            same_as_the_whole_read(blob, device, None, exc)
        return
    if how != 2:
        same_as_the_whole_read(blob, device, t, None)
    n = len(t)
    rows = sum(1 for _ in t.rows())
    if rows != n:
        raise AssertionError(f"a trace of {n} events yields {rows} rows")
    t.peak_live()
    for e in t.events:
        if not sane_size(e.size):
            raise AssertionError(f"loaded an event of size {e.size!r}: {e}")
    if t.source.get("format") == "snapshot":
        bad = unsized_entries(blob, t.source["device"])
        if bad:
            size = bad[0]["size"]
            shown = size if size.bit_length() < 200 else f"an int of {size.bit_length()} bits"
            raise AssertionError(f"loaded a snapshot as {n} events although its "
                                 f"{bad[0]['action']!r} entry has size {shown}, outside "
                                 f"0..2**64-1 (device {t.source['device']}, skipped frees "
                                 f"{t.source['skipped_frees']})")


def same_as_the_whole_read(blob, device, t, error):
    """A profiler trace: the compiled scanner's reading (t, or its error)
    is json's reading of the whole text (trace._load_torch), but for
    nesting past the scanner's limit that json still reads."""
    try:
        text = b"".join(tr._chunks(io.BytesIO(blob), "x"))
    except TraceError:
        return
    if tr._import.detect(text) != "chrome":
        return
    try:
        whole = tr._load_torch(text, "x", "chrome", device)
    except TraceError as exc:
        if t is not None:
            raise AssertionError(f"the scanner read {len(t)} events where json says: {exc}")
        return
    if t is None:
        if "nested deeper than" in str(error):
            return
        raise AssertionError(f"the scanner refused what json reads ({len(whole)} events): "
                             f"{error}")
    if list(t.events) != list(whole.events) or t.source != whole.source:
        raise AssertionError(f"the scanner read {len(t)} events, {t.source}; json "
                             f"{len(whole)}, {whole.source}")


SIZED_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                 "segment_map", "segment_unmap")


class PlainUnpickler(pickle.Unpickler):
    """The harness's own reading of a snapshot: plain data only."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"{module}.{name}")


def unsized_entries(blob, device):
    """The alloc, free and segment entries of a snapshot's chosen device
    ("device:N") whose size is a negative integer or one of 2**64 or more:
    an allocation read as a free, a free read as an allocation, a size no
    allocator takes, a reserved peak of 10**5000 bytes."""
    while blob[:2] == b"\x1f\x8b":
        blob = gzip.decompress(blob)
    traces = PlainUnpickler(io.BytesIO(blob)).load()["device_traces"]
    entries = traces[int(device.split(":")[1])]
    return [e for e in entries if isinstance(e, dict)
            and e.get("action") in SIZED_ACTIONS
            and type(e.get("size")) is int and not 0 <= e["size"] < UINT64_END]


def collect(exc, blob, device):
    """One file per (exception type, innermost ascmem frame)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "ascmem" in f.filename]
    where = f"{os.path.basename(frames[-1].filename)}-{frames[-1].lineno}" if frames else "fuzz"
    name = os.path.join(COLLECT, f"trace-{type(exc).__name__}-{where}")
    if not os.path.exists(name):
        with open(name, "wb") as f:
            f.write(b"\x00" + blob)
        with open(name + ".txt", "w") as f:
            f.write(f"device={device!r}\n{type(exc).__name__}: {str(exc)[:500]}\n")
            f.write("".join(traceback.format_exception(exc)[-6:])[-3000:])


if __name__ == "__main__":
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
