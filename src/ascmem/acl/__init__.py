"""A drop-in for pyACL's memory calls: same names, arguments and return
conventions (``ptr, ret = acl.rt.malloc(size, policy)``; ``ret = acl.rt.free(ptr)``),
errors as integer aclError codes, never exceptions.

    from ascmem import acl
    ptr, ret = acl.rt.malloc(1 << 20, 0)

The calls go to a default Device, made on first use from ASCMEM_MODEL (default
atlas-inference) and ASCMEM_BACKEND (default sim), or set with ``use(device)``.
``install(module)`` patches these functions into a real ``acl`` module in place,
so an unchanged pipeline allocates through ascmem; pointers ascmem did not hand
out go to the module's original free; ``uninstall()`` restores everything.

CANN's stream-ordered pools (``acl.rt.mem_pool_create`` ... ``mem_pool_trim_to``,
with the stream and event calls they depend on) are in ascmem.acl.soma, and
the external allocator for a stream (``register_allocator``) in
ascmem.acl.allocator; both are reached from here.
"""

import os
import threading
import types
import warnings

import ascmem
from ascmem import ipc
from ascmem.acl import allocator as acl_allocator
from ascmem.acl import soma as acl_soma
from ascmem.errors import (ACL_ERROR_INTERNAL_ERROR, ACL_ERROR_INVALID_PARAM,
                           ACL_ERROR_RT_FEATURE_NOT_SUPPORT, ACL_SUCCESS,
                           InvalidArgumentError, acl_code)

_lock = threading.Lock()
_device = None
_devices = {}


def _after_fork_in_child():
    global _lock
    _lock = threading.Lock()  # another thread may have held it in the parent


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def use(device: "ascmem.Device | None") -> None:
    """Makes device the target of every call (None: back to the default)."""
    global _device
    _device = device


def device():
    """The device the calls go to, made on first use."""
    global _device
    if _device is None:
        with _lock:
            if _device is None:
                _device = ascmem.Device(os.environ.get("ASCMEM_MODEL", "atlas-inference"),
                                        backend=os.environ.get("ASCMEM_BACKEND", "sim"))
    return _device


def _alloc(method, *args):
    """ptr, ret of device().method(*args): (0, code) on any failure, also a
    default device that cannot be made (a bad ASCMEM_MODEL or backend)."""
    try:
        return getattr(device(), method)(*args), ACL_SUCCESS
    except Exception as exc:
        return 0, acl_code(exc)


def _free(method, ptr):
    try:
        getattr(device(), method)(ptr)
        return ACL_SUCCESS
    except Exception as exc:
        return acl_code(exc)


def init(config_path=None):
    return ACL_SUCCESS


def finalize():
    return ACL_SUCCESS


def _is_device_id(device_id):
    return isinstance(device_id, int) and not isinstance(device_id, bool) and 0 <= device_id < 64


def _set_device(device_id):
    global _device
    if not _is_device_id(device_id):
        return ACL_ERROR_INVALID_PARAM
    with _lock:
        if device_id not in _devices:
            try:
                _devices[device_id] = ascmem.Device(
                    os.environ.get("ASCMEM_MODEL", "atlas-inference"),
                    backend=os.environ.get("ASCMEM_BACKEND", "sim"), device_id=device_id)
            except Exception as exc:
                return acl_code(exc)
        _device = _devices[device_id]
    return ACL_SUCCESS


def _device_by_id(device_id):
    """The device set for device_id (set_device, or the default one), or None."""
    if not _is_device_id(device_id):
        return None
    dev = _devices.get(device_id)
    if dev is None and _device is not None and _device.device_id == device_id:
        dev = _device
    return dev


def _device_in_use(device_id):
    """The device set for device_id, else the default device (made on first
    use) if it has that id, else None."""
    dev = _device_by_id(device_id)
    if dev is None and device().device_id == device_id:
        dev = device()
    return dev


def _reset_device(device_id):
    dev = _device_by_id(device_id)
    if dev is None:
        return ACL_ERROR_INVALID_PARAM
    try:
        dev.reset()
    except Exception as exc:
        return acl_code(exc)
    acl_soma.forget_pools_of(dev)
    return ACL_SUCCESS


def _get_mem_info(attr):
    try:
        free, total = device().get_mem_info(attr)
        return free, total, ACL_SUCCESS
    except Exception as exc:
        return 0, 0, acl_code(exc)


def _himpi_dvpp_malloc(dev_id, size):
    """hi_mpi_dvpp_malloc(dev_id, size): dev_id must name a device in use;
    products without it (profiles [D]) get the runtime's not-supported code."""
    if not _is_device_id(dev_id):
        return 0, ACL_ERROR_INVALID_PARAM
    try:
        dev = _device_in_use(dev_id)
    except Exception as exc:
        return 0, acl_code(exc)
    if dev is None:
        return 0, ACL_ERROR_INVALID_PARAM
    if not dev.profile.himpi:
        return 0, ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    try:
        return dev.dvpp_malloc(size), ACL_SUCCESS
    except Exception as exc:
        return 0, acl_code(exc)


def _free_device_memory(ptr):
    """aclrtFree: a block of a stream-ordered pool leaves its pool (the
    runtime frees it there too); anything else is the device's."""
    if acl_soma._pools:
        try:
            if acl_soma.free_pooled(ptr):
                return ACL_SUCCESS
        except Exception as exc:
            return acl_code(exc)
    return _free("free", ptr)


rt = types.SimpleNamespace(
    malloc=lambda size, policy=0: _alloc("malloc", size, policy),
    malloc_align32=lambda size, policy=0: _alloc("malloc_align32", size, policy),
    free=_free_device_memory,
    malloc_host=lambda size: _alloc("malloc_host", size),
    free_host=lambda ptr: _free("free_host", ptr),
    get_mem_info=_get_mem_info,
    set_device=_set_device,
    reset_device=_reset_device,
    # stream-ordered memory pools (aclrtMemPool*; no pyACL binding exists)
    mem_pool_create=acl_soma.mem_pool_create,
    mem_pool_destroy=acl_soma.mem_pool_destroy,
    mem_pool_set_attr=acl_soma.mem_pool_set_attr,
    mem_pool_get_attr=acl_soma.mem_pool_get_attr,
    mem_pool_malloc_async=acl_soma.mem_pool_malloc_async,
    mem_pool_free_async=acl_soma.mem_pool_free_async,
    mem_pool_trim_to=acl_soma.mem_pool_trim_to,
    # the streams and events they order (sim and host backends)
    create_stream=acl_soma.create_stream,
    destroy_stream=acl_soma.destroy_stream,
    create_event=acl_soma.create_event,
    destroy_event=acl_soma.destroy_event,
    record_event=acl_soma.record_event,
    stream_wait_event=acl_soma.stream_wait_event,
    synchronize_event=acl_soma.synchronize_event,
    query_event_status=acl_soma.query_event_status,
    synchronize_stream=acl_soma.synchronize_stream,
    synchronize_device=acl_soma.synchronize_device,
    # sharing device memory between processes (aclrtIpcMem*; ascmem.ipc)
    ipc_mem_get_export_key=ipc.ipc_mem_get_export_key,
    ipc_mem_set_import_pid=ipc.ipc_mem_set_import_pid,
    ipc_mem_import_by_key=ipc.ipc_mem_import_by_key,
    ipc_mem_close=ipc.ipc_mem_close,
)
# aclrtIpcMemGetExportKey's flags (include/external/acl/acl_rt.h lines 65-66)
ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT = ipc.EXPORT_FLAG_DEFAULT
ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION = ipc.EXPORT_FLAG_DISABLE_PID_VALIDATION
media = types.SimpleNamespace(
    dvpp_malloc=lambda size: _alloc("dvpp_malloc", size),
    dvpp_free=lambda ptr: _free("dvpp_free", ptr),
)
himpi = types.SimpleNamespace(
    dvpp_malloc=_himpi_dvpp_malloc,
    dvpp_free=lambda ptr: _free("dvpp_free", ptr),
)


def register_allocator(stream, device=None, module=None):
    """Makes CANN take stream's memory from device (the default device if
    None) through the external allocator (aclrtAllocatorRegister).  module:
    the pyACL module to register with (the installed one, else ``import
    acl``).  Returns an aclError code; ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    without pyACL or on a product without the call; ACL_ERROR_INVALID_PARAM
    for a null or unhashable stream or a device that is not an ascmem
    Device.  The shipped pyACL's trampolines return NULL to the runtime
    whatever the Python callback returns (docs/EMBEDDING.md, section 4):
    to serve the runtime's allocations, register the C functions from C."""
    try:
        dev = ascmem_device() if device is None else device
    except Exception as exc:
        return acl_code(exc)
    return acl_allocator.register(_module() if module is None else module, stream, dev)


def unregister_allocator(stream):
    """aclrtAllocatorUnregister for a stream register_allocator set up."""
    return acl_allocator.unregister(stream)


def _module():
    """The pyACL module: the installed one, else an importable ``acl``."""
    if _installed:
        return _installed[0]
    try:
        import acl as module  # pyACL, where CANN is installed
    except ImportError:
        return None
    return module


ascmem_device = device  # device() under a name register_allocator's argument cannot hide

# ---- patching a real pyACL module ------------------------------------------------------

_PATCHED = {
    "rt": ("malloc", "malloc_align32", "free", "malloc_host", "free_host", "get_mem_info"),
    "media": ("dvpp_malloc", "dvpp_free"),
    "himpi": ("dvpp_malloc", "dvpp_free"),
}
_FREES = {("rt", "free"), ("rt", "free_host"), ("media", "dvpp_free"), ("himpi", "dvpp_free")}
# The calls that run a job: the first after the device starts takes the
# runtime's own memory (AI CPU operator cache, or the system package on
# A2/A3: Device.begin_job), so install() has them charge it first.
_JOBS = {"mdl": ("execute", "execute_async", "execute_v2"),
         "op": ("execute", "execute_v2", "execute_async")}
_saved = []
_installed = []  # the module install() patched


def install(module):
    """Routes a pyACL module's memory calls through ascmem, in place, and
    wraps its event and synchronization calls so that the stream-ordered
    pools see them (acl_soma.OBSERVERS).  All or nothing: if one function
    cannot be replaced (a read-only namespace), the ones already replaced
    are put back and InvalidArgumentError is raised."""
    if _saved:
        raise RuntimeError("ascmem.acl is already installed; uninstall() first")
    mine = {"rt": rt, "media": media, "himpi": himpi}
    done = []
    try:
        for ns_name, names in dict(_PATCHED, rt=_PATCHED["rt"] + tuple(acl_soma.OBSERVERS),
                                   **_JOBS).items():
            ns = getattr(module, ns_name, None)
            if ns is None:
                continue
            for name in names:
                original = getattr(ns, name, None)
                if original is None:
                    continue
                if ns_name in _JOBS:
                    ours = _first_job_then(original)
                elif name in acl_soma.OBSERVERS:
                    ours = acl_soma.observed(name, original)
                else:
                    ours = getattr(mine[ns_name], name)
                if (ns_name, name) in _FREES:
                    ours = _free_or_forward(ours, original)
                try:
                    setattr(ns, name, ours)
                except Exception as exc:
                    raise InvalidArgumentError(f"cannot replace {ns_name}.{name} of {module!r}: "
                                               f"{exc}") from None
                done.append((ns, name, original))
    except BaseException:
        _restore(done)
        raise
    _saved.extend(done)
    _installed[:] = [module]


def _first_job_then(original):
    """original, after the device has taken what the first job takes; if
    that memory is not free, the job fails with the code, as it would."""
    def run(*args, **kw):
        try:
            device().begin_job()  # nothing after the first
        except Exception as exc:
            return acl_code(exc)
        return original(*args, **kw)
    run.__wrapped__ = original
    return run


def _free_or_forward(ours, original):
    def free(ptr):
        try:
            mine = device().kind_of(ptr) is not None
        except Exception:
            mine = False
        return ours(ptr) if mine else original(ptr)
    return free


def _restore(patched):
    """Puts originals back, newest first; returns what could not be."""
    failed = []
    while patched:
        ns, name, original = patched.pop()
        try:
            setattr(ns, name, original)
        except Exception as exc:
            failed.append(f"{name}: {exc}")
    return failed


def uninstall():
    """Puts back every function install() replaced.  Never raises: what
    cannot be put back is reported as a ResourceWarning."""
    failed = _restore(_saved)
    _installed.clear()
    if failed:
        warnings.warn("ascmem.acl.uninstall could not restore " + "; ".join(failed),
                      ResourceWarning, stacklevel=2)
