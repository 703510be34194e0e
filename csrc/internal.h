/* Internals shared by the C core's files; not installed, not part of the API:
 * the building blocks (bits, lock, fork safety, bitmap, address set and map,
 * best fit, slab types, paging) and the pool functions the device layer
 * calls.  The pool's struct is the pool layer's alone (pool_core.h). */
#ifndef ASCMEM_INTERNAL_H
#define ASCMEM_INTERNAL_H

#include "ascmem.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#define ASCM_PREFETCH(p) __builtin_prefetch(p)
/* A function that only prefetches looks pure to GCC: unless it is inlined
 * before that analysis, the call, and the prefetch, are deleted. */
#define ASCM_PREFETCHER static inline __attribute__((always_inline))
/* A function called with a constant argument that selects a variant, so
 * that each call site compiles to that variant alone (fit.c's regions). */
#define ASCM_SPECIALISED static inline __attribute__((always_inline))
/* The pool's alloc and free entry points, and the device's held ones:
 * external functions that LTO puts in line in their callers (the device,
 * the Cython module, the C benchmarks), where GCC's own size limit stops
 * inlining them once the slab path is in line in them (device.c,
 * device_try, for the device's). */
#define ASCM_ENTRY __attribute__((always_inline)) inline
#define ASCM_LIKELY(x) __builtin_expect(!!(x), 1)
#define ASCM_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define ASCM_PREFETCH(p) ((void)(p))
#define ASCM_PREFETCHER static inline
#define ASCM_SPECIALISED static inline
#define ASCM_ENTRY
#define ASCM_LIKELY(x) (x)
#define ASCM_UNLIKELY(x) (x)
#endif

/* ---- bits --------------------------------------------------------------- */

static inline unsigned ascm_ctz64(uint64_t x) { return (unsigned)__builtin_ctzll(x); }     /* x != 0 */
static inline unsigned ascm_log2_floor(uint64_t x) { return 63u - (unsigned)__builtin_clzll(x); } /* x != 0 */
static inline unsigned ascm_log2_ceil(uint64_t x) { return x <= 1 ? 0 : ascm_log2_floor(x - 1) + 1; }
static inline int ascm_is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

/* The placements (ASCM_PLACE_*, ascmem.h) of each kind of pool. */
static inline int ascm_placement_paged(int placement) {
    return placement == ASCM_PLACE_GRANULES || placement == ASCM_PLACE_PACKED || placement == ASCM_PLACE_BEST_FIT;
}
static inline int ascm_placement_contiguous(int placement) {
    return placement == ASCM_PLACE_KEPT_IN_PLACE || placement == ASCM_PLACE_KEPT_TO_BEST_FIT ||
           placement == ASCM_PLACE_LOWEST_EQUAL || placement == ASCM_PLACE_BEST_FIT_END_LAST;
}

/* Zeroed memory aligned to a cache line, for structures that threads share
 * (the pool, a thread cache): a line of one must not hold another's fields.
 * Freed with free(). */
static inline void *ascm_zalloc_lines(size_t bytes) {
    bytes = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

/* Zeroed arrays sized by the range (one entry per unit or page): mapped
 * lazily, so untouched parts cost nothing, and on transparent huge pages
 * where the OS has them, since lookups land all over them. */
void *ascm_zalloc_big(size_t bytes);
void ascm_free_big(void *p, size_t bytes);

/* Formats a message for check(); always returns ASCM_ERR_CORRUPT. */
int ascm_fail(char *msg, size_t msglen, const char *fmt, ...);

/* ---- lock: a spinlock, since every critical section is tens of ns -------- */

struct ascm_pool;
/* The bytes of the pages a pool holds: pages under a live byte and, for a
 * paged pool, the kept granules.  The caller holds the pool's lock (the
 * device's, for a charged pool): the device layer reads its budget this way. */
uint64_t ascm_pool_held_bytes_locked(const struct ascm_pool *p);
typedef struct {
    atomic_int held;
    atomic_int waiters; /* threads in ascm_lock_slow: a long holder hands over to them */
    /* A pool locked by this lock whose kept last freed block still has its
     * pages taken and charged (pool.c, "Deferred discharge"); at most one.
     * Read and written only with the lock held. */
    struct ascm_pool *deferred;
} ascm_lock;

void ascm_lock_slow(ascm_lock *l);
/* For a holder part-way through a long call (a batch): lets a waiting thread
 * take the lock, then takes it again.  Releasing and taking it again at once
 * lets no one in: a waiter polls between pauses, and the holder is always
 * first, so a single allocation would wait for whole batches.  Waits a bounded time for the hand-over. */
void ascm_lock_hand_over(ascm_lock *l);
static inline int ascm_lock_waited_for(ascm_lock *l) {
    return atomic_load_explicit(&l->waiters, memory_order_relaxed) != 0;
}
static inline void ascm_lock_acquire(ascm_lock *l) {
    if (ASCM_UNLIKELY(atomic_exchange_explicit(&l->held, 1, memory_order_acquire)))
        ascm_lock_slow(l);
}
static inline void ascm_lock_release(ascm_lock *l) {
    atomic_store_explicit(&l->held, 0, memory_order_release);
}
/* Gives the pages of the kept block whose discharge a lock holds deferred
 * (pool.c); the lock is held.  Every call that takes a lock of pools, but a
 * single allocation or free, settles first, so that nothing but the
 * allocation that may take the block back reads its pages still taken. */
void ascm_pool_settle(ascm_lock *domain);
static inline void ascm_lock_settle(ascm_lock *l) {
    if (ASCM_UNLIKELY(l->deferred != NULL)) ascm_pool_settle(l);
}
/* A pool whose calls take `lock` (which its owner registers for fork) instead
 * of a lock of its own: a device's pools share the device's budget lock, so
 * that the charge hook, called with the pool lock held, needs no second
 * lock (device_budget.c). */
int ascm_pool_create_shared(const ascm_pool_config *cfg, ascm_lock *lock, ascm_pool **out);

/* ---- fork safety (forksafe.c): shared locks are taken around fork() ------ */

enum { ASCM_FORK_CHUNKS = 0, ASCM_FORK_CACHES = 1, ASCM_FORK_POOL = 2, ASCM_FORK_BUDGET = 3,
       ASCM_FORK_RANKS = 4 };

typedef struct ascm_fork_node {
    struct ascm_fork_node *prev, *next;
    ascm_lock *lock;
    void (*in_child)(struct ascm_fork_node *); /* optional: fix-ups in the child */
} ascm_fork_node;

/* A memory barrier on every thread of the process (barrier.c): init says
 * whether the system has one (call it once); the barrier returns 0 if not. */
int ascm_heavy_barrier_init(void);
int ascm_heavy_barrier(void);
int ascm_heavy_barrier_ready(void); /* init once per process; 0 also with ASCMEM_NO_BARRIER=1 */
/* What ascm_heavy_barrier_ready said, for the fast paths: read it only
 * after a call of that (a thread cache's or a device's creation makes one). */
extern _Atomic int ascm_barrier_on;

/* Call with no core lock held (the registry's mutex is taken first). */
void ascm_fork_register(ascm_fork_node *n, ascm_lock *lock, int rank,
                        void (*in_child)(ascm_fork_node *));
void ascm_fork_unregister(ascm_fork_node *n); /* no-op if never registered */

/* ---- hierarchical bitmap: set/clear/test O(levels), first set bit O(levels) */

#define ASCM_HBM_LEVELS 7 /* 64^7 bits: far beyond any range */

typedef struct ascm_hbm {
    uint64_t nbits;
    int levels;
    uint64_t *words[ASCM_HBM_LEVELS]; /* [0] holds the bits, [l+1] marks non-zero words of [l] */
    uint64_t nwords[ASCM_HBM_LEVELS];
} ascm_hbm;

int ascm_hbm_init(ascm_hbm *h, uint64_t nbits);
void ascm_hbm_destroy(ascm_hbm *h);
void ascm_hbm_clear_all(ascm_hbm *h);
uint64_t ascm_hbm_bytes(const ascm_hbm *h);
int ascm_hbm_check(const ascm_hbm *h, char *msg, size_t msglen);
/* Runs of bits [lo, hi), a word at a time. */
void ascm_hbm_set_range(ascm_hbm *h, uint64_t lo, uint64_t hi);
void ascm_hbm_clear_range(ascm_hbm *h, uint64_t lo, uint64_t hi);
uint64_t ascm_hbm_count_range(const ascm_hbm *h, uint64_t lo, uint64_t hi);

static inline int ascm_hbm_test(const ascm_hbm *h, uint64_t i) {
    return (int)((h->words[0][i >> 6] >> (i & 63)) & 1u);
}
static inline void ascm_hbm_set(ascm_hbm *h, uint64_t i) {
    for (int l = 0; l < h->levels; l++) {
        uint64_t *w = &h->words[l][i >> 6];
        int was_empty = (*w == 0);
        *w |= 1ull << (i & 63);
        if (!was_empty) return;
        i >>= 6;
    }
}
static inline void ascm_hbm_clear(ascm_hbm *h, uint64_t i) {
    for (int l = 0; l < h->levels; l++) {
        uint64_t *w = &h->words[l][i >> 6];
        *w &= ~(1ull << (i & 63));
        if (*w != 0) return;
        i >>= 6;
    }
}
static inline int ascm_hbm_any(const ascm_hbm *h) { return h->words[h->levels - 1][0] != 0; }
/* Lowest set bit; the bitmap must not be empty. */
static inline uint64_t ascm_hbm_first(const ascm_hbm *h) {
    uint64_t i = 0;
    for (int l = h->levels - 1; l >= 0; l--) i = (i << 6) | ascm_ctz64(h->words[l][i]);
    return i;
}

/* ---- address set: 64-bit addresses (addrset.c), a device's guarded blocks */
typedef struct ascm_addrset {
    uint64_t *keys; /* address + 1; 0 = empty slot */
    uint64_t mask, count;
} ascm_addrset;

int ascm_set_add(ascm_addrset *s, uint64_t addr); /* ASCM_ERR_HOSTMEM if it cannot grow */
int ascm_set_has(const ascm_addrset *s, uint64_t addr);
void ascm_set_remove(ascm_addrset *s, uint64_t addr);
void ascm_set_clear(ascm_addrset *s);             /* empty, its memory freed */

/* ---- address map: 32-bit key -> non-zero 32-bit value (addrmap.c) -------
 * The pool's blocks and slabs and the buddy's live blocks. */

typedef struct ascm_map_entry {
    uint32_t key;   /* key + 1; 0 = empty slot */
    uint32_t value;
} ascm_map_entry;

typedef struct ascm_addrmap {
    ascm_map_entry *slots;
    uint32_t mask, count;
} ascm_addrmap;

int ascm_map_init(ascm_addrmap *m);
void ascm_map_destroy(ascm_addrmap *m);
void ascm_map_clear(ascm_addrmap *m);
int ascm_map_grow(ascm_addrmap *m, uint32_t more);
/* Makes room for `more` puts, so that they cannot fail. */
static inline int ascm_map_reserve(ascm_addrmap *m, uint32_t more) {
    if (((uint64_t)m->count + more) * 2 <= (uint64_t)m->mask + 1) return ASCM_OK;
    return ascm_map_grow(m, more);
}
void ascm_map_put(ascm_addrmap *m, uint32_t key, uint32_t value); /* key absent, room reserved */
uint32_t ascm_map_take(ascm_addrmap *m, uint32_t key);            /* removes; 0 if absent */
uint64_t ascm_map_bytes(const ascm_addrmap *m);

/* Slot where the probe run of a stored key (key + 1) starts. */
static inline uint32_t ascm_map_home(const ascm_addrmap *m, uint32_t stored) {
    return (uint32_t)(((uint64_t)stored * 0x9E3779B97F4A7C15ull) >> 32) & m->mask;
}

/* Batches look keys up ahead of use: each lookup in a table larger than the
 * cache is a miss, and they are independent. */
ASCM_PREFETCHER void ascm_map_prefetch(const ascm_addrmap *m, uint32_t key) {
    ASCM_PREFETCH(&m->slots[ascm_map_home(m, key + 1)]);
}

static inline uint32_t ascm_map_get(const ascm_addrmap *m, uint32_t key) { /* 0 if absent */
    uint32_t k = key + 1;
    for (uint32_t i = ascm_map_home(m, k);; i = (i + 1) & m->mask) {
        if (m->slots[i].key == k) return m->slots[i].value;
        if (!m->slots[i].key) return 0;
    }
}

/* ---- best-fit allocator over units (the pool's large-block path) -------- */

#define ASCM_NODE_NONE 0u
#ifndef ASCM_FIT_SUB_BITS
#define ASCM_FIT_SUB_BITS 6 /* 2^SUB bins per power of two: sizes within 1.6% share a bin */
#endif
#define ASCM_FIT_BINS ((32 - ASCM_FIT_SUB_BITS + 1) << ASCM_FIT_SUB_BITS)
#ifndef ASCM_FIT_SCAN
#define ASCM_FIT_SCAN 16 /* nodes looked at in the request's bin before settling for the best seen (fit.c) */
#endif

/* 32 bytes, so that the nodes of ten thousand blocks stay in cache. */
typedef struct ascm_fit_node {
    uint32_t off, len;             /* in units; len 0 = recycled */
    uint32_t prev_phys, next_phys; /* address-order neighbours */
    uint32_t prev_free, next_free; /* bin list; next_free links recycled nodes too */
    uint32_t slack;                /* used block: usable - requested bytes; slab storage: 0 */
    uint16_t bin;
    uint8_t is_free;
    uint8_t is_slab : 1;
    uint8_t by_handle : 1; /* used block known by its handle, not in the address map */
} ascm_fit_node;

/* Free blocks by size: the bins of one region. */
typedef struct ascm_fit_bins {
    uint32_t head[ASCM_FIT_BINS];
    uint64_t bits[(ASCM_FIT_BINS + 63) / 64];
    uint64_t words; /* bit w: bits[w] != 0 */
} ascm_fit_bins;

/* Regions (paged pools, see fit.c): the range is cut into nregions parts
 * of 2^region_shift units, the last taking the rest, each with bins of its
 * own; a free node's bin field holds its bin in the low bits and its region
 * above them. */
#define ASCM_FIT_BIN_BITS 11 /* ASCM_FIT_BINS <= 2^11 */
#define ASCM_FIT_MAX_REGIONS 32u /* 16-bit bin field: 5 bits of region */

typedef struct ascm_fit {
    uint64_t nunits;               /* < 2^32 */
    uint64_t free_units;
    ascm_fit_node *nodes; /* nodes[0] is the null node */
    uint32_t ncap, nused, recycled;
    uint32_t nregions;
    uint32_t region_mask;  /* units per region but the last - 1 (one region: 2^32 - 1) */
    unsigned region_shift; /* log2 of units per region (one region: 32) */
    ascm_fit_bins one;     /* the bins of region 0, the only one of most pools */
    ascm_fit_bins *extra;  /* regions 1 .. nregions - 1 */
} ascm_fit;

/* nregions 1: plain best fit over the range; more: see fit.c. */
int ascm_fit_init(ascm_fit *f, uint64_t nunits, uint32_t nregions);
void ascm_fit_destroy(ascm_fit *f);
void ascm_fit_reset(ascm_fit *f);
/* Takes n units starting at a multiple of align_units, from the low end of
 * the best-fitting free block (with high, from its high end if the block is
 * a large free region: see fit.c); returns the node. */
int ascm_fit_take(ascm_fit *f, uint64_t n, uint64_t align_units, int high, uint32_t *node);
/* Contiguous: as ascm_fit_take (low end), but when best fit is the free
 * block that reaches the end of the range, at least end_factor times the
 * request, and spare_end(ctx, n) says so, the best fit among the other free
 * blocks is taken if one holds it (fit.c, "sparing the end"). */
int ascm_fit_take_sparing_end(ascm_fit *f, uint64_t n, uint64_t align_units, uint64_t end_factor,
                              int (*spare_end)(const void *ctx, uint64_t n), const void *ctx,
                              uint32_t *node);
/* With regions (nregions > 1): as ascm_fit_take, from the given region's
 * free blocks first, placed within its free block by the granule rules
 * (granule: the paged pool's granule in units, a power of two; 0: none;
 * fit.c). */
int ascm_fit_take_in(ascm_fit *f, uint64_t n, uint64_t align_units, uint32_t region, uint64_t granule,
                     uint32_t *node);
/* With regions: plain best fit in the first region, the regions after it
 * acting as its continuation (a paged pool's best-fit placement; fit.c). */
int ascm_fit_take_across(ascm_fit *f, uint64_t n, uint64_t align_units, uint32_t *node);
/* Paged pools (fit.c, "mapped granules first"): a free block of region
 * with a place at one of its ends (*start) where n units (under a granule
 * of g units) touch only granules `mapped` says are mapped, or 0; nothing is
 * taken.  ascm_fit_take_mapped takes that place, or is ASCM_ERR_NOMEM. */
uint32_t ascm_fit_find_mapped(ascm_fit *f, uint64_t n, uint32_t region, uint64_t g,
                              int (*mapped)(const void *ctx, uint64_t granule), const void *ctx,
                              uint64_t *start);
int ascm_fit_take_mapped(ascm_fit *f, uint64_t n, uint32_t region, uint64_t g,
                         int (*mapped)(const void *ctx, uint64_t granule), const void *ctx,
                         uint32_t *node);
void ascm_fit_give(ascm_fit *f, uint32_t node);
uint64_t ascm_fit_largest(const ascm_fit *f);
uint32_t ascm_fit_first(const ascm_fit *f); /* the node at unit 0: the address chain's head */
/* Contiguous (one region): whether a free block of exactly n units starts
 * below unit off, among the first ASCM_FIT_SCAN of n's bin (the nodes best
 * fit itself would look at). */
int ascm_fit_has_equal_below(const ascm_fit *f, uint64_t n, uint32_t off);
int ascm_fit_check(const ascm_fit *f, char *msg, size_t msglen);

/* ---- slabs: size classes for small requests ---------------------------- */

#define ASCM_SLAB_CLASSES 36
#define ASCM_SLAB_MAX_SLOTS 2048u

/* While thread caches are on, a released slab's descriptor is not freed: it
 * waits, idle, for the next slab of its class, because a thread cache may be
 * reading it without the pool lock (tcache.c).  Idle ones are freed when no
 * cache can be (ascm_slab_free_idle). */
typedef struct ascm_slab {
    /* read by thread caches without the lock: a line of its own */
    uint64_t off;        /* byte offset in the pool; __atomic (changes when an idle one is reused) */
    uint32_t cls;        /* for the descriptor's life */
    uint32_t count;
    uint32_t index;      /* in p->slabs, for the descriptor's life */
    uint16_t *slack;     /* per slot, on lines of their own: class size - requested,
                            and ASCM_SLOT_LIVE while a caller holds it (pool_core.h;
                            taken but not live = in a thread cache); __atomic */
    void *mem;           /* what malloc returned: the descriptor is aligned within it */
    /* changed under the pool lock */
    _Alignas(64) uint32_t node; /* fit node that holds it */
    uint32_t nfree;
    uint32_t prev, next; /* the class's list of slabs with free slots; idle ones chain on next */
    uint32_t hint;       /* first word that may have a free slot */
    uint32_t nwords;
    uint8_t idle;        /* released: no storage, in no table */
    uint64_t bits[];     /* 1 = slot taken; bits past count stay 1 */
} ascm_slab;

typedef struct ascm_slab_class {
    uint32_t size;
    uint32_t count;       /* slots per slab */
    uint64_t slab_bytes;
    uint64_t div_magic;   /* slot = (offset * div_magic) >> 48 */
    uint32_t partial;     /* head of the list of slabs with a free slot */
    uint32_t empty;       /* empty slabs kept as spares */
    uint32_t idle;        /* head of the chain of idle descriptors */
    uint32_t nidle;       /* how many are on it */
} ascm_slab_class;

/* Slab granule -> descriptor, in leaves of 2^ASCM_SLAB_LEAF_BITS entries
 * made on first use and kept to the pool's end: a thread cache reads it with
 * no lock while the pool writes other entries (all accesses __atomic). */
#define ASCM_SLAB_LEAF_BITS 8
typedef struct ascm_slab_table {
    ascm_slab ***leaves;
    uint64_t nleaves;
} ascm_slab_table;

static inline ascm_slab *ascm_slab_table_get(const ascm_slab_table *t, uint64_t g) {
    uint64_t i = g >> ASCM_SLAB_LEAF_BITS;
    if (ASCM_UNLIKELY(i >= t->nleaves)) return NULL;
    ascm_slab **leaf = __atomic_load_n(&t->leaves[i], __ATOMIC_ACQUIRE);
    return leaf ? __atomic_load_n(&leaf[g & ((1u << ASCM_SLAB_LEAF_BITS) - 1)], __ATOMIC_ACQUIRE) : NULL;
}

extern const uint32_t ascm_slab_sizes[ASCM_SLAB_CLASSES];

/* Class for a request, or -1 when slabs do not serve it. */
static inline int ascm_slab_class_of(uint64_t size, uint64_t align) {
    if (size > ASCM_SLAB_MAX || align > 4096) return -1;
    if (size < align) size = align;
    int c;
    if (size <= 256) {
        c = (int)((size + 31) >> 5) - 1;
    } else {
        unsigned p = ascm_log2_floor(size - 1);
        c = 8 + (int)(p - 8) * 4 + (int)(((size - 1) >> (p - 2)) & 3);
    }
    while (c < ASCM_SLAB_CLASSES && (ascm_slab_sizes[c] & (align - 1))) c++;
    return c < ASCM_SLAB_CLASSES ? c : -1;
}

/* ---- paging (paging.c): which granules of a paged pool are mapped ------- */

#define ASCM_KEPT_RUNS 64
typedef struct ascm_paging {
    uint64_t base;
    unsigned pshift;
    uint64_t threshold_pages; /* free granules kept mapped, at most, now */
    /* the adaptive threshold (paging.c, "how much is kept"): it moves
     * between floor and cap; cap == floor keeps it fixed */
    uint64_t floor_pages, cap_pages;
    uint64_t given_back; /* unmapped to honour the threshold, not mapped again since */
    uint64_t taken;      /* granules taken into use since the period began */
    uint64_t kept_low;   /* the fewest kept granules seen in the period */
    uint64_t raised;     /* granules the threshold rose by in the period */
    unsigned period_shift; /* a period takes threshold << period_shift into use */
    unsigned suspect;    /* periods since one lowered the threshold, counted down */
    ascm_map_fn map;
    void *map_ctx;
    ascm_hbm kept;            /* granules mapped with no live byte, but for: */
    uint64_t pend_lo, pend_hi; /* the run the last release kept, not in `kept` yet */
    uint64_t kept_count, peak_mapped; /* in granules */
    uint64_t map_calls, unmap_calls, unmap_failures;
    /* the runs releases kept, oldest first (a ring; granules acquired since
     * are skipped when read): the order kept granules are unmapped in when
     * a release needs room */
    struct { uint64_t lo, hi; } kept_runs[ASCM_KEPT_RUNS];
    unsigned runs_head, runs_count;
} ascm_paging;

int ascm_paging_init(ascm_paging *g, uint64_t npages, uint64_t base, unsigned pshift,
                     uint64_t threshold, ascm_map_fn map, void *map_ctx);
void ascm_paging_destroy(ascm_paging *g);
/* The threshold adapts between the one given at init and cap bytes (at
 * least that one; the same: fixed); kept granules past a lower cap are
 * unmapped. */
void ascm_paging_set_cap(ascm_paging *g, ascm_charge_fn charge, void *ctx, uint64_t cap);
/* Granules [lo, hi) gained their first live byte (in_use: granules with a
 * live byte, these included): maps the ones not kept and charges them. */
int ascm_paging_acquire(ascm_paging *g, ascm_charge_fn charge, void *ctx, uint64_t lo, uint64_t hi,
                        uint64_t in_use);
/* Granules [lo, hi) lost their last live byte: kept up to the threshold,
 * the rest unmapped and discharged. */
void ascm_paging_release(ascm_paging *g, ascm_charge_fn charge, void *ctx, uint64_t lo, uint64_t hi);
/* The same, but unmapped at once whatever the release threshold (sleep). */
void ascm_paging_unmap(ascm_paging *g, ascm_charge_fn charge, void *ctx, uint64_t lo, uint64_t hi);
uint64_t ascm_paging_trim(ascm_paging *g, ascm_charge_fn charge, void *ctx);
void ascm_paging_reset(ascm_paging *g, ascm_charge_fn charge, void *ctx, uint64_t in_use);
int ascm_paging_check(const ascm_paging *g, const uint8_t *page_used, char *msg, size_t msglen);
/* Granule `page` is kept: mapped, with no live byte (the pending run or the bitmap). */
static inline int ascm_paging_kept(const ascm_paging *g, uint64_t page) {
    return page - g->pend_lo < g->pend_hi - g->pend_lo || (g->kept_count && ascm_hbm_test(&g->kept, page));
}


#endif /* ASCMEM_INTERNAL_H */
