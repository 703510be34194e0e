# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: binding=False
"""A Device's stream ledger: blocks freed on a stream wait until the streams
that may still use them are past the free.  Cimported by ascmem._core
(_streams.pxd); the C core through its table (CoreCalls)."""
#
# The ledger only keeps the books.  Whatever becomes free is handed back to
# the Device as (address, kind mask) pairs to free, after the books are
# finished: a free may wait (the GIL released) for a reset in another thread,
# and that thread must find consistent books.

cimport cython

from ascmem._core cimport ASCM_OK, CoreCalls, ascm_device, ascm_pool, ascm_route, core_calls

cdef const CoreCalls *C = core_calls()


@cython.final
cdef class _PendingBlock:
    """A block freed on one or more streams, waiting for their work."""

    def __repr__(self):
        return (f"<pending block {self.addr:#x} {self.nbytes} bytes, seq {self.seq}, "
                f"{len(self.holders)} stream(s)>")


@cython.final
cdef class _StreamLedger:
    """Pending blocks per stream and per address, the streams record_stream
    added to live blocks, and the sequence numbers events compare against."""

    def __cinit__(self, _Upstream up):
        self.pending = {}
        self.by_addr = {}
        self.recorded = {}
        self.up = up

    cdef void _recount(self):
        self.tracked = len(self.by_addr) + len(self.recorded)

    cdef bint waits(self, uint64_t addr):
        """addr was freed and waits on a stream."""
        return addr in self.by_addr

    cdef record(self, uint64_t addr, object stream):
        self.recorded.setdefault(addr, set()).add(stream)
        self._recount()

    cdef bint defer(self, uint64_t addr, unsigned mask, object stream, uint64_t nbytes, int kind):
        """A free of a live block: if stream, or streams record_stream added,
        may still use it, it waits for them (True); else the caller frees it
        now (False)."""
        holders = self.recorded.pop(addr, set())
        if stream is not None:
            holders.add(stream)
        if not holders:
            self._recount()
            return False
        self.seq += 1
        cdef _PendingBlock b = _PendingBlock()
        b.addr, b.mask, b.holders, b.seq, b.nbytes, b.kind, b.events = \
            addr, mask, holders, self.seq, nbytes, kind, {}
        self.by_addr[addr] = b
        self.pending_bytes += nbytes
        for s in holders:
            self.pending.setdefault(s, []).append(b)
            ev = self.up.record_event(s)  # the runtime tells when s is past the free
            if ev is not None:
                b.events[s] = ev
        self._recount()
        return True

    cdef list streams(self):
        return list(self.pending)

    cdef list release(self, object stream, uint64_t upto):
        """Stream is done with its blocks freed up to sequence number upto
        (_ALL: every one): the (address, mask) of those no stream holds now."""
        blocks = self.pending.get(stream)
        if not blocks:
            return []
        keep = []
        to_free = []
        cdef _PendingBlock b
        for b in blocks:
            if b.seq > upto:
                keep.append(b)
            elif self._let_go(b, stream):
                to_free.append((b.addr, b.mask))
        if keep:
            self.pending[stream] = keep
        else:
            del self.pending[stream]
        self._recount()
        return to_free

    cdef bint _let_go(self, _PendingBlock b, object stream):
        """stream no longer holds b; True if no stream does."""
        b.holders.discard(stream)
        ev = b.events.pop(stream, None)
        if ev is not None:
            self.up.destroy_event(ev)
        if b.holders:
            return False
        del self.by_addr[b.addr]
        self.pending_bytes -= b.nbytes
        return True

    cdef list completed(self):
        """Asks the upstream which streams are past the frees that wait on
        them (acl: aclrtQueryEventStatus): the (address, mask) of the blocks
        no stream holds now."""
        to_free = []
        cdef _PendingBlock b
        for b in list(self.by_addr.values()):
            for s, ev in list(b.events.items()):
                if not self.up.event_done(ev):
                    continue
                blocks = self.pending.get(s)
                if blocks is None or b not in blocks:
                    continue
                blocks.remove(b)
                if not blocks:
                    del self.pending[s]
                if self._let_go(b, s):
                    to_free.append((b.addr, b.mask))
        self._recount()
        return to_free

    cdef uint64_t reuse(self, ascm_device *d, object stream, uint64_t n, uint32_t policy,
                        int mode) except? 0:
        """Same-stream reuse: a block this stream alone freed, that a fresh
        request would get in the same size, is handed back as it is -- it
        never becomes free, so no other stream can get it while this stream's
        queued work may still use it.  0: none fits."""
        cdef ascm_route r
        cdef ascm_pool *p
        cdef _PendingBlock b
        blocks = self.pending.get(stream)
        if not blocks or C.ascm_device_route(d, n, policy, mode, &r) != ASCM_OK:
            return 0
        kinds = tuple(r.kinds[i] for i in range(r.nkinds))
        for b in blocks:
            if b.kind not in kinds or len(b.holders) != 1:
                continue
            p = C.ascm_device_pool_at(d, b.addr, NULL)
            if p is NULL or C.ascm_pool_relabel(p, b.addr, r.rounded, r.pad, r.align) != ASCM_OK:
                continue
            blocks.remove(b)
            if not blocks:
                del self.pending[stream]
            self._let_go(b, stream)
            self._recount()
            return b.addr
        return 0

    cdef drop_events(self):
        """The upstream events of frees that will never be waited for (reset,
        close)."""
        cdef _PendingBlock b
        for b in self.by_addr.values():
            for ev in b.events.values():
                self.up.destroy_event(ev)
            b.events.clear()

    cdef clear(self):
        """Forgets every block (a reset freed them all)."""
        self.drop_events()
        self.pending.clear()
        self.by_addr.clear()
        self.recorded.clear()
        self.pending_bytes = 0
        self._recount()
