"""Device snapshots in PyTorch's memory-snapshot format, so that users read
them with the tools they know: the pickle that ``torch.cuda.memory._snapshot()``
produces (segments with their blocks, and per-device allocation traces), which
https://pytorch.org/memory_viz and ``torch.cuda._memory_viz`` render.

A segment is what PyTorch's allocator got from the driver; ascmem's
equivalent is a run of whole pages the device holds (under live blocks or
slabs, or kept mapped: Device.segments()), so that the segments add up to
memory_stats()' reserved bytes.  The free parts of a segment (a slab's free
slots, the rest of a shared page) become inactive blocks.
"""

import pickle

from ascmem._core import kind_table



def _block(addr, size, requested, state):
    return {"address": addr, "size": size, "requested_size": requested, "state": state,
            "frames": []}


def segment_blocks(device):
    """(segment, blocks) for each run of pages the device holds
    (Device.segments()): blocks are PyTorch's block dicts covering the
    segment, "active_allocated" for the live blocks in it and "inactive" for
    the free spans between them."""
    blocks = device.snapshot()  # address order, as the segments
    i = 0
    for seg in device.segments():
        base, end = seg["address"], seg["address"] + seg["size"]
        while i < len(blocks) and blocks[i]["address"] < base:
            i += 1  # a sleeping block of a paged kind: it holds no page
        out, at = [], base
        while i < len(blocks) and blocks[i]["address"] < end:
            b = blocks[i]
            i += 1
            if b["address"] + b["size"] > end:  # asleep, its edge page held by a neighbour
                continue
            if b["address"] > at:
                out.append(_block(at, b["address"] - at, 0, "inactive"))
            out.append(_block(b["address"], b["size"], b["requested"], "active_allocated"))
            at = b["address"] + b["size"]
        if end > at:
            out.append(_block(at, end - at, 0, "inactive"))
        yield seg, out


def to_torch(device, history=(), stream=0, limit=None):
    """The snapshot dict of a Device; ``history``: (action, addr, size) tuples,
    action "alloc" or "free", oldest first; limit: keep only the last that
    many (default: all -- PyTorch's _record_memory_history keeps all too
    unless told a max_entries)."""
    segments = []
    kinds = kind_table()
    for seg, out in segment_blocks(device):
        active = [b for b in out if b["state"] == "active_allocated"]
        page = kinds[seg["kind"]]["page_size"]
        segments.append({
            "device": device.device_id, "address": seg["address"], "total_size": seg["size"],
            "stream": stream, "segment_type": "large" if page > 4096 else "small",
            "segment_pool_id": (0, 0), "allocated_size": sum(b["size"] for b in active),
            "active_size": sum(b["size"] for b in active),
            "requested_size": sum(b["requested_size"] for b in active), "is_expandable": False,
            "frames": [], "blocks": out, "memory_kind": seg["kind"].name.lower(),
        })
    trace = []
    history = list(history or ())
    for i, (action, addr, size) in enumerate(history[-limit:] if limit else history):
        if action == "free":  # PyTorch logs a free as requested, then completed
            trace.append({"action": "free_requested", "addr": addr, "size": size,
                          "stream": stream, "frames": [], "time_us": i})
            action = "free_completed"
        trace.append({"action": action, "addr": addr, "size": size, "stream": stream,
                      "frames": [], "time_us": i})
    traces = [[] for _ in range(device.device_id + 1)]
    traces[device.device_id] = trace
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": {"source": "ascmem", "model": device.profile.name,
                                   "mode": device.mode}}


def save_torch(device_or_snapshot, path, history=()):
    """Writes the snapshot pickle of a Device (or a dict from to_torch)."""
    snap = device_or_snapshot if isinstance(device_or_snapshot, dict) else \
        to_torch(device_or_snapshot, history)
    with open(path, "wb") as f:
        pickle.dump(snap, f)
    return path
