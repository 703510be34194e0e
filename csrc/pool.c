/* Pool: routes small requests to slabs and large ones to best fit, keeps the
 * statistics and the page accounting, and holds the lock.
 *
 * Why and where each mechanism stops: docs/ARCHITECTURE.md, Note [Page
 * accounting] (first and last pages counted), Note [The kept block]
 * (last_freed, kept_reused, kept_in_map; live_large_at treats it as free;
 * anything that reads free space gives it to best fit first) and Note
 * [Deferred discharge] (a reuse loop's free leaves the pages taken and
 * records the pool in its lock; ascm_pool_settle gives them before anything
 * else runs under that lock; paged pools and pools with a creator's charge
 * hook give at once).
 */
#include "pool_internal.h"

/* The lock is held; its deferred pool's kept block gives its pages. */
void ascm_pool_settle(ascm_lock *domain) {
    ascm_pool *p = domain->deferred;
    domain->deferred = NULL;
    discharge_block(p, &p->fit.nodes[p->last_freed]);
}

/* The size-class region of a block of `units` in a paged pool (why regions:
 * pool_lifecycle.c, where the range is cut into them). */
static inline uint32_t region_for(const ascm_pool *p, uint64_t units) {
    uint64_t granules = units >> (p->pshift - p->gshift);
    uint32_t c = granules ? 1 + ascm_log2_floor(granules) : 0;
    return c < p->fit.nregions ? c : p->fit.nregions - 1;
}

/* Granule q of a paged pool is mapped: a live byte in it, or kept.  Asked
 * of the granules at an end of a free block only, whose page counts then
 * tell (no live block covers them whole). */
static inline int granule_is_mapped(const ascm_pool *p, uint64_t q) {
    return p->page_refs[q] || ascm_paging_kept(p->paging, q);
}
static int granule_mapped(const void *ctx, uint64_t q) { return granule_is_mapped(ctx, q); }

/* Whether n units go to mapped granules first: a quarter granule or more,
 * under a granule (a paged pool with regions), of a size freed before. */
static inline int mapped_first(const ascm_pool *p, uint64_t n) {
    return mapped_size(p, n) && (p->sizes_freed[n >> 6] >> (n & 63) & 1);
}

/* Placement in a paged pool's regions (fit.c): a block of a quarter
 * granule or more, under a granule, of a size freed before goes first where
 * it maps no granule ("mapped granules first" in fit.c, which says why
 * sizes freed before; docs/ARCHITECTURE.md, Note [Mapped granules first]).
 * A packed pool (ascm_pool_set_placement) gives best fit no granule: every
 * block at the low end of its hole, end to end with the block below it.  A
 * best-fit pool places every block as plain best fit does, the regions
 * acting as one (docs/ARCHITECTURE.md, Note [Best-fit placement]). */
static int take_paged(ascm_pool *p, uint64_t n, uint64_t align, uint64_t requested, uint32_t *node) {
    if (ASCM_UNLIKELY(p->placement == ASCM_PLACE_BEST_FIT))
        return ascm_fit_take_across(&p->fit, n, align_units_for(p, align), node);
    uint64_t g = 1ull << (p->pshift - p->gshift);
    if (ASCM_UNLIKELY(mapped_first(p, n)) && align_units_for(p, align) == 1 &&
        ascm_fit_take_mapped(&p->fit, n, 0, g, granule_mapped, p, node) == ASCM_OK)
        return ASCM_OK;
    return ascm_fit_take_in(&p->fit, n, align_units_for(p, align),
                            requested ? region_for(p, n) : 0, /* slabs: the first */
                            requested && p->placement != ASCM_PLACE_PACKED ? g : 0, node);
}

/* Sparing the end (fit.c): a large request of a contiguous pool spares the
 * free block at the end of the range when that block is ENDS_SPARED_FROM
 * times the request or more and no block of the request's size has been
 * given back to best fit before.  Sizes given back before are the loop's
 * tensors: best fit, the end included, packs them as it always has; a
 * size never given back is the working set growing, and in the end block
 * it would raise the high-water mark for good. */
#define ENDS_SPARED_FROM 6u

/* BEST_FIT_END_LAST spares the end for every request and an end of any size,
 * as textbook best fit with the wilderness rule does (ascmem.h).  One call
 * site for both: a second one cost the default's large pair about 50
 * instructions (benchmarks/c instructions). */
static int ends_spared(const void *ctx, uint64_t n) {
    const ascm_pool *p = ctx;
    return p->placement == ASCM_PLACE_BEST_FIT_END_LAST || !ascm_set_has(&p->sizes_given, n << p->gshift);
}

/* Takes a block of the large-block path and charges its pages; the caller
 * registers it (blocks map for a large block, the slab table for a slab). */
static int take_block(ascm_pool *p, uint64_t bytes, uint64_t align, uint64_t requested,
                      int high, uint32_t *node) {
    ascm_pool_flush_last_freed(p);
    uint64_t n = units_for(p, bytes);
    int st;
    if (ASCM_UNLIKELY(p->fit.nregions != 1))
        st = take_paged(p, n, align, requested, node);
    else if (requested && p->paging == NULL) /* a large block (slab storage: requested 0) */
        st = ascm_fit_take_sparing_end(&p->fit, n, align_units_for(p, align),
                                       p->placement == ASCM_PLACE_BEST_FIT_END_LAST ? 1 : ENDS_SPARED_FROM,
                                       ends_spared, p, node);
    else
        st = ascm_fit_take(&p->fit, n, align_units_for(p, align), high, node);
    if (st != ASCM_OK) return st;
    ascm_fit_node *blk = &p->fit.nodes[*node];
    if ((st = charge_block(p, blk)) != ASCM_OK) {
        ascm_fit_give(&p->fit, *node);
        return st;
    }
    blk->slack = requested ? (uint32_t)((((uint64_t)blk->len) << p->gshift) - requested) : 0;
    return ASCM_OK;
}

static void give_block(ascm_pool *p, uint32_t node) {
    discharge_block(p, &p->fit.nodes[node]);
    ascm_pool_note_given(p, &p->fit.nodes[node]);
    ascm_fit_give(&p->fit, node);
}

/* The block source slabs take their storage from (pool_core.h), marked as
 * slab storage for the walks.  Contiguous pools take it from the high end of
 * large free regions, so that slabs gather away from the large blocks
 * (fit.c).  Paged pools take it like any block: at the top of a virtual
 * range a slab pins a granule of its own for a few small blocks, where best
 * fit puts it in a hole of a granule already mapped. */
static int lend_to_slab(void *ctx, uint64_t bytes, uint64_t align, uint32_t *node, uint64_t *off) {
    ascm_pool *p = ctx;
    int st = take_block(p, bytes, align, 0, p->paging == NULL, node);
    if (st != ASCM_OK) return st;
    p->fit.nodes[*node].is_slab = 1;
    *off = (uint64_t)p->fit.nodes[*node].off << p->gshift;
    return ASCM_OK;
}

static void return_from_slab(void *ctx, uint32_t node) { give_block(ctx, node); }

static int lent_to_slab(const void *ctx, uint32_t node, uint64_t off) {
    const ascm_pool *p = ctx;
    const ascm_fit_node *n = &p->fit.nodes[node];
    return ((uint64_t)n->off << p->gshift) == off && !n->is_free && n->is_slab;
}

ascm_block_source ascm_pool_slab_source(ascm_pool *p) {
    return (ascm_block_source){lend_to_slab, return_from_slab, lent_to_slab, p};
}

/* Whether a paged pool's kept block still has a live neighbour in its
 * first or last granule (or a granule kept mapped there).  Out of line: in
 * line, it made reuse_last_freed too large for GCC to put in line in its
 * callers. */
static __attribute__((noinline)) int kept_edge_mapped(const ascm_pool *p, const ascm_fit_node *blk) {
    unsigned shift = p->pshift - p->gshift; /* units to granules */
    uint64_t first = blk->off >> shift, last = ((uint64_t)blk->off + blk->len - 1) >> shift;
    return granule_is_mapped(p, first) || granule_is_mapped(p, last);
}

/* Whether a paged pool reuses its kept block in place: only while a
 * neighbour still maps its first or last granule.  When neither is mapped
 * its place maps nothing more than a fresh one would, and best fit (with the
 * granule rules and mapped granules first) chooses among every hole: reused
 * in place, a step's blocks kept the places their first step gave them.
 * On the traces at 2 MiB: gnn_message_passing 0.842 -> 0.926 (its bound),
 * moe_train 0.933 -> 0.942, conformer_ctc 0.941 -> 0.959; never reusing
 * it cost seq2seq_generate 0.982 -> 0.967 at 64 KiB (docs/ARCHITECTURE.md,
 * Note [Mapped granules first]).  A pool whose granule is its unit
 * (no page counts) reuses it as a contiguous pool does.  The cost is on a
 * path that maps a granule anyway. */
static inline int kept_place_mapped(ascm_pool *p, const ascm_fit_node *blk) {
    return ASCM_LIKELY(!p->paging) || !p->page_refs || kept_edge_mapped(p, blk);
}

/* A contiguous pool's kept block goes to best fit instead of back in place
 * when the free block just below it is at least 1/KEPT_HOLE_MIN of its size
 * and smaller than it.  Reused in place, it would strand that hole under
 * it for good: no request of the block's size fits there, and the block
 * stays put for as long as the loop that reuses it.  Given to best fit, it
 * merges with the hole and, when that merged block is the best fit, starts
 * at the hole's start, so the hole moves above it, next to whatever is
 * freed there.  A hole of a block's size or more is left alone: it takes
 * another block of that size, and moving into it scatters a layout that
 * repeats (a multi-resolution CNN's activations); one under 1/KEPT_HOLE_MIN
 * is a small block's room, not worth moving a large block for (Note [The
 * kept block] in docs/ARCHITECTURE.md has the figures that chose both
 * bounds).  Paged pools keep their own rules (kept_place_mapped). */
#define KEPT_HOLE_MIN 128u
static inline int kept_block_moves_down(const ascm_pool *p, const ascm_fit_node *blk) {
    const ascm_fit_node *below = &p->fit.nodes[blk->prev_phys];
    return blk->prev_phys && below->is_free && below->len < blk->len &&
           (uint64_t)below->len * KEPT_HOLE_MIN >= blk->len && p->paging == NULL;
}

/* A contiguous pool placing by KEPT_TO_BEST_FIT, BEST_FIT_END_LAST or
 * LOWEST_EQUAL, or a paged one by BEST_FIT (ascm_pool_set_placement):
 * whether the kept block, of the request's size, goes to best fit instead
 * of back in place (always, but for LOWEST_EQUAL: plain best fit has no
 * kept block).  Out of line: the default's pair pays one byte compare for
 * it (Note [Contiguous placements]). */
static __attribute__((noinline)) int kept_leaves_by_placement(const ascm_pool *p,
                                                              const ascm_fit_node *blk) {
    if (p->placement != ASCM_PLACE_LOWEST_EQUAL) return 1;
    return ascm_fit_has_equal_below(&p->fit, blk->len, blk->off);
}

/* Whether the kept block, of the request's size, goes to best fit instead
 * of back in place: by the pool's placement.  Paged pools' placements
 * (GRANULES, PACKED) are below KEPT_IN_PLACE and take the default's rule,
 * which leaves them to kept_place_mapped. */
static inline int kept_leaves_place(const ascm_pool *p, const ascm_fit_node *blk) {
    if (ASCM_UNLIKELY(p->placement > ASCM_PLACE_KEPT_IN_PLACE)) return kept_leaves_by_placement(p, blk);
    return ASCM_UNLIKELY(kept_block_moves_down(p, blk));
}

/* The kept block, if it is exactly what a large request of size and align
 * would get; charged and out of last_freed. */
static inline uint32_t reuse_last_freed(ascm_pool *p, uint64_t size, uint64_t requested,
                                        uint64_t align) {
    uint32_t node = p->last_freed;
    if (!node) return ASCM_NODE_NONE;
    ascm_fit_node *blk = &p->fit.nodes[node];
    uint64_t n = units_for(p, size);
    int deferred = p->domain->deferred == p; /* its pages were never given (top of file) */
    if (blk->len != n || (blk->off & (align_units_for(p, align) - 1)) || kept_leaves_place(p, blk)) {
        if (ASCM_UNLIKELY(deferred)) ascm_pool_settle(p->domain);
        return ASCM_NODE_NONE;
    }
    if (ASCM_LIKELY(deferred)) {
        p->domain->deferred = NULL;
    } else if (!kept_place_mapped(p, blk) ||
               charge_block(p, blk) != ASCM_OK) {
        return ASCM_NODE_NONE;
    }
    p->last_freed = ASCM_NODE_NONE;
    p->kept_reused = 1;
    blk->slack = (uint32_t)((n << p->gshift) - requested);
    return node;
}

static inline void count_alloc(ascm_pool *p, uint64_t usable, uint64_t requested) {
    p->used += usable;
    p->requested += requested;
    if (p->used > p->peak_used) p->peak_used = p->used;
    if (p->requested > p->peak_requested) p->peak_requested = p->requested;
    if (++p->live_count > p->peak_live_count) p->peak_live_count = p->live_count;
    p->alloc_count++;
    p->alloc_bytes += usable;
    p->alloc_requested += requested;
}

/* Handles (ascmem.h): a slab slot's is its slab and slot under HANDLE_SLAB;
 * a large block's is its fit node and first unit, so that a handle whose
 * node now serves another place is refused. */
#define HANDLE_SLAB (1ull << 63)
static inline ascm_handle slab_handle(uint32_t si, uint32_t slot) {
    return HANDLE_SLAB | ((uint64_t)si << 16) | slot; /* slots < 2^16: ASCM_SLAB_MAX_SLOTS */
}
static inline ascm_handle block_handle(uint32_t node, uint32_t unit) {
    return ((uint64_t)node << 32) | unit; /* node >= 1: never 0, never HANDLE_SLAB */
}

/* A large block goes to its caller: counted, and its address. */
static inline void hand_out_large(ascm_pool *p, const ascm_fit_node *blk, uint64_t requested,
                                  uint64_t *addr) {
    count_alloc(p, (uint64_t)blk->len << p->gshift, requested);
    *addr = p->base + ((uint64_t)blk->off << p->gshift);
}

/* With unmapped, a large block is not put in the blocks map: its node is
 * stored there (0 for a slab slot) for the caller to put, and `pending` such
 * puts are outstanding (room is reserved for them).  With handle, it is not
 * put there either: it is marked as known by its handle, returned there. */
/* size: the bytes placed; requested: the caller's (size less a pad). */
/* kept_tried: alloc_locked found the kept block not reusable already. */
static __attribute__((noinline)) int alloc_large_locked(ascm_pool *p, uint64_t size, uint64_t requested,
                                                        uint64_t align, uint64_t *addr, uint32_t *unmapped,
                                                        uint32_t pending, ascm_handle *handle, int kept_tried) {
    int st;
    if (!handle && ASCM_UNLIKELY(ascm_map_reserve(&p->blocks, 1 + pending) != ASCM_OK))
        return ASCM_ERR_HOSTMEM;
    uint32_t node = kept_tried ? ASCM_NODE_NONE : reuse_last_freed(p, size, requested, align);
    int mapped = 0; /* the reused kept block still has its entry in the address map */
    if (node) {
        mapped = p->kept_in_map;
        p->kept_in_map = 0;
    }
    /* A fresh large block: spare slabs go back first.  Where they sit they
     * split free space that best fit would otherwise use, and on the recorded
     * traces that cost more capacity than plain best fit; what they save -- a
     * slab rebuilt when a class empties and refills -- only loops of small
     * blocks need, and those make no large requests (Note [Slabs]). */
    if (!node && ASCM_UNLIKELY(p->empty_slabs)) ascm_slab_trim(p);
    st = node ? ASCM_OK : take_block(p, size, align, requested, 0, &node);
    if (st != ASCM_OK && st != ASCM_ERR_HOSTMEM && ascm_slab_trim(p)) /* spare slabs may be in the way */
        st = take_block(p, size, align, requested, 0, &node);
    if (st == ASCM_OK) {
        ascm_fit_node *blk = &p->fit.nodes[node];
        blk->by_handle = handle != NULL; /* a reused kept block may have been either */
        if (handle || unmapped) {
            if (mapped) ascm_map_take(&p->blocks, blk->off);
            if (handle) *handle = block_handle(node, blk->off);
            else *unmapped = node;
        } else if (!mapped) {
            ascm_map_put(&p->blocks, blk->off, node);
        }
        hand_out_large(p, blk, requested, addr);
        return ASCM_OK;
    }
    if (st != ASCM_ERR_HOSTMEM) p->failed_count++;
    return st;
}

/* The slab path and the kept block's reuse in a loop (its address-map
 * entry still there) in line in each caller: a small pair's call overhead
 * and register saves would be a large part of its cost.  Other large blocks,
 * and a class with no partial slab, out of line. */
static inline __attribute__((always_inline)) int alloc_locked(ascm_pool *p, uint64_t size, uint64_t requested,
                                                              uint64_t align, uint64_t *addr, uint32_t *unmapped,
                                                              uint32_t pending, ascm_handle *handle) {
    if (ASCM_UNLIKELY(p->closed)) return ASCM_ERR_NOMEM;
    int cls = ascm_pool_class_of(p, size, align);
    ascm_lock *domain = p->domain; /* locked without settling: only the kept block's reuse may skip it */
    if (ASCM_UNLIKELY(domain->deferred != NULL) && (domain->deferred != p || cls >= 0))
        ascm_pool_settle(domain);
    if (ASCM_LIKELY(cls >= 0)) {
        uint64_t off;
        uint32_t si, slot;
        if (ASCM_LIKELY(ascm_slab_alloc(p, cls, requested, &off, &si, &slot) == ASCM_OK)) {
            if (unmapped) *unmapped = ASCM_NODE_NONE;
            if (handle) *handle = slab_handle(si, slot);
            count_alloc(p, p->classes[cls].size, requested);
            *addr = p->base + off;
            return ASCM_OK;
        }
        /* no room for a whole slab: a block of a few units may still fit */
    } else if (p->kept_in_map && !handle && !unmapped) {
        uint32_t node = reuse_last_freed(p, size, requested, align);
        if (ASCM_LIKELY(node)) {
            ascm_fit_node *blk = &p->fit.nodes[node];
            p->kept_in_map = 0;
            blk->by_handle = 0;
            hand_out_large(p, blk, requested, addr);
            return ASCM_OK;
        }
        return alloc_large_locked(p, size, requested, align, addr, unmapped, pending, handle, 1);
    }
    return alloc_large_locked(p, size, requested, align, addr, unmapped, pending, handle, 0);
}

/* With thread caches on: the caller's cache first, then the pool; an
 * allocation that finds no room flushes every cache and tries again.  Out
 * of line, so that the pool's own path stays as it was. */
static __attribute__((noinline)) int alloc_cached(ascm_pool *p, uint64_t size, uint64_t requested,
                                                  uint64_t align, uint64_t *addr, ascm_handle *h) {
    if (!h && ascm_tcache_alloc(p, size, requested, align, addr) == ASCM_OK) return ASCM_OK;
    ascm_pool_lock(p);
    int st = alloc_locked(p, size, requested, align, addr, NULL, 0, h);
    ascm_pool_unlock(p);
    if (st == ASCM_ERR_NOMEM) {
        ascm_tcache_stop(p);
        p->failed_count -= p->failed_count > 0; /* counted again below if it fails again */
        st = alloc_locked(p, size, requested, align, addr, NULL, 0, h);
        ascm_tcache_go(p);
    }
    return st;
}

/* A request check_request refused: one larger than the whole range counts
 * as a failed allocation, as any request the pool cannot serve does (a
 * Device counted it, a Pool did not: issue 43.7); a malformed one does not. */
static __attribute__((noinline, cold)) int refused(ascm_pool *p, int st) {
    if (st == ASCM_ERR_NOMEM) {
        ascm_pool_lock(p);
        p->failed_count++;
        ascm_pool_unlock(p);
    }
    return st;
}

ASCM_ENTRY int ascm_pool_alloc(ascm_pool *p, uint64_t size, uint64_t align, uint64_t *addr) {
    int st = check_request(p, size, align);
    if (ASCM_UNLIKELY(st != ASCM_OK)) return refused(p, st);
    if (ASCM_UNLIKELY(ascm_caches_on(p))) return alloc_cached(p, size, size, align, addr, NULL);
    ascm_pool_lock_keeping(p);
    st = alloc_locked(p, size, size, align, addr, NULL, 0, NULL);
    ascm_pool_unlock(p);
    return st;
}

ASCM_ENTRY int ascm_pool_alloc_padded(ascm_pool *p, uint64_t size, uint64_t pad, uint64_t align, uint64_t *addr) {
    if (bad_padded(size, pad)) return ASCM_ERR_INVAL;
    int st = check_request(p, size + pad, align);
    if (ASCM_UNLIKELY(st != ASCM_OK)) return refused(p, st);
    if (ASCM_UNLIKELY(ascm_caches_on(p))) return alloc_cached(p, size + pad, size, align, addr, NULL);
    ascm_pool_lock_keeping(p);
    st = alloc_locked(p, size + pad, size, align, addr, NULL, 0, NULL);
    ascm_pool_unlock(p);
    return st;
}

static inline void count_free(ascm_pool *p, uint64_t usable, uint64_t requested) {
    p->used -= usable;
    p->requested -= requested;
    p->live_count--;
    p->free_count++;
    p->freed_bytes += usable;
    p->freed_requested += requested;
}

/* A live large block out of the address map goes back: kept whole as the
 * last freed block (see the top of this file). */
static inline void free_large(ascm_pool *p, uint32_t node, uint64_t *usable, uint64_t *requested,
                              int in_map) {
    const ascm_fit_node *blk = &p->fit.nodes[node];
    *usable = (uint64_t)blk->len << p->gshift;
    *requested = *usable - blk->slack;
    int reuse_loop = p->kept_reused && !p->last_freed; /* a kept block not taken back ends it */
    ascm_pool_flush_last_freed(p); /* first: it may hold the lock's deferred discharge */
    if (ASCM_LIKELY(!p->asleep.count) || !ascm_map_take(&p->asleep, blk->off)) {
        /* a sleeping block's pages were given at sleep */
        if (reuse_loop && ASCM_LIKELY(p->defers) && !p->domain->deferred)
            p->domain->deferred = p; /* given when anything else happens (top of file) */
        else
            discharge_block(p, blk);
    }
    p->last_freed = node;
    p->kept_in_map = (uint8_t)in_map;
    p->kept_reused = (uint8_t)reuse_loop;
}

static __attribute__((noinline)) int free_cold_locked(ascm_pool *p, uint64_t off) {
    uint64_t usable, requested;
    uint32_t node = 0;
    if (!(off & (p->gran - 1)))
        node = p->kept_reused ? ascm_map_get(&p->blocks, (uint32_t)(off >> p->gshift))
                              : ascm_map_take(&p->blocks, (uint32_t)(off >> p->gshift));
    if (node) {
        if (ASCM_UNLIKELY(node == p->last_freed)) { /* freed already, kept */
            if (!p->kept_reused) p->kept_in_map = 0; /* just taken out */
            return ASCM_ERR_BADFREE;
        }
        free_large(p, node, &usable, &requested, p->kept_reused);
    } else {
        uint32_t si = ascm_slab_at(p, off);
        if (ASCM_UNLIKELY(!si)) return ASCM_ERR_BADFREE;
        /* later frees into this slab skip the maps; set before the free,
         * which may release the slab (and then clears this) */
        ascm_slab_remember(p, si);
        int st = ascm_slab_free(p, si, off, &usable, &requested);
        if (st != ASCM_OK) return st;
    }
    count_free(p, usable, requested);
    return ASCM_OK;
}

/* A free into the slab the last slab free went to, in line in each caller
 * (as alloc_locked's slab path); the rest out of line. */
static inline __attribute__((always_inline)) int free_locked(ascm_pool *p, uint64_t addr) {
    if (ASCM_UNLIKELY(addr < p->base || addr - p->base >= p->size)) return ASCM_ERR_BADFREE;
    uint64_t off = addr - p->base, usable, requested;
    if (off - p->hot_off >= p->hot_len) return free_cold_locked(p, off); /* no large block inside a slab */
    int st = ascm_slab_free(p, p->hot_slab, off, &usable, &requested);
    if (st != ASCM_OK) return st;
    count_free(p, usable, requested);
    return ASCM_OK;
}

ASCM_ENTRY int ascm_pool_alloc_handle(ascm_pool *p, uint64_t size, uint64_t align, uint64_t *addr, ascm_handle *h) {
    int st = check_request(p, size, align);
    if (ASCM_UNLIKELY(st != ASCM_OK)) return refused(p, st);
    if (ASCM_UNLIKELY(ascm_caches_on(p))) return alloc_cached(p, size, size, align, addr, h);
    ascm_pool_lock_keeping(p);
    st = alloc_locked(p, size, size, align, addr, NULL, 0, h);
    ascm_pool_unlock(p);
    return st;
}

/* Every field of the handle is checked against the pool before anything is
 * touched: an index past the arrays, a recycled slab, a free slot, a node
 * that is free, kept, slab storage, in the address map or now at another
 * unit is ASCM_ERR_BADFREE. */
static int free_handle_locked(ascm_pool *p, ascm_handle h) {
    uint64_t usable, requested;
    if (h & HANDLE_SLAB) {
        uint64_t si = (h >> 16) & 0x7fffffffffffull, slot = h & 0xffff;
        if (ASCM_UNLIKELY(si == 0 || si >= p->nslabs_used || !ascm_slab_in_use(p, (uint32_t)si)))
            return ASCM_ERR_BADFREE;
        const ascm_slab *s = p->slabs[si];
        if (ASCM_UNLIKELY(slot >= s->count)) return ASCM_ERR_BADFREE;
        int st = ascm_slab_free(p, (uint32_t)si, s->off + slot * p->classes[s->cls].size, &usable,
                                &requested); /* refuses a free slot */
        if (st != ASCM_OK) return st;
    } else {
        uint64_t node = h >> 32;
        if (ASCM_UNLIKELY(node == 0 || node >= p->fit.nused)) return ASCM_ERR_BADFREE;
        const ascm_fit_node *blk = &p->fit.nodes[node];
        if (ASCM_UNLIKELY(!blk->by_handle || blk->is_free || blk->is_slab || !blk->len ||
                          blk->off != (uint32_t)h || node == p->last_freed))
            return ASCM_ERR_BADFREE;
        free_large(p, (uint32_t)node, &usable, &requested, 0);
    }
    count_free(p, usable, requested);
    return ASCM_OK;
}

ASCM_ENTRY int ascm_pool_free_handle(ascm_pool *p, ascm_handle h) {
    ascm_pool_lock_keeping(p); /* a free only gives pages: no need to settle */
    int st = free_handle_locked(p, h);
    ascm_pool_unlock(p);
    return st;
}

static __attribute__((noinline)) int free_cached(ascm_pool *p, uint64_t addr) {
    if (ascm_tcache_free(p, addr) == ASCM_OK) return ASCM_OK;
    ascm_pool_lock(p);
    int st = free_locked(p, addr);
    ascm_pool_unlock(p);
    return st;
}

ASCM_ENTRY int ascm_pool_free(ascm_pool *p, uint64_t addr) {
    if (ASCM_UNLIKELY(ascm_caches_on(p))) return free_cached(p, addr);
    ascm_pool_lock_keeping(p); /* a free only gives pages: no need to settle */
    int st = free_locked(p, addr);
    ascm_pool_unlock(p);
    return st;
}

/* Batches hide the cache misses of the address maps (a hundred thousand
 * live blocks make tables of megabytes): free_many prefetches the map slots
 * of the address BATCH_AHEAD places on, and alloc_many puts each new block in
 * the map BATCH_AHEAD allocations later, its slot prefetched meanwhile.  No
 * lookup by address happens inside alloc_many, so the delay is invisible. */
#define BATCH_AHEAD 8u

/* Batches hand the lock over to any thread waiting for it every BATCH_SLICE
 * blocks, so that none waits longer than that: a Python thread that
 * allocates waits with the GIL held (tens of microseconds, against ~20 ms
 * for a whole batch of 100,000 blocks). */
#define BATCH_SLICE 256u

/* At block i: whether a slice ends there (*at moves on to the next) with a
 * thread waiting for the lock. */
static inline int batch_hand_over_due(const ascm_pool *p, size_t i, size_t *at) {
    if (ASCM_LIKELY(i != *at)) return 0;
    *at += BATCH_SLICE;
    return p->lock_at && ascm_lock_waited_for(p->lock_at);
}

/* The hand-over; 1 if the waiter reset the pool, which freed every block
 * the batch had dealt with (*resets: the count of resets the batch knows). */
static int batch_hand_over(ascm_pool *p, uint64_t *resets) {
    ascm_lock_hand_over(p->lock_at);
    ascm_lock_settle(p->domain);
    if (p->resets == *resets) return 0;
    *resets = p->resets;
    return 1;
}

/* A refused batch is all or nothing: the blocks it allocated are freed, in
 * the same hold of the lock, and the counters of allocations and frees are
 * as if it had never begun (issue 45.11: a refused call moved alloc_count
 * and free_count); the failure itself stays counted, and peaks stay what
 * they were at their highest. */
static void undo_batch(ascm_pool *p, const uint64_t *addrs, size_t n) {
    uint64_t frees = p->free_count, bytes = p->freed_bytes, requested = p->freed_requested;
    for (size_t i = 0; i < n; i++) free_locked(p, addrs[i]);
    p->alloc_count -= p->free_count - frees;
    p->alloc_bytes -= p->freed_bytes - bytes;
    p->alloc_requested -= p->freed_requested - requested;
    p->free_count = frees;
    p->freed_bytes = bytes;
    p->freed_requested = requested;
}

int ascm_pool_alloc_many(ascm_pool *p, const uint64_t *sizes, size_t n, uint64_t align,
                         uint64_t *addrs, size_t *done) {
    int st = ASCM_OK;
    size_t i = 0;
    ascm_map_entry ring[BATCH_AHEAD]; /* stored keys: unit + 1 */
    uint32_t head = 0, pending = 0;
    size_t hand_over_at = BATCH_SLICE;
    ascm_pool_lock(p);
    uint64_t resets = p->resets;
    for (; i < n; i++) {
        uint32_t node;
        if (batch_hand_over_due(p, i, &hand_over_at)) {
            /* the map must be whole before anyone else looks */
            for (; pending; pending--, head = (head + 1) % BATCH_AHEAD)
                ascm_map_put(&p->blocks, ring[head].key - 1, ring[head].value);
            if (batch_hand_over(p, &resets)) { /* the blocks so far are gone: start again */
                i = 0;
                hand_over_at = BATCH_SLICE;
            }
        }
        st = check_request(p, sizes[i], align);
        if (st == ASCM_ERR_NOMEM) p->failed_count++; /* as refused() counts it */
        if (st == ASCM_OK) st = alloc_locked(p, sizes[i], sizes[i], align, &addrs[i], &node, pending, NULL);
        if (st != ASCM_OK) break;
        if (!node) continue;
        if (pending == BATCH_AHEAD) {
            ascm_map_put(&p->blocks, ring[head].key - 1, ring[head].value);
            head = (head + 1) % BATCH_AHEAD;
            pending--;
        }
        uint32_t unit = p->fit.nodes[node].off;
        ring[(head + pending) % BATCH_AHEAD] = (ascm_map_entry){unit + 1, node};
        pending++;
        ascm_map_prefetch(&p->blocks, unit);
    }
    for (; pending; pending--, head = (head + 1) % BATCH_AHEAD)
        ascm_map_put(&p->blocks, ring[head].key - 1, ring[head].value);
    if (st != ASCM_OK) undo_batch(p, addrs, i);
    ascm_pool_unlock(p);
    *done = i;
    return st;
}

ASCM_PREFETCHER void prefetch_free(const ascm_pool *p, uint64_t addr) {
    uint64_t off = addr - p->base; /* below base wraps past size */
    if (off >= p->size) return;
    if (!(off & (p->gran - 1))) ascm_map_prefetch(&p->blocks, (uint32_t)(off >> p->gshift));
    uint64_t leaf = (off >> p->sgshift) >> ASCM_SLAB_LEAF_BITS;
    if (p->slabtab.leaves && leaf < p->slabtab.nleaves) ASCM_PREFETCH(&p->slabtab.leaves[leaf]);
}

/* Second stage, half as far ahead: the map slot is in cache by now, so find
 * the block's metadata and fetch that too. */
ASCM_PREFETCHER void prefetch_meta(const ascm_pool *p, uint64_t addr) {
    uint64_t off = addr - p->base;
    if (off >= p->size) return;
    uint32_t node = (off & (p->gran - 1)) ? 0 : ascm_map_get(&p->blocks, (uint32_t)(off >> p->gshift));
    if (node) {
        ASCM_PREFETCH(&p->fit.nodes[node]);
    } else {
        const ascm_slab *s = ascm_slab_of(p, off);
        if (s) ASCM_PREFETCH(s);
    }
}

int ascm_pool_free_many(ascm_pool *p, const uint64_t *addrs, size_t n, size_t *done) {
    int first_error = ASCM_OK;
    size_t ok = 0, hand_over_at = BATCH_SLICE;
    ascm_pool_lock(p);
    uint64_t resets = p->resets;
    for (size_t i = 0; i < n && i < BATCH_AHEAD; i++) prefetch_free(p, addrs[i]);
    for (size_t i = 0; i < n; i++) {
        if (batch_hand_over_due(p, i, &hand_over_at) && batch_hand_over(p, &resets)) {
            ok += n - i; /* the reset freed the rest */
            break;
        }
        if (i + BATCH_AHEAD < n) prefetch_free(p, addrs[i + BATCH_AHEAD]);
        if (i + BATCH_AHEAD / 2 < n) prefetch_meta(p, addrs[i + BATCH_AHEAD / 2]);
        int st = free_locked(p, addrs[i]);
        if (st == ASCM_OK) ok++;
        else if (first_error == ASCM_OK) first_error = st;
    }
    ascm_pool_unlock(p);
    *done = ok;
    return first_error;
}
