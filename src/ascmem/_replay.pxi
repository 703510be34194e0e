# Trace replay over columns (ascmem.trace.replay's path for a Pool and a
# BuddyAllocator): the whole loop in C, no Python call per event.  The
# columns come from ascmem.trace.data.Columns; slot pairs each free with its
# allocation (replay_slots), so live blocks sit in an array, not a dict.

from libc.stdint cimport uint8_t
from libc.stdlib cimport calloc, malloc


cdef struct _IdSlot:
    int64_t id
    int64_t slot    # -1: empty; -2: a removed entry


cdef inline uint64_t _id_hash(int64_t key) noexcept nogil:
    cdef uint64_t h = <uint64_t>key * <uint64_t>0x9E3779B97F4A7C15
    return h ^ (h >> 29)


cdef int _slots(const uint8_t[::1] alloc, const int64_t[::1] ids, int64_t[::1] out) noexcept nogil:
    """out[i]: the allocation's ordinal for an allocation, the ordinal of the
    live allocation of its id for a free (-1: none is live, a free the replay
    skips, as the dict-based replay does).  An id allocated again while live
    replaces the older one, as a dict does.  -1 on no memory."""
    cdef Py_ssize_t n = alloc.shape[0], i, j, k, cap = 1024, used = 0, live = 0, old_cap
    cdef int64_t next_slot = 0, key
    cdef uint64_t mask, h
    cdef _IdSlot *t = <_IdSlot *>malloc(cap * sizeof(_IdSlot))
    cdef _IdSlot *old
    if t is NULL:
        return -1
    for j in range(cap):
        t[j].slot = -1
    for i in range(n):
        key = ids[i]
        mask = cap - 1
        h = _id_hash(key) & mask
        while t[h].slot != -1 and not (t[h].slot >= 0 and t[h].id == key):
            h = (h + 1) & mask
        if alloc[i]:
            out[i] = next_slot
            if t[h].slot >= 0:
                t[h].slot = next_slot
            else:
                t[h].id = key
                t[h].slot = next_slot
                used += 1
                live += 1
            next_slot += 1
            if used * 2 > cap:  # rebuild without tombstones; double when the live set needs it
                old, old_cap = t, cap
                cap = cap * 2 if live * 4 > cap else cap
                t = <_IdSlot *>malloc(cap * sizeof(_IdSlot))
                if t is NULL:
                    free(old)
                    return -1
                for j in range(cap):
                    t[j].slot = -1
                mask = cap - 1
                for j in range(old_cap):
                    if old[j].slot >= 0:
                        k = _id_hash(old[j].id) & mask
                        while t[k].slot != -1:
                            k = (k + 1) & mask
                        t[k] = old[j]
                free(old)
                used = live
        else:
            if t[h].slot >= 0:
                out[i] = t[h].slot
                t[h].slot = -2
                live -= 1
            else:
                out[i] = -1
    free(t)
    return 0


def replay_slots(alloc, ids):
    """The slot column of a trace (see _slots): int64, one per event."""
    np = _numpy()
    cdef const uint8_t[::1] a = alloc
    cdef const int64_t[::1] d = ids
    out = np.empty(a.shape[0], np.int64)
    cdef int64_t[::1] o = out
    cdef int st
    with nogil:
        st = _slots(a, d, o)
    if st < 0:
        raise MemoryError("no memory for the replay's table of live ids")
    return out


cdef struct _ReplayState:
    int64_t live, used, peak_live, peak_used
    int64_t kind_live[8]
    int64_t kind_peak[8]
    uint64_t failures
    Py_ssize_t at          # the next event to play
    int kinds_seen


cdef inline int _arena_alloc(void *arena, bint buddy, uint64_t size, uint64_t *addr,
                             uint64_t *usable) noexcept nogil:
    cdef int st
    if buddy:
        st = ascm_buddy_alloc(<ascm_buddy *>arena, size, 64, addr)
        if st == ASCM_OK:
            st = ascm_buddy_usable_size(<ascm_buddy *>arena, addr[0], usable)
    else:
        st = ascm_pool_alloc(<ascm_pool *>arena, size, 64, addr)
        if st == ASCM_OK:
            st = ascm_pool_usable_size(<ascm_pool *>arena, addr[0], usable)
    return st


cdef inline int _arena_free(void *arena, bint buddy, uint64_t addr) noexcept nogil:
    if buddy:
        return ascm_buddy_free(<ascm_buddy *>arena, addr)
    return ascm_pool_free(<ascm_pool *>arena, addr)


cdef uint64_t _NOT_LIVE = <uint64_t>-1  # a slot with no live block


cdef Py_ssize_t _play(void *arena, bint buddy, const uint8_t[::1] alloc, const int64_t[::1] slot,
                      const uint64_t[::1] size, const uint8_t[::1] kind, uint64_t *ptr,
                      uint64_t *held, _ReplayState *s, Py_ssize_t stop, int *err) noexcept nogil:
    """Plays events s.at .. stop-1; returns at a refused allocation or free
    (its index, its status in err; s.at is past it) or at stop (-1)."""
    cdef Py_ssize_t i
    cdef int64_t sl, n
    cdef uint64_t addr, usable
    cdef int st
    cdef uint8_t k
    for i in range(s.at, stop):
        sl = slot[i]
        k = kind[i] & 7
        n = <int64_t>size[i]
        if alloc[i]:
            st = _arena_alloc(arena, buddy, size[i], &addr, &usable)
            if st != ASCM_OK:
                ptr[sl] = _NOT_LIVE
                s.at = i + 1
                err[0] = st
                return i
            ptr[sl] = addr
            held[sl] = usable
            s.live += n
            s.used += <int64_t>usable
            s.kind_live[k] += n
            if s.kind_live[k] > s.kind_peak[k]:
                s.kind_peak[k] = s.kind_live[k]
            s.kinds_seen |= 1 << k
            if s.live > s.peak_live:
                s.peak_live = s.live
            if s.used > s.peak_used:
                s.peak_used = s.used
        elif sl >= 0 and ptr[sl] != _NOT_LIVE:
            st = _arena_free(arena, buddy, ptr[sl])
            if st != ASCM_OK:
                err[0] = st
                s.at = i + 1
                return i
            ptr[sl] = _NOT_LIVE
            s.live -= n
            s.used -= <int64_t>held[sl]
            s.kind_live[k] -= n
    s.at = stop
    return -1


def replay_columns(arena, alloc, slot, size, kind, bint stop_at_failure=False, progress=None,
                   Py_ssize_t block=1 << 18):
    """Plays a trace's columns through a Pool or BuddyAllocator (align 64,
    as replay()).  Returns a dict: peak_live, peak_used, failures,
    first_failure (the event index, or -1), first_error (the exception the
    failed allocation raises through the Python API), kind_peaks ({kind
    code: peak}), stats (the arena's, as the trace ends).  Everything still
    live at the end is then freed.
    progress(i, n) is called between blocks of events."""
    cdef void *a
    cdef bint buddy
    if type(arena) is Pool:
        a = <void *>(<Pool>arena)._p
        buddy = False
    elif type(arena) is BuddyAllocator:
        a = <void *>(<BuddyAllocator>arena)._b
        buddy = True
    else:
        raise ArgumentTypeError(f"replay_columns needs a Pool or a BuddyAllocator, not "
                                f"{type(arena).__name__}")
    cdef const uint8_t[::1] al = alloc
    cdef const int64_t[::1] sl = slot
    cdef const uint64_t[::1] sz = size
    cdef const uint8_t[::1] kd = kind
    cdef Py_ssize_t n = al.shape[0], slots = 0, i, got, stop
    cdef int err = 0
    for i in range(n):
        slots += al[i]
    cdef uint64_t *ptr = <uint64_t *>malloc((slots + 1) * sizeof(uint64_t))
    cdef uint64_t *held = <uint64_t *>malloc((slots + 1) * sizeof(uint64_t))
    if ptr is NULL or held is NULL:
        free(ptr)
        free(held)
        raise MemoryError("no memory for the replay's table of live blocks")
    cdef _ReplayState s
    memset(&s, 0, sizeof(s))
    first, first_error = -1, None
    try:
        for i in range(slots):
            ptr[i] = _NOT_LIVE
        while s.at < n:
            stop = min(s.at + block, n)
            with nogil:
                got = _play(a, buddy, al, sl, sz, kd, ptr, held, &s, stop, &err)
            if got >= 0:
                if not al[got]:
                    raise CorruptionError(f"the replay's arena refused the free of event {got} "
                                          f"(status {err})")
                if first < 0 or err not in (ASCM_ERR_NOMEM, ASCM_ERR_BUDGET, ASCM_ERR_HOSTMEM):
                    # the same request through the Python API: the error it raises there
                    # (an out-of-memory one is a failure, any other propagates)
                    try:
                        arena.free(arena.alloc(int(sz[got]), 64))
                    except OutOfMemoryError as exc:
                        if first < 0:
                            first, first_error = got, exc
                    else:
                        raise CorruptionError(f"event {got}: the arena refused an allocation "
                                              f"(status {err}) it then made")
                err = 0
                s.failures += 1
                if stop_at_failure:
                    break
                continue
            if progress is not None:
                progress(s.at, n)
        end_stats = arena.stats()  # before the give-back, as replay() reads them
        for i in range(slots):  # give everything back, as replay() does
            if ptr[i] != _NOT_LIVE:
                _arena_free(a, buddy, ptr[i])
    finally:
        free(ptr)
        free(held)
    return {"peak_live": s.peak_live, "peak_used": s.peak_used, "failures": s.failures,
            "first_failure": first, "first_error": first_error, "stats": end_stats,
            "kind_peaks": {k: s.kind_peak[k] for k in range(8) if s.kinds_seen & (1 << k)}}
