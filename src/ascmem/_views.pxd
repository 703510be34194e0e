# A Device's views and guard bytes (_views.pyx), for the Device (ascmem._core).
cimport cython
from libc.stdint cimport uint64_t

cdef enum:
    _GUARD = 64  # debug mode: bytes written after each block


@cython.final
cdef class _ViewRegistry:
    cdef dict counts        # address -> live exports
    cdef Py_ssize_t live    # exports in all: the free path's one test
    cdef bint closed        # the device is closed: no new exports
    cdef add(self, uint64_t addr)
    cdef remove(self, uint64_t addr)
    cdef Py_ssize_t of(self, uint64_t addr)


@cython.final
cdef class _BlockBuffer:
    cdef object device
    cdef _ViewRegistry views
    cdef uint64_t addr, nbytes
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t exports  # live exports of this buffer
    cdef bint retired        # its exports all ended: refuses from now on


@cython.final
cdef class _GuardBytes:
    cdef dict sizes  # address -> the size the caller asked for
    cdef uint64_t place(self, uint64_t addr, uint64_t size) except? 0
    cdef uint64_t requested(self, uint64_t addr, uint64_t usable)
    cdef str overrun(self, uint64_t addr, bint mapped)
    cdef restore(self, uint64_t addr)
    cdef clear(self)


cdef _BlockBuffer _make_block_buffer(object device, _ViewRegistry views, uint64_t addr,
                                     uint64_t nbytes)
