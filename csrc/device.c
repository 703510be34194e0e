/* Device: routes a CANN-style request to the pool of the right memory kind
 * and charges every page against one physical budget.  This file: the
 * device's life (create, reset, close), routing and the free path;
 * device_gate.c: the gate the GIL-free entry points pass, which reset and
 * close wait on; device_chunks.c: the chunk tables of each kind;
 * device_budget.c: the budget.  device_internal.h: what they share.
 */
#include "device_gate.h"

#include <sched.h>
#include <stdlib.h>

#define MIB (1024ull * 1024ull)

enum { HUGE_FIRST = 0, HUGE_ONLY = 1, NORMAL_ONLY = 2, HUGE_FIRST_P2P = 3, HUGE_ONLY_P2P = 4,
       NORMAL_ONLY_P2P = 5, HUGE1G_ONLY = 6, HUGE1G_ONLY_P2P = 7 };

int ascm_device_enter(ascm_device *d) { return gate_enter(d); }
void ascm_device_leave(ascm_device *d) { gate_leave(d); }

int ascm_device_new_pool(ascm_device *d, int k, uint64_t base, uint64_t size, ascm_pool **out) {
    ascm_pool_config pc = {.base = base, .size = size, .min_block = d->min_block,
                           .page_size = page_of(d, k)};
    if (d->paged && ascm_kind(k)->freed_by == ASCM_FREE_DEVICE) {
        pc.paged = 1;
        pc.map = d->map;
        pc.map_ctx = d->map_ctx;
        if (pc.page_size < d->granule_min) pc.page_size = d->granule_min;
        pc.release_threshold = d->release_threshold;
    }
    /* host memory is not charged to the device, but in RC mode it is the
     * device's (normal pages: see route()) */
    int st;
    if (ascm_kind(k)->device || (k == ASCM_KIND_HOST && d->host_is_device)) {
        pc.charge = ascm_device_charge;
        pc.charge_ctx = &d->ctx[k];
        st = ascm_pool_create_shared(&pc, &d->lock, out);
    } else {
        st = ascm_pool_create(&pc, out);
    }
    if (st == ASCM_OK && pc.paged && d->release_threshold_max) /* nothing kept yet: nothing to unmap */
        ascm_pool_set_release_cap(*out, d->release_threshold_max);
    return st;
}

static int make_pools(ascm_device *d) {
    for (int k = 0; k < ASCM_KINDS; k++) {
        if (!d->size[k] && !d->growable[k]) continue;
        chunk_table *t = calloc(1, sizeof *t);
        if (!t) return ASCM_ERR_HOSTMEM;
        atomic_store_explicit(&d->table[k], t, memory_order_release);
        if (!d->size[k]) continue;
        int st = ascm_device_new_pool(d, k, d->base[k], d->size[k], &t->c[0].pool);
        if (st != ASCM_OK) return st;
        give_caches_mode(d, k, t->c[0].pool); /* a reset keeps the device's caches */
        give_placement(d, t->c[0].pool);      /* and placement */
        t->c[0].base = d->base[k];
        t->c[0].size = d->size[k];
        t->n = 1;
    }
    return ASCM_OK;
}

static void drop_pool(ascm_pool *p) {
    /* the range goes with the pool (a reset retires it, a closed device gave
     * it back already, and the OS may have handed it to someone else): no
     * unmapping, only the accounting */
    ascm_pool_detach_mapping(p);
    ascm_pool_reset(p); /* gives its pages back to the budget */
    ascm_pool_destroy(p);
}

static void drop_pools(ascm_device *d) {
    for (int k = 0; k < ASCM_KINDS; k++) {
        chunk_table *t = table_of(d, k);
        for (uint32_t i = 0; t && i < t->n; i++) drop_pool(t->c[i].pool);
        free(t);
        atomic_store_explicit(&d->table[k], NULL, memory_order_release);
        memset(&d->retired_totals[k], 0, sizeof d->retired_totals[k]);
        atomic_store_explicit(&d->failed[k], 0, memory_order_relaxed);
    }
    while (d->graveyard) {
        retired *r = d->graveyard;
        d->graveyard = r->next;
        if (r->pool) drop_pool(r->pool);
        free(r->table);
        free(r);
    }
}

int ascm_device_create(const ascm_device_config *cfg, ascm_device **out) {
    *out = NULL;
    /* every pool it makes takes the unit: refused here, not at the first
     * chunk of a kind that has none yet (a growable one) */
    if (cfg->min_block == 0 || (cfg->min_block & (cfg->min_block - 1))) return ASCM_ERR_INVAL;
    ascm_device *d = ascm_zalloc_lines(sizeof *d);
    if (!d) return ASCM_ERR_HOSTMEM;
    ascm_gate_init(d);
    d->b = cfg->budget;
    d->b.huge_used = d->b.normal_used = d->b.peak_huge = d->b.peak_normal = 0;
    d->min_block = cfg->min_block;
    d->slab_max = ASCM_SLAB_MAX;
    d->p2p = cfg->p2p;
    d->paged = cfg->paged != 0;
    d->map = cfg->map;
    d->map_ctx = cfg->map_ctx;
    d->granule_min = cfg->granule_min;
    d->host_is_device = cfg->host_is_device != 0;
    d->release_threshold = cfg->release_threshold;
    d->release_threshold_max = cfg->release_threshold_max;
    for (int k = 0; k < ASCM_KINDS; k++) {
        d->base[k] = cfg->base[k];
        d->size[k] = cfg->size[k];
        d->growable[k] = cfg->growable[k] != 0;
        d->ctx[k].dev = d;
        d->ctx[k].huge = ascm_kind(k)->huge;
    }
    int st = make_pools(d);
    if (st != ASCM_OK) {
        ascm_device_destroy(d);
        return st;
    }
    ascm_fork_register(&d->fork_chunks, &d->chunks_lock, ASCM_FORK_CHUNKS, ascm_gate_in_child);
    ascm_fork_register(&d->fork_budget, &d->lock, ASCM_FORK_BUDGET, NULL);
    *out = d;
    return ASCM_OK;
}

void ascm_device_destroy(ascm_device *d) {
    if (!d) return;
    ascm_fork_unregister(&d->fork_chunks);
    ascm_fork_unregister(&d->fork_budget);
    drop_pools(d);
    ascm_set_clear(&d->guards);
    ascm_set_clear(&d->handed);
    free(d);
}

int ascm_device_close(ascm_device *d) {
    if (atomic_exchange(&d->closed, 1)) return ASCM_OK;
    ascm_device_quiesce(d); /* and stays shut: every later call gets ASCM_ERR_CLOSED */
    return ASCM_OK;
}

int ascm_device_reset(ascm_device *d, const uint64_t base[ASCM_KINDS]) {
    if (atomic_load(&d->closed)) return ASCM_ERR_CLOSED;
    ascm_device_quiesce(d); /* no caller is inside while the pools are swapped */
    drop_pools(d);
    ascm_lock_acquire(&d->chunks_lock); /* every block is gone, guarded ones too */
    ascm_set_clear(&d->guards);
    atomic_store(&d->nguards, 0);
    ascm_set_clear(&d->handed);
    atomic_store(&d->nhanded, 0);
    ascm_lock_release(&d->chunks_lock);
    for (int k = 0; k < ASCM_KINDS; k++) d->base[k] = base[k];
    ascm_lock_acquire(&d->lock);
    /* b.fixed (the runtime's own memory: AI CPU operator cache, system
     * package) stays: a reset frees blocks, only a restart frees that */
    d->b.peak_huge = d->b.huge_used;
    d->b.peak_normal = d->b.normal_used;
    ascm_lock_release(&d->lock);
    int st = make_pools(d);
    ascm_device_reopen(d);
    return st;
}

/* Rounds of the grow hook one request may ask for.  The hook says yes only
 * when the kind's chunks changed (it grew them, or another thread did), so
 * the rounds end when the kind is at its maximum; the bound only stops a
 * livelock of threads that keep taking each other's new chunks. */
#define GROW_ROUNDS (4 * ASCM_MAX_CHUNKS)

/* Every chunk of the kind in turn, from chunk `first` in the first round;
 * then, while the kind can grow and its chunks were full (not over budget),
 * the grow hook and another round.  st: the status of the chunks before
 * first.  A request that fits under the maximum is not refused because
 * another thread grew the kind first: that thread's chunk is tried next. */
static int try_chunks(ascm_device *d, int kind, uint64_t size, uint64_t pad, uint64_t align,
                      uint64_t *addr, uint32_t first, int st) {
    for (int round = 0;; round++, first = 0, st = ASCM_ERR_NOMEM) {
        chunk_table *t = table_of(d, kind);
        if (!t) return ASCM_ERR_NOMEM;
        for (uint32_t i = first; i < t->n; i++) {
            int got = ascm_pool_alloc_padded(t->c[i].pool, size, pad, align, addr);
            if (got == ASCM_OK || got == ASCM_ERR_INVAL) return got;
            if (got == ASCM_ERR_BUDGET || st == ASCM_ERR_NOMEM) st = got;
        }
        if (st != ASCM_ERR_NOMEM || round >= GROW_ROUNDS || !d->growable[kind] || !d->grow ||
            d->grow(d->grow_ctx, kind, size + pad, align, t->generation) != ASCM_OK)
            return st;
    }
}

/* The first chunk inline: it serves nearly every request. */
static inline int try_kind(ascm_device *d, int kind, uint64_t size, uint64_t pad, uint64_t align,
                           uint64_t *addr) {
    chunk_table *t = table_of(d, kind);
    if (ASCM_UNLIKELY(!t || !t->n)) return try_chunks(d, kind, size, pad, align, addr, 0, ASCM_ERR_NOMEM);
    int got = ascm_pool_alloc_padded(t->c[0].pool, size, pad, align, addr);
    if (ASCM_LIKELY(got == ASCM_OK) || got == ASCM_ERR_INVAL) return got;
    return try_chunks(d, kind, size, pad, align, addr, 1, got);
}

/* aclrtMalloc's (and acldvppMalloc's) size: ALIGN_UP(size, 32) + 32 (see
 * route() for the sources). */
static inline uint64_t malloc_size(uint64_t size) {
    return ((size + 31) & ~31ull) + 32;
}

/* HUGE_FIRST's first kind: huge pages above 1 MiB of the rounded size the
 * runtime is asked for, normal pages below (npu_driver_mem.cc lines
 * 1035-1056; HUGE_PAGE_MEM_CRITICAL_VALUE, npu_driver_base.hpp 249). */
static inline int huge_first_kind(uint64_t rounded) {
    return rounded > MIB ? ASCM_KIND_HUGE : ASCM_KIND_NORMAL;
}

static inline int route(const ascm_device *d, uint64_t size, uint32_t policy, int mode,
                        ascm_route *r) {
    if (size == 0) return ASCM_ERR_INVAL;
    if (size > (1ull << 62)) return ASCM_ERR_NOMEM; /* no device has this much; rounding would wrap */
    r->rounded = (size + 31) & ~31ull;
    r->align = 64;
    /* Every piece cut from a larger block needs ALIGN_UP(len, 32) + 32 bytes
     * at a 64-byte start, whichever call made the block: hicann/runtime
     * docs/api_docs/aclrtMallocAlign32.md lines 43-45 (commit 06531b1), the
     * same on aclrtMalloc's page.  aclrtMallocAlign32 and the 1 GiB-page
     * policies report ALIGN_UP(len, 32) and are placed with the 32-byte tail
     * (pad) after it, which is nobody's. */
    r->pad = mode == ASCM_SIZE_ALIGN32 ? 32 : 0; /* ASCM_SIZE_MAPPED: no piece follows it */
    r->nkinds = 1;
    r->reserve_event = 0;
    if (mode == ASCM_SIZE_MALLOC || mode == ASCM_SIZE_DVPP) r->rounded = malloc_size(size);
    if (mode == ASCM_SIZE_DVPP) {
        r->kinds[0] = ASCM_KIND_DVPP;
        r->align = 128;
        return ASCM_OK;
    }
    if (mode == ASCM_SIZE_HOST) {
        r->kinds[0] = ASCM_KIND_HOST;
        /* RC mode (Ascend RC, control CPU open): host and device are one, so
         * aclrtMallocHost is device memory in normal pages, and every piece
         * cut from a larger block needs ALIGN_UP(len, 32) + 32 at a 64-byte
         * start (hicann/runtime docs/zh/api_ref/11-02_host_memory_management.md
         * lines 71-77).  Elsewhere host memory is the host's: 64-byte start. */
        r->rounded = d->host_is_device ? r->rounded + 32 : size;
        return ASCM_OK;
    }
    /* aclMallocMemInner compares the policy whole: one OR-ed with a flag,
     * or out of range, is none of the named ones and takes the default route
     * (hicann/runtime src/acl/aclrt_impl/memory.cpp lines 320-342) */
    if (policy > HUGE1G_ONLY_P2P) policy = HUGE_FIRST;
    if (policy >= HUGE_FIRST_P2P && policy != HUGE1G_ONLY && !d->p2p) return ASCM_ERR_UNSUPPORTED;
    switch (policy) {
    case HUGE1G_ONLY:
    case HUGE1G_ONLY_P2P:
        if (!table_of(d, ASCM_KIND_HUGE1G)) return ASCM_ERR_UNSUPPORTED;
        r->kinds[0] = ASCM_KIND_HUGE1G;
        r->rounded = (size + 31) & ~31ull; /* 1 GiB pages: CANN rounds without the extra 32 */
        r->pad = 32;                         /* ...and the sub-allocated piece keeps its tail */
        return ASCM_OK;
    case HUGE_ONLY:
    case HUGE_ONLY_P2P:
        r->kinds[0] = ASCM_KIND_HUGE;
        r->reserve_event = 1;
        return ASCM_OK;
    case NORMAL_ONLY:
    case NORMAL_ONLY_P2P:
        r->kinds[0] = ASCM_KIND_NORMAL;
        return ASCM_OK;
    default: /* HUGE_FIRST, HUGE_FIRST_P2P and the default route: normal
              * pages also when huge ones run out */
        if (huge_first_kind(r->rounded) == ASCM_KIND_HUGE) {
            r->kinds[0] = ASCM_KIND_HUGE;
            r->kinds[1] = ASCM_KIND_NORMAL;
            r->nkinds = 2;
            r->reserve_event = 1;
        } else {
            r->kinds[0] = ASCM_KIND_NORMAL;
        }
        return ASCM_OK;
    }
}

/* route(), and MALLOC_KEEP: MALLOC's route, its rounding moved into pad;
 * EXACT: MALLOC's route, the size as asked with no pad.  EXACT's blocks are
 * no CANN call's to cut, so the tail goes: with it a block of a whole
 * number of granules (torch's 16 MiB tensors) reached into one granule more
 * of a paged pool, resident once touched, and never packed two to a
 * granule.  Its kinds stay MALLOC's (an exact 1 MiB request goes to huge
 * pages, as aclrtMalloc sends it): on normal pages the same blocks would
 * hold a second release threshold's worth of kept pages. */
static inline int route_any(const ascm_device *d, uint64_t size, uint32_t policy, int mode,
                            ascm_route *r) {
    if (ASCM_LIKELY(mode != ASCM_SIZE_MALLOC_KEEP && mode != ASCM_SIZE_EXACT))
        return route(d, size, policy, mode, r);
    int st = route(d, size, policy, ASCM_SIZE_MALLOC, r);
    if (st == ASCM_OK) { /* rounded - size <= 63 (ALIGN_UP + 32; 1 GiB pages: ALIGN_UP, pad 32) */
        r->pad = mode == ASCM_SIZE_EXACT ? 0 : r->pad + r->rounded - size;
        r->rounded = size;
    }
    return st;
}

int ascm_device_route(const ascm_device *d, uint64_t size, uint32_t policy, int mode,
                      ascm_route *r) {
    return route_any(d, size, policy, mode, r);
}

/* ---- blocks handed out to C callers ------------------------------------------
 * A mark per block, not a count per path: a block the pluggable alloc made
 * and Python's free released (or the other way round) kept a count per
 * path off by one for good, and close() refused -- or allowed while a C
 * block was live.  The free of a marked block unmarks it, whichever path
 * frees it; a free tests the count alone while nothing is marked. */
int ascm_device_hand_out_block(ascm_device *d, uint64_t addr) {
    ascm_lock_acquire(&d->chunks_lock);
    int st = ascm_set_add(&d->handed, addr);
    atomic_store_explicit(&d->nhanded, d->handed.count, memory_order_release);
    ascm_lock_release(&d->chunks_lock);
    return st;
}

int64_t ascm_device_handed_out(ascm_device *d) {
    return (int64_t)atomic_load_explicit(&d->nhanded, memory_order_acquire);
}

/* Unmarks addr; whether it was marked. */
static __attribute__((noinline)) int unhand(ascm_device *d, uint64_t addr) {
    ascm_lock_acquire(&d->chunks_lock);
    int was = ascm_set_has(&d->handed, addr);
    if (was) {
        ascm_set_remove(&d->handed, addr);
        atomic_store_explicit(&d->nhanded, d->handed.count, memory_order_release);
    }
    ascm_lock_release(&d->chunks_lock);
    return was;
}

/* p's free of addr, unmarking it first if it was handed out: unmarked after
 * the free, the address could be handed out again and marked by another
 * thread in between, and this would unmark the new block. */
static inline int pool_free_unhanding(ascm_device *d, ascm_pool *p, uint64_t addr) {
    if (ASCM_LIKELY(atomic_load_explicit(&d->nhanded, memory_order_acquire) == 0))
        return ascm_pool_free(p, addr);
    int was = unhand(d, addr);
    int st = ascm_pool_free(p, addr);
    if (ASCM_UNLIKELY(st != ASCM_OK && was)) ascm_device_hand_out_block(d, addr); /* nothing freed */
    return st;
}

/* The media window past 90%: bytes in use over the kind's chunks (no full
 * statistics on the allocation path). */
static int media_over_90(ascm_device *d) {
    chunk_table *t = table_of(d, ASCM_KIND_DVPP);
    uint64_t used = 0, capacity = 0;
    for (uint32_t i = 0; t && i < t->n; i++) {
        used += ascm_pool_used(t->c[i].pool);
        capacity += t->c[i].size;
    }
    return used * 10 > capacity * 9;
}

/* The kinds after the first of a route that missed with st: the reserve
 * event, then HUGE_FIRST's normal pages when huge ones ran out. */
static int try_rest(ascm_device *d, const ascm_route *r, int st, uint64_t *addr, int *kind,
                    int *events) {
    if (r->reserve_event && (st == ASCM_ERR_BUDGET || st == ASCM_ERR_NOMEM) && !d->b.huge_grows)
        *events |= ASCM_EVENT_RESERVE_FULL;
    if (r->nkinds > 1) {
        *kind = r->kinds[1];
        st = try_kind(d, r->kinds[1], r->rounded, r->pad, r->align, addr);
        if (st == ASCM_OK) *events |= ASCM_EVENT_HUGE_FALLBACK;
    }
    return st;
}

/* In line in both callers, and ascm_device_try_malloc_held (an entry point,
 * ASCM_ENTRY) in line in the Cython module's malloc: the calls and their seven
 * arguments would otherwise be paid on every Device allocation. */
ASCM_SPECIALISED int device_try(ascm_device *d, uint64_t size, uint32_t policy, int mode,
                                uint64_t *addr, int *kind, int *events) {
    *events = 0;
    ascm_route r;
    if (ASCM_LIKELY(mode == ASCM_SIZE_MALLOC && policy == HUGE_FIRST) && size - 1 < (1ull << 62)) {
        /* aclrtMalloc's default policy, nearly every request: route()'s
         * default case without the general one */
        uint64_t rounded = malloc_size(size);
        int k = huge_first_kind(rounded);
        *kind = k;
        int st = try_kind(d, k, rounded, 0, 64, addr);
        if (ASCM_LIKELY(st == ASCM_OK) || k == ASCM_KIND_NORMAL) return st;
        route(d, size, policy, mode, &r); /* the same route, for the rest of it */
        return try_rest(d, &r, st, addr, kind, events);
    }
    *kind = -1;
    int st = route_any(d, size, policy, mode, &r);
    if (st != ASCM_OK) return st;
    *kind = r.kinds[0];
    st = try_kind(d, r.kinds[0], r.rounded, r.pad, r.align, addr);
    if (st != ASCM_OK) st = try_rest(d, &r, st, addr, kind, events);
    if (st == ASCM_OK && *kind == ASCM_KIND_DVPP && media_over_90(d)) *events |= ASCM_EVENT_MEDIA_90;
    return st;
}

/* An aligned group's request (Device.align_tag): the route of the call, its
 * size (pad included) rounded up to a multiple of align and placed at a
 * multiple of align, so that both the start and the usable size are
 * multiples of it; the kinds are tried as the route says.  align: a power
 * of two (ASCM_ERR_INVAL otherwise, or when rounding would wrap). */
static int device_try_aligned(ascm_device *d, uint64_t size, uint32_t policy, int mode,
                              uint64_t align, uint64_t *addr, int *kind, int *events) {
    *events = 0;
    *kind = -1;
    if (align == 0 || (align & (align - 1))) return ASCM_ERR_INVAL;
    ascm_route r;
    int st = route(d, size, policy, mode, &r);
    if (st != ASCM_OK) return st;
    uint64_t whole = r.rounded + r.pad;
    if (whole > UINT64_MAX - align) return ASCM_ERR_NOMEM; /* no device has this much */
    r.rounded = (whole + align - 1) & ~(align - 1);
    r.pad = 0;
    if (align > r.align) r.align = align;
    *kind = r.kinds[0];
    st = try_kind(d, r.kinds[0], r.rounded, 0, r.align, addr);
    if (st != ASCM_OK) st = try_rest(d, &r, st, addr, kind, events);
    return st;
}

/* An allocation refused because the device is closed (or shut for a reset). */
static inline int refused(int *kind, int *events) {
    *events = 0;
    *kind = -1;
    return ASCM_ERR_CLOSED;
}

ASCM_ENTRY int ascm_device_try_malloc_held(ascm_device *d, uint64_t size, uint32_t policy,
                                           int mode, uint64_t *addr, int *kind, int *events) {
    if (ASCM_UNLIKELY(atomic_load_explicit(&d->closed, memory_order_relaxed)))
        return refused(kind, events);
    return device_try(d, size, policy, mode, addr, kind, events);
}

int ascm_device_try_malloc_aligned_held(ascm_device *d, uint64_t size, uint32_t policy, int mode,
                                        uint64_t align, uint64_t *addr, int *kind, int *events) {
    if (ASCM_UNLIKELY(atomic_load_explicit(&d->closed, memory_order_relaxed)))
        return refused(kind, events);
    return device_try_aligned(d, size, policy, mode, align, addr, kind, events);
}

int ascm_device_try_malloc(ascm_device *d, uint64_t size, uint32_t policy, int mode, uint64_t *addr,
                           int *kind, int *events) {
    if (ASCM_UNLIKELY(!gate_enter(d))) return refused(kind, events);
    int st = device_try(d, size, policy, mode, addr, kind, events);
    gate_leave(d);
    return st;
}

void ascm_device_count_failure(ascm_device *d, int kind) {
    if (kind >= 0 && kind < ASCM_KINDS) atomic_fetch_add_explicit(&d->failed[kind], 1, memory_order_relaxed);
}

/* Also for a caller that passed the gate already (the pluggable and
 * external-allocator slots enter it to hold the device they loaded): a
 * second pass cost two more atomic operations a call. */
int ascm_device_malloc_entered(ascm_device *d, uint64_t size, uint32_t policy, int mode, uint64_t *addr,
                               int *kind, int *events) {
    int st = device_try(d, size, policy, mode, addr, kind, events);
    if (ASCM_UNLIKELY(st == ASCM_ERR_NOMEM || st == ASCM_ERR_BUDGET)) ascm_device_count_failure(d, *kind);
    return st;
}

int ascm_device_malloc(ascm_device *d, uint64_t size, uint32_t policy, int mode, uint64_t *addr,
                       int *kind, int *events) {
    if (ASCM_UNLIKELY(!gate_enter(d))) return refused(kind, events);
    int st = ascm_device_malloc_entered(d, size, policy, mode, addr, kind, events);
    gate_leave(d);
    return st;
}

/* The pool of kind k's chunk that holds addr, or NULL. */
static inline ascm_pool *chunk_in(const ascm_device *d, int k, uint64_t addr) {
    const chunk_table *t = table_of(d, k);
    if (!t) return NULL;
    for (const chunk *c = t->c, *end = t->c + t->n; c < end; c++)
        if (addr - c->base < c->size) return c->pool; /* below base wraps past size */
    return NULL;
}

/* The chunk's pool that holds addr among the kinds in kind_mask, or NULL. */
static ascm_pool *chunk_at(const ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind) {
    for (unsigned m = kind_mask & ((1u << ASCM_KINDS) - 1); m; m &= m - 1) {
        int k = (int)__builtin_ctz(m);
        ascm_pool *p = chunk_in(d, k, addr);
        if (p) {
            if (kind) *kind = k;
            return p;
        }
    }
    if (kind) *kind = -1;
    return NULL;
}

ascm_pool *ascm_device_pool_at(const ascm_device *d, uint64_t addr, int *kind) {
    return chunk_at(d, addr, (1u << ASCM_KINDS) - 1, kind);
}

int ascm_device_kind_of(const ascm_device *d, uint64_t addr) {
    int k;
    ascm_device_pool_at(d, addr, &k);
    return k;
}

/* A free looks first in the kind the last free found its block in: a
 * workload frees mostly one kind, and for normal pages -- most blocks of
 * the real-model traces -- the kinds' order would look at huge pages first.
 * The hint is a kind, never a pointer, so a stale one costs a look. */
static inline int device_free(ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind) {
    int hint = atomic_load_explicit(&d->free_kind, memory_order_relaxed);
    ascm_pool *p = (kind_mask >> hint) & 1 ? chunk_in(d, hint, addr) : NULL;
    if (ASCM_LIKELY(p != NULL)) {
        if (kind) *kind = hint;
        return pool_free_unhanding(d, p, addr);
    }
    int k;
    p = chunk_at(d, addr, kind_mask & ~(1u << hint), &k); /* the kinds the caller expects */
    if (kind) *kind = k;
    if (p) {
        atomic_store_explicit(&d->free_kind, k, memory_order_relaxed);
        return pool_free_unhanding(d, p, addr);
    }
    ascm_device_pool_at(d, addr, kind); /* another kind's pointer: say which */
    return ASCM_ERR_BADFREE;
}

/* Guards: a block the Python layer tracks -- freed on a stream and waiting
 * for it, record_stream'd, viewed through a buffer, tagged -- is freed and
 * forgotten there alone.  A GIL-free free of it (the pluggable functions,
 * cimport's free_raw, the capsule) would let the Python layer free the
 * block again once its stream is done, by then someone else's, or write
 * through a view into it, or put it to sleep: so that free is refused
 * (ASCM_ERR_BADFREE, nothing changed).  Set by the Python layer (GIL held)
 * while it tracks a block, until it frees it; reset clears them all. */
int ascm_device_guard(ascm_device *d, uint64_t addr) {
    ascm_lock_acquire(&d->chunks_lock);
    int st = ascm_set_add(&d->guards, addr);
    atomic_store_explicit(&d->nguards, d->guards.count, memory_order_release);
    ascm_lock_release(&d->chunks_lock);
    return st;
}

void ascm_device_unguard(ascm_device *d, uint64_t addr) {
    if (!atomic_load_explicit(&d->nguards, memory_order_acquire)) return;
    ascm_lock_acquire(&d->chunks_lock);
    ascm_set_remove(&d->guards, addr);
    atomic_store_explicit(&d->nguards, d->guards.count, memory_order_release);
    ascm_lock_release(&d->chunks_lock);
}

/* Out of line: the free's path tests the count alone. */
static __attribute__((noinline)) int guarded(ascm_device *d, uint64_t addr) {
    ascm_lock_acquire(&d->chunks_lock);
    int hit = ascm_set_has(&d->guards, addr);
    ascm_lock_release(&d->chunks_lock);
    return hit;
}

int ascm_device_free_entered(ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind) {
    if (ASCM_UNLIKELY(atomic_load_explicit(&d->nguards, memory_order_acquire) != 0) &&
        guarded(d, addr)) {
        *kind = ascm_device_kind_of(d, addr);
        return ASCM_ERR_BADFREE;
    }
    return device_free(d, addr, kind_mask, kind);
}

int ascm_device_free(ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind) {
    if (ASCM_UNLIKELY(!gate_enter(d))) {
        *kind = -1;
        return ASCM_ERR_CLOSED;
    }
    int st = ascm_device_free_entered(d, addr, kind_mask, kind);
    gate_leave(d);
    return st;
}

static __attribute__((noinline)) int free_unguarding(ascm_device *d, uint64_t addr,
                                                     unsigned kind_mask, int *kind) {
    int st = device_free(d, addr, kind_mask, kind);
    if (st == ASCM_OK) ascm_device_unguard(d, addr);
    return st;
}

ASCM_ENTRY int ascm_device_free_held(ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind) {
    if (ASCM_UNLIKELY(atomic_load_explicit(&d->closed, memory_order_relaxed))) {
        *kind = -1;
        return ASCM_ERR_CLOSED;
    }
    /* the caller that guards blocks frees them here: the guard goes too */
    if (ASCM_UNLIKELY(atomic_load_explicit(&d->nguards, memory_order_relaxed) != 0))
        return free_unguarding(d, addr, kind_mask, kind);
    return device_free(d, addr, kind_mask, kind);
}

