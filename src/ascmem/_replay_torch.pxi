# torch_npu's caching allocator and its expandable segments, compiled: the
# algorithms of ascmem.emulations.torch_caching and ascmem.emulations.torch_expandable (which stay
# the readable references, with the torch_npu source lines they follow),
# step for step, so that every figure is the same.  Included by
# _replay_peers.pyx.

from libc.stdlib cimport free as c_free_mem, malloc

cdef uint64_t _MIB = 1 << 20
cdef uint64_t _MIN_BLOCK = 512
cdef uint64_t _SMALL_SIZE = _MIB
cdef uint64_t _SMALL_BUFFER = 2 * _MIB
cdef uint64_t _LARGE_BUFFER = 20 * _MIB
cdef uint64_t _MIN_LARGE_ALLOC = 10 * _MIB
cdef uint64_t _ROUND_LARGE = 2 * _MIB
cdef uint64_t _ALIGN_LARGE = 16 * 1024
cdef uint64_t _SPAN = <uint64_t>1 << 44


cdef struct _TBlock:
    uint64_t addr, size, stamp
    _TBlock *prev
    _TBlock *next
    bint allocated, small, mapped, listed


cdef extern from *:  # the guards must see its bad_alloc (ascm_peer_push_back, _replay_peers.pyx)
    void _push_block "ascm_peer_push_back"(vector[_TBlock *] &, _TBlock *) noexcept


cdef _TBlock *_new_block(uint64_t addr, uint64_t size, bint small, bint mapped) noexcept:
    cdef _TBlock *b = <_TBlock *>malloc(sizeof(_TBlock))
    if b is NULL:  # as the containers do: caught at the edge of the call (_peer_alloc)
        _throw_bad_alloc()
    b.addr, b.size, b.small, b.mapped = addr, size, small, mapped
    b.prev = b.next = NULL
    b.allocated = b.listed = False
    b.stamp = 0
    return b


cdef inline int _bit_length(uint64_t v) noexcept:
    cdef int n = 0
    while v:
        v >>= 1
        n += 1
    return n


cdef uint64_t _round_request(uint64_t size, uint64_t pad, uint64_t divisions) noexcept:
    """ascmem.emulations.torch_caching.round_request."""
    cdef uint64_t floor, step, low
    size += pad
    if size < _MIN_BLOCK:
        return _MIN_BLOCK
    if divisions > 1 and size > _MIN_BLOCK * divisions:
        if size & (size - 1) == 0:
            return size
        floor = (<uint64_t>1) << (_bit_length(size) - 1)
        step = floor >> (_bit_length(divisions) - 1)
        if step == 0:
            return floor << 1
        low = size & ~(step - 1)
        return size if low == size else low + step
    return (size + _MIN_BLOCK - 1) // _MIN_BLOCK * _MIN_BLOCK


cdef class _TorchPeer(_Peer):
    """What both emulations share: the blocks by address, sizes, counters."""
    cdef unordered_map[uint64_t, _TBlock *] blocks
    cdef FreeSet free_small, free_large
    cdef readonly uint64_t capacity, pad, divisions
    cdef readonly uint64_t reserved, peak_reserved, allocated, segments, retries
    cdef uint64_t oom_seg

    def __cinit__(self, *args, **kw):
        self.curve_reserved = True

    def __dealloc__(self):
        cdef unordered_map[uint64_t, _TBlock *].iterator it = self.blocks.begin()
        while it != self.blocks.end():
            c_free_mem(deref(it).second)
            inc(it)
        self.blocks.clear()

    cdef inline FreeSet *_free_of(self, bint small) noexcept:
        return &self.free_small if small else &self.free_large

    cdef uint64_t c_usable(self, uint64_t addr) noexcept:
        cdef unordered_map[uint64_t, _TBlock *].iterator it = self.blocks.find(addr)
        if it == self.blocks.end() or not deref(it).second.allocated:
            return _NOT_LIVE
        return deref(it).second.size

    cdef uint64_t c_reserved(self) noexcept:
        return self.reserved

    cdef _TBlock *_take_back(self, uint64_t addr) noexcept:
        """ascmem.emulations.torch_caching.take_back: the live block at addr, marked
        free; NULL if there is none."""
        cdef unordered_map[uint64_t, _TBlock *].iterator it = self.blocks.find(addr)
        if it == self.blocks.end() or not deref(it).second.allocated:
            return NULL
        cdef _TBlock *b = deref(it).second
        b.allocated = False
        self.allocated -= b.size
        return b

    def round_size(self, size):
        return _round_request(_size_arg(size), self.pad, self.divisions)

    def stats(self):
        return {"reserved": self.reserved, "peak_reserved": self.peak_reserved,
                "allocated": self.allocated, "segments": self.segments, "retries": self.retries}


# ---- the caching allocator (ascmem.emulations.torch_caching.TorchCachingAllocator) -----------------

cdef class TorchCachingAllocator(_TorchPeer):
    """ascmem.emulations.torch_caching.TorchCachingAllocator, compiled, with its
    default max_split_size (none) and no garbage_collection_threshold (the
    options whose segment releases the reference orders by its dict: those
    stay with the reference; ascmem.trace.make_allocator picks)."""
    cdef uint64_t clock, next_segment

    def __init__(self, capacity, roundup_power2_divisions=0, pad=32):
        self.capacity = _size_arg(capacity)
        self.divisions = _size_arg(roundup_power2_divisions)
        self.pad = _size_arg(pad)

    @staticmethod
    def allocation_size(size):
        return _allocation_size(_size_arg(size))

    cdef int c_alloc(self, uint64_t size, uint64_t *addr) noexcept:
        if size == 0:
            return _BADSIZE
        self.clock += 1
        size = _round_request(size, self.pad, self.divisions)
        cdef bint small = size <= _SMALL_SIZE
        cdef _TBlock *block = self._find(size, small)
        cdef _TBlock *rest
        cdef uint64_t seg
        if block is NULL:
            seg = _allocation_size(size)
            block = self._new_segment(seg, small)
            if block is NULL:  # the last retry: every cached whole segment goes back
                self.retries += 1
                self._release_all()
                block = self._new_segment(seg, small)
            if block is NULL:
                self.oom_seg = seg
                return _NOMEM
        if self._should_split(block, size):
            rest = _new_block(block.addr + size, block.size - size, small, True)
            rest.prev, rest.next = block, block.next
            if block.next is not NULL:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self.blocks[rest.addr] = rest
            _insert(self._free_of(small)[0], SizeAddr(rest.size, rest.addr))
        block.allocated = True
        block.stamp = self.clock
        self.allocated += block.size
        addr[0] = block.addr
        return _OK

    cdef _TBlock *_find(self, uint64_t size, bint small) noexcept:
        cdef FreeSet *free = self._free_of(small)
        cdef FreeSet.iterator it = free.lower_bound(SizeAddr(size, 0))
        if it == free.end():
            return NULL
        cdef uint64_t addr = deref(it).second
        free.erase(it)
        return self.blocks[addr]

    cdef bint _should_split(self, _TBlock *block, uint64_t size) noexcept:
        cdef uint64_t rest = block.size - size
        if block.small:
            return rest >= _MIN_BLOCK
        return rest > _SMALL_SIZE

    cdef _TBlock *_new_segment(self, uint64_t size, bint small) noexcept:
        if self.reserved + size > self.capacity:
            return NULL
        self.next_segment += 1
        cdef _TBlock *block = _new_block(self.next_segment << 44, size, small, True)
        self.blocks[block.addr] = block
        self.reserved += size
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
        self.segments += 1
        return block

    cdef void _release_all(self) noexcept:
        cdef vector[_TBlock *] whole
        cdef unordered_map[uint64_t, _TBlock *].iterator it = self.blocks.begin()
        cdef _TBlock *b
        while it != self.blocks.end():
            b = deref(it).second
            if not b.allocated and b.prev is NULL and b.next is NULL:
                _push_block(whole, b)
            inc(it)
        for b in whole:
            self._free_of(b.small).erase(SizeAddr(b.size, b.addr))
            self.blocks.erase(b.addr)
            self.reserved -= b.size
            self.segments -= 1
            c_free_mem(b)

    cdef int c_free(self, uint64_t addr) noexcept:
        cdef _TBlock *block = self._take_back(addr)
        if block is NULL:
            return _BADFREE
        cdef _TBlock *before = block.prev
        cdef _TBlock *after = block.next
        cdef _TBlock *other
        cdef int side
        for side in range(2):
            other = before if side == 0 else after
            if other is not NULL and not other.allocated:
                self._free_of(other.small).erase(SizeAddr(other.size, other.addr))
                self.blocks.erase(other.addr)
                if side == 0:
                    block.addr, block.prev = other.addr, other.prev
                    if other.prev is not NULL:
                        other.prev.next = block
                else:
                    block.next = other.next
                    if other.next is not NULL:
                        other.next.prev = block
                block.size += other.size
                c_free_mem(other)
        self.blocks.erase(addr)
        self.blocks[block.addr] = block
        _insert(self._free_of(block.small)[0], SizeAddr(block.size, block.addr))
        return _OK

    def _oom_text(self):
        return (f"torch caching allocator: no room for a {self.oom_seg}-byte segment "
                f"({self.reserved} of {self.capacity} reserved)")


cdef inline uint64_t _allocation_size(uint64_t size) noexcept:
    if size <= _SMALL_SIZE:
        return _SMALL_BUFFER
    if size < _MIN_LARGE_ALLOC:
        return _LARGE_BUFFER
    return (size + _ROUND_LARGE - 1) // _ROUND_LARGE * _ROUND_LARGE


# ---- expandable segments (ascmem.emulations.torch_expandable.TorchExpandableSegments) --------------

ctypedef cset[uint64_t] AddrSet

cdef extern from *:  # the guards must see their bad_alloc (ascm_peer_insert, _replay_peers.pyx)
    void _insert_addr "ascm_peer_insert"(AddrSet &, uint64_t) noexcept
    void _push_addr "ascm_peer_push_back"(vector[uint64_t] &, uint64_t) noexcept


cdef inline uint64_t _seg_base(bint small) noexcept:
    """Where a pool's one virtual segment starts."""
    return (<uint64_t>1 << 45) if small else (<uint64_t>2 << 45)


cdef inline uint64_t _seg_page(bint small) noexcept:
    """The pages a pool's segment is mapped in."""
    return _SMALL_BUFFER if small else _LARGE_BUFFER


cdef class TorchExpandableSegments(_TorchPeer):
    """ascmem.emulations.torch_expandable.TorchExpandableSegments, compiled (eager:
    pages unmapped as soon as they are free)."""
    cdef AddrSet unmapped_small, unmapped_large
    cdef readonly bint eager
    cdef uint64_t oom_request

    def __init__(self, capacity, eager=False, pad=32, roundup_power2_divisions=0):
        self.capacity = _size_arg(capacity)
        self.eager = bool(eager)
        self.pad = _size_arg(pad)
        self.divisions = _size_arg(roundup_power2_divisions)

    cdef inline AddrSet *_unmapped_of(self, bint small) noexcept:
        return &self.unmapped_small if small else &self.unmapped_large

    cdef void _list(self, _TBlock *b) noexcept:
        if b.mapped:
            _insert(self._free_of(b.small)[0], SizeAddr(b.size, b.addr))
        else:
            _insert_addr(self._unmapped_of(b.small)[0], b.addr)
        b.listed = True

    cdef void _unlist(self, _TBlock *b) noexcept:
        if b.mapped:
            self._free_of(b.small).erase(SizeAddr(b.size, b.addr))
        else:
            self._unmapped_of(b.small).erase(b.addr)
        b.listed = False

    cdef int c_alloc(self, uint64_t size, uint64_t *addr) noexcept:
        if size == 0:
            return _BADSIZE
        size = _round_request(size, self.pad, self.divisions)
        cdef bint small = size <= _SMALL_SIZE
        cdef _TBlock *block = self._best_free(size, small)
        if block is NULL:
            block = self._map_for(size, small)
            if block is NULL:  # the last retry: every free page of both pools goes back
                self.retries += 1
                self._empty_cache()
                block = self._map_for(size, small)
            if block is NULL:
                self.oom_request = size
                return _NOMEM
        else:
            self._unlist(block)
        block = self._aligned(block, size)
        if block.size - size >= _MIN_BLOCK:  # should_split: 512 bytes left
            self._split(block, size)
        block.allocated = True
        self.allocated += block.size
        addr[0] = block.addr
        return _OK

    cdef inline uint64_t _grow(self, uint64_t size, uint64_t addr) noexcept:
        cdef _TBlock *nxt = self.blocks[addr].next
        return size + (nxt.size if nxt is not NULL and not nxt.mapped else 0)

    cdef _TBlock *_best_free(self, uint64_t size, bint small) noexcept:
        cdef FreeSet *free = self._free_of(small)
        cdef FreeSet.iterator it = free.lower_bound(SizeAddr(size, 0))
        cdef FreeSet.iterator nx
        if it == free.end():
            return NULL
        nx = it
        inc(nx)
        while nx != free.end() and self._grow(deref(nx).first, deref(nx).second) < \
                self._grow(deref(it).first, deref(it).second):
            it = nx
            inc(nx)
        return self.blocks[deref(it).second]

    cdef _TBlock *_aligned(self, _TBlock *block, uint64_t size) noexcept:
        cdef uint64_t off = (_ALIGN_LARGE - (block.addr - _seg_base(block.small)) % _ALIGN_LARGE) \
            % _ALIGN_LARGE
        if size < _ROUND_LARGE or off == 0 or off + size > block.size:
            return block
        cdef _TBlock *rest = self._split(block, off)
        self._unlist(rest)
        self._list(block)  # block keeps the gap, free
        return rest

    cdef _TBlock *_split(self, _TBlock *block, uint64_t size) noexcept:
        cdef _TBlock *rest = _new_block(block.addr + size, block.size - size, block.small,
                                        block.mapped)
        rest.prev, rest.next = block, block.next
        if block.next is not NULL:
            block.next.prev = rest
        block.next = rest
        block.size = size
        self.blocks[rest.addr] = rest
        self._list(rest)
        return rest

    cdef _TBlock *_map_for(self, uint64_t size, bint small) noexcept:
        cdef AddrSet *unm = self._unmapped_of(small)
        cdef _TBlock *whole
        cdef _TBlock *c = NULL
        cdef _TBlock *b
        cdef _TBlock *cand
        cdef _TBlock *nxt
        cdef uint64_t room
        cdef bint found = False
        if unm.empty():
            whole = _new_block(_seg_base(small), _SPAN, small, False)
            self.blocks[whole.addr] = whole
            self._list(whole)
            self.segments += 1
        cdef AddrSet.iterator it = unm.begin()
        while it != unm.end():
            c = self.blocks[deref(it)]
            if c.prev is not NULL and not c.prev.allocated:
                c = c.prev
            room, b = 0, c
            while room < size and b is not NULL and not b.allocated:
                room += b.size
                b = b.next
            if room >= size:
                found = True
                break
            inc(it)
        if not found:
            return NULL
        if not c.mapped:
            if not self._map(c, min(c.size, size)):
                return NULL
        cand = self._merge(c)
        while cand.size < size:
            nxt = cand.next
            if not self._map(nxt, min(size - cand.size, nxt.size)):
                return NULL  # cand stays free and listed
            cand = self._merge(nxt)
        self._unlist(cand)
        return cand

    cdef bint _map(self, _TBlock *block, uint64_t nbytes) noexcept:
        cdef uint64_t page = _seg_page(block.small)
        cdef uint64_t n = min(block.size, (nbytes + page - 1) // page * page)
        if self.reserved + n > self.capacity:
            return False
        self._unlist(block)
        if n < block.size:
            self._split(block, n)  # the unmapped rest, listed
        block.mapped = True
        self.reserved += n
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
        self._list(block)
        return True

    cdef int c_free(self, uint64_t addr) noexcept:
        cdef _TBlock *block = self._take_back(addr)
        if block is NULL:
            return _BADFREE
        block = self._merge(block)
        if self.eager:
            self._unmap(block)
        return _OK

    cdef _TBlock *_merge(self, _TBlock *block) noexcept:
        if block.listed:
            self._unlist(block)
        cdef _TBlock *before = block.prev
        cdef _TBlock *after = block.next
        cdef _TBlock *other
        cdef int side
        for side in range(2):
            other = before if side == 0 else after
            if other is NULL or other.allocated or other.mapped != block.mapped:
                continue
            if other.listed:
                self._unlist(other)
            self.blocks.erase(other.addr)
            if side == 0:
                self.blocks.erase(block.addr)
                block.addr, block.prev = other.addr, other.prev
                if other.prev is not NULL:
                    other.prev.next = block
                self.blocks[block.addr] = block
            else:
                block.next = other.next
                if other.next is not NULL:
                    other.next.prev = block
            block.size += other.size
            c_free_mem(other)
        self._list(block)
        return block

    def empty_cache(self):
        """release_cached_blocks: the whole pages inside every free mapped
        block of both pools are unmapped."""
        self._empty_cache()

    cdef void _empty_cache(self) noexcept:
        cdef vector[uint64_t] addrs
        cdef FreeSet *free
        cdef FreeSet.iterator it
        cdef unordered_map[uint64_t, _TBlock *].iterator found
        cdef _TBlock *block
        cdef int pool
        for pool in range(2):
            free = self._free_of(pool == 0)
            addrs.clear()
            it = free.begin()
            while it != free.end():
                _push_addr(addrs, deref(it).second)
                inc(it)
            for a in addrs:
                found = self.blocks.find(a)
                if found == self.blocks.end():
                    continue
                block = deref(found).second
                if block.listed and block.mapped:
                    self._unmap(block)

    cdef void _unmap(self, _TBlock *block) noexcept:
        cdef uint64_t page = _seg_page(block.small), base = _seg_base(block.small)
        cdef uint64_t lo = base + (block.addr - base + page - 1) // page * page
        cdef uint64_t hi = base + (block.addr + block.size - base) // page * page
        cdef _TBlock *before
        if hi <= lo:
            return
        self._unlist(block)
        if lo > block.addr:
            before = block
            block = self._split(block, lo - block.addr)
            self._unlist(block)
            self._list(before)                            # the part before stays mapped
        if hi < block.addr + block.size:
            self._split(block, hi - block.addr)          # the part after stays mapped, listed
        block.mapped = False
        self.reserved -= block.size
        self._merge(block)

    def _oom_text(self):
        return (f"torch_npu expandable segments: no room to map for {self.oom_request} bytes "
                f"({self.reserved} of {self.capacity} mapped)")


cdef void _empty_cache_thunk(object peer) noexcept:
    (<TorchExpandableSegments>peer)._empty_cache()
