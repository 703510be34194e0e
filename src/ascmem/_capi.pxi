# The capsule of C function pointers that plain C extensions import
# (csrc/ascmem_capi.h).  Included by _core.pyx.

from cpython.pycapsule cimport PyCapsule_New
from cpython.ref cimport PyObject

cdef extern from "ascmem_capi.h":
    unsigned ASCM_CAPI_VERSION
    ctypedef struct ascm_capi:
        unsigned version
        size_t size
        int (*pool_create)(const ascm_pool_config *, ascm_pool **) noexcept nogil
        void (*pool_destroy)(ascm_pool *) noexcept nogil
        int (*pool_alloc)(ascm_pool *, uint64_t, uint64_t, uint64_t *) noexcept nogil
        int (*pool_free)(ascm_pool *, uint64_t) noexcept nogil
        int (*pool_usable_size)(ascm_pool *, uint64_t, uint64_t *) noexcept nogil
        void (*pool_stats)(ascm_pool *, ascm_stats *) noexcept nogil
        int (*pool_check)(ascm_pool *, char *, size_t) noexcept nogil
        ascm_pool *(*pool_of)(PyObject *) noexcept
        ascm_device *(*device_of)(PyObject *) noexcept
        int (*device_malloc)(ascm_device *, uint64_t, uint32_t, int, uint64_t *, int *, int *) noexcept nogil
        int (*device_free)(ascm_device *, uint64_t, unsigned, int *) noexcept nogil
        const char *(*status_str)(int) noexcept nogil
        int (*pool_alloc_handle)(ascm_pool *, uint64_t, uint64_t, uint64_t *, uint64_t *) noexcept nogil
        int (*pool_free_handle)(ascm_pool *, uint64_t) noexcept nogil
        int (*pool_set_thread_caches)(ascm_pool *, int) noexcept nogil
        int (*pool_thread_caches_on)(const ascm_pool *) noexcept nogil
        int (*pool_set_placement)(ascm_pool *, int) noexcept nogil
        int (*pool_placement)(ascm_pool *) noexcept nogil
        int (*device_set_placement)(ascm_device *, int) noexcept nogil
        int (*device_placement)(ascm_device *) noexcept nogil
        int (*pool_set_slab_max)(ascm_pool *, uint64_t) noexcept nogil
        uint64_t (*pool_slab_max)(ascm_pool *) noexcept nogil
        int (*device_set_slab_max)(ascm_device *, uint64_t) noexcept nogil
        uint64_t (*device_slab_max)(ascm_device *) noexcept nogil


cdef ascm_pool *_capi_pool_of(PyObject *o) noexcept:
    obj = <object>o
    return (<Pool>obj)._p if type(obj) is Pool else NULL


cdef ascm_device *_capi_device_of(PyObject *o) noexcept:
    obj = <object>o
    return (<Device>obj)._d if type(obj) is Device else NULL


cdef int _capi_device_malloc(ascm_device *d, uint64_t size, uint32_t policy, int mode,
                             uint64_t *addr, int *kind, int *events) noexcept nogil:
    """The capsule's device allocation: marked as handed out to C, so
    close() and reset() refuse while it is live (ascm_device_hand_out_block;
    its free unmarks it, whichever path frees it).  The allocation and the
    mark happen in one pass of the gate: marked after leaving it, a close()
    or reset() in between would pass its check, unmap the block and then be
    refused for good by the late mark (the pluggable alloc does the same)."""
    cdef int k
    cdef int st
    if not ascm_device_enter(d):
        addr[0] = 0
        kind[0] = -1
        events[0] = 0
        return ASCM_ERR_CLOSED
    st = ascm_device_malloc_entered(d, size, policy, mode, addr, kind, events)
    if st == ASCM_OK and ascm_device_hand_out_block(d, addr[0]) != ASCM_OK:
        ascm_device_free_entered(d, addr[0], 0xFFFFFFFF, &k)  # unmarked: not handed out
        addr[0] = 0
        st = ASCM_ERR_HOSTMEM
    ascm_device_leave(d)
    return st


cdef int _capi_device_set_placement(ascm_device *d, int placement) noexcept nogil:
    """Through the gate, as the capsule's other device calls: a reset or
    close does not swap the device's pools under it."""
    cdef int st
    if not ascm_device_enter(d):
        return ASCM_ERR_CLOSED
    st = ascm_device_set_placement(d, placement)
    ascm_device_leave(d)
    return st


cdef int _capi_device_set_slab_max(ascm_device *d, uint64_t bytes) noexcept nogil:
    """Through the gate, as device_set_placement."""
    cdef int st
    if not ascm_device_enter(d):
        return ASCM_ERR_CLOSED
    st = ascm_device_set_slab_max(d, bytes)
    ascm_device_leave(d)
    return st


cdef ascm_capi _capi
_capi.version = ASCM_CAPI_VERSION
_capi.size = sizeof(ascm_capi)
_capi.pool_create = ascm_pool_create
_capi.pool_destroy = ascm_pool_destroy
_capi.pool_alloc = ascm_pool_alloc
_capi.pool_free = ascm_pool_free
_capi.pool_usable_size = ascm_pool_usable_size
_capi.pool_stats = ascm_pool_stats
_capi.pool_check = ascm_pool_check
_capi.pool_of = _capi_pool_of
_capi.device_of = _capi_device_of
_capi.device_malloc = _capi_device_malloc
_capi.device_free = ascm_device_free
_capi.status_str = ascm_status_str
_capi.pool_alloc_handle = ascm_pool_alloc_handle
_capi.pool_free_handle = ascm_pool_free_handle
_capi.pool_set_thread_caches = ascm_pool_set_thread_caches
_capi.pool_thread_caches_on = ascm_pool_thread_caches_on
_capi.pool_set_placement = ascm_pool_set_placement
_capi.pool_placement = ascm_pool_placement
_capi.device_set_placement = _capi_device_set_placement
_capi.device_placement = ascm_device_placement
_capi.pool_set_slab_max = ascm_pool_set_slab_max
_capi.pool_slab_max = ascm_pool_slab_max
_capi.device_set_slab_max = _capi_device_set_slab_max
_capi.device_slab_max = ascm_device_slab_max

_C_API = PyCapsule_New(<void *>&_capi, "ascmem._core._C_API", NULL)
