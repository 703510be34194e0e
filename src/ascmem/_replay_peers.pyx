# distutils: language = c++
# cython: boundscheck=False, wraparound=False, cdivision=True
"""The peers of replay, fit and plan, compiled: best fit and best fit with
the wilderness rule (ascmem.emulations.reference), torch_npu's caching allocator and
its expandable segments (ascmem.emulations.torch_caching, ascmem.emulations.torch_expandable),
each the same algorithm as its Python reference, which stays the readable
one: tests/test_replay_peers.py plays every shipped trace through both and
compares every figure.  replay_peer plays a trace's columns through one of
them in one loop, with no Python call per event.

The free structures are C++'s ordered sets of (size, address) pairs, the
order the references keep with bisect: the same block is chosen whenever
the references choose it."""

from cython.operator cimport dereference as deref, preincrement as inc
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memset
from libcpp.pair cimport pair
from libcpp.set cimport set as cset
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector

from ascmem.errors import ArgumentTypeError, InvalidArgumentError, OutOfMemoryError

ctypedef pair[uint64_t, uint64_t] SizeAddr
ctypedef cset[SizeAddr] FreeSet

cdef enum:
    _OK = 0
    _NOMEM = 1      # out of memory: the reference raises OutOfMemoryError
    _BADSIZE = 2    # a size the reference refuses (InvalidArgumentError)
    _BADFREE = 3    # not a live block

cdef uint64_t _NOT_LIVE = <uint64_t>-1

# The peers keep their state in C++ containers, which throw std::bad_alloc
# when the host runs out of memory.  Nothing in the Cython code between here
# and CPython catches it, so it would end the process (std::terminate); each
# call into a peer goes through one of these instead, which turns it into a
# status, and the caller raises MemoryError and marks the peer lost (it may
# have been caught half-way through a change).
cdef extern from *:
    """
    #include <new>
    typedef int (*ascm_peer_alloc_fn)(PyObject *, uint64_t, uint64_t *);
    typedef int (*ascm_peer_free_fn)(PyObject *, uint64_t);
    static int ascm_peer_guarded_alloc(ascm_peer_alloc_fn f, PyObject *peer, uint64_t size,
                                       uint64_t *addr) {
        try { return f(peer, size, addr); } catch (const std::bad_alloc &) { return -1; }
    }
    static int ascm_peer_guarded_free(ascm_peer_free_fn f, PyObject *peer, uint64_t addr) {
        try { return f(peer, addr); } catch (const std::bad_alloc &) { return -1; }
    }
    typedef void (*ascm_peer_void_fn)(PyObject *);
    static int ascm_peer_guarded_void(ascm_peer_void_fn f, PyObject *peer) {
        try { f(peer); return 0; } catch (const std::bad_alloc &) { return -1; }
    }
    static void ascm_peer_throw_bad_alloc(void) { throw std::bad_alloc(); }
    static uint64_t *ascm_peer_map_slot(std::unordered_map<uint64_t, uint64_t> &m, uint64_t k) {
        return &m[k];
    }
    /* Cython's own declarations of set::insert and vector::push_back are
     * `except +`: it catches their bad_alloc itself, and in a noexcept
     * method only prints "Exception ignored" and goes on with the element
     * lost.  Called through these, the exception reaches the guards. */
    template <class C, class V> static inline void ascm_peer_insert(C &c, const V &v) { c.insert(v); }
    template <class C, class V> static inline void ascm_peer_push_back(C &c, const V &v) { c.push_back(v); }
    """
    ctypedef int (*_alloc_fn "ascm_peer_alloc_fn")(object, uint64_t, uint64_t *) noexcept
    ctypedef int (*_free_fn "ascm_peer_free_fn")(object, uint64_t) noexcept
    int _guarded_alloc "ascm_peer_guarded_alloc"(_alloc_fn, object, uint64_t, uint64_t *) noexcept
    int _guarded_free "ascm_peer_guarded_free"(_free_fn, object, uint64_t) noexcept
    ctypedef void (*_void_fn "ascm_peer_void_fn")(object) noexcept
    int _guarded_void "ascm_peer_guarded_void"(_void_fn, object) noexcept
    void _throw_bad_alloc "ascm_peer_throw_bad_alloc"() noexcept
    uint64_t *_map_slot "ascm_peer_map_slot"(unordered_map[uint64_t, uint64_t] &, uint64_t) except +
    void _insert "ascm_peer_insert"(FreeSet &, SizeAddr) noexcept


cdef int _alloc_thunk(object peer, uint64_t size, uint64_t *addr) noexcept:
    return (<_Peer>peer).c_alloc(size, addr)


cdef int _free_thunk(object peer, uint64_t addr) noexcept:
    return (<_Peer>peer).c_free(addr)


cdef int _refuse_if_lost(_Peer peer) except -1:
    if peer.lost:
        raise MemoryError(_lost_text(peer))
    return 0


cdef int _lost_if_caught(_Peer peer, int st) except -1:
    """st, or MemoryError (the peer marked lost) when a guard caught bad_alloc."""
    if st < 0:
        peer.lost = True
        raise MemoryError(_lost_text(peer))
    return st


cdef int _peer_alloc(_Peer peer, uint64_t size, uint64_t *addr) except -1:
    """peer.c_alloc, with the host's out-of-memory as MemoryError."""
    _refuse_if_lost(peer)
    return _lost_if_caught(peer, _guarded_alloc(_alloc_thunk, peer, size, addr))


cdef int _peer_free(_Peer peer, uint64_t addr) except -1:
    """peer.c_free, with the host's out-of-memory as MemoryError."""
    _refuse_if_lost(peer)
    return _lost_if_caught(peer, _guarded_free(_free_thunk, peer, addr))


cdef int _peer_call(_Peer peer, _void_fn f) except -1:
    """f(peer), with the host's out-of-memory as MemoryError."""
    _refuse_if_lost(peer)
    return _lost_if_caught(peer, _guarded_void(f, peer))


def _lost_text(peer):
    return (f"the host ran out of memory inside {type(peer).__name__}; its state may be "
            f"half-changed, so it refuses further calls: make a new one")


cdef class _Peer:
    """What replay_peer calls: alloc and free with no Python in between.
    The Python methods alloc, free and usable_size make these allocators
    drop-in replacements for their references."""
    cdef uint64_t oom_size        # the request of the last out-of-memory, for its message
    cdef bint curve_reserved      # the replay's curve is what it reserves, not what it hands out
    cdef object error             # an exception a Python part raised (tlsf's binding), to raise
    cdef bint lost                # the host ran out of memory inside a call (_peer_alloc)

    cdef int c_alloc(self, uint64_t size, uint64_t *addr) noexcept:
        return _NOMEM

    cdef int c_free(self, uint64_t addr) noexcept:
        return _BADFREE

    cdef uint64_t c_usable(self, uint64_t addr) noexcept:
        return 0

    cdef uint64_t c_reserved(self) noexcept:
        return 0

    def _oom_text(self):
        return "out of memory"

    def alloc(self, size, align=64):
        cdef uint64_t addr = 0
        cdef int st = _peer_alloc(self, _size_arg(size), &addr)
        if st == _NOMEM:
            raise OutOfMemoryError(self._oom_text())
        if st == _BADSIZE:
            self._raise_error()
            raise InvalidArgumentError("size must be positive")
        return addr

    def free(self, addr):
        if _peer_free(self, _addr_arg(addr)) != _OK:
            self.error = None  # a block the binding did not know: the same error as the others
            raise InvalidArgumentError(f"{addr:#x} is not a live block")

    def _raise_error(self):
        """Raises what a Python part raised, if anything."""
        if self.error is not None:
            exc, self.error = self.error, None
            raise exc

    def usable_size(self, addr):
        cdef uint64_t a = _addr_arg(addr)
        cdef uint64_t n = self.c_usable(a)
        if n == _NOT_LIVE:
            raise InvalidArgumentError(f"{a:#x} is not a live block")
        return n


cdef uint64_t _size_arg(object size) except? 0:
    if isinstance(size, bool) or not isinstance(size, int):
        raise InvalidArgumentError(f"size must be an int, not {size!r}")
    if size < 0 or size >= 1 << 62:
        raise InvalidArgumentError(f"size {size} is out of range")
    return size


cdef uint64_t _addr_arg(object addr) except? 0:
    if isinstance(addr, bool) or not isinstance(addr, int) or not 0 <= addr < 1 << 64:
        raise InvalidArgumentError(f"{addr!r} is not a block's address")
    return addr


def check_columns(what, columns):
    """ArgumentTypeError unless each (name, array, dtype) of columns is a
    one-dimensional contiguous numpy array of that dtype, and
    InvalidArgumentError unless they are all as long: what the compiled
    loops read (a typed error, not the buffer protocol's ValueError)."""
    import numpy as np
    n = None
    for name, array, dtype in columns:
        if not isinstance(array, np.ndarray) or array.dtype != np.dtype(dtype) or \
                array.ndim != 1 or not array.flags.c_contiguous:
            got = type(array).__name__
            if isinstance(array, np.ndarray):
                got = f"{array.dtype} array of shape {array.shape}" + \
                    ("" if array.flags.c_contiguous else ", not contiguous")
            raise ArgumentTypeError(f"{what}: the {name} column must be a contiguous "
                                    f"one-dimensional {dtype} array, not a {got}")
        if n is not None and len(array) != n:
            raise InvalidArgumentError(f"{what}: the columns differ in length")
        n = len(array)


# ---- best fit (ascmem.emulations.reference.BestFit, BestFitWilderness) ---------------------------

cdef class BestFit(_Peer):
    """ascmem.emulations.reference.BestFit, compiled: the smallest free block that fits
    (lowest address among equals), split; a freed block merges with both
    neighbours."""
    cdef FreeSet by_size
    cdef unordered_map[uint64_t, uint64_t] free_at    # offset -> size of a free block
    cdef unordered_map[uint64_t, uint64_t] free_end   # end offset -> start of a free block
    cdef unordered_map[uint64_t, uint64_t] used       # offset -> size of a live block
    cdef readonly uint64_t granule, capacity
    cdef bint wilderness
    cdef uint64_t _high_water

    def __init__(self, capacity, granule=64):
        if isinstance(granule, bool) or not isinstance(granule, int) or granule <= 0:
            raise InvalidArgumentError(f"granule must be a positive int, not {granule!r}")
        self.granule = granule
        self.capacity = _size_arg(capacity) // self.granule * self.granule
        self._add_free(0, self.capacity)

    cdef inline void _add_free(self, uint64_t off, uint64_t size) noexcept:
        self.free_at[off] = size
        self.free_end[off + size] = off
        _insert(self.by_size, SizeAddr(size, off))

    cdef inline uint64_t _remove_free(self, uint64_t off) noexcept:
        cdef uint64_t size = self.free_at[off]
        self.free_at.erase(off)
        self.free_end.erase(off + size)
        self.by_size.erase(SizeAddr(size, off))
        return size

    cdef int c_alloc(self, uint64_t size, uint64_t *addr) noexcept:
        cdef uint64_t need = (size + self.granule - 1) // self.granule * self.granule
        cdef uint64_t off, block, end = 0
        cdef FreeSet.iterator it = self.by_size.lower_bound(SizeAddr(need, 0))
        cdef bint has_end = False
        if self.wilderness:  # the untouched end is taken only when no other block fits
            has_end = self.free_end.count(self.capacity) != 0
            if has_end:
                end = self.free_end[self.capacity]
            if it != self.by_size.end() and has_end and deref(it).second == end:
                inc(it)
            if it == self.by_size.end():
                if not has_end or self.free_at[end] < need:
                    self.oom_size = need
                    return _NOMEM
                off = end
            else:
                off = deref(it).second
        else:
            if it == self.by_size.end():
                self.oom_size = need
                return _NOMEM
            off = deref(it).second
        block = self._remove_free(off)
        if block > need:
            self._add_free(off + need, block - need)
        self.used[off] = need
        if off + need > self._high_water:
            self._high_water = off + need
        addr[0] = off
        return _OK

    cdef int c_free(self, uint64_t off) noexcept:
        cdef unordered_map[uint64_t, uint64_t].iterator it = self.used.find(off)
        cdef uint64_t size, prev
        if it == self.used.end():
            return _BADFREE
        size = deref(it).second
        self.used.erase(it)
        if self.free_at.count(off + size):          # merge with the next block
            size += self._remove_free(off + size)
        if self.free_end.count(off):                # and with the previous one
            prev = self.free_end[off]
            size += self._remove_free(prev)
            off = prev
        self._add_free(off, size)
        return _OK

    cdef uint64_t c_usable(self, uint64_t off) noexcept:
        cdef unordered_map[uint64_t, uint64_t].iterator it = self.used.find(off)
        return _NOT_LIVE if it == self.used.end() else deref(it).second

    def _oom_text(self):
        return f"best fit: no free block of {self.oom_size} bytes"


cdef class BestFitWilderness(BestFit):
    """ascmem.emulations.reference.BestFitWilderness, compiled.  high_water: the highest
    end of a block so far."""

    def __init__(self, capacity, granule=64):
        super().__init__(capacity, granule)
        self.wilderness = True

    @property
    def high_water(self):
        return self._high_water


def bestfit_unmapped_peak(alloc, slot, size, granule):
    """ascmem.emulations.reference.bestfit_unmapped_peak over a trace's columns (slot:
    Trace.slots()): the most bytes in whole granules that best fit keeps
    mapped when it unmaps every granule no live block touches."""
    if isinstance(granule, bool) or not isinstance(granule, int) or granule <= 0:
        raise InvalidArgumentError(f"granule must be a positive int, not {granule!r}")
    cdef const uint8_t[::1] al
    cdef const int64_t[::1] sl
    cdef const uint64_t[::1] sz
    check_columns("bestfit_unmapped_peak", (("alloc", alloc, "uint8"), ("slot", slot, "int64"),
                                            ("size", size, "uint64")))
    al, sl, sz = alloc, slot, size
    cdef Py_ssize_t n = al.shape[0], i, slots = 0
    for i in range(n):
        slots += al[i]
    cdef BestFit fit = BestFit(1 << 46)
    cdef uint64_t g = granule, off, first, last, j, mapped = 0, peak = 0, usable
    cdef vector[uint64_t] ptr
    ptr.resize(slots + 1, _NOT_LIVE)  # resize, not assign: Cython's assign lets bad_alloc through
    cdef unordered_map[uint64_t, uint64_t] refs   # granule -> live blocks touching it
    cdef uint64_t *count
    cdef int64_t s
    for i in range(n):
        s = sl[i]
        if al[i]:
            if s < 0 or s >= slots:
                raise InvalidArgumentError(f"event {i}: slot {s} is not an allocation's "
                                           f"ordinal (0 to {slots - 1})")
            if _peer_alloc(fit, sz[i], &off) != _OK:
                raise OutOfMemoryError(fit._oom_text())
            ptr[s] = off
            usable = fit.c_usable(off)
            first, last = off // g, (off + (usable if usable > 1 else 1) - 1) // g
            for j in range(first, last + 1):
                count = _map_slot(refs, j)
                if count[0] == 0:
                    mapped += 1
                count[0] += 1
            if mapped > peak:
                peak = mapped
        elif 0 <= s < slots and ptr[s] != _NOT_LIVE:
            off = ptr[s]
            ptr[s] = _NOT_LIVE
            usable = fit.c_usable(off)
            first, last = off // g, (off + (usable if usable > 1 else 1) - 1) // g
            _peer_free(fit, off)
            for j in range(first, last + 1):
                refs[j] -= 1
                if refs[j] == 0:
                    refs.erase(j)
                    mapped -= 1
    return peak * g


# ---- tlsfallocator ---------------------------------------------------------------------

cdef class TlsfPeer(_Peer):
    """tlsfallocator's OffsetAllocator over capacity bytes in 64-byte units,
    as a peer: the one peer whose every allocate and free is a Python call
    (into its pybind11 binding); the loop around them is compiled."""
    cdef object _a, _allocate, _release
    cdef dict _live                    # address -> its OffsetAllocation
    cdef unordered_map[uint64_t, uint64_t] held   # address -> its size in whole units
    cdef readonly uint64_t capacity

    def __init__(self, capacity):
        import TLSFAllocator
        cdef uint64_t units = _size_arg(capacity) // 64
        if units >= (<uint64_t>1) << 32:
            raise InvalidArgumentError("tlsfallocator manages at most 2^32 units")
        self._a = TLSFAllocator.OffsetAllocator(units, 1 << 20)
        self._allocate, self._release = self._a.allocate, self._a.free
        self._live = {}
        self.capacity = capacity

    cdef int c_alloc(self, uint64_t size, uint64_t *addr) noexcept:
        cdef uint64_t offset
        try:
            got = self._allocate((size + 63) // 64)
            offset = got.offset
        except BaseException as exc:
            self.error = exc
            return _BADSIZE
        if offset == 0xFFFFFFFF:
            self.oom_size = size
            return _NOMEM
        addr[0] = offset * 64
        self._live[addr[0]] = got
        self.held[addr[0]] = (size + 63) // 64 * 64
        return _OK

    cdef int c_free(self, uint64_t addr) noexcept:
        try:
            self._release(self._live.pop(addr))
        except BaseException as exc:
            self.error = exc
            return _BADFREE
        self.held.erase(addr)
        return _OK

    cdef uint64_t c_usable(self, uint64_t addr) noexcept:
        cdef unordered_map[uint64_t, uint64_t].iterator it = self.held.find(addr)
        return _NOT_LIVE if it == self.held.end() else deref(it).second

    def _oom_text(self):
        return f"tlsfallocator: no room for {self.oom_size} bytes"


# ---- the replay loop ------------------------------------------------------------------

def replay_peer(_Peer peer, alloc, slot, size, kind, bint stop_at_failure=False,
                bint curve=False, progress=None, Py_ssize_t block=1 << 18):
    """Plays a trace's columns through a compiled peer as replay() does
    with an object with alloc and free.  Returns a dict: peak_live,
    peak_used, failures, first_failure (the event index, or -1),
    first_error (its OutOfMemoryError), kind_peaks ([(kind code, peak)] in
    the order the kinds first held a block), curve (with curve: after each
    event that changed something, what the peer reserves for a caching one,
    else the bytes it hands out; an int64 array).  Everything still live at
    the end is then freed.  progress(i, n) is called between blocks."""
    import numpy as np
    cdef const uint8_t[::1] al
    cdef const int64_t[::1] sl
    cdef const uint64_t[::1] sz
    cdef const uint8_t[::1] kd
    check_columns("replay_peer", (("alloc", alloc, "uint8"), ("slot", slot, "int64"),
                                  ("size", size, "uint64"), ("kind", kind, "uint8")))
    al, sl, sz, kd = alloc, slot, size, kind
    cdef Py_ssize_t n = al.shape[0], i, slots = 0, points = 0, stop
    for i in range(n):
        slots += al[i]
    cdef vector[uint64_t] ptr
    cdef vector[uint64_t] held
    ptr.resize(slots + 1, _NOT_LIVE)
    held.resize(slots + 1, 0)
    out_curve = np.empty(n if curve else 0, np.int64)
    cdef int64_t[::1] pts = out_curve
    cdef int64_t live = 0, used = 0, peak_live = 0, peak_used = 0, nb, s
    cdef int64_t kind_live[8]
    cdef int64_t kind_peak[8]
    memset(kind_live, 0, sizeof(kind_live))
    memset(kind_peak, 0, sizeof(kind_peak))
    order = []
    cdef int seen = 0, st
    cdef uint8_t k
    cdef uint64_t addr, usable, failures = 0
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
                        raise InvalidArgumentError(f"event {i}: slot {s} is not an "
                                                   f"allocation's ordinal (0 to {slots - 1})")
                    st = _peer_alloc(peer, sz[i], &addr)
                    if st != _OK:
                        if st != _NOMEM:
                            peer._raise_error()
                            raise InvalidArgumentError(f"event {i}: size must be positive")
                        failures += 1
                        if first < 0:
                            first, first_error = i, OutOfMemoryError(peer._oom_text())
                        i += 1
                        if stop_at_failure:
                            i = n
                            break
                        continue
                    usable = peer.c_usable(addr)
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
                    if _peer_free(peer, ptr[s]) != _OK:
                        peer._raise_error()
                        raise InvalidArgumentError(f"event {i}: the peer refused the free of "
                                                   f"{ptr[s]:#x}")
                    ptr[s] = _NOT_LIVE
                    live -= nb
                    used -= <int64_t>held[s]
                    kind_live[k] -= nb
                else:  # its allocation failed: nothing changes, no point on the curve
                    i += 1
                    continue
                if curve:
                    pts[points] = <int64_t>(peer.c_reserved() if peer.curve_reserved else used)
                    points += 1
                i += 1
            if progress is not None and i < n:
                progress(i, n)
    finally:
        for j in range(slots):  # give everything back, as replay() does
            if ptr[j] != _NOT_LIVE and not peer.lost:
                _peer_free(peer, ptr[j])
    return {"peak_live": peak_live, "peak_used": peak_used, "failures": failures,
            "first_failure": first, "first_error": first_error,
            "kind_peaks": [(c, kind_peak[c]) for c in order],
            "curve": out_curve[:points] if curve else None}


include "_replay_torch.pxi"
