# Device: the public front of an Ascend device (included by _core.pyx, so
# that its hot path is compiled with the pools').  Allocation, streams, sleep
# and wake, host memory, budget settings and lifetime live here; the queries
# and statistics in its base class (_device_readout.pxi); its state and the
# helpers in _device_parts.pxi; the one allocate and one free path in
# _device_paths.pxi.
#
# Threads and locks: no C lock holder ever waits for the GIL (walks gather
# into C memory, hooks run with no lock held), so a thread holding the GIL
# may spin on a pool lock.  Callers without the GIL pass the C device's gate;
# reset and close shut it, without the GIL, before they free anything.  The
# methods here hold the GIL, which reset and close also hold while they free
# (ascm_device_reset never releases it), so they use the *_held calls and
# skip the gate's two atomic operations per call.


@cython.final
cdef class Device(_DeviceReadout):
    """Device(model='atlas-inference', *, mode=None, backend='sim', device_id=0, memory=None, free_os_memory=None, aicpu_cache=None, host_memory=4294967296, limit=None, pool_sizes=None, acl_module=None, paged=False, release_threshold=0, release_threshold_max=None, thread_caches=None, placement=None, min_block=4096, slab_max=None)
--

    An Ascend device: one pool per memory kind, one physical budget, the
    CANN rules.

    ``model``: a profile name or alias (``ascmem.profiles.names()``,
    ``ascmem info --list``).
    ``mode``: "EP" or "RC" (default: the product's first).
    ``backend``: "sim" (addresses only), "host" (real memory from mmap) or
    "acl" (chunks from the CANN runtime through pyACL).
    ``device_id``: the device's number (simulated ranges of different ids never
    overlap; the pluggable functions use it as the device index).
    ``memory`` / ``free_os_memory``: override the profile's bytes.
    ``aicpu_cache``: bytes the first job takes on products that cache AI CPU
    operators (default: the upper bound).
    ``host_memory``: size of the host (aclrtMallocHost) pool.
    ``limit``: cap on huge + normal + runtime memory in bytes (as set_limit).
    ``pool_sizes``: host and acl backends: the bytes each kind takes from its
    upstream, ``{"normal": size}``, or ``{"normal": (initial, maximum)}`` for a
    pool that grows by chunks (at least 2 MiB each).
    ``acl_module``: the pyACL module to use with backend="acl" (default:
    ``import acl``).
    ``paged``: the device memory kinds freed by free() (huge, normal,
    huge1g) become virtual ranges with physical memory mapped in granules of
    the kind's page only where live blocks are; the budget counts mapped
    bytes.  Products with virtual memory management only (Atlas A2, A3);
    backends sim (counted) and host (PROT_NONE reservations, pages given back
    to the OS on unmap).
    ``release_threshold``: with paged, bytes of free granules each kind keeps
    mapped for reuse (trimmed by empty_cache()); 0 (the default) keeps none,
    spare slabs included.  Refused without paged.
    ``release_threshold_max``: with paged, the threshold adapts between
    ``release_threshold`` and this many bytes per kind, as
    ``Pool(release_threshold_max=...)``: memory given back and mapped again
    soon after raises it, kept memory a period of allocations did not need
    lowers it.  None (the default): fixed.  ``stats()[kind]['release_threshold']``
    is the threshold now.
    ``thread_caches``: "off", "on" or "auto" (from the first time two threads
    meet at a pool's lock): a cache of small blocks per thread in front of
    each kind's pools but the media window's, as ``Pool(thread_caches=...)``, for callers that
    allocate without the GIL (the pluggable allocator, ``cimport``, the C
    API).  Statistics, ``check()`` and walks flush them first.  Not with
    ``paged``.  The default (None) is "auto", "off" with ``paged``.
    ``placement``: where each kind's pools place blocks, as
    ``Pool(placement=...)``, for the pools of chunks added later and after a
    reset too.  With paged, blocks of a granule or more: "granules" (the
    default), "packed" or "best-fit" (``ascmem.trace.choose_placement`` picks
    one from a recorded run).  Without paged, a request of the last large block freed's
    size, for every pool of every kind: "kept-in-place" (the default),
    "kept-to-best-fit", "lowest-equal" or "best-fit-end-last"
    (``ascmem.trace.choose_contiguous_placement`` picks one).  A placement of
    the other kind is refused; ``placement`` is the one in use.
    ``min_block``: the unit of every pool's large blocks and slabs, as
    ``Pool(min_block=...)``: a power of two from 512 to 4096 (the default).
    A smaller unit changes the holes best fit leaves and so the placement;
    ``ascmem.trace.choose_contiguous_plan`` and ``ascmem plan`` pick one
    with the placement from a recorded run.
    ``slab_max``: the largest request every pool serves from slabs, as
    ``Pool(slab_max=...)``: 0 places every block by best fit; None (the
    default) is 32 KiB.  The plans choose it with the placement and unit.

    ``with Device(...) as dev:`` closes the device at the end.
    """

    def __cinit__(self, model="atlas-inference", *, mode=None, backend="sim", device_id=0,
                  memory=None, free_os_memory=None, aicpu_cache=None, host_memory=4 << 30,
                  limit=None, pool_sizes=None, acl_module=None, paged=False, release_threshold=0,
                  release_threshold_max=None, thread_caches=None, placement=None,
                  min_block=4096, slab_max=None):
        self._d = NULL
        placement = _placement_of(placement, paged, "give paged=True")
        cdef uint64_t unit = _device_unit(min_block)
        cdef uint64_t slabs_upto = SLAB_MAX if slab_max is None else as_u64(slab_max, "slab_max")
        thread_caches = _default_caches(thread_caches, paged)
        caches = _caches_mode(thread_caches)
        if paged and caches != ASCM_CACHES_OFF:
            raise UnsupportedError("thread_caches with paged=True: a paged device's caches are not "
                                   "built (a cache's flush may unmap granules outside an allocation)")
        self.profile = _profiles.get(model)
        self.mode = _profiles.mode_of(self.profile, mode)
        if not isinstance(backend, str) or backend not in _BACKENDS:
            raise InvalidArgumentError(f"unknown backend {backend!r}; known: {', '.join(_BACKENDS)}")
        self.backend = backend
        cdef uint64_t did = as_u64(device_id, "device_id")
        if did >= (<uint64_t>1 << (64 - _DEVICE_SHIFT)) - 1:
            raise InvalidArgumentError(f"device_id {device_id} is too large")
        self.device_id = <int>did
        # the upstream holds nothing before its first chunks (configure, below)
        # and gives back every chunk it handed out when it is collected: a
        # constructor that fails below loses nothing
        cdef _Upstream up = _make_upstream(backend, did, acl_module)
        lay = _profiles.layout(self.profile, self.mode, memory=_opt_u64(memory, "memory"),
                               free_os_memory=_opt_u64(free_os_memory, "free_os_memory"),
                               aicpu_cache=_opt_u64(aicpu_cache, "aicpu_cache"),
                               host_memory=as_u64(host_memory, "host_memory"),
                               limit=_opt_u64(limit, "limit"),
                               runtime_sized=up.from_runtime and not pool_sizes)
        cdef _DeviceParts parts = _DeviceParts(up, lay.sizes, lay.aicpu_cache)
        self._parts = parts
        if pool_sizes:
            parts.growth.set_pool_sizes(pool_sizes)
        cdef ascm_device_config cfg
        _budget_config(&cfg, self.profile, lay, self.mode)
        cfg.min_block = unit
        # checked whether paged or not: a bad value is refused, never ignored (issue 45.12)
        cdef uint64_t threshold = as_u64(release_threshold, "release_threshold")
        if threshold and not paged:
            raise InvalidArgumentError("release_threshold applies to paged devices: give "
                                       "paged=True")
        cfg.release_threshold_max = _release_cap(release_threshold_max, threshold, paged,
                                                 "devices: give paged=True")
        if paged:
            _paged_config(&cfg, self, parts, threshold)
        parts.growth.configure(&cfg)  # takes the first chunks
        if ascm_device_create(&cfg, &self._d) != ASCM_OK:
            raise OutOfMemoryError("host memory for the device's metadata ran out")
        parts.growth.bind(self._d)
        if parts.mapper is not None:
            parts.mapper.d = self._d
        if ascm_device_set_thread_caches(self._d, caches) != ASCM_OK:
            raise InvalidArgumentError(f"thread_caches: {thread_caches!r}")  # refused above already
        self.thread_caches = thread_caches
        if ascm_device_set_placement(self._d, _PLACEMENTS[placement]) != ASCM_OK:
            raise InvalidArgumentError(f"placement: {placement!r}")  # refused above already
        ascm_device_set_slab_max(self._d, slabs_upto)
        _live_devices.add(self)

    def __reduce__(self):
        raise _not_picklable(self, "its memory and runtime belong to this process")

    @property
    def placement(self):
        """The placement of the device's pools (``placement`` above), read
        from the C device: one an embedder set through the capsule included."""
        return _PLACEMENT_NAMES[ascm_device_placement(self._d)] if self._d is not NULL else None

    @property
    def slab_max(self):
        """The largest request the device's pools serve from slabs
        (``slab_max`` above), read from the C device."""
        return ascm_device_slab_max(self._d) if self._d is not NULL else None

    @property
    def min_block(self):
        """The unit of the device's pools (``min_block`` above)."""
        return ascm_device_min_block(self._d) if self._d is not NULL else None

    def __dealloc__(self):
        # In a reference cycle the collector may have cleared _parts (None)
        # before this runs; the parts then gave the chunks back when they
        # were collected.
        cdef _DeviceParts parts = self._parts
        cdef ascm_pool *p
        if self._d is not NULL and ascm_device_handed_out(self._d) != 0:
            # C callers still hold blocks (torch tensors freed later, at
            # interpreter exit perhaps): the device and its memory stay for
            # their frees, as a leak, rather than a use after free
            _orphans.append(parts)
            return
        if self._d is not NULL:
            # the collector may have cleared the ledger's own fields (None)
            warn = parts is not None and not parts.closed and not parts.ledger.by_addr
            for k in range(ASCM_KINDS):
                for i in range(ascm_device_chunk_count(self._d, k)):
                    p = ascm_device_chunk(self._d, k, i, NULL, NULL)
                    if p is not NULL and warn:
                        _warn_leaks(f"Device {self.device_id}", p, MemKind(k).name)
            if parts is not None and parts.mapper is not None:
                parts.mapper.d = NULL  # what the mapper still does (release_all) needs no kind
            ascm_device_destroy(self._d)
            self._d = NULL
        if parts is not None:
            try:
                parts.give_back()
            except Exception:
                pass

    # ---- hot path -------------------------------------------------------------

    cdef int malloc_raw(self, uint64_t size, uint32_t policy, uint64_t *addr) noexcept nogil:
        cdef int kind, events
        return ascm_device_malloc(self._d, size, policy, ASCM_SIZE_MALLOC, addr, &kind, &events)

    cdef int free_raw(self, uint64_t addr) noexcept nogil:
        cdef int kind
        return ascm_device_free(self._d, addr, _DEVICE_MASK, &kind)

    def malloc(self, size, policy=0, stream=None, tag=None):
        """aclrtMalloc: ALIGN_UP(size, 32) + 32 bytes at a 64-byte boundary.
        With a stream, a block that stream alone freed, of the size this
        request gets, is handed back at once.  With a tag, the block joins
        that group for sleep() and wake()."""
        return _malloc(self, size, policy, stream, tag, ASCM_SIZE_MALLOC)

    def malloc_align32(self, size, policy=0, stream=None, tag=None):
        """aclrtMallocAlign32: ALIGN_UP(size, 32) bytes at a 64-byte boundary."""
        return _malloc(self, size, policy, stream, tag, ASCM_SIZE_ALIGN32)

    def _malloc_mapped(self, size, uint64_t granule):
        """A block of whole granules the runtime maps, on a granule boundary
        and with no sub-allocation tail after it: what a stream-ordered pool
        takes from the device (its memory is mapped in 2 MB granules,
        hicann/runtime stream_mem_pool.cc 172, 193), so that the device
        charges what the pool counts."""
        return _alloc(self, size, 0, ASCM_SIZE_MAPPED, None, None, "malloc_align32", -1, 0, -1, 0,
                      granule)

    def dvpp_malloc(self, size, stream=None):
        """acldvppMalloc: ALIGN_UP(size, 32) + 32 bytes of huge-page memory in the
        media window, at a 128-byte boundary."""
        # a few calls per frame: the general path (it makes the one try), not
        # the inline first try of malloc, which runs per tensor
        return _alloc(self, size, 0, ASCM_SIZE_DVPP, stream, None, "dvpp_malloc", -1, 0, -1, 0)

    def malloc_host(self, size):
        """aclrtMallocHost: host memory at a 64-byte boundary."""
        return _alloc(self, size, 0, ASCM_SIZE_HOST, None, None, "malloc_host", -1, 0, -1, 0)

    def free(self, ptr, stream=None):
        """aclrtFree for malloc/malloc_align32 memory.  With a stream (or after
        record_stream), the block waits until the streams' work is done."""
        _device_free(self, ptr, _DEVICE_MASK, stream, "free")

    def dvpp_free(self, ptr, stream=None):
        """acldvppFree for dvpp_malloc memory."""
        _device_free(self, ptr, _DVPP_MASK, stream, "dvpp_free")

    def free_host(self, ptr):
        """aclrtFreeHost for malloc_host memory."""
        _device_free(self, ptr, _HOST_MASK, None, "free_host")

    # ---- streams ----------------------------------------------------------------

    def _guard(self, ptr):
        """For ascmem's own Python layers that keep a block for later (the
        stream pools): the GIL-free frees refuse it until Device.free frees it."""
        _guard(self, as_u64(ptr, "pointer"))

    def record_stream(self, ptr, stream):
        """Marks a live block as also used by stream: when freed, it waits for
        that stream too (as PyTorch's Tensor.record_stream)."""
        cdef uint64_t a = as_u64(ptr, "pointer"), n
        cdef _DeviceParts parts = <_DeviceParts>self._parts
        _require_open(self, "record_stream")
        _check_stream(stream)
        cdef ascm_pool *p = ascm_device_pool_at(self._d, a, NULL)
        if p is NULL or parts.ledger.waits(a) or ascm_pool_usable_size(p, a, &n) != ASCM_OK:
            raise InvalidFreeError(f"{a:#x} is not a live block of device {self.device_id}")
        _guard(self, a)
        parts.ledger.record(a, stream)

    def synchronize(self, stream=None):
        """The work queued on stream (every stream when None) is done: blocks
        waiting on it become free (acl: after aclrtSynchronizeStream)."""
        cdef _DeviceParts parts = <_DeviceParts>self._parts
        _require_open(self, "synchronize")
        if stream is not None:
            _check_stream(stream)
        if stream is None:
            parts.counters["sync_all_streams"] += 1
        for s in (parts.ledger.streams() if stream is None else [stream]):
            parts.up.synchronize(s)  # the stream's queued work first
            _free_released(self, parts.ledger.release(s, _ALL))

    def record_event(self, stream):
        """An event on stream; complete_event(ev) frees what the stream had
        freed before it was recorded (the acl backend maps stream frees onto
        aclrtRecordEvent / aclrtQueryEventStatus itself: process_events)."""
        _check_stream(stream)
        return (stream, (<_DeviceParts>self._parts).ledger.seq)

    def complete_event(self, event):
        """The stream of event has passed it: frees what the stream had freed
        before the event was recorded (nothing, if it had freed nothing)."""
        try:
            stream, upto = event
            upto = as_u64(upto, "event sequence")
        except (TypeError, ValueError):
            raise ArgumentTypeError(f"complete_event takes an event from record_event, not "
                                    f"{event!r}") from None
        _check_stream(stream)
        _free_released(self, (<_DeviceParts>self._parts).ledger.release(stream, upto))

    def process_events(self):
        """Asks the upstream (acl: aclrtQueryEventStatus) which streams are
        past the frees that wait on them, and frees those blocks.  Done on
        every allocation that would otherwise fail; call it to return memory
        sooner.  Returns the number of blocks freed."""
        cdef _DeviceParts parts = <_DeviceParts>self._parts
        if parts.closed:
            return 0
        done = parts.ledger.completed()
        _free_released(self, done)
        return len(done)

    # ---- sleep and wake (paged devices) --------------------------------------------

    def sleep(self, tag, keep=True):
        """Gives the physical memory of the blocks allocated with tag back
        (their granules are unmapped where no awake block shares them; budget
        and, on the host backend, resident memory drop) while they keep their
        addresses.  keep: save their contents in host memory for wake();
        False discards them.  Other tags go on allocating and freeing; a
        sleeping block may be freed; a view of one is refused.  Blocks in slab
        slots (requests up to 32 KiB less the 32 bytes the runtime's rule
        adds: 32,736 bytes through malloc) share slabs with other blocks and
        stay resident, contents in place.  Returns the bytes given back.
        The tag must be one some block was allocated with on this device (a
        mistyped one raises InvalidArgumentError); one with no block right
        now may sleep, and takes no new block until it wakes.  Needs
        Device(paged=True)."""
        return _sleep_tag(self, tag, keep)

    def wake(self, tag):
        """Maps a sleeping tag's blocks again at the same addresses and puts
        back the contents sleep(keep=True) saved.  All or nothing: if the
        device has no room, the tag stays asleep and OutOfMemoryError is
        raised.  Returns the bytes mapped."""
        return _wake_tag(self, tag)

    # ---- aligned groups, sharing between processes (_tags.pyx, ascmem/ipc.py) -------

    def align_tag(self, tag, alignment, *, shareable=False):
        """Every later block allocated with tag starts on a multiple of
        alignment (a power of two up to 1 GiB: 2 MiB for HCCL, 64 KiB...)
        and has a usable size that is a multiple of it; other tags' and
        untagged blocks are placed as before.  stats()["aligned"] and
        memory_stats() show what it costs.  shareable: its blocks can be
        exported (ipc_export); on the host backend they live in shared
        memory, which needs an alignment of at least the OS page.
        alignment None: later blocks of tag are placed as usual again."""
        _align_tag(self, tag, alignment, shareable)

    def ipc_export(self, ptr, size=None, *, pids=(), any_process=False):
        """aclrtIpcMemGetExportKey: a key (a str of at most 64 characters)
        another process passes to ipc_import to reach this live block's
        bytes (the first size of them; default all).  Only the processes in
        pids (and those ipc_allow adds) may import, unless any_process.  The
        block cannot be freed until ipc_close(key).  Host backend: the block
        must be of a shareable tag (align_tag)."""
        return _ipc_export(self, ptr, size, pids, any_process)

    def ipc_allow(self, key, pids):
        """aclrtIpcMemSetImportPid: more processes may import key."""
        _require_open(self, "ipc_allow")
        _ipc_state(self).allow(key, pids)

    def ipc_import(self, key):
        """aclrtIpcMemImportByKey: the address, in this process, of the
        exporter's block (no copy: its bytes, as the exporter writes them;
        host: read and written through buffer() / as_array())."""
        _require_open(self, "ipc_import")
        return _ipc_state(self).import_(key)

    def ipc_close(self, key):
        """aclrtIpcMemClose, on either side: an importer unmaps; the exporter
        ends the export (refused with IpcBusyError while importers hold
        it), after which the block may be freed."""
        _ipc_close(self, key)

    @property
    def resets(self):
        """How many times reset() (or restart()) freed every block: what was
        handed out before the last one is gone."""
        return (<_DeviceParts>self._parts).counters["resets"]

    def pending_bytes(self):
        """Bytes of blocks freed on a stream and waiting for it."""
        return (<_DeviceParts>self._parts).ledger.pending_bytes

    def on_out_of_memory(self, fn):
        """fn(info) is called when an allocation fails, after the spare slabs
        were given back; info has kind, size, free, largest_free and
        pending_bytes.  A true return asks for one more try."""
        if fn is not None and not callable(fn):
            raise ArgumentTypeError("on_out_of_memory takes a callable or None")
        (<_DeviceParts>self._parts).oom_callback = fn

    # ---- host memory (host backend) -------------------------------------------

    def buffer(self, ptr, nbytes=None):
        """A writable memoryview of a live block (host backend).  The rule for
        views: a block cannot be freed while a view of it (or a numpy array
        made from one) is alive; free raises InvalidFreeError."""
        cdef uint64_t a = as_u64(ptr, "pointer"), usable, n
        cdef _DeviceParts parts = <_DeviceParts>self._parts
        _require_open(self, "buffer")
        cdef ascm_pool *p = ascm_device_pool_at(self._d, a, NULL)
        if not parts.up.readable:
            raise UnsupportedError(f"the {self.backend} backend holds no memory the host can "
                                   f"read; use backend='host'")
        usable = _ipc_buffer_size(parts, a) if p is NULL else 0  # an imported range
        if not usable and (p is NULL or parts.ledger.waits(a) or
                           ascm_pool_requested_size(p, a, &usable) != ASCM_OK):
            raise InvalidFreeError(f"{a:#x} is not the start of a live block")
        if parts.tags.asleep_tag(a) is not None:
            raise InvalidArgumentError(f"buffer: {a:#x} belongs to tag "
                                       f"{parts.tags.asleep_tag(a)!r}, which is asleep: wake it first")
        if parts.guards is not None:
            usable = parts.guards.requested(a, usable)
        n = usable if nbytes is None else as_u64(nbytes, "nbytes")
        if n == 0 or n > usable:
            raise InvalidArgumentError(f"nbytes {n} does not fit the block's {usable} bytes")
        if p is not NULL:
            _guard(self, a)  # viewed once, freed here only
        return memoryview(_make_block_buffer(self, parts.views, a, n))

    def as_array(self, ptr, shape, dtype="uint8"):
        """A numpy array on a live block's memory (no copy); the array counts
        as a view of the block.  Arrays export DLPack (numpy.from_dlpack)."""
        np = _numpy()
        try:
            dt = np.dtype(dtype)
            shape = (shape,) if isinstance(shape, int) else tuple(int(operator.index(s)) for s in shape)
        except TypeError as e:
            raise ArgumentTypeError(f"as_array: {e}") from None
        if dt.hasobject:  # numpy cannot put Python objects in raw memory (its bare ValueError)
            raise InvalidArgumentError(f"as_array: dtype {dt} holds Python objects; device memory "
                                       f"holds plain data")
        count = 1
        for s in shape:
            if s < 0:
                raise InvalidArgumentError(f"as_array: negative dimension in {shape}")
            count *= s
        buf = self.buffer(ptr, count * dt.itemsize)
        return np.frombuffer(buf, dtype=dt, count=count).reshape(shape)

    def pages(self):
        """Which pages the OS gave each kind's range (host backend)."""
        cdef _DeviceParts parts = <_DeviceParts>self._parts
        if not parts.up.readable:
            return {}
        return {MemKind(k).name.lower(): _OS_PAGES[parts.up.pages.get(k, ASCM_OS_NORMAL)]
                for k in range(ASCM_KINDS) if parts.growth.size[k]}

    # ---- media to inference ------------------------------------------------------

    def as_model_input(self, ptr, length):
        """Media -> inference reuse: hands a live device or media buffer to model
        inference as it is (same address, no copy), after checking that the
        segment obeys the rule for carved memory: a 128-byte aligned start and a
        length within the buffer's rounded size."""
        cdef uint64_t a = as_u64(ptr, "pointer"), n = as_u64(length, "length"), size
        cdef int k = -1
        _require_open(self, "as_model_input")
        cdef ascm_pool *p = ascm_device_pool_at(self._d, a, &k)
        if k >= 0 and not ascm_kind(k).device:
            raise InvalidArgumentError(f"{a:#x} is host memory: model inference reads device "
                                       f"or media memory")
        if p is NULL or ascm_pool_requested_size(p, a, &size) != ASCM_OK:
            raise InvalidArgumentError(f"{a:#x} is not a live device or media buffer "
                                       f"(freed, interior, or foreign)")
        if a % MEDIA_ALIGN:
            raise MisalignedError(f"{a:#x} is not 128-byte aligned, as model input carved from "
                                  f"media memory must be")
        if n == 0 or n > size:
            raise InvalidArgumentError(f"length {n} does not fit the buffer's {size} bytes")
        cdef _DeviceParts parts = <_DeviceParts>self._parts
        parts.reused_bytes += n
        parts.reuse_count += 1
        return a

    # ---- budget ---------------------------------------------------------------

    def begin_job(self):
        """Marks the start of an inference or training job.  On products that
        cache AI CPU operators (training series, EP mode) the first job after
        start or restart takes that cache from device memory; A2/A3 products load
        their system package instead."""
        cdef _DeviceParts parts = <_DeviceParts>self._parts
        _require_open(self, "begin_job")
        if parts.job_started:
            return 0
        take = parts.aicpu if self.mode == "EP" and self.profile.aicpu_cache[1] else 0
        take += self.profile.first_job_package
        if take and ascm_device_charge_fixed(self._d, take) != ASCM_OK:
            raise OutOfMemoryError(f"the first job needs {_fmt_bytes(take)} of device memory "
                                   f"for the runtime, and it is not free")
        parts.fixed_taken = take
        parts.job_started = True
        return take

    def set_limit(self, limit):
        """Caps huge + normal + runtime memory at limit bytes (0: no cap)."""
        ascm_device_set_limit(self._d, as_u64(limit, "limit"))

    def set_memory_fraction(self, fraction):
        """Caps device memory at a fraction (0 < f <= 1) of the total."""
        try:
            f = float(fraction)
        except (TypeError, ValueError):
            raise ArgumentTypeError(f"memory fraction must be a number, not "
                                    f"{type(fraction).__name__}") from None
        if not 0.0 < f <= 1.0:
            raise InvalidArgumentError(f"memory fraction must be in (0, 1], got {fraction!r}")
        total = self.budget()["total"]
        # a tiny fraction still caps (a limit of 0 would mean no limit at all)
        ascm_device_set_limit(self._d, 0 if f == 1.0 else max(1, int(total * f)))

    def set_per_process_memory_fraction(self, fraction, device=None):
        """torch.cuda's name for set_memory_fraction (device: None or this
        device's id)."""
        self._torch_device(device)
        self.set_memory_fraction(fraction)

    # ---- lifetime ---------------------------------------------------------------

    def reset(self):
        """aclrtResetDevice: frees every block and invalidates every pointer
        handed out before (freeing one raises InvalidFreeError, after any
        number of resets).  The AI CPU operator cache and the system package
        stay: only a restart of the device releases them (restart()).  All
        or nothing: if
        the upstream refuses the fresh chunks, the device is left as it was
        and the upstream's error is raised.  Callers without the GIL inside
        the device are waited out; new ones are refused until it is over."""
        cdef _DeviceParts parts = <_DeviceParts>self._parts
        _require_open(self, "reset")
        _refuse_in_use(self, "reset")
        with nogil:
            ascm_device_quiesce(self._d)
        try:
            _refuse_handed_out(self, "reset")  # none can be handed out now: the gate is shut
            with parts.growth.lock:
                old = parts.growth.renew()  # raises with the device untouched
                if ascm_device_reset(self._d, parts.growth.first_base) != ASCM_OK:
                    raise OutOfMemoryError("host memory for the device's metadata ran out")
                # before anything that may release the GIL (pyACL frees below):
                # other threads must find no bookkeeping of the blocks just freed
                parts.forget_blocks()
                if parts.mapper is not None:  # the old ranges' physical memory, then the ranges
                    for chunks in old:
                        for base, size in chunks:
                            parts.mapper.release_range(base, size)
                parts.growth.retire(old)
                parts.counters["resets"] += 1
        finally:
            ascm_device_reopen(self._d)

    def restart(self):
        """The device restarts: as reset(), and the runtime's own memory the
        first job took (AI CPU operator cache, system package) is released,
        so the next first job takes it again.  The precautions page: "If the
        device is restarted, the AI CPU operator buffer is released"
        (shared/seed/memory-precautions.txt line 7)."""
        cdef _DeviceParts parts = <_DeviceParts>self._parts
        self.reset()
        if parts.fixed_taken:
            ascm_device_charge_fixed(self._d, -<int64_t>parts.fixed_taken)
        parts.fixed_taken = 0
        parts.job_started = False

    def close(self):
        """Gives every chunk back to the upstream (the OS, the runtime).  After
        close, every allocation, free and view raises DeviceClosedError, also
        for callers without the GIL (which get ASCM_ERR_CLOSED); statistics
        stay readable.  Idempotent."""
        cdef _DeviceParts parts = <_DeviceParts>self._parts
        if parts.closed:
            return
        _refuse_in_use(self, "close")
        if self._d is not NULL:
            with nogil:
                ascm_device_quiesce(self._d)
            try:
                _refuse_handed_out(self, "close")  # none can be handed out now: the gate is shut
            except InUseError:
                ascm_device_reopen(self._d)
                raise
        parts.closed = parts.views.closed = True
        if self._d is not NULL:
            with nogil:
                ascm_device_close(self._d)  # shuts the gate for good
        parts.ledger.drop_events()
        parts.tags.clear()  # exports end, imports are unmapped (ascmem/ipc.py)
        if parts.mapper is not None:
            parts.mapper.release_all()
        parts.growth.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def empty_cache(self):
        """Gives every pool's spare empty slabs back, and their pages to the
        budget; chunks that hold no live block go back upstream; on the host
        backend the pages of every fully free span go back to the OS too
        (MADV_DONTNEED).  Returns the bytes released: slabs, chunks, and the
        resident host pages given back."""
        cdef _DeviceParts parts = <_DeviceParts>self._parts
        _require_open(self, "empty_cache")
        with parts.map_lock():
            return _empty_cache(self._d, parts)

    def __repr__(self):
        closed = (<_DeviceParts>self._parts).closed if self._parts is not None else False
        return (f"<ascmem.Device {self.profile.name} {self.mode} id={self.device_id} "
                f"backend={self.backend}{' closed' if closed else ''}>")


cdef _refuse_in_use(Device dev, str call):
    """close() and reset() leave the memory of live views and handed-out
    blocks unmapped: the next read through them would crash the process."""
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    if parts.views.live:
        raise InUseError(f"{call}: {parts.views.live} buffer views of device memory are still alive")
    _refuse_handed_out(dev, call)


cdef _refuse_handed_out(Device dev, str call):
    """Refuses while blocks handed out to C are live (each is marked until
    its free, whichever path frees it: ascm_device_hand_out_block)."""
    cdef int64_t n = ascm_device_handed_out(dev._d) if dev._d is not NULL else 0
    if n:
        raise InUseError(f"{call}: {n} blocks handed out to C callers (the pluggable functions, "
                         f"the C API, torch through ascmem.torch) are still live; free them first "
                         f"(torch: drop the tensors, or ascmem.torch.uninstall() and let them go)")


cdef uint64_t _empty_cache(ascm_device *d, _DeviceParts parts) except? 0:
    """Device.empty_cache, with the mapper's lock held (paged acl)."""
    cdef uint64_t released = ascm_device_trim(d)
    for k in range(ASCM_KINDS):
        with parts.growth.lock:
            released += parts.growth.release_empty(k)  # whole chunks back to the upstream
        if parts.up.readable:
            released += _discard_free_pages(d, k)
    parts.apply_maps()  # trimmed granules go back to the runtime
    return released


cdef _paged_config(ascm_device_config *cfg, Device dev, _DeviceParts parts, uint64_t threshold):
    """Device(paged=True): the kinds free() frees become paged pools, if the
    product has virtual memory management (profiles [V]); never a silent
    fallback to contiguous pools.  acl: ranges from aclrtReserveMemAddress,
    granules of 2 MB mapped through pyACL (_acl_paging.pyx)."""
    prof = dev.profile
    if not prof.virtual_memory:
        raise UnsupportedError(f"paged=True: {prof.title} has no virtual memory management "
                               f"(aclrtReserveMemAddress and aclrtMapMem are documented for the "
                               f"Ascend 950, Atlas A3, A2, 200I/500 A2, inference series (310P) "
                               f"and training series (910), not for the Ascend 310 products)")
    if not prof.virtual_memory_in(dev.mode):
        raise UnsupportedError(f"paged=True: {prof.title} has no virtual memory management in "
                               f"{dev.mode} mode (aclrtReserveMemAddress and aclrtMapMem are "
                               f"documented as refused there); use EP mode")
    cfg.paged = 1
    cfg.release_threshold = threshold
    cfg.map = NULL  # sim: counted, nothing mapped
    # sim stands for the acl backend: device memory is mapped in granules of
    # at least 2 MB whatever the page type (hicann/driver
    # src/ascend_hal/svm/v2/devmm/devmm_svm.c lines 60-61 and 6971-6978: only
    # host-side normal pages have the OS page as their minimum; lines
    # 4989-4993: a normal-page request of 2 MB or more gets huge pages;
    # hicann/runtime docs/zh/api_ref/11-04_virtual_memory_management.md
    # line 461), so a plan made on sim maps what the acl backend would
    if parts.up.paging == "counted":
        cfg.granule_min = _ACL_GRANULE
    elif parts.up.paging == "os":
        cfg.map = ascm_os_map
    elif parts.up.paging == "runtime":  # queued under the pool locks, applied through pyACL
        if any(parts.growth.maximum[k] > parts.growth.size[k] for k in range(ASCM_KINDS)):
            raise UnsupportedError("paged=True on the acl backend: give fixed pool sizes (a paged "
                                   "range has no need to grow)")
        parts.mapper = _AclMapper(parts.up.acl, _acl_granule(parts.up.acl, dev.device_id),
                                  dev.device_id)
        g = parts.mapper.granule
        for k in range(ASCM_KINDS):  # a reserved range holds whole granules of the runtime's
            if ascm_kind(k).freed_by == ASCM_FREE_DEVICE and parts.growth.size[k]:
                parts.growth.size[k] = max(g, parts.growth.size[k] // g * g)
                parts.growth.maximum[k] = parts.growth.size[k]
        parts.general = True
        cfg.map = _acl_map_hook
        cfg.map_ctx = parts.mapper.hook_ctx()
        cfg.granule_min = parts.mapper.granule
    parts.up.paged_kinds = frozenset(k for k in range(ASCM_KINDS)
                                     if ascm_kind(k).freed_by == ASCM_FREE_DEVICE)
    parts.paged = True


# the parts of Devices collected while C callers held blocks of them (__dealloc__)
_orphans = []


def _pluggable_register(int index, Device device=None):
    """Points the pluggable-allocator functions for device index at device
    (None: unregisters).  Waits, without the GIL, for calls still using the
    device registered before.  Used by ascmem.pluggable."""
    cdef ascm_device *d = device._d if device is not None else NULL
    cdef int st
    if device is not None and (<_DeviceParts>device._parts).mapper is not None:
        raise UnsupportedError("a paged acl device maps its memory through pyACL, which the "
                               "pluggable functions (called without the GIL) cannot do")
    with nogil:
        st = ascm_pluggable_register(index, d)
    if st != ASCM_OK:
        raise InvalidArgumentError(f"device index {index} is outside 0..63")
