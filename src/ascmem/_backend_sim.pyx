# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: binding=False
"""The sim backend: an upstream that hands out no memory, only address
ranges, laid out by device id and reset epoch (_DEVICE_SHIFT... in
_upstream.pxd).  Enough to plan and check a workload's memory without the
runtime."""

cimport cython
from libc.stdint cimport uint64_t

from ascmem._upstream cimport (_Upstream, ASCM_KINDS, _DEVICE_SHIFT, _EPOCH_SHIFT, _EPOCHS,
                               _KIND_SHIFT)


@cython.final
@cython.no_gc_clear
cdef class _SimUpstream(_Upstream):
    cdef uint64_t _device_id     # which device's ranges
    cdef uint64_t _epoch         # first_chunks calls so far (resets + 1)

    def __cinit__(self, *args, **kwargs):
        self.name = "sim"
        self.chunk_alignment = 1 << 30  # simulated ranges are aligned past any page

    def first_chunks(self, sizes):
        cdef uint64_t top = ((self._device_id + 1) << _DEVICE_SHIFT) | \
            ((self._epoch % _EPOCHS) << _EPOCH_SHIFT)
        self._epoch += 1
        return [top | (<uint64_t>k << _KIND_SHIFT) for k in range(ASCM_KINDS)]


def upstream(uint64_t device_id, acl_module):
    """The registry's maker (_backends.py)."""
    cdef _SimUpstream sim = _SimUpstream()
    sim._device_id = device_id
    return sim
