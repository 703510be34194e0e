# Upstreams: where a Device's chunks come from and where they go back, and
# the runtime's view of streams (one class per backend: sim, host, acl; the
# role of RMM's upstream device_memory_resource).  Included by _core.pyx.
#
# The protocol: first_chunks (each kind's first chunk, all or nothing), take
# and give (one chunk), retire (a chunk a reset let go), close; readable
# (the host can touch the memory); record_event / event_done / destroy_event
# / synchronize (a runtime's streams; without one, events are None and the
# Device's own sequence numbers order frees).  Growth -- how much a kind has
# taken, its maximum, when idle chunks go back -- is _Growth's (_growth.pxi).
#
# What a Device may ask of its backend is declared here as the upstream's
# capabilities, set by each class and read by the Device instead of the
# backend's name:
#   holds_memory   chunks are memory, not only address ranges: a pool can grow
#                  from them and give idle ones back, and their accounting is checked
#   readable       the host can read and write the memory (views, sleep's saved bytes)
#   from_runtime   chunks, events and mappings are the Ascend runtime's: the layout
#                  is sized by it, and a child of fork() must disown them
#   paging         how a paged pool's granules are mapped: "counted" (nothing is
#                  mapped; the runtime's 2 MB granule is kept), "os" (mmap), or
#                  "runtime" (the VMM calls through pyACL)
#   chunk_alignment  what every chunk's start is aligned to (0: only what the
#                  runtime handed out, read from the chunks)
# A backend is its upstream class and one line of _UPSTREAMS (the end of this
# file).
#
# An upstream owns every chunk it handed out until it takes it back, and
# gives them all back when it is closed or collected -- whatever happened to
# the Device.  That is what keeps memory from leaking when a Device dies in a
# reference cycle (the collector clears the Device's fields before its
# deallocation runs, so the Device cannot be relied on to clean up) or when
# its constructor fails half-way.

from ascmem.errors import (ACL_ERROR_RT_FEATURE_NOT_SUPPORT, AscmemError, MisalignedError,
                           UnsupportedError)
from ascmem.rules import MemKind

# acl backend: how each kind's chunks are taken from the runtime and given back
# (namespace, function, policy or None, free function): the runtime's calls,
# not facts about the kinds (those are csrc/kinds.c's)
_ACL_CALLS = {ASCM_KIND_HUGE: ("rt", "malloc", 1, "free"),
              ASCM_KIND_NORMAL: ("rt", "malloc", 2, "free"),
              ASCM_KIND_DVPP: ("media", "dvpp_malloc", None, "dvpp_free"),
              ASCM_KIND_HOST: ("rt", "malloc_host", None, "free_host"),
              ASCM_KIND_HUGE1G: ("rt", "malloc", 6, "free")}
# pyACL codes that mean "the runtime is out of memory" (aclError: 207001
# ACL_ERROR_RT_MEMORY_ALLOCATION, 200000 ACL_ERROR_BAD_ALLOC)
_UPSTREAM_OOM = (207001, 200000)
_CHUNK_ALIGN = 2 << 20
# Retired host ranges kept reserved per device: each costs the process one
# mapping (the kernel allows about 65,000 in all) and no memory, so the
# oldest are let go past this many -- a pointer from within the last
# thousand resets or so (four kinds each) is always refused.
_QUARANTINE_MAX = 4096
# Simulated address layout: devices 64 TiB apart, each reset moves the device's
# ranges by 1 TiB (64 epochs before addresses repeat), kinds 128 GiB apart.
cdef int _DEVICE_SHIFT = 46
cdef int _EPOCH_SHIFT = 40
cdef int _EPOCHS = 64
cdef int _KIND_SHIFT = 37
_OS_PAGES = {ASCM_OS_NORMAL: "normal pages", ASCM_OS_THP: "transparent huge pages (advised)",
             ASCM_OS_HUGETLB: "explicit huge pages (MAP_HUGETLB)"}


cdef extern from "Python.h":
    void PyObject_GC_UnTrack(object o)


cdef list _uncollectable_list():
    """An empty list the cycle collector does not track.  The collector
    clears every container it finds unreachable, in an order of its own:
    a Device in a cycle could find its upstream's record of chunks emptied
    by the time the upstream gave them back -- a segmentation fault (the
    record indexed by kind) or leaked chunks.  A list CPython does not
    track is never cleared, and a list stays untracked when items are added
    (only dicts track themselves again).  What these lists hold -- tuples of
    integers -- cannot be part of a cycle."""
    cdef list l = []
    PyObject_GC_UnTrack(l)
    return l


class UpstreamError(AscmemError):
    """The upstream (the OS, the Ascend runtime) refused a chunk; ``code`` is
    the runtime's."""


@cython.no_gc_clear  # close() must find the chunks whenever it runs (see above)
cdef class _Upstream:
    """The chunks a device holds, per kind, as (base, size) in the order taken.
    This base class is the sim backend's upstream: it hands out no memory, only
    address ranges, laid out by device id and reset epoch (_DEVICE_SHIFT...).

    Every field lives here, none in the subclasses: the base class's
    deallocation runs close(), which must still find them (Cython clears a
    subclass's fields before the base's __dealloc__ runs).  The garbage
    collector may not clear them either (no_gc_clear): collecting a Device
    in a cycle collects everything only it reaches, this included, and a
    cleared list of chunks would leak them.  Nor the lists themselves: they
    are not tracked by the collector (_uncollectable_list).  Nothing here
    refers back to a Device, so no cycle runs through an upstream."""
    cdef readonly list held      # per kind: [(base, size), ...]
    cdef readonly str name
    cdef readonly bint readable  # the host can read and write the memory
    cdef readonly bint holds_memory      # capabilities: see the top of this file
    cdef readonly bint from_runtime
    cdef readonly str paging
    cdef readonly uint64_t chunk_alignment
    cdef readonly object acl     # acl: the pyACL module
    cdef readonly dict pages     # host: kind -> ASCM_OS_* of its first chunk
    cdef list _quarantine        # host: [(base, size)] retired, reserved, inaccessible
    cdef uint64_t _device_id     # sim: which device's ranges
    cdef uint64_t _epoch         # sim: first_chunks calls so far (resets + 1)
    cdef public frozenset paged_kinds  # kinds whose chunks are mapped in granules by the pools
    cdef public bint disowned    # acl, in a child of fork(): the chunks and events are the
                                 # parent's, forgotten rather than given back (the copy is
                                 # closed there, so nothing takes or records any more)

    def __cinit__(self, *args, **kwargs):
        self.held = _uncollectable_list()
        for _ in range(ASCM_KINDS):
            self.held.append(_uncollectable_list())
        self.name = "sim"
        self.readable = False
        self.holds_memory = False
        self.from_runtime = False
        self.paging = "counted"
        self.chunk_alignment = 1 << 30  # simulated ranges are aligned past any page
        self.pages = {}
        self._quarantine = _uncollectable_list()
        self.paged_kinds = frozenset()

    def first_chunks(self, sizes):
        """Each kind's first chunk (size 0: none, base 0), all or nothing: if
        one is refused, the ones taken here go back and the error is raised."""
        return self._sim_ranges(sizes)

    cdef list _sim_ranges(self, sizes):
        cdef uint64_t top = ((self._device_id + 1) << _DEVICE_SHIFT) | \
            ((self._epoch % _EPOCHS) << _EPOCH_SHIFT)
        self._epoch += 1
        return [top | (<uint64_t>k << _KIND_SHIFT) for k in range(ASCM_KINDS)]

    def take(self, int k, uint64_t size):
        """One chunk: its base.  Raises UpstreamError if refused."""
        raise UnsupportedError("the sim backend takes no memory from an upstream")

    def give(self, int k, uint64_t base, uint64_t size):
        """Gives one chunk back."""
        self.held[k].remove((base, size))
        self._release(k, base, size)

    def retire(self, int k, uint64_t base, uint64_t size):
        """Gives a chunk back after a reset; pointers into it must stay
        foreign to the device (see the host upstream)."""
        self.give(k, base, size)

    def drop_quarantine(self):
        return 0

    def describe(self, e):
        """Why a take failed, for messages."""
        return str(e)

    # streams: without a runtime there are no events (None) and nothing to wait for
    def record_event(self, stream):
        """An event recorded on stream now, or None."""
        return None

    def event_done(self, ev):
        """The stream of ev has passed it."""
        return False

    def destroy_event(self, ev):
        pass

    def synchronize(self, stream):
        """Waits for the work queued on stream; raises if the runtime fails."""

    def close(self):
        """Gives every chunk back; idempotent."""
        for k, ranges in enumerate(self.held):  # not indexed: never past its end
            while ranges:
                base, size = ranges.pop()
                self._release(k, base, size)

    def _release(self, int k, uint64_t base, uint64_t size):
        pass

    def __dealloc__(self):
        try:
            self.close()
        except BaseException:  # nothing may escape a destructor
            pass


@cython.no_gc_clear
cdef class _RealUpstream(_Upstream):
    """An upstream with memory behind its chunks (host, acl)."""

    def first_chunks(self, sizes):
        got = [0] * ASCM_KINDS
        try:
            for k in range(ASCM_KINDS):
                if sizes[k]:
                    got[k] = self.take(k, sizes[k])
        except BaseException:
            for k in range(ASCM_KINDS):
                if got[k]:
                    self.give(k, got[k], sizes[k])
            raise
        return got


@cython.no_gc_clear
cdef class _HostUpstream(_RealUpstream):
    """Real memory from mmap; huge kinds 2 MiB-aligned, on huge pages if the
    OS has them.  A chunk retired by a reset stays reserved as inaccessible
    address space (no physical memory), so the OS cannot hand its addresses
    out again while the device lives: a pointer from before a reset stays
    foreign, for the last _QUARANTINE_MAX retired ranges (and all of them
    when the OS runs short of mappings: see drop_quarantine).  close()
    returns the reservations too."""

    def __cinit__(self, *args, **kwargs):
        self.name = "host"
        self.readable = True
        self.holds_memory = True
        self.paging = "os"
        self.chunk_alignment = _CHUNK_ALIGN  # take() reserves every chunk 2 MiB-aligned

    def take(self, int k, uint64_t size):
        cdef uint64_t addr
        cdef int got
        huge = ascm_kind(k).huge  # huge-page kinds: on huge pages if the OS has them
        # every chunk 2 MiB-aligned (address space only): a pool aligns blocks
        # past its unit relative to its base, so align_tag's groups get up to
        # 2 MiB on every kind
        if ascm_os_reserve(size, _CHUNK_ALIGN, huge, &addr, &got) != ASCM_OK:
            raise UpstreamError(f"the OS refused {_fmt_bytes(size)} of address space for "
                                f"{MemKind(k).name} memory")
        self.pages.setdefault(k, got)
        if k in self.paged_kinds and ascm_os_map(NULL, addr, size, 0) != 0:
            ascm_os_release(addr, size)  # a paged chunk starts unmapped: no access, no memory
            raise UpstreamError(f"the OS refused to protect {_fmt_bytes(size)} of reserved "
                                f"{MemKind(k).name} address space")
        self.held[k].append((addr, size))
        return addr

    def retire(self, int k, uint64_t base, uint64_t size):
        self.held[k].remove((base, size))
        if ascm_os_quarantine(base, size) == ASCM_OK:
            self._quarantine.append((base, size))
        else:  # cannot keep the addresses: at least give the memory back
            ascm_os_release(base, size)
        while len(self._quarantine) > _QUARANTINE_MAX:
            old_base, old_size = self._quarantine.pop(0)
            ascm_os_release(old_base, old_size)

    def drop_quarantine(self):
        """Lets every retired range go (the OS refused fresh address space);
        returns how many."""
        n = len(self._quarantine)
        while self._quarantine:
            base, size = self._quarantine.pop()
            ascm_os_release(base, size)
        return n

    def close(self):
        _Upstream.close(self)
        while self._quarantine:
            base, size = self._quarantine.pop()
            ascm_os_release(base, size)

    def _release(self, int k, uint64_t base, uint64_t size):
        ascm_os_release(base, size)


@cython.no_gc_clear
cdef class _AclUpstream(_RealUpstream):
    """Chunks from the CANN runtime through pyACL (aclrtMalloc with the kind's
    policy, acldvppMalloc, aclrtMallocHost), sub-allocated by ascmem as CANN
    advises instead of frequent aclrtMalloc calls."""

    def __cinit__(self, acl_module, *args, **kwargs):
        self.name = "acl"
        self.acl = acl_module
        self.holds_memory = True
        self.from_runtime = True
        self.paging = "runtime"
        self.chunk_alignment = 0  # aclrtMalloc promises no more than its page

    def take(self, int k, uint64_t size):
        ns, name, policy, free_name = _ACL_CALLS[k]
        if k in self.paged_kinds:  # address space only: the pools map granules under it
            ns, name, free_name, align = "rt", "reserve_mem_address", "release_mem_address", 2 << 20
            ptr, ret = self.acl.rt.reserve_mem_address(size, 0, 0, 0)
        else:
            align = 4096
            fn = getattr(getattr(self.acl, ns), name)
            ptr, ret = fn(size, policy) if policy is not None else fn(size)
        if ret == 0 and isinstance(ptr, int) and ptr > 0 and ptr % align == 0 and \
                ptr + size < (1 << 64):
            self.held[k].append((ptr, size))
            return ptr
        if ret == 0 and isinstance(ptr, int) and ptr > 0:  # a pointer we cannot use: give it back
            getattr(getattr(self.acl, ns), free_name)(ptr)
            raise MisalignedError(f"acl.{ns}.{name}({size}) returned {ptr:#x}, not {align} "
                                  f"aligned (or past the address space)")
        err = OutOfMemoryError if ret in _UPSTREAM_OOM else UpstreamError
        why = ""
        if k in self.paged_kinds and ret == ACL_ERROR_RT_FEATURE_NOT_SUPPORT:
            # the runtime's answer where the driver lacks the virtual memory
            # calls (hicann/runtime src/runtime/driver/npu_driver_mem.cc
            # lines 334-341): paged=True cannot work here, and is not faked
            err, why = UnsupportedError, ": this device has no virtual memory management"
        e = err(f"acl.{ns}.{name}({size}) for the {MemKind(k).name} pool returned "
                f"{ret if ret else 'a null pointer'}{why}")
        e.code = ret if ret else 207001
        raise e

    def describe(self, e):
        return f"code {e.code}"

    # A runtime call that raises (pyACL's MemoryError, say) where it could
    # return a failure code is taken as that failure, so that what the
    # device counts stays what the runtime holds (found by probing: a raise
    # in a chunk's free left the growth accounting wrong, and check() said
    # so; one in aclrtRecordEvent leaked the event).

    def record_event(self, stream):
        """aclrtCreateEvent + aclrtRecordEvent; None if the runtime refused."""
        rt = self.acl.rt
        try:
            ev, ret = rt.create_event()
        except Exception:
            return None
        if ret != 0:
            return None
        try:
            ret = rt.record_event(ev, stream)
        except Exception:
            ret = -1
        if ret != 0:
            self.destroy_event(ev)
            return None
        return ev

    def event_done(self, ev):
        """aclrtQueryEventStatus says ACL_EVENT_RECORDED_STATUS_COMPLETE (1)."""
        status, ret = self.acl.rt.query_event_status(ev)
        return ret == 0 and status == 1

    def destroy_event(self, ev):
        if self.disowned:  # an event of the parent's runtime
            return
        try:
            self.acl.rt.destroy_event(ev)
        except Exception as e:  # its code is not looked at either
            warnings.warn(f"acl.rt.destroy_event raised {e!r}", ResourceWarning)

    def synchronize(self, stream):
        ret = self.acl.rt.synchronize_stream(stream)
        if ret != 0:
            raise AscmemError(f"acl.rt.synchronize_stream returned {ret}")

    def _release(self, int k, uint64_t base, uint64_t size):
        if self.disowned:  # forgotten: the parent still holds it (_disown_after_fork)
            return
        ns, _, _, free_name = _ACL_CALLS[k]
        if k in self.paged_kinds:
            ns, free_name = "rt", "release_mem_address"
        try:
            ret = getattr(getattr(self.acl, ns), free_name)(base)
        except Exception as e:
            ret = repr(e)
        if ret != 0:  # the chunk is forgotten all the same: the device no longer has it
            warnings.warn(f"acl.{ns}.{free_name}({base:#x}) returned {ret}", ResourceWarning)


cdef _Upstream _sim_upstream(uint64_t device_id, object acl_module):
    cdef _Upstream sim = _Upstream()
    sim._device_id = device_id
    return sim


cdef _Upstream _host_upstream(uint64_t device_id, object acl_module):
    return _HostUpstream()


cdef _Upstream _acl_upstream(uint64_t device_id, object acl_module):
    """pyACL: `import acl` unless a module is given."""
    if acl_module is None:
        try:
            import acl as acl_module
        except ImportError:
            raise UnsupportedError("backend='acl' needs pyACL (`import acl` failed); use "
                                   "backend='sim' or 'host' without an Ascend runtime") from None
    return _AclUpstream(acl_module)


ctypedef _Upstream (*_upstream_maker)(uint64_t, object)

# The registry of backends: the name a Device is given, and how its upstream is made.
_UPSTREAMS = ("sim", "host", "acl")


cdef _Upstream _make_upstream(str backend, uint64_t device_id, object acl_module):
    cdef _upstream_maker make = (_sim_upstream if backend == "sim" else
                                 _host_upstream if backend == "host" else _acl_upstream)
    return make(device_id, acl_module)


def backends():
    """Each backend's name and what its upstream declares it can do (the
    capabilities at the top of _upstream.pxi); the acl backend's without
    pyACL, as a stand-in module would give."""
    out = {}
    for name in _UPSTREAMS:
        up = _make_upstream(name, 0, object()) if name == "acl" else _make_upstream(name, 0, None)
        out[name] = {"holds_memory": up.holds_memory, "readable": up.readable,
                     "from_runtime": up.from_runtime, "paging": up.paging,
                     "chunk_alignment": up.chunk_alignment}
        up.close()
    return out
