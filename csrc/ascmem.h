/* ascmem public C API.
 *
 * Allocators here manage *address ranges*: [base, base + size) is a span of
 * numbers that may be device memory the host cannot touch, so every piece of
 * metadata lives outside the range (out-of-band) and nothing here ever reads
 * or writes an address it hands out.
 *
 * Every function returns a status code (ASCM_OK on success); none aborts on
 * bad input.  Pools are internally locked and may be shared by threads; a
 * buddy allocator on its own is not locked.
 */
#ifndef ASCMEM_H
#define ASCMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ASCM_VERSION_MAJOR 0
#define ASCM_VERSION_MINOR 1

typedef enum ascm_status {
    ASCM_OK = 0,
    ASCM_ERR_NOMEM = 1,    /* no free block large enough (or over the page budget) */
    ASCM_ERR_INVAL = 2,    /* bad argument: size 0, bad alignment, bad configuration */
    ASCM_ERR_BADFREE = 3,  /* address is not the start of a live block */
    ASCM_ERR_CORRUPT = 4,  /* an invariant does not hold (check()) */
    ASCM_ERR_HOSTMEM = 5,  /* the host could not give memory for metadata */
    ASCM_ERR_BUDGET = 6,   /* room in the range, but the page budget said no */
    /* 7 is ASCM_ERR_UNSUPPORTED, below */
    ASCM_ERR_CLOSED = 8    /* the device is closed, or a reset is in progress */
} ascm_status;

/* Counters every allocator keeps.  Sizes in bytes. */
typedef struct ascm_stats {
    uint64_t capacity;       /* bytes managed */
    uint64_t used;           /* bytes of live blocks as handed out (after rounding) */
    uint64_t requested;      /* bytes callers asked for, over live blocks */
    uint64_t peak_used;
    uint64_t peak_requested;
    uint64_t free;           /* bytes free now: free space plus cached empty slabs */
    uint64_t largest_free;   /* largest single request that would succeed now */
    uint64_t live_count;
    uint64_t alloc_count;    /* successful allocations */
    uint64_t free_count;     /* successful frees */
    uint64_t failed_count;   /* allocations refused for lack of room or budget */
    uint64_t pages_in_use;   /* pages of page_size holding any live block (pool only) */
    uint64_t page_size;
    uint64_t slab_bytes;     /* bytes held by slabs (pool only) */
    uint64_t metadata_bytes; /* host bytes of out-of-band metadata */
    /* appended in C API version 3 */
    uint64_t cached_bytes;   /* empty slabs kept as spares (in free; given back on demand) */
    uint64_t peak_live_count;
    /* appended in C API version 4: paged pools (0 for others) */
    uint64_t mapped;         /* bytes of granules mapped: those with a live byte, and kept ones */
    uint64_t peak_mapped;
    uint64_t map_calls, unmap_calls; /* calls of the map hook (counted without one too) */
    /* cumulative bytes since creation or reset: usable and requested, of
     * every allocation and every free (PyTorch's .allocated / .freed) */
    uint64_t alloc_bytes, freed_bytes, alloc_requested, freed_requested;
    /* pages holding a live block (pool only): the most at once, and how many
     * ever gained or lost their last live block (PyTorch's reserved bytes);
     * in a loop that frees a large block and takes it back with the next
     * request, the rounds after the first give no pages and are not counted
     * (pool.c, "Deferred discharge"; pools with a charge hook count them) */
    uint64_t peak_pages, pages_taken, pages_given;
} ascm_stats;

/* ---- buddy allocator ---------------------------------------------------- */

typedef struct ascm_buddy ascm_buddy;

/* size: a multiple of min_block; min_block: a power of two; base: a multiple
 * of min_block.  Alignment of a block is guaranteed up to the alignment of
 * base. */
int ascm_buddy_create(uint64_t base, uint64_t size, uint64_t min_block, ascm_buddy **out);
void ascm_buddy_destroy(ascm_buddy *b);
int ascm_buddy_alloc(ascm_buddy *b, uint64_t size, uint64_t align, uint64_t *addr);
int ascm_buddy_free(ascm_buddy *b, uint64_t addr);
int ascm_buddy_usable_size(const ascm_buddy *b, uint64_t addr, uint64_t *size);
int ascm_buddy_requested_size(const ascm_buddy *b, uint64_t addr, uint64_t *size);
void ascm_buddy_stats(const ascm_buddy *b, ascm_stats *st);
void ascm_buddy_reset(ascm_buddy *b);
/* Walks every invariant; on failure returns ASCM_ERR_CORRUPT and writes a
 * sentence naming the broken condition into msg. */
int ascm_buddy_check(const ascm_buddy *b, char *msg, size_t msglen);

/* ---- pool: slabs for small requests, best fit for large ones ------------ */

typedef struct ascm_pool ascm_pool;

/* Called when the number of pages holding live blocks changes; delta_bytes
 * is a multiple of page_size.  Returning non-zero for a positive delta makes
 * the allocation fail with ASCM_ERR_BUDGET; a negative delta must succeed.
 * A pool with a hook gives a freed block's pages at the free, always. */
typedef int (*ascm_charge_fn)(void *ctx, int64_t delta_bytes);

/* Paged pools: maps (map = 1) or unmaps (map = 0) the granules of
 * [addr, addr + size).  Called with the pool's lock held: it must not take a
 * lock that a user of the pool may hold while calling the pool, nor call
 * into Python.  Non-zero refuses: a refused map fails the allocation with
 * ASCM_ERR_NOMEM (nothing stays mapped or charged); a refused unmap is
 * counted (stats: none; check() does not see it) and the granules are
 * treated as unmapped. */
typedef int (*ascm_map_fn)(void *ctx, uint64_t addr, uint64_t size, int map);

typedef struct ascm_pool_config {
    uint64_t base;
    uint64_t size;        /* a multiple of min_block */
    uint64_t min_block;   /* power of two: granule of large blocks and slabs */
    uint64_t page_size;   /* power of two; 0 means min_block */
    ascm_charge_fn charge;  /* optional */
    void *charge_ctx;
    /* Non-zero: the caller guarantees that no two calls on this pool ever
     * overlap (one thread, or its own lock around them), and the pool takes
     * no lock of its own -- an atomic exchange less per call.  Pools made
     * from Python always lock. */
    int single_threaded;
    /* appended in C API version 4.  Non-zero: a paged pool.  Its range is
     * virtual; granules of page_size (a power of two, at least min_block)
     * are mapped through `map` (optional: without it the pool only counts)
     * when their first live byte arrives and unmapped when the last one
     * leaves, keeping up to release_threshold bytes of free granules mapped.
     * charge is then called for mapped bytes, kept granules included. */
    int paged;
    ascm_map_fn map;
    void *map_ctx;
    uint64_t release_threshold;
} ascm_pool_config;

int ascm_pool_create(const ascm_pool_config *cfg, ascm_pool **out);
void ascm_pool_destroy(ascm_pool *p);
int ascm_pool_alloc(ascm_pool *p, uint64_t size, uint64_t align, uint64_t *addr);
/* As ascm_pool_alloc, but the block is placed with pad more bytes after it
 * (at most ASCM_MAX_PAD) that are not the caller's: its requested size, the
 * one usable_size-style queries of a device report, stays size.
 * ASCM_ERR_INVAL for a size of 0, or one that wraps past 2^64 with pad. */
#define ASCM_MAX_PAD 64
int ascm_pool_alloc_padded(ascm_pool *p, uint64_t size, uint64_t pad, uint64_t align, uint64_t *addr);
int ascm_pool_free(ascm_pool *p, uint64_t addr);
int ascm_pool_usable_size(ascm_pool *p, uint64_t addr, uint64_t *size);
int ascm_pool_requested_size(ascm_pool *p, uint64_t addr, uint64_t *size);
void ascm_pool_stats(ascm_pool *p, ascm_stats *st);
uint64_t ascm_pool_used(ascm_pool *p); /* bytes in live blocks: stats' `used`, cheaply */
void ascm_pool_reset(ascm_pool *p);
/* Gives the empty slabs kept as spares back to the large-block path (and
 * their pages to the budget), and unmaps a paged pool's kept granules;
 * returns the bytes released. */
uint64_t ascm_pool_trim(ascm_pool *p);
/* Paged pools: the release threshold adapts between release_threshold (the
 * floor) and cap bytes, as glibc's mmap threshold does (paging.c, "how much
 * is kept"): granules given back past it and mapped again raise it, kept
 * granules a period of allocation did not need lower it.  A cap at or below
 * the floor fixes it at the floor (the default).  Kept granules past a lower
 * cap are unmapped.  ASCM_ERR_INVAL: not a paged pool. */
int ascm_pool_set_release_cap(ascm_pool *p, uint64_t cap);
/* Paged pools: bytes of free granules kept mapped at most now (0 for others). */
uint64_t ascm_pool_release_threshold(ascm_pool *p);
void ascm_pool_reset_peaks(ascm_pool *p);
/* The usable size a request of size bytes at align would get (0: never). */
uint64_t ascm_pool_usable_for(const ascm_pool *p, uint64_t size, uint64_t align);
/* Hands a live block over to a new request of `requested` bytes, as a free
 * and an allocation would, without the block ever being free: for reuse on
 * the same stream.  ASCM_ERR_INVAL unless the request would get exactly this
 * block's usable size and alignment, for a sleeping block (it holds no
 * granules: it is to be freed), and for what ascm_pool_alloc_padded
 * refuses (nothing changes then). */
int ascm_pool_relabel(ascm_pool *p, uint64_t addr, uint64_t requested, uint64_t pad, uint64_t align);
/* With no live block: gives the spare slabs back and closes the pool (every
 * later allocation fails with ASCM_ERR_NOMEM); returns 1.  Else returns 0. */
int ascm_pool_close_if_empty(ascm_pool *p);
/* Frees every block (as ascm_pool_reset) and closes the pool, in one step:
 * no call of another thread comes between. */
void ascm_pool_close(ascm_pool *p);
/* Paged pools: a live large block (one no slab serves: over the pool's
 * slab_max when it was placed, ascm_pool_set_slab_max -- 1 KiB at most
 * under BEST_FIT --, or aligned past the unit)
 * stops holding its granules -- they are unmapped where no other live block
 * needs them, and discharged, at once (the release threshold keeps none of
 * them) -- but stays allocated at its address; wake maps them again
 * (ASCM_ERR_BUDGET or ASCM_ERR_NOMEM if refused, nothing changed).  Freeing
 * a sleeping block is allowed.  ASCM_ERR_INVAL: not a paged pool, not a live
 * large block, or (wake) not asleep; (sleep) asleep.  *released / *mapped
 * (either may be NULL): the bytes of granules this call gave back / brought
 * back into use (0 on an error), counted under the pool's lock, so other
 * threads' allocations do not blur them. */
int ascm_pool_sleep(ascm_pool *p, uint64_t addr, uint64_t *released);
/* 1 when addr starts a live large block (one ascm_pool_sleep takes if the
 * pool is paged and it is awake), 0 for a slab slot or anything else: which
 * path a block took depends on the pool's slab_max when it was placed, not
 * on its size alone. */
int ascm_pool_is_large_block(ascm_pool *p, uint64_t addr);
/* Paged pools: the range is going away with its owner (it may be unmapped
 * already): the map hook is never called again; accounting goes on. */
void ascm_pool_detach_mapping(ascm_pool *p);
int ascm_pool_wake(ascm_pool *p, uint64_t addr, uint64_t *mapped);
int ascm_pool_check(ascm_pool *p, char *msg, size_t msglen);
/* Thread caches (tcache.c): a cache of slab slots per thread in front of
 * the pool lock.  OFF (a new pool's mode; Python's Pool and Device ask for
 * AUTO unless paged): none.  ON: from now on.  AUTO: from the first time two
 * threads meet at the lock.  Statistics, check() and walks
 * flush every cache first, so they stay exact; an allocation that finds no
 * room flushes them and tries again.  They pay where threads free the small
 * blocks they allocate; blocks freed by another thread would cost more than
 * through the lock, so a thread that mostly allocates or mostly frees passes
 * its cache by.  ASCM_ERR_INVAL for another mode, or for ON or AUTO on a
 * single-threaded pool. */
enum { ASCM_CACHES_OFF = 0, ASCM_CACHES_ON = 1, ASCM_CACHES_AUTO = 2 };
int ascm_pool_set_thread_caches(ascm_pool *p, int mode);
/* Whether the pool's thread caches are on at this moment: ON, or AUTO once
 * two threads have met at its lock. */
int ascm_pool_thread_caches_on(const ascm_pool *p);
/* Where a paged pool places blocks of a granule or more.  GRANULES (a new
 * pool's): by the granule rules, blocks aligned to granule boundaries and
 * large ones from the top of their hole.  PACKED: at the low end of the hole
 * best fit chose, end to end with the block below.  BEST_FIT: every block,
 * small or large, as plain best fit places it, the regions acting as one,
 * with no granule rule and slabs for blocks of 1 KiB or less only
 * (ascmem.reference.bestfit_unmapped_peak's placement).  None
 * maps fewer granules on every workload; ascmem.trace.choose_placement
 * replays a recorded run under each (docs/ARCHITECTURE.md, Note [Packed
 * placement], Note [Best-fit placement]).
 *
 * Where a contiguous pool places the last large block freed (the kept
 * block, Note [The kept block]) when the next large request has its size.
 * KEPT_IN_PLACE (a new pool's): reused in place, unless a smaller hole just
 * below it would be stranded.  KEPT_TO_BEST_FIT: never reused in place, the
 * request goes to best fit like any other.  LOWEST_EQUAL: reused in place
 * unless a free block of its exact size lies lower in the range, which the
 * request then takes (best fit's lowest among equals); a hole below is left
 * where it is.  BEST_FIT_END_LAST: as KEPT_TO_BEST_FIT, and every large
 * request takes the free block that reaches the end of the range only when
 * no other free block holds it (the wilderness rule, where the default
 * applies it only to sizes never freed and an end six times the request:
 * Note [Sparing the end]).  None needs the smallest arena on every workload;
 * ascmem.trace.choose_contiguous_placement replays a recorded run under each
 * (Note [Contiguous placements]).
 *
 * It applies to the blocks placed from then on.  ASCM_ERR_INVAL for another
 * value, or for a placement of the other kind of pool. */
enum { ASCM_PLACE_GRANULES = 0, ASCM_PLACE_PACKED = 1,
       ASCM_PLACE_KEPT_IN_PLACE = 2, ASCM_PLACE_KEPT_TO_BEST_FIT = 3, ASCM_PLACE_LOWEST_EQUAL = 4,
       ASCM_PLACE_BEST_FIT = 5, ASCM_PLACE_BEST_FIT_END_LAST = 6 };
int ascm_pool_set_placement(ascm_pool *p, int placement);
/* The pool's placement: one of its kind's, its default until one is set. */
int ascm_pool_placement(ascm_pool *p);
/* Requests of at most this many bytes are served from slabs, larger ones
 * from best fit in units of min_block; 0: none from slabs, every block
 * placed as the placement places large ones.  A new pool's is ASCM_SLAB_MAX
 * (the largest slab class), and more is read as that; BEST_FIT serves at most 1 KiB from
 * slabs whatever it is.  Slabs pack small blocks fast in a few spans, but
 * a span stays while any of its slots is live, and on some workloads that
 * costs memory best fit would not (docs/ARCHITECTURE.md, Note [Slabs or
 * best fit]); ascmem.trace.choose_contiguous_plan and choose_paged_plan
 * try both.  It applies to the blocks placed from then on: a block keeps
 * the path it was placed by until it is freed.  Always ASCM_OK. */
#define ASCM_SLAB_MAX 32768u /* the largest request slabs can serve */
int ascm_pool_set_slab_max(ascm_pool *p, uint64_t bytes);
uint64_t ascm_pool_slab_max(ascm_pool *p);
int ascm_pool_contains(const ascm_pool *p, uint64_t addr);
/* Calls fn(ctx, addr, usable, requested) for each live block, under the lock. */
typedef void (*ascm_block_fn)(void *ctx, uint64_t addr, uint64_t usable, uint64_t requested);
void ascm_pool_walk(ascm_pool *p, ascm_block_fn fn, void *ctx);

/* Batch calls: one lock for the whole batch.  alloc_many is all or nothing:
 * at the first failure it frees what it allocated (the allocation and free
 * counters as before the call) and returns the status with *done set to the
 * index that failed;
 * free_many frees every valid address and returns the first error seen, with
 * *done counting the successful frees.  Every 256 blocks a batch hands the
 * lock to a thread waiting for it; if that thread resets the pool, which
 * frees what the batch did so far, alloc_many starts again (every address it
 * returns is then from after the reset) and free_many stops, counting the
 * addresses left as freed. */
int ascm_pool_alloc_many(ascm_pool *p, const uint64_t *sizes, size_t n, uint64_t align,
                         uint64_t *addrs, size_t *done);
int ascm_pool_free_many(ascm_pool *p, const uint64_t *addrs, size_t n, size_t *done);

/* Handles: for a caller that keeps one per block, so that the free needs no
 * lookup by address.  alloc_handle is ascm_pool_alloc that also returns the
 * block's handle (never 0).  A large block allocated this way is not entered
 * in the pool's address map: it is known by its handle only (free,
 * usable_size, sleep by address refuse it with ASCM_ERR_BADFREE /
 * ASCM_ERR_INVAL); walks, statistics and check() count it as any block.  A
 * block from a slab (at most the pool's slab_max when it was placed,
 * ascm_pool_set_slab_max: 32 KiB by default, 0 for none, 1 KiB at most
 * under BEST_FIT) may be freed either way.
 * free_handle refuses, with ASCM_ERR_BADFREE and nothing changed, a handle
 * that designates no live block of this pool: a freed block's handle stays
 * refused until the same metadata and address serve a new block -- the
 * guarantee a free by address gives, no more.  Handles do not survive
 * ascm_pool_reset. */
typedef uint64_t ascm_handle;
int ascm_pool_alloc_handle(ascm_pool *p, uint64_t size, uint64_t align, uint64_t *addr, ascm_handle *h);
int ascm_pool_free_handle(ascm_pool *p, ascm_handle h);

/* ---- device: one pool per memory kind under one physical budget --------- */

/* Kinds, as ascmem.MemKind. */
enum { ASCM_KIND_HUGE = 0, ASCM_KIND_NORMAL = 1, ASCM_KIND_DVPP = 2, ASCM_KIND_HOST = 3,
       ASCM_KIND_HUGE1G = 4, ASCM_KINDS = 5 };

/* The free calls, each of which frees some kinds only. */
enum { ASCM_FREE_DEVICE = 0, /* aclrtFree: memory of aclrtMalloc / aclrtMallocAlign32 */
       ASCM_FREE_DVPP = 1,   /* acldvppFree */
       ASCM_FREE_HOST = 2 }; /* aclrtFreeHost */

/* What each kind is: the one table the device, the pluggable functions and
 * the Python layer read (kinds.c). */
typedef struct ascm_kind_info {
    const char *name;   /* as ascmem.MemKind, lower case */
    uint64_t page_size; /* the physical page the memory comes in */
    int huge;           /* charged to the device budget as huge pages */
    int device;         /* device memory (not host memory: no budget charge) */
    int freed_by;       /* ASCM_FREE_* */
} ascm_kind_info;

/* NULL when kind is not one of ASCM_KIND_*. */
const ascm_kind_info *ascm_kind(int kind);
/* Bit k set for each kind that free call `call` (ASCM_FREE_*) frees. */
unsigned ascm_kind_mask(int call);

/* How a request is sized and aligned (CANN API reference: aclrtMalloc,
 * aclrtMallocAlign32, acldvppMalloc, aclrtMallocHost). */
enum { ASCM_SIZE_MALLOC = 0,   /* ALIGN_UP(size, 32) + 32, start 64-byte aligned */
       ASCM_SIZE_ALIGN32 = 1,  /* ALIGN_UP(size, 32), start 64-byte aligned */
       ASCM_SIZE_DVPP = 2,     /* ALIGN_UP(size, 32) + 32, start 128-byte aligned */
       ASCM_SIZE_HOST = 3,     /* size as asked, start 64-byte aligned */
       /* as MALLOC, but the block's requested size stays size: the rounding
        * is placed as pad (at most 63 bytes) after it, so a free that is not
        * told the size (torch's deleters) can read it back exactly */
       ASCM_SIZE_MALLOC_KEEP = 4,
       /* ALIGN_UP(size, 32) with no 32-byte tail, start 64-byte aligned: a
        * block the runtime maps whole rather than cuts from a larger one (a
        * stream-ordered pool's 2 MB granules), with no piece after it */
       ASCM_SIZE_MAPPED = 5,
       /* the size as asked, with no rounding and no tail, start 64-byte
        * aligned, the kinds MALLOC's: a CPU allocator's contract (torch's
        * alloc_cpu: posix_memalign(64, size)), for memory no CANN call cuts
        * pieces from (ascmem.torch's CPU tensors) */
       ASCM_SIZE_EXACT = 6 };

/* Things the caller may want to warn about, reported by ascm_device_malloc. */
enum { ASCM_EVENT_HUGE_FALLBACK = 1,   /* HUGE_FIRST got normal pages: huge ran out */
       ASCM_EVENT_RESERVE_FULL = 2,    /* huge reserve exhausted and it cannot grow (RC) */
       ASCM_EVENT_MEDIA_90 = 4 };      /* the media window passed 90% */

#define ASCM_ERR_UNSUPPORTED 7         /* policy not supported by the product */

typedef struct ascm_budget {
    uint64_t reserve;     /* bytes for huge pages only (atlas-inference's reserve) */
    uint64_t shared;      /* bytes for normal pages, and for huge growth when allowed */
    int huge_grows;       /* EP: huge memory grows past the reserve out of shared */
    uint64_t fixed;       /* taken out of shared by the runtime (AI CPU operator cache) */
    uint64_t limit;       /* cap on huge + normal + fixed; 0 = none */
    uint64_t huge_used, normal_used, peak_huge, peak_normal;
} ascm_budget;

typedef struct ascm_device_config {
    uint64_t base[ASCM_KINDS], size[ASCM_KINDS]; /* the first chunk of each kind; size 0: none */
    uint64_t min_block;
    ascm_budget budget;
    int p2p;              /* P2P policies supported */
    int growable[ASCM_KINDS]; /* the kind exists even with no chunk, and may grow by chunks */
    /* Non-zero: the device memory kinds freed by aclrtFree (huge, normal,
     * huge1g) are paged pools, mapped in granules of the kind's page through
     * `map` (NULL: counted only); the budget counts mapped bytes.  Media and
     * host memory stay contiguous. */
    int paged;
    ascm_map_fn map;
    void *map_ctx;
    uint64_t release_threshold; /* per paged kind: free granules kept mapped, in bytes */
    uint64_t granule_min;       /* paged kinds: granule = max(the kind's page, this) */
    /* Non-zero (RC mode): host memory is the device's normal memory, charged
     * to the budget and sized as aclrtMalloc's pieces are. */
    int host_is_device;
    /* paged kinds: above release_threshold, the threshold adapts up to this
     * many bytes (ascm_pool_set_release_cap); 0 keeps it fixed */
    uint64_t release_threshold_max;
} ascm_device_config;

#define ASCM_MAX_CHUNKS 64 /* chunks a kind holds at once */

/* Asked, with no lock held, when a growable kind's chunks cannot serve a
 * request of size bytes: the hook may take memory from its upstream and
 * ascm_device_add_chunk it (or give empty chunks back first).  generation is
 * the kind's chunk-table generation seen when the request failed: if it has
 * changed, another thread grew the kind already and a retry may be enough.
 * Return ASCM_OK to have the request tried once more. */
typedef int (*ascm_grow_fn)(void *ctx, int kind, uint64_t size, uint64_t align, uint64_t generation);

typedef struct ascm_device ascm_device;

/* ASCM_ERR_INVAL: min_block is not a power of two. */
int ascm_device_create(const ascm_device_config *cfg, ascm_device **out);
void ascm_device_destroy(ascm_device *d);
/* How ascm_device_malloc serves a request: its size after the CANN rounding,
 * its alignment, and the kinds it tries in order. */
typedef struct ascm_route {
    uint64_t rounded, align;
    uint64_t pad;      /* placed after the block, not reported: the sub-allocation tail */
    int kinds[2], nkinds;
    int reserve_event; /* a huge-page failure means the reserve is used up */
} ascm_route;
/* ASCM_OK, or the status the request fails with before any pool is asked. */
int ascm_device_route(const ascm_device *d, uint64_t size, uint32_t policy, int mode, ascm_route *r);
/* mode: ASCM_SIZE_*; policy: aclrtMemMallocPolicy (ignored for DVPP/HOST).
 * A refusal for lack of room or budget counts once in the kind's
 * failed_count (the kind last tried, reported in *kind). */
int ascm_device_malloc(ascm_device *d, uint64_t size, uint32_t policy, int mode, uint64_t *addr,
                       int *kind, int *events);
/* The same without counting a refusal, for callers that retry (after
 * freeing caches) and count the request once when they give up. */
int ascm_device_try_malloc(ascm_device *d, uint64_t size, uint32_t policy, int mode, uint64_t *addr,
                           int *kind, int *events);
void ascm_device_count_failure(ascm_device *d, int kind);
/* As ascm_device_try_malloc_held, for an aligned group: the block starts
 * at a multiple of align (a power of two) and its usable size is one too;
 * ASCM_ERR_INVAL for an align that is not a power of two. */
int ascm_device_try_malloc_aligned_held(ascm_device *d, uint64_t size, uint32_t policy, int mode,
                                        uint64_t align, uint64_t *addr, int *kind, int *events);
/* The same calls without the gate's two atomic operations, for a caller that
 * holds the lock every reset and close of this device is made under (the
 * Python Device: the GIL, which ascm_device_reset never releases), so that
 * neither can run while the call is inside.  A closed device still refuses
 * them with ASCM_ERR_CLOSED. */
int ascm_device_try_malloc_held(ascm_device *d, uint64_t size, uint32_t policy, int mode,
                                uint64_t *addr, int *kind, int *events);
int ascm_device_free_held(ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind);
/* kind_mask: kinds the address may belong to (bit per kind). */
int ascm_device_free(ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind);
/* Blocks a caller with more state than the device (the Python layer: stream
 * frees, buffer views, tags) frees itself, through ascm_device_free_held:
 * while guarded, ascm_device_free refuses them with ASCM_ERR_BADFREE.
 * guard: ASCM_ERR_HOSTMEM if the set cannot grow.  A free through
 * ascm_device_free_held drops the block's guard; unguard drops it without a
 * free.  ascm_device_reset forgets them all. */
int ascm_device_guard(ascm_device *d, uint64_t addr);
void ascm_device_unguard(ascm_device *d, uint64_t addr);
int ascm_device_kind_of(const ascm_device *d, uint64_t addr);  /* -1: none */
/* The chunk's pool that holds addr (and its kind), or NULL. */
ascm_pool *ascm_device_pool_at(const ascm_device *d, uint64_t addr, int *kind);
ascm_pool *ascm_device_pool(ascm_device *d, int kind);          /* first chunk's; NULL if none */
int ascm_device_has_kind(const ascm_device *d, int kind);
int ascm_device_chunk_count(const ascm_device *d, int kind);
/* Chunk i of a kind (and its range), or NULL. */
ascm_pool *ascm_device_chunk(ascm_device *d, int kind, int i, uint64_t *base, uint64_t *size);
uint64_t ascm_device_generation(const ascm_device *d, int kind);
/* Statistics of a kind summed over its chunks (peaks: exact with one chunk,
 * else the sum of the chunks' peaks, an upper bound). */
void ascm_device_kind_stats(ascm_device *d, int kind, ascm_stats *out);
/* Paged kinds: bytes of free granules the kind's pools keep mapped at most
 * now (their release thresholds, summed over chunks); 0 for others. */
uint64_t ascm_device_kind_release_threshold(ascm_device *d, int kind);
void ascm_device_set_grow(ascm_device *d, ascm_grow_fn fn, void *ctx);
/* Asked, with no lock held and outside the gate, to give chunks that hold no
 * live block back to their upstream (torch's empty_cache through the
 * pluggable reset hook); returns the bytes given back. */
typedef uint64_t (*ascm_release_fn)(void *ctx);
void ascm_device_set_release(ascm_device *d, ascm_release_fn fn, void *ctx);
uint64_t ascm_device_release_idle(ascm_device *d); /* calls the hook, if any */
/* Gives every pool's spare slabs back (and their pages to the budget). */
uint64_t ascm_device_trim(ascm_device *d);
/* Thread caches (ascm_pool_set_thread_caches) for every pool of the device
 * but the media (DVPP) window's, those of chunks added later included;
 * ASCM_ERR_UNSUPPORTED on a paged device, ASCM_ERR_INVAL for an unknown mode. */
int ascm_device_set_thread_caches(ascm_device *d, int mode);
/* The placement (ascm_pool_set_placement) of the device's pools, those of
 * chunks added later and those a reset makes included: on a paged device
 * GRANULES, PACKED or BEST_FIT for its paged pools, on a device that is not paged
 * KEPT_IN_PLACE, KEPT_TO_BEST_FIT, LOWEST_EQUAL or BEST_FIT_END_LAST for every pool.
 * ASCM_ERR_INVAL for another value, or one of the other kind of device. */
int ascm_device_set_placement(ascm_device *d, int placement);
/* The device's placement: one of its kind's, its default until one is set. */
int ascm_device_placement(ascm_device *d);
/* The slab_max (ascm_pool_set_slab_max) of the device's pools, those of
 * chunks added later and those a reset makes included.  Always ASCM_OK. */
int ascm_device_set_slab_max(ascm_device *d, uint64_t bytes);
uint64_t ascm_device_slab_max(ascm_device *d);
/* The unit of the device's pools (its configuration's min_block): fixed at
 * creation, so read without a lock. */
uint64_t ascm_device_min_block(const ascm_device *d);
/* A new chunk [base, base + size) for the kind (ranges must not overlap). */
int ascm_device_add_chunk(ascm_device *d, int kind, uint64_t base, uint64_t size);
/* Closes every chunk of the kind that holds no live block (after giving its
 * spare slabs back), at most max of them, and takes it off the kind; writes
 * their ranges for the caller to give back upstream. */
int ascm_device_release_empty(ascm_device *d, int kind, uint64_t *bases, uint64_t *sizes, int max,
                              int *count);
/* Recreates every pool empty at new bases; the budget keeps its settings
 * and its fixed charge (the runtime's own memory goes only at a restart).
 * Waits out callers inside the device first (see the gate below). */
int ascm_device_reset(ascm_device *d, const uint64_t base[ASCM_KINDS]);

/* The gate.  ascm_device_malloc/try_malloc/free count themselves in and out;
 * other callers that reach the pools without the GIL (walks, statistics from
 * another thread) bracket their calls with enter (0: refused, the device is
 * closed or being reset) and leave.  quiesce shuts the gate and waits until
 * no caller is inside; call it without holding anything a caller inside may
 * wait for (with Python: without the GIL).  reopen undoes one quiesce.
 * close shuts the gate for good: every later call gets ASCM_ERR_CLOSED, and
 * the device's memory stays valid until destroy.  A leave must come from
 * the thread that entered (the count is kept by stripe of threads). */
int ascm_device_enter(ascm_device *d);
void ascm_device_leave(ascm_device *d);
/* ascm_device_malloc and ascm_device_free for a caller between its own
 * enter and leave (one pass of the gate, not two). */
int ascm_device_malloc_entered(ascm_device *d, uint64_t size, uint32_t policy, int mode, uint64_t *addr,
                               int *kind, int *events);
int ascm_device_free_entered(ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind);
void ascm_device_quiesce(ascm_device *d);
void ascm_device_reopen(ascm_device *d);
int ascm_device_close(ascm_device *d);
/* Yields until a reset in progress is over; ASCM_ERR_CLOSED if closed. */
int ascm_device_wait_open(ascm_device *d);
void ascm_device_budget(ascm_device *d, ascm_budget *out);
/* The huge-page bytes the budget charges and those the device's pools hold,
 * read together (they are equal unless the accounting is broken). */
void ascm_device_huge_pages(ascm_device *d, uint64_t *charged, uint64_t *held);
/* Takes (delta > 0) or gives back fixed runtime memory from shared:
 * ASCM_ERR_NOMEM if the budget has no room, ASCM_ERR_INVAL for giving back
 * more than is taken (nothing changes then). */
int ascm_device_charge_fixed(ascm_device *d, int64_t delta);
int ascm_device_set_limit(ascm_device *d, uint64_t limit);
/* Peaks (of every pool and of the budget) start again from current use. */
void ascm_device_reset_peaks(ascm_device *d);
/* Blocks handed out to callers outside the Python layer (the pluggable
 * functions, the capsule's device calls, torch's CPU allocator): each is
 * marked at such an allocation (ASCM_ERR_HOSTMEM if the mark finds no
 * memory: give the block back), and its free unmarks it, whichever path
 * frees it.  The Python Device refuses close() and reset() while any is
 * marked: those callers' next read would find unmapped memory. */
int ascm_device_hand_out_block(ascm_device *d, uint64_t addr);
int64_t ascm_device_handed_out(ascm_device *d);
/* The device that the pluggable-allocator functions use for a device index. */
int ascm_pluggable_register(int device, ascm_device *d);
/* The external allocator's slots (acl_allocator.c): bind points a slot at a
 * device (NULL: unbinds, waiting for callbacks in flight); handle is the
 * aclrtAllocator object the runtime passes back to the callbacks. */
#define ASCM_ACL_ALLOCATOR_SLOTS 64
int ascm_acl_allocator_bind(int slot, ascm_device *d);
void *ascm_acl_allocator_handle(int slot);

const char *ascm_status_str(int status);

/* ---- real memory from the OS (host backend) ----------------------------- */

enum { ASCM_OS_NORMAL = 0, ASCM_OS_THP = 1, ASCM_OS_HUGETLB = 2 };
/* Reserves size bytes at a multiple of align, touched only when used; with
 * want_huge, explicit huge pages when the OS has them configured, else
 * transparent huge pages advised; *got says which (ASCM_OS_*).
 * ASCM_ERR_INVAL for a size of 0, an align not a power of two, or a size
 * that wraps past 2^64 with align; ASCM_ERR_HOSTMEM when the OS refuses. */
int ascm_os_reserve(uint64_t size, uint64_t align, int want_huge, uint64_t *addr, int *got);
int ascm_os_release(uint64_t addr, uint64_t size);
/* Frees the memory of a reserved range but keeps its addresses reserved and
 * inaccessible (ascm_os_release ends the reservation). */
int ascm_os_quarantine(uint64_t addr, uint64_t size);
/* Bytes of [addr, addr + size) backed by memory now (mincore). */
uint64_t ascm_os_resident(uint64_t addr, uint64_t size);
/* Hands the pages of [addr, addr + size) back to the OS; they read as zero after. */
int ascm_os_discard(uint64_t addr, uint64_t size);
/* The host backend's map hook (ascm_map_fn) for paged pools over a reserved
 * range: map makes granules readable and writable; unmap gives their pages
 * back to the OS and makes them inaccessible.  ctx is unused. */
int ascm_os_map(void *ctx, uint64_t addr, uint64_t size, int map);
/* Calls fn(ctx, addr, size, 0) for each free span of the large-block path. */
void ascm_pool_walk_free(ascm_pool *p, ascm_block_fn fn, void *ctx);
/* Calls fn(ctx, addr, size, 0) for each run of whole pages the pool holds
 * now, in address order: pages under a live block or slab storage, and a
 * paged pool's kept granules.  They add up to the pages in use (and kept)
 * of ascm_pool_stats: PyTorch's segments in a snapshot. */
void ascm_pool_walk_held(ascm_pool *p, ascm_block_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif /* ASCMEM_H */
