"""Allocation traces: load, save, record, replay, and the minimum capacity.

Format (CSV, optionally gzip-compressed, detected by content): a header
``op,id,size`` with optional further columns ``kind`` (huge, normal, dvpp, host)
and ``policy`` (an aclrtMemMallocPolicy number); ``op`` is ``a`` (allocate) or
``f`` (free); ``id`` pairs a free with its allocation.

Efficiency = peak live bytes / minimum capacity: the share of the smallest arena
that is actually holding requested bytes at the worst moment (1.0 is the limit).
"""

import importlib.resources
import io
import os
import time
import zlib
from typing import Any, NamedTuple

from ascmem.trace import profiler as _import
from ascmem._core import SLAB_MAX
from ascmem.errors import ArgumentTypeError, InvalidArgumentError, OutOfMemoryError
from ascmem.emulations.raw_cann import request_of
from ascmem.trace.csvfile import save  # noqa: F401  (ascmem.trace.save)
from ascmem.trace.data import KINDS, Event, Trace, TraceError  # noqa: F401  (the public names)

GRANULE = 64  # bytes: tlsfallocator works in these units, and Pool aligns to them


# ---- reading ------------------------------------------------------------------------

def _open(path_or_file):
    """(a binary stream, whether load must close it, its name); text-mode
    files come back as their text."""
    if hasattr(path_or_file, "read"):
        return path_or_file, False, str(getattr(path_or_file, "name", "trace"))
    try:
        name = os.fspath(path_or_file)
    except TypeError:
        raise TraceError(f"{path_or_file!r}: not a path or a file") from None
    name = os.fsdecode(name) if isinstance(name, bytes) else name
    try:
        return open(name, "rb"), True, name
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise TraceError(f"{name!r}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None


def _chunks(stream, name, first=b""):
    """The decompressed chunks, with read and gzip errors as TraceErrors."""
    from ascmem.trace.csvfile import chunks_of
    try:
        yield from chunks_of(stream, first)
    except UnicodeDecodeError as exc:  # a file opened in text mode
        raise TraceError(f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except (EOFError, zlib.error) as exc:
        raise TraceError(f"{name}: the gzip data is truncated or corrupt ({exc})") from None
    except OSError as exc:  # BadGzipFile is one too
        raise TraceError(f"{name}: cannot read: {exc.strerror or exc}") from None


def _examples_dir():
    return importlib.resources.files("ascmem") / "examples"


def example_names():
    """The workloads shipped with the package."""
    return sorted(r.name[:-len(".csv.gz")] for r in _examples_dir().iterdir()
                  if r.name.endswith(".csv.gz"))


def example(name):
    """A shipped example trace, read through importlib.resources (so it
    works from a wheel, a zip or a source tree alike)."""
    res = _examples_dir() / f"{name}.csv.gz"
    if not res.is_file():
        raise TraceError(f"no example {name!r}; shipped: {', '.join(example_names())}")
    data = io.BytesIO(res.read_bytes())
    data.name = f"{name}.csv.gz"
    return load(data)


# A PyTorch trace is read whole before it is parsed: a file (or a gzip
# member that inflates) beyond this is refused rather than read until memory
# runs out.  1 GiB holds some three million profiler memory events.
MAX_WHOLE_BYTES = 1 << 30


def load(path_or_file, device=None, max_bytes=None, progress=None):
    """Reads a trace: ascmem's CSV, a PyTorch profiler Chrome trace or a
    PyTorch memory snapshot (told apart by content; gzip allowed; see
    docs/TRACES.md).  device: which device's events of a PyTorch trace
    ("cpu", "cuda", "npu:1", a snapshot's index; default: the one with the
    most).  Anything malformed raises TraceError naming the file and line
    (or event).  A CSV trace streams through the compiled reader
    (trace_csv); a PyTorch trace is read up to max_bytes once decompressed
    (default MAX_WHOLE_BYTES), a Chrome trace as it streams through the
    compiled scanner (ascmem._tracejson).  progress(bytes read) is called as chunks come."""
    from ascmem.trace import csvfile as trace_csv
    stream, close, name = _open(path_or_file)
    try:
        try:
            first = stream.read(0)
        except OSError as exc:
            raise TraceError(f"{name}: cannot read: {exc.strerror or exc}") from None
        if isinstance(first, str):  # a text-mode file: the csv reader takes its text
            try:
                return _named(trace_csv.parse_text(stream.read(), name), name)
            except UnicodeDecodeError as exc:
                raise TraceError(f"{name}: not UTF-8 text ({exc.reason} at byte "
                                 f"{exc.start})") from None
        if not stream.seekable():  # a pipe: kept, so that the csv reader can read it again
            stream = io.BytesIO(stream.read())
        start = stream.tell()
        chunks = _watched(_chunks(stream, name), progress)
        head = next(chunks, b"")
        fmt = _import.detect(head)
        if fmt == "chrome" and _import.streaming():
            try:
                got = _import.from_chrome_chunks(_capped(head, chunks, name, max_bytes), name,
                                                 device)
            except InvalidArgumentError as exc:
                raise TraceError(str(exc)) from None
            return _imported(got, name, fmt)
        if fmt != "csv":
            return _load_torch(_whole_text(head, chunks, name, max_bytes), name, fmt, device)
        columns = trace_csv.read_columns(_prepend(head, chunks), name)
        if columns is not None:
            return _named(Trace(columns=columns), name)
        # the csv reader decides: an error, or a form the fast path leaves
        stream.seek(start)
        return _named(trace_csv.parse_text(b"".join(_chunks(stream, name)), name), name)
    finally:
        if close:
            stream.close()


def _capped(head, chunks, name, max_bytes):
    """The decompressed chunks, refused past max_bytes as they come (a small
    gzip can inflate to gigabytes)."""
    limit = MAX_WHOLE_BYTES if max_bytes is None else max_bytes
    total = 0
    for chunk in _prepend(head, chunks):
        total += len(chunk)
        if total > limit:
            raise TraceError(f"{name}: inflates to more than {limit:,} bytes, the most a PyTorch "
                             f"trace is read to (trace.load(..., max_bytes=N) reads more)")
        yield chunk


def _whole_text(head, chunks, name, max_bytes):
    return b"".join(_capped(head, chunks, name, max_bytes))


def _watched(chunks, progress):
    """chunks, telling progress the bytes so far."""
    if progress is None:
        yield from chunks
        return
    total = 0
    for chunk in chunks:
        total += len(chunk)
        progress(total)
        yield chunk


def _prepend(head, chunks):
    yield head
    yield from chunks


def _named(trace, name):
    trace.name = _base_name(name)
    return trace


def _load_torch(data, name, fmt, device):
    try:
        got = (_import.from_chrome if fmt == "chrome" else _import.from_snapshot)(data, name, device)
    except InvalidArgumentError as exc:
        raise TraceError(str(exc)) from None
    return _imported(got, name, fmt)


def _imported(got, name, fmt):
    """The Trace of an importer's ImportedTrace."""
    trace = Trace(columns=got.events.columns(), name=_base_name(name))
    trace.origin = "traceEvents" if fmt == "chrome" else f"device_traces[{got.device.split(':')[1]}]"
    trace.source = {"format": fmt, "device": got.device, "skipped_frees": got.skipped_frees,
                    "reserved_peak": got.reserved_peak}
    return trace


def _base_name(name):
    base = os.path.basename(name)
    for ext in (".gz", ".csv", ".json", ".pickle", ".pkl"):
        base = base[: -len(ext)] if base.endswith(ext) else base
    return base


# ---- recording ------------------------------------------------------------------------

class Recorder:
    """Wraps a Device, a Pool (or BuddyAllocator) and records every allocate
    and free as it happens.  Use it in place of the target:

        rec = Recorder(dev); p = rec.malloc(1000); rec.free(p); rec.trace()
    """

    _ALLOC = {"alloc": "", "malloc": "", "malloc_align32": "", "dvpp_malloc": "dvpp",
              "malloc_host": "host"}
    _FREE = ("free", "dvpp_free", "free_host")

    def __init__(self, target: Any) -> None:
        self._target = target
        self._events = []
        self._live = {}  # pointer -> its allocation event
        self._next = 0
        self._kinded = hasattr(target, "kind_of")

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name in self._ALLOC:
            def alloc(size, *args, **kw):
                ptr = attr(size, *args, **kw)
                policy = int(args[0]) if args and name in ("malloc", "malloc_align32") else 0
                kind = self._target.kind_of(ptr).name.lower() if self._kinded else ""
                self._live[ptr] = Event("a", self._next, int(size), kind, policy)
                self._events.append(self._live[ptr])
                self._next += 1
                return ptr
            return alloc
        if name in self._FREE:
            def free(ptr, *args, **kw):
                result = attr(ptr, *args, **kw)
                a = self._live.pop(ptr)
                self._events.append(Event("f", a.id, a.size, a.kind, a.policy))
                return result
            return free
        return attr

    def trace(self) -> "Trace":
        """What was recorded so far."""
        return Trace(self._events, name="recorded")

    def save(self, path: "str | os.PathLike[str]") -> None:
        """Writes what was recorded so far (gzip when the name ends in .gz)."""
        save(self.trace(), path)


class AclRecorder:
    """Records the ``ascmem.acl`` drop-in's calls: use its ``rt``, ``media``
    and ``himpi`` in place of the module's (same return conventions); failed
    calls (a non-zero code) are not recorded.

        rec = AclRecorder(); ptr, ret = rec.rt.malloc(1000, 0); rec.rt.free(ptr)
    """

    def __init__(self, acl_module=None):
        import types
        if acl_module is None:
            from ascmem import acl as acl_module
        self._acl = acl_module
        self._events, self._live, self._next = [], {}, 0

        def alloc(fn, policy_arg):
            def call(*args):
                ptr, ret = fn(*args)
                if ret == 0:
                    policy = int(args[1]) if policy_arg and len(args) > 1 else 0
                    kind = self._acl.device().kind_of(ptr).name.lower()
                    size = args[-1] if fn in (acl_module.himpi.dvpp_malloc,) else args[0]
                    self._live[ptr] = Event("a", self._next, int(size), kind, policy)
                    self._events.append(self._live[ptr])
                    self._next += 1
                return ptr, ret
            return call

        def free(fn):
            def call(ptr):
                ret = fn(ptr)
                if ret == 0 and ptr in self._live:
                    a = self._live.pop(ptr)
                    self._events.append(Event("f", a.id, a.size, a.kind, a.policy))
                return ret
            return call

        rt, media, himpi = acl_module.rt, acl_module.media, acl_module.himpi
        self.rt = types.SimpleNamespace(
            malloc=alloc(rt.malloc, True), malloc_align32=alloc(rt.malloc_align32, True),
            malloc_host=alloc(rt.malloc_host, False), free=free(rt.free),
            free_host=free(rt.free_host), get_mem_info=rt.get_mem_info)
        self.media = types.SimpleNamespace(dvpp_malloc=alloc(media.dvpp_malloc, False),
                                           dvpp_free=free(media.dvpp_free))
        self.himpi = types.SimpleNamespace(dvpp_malloc=alloc(himpi.dvpp_malloc, False),
                                           dvpp_free=free(himpi.dvpp_free))

    def trace(self):
        return Trace(self._events, name="recorded-acl")

    def save(self, path):
        save(self.trace(), path)


# ---- replay -------------------------------------------------------------------------------

def tlsf_available():
    try:
        import TLSFAllocator  # noqa: F401
    except ImportError:
        return False
    return True


ALLOCATORS = ("pool", "buddy", "tlsf", "bestfit", "bestfit-wilderness", "torch-caching",
              "torch-expandable", "torch-expandable-eager")


def _a_trace(trace):
    """trace, if it is one (load, example, a Recorder's trace)."""
    if not isinstance(trace, Trace):
        raise ArgumentTypeError(f"expected a Trace (ascmem.trace.load or example), not "
                                f"{type(trace).__name__}")
    return trace


def _bytes(value, what, power_of_two=False):
    """value, if it is a positive number of bytes (and a power of two when asked)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or \
            (power_of_two and value & (value - 1)):
        kind = "a power of two number" if power_of_two else "a positive number"
        raise InvalidArgumentError(f"{what} must be {kind} of bytes, not {value!r}")
    return value


def make_allocator(name, capacity):
    """An allocator of capacity bytes by name: pool, buddy, tlsf, bestfit,
    bestfit-wilderness (best fit keeping the arena's untouched end for last),
    torch-caching (torch_npu's caching allocator, emulated, with the options
    of PYTORCH_NPU_ALLOC_CONF in the environment), torch-expandable and
    torch-expandable-eager (its expandable segments, pages unmapped only
    before out-of-memory, or as soon as they are free)."""
    import ascmem
    base = 1 << 32  # any aligned base works; 0 is avoided so that 0 is never a block
    if name == "pool":
        return ascmem.Pool(capacity, base=base)
    if name == "buddy":
        return ascmem.BuddyAllocator(capacity, base=base)
    # the peers are compiled (ascmem._replay_peers), the Python references'
    # algorithms with the same figures; a caching allocator with options
    # only the reference has is the reference
    from ascmem import _replay_peers as peers
    if name == "torch-caching":
        from ascmem.emulations.torch_caching import TorchCachingAllocator, parse_conf
        conf = os.environ.get("PYTORCH_NPU_ALLOC_CONF")
        opts = parse_conf(conf)
        if opts.pop("expandable_segments", False):
            return peers.TorchExpandableSegments(capacity, **opts)
        if set(opts) <= {"roundup_power2_divisions"}:
            return peers.TorchCachingAllocator(capacity, **opts)
        return TorchCachingAllocator.from_conf(capacity, conf)
    if name in ("torch-expandable", "torch-expandable-eager"):
        return peers.TorchExpandableSegments(capacity, eager=name.endswith("eager"))
    if name == "bestfit":
        return peers.BestFit(capacity)
    if name == "bestfit-wilderness":
        return peers.BestFitWilderness(capacity)
    if name == "tlsf":
        if not tlsf_available():
            raise InvalidArgumentError("the tlsf allocator needs `pip install tlsfallocator`")
        return peers.TlsfPeer(capacity)
    raise InvalidArgumentError(f"unknown allocator {name!r}; known: {', '.join(ALLOCATORS)}")


def _device_alloc(device, kind, policy):
    """The Device call that allocates an event of this kind and policy."""
    call, pol = request_of(kind, policy)
    if call == "malloc":
        return lambda size: device.malloc(size, pol)
    return getattr(device, call)


def _device_free(device, kind):
    return {"dvpp": device.dvpp_free, "host": device.free_host}.get(kind, device.free)


def replay(trace, allocator="pool", capacity=None, stop_at_failure=False, progress=None,
           snapshot=None, curve=False, snapshot_at_peak=False, history_limit=None):
    """Plays a trace through an allocator: a name (pool, buddy, tlsf) with a
    capacity, or any object with alloc/free (a Pool, a BuddyAllocator, a
    reference allocator), or a Device (kinds and policies honoured).

    Returns a report: peak_live, peak_used (bytes held by blocks at the worst
    moment, after rounding), failures, first_failure, per-kind peaks,
    operations per second.  progress(i, n) is called now and then; curve:
    record live bytes per kind and the footprint at every event (for plots:
    curve_live, curve_used; curve="used": the footprint only).  With a Device, ``snapshot`` (a path) writes
    PyTorch's memory-snapshot pickle of the device as the trace ends -- or,
    with snapshot_at_peak, at its peak of live bytes -- with the allocation
    history (the last history_limit entries; default: all, as PyTorch)."""
    import ascmem
    _a_trace(trace)
    if isinstance(allocator, str):
        if capacity is None:
            raise InvalidArgumentError("replay by allocator name needs a capacity")
        allocator = make_allocator(allocator, _bytes(capacity, "capacity"))
    elif not isinstance(allocator, ascmem.Device) and not (
            callable(getattr(allocator, "alloc", None)) and callable(getattr(allocator, "free", None))):
        raise ArgumentTypeError(f"replay needs an allocator name, a Device or an object with "
                                f"alloc and free, not {type(allocator).__name__}")
    is_device = isinstance(allocator, ascmem.Device)
    if _compiled(trace, allocator, curve, snapshot):
        return _replay_compiled(trace, allocator, stop_at_failure, progress)
    if _compiled_peer(allocator, curve, snapshot, trace):
        return _replay_peer_compiled(trace, allocator, stop_at_failure, progress, curve)
    if is_device and not snapshot and curve in (False, "used") and \
            trace.columns.ids.dtype == "int64":
        got = _replay_device_compiled(trace, allocator, stop_at_failure, progress, curve)
        if got is not None:
            return got
    caching = hasattr(allocator, "peak_reserved")  # what it holds from the device is its curve
    paged = isinstance(allocator, ascmem.Pool) and bool(allocator.granule)  # its curve: mapped
    usable = getattr(allocator, "usable_size", None)
    live, sizes_used = {}, {}
    live_bytes = used_bytes = peak_live = peak_used = 0
    kind_live, kind_peak = {}, {}
    failures, first_failure = 0, None
    curve_live, curve_used = [], []
    history = [] if snapshot else None
    if snapshot and not is_device:
        raise InvalidArgumentError("a snapshot needs a Device to replay through")
    peak_at = trace.peak_index() if snapshot and snapshot_at_peak else None
    captured = None
    t0 = time.perf_counter()
    for i, (is_alloc, ident, size, kind, policy) in enumerate(trace.rows()):
        if is_alloc:
            try:
                if is_device:
                    alloc = _device_alloc(allocator, kind, policy)
                    ptr = alloc(size)
                    got = allocator.usable_size(ptr)
                else:
                    ptr = allocator.alloc(size, GRANULE)
                    got = usable(ptr) if usable else (size + GRANULE - 1) // GRANULE * GRANULE
            except OutOfMemoryError as exc:
                failures += 1
                if first_failure is None:
                    first_failure = {"event": i, "line": trace.line_of(i),
                                     "where": trace.where(i), "id": ident,
                                     "size": size, "kind": kind, "error": str(exc)}
                if stop_at_failure:
                    break
                continue
            live[ident] = (ptr, kind, policy)
            sizes_used[ident] = got
            if history is not None:
                history.append(("alloc", ptr, got))
            live_bytes += size
            used_bytes += got
            kind_live[kind] = kind_live.get(kind, 0) + size
            kind_peak[kind] = max(kind_peak.get(kind, 0), kind_live[kind])
            peak_live = max(peak_live, live_bytes)
            peak_used = max(peak_used, used_bytes)
        else:
            entry = live.pop(ident, None)
            if entry is None:  # its allocation failed
                continue
            ptr = entry[0]
            if is_device:
                _device_free(allocator, kind)(ptr)
            else:
                allocator.free(ptr)
            if history is not None:
                history.append(("free", ptr, sizes_used[ident]))
            live_bytes -= size
            used_bytes -= sizes_used.pop(ident)
            kind_live[kind] -= size
        if i == peak_at:
            from ascmem.snapshot import to_torch
            captured = to_torch(allocator, history, limit=history_limit)
        if curve:
            if curve != "used":
                curve_live.append(dict(kind_live))
            if is_device:  # the footprint that counts: pages charged to the device
                b = allocator.budget()
                curve_used.append(b["huge_used"] + b["normal_used"])
            elif caching:
                curve_used.append(allocator.reserved)
            elif paged:
                curve_used.append(allocator.stats()["mapped"])
            else:
                curve_used.append(used_bytes)
        if progress is not None and i % 4096 == 0:
            progress(i, len(trace))
    elapsed = time.perf_counter() - t0
    report = {
        "trace": trace.name, "events": len(trace), "allocations": trace.allocations,
        "peak_live": peak_live, "peak_used": peak_used, "failures": failures,
        "first_failure": first_failure, "ops_per_sec": len(trace) / elapsed if elapsed else 0.0,
        "seconds": elapsed,
    }
    if trace.has_kinds:
        report["per_kind_peak_live"] = {k: v for k, v in kind_peak.items()}
    if trace.has_streams:  # what each stream holds at its own peak (PyTorch snapshots)
        report["per_stream_peak_live"] = {str(k): v for k, v in trace.stream_peaks().items()}
    if curve:
        if curve != "used":
            report["curve_live"] = curve_live
        report["curve_used"] = curve_used
        report["curve_used_label"] = ("device pages in use" if is_device else
                                      "reserved" if caching else
                                      "mapped" if paged else "held after rounding")
    if snapshot:
        from ascmem.snapshot import save_torch, to_torch
        if captured is None:
            captured = to_torch(allocator, history, limit=history_limit)
        save_torch(captured, snapshot)
        report["snapshot"] = str(snapshot)
        report["snapshot_event"] = peak_at if peak_at is not None else len(trace) - 1
    if caching:  # a caching allocator: what it took from the device
        report["peak_reserved"] = allocator.peak_reserved
    if paged:  # the physical side
        stats = allocator.stats()
        report.update(granule=allocator.granule, peak_mapped=stats["peak_mapped"],
                      map_calls=stats["map_calls"], unmap_calls=stats["unmap_calls"],
                      physical_efficiency=peak_live / stats["peak_mapped"] if stats["peak_mapped"] else 0.0)
    # give everything back so that a caller's allocator is left as it was
    for ptr, kind, _ in live.values():
        if is_device:
            _device_free(allocator, kind)(ptr)
        else:
            allocator.free(ptr)
    return report


def _compiled(trace, allocator, curve, snapshot):
    """Whether replay() can play trace through allocator in compiled code
    (ascmem._core.replay_columns): a Pool or a BuddyAllocator, no curve or
    snapshot, ids that are int64."""
    from ascmem._core import BuddyAllocator, Pool
    return type(allocator) in (Pool, BuddyAllocator) and not curve and not snapshot \
        and trace.columns.ids.dtype == "int64"


def _replay_compiled(trace, allocator, stop_at_failure, progress):
    """replay()'s report, from the compiled loop: the same figures as the
    loop in Python (tests/traces/test_trace_scale.py compares them)."""
    from ascmem._core import replay_columns
    c = trace.columns
    t0 = time.perf_counter()
    got = replay_columns(allocator, c.alloc, trace.slots(), c.size, c.kind,
                         stop_at_failure=stop_at_failure, progress=progress)
    elapsed = time.perf_counter() - t0
    report = _compiled_report(trace, got, elapsed)
    if getattr(allocator, "granule", 0):  # a paged pool: the physical side
        stats = got["stats"]
        report.update(granule=allocator.granule, peak_mapped=stats["peak_mapped"],
                      map_calls=stats["map_calls"], unmap_calls=stats["unmap_calls"],
                      physical_efficiency=got["peak_live"] / stats["peak_mapped"]
                      if stats["peak_mapped"] else 0.0)
    return report


def device_footprint(trace, device, curve=False):
    """(the most huge + normal pages of device in use after any event of
    trace, the failures, with curve the pages in use after each event):
    what `ascmem plan` asks of a replay through a Device, without the
    curve's memory when it is not asked for."""
    got = _replay_device_compiled(trace, device, False, None, curve, keep=True) \
        if _a_trace(trace).columns.ids.dtype == "int64" else None
    if got is None:
        rep = replay(trace, device, curve="used")
        return max(rep["curve_used"], default=0), rep["failures"], \
            rep["curve_used"] if curve else []
    return got["peak_pages"], got["failures"], got.get("curve_used", [])


def _replay_device_compiled(trace, device, stop_at_failure, progress, curve, keep=False):
    """replay()'s report through a Device, from the compiled loop
    (ascmem._core.replay_device): the same figures as the loop in Python
    (tests/test_replay_compiled.py compares them); None when the device
    takes its Python API only (debug mode, a paged acl device)."""
    from ascmem._core import replay_device
    from ascmem.errors import UnsupportedError
    c = trace.columns
    t0 = time.perf_counter()
    try:
        got = replay_device(device, c.alloc, trace.slots(), c.size, c.kind, c.policy,
                            stop_at_failure=stop_at_failure, curve=bool(curve),
                            progress=progress)
    except UnsupportedError:
        return None
    elapsed = time.perf_counter() - t0
    report = _compiled_report(trace, got, elapsed, curve and "device pages in use")
    if keep:
        report["peak_pages"] = got["peak_pages"]
    return report


def _compiled_peer(allocator, curve, snapshot, trace):
    """Whether replay() plays trace through allocator, a compiled peer
    (ascmem._replay_peers), in its compiled loop."""
    from ascmem._replay_peers import _Peer
    return isinstance(allocator, _Peer) and curve in (False, "used") and not snapshot \
        and trace.columns.ids.dtype == "int64"


def _replay_peer_compiled(trace, peer, stop_at_failure, progress, curve):
    """replay()'s report through a compiled peer (ascmem._replay_peers):
    the same figures as the loop in Python with its Python reference
    (tests/test_replay_compiled.py compares them)."""
    from ascmem._replay_peers import replay_peer
    c = trace.columns
    t0 = time.perf_counter()
    got = replay_peer(peer, c.alloc, trace.slots(), c.size, c.kind,
                      stop_at_failure=stop_at_failure, curve=bool(curve), progress=progress)
    elapsed = time.perf_counter() - t0
    caching = hasattr(peer, "peak_reserved")
    report = _compiled_report(trace, got, elapsed,
                              curve and ("reserved" if caching else "held after rounding"))
    if caching:
        report["peak_reserved"] = peer.peak_reserved
    return report


def _compiled_report(trace, got, elapsed, curve_label=None):
    """The figures every compiled replay reports, from its dict (kind_peaks:
    a dict or (kind code, peak) pairs, in the report's order); with
    curve_label, its curve."""
    from ascmem.trace.data import KIND_NAMES
    c = trace.columns
    first = None
    if got["first_failure"] >= 0:
        i = got["first_failure"]
        first = {"event": i, "line": trace.line_of(i), "where": trace.where(i),
                 "id": int(c.ids[i]), "size": int(c.size[i]), "kind": KIND_NAMES[c.kind[i]],
                 "error": str(got["first_error"])}
    report = {
        "trace": trace.name, "events": len(trace), "allocations": trace.allocations,
        "peak_live": got["peak_live"], "peak_used": got["peak_used"],
        "failures": got["failures"], "first_failure": first,
        "ops_per_sec": len(trace) / elapsed if elapsed else 0.0, "seconds": elapsed,
    }
    if trace.has_kinds:
        peaks = dict(got["kind_peaks"])
        report["per_kind_peak_live"] = {KIND_NAMES[k]: v for k, v in peaks.items()}
    if trace.has_streams:
        report["per_stream_peak_live"] = {str(k): v for k, v in trace.stream_peaks().items()}
    if curve_label:
        report["curve_used"] = got["curve"].tolist()
        report["curve_used_label"] = curve_label
    return report


def fits(trace, allocator, capacity):
    """True when the whole trace replays with no failure in capacity bytes
    (the replay stops at the first failure)."""
    if callable(allocator) and not isinstance(allocator, str):
        a = allocator(capacity)
    else:
        a = make_allocator(allocator, capacity)
    return replay(trace, a, stop_at_failure=True)["failures"] == 0


def min_capacity(trace, allocator="pool", resolution=64 * 1024, hi=None, progress=None):
    """The smallest capacity (a multiple of resolution) in which the trace
    replays with no failure, by bisection.  allocator: a name, or a callable
    capacity -> allocator object.  progress(replays so far) after each."""
    _bytes(resolution, "resolution")
    done = 0

    def fits_in(capacity):
        nonlocal done
        ok = fits(trace, allocator, capacity)
        done += 1
        if progress is not None:
            progress(done)
        return ok

    peak = _a_trace(trace).peak_live()
    lo = max(resolution, peak // resolution * resolution)  # below peak_live nothing fits
    if hi is None:
        hi = max(lo * 2, resolution)
        while not fits_in(hi):
            lo, hi = hi, hi * 2
            if hi > 1 << 40:
                raise OutOfMemoryError("the trace does not fit in 1 TiB")
    # invariant: hi fits; lo may not
    while hi - lo > resolution:
        mid = (lo + hi) // 2 // resolution * resolution
        if fits_in(mid):
            hi = mid
        else:
            lo = mid
    if fits_in(lo):
        return lo
    return hi


def paged_pool(trace, granule=2 << 20, release_threshold=0, range_size=None, placement=None,
               min_block=4096, slab_max=None):
    """A paged Pool for replaying trace: a virtual range far larger than any
    placement of it needs (at least 64 GiB), or of range_size bytes, mapped
    in granules, with the given placement (Pool's; None: "granules"), unit
    (Pool's min_block) and slab_max (Pool's; None: its default)."""
    import ascmem
    size = range_size or max(64 << 30, 16 * _a_trace(trace).peak_live())
    _bytes(granule, "granule", power_of_two=True)
    size = (size + granule - 1) // granule * granule
    return ascmem.Pool(size, base=1 << 44, granule=granule, release_threshold=release_threshold,
                       placement=placement, min_block=min_block, slab_max=slab_max)


def physical_efficiency(trace, granule=2 << 20, release_threshold=0, range_size=None,
                        progress=None, placement=None, min_block=4096, slab_max=None):
    """Peak live bytes / peak mapped bytes when a paged Pool with this granule
    (and virtual range, placement, unit and slab_max, see paged_pool) replays the trace: how
    much physical memory a page-mapped pool needs against what the trace
    holds live at its peak.  Returns (efficiency, peak mapped bytes)."""
    pool = paged_pool(trace, granule, release_threshold, range_size, placement, min_block, slab_max)
    report = replay(trace, pool, progress=progress)
    if report["failures"]:  # the figures would be those of another run, with fewer blocks live
        raise OutOfMemoryError(f"{report['failures']} of the trace's allocations found no room in "
                               f"the paged range of {pool.capacity} bytes: give a larger range_size")
    if not report["peak_mapped"]:  # nothing ever mapped: nothing wasted (fit's bound says 1.0 too)
        return 1.0, 0
    return report["peak_live"] / report["peak_mapped"], report["peak_mapped"]


PLACEMENTS = ("granules", "packed", "best-fit")  # Pool's placement argument; the default first


def placement_efficiencies(trace, granule=2 << 20, release_threshold=0, range_size=None,
                           progress=None, min_block=4096, slab_max=None):
    """physical_efficiency under each paged placement, in units of min_block
    with this slab_max: {placement: (efficiency, peak mapped bytes)}, in the
    order of PLACEMENTS."""
    return {p: physical_efficiency(trace, granule, release_threshold, range_size, progress, p,
                                   min_block, slab_max)
            for p in PLACEMENTS}


def fewest_mapped(figures):
    """The placement of placement_efficiencies' figures that maps the fewest
    bytes at the peak (or of contiguous_placement_efficiencies' that needs
    the smallest arena); the default, listed first, on a tie."""
    return min(figures, key=lambda p: figures[p][1])


def choose_placement(trace, granule=2 << 20, release_threshold=0, range_size=None):
    """The paged placement (Pool's placement argument) that maps the fewest
    bytes at the peak when this recorded run replays, the default on a tie
    (else the one listed first in PLACEMENTS).  None wins on every workload
    (docs/ARCHITECTURE.md, Note [Packed placement], Note [Best-fit
    placement]); a workload that repeats its recorded run keeps the winner.
    Returns (placement, efficiency, peak mapped bytes).  choose_paged_plan
    chooses the unit too."""
    figures = placement_efficiencies(trace, granule, release_threshold, range_size)
    best = fewest_mapped(figures)
    return (best,) + figures[best]


def _in_each_setting(units, figures_in):
    """{(placement, unit, slab_max): figures} from figures_in(unit,
    slab_max) -> {placement: figures}: a plan's replays, with slabs
    (SLAB_MAXES' order) then unit by unit in the order of units, so that
    the defaults come first."""
    return {(p, unit, slab_max): got for slab_max in SLAB_MAXES for unit in units
            for p, got in figures_in(unit, slab_max).items()}


class PagedPlan(NamedTuple):
    """A paged Pool's configuration chosen from a recorded run: deploy with
    ``Pool(size, granule=granule, placement=placement, min_block=min_block,
    slab_max=slab_max)`` (``Device(paged=True, ...)`` takes the same three)."""
    placement: str
    min_block: int
    efficiency: float
    peak_mapped: int  # bytes mapped at the replay's peak
    slab_max: int = SLAB_MAX


def paged_plan_efficiencies(trace, granule=2 << 20, release_threshold=0, range_size=None,
                            progress=None):
    """physical_efficiency under each paged placement in each unit of
    PAGED_UNITS, with each slab_max of SLAB_MAXES: {(placement, min_block,
    slab_max): (efficiency, peak mapped bytes)}, the default unit's
    placements with slabs first, the default first among them."""
    # a unit holds no more than one granule; with none that small, the
    # smallest is tried, for the pool to refuse the granule as it would
    units = [u for u in PAGED_UNITS if u <= granule] or [min(PAGED_UNITS)]
    return _in_each_setting(units, lambda unit, slab_max: placement_efficiencies(
        trace, granule, release_threshold, range_size, progress, unit, slab_max))


def best_paged_plan(figures):
    """The PagedPlan of paged_plan_efficiencies' figures that maps the
    fewest bytes at the peak, the earliest listed on a tie (the default
    placement, unit and slab_max first)."""
    placement, unit, slab_max = setting = fewest_mapped(figures)
    return PagedPlan(placement, unit, *figures[setting], slab_max=slab_max)


def choose_paged_plan(trace, granule=2 << 20, release_threshold=0, range_size=None):
    """The paged placement, unit and slab_max (Pool's placement, min_block
    and slab_max) that map the fewest bytes at the peak when this recorded
    run replays, the default on a tie.  The unit sets the holes best fit
    leaves, and so which granules a block lands on (docs/ARCHITECTURE.md,
    Note [Best-fit placement]); slabs keep a span for each size class,
    which on some workloads costs granules best fit would not (Note [Slabs
    or best fit]).  Returns a PagedPlan."""
    return best_paged_plan(paged_plan_efficiencies(trace, granule, release_threshold, range_size))


# a contiguous Pool's placement argument; the default first
CONTIGUOUS_PLACEMENTS = ("kept-in-place", "kept-to-best-fit", "lowest-equal", "best-fit-end-last")
# the units (Pool's and Device's min_block) a contiguous plan tries; the
# default first (docs/ARCHITECTURE.md, Note [Contiguous placements])
CONTIGUOUS_UNITS = (4096, 2048, 1024)
# the units a paged plan tries: the same, for the same reason (Note [Best-fit placement])
PAGED_UNITS = CONTIGUOUS_UNITS
# the slab_max (Pool's and Device's) both plans try: slabs up to 32 KiB (the
# default), and none (Note [Slabs or best fit])
SLAB_MAXES = (SLAB_MAX, 0)


def contiguous_pool(placement=None, min_block=4096, slab_max=None):
    """capacity -> a contiguous Pool with this placement (Pool's; None:
    "kept-in-place"), unit and slab_max (None: the Pool's default), as
    make_allocator("pool") makes one: an allocator argument of min_capacity
    and efficiency."""
    import ascmem

    def make(capacity):
        return ascmem.Pool(capacity, base=1 << 32, placement=placement, min_block=min_block,
                           slab_max=slab_max)
    return make


def contiguous_placement_efficiencies(trace, resolution=64 * 1024, progress=None,
                                      min_block=4096, slab_max=None):
    """efficiency under each contiguous placement, in units of min_block
    with this slab_max: {placement: (efficiency, smallest arena)}, in the
    order of CONTIGUOUS_PLACEMENTS (progress: as min_capacity's, counted
    afresh for each placement)."""
    peak = _a_trace(trace).peak_live()
    figures = {}
    for p in CONTIGUOUS_PLACEMENTS:
        cap = min_capacity(trace, contiguous_pool(p, min_block, slab_max), resolution,
                           progress=progress)
        figures[p] = (peak / cap, cap)
    return figures


def choose_contiguous_placement(trace, resolution=64 * 1024, min_block=4096):
    """The contiguous placement (Pool's placement argument) whose Pool, in
    units of min_block, replays this recorded run in the smallest arena, the
    default on a tie.  None wins on every workload (docs/ARCHITECTURE.md,
    Note [Contiguous placements]); a workload that repeats its recorded run
    keeps the winner.  Returns (placement, efficiency, smallest arena in
    bytes).  choose_contiguous_plan chooses the unit too."""
    figures = contiguous_placement_efficiencies(trace, resolution, min_block=min_block)
    best = fewest_mapped(figures)
    return (best,) + figures[best]


class ContiguousPlan(NamedTuple):
    """A contiguous Pool's configuration chosen from a recorded run: deploy
    with ``Pool(arena, placement=placement, min_block=min_block,
    slab_max=slab_max)`` (a Device that is not paged takes the same three
    arguments)."""
    placement: str
    min_block: int
    efficiency: float
    arena: int  # the smallest arena that replays the run, in bytes
    slab_max: int = SLAB_MAX


def contiguous_plan_efficiencies(trace, resolution=64 * 1024, progress=None):
    """efficiency under each contiguous placement in each unit of
    CONTIGUOUS_UNITS, with each slab_max of SLAB_MAXES: {(placement,
    min_block, slab_max): (efficiency, smallest arena)}, the default unit's
    placements with slabs first, the default first among them."""
    return _in_each_setting(CONTIGUOUS_UNITS, lambda unit, slab_max: (
        contiguous_placement_efficiencies(trace, resolution, progress, unit, slab_max)))


def best_contiguous_plan(figures):
    """The ContiguousPlan of contiguous_plan_efficiencies' figures with the
    smallest arena, the earliest listed on a tie (the default placement,
    unit and slab_max first)."""
    placement, unit, slab_max = setting = fewest_mapped(figures)
    return ContiguousPlan(placement, unit, *figures[setting], slab_max=slab_max)


def choose_contiguous_plan(trace, resolution=64 * 1024):
    """The contiguous placement, unit and slab_max (Pool's placement,
    min_block and slab_max) whose Pool replays this recorded run in the
    smallest arena, the default on a tie.  The unit changes the sizes of the
    holes best fit leaves, so which placement wins, and by how much, depends
    on it as well (docs/ARCHITECTURE.md, Note [Contiguous placements]); so
    do slabs, whose spans best fit places among the large blocks (Note
    [Slabs or best fit]).  Returns a ContiguousPlan."""
    return best_contiguous_plan(contiguous_plan_efficiencies(trace, resolution))


def efficiency(trace, allocator="pool", resolution=64 * 1024):
    cap = min_capacity(trace, allocator, resolution)
    return trace.peak_live() / cap, cap
