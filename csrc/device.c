/* Device: routes a CANN-style request to the pool of the right memory kind
 * and charges every page against one physical budget.
 *
 * Budget (CANN "Memory Management" precautions; see ascmem/profiles.py):
 *   huge_used <= reserve + (huge_grows ? what shared has left : 0)
 *   max(0, huge_used - reserve) + normal_used + fixed <= shared
 *   huge_used + normal_used + fixed <= limit        (when a limit is set)
 * Pools report page deltas through their charge hook, which runs with the
 * pool's lock held.  Every pool the budget charges shares one lock, the
 * device's (ascm_pool_create_shared), so the hook needs no lock of its own:
 * a pair that empties and refills a huge page took a second lock twice when
 * the budget had a lock of its own (C, 1 MiB pair: 532 -> 495 instructions,
 * 80-98 -> 62-72 ns; `make -C benchmarks/c instructions`, bench_core).  The
 * cost: pools of different kinds wait for each other, where before they met
 * only at page changes (with thread caches, slab sizes take no lock).
 *
 * Chunks: a kind's memory is one or more chunks, each a pool over a range
 * taken from an upstream (the OS, the Ascend runtime).  A kind with a grow
 * hook takes another chunk when its chunks are full, and gives empty chunks
 * back on request.  The chunk list of a kind is an immutable table swapped
 * in with one atomic store, so the allocation and free paths read it with no
 * lock while another thread grows or shrinks the kind; replaced tables and
 * retired pools are kept until reset or destroy, since a reader may still
 * hold them (a retired pool is closed: it refuses allocations).
 *
 * The gate: callers without the GIL (the capsule, cimport's raw methods, the
 * pluggable-allocator functions) may be inside the device while Python resets
 * or closes it.  Every entry point that reads the chunk tables counts itself
 * in (inflight) and refuses with ASCM_ERR_CLOSED while the gate is shut;
 * reset and close shut it and wait for the count to drain before they free
 * anything, so no call ever runs on a freed pool.
 */
#include "internal.h"

#include <sched.h>
#include <stdlib.h>

#define MIB (1024ull * 1024ull)

enum { HUGE_FIRST = 0, HUGE_ONLY = 1, NORMAL_ONLY = 2, HUGE_FIRST_P2P = 3, HUGE_ONLY_P2P = 4,
       NORMAL_ONLY_P2P = 5, HUGE1G_ONLY = 6, HUGE1G_ONLY_P2P = 7 };

struct ascm_device;

typedef struct charge_ctx {
    struct ascm_device *dev;
    int huge; /* charges huge pages (HUGE, DVPP, HUGE1G) or normal ones */
} charge_ctx;

typedef struct chunk {
    uint64_t base, size;
    ascm_pool *pool;
} chunk;

typedef struct chunk_table {
    uint64_t generation; /* changes with every table of the kind */
    uint32_t n;
    chunk c[ASCM_MAX_CHUNKS];
} chunk_table;

typedef struct retired { /* kept until reset or destroy: readers may hold it */
    struct retired *next;
    chunk_table *table;
    ascm_pool *pool;
} retired;

typedef struct kind_totals { /* what retired chunks of a kind had counted */
    uint64_t alloc_bytes, freed_bytes, alloc_requested, freed_requested;
    uint64_t alloc_count, free_count, peak_used, peak_requested;
} kind_totals;

struct ascm_device {
    _Atomic(chunk_table *) table[ASCM_KINDS]; /* NULL: the kind does not exist */
    _Atomic int closed; /* beside the tables: the held calls read it every time */
    uint64_t base[ASCM_KINDS], size[ASCM_KINDS], min_block;
    int growable[ASCM_KINDS];
    charge_ctx ctx[ASCM_KINDS];
    int p2p;
    int paged;            /* see ascm_device_config */
    ascm_map_fn map;
    void *map_ctx;
    uint64_t granule_min;
    int host_is_device; /* RC mode: aclrtMallocHost is device memory (route, new_pool) */
    uint64_t release_threshold;
    ascm_lock chunks_lock; /* serialises table changes; never held while allocating */
    retired *graveyard;
    /* blocks the Python layer tracks, which the GIL-free free refuses
     * (ascm_device_guard); under chunks_lock, with their count beside for
     * the free's lock-free test */
    ascm_addrset guards;
    _Atomic uint64_t nguards;
    kind_totals retired_totals[ASCM_KINDS];
    /* requests the whole kind failed (a miss in one chunk that another
     * chunk serves is no failure, so the pools' own counts do not add up) */
    _Atomic uint64_t failed[ASCM_KINDS];
    ascm_grow_fn grow;
    void *grow_ctx;
    ascm_release_fn release;
    void *release_ctx;
    /* the gate (see the top of this file), away from the fields above */
    char gate_pad[64];
    _Atomic uint64_t inflight;
    _Atomic uint32_t shut;   /* quiesce() calls not yet reopened; closed devices stay shut */
    ascm_fork_node fork_chunks, fork_budget;
    /* the budget's lock, which the charged pools take as theirs: written on
     * every call, so a line of its own, away from the tables read without it */
    _Alignas(64) ascm_lock lock;
    ascm_budget b;
};

static inline int gate_enter(ascm_device *d) {
    atomic_fetch_add(&d->inflight, 1); /* sequentially consistent with quiesce's shut */
    if (ASCM_LIKELY(!atomic_load(&d->shut))) return 1;
    atomic_fetch_sub_explicit(&d->inflight, 1, memory_order_release);
    return 0;
}

static inline void gate_leave(ascm_device *d) {
    atomic_fetch_sub_explicit(&d->inflight, 1, memory_order_release);
}

int ascm_device_enter(ascm_device *d) { return gate_enter(d); }
void ascm_device_leave(ascm_device *d) { gate_leave(d); }

void ascm_device_quiesce(ascm_device *d) {
    atomic_fetch_add(&d->shut, 1);
    for (unsigned spins = 0; atomic_load(&d->inflight); spins++) {
        if (spins >= 64) {
            sched_yield();
            spins = 0;
        }
    }
}

void ascm_device_reopen(ascm_device *d) {
    if (!atomic_load(&d->closed)) atomic_fetch_sub(&d->shut, 1);
}

/* Waits, without spinning hard, until a reset in progress has reopened the
 * gate; returns ASCM_ERR_CLOSED if the device is closed for good. */
int ascm_device_wait_open(ascm_device *d) {
    while (atomic_load(&d->shut)) {
        if (atomic_load(&d->closed)) return ASCM_ERR_CLOSED;
        sched_yield();
    }
    return ASCM_OK;
}

/* In a child of fork(): the parent's other threads are not here. */
static void gate_in_child(ascm_fork_node *n) {
    ascm_device *d = (ascm_device *)((char *)n - offsetof(ascm_device, fork_chunks));
    atomic_store(&d->inflight, 0);
    atomic_store(&d->shut, atomic_load(&d->closed) ? 1u : 0u);
}

/* The pool's page: the kind's, or the unit when that is larger. */
static uint64_t page_of(const ascm_device *d, int kind) {
    uint64_t page = ascm_kind(kind)->page_size;
    return page > d->min_block ? page : d->min_block;
}

static inline chunk_table *table_of(const ascm_device *d, int kind) {
    return atomic_load_explicit((_Atomic(chunk_table *) *)&d->table[kind], memory_order_acquire);
}

static uint64_t growth(const ascm_budget *b, uint64_t huge_used) {
    return huge_used > b->reserve ? huge_used - b->reserve : 0;
}

static int fits(const ascm_budget *b, uint64_t huge, uint64_t normal) {
    if (!b->huge_grows && huge > b->reserve) return 0;
    uint64_t from_shared = growth(b, huge) + normal + b->fixed;
    if (from_shared > b->shared) return 0;
    if (b->limit && huge + normal + b->fixed > b->limit) return 0;
    return 1;
}

/* The pools' charge hook: their lock, which is the device's, is held. */
static int charge(void *vctx, int64_t delta) {
    charge_ctx *c = vctx;
    ascm_budget *b = &c->dev->b;
    uint64_t huge = b->huge_used, normal = b->normal_used;
    if (c->huge) huge += (uint64_t)delta;
    else normal += (uint64_t)delta;
    int ok = delta <= 0 || fits(b, huge, normal);
    if (ok) {
        b->huge_used = huge;
        b->normal_used = normal;
        if (huge > b->peak_huge) b->peak_huge = huge;
        if (normal > b->peak_normal) b->peak_normal = normal;
    }
    return ok ? 0 : 1;
}

static int new_pool(ascm_device *d, int k, uint64_t base, uint64_t size, ascm_pool **out) {
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
    if (ascm_kind(k)->device || (k == ASCM_KIND_HOST && d->host_is_device)) {
        pc.charge = charge;
        pc.charge_ctx = &d->ctx[k];
        return ascm_pool_create_shared(&pc, &d->lock, out);
    }
    return ascm_pool_create(&pc, out);
}

static int make_pools(ascm_device *d) {
    for (int k = 0; k < ASCM_KINDS; k++) {
        if (!d->size[k] && !d->growable[k]) continue;
        chunk_table *t = calloc(1, sizeof *t);
        if (!t) return ASCM_ERR_HOSTMEM;
        atomic_store_explicit(&d->table[k], t, memory_order_release);
        if (!d->size[k]) continue;
        int st = new_pool(d, k, d->base[k], d->size[k], &t->c[0].pool);
        if (st != ASCM_OK) return st;
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
    ascm_device *d = ascm_zalloc_lines(sizeof *d);
    if (!d) return ASCM_ERR_HOSTMEM;
    d->b = cfg->budget;
    d->b.huge_used = d->b.normal_used = d->b.peak_huge = d->b.peak_normal = 0;
    d->min_block = cfg->min_block;
    d->p2p = cfg->p2p;
    d->paged = cfg->paged != 0;
    d->map = cfg->map;
    d->map_ctx = cfg->map_ctx;
    d->granule_min = cfg->granule_min;
    d->host_is_device = cfg->host_is_device != 0;
    d->release_threshold = cfg->release_threshold;
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
    ascm_fork_register(&d->fork_chunks, &d->chunks_lock, ASCM_FORK_CHUNKS, gate_in_child);
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
    r->pad = mode == ASCM_SIZE_ALIGN32 ? 32 : 0;
    r->nkinds = 1;
    r->reserve_event = 0;
    if (mode == ASCM_SIZE_MALLOC || mode == ASCM_SIZE_DVPP) r->rounded += 32;
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
    default: /* HUGE_FIRST, HUGE_FIRST_P2P and the default route */
        /* huge pages above 1 MiB of the rounded size the runtime is asked
         * for, normal pages when there are none (npu_driver_mem.cc lines
         * 1035-1056; HUGE_PAGE_MEM_CRITICAL_VALUE, npu_driver_base.hpp 249) */
        if (r->rounded > MIB) {
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

int ascm_device_route(const ascm_device *d, uint64_t size, uint32_t policy, int mode,
                      ascm_route *r) {
    return route(d, size, policy, mode, r);
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

static int device_try(ascm_device *d, uint64_t size, uint32_t policy, int mode, uint64_t *addr,
                      int *kind, int *events) {
    *events = 0;
    ascm_route r;
    if (ASCM_LIKELY(mode == ASCM_SIZE_MALLOC && policy == HUGE_FIRST) && size - 1 < (1ull << 62)) {
        /* aclrtMalloc's default policy, nearly every request: route()'s
         * default case without the general one (Python Device pair at 64 B
         * 1,322 -> 1,275 instructions) */
        uint64_t rounded = ((size + 31) & ~31ull) + 32;
        int k = rounded > MIB ? ASCM_KIND_HUGE : ASCM_KIND_NORMAL;
        *kind = k;
        int st = try_kind(d, k, rounded, 0, 64, addr);
        if (ASCM_LIKELY(st == ASCM_OK) || k == ASCM_KIND_NORMAL) return st;
        route(d, size, policy, mode, &r); /* the same route, for the rest of it */
        return try_rest(d, &r, st, addr, kind, events);
    }
    *kind = -1;
    int st = route(d, size, policy, mode, &r);
    if (st != ASCM_OK) return st;
    *kind = r.kinds[0];
    st = try_kind(d, r.kinds[0], r.rounded, r.pad, r.align, addr);
    if (st != ASCM_OK) st = try_rest(d, &r, st, addr, kind, events);
    if (st == ASCM_OK && *kind == ASCM_KIND_DVPP && media_over_90(d)) *events |= ASCM_EVENT_MEDIA_90;
    return st;
}

int ascm_device_try_malloc_held(ascm_device *d, uint64_t size, uint32_t policy, int mode,
                                uint64_t *addr, int *kind, int *events) {
    if (ASCM_UNLIKELY(atomic_load_explicit(&d->closed, memory_order_relaxed))) {
        *events = 0;
        *kind = -1;
        return ASCM_ERR_CLOSED;
    }
    return device_try(d, size, policy, mode, addr, kind, events);
}

int ascm_device_try_malloc(ascm_device *d, uint64_t size, uint32_t policy, int mode, uint64_t *addr,
                           int *kind, int *events) {
    if (ASCM_UNLIKELY(!gate_enter(d))) {
        *events = 0;
        *kind = -1;
        return ASCM_ERR_CLOSED;
    }
    int st = device_try(d, size, policy, mode, addr, kind, events);
    gate_leave(d);
    return st;
}

void ascm_device_count_failure(ascm_device *d, int kind) {
    if (kind >= 0 && kind < ASCM_KINDS) atomic_fetch_add_explicit(&d->failed[kind], 1, memory_order_relaxed);
}

int ascm_device_malloc(ascm_device *d, uint64_t size, uint32_t policy, int mode, uint64_t *addr,
                       int *kind, int *events) {
    int st = ascm_device_try_malloc(d, size, policy, mode, addr, kind, events);
    if (ASCM_UNLIKELY(st == ASCM_ERR_NOMEM || st == ASCM_ERR_BUDGET)) ascm_device_count_failure(d, *kind);
    return st;
}

/* The chunk's pool that holds addr among the kinds in kind_mask, or NULL. */
static ascm_pool *chunk_at(const ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind) {
    for (unsigned m = kind_mask & ((1u << ASCM_KINDS) - 1); m; m &= m - 1) {
        int k = (int)__builtin_ctz(m);
        const chunk_table *t = table_of(d, k);
        if (!t) continue;
        for (const chunk *c = t->c, *end = t->c + t->n; c < end; c++)
            if (addr - c->base < c->size) { /* below base wraps past size */
                if (kind) *kind = k;
                return c->pool;
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

static inline int device_free(ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind) {
    ascm_pool *p = chunk_at(d, addr, kind_mask, kind); /* the kinds the caller expects first */
    if (p) return ascm_pool_free(p, addr);
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

int ascm_device_free(ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind) {
    if (ASCM_UNLIKELY(!gate_enter(d))) {
        *kind = -1;
        return ASCM_ERR_CLOSED;
    }
    int st;
    if (ASCM_UNLIKELY(atomic_load_explicit(&d->nguards, memory_order_acquire) != 0) &&
        guarded(d, addr)) {
        *kind = ascm_device_kind_of(d, addr);
        st = ASCM_ERR_BADFREE;
    } else {
        st = device_free(d, addr, kind_mask, kind);
    }
    gate_leave(d);
    return st;
}

static __attribute__((noinline)) int free_unguarding(ascm_device *d, uint64_t addr,
                                                     unsigned kind_mask, int *kind) {
    int st = device_free(d, addr, kind_mask, kind);
    if (st == ASCM_OK) ascm_device_unguard(d, addr);
    return st;
}

int ascm_device_free_held(ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind) {
    if (ASCM_UNLIKELY(atomic_load_explicit(&d->closed, memory_order_relaxed))) {
        *kind = -1;
        return ASCM_ERR_CLOSED;
    }
    /* the caller that guards blocks frees them here: the guard goes too */
    if (ASCM_UNLIKELY(atomic_load_explicit(&d->nguards, memory_order_relaxed) != 0))
        return free_unguarding(d, addr, kind_mask, kind);
    return device_free(d, addr, kind_mask, kind);
}

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
    int st = fresh && grave ? new_pool(d, kind, base, size, &pool) : ASCM_ERR_HOSTMEM;
    if (st == ASCM_OK) {
        ascm_lock_acquire(&d->chunks_lock);
        chunk_table *t = table_of(d, kind);
        st = !t ? ASCM_ERR_UNSUPPORTED : t->n == ASCM_MAX_CHUNKS ? ASCM_ERR_NOMEM : ASCM_OK;
        for (uint32_t i = 0; st == ASCM_OK && i < t->n; i++) /* ranges must not overlap */
            if (base < t->c[i].base + t->c[i].size && t->c[i].base < base + size) st = ASCM_ERR_INVAL;
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

/* The budget's lock, for the device's own reads and changes of the budget:
 * a pool's kept block whose pages are still charged gives them first
 * (pool.c, "Deferred discharge"), so the budget reads as if at its free. */
static void budget_lock(ascm_device *d) {
    ascm_lock_acquire(&d->lock);
    ascm_lock_settle(&d->lock);
}

void ascm_device_budget(ascm_device *d, ascm_budget *out) {
    budget_lock(d);
    *out = d->b;
    ascm_lock_release(&d->lock);
}

/* Read in one moment under the device lock, which every charged pool takes
 * as its own: no page can change between the two figures.  (Summing the
 * pools' statistics and then reading the budget saw another thread's
 * allocation in between, and Device.check() reported a mismatch that was
 * not there.) */
void ascm_device_huge_pages(ascm_device *d, uint64_t *charged, uint64_t *held) {
    uint64_t bytes = 0;
    budget_lock(d);
    for (int k = 0; k < ASCM_KINDS; k++) {
        chunk_table *t = ascm_kind(k)->huge ? table_of(d, k) : NULL;
        for (uint32_t i = 0; t && i < t->n; i++) {
            const ascm_pool *p = t->c[i].pool; /* a paged pool's kept granules are charged too */
            bytes += (p->pages_in_use + (p->paging ? p->paging->kept_count : 0)) << p->pshift;
        }
    }
    *charged = d->b.huge_used;
    ascm_lock_release(&d->lock);
    *held = bytes;
}

int ascm_device_charge_fixed(ascm_device *d, int64_t delta) {
    budget_lock(d);
    uint64_t old = d->b.fixed;
    d->b.fixed += (uint64_t)delta;
    int ok = delta <= 0 || fits(&d->b, d->b.huge_used, d->b.normal_used);
    if (!ok) d->b.fixed = old;
    ascm_lock_release(&d->lock);
    return ok ? ASCM_OK : ASCM_ERR_NOMEM;
}

int ascm_device_set_limit(ascm_device *d, uint64_t limit) {
    budget_lock(d);
    d->b.limit = limit;
    ascm_lock_release(&d->lock);
    return ASCM_OK;
}

void ascm_device_reset_peaks(ascm_device *d) {
    for (int k = 0; k < ASCM_KINDS; k++) {
        chunk_table *t = table_of(d, k);
        for (uint32_t i = 0; t && i < t->n; i++) ascm_pool_reset_peaks(t->c[i].pool);
        d->retired_totals[k].peak_used = d->retired_totals[k].peak_requested = 0;
    }
    budget_lock(d);
    d->b.peak_huge = d->b.huge_used;
    d->b.peak_normal = d->b.normal_used;
    ascm_lock_release(&d->lock);
}
