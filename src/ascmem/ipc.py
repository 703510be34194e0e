"""Sharing device blocks between processes: the bookkeeping behind
``Device.ipc_export`` / ``ipc_allow`` / ``ipc_import`` / ``ipc_close`` (see
docs/IPC.md), one ``IpcState`` per Device, made on first use.

The Device checks what only it can (a live block, its size and kind, buffer
views) and hands this module addresses and sizes; this module never calls
back into the Device's pools.  Each backend shares differently:

- host: real memory between real processes (ascmem._ipc_host: memfd per
  shareable block, an abstract Unix socket per exporting process, the
  allow-list checked against the kernel's SO_PEERCRED);
- sim: keys and addresses tracked in this process (several simulated
  Devices, as a plan lays them out);
- acl: the runtime's four calls through pyACL (aclrtIpcMemGetExportKey,
  aclrtIpcMemSetImportPid, aclrtIpcMemImportByKey, aclrtIpcMemClose).
"""

import os
import secrets
import threading

from ascmem.errors import (ACL_ERROR_RT_FEATURE_NOT_SUPPORT, ACL_ERROR_RT_NO_PERMISSION,
                           ACL_ERROR_RT_PARAM_INVALID, AscmemError, ArgumentTypeError,
                           InvalidArgumentError, IpcBusyError, IpcKeyError, IpcPermissionError,
                           UnsupportedError)

# aclrtIpcMemGetExportKey's flags and its key buffer (hicann/runtime
# include/external/acl/acl_rt.h lines 65-66; docs/zh/api_ref/
# 11-07_IPC_memory_sharing.md: "len ... 固定配置为65")
EXPORT_FLAG_DEFAULT = 0
EXPORT_FLAG_DISABLE_PID_VALIDATION = 1
IMPORT_FLAG_DEFAULT = 0
IMPORT_FLAG_ENABLE_PEER_ACCESS = 1
KEY_LEN = 65          # bytes of the runtime's key buffer, its terminating NUL included
MAX_KEY_CHARS = KEY_LEN - 1


def pid_list(pids):
    """A list of process ids (ints > 0) from any iterable of them."""
    if isinstance(pids, (str, bytes)) or not hasattr(pids, "__iter__"):
        raise ArgumentTypeError(f"pids must be an iterable of process ids, not "
                                f"{type(pids).__name__}")
    out = []
    for p in pids:
        if isinstance(p, bool) or not isinstance(p, int):
            raise ArgumentTypeError(f"a process id is an int, not {type(p).__name__}")
        if not 0 < p < 2 ** 31:
            raise InvalidArgumentError(f"{p} is not a process id")
        out.append(p)
    return out


def check_key(key):
    if not isinstance(key, str):
        raise ArgumentTypeError(f"an IPC key is a str, not {type(key).__name__}")
    if not key or len(key) > MAX_KEY_CHARS:
        raise IpcKeyError(f"{key[:80]!r} is not an IPC key (1 to {MAX_KEY_CHARS} characters)")


def error_for(code, message):
    """The typed ascmem error of a runtime code (the code kept on it)."""
    cls = {ACL_ERROR_RT_PARAM_INVALID: IpcKeyError, ACL_ERROR_RT_NO_PERMISSION: IpcPermissionError,
           ACL_ERROR_RT_FEATURE_NOT_SUPPORT: UnsupportedError}.get(code, AscmemError)
    e = cls(f"{message}: the runtime returned {code}")
    e.code = code
    return e


class _Export:
    __slots__ = ("addr", "size", "handle")

    def __init__(self, addr, size, handle):
        self.addr, self.size, self.handle = addr, size, handle


class _Import:
    __slots__ = ("addr", "size", "handle")

    def __init__(self, addr, size, handle):
        self.addr, self.size, self.handle = addr, size, handle


class IpcState:
    """A Device's exports and imports.  sharing: the upstream's capability
    ("os", "local" or "runtime": ascmem/_upstream.pyx); acl: the pyACL
    module; device_id: for the sim's import window."""

    def __init__(self, sharing, acl=None, device_id=0):
        self.lock = threading.RLock()
        self.exports = {}   # key -> _Export
        self.imports = {}   # key -> _Import
        self.import_at = {}  # importer address -> key
        self.backed = {}    # host: block address -> (size, memfd)
        self.way = _WAYS[sharing](acl, device_id)

    # ---- blocks of shareable tags -------------------------------------------------

    def back(self, addr, size):
        """host: a new block of a shareable tag gets its own shared memory."""
        from ascmem import _ipc_host
        fd = _ipc_host.back(addr, size)
        self.backed[addr] = (size, fd)

    def exported(self, addr):
        with self.lock:
            return any(e.addr == addr for e in self.exports.values())

    def forget_block(self, addr):
        """The block is being freed (not exported: the Device checked)."""
        backed = self.backed.pop(addr, None)
        if backed is not None:
            from ascmem import _ipc_host
            _ipc_host.unback(addr, backed[0], backed[1])

    # ---- export and import -----------------------------------------------------------

    def export(self, addr, usable, size, pids, any_process):
        pids = pid_list(pids)
        if size is None:
            size = usable
        if isinstance(size, bool) or not isinstance(size, int):
            raise ArgumentTypeError(f"size must be an int, not {type(size).__name__}")
        if not 0 < size <= usable:
            raise InvalidArgumentError(f"ipc_export: size {size} does not fit the block's "
                                       f"{usable} bytes")
        with self.lock:
            key, handle = self.way.export(self, addr, size, pids, bool(any_process))
            self.exports[key] = _Export(addr, size, handle)
        return key

    def allow(self, key, pids):
        check_key(key)
        pids = pid_list(pids)
        with self.lock:
            e = self.exports.get(key)
            if e is None and not isinstance(self.way, _AclWay):
                raise IpcKeyError(f"ipc_allow: {key!r} is not exported by this device")
            self.way.allow(key, e, pids)

    def import_(self, key):
        check_key(key)
        with self.lock:
            if key in self.imports:
                raise InvalidArgumentError(f"ipc_import: {key!r} is imported already (at "
                                           f"{self.imports[key].addr:#x})")
            if key in self.exports:
                raise InvalidArgumentError(f"ipc_import: {key!r} is this device's own export")
            addr, size, handle = self.way.import_(key)
            self.imports[key] = _Import(addr, size, handle)
            self.import_at[addr] = key
        return addr

    def imported_size(self, addr):
        key = self.import_at.get(addr)
        return self.imports[key].size if key is not None else 0

    def close(self, key, views):
        """views: the number of live buffer views at each address (a callable)."""
        check_key(key)
        with self.lock:
            imp = self.imports.get(key)
            if imp is not None:
                if views(imp.addr):
                    raise IpcBusyError(f"ipc_close: {key!r} still has {views(imp.addr)} live "
                                       f"buffer view(s) at {imp.addr:#x}; drop them first")
                self.way.close_import(key, imp)
                del self.imports[key]
                del self.import_at[imp.addr]
                return "import"
            exp = self.exports.get(key)
            if exp is None:
                raise IpcKeyError(f"ipc_close: {key!r} is neither exported nor imported by this "
                                  f"device")
            held = self.way.importers(key, exp)
            if held:
                raise IpcBusyError(f"ipc_close: {key!r} is still imported by process(es) "
                                   f"{', '.join(map(str, held))}: every importer closes first")
            self.way.close_export(key, exp)
            del self.exports[key]
            return "export"

    def drop_all(self):
        """The device is reset or closed: exports end (importers keep what they
        mapped, as after the exporter's death), imports are unmapped, the
        shared memory of blocks goes with their chunks."""
        with self.lock:
            for key, exp in list(self.exports.items()):
                try:
                    self.way.close_export(key, exp, force=True)
                except AscmemError:
                    pass
            for key, imp in list(self.imports.items()):
                try:
                    self.way.close_import(key, imp)
                except AscmemError:
                    pass
            self.exports.clear()
            self.imports.clear()
            self.import_at.clear()
            for _size, fd in self.backed.values():
                os.close(fd)
            self.backed.clear()


    def __del__(self):  # a Device collected without close(): no descriptor left behind
        try:
            self.drop_all()
        except Exception:
            pass


class _HostWay:
    """Real processes: see ascmem._ipc_host."""

    def __init__(self, acl, device_id):
        pass

    def export(self, state, addr, size, pids, any_process):
        from ascmem import _ipc_host
        backed = state.backed.get(addr)
        if backed is None:
            raise UnsupportedError(f"ipc_export: {addr:#x} is not a block of a shareable tag; on "
                                   f"the host backend only blocks allocated with a tag made "
                                   f"shareable (align_tag(tag, alignment, shareable=True)) live "
                                   f"in memory another process can map")
        door = _ipc_host.door()
        token = door.add(backed[1], size, pids, any_process)
        return _ipc_host.make_key(door, token), token

    def allow(self, key, exp, pids):
        from ascmem import _ipc_host
        _ipc_host.door().allow(exp.handle, pids)

    def importers(self, key, exp):
        from ascmem import _ipc_host
        return _ipc_host.door().importers(exp.handle)

    def close_export(self, key, exp, force=False):
        from ascmem import _ipc_host
        door = _ipc_host.door()
        door.remove(exp.handle)
        if not door.entries:  # no export left in the process: the socket and thread go
            _ipc_host.close_door()

    def import_(self, key):
        from ascmem import _ipc_host
        conn = _ipc_host.Connection(key)
        return conn.addr, conn.size, conn

    def close_import(self, key, imp):
        imp.handle.close()


# sim: every simulated device of the process sees one table of keys
_sim_lock = threading.Lock()
_sim_exports = {}   # key -> {"pids": set, "any": bool, "importers": int}
_SIM_IMPORT_SLOT = 7  # the kind slot no memory kind uses (kinds 0-4): imported ranges


class _SimWay:
    def __init__(self, acl, device_id):
        self.next = ((device_id + 1) << 46) | (_SIM_IMPORT_SLOT << 37)

    def export(self, state, addr, size, pids, any_process):
        key = "ascm1-sim-" + secrets.token_hex(16)
        with _sim_lock:
            _sim_exports[key] = {"pids": set(pids), "any": any_process, "importers": 0,
                                 "size": size}
        return key, None

    def allow(self, key, exp, pids):
        with _sim_lock:
            _sim_exports[key]["pids"].update(pids)

    def importers(self, key, exp):
        with _sim_lock:
            n = _sim_exports[key]["importers"]
        return [os.getpid()] * n

    def close_export(self, key, exp, force=False):
        with _sim_lock:
            _sim_exports.pop(key, None)

    def import_(self, key):
        with _sim_lock:
            e = _sim_exports.get(key)
            if e is None:
                raise IpcKeyError(f"{key!r} is not exported (forged, or closed since: stale key)")
            if not e["any"] and os.getpid() not in e["pids"]:
                raise IpcPermissionError(f"process {os.getpid()} is not on the allow-list of "
                                         f"{key!r}")
            e["importers"] += 1
            size = e["size"]
        addr = self.next
        self.next += (size + (2 << 20) - 1) // (2 << 20) * (2 << 20)
        return addr, size, None

    def close_import(self, key, imp):
        with _sim_lock:
            e = _sim_exports.get(key)
            if e is not None:
                e["importers"] -= 1


class _AclWay:
    """The runtime's calls through pyACL.  The runtime keeps the allow-list
    and the importers; the order it asks for (importers close first) is the
    caller's to keep, as with CANN."""

    def __init__(self, acl, device_id):
        self.acl = acl

    def export(self, state, addr, size, pids, any_process):
        flags = EXPORT_FLAG_DISABLE_PID_VALIDATION if any_process else EXPORT_FLAG_DEFAULT
        key, ret = self.acl.rt.ipc_mem_get_export_key(addr, size, flags)
        if ret:
            raise error_for(ret, f"aclrtIpcMemGetExportKey({addr:#x}, {size})")
        if pids:
            ret = self.acl.rt.ipc_mem_set_import_pid(key, pids)
            if ret:
                self.acl.rt.ipc_mem_close(key)
                raise error_for(ret, f"aclrtIpcMemSetImportPid({key!r})")
        return key, None

    def allow(self, key, exp, pids):
        ret = self.acl.rt.ipc_mem_set_import_pid(key, pids)
        if ret:
            raise error_for(ret, f"aclrtIpcMemSetImportPid({key!r})")

    def importers(self, key, exp):
        return []

    def close_export(self, key, exp, force=False):
        ret = self.acl.rt.ipc_mem_close(key)
        if ret:
            raise error_for(ret, f"aclrtIpcMemClose({key!r})")

    def import_(self, key):
        ptr, ret = self.acl.rt.ipc_mem_import_by_key(key, IMPORT_FLAG_DEFAULT)
        if ret:
            raise error_for(ret, f"aclrtIpcMemImportByKey({key!r})")
        return ptr, 0, None

    def close_import(self, key, imp):
        ret = self.acl.rt.ipc_mem_close(key)
        if ret:
            raise error_for(ret, f"aclrtIpcMemClose({key!r})")


# ---- the pyACL drop-in (ascmem.acl.rt.ipc_mem_*) ----------------------------------------
# Same names, arguments and return conventions as pyACL; errors are aclError
# codes, never exceptions.  A null pointer or key is the ACL layer's
# ACL_ERROR_INVALID_PARAM (src/acl/aclrt_impl/memory.cpp lines 1775-1810); a
# size of 0, a flag past the last one, an empty pid list, the runtime's
# ACL_ERROR_RT_PARAM_INVALID (src/runtime/api/impl/api_error.cc lines
# 3747-3766, 3809-3846).


# how each sharing capability of an upstream (ascmem/_upstream.pyx) shares blocks
_WAYS = {"os": _HostWay, "local": _SimWay, "runtime": _AclWay}

def _dropin(call, *args):
    from ascmem import acl
    from ascmem.errors import acl_code
    try:
        return getattr(acl.device(), call)(*args), 0
    except Exception as exc:
        return None, acl_code(exc)


def ipc_mem_get_export_key(dev_ptr, size, flags):
    """aclrtIpcMemGetExportKey -> (key, ret)."""
    from ascmem.errors import ACL_ERROR_INVALID_PARAM
    if not isinstance(dev_ptr, int) or isinstance(dev_ptr, bool) or not dev_ptr:
        return "", ACL_ERROR_INVALID_PARAM
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0 or \
            not isinstance(flags, int) or flags not in (EXPORT_FLAG_DEFAULT,
                                                        EXPORT_FLAG_DISABLE_PID_VALIDATION):
        return "", ACL_ERROR_RT_PARAM_INVALID
    from ascmem import acl
    from ascmem.errors import acl_code
    try:
        key = acl.device().ipc_export(dev_ptr, size,
                                      any_process=flags == EXPORT_FLAG_DISABLE_PID_VALIDATION)
        return key, 0
    except Exception as exc:
        return "", acl_code(exc)


def ipc_mem_set_import_pid(key, pids):
    """aclrtIpcMemSetImportPid -> ret."""
    from ascmem.errors import ACL_ERROR_INVALID_PARAM
    if not isinstance(key, str) or not key:
        return ACL_ERROR_INVALID_PARAM
    if not isinstance(pids, (list, tuple)) or not pids:
        return ACL_ERROR_RT_PARAM_INVALID
    return _dropin("ipc_allow", key, list(pids))[1]


def ipc_mem_import_by_key(key, flags):
    """aclrtIpcMemImportByKey -> (dev_ptr, ret)."""
    from ascmem.errors import ACL_ERROR_INVALID_PARAM
    if not isinstance(key, str) or not key:
        return 0, ACL_ERROR_INVALID_PARAM
    if not isinstance(flags, int) or flags not in (IMPORT_FLAG_DEFAULT,
                                                   IMPORT_FLAG_ENABLE_PEER_ACCESS):
        return 0, ACL_ERROR_RT_PARAM_INVALID
    ptr, ret = _dropin("ipc_import", key)
    return (ptr or 0), ret


def ipc_mem_close(key):
    """aclrtIpcMemClose -> ret."""
    from ascmem.errors import ACL_ERROR_INVALID_PARAM
    if not isinstance(key, str) or not key:
        return ACL_ERROR_INVALID_PARAM
    return _dropin("ipc_close", key)[1]
