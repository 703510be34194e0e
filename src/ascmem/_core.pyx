# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: binding=False, embedsignature=True, embedsignature.format=clinic
"""Bindings of the C core: argument conversion, the error mapping, walks;
Pool (_pool.pxi), BuddyAllocator (_buddy.pxi), Device and the rest in the
.pxi files included at the end.  The one extension module that links the C
core (csrc/*.c): the modules off the hot path reach it through the core_*
functions this module exports (_core.pxd), never by linking it again."""
# binding=False: methods are CPython method descriptors, not Cython function
# objects, so a call takes CPython's own specialised path (3.11's adaptive
# interpreter has one for method descriptors, none for Cython's functions):
# that path is the whole call of a pair from Python, so it is most of what a
# pair costs beyond the allocator's work.  The clinic-format signature in each docstring keeps inspect.signature() working.

cimport cython
from cpython.long cimport PyLong_Check, PyLong_CheckExact
from cpython.bool cimport PyBool_Check
from cpython.exc cimport PyErr_Occurred, PyErr_Clear
from libc.stdint cimport uint64_t, int64_t, uint32_t, uintptr_t
from libc.stdlib cimport free, realloc
from libc.string cimport memset

import operator
import warnings

from ascmem._upstream cimport _Upstream, _DEVICE_SHIFT
from ascmem._growth cimport _Growth
from ascmem._streams cimport _ALL, _PendingBlock, _StreamLedger
from ascmem._tags cimport (_TagRegistry, _align_tag, _alignment_stats, _check_tag, _ipc_buffer_size,
                           _ipc_close, _ipc_export, _ipc_state, _join_aligned, _refuse_exported,
                           _sleep_tag, _wake_tag)
from ascmem._acl_paging cimport _ACL_GRANULE, _AclMapper, _acl_map_hook
from ascmem._views cimport (_BlockBuffer, _GuardBytes, _ViewRegistry, _make_block_buffer,
                            _GUARD)

from ascmem._acl_paging import _acl_granule
from ascmem._upstream import _OS_PAGES, UpstreamError
from ascmem.errors import (AscmemError, ArgumentTypeError, ClosedError, CorruptionError,
                           DeviceClosedError, InUseError, InvalidArgumentError, InvalidFreeError,
                           OutOfMemoryError,
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


ctypedef void (*_pool_walk_fn)(ascm_pool *p, ascm_block_fn fn, void *ctx) noexcept nogil

cdef list _pool_blocks(ascm_pool *p, bint free_spans):
    """(addr, usable, requested) of each live block, or (addr, size, 0) of
    each free span of the large-block path."""
    return _pool_spans(p, ascm_pool_walk_free if free_spans else ascm_pool_walk)


cdef list _pool_held(ascm_pool *p):
    """(addr, size, 0) of each run of pages the pool holds (ascm_pool_walk_held)."""
    return _pool_spans(p, ascm_pool_walk_held)


cdef list _pool_spans(ascm_pool *p, _pool_walk_fn walk):
    cdef _Spans s
    cdef size_t i
    memset(&s, 0, sizeof(s))
    walk(p, _span_add, &s)
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


include "_pool.pxi"
include "_buddy.pxi"
include "_device_failures.pxi"
include "_device_parts.pxi"
include "_device_readout.pxi"
include "_device.pxi"
include "_device_paths.pxi"
include "_capi.pxi"
include "_replay.pxi"
include "_replay_device.pxi"


# ---- the C core for ascmem's other extension modules (CoreCalls, _core.pxd)

cdef CoreCalls _core_calls


cdef const CoreCalls *core_calls() noexcept nogil:
    """The table of C core functions; filled on every call (constant
    stores), so it is complete whichever module imports first."""
    _core_calls.ascm_os_reserve = ascm_os_reserve
    _core_calls.ascm_os_release = ascm_os_release
    _core_calls.ascm_os_quarantine = ascm_os_quarantine
    _core_calls.ascm_os_map = ascm_os_map
    _core_calls.ascm_kind = ascm_kind
    _core_calls.ascm_status_str = ascm_status_str
    _core_calls.ascm_device_route = ascm_device_route
    _core_calls.ascm_device_pool_at = ascm_device_pool_at
    _core_calls.ascm_device_kind_of = ascm_device_kind_of
    _core_calls.ascm_device_chunk_count = ascm_device_chunk_count
    _core_calls.ascm_device_chunk = ascm_device_chunk
    _core_calls.ascm_device_generation = ascm_device_generation
    _core_calls.ascm_device_set_grow = ascm_device_set_grow
    _core_calls.ascm_device_set_release = ascm_device_set_release
    _core_calls.ascm_device_add_chunk = ascm_device_add_chunk
    _core_calls.ascm_device_release_empty = ascm_device_release_empty
    _core_calls.ascm_device_handed_out = ascm_device_handed_out
    _core_calls.ascm_pool_relabel = ascm_pool_relabel
    _core_calls.ascm_pool_stats = ascm_pool_stats
    _core_calls.ascm_pool_walk = ascm_pool_walk
    _core_calls.ascm_pool_sleep = ascm_pool_sleep
    _core_calls.ascm_pool_is_large_block = ascm_pool_is_large_block
    _core_calls.ascm_pool_wake = ascm_pool_wake
    _core_calls.ascm_acl_allocator_bind = ascm_acl_allocator_bind
    _core_calls.ascm_acl_allocator_handle = ascm_acl_allocator_handle
    _core_calls.ascm_device_pool = ascm_device_pool
    _core_calls.ascm_device_free_held = ascm_device_free_held
    _core_calls.ascm_pool_usable_size = ascm_pool_usable_size
    _core_calls.ascm_pool_usable_for = ascm_pool_usable_for
    return &_core_calls


# The modules that cimport this one, imported last (their imports of this
# module find its functions and types exported by now) and re-exported under
# the names they had here.
from ascmem._backends import BACKENDS as _BACKENDS, make_upstream as _make_upstream, backends
from ascmem._acl_allocator import ACL_ALLOCATOR_SLOTS, _acl_allocator_bind
from ascmem._handed_sleep import _handed_out, _sleep_handed_out, _wake_handed_out
