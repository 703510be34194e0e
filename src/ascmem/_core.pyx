# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: binding=False, embedsignature=True, embedsignature.format=clinic
"""Bindings of the C core: Pool, BuddyAllocator, and the error mapping."""
# binding=False: methods are CPython method descriptors, not Cython function
# objects, so a call takes CPython's own specialised path (3.11's adaptive
# interpreter has one for method descriptors, none for Cython's functions):
# a Python alloc + free pair is about 175 instructions shorter at every size,
# the floor's (NoopPool) as much (BENCHMARKS.md, eleventh session).  The
# clinic-format signature in each docstring keeps inspect.signature() working.

cimport cython
from cpython.long cimport PyLong_Check, PyLong_CheckExact
from cpython.bool cimport PyBool_Check
from cpython.exc cimport PyErr_Occurred, PyErr_Clear
from libc.stdint cimport uint64_t, int64_t, uint32_t, uintptr_t
from libc.stdlib cimport free, realloc
from libc.string cimport memset

import operator
import warnings

from ascmem.errors import (ArgumentTypeError, ClosedError, CorruptionError, DeviceClosedError,
                           InvalidArgumentError, InvalidFreeError, OutOfMemoryError,
                           UnsupportedError)

DEF MSG_LEN = 512

cdef extern from "Python.h":
    # declared without Cython's exception check: the error case is handled below.
    # PyLong_AsUnsignedLong walks the digits directly, where the LongLong
    # variant goes through _PyLong_AsByteArray (measurably slower on 3.11);
    # on LP64 platforms both are 64-bit.
    unsigned long long PyLong_AsUnsignedLongLong(object o) noexcept
    unsigned long PyLong_AsUnsignedLong(object o) noexcept


cdef object _np = None


cdef object _numpy():
    """numpy, imported on first use: the allocator's hot paths never need it,
    and importing it costs about 0.15 s and starts BLAS threads that spin on
    another core (seen in profiles of plain alloc/free loops)."""
    global _np
    if _np is None:
        import numpy
        _np = numpy
    return _np


# ---- argument conversion: bad input becomes InvalidArgumentError ----------

cdef inline uint64_t _long_as_u64(object v) noexcept:
    """An int (or int subclass) as uint64; (uint64_t)-1 with an exception set
    when it is negative or too large."""
    if sizeof(unsigned long) == 8:
        return PyLong_AsUnsignedLong(v)
    return PyLong_AsUnsignedLongLong(v)


cdef uint64_t _as_u64_slow(object v, str what) except? 0xFFFFFFFFFFFFFFFF:
    cdef uint64_t r
    if PyLong_Check(v) and not PyBool_Check(v):  # int subclasses, e.g. the Policy IntEnum
        r = _long_as_u64(v)
        if not (r == <uint64_t>-1 and PyErr_Occurred()):
            return r
        PyErr_Clear()  # negative or too large: the messages below
    if isinstance(v, bool) or not hasattr(type(v), "__index__"):
        raise ArgumentTypeError(f"{what} must be an integer, not {type(v).__name__}")
    try:
        i = operator.index(v)  # unlike v.__index__(), insists on an int result
    except TypeError as e:
        raise ArgumentTypeError(f"{what}: {type(v).__name__}.__index__ did not give an "
                                f"integer ({e})") from None
    except Exception as e:
        raise ArgumentTypeError(f"{what}: {type(v).__name__}.__index__ raised {e!r}") from None
    if i < 0:
        raise InvalidArgumentError(f"{what} must not be negative (got {i})")
    if i >= 1 << 64:
        raise InvalidArgumentError(f"{what} is absurdly large (got {i})")
    return <uint64_t>i


cdef inline uint64_t as_u64(object v, str what) except? 0xFFFFFFFFFFFFFFFF:
    cdef uint64_t r
    if PyLong_CheckExact(v):
        r = _long_as_u64(v)
        if r == <uint64_t>-1 and PyErr_Occurred():
            PyErr_Clear()
            return _as_u64_slow(v, what)
        return r
    return _as_u64_slow(v, what)


cdef object _raise(int st, str what):
    if st == ASCM_ERR_INVAL:
        raise InvalidArgumentError(what)
    if st == ASCM_ERR_BADFREE:
        raise InvalidFreeError(what)
    if st == ASCM_ERR_CORRUPT:
        raise CorruptionError(what)
    if st in (ASCM_ERR_NOMEM, ASCM_ERR_BUDGET, ASCM_ERR_HOSTMEM):
        raise OutOfMemoryError(what)
    if st == ASCM_ERR_UNSUPPORTED:
        raise UnsupportedError(what)
    if st == ASCM_ERR_CLOSED:
        raise DeviceClosedError(what)
    raise CorruptionError(f"unknown status {st}: {what}")


cdef dict _stats_dict(ascm_stats *s):
    return {
        "capacity": s.capacity, "used": s.used, "requested": s.requested,
        "peak_used": s.peak_used, "peak_requested": s.peak_requested, "free": s.free,
        "largest_free": s.largest_free, "live_count": s.live_count,
        "alloc_count": s.alloc_count, "free_count": s.free_count,
        "failed_count": s.failed_count, "pages_in_use": s.pages_in_use,
        "page_size": s.page_size, "slab_bytes": s.slab_bytes,
        "metadata_bytes": s.metadata_bytes, "cached_bytes": s.cached_bytes,
        "peak_live_count": s.peak_live_count, "alloc_bytes": s.alloc_bytes,
        "freed_bytes": s.freed_bytes, "alloc_requested": s.alloc_requested,
        "freed_requested": s.freed_requested, "peak_pages": s.peak_pages,
        "pages_taken": s.pages_taken, "pages_given": s.pages_given,
    }


# ---- walks: gathered in C memory under the pool's lock, turned into Python after.
# A Python callback under the lock could run a garbage collection that
# releases the GIL, and a thread holding the GIL could then spin on the lock.

cdef struct _Spans:
    uint64_t *v     # (addr, usable, requested) triples
    size_t n, cap   # in triples
    bint failed


cdef void _span_add(void *ctx, uint64_t addr, uint64_t usable, uint64_t requested) noexcept nogil:
    cdef _Spans *s = <_Spans *>ctx
    cdef uint64_t *grown
    if s.failed:
        return
    if s.n == s.cap:
        grown = <uint64_t *>realloc(s.v, (s.cap * 2 + 64) * 3 * sizeof(uint64_t))
        if grown is NULL:
            s.failed = True
            return
        s.v = grown
        s.cap = s.cap * 2 + 64
    s.v[3 * s.n] = addr
    s.v[3 * s.n + 1] = usable
    s.v[3 * s.n + 2] = requested
    s.n += 1


cdef list _pool_blocks(ascm_pool *p, bint free_spans):
    """(addr, usable, requested) of each live block, or (addr, size, 0) of
    each free span of the large-block path."""
    cdef _Spans s
    cdef size_t i
    memset(&s, 0, sizeof(s))
    if free_spans:
        ascm_pool_walk_free(p, _span_add, &s)
    else:
        ascm_pool_walk(p, _span_add, &s)
    try:
        if s.failed:
            raise OutOfMemoryError("host memory for the walk's list ran out")
        return [(s.v[3 * i], s.v[3 * i + 1], s.v[3 * i + 2]) for i in range(s.n)]
    finally:
        free(s.v)


cdef _warn_leaks(str what, ascm_pool *p, object kind):
    """A ResourceWarning naming the largest live blocks of a pool being
    destroyed: their memory would be lost with it."""
    cdef ascm_stats s
    ascm_pool_stats(p, &s)
    if not s.live_count:
        return
    blocks = sorted(((u, a) for a, u, _ in _pool_blocks(p, False)), reverse=True)
    top = ", ".join(f"{_fmt_bytes(n)} at {a:#x}" for n, a in blocks[:3])
    where = f" ({kind} memory)" if kind else ""
    try:
        warnings.warn(f"{what}{where} destroyed with {s.live_count} live blocks "
                      f"({_fmt_bytes(s.used)}); largest: {top}", ResourceWarning, stacklevel=1)
    except Exception:  # warnings turned into errors can not propagate from a destructor
        pass


cdef str _fmt_bytes(uint64_t n):
    # floating-point division: the module compiles with cdivision, under which
    # n / (1 << 20) on integers truncates (45.5 MiB printed as 45.00)
    cdef double x = <double>n
    if n >= 1 << 30:
        return f"{x / (1 << 30):.2f} GiB"
    if n >= 1 << 20:
        return f"{x / (1 << 20):.2f} MiB"
    if n >= 1 << 10:
        return f"{x / (1 << 10):.1f} KiB"
    return f"{n} B"


cdef str _alloc_failure(int st, uint64_t size, uint64_t align, uint64_t capacity,
                        ascm_stats *s):
    if st == ASCM_ERR_INVAL:
        if size == 0:
            return "size must be at least 1 byte"
        return f"alignment {align} is not a power of two the range's base can honour"
    if size > capacity:
        return (f"cannot allocate {_fmt_bytes(size)}: larger than the whole pool "
                f"({_fmt_bytes(capacity)})")
    why = "page budget exhausted" if st == ASCM_ERR_BUDGET else (
        "host memory for metadata ran out" if st == ASCM_ERR_HOSTMEM else "no free block fits")
    return (f"cannot allocate {_fmt_bytes(size)} ({why}): {_fmt_bytes(s.free)} free in total, "
            f"largest free block {_fmt_bytes(s.largest_free)}, capacity {_fmt_bytes(capacity)}")


cdef object _sizes_array(object values):
    np = _numpy()
    arr = _u64_array(values, "sizes")
    if arr.size and arr.min() == 0:
        raise InvalidArgumentError(f"sizes must be at least 1 byte (index {int(np.argmin(arr))} is 0)")
    return arr


cdef object _u64_array(object values, str what):
    """A contiguous uint64 array (read-only input is fine: it is only read).
    Lists numpy would turn into floats or objects (2**63 and above, mixed
    types) are converted item by item, so the error names the item."""
    np = _numpy()
    try:
        arr = np.asarray(values)
        if arr.ndim == 0 and arr.dtype.kind == "O":  # an iterator (or not a sequence at all)
            values = list(values)
            arr = np.asarray(values)
    except (ValueError, TypeError) as e:
        raise ArgumentTypeError(f"{what} must be a flat sequence of integers ({e})") from None
    if arr.ndim == 0:
        raise ArgumentTypeError(f"{what} must be a flat sequence of integers, not "
                                f"{type(values).__name__}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint64)
    if arr.dtype.kind not in "iu":
        if isinstance(values, np.ndarray) or arr.dtype.kind not in "fO":
            raise ArgumentTypeError(f"{what} must be integers, not {arr.dtype}")
        items = list(values)  # the caller's own objects, not numpy's floats
        out = np.empty(len(items), dtype=np.uint64)
        for i, v in enumerate(items):
            out[i] = as_u64(v, f"{what}[{i}]")
        return out
    if arr.dtype.kind == "i" and arr.min() < 0:
        raise InvalidArgumentError(f"{what} must not be negative (index {int(np.argmin(arr))})")
    return np.ascontiguousarray(arr.reshape(-1), dtype=np.uint64)


cdef _not_picklable(obj, str why):
    """The TypeError of pickle and copy for an object whose state is this
    process's (Pool, BuddyAllocator, Device)."""
    return TypeError(f"{type(obj).__name__} cannot be pickled or copied: {why}; make one in "
                     f"each process")


cdef inline uint64_t _align(object align) except? 0xFFFFFFFFFFFFFFFF:
    if align is 64:  # the default (a cached int): no conversion call
        return 64
    return as_u64(align, "align")


# ---- Pool ------------------------------------------------------------------

cdef str _pool_config_problem(ascm_pool_config *c):
    """Which rule of ascm_pool_create a configuration breaks, in words."""
    cdef uint64_t page = c.page_size if c.page_size else c.min_block
    if c.min_block == 0 or c.min_block & (c.min_block - 1) or c.min_block > (1 << 31):
        return f"min_block {c.min_block} must be a power of two of at most 2 GiB"
    if page & (page - 1):
        return f"page_size {page} must be a power of two"
    if c.paged and page < c.min_block:
        return f"granule {page} must be at least min_block {c.min_block}"
    if c.size == 0 or c.size % c.min_block:
        return f"size {c.size} must be a non-zero multiple of min_block {c.min_block}"
    if c.base % c.min_block:
        return f"base {c.base:#x} must be a multiple of min_block {c.min_block}"
    if c.base + c.size < c.base:
        return f"the range [{c.base:#x}, +{c.size}) wraps past the end of the address space"
    if c.size // c.min_block >= (1 << 32) - 1:
        return (f"size {c.size} is {c.size // c.min_block} units of min_block {c.min_block}; a "
                f"pool holds fewer than 2**32 - 1 units: use a larger min_block")
    return "the configuration was refused"


@cython.final
cdef class Pool:
    """Pool(size, *, base=0, min_block=4096, page_size=None, granule=None, release_threshold=0, thread_caches="off")
--

    A pool over the address range [base, base + size): slabs for requests
    up to 32 KiB, best fit with coalescing above.  Thread-safe.

    ``page_size`` (default ``min_block``) is the page whose use the pool
    counts in ``stats()['pages_in_use']``.

    ``granule`` (a power of two, a multiple of ``min_block``) makes the pool
    paged: its range is virtual and physical memory is counted as mapped in
    granules, from a granule's first live byte to its last; up to
    ``release_threshold`` bytes of free granules stay mapped for reuse.
    ``stats()`` then has ``mapped``, ``peak_mapped``, ``map_calls`` and
    ``unmap_calls``; ``trim()`` unmaps the kept granules.

    ``thread_caches`` ("off", "on" or "auto": from the first time two threads
    meet at the pool's lock) puts a cache of small blocks per thread in front
    of the lock, for callers that allocate without the GIL (``cimport`` or
    the C API).  Statistics, ``check()`` and walks flush them first.
    """

    def __cinit__(self, size, *, base=0, min_block=4096, page_size=None, granule=None,
                  release_threshold=0, thread_caches="off"):
        cdef ascm_pool_config cfg
        memset(&cfg, 0, sizeof(cfg))  # fields added later default to zero
        cfg.size = as_u64(size, "size")
        cfg.base = as_u64(base, "base")
        cfg.min_block = as_u64(min_block, "min_block")
        cfg.page_size = 0 if page_size is None else as_u64(page_size, "page_size")
        cfg.release_threshold = as_u64(release_threshold, "release_threshold")
        if granule is not None:
            cfg.paged = 1
            if page_size is not None and cfg.page_size != as_u64(granule, "granule"):
                raise InvalidArgumentError("a paged pool's page is its granule: give one of "
                                           "page_size and granule")
            cfg.page_size = as_u64(granule, "granule")
            if cfg.page_size == 0:
                raise InvalidArgumentError("granule must be a power of two, at least min_block")
        elif cfg.release_threshold:
            raise InvalidArgumentError("release_threshold applies to paged pools: give a granule")
        self._p = NULL
        cdef int st = ascm_pool_create(&cfg, &self._p)
        if st == ASCM_ERR_INVAL:
            raise InvalidArgumentError(f"bad pool: {_pool_config_problem(&cfg)}")
        if st != ASCM_OK:
            raise OutOfMemoryError("host memory for the pool's metadata ran out")
        modes = {"off": ASCM_CACHES_OFF, "on": ASCM_CACHES_ON, "auto": ASCM_CACHES_AUTO}
        if thread_caches not in modes:
            raise InvalidArgumentError(f"thread_caches must be 'off', 'on' or 'auto', not {thread_caches!r}")
        ascm_pool_set_thread_caches(self._p, modes[thread_caches])
        self.thread_caches = thread_caches
        self.base = cfg.base
        self.capacity = cfg.size
        self.min_block = cfg.min_block
        self.page_size = cfg.page_size if cfg.page_size else cfg.min_block
        self.granule = self.page_size if cfg.paged else 0
        self.release_threshold = cfg.release_threshold

    def __reduce__(self):
        raise _not_picklable(self, "its pool state lives in C memory of this process")

    def __dealloc__(self):
        if self._p is not NULL:
            if not self._closed:
                _warn_leaks("Pool", self._p, None)
            ascm_pool_destroy(self._p)

    cdef int alloc_raw(self, uint64_t size, uint64_t align, uint64_t *addr) noexcept nogil:
        return ascm_pool_alloc(self._p, size, align, addr)

    cdef int free_raw(self, uint64_t addr) noexcept nogil:
        return ascm_pool_free(self._p, addr)

    cdef int alloc_handle_raw(self, uint64_t size, uint64_t align, uint64_t *addr,
                              ascm_handle *handle) noexcept nogil:
        return ascm_pool_alloc_handle(self._p, size, align, addr, handle)

    cdef int free_handle_raw(self, ascm_handle handle) noexcept nogil:
        return ascm_pool_free_handle(self._p, handle)

    def alloc(self, nbytes, align=64):
        """Allocates nbytes at a multiple of align; returns the address."""
        cdef uint64_t addr, size = as_u64(nbytes, "size"), al = _align(align)
        cdef int st = ascm_pool_alloc(self._p, size, al, &addr)
        if st != ASCM_OK:
            self._alloc_error(st, size, al)
        return addr

    cdef _alloc_error(self, int st, uint64_t size, uint64_t align):
        if self._closed:
            raise ClosedError("the pool is closed")
        cdef ascm_stats s
        ascm_pool_stats(self._p, &s)
        _raise(st, _alloc_failure(st, size, align, self.capacity, &s))

    def free(self, addr):
        """Frees the block that starts at addr."""
        cdef uint64_t a = as_u64(addr, "address")
        cdef int st = ascm_pool_free(self._p, a)
        if st != ASCM_OK:
            if self._closed:
                raise ClosedError("the pool is closed")
            _raise(st, f"{a:#x} is not the start of a live block of this pool")

    def usable_size(self, addr):
        """Bytes usable at addr (the request rounded to its size class)."""
        cdef uint64_t n, a = as_u64(addr, "address")
        cdef int st = ascm_pool_usable_size(self._p, a, &n)
        if st != ASCM_OK:
            _raise(st, f"{a:#x} is not the start of a live block of this pool")
        return n

    def requested_size(self, addr):
        """Bytes the caller asked for at addr."""
        cdef uint64_t n, a = as_u64(addr, "address")
        cdef int st = ascm_pool_requested_size(self._p, a, &n)
        if st != ASCM_OK:
            _raise(st, f"{a:#x} is not the start of a live block of this pool")
        return n

    def alloc_many(self, sizes, align=64):
        """Allocates every size (all or nothing); returns a uint64 array.
        Runs without the GIL; every 256 blocks a thread waiting for the pool
        gets it, and if that thread resets the pool the batch starts again."""
        cdef uint64_t al = _align(align)
        cdef const uint64_t[::1] sz = _sizes_array(sizes)
        np = _numpy()
        out = np.empty(sz.shape[0], dtype=np.uint64)
        cdef uint64_t[::1] addrs = out
        cdef size_t done = 0, undone = 0, n = sz.shape[0]
        cdef int st = ASCM_OK
        cdef ascm_stats s
        if n:
            with nogil:
                st = ascm_pool_alloc_many(self._p, &sz[0], n, al, &addrs[0], &done)
        if st != ASCM_OK:
            if self._closed:
                raise ClosedError("the pool is closed")
            ascm_pool_stats(self._p, &s)  # as it was when the request failed
            msg = _alloc_failure(st, sz[done], al, self.capacity, &s)
            if done:
                with nogil:
                    ascm_pool_free_many(self._p, &addrs[0], done, &undone)
            _raise(st, f"alloc_many: item {done} of {n}: {msg}; the {done} blocks already "
                       f"allocated were given back")
        return out

    def free_many(self, addrs):
        """Frees every address; raises InvalidFreeError after freeing the
        valid ones if any address was not a live block.  Runs without the
        GIL, letting a waiting thread in every 256 blocks; a reset by it
        frees the rest."""
        cdef const uint64_t[::1] a = _u64_array(addrs, "addresses")
        cdef size_t done = 0, n = a.shape[0]
        cdef int st = ASCM_OK
        if n:
            with nogil:
                st = ascm_pool_free_many(self._p, &a[0], n, &done)
        if st != ASCM_OK:
            if self._closed:
                raise ClosedError("the pool is closed")
            _raise(st, f"{n - done} of {n} addresses were not live blocks of this pool "
                       f"(the other {done} were freed)")

    def stats(self):
        """Counters and sizes (capacity, used, requested, peaks, free,
        largest_free, cached_bytes, counts, pages, metadata), in bytes."""
        cdef ascm_stats s
        ascm_pool_stats(self._p, &s)
        d = _stats_dict(&s)
        if self.granule:
            d.update(mapped=s.mapped, peak_mapped=s.peak_mapped, map_calls=s.map_calls,
                     unmap_calls=s.unmap_calls)
        return d

    def check(self):
        """Walks every invariant; raises CorruptionError naming a broken one."""
        cdef char msg[MSG_LEN]
        msg[0] = 0
        cdef int st
        with nogil:
            st = ascm_pool_check(self._p, msg, MSG_LEN)
        if st != ASCM_OK:
            _raise(st, msg.decode("utf-8", "replace") or "check failed")

    def reset(self):
        """Frees every block at once; addresses from before are invalid."""
        if self._closed:
            raise ClosedError("reset: the pool is closed")
        ascm_pool_reset(self._p)

    def close(self):
        """Ends the pool: blocks still live are reported (ResourceWarning, as
        when a pool is collected with them) and dropped; every later
        allocation, free and reset raises ClosedError (C callers get
        ASCM_ERR_NOMEM / BADFREE); statistics stay readable.  Idempotent."""
        if self._closed:
            return
        _warn_leaks("Pool", self._p, None)
        self._closed = True  # first: a batch of another thread that fails now says "closed"
        ascm_pool_close(self._p)  # one step: no batch's hand-over comes between the reset and closing

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def reset_peaks(self):
        """Peak statistics start again from current use."""
        ascm_pool_reset_peaks(self._p)

    def reset_peak_memory_stats(self):
        """PyTorch's name for reset_peaks()."""
        ascm_pool_reset_peaks(self._p)

    def trim(self):
        """Gives spare empty slabs back, and unmaps a paged pool's kept
        granules; returns the bytes released."""
        return ascm_pool_trim(self._p)

    def __contains__(self, addr):
        try:
            return bool(ascm_pool_contains(self._p, as_u64(addr, "address")))
        except InvalidArgumentError:  # ArgumentTypeError too
            return False

    def __repr__(self):
        s = self.stats()
        return (f"<ascmem.Pool base={self.base:#x} capacity={_fmt_bytes(self.capacity)} "
                f"used={_fmt_bytes(s['used'])} live={s['live_count']}>")


# ---- BuddyAllocator ----------------------------------------------------------

@cython.final
cdef class BuddyAllocator:
    """BuddyAllocator(size, *, base=0, min_block=4096)
--

    A binary buddy allocator over [base, base + size) with exact-size
    allocations.  Not locked: share it between threads only under a lock."""

    def __cinit__(self, size, *, base=0, min_block=4096):
        cdef uint64_t s = as_u64(size, "size"), b = as_u64(base, "base")
        cdef uint64_t m = as_u64(min_block, "min_block")
        self._b = NULL
        cdef int st = ascm_buddy_create(b, s, m, &self._b)
        if st == ASCM_ERR_INVAL:
            raise InvalidArgumentError(
                f"bad buddy range: size {s} must be a non-zero multiple of min_block {m}, "
                f"min_block a power of two, base a multiple of min_block")
        if st != ASCM_OK:
            raise OutOfMemoryError("host memory for the allocator's metadata ran out")
        self.base = b
        self.capacity = s
        self.min_block = m

    def __reduce__(self):
        raise _not_picklable(self, "its allocator state lives in C memory of this process")

    def __dealloc__(self):
        if self._b is not NULL:
            ascm_buddy_destroy(self._b)

    def alloc(self, nbytes, align=64):
        """Allocates exactly nbytes (rounded to min_block) at a multiple of align."""
        cdef uint64_t addr, size = as_u64(nbytes, "size"), al = _align(align)
        cdef int st = ascm_buddy_alloc(self._b, size, al, &addr)
        cdef ascm_stats s
        if st != ASCM_OK:
            ascm_buddy_stats(self._b, &s)
            _raise(st, _alloc_failure(st, size, al, self.capacity, &s))
        return addr

    def free(self, addr):
        """Frees the block that starts at addr."""
        cdef uint64_t a = as_u64(addr, "address")
        cdef int st = ascm_buddy_free(self._b, a)
        if st != ASCM_OK:
            _raise(st, f"{a:#x} is not the start of a live block of this allocator")

    def usable_size(self, addr):
        """Bytes usable at addr (the request rounded to min_block)."""
        cdef uint64_t n, a = as_u64(addr, "address")
        cdef int st = ascm_buddy_usable_size(self._b, a, &n)
        if st != ASCM_OK:
            _raise(st, f"{a:#x} is not the start of a live block of this allocator")
        return n

    def requested_size(self, addr):
        """Bytes the caller asked for at addr."""
        cdef uint64_t n, a = as_u64(addr, "address")
        cdef int st = ascm_buddy_requested_size(self._b, a, &n)
        if st != ASCM_OK:
            _raise(st, f"{a:#x} is not the start of a live block of this allocator")
        return n

    def alloc_many(self, sizes, align=64):
        """Allocates every size (all or nothing); returns a uint64 array."""
        cdef uint64_t al = _align(align)
        cdef const uint64_t[::1] sz = _sizes_array(sizes)
        np = _numpy()
        out = np.empty(sz.shape[0], dtype=np.uint64)
        cdef uint64_t[::1] addrs = out
        cdef size_t i, j, n = sz.shape[0]
        cdef int st = ASCM_OK
        cdef ascm_stats s
        for i in range(n):
            st = ascm_buddy_alloc(self._b, sz[i], al, &addrs[i])
            if st != ASCM_OK:
                for j in range(i):
                    ascm_buddy_free(self._b, addrs[j])
                ascm_buddy_stats(self._b, &s)
                _raise(st, _alloc_failure(st, sz[i], al, self.capacity, &s))
        return out

    def free_many(self, addrs):
        """Frees every address; raises InvalidFreeError after freeing the
        valid ones if any address was not a live block."""
        cdef const uint64_t[::1] a = _u64_array(addrs, "addresses")
        cdef size_t i, bad = 0, n = a.shape[0]
        for i in range(n):
            if ascm_buddy_free(self._b, a[i]) != ASCM_OK:
                bad += 1
        if bad:
            raise InvalidFreeError(f"{bad} of {n} addresses were not live blocks "
                                   f"(the other {n - bad} were freed)")

    def stats(self):
        """Counters and sizes, as Pool.stats()."""
        cdef ascm_stats s
        ascm_buddy_stats(self._b, &s)
        return _stats_dict(&s)

    def check(self):
        """Walks every invariant; raises CorruptionError naming a broken one."""
        cdef char msg[MSG_LEN]
        msg[0] = 0
        cdef int st = ascm_buddy_check(self._b, msg, MSG_LEN)
        if st != ASCM_OK:
            _raise(st, msg.decode("utf-8", "replace") or "check failed")

    def reset(self):
        """Frees every block at once; addresses from before are invalid."""
        ascm_buddy_reset(self._b)

    def __contains__(self, addr):
        try:
            a = as_u64(addr, "address")
        except InvalidArgumentError:
            return False
        return self.base <= a < self.base + self.capacity

    def __repr__(self):
        s = self.stats()
        return (f"<ascmem.BuddyAllocator base={self.base:#x} "
                f"capacity={_fmt_bytes(self.capacity)} used={_fmt_bytes(s['used'])}>")


# ---- the floor for benchmarks ----------------------------------------------------

@cython.final
cdef class NoopPool:
    """Same call signatures as Pool, no work: a benchmark's floor (what a
    Python -> Cython call pair costs with nothing behind it)."""

    def alloc(self, nbytes, align=64):
        # An address-sized result, as any allocator must return.  Returning
        # nbytes itself handed back CPython's cached small int for 64 and so
        # skipped the int allocation every real address costs (~15 ns).
        return as_u64(nbytes, "size") | (<uint64_t>1 << 40)

    def free(self, addr):
        as_u64(addr, "address")
include "_upstream.pxi"
include "_growth.pxi"
include "_streams.pxi"
include "_views.pxi"
include "_tags.pxi"
include "_acl_paging.pxi"
include "_device_failures.pxi"
include "_device_parts.pxi"
include "_device_readout.pxi"
include "_device.pxi"
include "_device_paths.pxi"
include "_device_fastcall.pxi"
include "_acl_allocator.pxi"
include "_capi.pxi"
