"""A recording stand-in for pyACL's memory calls (the real runtime is not
available here).  It enforces pyACL's signatures and return conventions:
allocations return (ptr, ret), frees return ret, bad arguments give
ACL_ERROR_INVALID_PARAM, and every call is recorded."""
import os
import secrets
import types

ACL_SUCCESS = 0
ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_BAD_ALLOC = 200000
ACL_ERROR_RT_MEMORY_ALLOCATION = 207001
ACL_ERROR_RT_MEMORY_FREE = 207002
ACL_ERROR_RT_PARAM_INVALID = 107000
ACL_ERROR_RT_NO_PERMISSION = 207006


# aclrtMemAttr (hicann/runtime include/external/acl/acl_rt.h lines 227-246) and
# what aclrtMallocPhysical / aclrtMemGetAllocationGranularity accept for device
# memory (src/acl/aclrt_impl/memory.cpp lines 51-140, 1071-1128): the HBM_*,
# generic and P2P attributes; DDR_* ones are for host memory only, ACL_DDR_MEM
# and ACL_HBM_MEM (0, 1) are not in the handler table at all.
DEVICE_ATTRS = {4, 5, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}
HUGE1G_ATTRS = {10, 11, 14, 17}


def _bad_prop(prop):
    """Whether aclrtPhysicalMemProp (pyACL's dict) fails the runtime's checks
    for device memory: not null, handle type NONE, allocation type PINNED,
    location DEVICE with an id, a device memory attribute."""
    if not isinstance(prop, dict):
        return True
    loc = prop.get("location")
    return (prop.get("handleType") != 0 or prop.get("allocationType") != 0 or
            not isinstance(loc, dict) or loc.get("type") != 1 or not isinstance(loc.get("id"), int) or
            prop.get("memAttr") not in DEVICE_ATTRS)


def make(capacity=None, fail=None, granule=2 << 20):
    """capacity: bytes the runtime can hand out in all (beyond it,
    allocations return 207001); fail: a callable (name, size) -> an error
    code to inject, or 0 -- both can be changed later on the module."""
    calls = []
    live = {}
    next_ptr = [0x7000_0000_0000]

    def record(name, *args):
        calls.append((name,) + args)

    def _alloc(name, size, *rest):
        record(name, size, *rest)
        if not isinstance(size, int) or size <= 0:
            return 0, ACL_ERROR_INVALID_PARAM
        injected = mod.fail(name, size) if mod.fail else 0
        if injected:
            return 0, injected
        if mod.capacity is not None and sum(live.values()) + size > mod.capacity:
            return 0, ACL_ERROR_RT_MEMORY_ALLOCATION
        ptr = next_ptr[0]
        next_ptr[0] += (size + 4095) // 4096 * 4096
        live[ptr] = size
        return ptr, ACL_SUCCESS

    def _free(name, ptr):
        record(name, ptr)
        if ptr not in live:
            return ACL_ERROR_RT_MEMORY_FREE
        del live[ptr]
        return ACL_SUCCESS

    def malloc(size, policy):
        if not isinstance(policy, int):
            raise TypeError("policy must be an int")
        return _alloc("rt.malloc", size, policy)

    def malloc_align32(size, policy):
        return _alloc("rt.malloc_align32", size, policy)

    # events: an event recorded on a stream completes when the test says the
    # stream's work so far is done (finish) or the stream is synchronized
    events = {}  # handle -> [stream, complete]
    next_event = [1]

    def create_event():
        record("rt.create_event")
        h = next_event[0]
        next_event[0] += 1
        events[h] = [None, False]
        return h, ACL_SUCCESS

    def record_event(event, stream):
        record("rt.record_event", event, stream)
        if event not in events:
            return ACL_ERROR_INVALID_PARAM
        events[event] = [stream, False]
        return ACL_SUCCESS

    def query_event_status(event):
        record("rt.query_event_status", event)
        if event not in events:
            return 0, ACL_ERROR_INVALID_PARAM
        return (1 if events[event][1] else 0), ACL_SUCCESS

    def destroy_event(event):
        record("rt.destroy_event", event)
        return ACL_SUCCESS if events.pop(event, None) is not None else ACL_ERROR_INVALID_PARAM

    def finish(stream):
        for e in events.values():
            if e[0] == stream:
                e[1] = True

    def synchronize_stream(stream):
        record("rt.synchronize_stream", stream)
        finish(stream)
        return ACL_SUCCESS

    waits = []  # (stream, event) of stream_wait_event

    def stream_wait_event(stream, event):
        record("rt.stream_wait_event", stream, event)
        if event not in events:
            return ACL_ERROR_INVALID_PARAM
        waits.append((stream, event))
        return ACL_SUCCESS

    def synchronize_event(event):
        record("rt.synchronize_event", event)
        if event not in events:
            return ACL_ERROR_INVALID_PARAM
        events[event][1] = True
        return ACL_SUCCESS

    # the external allocator (pyACL: acl.rt.allocator_*): descriptors hold the
    # object and the four Python callables; a stream's registration can be
    # read back (allocator_get_by_stream) and called as the runtime would
    descs = {}         # handle -> {"obj": ..., "alloc": ..., ...}
    registered = {}    # stream -> descriptor handle
    next_desc = [0x3000]

    def _injected(name):
        return mod.fail(name, None) if mod.fail else 0

    def allocator_create_desc():
        record("rt.allocator_create_desc")
        if _injected("rt.allocator_create_desc"):
            return 0  # NULL: the runtime could not make one
        h = next_desc[0]
        next_desc[0] += 8
        descs[h] = {}
        return h

    def allocator_destroy_desc(desc):
        record("rt.allocator_destroy_desc", desc)
        if desc not in descs:
            return ACL_ERROR_INVALID_PARAM
        del descs[desc]
        return ACL_SUCCESS

    def _setter(name, key):
        def setter(desc, value):
            record("rt." + name, desc)
            if desc not in descs or not value:
                return ACL_ERROR_INVALID_PARAM
            if key != "obj" and not callable(value):
                return ACL_ERROR_INVALID_PARAM
            code = _injected("rt." + name)
            if code:
                return code
            descs[desc][key] = value
            return ACL_SUCCESS
        return setter

    def allocator_register(stream, desc):
        record("rt.allocator_register", stream, desc)
        # the object and the alloc, free and get-address functions must be
        # set; the alloc-advise one is optional (hicann/runtime
        # src/acl/aclrt_impl/allocator.cpp lines 122-131)
        if not stream or desc not in descs or \
                not {"obj", "alloc", "free", "get_addr_from_block"} <= set(descs[desc]):
            return ACL_ERROR_INVALID_PARAM
        code = _injected("rt.allocator_register")
        if code:
            return code
        registered[stream] = desc
        return ACL_SUCCESS

    def allocator_get_by_stream(stream):
        record("rt.allocator_get_by_stream", stream)
        if stream not in registered:
            return 0, 0, None, None, None, None, ACL_ERROR_INVALID_PARAM
        d = descs[registered[stream]]
        return (registered[stream], d["obj"], d["alloc"], d["free"], d.get("alloc_advise"),
                d["get_addr_from_block"], ACL_SUCCESS)

    def allocator_unregister(stream):
        record("rt.allocator_unregister", stream)
        if not stream:
            return ACL_ERROR_INVALID_PARAM  # allocator.cpp line 181
        code = _injected("rt.allocator_unregister")
        if code:
            return code
        # a stream never registered, or unregistered twice: nothing happens,
        # success (allocator.cpp lines 179-186; 11-08_custom_memory_allocator.md line 168)
        registered.pop(stream, None)
        return ACL_SUCCESS

    def get_mem_info(attr):
        record("rt.get_mem_info", attr)
        return 1 << 30, 1 << 31, ACL_SUCCESS

    # virtual memory management (pyACL names: acl.rt.reserve_mem_address,
    # malloc_physical, map_mem, unmap_mem, free_physical, release_mem_address;
    # addresses and sizes 2 MB-aligned, as aclrtMapMem requires)
    def mem_get_allocation_granularity(prop, option):
        record("rt.mem_get_allocation_granularity", option)
        if _bad_prop(prop) or option not in (0, 1):
            return 0, ACL_ERROR_INVALID_PARAM
        return (1 << 30 if prop["memAttr"] in HUGE1G_ATTRS else granule), ACL_SUCCESS
    reserved = {}   # base -> size
    physical = {}   # handle -> size
    physical_props = []  # the prop of every aclrtMallocPhysical that passed its checks
    mapped = {}     # address -> handle
    next_handle = [1]
    next_range = [0x9000_0000_0000]

    def reserve_mem_address(size, alignment, expect_ptr, flags):
        record("rt.reserve_mem_address", size)
        if size <= 0 or size % granule:
            return 0, ACL_ERROR_INVALID_PARAM
        injected = mod.fail("rt.reserve_mem_address", size) if mod.fail else 0
        if injected:
            return 0, injected
        base = next_range[0]
        next_range[0] += (size + granule - 1) // granule * granule + granule
        reserved[base] = size
        return base, ACL_SUCCESS

    def release_mem_address(ptr):
        record("rt.release_mem_address", ptr)
        if ptr not in reserved or any(base <= a < base + reserved[ptr] for base in [ptr]
                                      for a in mapped):
            return ACL_ERROR_INVALID_PARAM  # unknown, or still mapped
        del reserved[ptr]
        return ACL_SUCCESS

    def malloc_physical(size, prop, flags):
        record("rt.malloc_physical", size)
        if size <= 0 or size % granule or _bad_prop(prop) or flags != 0 or \
                (prop["memAttr"] in HUGE1G_ATTRS and size % (1 << 30)):
            return 0, ACL_ERROR_INVALID_PARAM
        physical_props.append(prop)
        injected = mod.fail("rt.malloc_physical", size) if mod.fail else 0
        if injected:
            return 0, injected
        if mod.capacity is not None and sum(live.values()) + sum(physical.values()) + size > mod.capacity:
            return 0, ACL_ERROR_RT_MEMORY_ALLOCATION
        h = next_handle[0]
        next_handle[0] += 1
        physical[h] = size
        return h, ACL_SUCCESS

    contents = {}   # handle -> bytearray: what device memory holds (for memcpy)

    def _pieces(addr, count):
        """(bytearray, offset, length) of the mapped granules under
        [addr, addr + count), or None if any part is not mapped."""
        out = []
        while count:
            g = addr - addr % granule
            handle = mapped.get(g)
            if handle is None:
                return None
            off = addr - g
            n = min(count, granule - off)
            out.append((contents.setdefault(handle, bytearray(granule)), off, n))
            addr, count = addr + n, count - n
        return out

    def memcpy(dst, dest_max, src, count, kind):
        """acl.rt.memcpy(dst, dest_max, src, count, kind): host addresses are
        this process's memory; device ones the mapped granules' contents."""
        import ctypes
        record("rt.memcpy", dst, count, kind)
        if count > dest_max or kind not in (1, 2):
            return ACL_ERROR_INVALID_PARAM
        injected = mod.fail("rt.memcpy", count) if mod.fail else 0
        if injected:
            return injected
        pieces = _pieces(src if kind == 2 else dst, count)
        if pieces is None:
            return ACL_ERROR_INVALID_PARAM  # device memory that is not mapped
        if kind == 2:  # device -> host
            data = b"".join(bytes(b[o:o + n]) for b, o, n in pieces)
            ctypes.memmove(dst, data, count)
        else:  # host -> device
            data = ctypes.string_at(src, count)
            at = 0
            for b, o, n in pieces:
                b[o:o + n] = data[at:at + n]
                at += n
        return ACL_SUCCESS

    doomed = set()  # handles freed while mapped: released at their unmap

    def free_physical(handle):
        record("rt.free_physical", handle)
        if handle not in physical or handle in doomed:
            return ACL_ERROR_INVALID_PARAM
        if handle in mapped.values():
            # accepted; the memory goes at the unmap (hicann/runtime
            # docs/zh/api_ref/11-04_virtual_memory_management.md line 180)
            doomed.add(handle)
            return ACL_SUCCESS
        del physical[handle]
        contents.pop(handle, None)  # its memory is gone
        return ACL_SUCCESS

    def map_mem(ptr, size, offset, handle, flags):
        record("rt.map_mem", ptr, size, handle)
        inside = any(base <= ptr and ptr + size <= base + n for base, n in reserved.items())
        if (not inside or ptr % granule or size != physical.get(handle) or offset or
                ptr in mapped or handle in mapped.values()):
            return ACL_ERROR_INVALID_PARAM
        injected = mod.fail("rt.map_mem", size) if mod.fail else 0
        if injected:
            return injected
        mapped[ptr] = handle
        return ACL_SUCCESS

    def unmap_mem(ptr):
        record("rt.unmap_mem", ptr)
        handle = mapped.pop(ptr, None)
        if handle is None:
            return ACL_ERROR_INVALID_PARAM
        if handle in doomed:  # freed while mapped: released now
            doomed.discard(handle)
            del physical[handle]
            contents.pop(handle, None)
        return ACL_SUCCESS

    # IPC memory (hicann/runtime docs/zh/api_ref/11-07_IPC_memory_sharing.md).
    # One stand-in is one process's runtime; mod.pid is the process calling
    # it (a test sets another pid to act as the importing process).
    # Null pointers and keys are refused by the ACL layer (100000:
    # src/acl/aclrt_impl/memory.cpp lines 1775-1810); a size of 0, a flag
    # past the last one, or an empty pid list by the runtime's checks
    # (107000: src/runtime/api/impl/api_error.cc lines 3747-3766, 3809-3846).
    # An exporter's close destroys the name whatever importers remain, as the
    # runtime's does (api_impl_standard_soc.cc lines 748-805): the order
    # (importers first) is the caller's to keep.  The driver's answers (a pid
    # not on the allow-list, a name it does not know) are not in the open
    # source: 207006 and 107000 are assumed.
    ipc_names = {}    # name -> {"ptr", "size", "pids", "any", "owner"}
    ipc_imports = {}  # (pid, name) -> [importer addresses]
    next_import = [0x7800_0000_0000]

    def ipc_mem_get_export_key(dev_ptr, size, flags):
        record("rt.ipc_mem_get_export_key", dev_ptr, size, flags)
        if not isinstance(dev_ptr, int) or not dev_ptr:
            return "", ACL_ERROR_INVALID_PARAM
        if not isinstance(size, int) or size <= 0 or not isinstance(flags, int) or not 0 <= flags <= 1:
            return "", ACL_ERROR_RT_PARAM_INVALID
        if not any(p <= dev_ptr and dev_ptr + size <= p + n for p, n in live.items()):
            return "", ACL_ERROR_RT_PARAM_INVALID
        name = secrets.token_hex(16)
        ipc_names[name] = {"ptr": dev_ptr, "size": size, "pids": set(), "any": flags == 1,
                           "owner": mod.pid}
        return name, ACL_SUCCESS

    def ipc_mem_set_import_pid(key, pids):
        record("rt.ipc_mem_set_import_pid", key, list(pids) if isinstance(pids, (list, tuple)) else pids)
        if not isinstance(key, str) or not key:
            return ACL_ERROR_INVALID_PARAM
        if not isinstance(pids, (list, tuple)) or not pids or \
                not all(isinstance(p, int) for p in pids):
            return ACL_ERROR_RT_PARAM_INVALID
        if key not in ipc_names:
            return ACL_ERROR_RT_PARAM_INVALID
        ipc_names[key]["pids"].update(pids)
        return ACL_SUCCESS

    def ipc_mem_import_by_key(key, flags):
        record("rt.ipc_mem_import_by_key", key, flags)
        if not isinstance(key, str) or not key:
            return 0, ACL_ERROR_INVALID_PARAM
        if not isinstance(flags, int) or not 0 <= flags <= 1:
            return 0, ACL_ERROR_RT_PARAM_INVALID
        e = ipc_names.get(key)
        if e is None:
            return 0, ACL_ERROR_RT_PARAM_INVALID
        if not e["any"] and mod.pid not in e["pids"]:
            return 0, ACL_ERROR_RT_NO_PERMISSION
        va = next_import[0]
        next_import[0] += (e["size"] + granule - 1) // granule * granule
        ipc_imports.setdefault((mod.pid, key), []).append(va)
        return va, ACL_SUCCESS

    def ipc_mem_close(key):
        record("rt.ipc_mem_close", key)
        if not isinstance(key, str) or not key:
            return ACL_ERROR_INVALID_PARAM
        vas = ipc_imports.get((mod.pid, key))
        if vas:  # this process imported it: one import closes
            vas.pop(0)
            if not vas:
                del ipc_imports[(mod.pid, key)]
            return ACL_SUCCESS
        if key in ipc_names:
            del ipc_names[key]
            return ACL_SUCCESS
        return ACL_ERROR_RT_PARAM_INVALID

    mod = types.SimpleNamespace(
        rt=types.SimpleNamespace(
            malloc=malloc, malloc_align32=malloc_align32,
            free=lambda ptr: _free("rt.free", ptr),
            malloc_host=lambda size: _alloc("rt.malloc_host", size),
            free_host=lambda ptr: _free("rt.free_host", ptr),
            get_mem_info=get_mem_info, create_event=create_event, record_event=record_event,
            query_event_status=query_event_status, destroy_event=destroy_event,
            synchronize_stream=synchronize_stream, reserve_mem_address=reserve_mem_address,
            release_mem_address=release_mem_address, malloc_physical=malloc_physical,
            free_physical=free_physical, map_mem=map_mem, unmap_mem=unmap_mem,
            stream_wait_event=stream_wait_event, synchronize_event=synchronize_event,
            mem_get_allocation_granularity=mem_get_allocation_granularity, memcpy=memcpy,
            allocator_create_desc=allocator_create_desc,
            allocator_destroy_desc=allocator_destroy_desc,
            allocator_set_obj_to_desc=_setter("allocator_set_obj_to_desc", "obj"),
            allocator_set_alloc_func_to_desc=_setter("allocator_set_alloc_func_to_desc", "alloc"),
            allocator_set_free_func_to_desc=_setter("allocator_set_free_func_to_desc", "free"),
            allocator_set_alloc_advise_func_to_desc=_setter(
                "allocator_set_alloc_advise_func_to_desc", "alloc_advise"),
            allocator_set_get_addr_from_block_func_to_desc=_setter(
                "allocator_set_get_addr_from_block_func_to_desc", "get_addr_from_block"),
            allocator_register=allocator_register, allocator_get_by_stream=allocator_get_by_stream,
            allocator_unregister=allocator_unregister,
            ipc_mem_get_export_key=ipc_mem_get_export_key,
            ipc_mem_set_import_pid=ipc_mem_set_import_pid,
            ipc_mem_import_by_key=ipc_mem_import_by_key, ipc_mem_close=ipc_mem_close),
        media=types.SimpleNamespace(
            dvpp_malloc=lambda size: _alloc("media.dvpp_malloc", size),
            dvpp_free=lambda ptr: _free("media.dvpp_free", ptr)),
        calls=calls, live=live, capacity=capacity, fail=fail, events=events, finish=finish,
        reserved=reserved, physical=physical, physical_props=physical_props, mapped=mapped,
        waits=waits, descs=descs, doomed=doomed,
        registered=registered, ipc_names=ipc_names, ipc_imports=ipc_imports, pid=os.getpid())
    return mod
