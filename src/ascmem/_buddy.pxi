# BuddyAllocator: the buddy of csrc/buddy.c.  Included by _core.pyx.

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
