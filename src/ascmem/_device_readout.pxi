# The reading half of a Device's public API: what it holds and how it is
# doing (queries, budget, statistics, check).  A base class of Device, so
# that each stays a class one can read at a sitting; it holds the fields
# both use.  Included by _core.pyx after _device_parts.pxi.


cdef class _DeviceReadout:
    """Queries and statistics of a Device (see Device)."""

    # ---- queries --------------------------------------------------------------

    def kind_of(self, ptr):
        """The MemKind of the range ptr lies in."""
        cdef uint64_t a = as_u64(ptr, "pointer")
        _require_open(self, "kind_of")
        cdef int k = ascm_device_kind_of(self._d, a)
        if k < 0:
            raise InvalidArgumentError(f"{a:#x} is not memory of device {self.device_id}")
        return MemKind(k)

    def usable_size(self, ptr):
        """The size a live block was given after the CANN rounding rule (with
        ASCMEM_DEBUG=1, the size asked for: the guard bytes follow it)."""
        cdef uint64_t a = as_u64(ptr, "pointer"), n
        _require_open(self, "usable_size")
        cdef ascm_pool *p = ascm_device_pool_at(self._d, a, NULL)
        if p is NULL or ascm_pool_requested_size(p, a, &n) != ASCM_OK:
            raise InvalidFreeError(f"{a:#x} is not the start of a live block")
        guards = (<_DeviceParts>self._parts).guards
        return n if guards is None else guards.requested(a, n)

    def chunks(self, kind):
        """(base, size) of each chunk a kind holds now, first one first."""
        cdef int k = _kind_arg(kind)
        cdef uint64_t base, size
        out = []
        for i in range(ascm_device_chunk_count(self._d, k)):
            ascm_device_chunk(self._d, k, i, &base, &size)
            out.append((base, size))
        return out

    def range_of(self, kind):
        """(base, size) of a kind's first chunk, or None."""
        cdef int k = _kind_arg(kind)
        cdef uint64_t base, size
        if ascm_device_chunk(self._d, k, 0, &base, &size) is NULL:
            return None
        return (base, size)

    def route(self, size, policy=0, call="malloc"):
        """Where a request would go, without allocating: the size the runtime
        is asked for (CANN's rounding), the start alignment, the tail left
        after the block, and the kinds tried in order.  call: malloc,
        malloc_align32, dvpp_malloc or malloc_host."""
        cdef ascm_route r
        modes = {"malloc": ASCM_SIZE_MALLOC, "malloc_align32": ASCM_SIZE_ALIGN32,
                 "dvpp_malloc": ASCM_SIZE_DVPP, "malloc_host": ASCM_SIZE_HOST}
        if not isinstance(call, str) or call not in modes:
            raise InvalidArgumentError(f"route: call must be one of {', '.join(modes)}, "
                                       f"not {call!r}")
        cdef int st = ascm_device_route(self._d, as_u64(size, "size"), _policy(policy), modes[call],
                                        &r)
        if st != ASCM_OK:
            _raise(st, f"route({size}, {policy!r}, {call!r}): {ascm_status_str(st).decode()}")
        return {"rounded": r.rounded, "align": r.align, "pad": r.pad,
                "kinds": [MemKind(r.kinds[i]) for i in range(r.nkinds)]}

    def precautions(self):
        """The CANN memory precautions of this product and mode, as sentences."""
        return _profiles.precautions(self.profile, self.mode)

    def get_mem_info(self, attr):
        """aclrtGetMemInfo: (free, total) in bytes for an aclrtMemAttr value,
        as the runtime answers it (rules.mem_info: DDR chips answer HBM
        attributes with DDR figures; an unknown attribute raises
        InvalidMemoryTypeError, 107016; a 1 GiB-page one where there are no
        1 GiB pages UnsupportedError, 207000)."""
        prof = self.profile
        return _rules.mem_info(attr, self.budget(), prof.memory_type, prof.p2p, prof.huge1g)

    # ---- budget ---------------------------------------------------------------

    def budget(self):
        """The physical budget: bytes of huge and normal pages in use."""
        cdef ascm_budget b
        ascm_device_budget(self._d, &b)
        return {"reserve": b.reserve, "shared": b.shared, "total": b.reserve + b.shared,
                "huge_used": b.huge_used, "normal_used": b.normal_used, "fixed": b.fixed,
                "peak_huge": b.peak_huge, "peak_normal": b.peak_normal,
                "ep_growth": b.huge_used - b.reserve if b.huge_used > b.reserve else 0,
                "limit": b.limit, "huge_grows": bool(b.huge_grows)}

    def get_limit(self):
        """The cap set by set_limit / set_memory_fraction, in bytes (0: none)."""
        return self.budget()["limit"]

    def get_memory_fraction(self):
        """The cap as a fraction of the device's total memory (1.0: no cap)."""
        b = self.budget()
        return min(1.0, b["limit"] / b["total"]) if b["limit"] and b["total"] else 1.0

    # ---- observability ----------------------------------------------------------

    def reset_peaks(self):
        """Peak statistics start again from current use."""
        ascm_device_reset_peaks(self._d)

    def reset_peak_memory_stats(self):
        """PyTorch's name for reset_peaks()."""
        ascm_device_reset_peaks(self._d)

    def memory_stats(self):
        """stats() under torch.cuda.memory_stats()'s flat key names
        (allocated_bytes.all.current, reserved_bytes.large_pool.peak,
        num_ooms, ...; ascmem.stats says how the pools map)."""
        from ascmem import stats
        return stats.memory_stats(self)

    def memory_summary(self):
        """memory_stats() as a table in the shape of torch.cuda.memory_summary()."""
        from ascmem import stats
        return stats.memory_summary(self)

    # torch.cuda's (and torch.npu's) names for the same figures; device:
    # None or this device's id, as torch takes the device to read

    def _torch_device(self, device):
        if device is not None and device != self.device_id:
            raise InvalidArgumentError(f"this is device {self.device_id}, not {device!r}")

    def memory_allocated(self, device=None):
        """Bytes in live blocks of device memory: allocated_bytes.all.current."""
        self._torch_device(device)
        from ascmem import stats
        return stats.allocated_and_reserved(self)[0]

    def max_memory_allocated(self, device=None):
        """The peak of memory_allocated() since the last reset_peak_memory_stats()."""
        self._torch_device(device)
        from ascmem import stats
        return stats.allocated_and_reserved(self)[1]

    def memory_reserved(self, device=None):
        """Bytes of pages the device holds: reserved_bytes.all.current."""
        self._torch_device(device)
        from ascmem import stats
        return stats.allocated_and_reserved(self)[2]

    def max_memory_reserved(self, device=None):
        """The peak of memory_reserved() since the last reset_peak_memory_stats()."""
        self._torch_device(device)
        from ascmem import stats
        return stats.allocated_and_reserved(self)[3]

    def mem_get_info(self, device=None):
        """(free, total) bytes of the device's memory, as torch.npu.mem_get_info
        reads them: aclrtGetMemInfo(ACL_HBM_MEM), which a DDR chip answers
        with its DDR figures (get_mem_info)."""
        self._torch_device(device)
        return self.get_mem_info(_rules.MemAttr.HBM_MEM)

    def stats(self):
        """Per kind: the pool's statistics; plus the budget and reuse counters."""
        cdef _DeviceParts parts = <_DeviceParts>self._parts
        cdef ascm_stats s
        out = {}
        for k in range(ASCM_KINDS):
            if ascm_device_has_kind(self._d, k):
                ascm_device_kind_stats(self._d, k, &s)
                d = _stats_dict(&s)
                if parts.paged and ascm_kind(k).freed_by == ASCM_FREE_DEVICE:
                    d.update(mapped=s.mapped, peak_mapped=s.peak_mapped, map_calls=s.map_calls,
                             unmap_calls=s.unmap_calls,
                             release_threshold=ascm_device_kind_release_threshold(self._d, k))
                d["chunks"] = ascm_device_chunk_count(self._d, k)
                d.update(parts.growth.kind_stats(k))
                out[MemKind(k).name.lower()] = d
        b = self.budget()
        out["device"] = dict(b, aicpu_cache=parts.fixed_taken,
                             reserve_used=min(b["huge_used"], b["reserve"]),
                             reused_bytes=parts.reused_bytes, reuse_count=parts.reuse_count,
                             pending_bytes=parts.ledger.pending_bytes, closed=parts.closed,
                             asleep_bytes=parts.tags.asleep_bytes(self._d),
                             **parts.counters)
        if parts.tags.cost_of:  # only once align_tag was used: other readers see kinds as before
            out["aligned"] = _alignment_stats(parts.tags)
        return out

    def snapshot(self):
        """Live blocks: dicts of address, size (usable), requested (after the
        CANN rounding) and kind, in address order."""
        blocks = []
        cdef ascm_pool *p
        for k in range(ASCM_KINDS):
            kind = MemKind(k)
            for i in range(ascm_device_chunk_count(self._d, k)):
                p = ascm_device_chunk(self._d, k, i, NULL, NULL)
                if p is not NULL:
                    blocks.extend({"address": a, "size": u, "requested": r, "kind": kind}
                                  for a, u, r in _pool_blocks(p, False))
        blocks.sort(key=lambda b: b["address"])
        return blocks

    def segments(self):
        """Memory the device holds now: dicts of address, size and kind, one
        per run of whole pages under live blocks or slabs (and kept granules
        of a paged kind), in address order.  Their sizes add up to each kind's
        pages in use (mapped bytes, paged): memory_stats' reserved_bytes, and
        the segments of a PyTorch snapshot (ascmem.snapshot)."""
        runs = []
        cdef ascm_pool *p
        for k in range(ASCM_KINDS):
            kind = MemKind(k)
            for i in range(ascm_device_chunk_count(self._d, k)):
                p = ascm_device_chunk(self._d, k, i, NULL, NULL)
                if p is not NULL:
                    runs.extend({"address": a, "size": n, "kind": kind}
                                for a, n, _ in _pool_held(p))
        runs.sort(key=lambda r: r["address"])
        return runs

    def check(self):
        """Walks every pool's invariants, the chunk accounting and the page
        budget; raises CorruptionError naming a broken one."""
        cdef char msg[MSG_LEN]
        cdef ascm_pool *p
        cdef ascm_stats s
        cdef _DeviceParts parts = <_DeviceParts>self._parts
        cdef uint64_t charged, held
        for k in range(ASCM_KINDS):
            for i in range(ascm_device_chunk_count(self._d, k)):
                p = ascm_device_chunk(self._d, k, i, NULL, NULL)
                if p is not NULL and ascm_pool_check(p, msg, MSG_LEN) != ASCM_OK:
                    raise CorruptionError(f"{MemKind(k).name} chunk {i}: " +
                                          msg.decode("utf-8", "replace"))
            if not ascm_device_has_kind(self._d, k):
                continue
            if parts.up.holds_memory and not parts.closed:
                problem = parts.growth.accounting_problem(k, self.chunks)
                if problem:
                    raise CorruptionError(problem)
        if parts.mapper is not None:  # acl, paged: a runtime handle under every mapped granule
            with parts.map_lock():  # held by every call that maps or unmaps
                mapped = 0
                for k in range(ASCM_KINDS):
                    ascm_device_kind_stats(self._d, k, &s)
                    mapped += s.mapped
                if parts.mapper.mapped_bytes != mapped:
                    raise CorruptionError(f"{parts.mapper.mapped_bytes} bytes of runtime memory "
                                          f"are mapped, {mapped} are counted as mapped")
        ascm_device_huge_pages(self._d, &charged, &held)  # one moment, whatever other threads do
        if charged != held:
            raise CorruptionError(f"huge pages charged {charged} != pages in use {held}")

    @property
    def paged(self):
        """Whether the device memory kinds are paged pools (Device(paged=True))."""
        return (<_DeviceParts>self._parts).paged
