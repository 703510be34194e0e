# The Device's one allocate path (malloc, malloc_align32, dvpp_malloc,
# malloc_host) and one free path (free, dvpp_free, free_host).  Each starts
# with an inline part that the common case never leaves -- no stream, no
# guard bytes, no view, no stream free in flight: one test of a typed field
# each -- and goes on in a general part.  Included by _core.pyx after
# _device.pxi.

# ---- the one allocate path -----------------------------------------------------

cdef inline int _alloc_first_try(Device dev, object size, object policy, int mode, object stream,
                                 object tag, uint64_t *addr, int *kind, int *events) except -2:
    """The first try of every Device allocation call, inline in each (its
    mode a constant): the C device's status, or -1 when a stream, a tag or
    debug mode needs the general path first.  _alloc goes on from it: the request
    is tried once, whatever path it takes."""
    if stream is not None or tag is not None or (<_DeviceParts>dev._parts).general:
        return -1
    return ascm_device_try_malloc_held(dev._d, as_u64(size, "size"), _policy(policy), mode, addr,
                                       kind, events)


cdef inline object _malloc(Device dev, object size, object policy, object stream, object tag,
                           int mode):
    """Device.malloc and malloc_align32 (mode ASCM_SIZE_MALLOC or _ALIGN32, a
    constant at each call)."""
    cdef uint64_t addr = 0
    cdef int kind = -1, events = 0
    cdef int st = _alloc_first_try(dev, size, policy, mode, stream, tag, &addr, &kind, &events)
    if st == ASCM_OK and not events:
        return addr
    return _alloc(dev, size, policy, mode, stream, tag,
                  "malloc" if mode == ASCM_SIZE_MALLOC else "malloc_align32", st, addr, kind, events)


cdef object _alloc(Device dev, object size, object policy, int mode, object stream, object tag,
                   str call, int st, uint64_t addr, int kind, int events, uint64_t align=0):
    """_alloc_body, holding the mapper's lock on a paged acl device."""
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    if parts.mapper is None:
        return _alloc_body(dev, size, policy, mode, stream, tag, call, st, addr, kind, events,
                           align)
    with parts.mapper.lock:
        return _alloc_body(dev, size, policy, mode, stream, tag, call, st, addr, kind, events,
                           align)


cdef object _alloc_body(Device dev, object size, object policy, int mode, object stream,
                        object tag, str call, int st, uint64_t addr, int kind, int events,
                        uint64_t align=0):
    """An allocation after _alloc_first_try, or the whole of one: st is the
    status of the first try of the whole size (-1: not tried yet).
    Same-stream reuse, then the C device, then the slow path (retries,
    out-of-memory error); guard bytes in debug mode; the tag.  align: the
    block's start and size on a multiple of it (0: the tag's, if any)."""
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    cdef uint64_t want, n = as_u64(size, "size")
    cdef ascm_pool *p
    cdef uint32_t pol = _policy(policy)
    if tag is not None:
        _check_tag(tag)
        if tag in parts.tags.sleeping:
            raise InvalidArgumentError(f"{call}: tag {tag!r} is asleep: wake it first")
        align = align or parts.tags.alignment_of(tag)  # an aligned group (align_tag)
    if align:
        if stream is not None:
            _check_stream(stream)  # a block freed on a stream fits other sizes: never reused here
        st = _try_malloc(dev, n, pol, mode, align, &addr, &kind, &events)
        want = n
    elif st == -1:
        if stream is not None:
            _check_stream(stream)
            # debug mode re-checks guard bytes at every real free: no reuse
            addr = parts.ledger.reuse(dev._d, stream, n, pol, mode) if parts.guards is None else 0
            if addr:
                if tag is not None:
                    _track_tag(dev, addr, tag)
                return addr
        # debug mode asks for the guard bytes too; a size no device has is
        # left as it is (routing refuses it) so that adding them cannot wrap, and
        # so is 0 (refused as ever: the guard bytes are not the caller's)
        want = n + _GUARD if parts.guards is not None and 0 < n <= _NO_DEVICE_HAS else n
        st = ascm_device_try_malloc_held(dev._d, want, pol, mode, &addr, &kind, &events)
    else:
        want = n
    if events:
        _notice_events(dev, events)
    if st != ASCM_OK:  # media and host calls take no policy: their messages show none
        addr = _alloc_slow(dev, st, want, pol, mode, kind,
                           policy if mode <= ASCM_SIZE_ALIGN32 else None, call, align)
    if not parts.apply_maps():  # acl, paged: the runtime refused physical memory
        p = ascm_device_pool_at(dev._d, addr, NULL)
        ascm_device_free_held(dev._d, addr, 0xFFFFFFFF, &kind)
        # A release threshold would keep the freed block's granules as mapped,
        # those the runtime refused among them, and the next block placed
        # there would be used unmapped (found by the Python fuzzer): every
        # kept granule of the pool goes instead (the mapper skips the ones it
        # never mapped).  The mapper's lock, held here, keeps other callers out.
        if p is not NULL:
            ascm_pool_trim(p)
        parts.apply_maps()
        raise OutOfMemoryError(f"{call}({n}): the runtime refused physical memory for the "
                               f"block's granules ({parts.mapper.error}); nothing stays mapped")
    if tag is not None:
        _track_tag(dev, addr, tag)
        if align:
            _join_aligned(dev, addr, tag, n, pol, mode)
    if parts.guards is not None and not align:  # guard bytes would break the size rule
        return parts.guards.place(addr, n)
    return addr


cdef inline int _try_malloc(Device dev, uint64_t size, uint32_t policy, int mode, uint64_t align,
                            uint64_t *addr, int *kind, int *events):
    """One try of the C device: aligned (an align_tag group) when align is not 0."""
    if align:
        return ascm_device_try_malloc_aligned_held(dev._d, size, policy, mode, align, addr, kind,
                                                   events)
    return ascm_device_try_malloc_held(dev._d, size, policy, mode, addr, kind, events)


cdef int _guard(Device dev, uint64_t addr) except -1:
    """This layer now tracks addr (a stream free, record_stream, a view, a
    tag): the GIL-free free (pluggable functions, free_raw, the capsule)
    refuses it until this layer frees it (ascm_device_guard).  Otherwise a
    block freed there would be freed again here once its stream is done --
    by then another caller's -- or written through a view, or put to sleep."""
    if ascm_device_guard(dev._d, addr) != ASCM_OK:
        _raise(ASCM_ERR_HOSTMEM, f"host memory for the device's record of {addr:#x} ran out")
    return 0


cdef int _track_tag(Device dev, uint64_t addr, object tag) except -1:
    """A new block joins tag's group; if it cannot be guarded, it is freed
    again and the error raised (nothing changed)."""
    cdef int kind
    try:
        _guard(dev, addr)
    except BaseException:
        ascm_device_free_held(dev._d, addr, 0xFFFFFFFF, &kind)
        (<_DeviceParts>dev._parts).apply_maps()
        raise
    (<_DeviceParts>dev._parts).tags.add(addr, tag)
    return 0


cdef uint64_t _alloc_slow(Device dev, int st, uint64_t size, uint32_t policy, int mode, int kind,
                          object policy_obj, str call, uint64_t align=0) except? 0:
    """The first try failed with st: waits out a reset in progress; on a
    lack of room frees what streams are done with and what is cached, then
    asks the user's callback; the request counts once as failed."""
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    cdef uint64_t addr
    cdef int events = 0
    while st == ASCM_ERR_CLOSED:  # resets in progress (raises once closed for good)
        _wait_reset(dev, call)
        st = _try_malloc(dev, size, policy, mode, align, &addr, &kind, &events)
    if st in (ASCM_ERR_NOMEM, ASCM_ERR_BUDGET):
        dev.process_events()
        ascm_device_trim(dev._d)
        st = _try_malloc(dev, size, policy, mode, align, &addr, &kind, &events)
        if st != ASCM_OK and parts.oom_callback is not None:
            if parts.oom_callback(_oom_info(dev, size, kind)):
                parts.counters["oom_retries"] += 1
                st = _try_malloc(dev, size, policy, mode, align, &addr, &kind, &events)
    if events:
        _notice_events(dev, events)
    if st == ASCM_OK:
        return addr
    if st in (ASCM_ERR_NOMEM, ASCM_ERR_BUDGET):
        ascm_device_count_failure(dev._d, kind)
    if st == ASCM_ERR_INVAL and align and size:  # a chunk (acl, grown) less aligned than the tag
        raise MisalignedError(f"{call}: the {MemKind(kind).name.lower() if kind >= 0 else ''} "
                              f"chunks the upstream handed out are not aligned to {align} bytes, "
                              f"the tag's alignment (align_tag)")
    _raise_alloc_failure(dev, st, size, policy_obj, kind, call)


cdef inline uint32_t _policy(object policy) except? 0xFFFFFFFF:
    if policy is 0:  # the default (a cached int): no conversion call
        return 0
    cdef uint64_t p = as_u64(policy, "policy")
    return <uint32_t>p if p < 0xFFFFFFFF else 0xFFFFFFFE  # still out of range, as CANN sees it


# ---- the one free path ------------------------------------------------------------

cdef inline int _device_free(Device dev, object ptr, unsigned mask, object stream,
                             str call) except -1:
    """The free path of every Device free call: inline when no stream, view,
    guard, tag or earlier stream free is involved (one test each); else
    _free_slow."""
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    cdef int kind, st
    cdef uint64_t a = as_u64(ptr, "pointer")
    if stream is not None or parts.ledger.tracked or parts.views.live or parts.tags.tracked or \
            parts.general:
        _free_slow(dev, a, mask, stream, call)
        return 0
    st = ascm_device_free_held(dev._d, a, mask, &kind)
    if st != ASCM_OK:
        if st == ASCM_ERR_CLOSED:
            st = _free_when_open(dev, a, mask, &kind, call)
        if st != ASCM_OK:
            _raise(st, _bad_pointer(dev, a, kind, call, mask))
    return 0


cdef _free_slow(Device dev, uint64_t addr, unsigned mask, object stream, str call):
    """A free that streams, views, tags, guard bytes or a mapper have a say in."""
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    with parts.map_lock():
        _free_slow_body(dev, addr, mask, stream, call)


cdef _free_slow_body(Device dev, uint64_t addr, unsigned mask, object stream, str call):
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    cdef int k = -1
    cdef uint64_t usable
    _require_open(dev, call)
    if stream is not None:
        _check_stream(stream)  # before anything changes
    cdef ascm_pool *p = ascm_device_pool_at(dev._d, addr, &k)
    if parts.ledger.waits(addr):
        raise InvalidFreeError(f"{call}: {addr:#x} was already freed and waits on a stream")
    if parts.views.of(addr):
        raise InvalidFreeError(f"{call}: {addr:#x} still has {parts.views.of(addr)} live buffer "
                               f"view(s); drop them (del / release()) before freeing")
    if p is NULL or not (mask >> k) & 1 or ascm_pool_usable_size(p, addr, &usable) != ASCM_OK:
        _raise(ASCM_ERR_BADFREE, _bad_pointer(dev, addr, k, call, mask))
    _refuse_exported(parts, addr, call)
    awake = parts.tags.asleep_tag(addr) is None
    parts.tags.forget(addr)  # the block is no longer the caller's, whenever it is freed
    if stream is not None:  # it may wait for the stream: guarded until then (free_held drops it);
        _guard(dev, addr)   # blocks record_stream'd or tagged are guarded already
    if parts.guards is not None and not awake:
        parts.guards.overrun(addr, False)  # unmapped: its guard bytes cannot be read, now or later
    if parts.ledger.defer(addr, mask, stream, usable, k):
        return
    # guard bytes are read before the free, which may unmap the block (paged)
    problem = parts.guards.overrun(addr, True) if parts.guards is not None else None
    _free_when_open(dev, addr, mask, &k, call)
    parts.apply_maps()
    if problem is not None:
        raise CorruptionError(problem)


cdef _free_released(Device dev, list blocks):
    """Frees the (address, mask) pairs the stream ledger let go.  A reset
    meanwhile made them stale: that BADFREE is ignored.  Guard bytes are
    checked after all are freed."""
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    cdef int k
    # read before the frees, which may unmap the blocks (a sleeping block's
    # record was dropped when it was freed to its stream)
    problems = [parts.guards.overrun(addr, True) for addr, _ in blocks] \
        if parts.guards is not None else []
    with parts.map_lock():
        for addr, mask in blocks:
            _free_when_open(dev, addr, mask, &k, "synchronize")
        parts.apply_maps()
    for problem in problems:
        if problem is not None:
            raise CorruptionError(problem)


cdef int _free_when_open(Device dev, uint64_t a, unsigned mask, int *kind, str call) except -1:
    """A free the gate may refuse: waits out resets in progress (raises once
    the device is closed for good) and frees; returns the status."""
    cdef int st = ascm_device_free_held(dev._d, a, mask, kind)
    while st == ASCM_ERR_CLOSED:
        _wait_reset(dev, call)
        st = ascm_device_free_held(dev._d, a, mask, kind)
    return st


cdef int _wait_reset(Device dev, str call) except -1:
    """The C device refused with ASCM_ERR_CLOSED: raises if it is closed,
    else waits (without the GIL) for the reset in progress to end."""
    cdef int st
    _require_open(dev, call)
    with nogil:
        st = ascm_device_wait_open(dev._d)
    if st != ASCM_OK:
        raise _closed_error(dev, call)
    return 0


cdef _closed_error(Device dev, str call):
    """The DeviceClosedError of a call on a closed device, with why when it
    was not close() (a fork child's copy: _disown_after_fork)."""
    return DeviceClosedError(f"{call}: device {dev.device_id} is closed"
                             f"{(<_DeviceParts>dev._parts).closed_why}")


cdef int _require_open(Device dev, str call) except -1:
    if (<_DeviceParts>dev._parts).closed:
        raise _closed_error(dev, call)
    return 0


cdef uint64_t _discard_free_pages(ascm_device *d, int k):
    """Host memory: the pages of kind k's fully free spans back to the OS
    (MADV_DONTNEED); returns the resident bytes that were given back."""
    cdef uint64_t page = ascm_kind(k).page_size, released = 0, lo, hi
    cdef ascm_pool *p
    for i in range(ascm_device_chunk_count(d, k)):
        p = ascm_device_chunk(d, k, i, NULL, NULL)
        if p is NULL:
            continue
        for addr, size, _ in _pool_blocks(p, True):
            lo = (addr + page - 1) // page * page
            hi = (addr + size) // page * page
            if hi > lo:
                released += ascm_os_resident(lo, hi - lo)
                ascm_os_discard(lo, hi - lo)
    return released
