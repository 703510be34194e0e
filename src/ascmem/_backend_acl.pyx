# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: binding=False
"""The acl backend: chunks from the CANN runtime through pyACL."""

cimport cython
from libc.stdint cimport uint64_t

from ascmem._core cimport (ASCM_KIND_DVPP, ASCM_KIND_HOST, ASCM_KIND_HUGE, ASCM_KIND_HUGE1G,
                          ASCM_KIND_NORMAL)
from ascmem._upstream cimport _RealUpstream

import warnings

from ascmem.errors import (ACL_ERROR_RT_FEATURE_NOT_SUPPORT, AscmemError, MisalignedError,
                           OutOfMemoryError, UnsupportedError)
from ascmem._upstream import UpstreamError
from ascmem.rules import MemKind

# how each kind's chunks are taken from the runtime and given back
# (namespace, function, policy or None, free function): the runtime's calls,
# not facts about the kinds (those are csrc/kinds.c's)
_ACL_CALLS = {ASCM_KIND_HUGE: ("rt", "malloc", 1, "free"),
              ASCM_KIND_NORMAL: ("rt", "malloc", 2, "free"),
              ASCM_KIND_DVPP: ("media", "dvpp_malloc", None, "dvpp_free"),
              ASCM_KIND_HOST: ("rt", "malloc_host", None, "free_host"),
              ASCM_KIND_HUGE1G: ("rt", "malloc", 6, "free")}
# pyACL codes that mean "the runtime is out of memory" (aclError: 207001
# ACL_ERROR_RT_MEMORY_ALLOCATION, 200000 ACL_ERROR_BAD_ALLOC)
_UPSTREAM_OOM = (207001, 200000)


@cython.no_gc_clear
cdef class _AclUpstream(_RealUpstream):
    """Chunks from the CANN runtime through pyACL (aclrtMalloc with the kind's
    policy, acldvppMalloc, aclrtMallocHost), sub-allocated by ascmem as CANN
    advises instead of frequent aclrtMalloc calls."""

    def __cinit__(self, acl_module, *args, **kwargs):
        self.name = "acl"
        self.acl = acl_module
        self.holds_memory = True
        self.from_runtime = True
        self.paging = "runtime"
        self.sharing = "runtime"
        self.chunk_alignment = 0  # aclrtMalloc promises no more than its page

    def take(self, int k, uint64_t size):
        ns, name, policy, free_name = _ACL_CALLS[k]
        if k in self.paged_kinds:  # address space only: the pools map granules under it
            ns, name, free_name, align = "rt", "reserve_mem_address", "release_mem_address", 2 << 20
            ptr, ret = self.acl.rt.reserve_mem_address(size, 0, 0, 0)
        else:
            align = 4096
            fn = getattr(getattr(self.acl, ns), name)
            ptr, ret = fn(size, policy) if policy is not None else fn(size)
        if ret == 0 and isinstance(ptr, int) and ptr > 0 and ptr % align == 0 and \
                ptr + size < (1 << 64):
            self.held[k].append((ptr, size))
            return ptr
        if ret == 0 and isinstance(ptr, int) and ptr > 0:  # a pointer we cannot use: give it back
            getattr(getattr(self.acl, ns), free_name)(ptr)
            raise MisalignedError(f"acl.{ns}.{name}({size}) returned {ptr:#x}, not {align} "
                                  f"aligned (or past the address space)")
        err = OutOfMemoryError if ret in _UPSTREAM_OOM else UpstreamError
        why = ""
        if k in self.paged_kinds and ret == ACL_ERROR_RT_FEATURE_NOT_SUPPORT:
            # the runtime's answer where the driver lacks the virtual memory
            # calls (hicann/runtime src/runtime/driver/npu_driver_mem.cc
            # lines 334-341): paged=True cannot work here, and is not faked
            err, why = UnsupportedError, ": this device has no virtual memory management"
        e = err(f"acl.{ns}.{name}({size}) for the {MemKind(k).name} pool returned "
                f"{ret if ret else 'a null pointer'}{why}")
        e.code = ret if ret else 207001
        raise e

    def describe(self, e):
        return f"code {e.code}"

    # A runtime call that raises (pyACL's MemoryError, say) where it could
    # return a failure code is taken as that failure, so that what the
    # device counts stays what the runtime holds (found by probing: a raise
    # in a chunk's free left the growth accounting wrong, and check() said
    # so; one in aclrtRecordEvent leaked the event).

    def record_event(self, stream):
        """aclrtCreateEvent + aclrtRecordEvent; None if the runtime refused."""
        rt = self.acl.rt
        try:
            ev, ret = rt.create_event()
        except Exception:
            return None
        if ret != 0:
            return None
        try:
            ret = rt.record_event(ev, stream)
        except Exception:
            ret = -1
        if ret != 0:
            self.destroy_event(ev)
            return None
        return ev

    def event_done(self, ev):
        """aclrtQueryEventStatus says ACL_EVENT_RECORDED_STATUS_COMPLETE (1)."""
        status, ret = self.acl.rt.query_event_status(ev)
        return ret == 0 and status == 1

    def destroy_event(self, ev):
        if self.disowned:  # an event of the parent's runtime
            return
        try:
            self.acl.rt.destroy_event(ev)
        except Exception as e:  # its code is not looked at either
            warnings.warn(f"acl.rt.destroy_event raised {e!r}", ResourceWarning)

    def synchronize(self, stream):
        ret = self.acl.rt.synchronize_stream(stream)
        if ret != 0:
            raise AscmemError(f"acl.rt.synchronize_stream returned {ret}")

    def _release(self, int k, uint64_t base, uint64_t size):
        if self.disowned:  # forgotten: the parent still holds it (_disown_after_fork)
            return
        ns, _, _, free_name = _ACL_CALLS[k]
        if k in self.paged_kinds:
            ns, free_name = "rt", "release_mem_address"
        try:
            ret = getattr(getattr(self.acl, ns), free_name)(base)
        except Exception as e:
            ret = repr(e)
        if ret != 0:  # the chunk is forgotten all the same: the device no longer has it
            warnings.warn(f"acl.{ns}.{free_name}({base:#x}) returned {ret}", ResourceWarning)


def upstream(uint64_t device_id, acl_module):
    """The registry's maker (_backends.py); pyACL: `import acl` unless a module is given."""
    if acl_module is None:
        try:
            import acl as acl_module
        except ImportError:
            raise UnsupportedError("backend='acl' needs pyACL (`import acl` failed); use "
                                   "backend='sim' or 'host' without an Ascend runtime") from None
    return _AclUpstream(acl_module)
