# What a Device tells its user when something goes wrong or needs care:
# out-of-memory messages, bad-pointer messages, the precaution warnings the C
# device reports as events.  Included by _core.pyx.

_CAUSE_TEXT = {
    ASCM_EVENT_HUGE_FALLBACK: "a HUGE_FIRST request above 1 MiB found no huge pages and got "
                              "normal pages instead",
    ASCM_EVENT_RESERVE_FULL: "the huge-page reserve is used up and cannot grow in RC mode",
    ASCM_EVENT_MEDIA_90: "the media (DVPP) address window is more than 90% full",
}
cdef uint64_t _NO_DEVICE_HAS = 1ull << 62  # larger requests fail in routing (no wrap with the guard)


cdef _notice_events(Device dev, int events):
    """Counts HUGE_FIRST fallbacks and warns once per device about each
    precaution the C device reported (ASCM_EVENT_*)."""
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    if events & ASCM_EVENT_HUGE_FALLBACK:
        parts.counters["huge_fallbacks"] += 1
    for cause in (ASCM_EVENT_HUGE_FALLBACK, ASCM_EVENT_RESERVE_FULL, ASCM_EVENT_MEDIA_90):
        if events & cause and cause not in parts.warned:
            parts.warned.add(cause)
            warnings.warn(f"device {dev.device_id}: {_CAUSE_TEXT[cause]}",
                          PrecautionWarning, stacklevel=1)  # the caller's line: no Python frame between


cdef str _bad_pointer(Device dev, uint64_t ptr, int kind, str call, unsigned mask):
    if kind < 0:
        return (f"{call}: {ptr:#x} is not memory of device {dev.device_id} (foreign, or from "
                f"before a reset)")
    if not (mask >> kind) & 1:
        return f"{call}: {ptr:#x} is {MemKind(kind).name} memory; free it with its own call"
    return f"{call}: {ptr:#x} is not the start of a live block (double free or interior pointer)"


cdef dict _oom_info(Device dev, uint64_t size, int kind):
    """What an on_out_of_memory callback is told."""
    cdef ascm_stats s
    cdef bint has = kind >= 0 and ascm_device_has_kind(dev._d, kind)
    if has:
        ascm_device_kind_stats(dev._d, kind, &s)
    return {"kind": MemKind(kind) if kind >= 0 else None, "size": size,
            "free": s.free if has else 0, "largest_free": s.largest_free if has else 0,
            "pending_bytes": (<_DeviceParts>dev._parts).ledger.pending_bytes}


cdef _raise_alloc_failure(Device dev, int st, uint64_t size, object policy, int kind, str call):
    """The exception for an allocation that failed with status st; an
    out-of-memory one says what is free, cached, waiting and charged."""
    if st == ASCM_ERR_UNSUPPORTED:
        raise UnsupportedError(f"policy {_rules.policy_name(policy)} is not supported on "
                               f"{dev.profile.title}")
    if st == ASCM_ERR_INVAL:
        raise InvalidArgumentError(f"{call}: size must be at least 1 byte")
    if st == ASCM_ERR_CLOSED:
        raise _closed_error(dev, call)
    if kind < 0 and size > _NO_DEVICE_HAS:
        raise OutOfMemoryError(f"{call}({size}): larger than the memory of any device")
    name = MemKind(kind).name if 0 <= kind < ASCM_KINDS else "?"
    if not (0 <= kind < ASCM_KINDS and ascm_device_has_kind(dev._d, kind)):
        raise OutOfMemoryError(f"{call}({size}): this device has no {name} memory")
    cdef ascm_stats s
    ascm_device_kind_stats(dev._d, kind, &s)
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    from ascmem import oom as _oom
    pname = _rules.policy_name(policy)
    try:
        route = dev.route(size, policy or 0, call)
        rounded, kinds = route["rounded"], route["kinds"]
    except AscmemError:  # a call route() does not know: the size as asked
        rounded, kinds = size, [MemKind(kind)]
    page = s.page_size  # a paged pool's granule, else the kind's page
    if st == ASCM_ERR_BUDGET:
        need, huge = (rounded + page - 1) // page * page, bool(ascm_kind(kind).huge)
        why = _oom.budget_refusal(dev.budget(), huge, need)
        if _oom.CAP in _oom.limits_broken(dev.budget(), huge, need):
            parts.counters["oom_rejections"] += 1  # torch's num_oom_rejections
    else:
        why = _oom.range_refusal(name, rounded, s.capacity, s.free, s.largest_free)
    b = dev.budget()
    upstream = parts.growth.describe(kind, ascm_device_chunk_count(dev._d, kind))
    raise OutOfMemoryError(
        f"{call}({size}, policy={pname}): out of {name} memory: {why}; "
        f"{_oom.asked(size, pname, kinds, name)}; "
        f"{_fmt_bytes(s.free)} of the {name} range free, largest free block "
        f"{_fmt_bytes(s.largest_free)}; {_fmt_bytes(parts.ledger.pending_bytes)} waiting on "
        f"streams{upstream}; device budget: {_fmt_bytes(b['huge_used'])} huge + "
        f"{_fmt_bytes(b['normal_used'])} normal + {_fmt_bytes(b['fixed'])} runtime of "
        f"{_fmt_bytes(b['total'])}")
