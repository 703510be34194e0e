# Declarations of the C core and of the extension types, for other Cython
# extensions:  from ascmem._core cimport Pool
from libc.stdint cimport uint64_t, int64_t, uint32_t

cdef extern from "ascmem.h" nogil:
    enum:
        ASCM_OK
        ASCM_ERR_NOMEM
        ASCM_ERR_INVAL
        ASCM_ERR_BADFREE
        ASCM_ERR_CORRUPT
        ASCM_ERR_HOSTMEM
        ASCM_ERR_BUDGET

    ctypedef struct ascm_stats:
        uint64_t capacity, used, requested, peak_used, peak_requested, free, largest_free
        uint64_t live_count, alloc_count, free_count, failed_count
        uint64_t pages_in_use, page_size, slab_bytes, metadata_bytes
        uint64_t cached_bytes, peak_live_count

    ctypedef struct ascm_buddy:
        pass
    int ascm_buddy_create(uint64_t base, uint64_t size, uint64_t min_block, ascm_buddy **out)
    void ascm_buddy_destroy(ascm_buddy *b)
    int ascm_buddy_alloc(ascm_buddy *b, uint64_t size, uint64_t align, uint64_t *addr)
    int ascm_buddy_free(ascm_buddy *b, uint64_t addr)
    int ascm_buddy_usable_size(const ascm_buddy *b, uint64_t addr, uint64_t *size)
    int ascm_buddy_requested_size(const ascm_buddy *b, uint64_t addr, uint64_t *size)
    void ascm_buddy_stats(const ascm_buddy *b, ascm_stats *st)
    void ascm_buddy_reset(ascm_buddy *b)
    int ascm_buddy_check(const ascm_buddy *b, char *msg, size_t msglen)

    ctypedef int (*ascm_charge_fn)(void *ctx, int64_t delta_bytes)
    ctypedef void (*ascm_block_fn)(void *ctx, uint64_t addr, uint64_t usable, uint64_t requested)
    ctypedef struct ascm_pool:
        pass
    ctypedef struct ascm_pool_config:
        uint64_t base, size, min_block, page_size
        ascm_charge_fn charge
        void *charge_ctx
        int single_threaded
    int ascm_pool_create(const ascm_pool_config *cfg, ascm_pool **out)
    void ascm_pool_destroy(ascm_pool *p)
    int ascm_pool_alloc(ascm_pool *p, uint64_t size, uint64_t align, uint64_t *addr)
    int ascm_pool_free(ascm_pool *p, uint64_t addr)
    int ascm_pool_usable_size(ascm_pool *p, uint64_t addr, uint64_t *size)
    int ascm_pool_requested_size(ascm_pool *p, uint64_t addr, uint64_t *size)
    void ascm_pool_stats(ascm_pool *p, ascm_stats *st)
    void ascm_pool_reset(ascm_pool *p)
    uint64_t ascm_pool_trim(ascm_pool *p)
    int ascm_pool_check(ascm_pool *p, char *msg, size_t msglen)
    int ascm_pool_contains(const ascm_pool *p, uint64_t addr)
    void ascm_pool_walk(ascm_pool *p, ascm_block_fn fn, void *ctx)
    int ascm_pool_alloc_many(ascm_pool *p, const uint64_t *sizes, size_t n, uint64_t align,
                             uint64_t *addrs, size_t *done)
    int ascm_pool_free_many(ascm_pool *p, const uint64_t *addrs, size_t n, size_t *done)
    const char *ascm_status_str(int status)

    enum:
        ASCM_KIND_HUGE
        ASCM_KIND_NORMAL
        ASCM_KIND_DVPP
        ASCM_KIND_HOST
        ASCM_KIND_HUGE1G
        ASCM_KINDS
        ASCM_SIZE_MALLOC
        ASCM_SIZE_ALIGN32
        ASCM_SIZE_DVPP
        ASCM_SIZE_HOST
        ASCM_EVENT_HUGE_FALLBACK
        ASCM_EVENT_RESERVE_FULL
        ASCM_EVENT_MEDIA_90
        ASCM_ERR_UNSUPPORTED
        ASCM_ERR_CLOSED
    ctypedef struct ascm_budget:
        uint64_t reserve, shared
        int huge_grows
        uint64_t fixed, limit, huge_used, normal_used, peak_huge, peak_normal
    ctypedef struct ascm_device_config:
        uint64_t base[5]
        uint64_t size[5]
        uint64_t min_block
        ascm_budget budget
        int p2p
        int growable[5]
    ctypedef struct ascm_device:
        pass
    enum:
        ASCM_MAX_CHUNKS
    ctypedef int (*ascm_grow_fn)(void *ctx, int kind, uint64_t size, uint64_t align,
                                 uint64_t generation) noexcept
    int ascm_device_create(const ascm_device_config *cfg, ascm_device **out)
    void ascm_device_destroy(ascm_device *d)
    ctypedef struct ascm_route:
        uint64_t rounded, align
        int kinds[2]
        int nkinds
        int reserve_event
    int ascm_device_route(const ascm_device *d, uint64_t size, uint32_t policy, int mode,
                          ascm_route *r)
    int ascm_device_malloc(ascm_device *d, uint64_t size, uint32_t policy, int mode,
                           uint64_t *addr, int *kind, int *events)
    int ascm_device_try_malloc(ascm_device *d, uint64_t size, uint32_t policy, int mode,
                               uint64_t *addr, int *kind, int *events)
    void ascm_device_count_failure(ascm_device *d, int kind)
    int ascm_device_try_malloc_held(ascm_device *d, uint64_t size, uint32_t policy, int mode,
                                    uint64_t *addr, int *kind, int *events)
    int ascm_device_free_held(ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind)
    int ascm_device_enter(ascm_device *d)
    void ascm_device_leave(ascm_device *d)
    void ascm_device_quiesce(ascm_device *d)
    void ascm_device_reopen(ascm_device *d)
    int ascm_device_close(ascm_device *d)
    int ascm_device_wait_open(ascm_device *d)
    ctypedef uint64_t (*ascm_release_fn)(void *ctx) noexcept
    void ascm_device_set_release(ascm_device *d, ascm_release_fn fn, void *ctx)
    uint64_t ascm_device_release_idle(ascm_device *d)
    uint64_t ascm_device_trim(ascm_device *d)
    int ascm_device_free(ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind)
    int ascm_device_kind_of(const ascm_device *d, uint64_t addr)
    ascm_pool *ascm_device_pool(ascm_device *d, int kind)
    ascm_pool *ascm_device_pool_at(const ascm_device *d, uint64_t addr, int *kind)
    int ascm_device_has_kind(const ascm_device *d, int kind)
    int ascm_device_chunk_count(const ascm_device *d, int kind)
    ascm_pool *ascm_device_chunk(ascm_device *d, int kind, int i, uint64_t *base, uint64_t *size)
    uint64_t ascm_device_generation(const ascm_device *d, int kind)
    void ascm_device_kind_stats(ascm_device *d, int kind, ascm_stats *out)
    void ascm_device_set_grow(ascm_device *d, ascm_grow_fn fn, void *ctx)
    int ascm_device_add_chunk(ascm_device *d, int kind, uint64_t base, uint64_t size)
    int ascm_device_release_empty(ascm_device *d, int kind, uint64_t *bases, uint64_t *sizes,
                                  int max, int *count)
    int ascm_device_reset(ascm_device *d, const uint64_t *base)
    void ascm_device_budget(ascm_device *d, ascm_budget *out)
    int ascm_device_charge_fixed(ascm_device *d, int64_t delta)
    int ascm_device_set_limit(ascm_device *d, uint64_t limit)
    void ascm_device_reset_peaks(ascm_device *d)
    int ascm_pluggable_register(int device, ascm_device *d)
    void ascm_pool_reset_peaks(ascm_pool *p)
    uint64_t ascm_pool_usable_for(const ascm_pool *p, uint64_t size, uint64_t align)
    int ascm_pool_relabel(ascm_pool *p, uint64_t addr, uint64_t requested, uint64_t align)
    void ascm_pool_walk_free(ascm_pool *p, ascm_block_fn fn, void *ctx)
    enum:
        ASCM_OS_NORMAL
        ASCM_OS_THP
        ASCM_OS_HUGETLB
    int ascm_os_reserve(uint64_t size, uint64_t align, int want_huge, uint64_t *addr, int *got)
    int ascm_os_release(uint64_t addr, uint64_t size)
    int ascm_os_discard(uint64_t addr, uint64_t size)
    int ascm_os_quarantine(uint64_t addr, uint64_t size)
    uint64_t ascm_os_resident(uint64_t addr, uint64_t size)


cdef class Pool:
    cdef ascm_pool *_p
    cdef readonly uint64_t base, capacity, min_block, page_size
    # C-level entry points for other Cython extensions (through the type's
    # vtable, so they need no link to this module): no Python call, no GIL.
    # They return an ascm_status (0 = ASCM_OK).
    cdef int alloc_raw(self, uint64_t size, uint64_t align, uint64_t *addr) noexcept nogil
    cdef int free_raw(self, uint64_t addr) noexcept nogil
    cdef _alloc_error(self, int st, uint64_t size, uint64_t align)


cdef class Device:
    cdef ascm_device *_d
    cdef readonly object profile, mode, backend
    cdef readonly int device_id
    cdef int _epoch
    cdef uint64_t _sizes[5]
    cdef set _warned
    cdef readonly dict _counters
    cdef bint _job_started, _closed
    cdef uint64_t _reused_bytes, _reuse_count, _fixed_taken, _aicpu
    # stream-ordered reuse: blocks freed on a stream wait for it (see _device.pxi)
    cdef dict _pending          # stream -> list of pending entries
    cdef dict _pending_by_addr  # address -> entry [addr, kind_mask, holders, seq, bytes]
    cdef dict _recorded         # address -> set of extra streams (record_stream)
    cdef uint64_t _pending_bytes, _seq
    cdef object _oom_callback
    cdef object _up             # the upstream (_upstream.pxi): owns the chunks
    cdef uint64_t _real_base[5] # host, acl: each kind's first chunk
    cdef dict _views            # address -> number of live buffer exports
    cdef object _acl            # acl backend: the pyACL module (events)
    # pools that grow from an upstream (host, acl): bytes taken / allowed per kind
    cdef uint64_t _taken[5]
    cdef uint64_t _max[5]
    cdef object _upstream_error # the last upstream failure, for the OOM message
    cdef object _grow_lock      # one growth at a time (the GIL is dropped inside pyACL)
    cdef bint _debug            # ASCMEM_DEBUG=1 on the host backend: guard bytes
    cdef dict _guards           # address -> requested size, in debug mode
    cdef object __weakref__
    cdef int malloc_raw(self, uint64_t size, uint32_t policy, uint64_t *addr) noexcept nogil
    cdef int free_raw(self, uint64_t addr) noexcept nogil
    cdef _failed(self, int st, uint64_t size, object policy, int kind, int events, str call)
    cdef uint64_t _alloc_slow(self, int st, uint64_t size, uint32_t policy, int mode, int kind,
                              int events, object policy_obj, str call) except? 0
    cdef _free_slow(self, uint64_t addr, unsigned mask, object stream, str call)
    cdef _release(self, list entries, object stream, uint64_t upto)
    cdef _layout(self, ascm_device_config *cfg, memory, free_os_memory, aicpu_cache,
                 host_memory, limit)
    cdef _pool_sizes(self, object pool_sizes)
    cdef _acl_sizes(self, uint64_t reserve, uint64_t app)
    cdef _first_chunks(self, uint64_t *out)
    cdef object _alloc_rest(self, object size, object policy, int mode, object stream, str call,
                            int st, uint64_t addr, int kind, int events)
    cdef _free_failed(self, int st, uint64_t a, unsigned mask, int kind, str call)
    cdef int _wait_reset(self, str call) except -1
    cdef int _free_when_open(self, uint64_t a, unsigned mask, int *kind, str call) except -1
    cdef _require_open(self, str call)
    cdef _drop_pending_events(self)
    cdef _forget_blocks(self)
    cdef uint64_t _guarded(self, uint64_t addr, uint64_t size) except? 0
    cdef _check_guard(self, uint64_t addr)
    cdef uint64_t _reuse(self, object stream, uint64_t n, uint32_t policy, int mode) except? 0
    cdef _events(self, int events)
    cdef _bases(self, uint64_t *out)


cdef class BuddyAllocator:
    cdef ascm_buddy *_b
    cdef readonly uint64_t base, capacity, min_block
