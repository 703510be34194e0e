/* One live block, asked about or changed in place: its usable and
 * requested sizes, a new label (relabel), sleep and wake (paged pools). */
#include "pool_internal.h"

/* Finds the live block at addr: a large block (by its first unit) or a slab
 * slot (by the slab granule it lies in).  Addresses off the unit grid can
 * only be slab slots. */
static int lookup_locked(const ascm_pool *p, uint64_t addr, uint64_t *usable, uint64_t *requested) {
    if (addr < p->base || addr - p->base >= p->size) return ASCM_ERR_BADFREE;
    uint64_t off = addr - p->base;
    if (!(off & (p->gran - 1))) {
        uint32_t node = live_large_at(p, (uint32_t)(off >> p->gshift));
        if (node) {
            const ascm_fit_node *blk = &p->fit.nodes[node];
            *usable = (uint64_t)blk->len << p->gshift;
            *requested = *usable - blk->slack;
            return ASCM_OK;
        }
    }
    return ascm_slab_lookup(p, off, usable, requested);
}

int ascm_pool_usable_size(ascm_pool *p, uint64_t addr, uint64_t *size) {
    uint64_t requested;
    ascm_pool_lock(p);
    int st = lookup_locked(p, addr, size, &requested);
    ascm_pool_unlock(p);
    return st;
}

int ascm_pool_requested_size(ascm_pool *p, uint64_t addr, uint64_t *size) {
    uint64_t usable;
    ascm_pool_lock(p);
    int st = lookup_locked(p, addr, &usable, size);
    ascm_pool_unlock(p);
    return st;
}

int ascm_pool_contains(const ascm_pool *p, uint64_t addr) {
    return addr >= p->base && addr - p->base < p->size;
}

uint64_t ascm_pool_usable_for(const ascm_pool *p, uint64_t size, uint64_t align) {
    if (check_request(p, size, align) != ASCM_OK) return 0;
    int cls = ascm_pool_class_of(p, size, align);
    if (cls >= 0) return p->classes[cls].size;
    return units_for(p, size) << p->gshift;
}

int ascm_pool_relabel(ascm_pool *p, uint64_t addr, uint64_t requested, uint64_t pad, uint64_t align) {
    ascm_pool_lock(p);
    uint64_t usable, old, off = addr - p->base;
    int st = bad_padded(requested, pad) ? ASCM_ERR_INVAL : lookup_locked(p, addr, &usable, &old);
    if (st == ASCM_OK && (ascm_pool_usable_for(p, requested + pad, align) != usable ||
                          (off & (align - 1))))
        st = ASCM_ERR_INVAL;
    uint32_t node = st == ASCM_OK && !(off & (p->gran - 1)) ? live_large_at(p, (uint32_t)(off >> p->gshift)) : 0;
    /* a sleeping block holds no granules: handed over as it is, its next
     * owner would get an address with nothing mapped under it.  It is to be
     * freed instead, which settles its granules' books. */
    if (node && p->asleep.count && ascm_map_get(&p->asleep, (uint32_t)(off >> p->gshift)))
        st = ASCM_ERR_INVAL;
    if (st == ASCM_OK) {
        if (node) {
            p->fit.nodes[node].slack = (uint32_t)(usable - requested);
        } else {
            ascm_slab *s = ascm_slab_of(p, off);
            ascm_slab_relabel(s, (uint64_t)ascm_slab_live_slot(p, s, off), usable - requested);
        }
        p->requested = p->requested - old + requested;
        if (p->requested > p->peak_requested) p->peak_requested = p->requested;
        p->free_count++; /* a free and an allocation, as far as anyone can tell */
        p->alloc_count++;
        p->freed_bytes += usable;
        p->alloc_bytes += usable;
        p->freed_requested += old;
        p->alloc_requested += requested;
    }
    ascm_pool_unlock(p);
    return st;
}

/* The fit node of the live large block at addr, or 0. */
static uint32_t large_block_at(const ascm_pool *p, uint64_t addr) {
    if (addr < p->base || addr - p->base >= p->size || ((addr - p->base) & (p->gran - 1))) return 0;
    return live_large_at(p, (uint32_t)((addr - p->base) >> p->gshift));
}

int ascm_pool_is_large_block(ascm_pool *p, uint64_t addr) {
    ascm_pool_lock(p);
    int large = large_block_at(p, addr) != 0;
    ascm_pool_unlock(p);
    return large;
}

int ascm_pool_sleep(ascm_pool *p, uint64_t addr, uint64_t *released) {
    uint64_t bytes = 0;
    ascm_pool_lock(p);
    uint32_t node = p->paging ? large_block_at(p, addr) : 0;
    uint32_t unit = (uint32_t)((addr - p->base) >> p->gshift);
    int st = node && !ascm_map_get(&p->asleep, unit) ? ascm_map_reserve(&p->asleep, 1) : ASCM_ERR_INVAL;
    if (st == ASCM_OK) {
        const ascm_fit_node *blk = &p->fit.nodes[node];
        uint64_t lo, hi;
        page_give(p, (uint64_t)blk->off << p->gshift, (uint64_t)blk->len << p->gshift, &lo, &hi);
        /* unmapped now, past any release threshold: whoever puts a block to
         * sleep wants its memory back, not kept for the next allocation */
        if (hi > lo) ascm_paging_unmap(p->paging, p->charge, p->charge_ctx, lo, hi);
        bytes = (hi - lo) << p->pshift;
        ascm_map_put(&p->asleep, unit, 1);
    }
    ascm_pool_unlock(p);
    if (released) *released = bytes;
    return st;
}

int ascm_pool_wake(ascm_pool *p, uint64_t addr, uint64_t *mapped) {
    ascm_pool_lock(p);
    uint64_t before = p->pages_in_use;
    uint32_t node = p->paging ? large_block_at(p, addr) : 0;
    uint32_t unit = (uint32_t)((addr - p->base) >> p->gshift);
    int st = node && ascm_map_get(&p->asleep, unit) ? charge_block(p, &p->fit.nodes[node]) : ASCM_ERR_INVAL;
    if (st == ASCM_OK) ascm_map_take(&p->asleep, unit);
    uint64_t bytes = (p->pages_in_use - before) << p->pshift;
    ascm_pool_unlock(p);
    if (mapped) *mapped = bytes;
    return st;
}
