"""The drop-in's external allocator: hands CANN an allocator for a stream
(aclrtAllocatorRegister) whose blocks come from an ascmem Device, so the
memory the runtime takes for that stream's work shows in the Device's
statistics, budget and check().

    from ascmem import acl
    ret = acl.register_allocator(stream)          # the default device
    ...
    ret = acl.unregister_allocator(stream)

The callbacks are C functions exported from ascmem's extension with the
prototypes of acl_rt_allocator.h (csrc/acl_allocator.c); a C or C++
application can hand them to aclrtAllocatorSet*FuncToDesc itself
(function_addresses(), allocator_object()).  pyACL's setters take Python
callables (acl.rt.allocator_set_alloc_func_to_desc(desc, func)), so through
pyACL the callables call the same C functions.  Registration follows the
runtime's order (docs/zh/api_ref/11-08_custom_memory_allocator.md in
hicann/runtime): create a descriptor, set the object and the four
functions, register on the stream; a step that fails undoes the ones before
it and its code is returned.  It has run against the recording stand-in in
tests/fake_acl.py, not against the Ascend runtime.
"""

import ctypes
import threading

from ascmem import _core
from ascmem.pluggable import bind, library_path  # the same .so exports both sets
from ascmem.errors import (ACL_ERROR_BAD_ALLOC, ACL_ERROR_INVALID_PARAM,
                           ACL_ERROR_RT_FEATURE_NOT_SUPPORT, ACL_SUCCESS, acl_code)

ALLOC = "ascmem_acl_alloc"
FREE = "ascmem_acl_free"
ALLOC_ADVISE = "ascmem_acl_alloc_advise"
GET_ADDR_FROM_BLOCK = "ascmem_acl_get_addr_from_block"
_VP, _SZ = ctypes.c_void_p, ctypes.c_size_t
_PROTOTYPES = {ALLOC: (_VP, [_VP, _SZ]), FREE: (None, [_VP, _VP]),
               ALLOC_ADVISE: (_VP, [_VP, _SZ, _VP]), GET_ADDR_FROM_BLOCK: (_VP, [_VP])}
# pyACL's setters, in the order the runtime's docs call them
_SETTERS = (("allocator_set_alloc_func_to_desc", "alloc"),
            ("allocator_set_free_func_to_desc", "free"),
            ("allocator_set_alloc_advise_func_to_desc", "alloc_advise"),
            ("allocator_set_get_addr_from_block_func_to_desc", "get_addr_from_block"))

_lock = threading.Lock()
_slots = {}        # id(Device) -> [slot, references, Device]
_registered = {}   # stream -> (module, descriptor, Device)


def functions():
    """The four exported callbacks through ctypes, with their prototypes."""
    return bind(ctypes.CDLL(library_path()), _PROTOTYPES)


def function_addresses():
    """The callbacks' addresses, for aclrtAllocatorSet*FuncToDesc in C."""
    lib = ctypes.CDLL(library_path())
    return {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in _PROTOTYPES}


def allocator_object(device):
    """The aclrtAllocator object (an address) whose callbacks serve device's
    blocks; each call takes a reference that release_allocator_object drops."""
    with _lock:
        entry = _slots.get(id(device))
        if entry is None:
            used = {e[0] for e in _slots.values()}
            free = [s for s in range(_core.ACL_ALLOCATOR_SLOTS) if s not in used]
            if not free:
                raise MemoryError("every external allocator slot is bound to a device")
            entry = _slots[id(device)] = [free[0], 0, device]
        handle = _core._acl_allocator_bind(entry[0], device)
        entry[1] += 1
        return handle


def release_allocator_object(device):
    """Drops a reference; the last one unbinds the slot (waiting for
    callbacks still inside it)."""
    with _lock:
        entry = _slots.get(id(device))
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _slots[id(device)]
            _core._acl_allocator_bind(entry[0], None)


def _callables():
    """pyACL's callback signatures, calling the exported C functions."""
    fns = functions()
    alloc, free, advise, addr = (fns[ALLOC], fns[FREE], fns[ALLOC_ADVISE],
                                 fns[GET_ADDR_FROM_BLOCK])
    return {"alloc": lambda allocator, size: alloc(allocator, size) or 0,
            "free": lambda allocator, block: free(allocator, block),
            "alloc_advise": lambda allocator, size, a: advise(allocator, size, a) or 0,
            "get_addr_from_block": lambda block: addr(block) or 0}


def register(module, stream, device):
    """Registers device's allocator for stream through module (pyACL):
    ret.  A stream registered before gets the new one (the runtime keeps the
    last registration)."""
    if not _a_stream(stream):
        return ACL_ERROR_INVALID_PARAM  # the runtime refuses a null stream (allocator.cpp line 122)
    if not isinstance(device, _core.Device):
        return ACL_ERROR_INVALID_PARAM  # not an ascmem Device: nothing to serve blocks from
    if module is None or not hasattr(getattr(module, "rt", None), "allocator_register"):
        return ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    if not device.profile.external_allocator:
        return ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    rt = module.rt
    try:
        handle = allocator_object(device)
    except Exception as exc:
        return acl_code(exc)
    desc = 0
    try:
        desc = rt.allocator_create_desc()
        if not desc:
            ret = ACL_ERROR_BAD_ALLOC
        else:
            ret = rt.allocator_set_obj_to_desc(desc, handle)
            fns = _callables()
            for setter, key in _SETTERS:
                if ret != ACL_SUCCESS:
                    break
                ret = getattr(rt, setter)(desc, fns[key])
            if ret == ACL_SUCCESS:
                ret = rt.allocator_register(stream, desc)
    except Exception as exc:
        ret = acl_code(exc)
    if ret != ACL_SUCCESS:
        if desc:
            _quietly(rt.allocator_destroy_desc, desc)
        release_allocator_object(device)
        return ret
    with _lock:
        previous = _registered.get(stream)
        _registered[stream] = (module, desc, device)
    if previous is not None:
        _quietly(previous[0].rt.allocator_destroy_desc, previous[1])
        release_allocator_object(previous[2])
    return ACL_SUCCESS


def unregister(stream):
    """aclrtAllocatorUnregister, then the descriptor is destroyed and the
    slot let go: ret.  If the runtime refuses, nothing changes.  A stream
    never registered here, or unregistered already, is a success that does
    nothing, as the runtime answers it (hicann/runtime
    src/acl/aclrt_impl/allocator.cpp lines 179-186,
    docs/zh/api_ref/11-08_custom_memory_allocator.md line 168); a null one
    is refused (line 181)."""
    if not _a_stream(stream):
        return ACL_ERROR_INVALID_PARAM
    with _lock:
        entry = _registered.get(stream)
    if entry is None:
        return ACL_SUCCESS
    module, desc, device = entry
    try:
        ret = module.rt.allocator_unregister(stream)
    except Exception as exc:
        ret = acl_code(exc)
    if ret != ACL_SUCCESS:
        return ret
    with _lock:
        _registered.pop(stream, None)
    ret = _quietly(module.rt.allocator_destroy_desc, desc)
    release_allocator_object(device)
    return ret


def _a_stream(stream):
    """Not NULL (None or 0, as pyACL passes it) and usable as a key: a
    stream handle.  Anything else is answered with a code, never a
    TypeError."""
    try:
        hash(stream)
    except TypeError:
        return False
    return stream is not None and not (isinstance(stream, int) and stream == 0)


def registered_streams():
    with _lock:
        return list(_registered)


def _quietly(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:
        return acl_code(exc)
