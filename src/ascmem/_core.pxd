# Declarations of the C core and of the extension types, for other Cython
# extensions:  from ascmem._core cimport Pool
from libc.stdint cimport uint64_t, int64_t

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


cdef class Pool:
    cdef ascm_pool *_p
    cdef readonly uint64_t base, capacity, min_block, page_size
    # C-level entry points for other extensions: no Python call, no GIL needed.
    cdef inline int alloc_raw(self, uint64_t size, uint64_t align, uint64_t *addr) noexcept nogil:
        return ascm_pool_alloc(self._p, size, align, addr)
    cdef inline int free_raw(self, uint64_t addr) noexcept nogil:
        return ascm_pool_free(self._p, addr)
    cdef _alloc_error(self, int st, uint64_t size, uint64_t align)


cdef class BuddyAllocator:
    cdef ascm_buddy *_b
    cdef readonly uint64_t base, capacity, min_block
