# The backend contract (_upstream.pyx): the upstream every backend subclasses,
# for the Device (ascmem._core) and the backends' modules to cimport.
from libc.stdint cimport uint64_t

cdef extern from "ascmem.h" nogil:
    enum:
        ASCM_KINDS
        ASCM_OS_NORMAL
        ASCM_OS_THP
        ASCM_OS_HUGETLB

# The sim backend's address layout: devices 64 TiB apart (so device ids below
# 2**18 - 1), each reset moves the device's ranges by 1 TiB (64 epochs before
# addresses repeat), kinds 128 GiB apart.
cdef enum:
    _DEVICE_SHIFT = 46
    _EPOCH_SHIFT = 40
    _EPOCHS = 64
    _KIND_SHIFT = 37

cdef list _uncollectable_list()


cdef class _Upstream:
    cdef readonly list held      # per kind: [(base, size), ...]
    cdef readonly str name
    # capabilities: see the top of _upstream.pyx
    cdef readonly bint readable  # the host can read and write the memory
    cdef readonly bint holds_memory
    cdef readonly bint from_runtime
    cdef readonly str paging
    cdef readonly str sharing
    cdef readonly uint64_t chunk_alignment
    cdef readonly object acl     # acl: the pyACL module
    cdef readonly dict pages     # host: kind -> ASCM_OS_* of its first chunk
    cdef list _quarantine        # host: [(base, size)] retired, reserved, inaccessible
    cdef public frozenset paged_kinds  # kinds whose chunks are mapped in granules by the pools
    cdef public bint disowned    # acl, in a child of fork(): the chunks and events are the
                                 # parent's, forgotten rather than given back (the copy is
                                 # closed there, so nothing takes or records any more)


cdef class _RealUpstream(_Upstream):
    pass
