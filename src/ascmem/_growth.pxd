# A Device's growth (_growth.pyx), for the Device (ascmem._core).
cimport cython
from libc.stdint cimport uint64_t

from ascmem._core cimport ascm_device, ascm_device_config
from ascmem._upstream cimport _Upstream


@cython.final
cdef class _Growth:
    cdef ascm_device *d            # set by bind()
    cdef readonly _Upstream up
    cdef uint64_t size[5]          # first chunk (and least growth) per kind
    cdef uint64_t maximum[5]
    cdef uint64_t taken[5]
    cdef uint64_t first_base[5]    # where each kind's first chunk is now
    cdef uint64_t peak_taken[5]    # the most taken at once
    cdef uint64_t total_taken[5]   # bytes, cumulative (first chunks included)
    cdef uint64_t total_given[5]
    cdef uint64_t chunks_taken[5]
    cdef uint64_t chunks_given[5]
    cdef uint64_t peak_chunks[5]
    cdef object lock               # the GIL is dropped inside pyACL
    cdef readonly object error     # the last upstream failure, for the OOM message
    cdef bint closed
    cdef dict counters             # the Device's: chunks_taken, chunks_given_back, upstream_failures
    cdef set_pool_sizes(self, object pool_sizes)
    cdef configure(self, ascm_device_config *cfg)
    cdef _first_chunks(self)
    cdef bind(self, ascm_device *d)
    cdef after_fork(self)
    cdef uint64_t _take(self, int k, uint64_t size) except? 0
    cdef _count_taken(self, int k, uint64_t size)
    cdef bint _add(self, int k, uint64_t addr, uint64_t size) except -1
    cdef uint64_t release_empty(self, int k) except? 0
    cdef renew(self)
    cdef retire(self, list old)
    cdef close(self)
    cdef str accounting_problem(self, int k, object chunks_of)
    cdef str describe(self, int k, int chunks)
    cdef dict kind_stats(self, int k)
