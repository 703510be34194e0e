/* What the device's files share (device.c, device_chunks.c,
 * device_budget.c): the device itself and its chunk tables.
 *
 * Chunks: a kind's memory is one or more chunks, each a pool over a range
 * taken from an upstream (the OS, the Ascend runtime).  A kind with a grow
 * hook takes another chunk when its chunks are full, and gives empty chunks
 * back on request.  The chunk list of a kind is an immutable table swapped
 * in with one atomic store, so the allocation and free paths read it with no
 * lock while another thread grows or shrinks the kind; replaced tables and
 * retired pools are kept until reset or destroy, since a reader may still
 * hold them (a retired pool is closed: it refuses allocations).
 */
#ifndef ASCMEM_DEVICE_INTERNAL_H
#define ASCMEM_DEVICE_INTERNAL_H

#include "internal.h"
#include "stripes.h"

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

/* A thread's place in a device's gate (device_gate.c): its count of calls
 * inside, written by that thread alone, on a line of its own. */
#define ASCM_GATE_SEATS 64
typedef struct ascm_gate_seat {
    _Alignas(64) _Atomic uint64_t depth;
    _Atomic int taken; /* claimed by a thread, for good */
} ascm_gate_seat;

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
    int host_is_device; /* RC mode: aclrtMallocHost is device memory (route, new_pool: device.c) */
    uint64_t release_threshold, release_threshold_max;
    int caches_mode;      /* ASCM_CACHES_* of every pool, under chunks_lock (device_chunks.c) */
    int placement;        /* ASCM_PLACE_* of its pools, under chunks_lock (device_chunks.c) */
    uint64_t slab_max;    /* ascm_pool_set_slab_max of its pools, the same way */
    ascm_lock chunks_lock; /* serialises table changes; never held while allocating */
    retired *graveyard;
    /* blocks the Python layer tracks, which the GIL-free free refuses
     * (ascm_device_guard); under chunks_lock, with their count beside for
     * the free's lock-free test */
    ascm_addrset guards;
    _Atomic uint64_t nguards;
    /* blocks handed out to callers outside the Python layer, marked one by
     * one (ascm_device_hand_out_block) and unmarked by their free, whichever
     * path frees them; under chunks_lock, the count beside as for guards */
    ascm_addrset handed;
    _Atomic uint64_t nhanded;
    kind_totals retired_totals[ASCM_KINDS];
    /* requests the whole kind failed (a miss in one chunk that another
     * chunk serves is no failure, so the pools' own counts do not add up) */
    _Atomic uint64_t failed[ASCM_KINDS];
    ascm_grow_fn grow;
    void *grow_ctx;
    ascm_release_fn release;
    void *release_ctx;
    /* the gate (device_gate.c): callers inside, counted in a seat per thread,
     * or by stripe of threads (stripes.h) */
    ascm_gate_seat seats[ASCM_GATE_SEATS];
    ascm_stripe inflight[ASCM_STRIPES];
    uint64_t uid; /* never reused: tells a thread's seat at a freed device apart */
    _Alignas(64) _Atomic uint32_t shut; /* quiesce() calls not yet reopened; closed devices stay shut */
    ascm_fork_node fork_chunks, fork_budget;
    /* the budget's lock, which the charged pools take as theirs: written on
     * every call, so a line of its own, away from the tables read without it */
    _Alignas(64) ascm_lock lock;
    _Atomic int free_kind; /* where the last free found its block (device.c, device_free) */
    ascm_budget b;
};

/* The gate (device_gate.c; its way in and out, device_gate.h, in line in
 * device.c). */
void ascm_gate_init(ascm_device *d);
void ascm_gate_in_child(ascm_fork_node *n);

/* The pool's page: the kind's, or the unit when that is larger. */
static inline uint64_t page_of(const ascm_device *d, int kind) {
    uint64_t page = ascm_kind(kind)->page_size;
    return page > d->min_block ? page : d->min_block;
}

/* The thread-cache mode a pool of kind k gets (ascm_device_set_thread_caches):
 * the device's, but for the media window, whose allocations read the kind's
 * bytes in use for the 90% event (device.c, media_over_90) -- a read that
 * flushes every cache of the pool, on every allocation. */
static inline int caches_mode_for(const ascm_device *d, int k) {
    return k == ASCM_KIND_DVPP ? ASCM_CACHES_OFF : d->caches_mode;
}

/* A new pool of kind k takes the device's thread-cache mode. */
static inline int give_caches_mode(const ascm_device *d, int k, ascm_pool *p) {
    int mode = caches_mode_for(d, k);
    return mode == ASCM_CACHES_OFF ? ASCM_OK : ascm_pool_set_thread_caches(p, mode);
}

/* A pool takes the device's placement (ascm_device_set_placement) and
 * slab_max (ascm_device_set_slab_max).  A pool of the other kind (a
 * contiguous pool of a paged device; any pool while the device's placement
 * is still GRANULES, 0, every new pool's own default) refuses the placement
 * with ASCM_ERR_INVAL and keeps its own. */
static inline void give_placement(const ascm_device *d, ascm_pool *p) {
    (void)ascm_pool_set_placement(p, d->placement);
    (void)ascm_pool_set_slab_max(p, d->slab_max);
}

static inline chunk_table *table_of(const ascm_device *d, int kind) {
    return atomic_load_explicit((_Atomic(chunk_table *) *)&d->table[kind], memory_order_acquire);
}


/* A pool over [base, base + size) for kind k: charged to the budget for
 * device memory, paged on a paged device (device.c). */
int ascm_device_new_pool(ascm_device *d, int k, uint64_t base, uint64_t size, ascm_pool **out);
/* The charge hook of the device's pools (device_budget.c). */
int ascm_device_charge(void *ctx, int64_t delta);

#endif /* ASCMEM_DEVICE_INTERNAL_H */
