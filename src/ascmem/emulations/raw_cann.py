"""What a trace would cost if every request went to the CANN runtime itself
(raw aclrtMalloc, acldvppMalloc, aclrtMallocHost): the runtime hands each
call whole pages of the memory it lands in -- 2 MiB huge pages (the driver's
huge-page allocations, hicann/runtime src/runtime/driver/npu_driver_mem.cc
DevMemAllocHugePageManaged; acldvppMalloc memory is huge-page memory too),
1 GiB pages for the HUGE1G policies, 4 KiB normal pages -- so two small
blocks never share a page.  ascmem packs blocks into pages; this is the
figure it is compared with (the "cann-raw" peer).

Each request is sized as the runtime sizes it and lands in the first kind
its policy routes to (Device.route); a fallback to normal pages when huge
ones run short is not modelled.
"""

from ascmem.rules import MemKind

_PAGE = {MemKind.HUGE: 2 << 20, MemKind.DVPP: 2 << 20, MemKind.HUGE1G: 1 << 30,
         MemKind.NORMAL: 4 << 10, MemKind.HOST: 4 << 10}


def request_of(kind, policy):
    """(call, policy) of a trace event's kind and policy, as Device calls
    take them: a trace that says a block sat in huge (normal) pages and
    gives no policy asks for HUGE_ONLY (NORMAL_ONLY)."""
    if kind == "dvpp":
        return "dvpp_malloc", 0
    if kind == "host":
        return "malloc_host", 0
    if kind == "huge" and not policy:
        policy = 1
    elif kind == "normal" and not policy:
        policy = 2
    return "malloc", policy


def pages_of(device, size, kind, policy):
    """(kind, bytes in whole pages) raw CANN would hand out for an
    allocation of size bytes of this trace kind and policy."""
    call, policy = request_of(kind, policy)
    r = device.route(size, policy, call)
    got = r["kinds"][0]
    page = _PAGE[got]
    return got, (r["rounded"] + page - 1) // page * page


def peak(trace, device, curve=False):
    """The peak of device memory raw CANN calls would hold for trace on
    device's product: {"peak": bytes of device memory (host memory aside,
    except in RC mode where it is the device's), "per_kind_peak": {kind
    name: bytes}}; with curve, "curve": device bytes held after each event."""
    rc_host = device.mode == "RC"
    live, held, kind_held, kind_peak, top = {}, 0, {}, {}, 0
    points = [] if curve else None
    routed = {}  # (size, kind, policy) -> pages_of: the route depends on nothing else
    for is_alloc, ident, size, kind_name, policy in trace.rows():
        if is_alloc:
            key = (size, kind_name, policy)
            got = routed.get(key)
            if got is None:
                got = routed[key] = pages_of(device, size, kind_name, policy)
            kind, nbytes = got
            live[ident] = (kind, nbytes)
        else:
            entry = live.pop(ident, None)
            if entry is None:  # never allocated (not in a loaded trace): nothing changes
                if points is not None:
                    points.append(held)
                continue
            kind, nbytes = entry
            nbytes = -nbytes
        name = kind.name.lower()
        kind_held[name] = kind_held.get(name, 0) + nbytes
        kind_peak[name] = max(kind_peak.get(name, 0), kind_held[name])
        if kind != MemKind.HOST or rc_host:
            held += nbytes
            top = max(top, held)
        if points is not None:
            points.append(held)
    out = {"peak": top, "per_kind_peak": kind_peak}
    if points is not None:
        out["curve"] = points
    return out
