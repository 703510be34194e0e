# Device: the CANN-rule facade over one pool per memory kind (included by
# _core.pyx so that its hot path is compiled with the pools').
#
# Threads and locks: no C lock holder ever waits for the GIL (walks gather
# into C memory, hooks run with no lock held), so a thread holding the GIL
# may spin on a pool lock.  Callers without the GIL pass the C device's gate;
# reset and close shut it, without the GIL, before they free anything.  The
# methods here hold the GIL, which reset and close also hold while they free
# (ascm_device_reset never releases it), so they use the *_held calls and
# skip the gate's two atomic operations per call.

import os
import threading
import weakref

from ascmem import profiles as _profiles
from ascmem.errors import (AscmemError, DeviceClosedError, MisalignedError, PrecautionWarning,
                           UnsupportedError)
from ascmem.rules import MemAttr, MemKind, MEDIA_ALIGN

cdef uint64_t _MiB = 1 << 20
cdef uint64_t _GiB = 1 << 30
# Simulated address layout: devices 64 TiB apart, each reset moves the device's
# ranges by 1 TiB (64 epochs before addresses repeat), kinds 128 GiB apart.
cdef int _DEVICE_SHIFT = 46
cdef int _EPOCH_SHIFT = 40
cdef int _EPOCHS = 64
cdef int _KIND_SHIFT = 37

cdef unsigned _DEVICE_MASK = (1 << ASCM_KIND_HUGE) | (1 << ASCM_KIND_NORMAL) | (1 << ASCM_KIND_HUGE1G)
cdef unsigned _DVPP_MASK = 1 << ASCM_KIND_DVPP
cdef unsigned _HOST_MASK = 1 << ASCM_KIND_HOST
cdef uint64_t _GUARD = 64             # debug mode: bytes written after each block
cdef uint64_t _NO_DEVICE_HAS = 1ull << 62  # larger requests fail in routing (no wrap with the guard)
_GUARD_BYTES = bytes([0xAB]) * 64

_BACKENDS = ("sim", "host", "acl")
_CAUSE_TEXT = {
    ASCM_EVENT_HUGE_FALLBACK: "a HUGE_FIRST request above 1 MiB found no huge pages and got "
                              "normal pages instead",
    ASCM_EVENT_RESERVE_FULL: "the huge-page reserve is used up and cannot grow in RC mode",
    ASCM_EVENT_MEDIA_90: "the media (DVPP) address window is more than 90% full",
}

# Devices alive in this process: a child of fork() gets fresh Python locks
# (a lock another thread held in the parent would stay held in the child).
_live_devices = weakref.WeakSet()


def _devices_after_fork():
    for dev in list(_live_devices):
        (<Device>dev)._grow_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_devices_after_fork)


cdef int _grow_hook(void *ctx, int kind, uint64_t size, uint64_t align,
                    uint64_t generation) noexcept with gil:
    """The C device asks for another chunk (see ascm_grow_fn)."""
    cdef Device dev = <Device>ctx
    try:
        return ASCM_OK if dev._grow(kind, size, generation) else ASCM_ERR_NOMEM
    except BaseException as e:  # never let an exception cross into C
        dev._upstream_error = f"growing the pool raised {e!r}"
        return ASCM_ERR_NOMEM


cdef uint64_t _release_hook(void *ctx) noexcept with gil:
    """The C device (torch's empty_cache through the pluggable reset hook)
    asks for idle chunks to go back upstream."""
    try:
        return (<Device>ctx)._release_idle()
    except BaseException:
        return 0


cdef inline int _kind_arg(object kind) except -1:
    """A MemKind, its value or its name (any case) as a kind number."""
    try:
        if isinstance(kind, str):
            return int(MemKind[kind.upper()])
        return int(MemKind(kind))
    except (KeyError, ValueError, TypeError):
        raise InvalidArgumentError(f"unknown memory kind {kind!r}; known: "
                                   f"{', '.join(k.name.lower() for k in MemKind)}") from None


cdef inline _check_stream(object stream):
    """Streams are dictionary keys: an unhashable one is refused up front,
    before anything has changed."""
    try:
        hash(stream)
    except TypeError:
        raise ArgumentTypeError(f"a stream must be hashable (a pyACL stream handle, a name, "
                                f"...), not {type(stream).__name__}") from None


@cython.final
cdef class Device:
    """Device(model='atlas-inference', *, mode=None, backend='sim', device_id=0, memory=None, free_os_memory=None, aicpu_cache=None, host_memory=4294967296, limit=None, pool_sizes=None, acl_module=None)
--

    An Ascend device: one pool per memory kind, one physical budget, the
    CANN rules.

    ``model``: a profile name or alias (``ascmem.profiles.names()``,
    ``ascmem info --list``).
    ``mode``: "EP" or "RC" (default: the product's first).
    ``backend``: "sim" (addresses only), "host" (real memory from mmap) or
    "acl" (chunks from the CANN runtime through pyACL).
    ``device_id``: the device's number (simulated ranges of different ids never
    overlap; the pluggable functions use it as the device index).
    ``memory`` / ``free_os_memory``: override the profile's bytes.
    ``aicpu_cache``: bytes the first job takes on products that cache AI CPU
    operators (default: the upper bound).
    ``host_memory``: size of the host (aclrtMallocHost) pool.
    ``limit``: cap on huge + normal + runtime memory in bytes (as set_limit).
    ``pool_sizes``: host and acl backends: the bytes each kind takes from its
    upstream, ``{"normal": size}``, or ``{"normal": (initial, maximum)}`` for a
    pool that grows by chunks (at least 2 MiB each).
    ``acl_module``: the pyACL module to use with backend="acl" (default:
    ``import acl``).

    ``with Device(...) as dev:`` closes the device at the end.
    """

    def __cinit__(self, model="atlas-inference", *, mode=None, backend="sim", device_id=0,
                  memory=None, free_os_memory=None, aicpu_cache=None, host_memory=4 << 30,
                  limit=None, pool_sizes=None, acl_module=None):
        self._d = NULL
        self._closed = False
        prof = _profiles.get(model)
        mode = prof.default_mode if mode is None else str(mode).upper()
        if mode not in prof.modes:
            raise UnsupportedError(f"{prof.title} has no {mode} mode (it has: "
                                   f"{', '.join(prof.modes)})")
        if not isinstance(backend, str) or backend not in _BACKENDS:
            raise InvalidArgumentError(f"unknown backend {backend!r}; known: {', '.join(_BACKENDS)}")
        cdef uint64_t did = as_u64(device_id, "device_id")
        if did >= (1 << (64 - _DEVICE_SHIFT)) - 1:
            raise InvalidArgumentError(f"device_id {device_id} is too large")
        self.profile = prof
        self.mode = mode
        self.backend = backend
        self.device_id = <int>did
        self._epoch = 0
        self._warned = set()
        self._counters = {"huge_fallbacks": 0, "oom_retries": 0, "chunks_taken": 0,
                          "chunks_given_back": 0, "upstream_failures": 0}
        self._pending = {}
        self._pending_by_addr = {}
        self._recorded = {}
        self._views = {}
        self._upstream_error = None
        self._grow_lock = threading.Lock()
        self._guards = {}
        self._debug = backend == "host" and os.environ.get("ASCMEM_DEBUG", "") == "1"
        self._oom_callback = None
        cdef ascm_device_config cfg
        memset(&cfg, 0, sizeof(cfg))
        self._layout(&cfg, memory, free_os_memory, aicpu_cache, host_memory, limit)
        if pool_sizes:
            self._pool_sizes(pool_sizes)
        elif backend == "acl":  # the runtime gives what the budget allows, not address space
            self._acl_sizes(cfg.budget.reserve, cfg.budget.reserve + cfg.budget.shared)
        for k in range(ASCM_KINDS):
            if self._sizes[k] >= (<uint64_t>1 << _KIND_SHIFT):
                raise InvalidArgumentError("memory beyond 128 GiB per kind is not modelled")
            cfg.size[k] = self._sizes[k]
            if self._max[k] < self._sizes[k]:
                self._max[k] = self._sizes[k]
            cfg.growable[k] = self._max[k] > self._sizes[k]
            self._taken[k] = self._sizes[k]
        if backend == "acl":
            if acl_module is None:
                try:
                    import acl as acl_module
                except ImportError:
                    raise UnsupportedError("backend='acl' needs pyACL (`import acl` failed); use "
                                           "backend='sim' or 'host' without an Ascend runtime") from None
            self._acl = acl_module
        # the upstream owns every chunk it hands out, and gives them back when
        # it is collected: a constructor that fails below loses nothing
        self._up = _make_upstream(backend, acl_module)
        self._first_chunks(self._real_base)
        self._bases(cfg.base)
        cdef int st = ascm_device_create(&cfg, &self._d)
        if st != ASCM_OK:
            raise OutOfMemoryError("host memory for the device's metadata ran out")
        if any(cfg.growable[k] for k in range(ASCM_KINDS)):
            ascm_device_set_grow(self._d, _grow_hook, <void *>self)
        if backend != "sim":
            ascm_device_set_release(self._d, _release_hook, <void *>self)
        _live_devices.add(self)

    cdef _layout(self, ascm_device_config *cfg, memory, free_os_memory, aicpu_cache,
                 host_memory, limit):
        """The budget and each kind's first-chunk size, from the profile."""
        prof = self.profile
        mem = prof.memory if memory is None else as_u64(memory, "memory")
        if free_os_memory is not None:
            free_os = as_u64(free_os_memory, "free_os_memory")
        elif memory is None:
            free_os = prof.free_os_memory
        else:
            free_os = mem * prof.free_os_memory // prof.memory
        if free_os > mem or free_os < 8 * _MiB:
            raise InvalidArgumentError("free OS memory must be at least 8 MiB and at most the "
                                       "device memory")
        if aicpu_cache is not None:
            lo, hi = prof.aicpu_cache
            aicpu_cache = as_u64(aicpu_cache, "aicpu_cache")
            if not hi or not lo <= aicpu_cache <= hi:
                raise InvalidArgumentError(
                    f"aicpu_cache must lie in {lo}-{hi} bytes for {prof.name}" if hi else
                    f"{prof.name} has no AI CPU operator cache")
        self._fixed_taken = 0
        self._aicpu = prof.aicpu_cache[1] if aicpu_cache is None else aicpu_cache
        cdef uint64_t app = free_os // (2 * _MiB) * (2 * _MiB)
        cdef uint64_t reserve = prof.huge_reserve(free_os)
        cfg.min_block = 4096
        cfg.p2p = prof.p2p
        cfg.budget.reserve = reserve
        cfg.budget.shared = app - reserve
        cfg.budget.huge_grows = self.mode == "EP"
        cfg.budget.fixed = 0
        cfg.budget.limit = 0 if limit is None else as_u64(limit, "limit")
        self._sizes[ASCM_KIND_HUGE] = app if cfg.budget.huge_grows else reserve
        self._sizes[ASCM_KIND_NORMAL] = app - reserve
        self._sizes[ASCM_KIND_DVPP] = min(<uint64_t>prof.media_window, app)
        self._sizes[ASCM_KIND_HOST] = as_u64(host_memory, "host_memory") // 4096 * 4096
        self._sizes[ASCM_KIND_HUGE1G] = (app // _GiB * _GiB) if prof.huge1g else 0
        for k in range(ASCM_KINDS):
            self._max[k] = 0

    cdef _pool_sizes(self, object pool_sizes):
        """The size each pool takes from its upstream (host, acl): a size, or
        (initial, maximum) for a pool that grows by chunks."""
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
            self._sizes[k] = initial // _CHUNK_ALIGN * _CHUNK_ALIGN
            self._max[k] = maximum // _CHUNK_ALIGN * _CHUNK_ALIGN
            if self._max[k] > self._sizes[k] and self.backend == "sim":
                raise InvalidArgumentError("a pool grows from an upstream: give an initial "
                                           "and a maximum size with backend='host' or 'acl'")

    cdef _acl_sizes(self, uint64_t reserve, uint64_t app):
        self._sizes[ASCM_KIND_HUGE] = (reserve or app // 2) // (2 << 20) * (2 << 20)
        self._sizes[ASCM_KIND_NORMAL] = (app - self._sizes[ASCM_KIND_HUGE]) // 2 // 4096 * 4096
        self._sizes[ASCM_KIND_DVPP] = min(self._sizes[ASCM_KIND_DVPP], app // 4) // (2 << 20) * (2 << 20)
        self._sizes[ASCM_KIND_HOST] = min(self._sizes[ASCM_KIND_HOST], 1 << 30)
        self._sizes[ASCM_KIND_HUGE1G] = 0

    cdef _first_chunks(self, uint64_t *out):
        """Each kind's first chunk from the upstream, all or nothing: if one is
        refused, the ones taken here go back and the error is raised."""
        cdef uint64_t got[5]
        cdef int k
        taken = []
        for k in range(ASCM_KINDS):
            got[k] = 0
            if not self._sizes[k] or self.backend == "sim":
                continue
            try:
                got[k] = self._up.take(k, self._sizes[k])
            except BaseException:
                for kk, base in taken:
                    self._up.give(kk, base, self._sizes[kk])
                raise
            taken.append((k, got[k]))
        for k in range(ASCM_KINDS):
            out[k] = got[k]

    # ---- growing from the upstream ------------------------------------------------

    def _grow(self, int k, uint64_t size, uint64_t generation):
        """Called by the C device when kind k's chunks cannot serve size bytes:
        takes one more chunk from the upstream.  If the kind is at its maximum,
        or the upstream is short, gives back the chunks that hold no live block
        (this kind's first, then every kind's) and tries once more.  True:
        the request should be retried."""
        with self._grow_lock:
            if self._closed:
                return False
            if ascm_device_generation(self._d, k) != generation:
                return True  # another thread changed the chunks meanwhile
            need = (size + _CHUNK_ALIGN - 1) // _CHUNK_ALIGN * _CHUNK_ALIGN
            want = max(need, self._sizes[k])  # grow by at least the initial size
            if self._taken[k] + need > self._max[k]:
                self._release_empty(k)
            room = self._max[k] - self._taken[k]
            if room < need:
                self._upstream_error = (f"the {MemKind(k).name} pool is at its maximum: "
                                        f"growing by {_fmt_bytes(need)} would pass "
                                        f"{_fmt_bytes(self._max[k])}, and no chunk is idle")
                return False
            chunk = min(want, room)
            addr, err = self._upstream_take(k, chunk)
            if err:  # the upstream is short: give back what is cached, try once more
                self._counters["upstream_failures"] += 1
                for kk in range(ASCM_KINDS):
                    self._release_empty(kk)
                chunk = need
                addr, err = self._upstream_take(k, chunk)
                if err:
                    self._counters["upstream_failures"] += 1
                    self._upstream_error = (f"the upstream refused {_fmt_bytes(chunk)} for the "
                                            f"{MemKind(k).name} pool ({err}), also after the "
                                            f"free chunks went back")
                    return False
            if ascm_device_add_chunk(self._d, k, addr, chunk) != ASCM_OK:
                self._up.give(k, addr, chunk)
                self._upstream_error = (f"the {MemKind(k).name} pool holds {ASCM_MAX_CHUNKS} "
                                        f"chunks, its most")
                return False
            self._taken[k] += chunk
            self._counters["chunks_taken"] += 1
            self._upstream_error = None
            return True

    def _upstream_take(self, int k, uint64_t size):
        """(address, None), or (0, why) if the upstream refused."""
        try:
            return self._up.take(k, size), None
        except AscmemError as e:
            return 0, f"code {e.code}" if isinstance(self._up, _AclUpstream) else str(e)

    def _release_empty(self, int k):
        """Gives kind k's chunks that hold no live block back to the upstream;
        returns the bytes given back.  Call with _grow_lock held."""
        cdef uint64_t bases[ASCM_MAX_CHUNKS]
        cdef uint64_t sizes[ASCM_MAX_CHUNKS]
        cdef int n = 0, i
        if self._max[k] <= self._sizes[k] and not self._up.held[k][1:]:
            return 0  # a fixed pool keeps its one chunk
        if ascm_device_release_empty(self._d, k, bases, sizes, ASCM_MAX_CHUNKS, &n) != ASCM_OK:
            return 0
        given = 0
        for i in range(n):
            self._up.give(k, bases[i], sizes[i])
            self._taken[k] -= sizes[i]
            given += sizes[i]
        self._counters["chunks_given_back"] += n
        return given

    def _release_idle(self):
        """Every kind's idle chunks back upstream (the pluggable reset hook)."""
        if self._closed:
            return 0
        with self._grow_lock:
            return sum(self._release_empty(k) for k in range(ASCM_KINDS))

    def chunks(self, kind):
        """(base, size) of each chunk a kind holds now, first one first."""
        cdef int k = _kind_arg(kind)
        cdef uint64_t base, size
        out = []
        for i in range(ascm_device_chunk_count(self._d, k)):
            ascm_device_chunk(self._d, k, i, &base, &size)
            out.append((base, size))
        return out

    # ---- lifetime ---------------------------------------------------------------

    def close(self):
        """Gives every chunk back to the upstream (the OS, the runtime).  After
        close, every allocation, free and view raises DeviceClosedError, also
        for callers without the GIL (which get ASCM_ERR_CLOSED); statistics
        stay readable.  Idempotent."""
        if self._closed:
            return
        if self._views:
            raise InvalidArgumentError(f"close: {sum(self._views.values())} buffer views of "
                                       f"device memory are still alive")
        self._closed = True
        if self._d is not NULL:
            with nogil:
                ascm_device_close(self._d)  # waits out callers inside
        self._drop_pending_events()
        with self._grow_lock:  # no growth can add a chunk after this
            self._up.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    cdef _require_open(self, str call):
        if self._closed:
            raise DeviceClosedError(f"{call}: device {self.device_id} is closed")

    cdef _bases(self, uint64_t *out):
        if self.backend in ("host", "acl"):
            for k in range(ASCM_KINDS):
                out[k] = self._real_base[k]
            return
        cdef uint64_t top = (<uint64_t>(self.device_id + 1) << _DEVICE_SHIFT) | \
            (<uint64_t>(self._epoch % _EPOCHS) << _EPOCH_SHIFT)
        for k in range(ASCM_KINDS):
            out[k] = top | (<uint64_t>k << _KIND_SHIFT)

    def __dealloc__(self):
        # In a reference cycle the collector may have cleared the object
        # fields (None) before this runs; the upstream then gave its chunks
        # back when it was cleared.
        cdef ascm_pool *p
        if self._d is not NULL:
            for k in range(ASCM_KINDS):
                for i in range(ascm_device_chunk_count(self._d, k)):
                    p = ascm_device_chunk(self._d, k, i, NULL, NULL)
                    if p is not NULL and not self._pending_by_addr and not self._closed:
                        _warn_leaks(f"Device {self.device_id}", p, MemKind(k).name)
            ascm_device_destroy(self._d)
            self._d = NULL
        up = self._up
        if up is not None:
            try:
                up.close()
            except Exception:
                pass

    # ---- hot path -------------------------------------------------------------

    cdef int malloc_raw(self, uint64_t size, uint32_t policy, uint64_t *addr) noexcept nogil:
        cdef int kind, events
        return ascm_device_malloc(self._d, size, policy, ASCM_SIZE_MALLOC, addr, &kind, &events)

    cdef int free_raw(self, uint64_t addr) noexcept nogil:
        cdef int kind
        return ascm_device_free(self._d, addr, _DEVICE_MASK, &kind)

    def malloc(self, size, policy=0, stream=None):
        """aclrtMalloc: ALIGN_UP(size, 32) + 32 bytes at a 64-byte boundary.
        With a stream, a block that stream alone freed, of the size this
        request gets, is handed back at once."""
        cdef uint64_t addr = 0
        cdef int kind = -1, events = 0
        cdef int st = _alloc_first_try(self, size, policy, ASCM_SIZE_MALLOC, stream, &addr, &kind, &events)
        if st == ASCM_OK and not events:
            return addr
        return self._alloc_rest(size, policy, ASCM_SIZE_MALLOC, stream, "malloc", st, addr, kind, events)

    def malloc_align32(self, size, policy=0, stream=None):
        """aclrtMallocAlign32: ALIGN_UP(size, 32) bytes at a 64-byte boundary."""
        cdef uint64_t addr = 0
        cdef int kind = -1, events = 0
        cdef int st = _alloc_first_try(self, size, policy, ASCM_SIZE_ALIGN32, stream, &addr, &kind, &events)
        if st == ASCM_OK and not events:
            return addr
        return self._alloc_rest(size, policy, ASCM_SIZE_ALIGN32, stream, "malloc_align32", st, addr, kind, events)

    def dvpp_malloc(self, size, stream=None):
        """acldvppMalloc: ALIGN_UP(size, 32) + 32 bytes of huge-page memory in the
        media window, at a 128-byte boundary."""
        # a few calls per frame: the general path (it makes the one try), not
        # the inline first try of malloc, which runs per tensor
        return self._alloc_rest(size, 0, ASCM_SIZE_DVPP, stream, "dvpp_malloc", -1, 0, -1, 0)

    def malloc_host(self, size):
        """aclrtMallocHost: host memory at a 64-byte boundary."""
        return self._alloc_rest(size, 0, ASCM_SIZE_HOST, None, "malloc_host", -1, 0, -1, 0)

    def free(self, ptr, stream=None):
        """aclrtFree for malloc/malloc_align32 memory.  With a stream (or after
        record_stream), the block waits until the streams' work is done."""
        _device_free(self, ptr, _DEVICE_MASK, stream, "free")

    def dvpp_free(self, ptr, stream=None):
        """acldvppFree for dvpp_malloc memory."""
        _device_free(self, ptr, _DVPP_MASK, stream, "dvpp_free")

    def free_host(self, ptr):
        """aclrtFreeHost for malloc_host memory."""
        _device_free(self, ptr, _HOST_MASK, None, "free_host")

    cdef object _alloc_rest(self, object size, object policy, int mode, object stream, str call,
                            int st, uint64_t addr, int kind, int events):
        """An allocation after _alloc_first_try, or the whole of one: st is
        the status of the first try of the whole size (-1: not tried yet).
        Same-stream reuse, then the C device, then the slow path (retries,
        out-of-memory error); guard bytes in debug mode."""
        cdef uint64_t want, n = as_u64(size, "size")
        cdef uint32_t pol = _policy(policy)
        if st == -1:
            if stream is not None:
                _check_stream(stream)
                if stream in self._pending:
                    addr = self._reuse(stream, n, pol, mode)
                    if addr:
                        return addr
            # debug mode asks for the guard bytes too; a size no device has is
            # left as it is (routing refuses it) so that adding them cannot wrap
            want = n + _GUARD if self._debug and n <= _NO_DEVICE_HAS else n
            st = ascm_device_try_malloc_held(self._d, want, pol, mode, &addr, &kind, &events)
        else:
            want = n
        if st != ASCM_OK:  # media and host calls take no policy: their messages show none
            addr = self._alloc_slow(st, want, pol, mode, kind, events,
                                    policy if mode <= ASCM_SIZE_ALIGN32 else None, call)
        elif events:
            self._events(events)
        if self._debug:
            return self._guarded(addr, n)
        return addr

    cdef _free_failed(self, int st, uint64_t a, unsigned mask, int kind, str call):
        if st == ASCM_ERR_CLOSED:
            st = self._free_when_open(a, mask, &kind, call)
        if st != ASCM_OK:
            _raise(st, self._bad_pointer(a, kind, call, mask))

    cdef int _free_when_open(self, uint64_t a, unsigned mask, int *kind, str call) except -1:
        """A free the gate refused: waits out resets in progress (raises once
        the device is closed for good) and frees; returns the status."""
        cdef int st = ASCM_ERR_CLOSED
        while st == ASCM_ERR_CLOSED:
            self._wait_reset(call)
            st = ascm_device_free_held(self._d, a, mask, kind)
        return st

    cdef int _wait_reset(self, str call) except -1:
        """The C device refused with ASCM_ERR_CLOSED: raises if it is closed,
        else waits (without the GIL) for the reset in progress to end."""
        cdef int st
        self._require_open(call)
        with nogil:
            st = ascm_device_wait_open(self._d)
        if st != ASCM_OK:
            raise DeviceClosedError(f"{call}: device {self.device_id} is closed")
        return 0

    # ---- debug mode: guard bytes after each block (host backend) ------------------

    cdef uint64_t _guarded(self, uint64_t addr, uint64_t size) except? 0:
        (<unsigned char[:_GUARD]><unsigned char *><size_t>(addr + size))[:] = _GUARD_BYTES
        self._guards[addr] = size
        return addr

    cdef _check_guard(self, uint64_t addr):
        """Called after the block is freed (its memory is not handed out again
        before this returns: the GIL is held)."""
        size = self._guards.pop(addr, None)
        if size is None:
            return
        got = bytes(<unsigned char[:_GUARD]><unsigned char *><size_t>(addr + size))
        if got != _GUARD_BYTES:
            first = next(i for i in range(_GUARD) if got[i] != 0xAB)
            raise CorruptionError(f"overrun: the block at {addr:#x} of {size} bytes was written "
                                  f"past its end (guard byte +{first} changed)")

    # ---- streams ----------------------------------------------------------------

    cdef _free_slow(self, uint64_t addr, unsigned mask, object stream, str call):
        cdef int k = -1
        cdef ascm_pool *p
        cdef uint64_t usable
        self._require_open(call)
        if stream is not None:
            _check_stream(stream)  # before anything changes
        p = ascm_device_pool_at(self._d, addr, &k)
        if addr in self._pending_by_addr:
            raise InvalidFreeError(f"{call}: {addr:#x} was already freed and waits on a stream")
        if self._views.get(addr):
            raise InvalidFreeError(f"{call}: {addr:#x} still has {self._views[addr]} live buffer "
                                   f"view(s); drop them (del / release()) before freeing")
        if p is NULL or not (mask >> k) & 1 or ascm_pool_usable_size(p, addr, &usable) != ASCM_OK:
            _raise(ASCM_ERR_BADFREE, self._bad_pointer(addr, k, call, mask))
        holders = self._recorded.pop(addr, set())
        if stream is not None:
            holders.add(stream)
        if not holders:
            self._free_when_open(addr, mask, &k, call)
            if self._debug:
                self._check_guard(addr)
            return
        self._seq += 1
        entry = [addr, mask, holders, self._seq, usable, k, {}]
        self._pending_by_addr[addr] = entry
        self._pending_bytes += usable
        for s in holders:
            self._pending.setdefault(s, []).append(entry)
            if self.backend == "acl":  # the runtime tells when the stream is past the free
                ev = self._acl_event(s)
                if ev:
                    entry[6][s] = ev

    def _acl_event(self, stream):
        """acl backend: an event recorded on stream now (aclrtCreateEvent +
        aclrtRecordEvent), or None if the runtime refused."""
        rt = self._acl.rt
        ev, ret = rt.create_event()
        if ret != 0:
            return None
        if rt.record_event(ev, stream) != 0:
            rt.destroy_event(ev)
            return None
        return ev

    cdef _drop_pending_events(self):
        """acl backend: the runtime events of frees that will never be waited
        for (reset, close)."""
        if self.backend != "acl" or not self._pending_by_addr:
            return
        for e in self._pending_by_addr.values():
            for ev in e[6].values():
                self._acl.rt.destroy_event(ev)
            e[6].clear()

    def process_events(self):
        """acl backend: asks the runtime (aclrtQueryEventStatus) which streams
        are past the frees that wait on them, and frees those blocks.  Done
        on every allocation that would otherwise fail; call it to return
        memory sooner.  Returns the number of blocks freed."""
        if self.backend != "acl" or self._closed:
            return 0
        rt = self._acl.rt
        done = []
        for e in list(self._pending_by_addr.values()):
            for s, ev in list(e[6].items()):
                status, ret = rt.query_event_status(ev)
                if ret == 0 and status == 1:  # ACL_EVENT_RECORDED_STATUS_COMPLETE
                    done.append((s, e))
        before = len(self._pending_by_addr)
        for s, e in done:
            if s in self._pending and e in self._pending[s]:
                self._pending[s].remove(e)
                self._release([e], s, _ALL)
                if not self._pending.get(s, True):
                    del self._pending[s]
        return before - len(self._pending_by_addr)

    cdef _release(self, list entries, object stream, uint64_t upto):
        """Stream `stream` is done with the entries up to sequence number upto
        (_ALL: every one); frees the ones no stream holds any more.  The
        bookkeeping is finished before the first free, which may wait (the
        GIL released) for a reset in another thread."""
        cdef int k
        keep = []
        to_free = []
        for e in entries:
            if e[3] > upto:
                keep.append(e)
                continue
            e[2].discard(stream)
            ev = e[6].pop(stream, None)
            if ev is not None:
                self._acl.rt.destroy_event(ev)
            if not e[2]:
                del self._pending_by_addr[e[0]]
                self._pending_bytes -= e[4]
                to_free.append((e[0], e[1]))
        if keep:
            self._pending[stream] = keep
        elif entries is self._pending.get(stream):
            del self._pending[stream]
        for addr, mask in to_free:  # a reset meanwhile made them stale: BADFREE, ignored
            self._free_when_open(addr, mask, &k, "synchronize")

    cdef uint64_t _reuse(self, object stream, uint64_t n, uint32_t policy, int mode) except? 0:
        """Same-stream reuse: a block this stream freed, still waiting on it
        alone, that a fresh request would get in the same size, is handed
        back as it is -- it never becomes free, so no other stream can get it
        while this stream's queued work may still use it.  0: none fits."""
        cdef ascm_route r
        cdef ascm_pool *p
        if self._debug or ascm_device_route(self._d, n, policy, mode, &r) != ASCM_OK:
            return 0  # debug mode re-checks guard bytes at every real free
        kinds = tuple(r.kinds[i] for i in range(r.nkinds))
        for e in self._pending[stream]:
            if e[5] not in kinds or len(e[2]) != 1:
                continue
            p = ascm_device_pool_at(self._d, e[0], NULL)
            if p is NULL or ascm_pool_relabel(p, e[0], r.rounded, r.align) != ASCM_OK:
                continue
            self._pending[stream].remove(e)
            if not self._pending[stream]:
                del self._pending[stream]
            for ev in e[6].values():
                self._acl.rt.destroy_event(ev)
            del self._pending_by_addr[e[0]]
            self._pending_bytes -= e[4]
            return e[0]
        return 0

    def record_stream(self, ptr, stream):
        """Marks a live block as also used by stream: when freed, it waits for
        that stream too (as PyTorch's Tensor.record_stream)."""
        cdef uint64_t a = as_u64(ptr, "pointer"), n
        self._require_open("record_stream")
        _check_stream(stream)
        cdef ascm_pool *p = ascm_device_pool_at(self._d, a, NULL)
        if p is NULL or a in self._pending_by_addr or ascm_pool_usable_size(p, a, &n) != ASCM_OK:
            raise InvalidFreeError(f"{a:#x} is not a live block of device {self.device_id}")
        self._recorded.setdefault(a, set()).add(stream)

    def synchronize(self, stream=None):
        """The work queued on stream (every stream when None) is done: blocks
        waiting on it become free."""
        self._require_open("synchronize")
        if stream is not None:
            _check_stream(stream)
        streams = list(self._pending) if stream is None else [stream]
        for s in streams:
            if self.backend == "acl":  # wait for the stream's queued work first
                ret = self._acl.rt.synchronize_stream(s)
                if ret != 0:
                    raise AscmemError(f"acl.rt.synchronize_stream returned {ret}")
            if s in self._pending:
                self._release(self._pending[s], s, _ALL)

    def record_event(self, stream):
        """An event on stream; complete_event(ev) frees what the stream had
        freed before it was recorded (the acl backend would map this onto
        aclrtRecordEvent / aclrtQueryEvent)."""
        _check_stream(stream)
        return (stream, self._seq)

    def complete_event(self, event):
        """The stream of event has passed it: frees what the stream had freed
        before the event was recorded (nothing, if it had freed nothing)."""
        try:
            stream, upto = event
            upto = as_u64(upto, "event sequence")
        except (TypeError, ValueError):
            raise ArgumentTypeError(f"complete_event takes an event from record_event, not "
                                    f"{event!r}") from None
        _check_stream(stream)
        if stream in self._pending:
            self._release(self._pending[stream], stream, upto)

    def pending_bytes(self):
        """Bytes of blocks freed on a stream and waiting for it."""
        return self._pending_bytes

    # ---- out of memory ------------------------------------------------------------

    def on_out_of_memory(self, fn):
        """fn(info) is called when an allocation fails, after the spare slabs
        were given back; info has kind, size, free, largest_free and
        pending_bytes.  A true return asks for one more try."""
        if fn is not None and not callable(fn):
            raise ArgumentTypeError("on_out_of_memory takes a callable or None")
        self._oom_callback = fn

    cdef uint64_t _alloc_slow(self, int st, uint64_t size, uint32_t policy, int mode, int kind,
                              int events, object policy_obj, str call) except? 0:
        """The first try failed with st: waits out a reset in progress; on a
        lack of room frees what streams are done with and what is cached,
        then asks the user's callback; the request counts once as failed."""
        cdef uint64_t addr
        while st == ASCM_ERR_CLOSED:  # resets in progress (raises once closed for good)
            self._wait_reset(call)
            st = ascm_device_try_malloc_held(self._d, size, policy, mode, &addr, &kind, &events)
        if st in (ASCM_ERR_NOMEM, ASCM_ERR_BUDGET):
            self.process_events()
            ascm_device_trim(self._d)
            st = ascm_device_try_malloc_held(self._d, size, policy, mode, &addr, &kind, &events)
            if st != ASCM_OK and self._oom_callback is not None:
                info = self._oom_info(size, kind)
                if self._oom_callback(info):
                    self._counters["oom_retries"] += 1
                    st = ascm_device_try_malloc_held(self._d, size, policy, mode, &addr, &kind, &events)
        if st == ASCM_OK:
            if events:
                self._events(events)
            return addr
        if st in (ASCM_ERR_NOMEM, ASCM_ERR_BUDGET):
            ascm_device_count_failure(self._d, kind)
        self._failed(st, size, policy_obj, kind, events, call)

    def _oom_info(self, size, int kind):
        cdef ascm_stats s
        cdef bint has = kind >= 0 and ascm_device_has_kind(self._d, kind)
        if has:
            ascm_device_kind_stats(self._d, kind, &s)
        return {"kind": MemKind(kind) if kind >= 0 else None, "size": size,
                "free": s.free if has else 0,
                "largest_free": s.largest_free if has else 0,
                "pending_bytes": self._pending_bytes}

    # ---- real memory (host backend) ---------------------------------------------

    def buffer(self, ptr, nbytes=None):
        """A writable memoryview of a live block (host backend).  The rule for
        views: a block cannot be freed while a view of it (or a numpy array
        made from one) is alive; free raises InvalidFreeError."""
        cdef uint64_t a = as_u64(ptr, "pointer"), usable, n
        cdef int k = -1
        self._require_open("buffer")
        cdef ascm_pool *p = ascm_device_pool_at(self._d, a, &k)
        if not self._up.readable:
            raise UnsupportedError(f"the {self.backend} backend holds no memory the host can "
                                   f"read; use backend='host'")
        if p is NULL or a in self._pending_by_addr or \
                ascm_pool_requested_size(p, a, &usable) != ASCM_OK:
            raise InvalidFreeError(f"{a:#x} is not the start of a live block")
        if self._debug:  # the guard bytes are not the caller's
            usable = min(<uint64_t>self._guards.get(a, usable), usable)
        n = usable if nbytes is None else as_u64(nbytes, "nbytes")
        if n == 0 or n > usable:
            raise InvalidArgumentError(f"nbytes {n} does not fit the block's {usable} bytes")
        return memoryview(_make_block_buffer(self, a, n))

    def as_array(self, ptr, shape, dtype="uint8"):
        """A numpy array on a live block's memory (no copy); the array counts
        as a view of the block.  Arrays export DLPack (numpy.from_dlpack)."""
        np = _numpy()
        try:
            dt = np.dtype(dtype)
            shape = (shape,) if isinstance(shape, int) else tuple(int(operator.index(s)) for s in shape)
        except TypeError as e:
            raise ArgumentTypeError(f"as_array: {e}") from None
        count = 1
        for s in shape:
            if s < 0:
                raise InvalidArgumentError(f"as_array: negative dimension in {shape}")
            count *= s
        buf = self.buffer(ptr, count * dt.itemsize)
        return np.frombuffer(buf, dtype=dt, count=count).reshape(shape)

    def pages(self):
        """Which pages the OS gave each kind's range (host backend)."""
        if self.backend != "host":
            return {}
        return {MemKind(k).name.lower(): _OS_PAGES[self._up.pages.get(k, ASCM_OS_NORMAL)]
                for k in range(ASCM_KINDS) if self._sizes[k]}

    # ---- failures and warnings ------------------------------------------------

    cdef _failed(self, int st, uint64_t size, object policy, int kind, int events, str call):
        if events:
            self._events(events)
        if st == ASCM_ERR_UNSUPPORTED:
            raise UnsupportedError(f"policy {_policy_name(policy)} is not supported on "
                                   f"{self.profile.title}")
        if st == ASCM_ERR_INVAL:
            raise InvalidArgumentError(f"{call}: size must be at least 1 byte")
        if st == ASCM_ERR_CLOSED:
            raise DeviceClosedError(f"{call}: device {self.device_id} is closed")
        cdef ascm_stats s
        if kind < 0 and size > _NO_DEVICE_HAS:
            raise OutOfMemoryError(f"{call}({size}): larger than the memory of any device")
        name = MemKind(kind).name if 0 <= kind < ASCM_KINDS else "?"
        if not (0 <= kind < ASCM_KINDS and ascm_device_has_kind(self._d, kind)):
            raise OutOfMemoryError(f"{call}({size}): this device has no {name} memory")
        ascm_device_kind_stats(self._d, kind, &s)
        why = "the page budget is exhausted" if st == ASCM_ERR_BUDGET else "no free block fits"
        b = self.budget()
        upstream = ""
        if self._max[kind] > self._sizes[kind] or len(self._up.held[kind]) > 1:
            upstream = (f"; {ascm_device_chunk_count(self._d, kind)} chunk(s) hold "
                        f"{_fmt_bytes(self._taken[kind])} of the pool's "
                        f"{_fmt_bytes(self._max[kind])} maximum")
            if self._upstream_error:
                upstream += f" ({self._upstream_error})"
        raise OutOfMemoryError(
            f"{call}({size}, policy={_policy_name(policy)}): out of {name} memory ({why}); "
            f"{_fmt_bytes(s.free)} of the {name} range free, largest free block "
            f"{_fmt_bytes(s.largest_free)}; {_fmt_bytes(self._pending_bytes)} waiting on streams"
            f"{upstream}; device budget: {_fmt_bytes(b['huge_used'])} huge + "
            f"{_fmt_bytes(b['normal_used'])} normal + {_fmt_bytes(b['fixed'])} runtime of "
            f"{_fmt_bytes(b['total'])}")

    cdef _events(self, int events):
        if events & ASCM_EVENT_HUGE_FALLBACK:
            self._counters["huge_fallbacks"] += 1
        for cause in (ASCM_EVENT_HUGE_FALLBACK, ASCM_EVENT_RESERVE_FULL, ASCM_EVENT_MEDIA_90):
            if events & cause and cause not in self._warned:
                self._warned.add(cause)
                warnings.warn(f"device {self.device_id}: {_CAUSE_TEXT[cause]}",
                              PrecautionWarning, stacklevel=1)  # the caller's line: no Python frame between

    def _bad_pointer(self, uint64_t ptr, int kind, str call, unsigned mask):
        if kind < 0:
            return f"{call}: {ptr:#x} is not memory of device {self.device_id} (foreign, or from before a reset)"
        if not (mask >> kind) & 1:
            return f"{call}: {ptr:#x} is {MemKind(kind).name} memory; free it with its own call"
        return f"{call}: {ptr:#x} is not the start of a live block (double free or interior pointer)"

    # ---- queries --------------------------------------------------------------

    def kind_of(self, ptr):
        """The MemKind of the range ptr lies in."""
        cdef uint64_t a = as_u64(ptr, "pointer")
        self._require_open("kind_of")
        cdef int k = ascm_device_kind_of(self._d, a)
        if k < 0:
            raise InvalidArgumentError(f"{a:#x} is not memory of device {self.device_id}")
        return MemKind(k)

    def usable_size(self, ptr):
        """The size a live block was given after the CANN rounding rule."""
        cdef uint64_t a = as_u64(ptr, "pointer"), n
        self._require_open("usable_size")
        cdef ascm_pool *p = ascm_device_pool_at(self._d, a, NULL)
        if p is NULL or ascm_pool_requested_size(p, a, &n) != ASCM_OK:
            raise InvalidFreeError(f"{a:#x} is not the start of a live block")
        return n

    def as_model_input(self, ptr, length):
        """Media -> inference reuse: hands a live device or media buffer to model
        inference as it is (same address, no copy), after checking that the
        segment obeys the rule for carved memory: a 128-byte aligned start and a
        length within the buffer's rounded size."""
        cdef uint64_t a = as_u64(ptr, "pointer"), n = as_u64(length, "length"), size
        cdef int k = -1
        self._require_open("as_model_input")
        cdef ascm_pool *p = ascm_device_pool_at(self._d, a, &k)
        if k == ASCM_KIND_HOST:
            raise InvalidArgumentError(f"{a:#x} is host memory: model inference reads device "
                                       f"or media memory")
        if p is NULL or ascm_pool_requested_size(p, a, &size) != ASCM_OK:
            raise InvalidArgumentError(f"{a:#x} is not a live device or media buffer "
                                       f"(freed, interior, or foreign)")
        if a % MEDIA_ALIGN:
            raise MisalignedError(f"{a:#x} is not 128-byte aligned, as model input carved from "
                                  f"media memory must be")
        if n == 0 or n > size:
            raise InvalidArgumentError(f"length {n} does not fit the buffer's {size} bytes")
        self._reused_bytes += n
        self._reuse_count += 1
        return a

    def budget(self):
        """The physical budget: bytes of huge and normal pages in use."""
        cdef ascm_budget b
        ascm_device_budget(self._d, &b)
        total = b.reserve + b.shared
        return {"reserve": b.reserve, "shared": b.shared, "total": total,
                "huge_used": b.huge_used, "normal_used": b.normal_used, "fixed": b.fixed,
                "peak_huge": b.peak_huge, "peak_normal": b.peak_normal,
                "ep_growth": b.huge_used - b.reserve if b.huge_used > b.reserve else 0,
                "limit": b.limit, "huge_grows": bool(b.huge_grows)}

    def get_mem_info(self, attr):
        """aclrtGetMemInfo: (free, total) in bytes for an aclrtMemAttr value;
        attributes this hardware lacks report (0, 0)."""
        cdef int a
        try:
            a = int(MemAttr(attr))
        except (ValueError, TypeError):
            raise InvalidArgumentError(f"unknown aclrtMemAttr value {attr!r}") from None
        b = self.budget()
        hbm = self.profile.memory_type == "HBM"
        if a <= 11:  # the HBM_* attributes are 1, 4, 5, 8, 9 (and 10, 11 for 1 GiB pages)
            is_hbm = a in (1, 4, 5, 8, 9, 10, 11)
            if is_hbm != hbm:
                return (0, 0)
        which = {0: "all", 1: "all", 2: "huge", 3: "normal", 4: "huge", 5: "normal",
                 6: "p2p_huge", 7: "p2p_normal", 8: "p2p_huge", 9: "p2p_normal", 10: "huge1g",
                 11: "p2p_huge1g", 12: "normal", 13: "huge", 14: "huge1g", 15: "p2p_normal",
                 16: "p2p_huge", 17: "p2p_huge1g"}[a]
        if which.startswith("p2p_"):
            if not self.profile.p2p:
                return (0, 0)
            which = which[4:]
        if which == "huge1g" and not self.profile.huge1g:
            return (0, 0)
        growth = b["ep_growth"]
        left = b["shared"] - b["fixed"] - b["normal_used"] - growth
        if which == "all":
            total = b["total"] if not b["limit"] else min(b["total"], b["limit"])
            used = b["huge_used"] + b["normal_used"] + b["fixed"]
        elif which == "normal":
            total = b["shared"] - b["fixed"] - growth
            used = b["normal_used"]
        elif b["reserve"]:
            # a reserve product reports the huge-page pool as it is now: the
            # reserve plus whatever EP mode grew it by
            total = b["reserve"] + growth
            used = b["huge_used"]
        else:
            total = b["huge_used"] + left
            used = b["huge_used"]
        total = max(total, used)
        return (total - used, total)

    def begin_job(self):
        """Marks the start of an inference or training job.  On products that
        cache AI CPU operators (training series, EP mode) the first job after
        start or reset takes that cache from device memory; A2/A3 products load
        their system package instead."""
        self._require_open("begin_job")
        if self._job_started:
            return 0
        take = 0
        if self.mode == "EP" and self.profile.aicpu_cache[1]:
            take = self._aicpu
        take += self.profile.first_job_package
        if take and ascm_device_charge_fixed(self._d, take) != ASCM_OK:
            raise OutOfMemoryError(f"the first job needs {_fmt_bytes(take)} of device memory "
                                   f"for the runtime, and it is not free")
        self._fixed_taken = take
        self._job_started = True
        return take

    def reset(self):
        """aclrtResetDevice: frees every block, releases the AI CPU cache, and
        invalidates every pointer handed out before (freeing one raises
        InvalidFreeError, after any number of resets).  All or nothing: if
        the upstream refuses the fresh chunks, the device is left as it was
        and the upstream's error is raised.  Callers without the GIL inside
        the device are waited out; new ones are refused until it is over."""
        cdef uint64_t bases[5]
        cdef uint64_t fresh[5]
        self._require_open("reset")
        if self._views:
            raise InvalidArgumentError(f"reset: {sum(self._views.values())} buffer views of device "
                                       f"memory are still alive")
        with nogil:
            ascm_device_quiesce(self._d)
        try:
            with self._grow_lock:
                old = [list(held) for held in self._up.held]
                try:
                    self._first_chunks(fresh)  # raises with the device untouched
                except UpstreamError:
                    if not self._up.drop_quarantine():
                        raise
                    self._first_chunks(fresh)  # the OS had run short of mappings
                for k in range(ASCM_KINDS):
                    self._real_base[k] = fresh[k]
                self._epoch += 1
                self._bases(bases)
                if ascm_device_reset(self._d, bases) != ASCM_OK:
                    raise OutOfMemoryError("host memory for the device's metadata ran out")
                # before anything that may release the GIL (pyACL frees below):
                # other threads must find no bookkeeping of the blocks just freed
                self._forget_blocks()
                for k in range(ASCM_KINDS):  # stale pointers into these stay foreign
                    for base, size in old[k]:
                        self._up.retire(k, base, size)
                    self._taken[k] = self._sizes[k]
        finally:
            ascm_device_reopen(self._d)

    cdef _forget_blocks(self):
        """Python-side state of the blocks a reset freed."""
        self._fixed_taken = 0  # ascm_device_reset gave the runtime's memory back
        self._job_started = False
        self._reused_bytes = self._reuse_count = 0
        self._drop_pending_events()
        self._pending.clear()
        self._pending_by_addr.clear()
        self._recorded.clear()
        self._guards.clear()
        self._pending_bytes = 0

    def empty_cache(self):
        """Gives every pool's spare empty slabs back, and their pages to the
        budget; chunks that hold no live block go back upstream; on the host
        backend the pages of every fully free span go back to the OS too
        (MADV_DONTNEED).  Returns the bytes released: slabs, chunks, and the
        resident host pages given back."""
        cdef ascm_pool *p
        self._require_open("empty_cache")
        released = ascm_device_trim(self._d)
        for k in range(ASCM_KINDS):
            with self._grow_lock:
                released += self._release_empty(k)  # whole chunks back to the upstream
            if self.backend != "host":
                continue
            page = 2 << 20 if k in (ASCM_KIND_HUGE, ASCM_KIND_DVPP) else 4096
            if k == ASCM_KIND_HUGE1G:
                page = 1 << 30
            for i in range(ascm_device_chunk_count(self._d, k)):
                p = ascm_device_chunk(self._d, k, i, NULL, NULL)
                if p is NULL:
                    continue
                for addr, size, _ in _pool_blocks(p, True):
                    lo = (addr + page - 1) // page * page
                    hi = (addr + size) // page * page
                    if hi > lo:
                        released += ascm_os_resident(lo, hi - lo)
                        ascm_os_discard(lo, hi - lo)
        return released

    def reset_peaks(self):
        """Peak statistics start again from current use."""
        ascm_device_reset_peaks(self._d)

    def reset_peak_memory_stats(self):
        """PyTorch's name for reset_peaks()."""
        ascm_device_reset_peaks(self._d)

    def get_limit(self):
        """The cap set by set_limit / set_memory_fraction, in bytes (0: none)."""
        return self.budget()["limit"]

    def get_memory_fraction(self):
        """The cap as a fraction of the device's total memory (1.0: no cap)."""
        b = self.budget()
        return min(1.0, b["limit"] / b["total"]) if b["limit"] and b["total"] else 1.0

    def set_limit(self, limit):
        """Caps huge + normal + runtime memory at limit bytes (0: no cap)."""
        ascm_device_set_limit(self._d, as_u64(limit, "limit"))

    def set_memory_fraction(self, fraction):
        """Caps device memory at a fraction (0 < f <= 1) of the total."""
        try:
            f = float(fraction)
        except (TypeError, ValueError):
            raise ArgumentTypeError(f"memory fraction must be a number, not "
                                    f"{type(fraction).__name__}") from None
        if not 0.0 < f <= 1.0:
            raise InvalidArgumentError(f"memory fraction must be in (0, 1], got {fraction!r}")
        total = self.budget()["total"]
        # a tiny fraction still caps (a limit of 0 would mean no limit at all)
        ascm_device_set_limit(self._d, 0 if f == 1.0 else max(1, int(total * f)))

    def stats(self):
        """Per kind: the pool's statistics; plus the budget and reuse counters."""
        out = {}
        cdef ascm_stats s
        for k in range(ASCM_KINDS):
            if ascm_device_has_kind(self._d, k):
                ascm_device_kind_stats(self._d, k, &s)
                d = _stats_dict(&s)
                d.update(chunks=ascm_device_chunk_count(self._d, k), upstream_bytes=self._taken[k],
                         max_pool_size=self._max[k])
                out[MemKind(k).name.lower()] = d
        b = self.budget()
        out["device"] = dict(b, aicpu_cache=self._fixed_taken, reserve_used=min(b["huge_used"], b["reserve"]),
                             reused_bytes=self._reused_bytes, reuse_count=self._reuse_count,
                             pending_bytes=self._pending_bytes, closed=self._closed,
                             **self._counters)
        return out

    def snapshot(self):
        """Live blocks: dicts of address, size (usable), requested (after the
        CANN rounding) and kind, in address order."""
        blocks = []
        cdef ascm_pool *p
        for k in range(ASCM_KINDS):
            kind = MemKind(k)
            for i in range(ascm_device_chunk_count(self._d, k)):
                p = ascm_device_chunk(self._d, k, i, NULL, NULL)
                if p is not NULL:
                    blocks.extend({"address": a, "size": u, "requested": r, "kind": kind}
                                  for a, u, r in _pool_blocks(p, False))
        blocks.sort(key=lambda b: b["address"])
        return blocks

    def precautions(self):
        """The CANN memory precautions of this product and mode, as sentences."""
        return _profiles.precautions(self.profile, self.mode)

    def check(self):
        """Walks every pool's invariants, the chunk accounting and the page
        budget; raises CorruptionError naming a broken one."""
        cdef char msg[MSG_LEN]
        cdef ascm_pool *p
        cdef ascm_stats s
        for k in range(ASCM_KINDS):
            for i in range(ascm_device_chunk_count(self._d, k)):
                p = ascm_device_chunk(self._d, k, i, NULL, NULL)
                if p is not NULL and ascm_pool_check(p, msg, MSG_LEN) != ASCM_OK:
                    raise CorruptionError(f"{MemKind(k).name} chunk {i}: " +
                                          msg.decode("utf-8", "replace"))
            if self.backend != "sim" and not self._closed and ascm_device_has_kind(self._d, k):
                held = self._up.held[k]
                if sum(size for _, size in held) != self._taken[k] or self._taken[k] > self._max[k] or \
                        sorted(held) != sorted(self.chunks(k)):
                    raise CorruptionError(f"{MemKind(k).name}: chunk accounting is wrong")
        b = self.budget()
        pages = 0
        for k in (ASCM_KIND_HUGE, ASCM_KIND_DVPP, ASCM_KIND_HUGE1G):
            if ascm_device_has_kind(self._d, k):
                ascm_device_kind_stats(self._d, k, &s)
                pages += s.pages_in_use * s.page_size
        if pages != b["huge_used"]:
            raise CorruptionError(f"huge pages charged {b['huge_used']} != pages in use {pages}")

    def range_of(self, kind):
        """(base, size) of a kind's address range, or None."""
        cdef int k = _kind_arg(kind)
        cdef uint64_t base, size
        if ascm_device_chunk(self._d, k, 0, &base, &size) is NULL:
            return None
        return (base, size)

    def __repr__(self):
        return (f"<ascmem.Device {self.profile.name} {self.mode} id={self.device_id} "
                f"backend={self.backend}{' closed' if self._closed else ''}>")


cdef inline int _alloc_first_try(Device self, object size, object policy, int mode, object stream,
                                 uint64_t *addr, int *kind, int *events) except -2:
    """The first try of every Device allocation call, inline in each (its
    mode a constant): the C device's status, or -1 when a stream or debug
    mode needs the general path first.  Device._alloc_rest goes on from it:
    the request is tried once, whatever path it takes."""
    if stream is not None or self._debug:
        return -1
    return ascm_device_try_malloc_held(self._d, as_u64(size, "size"), _policy(policy), mode, addr,
                                       kind, events)


cdef inline object _device_free(Device self, object ptr, unsigned mask, object stream, str call):
    """The free path of every Device free call: inline when no stream, view,
    guard or earlier stream free is involved; else Device._free_slow."""
    cdef int kind, st
    cdef uint64_t a = as_u64(ptr, "pointer")
    if stream is not None or self._recorded or self._pending_by_addr or self._views or self._debug:
        return self._free_slow(a, mask, stream, call)
    st = ascm_device_free_held(self._d, a, mask, &kind)
    if st != ASCM_OK:
        self._free_failed(st, a, mask, kind, call)


cdef uint64_t _ALL = 0xFFFFFFFFFFFFFFFF  # _release: every entry, whatever its sequence number


cdef inline uint32_t _policy(object policy) except? 0xFFFFFFFF:
    if policy is 0:  # the default (a cached int): no conversion call
        return 0
    cdef uint64_t p = as_u64(policy, "policy")
    return <uint32_t>p if p < 0xFFFFFFFF else 0xFFFFFFFE  # still out of range, as CANN sees it


def _policy_name(policy):
    from ascmem.rules import Policy, POLICY_BASE_MASK
    if policy is None:
        return "-"
    try:
        p = int(policy)
        base = Policy(p & POLICY_BASE_MASK).name
        flags = [f.name for f in (Policy.LOW_BAND_WIDTH, Policy.HIGH_BAND_WIDTH,
                                  Policy.ACCESS_USER_SPACE_READONLY) if p & f]
        return "|".join([base] + flags)
    except (ValueError, TypeError):
        return repr(policy)


def _pluggable_register(int index, Device device=None):
    """Points the pluggable-allocator functions for device index at device
    (None: unregisters).  Waits, without the GIL, for calls still using the
    device registered before.  Used by ascmem.pluggable."""
    cdef ascm_device *d = device._d if device is not None else NULL
    cdef int st
    with nogil:
        st = ascm_pluggable_register(index, d)
    if st != ASCM_OK:
        raise InvalidArgumentError(f"device index {index} is outside 0..63")


# Only the Device makes block buffers: one built from Python could point
# anywhere.  The token is not reachable from Python.
cdef object _BUFFER_TOKEN = object()


cdef _BlockBuffer _make_block_buffer(Device dev, uint64_t addr, uint64_t nbytes):
    return _BlockBuffer(_BUFFER_TOKEN, dev, addr, nbytes)


@cython.final
cdef class _BlockBuffer:
    """Exports a live block of a host-backend Device through the buffer
    protocol, counting exports so that the block cannot be freed under them.
    Made by Device.buffer() only."""
    cdef Device dev
    cdef uint64_t addr, nbytes
    cdef Py_ssize_t shape[1]

    def __cinit__(self, token, Device dev, uint64_t addr, uint64_t nbytes):
        if token is not _BUFFER_TOKEN:
            raise TypeError("block buffers are made by Device.buffer(), not directly")
        self.dev = dev
        self.addr = addr
        self.nbytes = nbytes

    def __getbuffer__(self, Py_buffer *view, int flags):
        if self.dev._closed:
            raise DeviceClosedError("the device of this buffer is closed")
        self.shape[0] = <Py_ssize_t>self.nbytes
        view.buf = <void *><size_t>self.addr
        view.obj = self
        view.len = <Py_ssize_t>self.nbytes
        view.readonly = 0
        view.itemsize = 1
        view.format = "B"
        view.ndim = 1
        view.shape = self.shape
        view.strides = NULL
        view.suboffsets = NULL
        view.internal = NULL
        self.dev._views[self.addr] = self.dev._views.get(self.addr, 0) + 1

    def __releasebuffer__(self, Py_buffer *view):
        n = self.dev._views.get(self.addr, 0) - 1
        if n > 0:
            self.dev._views[self.addr] = n
        else:
            self.dev._views.pop(self.addr, None)
