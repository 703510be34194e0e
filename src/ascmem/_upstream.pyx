# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: binding=False
"""The backend contract: what an upstream -- where a Device's chunks come
from and where they go back, and the runtime's view of streams -- provides
(the role of RMM's upstream device_memory_resource).  Each backend is a
module of its own (_backend_sim.pyx, _backend_host.pyx, _backend_acl.pyx)
with a subclass of _Upstream; the registry (_backends.py) names them.  This
module needs nothing of the C core: ascmem._core cimports it."""
#
# The protocol: first_chunks (each kind's first chunk, all or nothing), take
# and give (one chunk), retire (a chunk a reset let go), close; readable
# (the host can touch the memory); record_event / event_done / destroy_event
# / synchronize (a runtime's streams; without one, events are None and the
# Device's own sequence numbers order frees).  Growth -- how much a kind has
# taken, its maximum, when idle chunks go back -- is _Growth's (_growth.pyx).
#
# What a Device may ask of its backend is declared here as the upstream's
# capabilities, set by each class and read by the Device instead of the
# backend's name:
#   holds_memory   chunks are memory, not only address ranges: a pool can grow
#                  from them and give idle ones back, and their accounting is checked
#   readable       the host can read and write the memory (views, sleep's saved bytes)
#   from_runtime   chunks, events and mappings are the Ascend runtime's: the layout
#                  is sized by it, and a child of fork() must disown them
#   paging         how a paged pool's granules are mapped: "counted" (nothing is
#                  mapped; the runtime's 2 MB granule is kept), "os" (mmap), or
#                  "runtime" (the VMM calls through pyACL)
#   chunk_alignment  what every chunk's start is aligned to (0: only what the
#                  runtime handed out, read from the chunks)
#   sharing        how blocks are shared between processes (ascmem.ipc):
#                  "local" (keys and addresses tracked in this process), "os"
#                  (a memfd per block, handed over a Unix socket), or "runtime"
#                  (aclrtIpcMem* through pyACL)
# A backend is its module (an _Upstream subclass setting these, and
# upstream(device_id, acl_module) making one), one line of the registry
# (_backends.py) and one line of the contract test (tests/test_backends.py).
#
# An upstream owns every chunk it handed out until it takes it back, and
# gives them all back when it is closed or collected -- whatever happened to
# the Device.  That is what keeps memory from leaking when a Device dies in a
# reference cycle (the collector clears the Device's fields before its
# deallocation runs, so the Device cannot be relied on to clean up) or when
# its constructor fails half-way.

cimport cython

from ascmem.errors import AscmemError, UnsupportedError

# How the OS backed a host chunk (_Upstream.pages), for Device.pages().
_OS_PAGES = {ASCM_OS_NORMAL: "normal pages", ASCM_OS_THP: "transparent huge pages (advised)",
             ASCM_OS_HUGETLB: "explicit huge pages (MAP_HUGETLB)"}


cdef extern from "Python.h":
    void PyObject_GC_UnTrack(object o)


cdef list _uncollectable_list():
    """An empty list the cycle collector does not track.  The collector
    clears every container it finds unreachable, in an order of its own:
    a Device in a cycle could find its upstream's record of chunks emptied
    by the time the upstream gave them back -- a segmentation fault (the
    record indexed by kind) or leaked chunks.  A list CPython does not
    track is never cleared, and a list stays untracked when items are added
    (only dicts track themselves again).  What these lists hold -- tuples of
    integers -- cannot be part of a cycle."""
    cdef list l = []
    PyObject_GC_UnTrack(l)
    return l


class UpstreamError(AscmemError):
    """The upstream (the OS, the Ascend runtime) refused a chunk; ``code`` is
    the runtime's."""


@cython.no_gc_clear  # close() must find the chunks whenever it runs (see above)
cdef class _Upstream:
    """The chunks a device holds, per kind, as (base, size) in the order taken,
    and the defaults of the protocol: no events, nothing to wait for, nothing
    quarantined.  A backend's class sets its name and capabilities in
    __cinit__ and provides first_chunks (and take, _release where it holds
    memory).

    Every field a backend's close() or _release reads lives here (_upstream.pxd),
    none in the subclasses: the base class's deallocation runs close(), which
    must still find them (Cython clears a subclass's fields before the base's
    __dealloc__ runs).  The garbage collector may not clear them either
    (no_gc_clear): collecting a Device in a cycle collects everything only it
    reaches, this included, and a cleared list of chunks would leak them.  Nor
    the lists themselves: they are not tracked by the collector
    (_uncollectable_list).  Nothing here refers back to a Device, so no cycle
    runs through an upstream."""

    def __cinit__(self, *args, **kwargs):
        self.held = _uncollectable_list()
        for _ in range(ASCM_KINDS):
            self.held.append(_uncollectable_list())
        self.paging = "counted"
        self.sharing = "local"
        self.pages = {}
        self._quarantine = _uncollectable_list()
        self.paged_kinds = frozenset()

    def first_chunks(self, sizes):
        """Each kind's first chunk (size 0: none, base 0), all or nothing: if
        one is refused, the ones taken here go back and the error is raised."""
        raise NotImplementedError(f"{type(self).__name__}.first_chunks")

    def take(self, int k, uint64_t size):
        """One chunk: its base.  Raises UpstreamError if refused."""
        raise UnsupportedError(f"the {self.name} backend takes no memory from an upstream")

    def give(self, int k, uint64_t base, uint64_t size):
        """Gives one chunk back."""
        self.held[k].remove((base, size))
        self._release(k, base, size)

    def retire(self, int k, uint64_t base, uint64_t size):
        """Gives a chunk back after a reset; pointers into it must stay
        foreign to the device (see the host upstream)."""
        self.give(k, base, size)

    def drop_quarantine(self):
        return 0

    def describe(self, e):
        """Why a take failed, for messages."""
        return str(e)

    # streams: without a runtime there are no events (None) and nothing to wait for
    def record_event(self, stream):
        """An event recorded on stream now, or None."""
        return None

    def event_done(self, ev):
        """The stream of ev has passed it."""
        return False

    def destroy_event(self, ev):
        pass

    def synchronize(self, stream):
        """Waits for the work queued on stream; raises if the runtime fails."""

    def close(self):
        """Gives every chunk back; idempotent."""
        for k, ranges in enumerate(self.held):  # not indexed: never past its end
            while ranges:
                base, size = ranges.pop()
                self._release(k, base, size)

    def _release(self, int k, uint64_t base, uint64_t size):
        pass

    def __dealloc__(self):
        try:
            self.close()
        except BaseException:  # nothing may escape a destructor
            pass


@cython.no_gc_clear
cdef class _RealUpstream(_Upstream):
    """An upstream with memory behind its chunks (host, acl)."""

    def first_chunks(self, sizes):
        got = [0] * ASCM_KINDS
        try:
            for k in range(ASCM_KINDS):
                if sizes[k]:
                    got[k] = self.take(k, sizes[k])
        except BaseException:
            for k in range(ASCM_KINDS):
                if got[k]:
                    self.give(k, got[k], sizes[k])
            raise
        return got


