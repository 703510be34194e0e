# Tags (_tags.pyx), for the Device (ascmem._core).
cimport cython
from libc.stdint cimport uint32_t, uint64_t

from ascmem._core cimport Device, _DeviceParts, ascm_device


@cython.final
cdef class _TagRegistry:
    cdef dict tag_of        # address -> tag
    cdef dict members       # tag -> set of addresses
    cdef dict sleeping      # tag -> {address: saved bytes (None: not kept) or False: resident}
    cdef set known          # every tag a block was allocated with (resets keep it)
    cdef Py_ssize_t tracked # tagged live blocks and open exports: the free path's one test
    cdef dict aligned       # tag -> alignment of its later blocks (align_tag)
    cdef set shareable      # tags whose blocks can be exported (align_tag(shareable=True))
    cdef dict cost_at       # address -> bytes the alignment added to that live block
    cdef dict cost_of       # tag -> [bytes now, peak bytes, live aligned blocks]
    cdef object ipc         # ascmem.ipc.IpcState, made on first use (None before)
    cdef add(self, uint64_t addr, object tag)
    cdef forget(self, uint64_t addr)
    cdef object asleep_tag(self, uint64_t addr)
    cdef uint64_t asleep_bytes(self, ascm_device *d)
    cdef uint64_t alignment_of(self, object tag) except? 0
    cdef clear(self)


cdef _check_tag(object tag)
cdef uint64_t _sleep_tag(Device dev, object tag, bint keep) except? 0
cdef uint64_t _wake_tag(Device dev, object tag) except? 0
cdef _align_tag(Device dev, object tag, object alignment, bint shareable)
cdef int _join_aligned(Device dev, uint64_t addr, object tag, uint64_t n, uint32_t policy,
                       int mode) except -1
cdef dict _alignment_stats(_TagRegistry tags)
cdef object _ipc_state(Device dev)
cdef int _refuse_exported(_DeviceParts parts, uint64_t addr, str call) except -1
cdef object _ipc_export(Device dev, object ptr, object size, object pids, object any_process)
cdef _ipc_close(Device dev, object key)
cdef object _ipc_buffer_size(_DeviceParts parts, uint64_t addr)
