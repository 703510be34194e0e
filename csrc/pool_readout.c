/* Reading the pool whole: statistics, walks, check() and the recount after
 * fork.  Each first flushes and holds every thread cache (tcache.c), so what
 * it reads is exact; the kept last freed block (pool.c) is handed to best
 * fit first, so free space reads as it is. */
#include "internal.h"
#include "pool_core.h"

#include <stdlib.h>

/* The largest run of units that free space and empty spare slabs make
 * together: what an allocation gets once it has trimmed the spares (as it
 * does before it fails).  A walk in address order, only when spares exist. */
static uint64_t largest_with_spares(const ascm_pool *p) {
    uint64_t best = 0, run = 0;
    for (uint32_t i = ascm_fit_first(&p->fit); i; i = p->fit.nodes[i].next_phys) {
        const ascm_fit_node *n = &p->fit.nodes[i];
        int reclaimable = n->is_free || (n->is_slab && ascm_slab_is_empty_at(p, (uint64_t)n->off << p->gshift));
        run = reclaimable ? run + n->len : 0;
        if (run > best) best = run;
    }
    return best;
}

uint64_t ascm_pool_held_bytes_locked(const ascm_pool *p) {
    return (p->pages_in_use + (p->paging ? p->paging->kept_count : 0)) << p->pshift;
}

uint64_t ascm_pool_used(ascm_pool *p) {
    int whole = ascm_pool_lock_whole(p);
    uint64_t used = p->used;
    ascm_pool_unlock_whole(p, whole);
    return used;
}

void ascm_pool_stats(ascm_pool *p, ascm_stats *st) {
    memset(st, 0, sizeof *st);
    int whole = ascm_pool_lock_whole(p);
    ascm_pool_flush_last_freed(p);
    st->capacity = p->size;
    st->used = p->used;
    st->requested = p->requested;
    st->peak_used = p->peak_used;
    st->peak_requested = p->peak_requested;
    st->cached_bytes = ascm_slab_cached_bytes(p);
    st->free = (p->fit.free_units << p->gshift) + st->cached_bytes;
    st->largest_free = (st->cached_bytes ? largest_with_spares(p) : ascm_fit_largest(&p->fit)) << p->gshift;
    st->peak_live_count = p->peak_live_count;
    st->live_count = p->live_count;
    st->alloc_count = p->alloc_count;
    st->alloc_bytes = p->alloc_bytes;
    st->peak_pages = p->peak_pages;
    st->pages_taken = p->pages_taken;
    st->pages_given = p->pages_given;
    st->freed_bytes = p->freed_bytes;
    st->alloc_requested = p->alloc_requested;
    st->freed_requested = p->freed_requested;
    st->free_count = p->free_count;
    st->failed_count = p->failed_count;
    st->pages_in_use = p->pages_in_use;
    st->page_size = p->page_size;
    st->slab_bytes = p->slab_bytes;
    st->metadata_bytes = sizeof *p + ascm_map_bytes(&p->blocks) +
                         (p->page_refs ? p->npages * sizeof *p->page_refs : 0) +
                         p->fit.ncap * sizeof *p->fit.nodes +
                         (p->fit.nregions - 1) * sizeof *p->fit.extra + /* regions' bins */
                         ascm_slab_metadata_bytes(p) +
                         (p->paging ? sizeof *p->paging + ascm_hbm_bytes(&p->paging->kept) : 0);
    if (p->paging) {
        st->mapped = (p->pages_in_use + p->paging->kept_count) << p->pshift;
        st->peak_mapped = p->paging->peak_mapped << p->pshift;
        st->map_calls = p->paging->map_calls;
        st->unmap_calls = p->paging->unmap_calls;
    }
    ascm_pool_unlock_whole(p, whole);
}

void ascm_pool_walk_free(ascm_pool *p, ascm_block_fn fn, void *ctx) {
    int whole = ascm_pool_lock_whole(p);
    ascm_pool_flush_last_freed(p);
    for (uint32_t i = 1; i < p->fit.nused; i++) {
        const ascm_fit_node *n = &p->fit.nodes[i];
        if (n->len && n->is_free)
            fn(ctx, p->base + ((uint64_t)n->off << p->gshift), (uint64_t)n->len << p->gshift, 0);
    }
    ascm_pool_unlock_whole(p, whole);
}

void ascm_pool_reset_peaks(ascm_pool *p) {
    int whole = ascm_pool_lock_whole(p);
    p->peak_used = p->used;
    p->peak_requested = p->requested;
    p->peak_live_count = p->live_count;
    if (p->paging) p->paging->peak_mapped = p->pages_in_use + p->paging->kept_count;
    p->peak_pages = p->pages_in_use;
    ascm_pool_unlock_whole(p, whole);
}

void ascm_pool_walk(ascm_pool *p, ascm_block_fn fn, void *ctx) {
    int whole = ascm_pool_lock_whole(p);
    ascm_pool_flush_last_freed(p);
    for (uint32_t i = 1; i < p->fit.nused; i++) {
        const ascm_fit_node *n = &p->fit.nodes[i];
        if (n->len && !n->is_free && !n->is_slab) {
            uint64_t len = (uint64_t)n->len << p->gshift;
            fn(ctx, p->base + ((uint64_t)n->off << p->gshift), len, len - n->slack);
        }
    }
    ascm_slab_walk(p, fn, ctx);
    ascm_pool_unlock_whole(p, whole);
}

/* The run of pages [lo, hi) held open by ascm_pool_walk_held, reported when
 * the next held page is not adjacent to it. */
typedef struct {
    const ascm_pool *p;
    ascm_block_fn fn;
    void *ctx;
    uint64_t lo, hi;
} held_run;

static void held_add(held_run *r, uint64_t lo, uint64_t hi) {
    if (r->hi > r->lo && lo <= r->hi) {
        if (hi > r->hi) r->hi = hi;
        return;
    }
    if (r->hi > r->lo)
        r->fn(r->ctx, r->p->base + (r->lo << r->p->pshift), (r->hi - r->lo) << r->p->pshift, 0);
    r->lo = lo;
    r->hi = hi;
}

/* Pages are held by what charges them (charge_block in pool_internal.h):
 * live large blocks and slab storage, whole pages each, but not a sleeping
 * block; and, in a paged pool, the kept granules under free blocks.  Their
 * sum is pages_in_use (+ kept_count), the figure check() verifies. */
void ascm_pool_walk_held(ascm_pool *p, ascm_block_fn fn, void *ctx) {
    int whole = ascm_pool_lock_whole(p);
    ascm_pool_flush_last_freed(p);
    held_run r = {p, fn, ctx, 0, 0};
    int kept = p->paging && p->paging->kept_count;
    for (uint32_t i = ascm_fit_first(&p->fit); i; i = p->fit.nodes[i].next_phys) {
        const ascm_fit_node *n = &p->fit.nodes[i];
        uint64_t off = (uint64_t)n->off << p->gshift, len = (uint64_t)n->len << p->gshift;
        uint64_t first = off >> p->pshift, last = (off + len - 1) >> p->pshift;
        int asleep = !n->is_free && p->asleep.count && ascm_map_get(&p->asleep, n->off);
        if (!n->is_free && !asleep) {
            held_add(&r, first, last + 1);
        } else if (kept) {
            for (uint64_t q = first; q <= last; q++)
                if (ascm_paging_kept(p->paging, q)) held_add(&r, q, q + 1);
        }
    }
    held_add(&r, UINT64_MAX, UINT64_MAX); /* reports the last run */
    ascm_pool_unlock_whole(p, whole);
}

void ascm_pool_recount(ascm_pool *p) {
    uint64_t live = 0, used = 0, requested = 0;
    for (uint32_t i = 1; i < p->fit.nused; i++) {
        const ascm_fit_node *n = &p->fit.nodes[i];
        if (!n->len || n->is_free || n->is_slab || i == p->last_freed) continue;
        live++;
        used += (uint64_t)n->len << p->gshift;
        requested += ((uint64_t)n->len << p->gshift) - n->slack;
    }
    for (uint32_t si = 1; si < p->nslabs_used; si++) {
        const ascm_slab *s = ascm_slab_in_use(p, si);
        uint32_t size = s ? p->classes[s->cls].size : 0;
        for (uint32_t slot = 0; s && slot < s->count; slot++)
            if (ascm_slab_is_live(p, s, slot)) {
                live++;
                used += size;
                requested += size - ascm_slab_slack(s, slot);
            }
    }
    p->live_count = live;
    p->used = used;
    p->requested = requested;
    p->free_count = p->alloc_count - live;
    p->freed_bytes = p->alloc_bytes - used;
    p->freed_requested = p->alloc_requested - requested;
    if (used > p->peak_used) p->peak_used = used;
    if (requested > p->peak_requested) p->peak_requested = requested;
    if (live > p->peak_live_count) p->peak_live_count = live;
}

static int check_locked(ascm_pool *p, char *msg, size_t msglen) {
    int st = ascm_fit_check(&p->fit, msg, msglen);
    if (st != ASCM_OK) return st;
    /* 0 is either kind's default; another kind's placement would send a
     * paged pool's kept block to ascm_fit_has_equal_below, a one-region scan */
    if (p->placement != ASCM_PLACE_GRANULES &&
        !(p->paging ? ascm_placement_paged(p->placement) : ascm_placement_contiguous(p->placement)))
        return ascm_fail(msg, msglen, "placement %u is not one of the pool's kind", (unsigned)p->placement);
    uint64_t live = 0, used = 0, requested = 0, pages = 0;
    uint32_t *refs = calloc(p->npages, sizeof *refs);
    uint8_t *page_used = p->paging ? calloc(p->npages, 1) : NULL; /* paged: granules with a live byte */
    if (!refs || (p->paging && !page_used)) {
        free(refs);
        free(page_used);
        return ASCM_ERR_HOSTMEM;
    }
    uint64_t large = 0, asleep_seen = 0;
    if (p->last_freed) {
        const ascm_fit_node *n = p->last_freed < p->fit.nused ? &p->fit.nodes[p->last_freed] : NULL;
        /* in a loop of reuse it keeps its map entry while kept (pool.c) */
        if (!n || !n->len || n->is_free || n->is_slab || (p->kept_in_map && n->by_handle) ||
            ascm_map_get(&p->blocks, n->off) != (p->kept_in_map ? p->last_freed : 0))
            st = ascm_fail(msg, msglen, "the kept last freed block is not a freed large block");
        else large += p->kept_in_map;
    }
    for (uint32_t i = 1; i < p->fit.nused && st == ASCM_OK; i++) {
        const ascm_fit_node *n = &p->fit.nodes[i];
        if (!n->len || n->is_free || i == p->last_freed) continue; /* recycled, free or kept */
        uint64_t off = (uint64_t)n->off << p->gshift, len = (uint64_t)n->len << p->gshift;
        uint64_t first = off >> p->pshift, last = (off + len - 1) >> p->pshift;
        if (p->asleep.count && ascm_map_get(&p->asleep, n->off)) { /* holds no page */
            if (n->is_slab || ascm_map_get(&p->blocks, n->off) != i)
                st = ascm_fail(msg, msglen, "a sleeping block at unit %llu is not a live large "
                               "block", (unsigned long long)n->off);
            asleep_seen++;
        } else {
            if (page_used) memset(page_used + first, 1, last - first + 1);
            if (p->page_refs) {
                refs[first]++;
                if (last != first) refs[last]++;
                pages += last > first + 1 ? last - first - 1 : 0;
            } else {
                pages += len >> p->pshift;
            }
        }
        if (n->is_slab) continue; /* slab_check matches slabs with the slab table */
        if (n->by_handle ? ascm_map_get(&p->blocks, n->off) != 0 : ascm_map_get(&p->blocks, n->off) != i) {
            st = ascm_fail(msg, msglen, "used block at unit %llu is %s the block map",
                           (unsigned long long)n->off, n->by_handle ? "in" : "not in");
        } else if (n->slack >= p->gran + ASCM_MAX_PAD || n->slack >= len) {
            st = ascm_fail(msg, msglen, "block at unit %llu has a bad requested size",
                           (unsigned long long)n->off);
        }
        large += !n->by_handle;
        live++;
        used += len;
        requested += len - n->slack;
    }
    if (st == ASCM_OK && asleep_seen != p->asleep.count)
        st = ascm_fail(msg, msglen, "the sleeping-block map holds blocks that are not live");
    if (st == ASCM_OK && large != p->blocks.count)
        st = ascm_fail(msg, msglen, "block map holds %u entries for %llu blocks", p->blocks.count,
                       (unsigned long long)large);
    for (uint64_t pg = 0; p->page_refs && pg < p->npages && st == ASCM_OK; pg++) {
        if (refs[pg] != p->page_refs[pg])
            st = ascm_fail(msg, msglen, "page %llu reference count is wrong", (unsigned long long)pg);
        pages += refs[pg] != 0;
    }
    free(refs);
    if (st == ASCM_OK && page_used) st = ascm_paging_check(p->paging, page_used, msg, msglen);
    free(page_used);
    if (st != ASCM_OK) return st;
    if (pages != p->pages_in_use) return ascm_fail(msg, msglen, "pages in use is wrong");
    st = ascm_slab_check(p, &live, &used, &requested, msg, msglen);
    if (st != ASCM_OK) return st;
    if (p->hot_slab) {
        const ascm_slab *s = p->hot_slab < p->nslabs_used ? ascm_slab_in_use(p, p->hot_slab) : NULL;
        if (!s || s->off != p->hot_off ||
            p->hot_len != p->classes[s->cls].slab_bytes)
            return ascm_fail(msg, msglen, "the remembered slab of the last free is stale");
    } else if (p->hot_len) {
        return ascm_fail(msg, msglen, "a remembered slab range without a slab");
    }
    if (live != p->live_count || used != p->used || requested != p->requested)
        return ascm_fail(msg, msglen, "statistics disagree with the live blocks");
    if (p->alloc_count - p->free_count != p->live_count)
        return ascm_fail(msg, msglen, "alloc_count - free_count != live_count");
    if (p->alloc_bytes - p->freed_bytes != p->used ||
        p->alloc_requested - p->freed_requested != p->requested)
        return ascm_fail(msg, msglen, "cumulative bytes allocated - freed != bytes in use");
    if (p->peak_used < p->used || p->peak_requested < p->requested || p->used < p->requested)
        return ascm_fail(msg, msglen, "peaks or rounding are inconsistent");
    return ASCM_OK;
}

int ascm_pool_check(ascm_pool *p, char *msg, size_t msglen) {
    int whole = ascm_pool_lock_whole(p);
    int st = check_locked(p, msg, msglen);
    ascm_pool_unlock_whole(p, whole);
    return st;
}
