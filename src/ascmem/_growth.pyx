# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: binding=False
# A Device's growth: how many bytes each kind took from its upstream, its
# maximum, taking one more chunk when the pools are full and giving idle
# chunks back.  Cimported by ascmem._core (_growth.pxd); the C core through
# its table (CoreCalls).

cimport cython
from libc.stdint cimport uint64_t

from ascmem._core cimport (ASCM_ERR_NOMEM, ASCM_KINDS, ASCM_MAX_CHUNKS, ASCM_OK, CoreCalls,
                           ascm_device, ascm_device_config, core_calls, _fmt_bytes,
                           _as_u64_slow as as_u64, _kind_arg)
from ascmem._upstream cimport _Upstream, _KIND_SHIFT

import threading

from ascmem._upstream import UpstreamError
from ascmem.errors import ArgumentTypeError, AscmemError, InvalidArgumentError
from ascmem.rules import MemKind

cdef const CoreCalls *C = core_calls()

_CHUNK_ALIGN = 2 << 20  # chunks are taken in whole 2 MiB units


cdef int _grow_hook(void *ctx, int kind, uint64_t size, uint64_t align,
                    uint64_t generation) noexcept with gil:
    """The C device asks for another chunk (see ascm_grow_fn)."""
    cdef _Growth g = <_Growth>ctx
    try:
        # a block aligned past the pools' unit (4 KiB: _budget_config) needs
        # room to slide its start to the alignment (csrc/fit.c, take: n +
        # align_units - 1): the chunk is grown by that much more
        if align > 4096:
            size += align - 4096
        return ASCM_OK if g.grow(kind, size, generation) else ASCM_ERR_NOMEM
    except BaseException as e:  # never let an exception cross into C
        g.error = f"growing the pool raised {e!r}"
        return ASCM_ERR_NOMEM


cdef uint64_t _release_hook(void *ctx) noexcept with gil:
    """The C device (torch's empty_cache through the pluggable reset hook)
    asks for idle chunks to go back upstream."""
    try:
        return (<_Growth>ctx).release_idle()
    except BaseException:
        return 0


@cython.final
cdef class _Growth:
    """Each kind's chunks as the upstream sees them: bytes taken, the initial
    (first-chunk) size, the maximum; one growth at a time.  A kind whose
    maximum is above its initial size grows by chunks."""

    def __cinit__(self, _Upstream up, sizes, dict counters):
        self.up = up
        self.lock = threading.Lock()
        self.counters = counters
        for k in range(ASCM_KINDS):
            self.size[k] = self.maximum[k] = sizes[k]

    cdef set_pool_sizes(self, object pool_sizes):
        """The size each pool takes from its upstream: a size, or (initial,
        maximum) for a pool that grows by chunks."""
        cdef uint64_t initial, maximum
        try:
            items = list(dict(pool_sizes).items())
        except (TypeError, ValueError):
            raise ArgumentTypeError("pool_sizes must be a mapping of kind -> size or "
                                    "(initial, maximum)") from None
        for kind, n in items:
            k = _kind_arg(kind)
            if isinstance(n, (tuple, list)):
                if len(n) != 2:
                    raise InvalidArgumentError(f"pool_sizes[{kind!r}]: give a size or (initial, "
                                               f"maximum), not {len(n)} values")
                initial, maximum = as_u64(n[0], "initial pool size"), as_u64(n[1], "maximum pool size")
            else:
                initial = maximum = as_u64(n, "pool size")
            if maximum < initial:
                raise InvalidArgumentError(f"{MemKind(k).name}: maximum pool size {maximum} "
                                           f"is below the initial size {initial}")
            if maximum < _CHUNK_ALIGN or (initial and initial < _CHUNK_ALIGN):
                raise InvalidArgumentError(
                    f"pool_sizes[{kind!r}]: {_fmt_bytes(initial if initial else maximum)} is below "
                    f"the smallest chunk, {_fmt_bytes(_CHUNK_ALIGN)} (sizes are taken in whole "
                    f"2 MiB chunks)")
            self.size[k] = initial // _CHUNK_ALIGN * _CHUNK_ALIGN
            self.maximum[k] = maximum // _CHUNK_ALIGN * _CHUNK_ALIGN
            if self.maximum[k] > self.size[k] and not self.up.holds_memory:
                raise InvalidArgumentError("a pool grows from an upstream: give an initial "
                                           "and a maximum size with backend='host' or 'acl'")

    cdef configure(self, ascm_device_config *cfg):
        """Each kind's first chunk from the upstream, into the C config."""
        for k in range(ASCM_KINDS):
            if self.size[k] >= (<uint64_t>1 << _KIND_SHIFT):
                raise InvalidArgumentError("memory beyond 128 GiB per kind is not modelled")
            if self.maximum[k] < self.size[k]:
                self.maximum[k] = self.size[k]
            cfg.size[k] = self.taken[k] = self.size[k]
            self._count_taken(k, self.size[k])
            cfg.growable[k] = self.maximum[k] > self.size[k]
        self._first_chunks()
        for k in range(ASCM_KINDS):
            cfg.base[k] = self.first_base[k]

    cdef _first_chunks(self):
        bases = self.up.first_chunks([self.size[k] for k in range(ASCM_KINDS)])
        for k in range(ASCM_KINDS):
            self.first_base[k] = bases[k]

    cdef bind(self, ascm_device *d):
        """The C device is made: it asks this for chunks (growable kinds) and
        for idle chunks back (torch's empty_cache)."""
        self.d = d
        if any(self.maximum[k] > self.size[k] for k in range(ASCM_KINDS)):
            C.ascm_device_set_grow(d, _grow_hook, <void *>self)
        if self.up.holds_memory:
            C.ascm_device_set_release(d, _release_hook, <void *>self)

    cdef after_fork(self):
        self.lock = threading.Lock()  # another thread may have held it at fork()

    def grow(self, int k, uint64_t size, uint64_t generation):
        """Called by the C device when kind k's chunks cannot serve size bytes:
        takes one more chunk.  If the kind is at its maximum, or the upstream
        is short, gives back the chunks that hold no live block (this kind's
        first, then every kind's) and tries once more.  True: the request
        should be retried."""
        with self.lock:
            if self.closed:
                return False
            if C.ascm_device_generation(self.d, k) != generation:
                return True  # another thread changed the chunks meanwhile
            need = (size + _CHUNK_ALIGN - 1) // _CHUNK_ALIGN * _CHUNK_ALIGN
            if self.taken[k] + need > self.maximum[k]:
                self.release_empty(k)
            room = self.maximum[k] - self.taken[k]
            if room < need:
                self.error = (f"the {MemKind(k).name} pool is at its maximum: growing by "
                              f"{_fmt_bytes(need)} would pass {_fmt_bytes(self.maximum[k])}, "
                              f"and no chunk is idle")
                return False
            chunk = min(max(need, self.size[k]), room)  # grow by at least the initial size
            addr = self._take(k, chunk)
            if not addr:  # the upstream is short: give back what is cached, try once more
                for kk in range(ASCM_KINDS):
                    self.release_empty(kk)
                chunk = need
                addr = self._take(k, chunk)
                if not addr:
                    self.error += ", also after the free chunks went back"
                    return False
            return self._add(k, addr, chunk)

    cdef uint64_t _take(self, int k, uint64_t size) except? 0:
        """A chunk's base, or 0 with self.error set if the upstream refused."""
        try:
            return self.up.take(k, size)
        except AscmemError as e:
            self.counters["upstream_failures"] += 1
            self.error = (f"the upstream refused {_fmt_bytes(size)} for the {MemKind(k).name} "
                          f"pool ({self.up.describe(e)})")
            return 0

    cdef _count_taken(self, int k, uint64_t size):
        if not size:
            return
        self.total_taken[k] += size
        self.chunks_taken[k] += 1
        self.peak_taken[k] = max(self.peak_taken[k], self.taken[k])
        self.peak_chunks[k] = max(self.peak_chunks[k], self.chunks_taken[k] - self.chunks_given[k])

    cdef bint _add(self, int k, uint64_t addr, uint64_t size) except -1:
        if C.ascm_device_add_chunk(self.d, k, addr, size) != ASCM_OK:
            self.up.give(k, addr, size)
            self.error = f"the {MemKind(k).name} pool holds {ASCM_MAX_CHUNKS} chunks, its most"
            return False
        self.taken[k] += size
        self._count_taken(k, size)
        self.counters["chunks_taken"] += 1
        self.error = None
        return True

    cdef uint64_t release_empty(self, int k) except? 0:
        """Gives kind k's chunks that hold no live block back to the upstream;
        returns the bytes given back.  Call with the lock held."""
        cdef uint64_t bases[ASCM_MAX_CHUNKS]
        cdef uint64_t sizes[ASCM_MAX_CHUNKS]
        cdef int n = 0, i
        cdef uint64_t given = 0
        if self.maximum[k] <= self.size[k] and not self.up.held[k][1:]:
            return 0  # a fixed pool keeps its one chunk
        if C.ascm_device_release_empty(self.d, k, bases, sizes, ASCM_MAX_CHUNKS, &n) != ASCM_OK:
            return 0
        for i in range(n):
            self.up.give(k, bases[i], sizes[i])
            self.taken[k] -= sizes[i]
            self.total_given[k] += sizes[i]
            self.chunks_given[k] += 1
            given += sizes[i]
        self.counters["chunks_given_back"] += n
        return given

    def release_idle(self):
        """Every kind's idle chunks back upstream; the bytes."""
        if self.closed:
            return 0
        with self.lock:
            return sum(self.release_empty(k) for k in range(ASCM_KINDS))

    cdef renew(self):
        """A reset: fresh first chunks (raises with nothing changed if the
        upstream refuses), then every chunk held before is retired -- call
        ascm_device_reset in between (see Device.reset).  Returns the old
        chunks; call with the lock held."""
        old = [list(held) for held in self.up.held]
        try:
            self._first_chunks()
        except UpstreamError:
            if not self.up.drop_quarantine():
                raise
            self._first_chunks()  # the OS had run short of mappings
        return old

    cdef retire(self, list old):
        for k in range(ASCM_KINDS):  # stale pointers into these stay foreign
            for base, size in old[k]:
                self.up.retire(k, base, size)
                self.total_given[k] += size
                self.chunks_given[k] += 1
            if not old[k] and self.size[k]:  # sim: the range is a number, given up all the same
                self.total_given[k] += self.taken[k]
                self.chunks_given[k] += 1
            self.taken[k] = self.size[k]
            self._count_taken(k, self.size[k])

    cdef close(self):
        with self.lock:  # no growth can add a chunk after this
            self.closed = True
            self.up.close()

    cdef str accounting_problem(self, int k, object chunks_of):
        """None, or what is wrong with kind k's chunk accounting.  chunks_of(k):
        the device's chunks, read under the lock every chunk change takes, so
        that another thread's growth cannot fall between the two readings."""
        with self.lock:
            held = self.up.held[k]
            if sum(size for _, size in held) != self.taken[k] or \
                    self.taken[k] > self.maximum[k] or sorted(held) != sorted(chunks_of(k)):
                return f"{MemKind(k).name}: chunk accounting is wrong"
        return None

    cdef str describe(self, int k, int chunks):
        """For an out-of-memory message: the kind's chunks against its maximum."""
        if self.maximum[k] <= self.size[k] and len(self.up.held[k]) <= 1:
            return ""
        text = (f"; {chunks} chunk(s) hold {_fmt_bytes(self.taken[k])} of the pool's "
                f"{_fmt_bytes(self.maximum[k])} maximum")
        return text + (f" ({self.error})" if self.error else "")

    cdef dict kind_stats(self, int k):
        return {"upstream_bytes": self.taken[k], "max_pool_size": self.maximum[k],
                "peak_upstream_bytes": self.peak_taken[k], "upstream_taken": self.total_taken[k],
                "upstream_given": self.total_given[k], "chunks_taken": self.chunks_taken[k],
                "chunks_given": self.chunks_given[k], "peak_chunks": self.peak_chunks[k]}
