/* A pool's life: its creation (address maps, page counts, paging layer,
 * size-class regions), reset, close, trim and destruction.  Allocation and
 * free are in pool.c. */
#include "pool_internal.h"

#include <stdlib.h>

/* Paged pools place blocks under a granule (slab storage included) and
 * blocks of a granule or more in two regions of the range (fit.c): in a
 * paged pool a granule stays mapped while any live byte is in it, and small
 * blocks among large ones pin the granules the large ones leave.  Two, not
 * a region per size class: a region is a fixed part of the range (fit.c),
 * and regions small enough to fill up send blocks elsewhere, so that the
 * placement -- and the memory mapped -- moved with the range's size (at
 * 2 MiB granules a class region of a quarter of the peak held no block of a
 * large class).  Two regions of a quarter and three quarters of a range
 * of four times the peak do not fill up; figures in docs/ARCHITECTURE.md,
 * Note [Size-class regions].  A range of under MIN_REGION_GRANULES granules
 * keeps one region, whose boundary would fall inside a granule. */
#define PAGED_REGIONS 2u
#define MIN_REGION_GRANULES 4u

/* Words of sizes_freed: a bit per size in units, up to a granule. */
static size_t sizes_freed_words(uint64_t page, uint64_t gran) { return (size_t)((page / gran) >> 6) + 1; }

static uint32_t paged_regions(const ascm_pool *p) {
    return (p->size >> p->pshift) >= MIN_REGION_GRANULES ? PAGED_REGIONS : 1;
}

int ascm_pool_create(const ascm_pool_config *cfg, ascm_pool **out) {
    return ascm_pool_create_shared(cfg, NULL, out);
}

int ascm_pool_create_shared(const ascm_pool_config *cfg, ascm_lock *lock, ascm_pool **out) {
    *out = NULL;
    uint64_t gran = cfg->min_block, page = cfg->page_size ? cfg->page_size : cfg->min_block;
    if (!ascm_is_pow2(gran) || gran > (1ull << 31) || !ascm_is_pow2(page) || cfg->size == 0 ||
        cfg->size % gran ||
        cfg->base % gran || cfg->base + cfg->size < cfg->base ||
        /* a paged pool maps whole granules: one reaching past the range
         * would map memory that is not the pool's (issue 45.5) */
        (cfg->paged && (page < gran || cfg->size % page)))
        return ASCM_ERR_INVAL;
    ascm_pool *p = ascm_zalloc_lines(sizeof *p);
    if (!p) return ASCM_ERR_HOSTMEM;
    p->base = cfg->base;
    p->size = cfg->size;
    p->gran = gran;
    p->gshift = ascm_log2_floor(gran);
    p->page_size = page;
    p->pshift = ascm_log2_floor(page);
    /* pages are counted relative to base; a base that is not page aligned
     * shifts page boundaries, which only the caller can decide is right */
    p->npages = ((cfg->size - 1) >> p->pshift) + 1;
    p->lock_at = cfg->single_threaded ? NULL : lock ? lock : &p->lock;
    p->domain = p->lock_at ? p->lock_at : &p->lock;
    /* a charge hook of the caller's own may be read by others at any time;
     * a device's hook is read only under the lock its pools share */
    p->defers = !cfg->paged && (!cfg->charge || lock != NULL);
    p->charge = cfg->charge;
    p->charge_ctx = cfg->charge_ctx;
    p->sgshift = p->gshift > 13 ? p->gshift : 13;
    uint64_t nunits = cfg->size >> p->gshift;
    if (nunits >= (1ull << 32) - 1) { /* units, and map keys + 1, are 32-bit */
        free(p);
        return ASCM_ERR_INVAL;
    }
    if (page > gran) p->page_refs = ascm_zalloc_big(p->npages * sizeof *p->page_refs);
    if (cfg->paged) p->sizes_freed = calloc(sizes_freed_words(page, gran), sizeof *p->sizes_freed);
    int maps = ascm_map_init(&p->blocks) == ASCM_OK;
    if (cfg->paged && ascm_map_init(&p->asleep) != ASCM_OK) maps = 0;
    if (cfg->paged && (p->paging = malloc(sizeof *p->paging)) != NULL &&
        ascm_paging_init(p->paging, p->npages, p->base, p->pshift, cfg->release_threshold, cfg->map,
                         cfg->map_ctx) != ASCM_OK) {
        ascm_paging_destroy(p->paging);
        free(p->paging);
        p->paging = NULL;
        maps = 0;
    }
    if (!maps || (page > gran && !p->page_refs) || (cfg->paged && (!p->paging || !p->sizes_freed)) ||
        ascm_fit_init(&p->fit, nunits, cfg->paged ? paged_regions(p) : 1) != ASCM_OK) {
        ascm_pool_destroy(p);
        return ASCM_ERR_HOSTMEM;
    }
    if (p->fit.nregions > 1) { /* a quarter granule or more, under a granule */
        p->mapped_lo = (page / gran) / 4;
        p->mapped_span = page / gran - p->mapped_lo;
    }
    p->slab_max = p->slab_limit = ASCM_SLAB_MAX;
    p->slab_storage = ascm_pool_slab_source(p);
    ascm_slab_init_classes(p);
    if (p->lock_at == &p->lock) ascm_fork_register(&p->fork, &p->lock, ASCM_FORK_POOL, NULL);
    ascm_tcache_init(p);
    *out = p;
    return ASCM_OK;
}

void ascm_pool_destroy(ascm_pool *p) {
    if (!p) return;
    if (p->domain && p->domain->deferred == p) p->domain->deferred = NULL; /* a shared lock outlives it */
    ascm_tcache_destroy(p);
    ascm_fork_unregister(&p->fork);
    ascm_slab_destroy(p);
    ascm_fit_destroy(&p->fit);
    ascm_map_destroy(&p->blocks);
    if (p->page_refs) ascm_free_big(p->page_refs, p->npages * sizeof *p->page_refs);
    if (p->paging) ascm_paging_destroy(p->paging);
    free(p->paging);
    free(p->sizes_freed);
    ascm_set_clear(&p->sizes_given);
    ascm_map_destroy(&p->asleep);
    free(p);
}

/* The pool lock held (whole): every block freed, the statistics from zero. */
static void reset_locked(ascm_pool *p) {
    p->resets++; /* a batch that handed the lock over starts again (alloc_many) */
    if (p->paging)
        ascm_paging_reset(p->paging, p->charge, p->charge_ctx, p->pages_in_use);
    else if (p->pages_in_use && p->charge)
        p->charge(p->charge_ctx, -(int64_t)(p->pages_in_use << p->pshift));
    ascm_slab_forget_all(p);
    ascm_fit_reset(&p->fit);
    ascm_set_clear(&p->sizes_given); /* placement after a reset is a new pool's */
    p->last_freed = ASCM_NODE_NONE;
    p->kept_in_map = p->kept_reused = 0;
    ascm_map_clear(&p->blocks);
    if (p->asleep.slots) ascm_map_clear(&p->asleep);
    if (p->page_refs) memset(p->page_refs, 0, p->npages * sizeof *p->page_refs);
    p->pages_in_use = 0;
    if (p->paging) {
        p->paging->peak_mapped = 0;
        memset(p->sizes_freed, 0, sizes_freed_words(p->page_size, p->gran) * sizeof *p->sizes_freed);
    }
    p->used = p->requested = p->peak_used = p->peak_requested = 0;
    p->live_count = p->alloc_count = p->free_count = p->failed_count = p->peak_live_count = 0;
    p->alloc_bytes = p->freed_bytes = p->alloc_requested = p->freed_requested = 0;
    p->peak_pages = p->pages_taken = p->pages_given = 0;
}

void ascm_pool_reset(ascm_pool *p) {
    int whole = ascm_pool_lock_whole(p);
    reset_locked(p);
    p->closed = 0;
    ascm_pool_unlock_whole(p, whole);
}

/* The reset and the closing in one hold of the lock: as a reset followed by
 * ascm_pool_close_if_empty, a batch handed the lock between them allocated
 * again and the pool stayed open. */
void ascm_pool_close(ascm_pool *p) {
    int whole = ascm_pool_lock_whole(p);
    reset_locked(p);
    if (p->paging) ascm_paging_trim(p->paging, p->charge, p->charge_ctx); /* kept granules too */
    p->closed = 1;
    ascm_pool_unlock_whole(p, whole);
}

uint64_t ascm_pool_trim(ascm_pool *p) {
    int whole = ascm_pool_lock_whole(p);
    ascm_pool_flush_last_freed(p);
    uint64_t released = ascm_slab_trim(p);
    if (p->paging) released += ascm_paging_trim(p->paging, p->charge, p->charge_ctx);
    ascm_pool_unlock_whole(p, whole);
    return released;
}

int ascm_pool_set_placement(ascm_pool *p, int placement) {
    if (p->paging ? !ascm_placement_paged(placement) : !ascm_placement_contiguous(placement))
        return ASCM_ERR_INVAL;
    ascm_pool_lock(p);
    p->placement = (uint8_t)placement;
    __atomic_store_n(&p->slab_limit, ascm_slab_limit_of(placement, p->slab_max), __ATOMIC_RELAXED);
    ascm_pool_unlock(p);
    return ASCM_OK;
}

int ascm_pool_set_slab_max(ascm_pool *p, uint64_t bytes) {
    uint32_t slab_max = bytes < ASCM_SLAB_MAX ? (uint32_t)bytes : ASCM_SLAB_MAX;
    ascm_pool_lock(p);
    p->slab_max = slab_max;
    __atomic_store_n(&p->slab_limit, ascm_slab_limit_of(p->placement, slab_max), __ATOMIC_RELAXED);
    ascm_pool_unlock(p);
    return ASCM_OK;
}

uint64_t ascm_pool_slab_max(ascm_pool *p) {
    ascm_pool_lock(p);
    uint64_t slab_max = p->slab_max;
    ascm_pool_unlock(p);
    return slab_max;
}

/* A new pool's 0 is its kind's default: GRANULES for a paged pool,
 * KEPT_IN_PLACE (which the pool reads 0 as, pool.c) for a contiguous one. */
int ascm_pool_placement(ascm_pool *p) {
    ascm_pool_lock(p);
    int placement = p->placement;
    ascm_pool_unlock(p);
    return placement == ASCM_PLACE_GRANULES && !p->paging ? ASCM_PLACE_KEPT_IN_PLACE : placement;
}

int ascm_pool_set_release_cap(ascm_pool *p, uint64_t cap) {
    if (!p->paging) return ASCM_ERR_INVAL;
    int whole = ascm_pool_lock_whole(p);
    ascm_paging_set_cap(p->paging, p->charge, p->charge_ctx, cap);
    ascm_pool_unlock_whole(p, whole);
    return ASCM_OK;
}

uint64_t ascm_pool_release_threshold(ascm_pool *p) {
    if (!p->paging) return 0;
    ascm_pool_lock(p);
    uint64_t bytes = p->paging->threshold_pages << p->pshift;
    ascm_pool_unlock(p);
    return bytes;
}

void ascm_pool_detach_mapping(ascm_pool *p) {
    ascm_pool_lock(p);
    if (p->paging) p->paging->map = NULL;
    ascm_pool_unlock(p);
}

int ascm_pool_close_if_empty(ascm_pool *p) {
    int whole = ascm_pool_lock_whole(p);
    int empty = p->live_count == 0;
    if (empty) {
        ascm_pool_flush_last_freed(p);
        ascm_slab_trim(p);
        if (p->paging) ascm_paging_trim(p->paging, p->charge, p->charge_ctx); /* kept granules too */
        p->closed = 1;
    }
    ascm_pool_unlock_whole(p, whole);
    return empty;
}
