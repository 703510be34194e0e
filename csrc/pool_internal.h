/* What the pool's files (pool.c, pool_lifecycle.c, pool_blocks.c) share:
 * the page accounting, the charge of a block's pages, the checks of a
 * request, the live large block at a unit.  Static inline: pool.c's hot
 * paths are built from them. */
#ifndef ASCMEM_POOL_INTERNAL_H
#define ASCMEM_POOL_INTERNAL_H

#include "internal.h"
#include "pool_core.h"

/* Takes a reference on the pages of [off, off + bytes); the pages that had
 * no live byte before are the run [*lo, *hi) (interior pages always, edge
 * pages when their count was 0). */
static inline void page_take(ascm_pool *p, uint64_t off, uint64_t bytes, uint64_t *lo, uint64_t *hi) {
    uint64_t first = off >> p->pshift, last = (off + bytes - 1) >> p->pshift;
    *lo = first;
    *hi = last + 1;
    if (p->page_refs) { /* pages larger than units: edge pages may be shared */
        if (p->page_refs[first]++ != 0) *lo = first + 1;
        if (last != first && p->page_refs[last]++ != 0) *hi = last;
    }
    if (*hi < *lo) *hi = *lo;
    p->pages_in_use += *hi - *lo;
    p->pages_taken += *hi - *lo;
    if (p->pages_in_use > p->peak_pages) p->peak_pages = p->pages_in_use;
}

/* Drops the references taken by page_take; [*lo, *hi): the pages left with
 * no live byte. */
static inline void page_give(ascm_pool *p, uint64_t off, uint64_t bytes, uint64_t *lo, uint64_t *hi) {
    uint64_t first = off >> p->pshift, last = (off + bytes - 1) >> p->pshift;
    *lo = first;
    *hi = last + 1;
    if (p->page_refs) {
        if (--p->page_refs[first] != 0) *lo = first + 1;
        if (last != first && --p->page_refs[last] != 0) *hi = last;
    }
    if (*hi < *lo) *hi = *lo;
    p->pages_in_use -= *hi - *lo;
    p->pages_given += *hi - *lo;
}

/* A request in units, and its alignment in units (1: any unit). */
static inline uint64_t units_for(const ascm_pool *p, uint64_t bytes) {
    return (bytes + p->gran - 1) >> p->gshift;
}
static inline uint64_t align_units_for(const ascm_pool *p, uint64_t align) {
    return align > p->gran ? align >> p->gshift : 1;
}

/* Charges the pages of a block the fit path has set aside (a paged pool maps
 * them); on a refusal nothing stays charged or mapped. */
static inline int charge_block(ascm_pool *p, const ascm_fit_node *blk) {
    uint64_t off = (uint64_t)blk->off << p->gshift, len = (uint64_t)blk->len << p->gshift, lo, hi;
    page_take(p, off, len, &lo, &hi);
    if (hi == lo) return ASCM_OK;
    int st = ASCM_OK;
    if (ASCM_UNLIKELY(p->paging != NULL))
        st = ascm_paging_acquire(p->paging, p->charge, p->charge_ctx, lo, hi, p->pages_in_use);
    else if (p->charge && p->charge(p->charge_ctx, (int64_t)((hi - lo) << p->pshift)) != 0)
        st = ASCM_ERR_BUDGET;
    if (st != ASCM_OK) page_give(p, off, len, &lo, &hi);
    return st;
}

/* Whether n units fall in the sizes placed in mapped granules first (a
 * quarter granule or more, under a granule: pool.c, take_paged); their
 * frees are noted in sizes_freed. */
static inline int mapped_size(const ascm_pool *p, uint64_t n) {
    return n - p->mapped_lo < p->mapped_span;
}

static inline void discharge_block(ascm_pool *p, const ascm_fit_node *blk) {
    uint64_t lo, hi;
    page_give(p, (uint64_t)blk->off << p->gshift, (uint64_t)blk->len << p->gshift, &lo, &hi);
    if (ASCM_UNLIKELY(p->paging != NULL)) {
        if (mapped_size(p, blk->len)) p->sizes_freed[blk->len >> 6] |= 1ull << (blk->len & 63);
        if (hi > lo) ascm_paging_release(p->paging, p->charge, p->charge_ctx, lo, hi);
    } else if (hi != lo && p->charge) {
        p->charge(p->charge_ctx, -(int64_t)((hi - lo) << p->pshift));
    }
}

static inline int check_request(const ascm_pool *p, uint64_t size, uint64_t align) {
    if (size == 0 || !ascm_is_pow2(align)) return ASCM_ERR_INVAL;
    if (align > p->gran && (p->base & (align - 1))) return ASCM_ERR_INVAL;
    if (size > p->size) return ASCM_ERR_NOMEM; /* could never fit: the caller counts it (refused) */
    return ASCM_OK;
}

/* A padded request refused before anything is looked at: a size of 0 (as
 * ascm_pool_alloc), a pad over ASCM_MAX_PAD, or one that wraps past 2^64
 * (it would look like a small request and be handed a small block). */
static inline int bad_padded(uint64_t size, uint64_t pad) {
    return size == 0 || pad > ASCM_MAX_PAD || size + pad < size;
}


/* The live large block whose first unit is `unit`, or 0: the address map,
 * but for the kept last freed block, which keeps its entry while kept. */
static inline uint32_t live_large_at(const ascm_pool *p, uint32_t unit) {
    uint32_t node = ascm_map_get(&p->blocks, unit);
    return node != p->last_freed ? node : ASCM_NODE_NONE;
}

/* Where slabs take their storage from (pool.c): the pool's large-block path. */
ascm_block_source ascm_pool_slab_source(ascm_pool *p);

#endif
