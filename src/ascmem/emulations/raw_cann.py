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
    name: bytes}}; with curve, "curve": device bytes held after each event.
    Over the trace's columns, one route per distinct request; peak_by_event
    is the same rule event by event (for ids that are not integers)."""
    if trace.columns.ids.dtype != "int64":
        return peak_by_event(trace, device, curve)
    import numpy as np
    from ascmem.trace.data import KIND_NAMES
    c = trace.columns
    allocs = np.flatnonzero(c.alloc)
    # one route per distinct (size, kind, policy): the route depends on nothing else
    sizes = c.size[allocs]
    requests = c.policy[allocs].astype(np.uint64) << np.uint64(3) | c.kind[allocs]
    order = np.lexsort((requests, sizes))
    by_size, by_request = sizes[order], requests[order]
    new = np.ones(len(order), bool)
    new[1:] = (by_size[1:] != by_size[:-1]) | (by_request[1:] != by_request[:-1])
    which = np.empty(len(order), np.int64)
    which[order] = np.cumsum(new) - 1  # each allocation's distinct request
    firsts = order[new]
    routed = [pages_of(device, size, KIND_NAMES[request & 7], request >> 3)
              for size, request in zip(sizes[firsts].tolist(), requests[firsts].tolist())]
    route_kind = np.array([int(k) for k, _ in routed], np.int8).reshape(-1)
    route_bytes = np.array([n for _, n in routed], np.int64).reshape(-1)
    # each event's allocation's ordinal: its own, or the one a free gives back (-1: none live)
    slots = trace.slots()
    counted = slots >= 0
    route = which[slots[counted]]
    kinds = np.full(len(slots), -1, np.int8)
    kinds[counted] = route_kind[route]
    delta = np.zeros(len(slots), np.int64)
    delta[counted] = route_bytes[route]
    np.negative(delta, out=delta, where=c.alloc == 0)
    del route
    device_bytes = counted & ((kinds != int(MemKind.HOST)) | (device.mode == "RC"))
    held = np.where(device_bytes, delta, 0)
    del device_bytes
    np.cumsum(held, out=held)
    per_kind = {}
    seen = sorted((int(np.argmax(kinds == k)), k) for k in np.unique(kinds[counted]).tolist())
    for _, k in seen:  # in the order the kinds first held a block
        mine = kinds == k
        per_kind[MemKind(k).name.lower()] = max(0, int(np.cumsum(delta[mine]).max()))
    out = {"peak": max(0, int(held.max())) if len(held) else 0, "per_kind_peak": per_kind}
    if curve:
        out["curve"] = held.tolist()
    return out


def peak_by_event(trace, device, curve=False):
    """peak(), event by event."""
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
