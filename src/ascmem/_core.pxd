# Declarations of the C core and of the extension types, for other Cython
# extensions:  from ascmem._core cimport Pool
# ascmem._core is the one module that links the C core; ascmem's own modules
# off the hot path cimport the Device's parts and the C core's table
# (CoreCalls, at the end) from here, and the parts' types from their modules.
cimport cython
from libc.stdint cimport uint64_t, int64_t, uint32_t

from ascmem._acl_paging cimport _AclMapper
from ascmem._growth cimport _Growth
from ascmem._streams cimport _StreamLedger
from ascmem._tags cimport _TagRegistry
from ascmem._upstream cimport _Upstream
from ascmem._views cimport _GuardBytes, _ViewRegistry

cdef extern from "ascmem.h" nogil:
    enum:
        ASCM_SLAB_MAX
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
        uint64_t mapped, peak_mapped, map_calls, unmap_calls
        uint64_t alloc_bytes, freed_bytes, alloc_requested, freed_requested
        uint64_t peak_pages, pages_taken, pages_given

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
    ctypedef int (*ascm_map_fn)(void *ctx, uint64_t addr, uint64_t size, int map)
    ctypedef struct ascm_pool_config:
        uint64_t base, size, min_block, page_size
        ascm_charge_fn charge
        void *charge_ctx
        int single_threaded
        int paged
        ascm_map_fn map
        void *map_ctx
        uint64_t release_threshold
    int ascm_pool_create(const ascm_pool_config *cfg, ascm_pool **out)
    void ascm_pool_destroy(ascm_pool *p)
    int ascm_pool_alloc(ascm_pool *p, uint64_t size, uint64_t align, uint64_t *addr)
    int ascm_pool_free(ascm_pool *p, uint64_t addr)
    int ascm_pool_usable_size(ascm_pool *p, uint64_t addr, uint64_t *size)
    int ascm_pool_requested_size(ascm_pool *p, uint64_t addr, uint64_t *size)
    void ascm_pool_stats(ascm_pool *p, ascm_stats *st)
    uint64_t ascm_pool_used(ascm_pool *p)
    void ascm_pool_reset(ascm_pool *p)
    uint64_t ascm_pool_trim(ascm_pool *p)
    int ascm_pool_set_release_cap(ascm_pool *p, uint64_t cap)
    uint64_t ascm_pool_release_threshold(ascm_pool *p)
    int ascm_pool_check(ascm_pool *p, char *msg, size_t msglen)
    int ascm_pool_contains(const ascm_pool *p, uint64_t addr)
    void ascm_pool_walk(ascm_pool *p, ascm_block_fn fn, void *ctx)
    int ascm_pool_alloc_many(ascm_pool *p, const uint64_t *sizes, size_t n, uint64_t align,
                             uint64_t *addrs, size_t *done)
    int ascm_pool_free_many(ascm_pool *p, const uint64_t *addrs, size_t n, size_t *done)
    ctypedef uint64_t ascm_handle
    int ascm_pool_alloc_handle(ascm_pool *p, uint64_t size, uint64_t align, uint64_t *addr,
                               ascm_handle *h)
    int ascm_pool_free_handle(ascm_pool *p, ascm_handle h)
    int ascm_pool_set_thread_caches(ascm_pool *p, int mode)
    int ascm_pool_set_placement(ascm_pool *p, int placement)
    int ascm_pool_placement(ascm_pool *p)
    int ascm_pool_set_slab_max(ascm_pool *p, uint64_t bytes)
    uint64_t ascm_pool_slab_max(ascm_pool *p)
    int ascm_pool_thread_caches_on(const ascm_pool *p)
    enum:
        ASCM_CACHES_OFF
        ASCM_CACHES_ON
        ASCM_CACHES_AUTO
    enum:
        ASCM_PLACE_GRANULES
        ASCM_PLACE_PACKED
        ASCM_PLACE_KEPT_IN_PLACE
        ASCM_PLACE_KEPT_TO_BEST_FIT
        ASCM_PLACE_LOWEST_EQUAL
        ASCM_PLACE_BEST_FIT
        ASCM_PLACE_BEST_FIT_END_LAST
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
        ASCM_SIZE_MAPPED
        ASCM_SIZE_EXACT
        ASCM_EVENT_HUGE_FALLBACK
        ASCM_EVENT_RESERVE_FULL
        ASCM_EVENT_MEDIA_90
        ASCM_ERR_UNSUPPORTED
        ASCM_ERR_CLOSED
        ASCM_FREE_DEVICE
        ASCM_FREE_DVPP
        ASCM_FREE_HOST
    ctypedef struct ascm_kind_info:
        const char *name
        uint64_t page_size
        int huge, device, freed_by
    const ascm_kind_info *ascm_kind(int kind)
    unsigned ascm_kind_mask(int call)
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
        int paged
        ascm_map_fn map
        void *map_ctx
        uint64_t release_threshold
        uint64_t granule_min
        int host_is_device
        uint64_t release_threshold_max
    ctypedef struct ascm_device:
        pass
    enum:
        ASCM_MAX_CHUNKS
    ctypedef int (*ascm_grow_fn)(void *ctx, int kind, uint64_t size, uint64_t align,
                                 uint64_t generation) noexcept
    int ascm_device_create(const ascm_device_config *cfg, ascm_device **out)
    void ascm_device_destroy(ascm_device *d)
    ctypedef struct ascm_route:
        uint64_t rounded, align, pad
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
    int ascm_device_try_malloc_aligned_held(ascm_device *d, uint64_t size, uint32_t policy,
                                            int mode, uint64_t align, uint64_t *addr, int *kind,
                                            int *events)
    int ascm_device_free_held(ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind)
    int ascm_device_guard(ascm_device *d, uint64_t addr)
    void ascm_device_unguard(ascm_device *d, uint64_t addr)
    int ascm_device_enter(ascm_device *d)
    void ascm_device_leave(ascm_device *d)
    int ascm_device_malloc_entered(ascm_device *d, uint64_t size, uint32_t policy, int mode,
                                   uint64_t *addr, int *kind, int *events)
    int ascm_device_free_entered(ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind)
    void ascm_device_quiesce(ascm_device *d)
    void ascm_device_reopen(ascm_device *d)
    int ascm_device_close(ascm_device *d)
    int ascm_device_wait_open(ascm_device *d)
    ctypedef uint64_t (*ascm_release_fn)(void *ctx) noexcept
    void ascm_device_set_release(ascm_device *d, ascm_release_fn fn, void *ctx)
    uint64_t ascm_device_release_idle(ascm_device *d)
    uint64_t ascm_device_trim(ascm_device *d)
    int ascm_device_set_thread_caches(ascm_device *d, int mode)
    int ascm_device_set_placement(ascm_device *d, int placement)
    int ascm_device_placement(ascm_device *d)
    int ascm_device_set_slab_max(ascm_device *d, uint64_t bytes)
    uint64_t ascm_device_slab_max(ascm_device *d)
    uint64_t ascm_device_min_block(const ascm_device *d)
    int ascm_device_free(ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind)
    int ascm_device_kind_of(const ascm_device *d, uint64_t addr)
    ascm_pool *ascm_device_pool(ascm_device *d, int kind)
    ascm_pool *ascm_device_pool_at(const ascm_device *d, uint64_t addr, int *kind)
    int ascm_device_has_kind(const ascm_device *d, int kind)
    int ascm_device_chunk_count(const ascm_device *d, int kind)
    ascm_pool *ascm_device_chunk(ascm_device *d, int kind, int i, uint64_t *base, uint64_t *size)
    uint64_t ascm_device_generation(const ascm_device *d, int kind)
    void ascm_device_kind_stats(ascm_device *d, int kind, ascm_stats *out)
    uint64_t ascm_device_kind_release_threshold(ascm_device *d, int kind)
    void ascm_device_set_grow(ascm_device *d, ascm_grow_fn fn, void *ctx)
    int ascm_device_add_chunk(ascm_device *d, int kind, uint64_t base, uint64_t size)
    int ascm_device_release_empty(ascm_device *d, int kind, uint64_t *bases, uint64_t *sizes,
                                  int max, int *count)
    int ascm_device_reset(ascm_device *d, const uint64_t *base)
    void ascm_device_budget(ascm_device *d, ascm_budget *out)
    void ascm_device_huge_pages(ascm_device *d, uint64_t *charged, uint64_t *held)
    int ascm_device_charge_fixed(ascm_device *d, int64_t delta)
    int ascm_device_set_limit(ascm_device *d, uint64_t limit)
    void ascm_device_reset_peaks(ascm_device *d)
    int ascm_device_hand_out_block(ascm_device *d, uint64_t addr)
    int64_t ascm_device_handed_out(ascm_device *d)
    int ascm_pluggable_register(int device, ascm_device *d)
    enum:
        ASCM_ACL_ALLOCATOR_SLOTS
    int ascm_acl_allocator_bind(int slot, ascm_device *d)
    void *ascm_acl_allocator_handle(int slot)
    void ascm_pool_reset_peaks(ascm_pool *p)
    int ascm_pool_close_if_empty(ascm_pool *p)
    void ascm_pool_close(ascm_pool *p)
    uint64_t ascm_pool_usable_for(const ascm_pool *p, uint64_t size, uint64_t align)
    int ascm_pool_relabel(ascm_pool *p, uint64_t addr, uint64_t requested, uint64_t pad,
                          uint64_t align)
    int ascm_pool_sleep(ascm_pool *p, uint64_t addr, uint64_t *released)
    int ascm_pool_is_large_block(ascm_pool *p, uint64_t addr)
    int ascm_pool_wake(ascm_pool *p, uint64_t addr, uint64_t *mapped)
    void ascm_pool_walk_free(ascm_pool *p, ascm_block_fn fn, void *ctx)
    void ascm_pool_walk_held(ascm_pool *p, ascm_block_fn fn, void *ctx)
    enum:
        ASCM_OS_NORMAL
        ASCM_OS_THP
        ASCM_OS_HUGETLB
    int ascm_os_reserve(uint64_t size, uint64_t align, int want_huge, uint64_t *addr, int *got)
    int ascm_os_release(uint64_t addr, uint64_t size)
    int ascm_os_discard(uint64_t addr, uint64_t size)
    int ascm_os_quarantine(uint64_t addr, uint64_t size)
    uint64_t ascm_os_resident(uint64_t addr, uint64_t size)
    int ascm_os_map(void *ctx, uint64_t addr, uint64_t size, int map)


cdef class Pool:
    cdef ascm_pool *_p
    cdef readonly uint64_t base, capacity, min_block, page_size
    cdef readonly uint64_t granule, release_threshold  # paged pools; 0 for contiguous ones
    cdef bint _closed
    cdef readonly str thread_caches  # "off", "on" or "auto"
    # C-level entry points for other Cython extensions (through the type's
    # vtable, so they need no link to this module): no Python call, no GIL.
    # They return an ascm_status (0 = ASCM_OK).
    cdef int alloc_raw(self, uint64_t size, uint64_t align, uint64_t *addr) noexcept nogil
    cdef int free_raw(self, uint64_t addr) noexcept nogil
    cdef _alloc_error(self, int st, uint64_t size, uint64_t align)
    # By handle (ascm_pool_alloc_handle): the free looks nothing up by
    # address; a large block allocated so is known by its handle only.
    # Declared last: extensions built against the methods above keep working.
    cdef int alloc_handle_raw(self, uint64_t size, uint64_t align, uint64_t *addr,
                              ascm_handle *handle) noexcept nogil
    cdef int free_handle_raw(self, ascm_handle handle) noexcept nogil


cdef class _DeviceReadout:
    # private to ascmem: the C device, and the Device's parts (_device_parts.pxi)
    cdef ascm_device *_d
    cdef object _parts
    cdef readonly object profile, mode, backend
    cdef readonly int device_id
    cdef readonly str thread_caches  # "off", "on" or "auto"
    cdef object __weakref__


cdef class Device(_DeviceReadout):
    # C-level entry points, as Pool's: aclrtMalloc / aclrtFree without the GIL
    # (thread-safe, gated against reset and close).  ascm_status results.
    cdef int malloc_raw(self, uint64_t size, uint32_t policy, uint64_t *addr) noexcept nogil
    cdef int free_raw(self, uint64_t addr) noexcept nogil


cdef class BuddyAllocator:
    cdef ascm_buddy *_b
    cdef readonly uint64_t base, capacity, min_block



# The Device's private parts, for ascmem's modules that work on a Device
# (_tags.pyx, _handed_sleep.pyx, _acl_allocator.pyx): not an interface for
# embedders.
@cython.final
cdef class _DeviceParts:
    cdef _Growth growth
    cdef _Upstream up
    cdef _StreamLedger ledger
    cdef _ViewRegistry views
    cdef _GuardBytes guards          # None unless debug mode (ASCMEM_DEBUG=1, host backend)
    cdef _TagRegistry tags           # tagged blocks, sleeping tags (_tags.pyx)
    cdef _AclMapper mapper           # acl backend, paged: the runtime's physical memory
    cdef bint general                # guard bytes or a mapper: every call takes the general path
    cdef dict counters               # stats()["device"] counters
    cdef set warned                  # ASCM_EVENT_* causes warned about
    cdef object oom_callback
    cdef bint closed, job_started
    cdef str closed_why              # why closed, when not by close(): "" or " (...)"
    cdef bint paged                  # huge, normal and huge1g are paged pools
    cdef uint64_t reused_bytes, reuse_count, fixed_taken, aicpu
    cdef give_back(self)
    cdef bint apply_maps(self) except -1
    cdef forget_blocks(self)


cdef int _require_open(Device dev, str call) except -1
cdef int _guard(Device dev, uint64_t addr) except -1


# The C core for ascmem's other extension modules (_backend_host.pyx, ...).
# It is linked into this module only -- its state (the pluggable and external
# allocator registries, the fork handler, the kind table) exists once in a
# process -- so they call it through this table of its functions:
#     from ascmem._core cimport CoreCalls, core_calls
#     cdef const CoreCalls *C = core_calls()
#     C.ascm_pool_stats(p, &st)
# (core_calls is exported through this module's __pyx_capi__ capsules, as
# every cdef function a .pxd declares).  Not for the hot path: a call
# through the table cannot be inlined.
ctypedef struct CoreCalls:
    int (*ascm_os_reserve)(uint64_t size, uint64_t align, int want_huge, uint64_t *addr, int *got) noexcept nogil
    int (*ascm_os_release)(uint64_t addr, uint64_t size) noexcept nogil
    int (*ascm_os_quarantine)(uint64_t addr, uint64_t size) noexcept nogil
    int (*ascm_os_map)(void *ctx, uint64_t addr, uint64_t size, int map) noexcept nogil
    const ascm_kind_info *(*ascm_kind)(int kind) noexcept nogil
    const char *(*ascm_status_str)(int status) noexcept nogil
    int (*ascm_device_route)(const ascm_device *d, uint64_t size, uint32_t policy, int mode, ascm_route *r) noexcept nogil
    ascm_pool *(*ascm_device_pool_at)(const ascm_device *d, uint64_t addr, int *kind) noexcept nogil
    int (*ascm_device_kind_of)(const ascm_device *d, uint64_t addr) noexcept nogil
    int (*ascm_device_chunk_count)(const ascm_device *d, int kind) noexcept nogil
    ascm_pool *(*ascm_device_chunk)(ascm_device *d, int kind, int i, uint64_t *base, uint64_t *size) noexcept nogil
    uint64_t (*ascm_device_generation)(const ascm_device *d, int kind) noexcept nogil
    void (*ascm_device_set_grow)(ascm_device *d, ascm_grow_fn fn, void *ctx) noexcept nogil
    void (*ascm_device_set_release)(ascm_device *d, ascm_release_fn fn, void *ctx) noexcept nogil
    int (*ascm_device_add_chunk)(ascm_device *d, int kind, uint64_t base, uint64_t size) noexcept nogil
    int (*ascm_device_release_empty)(ascm_device *d, int kind, uint64_t *bases, uint64_t *sizes, int max, int *count) noexcept nogil
    int64_t (*ascm_device_handed_out)(ascm_device *d) noexcept nogil
    int (*ascm_pool_relabel)(ascm_pool *p, uint64_t addr, uint64_t requested, uint64_t pad, uint64_t align) noexcept nogil
    void (*ascm_pool_stats)(ascm_pool *p, ascm_stats *st) noexcept nogil
    void (*ascm_pool_walk)(ascm_pool *p, ascm_block_fn fn, void *ctx) noexcept nogil
    int (*ascm_pool_sleep)(ascm_pool *p, uint64_t addr, uint64_t *released) noexcept nogil
    int (*ascm_pool_is_large_block)(ascm_pool *p, uint64_t addr) noexcept nogil
    int (*ascm_pool_wake)(ascm_pool *p, uint64_t addr, uint64_t *mapped) noexcept nogil
    int (*ascm_acl_allocator_bind)(int slot, ascm_device *d) noexcept nogil
    void *(*ascm_acl_allocator_handle)(int slot) noexcept nogil
    ascm_pool *(*ascm_device_pool)(ascm_device *d, int kind) noexcept nogil
    int (*ascm_device_free_held)(ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind) noexcept nogil
    int (*ascm_pool_usable_size)(ascm_pool *p, uint64_t addr, uint64_t *size) noexcept nogil
    uint64_t (*ascm_pool_usable_for)(const ascm_pool *p, uint64_t size, uint64_t align) noexcept nogil

cdef const CoreCalls *core_calls() noexcept nogil
cdef str _fmt_bytes(uint64_t n)
cdef uint64_t _as_u64_slow(object v, str what) except? 0xFFFFFFFFFFFFFFFF
cdef int _kind_arg(object kind) except -1
