"""What a trace is in memory: one numpy column per field, so that ten
million events take about 230 MB (op 1 byte, id 8, size 8, kind 1, policy
4, and a line number only when the file skipped lines) instead of a Python
object each.  Trace.events is a read-only sequence of Event records made on
demand, for code that wants them one at a time."""

import dataclasses
from collections.abc import Sequence

import numpy as np

from ascmem.errors import InvalidArgumentError

KINDS = ("huge", "normal", "dvpp", "host")
KIND_NAMES = ("",) + KINDS          # a kind column's codes
KIND_CODE = {k: i for i, k in enumerate(KIND_NAMES)}
_BLOCK = 1 << 16                     # rows turned into Python values at a time


class TraceError(InvalidArgumentError):
    """A malformed trace; the message names the line."""


@dataclasses.dataclass
class Event:
    op: str        # "a" or "f"
    id: int
    size: int      # for frees: the size of the block freed
    kind: str = ""
    policy: int = 0
    line: int = 0
    stream: int = 0  # the stream it was allocated on (PyTorch snapshots; 0: none given)


@dataclasses.dataclass
class Columns:
    """The fields of n events.  alloc: 1 for an allocation, 0 for a free;
    a free carries its allocation's size, kind and policy.  line: the file
    line of each event, or None when event i is on line i + 2 (a header,
    no skipped lines)."""
    alloc: np.ndarray    # uint8
    ids: np.ndarray      # int64 (object for ids outside it)
    size: np.ndarray     # uint64
    kind: np.ndarray     # uint8, KIND_NAMES codes
    policy: np.ndarray   # uint32
    line: "np.ndarray | None" = None
    stream: "np.ndarray | None" = None   # int64, or None when every event is on stream 0

    @classmethod
    def of_events(cls, events):
        n = len(events)
        alloc = np.fromiter((e.op == "a" for e in events), np.uint8, n)
        try:
            ids = np.fromiter((e.id for e in events), np.int64, n)
        except OverflowError:  # ids beyond int64 (addresses): kept as Python ints
            ids = np.array([e.id for e in events], dtype=object)
        size = np.fromiter((e.size for e in events), np.uint64, n)
        kind = np.fromiter((KIND_CODE[e.kind] for e in events), np.uint8, n)
        policy = np.fromiter((e.policy for e in events), np.uint32, n)
        line = np.fromiter((e.line for e in events), np.int64, n)
        stream = np.fromiter((e.stream for e in events), np.int64, n)
        return cls(alloc, ids, size, kind, policy, line, stream if stream.any() else None)


class Trace:
    """Events with the facts replays need.  Trace(events) from Event
    records, or Trace(columns=Columns(...)) as the readers make it."""

    def __init__(self, events=(), name="trace", *, columns=None):
        self.columns = columns if columns is not None else Columns.of_events(list(events))
        self.name = name
        self.source = {"format": "csv"}  # importers add device, skipped_frees, reserved_peak
        c = self.columns
        self.has_kinds = bool(c.kind.any())
        self.has_policies = bool(c.policy.any())
        self.has_streams = c.stream is not None
        # what the line column holds: None, file lines (a CSV trace); else the
        # list whose indexes it holds ("traceEvents", "device_traces[0]")
        self.origin = None
        self._slots = None  # slots(), made on first use

    def __len__(self):
        return len(self.columns.alloc)

    @property
    def events(self):
        return _EventView(self.columns)

    @property
    def allocations(self):
        return int(np.count_nonzero(self.columns.alloc))

    def slots(self):
        """Each event's slot: its allocation's ordinal (ascmem._core.replay_slots),
        made once; the compiled replays keep live blocks in an array by it."""
        if self._slots is None:
            from ascmem._core import replay_slots
            self._slots = replay_slots(self.columns.alloc, self.columns.ids)
        return self._slots

    def line_of(self, i):
        """The file line of event i (a CSV trace); None for a PyTorch trace."""
        if self.origin is not None:
            return None
        line = self.columns.line
        return int(line[i]) if line is not None else i + 2

    def where(self, i):
        """Where event i came from, in words: "line 370" of a CSV file,
        "traceEvents[1234]" of a Chrome trace, "device_traces[0][55]" of a
        memory snapshot."""
        if self.origin is None:
            return f"line {self.line_of(i)}"
        return f"{self.origin}[{int(self.columns.line[i])}]"

    def rows(self):
        """(alloc, id, size, kind name, policy) of every event, in order, as
        Python values (a block of rows converted at a time)."""
        c = self.columns
        for lo in range(0, len(c.alloc), _BLOCK):
            hi = lo + _BLOCK
            yield from zip(c.alloc[lo:hi].tolist(), c.ids[lo:hi].tolist(),
                           c.size[lo:hi].tolist(), [KIND_NAMES[k] for k in c.kind[lo:hi].tolist()],
                           c.policy[lo:hi].tolist())

    def stream_peaks(self):
        """{stream: its peak of live bytes}, when events carry streams."""
        c = self.columns
        if c.stream is None:
            return {}
        live, peaks = {}, {}
        for (a, _, size, _, _), st in zip(self.rows(), c.stream.tolist()):
            live[st] = live.get(st, 0) + (size if a else -size)
            peaks[st] = max(peaks.get(st, 0), live[st])
        return peaks

    def _live_curve(self):
        """Live bytes after each event (int64; None if sizes could overflow it)."""
        c = self.columns
        if len(c.size) and int(c.size.max()) >= 1 << 62:
            return None
        signed = c.size.astype(np.int64)
        np.negative(signed, out=signed, where=c.alloc == 0)
        return np.cumsum(signed)

    def peak_index(self):
        """The event at which live bytes first reach their peak (-1: none)."""
        curve = self._live_curve()
        if curve is None:
            return self._peak_slow()[1]
        if not len(curve) or curve.max() <= 0:
            return -1
        return int(np.argmax(curve))

    def peak_live(self):
        curve = self._live_curve()
        if curve is None:
            return self._peak_slow()[0]
        return max(int(curve.max()), 0) if len(curve) else 0

    def _peak_slow(self):
        live = peak = 0
        at = -1
        for i, (a, _, size, _, _) in enumerate(self.rows()):
            live += size if a else -size
            if live > peak:
                peak, at = live, i
        return peak, at


class _EventView(Sequence):
    """Trace.events: Event records made from the columns on demand."""

    def __init__(self, columns):
        self._c = columns

    def __len__(self):
        return len(self._c.alloc)

    def _event(self, i):
        c = self._c
        return Event("a" if c.alloc[i] else "f", int(c.ids[i]), int(c.size[i]),
                     KIND_NAMES[c.kind[i]], int(c.policy[i]),
                     int(c.line[i]) if c.line is not None else i + 2,
                     int(c.stream[i]) if c.stream is not None else 0)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._event(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("trace event index out of range")
        return self._event(i)

    def __iter__(self):
        c = self._c
        for lo in range(0, len(c.alloc), _BLOCK):
            hi = lo + _BLOCK
            lines = c.line[lo:hi].tolist() if c.line is not None else range(lo + 2, hi + 2)
            streams = c.stream[lo:hi].tolist() if c.stream is not None else [0] * len(lines)
            for a, ident, size, k, pol, line, st in zip(
                    c.alloc[lo:hi].tolist(), c.ids[lo:hi].tolist(), c.size[lo:hi].tolist(),
                    c.kind[lo:hi].tolist(), c.policy[lo:hi].tolist(), lines, streams):
                yield Event("a" if a else "f", ident, size, KIND_NAMES[k], pol, line, st)
