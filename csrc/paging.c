/* Paged pools: the range is virtual, and physical memory is mapped under it
 * in granules (the pool's pages) only where live blocks are.  A granule is
 * mapped when its first live byte arrives and unmapped when its last one
 * leaves, except that up to a release threshold of mapped free granules are
 * kept for reuse (CANN's memory pools keep the same threshold); with a cap,
 * the threshold adapts ("how much is kept", below).
 *
 * The pool tells which granules change state (page_take / page_give in
 * pool_internal.h give the contiguous run of pages that gained their first
 * or lost their last live byte); this file decides map, keep or unmap, calls the backend's
 * hook and charges the budget for mapped bytes.  Only kept granules need a
 * bitmap: a granule with a live byte is mapped, one without is mapped iff it
 * is kept.
 *
 * The run the last release kept stays out of the bitmap ([pend_lo,
 * pend_hi)) until something else needs the bitmap: a loop that frees and
 * reallocates one large block moves the same granules between live and kept
 * on every pair, and updating the bitmap's range each time would be most of
 * what such a pair costs beyond a contiguous pool's.  kept_count counts both.
 */
#include "internal.h"

#include <stdlib.h>

int ascm_paging_init(ascm_paging *g, uint64_t npages, uint64_t base, unsigned pshift,
                     uint64_t threshold, ascm_map_fn map, void *map_ctx) {
    memset(g, 0, sizeof *g);
    g->base = base;
    g->pshift = pshift;
    g->threshold_pages = g->floor_pages = g->cap_pages = threshold >> pshift;
    g->period_shift = 1; /* twice the threshold */
    g->map = map;
    g->map_ctx = map_ctx;
    return ascm_hbm_init(&g->kept, npages);
}

void ascm_paging_destroy(ascm_paging *g) { ascm_hbm_destroy(&g->kept); }

static inline int adaptive(const ascm_paging *g) { return g->cap_pages > g->floor_pages; }

static int call_map(ascm_paging *g, uint64_t lo, uint64_t hi, int map) {
    if (map) g->map_calls++;
    else g->unmap_calls++;
    if (!g->map) return 0;
    return g->map(g->map_ctx, g->base + (lo << g->pshift), (hi - lo) << g->pshift, map);
}

/* Unmaps [lo, hi): the hook, the charge.  An unmap the backend refuses is
 * counted; the granules are forgotten either way (nothing is live in them). */
static void unmap_run(ascm_paging *g, ascm_charge_fn charge, void *ctx, uint64_t lo, uint64_t hi) {
    if (call_map(g, lo, hi, 0) != 0) g->unmap_failures++;
    if (charge) charge(ctx, -(int64_t)((hi - lo) << g->pshift));
}

static inline uint64_t pending(const ascm_paging *g) { return g->pend_hi - g->pend_lo; }

/* The pending run goes into the bitmap. */
static void flush_pending(ascm_paging *g) {
    if (pending(g)) ascm_hbm_set_range(&g->kept, g->pend_lo, g->pend_hi);
    g->pend_lo = g->pend_hi = 0;
}

/* Kept granules of the bitmap in [lo, hi). */
static inline uint64_t count_kept(const ascm_paging *g, uint64_t lo, uint64_t hi) {
    return g->kept_count > pending(g) ? ascm_hbm_count_range(&g->kept, lo, hi) : 0;
}

/* Maps the pages of [lo, hi) that are not kept, run by run; on a refusal
 * unmaps what this call mapped.  Returns the pages mapped, or -1. */
static int64_t map_unkept(ascm_paging *g, uint64_t lo, uint64_t hi) {
    if (!count_kept(g, lo, hi)) /* the common case: one call for the whole run */
        return call_map(g, lo, hi, 1) == 0 ? (int64_t)(hi - lo) : -1;
    uint64_t mapped = 0, i = lo;
    while (i < hi) {
        while (i < hi && ascm_hbm_test(&g->kept, i)) i++;
        uint64_t run = i;
        while (i < hi && !ascm_hbm_test(&g->kept, i)) i++;
        if (i == run) continue;
        if (call_map(g, run, i, 1) != 0) { /* undo the runs before this one */
            for (uint64_t j = lo; j < run;) {
                while (j < run && ascm_hbm_test(&g->kept, j)) j++;
                uint64_t r = j;
                while (j < run && !ascm_hbm_test(&g->kept, j)) j++;
                if (j > r) call_map(g, r, j, 0);
            }
            return -1;
        }
        mapped += i - run;
    }
    return (int64_t)mapped;
}

/* ---- how much is kept: the threshold adapts ---------------------------------
 * glibc's malloc is the model (malloc/malloc.c, free(): freeing an mmapped
 * chunk raises mp_.mmap_threshold to the chunk's size, up to
 * DEFAULT_MMAP_THRESHOLD_MAX, and trim_threshold to twice that): memory a
 * program gave back and then asks for again belongs to its working set, and
 * from then on memory of that size is kept rather than given back.  Here the
 * granules a release unmapped to honour the threshold (given_back) and that
 * are mapped again later raise the threshold by as many, up to the cap.  A
 * program that frees 1 GiB once gives it back beyond the floor; one that
 * allocates and frees it every step maps it on its first two steps only.
 * Granules are counted, not addresses: the cost of giving back is the map
 * and the page faults that follow, whichever granules they land on.
 *
 * Unlike glibc's threshold, this one also comes down.  A period lasts until
 * the pool has taken twice the threshold into use (twice what it gave back,
 * if more: the program's next step may be that large).  The fewest granules
 * kept at any moment of the period (kept_low) sat idle through it: the
 * threshold drops by half of them (to the floor at most) and the kept
 * granules past it, the oldest first, are unmapped; halving, because a
 * granule idle at one moment may be the one another phase of the step
 * needs.  A period that raised the threshold lowers nothing, and one that
 * raises it within SUSPECT_PERIODS of a lowering makes periods twice as
 * long (up to 64 thresholds; they never shorten again but at reset()): the
 * lowering came from periods shorter than the program's step.  A working set that churns takes the kept granules in
 * every period and keeps them; one that shrank hands the idle part back
 * halving per period.  Given-back granules not mapped again within a period
 * are forgotten.  There is no clock: it all
 * happens in acquire and release, under the pool's lock, so there is no
 * thread to survive fork() and nothing runs outside a call.  A program that
 * stops allocating keeps what is kept until trim() (torch: empty_cache()),
 * as glibc's heap keeps its free chunks until malloc_trim(). */

static void evict_kept(ascm_paging *g, ascm_charge_fn charge, void *ctx, uint64_t want);

static inline uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Counts granules unmapped to honour the threshold (never more than the cap:
 * they could not raise it further). */
static inline void note_given_back(ascm_paging *g, uint64_t n) {
    if (adaptive(g)) g->given_back = min_u64(g->given_back + n, g->cap_pages);
}

#define PERIOD_SHIFT_MAX 6 /* periods of 64 thresholds at most */
#define SUSPECT_PERIODS 4

static void end_period(ascm_paging *g, ascm_charge_fn charge, void *ctx) {
    /* a period that had to raise the threshold was short of kept granules,
     * even if some sat idle throughout (a fragmented kept set: the step's
     * large blocks did not fit in them): it lowers nothing.  One that raises
     * it soon after another lowered it shows the periods are shorter than
     * the program's cycle (their fewest kept granules were not its peak's):
     * periods become twice as long. */
    if (g->raised && g->suspect && g->period_shift < PERIOD_SHIFT_MAX) g->period_shift++;
    if (g->suspect) g->suspect--;
    uint64_t idle = g->raised ? 0 : min_u64(g->kept_low / 2, g->threshold_pages - g->floor_pages);
    if (idle) g->suspect = SUSPECT_PERIODS;
    g->threshold_pages -= idle;
    g->given_back = 0;
    if (g->kept_count > g->threshold_pages) {
        uint64_t over = g->kept_count - g->threshold_pages;
        evict_kept(g, charge, ctx, over);
        g->given_back = over; /* if the program asks for them again, it needed them */
    }
    g->taken = g->raised = 0;
    g->kept_low = g->kept_count;
}

/* After an acquire of `taken` granules, `fresh` of them newly mapped. */
static void adapt(ascm_paging *g, ascm_charge_fn charge, void *ctx, uint64_t taken, uint64_t fresh) {
    uint64_t again = min_u64(fresh, g->given_back);
    if (again) {
        g->given_back -= again;
        g->raised += again;
        g->threshold_pages = min_u64(g->threshold_pages + again, g->cap_pages);
    }
    if (g->kept_count < g->kept_low) g->kept_low = g->kept_count;
    g->taken += taken;
    uint64_t span = g->threshold_pages > g->given_back ? g->threshold_pages : g->given_back;
    if (g->taken >= span << g->period_shift) end_period(g, charge, ctx);
}

int ascm_paging_acquire(ascm_paging *g, ascm_charge_fn charge, void *ctx, uint64_t lo, uint64_t hi,
                        uint64_t in_use) {
    /* the pending run counts as kept here when [lo, hi) holds all of it; a
     * run it only partly covers goes into the bitmap first */
    uint64_t from_pending = 0;
    if (pending(g) && lo < g->pend_hi && g->pend_lo < hi) {
        if (lo <= g->pend_lo && g->pend_hi <= hi) from_pending = pending(g);
        else flush_pending(g);
    }
    uint64_t from_bitmap = count_kept(g, lo, hi);
    uint64_t fresh = (hi - lo) - from_bitmap - from_pending;
    if (fresh && from_pending) { /* map_unkept skips what the bitmap says is kept */
        flush_pending(g);
        from_bitmap += from_pending;
        from_pending = 0;
    }
    if (fresh && charge && charge(ctx, (int64_t)(fresh << g->pshift)) != 0) return ASCM_ERR_BUDGET;
    if (fresh && map_unkept(g, lo, hi) < 0) {
        if (charge) charge(ctx, -(int64_t)(fresh << g->pshift));
        return ASCM_ERR_NOMEM;
    }
    /* they hold live bytes now */
    if (from_bitmap) ascm_hbm_clear_range(&g->kept, lo, hi);
    if (from_pending) g->pend_lo = g->pend_hi = 0;
    uint64_t kept = from_bitmap + from_pending;
    g->kept_count -= kept;
    /* in_use already counts [lo, hi) */
    if (in_use + g->kept_count > g->peak_mapped) g->peak_mapped = in_use + g->kept_count;
    if (adaptive(g)) adapt(g, charge, ctx, hi - lo, fresh);
    return ASCM_OK;
}

/* ---- which kept granules go first ------------------------------------------
 * A release that finds the threshold full unmaps the granules kept longest
 * ago to keep its own: a pool places a step's blocks where it placed the
 * last step's, so the granules freed last are the ones the next
 * allocations land on, while granules kept from an earlier pattern (another
 * model, a warm-up) may never be placed on again.  Kept first-come, those
 * would fill the threshold for good, and every later step would map its
 * granules (a page fault each) and unmap them at its end, with the stale
 * ones resident on top of its peak.  The order is a ring of the kept runs;
 * when it is full its two oldest runs merge into the span of both. */

static void push_run(ascm_paging *g, uint64_t lo, uint64_t hi) {
    if (g->runs_count == ASCM_KEPT_RUNS) {
        unsigned a = g->runs_head, b = (a + 1) % ASCM_KEPT_RUNS;
        if (g->kept_runs[a].lo < g->kept_runs[b].lo) g->kept_runs[b].lo = g->kept_runs[a].lo;
        if (g->kept_runs[a].hi > g->kept_runs[b].hi) g->kept_runs[b].hi = g->kept_runs[a].hi;
        g->runs_head = b;
        g->runs_count--;
    }
    unsigned i = (g->runs_head + g->runs_count++) % ASCM_KEPT_RUNS;
    g->kept_runs[i].lo = lo;
    g->kept_runs[i].hi = hi;
}

/* Unmaps kept granules of the bitmap in [*lo, hi) until `want` are gone,
 * run by run, advancing *lo past what it looked at; returns how many. */
static uint64_t evict_in(ascm_paging *g, ascm_charge_fn charge, void *ctx, uint64_t *lo, uint64_t hi,
                         uint64_t want) {
    uint64_t gone = 0, i = *lo;
    while (i < hi && gone < want) {
        if (!ascm_hbm_count_range(&g->kept, i, hi)) { /* nothing kept in the rest */
            i = hi;
            break;
        }
        while (i < hi && !ascm_hbm_test(&g->kept, i)) i++;
        uint64_t run = i;
        while (i < hi && i - run < want - gone && ascm_hbm_test(&g->kept, i)) i++;
        if (i == run) continue;
        ascm_hbm_clear_range(&g->kept, run, i);
        unmap_run(g, charge, ctx, run, i);
        gone += i - run;
    }
    *lo = i;
    return gone;
}

/* Unmaps `want` kept granules (fewer if fewer are kept), oldest first: the
 * bitmap's by the ring, then any the ring lost track of, then the tail of
 * the pending run (the newest). */
static void evict_kept(ascm_paging *g, ascm_charge_fn charge, void *ctx, uint64_t want) {
    uint64_t gone = 0;
    while (gone < want && g->runs_count && g->kept_count - gone > pending(g)) {
        uint64_t *lo = &g->kept_runs[g->runs_head].lo, hi = g->kept_runs[g->runs_head].hi;
        gone += evict_in(g, charge, ctx, lo, hi, want - gone);
        if (*lo >= hi) {
            g->runs_head = (g->runs_head + 1) % ASCM_KEPT_RUNS;
            g->runs_count--;
        }
    }
    while (gone < want && g->kept_count - gone > pending(g)) {
        uint64_t lo = ascm_hbm_first(&g->kept);
        gone += evict_in(g, charge, ctx, &lo, g->kept.nbits, want - gone);
    }
    g->kept_count -= gone;
    uint64_t n = want - gone < pending(g) ? want - gone : pending(g);
    if (n) {
        unmap_run(g, charge, ctx, g->pend_hi - n, g->pend_hi);
        g->pend_hi -= n;
        g->kept_count -= n;
        if (!pending(g)) g->pend_lo = g->pend_hi = 0;
    }
}

static void forget_runs(ascm_paging *g) { g->runs_head = g->runs_count = 0; }

void ascm_paging_release(ascm_paging *g, ascm_charge_fn charge, void *ctx, uint64_t lo, uint64_t hi) {
    uint64_t keep = hi - lo < g->threshold_pages ? hi - lo : g->threshold_pages;
    uint64_t room = g->threshold_pages > g->kept_count ? g->threshold_pages - g->kept_count : 0;
    if (keep > room) {
        evict_kept(g, charge, ctx, keep - room);
        note_given_back(g, keep - room);
    }
    if (keep) {
        flush_pending(g);
        g->pend_lo = lo;
        g->pend_hi = lo + keep;
        push_run(g, lo, lo + keep);
    }
    g->kept_count += keep;
    if (lo + keep < hi) {
        unmap_run(g, charge, ctx, lo + keep, hi);
        note_given_back(g, hi - lo - keep);
    }
}

void ascm_paging_set_cap(ascm_paging *g, ascm_charge_fn charge, void *ctx, uint64_t cap) {
    uint64_t pages = cap >> g->pshift;
    g->cap_pages = pages > g->floor_pages ? pages : g->floor_pages;
    if (g->threshold_pages > g->cap_pages) g->threshold_pages = g->cap_pages;
    if (g->kept_count > g->threshold_pages) evict_kept(g, charge, ctx, g->kept_count - g->threshold_pages);
    g->given_back = min_u64(g->given_back, g->cap_pages);
    if (!adaptive(g)) g->given_back = g->taken = g->kept_low = g->raised = 0;
}

void ascm_paging_unmap(ascm_paging *g, ascm_charge_fn charge, void *ctx, uint64_t lo, uint64_t hi) {
    unmap_run(g, charge, ctx, lo, hi);
}

uint64_t ascm_paging_trim(ascm_paging *g, ascm_charge_fn charge, void *ctx) {
    uint64_t released = g->kept_count << g->pshift;
    flush_pending(g);
    while (ascm_hbm_any(&g->kept)) {
        uint64_t lo = ascm_hbm_first(&g->kept), hi = lo;
        while (hi < g->kept.nbits && ascm_hbm_test(&g->kept, hi)) ascm_hbm_clear(&g->kept, hi++);
        unmap_run(g, charge, ctx, lo, hi);
    }
    g->kept_count = 0;
    forget_runs(g);
    return released;
}

void ascm_paging_reset(ascm_paging *g, ascm_charge_fn charge, void *ctx, uint64_t in_use) {
    if (in_use + g->kept_count) { /* no record of which granules are live: the whole range */
        call_map(g, 0, g->kept.nbits, 0);
        if (charge) charge(ctx, -(int64_t)((in_use + g->kept_count) << g->pshift));
    }
    ascm_hbm_clear_all(&g->kept);
    g->pend_lo = g->pend_hi = 0;
    g->kept_count = 0;
    forget_runs(g);
    /* a reset pool is a new one: what it learnt is forgotten */
    g->threshold_pages = g->floor_pages;
    g->given_back = g->taken = g->kept_low = g->raised = 0;
    g->period_shift = 1;
    g->suspect = 0;
}

int ascm_paging_check(const ascm_paging *g, const uint8_t *page_used, char *msg, size_t msglen) {
    uint64_t kept = 0;
    if (g->pend_hi < g->pend_lo || g->pend_hi > g->kept.nbits)
        return ascm_fail(msg, msglen, "the pending kept run is out of range");
    for (uint64_t i = 0; i < g->kept.nbits; i++) {
        int in_pending = i >= g->pend_lo && i < g->pend_hi;
        if (in_pending && ascm_hbm_test(&g->kept, i))
            return ascm_fail(msg, msglen, "granule %llu is kept twice", (unsigned long long)i);
        if (!in_pending && !ascm_hbm_test(&g->kept, i)) continue;
        kept++;
        if (page_used[i])
            return ascm_fail(msg, msglen, "granule %llu is kept as free but holds a live block",
                             (unsigned long long)i);
    }
    if (kept != g->kept_count) return ascm_fail(msg, msglen, "kept granule count is wrong");
    if (kept > g->threshold_pages) return ascm_fail(msg, msglen, "more granules kept than the threshold");
    if (g->threshold_pages < g->floor_pages || g->threshold_pages > g->cap_pages)
        return ascm_fail(msg, msglen, "the release threshold is outside its floor and cap");
    if (g->given_back > g->cap_pages || g->period_shift < 1 || g->period_shift > PERIOD_SHIFT_MAX ||
        g->suspect > SUSPECT_PERIODS)
        return ascm_fail(msg, msglen, "the adaptive threshold's counters are out of range");
    return ascm_hbm_check(&g->kept, msg, msglen);
}
