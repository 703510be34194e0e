# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: binding=False
"""The host backend: real memory from mmap (csrc/osmem.c, reached through
ascmem._core, the one module that links the C core)."""

cimport cython
from libc.stdint cimport uint64_t

from ascmem._core cimport ASCM_OK, CoreCalls, core_calls, _fmt_bytes
from ascmem._upstream cimport _RealUpstream, _Upstream

from ascmem._upstream import UpstreamError
from ascmem.rules import MemKind

_CHUNK_ALIGN = 2 << 20
# Retired host ranges kept reserved per device: each costs the process one
# mapping (the kernel allows about 65,000 in all) and no memory, so the
# oldest are let go past this many -- a pointer from within the last
# thousand resets or so (four kinds each) is always refused.
_QUARANTINE_MAX = 4096

cdef const CoreCalls *C = core_calls()


@cython.no_gc_clear
cdef class _HostUpstream(_RealUpstream):
    """Real memory from mmap; huge kinds 2 MiB-aligned, on huge pages if the
    OS has them.  A chunk retired by a reset stays reserved as inaccessible
    address space (no physical memory), so the OS cannot hand its addresses
    out again while the device lives: a pointer from before a reset stays
    foreign, for the last _QUARANTINE_MAX retired ranges (and all of them
    when the OS runs short of mappings: see drop_quarantine).  close()
    returns the reservations too."""

    def __cinit__(self, *args, **kwargs):
        self.name = "host"
        self.readable = True
        self.holds_memory = True
        self.paging = "os"
        self.sharing = "os"
        self.chunk_alignment = _CHUNK_ALIGN  # take() reserves every chunk 2 MiB-aligned

    def take(self, int k, uint64_t size):
        cdef uint64_t addr
        cdef int got
        huge = C.ascm_kind(k).huge  # huge-page kinds: on huge pages if the OS has them
        # every chunk 2 MiB-aligned (address space only): a pool aligns blocks
        # past its unit relative to its base, so align_tag's groups get up to
        # 2 MiB on every kind
        if C.ascm_os_reserve(size, _CHUNK_ALIGN, huge, &addr, &got) != ASCM_OK:
            raise UpstreamError(f"the OS refused {_fmt_bytes(size)} of address space for "
                                f"{MemKind(k).name} memory")
        self.pages.setdefault(k, got)
        if k in self.paged_kinds and C.ascm_os_map(NULL, addr, size, 0) != 0:
            C.ascm_os_release(addr, size)  # a paged chunk starts unmapped: no access, no memory
            raise UpstreamError(f"the OS refused to protect {_fmt_bytes(size)} of reserved "
                                f"{MemKind(k).name} address space")
        self.held[k].append((addr, size))
        return addr

    def retire(self, int k, uint64_t base, uint64_t size):
        self.held[k].remove((base, size))
        if C.ascm_os_quarantine(base, size) == ASCM_OK:
            self._quarantine.append((base, size))
        else:  # cannot keep the addresses: at least give the memory back
            C.ascm_os_release(base, size)
        while len(self._quarantine) > _QUARANTINE_MAX:
            old_base, old_size = self._quarantine.pop(0)
            C.ascm_os_release(old_base, old_size)

    def drop_quarantine(self):
        """Lets every retired range go (the OS refused fresh address space);
        returns how many."""
        n = len(self._quarantine)
        while self._quarantine:
            base, size = self._quarantine.pop()
            C.ascm_os_release(base, size)
        return n

    def close(self):
        _Upstream.close(self)
        while self._quarantine:
            base, size = self._quarantine.pop()
            C.ascm_os_release(base, size)

    def _release(self, int k, uint64_t base, uint64_t size):
        C.ascm_os_release(base, size)


def upstream(uint64_t device_id, acl_module):
    """The registry's maker (_backends.py)."""
    return _HostUpstream()
