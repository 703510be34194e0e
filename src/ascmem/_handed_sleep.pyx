# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: binding=False
# Sleep and wake of every live block of a paged Device, whoever allocated it:
# for callers outside the Python layer (torch through ascmem.torch), whose
# blocks the tag registry does not know.  A module of its own: it works on
# a Device's parts (_core.pxd) and calls the C core through its table
# (CoreCalls); ascmem._core re-exports its functions.

from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc as _c_malloc

from ascmem._core cimport (ASCM_ERR_INVAL, ASCM_FREE_DEVICE, ASCM_KINDS, ASCM_OK, CoreCalls,
                           Device, _DeviceParts, _require_open, ascm_device, ascm_pool, ascm_stats,
                           core_calls)

from ascmem.errors import OutOfMemoryError, UnsupportedError

cdef const CoreCalls *C = core_calls()


cdef struct _block_list:
    uint64_t *addr
    uint64_t *size
    size_t n, cap


cdef void _collect_block(void *ctx, uint64_t addr, uint64_t usable, uint64_t requested) noexcept nogil:
    # under the pool's lock: C only, no Python
    cdef _block_list *l = <_block_list *>ctx
    if l.n < l.cap:
        l.addr[l.n] = addr
        l.size[l.n] = usable
        l.n += 1


cdef list _live_blocks(ascm_device *d):
    """[(addr, usable)] of every live block of the kinds free() frees."""
    cdef ascm_stats st
    cdef _block_list l
    cdef ascm_pool *p
    out = []
    for k in range(ASCM_KINDS):
        if C.ascm_kind(k).freed_by != ASCM_FREE_DEVICE:
            continue
        for c in range(C.ascm_device_chunk_count(d, k)):
            p = C.ascm_device_chunk(d, k, c, NULL, NULL)
            if p is NULL:
                continue
            C.ascm_pool_stats(p, &st)
            l.cap = st.live_count + 64  # blocks allocated meanwhile by other threads are not this call's
            l.n = 0
            l.addr = <uint64_t *>_c_malloc(l.cap * sizeof(uint64_t))
            l.size = <uint64_t *>_c_malloc(l.cap * sizeof(uint64_t))
            try:
                if l.addr is NULL or l.size is NULL:
                    raise MemoryError()
                with nogil:
                    C.ascm_pool_walk(p, _collect_block, &l)
                out.extend((l.addr[i], l.size[i]) for i in range(l.n))
            finally:
                free(l.addr)
                free(l.size)
    return out


def _sleep_handed_out(Device dev, save):
    """Puts every live large block of a paged host Device to sleep (its pages
    go back to the OS, its address stays).  save: None (contents discarded)
    or save(addr, size) -> token, called before each block sleeps, which
    keeps the contents somewhere (a copy in this process would hold the
    resident memory the sleep gives back).  Returns (bytes given back,
    {addr: token} for _wake_handed_out).  Blocks in slab slots stay
    resident."""
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    cdef ascm_pool *p
    cdef uint64_t given, released = 0
    _require_open(dev, "sleep")
    if not parts.paged or not parts.up.readable:
        raise UnsupportedError("sleep of torch tensors needs a paged host Device "
                               "(Device(..., backend='host', paged=True))")
    saved = {}
    with parts.map_lock():
        for a, n in _live_blocks(dev._d):
            p = C.ascm_device_pool_at(dev._d, a, NULL)
            if p is NULL:
                continue
            # a slab slot (ascm_pool_sleep refuses it) stays; which blocks are
            # slots the pool's slab_max decided when each was placed
            if not C.ascm_pool_is_large_block(p, a):
                continue
            token = save(a, n) if save is not None else None
            if C.ascm_pool_sleep(p, a, &given) == ASCM_OK:
                saved[a] = token
                released += given
    return released, saved


def _wake_handed_out(Device dev, dict saved, load):
    """Maps the blocks _sleep_handed_out put to sleep again at their
    addresses, then load(addr, token) for each one whose contents were kept;
    all or nothing (OutOfMemoryError, still asleep).  A block freed while
    asleep is skipped.  Returns the bytes mapped."""
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    cdef ascm_pool *p
    cdef int st
    cdef uint64_t taken, mapped = 0
    _require_open(dev, "wake")
    woken = []
    with parts.map_lock():
        for a in saved:
            p = C.ascm_device_pool_at(dev._d, a, NULL)
            st = C.ascm_pool_wake(p, a, &taken) if p is not NULL else ASCM_ERR_INVAL
            if st == ASCM_ERR_INVAL:  # freed while asleep (or freed and allocated again: awake)
                continue
            if st != ASCM_OK:
                for b in woken:
                    C.ascm_pool_sleep(C.ascm_device_pool_at(dev._d, b, NULL), b, NULL)
                raise OutOfMemoryError(f"wake: no room to map {a:#x} again ({C.ascm_status_str(st).decode()})")
            woken.append(a)
            mapped += taken
    for a in woken:
        if saved[a] is not None:
            load(a, saved[a])
    return mapped


def _handed_out(Device dev):
    """Blocks of this Device handed out to C callers and not freed."""
    return C.ascm_device_handed_out(dev._d) if dev._d is not NULL else 0
