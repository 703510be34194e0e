"""The drop-in's stream-ordered memory pools (CANN's aclrtMemPool* calls)
and the stream and event calls they need, pyACL-style: results first, then
an aclError code; never an exception.  ascmem.acl puts them in acl.rt.

pyACL has no Python binding for the pool calls (hicann/runtime exports them
from C only: include/external/acl/acl_rt_memory_soma.h), so the names are
the C names in pyACL's snake_case and its conventions: the C out-parameters
become results (``pool, ret = mem_pool_create(props)``), structs are dicts
with the C field names (aclrtMemPoolProps: allocType, handleType, location
{"id", "type"}, maxSize, reserved).

On the sim and host backends streams and events are handles from
create_stream / create_event, and a stream's work is complete when it is
synchronized (nothing runs).  With a real pyACL, install() wraps its event
and synchronization calls so that the pools see them too.
"""

import itertools
import operator
import os
import threading

from ascmem.acl import stream_pools
from ascmem.errors import (ACL_ERROR_INVALID_PARAM, ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                           ACL_ERROR_RT_PARAM_INVALID, ACL_SUCCESS, InvalidArgumentError,
                           PoolStateError, RuntimeParamError, acl_code)
from ascmem.rules import MemAttr

MEM_ALLOCATION_TYPE_PINNED = 0   # aclrtMemAllocationType
MEM_LOCATION_TYPE_DEVICE = 1     # aclrtMemLocationType
EVENT_RECORDED_STATUS_NOT_READY = 0
EVENT_RECORDED_STATUS_COMPLETE = 1

order = stream_pools.StreamOrder()
_lock = threading.Lock()
_pools = {}                          # handle -> StreamPool
_handles = itertools.count(0x5000_0001)  # pools, streams and events: never 0 (NULL)


def _after_fork_in_child():
    global _lock
    _lock = threading.Lock()
    order.lock = threading.RLock()
    for pool in _pools.values():
        pool.lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _acl():
    from ascmem import acl  # the module that assembles acl.rt imports this one
    return acl


# ---- pools ---------------------------------------------------------------------------

def mem_pool_create(props):
    """aclrtMemPoolCreate: (pool, ret)."""
    try:
        dev = _device_for(_checked_props(props))
        if not dev.profile.stream_pools:
            return 0, ACL_ERROR_RT_FEATURE_NOT_SUPPORT
        _, total = dev.get_mem_info(MemAttr.HBM_MEM if dev.profile.memory_type == "HBM"
                                    else MemAttr.DDR_MEM)
        pool = stream_pools.StreamPool(dev, stream_pools.pool_size(props["maxSize"], total),
                                       order)
        with _lock:
            handle = next(_handles)
            _pools[handle] = pool
        return handle, ACL_SUCCESS
    except Exception as exc:
        return 0, acl_code(exc)


def _checked_props(props):
    """The ACL layer's checks of aclrtMemPoolProps (memory.cpp lines 2086-2108)."""
    if not isinstance(props, dict):
        raise InvalidArgumentError(f"mem_pool_create takes the props as a dict, not {props!r}")
    location = props.get("location")
    if props.get("allocType", MEM_ALLOCATION_TYPE_PINNED) != MEM_ALLOCATION_TYPE_PINNED:
        raise InvalidArgumentError("poolProps.allocType must be MEM_ALLOCATION_TYPE_PINNED (0)")
    if not isinstance(location, dict) or location.get("type") != MEM_LOCATION_TYPE_DEVICE:
        raise InvalidArgumentError("poolProps.location.type must be MEM_LOCATION_TYPE_DEVICE (1)")
    if any(props.get("reserved") or ()):
        raise InvalidArgumentError("poolProps.reserved must be zero")
    size = props.get("maxSize", 0)
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidArgumentError(f"poolProps.maxSize must be an int >= 0, not {size!r}")
    return location.get("id", 0)


def _device_for(device_id):
    dev = _acl()._device_in_use(device_id)
    if dev is None:
        raise RuntimeParamError(f"mem_pool_create: device {device_id!r} is not set")
    return dev


def _pool(handle, call, unknown=PoolStateError):
    """The pool of a handle.  A null handle is the ACL layer's parameter
    error; an unknown or destroyed one is the runtime's (pool errors for
    malloc, destroy and trim; RT_ERROR_INVALID_VALUE for set/get attr:
    soma.cc lines 151 and 180)."""
    if not handle:
        raise InvalidArgumentError(f"{call}: the pool may not be null")
    pool = _pools.get(handle) if isinstance(handle, int) else None
    if pool is None or pool.destroyed:  # a reset Device's pool: its own calls find out
        raise unknown(f"{call}: {handle!r} is not a pool (never created, or destroyed)")
    return pool


def _ret(fn, *args):
    try:
        fn(*args)
        return ACL_SUCCESS
    except Exception as exc:
        return acl_code(exc)


def _value(fn, *args):
    try:
        return fn(*args), ACL_SUCCESS
    except Exception as exc:
        return 0, acl_code(exc)


def mem_pool_destroy(pool):
    """aclrtMemPoolDestroy: ret."""
    def destroy():
        _pool(pool, "mem_pool_destroy").destroy()
        with _lock:
            _pools.pop(pool, None)
    return _ret(destroy)


def mem_pool_set_attr(pool, attr, value):
    """aclrtMemPoolSetAttr: ret."""
    return _ret(lambda: _pool(pool, "mem_pool_set_attr", RuntimeParamError).set_attr(attr, value))


def mem_pool_get_attr(pool, attr):
    """aclrtMemPoolGetAttr: (value, ret)."""
    return _value(lambda: _pool(pool, "mem_pool_get_attr", RuntimeParamError).get_attr(attr))


def mem_pool_malloc_async(size, pool, stream):
    """aclrtMemPoolMallocAsync: (ptr, ret)."""
    return _value(lambda: _pool(pool, "mem_pool_malloc_async").malloc_async(size, stream))


def mem_pool_free_async(ptr, stream):
    """aclrtMemPoolFreeAsync: ret.  A pointer no pool holds is taken for
    one of aclrtMalloc and freed on the stream, as the runtime does
    (api_impl_soma.cc lines 145-167, a host function on the stream)."""
    def free():
        ptr_ = _pointer(ptr)
        if not ptr_:
            raise InvalidArgumentError("mem_pool_free_async: the pointer may not be null")
        pools = list(_pools.values())
        for p in pools:
            if p.free_async(ptr_, stream):
                return
        dev = _acl().device()
        if any(p.device is dev and p.inside(ptr_) for p in pools):
            # inside a pool block, not its start: RT_ERROR_INVALID_VALUE
            # (api_impl_soma.cc line 134), not the aclrtFree path's 207002
            raise RuntimeParamError(f"mem_pool_free_async: {ptr_:#x} is inside a block of a "
                                    f"stream-ordered pool, not its start")
        dev.free(ptr, stream=stream)
    return _ret(free)


def _pointer(ptr):
    """ptr as the int pyACL's argument parsing makes of it (an object with
    __index__, such as a numpy integer, is its value); anything else --
    a float or a Fraction that merely equals an address -- as it is, which
    no pool takes for one of its blocks (StreamPool keys on exact ints)."""
    if isinstance(ptr, bool):
        return ptr
    try:
        return int(operator.index(ptr))
    except TypeError:
        return ptr


def free_pooled(ptr):
    """acl.rt.free of a pool's block: True if a pool had it live and it is
    freed; False if no pool has it (an ordinary aclrtMalloc block)."""
    ptr = _pointer(ptr)
    return any(p.free_now(ptr) for p in list(_pools.values()))


def mem_pool_trim_to(pool, min_bytes_to_keep):
    """aclrtMemPoolTrimTo: ret."""
    return _ret(lambda: _pool(pool, "mem_pool_trim_to").trim_to(min_bytes_to_keep))


def pool_stats(pool):
    """ascmem's own: the pool's books (reserved, used, their highs, blocks,
    and how requests were served), or None for an unknown handle."""
    p = _pools.get(pool)
    return None if p is None else p.stats()


def forget_pools_of(device):
    """device was reset: its pools went with its memory."""
    with _lock:
        for handle, pool in list(_pools.items()):
            if pool.device is device:
                pool.forget()
                del _pools[handle]


# ---- streams and events (sim and host backends) ---------------------------------------

_events = set()
_streams = set()


def _new_handle(kind):
    with _lock:
        handle = next(_handles)
        kind.add(handle)
    return handle, ACL_SUCCESS


def _ours(kind, handle):
    """Whether handle is one this module made; an unhashable object (a
    caller's list or dict) is not, and is answered with a code, not a
    TypeError."""
    try:
        return handle in kind
    except TypeError:
        return False


def _a_stream(stream):
    """A stream argument the order tracking can key on (not None, hashable)."""
    try:
        hash(stream)
    except TypeError:
        return False
    return stream is not None


def _drop_handle(kind, handle):
    with _lock:
        if not _ours(kind, handle):
            return ACL_ERROR_INVALID_PARAM
        kind.discard(handle)
    return ACL_SUCCESS


def create_stream():
    return _new_handle(_streams)


def destroy_stream(stream):
    return _drop_handle(_streams, stream)


def create_event():
    return _new_handle(_events)


def destroy_event(event):
    ret = _drop_handle(_events, event)
    if ret == ACL_SUCCESS:
        order.forget_event(event)
    return ret


def record_event(event, stream):
    if not _ours(_events, event) or not _a_stream(stream):
        return ACL_ERROR_INVALID_PARAM
    saw_record(event, stream)
    return ACL_SUCCESS


def stream_wait_event(stream, event):
    if not _ours(_events, event) or not _a_stream(stream):
        return ACL_ERROR_INVALID_PARAM
    saw_wait(stream, event)
    return ACL_SUCCESS


def synchronize_event(event):
    if not _ours(_events, event):
        return ACL_ERROR_INVALID_PARAM
    saw_event_done(event)
    return ACL_SUCCESS


def query_event_status(event):
    if not _ours(_events, event):
        return EVENT_RECORDED_STATUS_NOT_READY, ACL_ERROR_INVALID_PARAM
    with order.lock:
        stream, seq = order.events.get(event, (None, 0))
        done = stream is None or order.complete(stream, seq)
    return (EVENT_RECORDED_STATUS_COMPLETE if done else EVENT_RECORDED_STATUS_NOT_READY), \
        ACL_SUCCESS


def synchronize_stream(stream):
    if stream is None:
        return ACL_ERROR_RT_PARAM_INVALID
    try:
        _acl().device().synchronize(stream)
        saw_sync(stream)
    except Exception as exc:
        return acl_code(exc)
    return ACL_SUCCESS


def synchronize_device():
    try:
        _acl().device().synchronize()
        for stream in list(order.queued):
            saw_sync(stream)
    except Exception as exc:
        return acl_code(exc)
    return ACL_SUCCESS


# ---- what the pools learn from the runtime's calls (sim or wrapped pyACL) --------------

def saw_record(event, stream):
    order.record(event, stream)


def saw_wait(stream, event):
    order.wait(stream, event)


def saw_event_done(event):
    order.event_done(event)


def saw_sync(stream):
    """stream's queued work is done: its cached blocks may go to any stream
    (opportunistic reuse), and each pool gives back what is above its
    release threshold."""
    order.finished(stream)
    for pool in list(_pools.values()):
        pool.synchronized(stream)


# The wrappers install() puts around a real pyACL's calls: the call first,
# then, if it succeeded, what the pools learn from it.
OBSERVERS = {
    "record_event": lambda ret, event, stream: saw_record(event, stream),
    "stream_wait_event": lambda ret, stream, event: saw_wait(stream, event),
    "synchronize_event": lambda ret, event: saw_event_done(event),
    "synchronize_stream": lambda ret, stream: saw_sync(stream),
    "query_event_status": lambda ret, event: (saw_event_done(event)
                                              if ret == (EVENT_RECORDED_STATUS_COMPLETE,
                                                         ACL_SUCCESS) else None),
}


def observed(name, original):
    """original, reporting each successful call to the pools."""
    see = OBSERVERS[name]

    def call(*args):
        ret = original(*args)
        if ret == ACL_SUCCESS or (isinstance(ret, tuple) and ret[-1] == ACL_SUCCESS):
            try:
                see(ret, *args)
            except Exception:
                pass  # the pools' books never fail the runtime's own call
        return ret
    call.__wrapped__ = original
    return call


