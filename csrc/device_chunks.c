/* A device kind's chunks: each a pool over a range from an upstream, listed
 * in an immutable table per kind (device_internal.h, "Chunks"); growing and
 * giving back chunks, and the readouts summed over them. */
#include "device_internal.h"

#include <stdlib.h>
#include <string.h>

ascm_pool *ascm_device_pool(ascm_device *d, int kind) {
    return ascm_device_chunk(d, kind, 0, NULL, NULL);
}

int ascm_device_has_kind(const ascm_device *d, int kind) {
    return kind >= 0 && kind < ASCM_KINDS && table_of(d, kind) != NULL;
}

int ascm_device_chunk_count(const ascm_device *d, int kind) {
    chunk_table *t = kind >= 0 && kind < ASCM_KINDS ? table_of(d, kind) : NULL;
    return t ? (int)t->n : 0;
}

ascm_pool *ascm_device_chunk(ascm_device *d, int kind, int i, uint64_t *base, uint64_t *size) {
    chunk_table *t = kind >= 0 && kind < ASCM_KINDS ? table_of(d, kind) : NULL;
    if (!t || i < 0 || (uint32_t)i >= t->n) return NULL;
    if (base) *base = t->c[i].base;
    if (size) *size = t->c[i].size;
    return t->c[i].pool;
}

uint64_t ascm_device_generation(const ascm_device *d, int kind) {
    chunk_table *t = kind >= 0 && kind < ASCM_KINDS ? table_of(d, kind) : NULL;
    return t ? t->generation : 0;
}

void ascm_device_set_grow(ascm_device *d, ascm_grow_fn fn, void *ctx) {
    ascm_lock_acquire(&d->chunks_lock);
    d->grow_ctx = ctx;
    d->grow = fn;
    ascm_lock_release(&d->chunks_lock);
}

void ascm_device_set_release(ascm_device *d, ascm_release_fn fn, void *ctx) {
    ascm_lock_acquire(&d->chunks_lock);
    d->release_ctx = ctx;
    d->release = fn;
    ascm_lock_release(&d->chunks_lock);
}

uint64_t ascm_device_release_idle(ascm_device *d) {
    ascm_lock_acquire(&d->chunks_lock);
    ascm_release_fn fn = d->release;
    void *ctx = d->release_ctx;
    ascm_lock_release(&d->chunks_lock);
    return fn ? fn(ctx) : 0;
}

/* Thread caches come to a device's pools as to any pool's (tcache.c), but
 * the media window's (caches_mode_for): the pools share the device's lock,
 * which a cache takes only to refill or give back, and slots come and go
 * inside slabs whose pages are charged already, so the budget never sees
 * them.  Not on a paged device: there a cache's
 * flush inside a statistics call may release a slab and unmap granules,
 * which the acl backend's mapper applies only after an allocation or free
 * (_acl_paging.pxi). */
int ascm_device_set_thread_caches(ascm_device *d, int mode) {
    if (mode != ASCM_CACHES_OFF && mode != ASCM_CACHES_ON && mode != ASCM_CACHES_AUTO) return ASCM_ERR_INVAL;
    if (d->paged && mode != ASCM_CACHES_OFF) return ASCM_ERR_UNSUPPORTED;
    ascm_lock_acquire(&d->chunks_lock); /* a chunk added meanwhile takes the new mode */
    d->caches_mode = mode;
    int st = ASCM_OK;
    for (int k = 0; k < ASCM_KINDS; k++) {
        chunk_table *t = table_of(d, k);
        for (uint32_t i = 0; t && i < t->n; i++) {
            int got = ascm_pool_set_thread_caches(t->c[i].pool, caches_mode_for(d, k));
            if (got != ASCM_OK) st = got;
        }
    }
    ascm_lock_release(&d->chunks_lock);
    return st;
}

/* A device's placement reaches each of its pools that can take it, those of
 * chunks added later included (give_placement): a paged device takes a paged
 * placement for its paged pools (its kinds that are not paged keep their
 * default), a device that is not paged a contiguous one for every pool of
 * every kind.  The other kind's placements are refused: the device would
 * hold a placement none of its pools has.  chunks_lock before a pool's lock,
 * as in ascm_device_release_empty. */
static void give_every_pool(ascm_device *d) {
    for (int k = 0; k < ASCM_KINDS; k++) {
        chunk_table *t = table_of(d, k);
        for (uint32_t i = 0; t && i < t->n; i++) give_placement(d, t->c[i].pool);
    }
}

int ascm_device_set_placement(ascm_device *d, int placement) {
    if (d->paged ? !ascm_placement_paged(placement) : !ascm_placement_contiguous(placement))
        return ASCM_ERR_INVAL;
    ascm_lock_acquire(&d->chunks_lock);
    d->placement = placement;
    give_every_pool(d);
    ascm_lock_release(&d->chunks_lock);
    return ASCM_OK;
}

int ascm_device_placement(ascm_device *d) {
    ascm_lock_acquire(&d->chunks_lock);
    int placement = d->placement;
    ascm_lock_release(&d->chunks_lock);
    return placement == ASCM_PLACE_GRANULES && !d->paged ? ASCM_PLACE_KEPT_IN_PLACE : placement;
}

int ascm_device_set_slab_max(ascm_device *d, uint64_t bytes) {
    ascm_lock_acquire(&d->chunks_lock);
    d->slab_max = bytes < ASCM_SLAB_MAX ? bytes : ASCM_SLAB_MAX;
    give_every_pool(d);
    ascm_lock_release(&d->chunks_lock);
    return ASCM_OK;
}

uint64_t ascm_device_slab_max(ascm_device *d) {
    ascm_lock_acquire(&d->chunks_lock);
    uint64_t slab_max = d->slab_max;
    ascm_lock_release(&d->chunks_lock);
    return slab_max;
}

uint64_t ascm_device_min_block(const ascm_device *d) {
    return d->min_block;
}

uint64_t ascm_device_trim(ascm_device *d) {
    uint64_t released = 0;
    for (int k = 0; k < ASCM_KINDS; k++) {
        chunk_table *t = table_of(d, k);
        for (uint32_t i = 0; t && i < t->n; i++) released += ascm_pool_trim(t->c[i].pool);
    }
    return released;
}

/* Keeps a replaced table or a retired pool until reset or destroy; r is
 * allocated by the caller beforehand, so that burying cannot fail. */
static void bury(ascm_device *d, retired *r, chunk_table *table, ascm_pool *pool) {
    r->table = table;
    r->pool = pool;
    r->next = d->graveyard;
    d->graveyard = r;
}

int ascm_device_add_chunk(ascm_device *d, int kind, uint64_t base, uint64_t size) {
    if (kind < 0 || kind >= ASCM_KINDS || !size || base + size < base) return ASCM_ERR_INVAL;
    /* the pool is made before the chunks lock is taken: making one registers
     * it for fork(), and no core lock may be held then (forksafe.c) */
    ascm_pool *pool = NULL;
    chunk_table *fresh = malloc(sizeof *fresh);
    retired *grave = malloc(sizeof *grave);
    int st = fresh && grave ? ascm_device_new_pool(d, kind, base, size, &pool) : ASCM_ERR_HOSTMEM;
    if (st == ASCM_OK) {
        ascm_lock_acquire(&d->chunks_lock);
        chunk_table *t = table_of(d, kind);
        st = !t ? ASCM_ERR_UNSUPPORTED : t->n == ASCM_MAX_CHUNKS ? ASCM_ERR_NOMEM : ASCM_OK;
        for (uint32_t i = 0; st == ASCM_OK && i < t->n; i++) /* ranges must not overlap */
            if (base < t->c[i].base + t->c[i].size && t->c[i].base < base + size) st = ASCM_ERR_INVAL;
        if (st == ASCM_OK) st = give_caches_mode(d, kind, pool); /* under the lock: the mode now */
        if (st == ASCM_OK) give_placement(d, pool);
        if (st == ASCM_OK) {
            *fresh = *t;
            bury(d, grave, t, NULL);
            fresh->c[t->n] = (chunk){.base = base, .size = size, .pool = pool};
            fresh->n = t->n + 1;
            fresh->generation = t->generation + 1;
            atomic_store_explicit(&d->table[kind], fresh, memory_order_release);
            fresh = NULL;
            grave = NULL;
            pool = NULL;
        }
        ascm_lock_release(&d->chunks_lock);
    }
    free(fresh);
    free(grave);
    if (pool) ascm_pool_destroy(pool);
    return st;
}

int ascm_device_release_empty(ascm_device *d, int kind, uint64_t *bases, uint64_t *sizes, int max,
                              int *count) {
    *count = 0;
    if (kind < 0 || kind >= ASCM_KINDS) return ASCM_ERR_INVAL;
    ascm_lock_acquire(&d->chunks_lock);
    chunk_table *t = table_of(d, kind), *fresh = NULL;
    int st = t ? ASCM_OK : ASCM_ERR_UNSUPPORTED;
    if (st == ASCM_OK && !(fresh = malloc(sizeof *fresh))) st = ASCM_ERR_HOSTMEM;
    /* room in the graveyard first, so that nothing can fail half-way */
    retired *spare[ASCM_MAX_CHUNKS + 1];
    int nspare = 0;
    for (; st == ASCM_OK && t && nspare <= (int)t->n; nspare++)
        if (!(spare[nspare] = malloc(sizeof *spare[nspare]))) st = ASCM_ERR_HOSTMEM;
    if (st == ASCM_OK) {
        *fresh = *t;
        fresh->n = 0;
        for (uint32_t i = 0; i < t->n; i++) {
            ascm_pool *p = t->c[i].pool;
            ascm_stats s;
            if (*count < max && ascm_pool_close_if_empty(p)) {
                ascm_pool_stats(p, &s);
                kind_totals *r = &d->retired_totals[kind];
                r->alloc_count += s.alloc_count;
                r->free_count += s.free_count;
                r->alloc_bytes += s.alloc_bytes;
                r->freed_bytes += s.freed_bytes;
                r->alloc_requested += s.alloc_requested;
                r->freed_requested += s.freed_requested;
                if (s.peak_used > r->peak_used) r->peak_used = s.peak_used;
                if (s.peak_requested > r->peak_requested) r->peak_requested = s.peak_requested;
                bases[*count] = t->c[i].base;
                sizes[*count] = t->c[i].size;
                ++*count;
                bury(d, spare[--nspare], NULL, p);
            } else {
                fresh->c[fresh->n++] = t->c[i];
            }
        }
        fresh->generation = t->generation + 1;
        bury(d, spare[--nspare], t, NULL);
        atomic_store_explicit(&d->table[kind], fresh, memory_order_release);
    } else {
        free(fresh);
    }
    while (nspare > 0) free(spare[--nspare]);
    ascm_lock_release(&d->chunks_lock);
    return st;
}

uint64_t ascm_device_kind_release_threshold(ascm_device *d, int kind) {
    chunk_table *t = kind >= 0 && kind < ASCM_KINDS ? table_of(d, kind) : NULL;
    uint64_t bytes = 0;
    for (uint32_t i = 0; t && i < t->n; i++) bytes += ascm_pool_release_threshold(t->c[i].pool);
    return bytes;
}

void ascm_device_kind_stats(ascm_device *d, int kind, ascm_stats *out) {
    memset(out, 0, sizeof *out);
    chunk_table *t = kind >= 0 && kind < ASCM_KINDS ? table_of(d, kind) : NULL;
    if (!t) return;
    uint64_t peak_used = 0, peak_requested = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        ascm_stats s;
        ascm_pool_stats(t->c[i].pool, &s);
        out->capacity += s.capacity;
        out->used += s.used;
        out->requested += s.requested;
        peak_used += s.peak_used;
        peak_requested += s.peak_requested;
        out->free += s.free;
        if (s.largest_free > out->largest_free) out->largest_free = s.largest_free;
        out->live_count += s.live_count;
        out->peak_live_count += s.peak_live_count; /* several chunks: an upper bound */
        out->cached_bytes += s.cached_bytes;
        out->alloc_count += s.alloc_count;
        out->free_count += s.free_count;
        out->pages_in_use += s.pages_in_use;
        out->page_size = s.page_size;
        out->slab_bytes += s.slab_bytes;
        out->metadata_bytes += s.metadata_bytes;
        out->mapped += s.mapped;
        out->peak_mapped += s.peak_mapped; /* several chunks: an upper bound, as the other peaks */
        out->map_calls += s.map_calls;
        out->unmap_calls += s.unmap_calls;
        out->alloc_bytes += s.alloc_bytes;
        out->freed_bytes += s.freed_bytes;
        out->peak_pages += s.peak_pages; /* several chunks: an upper bound */
        out->pages_taken += s.pages_taken;
        out->pages_given += s.pages_given;
        out->alloc_requested += s.alloc_requested;
        out->freed_requested += s.freed_requested;
    }
    const kind_totals *r = &d->retired_totals[kind];
    out->alloc_count += r->alloc_count;
    out->free_count += r->free_count;
    out->alloc_bytes += r->alloc_bytes;
    out->freed_bytes += r->freed_bytes;
    out->alloc_requested += r->alloc_requested;
    out->freed_requested += r->freed_requested;
    out->failed_count = atomic_load_explicit(&d->failed[kind], memory_order_relaxed);
    /* one chunk: exact; several: the sum of their peaks, an upper bound */
    out->peak_used = peak_used > r->peak_used ? peak_used : r->peak_used;
    out->peak_requested = peak_requested > r->peak_requested ? peak_requested : r->peak_requested;
    if (!out->page_size) out->page_size = page_of(d, kind);
}

