# A Device's stream ledger (_streams.pyx), for the Device (ascmem._core).
cimport cython
from libc.stdint cimport uint32_t, uint64_t

from ascmem._core cimport ascm_device
from ascmem._upstream cimport _Upstream

cdef extern from *:
    """
    #define ASCMEM_LEDGER_ALL UINT64_MAX
    """
    const uint64_t _ALL "ASCMEM_LEDGER_ALL"  # release: every block, whatever its sequence number


@cython.final
cdef class _PendingBlock:
    cdef readonly uint64_t addr
    cdef readonly unsigned mask      # the kinds its free call frees (to free it in the end)
    cdef readonly set holders        # streams whose queued work may still use it
    cdef readonly uint64_t seq       # the ledger's count of deferred frees when it was freed
    cdef readonly uint64_t nbytes    # usable size, counted in pending_bytes
    cdef readonly int kind
    cdef readonly dict events        # stream -> upstream event recorded at the free (acl)


@cython.final
cdef class _StreamLedger:
    cdef dict pending       # stream -> [_PendingBlock] in free order
    cdef dict by_addr       # address -> _PendingBlock
    cdef dict recorded      # address -> set of extra streams (record_stream)
    cdef readonly uint64_t pending_bytes
    cdef readonly uint64_t seq
    cdef Py_ssize_t tracked # blocks in by_addr or recorded: the free path's one test
    cdef _Upstream up       # records and queries the runtime's events
    cdef void _recount(self)
    cdef bint waits(self, uint64_t addr)
    cdef record(self, uint64_t addr, object stream)
    cdef bint defer(self, uint64_t addr, unsigned mask, object stream, uint64_t nbytes, int kind)
    cdef list streams(self)
    cdef list release(self, object stream, uint64_t upto)
    cdef bint _let_go(self, _PendingBlock b, object stream)
    cdef list completed(self)
    cdef uint64_t reuse(self, ascm_device *d, object stream, uint64_t n, uint32_t policy,
                        int mode) except? 0
    cdef drop_events(self)
    cdef clear(self)
