"""Statistics in the shapes people already read: PyTorch's
``torch.cuda.memory_stats()`` flat keys and ``memory_summary()`` table, and
an RMM-style statistics block (``with ascmem.statistics(dev) as s:``).

PyTorch's caching allocator has a small pool (blocks up to 1 MiB, in 2 MiB
segments) and a large pool; ascmem's nearest equivalents are the device's
normal-page pool (small: aclrtMalloc's HUGE_FIRST puts requests up to 1 MiB
there) and its huge-page pools (large: huge and 1 GiB pages).  Media (DVPP)
and host memory are not in PyTorch's figures and not in these.
"""

import dataclasses

_GROUPS = {"all": ("huge", "normal", "huge1g"), "small_pool": ("normal",),
           "large_pool": ("huge", "huge1g")}


def _sum(kinds, key):
    return sum(k.get(key, 0) for k in kinds)


def _reserved(k):
    """(current, peak, allocated, freed) bytes of physical memory a kind
    holds, as PyTorch counts what it has from the driver: pages with a live
    block (the pages the device budget is charged for), or mapped granules
    of a paged kind (kept ones included).  A kept granule was given but is
    still mapped: freed counts what left the mapping, taken minus mapped."""
    page = k["page_size"]
    taken, given = k["pages_taken"] * page, k["pages_given"] * page
    if "mapped" in k:
        return k["mapped"], k["peak_mapped"], taken, taken - k["mapped"]
    return k["pages_in_use"] * page, k["peak_pages"] * page, taken, given


def _inactive(dev):
    """Per kind: (count, bytes) of the free spans inside the pages the device
    holds (a slab's free slots, the rest of a page shared with a live block,
    empty spare slabs, kept granules): PyTorch's inactive split blocks, the
    snapshot's inactive blocks.  Whole free pages are not held, so none of
    these is releasable while its neighbours live."""
    from ascmem.snapshot import segment_blocks
    out = {}
    for seg, blocks in segment_blocks(dev):
        count, size = out.get(seg["kind"].name.lower(), (0, 0))
        for b in blocks:
            if b["state"] == "inactive":
                count, size = count + 1, size + b["size"]
        out[seg["kind"].name.lower()] = (count, size)
    return out


def allocated_and_reserved(dev):
    """(allocated current, allocated peak, reserved current, reserved peak)
    of memory_stats' "all" group, without its walk of the blocks."""
    stats = dev.stats()
    kinds = [stats[n] for n in _GROUPS["all"] if n in stats]
    reserved = [_reserved(k) for k in kinds]
    return (_sum(kinds, "used"), _sum(kinds, "peak_used"), sum(r[0] for r in reserved),
            sum(r[1] for r in reserved))


def memory_stats(dev):
    """A Device's statistics under ``torch.cuda.memory_stats()``'s key names
    (``allocated_bytes.all.current``, ``reserved_bytes.large_pool.peak``,
    ``num_ooms``, ...).  Peaks summed over several kinds or chunks are upper
    bounds, as PyTorch's sums of pools are.  Inactive split blocks are read
    from the held pages now; ascmem keeps no history of them, so their peak
    and allocated totals read as the current value and freed as 0 (a peak
    is never below its current value, nor a total below what is held)."""
    stats = dev.stats()
    inactive = _inactive(dev)
    out = {}
    for group, names in _GROUPS.items():
        kinds = [stats[n] for n in names if n in stats]
        reserved = [_reserved(k) for k in kinds]
        metrics = {
            "allocated_bytes": (_sum(kinds, "used"), _sum(kinds, "peak_used"),
                                _sum(kinds, "alloc_bytes"), _sum(kinds, "freed_bytes")),
            "requested_bytes": (_sum(kinds, "requested"), _sum(kinds, "peak_requested"),
                                _sum(kinds, "alloc_requested"), _sum(kinds, "freed_requested")),
            "allocation": (_sum(kinds, "live_count"), _sum(kinds, "peak_live_count"),
                           _sum(kinds, "alloc_count"), _sum(kinds, "free_count")),
            "segment": (_sum(kinds, "chunks"), _sum(kinds, "peak_chunks"),
                        _sum(kinds, "chunks_taken"), _sum(kinds, "chunks_given")),
            "reserved_bytes": tuple(sum(r[i] for r in reserved) for i in range(4)),
        }
        metrics["active_bytes"] = metrics["allocated_bytes"]  # freed blocks never linger
        metrics["active"] = metrics["allocation"]
        count = sum(inactive.get(n, (0, 0))[0] for n in names)
        size = sum(inactive.get(n, (0, 0))[1] for n in names)
        metrics["inactive_split_bytes"] = (size, size, size, 0)
        metrics["inactive_split"] = (count, count, count, 0)
        metrics["oversize_allocations"] = metrics["oversize_segments"] = (0, 0, 0, 0)
        for name, values in metrics.items():
            for stat, v in zip(("current", "peak", "allocated", "freed"), values):
                out[f"{name}.{group}.{stat}"] = v
    device = stats["device"]
    out.update({
        "num_alloc_retries": device["oom_retries"],
        "num_ooms": sum(stats[n]["failed_count"] for n in _GROUPS["all"] if n in stats),
        # allocations refused by the cap of set_memory_fraction (torch's count of
        # those refused by per_process_memory_fraction)
        "num_oom_rejections": device["oom_rejections"],
        "num_sync_all_streams": device["sync_all_streams"],
        "num_device_alloc": out["segment.all.allocated"],
        "num_device_free": out["segment.all.freed"],
        "max_split_size": -1,  # every block may be split
    })
    aligned = stats.get("aligned")
    if aligned:  # what align_tag costs: bytes beyond what the same calls would get unaligned
        for tag, a in [("all", {"padding_bytes": sum(a["padding_bytes"] for a in aligned.values()),
                                "peak_padding_bytes": sum(a["peak_padding_bytes"]
                                                          for a in aligned.values())})] + \
                [(f"tag:{t}", a) for t, a in aligned.items()]:
            out[f"alignment_padding_bytes.{tag}.current"] = a["padding_bytes"]
            out[f"alignment_padding_bytes.{tag}.peak"] = a["peak_padding_bytes"]
    return dict(sorted(out.items()))


def _fmt(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def memory_summary(dev):
    """The memory_stats of a Device as a table in the shape of
    ``torch.cuda.memory_summary()``: a row per metric and pool, columns for
    the current value, the peak, and the totals allocated and freed."""
    s = memory_stats(dev)
    width = 83  # the metric rows below
    inner = width - 4
    lines = ["|" + "=" * (width - 2) + "|",
             f"| {'ascmem memory summary: ' + dev.profile.name + ' ' + dev.mode + ', device ' + str(dev.device_id):<{inner}.{inner}} |",
             "|" + "-" * (width - 2) + "|",
             f"| {'Metric':<29}| {'Cur Usage':>10} | {'Peak Usage':>10} | {'Tot Alloc':>10} | "
             f"{'Tot Freed':>9} |",
             "|" + "=" * (width - 2) + "|"]
    for title, key, as_bytes in (("Allocated memory", "allocated_bytes", True),
                                 ("Requested memory", "requested_bytes", True),
                                 ("Reserved memory", "reserved_bytes", True),
                                 ("Non-releasable memory", "inactive_split_bytes", True),
                                 ("Allocations", "allocation", False),
                                 ("Reserved segments", "segment", False)):
        for group, label in (("all", title), ("large_pool", "      from large pool"),
                             ("small_pool", "      from small pool")):
            cells = [s[f"{key}.{group}.{stat}"] for stat in ("current", "peak", "allocated", "freed")]
            text = [_fmt(c) if as_bytes else str(c) for c in cells]
            lines.append(f"| {label:<29}| {text[0]:>10} | {text[1]:>10} | {text[2]:>10} | "
                         f"{text[3]:>9} |")
        lines.append("|" + "-" * (width - 2) + "|")
    tail = (f"OOMs: {s['num_ooms']}, alloc retries: {s['num_alloc_retries']}, "
            f"device allocs / frees: {s['num_device_alloc']} / {s['num_device_free']}")
    lines.append(f"| {tail:<{inner}.{inner}} |")
    lines.append("|" + "=" * (width - 2) + "|")
    return "\n".join(lines)


@dataclasses.dataclass
class Statistics:
    """What happened inside a ``with ascmem.statistics(...)`` block: bytes
    (usable, after rounding) and counts of allocations.  current: the net
    change; peak: the most held above the start at any moment; total: all
    allocated in the block."""
    current_bytes: int = 0
    peak_bytes: int = 0
    total_bytes: int = 0
    current_count: int = 0
    peak_count: int = 0
    total_count: int = 0


def _totals(target):
    """(used, peak_used, alloc_bytes, live_count, peak_live_count, alloc_count)
    of a Pool, or of a Device's aclrtMalloc kinds."""
    if hasattr(target, "memory_stats"):
        s = memory_stats(target)
        return (s["allocated_bytes.all.current"], s["allocated_bytes.all.peak"],
                s["allocated_bytes.all.allocated"], s["allocation.all.current"],
                s["allocation.all.peak"], s["allocation.all.allocated"])
    s = target.stats()
    return (s["used"], s["peak_used"], s["alloc_bytes"], s["live_count"], s["peak_live_count"],
            s["alloc_count"])


class statistics:
    """``with ascmem.statistics(pool_or_device) as s:`` -- s (a Statistics)
    holds the bytes and counts of the block once it ends (as RMM's
    statistics adaptor does).  Entering resets the target's peak statistics
    to its current use (reset_peaks), so that the block's peak can be read."""

    def __init__(self, target):
        self.target = target
        self.result = Statistics()

    def __enter__(self):
        self.target.reset_peaks()
        self._start = _totals(self.target)
        return self.result

    def __exit__(self, *exc):
        used0, _, alloc0, live0, _, count0 = self._start
        used, peak, alloc, live, peak_live, count = _totals(self.target)
        r = self.result
        r.current_bytes, r.peak_bytes, r.total_bytes = used - used0, max(0, peak - used0), alloc - alloc0
        r.current_count, r.peak_count, r.total_count = live - live0, max(0, peak_live - live0), count - count0
        return False
