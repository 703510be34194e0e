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
"""

import os
import threading
import types

import ascmem
from ascmem.errors import ACL_ERROR_INVALID_PARAM, ACL_SUCCESS, AscmemError

_lock = threading.Lock()
_device = None
_devices = {}


def use(device):
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


def _code(exc):
    return getattr(exc, "code", ACL_ERROR_INVALID_PARAM)


def _alloc(call, *args):
    try:
        return call(*args), ACL_SUCCESS
    except AscmemError as exc:
        return 0, _code(exc)
    except (TypeError, ValueError):
        return 0, ACL_ERROR_INVALID_PARAM


def _free(call, ptr):
    try:
        call(ptr)
        return ACL_SUCCESS
    except AscmemError as exc:
        return _code(exc)
    except (TypeError, ValueError):
        return ACL_ERROR_INVALID_PARAM


def init(config_path=None):
    return ACL_SUCCESS


def finalize():
    return ACL_SUCCESS


def _set_device(device_id):
    global _device
    if not isinstance(device_id, int) or device_id < 0:
        return ACL_ERROR_INVALID_PARAM
    with _lock:
        if device_id not in _devices:
            try:
                _devices[device_id] = ascmem.Device(
                    os.environ.get("ASCMEM_MODEL", "atlas-inference"),
                    backend=os.environ.get("ASCMEM_BACKEND", "sim"), device_id=device_id)
            except AscmemError as exc:
                return _code(exc)
        _device = _devices[device_id]
    return ACL_SUCCESS


def _reset_device(device_id):
    dev = _devices.get(device_id) or (_device if _device and _device.device_id == device_id else None)
    if dev is None:
        return ACL_ERROR_INVALID_PARAM
    dev.reset()
    return ACL_SUCCESS


def _get_mem_info(attr):
    try:
        free, total = device().get_mem_info(attr)
        return free, total, ACL_SUCCESS
    except AscmemError as exc:
        return 0, 0, _code(exc)


rt = types.SimpleNamespace(
    malloc=lambda size, policy=0: _alloc(device().malloc, size, policy),
    malloc_align32=lambda size, policy=0: _alloc(device().malloc_align32, size, policy),
    free=lambda ptr: _free(device().free, ptr),
    malloc_host=lambda size: _alloc(device().malloc_host, size),
    free_host=lambda ptr: _free(device().free_host, ptr),
    get_mem_info=_get_mem_info,
    set_device=_set_device,
    reset_device=_reset_device,
)
media = types.SimpleNamespace(
    dvpp_malloc=lambda size: _alloc(device().dvpp_malloc, size),
    dvpp_free=lambda ptr: _free(device().dvpp_free, ptr),
)
himpi = types.SimpleNamespace(
    dvpp_malloc=lambda dev_id, size: _alloc(device().dvpp_malloc, size),
    dvpp_free=lambda ptr: _free(device().dvpp_free, ptr),
)

# ---- patching a real pyACL module ------------------------------------------------------

_PATCHED = {
    "rt": ("malloc", "malloc_align32", "free", "malloc_host", "free_host", "get_mem_info"),
    "media": ("dvpp_malloc", "dvpp_free"),
    "himpi": ("dvpp_malloc", "dvpp_free"),
}
_FREES = {("rt", "free"), ("rt", "free_host"), ("media", "dvpp_free"), ("himpi", "dvpp_free")}
_saved = []


def install(module):
    """Routes a pyACL module's memory calls through ascmem, in place."""
    if _saved:
        raise RuntimeError("ascmem.acl is already installed; uninstall() first")
    mine = {"rt": rt, "media": media, "himpi": himpi}
    for ns_name, names in _PATCHED.items():
        ns = getattr(module, ns_name, None)
        if ns is None:
            continue
        for name in names:
            original = getattr(ns, name, None)
            if original is None:
                continue
            _saved.append((ns, name, original))
            ours = getattr(mine[ns_name], name)
            if (ns_name, name) in _FREES:
                ours = _free_or_forward(ours, original)
            setattr(ns, name, ours)


def _free_or_forward(ours, original):
    def free(ptr):
        try:
            mine = device().kind_of(ptr) is not None
        except AscmemError:
            mine = False
        return ours(ptr) if mine else original(ptr)
    return free


def uninstall():
    """Puts back every function install() replaced."""
    while _saved:
        ns, name, original = _saved.pop()
        setattr(ns, name, original)
