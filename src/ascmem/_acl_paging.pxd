# Paged kinds on the acl backend (_acl_paging.pyx), for the Device (ascmem._core).
cimport cython
from libc.stdint cimport uint64_t

from ascmem._core cimport ascm_device

cdef enum:
    _ACL_GRANULE = 2 << 20  # aclrtMapMem: 2 MB-aligned addresses and sizes


cdef extern from *:
    """
    #define ASCMEM_ACL_GRANULE_1G (1ULL << 30)
    """
    # ACL_MEM_HUGE1G: "1G粒度对齐" (1 GB granularity)
    const uint64_t _ACL_GRANULE_1G "ASCMEM_ACL_GRANULE_1G"


cdef struct _MapRequest:
    uint64_t addr
    uint64_t size
    int map


cdef struct _MapQueue:
    _MapRequest *v
    size_t n, cap


cdef int _acl_map_hook(void *ctx, uint64_t addr, uint64_t size, int map) noexcept nogil


@cython.final
cdef class _AclMapper:
    cdef _MapQueue queue
    cdef object acl
    # piece address -> physical memory handle, and -> its bytes: integers
    # only, so that CPython never tracks the dicts and the cycle collector
    # cannot empty them before __dealloc__ frees the handles (a dict of
    # tuples is tracked; see _uncollectable_list)
    cdef dict handles
    cdef dict piece_bytes
    cdef readonly object error   # what the runtime last refused
    cdef object lock             # held from a pool call that may queue to its apply
    cdef readonly uint64_t granule  # bytes a piece of the huge and normal kinds maps (_acl_granule)
    cdef readonly uint64_t mapped_bytes  # what the handles hold
    cdef ascm_device *d          # the C device, once made (Device.__init__): whose kind a run is
    cdef int device_id
    cdef public bint disowned    # in a child of fork(): the handles are the parent's, forgotten
                                 # at release (the device is closed there: nothing maps)
    cdef after_fork(self)
    cdef void *hook_ctx(self)
    cdef bint apply(self) except -1
    cdef bint _map(self, uint64_t g, uint64_t piece, int mem_attr) except -1
    cdef _unmap(self, uint64_t g)
    cdef bytes to_host(self, uint64_t addr, uint64_t n)
    cdef to_device(self, uint64_t addr, bytes data)
    cdef release_range(self, uint64_t base, uint64_t size)
    cdef release_all(self)
