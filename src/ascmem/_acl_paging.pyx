# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: binding=False
# Paged kinds on the acl backend: physical memory from the Ascend runtime
# (aclrtMallocPhysical + aclrtMapMem per granule; aclrtUnmapMem +
# aclrtFreePhysical), under address ranges reserved with
# aclrtReserveMemAddress (the upstream's take for paged kinds).
#
# A pool calls its map hook with its lock held, where no Python may run, so
# the hook only queues the runs (C memory); the Device applies the queue
# through pyACL as soon as the call that filled it returns.  Between the two
# another thread could be handed a block in a granule counted as mapped but
# not mapped yet, so every call that can queue holds the mapper's lock from
# the pool call to the end of the apply (pyACL may let other Python threads
# run meanwhile).  The pluggable functions, which run without the GIL, are
# refused for such a device.  Cimported by ascmem._core (_acl_paging.pxd);
# the C core through its table (CoreCalls).

cimport cython
from libc.stdlib cimport malloc as c_malloc, realloc as c_realloc, free as c_free

from ascmem._core cimport (ASCM_KIND_HUGE, ASCM_KIND_HUGE1G, ASCM_KIND_NORMAL, CoreCalls,
                           core_calls)

import ctypes
import threading

from ascmem.errors import OutOfMemoryError

cdef const CoreCalls *C = core_calls()

_GRANULARITY_RECOMMENDED = 1          # aclrtMemGranularityOptions

# aclrtPhysicalMemProp as pyACL takes it (a dict).  hicann/runtime at
# 681ef7610: include/external/acl/acl_rt.h -- aclrtMemAttr lines 227-246
# (ACL_MEM_NORMAL 12, ACL_MEM_HUGE 13, ACL_MEM_HUGE1G 14), ACL_MEM_LOCATION_TYPE_DEVICE
# 1 (line 316), ACL_MEM_ALLOCATION_TYPE_PINNED 0 (352), ACL_MEM_HANDLE_TYPE_NONE
# 0 (356).  src/acl/aclrt_impl/memory.cpp lines 1071-1128 (aclrtMallocPhysical):
# prop must not be null, handleType NONE, allocationType PINNED, and a memAttr
# of its handler table for device memory: the generic NORMAL / HUGE / HUGE1G
# (the HBM_* ones only on 950, A3, A2; the DDR_* ones only for host memory:
# docs/zh/api_ref/11-04_virtual_memory_management.md lines 89-131).  The same
# checks guard aclrtMemGetAllocationGranularity (memory.cpp lines 1299-1340).
_ACL_MEM_NORMAL, _ACL_MEM_HUGE, _ACL_MEM_HUGE1G = 12, 13, 14
_MEM_ATTR_OF_KIND = {ASCM_KIND_HUGE: _ACL_MEM_HUGE, ASCM_KIND_NORMAL: _ACL_MEM_NORMAL,
                     ASCM_KIND_HUGE1G: _ACL_MEM_HUGE1G}


def _physical_prop(int mem_attr, int device_id):
    return {"handleType": 0, "allocationType": 0, "memAttr": mem_attr,
            "location": {"id": device_id, "type": 1}, "reserve": 0}


def _acl_granule(acl_module, int device_id):
    """The granule to map in: what the runtime recommends
    (acl.rt.mem_get_allocation_granularity, aclrtMemGetAllocationGranularity:
    "currently only 2M", the pyACL page aclpythondevg_01_0960), when it is a
    power-of-two multiple of 2 MB; else 2 MB, the documented value."""
    query = getattr(acl_module.rt, "mem_get_allocation_granularity", None)
    if query is None:
        return _ACL_GRANULE
    try:
        granule, ret = query(_physical_prop(_ACL_MEM_HUGE, device_id), _GRANULARITY_RECOMMENDED)
    except Exception:
        return _ACL_GRANULE
    if ret != 0 or not isinstance(granule, int) or granule < _ACL_GRANULE or \
            granule & (granule - 1) or granule > (1 << 30):
        return _ACL_GRANULE
    return granule


cdef int _acl_map_hook(void *ctx, uint64_t addr, uint64_t size, int map) noexcept nogil:
    """The pools' map hook (ascm_map_fn): queues the run.  A map that cannot
    be queued (host memory ran out) is refused; an unmap cannot be refused,
    so the pool counts it as failed and the granules stay mapped."""
    cdef _MapQueue *q = <_MapQueue *>ctx
    cdef _MapRequest *grown
    if q.n == q.cap:
        grown = <_MapRequest *>c_realloc(q.v, (q.cap * 2 + 16) * sizeof(_MapRequest))
        if grown is NULL:
            return 1
        q.v = grown
        q.cap = q.cap * 2 + 16
    q.v[q.n].addr = addr
    q.v[q.n].size = size
    q.v[q.n].map = map
    q.n += 1
    return 0


@cython.final
@cython.no_gc_clear  # its handles must be freed whenever it goes
cdef class _AclMapper:
    """The physical memory behind an acl device's paged kinds: one handle
    per mapped piece (a granule; a whole 1 GB page for the 1 GiB kind)."""

    def __cinit__(self, acl_module, uint64_t granule=_ACL_GRANULE, int device_id=0):
        self.acl = acl_module
        self.handles = {}
        self.piece_bytes = {}
        self.lock = threading.RLock()
        self.granule = granule
        self.device_id = device_id

    cdef after_fork(self):
        self.lock = threading.RLock()

    cdef void *hook_ctx(self):
        return <void *>&self.queue

    cdef bint apply(self) except -1:
        """Applies every queued run; False if a map was refused (the granules
        before it in that run are mapped, the rest not: the caller frees the
        block, which queues their unmaps, and applies again)."""
        cdef size_t i
        cdef bint ok = True
        # copied out first: pyACL may let another thread run, which waits on
        # self.lock but must not find the queue half read
        reqs = [(self.queue.v[i].addr, self.queue.v[i].size, self.queue.v[i].map)
                for i in range(self.queue.n)]
        self.queue.n = 0
        for addr, size, map in reqs:
            kind = C.ascm_device_kind_of(self.d, addr) if self.d is not NULL else -1
            piece = _ACL_GRANULE_1G if kind == ASCM_KIND_HUGE1G else self.granule
            for g in range(addr, addr + size, piece):
                if not map:
                    self._unmap(g)
                elif ok and not self._map(g, piece, _MEM_ATTR_OF_KIND.get(kind, _ACL_MEM_HUGE)):
                    ok = False  # the rest of the block's granules stay unmapped
        return ok

    # A runtime call that raises (pyACL's MemoryError, a stand-in's bug) is a
    # refusal like a failure code: every queued run is still applied, so the
    # pools' count of mapped granules and the handles agree, and the caller
    # undoes the allocation as for a refused map (found by probing: check()
    # reported corruption after such a raise).  KeyboardInterrupt and
    # SystemExit go through as they come.

    cdef bint _map(self, uint64_t g, uint64_t piece, int mem_attr) except -1:
        rt = self.acl.rt
        try:
            handle, ret = rt.malloc_physical(piece, _physical_prop(mem_attr, self.device_id), 0)
        except Exception as e:
            self.error = f"acl.rt.malloc_physical raised {e!r}"
            return False
        if ret != 0:
            self.error = f"acl.rt.malloc_physical returned {ret}"
            return False
        try:
            ret = rt.map_mem(g, piece, 0, handle, 0)
        except Exception as e:
            ret = e
        if ret != 0:
            try:
                rt.free_physical(handle)
            except Exception:  # the refusal below is what the caller needs to know
                pass
            self.error = f"acl.rt.map_mem {'raised' if isinstance(ret, Exception) else 'returned'} {ret!r}"
            return False
        self.handles[g] = handle
        self.piece_bytes[g] = piece
        self.mapped_bytes += piece
        return True

    cdef _unmap(self, uint64_t g):
        handle = self.handles.pop(g, None)
        if handle is None:  # its map was refused
            return
        self.mapped_bytes -= self.piece_bytes.pop(g)
        if self.disowned:  # forgotten: the parent still holds it
            return
        rt = self.acl.rt
        try:  # forgotten either way: the granule is the pool's free space again
            rt.unmap_mem(g)
            rt.free_physical(handle)
        except Exception as e:
            self.error = f"unmapping {g:#x} raised {e!r}"

    cdef bytes to_host(self, uint64_t addr, uint64_t n):
        """n bytes of device memory at addr, copied to the host
        (aclrtMemcpy, ACL_MEMCPY_DEVICE_TO_HOST = 2)."""
        buf = ctypes.create_string_buffer(n)
        try:
            ret = self.acl.rt.memcpy(ctypes.addressof(buf), n, addr, n, 2)
        except Exception as e:  # a raise is a refusal, as for the map calls
            ret = repr(e)
        if ret != 0:
            raise OutOfMemoryError(f"sleep(keep=True): copying {n} bytes at {addr:#x} to the host "
                                   f"failed (acl.rt.memcpy returned {ret}); nothing was given back")
        return buf.raw

    cdef to_device(self, uint64_t addr, bytes data):
        """data copied to device memory at addr (ACL_MEMCPY_HOST_TO_DEVICE = 1)."""
        cdef uint64_t n = len(data)
        buf = ctypes.create_string_buffer(data, n)
        try:
            ret = self.acl.rt.memcpy(addr, n, ctypes.addressof(buf), n, 1)
        except Exception as e:
            ret = repr(e)
        if ret != 0:
            raise OutOfMemoryError(f"wake: copying {n} bytes back to {addr:#x} failed "
                                   f"(acl.rt.memcpy returned {ret}); the tag stays asleep")

    cdef release_range(self, uint64_t base, uint64_t size):
        """A reserved range goes (reset, close): its granules' memory first."""
        for g in [g for g in self.handles if base <= g < base + size]:
            self._unmap(g)

    cdef release_all(self):
        for g in list(self.handles):
            self._unmap(g)

    def __dealloc__(self):
        c_free(self.queue.v)
        self.queue.v = NULL
        if self.handles:
            try:
                self.release_all()
            except BaseException:
                pass
