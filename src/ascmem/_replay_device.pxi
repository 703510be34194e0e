# Trace replay through a Device over columns (ascmem.trace.replay's path for
# a Device, and so `ascmem replay` and `ascmem plan`'s ascmem footprint): one
# compiled loop over the events.  Each allocation makes the C device's one
# try inline, as Device.malloc does; a try that fails or reports a
# precaution event goes on in the Device's own general path (_alloc), so
# retries, warnings and the out-of-memory error are the ones a caller of
# Device.malloc gets.  Frees take the Device's inline free, or its general
# path when streams, views or tags have a say.  Included by _core.pyx after
# _replay.pxi (it uses its slot table and _NOT_LIVE).

# a trace's kind codes (ascmem.trace.data.KIND_NAMES): "", huge, normal, dvpp, host
cdef enum:
    _TK_ANY = 0
    _TK_HUGE = 1
    _TK_NORMAL = 2
    _TK_DVPP = 3
    _TK_HOST = 4


cdef inline int _request_mode(uint8_t kind, uint32_t policy, uint32_t *pol) noexcept nogil:
    """The Device call an event of this kind and policy makes, as
    ascmem.emulations.raw_cann.request_of says (its size mode; the policy in pol): huge
    (normal) pages with no policy ask for HUGE_ONLY (NORMAL_ONLY)."""
    if kind == _TK_DVPP:
        pol[0] = 0
        return ASCM_SIZE_DVPP
    if kind == _TK_HOST:
        pol[0] = 0
        return ASCM_SIZE_HOST
    if kind == _TK_HUGE and policy == 0:
        policy = 1
    elif kind == _TK_NORMAL and policy == 0:
        policy = 2
    pol[0] = policy
    return ASCM_SIZE_MALLOC


cdef inline unsigned _free_mask(uint8_t kind):
    if kind == _TK_DVPP:
        return _DVPP_MASK
    if kind == _TK_HOST:
        return _HOST_MASK
    return _DEVICE_MASK


cdef inline str _free_call(uint8_t kind):
    return "dvpp_free" if kind == _TK_DVPP else "free_host" if kind == _TK_HOST else "free"


cdef inline str _alloc_call(int mode):
    return ("dvpp_malloc" if mode == ASCM_SIZE_DVPP else "malloc_host" if mode == ASCM_SIZE_HOST
            else "malloc")


cdef inline bint _inline_free(_DeviceParts parts):
    """Whether a free takes the Device's inline path (see _device_free)."""
    return not (parts.ledger.tracked or parts.views.live or parts.tags.tracked or parts.general)


cdef inline uint64_t _pages_in_use(ascm_device *d) noexcept:
    """What plan's footprint counts after an event: huge and normal pages."""
    cdef ascm_budget b
    ascm_device_budget(d, &b)
    return b.huge_used + b.normal_used


def replay_device(Device dev, alloc, slot, size, kind, policy, bint stop_at_failure=False,
                  bint curve=False, progress=None, Py_ssize_t block=1 << 18):
    """Plays a trace's columns through dev as replay() does with a Device
    (kinds and policies honoured).  Returns a dict: peak_live, peak_used,
    failures, first_failure (the event index, or -1), first_error (its
    OutOfMemoryError), kind_peaks ([(kind code, peak)] in the order the
    kinds first held a block), curve (with curve: huge + normal pages in use
    after each event that changed something, an int64 array; else None),
    peak_pages (the most huge + normal pages in use after any event).
    Everything still live at the end is then freed.  progress(i, n) is
    called between blocks of events."""
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    _require_open(dev, "replay")
    if parts.general or parts.mapper is not None:
        raise UnsupportedError("replay_device: a device in debug mode or with a mapper replays "
                               "through its Python API")
    np = _numpy()
    cdef const uint8_t[::1] al
    cdef const int64_t[::1] sl
    cdef const uint64_t[::1] sz
    cdef const uint8_t[::1] kd
    cdef const uint32_t[::1] po
    from ascmem._replay_peers import check_columns
    check_columns("replay_device", (("alloc", alloc, "uint8"), ("slot", slot, "int64"),
                                    ("size", size, "uint64"), ("kind", kind, "uint8"),
                                    ("policy", policy, "uint32")))
    al, sl, sz, kd, po = alloc, slot, size, kind, policy
    cdef Py_ssize_t n = al.shape[0], slots = 0, i, points = 0, stop
    for i in range(n):
        slots += al[i]
    ptrs = np.full(slots + 1, _NOT_LIVE, np.uint64)
    helds = np.zeros(slots + 1, np.uint64)
    cdef uint64_t[::1] ptr = ptrs
    cdef uint64_t[::1] held = helds
    cdef int64_t[::1] pts
    out_curve = None
    if curve:
        out_curve = np.empty(n, np.int64)
        pts = out_curve
    cdef int64_t live = 0, used = 0, peak_live = 0, peak_used = 0, nb, s, pages, peak_pages = 0
    cdef int64_t kind_live[8]
    cdef int64_t kind_peak[8]
    memset(kind_live, 0, sizeof(kind_live))
    memset(kind_peak, 0, sizeof(kind_peak))
    order = []
    cdef int seen = 0, st, got_kind, events, mode
    cdef uint8_t k
    cdef uint32_t pol
    cdef uint64_t addr, usable
    cdef uint64_t failures = 0
    cdef ascm_device *d = dev._d
    cdef ascm_pool *p
    first, first_error = -1, None
    i = 0
    try:
        while i < n:
            stop = min(i + block, n)
            while i < stop:
                s = sl[i]
                k = kd[i] & 7
                nb = <int64_t>sz[i]
                if al[i]:
                    if s < 0 or s >= slots:
                        raise InvalidArgumentError(f"event {i}: slot {s} is not an allocation's "
                                                   f"ordinal (0 to {slots - 1})")
                    mode = _request_mode(k, po[i], &pol)
                    events = 0
                    # the policy as Device._policy clamps it
                    st = ascm_device_try_malloc_held(d, sz[i], pol if pol < 0xFFFFFFFF else
                                                     0xFFFFFFFE, mode, &addr, &got_kind, &events)
                    if st != ASCM_OK or events:  # the Device's general path goes on from the try
                        try:
                            addr = _alloc(dev, sz[i], pol, mode, None, None, _alloc_call(mode),
                                          st, addr, got_kind, events)
                        except OutOfMemoryError as exc:
                            failures += 1
                            if first < 0:
                                first, first_error = i, exc
                            i += 1
                            if stop_at_failure:
                                i = n
                                break
                            continue
                    p = ascm_device_pool_at(d, addr, NULL)
                    if p is NULL or ascm_pool_requested_size(p, addr, &usable) != ASCM_OK:
                        raise CorruptionError(f"event {i}: the device has no block at the "
                                              f"{addr:#x} it handed out")
                    ptr[s] = addr
                    held[s] = usable
                    live += nb
                    used += <int64_t>usable
                    kind_live[k] += nb
                    if kind_live[k] > kind_peak[k]:
                        kind_peak[k] = kind_live[k]
                    if not seen & (1 << k):
                        seen |= 1 << k
                        order.append(k)
                    if live > peak_live:
                        peak_live = live
                    if used > peak_used:
                        peak_used = used
                elif 0 <= s < slots and ptr[s] != _NOT_LIVE:
                    addr = ptr[s]
                    if not _inline_free(parts) or \
                            ascm_device_free_held(d, addr, _free_mask(k), &got_kind) != ASCM_OK:
                        _device_free(dev, addr, _free_mask(k), None, _free_call(k))
                    ptr[s] = _NOT_LIVE
                    live -= nb
                    used -= <int64_t>held[s]
                    kind_live[k] -= nb
                else:  # its allocation failed: nothing changes, no point on the curve
                    i += 1
                    continue
                pages = <int64_t>_pages_in_use(d)
                if pages > peak_pages:
                    peak_pages = pages
                if curve:
                    pts[points] = pages
                    points += 1
                i += 1
            if progress is not None and i < n:
                progress(i, n)
    finally:
        for i in range(slots):  # give everything back, as replay() does
            if ptr[i] != _NOT_LIVE:
                addr = ptr[i]
                _device_free(dev, addr, _DEVICE_MASK | _DVPP_MASK | _HOST_MASK, None, "free")
    return {"peak_live": peak_live, "peak_used": peak_used, "failures": failures,
            "first_failure": first, "first_error": first_error,
            "kind_peaks": [(c, kind_peak[c]) for c in order], "peak_pages": peak_pages,
            "curve": out_curve[:points] if curve else None}
