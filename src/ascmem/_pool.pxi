# Pool: best fit and slabs over one range (csrc/pool*.c).  Included by _core.pyx.

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
    if c.paged and c.size % page:
        return (f"size {c.size} must be a multiple of the granule {page}: a paged pool maps "
                f"whole granules, and one reaching past the range would not be the pool's")
    if c.base % c.min_block:
        return f"base {c.base:#x} must be a multiple of min_block {c.min_block}"
    if c.base + c.size < c.base:
        return f"the range [{c.base:#x}, +{c.size}) wraps past the end of the address space"
    if c.size // c.min_block >= (1 << 32) - 1:
        return (f"size {c.size} is {c.size // c.min_block} units of min_block {c.min_block}; a "
                f"pool holds fewer than 2**32 - 1 units: use a larger min_block")
    return "the configuration was refused"


cdef dict _CACHES_MODES = {"off": ASCM_CACHES_OFF, "on": ASCM_CACHES_ON, "auto": ASCM_CACHES_AUTO}


cdef int _caches_mode(object name) except -1:
    """ASCM_CACHES_* of a thread_caches argument (Pool, Device)."""
    if type(name) is str and name in _CACHES_MODES:
        return _CACHES_MODES[name]
    raise InvalidArgumentError(f"thread_caches must be 'off', 'on' or 'auto', not {name!r}")


cdef dict _PLACEMENTS = {"granules": ASCM_PLACE_GRANULES, "packed": ASCM_PLACE_PACKED,
                         "kept-in-place": ASCM_PLACE_KEPT_IN_PLACE,
                         "kept-to-best-fit": ASCM_PLACE_KEPT_TO_BEST_FIT,
                         "lowest-equal": ASCM_PLACE_LOWEST_EQUAL, "best-fit": ASCM_PLACE_BEST_FIT,
                         "best-fit-end-last": ASCM_PLACE_BEST_FIT_END_LAST}
cdef dict _PLACEMENT_NAMES = {v: k for k, v in _PLACEMENTS.items()}
# the largest request slabs can serve, and a new pool's slab_max
SLAB_MAX = ASCM_SLAB_MAX

# each kind of pool's placements, its default first (ascmem.trace has the same)
cdef tuple _PAGED_PLACEMENTS = ("granules", "packed", "best-fit")
cdef tuple _CONTIGUOUS_PLACEMENTS = ("kept-in-place", "kept-to-best-fit", "lowest-equal",
                                     "best-fit-end-last")


cdef object _placement_of(object name, bint paged, str paged_by=None):
    """A pool's or device's placement by name, its kind's default when name
    is None: a pool takes only the placements of its kind (paged or
    contiguous), a device those of its pools' kind.  paged_by (a Device's:
    how to make it paged) names the way to a paged placement in the refusal
    of one on a device that is not paged."""
    names = _PAGED_PLACEMENTS if paged else _CONTIGUOUS_PLACEMENTS
    if name is None:
        return names[0]
    if type(name) is str and name in names:
        return name
    if not paged and paged_by is not None and type(name) is str and name in _PAGED_PLACEMENTS:
        raise InvalidArgumentError(f"placement {name!r} applies to paged pools: {paged_by}")
    raise InvalidArgumentError(f"placement of a {'paged' if paged else 'contiguous'} pool must be "
                               f"one of {', '.join(map(repr, names))}, not {name!r}")


cdef object _default_caches(object name, bint paged):
    """A thread_caches argument, its default (None) resolved: "auto", which
    costs a pool no thread ever shares nothing (caches come on only when two
    threads meet at its lock) and helps where threads share it; "off"
    for a paged pool or device, whose caches are not built."""
    if name is None:
        return "off" if paged else "auto"
    return name


cdef uint64_t _release_cap(object value, uint64_t threshold, bint paged, str what) except? 0:
    """release_threshold_max checked: 0 for None (a fixed threshold)."""
    if value is None:
        return 0
    cdef uint64_t cap = as_u64(value, "release_threshold_max")
    if not paged:
        raise InvalidArgumentError(f"release_threshold_max applies to paged {what}")
    if cap < threshold:
        raise InvalidArgumentError(f"release_threshold_max {cap} is below release_threshold "
                                   f"{threshold}: the threshold adapts between the two")
    return cap


@cython.final
cdef class Pool:
    """Pool(size, *, base=0, min_block=4096, page_size=None, granule=None, release_threshold=0, release_threshold_max=None, thread_caches=None, placement=None, slab_max=None)
--

    A pool over the address range [base, base + size): slabs for requests
    up to 32 KiB, best fit with coalescing above.  Thread-safe.

    ``page_size`` (default ``min_block``) is the page whose use the pool
    counts in ``stats()['pages_in_use']``.

    ``granule`` (a power of two, a multiple of ``min_block``) makes the pool
    paged: its range is virtual and physical memory is counted as mapped in
    granules, from a granule's first live byte to its last; up to
    ``release_threshold`` bytes of free granules stay mapped for reuse.
    ``stats()`` then has ``mapped``, ``peak_mapped``, ``map_calls``,
    ``unmap_calls`` and ``release_threshold`` (the threshold now);
    ``trim()`` unmaps the kept granules.

    ``release_threshold_max`` (paged pools; at least ``release_threshold``)
    makes the threshold adaptive, as glibc's mmap threshold is: granules
    given back past it and mapped again soon after raise it, up to this
    many bytes; kept granules that a period of allocations (twice the
    threshold taken into use) did not need bring it back down, to
    ``release_threshold`` at least.  None (the default): fixed.

    ``placement``: for a paged pool, where blocks of a granule or more go.
    "granules" (the default) aligns them to granule boundaries, the large
    ones from the top of their hole; "packed" puts every block at the low end
    of the hole best fit chose, end to end with the block below it;
    "best-fit" places every block, small or large, as plain best fit does
    (no size-class regions, no granule rule).  Which maps fewer granules
    depends on the workload: ``ascmem.trace.choose_placement`` replays a
    recorded run under each.
    For a contiguous pool, where a large request of the last large block
    freed's size goes: "kept-in-place" (the default) reuses that block in
    place unless a smaller hole just below it would be stranded;
    "kept-to-best-fit" never reuses it in place (best fit chooses);
    "lowest-equal" reuses it unless a free block of its size lies lower,
    which the request takes; "best-fit-end-last" never reuses it in place
    and takes the free end of the range last for every large request (the
    wilderness rule).  ``ascmem.trace.choose_contiguous_placement``
    replays a recorded run under each and keeps the smallest arena;
    ``ascmem.trace.choose_contiguous_plan`` chooses ``min_block`` with it.

    ``slab_max``: requests of at most this many bytes come from slabs,
    larger ones from best fit in units of ``min_block``; 0: none from slabs
    (every block placed as the placement places large ones: textbook best
    fit under "best-fit-end-last").  None (the default) is 32 KiB, the
    largest slab class, and more reads as that; "best-fit" serves at most
    1 KiB from slabs.  A slab stays while any of its slots is live, which on
    some workloads costs memory best fit would not; the plans
    (``choose_contiguous_plan``, ``choose_paged_plan``) try both.

    ``thread_caches`` ("off", "on" or "auto": from the first time two threads
    meet at the pool's lock) puts a cache of small blocks per thread in front
    of the lock, for callers that allocate without the GIL (``cimport``, the
    C API, batch calls).  Statistics, ``check()`` and walks flush them first.
    The default (None) is "auto" ("off" for a paged pool): a pool only one
    thread uses never has them.
    """

    def __cinit__(self, size, *, base=0, min_block=4096, page_size=None, granule=None,
                  release_threshold=0, release_threshold_max=None, thread_caches=None, placement=None,
                  slab_max=None):
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
        cdef uint64_t cap = _release_cap(release_threshold_max, cfg.release_threshold, cfg.paged,
                                         "pools: give a granule")
        placement = _placement_of(placement, cfg.paged)
        cdef uint64_t slabs_upto = SLAB_MAX if slab_max is None else as_u64(slab_max, "slab_max")
        self._p = NULL
        cdef int st = ascm_pool_create(&cfg, &self._p)
        if st == ASCM_ERR_INVAL:
            raise InvalidArgumentError(f"bad pool: {_pool_config_problem(&cfg)}")
        if st != ASCM_OK:
            raise OutOfMemoryError("host memory for the pool's metadata ran out")
        if cap:
            ascm_pool_set_release_cap(self._p, cap)
        thread_caches = _default_caches(thread_caches, cfg.paged)
        ascm_pool_set_thread_caches(self._p, _caches_mode(thread_caches))
        self.thread_caches = thread_caches
        ascm_pool_set_placement(self._p, _PLACEMENTS[placement])  # of the pool's kind: OK
        ascm_pool_set_slab_max(self._p, slabs_upto)
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
        return _pool_alloc(self, nbytes, _align(align))

    cdef _alloc_error(self, int st, uint64_t size, uint64_t align):
        if self._closed:
            raise ClosedError("the pool is closed")
        cdef ascm_stats s
        ascm_pool_stats(self._p, &s)
        _raise(st, _alloc_failure(st, size, align, self.capacity, &s))

    def free(self, addr):
        """Frees the block that starts at addr."""
        _pool_free(self, addr)

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
        cdef size_t done = 0, n = sz.shape[0]
        cdef int st = ASCM_OK
        cdef ascm_stats s
        if n:
            with nogil:
                st = ascm_pool_alloc_many(self._p, &sz[0], n, al, &addrs[0], &done)
        if st != ASCM_OK:
            if self._closed:
                raise ClosedError("the pool is closed")
            ascm_pool_stats(self._p, &s)  # the C batch gave its blocks back already
            msg = _alloc_failure(st, sz[done], al, self.capacity, &s)
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
                     unmap_calls=s.unmap_calls, release_threshold=ascm_pool_release_threshold(self._p))
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
        """Frees every block at once; addresses from before are invalid.
        A Pool cannot tell such an address from a block placed there since:
        freeing one frees that block (a Device can: its ranges move at every
        reset).  Threads that reset must keep others from using old ones."""
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

    @property
    def placement(self):
        """The pool's placement (its kind's: "granules", "packed" or "best-fit" when paged,
        else "kept-in-place", "kept-to-best-fit", "lowest-equal" or
        "best-fit-end-last"), read from
        the C pool: one an embedder set through the capsule included."""
        return _PLACEMENT_NAMES[ascm_pool_placement(self._p)]

    @property
    def slab_max(self):
        """The largest request served from slabs (``slab_max`` above; at
        most 32 KiB), read from the C pool."""
        return ascm_pool_slab_max(self._p)

    @property
    def thread_caches_on(self):
        """Whether thread caches are on at this moment: with "on", or with
        "auto" once two threads have met at the pool's lock."""
        return bool(ascm_pool_thread_caches_on(self._p))

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


# Pool.alloc's and Pool.free's bodies, in line; the error paths stay out of line.
cdef inline object _pool_alloc(Pool self, object nbytes, uint64_t al):
    cdef uint64_t addr, size = as_u64(nbytes, "size")
    cdef int st = ascm_pool_alloc(self._p, size, al, &addr)
    if st != ASCM_OK:
        self._alloc_error(st, size, al)
    return addr


cdef inline int _pool_free(Pool self, object addr) except -1:
    cdef uint64_t a = as_u64(addr, "address")
    cdef int st = ascm_pool_free(self._p, a)
    if st != ASCM_OK:
        _pool_free_failed(self, st, a)
    return 0


cdef int _pool_free_failed(Pool self, int st, uint64_t a) except -1:
    if self._closed:
        raise ClosedError("the pool is closed")
    _raise(st, f"{a:#x} is not the start of a live block of this pool")
    return -1
