"""Exceptions.  Each carries ``.code``: the CANN ``aclError`` value a pyACL
call would have returned for the same failure.

Codes from the CANN API reference, "aclError" (Application Development API,
e.g. canncommercial 8.0 ``aclcppdevg_03_1345`` and the pyACL page
``aclpythondevg_01_0910``) and ``include/acl/error_codes/rt_error_codes.h``.
"""

ACL_SUCCESS = 0
ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_RT_PARAM_INVALID = 107000
ACL_ERROR_RT_CONTEXT_NULL = 107002
ACL_ERROR_RT_INVALID_MEMORY_TYPE = 107016
ACL_ERROR_BAD_ALLOC = 200000
ACL_ERROR_MEMORY_ADDRESS_UNALIGNED = 200003
ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000
ACL_ERROR_RT_MEMORY_ALLOCATION = 207001
ACL_ERROR_RT_MEMORY_FREE = 207002
ACL_ERROR_RT_NO_PERMISSION = 207006
ACL_ERROR_INTERNAL_ERROR = 500000
ACL_ERROR_RT_INTERNAL_ERROR = 507000


class AscmemError(Exception):
    """Base of every ascmem error."""

    code = ACL_ERROR_INTERNAL_ERROR


class OutOfMemoryError(AscmemError, MemoryError, RuntimeError):
    """No room for the request: the range, the page budget or a limit.  A
    RuntimeError too, as torch.OutOfMemoryError is, so that code written
    for torch's (``except RuntimeError``) catches it."""

    code = ACL_ERROR_RT_MEMORY_ALLOCATION


class InvalidArgumentError(AscmemError, ValueError):
    """A size, alignment, policy or other argument is not acceptable."""

    code = ACL_ERROR_INVALID_PARAM


class ArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument has the wrong type (a float size, a string pointer...)."""


class MisalignedError(InvalidArgumentError):
    """An address does not have the alignment the rule asks for."""

    code = ACL_ERROR_MEMORY_ADDRESS_UNALIGNED


class InvalidFreeError(AscmemError, ValueError):
    """The address is not the start of a live block of this allocator:
    a double free, a foreign or interior pointer, or a pointer from before a
    reset."""

    code = ACL_ERROR_RT_MEMORY_FREE


class InUseError(InvalidArgumentError):
    """close() or reset() of a device while memory of it is still in use
    outside ascmem's Python objects: blocks handed out to C callers (the
    pluggable functions, the capsule's device calls, torch through
    ``ascmem.torch``) or live buffer views.  Nothing changed; free them (for
    torch: drop the tensors) and call again."""


class UnsupportedError(AscmemError):
    """The product does not support this (a P2P or 1 GiB-page policy...)."""

    code = ACL_ERROR_RT_FEATURE_NOT_SUPPORT


class ClosedError(AscmemError):
    """The pool or device was closed: every allocation and free fails;
    statistics stay readable (the runtime's answer once a device's context
    is gone: 107002, ACL_ERROR_RT_CONTEXT_NULL, in
    ``include/external/acl/error_codes/rt_error_codes.h``)."""

    code = ACL_ERROR_RT_CONTEXT_NULL


class DeviceClosedError(ClosedError):
    """The device was closed: its memory went back to the upstream, and every
    allocation, free or view fails."""


class InvalidMemoryTypeError(InvalidArgumentError):
    """aclrtGetMemInfo with an attribute outside aclrtMemAttr (the runtime:
    RT_ERROR_INVALID_MEMORY_TYPE, reported as 107016; hicann/runtime
    src/runtime/api/impl/api_error.cc lines 3185-3188, errcode_manage.cc
    line 330)."""

    code = ACL_ERROR_RT_INVALID_MEMORY_TYPE


class RuntimeParamError(InvalidArgumentError):
    """An argument the runtime itself (not the ACL layer) refuses: a
    read-only or unknown pool attribute, a pool that does not exist for
    set/get, a pointer inside a pool that is not a live block of it
    (RT_ERROR_INVALID_VALUE, which the runtime reports as 107000,
    ACL_ERROR_RT_PARAM_INVALID: src/runtime/core/src/common/errcode_manage.cc
    line 314 in hicann/runtime)."""

    code = ACL_ERROR_RT_PARAM_INVALID


class PoolStateError(AscmemError):
    """A stream-ordered pool refused an operation in its current state: it
    is destroyed, full, asked to trim below its used bytes, or has an
    attribute value out of range.  The runtime's pool errors
    (RT_ERROR_MEM_POOL_NULL ... RT_ERROR_MEM_POOL_ALLOC, 0x0720000x) have no
    public code and reach the caller as 507000, ACL_ERROR_RT_INTERNAL_ERROR
    (errcode_manage.cc lines 612-617: an inner code not in the table)."""

    code = ACL_ERROR_RT_INTERNAL_ERROR


class IpcKeyError(InvalidArgumentError):
    """An IPC key that opens nothing: forged, truncated, never exported, or
    stale (closed, its block freed, its exporter gone).  The runtime refuses
    a name it does not know with RT_ERROR_INVALID_VALUE, reported as 107000
    (hicann/runtime src/runtime/api/impl/api_error.cc lines 3821-3846 and
    errcode_manage.cc line 314)."""

    code = ACL_ERROR_RT_PARAM_INVALID


class IpcPermissionError(AscmemError, PermissionError):
    """This process is not on the exported block's allow-list
    (aclrtIpcMemSetImportPid; ACL_ERROR_RT_NO_PERMISSION, 207006, in
    include/external/acl/error_codes/rt_error_codes.h line 75)."""

    code = ACL_ERROR_RT_NO_PERMISSION


class IpcBusyError(InvalidArgumentError):
    """An export cannot be closed yet (importers still hold it: every importer
    closes first, docs/zh/api_ref/11-07_IPC_memory_sharing.md, aclrtIpcMemClose),
    or a block cannot be freed while it is exported."""

    code = ACL_ERROR_RT_PARAM_INVALID


class CorruptionError(AscmemError):
    """An internal invariant does not hold (raised by ``check()``)."""

    code = ACL_ERROR_INTERNAL_ERROR


class PrecautionWarning(UserWarning):
    """A CANN memory precaution applies to what just happened."""


def acl_code(exc):
    """The aclError code a pyACL call returns for an exception: the one ascmem
    errors carry, ACL_ERROR_INVALID_PARAM for bad arguments, else
    ACL_ERROR_INTERNAL_ERROR.  The drop-in (ascmem.acl) never raises."""
    if isinstance(exc, AscmemError):
        return exc.code
    if isinstance(exc, (TypeError, ValueError, OverflowError)):
        return ACL_ERROR_INVALID_PARAM
    return ACL_ERROR_INTERNAL_ERROR
