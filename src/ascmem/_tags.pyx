# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: binding=False
# Tags: named groups of device blocks that can sleep -- give their physical
# memory back while keeping their addresses -- and wake again with their
# contents (what vLLM's sleep mode needs for weights and KV cache).  Needs a
# paged Device: a sleeping large block's granules are unmapped where no
# awake block shares them (ascm_pool_sleep); small blocks (slab slots) share
# their slab with other blocks, so they stay resident, contents in place.
# A module of its own: the Device (ascmem._core) cimports the registry and
# the operations (_tags.pxd); they work on the Device's parts (_core.pxd) and
# call the C core through its table (CoreCalls).

cimport cython
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcpy

from ascmem._core cimport (ASCM_ERR_BUDGET, ASCM_ERR_NOMEM, ASCM_FREE_DEVICE, ASCM_KINDS, ASCM_OK,
                           CoreCalls, Device, _DeviceParts, _as_u64_slow as as_u64, _fmt_bytes,
                           _guard, _require_open, ascm_device, ascm_pool, ascm_route, core_calls)
from ascmem._upstream cimport _Upstream
from ascmem._views cimport _ViewRegistry

from ascmem.errors import (ArgumentTypeError, InvalidArgumentError, IpcBusyError,
                           OutOfMemoryError, UnsupportedError)
from ascmem.rules import MemKind

cdef const CoreCalls *C = core_calls()


@cython.final
cdef class _TagRegistry:
    """Which live blocks carry which tag, and what each sleeping tag saved."""

    def __cinit__(self):
        self.tag_of = {}
        self.members = {}
        self.sleeping = {}
        self.known = set()
        self.aligned = {}
        self.shareable = set()
        self.cost_at = {}
        self.cost_of = {}

    cdef add(self, uint64_t addr, object tag):
        self.known.add(tag)
        self.tag_of[addr] = tag
        self.members.setdefault(tag, set()).add(addr)
        self.tracked += 1

    cdef forget(self, uint64_t addr):
        """A tagged block was freed (asleep or not)."""
        tag = self.tag_of.pop(addr, None)
        if tag is None:
            return
        self.members[tag].discard(addr)
        if not self.members[tag] and tag not in self.sleeping:
            del self.members[tag]
        saved = self.sleeping.get(tag)
        if saved is not None:
            saved.pop(addr, None)
        self.tracked -= 1
        cost = self.cost_at.pop(addr, None)
        if cost is not None:
            c = self.cost_of[tag]
            c[0] -= cost
            c[2] -= 1
        if self.ipc is not None:
            self.ipc.forget_block(addr)  # host: private memory back under the block

    cdef object asleep_tag(self, uint64_t addr):
        """The tag of addr if that tag sleeps, else None."""
        tag = self.tag_of.get(addr)
        return tag if tag is not None and tag in self.sleeping else None

    cdef uint64_t asleep_bytes(self, ascm_device *d):
        cdef uint64_t total = 0, n
        cdef ascm_pool *p
        for saved in self.sleeping.values():
            for addr, state in saved.items():
                p = C.ascm_device_pool_at(d, addr, NULL)
                if state is not False and p is not NULL and \
                        C.ascm_pool_usable_size(p, addr, &n) == ASCM_OK:
                    total += n
        return total

    cdef uint64_t alignment_of(self, object tag) except? 0:
        return self.aligned.get(tag, 0) if self.aligned else 0

    cdef clear(self):
        """Every block is gone (reset, close); the tags' alignments stay."""
        self.tag_of.clear()
        self.members.clear()
        self.sleeping.clear()
        self.tracked = 0
        self.cost_at.clear()
        for c in self.cost_of.values():
            c[0] = c[2] = 0
        if self.ipc is not None:
            self.ipc.drop_all()


cdef _check_tag(object tag):
    try:
        hash(tag)
    except TypeError:
        raise ArgumentTypeError(f"a tag must be hashable (a name), not {type(tag).__name__}") from None


cdef uint64_t _sleep_tag(Device dev, object tag, bint keep) except? 0:
    """Device.sleep: returns the bytes of device memory given back."""
    with dev._parts.map_lock():  # (the parts class is declared after this file)
        return _sleep_body(dev, tag, keep)


cdef uint64_t _sleep_body(Device dev, object tag, bint keep) except? 0:
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    cdef _TagRegistry tags = parts.tags
    cdef ascm_pool *p
    cdef uint64_t n, given, released = 0
    _require_open(dev, "sleep")
    _check_tag(tag)
    if not parts.paged:
        raise UnsupportedError("sleep needs a paged device (Device(..., paged=True)): a "
                               "contiguous pool cannot give a block's memory back and keep its "
                               "address")
    if tag in tags.sleeping:
        raise InvalidArgumentError(f"sleep: tag {tag!r} is asleep already")
    # A tag no block was ever allocated with is a mistake (a typo would sleep
    # nothing and then refuse the right name's allocations until a wake,
    # issue 45.16).  A known tag with no block right now may sleep: it then
    # takes no new block until it wakes, as any sleeping tag.
    if tag not in tags.known:
        raise InvalidArgumentError(f"sleep: no block was ever allocated with tag {tag!r} on "
                                   f"this device")
    addrs = sorted(tags.members.get(tag, ()))
    for a in addrs:
        _refuse_exported(parts, a, "sleep")  # importers map it
        if parts.views.of(a):
            raise InvalidArgumentError(f"sleep: {a:#x} of tag {tag!r} has a live buffer view")
    copies = {}
    if keep and parts.mapper is not None:  # every copy first: a refused one changes nothing
        for a in addrs:
            p = C.ascm_device_pool_at(dev._d, a, NULL)
            C.ascm_pool_usable_size(p, a, &n)
            copies[a] = parts.mapper.to_host(a, n)
    saved = {}
    for a in addrs:
        p = C.ascm_device_pool_at(dev._d, a, NULL)
        C.ascm_pool_usable_size(p, a, &n)
        data = copies.get(a) if parts.mapper is not None else \
            ((<char *><size_t>a)[:n] if keep and parts.up.readable else None)
        if C.ascm_pool_sleep(p, a, &given) == ASCM_OK:
            saved[a] = data
            released += given
        else:  # a slab slot: its slab is shared, so it stays as it is
            saved[a] = False
    tags.sleeping[tag] = saved
    parts.apply_maps()
    return released


cdef uint64_t _wake_tag(Device dev, object tag) except? 0:
    """Device.wake: maps the tag's blocks again at their addresses and puts
    back what sleep kept; all or nothing.  Returns the bytes mapped."""
    with dev._parts.map_lock():
        return _wake_body(dev, tag)


cdef uint64_t _wake_body(Device dev, object tag) except? 0:
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    cdef _TagRegistry tags = parts.tags
    cdef ascm_pool *p
    cdef int st
    cdef uint64_t taken, mapped = 0
    _require_open(dev, "wake")
    _check_tag(tag)
    if tag not in tags.sleeping:
        raise InvalidArgumentError(f"wake: tag {tag!r} is not asleep")
    saved = tags.sleeping[tag]
    woken = []
    for a, data in saved.items():
        if data is False:
            continue
        p = C.ascm_device_pool_at(dev._d, a, NULL)
        st = C.ascm_pool_wake(p, a, &taken)
        if st == ASCM_OK and not parts.apply_maps():
            C.ascm_pool_sleep(p, a, NULL)  # the runtime refused: this one goes back to sleep too
            parts.apply_maps()
            st = ASCM_ERR_NOMEM
        if st != ASCM_OK:
            for b in woken:  # back to sleep: the device is left as it was
                C.ascm_pool_sleep(C.ascm_device_pool_at(dev._d, b, NULL), b, NULL)
            parts.apply_maps()
            b = dev.budget()
            raise OutOfMemoryError(f"wake({tag!r}): the device has no room to map {a:#x} again "
                                   f"({'the page budget is exhausted' if st == ASCM_ERR_BUDGET else 'the upstream refused'}); "
                                   f"{_fmt_bytes(b['huge_used'])} huge + {_fmt_bytes(b['normal_used'])} "
                                   f"normal of {_fmt_bytes(b['total'])} in use")
        woken.append(a)
        mapped += taken
    if parts.mapper is not None:  # acl: back to the device through aclrtMemcpy
        try:
            for a, data in saved.items():
                if data:
                    parts.mapper.to_device(a, data)
        except BaseException:
            for b in woken:  # asleep again, contents still kept: a later wake can retry
                C.ascm_pool_sleep(C.ascm_device_pool_at(dev._d, b, NULL), b, NULL)
            parts.apply_maps()
            raise
    else:
        for a, data in saved.items():
            if data:  # bytes kept by sleep(keep=True)
                memcpy(<void *><size_t>a, <const char *>data, len(data))
            elif data is None and parts.guards is not None:  # keep=False: fresh pages
                parts.guards.restore(a)
    del tags.sleeping[tag]
    if not tags.members.get(tag, True):
        del tags.members[tag]
    return mapped


# ---- aligned groups (Device.align_tag) ------------------------------------------------

_MAX_ALIGNMENT = 1 << 30  # the largest page any kind has (huge1g)


cdef _align_tag(Device dev, object tag, object alignment, bint shareable):
    """Device.align_tag."""
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    cdef _TagRegistry tags = parts.tags
    cdef uint64_t a
    _require_open(dev, "align_tag")
    _check_tag(tag)
    if tag is None:
        raise InvalidArgumentError("align_tag: None is no tag (untagged blocks stay as they are)")
    if alignment is None:
        if shareable:
            raise InvalidArgumentError("align_tag: a shareable tag needs an alignment")
        tags.aligned.pop(tag, None)
        tags.shareable.discard(tag)
        return
    a = as_u64(alignment, "alignment")
    if a == 0 or a & (a - 1):
        raise InvalidArgumentError(f"align_tag: alignment {alignment} is not a power of two")
    if a > _MAX_ALIGNMENT:
        raise InvalidArgumentError(f"align_tag: alignment {_fmt_bytes(a)} is larger than the "
                                   f"largest page ({_fmt_bytes(_MAX_ALIGNMENT)})")
    if a > _chunk_alignment(dev):
        raise InvalidArgumentError(f"align_tag: alignment {_fmt_bytes(a)} is larger than the "
                                   f"{dev.backend} backend's chunks are aligned "
                                   f"({_fmt_bytes(_chunk_alignment(dev))}): a pool aligns its "
                                   f"blocks relative to its chunk's start")
    if shareable and parts.up.readable and a % _PAGE:
        raise InvalidArgumentError(f"align_tag: a shareable tag on the host backend needs an "
                                   f"alignment of at least the OS page ({_PAGE} bytes): its "
                                   f"blocks are mapped from shared memory page by page")
    if shareable and parts.paged and parts.up.readable:
        raise UnsupportedError("align_tag: shareable tags on a paged host device (the pool maps "
                               "and unmaps its granules itself)")
    tags.aligned[tag] = a
    if shareable:
        tags.shareable.add(tag)
    else:
        tags.shareable.discard(tag)
    tags.cost_of.setdefault(tag, [0, 0, 0])


cdef uint64_t _chunk_alignment(Device dev):
    """The largest alignment every block of the device can get: host chunks
    are reserved 2 MiB-aligned (_HostUpstream.take); simulated ranges are
    aligned far past any page; on acl, the alignment of the chunks the
    runtime handed out (aclrtMalloc promises no more than its page)."""
    cdef uint64_t base, size, least = _MAX_ALIGNMENT
    cdef _Upstream up = (<_DeviceParts>dev._parts).up
    if up.chunk_alignment:
        return min(up.chunk_alignment, _MAX_ALIGNMENT)
    for k in range(ASCM_KINDS):
        if C.ascm_kind(k).freed_by != ASCM_FREE_DEVICE:
            continue
        for i in range(C.ascm_device_chunk_count(dev._d, k)):
            if C.ascm_device_chunk(dev._d, k, i, &base, &size) is not NULL and base:
                least = min(least, base & -base)
    return least


cdef int _join_aligned(Device dev, uint64_t addr, object tag, uint64_t n, uint32_t policy,
                       int mode) except -1:
    """A new block of an aligned tag (tracked already): what the alignment
    cost it, and, for a shareable tag on the host backend, its own shared
    memory.  If that is refused, the block is freed again and the error
    raised."""
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    cdef _TagRegistry tags = parts.tags
    cdef ascm_route r
    cdef uint64_t usable = 0, plain = 0
    cdef int kind
    cdef ascm_pool *p = C.ascm_device_pool_at(dev._d, addr, NULL)
    C.ascm_pool_usable_size(p, addr, &usable)
    cdef ascm_pool *q
    if C.ascm_device_route(dev._d, n, policy, mode, &r) == ASCM_OK:
        q = C.ascm_device_pool(dev._d, r.kinds[0])  # where the call lands unaligned
        plain = C.ascm_pool_usable_for(q if q is not NULL else p, r.rounded + r.pad, r.align)
    cost = usable - plain if usable > plain else 0
    tags.cost_at[addr] = cost
    c = tags.cost_of[tag]
    c[0] += cost
    c[2] += 1
    if c[0] > c[1]:
        c[1] = c[0]
    if tag in tags.shareable and parts.up.readable:
        try:
            _ipc_state(dev).back(addr, usable)
        except BaseException:
            tags.forget(addr)
            C.ascm_device_free_held(dev._d, addr, 0xFFFFFFFF, &kind)
            parts.apply_maps()
            raise
    return 0


cdef dict _alignment_stats(_TagRegistry tags):
    """stats()["aligned"]: per aligned tag, its alignment and what it costs:
    the bytes its live blocks hold beyond what the same calls would get
    unaligned (now and at the peak), and its live blocks."""
    return {tag: {"alignment": tags.aligned.get(tag, 0), "padding_bytes": c[0],
                  "peak_padding_bytes": c[1], "blocks": c[2],
                  "shareable": tag in tags.shareable}
            for tag, c in tags.cost_of.items()}


# ---- sharing between processes (ascmem/ipc.py) ----------------------------------------

import mmap as _mmap_module
cdef uint64_t _PAGE = _mmap_module.PAGESIZE


cdef object _ipc_state(Device dev):
    """The device's IpcState, made on first use."""
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    if parts.tags.ipc is None:
        from ascmem import ipc
        parts.tags.ipc = ipc.IpcState(parts.up.sharing, parts.up.acl, dev.device_id)
    return parts.tags.ipc


cdef int _refuse_exported(_DeviceParts parts, uint64_t addr, str call) except -1:
    """A block cannot be freed while it is exported (importers map it)."""
    if parts.tags.ipc is not None and parts.tags.ipc.exported(addr):
        raise IpcBusyError(f"{call}: {addr:#x} is exported; ipc_close its key first (after every "
                           f"importer closed it)")
    return 0


cdef object _ipc_export(Device dev, object ptr, object size, object pids, object any_process):
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    cdef uint64_t a = as_u64(ptr, "pointer"), usable
    cdef int k = -1
    _require_open(dev, "ipc_export")
    cdef ascm_pool *p = C.ascm_device_pool_at(dev._d, a, &k)
    if p is NULL or parts.ledger.waits(a) or C.ascm_pool_usable_size(p, a, &usable) != ASCM_OK:
        raise InvalidArgumentError(f"ipc_export: {a:#x} is not the start of a live block")
    if not C.ascm_kind(k).device or C.ascm_kind(k).freed_by != ASCM_FREE_DEVICE:
        raise InvalidArgumentError(f"ipc_export: {a:#x} is {MemKind(k).name.lower()} memory; "
                                   f"aclrtIpcMemGetExportKey shares device memory from aclrtMalloc")
    if parts.tags.asleep_tag(a) is not None:
        raise InvalidArgumentError(f"ipc_export: {a:#x} is asleep: wake it first")
    if parts.guards is not None:
        usable = parts.guards.requested(a, usable)
    key = _ipc_state(dev).export(a, usable, size, pids, any_process)
    _guard(dev, a)  # the GIL-free frees refuse it too
    parts.tags.tracked += 1  # Device frees take the path that refuses it (_refuse_exported)
    return key


cdef _ipc_close(Device dev, object key):
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    _require_open(dev, "ipc_close")
    if _ipc_state(dev).close(key, parts.views.of) == "export":
        parts.tags.tracked -= 1


cdef object _ipc_buffer_size(_DeviceParts parts, uint64_t addr):
    """The bytes of an imported range at addr (host), or 0."""
    return parts.tags.ipc.imported_size(addr) if parts.tags.ipc is not None else 0
