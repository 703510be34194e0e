# A Device's state (_DeviceParts: its upstream and growth, stream ledger,
# views, guard bytes, tags and counters) and the helpers the Device's halves
# share.  Included by _core.pyx before _device_readout.pxi and _device.pxi.

import os
import threading
import weakref

from ascmem import profiles as _profiles
from ascmem import rules as _rules
from ascmem.errors import (AscmemError, DeviceClosedError, MisalignedError, PrecautionWarning,
                           UnsupportedError)
from ascmem.rules import MemAttr, MemKind, MEDIA_ALIGN

# The kinds each free call frees, from the C kind table (csrc/kinds.c).
cdef unsigned _DEVICE_MASK = ascm_kind_mask(ASCM_FREE_DEVICE)
cdef unsigned _DVPP_MASK = ascm_kind_mask(ASCM_FREE_DVPP)
cdef unsigned _HOST_MASK = ascm_kind_mask(ASCM_FREE_HOST)

# Devices alive in this process: a child of fork() gets fresh Python locks
# (a lock another thread held in the parent would stay held in the child).
_live_devices = weakref.WeakSet()


def _devices_after_fork():
    for dev in list(_live_devices):
        parts = (<Device>dev)._parts
        if parts is not None:
            (<_DeviceParts>parts).growth.after_fork()
            if (<_DeviceParts>parts).mapper is not None:
                (<_DeviceParts>parts).mapper.after_fork()
            if (<_DeviceParts>parts).up.from_runtime:
                _disown_after_fork(<Device>dev)


cdef _disown_after_fork(Device dev):
    """An acl Device in a child of fork() is closed there, and never calls
    the Ascend runtime again: its memory, events and physical handles are the
    parent's, the runtime's threads (and any lock they held at the fork) are
    not in the child, and nothing in hicann/runtime src/runtime prepares it
    for fork (no pthread_atfork there).  torch_npu refuses the NPU in a
    forked subprocess for the same reason.  Closing or collecting the copy
    forgets its chunks and granules instead of freeing them, which in the
    parent would free memory still in use.  The child makes a Device of its
    own (the 'spawn' start method does that naturally)."""
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    parts.up.disowned = True
    if parts.mapper is not None:
        parts.mapper.disowned = True
    parts.closed_why = (f" (inherited through fork() from process {os.getppid()}: its Ascend "
                        f"runtime memory belongs to the parent; make a Device in the child, "
                        f"or use the 'spawn' start method)")
    parts.closed = parts.views.closed = True
    if dev._d is not NULL:
        ascm_device_close(dev._d)  # raw callers get ASCM_ERR_CLOSED too


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_devices_after_fork)


def kind_table():
    """The C core's kind table (csrc/kinds.c): per MemKind, its page size,
    whether it is charged as huge pages, whether it is device memory, and
    which free call frees it."""
    calls = {ASCM_FREE_DEVICE: "free", ASCM_FREE_DVPP: "dvpp_free", ASCM_FREE_HOST: "free_host"}
    out = {}
    for k in range(ASCM_KINDS):
        info = ascm_kind(k)
        out[MemKind(k)] = {"name": info.name.decode(), "page_size": info.page_size,
                           "huge": bool(info.huge), "device": bool(info.device),
                           "freed_by": calls[info.freed_by]}
    return out


cdef int _kind_arg(object kind) except -1:
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


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_LOCK = _NoLock()


cdef object _opt_u64(object v, str what):
    return None if v is None else as_u64(v, what)


cdef uint64_t _device_unit(object min_block) except 0:
    """A Device's min_block checked: a power of two from 512 to 4096.  At
    most the normal page: the device's ranges and chunks come in pages.  At
    least 512: the range its replays and tests cover (a plan tries 4096, 2048
    and 1024, ascmem.trace.CONTIGUOUS_UNITS)."""
    cdef uint64_t unit = as_u64(min_block, "min_block")
    if unit < 512 or unit > 4096 or unit & (unit - 1):
        raise InvalidArgumentError(f"a Device's min_block must be a power of two from 512 to "
                                   f"4096, not {min_block!r}")
    return unit


cdef _budget_config(ascm_device_config *cfg, object prof, object lay, str mode):
    """The C device's configuration from a profiles.Layout (chunks aside)."""
    memset(cfg, 0, sizeof(ascm_device_config))
    cfg.host_is_device = mode == "RC"  # aclrtMallocHost is device memory in RC mode
    cfg.min_block = 4096
    cfg.p2p = prof.p2p
    cfg.budget.reserve = lay.reserve
    cfg.budget.shared = lay.shared
    cfg.budget.huge_grows = lay.huge_grows
    cfg.budget.limit = lay.limit


@cython.final
@cython.no_gc_clear  # Device.__dealloc__ reads it (a cycle through oom_callback is cleared at the Device)
cdef class _DeviceParts:
    """A Device's private state: its parts, and what the front counts itself."""

    def __cinit__(self, _Upstream up, sizes, uint64_t aicpu):
        self.up = up
        self.counters = {"huge_fallbacks": 0, "oom_retries": 0, "oom_rejections": 0, "chunks_taken": 0,
                         "chunks_given_back": 0, "upstream_failures": 0, "sync_all_streams": 0,
                         "resets": 0}
        self.growth = _Growth(up, sizes, self.counters)
        self.ledger = _StreamLedger(up)
        self.views = _ViewRegistry()
        self.tags = _TagRegistry()
        if up.readable and os.environ.get("ASCMEM_DEBUG", "") == "1":
            self.guards = _GuardBytes()
            self.general = True
        self.warned = set()
        self.aicpu = aicpu
        self.closed_why = ""

    cdef give_back(self):
        """Everything the device holds upstream, when it is collected: the
        mapped granules before the reserved ranges under them -- unmap, free
        the physical memory, then release the range, the order of hicann/runtime
        docs/zh/api_ref/11-04_virtual_memory_management.md lines 241-247 (the
        stand-in refuses a release with mappings left, as the runtime may).
        First the runtime's events of frees that will never be waited for,
        as close() does."""
        try:
            self.ledger.drop_events()
        except Exception:  # in a cycle the collector may have emptied the ledger first
            pass
        try:  # each step whatever the one before did: what one leaves, the next still frees
            if self.mapper is not None:
                self.mapper.release_all()
        finally:
            self.up.close()

    def __dealloc__(self):
        # the Device's deallocation gives everything back; this is for a Device
        # whose fields the collector cleared first (in a reference cycle)
        try:
            self.give_back()
        except BaseException:  # nothing may escape a destructor
            pass

    def map_lock(self):
        """The lock a call that may queue map runs holds (a no-op context
        without a mapper)."""
        return self.mapper.lock if self.mapper is not None else _NO_LOCK

    cdef bint apply_maps(self) except -1:
        """acl, paged: the map and unmap runs the pools queued, through pyACL
        (_acl_paging.pyx); False if the runtime refused a map."""
        return self.mapper is None or self.mapper.apply()

    cdef forget_blocks(self):
        """The state of the blocks a reset freed (the runtime's own memory,
        fixed_taken, stays until a restart)."""
        self.reused_bytes = self.reuse_count = 0
        self.ledger.clear()
        self.tags.clear()
        if self.guards is not None:
            self.guards.clear()
