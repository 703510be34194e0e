/* ascmem public C API.
 *
 * Allocators here manage *address ranges*: [base, base + size) is a span of
 * numbers that may be device memory the host cannot touch, so every piece of
 * metadata lives outside the range (out-of-band) and nothing here ever reads
 * or writes an address it hands out.
 *
 * Every function returns a status code (ASCM_OK on success); none aborts on
 * bad input.  Pools are internally locked and may be shared by threads; a
 * buddy allocator on its own is not locked.
 */
#ifndef ASCMEM_H
#define ASCMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ASCM_VERSION_MAJOR 0
#define ASCM_VERSION_MINOR 1

typedef enum ascm_status {
    ASCM_OK = 0,
    ASCM_ERR_NOMEM = 1,    /* no free block large enough (or over the page budget) */
    ASCM_ERR_INVAL = 2,    /* bad argument: size 0, bad alignment, bad configuration */
    ASCM_ERR_BADFREE = 3,  /* address is not the start of a live block */
    ASCM_ERR_CORRUPT = 4,  /* an invariant does not hold (check()) */
    ASCM_ERR_HOSTMEM = 5,  /* the host could not give memory for metadata */
    ASCM_ERR_BUDGET = 6    /* room in the range, but the page budget said no */
} ascm_status;

/* Counters every allocator keeps.  Sizes in bytes. */
typedef struct ascm_stats {
    uint64_t capacity;       /* bytes managed */
    uint64_t used;           /* bytes of live blocks as handed out (after rounding) */
    uint64_t requested;      /* bytes callers asked for, over live blocks */
    uint64_t peak_used;
    uint64_t peak_requested;
    uint64_t free;           /* bytes not held by any block or slab */
    uint64_t largest_free;   /* largest single request that would succeed now */
    uint64_t live_count;
    uint64_t alloc_count;    /* successful allocations */
    uint64_t free_count;     /* successful frees */
    uint64_t failed_count;   /* allocations refused for lack of room or budget */
    uint64_t pages_in_use;   /* pages of page_size holding any live block (pool only) */
    uint64_t page_size;
    uint64_t slab_bytes;     /* bytes held by slabs (pool only) */
    uint64_t metadata_bytes; /* host bytes of out-of-band metadata */
} ascm_stats;

/* ---- buddy allocator ---------------------------------------------------- */

typedef struct ascm_buddy ascm_buddy;

/* size: a multiple of min_block; min_block: a power of two; base: a multiple
 * of min_block.  Alignment of a block is guaranteed up to the alignment of
 * base. */
int ascm_buddy_create(uint64_t base, uint64_t size, uint64_t min_block, ascm_buddy **out);
void ascm_buddy_destroy(ascm_buddy *b);
int ascm_buddy_alloc(ascm_buddy *b, uint64_t size, uint64_t align, uint64_t *addr);
int ascm_buddy_free(ascm_buddy *b, uint64_t addr);
int ascm_buddy_usable_size(const ascm_buddy *b, uint64_t addr, uint64_t *size);
int ascm_buddy_requested_size(const ascm_buddy *b, uint64_t addr, uint64_t *size);
void ascm_buddy_stats(const ascm_buddy *b, ascm_stats *st);
void ascm_buddy_reset(ascm_buddy *b);
/* Walks every invariant; on failure returns ASCM_ERR_CORRUPT and writes a
 * sentence naming the broken condition into msg. */
int ascm_buddy_check(const ascm_buddy *b, char *msg, size_t msglen);

/* ---- pool: slabs for small requests, best fit for large ones ------------ */

typedef struct ascm_pool ascm_pool;

/* Called when the number of pages holding live blocks changes; delta_bytes
 * is a multiple of page_size.  Returning non-zero for a positive delta makes
 * the allocation fail with ASCM_ERR_BUDGET; a negative delta must succeed. */
typedef int (*ascm_charge_fn)(void *ctx, int64_t delta_bytes);

typedef struct ascm_pool_config {
    uint64_t base;
    uint64_t size;        /* a multiple of min_block */
    uint64_t min_block;   /* power of two: granule of large blocks and slabs */
    uint64_t page_size;   /* power of two; 0 means min_block */
    ascm_charge_fn charge;  /* optional */
    void *charge_ctx;
} ascm_pool_config;

int ascm_pool_create(const ascm_pool_config *cfg, ascm_pool **out);
void ascm_pool_destroy(ascm_pool *p);
int ascm_pool_alloc(ascm_pool *p, uint64_t size, uint64_t align, uint64_t *addr);
int ascm_pool_free(ascm_pool *p, uint64_t addr);
int ascm_pool_usable_size(ascm_pool *p, uint64_t addr, uint64_t *size);
int ascm_pool_requested_size(ascm_pool *p, uint64_t addr, uint64_t *size);
void ascm_pool_stats(ascm_pool *p, ascm_stats *st);
void ascm_pool_reset(ascm_pool *p);
/* Gives the empty slabs kept as spares back to the large-block path (and
 * their pages to the budget); returns the bytes released. */
uint64_t ascm_pool_trim(ascm_pool *p);
int ascm_pool_check(ascm_pool *p, char *msg, size_t msglen);
int ascm_pool_contains(const ascm_pool *p, uint64_t addr);
uint64_t ascm_pool_base(const ascm_pool *p);
uint64_t ascm_pool_size(const ascm_pool *p);
/* Calls fn(ctx, addr, usable, requested) for each live block, under the lock. */
typedef void (*ascm_block_fn)(void *ctx, uint64_t addr, uint64_t usable, uint64_t requested);
void ascm_pool_walk(ascm_pool *p, ascm_block_fn fn, void *ctx);

/* Batch calls: one lock for the whole batch.  alloc_many stops at the first
 * failure and returns its status with *done set to how many succeeded;
 * free_many frees every valid address and returns the first error seen, with
 * *done counting the successful frees. */
int ascm_pool_alloc_many(ascm_pool *p, const uint64_t *sizes, size_t n, uint64_t align,
                         uint64_t *addrs, size_t *done);
int ascm_pool_free_many(ascm_pool *p, const uint64_t *addrs, size_t n, size_t *done);

const char *ascm_status_str(int status);

#ifdef __cplusplus
}
#endif
#endif /* ASCMEM_H */
