# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: binding=False
"""A Device's host views of its blocks and its debug guard bytes (host
backend): Python-level state the Device (ascmem._core) cimports through
_views.pxd; nothing here calls the C core."""

cimport cython

from ascmem.errors import DeviceClosedError, InvalidArgumentError

_GUARD_BYTES = bytes([0xAB]) * _GUARD


@cython.final
cdef class _ViewRegistry:
    """Live buffer exports per block address.  A block with a live view
    cannot be freed; a device with any cannot be reset or closed."""

    def __cinit__(self):
        self.counts = {}

    cdef add(self, uint64_t addr):
        self.counts[addr] = self.counts.get(addr, 0) + 1
        self.live += 1

    cdef remove(self, uint64_t addr):
        n = self.counts.get(addr, 0) - 1
        if n > 0:
            self.counts[addr] = n
        elif self.counts.pop(addr, None) is None:
            return
        self.live -= 1

    cdef Py_ssize_t of(self, uint64_t addr):
        return self.counts.get(addr, 0)


# Only a Device makes block buffers: one built from Python could point
# anywhere.  The token is not reachable from Python.
cdef object _BUFFER_TOKEN = object()


cdef _BlockBuffer _make_block_buffer(object device, _ViewRegistry views, uint64_t addr,
                                     uint64_t nbytes):
    return _BlockBuffer(_BUFFER_TOKEN, device, views, addr, nbytes)


@cython.final
cdef class _BlockBuffer:
    """Exports a live block of a host-backend Device through the buffer
    protocol, counting exports so that the block cannot be freed under them.
    Made by Device.buffer() only.  It holds its Device: a Device dropped
    without close() gives its memory back when it is deallocated, and a view
    (or a numpy array on one) written after that was a segmentation fault.

    It exports only while an export of it is alive: the block's guard
    against free, sleep and reset is a live export, so once the last one is
    released the block may be gone (freed by the fast path, which does not
    look here) and the buffer refuses for good.  Without that,
    memoryview(dev.buffer(p).obj) reached the memory of a freed, sleeping or
    reset block (issue 45.2)."""

    def __cinit__(self, token, device, _ViewRegistry views, uint64_t addr, uint64_t nbytes):
        if token is not _BUFFER_TOKEN:
            raise TypeError("block buffers are made by Device.buffer(), not directly")
        self.device = device
        self.views = views
        self.addr = addr
        self.nbytes = nbytes

    def __getbuffer__(self, Py_buffer *view, int flags):
        if self.views is None or self.views.closed:
            raise DeviceClosedError("the device of this buffer is closed")
        if self.retired:
            raise InvalidArgumentError(f"the buffer of the block at {self.addr:#x} was released: "
                                       f"the block may be freed, asleep or reset since; ask "
                                       f"Device.buffer() again")
        self.shape[0] = <Py_ssize_t>self.nbytes
        view.buf = <void *><size_t>self.addr
        view.obj = self
        view.len = <Py_ssize_t>self.nbytes
        view.readonly = 0
        view.itemsize = 1
        view.format = "B"
        view.ndim = 1
        view.shape = self.shape
        view.strides = NULL
        view.suboffsets = NULL
        view.internal = NULL
        self.views.add(self.addr)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer *view):
        self.exports -= 1
        if self.exports <= 0:
            self.retired = True
        if self.views is not None:  # None: the collector cleared it, in a cycle going away
            self.views.remove(self.addr)


@cython.final
cdef class _GuardBytes:
    """Debug mode (ASCMEM_DEBUG=1, host backend): _GUARD bytes of a known
    pattern after each block, checked when it is freed."""

    def __cinit__(self):
        self.sizes = {}

    cdef uint64_t place(self, uint64_t addr, uint64_t size) except? 0:
        (<unsigned char[:_GUARD]><unsigned char *><size_t>(addr + size))[:] = _GUARD_BYTES
        self.sizes[addr] = size
        return addr

    cdef uint64_t requested(self, uint64_t addr, uint64_t usable):
        """The caller's bytes of a block (its guard bytes are not theirs)."""
        return min(<uint64_t>self.sizes.get(addr, usable), usable)

    cdef str overrun(self, uint64_t addr, bint mapped):
        """Forgets addr's guard bytes and says what is wrong with them (None:
        nothing).  Read before the block is freed: a paged pool unmaps the
        memory of what it frees.  mapped False (a sleeping block): nothing
        can be read, and nothing is said."""
        size = self.sizes.pop(addr, None)
        if size is None or not mapped:
            return None
        got = bytes(<unsigned char[:_GUARD]><unsigned char *><size_t>(addr + size))
        if got == _GUARD_BYTES:
            return None
        first = next(i for i in range(_GUARD) if got[i] != 0xAB)
        return (f"overrun: the block at {addr:#x} of {size} bytes was written past its end "
                f"(guard byte +{first} changed)")

    cdef restore(self, uint64_t addr):
        """A block's memory came back without its contents (wake after
        sleep(keep=False)): its guard bytes are written again."""
        size = self.sizes.get(addr)
        if size is not None:
            self.place(addr, size)

    cdef clear(self):
        self.sizes.clear()
