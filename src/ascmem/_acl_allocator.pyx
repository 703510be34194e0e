# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: binding=False
# Binding of the external allocator's slots (csrc/acl_allocator.c) to
# Devices, for ascmem.acl.register_allocator.  A module of its own: the C core
# through its table (CoreCalls); ascmem._core re-exports its names.

from libc.stdint cimport uintptr_t

from ascmem._core cimport (ASCM_ACL_ALLOCATOR_SLOTS, ASCM_OK, CoreCalls, Device, _DeviceParts,
                           ascm_device, core_calls)

from ascmem.errors import InvalidArgumentError, UnsupportedError

cdef const CoreCalls *C = core_calls()

def _acl_allocator_bind(int slot, Device device=None):
    """Points external-allocator slot at device (None: unbinds, waiting
    without the GIL for callbacks still inside); returns the slot's
    aclrtAllocator object as an integer address."""
    cdef ascm_device *d = device._d if device is not None else NULL
    cdef int st
    if device is not None and (<_DeviceParts>device._parts).mapper is not None:
        raise UnsupportedError("a paged acl device maps its memory through pyACL, which the "
                               "external allocator's callbacks (called without the GIL) cannot do")
    with nogil:
        st = C.ascm_acl_allocator_bind(slot, d)
    if st != ASCM_OK:
        raise InvalidArgumentError(f"external allocator slot {slot} is outside "
                                   f"0..{ASCM_ACL_ALLOCATOR_SLOTS - 1}")
    return <uintptr_t>C.ascm_acl_allocator_handle(slot)


ACL_ALLOCATOR_SLOTS = ASCM_ACL_ALLOCATOR_SLOTS
