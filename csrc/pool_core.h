/* The pool as the pool layer's files see it (pool*.c, slab.c, tcache.c,
 * pool_readout.c): the pool struct, its lock, and the slab paths inline in
 * the pool's entry points.  Included after internal.h, which declares the
 * building blocks it uses (bits, lock, bitmap, address map, fit, slab
 * types, paging).  The device layer does not include it: it reads pools
 * through their functions. */
#ifndef ASCMEM_POOL_CORE_H
#define ASCMEM_POOL_CORE_H

#ifndef ASCMEM_INTERNAL_H
#error "include internal.h before pool_core.h"
#endif

/* ---- pool --------------------------------------------------------------- */

/* Where slabs get their storage: the pool lends them large blocks through
 * this interface (set up by ascm_pool_create), so that slab.c never calls
 * into pool.c.  take: a block of bytes at an align boundary, charged, as its
 * node and byte offset; give: back to the large-block path; lent: whether
 * node is a block lent at off (for check). */
typedef struct ascm_block_source {
    int (*take)(void *ctx, uint64_t bytes, uint64_t align, uint32_t *node, uint64_t *off);
    void (*give)(void *ctx, uint32_t node);
    int (*lent)(const void *ctx, uint32_t node, uint64_t off);
    void *ctx;
} ascm_block_source;

struct ascm_pool {
    /* Read without the pool lock by thread caches, never written after
     * creation but for caches_on: kept off the lines the lock's holder writes */
    uint64_t base, size, gran;
    unsigned gshift, pshift;
    unsigned sgshift;     /* log2 of the slab granule: max(unit, 8 KiB); slabs align to it */
    /* the lock every call takes: &lock, or the lock of the device the pool
     * belongs to (ascm_pool_create_shared); NULL: single-threaded, the
     * caller serialises calls */
    ascm_lock *lock_at;
    ascm_lock *domain;    /* lock_at, or &lock when single-threaded: holds `deferred` */
    int caches_on;        /* thread caches: __atomic; set under the lock (and every cache's) */
    uint64_t uid;         /* never reused: tells a thread's stale cache entries apart */
    ascm_slab_table slabtab; /* each slab granule -> the slab that covers it */

    _Alignas(64) ascm_lock lock; /* the pool's own; unused while it shares another */
    ascm_fork_node fork;  /* pools with a lock of their own are registered for fork() (forksafe.c) */
    int closed;           /* retired chunk: every allocation fails */
    uint64_t resets;      /* ascm_pool_reset calls: batches notice one in a hand-over */
    uint64_t page_size, npages, pages_in_use;
    uint32_t *page_refs;  /* live blocks touching a page, for the two edge pages of each block */
    ascm_addrmap blocks;  /* first unit of a large block -> its fit node */
    uint64_t slab_granules, slab_leaves; /* granules in the slab table, leaves made */
    ascm_charge_fn charge;
    void *charge_ctx;
    ascm_paging *paging;  /* paged pools only (paging.c) */
    uint64_t *sizes_freed; /* paged: bit n, a block of n units (under a granule) was freed (discharge_block) */
    ascm_addrset sizes_given; /* contiguous: byte sizes of large blocks given back to best fit (pool.c, ends_spared) */
    /* sizes that go to mapped granules first if freed before (pool.c,
     * take_paged): n - mapped_lo < mapped_span, in units; span 0: none */
    uint64_t mapped_lo, mapped_span;
    ascm_addrmap asleep;  /* paged pools: large blocks put to sleep (first unit -> 1) */
    ascm_fit fit;
    uint32_t last_freed;  /* fit node of the last large block freed, kept whole (pool.c) */
    uint8_t kept_in_map;  /* last_freed still has its entry in `blocks` (pool.c) */
    uint8_t kept_reused;  /* the kept block before it was taken back by the next request */
    uint8_t defers;       /* the kept block's discharge may be deferred (pool.c) */
    uint8_t placement;    /* ASCM_PLACE_*, 0 for a new pool of either kind: its kind's default (pool.c:
                           * take_paged, kept_leaves_place); in the padding above */
    uint32_t slab_max;    /* ascm_pool_set_slab_max's: the largest request slabs may serve */
    /* the largest request slabs serve: slab_max, or less under BEST_FIT
     * (slab_limit_of); __atomic, as thread caches read it without the lock */
    uint32_t slab_limit;
    ascm_block_source slab_storage; /* large blocks lent to slabs (see above) */
    ascm_slab_class classes[ASCM_SLAB_CLASSES];
    ascm_slab **slabs;    /* slabs[0] unused; every descriptor ever made */
    uint64_t hot_off, hot_len; /* the slab of the last slab free, [off, off + len): */
    uint32_t hot_slab;         /* frees next to it skip both map probes (pool.c) */
    uint32_t nslabs_cap, nslabs_used, slab_free_index;
    uint32_t empty_slabs;      /* spares of every class: the sum of classes[].empty */
    uint64_t slab_bytes;
    /* statistics */
    uint64_t used, requested, peak_used, peak_requested;
    uint64_t live_count, alloc_count, free_count, failed_count, peak_live_count;
    uint64_t alloc_bytes, freed_bytes, alloc_requested, freed_requested;
    uint64_t peak_pages, pages_taken, pages_given;
    /* thread caches (tcache.c) */
    int caches_mode;             /* ASCM_CACHES_* */
    ascm_lock caches_lock;       /* the list below; taken before any cache's lock */
    ascm_fork_node caches_fork;
    struct ascm_tcache *caches;
};

void ascm_pool_lock_contended(ascm_pool *p);
/* The pool lock, and the deferred discharge left as it is: for a single
 * allocation, which settles itself unless it takes the kept block back,
 * and a free. */
static inline void ascm_pool_lock_keeping(ascm_pool *p) {
    ascm_lock *l = p->lock_at;
    if (l && ASCM_UNLIKELY(atomic_exchange_explicit(&l->held, 1, memory_order_acquire)))
        ascm_pool_lock_contended(p);
}
static inline void ascm_pool_lock(ascm_pool *p) {
    ascm_pool_lock_keeping(p);
    ascm_lock_settle(p->domain);
}
static inline void ascm_pool_unlock(ascm_pool *p) {
    if (p->lock_at) ascm_lock_release(p->lock_at);
}
static inline int ascm_caches_on(const ascm_pool *p) {
    return __atomic_load_n(&p->caches_on, __ATOMIC_RELAXED);
}

/* Thread caches (tcache.c).  alloc and free: ASCM_OK, or non-zero when the
 * pool's locked path must serve the call. */
void ascm_tcache_init(ascm_pool *p);
void ascm_tcache_destroy(ascm_pool *p);
int ascm_tcache_alloc(ascm_pool *p, uint64_t size, uint64_t requested, uint64_t align, uint64_t *addr);
int ascm_tcache_free(ascm_pool *p, uint64_t addr);
void ascm_tcache_stop(ascm_pool *p); /* every cache flushed and locked, and the pool lock */
void ascm_tcache_go(ascm_pool *p);
/* Pool lock held: used, requested and live counts from the blocks (a child
 * after fork). */
void ascm_pool_recount(ascm_pool *p);
/* For calls that read or change the pool whole (pool_readout.c, reset, trim,
 * close): the pool lock, and with thread caches on every cache flushed and
 * held first; returns what ascm_pool_unlock_whole needs. */
int ascm_pool_lock_whole(ascm_pool *p);
void ascm_pool_unlock_whole(ascm_pool *p, int whole);

/* Hands the pool's kept last freed block (pool.c) to best fit, its pages
 * given first if their discharge was deferred. */
/* A contiguous pool notes the size of each large block it gives back to
 * best fit, up to SIZES_GIVEN_MAX sizes (beyond, a size counts as never
 * given: placement only, nothing depends on it being complete).  Why:
 * pool.c, ends_spared. */
#define SIZES_GIVEN_MAX (1u << 16)
static inline void ascm_pool_note_given(ascm_pool *p, const ascm_fit_node *blk) {
    if (p->paging == NULL && p->sizes_given.count < SIZES_GIVEN_MAX)
        (void)ascm_set_add(&p->sizes_given, (uint64_t)blk->len << p->gshift); /* out of memory: not noted */
}

static inline void ascm_pool_flush_last_freed(ascm_pool *p) {
    if (p->last_freed) {
        if (ASCM_UNLIKELY(p->domain->deferred == p)) ascm_pool_settle(p->domain);
        if (p->kept_in_map) ascm_map_take(&p->blocks, p->fit.nodes[p->last_freed].off);
        p->kept_in_map = p->kept_reused = 0;
        ascm_pool_note_given(p, &p->fit.nodes[p->last_freed]);
        ascm_fit_give(&p->fit, p->last_freed);
        p->last_freed = ASCM_NODE_NONE;
    }
}

void ascm_slab_init_classes(ascm_pool *p);
/* Slow paths of the inline slab functions below. */
int ascm_slab_new(ascm_pool *p, int cls, uint32_t *si);   /* a fresh slab, on the class's list */
void ascm_slab_list_push(ascm_pool *p, ascm_slab_class *k, uint32_t si);
void ascm_slab_list_unlink(ascm_pool *p, ascm_slab_class *k, uint32_t si);
void ascm_slab_emptied(ascm_pool *p, ascm_slab_class *k, uint32_t si); /* keep as spare or release */
int ascm_slab_lookup(const ascm_pool *p, uint64_t off, uint64_t *usable, uint64_t *requested);

/* A paged pool placing by best fit (ASCM_PLACE_BEST_FIT) serves requests
 * over this many bytes (or over its slab_max, if less) from best fit, not slabs.  A slab's storage is
 * 8 KiB aligned and its free slots hold room between the blocks best fit
 * packs end to end, which costs the granule a peak packed that tight needs
 * (detector_boxes at 2 MiB: 10 granules, 9 with these requests in best fit,
 * as the reference's); blocks of 1 KiB or less stay in slabs, where the
 * pool's 4 KiB units would waste four times them or more
 * (docs/ARCHITECTURE.md, Note [Best-fit placement], has the figures). */
#define BEST_FIT_SLAB_MAX 1024u

/* The largest request a pool with this placement and slab_max serves from
 * slabs (its slab_limit). */
static inline uint32_t ascm_slab_limit_of(int placement, uint32_t slab_max) {
    return placement == ASCM_PLACE_BEST_FIT && slab_max > BEST_FIT_SLAB_MAX ? BEST_FIT_SLAB_MAX : slab_max;
}

/* The slab class a pool serves a request from, or -1 for the large-block
 * path (alignment above the unit, and sizes over its slab_limit, go there). */
static inline int ascm_pool_class_of(const ascm_pool *p, uint64_t size, uint64_t align) {
    if (align > p->gran || size > __atomic_load_n(&p->slab_limit, __ATOMIC_RELAXED)) return -1;
    return ascm_slab_class_of(size, align);
}

/* The slab at index si (< nslabs_used) if it holds storage now, else NULL:
 * the index may be free (tagged odd, see slab.c) or its descriptor idle. */
static inline ascm_slab *ascm_slab_in_use(const ascm_pool *p, uint32_t si) {
    ascm_slab *s = p->slabs[si];
    return ((uintptr_t)s & 1u) || s->idle ? NULL : s;
}

/* The slab holding byte offset off (off < size), or NULL / 0. */
static inline ascm_slab *ascm_slab_of(const ascm_pool *p, uint64_t off) {
    return ascm_slab_table_get(&p->slabtab, off >> p->sgshift);
}
static inline uint32_t ascm_slab_at(const ascm_pool *p, uint64_t off) {
    const ascm_slab *s = ascm_slab_of(p, off);
    return s ? s->index : 0;
}

/* The slab of the last slab free, whose range free_locked checks before the
 * maps; si 0 forgets it. */
static inline void ascm_slab_remember(ascm_pool *p, uint32_t si) {
    p->hot_slab = si;
    p->hot_off = si ? p->slabs[si]->off : 0;
    p->hot_len = si ? p->classes[p->slabs[si]->cls].slab_bytes : 0;
}

/* Slot of off in s, or -1 if off is not the start of a slot. */
static inline int64_t ascm_slab_slot_of(const ascm_pool *p, const ascm_slab *s, uint64_t off) {
    const ascm_slab_class *k = &p->classes[s->cls];
    uint64_t rel = off - s->off;
    uint64_t slot = (rel * k->div_magic) >> 48;
    if (slot >= s->count || slot * k->size != rel) return -1;
    return (int64_t)slot;
}

/* A slot's word (s->slack[slot]): its slack (class size - requested, under
 * 32 KiB) and, while thread caches are on, its live flag.  One word, so that
 * a cache hands a slot out with one plain store and a free takes it back
 * with one atomic and: with the flag in a bitmap word that other slots
 * share, the hand-out would need a locked or (docs/ARCHITECTURE.md,
 * Note [Thread caches]).  A thread cache
 * changes words without the pool lock, and a stale free racing a reset may
 * read one a cache is writing, so every access is atomic (a plain move on
 * x86 but for the and). */
#define ASCM_SLOT_LIVE 0x8000u

/* Whether a caller holds the slot.  Live flags are kept only while thread
 * caches are on (a slot may then be taken but cached); otherwise taken means
 * live and the taken bits answer (ascm_slab_sync_live makes them agree when
 * caches come on). */
static inline int ascm_slab_is_live(const ascm_pool *p, const ascm_slab *s, uint64_t slot) {
    if (!ascm_caches_on(p)) return (int)((s->bits[slot >> 6] >> (slot & 63)) & 1u);
    return (__atomic_load_n(&s->slack[slot], __ATOMIC_RELAXED) & ASCM_SLOT_LIVE) != 0;
}

/* Slot of off in s, or -1 if off is not the start of a live slot. */
static inline int64_t ascm_slab_live_slot(const ascm_pool *p, const ascm_slab *s, uint64_t off) {
    int64_t slot = ascm_slab_slot_of(p, s, off);
    return slot >= 0 && ascm_slab_is_live(p, s, (uint64_t)slot) ? slot : -1;
}

static inline uint32_t ascm_slab_slack(const ascm_slab *s, uint64_t slot) {
    return __atomic_load_n(&s->slack[slot], __ATOMIC_RELAXED) & (ASCM_SLOT_LIVE - 1);
}
/* A slot handed out (by the pool under its lock, or by the thread cache
 * that holds it): its slack, and live.  With caches off the flag is not
 * read, and the sync makes it true when they come on. */
static inline void ascm_slab_hand_out(ascm_slab *s, uint64_t slot, uint64_t slack) {
    __atomic_store_n(&s->slack[slot], (uint16_t)(slack | ASCM_SLOT_LIVE), __ATOMIC_RELEASE);
}
/* A live slot's new slack (relabel), its flag kept: a free racing this
 * clears the flag in between, and the exchange then tries again. */
static inline void ascm_slab_relabel(ascm_slab *s, uint64_t slot, uint64_t slack) {
    uint16_t old = __atomic_load_n(&s->slack[slot], __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(&s->slack[slot], &old,
                                        (uint16_t)((old & ASCM_SLOT_LIVE) | slack), 1,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}
/* Caches on: the slot's live flag cleared with one atomic and, which
 * decides between two racing frees; whether it was set.  *slack: its slack. */
static inline int ascm_slab_unlive(ascm_slab *s, uint64_t slot, uint32_t *slack) {
    uint16_t old = __atomic_fetch_and(&s->slack[slot], (uint16_t)~ASCM_SLOT_LIVE, __ATOMIC_ACQ_REL);
    *slack = old & (ASCM_SLOT_LIVE - 1);
    return (old & ASCM_SLOT_LIVE) != 0;
}
/* A live slot stops being live; 0 if it was not live (then nothing changed).
 * *slack: its slack. */
static inline int ascm_slab_take_back(const ascm_pool *p, ascm_slab *s, uint64_t slot, uint32_t *slack) {
    if (ASCM_LIKELY(!ascm_caches_on(p))) {
        *slack = ascm_slab_slack(s, slot);
        return (int)((s->bits[slot >> 6] >> (slot & 63)) & 1u);
    }
    return ascm_slab_unlive(s, slot, slack);
}
/* Pool lock held, caches about to come on: live flags := taken bits. */
void ascm_slab_sync_live(ascm_pool *p);

/* The hot paths, inline so that a small pair runs in the pool's entry
 * points with no call (pool.c, alloc_locked and free_locked): the call
 * overhead was a tenth of a small pair's instructions. */

/* A spare is stranded when free space lies on both sides of it: no new slab
 * lands there (slabs take the high end of a large free region or the low end
 * of a smaller one; an alignment gap below is not free space), so the blocks
 * around it have left since it was placed, and reused in place it would split
 * the free region they left for as long as its class stays in use
 * (docs/ARCHITECTURE.md, Note [Slabs], "Stranded spares").  The kept block
 * counts as free: it is, to best fit, as soon as the next large request
 * comes.  Spares exist only in contiguous pools. */
static inline int ascm_fit_free_space(const ascm_pool *p, uint32_t node, uint32_t min_units) {
    return node && (p->fit.nodes[node].is_free || node == p->last_freed) &&
           p->fit.nodes[node].len >= min_units;
}

static inline int ascm_slab_spare_stranded(const ascm_pool *p, const ascm_slab *s) {
    const ascm_fit_node *x = &p->fit.nodes[s->node];
    return ascm_fit_free_space(p, x->next_phys, 1) &&
           ascm_fit_free_space(p, x->prev_phys, 1u << (p->sgshift - p->gshift));
}

/* Releases class cls's stranded spare (its partial list's head) and gives
 * the slab to use instead: another of the class's partial slabs, or a new
 * one placed as any new slab is (slab.c). */
int ascm_slab_replace_spare(ascm_pool *p, int cls, uint32_t *out);

/* Takes a free slot of class cls out of its slab (not live yet). */
static inline int ascm_slab_take(ascm_pool *p, int cls, uint32_t *slab, uint32_t *slot_out) {
    ascm_slab_class *k = &p->classes[cls];
    uint32_t si = k->partial;
    if (ASCM_UNLIKELY(!si)) {
        int st = ascm_slab_new(p, cls, &si);
        if (st != ASCM_OK) return st;
    }
    ascm_slab *s = p->slabs[si];
    if (s->nfree == s->count) {
        if (ASCM_UNLIKELY(ascm_slab_spare_stranded(p, s))) {
            int st = ascm_slab_replace_spare(p, cls, &si);
            if (st != ASCM_OK) return st;
            s = p->slabs[si];
        }
        if (s->nfree == s->count) { /* a spare (or a new slab) taken back into use */
            k->empty--;
            p->empty_slabs--;
        }
    }
    uint32_t w = s->hint;
    while (s->bits[w] == ~0ull) w++;
    unsigned bit = ascm_ctz64(~s->bits[w]);
    s->bits[w] |= 1ull << bit;
    s->hint = w;
    if (--s->nfree == 0) ascm_slab_list_unlink(p, k, si);
    *slab = si;
    *slot_out = w * 64 + bit;
    return ASCM_OK;
}

static inline int ascm_slab_alloc(ascm_pool *p, int cls, uint64_t requested, uint64_t *off,
                                  uint32_t *slab, uint32_t *slot_out) {
    int st = ascm_slab_take(p, cls, slab, slot_out);
    if (ASCM_UNLIKELY(st != ASCM_OK)) return st;
    ascm_slab *s = p->slabs[*slab];
    uint32_t size = p->classes[cls].size, slot = *slot_out;
    ascm_slab_hand_out(s, slot, size - requested);
    *off = s->off + (uint64_t)slot * size;
    return ASCM_OK;
}

/* A taken slot that is not live goes back to its slab. */
static inline void ascm_slab_put(ascm_pool *p, uint32_t si, uint64_t slot) {
    ascm_slab *s = p->slabs[si];
    ascm_slab_class *k = &p->classes[s->cls];
    uint32_t w = (uint32_t)(slot >> 6);
    s->bits[w] &= ~(1ull << (slot & 63));
    if (w < s->hint) s->hint = w;
    if (s->nfree++ == 0) ascm_slab_list_push(p, k, si);
    if (ASCM_UNLIKELY(s->nfree == s->count)) ascm_slab_emptied(p, k, si);
}

/* off is a byte offset in the pool, in slab si. */
static inline int ascm_slab_free(ascm_pool *p, uint32_t si, uint64_t off, uint64_t *usable,
                                 uint64_t *requested) {
    ascm_slab *s = p->slabs[si];
    int64_t slot = ascm_slab_slot_of(p, s, off);
    uint32_t slack;
    if (ASCM_UNLIKELY(slot < 0 || !ascm_slab_take_back(p, s, (uint64_t)slot, &slack))) return ASCM_ERR_BADFREE;
    uint32_t size = p->classes[s->cls].size;
    *usable = size;
    *requested = size - slack;
    ascm_slab_put(p, si, (uint64_t)slot);
    return ASCM_OK;
}
/* Every slab released at once (reset): descriptors go idle, storage is the caller's. */
void ascm_slab_forget_all(ascm_pool *p);
void ascm_slab_destroy(ascm_pool *p); /* descriptors and table freed */
/* Frees idle descriptors: call only while no thread cache can read one. */
void ascm_slab_free_idle(ascm_pool *p);
/* Gives every empty slab back to the large-block path; returns the bytes. */
uint64_t ascm_slab_trim(ascm_pool *p);
uint64_t ascm_slab_metadata_bytes(const ascm_pool *p);
uint64_t ascm_slab_cached_bytes(const ascm_pool *p); /* bytes of empty spare slabs */
/* 1 if the slab stored at byte offset off holds no live slot */
int ascm_slab_is_empty_at(const ascm_pool *p, uint64_t off);
int ascm_slab_check(const ascm_pool *p, uint64_t *live, uint64_t *used, uint64_t *requested,
                    char *msg, size_t msglen);
void ascm_slab_walk(ascm_pool *p, ascm_block_fn fn, void *ctx);

#endif /* ASCMEM_POOL_CORE_H */
