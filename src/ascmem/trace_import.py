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

import io
import json
import pickle

from ascmem.errors import InvalidArgumentError

# c10::DeviceType values the profiler writes as "Device Type"
DEVICE_TYPES = {0: "cpu", 1: "cuda", 20: "npu"}  # 20: PrivateUse1, torch_npu's


class ImportedTrace:
    """What an importer found: the events (op, size, address-free ids) and
    what it had to leave out."""

    def __init__(self, events, device, skipped_frees=0, reserved_peak=None):
        self.events = events              # [(op, id, size)]
        self.device = device              # "cpu", "cuda:0", ...
        self.skipped_frees = skipped_frees
        self.reserved_peak = reserved_peak


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


def _pair(steps):
    """Pairs (addr, delta[, stream]) steps by address into ascmem events
    (op, id, size, stream); a free carries its allocation's stream."""
    live, events, next_id, skipped = {}, [], 0, 0
    for step in steps:
        addr, delta = step[0], step[1]
        stream = step[2] if len(step) > 2 else 0
        if delta > 0:
            if addr in live:  # the profiler missed a free: the old block ends here
                old_id, old_size, old_stream = live.pop(addr)
                events.append(("f", old_id, old_size, old_stream))
            live[addr] = (next_id, delta, stream)
            events.append(("a", next_id, delta, stream))
            next_id += 1
        elif delta < 0:
            block = live.pop(addr, None)
            if block is None:
                skipped += 1  # allocated before recording started
                continue
            events.append(("f",) + block)
    return events, skipped


def from_chrome(data, name, device=None):
    try:
        obj = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgumentError(f"{name}: not a Chrome trace (invalid JSON: {exc})") from None
    events = obj.get("traceEvents") if isinstance(obj, dict) else obj
    if not isinstance(events, list):
        raise InvalidArgumentError(f"{name}: not a Chrome trace (no traceEvents list)")
    mem, counts = [], {}
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("name") != "[memory]":
            continue
        args = e.get("args") or {}
        try:
            addr, nbytes = int(args["Addr"]), int(args["Bytes"])
            dev = _device_name(int(args.get("Device Type", 0)), int(args.get("Device Id", -1)))
        except (KeyError, TypeError, ValueError):
            raise InvalidArgumentError(f"{name}: traceEvents[{i}]: a [memory] event without "
                                       f"Addr and Bytes") from None
        mem.append((float(e.get("ts", 0)), i, dev, addr, nbytes))
        counts[dev] = counts.get(dev, 0) + 1
    chosen = _pick_device(counts, device, name, "the Chrome trace")
    mem.sort(key=lambda m: (m[0], m[1]))  # the profiler's order; ties keep file order
    events, skipped = _pair((m[3], m[4]) for m in mem if m[2] == chosen)
    return ImportedTrace(events, chosen, skipped)


def _stream_of(entry):
    """A snapshot entry's stream (an int: the handle's value), 0 if none."""
    try:
        return int(entry.get("stream", 0) or 0) & 0x7FFFFFFFFFFFFFFF
    except (TypeError, ValueError):
        return 0


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers only."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing {module}.{name}: a memory snapshot holds plain "
                                     f"data only")


def from_snapshot(data, name, device=None):
    try:
        obj = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # a pickle can fail in many ways; all mean the same here
        raise InvalidArgumentError(f"{name}: not a PyTorch memory snapshot ({exc})") from None
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
    trace = traces[int(chosen.split(":")[1])]
    completes = any(e.get("action") == "free_completed" for e in trace if isinstance(e, dict))
    free_action = "free_completed" if completes else "free_requested"
    steps, reserved, reserved_peak = [], 0, 0
    for e in trace:
        if not isinstance(e, dict):
            continue
        action, addr, size = e.get("action"), e.get("addr"), e.get("size", 0)
        if action == "alloc":
            steps.append((addr, int(size), _stream_of(e)))
        elif action == free_action:
            steps.append((addr, -int(size) or -1))
        elif action in ("segment_alloc", "segment_map"):
            reserved += int(size)
            reserved_peak = max(reserved_peak, reserved)
        elif action in ("segment_free", "segment_unmap"):
            reserved -= int(size)
    events, skipped = _pair(steps)
    return ImportedTrace(events, chosen, skipped, reserved_peak or None)
