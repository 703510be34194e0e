/* libFuzzer harness over the C core's public functions: the input is a
 * stream of operations on one pool, one buddy allocator, one paged pool
 * (allocations, frees by address and by handle -- valid, stale or made up --,
 * sleep and wake, hand-overs (relabel) of sleeping and awake blocks, trims,
 * emptying it at threshold 0; its map hook keeps a mirror of
 * the mapped granules that must agree with the pool's statistics) and one
 * device (allocations, frees -- of guarded blocks and of blocks handed out
 * to C too, whose marks each free must take --, batches, trims,
 * and the device's lifecycle: resets, a gate shut and reopened around
 * calls, close).  Any crash, sanitizer
 * report or failed check() is a finding, and so is a statistic that lies:
 * a pool with nothing live must report its whole capacity free.
 *   make -C fuzz run      (clang, libFuzzer + ASan + UBSan)
 */
#include "ascmem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 64
#define GRANULE (64u << 10)
#define PAGED_GRANULES 256u

/* The paged pool's map hook: a byte per granule; mapping a mapped granule
 * is a finding; refuses when told to (failure injection). */
typedef struct mirror {
    uint8_t mapped[PAGED_GRANULES];
    int refuse;
} mirror;

static int mirror_map(void *ctx, uint64_t addr, uint64_t size, int map) {
    mirror *m = ctx;
    if (map && m->refuse) return 1;
    for (uint64_t a = addr; a < addr + size; a += GRANULE) {
        uint64_t g = (a - (1ull << 36)) / GRANULE;
        if (g >= PAGED_GRANULES || (map && m->mapped[g])) abort();
        m->mapped[g] = (uint8_t)map;
    }
    return 0;
}

static void paged_agrees(ascm_pool *p, const mirror *m) {
    ascm_stats st;
    uint64_t n = 0;
    ascm_pool_stats(p, &st); /* first: with thread caches on it flushes them, which may unmap */
    for (unsigned g = 0; g < PAGED_GRANULES; g++) n += m->mapped[g];
    if (st.mapped != n * GRANULE) {
        fprintf(stderr, "paged pool: %llu bytes mapped, the hook saw %llu\n",
                (unsigned long long)st.mapped, (unsigned long long)(n * GRANULE));
        abort();
    }
}

static uint64_t take(const uint8_t **p, size_t *n, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes && *n; i++, (*p)++, (*n)--) v |= (uint64_t)**p << (8 * i);
    return v;
}

/* Blocks marked handed out to C (ascm_device_hand_out_block) by slot: a mark
 * belongs to the slot that holds the address now.  Whether the block at
 * addr is marked; with clear, the marks of every slot holding addr go (a
 * block freed, or an address handed out afresh: stale slots keep it). */
static int marked_at(const uint64_t *live, uint8_t *marked, uint64_t addr, int clear) {
    int m = 0;
    for (unsigned s = 0; s < SLOTS; s++)
        if (live[s] == addr && marked[s]) {
            m = 1;
            if (clear) marked[s] = 0;
        }
    return m;
}

static void handed_moved(ascm_device *dev, int64_t before, int64_t by, const char *what) {
    int64_t now = ascm_device_handed_out(dev);
    if (now != before + by) {
        fprintf(stderr, "device: %s moved the handed-out count %lld -> %lld, not by %lld\n", what,
                (long long)before, (long long)now, (long long)by);
        abort();
    }
}

static void must_check(int st, const char *what, const char *msg) {
    if (st != ASCM_OK) {
        fprintf(stderr, "%s check failed: %s\n", what, msg);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ascm_pool *pool, *paged;
    ascm_buddy *buddy;
    mirror mirror_state;
    memset(&mirror_state, 0, sizeof mirror_state);
    ascm_pool_config gc = {.base = 1ull << 36, .size = PAGED_GRANULES * GRANULE, .min_block = 4096,
                           .page_size = GRANULE, .paged = 1, .map = mirror_map,
                           .map_ctx = &mirror_state, .release_threshold = (size & 6) * GRANULE};
    ascm_device *dev;
    ascm_pool_config pc = {.base = 1ull << 32, .size = 8u << 20, .min_block = 4096,
                           .page_size = 2u << 20};
    ascm_device_config dc = {.min_block = 4096, .p2p = 0};
    for (int k = 0; k < ASCM_KINDS; k++) {
        dc.base[k] = (1ull << 40) + ((uint64_t)k << 32);
        dc.size[k] = k == ASCM_KIND_HUGE1G ? 0 : (16u << 20);
    }
    dc.budget.reserve = 8u << 20;
    dc.budget.shared = 8u << 20;
    dc.budget.huge_grows = size & 1;
    if (ascm_pool_create(&pc, &pool) || ascm_buddy_create(1ull << 32, 6u << 20, 4096, &buddy) ||
        ascm_device_create(&dc, &dev) || ascm_pool_create(&gc, &paged))
        abort();
    /* the contiguous pool under each of its placements (ascmem.h), by the
     * input's length (bits above those the other choices below use) */
    static const int contiguous_placements[] = {ASCM_PLACE_KEPT_IN_PLACE, ASCM_PLACE_KEPT_TO_BEST_FIT,
                                                ASCM_PLACE_LOWEST_EQUAL, ASCM_PLACE_BEST_FIT_END_LAST};
    if (ascm_pool_set_placement(pool, contiguous_placements[(size >> 7) % 4])) abort();
    /* and the paged pool under each of its own, by the bits above */
    static const int paged_placements[] = {ASCM_PLACE_GRANULES, ASCM_PLACE_PACKED, ASCM_PLACE_BEST_FIT};
    if (ascm_pool_set_placement(paged, paged_placements[(size >> 9) % 3])) abort();
    /* thread caches on for some inputs: frees then go through the lock-free
     * validation of tcache.c, which the bad frees below must not get past */
    if (((size & 8) && ascm_pool_set_thread_caches(pool, ASCM_CACHES_ON)) ||
        ((size & 16) && ascm_pool_set_thread_caches(paged, ASCM_CACHES_ON)))
        abort();
    /* an adaptive release threshold for some inputs (paging.c, "how much is
     * kept"): raises, periods and evictions against the mirror's mappings */
    if ((size & 32) && ascm_pool_set_release_cap(paged, ((size & 6) + 10) * GRANULE)) abort();
    uint64_t live[4][SLOTS] = {{0}};
    uint8_t marked[SLOTS] = {0}; /* live[2]'s blocks handed out to C */
    ascm_handle handles[SLOTS] = {0}; /* the pool's blocks allocated by handle */
    char msg[256];
    int closed = 0, epoch = 0;
    while (size) {
        unsigned op = (unsigned)take(&data, &size, 1);
        unsigned slot = (unsigned)take(&data, &size, 1) % SLOTS;
        unsigned shift = (unsigned)take(&data, &size, 1) % 24;
        uint64_t req = take(&data, &size, 3) & ((1ull << shift) - 1);
        uint64_t align = 1ull << (take(&data, &size, 1) % 14);
        unsigned far = (unsigned)take(&data, &size, 1); /* sizes and addresses near 2^64 too */
        if (far >= 0xF0) req = ~req;
        else if (far >= 0xE0) req <<= 40;
        int kind, events;
        switch (op % 20) {
        case 0: /* pool alloc (size 0 and odd alignments included on purpose) */
            if (!live[0][slot] && ascm_pool_alloc(pool, req, align, &live[0][slot]) != ASCM_OK)
                live[0][slot] = 0;
            break;
        case 1: { /* pool free, valid or not (a large block allocated by handle: refused) */
            uint64_t a = live[0][slot] ? live[0][slot] : req, usable;
            if (ascm_pool_free(pool, a) == ASCM_OK && (req & 1)) {
                /* live nowhere now (the slots hold distinct live blocks):
                 * the kept last freed block, its map entry kept in a loop of
                 * reuse, included -- a second free and a lookup are refused */
                if (ascm_pool_free(pool, a) != ASCM_ERR_BADFREE ||
                    ascm_pool_usable_size(pool, a, &usable) != ASCM_ERR_BADFREE) {
                    fprintf(stderr, "pool: a freed block at %#llx was freed or found again\n",
                            (unsigned long long)a);
                    abort();
                }
            }
            live[0][slot] = 0;
            if (handles[slot]) ascm_pool_free_handle(pool, handles[slot]);
            handles[slot] = 0;
            break;
        }
        case 2:
            if (!live[1][slot] && ascm_buddy_alloc(buddy, req, align, &live[1][slot]) != ASCM_OK)
                live[1][slot] = 0;
            break;
        case 3:
            ascm_buddy_free(buddy, live[1][slot] ? live[1][slot] : req + (1ull << 32));
            live[1][slot] = 0;
            break;
        case 4: /* device: any policy value, any sizing mode; handed out to C at times */
            if (!live[2][slot] &&
                ascm_device_malloc(dev, req, (uint32_t)take(&data, &size, 4),
                                   (align & 0x1000) ? ASCM_SIZE_EXACT : (int)(align % 4),
                                   &live[2][slot], &kind, &events) != ASCM_OK)
                live[2][slot] = 0;
            else if (live[2][slot] && !marked[slot] && (align & 0x800)) {
                /* a fresh block carries no mark: the last free of its address took it */
                int64_t before = ascm_device_handed_out(dev);
                int fresh = !marked_at(live[2], marked, live[2][slot], 1);
                if (ascm_device_hand_out_block(dev, live[2][slot]) == ASCM_OK) {
                    handed_moved(dev, before, fresh, "handing a block out");
                    marked[slot] = 1;
                }
            }
            break;
        case 5: { /* device free, GIL-free or held; a guarded block refuses the GIL-free one */
            uint64_t a = live[2][slot] ? live[2][slot] : req;
            int guarded = (req & 2) && ascm_device_guard(dev, a) == ASCM_OK, held = (req & 4) != 0;
            int64_t before = ascm_device_handed_out(dev);
            int st = held ? ascm_device_free_held(dev, a, 0x1F, &kind) : ascm_device_free(dev, a, 0x1F, &kind);
            /* a free unmarks the block whichever way it goes; a refused one changes nothing */
            handed_moved(dev, before, st == ASCM_OK ? -marked_at(live[2], marked, a, 1) : 0, "a free");
            if (guarded && !held) {
                if (st == ASCM_OK) {
                    fprintf(stderr, "a guarded block was freed by the GIL-free free\n");
                    abort();
                }
                ascm_device_unguard(dev, a); /* refused, still live: a later free may go */
                break;
            }
            live[2][slot] = 0;
            marked[slot] = 0;
            break;
        }
        case 6: { /* batches longer than the 8 deferred map puts of alloc_many */
            uint64_t sizes[24], addrs[24];
            size_t n = 1 + slot % 24, done;
            for (size_t i = 0; i < n; i++) sizes[i] = (req >> (i % 5)) * (1 + i % 3) + (i & 1);
            ascm_stats before, after;
            ascm_pool_stats(pool, &before);
            if (ascm_pool_alloc_many(pool, sizes, n, align, addrs, &done) == ASCM_OK) {
                ascm_pool_free_many(pool, addrs, n, &done);
                break;
            }
            /* all or nothing: a refused batch gave its blocks back, its counters too */
            ascm_pool_stats(pool, &after);
            if (after.live_count != before.live_count || after.used != before.used ||
                after.alloc_count != before.alloc_count || after.free_count != before.free_count ||
                after.alloc_bytes != before.alloc_bytes || after.freed_bytes != before.freed_bytes) {
                fprintf(stderr, "a refused alloc_many changed the pool\n");
                abort();
            }
            break;
        }
        case 7: /* the device's lifecycle */
            if (slot % 8 == 0 && !closed) { /* reset: every pointer from before goes stale */
                uint64_t base[ASCM_KINDS];
                epoch++;
                for (int k = 0; k < ASCM_KINDS; k++) base[k] = (1ull << 40) + ((uint64_t)k << 32) + ((uint64_t)epoch << 28);
                if (ascm_device_reset(dev, base) != ASCM_OK) abort();
                memset(live[2], 0, sizeof live[2]);
                memset(marked, 0, sizeof marked);
                handed_moved(dev, 0, 0, "a reset");
            } else if (slot % 8 == 1) { /* callers arriving while the gate is shut are refused */
                uint64_t a;
                ascm_device_quiesce(dev);
                if (ascm_device_malloc(dev, 64, 0, 0, &a, &kind, &events) != ASCM_ERR_CLOSED) abort();
                if (ascm_device_enter(dev)) abort();
                ascm_device_reopen(dev);
                if (!closed && !ascm_device_enter(dev)) abort();
                if (!closed) ascm_device_leave(dev);
            } else if (slot % 8 == 2 && slot > 40) {
                ascm_device_close(dev);
                closed = 1;
            } else if (slot % 8 == 3) { /* fixed runtime memory taken or given back, any amount */
                ascm_budget b;
                ascm_device_budget(dev, &b);
                uint64_t before = b.fixed;
                int64_t delta = (int64_t)((req & 1) ? ~req : req) >> (req & 2 ? 0 : 8);
                int st = ascm_device_charge_fixed(dev, delta);
                ascm_device_budget(dev, &b);
                if (st != ASCM_OK ? b.fixed != before : b.fixed != before + (uint64_t)delta) abort();
                if (st == ASCM_OK && delta < 0 && 0 - (uint64_t)delta > before) abort(); /* more than taken */
            } else {
                ascm_device_trim(dev);
            }
            if (closed && ascm_device_free(dev, live[2][slot], 0x1F, &kind) != ASCM_ERR_CLOSED) abort();
            break;
        case 8: { /* nothing live in the pool: it must be whole again */
            ascm_stats st;
            for (unsigned i = 0; i < SLOTS; i++) {
                if (handles[i]) ascm_pool_free_handle(pool, handles[i]);
                else if (live[0][i]) ascm_pool_free(pool, live[0][i]);
            }
            memset(live[0], 0, sizeof live[0]);
            memset(handles, 0, sizeof handles);
            ascm_pool_stats(pool, &st);
            if (st.live_count == 0 && (st.largest_free != st.capacity || st.free != st.capacity)) {
                fprintf(stderr, "empty pool: largest_free %llu, free %llu of %llu\n",
                        (unsigned long long)st.largest_free, (unsigned long long)st.free,
                        (unsigned long long)st.capacity);
                abort();
            }
            break;
        }
        case 9: /* paged pool: allocations (padded too), some with the backend refusing */
            mirror_state.refuse = (align & 0x1000) != 0;
            if (!live[3][slot] && ascm_pool_alloc_padded(paged, req, req & 32, align, &live[3][slot]) != ASCM_OK)
                live[3][slot] = 0;
            mirror_state.refuse = 0;
            break;
        case 10:
            ascm_pool_free(paged, live[3][slot] ? live[3][slot] : req + (1ull << 36));
            live[3][slot] = 0;
            break;
        case 11: /* sleep and wake, valid or not, the backend refusing at times */
            mirror_state.refuse = (align & 0x2000) != 0;
            if (req & 1) ascm_pool_sleep(paged, live[3][slot] ? live[3][slot] : req, NULL);
            else ascm_pool_wake(paged, live[3][slot] ? live[3][slot] : req, NULL);
            mirror_state.refuse = 0;
            break;
        case 12: /* pool alloc by handle */
            if (!live[0][slot] &&
                ascm_pool_alloc_handle(pool, req, align, &live[0][slot], &handles[slot]) != ASCM_OK) {
                live[0][slot] = 0;
                handles[slot] = 0;
            }
            break;
        case 13: { /* free by handle: the slot's, twice at times, or bits from the input */
            ascm_handle h = handles[slot] ? handles[slot] : take(&data, &size, 8);
            int st = ascm_pool_free_handle(pool, h);
            if (h == handles[slot] && st == ASCM_OK) {
                if (req & 1) ascm_pool_free_handle(pool, h); /* stale now */
                live[0][slot] = 0;
                handles[slot] = 0;
            }
            break;
        }
        case 14: { /* relabel a block, valid or not: sizes near 2^64 whose pad wraps too */
            uint64_t a = live[0][slot] ? live[0][slot] : req;
            uint64_t want = (req & 1) ? ~req : req, pad = take(&data, &size, 1) % 80;
            ascm_pool_relabel(pool, a, want, pad, align);
            break;
        }
        case 15: { /* the paged pool's blocks handed over as stream reuse does, asleep or
                    * awake: a sleeping one must be refused (issue 45.1), and a block
                    * handed over must be mapped in full */
            uint64_t a = live[3][slot], usable;
            if (!a || ascm_pool_usable_size(paged, a, &usable) != ASCM_OK) break;
            if (req & 1) ascm_pool_sleep(paged, a, NULL);
            int asleep = ascm_pool_wake(paged, a, NULL) == ASCM_OK; /* it was asleep */
            if (asleep) ascm_pool_sleep(paged, a, NULL);            /* ...and is again */
            int st = ascm_pool_relabel(paged, a, usable - (req & 31), 0, 64);
            if (asleep && st == ASCM_OK) {
                fprintf(stderr, "paged pool: a sleeping block was handed over\n");
                abort();
            }
            for (uint64_t g = (a - (1ull << 36)) / GRANULE; st == ASCM_OK && g * GRANULE < a - (1ull << 36) + usable; g++)
                if (!mirror_state.mapped[g]) {
                    fprintf(stderr, "paged pool: a block handed over has granule %llu unmapped\n",
                            (unsigned long long)g);
                    abort();
                }
            break;
        }
        case 16: { /* nothing live in the paged pool: no more than the release threshold
                    * stays mapped, spare slabs included (issue 45.10).  The threshold
                    * read is the one in force now: with a cap it has adapted up from
                    * gc.release_threshold. */
            ascm_stats st;
            for (unsigned i = 0; i < SLOTS; i++)
                if (live[3][i]) ascm_pool_free(paged, live[3][i]);
            memset(live[3], 0, sizeof live[3]);
            ascm_pool_stats(paged, &st);
            uint64_t kept = ascm_pool_release_threshold(paged);
            if (st.live_count == 0 && st.mapped > kept) {
                fprintf(stderr, "empty paged pool at threshold %llu: %llu bytes mapped\n",
                        (unsigned long long)kept, (unsigned long long)st.mapped);
                abort();
            }
            break;
        }
        default:
            if (req & 1) ascm_pool_trim(pool);
            if (req & 2) ascm_pool_trim(paged);
            /* slab_max switched with blocks live: a block keeps the path it was
             * placed by (ascmem.h), which frees and checks must honour */
            if (req & 4) ascm_pool_set_slab_max(pool, (req >> 8) & 0xFFFF);
            if (req & 8) ascm_pool_set_slab_max(paged, (req >> 12) & 0xFFFF);
            if ((req & 16) && !closed) ascm_device_set_slab_max(dev, (req >> 4) & 0xFFFF);
            paged_agrees(paged, &mirror_state);
            must_check(ascm_pool_check(paged, msg, sizeof msg), "paged", msg);
            must_check(ascm_pool_check(pool, msg, sizeof msg), "pool", msg);
            must_check(ascm_buddy_check(buddy, msg, sizeof msg), "buddy", msg);
            if (!closed) { /* the budget and the pools agree (a freed block's deferred discharge too) */
                uint64_t charged, held;
                ascm_device_huge_pages(dev, &charged, &held);
                if (charged != held) {
                    fprintf(stderr, "device: %llu huge bytes charged, %llu held\n",
                            (unsigned long long)charged, (unsigned long long)held);
                    abort();
                }
            }
        }
    }
    must_check(ascm_pool_check(pool, msg, sizeof msg), "pool", msg);
    must_check(ascm_buddy_check(buddy, msg, sizeof msg), "buddy", msg);
    paged_agrees(paged, &mirror_state);
    must_check(ascm_pool_check(paged, msg, sizeof msg), "paged", msg);
    for (int k = 0; k < ASCM_KINDS; k++)
        if (ascm_device_pool(dev, k))
            must_check(ascm_pool_check(ascm_device_pool(dev, k), msg, sizeof msg), "device", msg);
    ascm_pool_destroy(pool);
    ascm_pool_destroy(paged);
    ascm_buddy_destroy(buddy);
    ascm_device_destroy(dev);
    return 0;
}
