/* C unit tests of the core, run by `make -C csrc test` under ASan and UBSan. */
#include "../ascmem.h"
#include "../internal.h" /* to corrupt metadata on purpose */
#include "../pool_core.h"
#include "../ascmem_acl_allocator.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#define BUDDY_OK(b) CHECK(ascm_buddy_check(b, msg, sizeof msg) == ASCM_OK || (fprintf(stderr, "  %s\n", msg), 0))

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void test_buddy_basic(void) {
    ascm_buddy *b;
    CHECK(ascm_buddy_create(0x10000000, 10 << 20, 4096, &b) == ASCM_OK); /* not a power of two */
    ascm_stats st;
    ascm_buddy_stats(b, &st);
    CHECK(st.largest_free == 8u << 20);
    uint64_t a, c;
    CHECK(ascm_buddy_alloc(b, 5u << 20, 64, &a) == ASCM_OK);
    ascm_buddy_stats(b, &st);
    CHECK(st.used == 5u << 20); /* exact size: 5 MiB costs 5 MiB, not 8 */
    /* the tail went back as 1 MiB at 5 MiB and 2 MiB at 6 MiB: lowest 2 MiB block first */
    CHECK(ascm_buddy_alloc(b, 2u << 20, 64, &c) == ASCM_OK && c == a + (6u << 20));
    BUDDY_OK(b);
    uint64_t sz;
    CHECK(ascm_buddy_usable_size(b, a, &sz) == ASCM_OK && sz == 5u << 20);
    CHECK(ascm_buddy_free(b, a + 4096) == ASCM_ERR_BADFREE);
    CHECK(ascm_buddy_free(b, a) == ASCM_OK);
    CHECK(ascm_buddy_free(b, a) == ASCM_ERR_BADFREE);
    CHECK(ascm_buddy_free(b, c) == ASCM_OK);
    ascm_buddy_stats(b, &st);
    CHECK(st.used == 0 && st.largest_free == 8u << 20 && st.live_count == 0);
    BUDDY_OK(b);
    CHECK(ascm_buddy_alloc(b, 0, 64, &a) == ASCM_ERR_INVAL);
    CHECK(ascm_buddy_alloc(b, 64, 3, &a) == ASCM_ERR_INVAL);
    CHECK(ascm_buddy_alloc(b, 11u << 20, 64, &a) == ASCM_ERR_NOMEM);
    CHECK(ascm_buddy_alloc(b, 4096, 1u << 20, &a) == ASCM_OK && a % (1u << 20) == 0);
    CHECK(ascm_buddy_free(b, a) == ASCM_OK);
    BUDDY_OK(b);
    ascm_buddy_destroy(b);
    CHECK(ascm_buddy_create(0, 4096 * 3, 1000, &b) == ASCM_ERR_INVAL);
    CHECK(ascm_buddy_create(100, 4096 * 3, 4096, &b) == ASCM_ERR_INVAL);
}

static void test_buddy_random(void) {
    ascm_buddy *b;
    CHECK(ascm_buddy_create(1u << 30, 3u << 20, 4096, &b) == ASCM_OK);
    uint64_t live[256] = {0};
    for (int step = 0; step < 20000; step++) {
        int i = (int)(next_rand() % 256);
        if (live[i]) {
            CHECK(ascm_buddy_free(b, live[i]) == ASCM_OK);
            live[i] = 0;
        } else {
            uint64_t size = 1 + next_rand() % (64u << 10);
            int st = ascm_buddy_alloc(b, size, 64, &live[i]);
            CHECK(st == ASCM_OK || st == ASCM_ERR_NOMEM);
            if (st != ASCM_OK) live[i] = 0;
        }
        if (step % 2000 == 0) BUDDY_OK(b);
    }
    for (int i = 0; i < 256; i++)
        if (live[i]) CHECK(ascm_buddy_free(b, live[i]) == ASCM_OK);
    ascm_stats st;
    ascm_buddy_stats(b, &st);
    CHECK(st.used == 0 && st.free == 3u << 20);
    BUDDY_OK(b);
    ascm_buddy_destroy(b);
}

static int64_t charged;
static int64_t charge_limit = -1;
static int charge(void *ctx, int64_t delta) {
    (void)ctx;
    if (delta > 0 && charge_limit >= 0 && charged + delta > charge_limit) return 1;
    charged += delta;
    return 0;
}

static void test_pool_basic(void) {
    ascm_pool *p;
    ascm_pool_config cfg = {.base = 1u << 30, .size = 64u << 20, .min_block = 4096,
                            .page_size = 2u << 20, .charge = charge};
    charged = 0;
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    uint64_t a, c, d, sz;
    CHECK(ascm_pool_alloc(p, 100, 64, &a) == ASCM_OK && a % 64 == 0);
    CHECK(ascm_pool_usable_size(p, a, &sz) == ASCM_OK && sz == 128);
    CHECK(ascm_pool_requested_size(p, a, &sz) == ASCM_OK && sz == 100);
    CHECK(ascm_pool_alloc(p, 5u << 20, 64, &c) == ASCM_OK);
    CHECK(ascm_pool_usable_size(p, c, &sz) == ASCM_OK && sz == 5u << 20);
    CHECK(ascm_pool_alloc(p, 1000, 128, &d) == ASCM_OK && d % 128 == 0);
    POOL_OK(p);
    ascm_stats st;
    ascm_pool_stats(p, &st);
    CHECK(st.live_count == 3 && st.requested == 100 + (5u << 20) + 1000);
    CHECK((int64_t)(st.pages_in_use * st.page_size) == charged);
    CHECK(ascm_pool_free(p, a + 64) == ASCM_ERR_BADFREE);
    CHECK(ascm_pool_free(p, c + 4096) == ASCM_ERR_BADFREE);
    CHECK(ascm_pool_free(p, 5) == ASCM_ERR_BADFREE);
    CHECK(ascm_pool_free(p, a) == ASCM_OK);
    CHECK(ascm_pool_free(p, a) == ASCM_ERR_BADFREE);
    CHECK(ascm_pool_free(p, c) == ASCM_OK);
    CHECK(ascm_pool_free(p, d) == ASCM_OK);
    POOL_OK(p);
    ascm_pool_stats(p, &st);
    CHECK(st.used == 0 && st.live_count == 0);
    /* 2 MiB pages: a spare slab would pin a whole page, so none is kept */
    CHECK(st.slab_bytes == 0 && charged == 0 && st.pages_in_use == 0 && st.free == st.capacity);
    CHECK(ascm_pool_alloc(p, 0, 64, &a) == ASCM_ERR_INVAL);
    CHECK(ascm_pool_alloc(p, 64, 48, &a) == ASCM_ERR_INVAL);
    CHECK(ascm_pool_alloc(p, 65u << 20, 64, &a) == ASCM_ERR_NOMEM);
    CHECK(ascm_pool_alloc(p, 64u << 20, 64, &a) == ASCM_OK); /* the whole range, one block */
    CHECK(ascm_pool_alloc(p, 64, 64, &c) == ASCM_ERR_NOMEM);
    CHECK(ascm_pool_free(p, a) == ASCM_OK);
    POOL_OK(p);
    /* budget refusal leaves nothing behind */
    charge_limit = 4u << 20;
    CHECK(ascm_pool_alloc(p, 3u << 20, 64, &a) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, 3u << 20, 64, &c) == ASCM_ERR_BUDGET);
    POOL_OK(p);
    CHECK(ascm_pool_free(p, a) == ASCM_OK);
    charge_limit = -1;
    ascm_pool_reset(p);
    POOL_OK(p);
    CHECK(charged == 0);
    ascm_pool_destroy(p);
}

/* The last large block freed is kept whole and taken back by a request of
 * exactly its size; nothing else may see a difference. */
static void test_pool_reuses_the_last_freed_large_block(void) {
    ascm_pool *p;
    ascm_pool_config cfg = {.base = 1u << 30, .size = 64u << 20, .min_block = 4096,
                            .page_size = 2u << 20, .charge = charge};
    charged = 0;
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    uint64_t a, b, c, sz;
    CHECK(ascm_pool_alloc(p, 64, 64, &c) == ASCM_OK);               /* a slab first */
    CHECK(ascm_pool_alloc(p, 3u << 20, 64, &a) == ASCM_OK);
    int64_t with_a = charged;
    CHECK(ascm_pool_free(p, a) == ASCM_OK);
    CHECK(charged < with_a);                       /* its pages are given back at once */
    POOL_OK(p);                                    /* check knows the kept block */
    CHECK(ascm_pool_free(p, a) == ASCM_ERR_BADFREE);    /* and it is not live */
    CHECK(ascm_pool_usable_size(p, a, &sz) == ASCM_ERR_BADFREE);
    CHECK(ascm_pool_alloc(p, (3u << 20) - 100, 64, &b) == ASCM_OK && b == a);
    CHECK(charged == with_a);
    CHECK(ascm_pool_requested_size(p, b, &sz) == ASCM_OK && sz == (3u << 20) - 100);
    POOL_OK(p);
    /* another size flushes it to best fit, which merges it with its neighbours */
    CHECK(ascm_pool_free(p, b) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, (3u << 20) + 4096, 64, &b) == ASCM_OK && b == a);
    CHECK(ascm_pool_free(p, b) == ASCM_OK);
    /* an alignment the kept block lacks is not served by it */
    uint64_t spacer;
    CHECK(ascm_pool_alloc(p, 512u << 10, 64, &spacer) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, 1u << 20, 64, &a) == ASCM_OK && a % (4u << 20) != 0);
    CHECK(ascm_pool_free(p, a) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, 1u << 20, 4u << 20, &b) == ASCM_OK && b != a && b % (4u << 20) == 0);
    CHECK(ascm_pool_free(p, b) == ASCM_OK);
    CHECK(ascm_pool_free(p, spacer) == ASCM_OK);
    /* statistics see every free byte */
    ascm_stats st;
    ascm_pool_stats(p, &st);
    CHECK(st.free + st.slab_bytes == st.capacity && st.largest_free + st.slab_bytes == st.capacity);
    /* a budget refusal on reuse leaves the kept block and the charge as they were */
    CHECK(ascm_pool_alloc(p, 2u << 20, 64, &a) == ASCM_OK);
    CHECK(ascm_pool_free(p, a) == ASCM_OK);
    int64_t before = charged;
    charge_limit = charged;
    CHECK(ascm_pool_alloc(p, 2u << 20, 64, &b) == ASCM_ERR_BUDGET);
    CHECK(charged == before);
    POOL_OK(p);
    charge_limit = -1;
    CHECK(ascm_pool_alloc(p, 2u << 20, 64, &b) == ASCM_OK);
    /* the same in a free-and-ask-again loop, where the reuse is in line
     * (pool.c, alloc_locked) and the kept block keeps its map entry */
    CHECK(ascm_pool_free(p, b) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, 2u << 20, 64, &a) == ASCM_OK && a == b);
    CHECK(ascm_pool_free(p, a) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, 2u << 20, 64, &a) == ASCM_OK && a == b); /* in line */
    CHECK(ascm_pool_usable_size(p, a, &sz) == ASCM_OK && sz == 2u << 20);
    POOL_OK(p);
    CHECK(ascm_pool_free(p, a) == ASCM_OK);
    before = charged;
    charge_limit = charged;
    CHECK(ascm_pool_alloc(p, 2u << 20, 64, &b) == ASCM_ERR_BUDGET);
    CHECK(charged == before);
    CHECK(ascm_pool_usable_size(p, a, &sz) == ASCM_ERR_BADFREE);
    POOL_OK(p);
    charge_limit = -1;
    CHECK(ascm_pool_alloc(p, 2u << 20, 64, &b) == ASCM_OK);
    CHECK(ascm_pool_usable_size(p, b, &sz) == ASCM_OK && sz == 2u << 20);
    /* a block freed by address keeps its map entry while kept: every lookup
     * by address must see it as free, and a reuse by handle or by a batch
     * must take the entry out, one by address after a free by handle put
     * it back */
    CHECK(ascm_pool_free(p, b) == ASCM_OK);
    CHECK(ascm_pool_relabel(p, b, 100, 0, 64) == ASCM_ERR_BADFREE);
    CHECK(ascm_pool_requested_size(p, b, &sz) == ASCM_ERR_BADFREE);
    POOL_OK(p);
    ascm_handle h;
    uint64_t ha;
    CHECK(ascm_pool_alloc_handle(p, 2u << 20, 64, &ha, &h) == ASCM_OK && ha == b); /* reused */
    POOL_OK(p);
    CHECK(ascm_pool_free(p, ha) == ASCM_ERR_BADFREE); /* known by its handle only */
    CHECK(ascm_pool_free_handle(p, h) == ASCM_OK);
    CHECK(ascm_pool_free_handle(p, h) == ASCM_ERR_BADFREE);
    POOL_OK(p);
    CHECK(ascm_pool_alloc(p, 2u << 20, 64, &b) == ASCM_OK && b == ha); /* by address again */
    CHECK(ascm_pool_usable_size(p, b, &sz) == ASCM_OK && sz == 2u << 20);
    POOL_OK(p);
    CHECK(ascm_pool_free(p, b) == ASCM_OK);
    uint64_t want = 2u << 20, got;
    size_t done;
    CHECK(ascm_pool_alloc_many(p, &want, 1, 64, &got, &done) == ASCM_OK && got == b);
    POOL_OK(p);
    CHECK(ascm_pool_free_many(p, &got, 1, &done) == ASCM_OK && done == 1);
    CHECK(ascm_pool_free(p, got) == ASCM_ERR_BADFREE);
    POOL_OK(p);
    CHECK(ascm_pool_alloc(p, 2u << 20, 64, &b) == ASCM_OK && b == got);
    /* the whole range is reachable while a block is kept */
    CHECK(ascm_pool_free(p, b) == ASCM_OK);
    CHECK(ascm_pool_free(p, c) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, 64u << 20, 64, &a) == ASCM_OK);
    CHECK(ascm_pool_free(p, a) == ASCM_OK);
    CHECK(ascm_pool_close_if_empty(p));
    POOL_OK(p);
    ascm_pool_stats(p, &st);
    CHECK(st.free == st.capacity && charged == 0);
    ascm_pool_reset(p);
    POOL_OK(p);
    ascm_pool_destroy(p);
}

/* Frees into the slab of the previous free skip the maps; that slab may be
 * released and its index reused by another class in between. */
static void test_pool_remembered_slab(void) {
    ascm_pool *p;
    ascm_pool_config cfg = {.base = 1u << 30, .size = 64u << 20, .min_block = 4096};
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    uint64_t a, b, c, big;
    CHECK(ascm_pool_alloc(p, 64, 64, &a) == ASCM_OK && ascm_pool_alloc(p, 64, 64, &b) == ASCM_OK);
    CHECK(ascm_pool_free(p, a) == ASCM_OK);             /* remembers a's slab */
    POOL_OK(p);
    CHECK(ascm_pool_free(p, a) == ASCM_ERR_BADFREE);    /* double free in the remembered slab */
    CHECK(ascm_pool_free(p, a + 32) == ASCM_ERR_BADFREE);
    CHECK(ascm_pool_free(p, b) == ASCM_OK);             /* the slab empties */
    CHECK(ascm_pool_trim(p) > 0);                       /* and goes back to best fit */
    POOL_OK(p);
    CHECK(ascm_pool_alloc(p, 3000, 64, &c) == ASCM_OK); /* another class, maybe the same index */
    CHECK(ascm_pool_alloc(p, 1u << 20, 64, &big) == ASCM_OK);
    CHECK(ascm_pool_free(p, a) == ASCM_ERR_BADFREE);
    CHECK(ascm_pool_free(p, c) == ASCM_OK);
    CHECK(ascm_pool_free(p, big) == ASCM_OK);
    POOL_OK(p);
    ascm_pool_reset(p);
    POOL_OK(p);
    ascm_pool_destroy(p);
}

/* ascm_pool_walk_held: runs in address order, apart (adjacent runs are one),
 * adding up to the pages in use: what a PyTorch snapshot's segments show. */
typedef struct {
    uint64_t bytes, end, runs;
    int ordered;
} held_sum;
static void add_held(void *ctx, uint64_t addr, uint64_t size, uint64_t requested) {
    held_sum *h = ctx;
    if (addr <= h->end && h->runs) h->ordered = 0;
    if (requested != 0 || size == 0) h->ordered = 0;
    h->bytes += size;
    h->end = addr + size;
    h->runs++;
}
static void held_matches_pages(ascm_pool *p) {
    held_sum h = {0, 0, 0, 1};
    ascm_pool_walk_held(p, add_held, &h);
    ascm_stats st;
    ascm_pool_stats(p, &st);
    CHECK(h.ordered);
    CHECK(h.bytes == (st.mapped ? st.mapped : st.pages_in_use * st.page_size));
}

/* The same on a paged pool that keeps freed granules mapped: kept granules
 * are held too. */
static void test_paged_held_runs(void) {
    ascm_pool_config cfg = {.base = 1ull << 36, .size = 1ull << 30, .min_block = 4096,
                            .page_size = 2u << 20, .paged = 1, .release_threshold = 16u << 20};
    ascm_pool *p;
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    enum { N = 256 };
    static uint64_t live[N];
    memset(live, 0, sizeof live);
    for (int step = 0; step < 20000; step++) {
        int i = (int)(next_rand() % N);
        if (live[i]) {
            CHECK(ascm_pool_free(p, live[i]) == ASCM_OK);
            live[i] = 0;
        } else if (ascm_pool_alloc(p, 1 + next_rand() % (6u << 20), 64, &live[i]) != ASCM_OK) {
            live[i] = 0;
        }
        if (step % 1000 == 0) held_matches_pages(p);
    }
    for (int i = 0; i < N; i++)
        if (live[i]) CHECK(ascm_pool_free(p, live[i]) == ASCM_OK);
    ascm_stats st;
    ascm_pool_stats(p, &st);
    CHECK(st.mapped > 0); /* kept under the threshold */
    held_matches_pages(p);
    POOL_OK(p);
    ascm_pool_destroy(p);
}

static void test_pool_random(void) {
    ascm_pool *p;
    ascm_pool_config cfg = {.base = 1u << 30, .size = 48u << 20, .min_block = 4096, .page_size = 2u << 20,
                            .charge = charge};
    charged = 0;
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    enum { N = 2048 };
    static uint64_t live[N];
    memset(live, 0, sizeof live);
    for (int step = 0; step < 200000; step++) {
        int i = (int)(next_rand() % N);
        if (live[i]) {
            CHECK(ascm_pool_free(p, live[i]) == ASCM_OK);
            live[i] = 0;
        } else {
            unsigned shift = 5 + (unsigned)(next_rand() % 17); /* 32 B .. 2 MiB, log-uniform */
            uint64_t size = 1 + next_rand() % (1ull << shift);
            uint64_t align = 1ull << (next_rand() % 9);
            int st = ascm_pool_alloc(p, size, align, &live[i]);
            CHECK(st == ASCM_OK || st == ASCM_ERR_NOMEM);
            if (st == ASCM_OK) CHECK(live[i] % align == 0);
            else live[i] = 0;
        }
        if (step % 20000 == 0) {
            POOL_OK(p);
            held_matches_pages(p);
        }
    }
    POOL_OK(p);
    held_matches_pages(p);
    size_t done;
    CHECK(ascm_pool_free_many(p, live, N, &done) == ASCM_ERR_BADFREE); /* zeros are not blocks */
    ascm_stats st;
    ascm_pool_stats(p, &st);
    CHECK(st.used == 0 && st.live_count == 0 && charged == (int64_t)(st.pages_in_use * st.page_size));
    CHECK(st.free + st.slab_bytes == st.capacity);
    POOL_OK(p);
    ascm_pool_destroy(p);
}

/* Handles: a random mix of blocks allocated by handle and by address, freed
 * each its own way (slab slots by handle or address alike), on a contiguous
 * and a paged pool; every wrong handle is refused with nothing changed. */
static void test_pool_handles(void) {
    for (int paged = 0; paged < 2; paged++) {
        ascm_pool *p;
        ascm_pool_config cfg = {.base = 1u << 30, .size = 48u << 20, .min_block = 4096,
                                .page_size = 2u << 20, .charge = charge, .paged = paged};
        charged = 0;
        CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
        enum { N = 1024 };
        static uint64_t addr[N];
        static ascm_handle handle[N]; /* 0: allocated by address */
        memset(addr, 0, sizeof addr);
        memset(handle, 0, sizeof handle);
        for (int step = 0; step < 100000; step++) {
            int i = (int)(next_rand() % N);
            if (addr[i]) {
                int by_handle = handle[i] != 0;
                int st = by_handle ? ascm_pool_free_handle(p, handle[i]) : ascm_pool_free(p, addr[i]);
                CHECK(st == ASCM_OK);
                if (by_handle) /* at once, before anything reuses its place: refused */
                    CHECK(ascm_pool_free_handle(p, handle[i]) == ASCM_ERR_BADFREE);
                addr[i] = 0;
                handle[i] = 0;
            } else {
                unsigned shift = 5 + (unsigned)(next_rand() % 17); /* 32 B .. 2 MiB */
                uint64_t size = 1 + next_rand() % (1ull << shift);
                uint64_t align = 1ull << (next_rand() % 9);
                int st;
                if (next_rand() & 1) {
                    st = ascm_pool_alloc_handle(p, size, align, &addr[i], &handle[i]);
                    if (st == ASCM_OK) CHECK(handle[i] != 0);
                } else {
                    st = ascm_pool_alloc(p, size, align, &addr[i]);
                }
                CHECK(st == ASCM_OK || st == ASCM_ERR_NOMEM);
                if (st == ASCM_OK) {
                    CHECK(addr[i] % align == 0);
                    uint64_t usable;
                    /* a large block by handle is not known by its address */
                    if (handle[i] && !(handle[i] >> 63))
                        CHECK(ascm_pool_usable_size(p, addr[i], &usable) == ASCM_ERR_BADFREE);
                } else {
                    addr[i] = 0;
                    handle[i] = 0;
                }
            }
            if (step % 10000 == 0) POOL_OK(p);
        }
        POOL_OK(p);
        ascm_stats before, after;
        ascm_pool_stats(p, &before);
        /* wrong handles: 0, each field out of range, a large block's handle
         * freed by address, a slab handle with a free slot */
        CHECK(ascm_pool_free_handle(p, 0) == ASCM_ERR_BADFREE);
        CHECK(ascm_pool_free_handle(p, ~0ull) == ASCM_ERR_BADFREE);
        CHECK(ascm_pool_free_handle(p, (1ull << 63) | (1ull << 16) | 0xffff) == ASCM_ERR_BADFREE);
        CHECK(ascm_pool_free_handle(p, 0x7fffffff00000000ull) == ASCM_ERR_BADFREE);
        for (int i = 0; i < N; i++) {
            if (handle[i] && !(handle[i] >> 63)) {
                CHECK(ascm_pool_free(p, addr[i]) == ASCM_ERR_BADFREE);
                CHECK(ascm_pool_free_handle(p, handle[i] + 1) == ASCM_ERR_BADFREE); /* wrong unit */
                break;
            }
        }
        ascm_pool_stats(p, &after);
        CHECK(after.live_count == before.live_count && after.used == before.used);
        POOL_OK(p);
        for (int i = 0; i < N; i++) {
            if (!addr[i]) continue;
            CHECK((handle[i] ? ascm_pool_free_handle(p, handle[i]) : ascm_pool_free(p, addr[i])) == ASCM_OK);
        }
        ascm_stats st;
        ascm_pool_stats(p, &st);
        CHECK(st.used == 0 && st.live_count == 0);
        CHECK(charged == (int64_t)((paged ? st.mapped : st.pages_in_use * st.page_size)));
        POOL_OK(p);
        /* a reset makes every handle stale */
        uint64_t a;
        ascm_handle h;
        CHECK(ascm_pool_alloc_handle(p, 1u << 20, 64, &a, &h) == ASCM_OK);
        ascm_pool_reset(p);
        CHECK(ascm_pool_free_handle(p, h) == ASCM_ERR_BADFREE);
        POOL_OK(p);
        ascm_pool_destroy(p);
    }
}

/* A paged pool's two regions (fit.c, pool_lifecycle.c): random mixed sizes
 * stay consistent; a block larger than a region joins free neighbours across
 * the boundary; an empty pool is whole again (largest_free = capacity) and
 * serves one block of its whole range. */
static void test_paged_regions(void) {
    ascm_pool *p;
    ascm_pool_config cfg = {.base = 1ull << 36, .size = 64u << 20, .min_block = 4096,
                            .page_size = 64u << 10, .paged = 1};
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    CHECK(p->fit.nregions == 2); /* 1024 granules: two regions of 512 */
    enum { N = 512 };
    static uint64_t live[N];
    memset(live, 0, sizeof live);
    for (int step = 0; step < 60000; step++) {
        int i = (int)(next_rand() % N);
        if (live[i]) {
            CHECK(ascm_pool_free(p, live[i]) == ASCM_OK);
            live[i] = 0;
        } else {
            unsigned shift = 5 + (unsigned)(next_rand() % 19); /* 32 B .. 8 MiB */
            uint64_t size = 1 + next_rand() % (1ull << shift);
            int st = ascm_pool_alloc(p, size, 64, &live[i]);
            CHECK(st == ASCM_OK || st == ASCM_ERR_NOMEM);
            if (st != ASCM_OK) live[i] = 0;
        }
        if (step % 5000 == 0) POOL_OK(p);
    }
    POOL_OK(p);
    for (int i = 0; i < N; i++)
        if (live[i]) CHECK(ascm_pool_free(p, live[i]) == ASCM_OK);
    ascm_stats st;
    ascm_pool_stats(p, &st);
    CHECK(st.live_count == 0 && st.free == st.capacity && st.largest_free == st.capacity);
    uint64_t a, b, c;
    CHECK(ascm_pool_alloc(p, 40u << 20, 64, &a) == ASCM_OK); /* over two regions: joined */
    CHECK(ascm_pool_alloc(p, 100u << 10, 64, &b) == ASCM_OK);
    POOL_OK(p);
    CHECK(ascm_pool_free(p, a) == ASCM_OK && ascm_pool_free(p, b) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, 64u << 20, 64, &c) == ASCM_OK && c == cfg.base); /* the whole range */
    POOL_OK(p);
    CHECK(ascm_pool_free(p, c) == ASCM_OK);
    ascm_pool_stats(p, &st);
    CHECK(st.largest_free == st.capacity && st.mapped == 0);
    POOL_OK(p);
    ascm_pool_reset(p);
    POOL_OK(p);
    ascm_pool_destroy(p);
}

/* The granule rules of fit.c: a block that fills its last granule all but a
 * sixteenth starts at a granule boundary; one of one to sixteen granules
 * takes the place in its hole that spans the fewest granules. */
/* Paged pools: a block of a quarter granule or more, under a granule, of
 * a size freed before goes where it maps no granule (fit.c, "mapped
 * granules first"); a size never freed takes best fit's place; and the kept
 * block is not reused in place when its granules went. */
static void test_paged_mapped_first(void) {
    const uint64_t U = 4096, G = 2u << 20, B = 1ull << 36; /* 512 units a granule */
    ascm_pool_config cfg = {.base = B, .size = 2ull << 30, .min_block = U, .page_size = G, .paged = 1};
    ascm_pool *p;
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    CHECK(p->fit.nregions == 2);
    /* units: a [0, 400) t1a, t1b [400, 1100) b [1100, 1200) t2a, t2b [1200, 2000) c [2000, 2100) */
    const uint64_t sizes[7] = {400, 350, 350, 100, 400, 400, 100};
    uint64_t at[7], x, y;
    for (int i = 0, off = 0; i < 7; off += (int)sizes[i], i++)
        CHECK(ascm_pool_alloc(p, sizes[i] * U, 64, &at[i]) == ASCM_OK && at[i] == B + off * U);
    /* holes [400, 1100) over granule 1, which nothing holds now, and
     * [1200, 2000) in granules 2 and 3, which b and c hold */
    for (int i = 4; i < 6; i++) CHECK(ascm_pool_free(p, at[i]) == ASCM_OK);
    for (int i = 1; i < 3; i++) CHECK(ascm_pool_free(p, at[i]) == ASCM_OK);
    ascm_stats st;
    ascm_pool_stats(p, &st);
    CHECK(st.mapped == 4 * G); /* granules 0, 2, 3, 4 */
    /* 400 units were freed before: not best fit's [400, 800), which maps
     * granule 1, but [1200, 1600) */
    CHECK(ascm_pool_alloc(p, 400 * U, 64, &x) == ASCM_OK && x == B + 1200 * U);
    ascm_pool_stats(p, &st);
    CHECK(st.mapped == 4 * G);
    POOL_OK(p);
    CHECK(ascm_pool_free(p, x) == ASCM_OK);
    /* 380 units never were: best fit */
    CHECK(ascm_pool_alloc(p, 380 * U, 64, &y) == ASCM_OK && y == B + 400 * U);
    ascm_pool_stats(p, &st);
    CHECK(st.mapped == 5 * G);
    POOL_OK(p);
    ascm_pool_destroy(p);

    /* The kept block: u [0, 200) h [200, 450) v [450, 512) k [512, 762) w [762, 1024) */
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    const uint64_t sizes2[5] = {200, 250, 62, 250, 262};
    for (int i = 0, off = 0; i < 5; off += (int)sizes2[i], i++)
        CHECK(ascm_pool_alloc(p, sizes2[i] * U, 64, &at[i]) == ASCM_OK && at[i] == B + off * U);
    CHECK(ascm_pool_free(p, at[1]) == ASCM_OK); /* a hole in granule 0, which u and v hold */
    CHECK(ascm_pool_free(p, at[4]) == ASCM_OK);
    CHECK(ascm_pool_free(p, at[3]) == ASCM_OK); /* kept (a statistics call would hand it
                                                  * to best fit); granule 1 unmapped */
    /* in place it would map granule 1 again: into the hole instead */
    CHECK(ascm_pool_alloc(p, 250 * U, 64, &x) == ASCM_OK && x == B + 200 * U);
    ascm_pool_stats(p, &st);
    CHECK(st.mapped == G);
    POOL_OK(p);
    /* reused in place while its granule stays mapped: v's neighbour freed and taken again */
    CHECK(ascm_pool_free(p, x) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, 250 * U, 64, &y) == ASCM_OK && y == x);
    POOL_OK(p);
    CHECK(p->sizes_freed[250 >> 6] >> (250 & 63) & 1);
    ascm_pool_reset(p); /* forgets the sizes freed */
    CHECK(!(p->sizes_freed[250 >> 6] >> (250 & 63) & 1));
    /* a kept block neither of whose edge granules is mapped any more goes
     * back to best fit (which, the pool empty, gives the same place), not
     * reused in place */
    CHECK(ascm_pool_alloc(p, 250 * U, 64, &x) == ASCM_OK && x == B);
    CHECK(ascm_pool_free(p, x) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, 250 * U, 64, &y) == ASCM_OK && y == x && !p->kept_reused);
    POOL_OK(p);
    ascm_pool_destroy(p);
}

/* A paged pool of 64 MiB in 64 KiB granules: blocks of a granule or more
 * go to its second region, the upper half (pool_lifecycle.c). */
static ascm_pool *granule_pool(void) {
    ascm_pool *p = NULL;
    ascm_pool_config cfg = {.base = 1ull << 36, .size = 64u << 20, .min_block = 4096,
                            .page_size = 64u << 10, .paged = 1};
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    CHECK(p->fit.nregions == 2);
    return p;
}

static void test_paged_granule_placement(void) {
    const uint64_t G = 64u << 10, R1 = (1ull << 36) + (32u << 20); /* the large blocks' region */
    ascm_pool *p = granule_pool();
    uint64_t left, m1, m2, right, x, y, z;
    /* blocks of 1.75, 1.125, 1.125, 1.5 granules, end to end */
    CHECK(ascm_pool_alloc(p, G * 7 / 4, 64, &left) == ASCM_OK && left == R1);
    CHECK(ascm_pool_alloc(p, G * 9 / 8, 64, &m1) == ASCM_OK && m1 == R1 + G * 7 / 4);
    CHECK(ascm_pool_alloc(p, G * 9 / 8, 64, &m2) == ASCM_OK && m2 == R1 + G * 23 / 8);
    CHECK(ascm_pool_alloc(p, G * 3 / 2, 64, &right) == ASCM_OK && right == R1 + 4 * G);
    /* a hole of [1.75, 4) granules: 1.5 granules at its start would span
     * granules 1-3, at the granule boundary 2 only 2-3 */
    CHECK(ascm_pool_free(p, m1) == ASCM_OK && ascm_pool_free(p, m2) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, G * 3 / 2, 64, &x) == ASCM_OK && x == R1 + 2 * G);
    ascm_stats st;
    ascm_pool_stats(p, &st);
    CHECK(st.mapped == 6 * G); /* left 2 + x 2 (2-3) + right 2 (4-5) */
    POOL_OK(p);
    /* a request with an alignment of its own is placed as before */
    uint64_t w;
    CHECK(ascm_pool_alloc(p, G * 3 / 2, 8192, &w) == ASCM_OK && w % 8192 == 0);
    POOL_OK(p);
    ascm_pool_destroy(p);
    /* 2.5 granules, then 4 granules less one unit: at the next boundary
     * (3), not end to end (2.5), where it would pin 5 granules */
    p = granule_pool();
    CHECK(ascm_pool_alloc(p, G * 5 / 2, 64, &y) == ASCM_OK && y == R1);
    CHECK(ascm_pool_alloc(p, 4 * G - 4096, 64, &z) == ASCM_OK && z == R1 + 3 * G);
    ascm_pool_stats(p, &st);
    CHECK(st.mapped == 7 * G); /* y 3 + z 4 */
    POOL_OK(p);
    ascm_pool_destroy(p);
    /* six granules and more from the top of the region (fit.c, large
     * blocks from the top): 8.5 granules against the end; 8.75 below it
     * would span 10 granules against it, 9 from the granule boundary 18
     * below the top or ending at the boundary 9 below it (the higher) */
    const uint64_t T = (1ull << 36) + (64u << 20);
    p = granule_pool();
    uint64_t hi1, hi2, lo;
    CHECK(ascm_pool_alloc(p, G * 17 / 2, 64, &hi1) == ASCM_OK && hi1 == T - G * 17 / 2);
    CHECK(ascm_pool_alloc(p, G * 35 / 4, 64, &hi2) == ASCM_OK && hi2 == T - G * 71 / 4);
    CHECK(ascm_pool_alloc(p, 2 * G, 64, &lo) == ASCM_OK && lo == R1); /* under six: the low end */
    ascm_pool_stats(p, &st);
    CHECK(st.mapped == 20 * G); /* 9 + 9 + 2 */
    POOL_OK(p);
    ascm_pool_destroy(p);
}

/* Packed placement (ascm_pool_set_placement): blocks of 1.75 granules
 * allocated in a row go end to end and share their edge granules (14
 * granules for eight), where the granule rules start each on a boundary
 * (16).  Only paged pools take it; other values are refused. */
static void test_paged_packed_placement(void) {
    const uint64_t G = 64u << 10, R1 = (1ull << 36) + (32u << 20);
    for (int packed = 0; packed < 2; packed++) {
        ascm_pool *p = granule_pool();
        if (packed) CHECK(ascm_pool_set_placement(p, ASCM_PLACE_PACKED) == ASCM_OK);
        for (uint64_t i = 0, a; i < 8; i++)
            CHECK(ascm_pool_alloc(p, G * 7 / 4, 64, &a) == ASCM_OK &&
                  a == R1 + i * (packed ? G * 7 / 4 : 2 * G));
        ascm_stats st;
        ascm_pool_stats(p, &st);
        CHECK(st.mapped == (packed ? 14 : 16) * G);
        POOL_OK(p);
        CHECK(ascm_pool_set_placement(p, 2) == ASCM_ERR_INVAL);
        ascm_pool_destroy(p);
    }
    ascm_pool *c;
    ascm_pool_config cfg = {.base = 1u << 20, .size = 16u << 20, .min_block = 4096};
    CHECK(ascm_pool_create(&cfg, &c) == ASCM_OK);
    CHECK(ascm_pool_set_placement(c, ASCM_PLACE_PACKED) == ASCM_ERR_INVAL);
    CHECK(ascm_pool_set_placement(c, ASCM_PLACE_GRANULES) == ASCM_ERR_INVAL);
    ascm_pool_destroy(c);
}

/* Best-fit placement (ascm_pool_set_placement): a block of 3/4 granule and
 * one of a granule and a quarter go end to end from the start of the range,
 * as plain best fit puts them, and map two granules; the other placements
 * keep them in their size-class regions, three.  Freed and asked for again,
 * the large block goes back to best fit (there is no kept block to reuse):
 * the same place here. */
static void test_paged_best_fit_placement(void) {
    const uint64_t G = 64u << 10, B = 1ull << 36, R1 = B + (32u << 20);
    const int placements[] = {ASCM_PLACE_GRANULES, ASCM_PLACE_PACKED, ASCM_PLACE_BEST_FIT};
    for (int i = 0; i < 3; i++) {
        int best_fit = placements[i] == ASCM_PLACE_BEST_FIT;
        ascm_pool *p = granule_pool();
        CHECK(ascm_pool_set_placement(p, placements[i]) == ASCM_OK);
        CHECK(ascm_pool_placement(p) == placements[i]);
        uint64_t small, large, again;
        CHECK(ascm_pool_alloc(p, G * 3 / 4, 64, &small) == ASCM_OK && small == B); /* over ASCM_SLAB_MAX */
        CHECK(ascm_pool_alloc(p, G * 5 / 4, 64, &large) == ASCM_OK && large == (best_fit ? B + G * 3 / 4 : R1));
        ascm_stats st;
        ascm_pool_stats(p, &st);
        CHECK(st.mapped == (best_fit ? 2 : 3) * G);
        POOL_OK(p);
        ascm_pool_free(p, large);
        CHECK(ascm_pool_alloc(p, G * 5 / 4, 64, &again) == ASCM_OK && again == large);
        POOL_OK(p);
        ascm_pool_destroy(p);
    }
    ascm_pool *c;
    ascm_pool_config cfg = {.base = 1u << 20, .size = 16u << 20, .min_block = 4096};
    CHECK(ascm_pool_create(&cfg, &c) == ASCM_OK);
    CHECK(ascm_pool_set_placement(c, ASCM_PLACE_BEST_FIT) == ASCM_ERR_INVAL); /* paged pools' */
    ascm_pool_destroy(c);
}

/* Contiguous placements (ascm_pool_set_placement): where a request of the
 * kept block's size goes.  Three layouts, each 1 MiB request (M) made
 * right after the kept block K was freed:
 *   equal: a free block of K's size lies lower -- KEPT_IN_PLACE reuses K,
 *          the other two take the lower block;
 *   above: a free 1.25 M block lies lower and K's upper neighbour is free --
 *          only KEPT_TO_BEST_FIT leaves K (merged, it is no longer the best fit);
 *   hole:  a free 0.5 M block lies just below K -- KEPT_IN_PLACE moves K
 *          down into it (Note [The kept block]), LOWEST_EQUAL keeps it.
 * A paged pool's placements are refused, as are other values. */
static uint64_t place_after_kept(int placement, const uint64_t *sizes, int n, const int *frees,
                                 int nfrees) {
    const uint64_t M = 1u << 20;
    ascm_pool *p;
    ascm_pool_config cfg = {.base = 1u << 30, .size = 64u << 20, .min_block = 4096};
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    CHECK(ascm_pool_set_placement(p, placement) == ASCM_OK);
    uint64_t a[8], got = 0;
    for (int i = 0; i < n; i++) CHECK(ascm_pool_alloc(p, sizes[i], 64, &a[i]) == ASCM_OK);
    for (int i = 0; i < nfrees; i++) CHECK(ascm_pool_free(p, a[frees[i]]) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, M, 64, &got) == ASCM_OK);
    POOL_OK(p);
    ascm_pool_destroy(p);
    return got - (1u << 30);
}

static void test_contiguous_placements(void) {
    const uint64_t M = 1u << 20;
    const uint64_t equal[] = {M, M, M, M};                 /* at 0, 1, 2, 3 M */
    const int equal_frees[] = {0, 2};                      /* K at 2 M, 1 M free at 0 */
    const uint64_t above[] = {M * 5 / 4, M, M, M, M};      /* at 0, 1.25, 2.25, 3.25, 4.25 M */
    const int above_frees[] = {0, 3, 2};                   /* K at 2.25 M, 3.25 M free above it */
    const uint64_t hole[] = {M, M / 2, M, M};              /* at 0, 1, 1.5, 2.5 M */
    const int hole_frees[] = {1, 2};                       /* K at 1.5 M, 0.5 M free below it */
    const int places[] = {ASCM_PLACE_KEPT_IN_PLACE, ASCM_PLACE_KEPT_TO_BEST_FIT,
                          ASCM_PLACE_LOWEST_EQUAL};
    const uint64_t want_equal[] = {2 * M, 0, 0};
    const uint64_t want_above[] = {M * 9 / 4, 0, M * 9 / 4};
    const uint64_t want_hole[] = {M, M, M * 3 / 2};
    for (int k = 0; k < 3; k++) {
        CHECK(place_after_kept(places[k], equal, 4, equal_frees, 2) == want_equal[k]);
        CHECK(place_after_kept(places[k], above, 5, above_frees, 3) == want_above[k]);
        CHECK(place_after_kept(places[k], hole, 4, hole_frees, 2) == want_hole[k]);
    }
    /* BEST_FIT_END_LAST reuses nothing in place, as KEPT_TO_BEST_FIT */
    CHECK(place_after_kept(ASCM_PLACE_BEST_FIT_END_LAST, equal, 4, equal_frees, 2) == 0);
    CHECK(place_after_kept(ASCM_PLACE_BEST_FIT_END_LAST, above, 5, above_frees, 3) == 0);
    /* 3, 1 and 3 MiB from 0 in an 8 MiB pool, the first freed: the free end
     * (1 MiB at 7 MiB) is best fit's choice for 0.5 MiB, and the default's
     * too (an end under six times the request is not spared); the wilderness
     * rule takes the 3 MiB hole at 0 first */
    const uint64_t ends[] = {3 * M, M, 3 * M};
    const int ends_frees[] = {0};
    uint64_t end_at[2];
    for (int k = 0; k < 2; k++) {
        ascm_pool *e;
        ascm_pool_config ecfg = {.base = 1u << 30, .size = 8u << 20, .min_block = 4096};
        uint64_t a[3];
        CHECK(ascm_pool_create(&ecfg, &e) == ASCM_OK);
        CHECK(ascm_pool_set_placement(e, k ? ASCM_PLACE_BEST_FIT_END_LAST : ASCM_PLACE_KEPT_IN_PLACE) ==
              ASCM_OK);
        for (int i = 0; i < 3; i++) CHECK(ascm_pool_alloc(e, ends[i], 64, &a[i]) == ASCM_OK);
        CHECK(ascm_pool_free(e, a[ends_frees[0]]) == ASCM_OK);
        CHECK(ascm_pool_alloc(e, M / 2, 64, &end_at[k]) == ASCM_OK);
        POOL_OK(e);
        ascm_pool_destroy(e);
        end_at[k] -= 1u << 30;
    }
    CHECK(end_at[0] == 7 * M);
    CHECK(end_at[1] == 0);
    ascm_pool *c;
    ascm_pool_config cfg = {.base = 1u << 20, .size = 16u << 20, .min_block = 4096};
    CHECK(ascm_pool_create(&cfg, &c) == ASCM_OK);
    CHECK(ascm_pool_set_placement(c, ASCM_PLACE_BEST_FIT_END_LAST) == ASCM_OK);
    CHECK(ascm_pool_placement(c) == ASCM_PLACE_BEST_FIT_END_LAST);
    CHECK(ascm_pool_set_placement(c, 7) == ASCM_ERR_INVAL);
    CHECK(ascm_pool_set_placement(c, ASCM_PLACE_GRANULES) == ASCM_ERR_INVAL);
    CHECK(ascm_pool_set_placement(c, 5) == ASCM_ERR_INVAL);
    CHECK(ascm_pool_set_placement(c, -1) == ASCM_ERR_INVAL);
    ascm_pool_destroy(c);
    ascm_pool *g = granule_pool();
    CHECK(ascm_pool_set_placement(g, ASCM_PLACE_KEPT_TO_BEST_FIT) == ASCM_ERR_INVAL);
    CHECK(ascm_pool_set_placement(g, ASCM_PLACE_LOWEST_EQUAL) == ASCM_ERR_INVAL);
    CHECK(ascm_pool_set_placement(g, ASCM_PLACE_BEST_FIT_END_LAST) == ASCM_ERR_INVAL);
    ascm_pool_destroy(g);
}

static void test_pool_batch(void) {
    ascm_pool *p;
    ascm_pool_config cfg = {.base = 1u << 20, .size = 16u << 20, .min_block = 4096};
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    uint64_t sizes[1000], addrs[1000];
    for (int i = 0; i < 1000; i++) sizes[i] = 1 + next_rand() % 20000;
    size_t done;
    CHECK(ascm_pool_alloc_many(p, sizes, 1000, 64, addrs, &done) == ASCM_OK && done == 1000);
    POOL_OK(p);
    CHECK(ascm_pool_free_many(p, addrs, 1000, &done) == ASCM_OK && done == 1000);
    POOL_OK(p);
    /* a refused batch is all or nothing (issue 45.11): its blocks are given
     * back and the allocation and free counters are as before the call */
    ascm_stats before, st;
    ascm_pool_stats(p, &before);
    sizes[10] = 0;
    CHECK(ascm_pool_alloc_many(p, sizes, 1000, 64, addrs, &done) == ASCM_ERR_INVAL && done == 10);
    ascm_pool_stats(p, &st);
    CHECK(st.live_count == 0 && st.used == 0 && st.alloc_count == before.alloc_count &&
          st.free_count == before.free_count && st.alloc_bytes == before.alloc_bytes &&
          st.freed_bytes == before.freed_bytes && st.failed_count == before.failed_count);
    POOL_OK(p);
    /* large blocks reach the block map a few allocations late (alloc_many
     * prefetches their slots): a batch that runs out of room must still have
     * put every block it handed out, for the undo to find */
    for (int i = 0; i < 1000; i++) sizes[i] = (i % 3 ? 40000 : 1) + next_rand() % 300000;
    CHECK(ascm_pool_alloc_many(p, sizes, 1000, 64, addrs, &done) == ASCM_ERR_NOMEM);
    CHECK(done > 20 && done < 1000);
    POOL_OK(p);
    ascm_pool_stats(p, &st);
    CHECK(st.live_count == 0 && st.used == 0 && st.alloc_count == before.alloc_count &&
          st.free_count == before.free_count && st.alloc_requested == before.alloc_requested &&
          st.freed_requested == before.freed_requested && st.failed_count == before.failed_count + 1);
    /* free_many with a double free and a foreign address frees the rest */
    CHECK(ascm_pool_alloc_many(p, sizes, 20, 64, addrs, &done) == ASCM_OK && done == 20);
    size_t n = done;
    addrs[n] = addrs[0];
    addrs[n + 1] = 12345;
    CHECK(ascm_pool_free_many(p, addrs, n + 2, &done) == ASCM_ERR_BADFREE && done == n);
    POOL_OK(p);
    ascm_pool_stats(p, &st);
    CHECK(st.live_count == 0 && st.used == 0);
    /* a request larger than the pool counts as failed (issue 43.7), through
     * every entry; a malformed one does not */
    uint64_t a, big = cfg.size + 1, one = 1;
    ascm_handle h;
    CHECK(ascm_pool_alloc(p, big, 64, &a) == ASCM_ERR_NOMEM);
    CHECK(ascm_pool_alloc_padded(p, big, 32, 64, &a) == ASCM_ERR_NOMEM);
    CHECK(ascm_pool_alloc_handle(p, big, 64, &a, &h) == ASCM_ERR_NOMEM);
    CHECK(ascm_pool_alloc_many(p, &big, 1, 64, &a, &done) == ASCM_ERR_NOMEM && done == 0);
    CHECK(ascm_pool_alloc(p, one, 3, &a) == ASCM_ERR_INVAL);
    ascm_pool_stats(p, &before);
    CHECK(before.failed_count == st.failed_count + 4);
    POOL_OK(p);
    ascm_pool_destroy(p);
}

/* Fill to the last byte, fail cleanly, drain; 1,000,000 operations in all.
 * Statistics must not drift and the metadata must stay flat. */
static void test_exhaustion_soak(void) {
    ascm_pool *p;
    ascm_pool_config cfg = {.base = 1u << 30, .size = 4u << 20, .min_block = 4096,
                            .page_size = 2u << 20};
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    enum { MAXN = 20000 };
    static uint64_t addrs[MAXN];
    uint64_t ops = 0, meta_first = 0, meta_most = 0;
    int cycles = 0;
    while (ops < 1000000) {
        int n = 0;
        for (;;) { /* fill with mixed sizes until nothing fits */
            uint64_t size = 1 + next_rand() % (n % 3 ? 3000 : 200000);
            int st = ascm_pool_alloc(p, size, 64, &addrs[n]);
            ops++;
            if (st != ASCM_OK) {
                CHECK(st == ASCM_ERR_NOMEM);
                break;
            }
            if (++n == MAXN) break;
        }
        for (;;) { /* then small requests to the last byte */
            int st = ascm_pool_alloc(p, 32, 32, &addrs[n]);
            ops++;
            if (st != ASCM_OK || ++n == MAXN) break;
        }
        for (int i = n - 1; i >= 0; i--, ops++) CHECK(ascm_pool_free(p, addrs[i]) == ASCM_OK);
        ascm_pool_trim(p);
        ascm_stats st;
        ascm_pool_stats(p, &st);
        CHECK(st.used == 0 && st.requested == 0 && st.live_count == 0);
        CHECK(st.free == st.capacity && st.largest_free == st.capacity && st.pages_in_use == 0);
        if (cycles++ == 3) meta_first = st.metadata_bytes; /* after warm-up growth */
        /* flat, but for one idle slab descriptor each class may keep (slab.c) */
        if (cycles > 4) CHECK(st.metadata_bytes <= meta_first + ASCM_SLAB_CLASSES * 1024);
        if (cycles > 4 && st.metadata_bytes > meta_most) meta_most = st.metadata_bytes;
    }
    POOL_OK(p);
    printf("soak: %llu operations in %d fill/drain cycles, metadata %llu -> at most %llu bytes\n",
           (unsigned long long)ops, cycles, (unsigned long long)meta_first, (unsigned long long)meta_most);
    ascm_pool_destroy(p);
}

/* check() must notice metadata broken on purpose. */
static void test_check_detects_corruption(void) {
    ascm_pool *p;
    ascm_pool_config cfg = {.base = 1u << 30, .size = 8u << 20, .min_block = 4096};
    uint64_t a, b, c;
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, 100, 64, &a) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, 1u << 20, 64, &b) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, 50000, 64, &c) == ASCM_OK);
    POOL_OK(p);
    uint32_t node = ascm_map_get(&p->blocks, (uint32_t)((b - p->base) >> p->gshift));
    CHECK(node != 0);
    p->fit.nodes[node].len++; /* a block that overlaps its neighbour */
    CHECK(ascm_pool_check(p, msg, sizeof msg) == ASCM_ERR_CORRUPT);
    p->fit.nodes[node].len--;
    POOL_OK(p);
    uint32_t si = ascm_slab_at(p, a - p->base);
    CHECK(si != 0);
    ascm_slab *s = p->slabs[si];
    s->bits[0] ^= 2; /* a slot marked used that nobody holds */
    CHECK(ascm_pool_check(p, msg, sizeof msg) == ASCM_ERR_CORRUPT);
    s->bits[0] ^= 2;
    p->used += 64; /* statistics that disagree with the blocks */
    CHECK(ascm_pool_check(p, msg, sizeof msg) == ASCM_ERR_CORRUPT);
    p->used -= 64;
    uint32_t inside = (uint32_t)((c - p->base) >> p->gshift) + 1;
    CHECK(ascm_map_reserve(&p->blocks, 1) == ASCM_OK);
    ascm_map_put(&p->blocks, inside, node); /* a map entry inside a block */
    CHECK(ascm_pool_check(p, msg, sizeof msg) == ASCM_ERR_CORRUPT);
    CHECK(ascm_map_take(&p->blocks, inside) == node);
    POOL_OK(p);
    CHECK(ascm_pool_free(p, c + 4096) == ASCM_ERR_BADFREE); /* inside a block: not a block */
    CHECK(ascm_pool_free(p, a + 1) == ASCM_ERR_BADFREE);    /* inside a slot */
    POOL_OK(p);
    ascm_pool_destroy(p);
}

/* check() covers the state the placement choice and the adaptive threshold
 * added: a placement byte of the other kind of pool (a paged pool's kept
 * block would go to a one-region scan), and the adaptive counters. */
static void test_check_detects_bad_placement_and_adaptive_state(void) {
    ascm_pool *c, *g;
    ascm_pool_config cc = {.base = 1u << 30, .size = 8u << 20, .min_block = 4096};
    ascm_pool_config gc = {.base = 1ull << 36, .size = 64u << 20, .min_block = 4096,
                           .page_size = 2u << 20, .paged = 1, .release_threshold = 4u << 20};
    CHECK(ascm_pool_create(&cc, &c) == ASCM_OK);
    CHECK(ascm_pool_create(&gc, &g) == ASCM_OK);
    CHECK(ascm_pool_set_release_cap(g, 16u << 20) == ASCM_OK);
    POOL_OK(c);
    POOL_OK(g);
    c->placement = ASCM_PLACE_PACKED;
    CHECK(ascm_pool_check(c, msg, sizeof msg) == ASCM_ERR_CORRUPT);
    c->placement = ASCM_PLACE_BEST_FIT; /* a paged pool's */
    CHECK(ascm_pool_check(c, msg, sizeof msg) == ASCM_ERR_CORRUPT);
    c->placement = 9;
    CHECK(ascm_pool_check(c, msg, sizeof msg) == ASCM_ERR_CORRUPT);
    c->placement = ASCM_PLACE_LOWEST_EQUAL;
    POOL_OK(c);
    g->placement = ASCM_PLACE_LOWEST_EQUAL;
    CHECK(ascm_pool_check(g, msg, sizeof msg) == ASCM_ERR_CORRUPT);
    g->placement = ASCM_PLACE_BEST_FIT;
    POOL_OK(g);
    g->placement = 9;
    CHECK(ascm_pool_check(g, msg, sizeof msg) == ASCM_ERR_CORRUPT);
    g->placement = ASCM_PLACE_PACKED;
    POOL_OK(g);
    g->paging->given_back = g->paging->cap_pages + 1;
    CHECK(ascm_pool_check(g, msg, sizeof msg) == ASCM_ERR_CORRUPT);
    g->paging->given_back = 0;
    g->paging->period_shift = 0;
    CHECK(ascm_pool_check(g, msg, sizeof msg) == ASCM_ERR_CORRUPT);
    g->paging->period_shift = 1;
    POOL_OK(g);
    ascm_pool_destroy(c);
    ascm_pool_destroy(g);
}

/* A growable kind: the hook hands out 8 MiB chunks from a fake upstream of
 * four; empty chunks go back; a request for the whole upstream then fits. */
typedef struct fake_upstream {
    ascm_device *d;
    uint64_t next, taken, limit;
    int calls;
} fake_upstream;

static int grow_hook(void *ctx, int kind, uint64_t size, uint64_t align, uint64_t generation) {
    fake_upstream *u = ctx;
    (void)align;
    (void)generation;
    u->calls++;
    uint64_t chunk = (size + (2u << 20) - 1) & ~((2ull << 20) - 1);
    if (chunk < (8u << 20)) chunk = 8u << 20;
    if (u->taken + chunk > u->limit) {
        uint64_t bases[ASCM_MAX_CHUNKS], sizes[ASCM_MAX_CHUNKS];
        int n = 0;
        CHECK(ascm_device_release_empty(u->d, kind, bases, sizes, ASCM_MAX_CHUNKS, &n) == ASCM_OK);
        for (int i = 0; i < n; i++) u->taken -= sizes[i];
        if (u->taken + chunk > u->limit) return ASCM_ERR_NOMEM;
    }
    int st = ascm_device_add_chunk(u->d, kind, u->next, chunk);
    if (st == ASCM_OK) {
        u->next += chunk;
        u->taken += chunk;
    }
    return st;
}

static void test_device_chunks(void) {
    ascm_device_config cfg = {.min_block = 4096};
    cfg.base[ASCM_KIND_NORMAL] = 1ull << 40;
    cfg.size[ASCM_KIND_NORMAL] = 8u << 20;
    cfg.growable[ASCM_KIND_NORMAL] = 1;
    cfg.budget.shared = 1ull << 30;
    ascm_device *d;
    CHECK(ascm_device_create(&cfg, &d) == ASCM_OK);
    fake_upstream u = {.d = d, .next = (1ull << 40) + (8u << 20), .taken = 8u << 20, .limit = 32u << 20};
    ascm_device_set_grow(d, grow_hook, &u);
    uint64_t a[6];
    int kind, events;
    for (int i = 0; i < 3; i++) /* 6 MiB each: one per chunk */
        CHECK(ascm_device_malloc(d, 6u << 20, 2 /* NORMAL_ONLY */, ASCM_SIZE_MALLOC, &a[i], &kind, &events) == ASCM_OK);
    CHECK(ascm_device_chunk_count(d, ASCM_KIND_NORMAL) == 3 && u.calls == 2);
    for (int i = 0; i < 3; i++) CHECK(ascm_device_free(d, a[i], 1u << ASCM_KIND_NORMAL, &kind) == ASCM_OK);
    CHECK(ascm_device_free(d, a[0], 1u << ASCM_KIND_NORMAL, &kind) == ASCM_ERR_BADFREE);
    /* 30 MiB: more than any chunk; the empty ones go back and one big chunk comes */
    CHECK(ascm_device_malloc(d, 30u << 20, 2, ASCM_SIZE_MALLOC, &a[0], &kind, &events) == ASCM_OK);
    CHECK(ascm_device_chunk_count(d, ASCM_KIND_NORMAL) == 1);
    ascm_stats s;
    ascm_device_kind_stats(d, ASCM_KIND_NORMAL, &s);
    CHECK(s.live_count == 1 && s.alloc_count == 4 && s.free_count == 3);
    CHECK(ascm_device_malloc(d, 4u << 20, 2, ASCM_SIZE_MALLOC, &a[1], &kind, &events) == ASCM_ERR_NOMEM);
    CHECK(ascm_device_free(d, a[0], 1u << ASCM_KIND_NORMAL, &kind) == ASCM_OK);
    for (int i = 0; i < ascm_device_chunk_count(d, ASCM_KIND_NORMAL); i++)
        POOL_OK(ascm_device_chunk(d, ASCM_KIND_NORMAL, i, NULL, NULL));
    ascm_device_destroy(d);
}

/* A device that is not paged takes a contiguous placement for every pool:
 * its first chunk's, one added later and one a reset makes.  Under
 * KEPT_TO_BEST_FIT a 1 MiB request after frees at 0 and 2 MiB (the kept
 * block) lands at 0, where the default reuses the kept block at 2 MiB
 * (test_contiguous_placements' "equal" layout).  A paged placement and
 * other values are refused. */
static uint64_t device_place_after_kept(ascm_device *d, uint64_t base) {
    const uint64_t M = 1u << 20;
    uint64_t a[4], got;
    int kind, events;
    for (int i = 0; i < 4; i++)
        CHECK(ascm_device_malloc(d, M, 2, ASCM_SIZE_MALLOC, &a[i], &kind, &events) == ASCM_OK);
    CHECK(ascm_device_free(d, a[0], 1u << ASCM_KIND_NORMAL, &kind) == ASCM_OK);
    CHECK(ascm_device_free(d, a[2], 1u << ASCM_KIND_NORMAL, &kind) == ASCM_OK);
    CHECK(ascm_device_malloc(d, M, 2, ASCM_SIZE_MALLOC, &got, &kind, &events) == ASCM_OK);
    CHECK(ascm_device_free(d, got, 1u << ASCM_KIND_NORMAL, &kind) == ASCM_OK);
    CHECK(ascm_device_free(d, a[1], 1u << ASCM_KIND_NORMAL, &kind) == ASCM_OK);
    CHECK(ascm_device_free(d, a[3], 1u << ASCM_KIND_NORMAL, &kind) == ASCM_OK);
    return (got - base) >> 20;
}

/* A device of one 64 MiB chunk of normal pages in units of min_block. */
static ascm_device_config normal_only(uint64_t min_block) {
    ascm_device_config cfg = {.min_block = min_block};
    cfg.base[ASCM_KIND_NORMAL] = 1ull << 40;
    cfg.size[ASCM_KIND_NORMAL] = 64u << 20;
    cfg.budget.shared = 1ull << 30;
    return cfg;
}

static void test_device_contiguous_placement(void) {
    ascm_device_config cfg = normal_only(4096);
    ascm_device *d;
    CHECK(ascm_device_create(&cfg, &d) == ASCM_OK);
    CHECK(device_place_after_kept(d, cfg.base[ASCM_KIND_NORMAL]) == 2);
    CHECK(ascm_device_placement(d) == ASCM_PLACE_KEPT_IN_PLACE);
    CHECK(ascm_pool_placement(ascm_device_chunk(d, ASCM_KIND_NORMAL, 0, NULL, NULL)) == ASCM_PLACE_KEPT_IN_PLACE);
    CHECK(ascm_device_set_placement(d, ASCM_PLACE_GRANULES) == ASCM_ERR_INVAL);
    CHECK(ascm_device_set_placement(d, ASCM_PLACE_PACKED) == ASCM_ERR_INVAL);
    CHECK(ascm_device_set_placement(d, 5) == ASCM_ERR_INVAL);
    CHECK(ascm_device_set_placement(d, -1) == ASCM_ERR_INVAL);
    CHECK(ascm_device_set_placement(d, ASCM_PLACE_BEST_FIT_END_LAST) == ASCM_OK);
    CHECK(ascm_device_set_placement(d, ASCM_PLACE_KEPT_TO_BEST_FIT) == ASCM_OK);
    CHECK(device_place_after_kept(d, cfg.base[ASCM_KIND_NORMAL]) == 0);
    CHECK(ascm_device_add_chunk(d, ASCM_KIND_NORMAL, 1ull << 41, 8u << 20) == ASCM_OK);
    CHECK(ascm_device_chunk(d, ASCM_KIND_NORMAL, 1, NULL, NULL)->placement == ASCM_PLACE_KEPT_TO_BEST_FIT);
    CHECK(ascm_device_reset(d, cfg.base) == ASCM_OK);
    CHECK(ascm_device_placement(d) == ASCM_PLACE_KEPT_TO_BEST_FIT);
    CHECK(ascm_pool_placement(ascm_device_chunk(d, ASCM_KIND_NORMAL, 0, NULL, NULL)) == ASCM_PLACE_KEPT_TO_BEST_FIT);
    CHECK(device_place_after_kept(d, cfg.base[ASCM_KIND_NORMAL]) == 0);
    POOL_OK(ascm_device_chunk(d, ASCM_KIND_NORMAL, 0, NULL, NULL));
    ascm_device_destroy(d);
}

/* slab_max (ascm_pool_set_slab_max): requests up to it come from slabs,
 * larger ones from best fit in whole units; 0 serves none from slabs; more
 * than the largest class reads as it; BEST_FIT caps it at 1 KiB.  A block
 * keeps the path it was placed by: one from a slab is freed as one after
 * the limit changed.  A device gives its setting to every pool, chunks
 * added later and a reset's included. */
static void test_slab_max(void) {
    ascm_pool *p;
    ascm_pool_config cfg = {.base = 1u << 30, .size = 16u << 20, .min_block = 4096};
    uint64_t a, b, c, sz;
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    CHECK(ascm_pool_slab_max(p) == 32768);
    CHECK(ascm_pool_alloc(p, 100, 64, &a) == ASCM_OK);
    CHECK(ascm_pool_usable_size(p, a, &sz) == ASCM_OK && sz == 128);
    CHECK(ascm_pool_set_slab_max(p, 0) == ASCM_OK && ascm_pool_slab_max(p) == 0);
    CHECK(ascm_pool_usable_for(p, 100, 64) == 4096);
    CHECK(ascm_pool_alloc(p, 100, 64, &b) == ASCM_OK);
    CHECK(ascm_pool_usable_size(p, b, &sz) == ASCM_OK && sz == 4096);
    POOL_OK(p);
    CHECK(ascm_pool_free(p, a) == ASCM_OK); /* from a slab, freed after the change */
    CHECK(ascm_pool_set_slab_max(p, 2048) == ASCM_OK);
    CHECK(ascm_pool_usable_for(p, 2048, 64) < 4096 && ascm_pool_usable_for(p, 2049, 64) == 4096);
    CHECK(ascm_pool_set_slab_max(p, 1ull << 40) == ASCM_OK && ascm_pool_slab_max(p) == 32768);
    CHECK(ascm_pool_alloc(p, 100, 64, &c) == ASCM_OK);
    CHECK(ascm_pool_usable_size(p, c, &sz) == ASCM_OK && sz == 128);
    CHECK(ascm_pool_free(p, b) == ASCM_OK && ascm_pool_free(p, c) == ASCM_OK);
    POOL_OK(p);
    /* by handle: what is not in a slab is known by its handle only, however
     * small (ascmem.h, handles); a slab slot may be freed either way */
    ascm_handle h;
    CHECK(ascm_pool_set_slab_max(p, 0) == ASCM_OK);
    CHECK(ascm_pool_alloc_handle(p, 100, 64, &a, &h) == ASCM_OK);
    CHECK(ascm_pool_free(p, a) == ASCM_ERR_BADFREE && ascm_pool_usable_size(p, a, &sz) == ASCM_ERR_BADFREE);
    CHECK(ascm_pool_free_handle(p, h) == ASCM_OK);
    CHECK(ascm_pool_set_slab_max(p, 128) == ASCM_OK);
    CHECK(ascm_pool_alloc_handle(p, 100, 64, &a, &h) == ASCM_OK);
    CHECK(ascm_pool_set_slab_max(p, 0) == ASCM_OK); /* placed from a slab: stays one */
    CHECK(ascm_pool_free(p, a) == ASCM_OK && ascm_pool_free_handle(p, h) == ASCM_ERR_BADFREE);
    POOL_OK(p);
    ascm_pool_destroy(p);
    ascm_pool *g = granule_pool(); /* BEST_FIT: at most 1 KiB from slabs, whatever slab_max */
    CHECK(ascm_pool_set_placement(g, ASCM_PLACE_BEST_FIT) == ASCM_OK);
    CHECK(ascm_pool_usable_for(g, 1024, 64) == 1024 && ascm_pool_usable_for(g, 1025, 64) == 4096);
    CHECK(ascm_pool_set_slab_max(g, 512) == ASCM_OK);
    CHECK(ascm_pool_usable_for(g, 512, 64) == 512 && ascm_pool_usable_for(g, 513, 64) == 4096);
    CHECK(ascm_pool_set_placement(g, ASCM_PLACE_GRANULES) == ASCM_OK);
    CHECK(ascm_pool_usable_for(g, 513, 64) == 4096 && ascm_pool_slab_max(g) == 512);
    ascm_pool_destroy(g);
    ascm_device_config dcfg = normal_only(4096);
    ascm_device *d;
    CHECK(ascm_device_create(&dcfg, &d) == ASCM_OK);
    CHECK(ascm_device_slab_max(d) == 32768);
    CHECK(ascm_device_set_slab_max(d, 0) == ASCM_OK && ascm_device_slab_max(d) == 0);
    CHECK(ascm_pool_slab_max(ascm_device_chunk(d, ASCM_KIND_NORMAL, 0, NULL, NULL)) == 0);
    CHECK(ascm_device_add_chunk(d, ASCM_KIND_NORMAL, 1ull << 41, 8u << 20) == ASCM_OK);
    CHECK(ascm_pool_slab_max(ascm_device_chunk(d, ASCM_KIND_NORMAL, 1, NULL, NULL)) == 0);
    CHECK(ascm_device_reset(d, dcfg.base) == ASCM_OK);
    CHECK(ascm_pool_slab_max(ascm_device_chunk(d, ASCM_KIND_NORMAL, 0, NULL, NULL)) == 0);
    ascm_device_destroy(d);
}

/* Best-fit placement, the first region full: a request goes to best fit in
 * the regions after it, as plain best fit over the range would place it --
 * not to the lowest free run that holds it.  Holes of 2 MiB and 1 MiB in
 * the second region: 1 MiB takes the 1 MiB hole. */
static void test_paged_best_fit_past_the_first_region(void) {
    const uint64_t M = 1u << 20, B = 1ull << 36, R1 = B + (32u << 20);
    ascm_pool *p = granule_pool();
    CHECK(ascm_pool_set_placement(p, ASCM_PLACE_BEST_FIT) == ASCM_OK);
    uint64_t first[32], a, b, c, d, got;
    for (int i = 0; i < 32; i++) CHECK(ascm_pool_alloc(p, M, 64, &first[i]) == ASCM_OK && first[i] == B + i * M);
    CHECK(ascm_pool_alloc(p, 2 * M, 64, &a) == ASCM_OK && a == R1);
    CHECK(ascm_pool_alloc(p, M, 64, &b) == ASCM_OK && b == R1 + 2 * M);
    CHECK(ascm_pool_alloc(p, M, 64, &c) == ASCM_OK && c == R1 + 3 * M);
    CHECK(ascm_pool_alloc(p, M, 64, &d) == ASCM_OK && d == R1 + 4 * M);
    CHECK(ascm_pool_free(p, a) == ASCM_OK);
    CHECK(ascm_pool_free(p, c) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, M, 64, &got) == ASCM_OK);
    CHECK(got == c); /* the exact hole, where first fit took a's */
    POOL_OK(p);
    ascm_pool_destroy(p);
}

/* Placement switched on a pool with live blocks (ascm_pool_set_placement
 * applies to blocks placed from then on): random allocations of every path
 * (slab classes a best-fit pool serves from best fit included, aligned past
 * the unit, near the range's size), frees, relabels, sleeps, trims and
 * resets, with the placement changed at random among the kind's; check()
 * after every step, and every block freed under a placement other than
 * the one it was placed by. */
static void placement_switch_stress(ascm_pool *p, const int *places, int nplaces, int paged) {
    enum { N = 96 };
    uint64_t live[N] = {0};
    char msg[256];
    for (int step = 0; step < 6000; step++) {
        unsigned op = (unsigned)(next_rand() % 100);
        int i = (int)(next_rand() % N);
        if (op < 6) {
            CHECK(ascm_pool_set_placement(p, places[next_rand() % (unsigned)nplaces]) == ASCM_OK);
        } else if (op < 8) {
            ascm_pool_trim(p);
        } else if (op < 9 && step % 7 == 0) {
            ascm_pool_reset(p);
            memset(live, 0, sizeof live);
        } else if (op < 14 && live[i]) {
            uint64_t usable, req;
            CHECK(ascm_pool_usable_size(p, live[i], &usable) == ASCM_OK);
            CHECK(ascm_pool_requested_size(p, live[i], &req) == ASCM_OK);
            (void)ascm_pool_relabel(p, live[i], req, 0, 64); /* refused or not: the pool stays whole */
        } else if (op < 18 && live[i] && paged) {
            if (ascm_pool_sleep(p, live[i], NULL) == ASCM_OK && (next_rand() & 1))
                CHECK(ascm_pool_wake(p, live[i], NULL) == ASCM_OK);
        } else if (live[i]) {
            CHECK(ascm_pool_free(p, live[i]) == ASCM_OK);
            live[i] = 0;
        } else {
            unsigned kind = (unsigned)(next_rand() % 10);
            uint64_t size = kind < 3 ? 1 + next_rand() % 1024                 /* slabs under every placement */
                          : kind < 6 ? 1025 + next_rand() % (31u << 10)        /* slabs but under best fit */
                          : kind < 9 ? 1 + next_rand() % (3u << 20)
                                     : p->size - next_rand() % (p->size / 4); /* near the range's size */
            uint64_t align = next_rand() % 8 == 0 ? (uint64_t)1 << (12 + next_rand() % 7) : 64;
            uint64_t a;
            int st = ascm_pool_alloc(p, size, align, &a);
            CHECK(st == ASCM_OK || st == ASCM_ERR_NOMEM || st == ASCM_ERR_BUDGET);
            if (st == ASCM_OK) {
                CHECK((a & (align - 1)) == 0);
                live[i] = a;
            }
        }
        if (ascm_pool_check(p, msg, sizeof msg) != ASCM_OK) {
            fprintf(stderr, "step %d op %u: %s\n", step, op, msg);
            CHECK(0);
            return;
        }
    }
    for (int i = 0; i < N; i++)
        if (live[i]) CHECK(ascm_pool_free(p, live[i]) == ASCM_OK);
    POOL_OK(p);
    ascm_stats st;
    ascm_pool_stats(p, &st);
    CHECK(st.used == 0);
}

static void test_placement_switch_paged(void) {
    const int places[] = {ASCM_PLACE_GRANULES, ASCM_PLACE_PACKED, ASCM_PLACE_BEST_FIT};
    ascm_pool *p = granule_pool();
    placement_switch_stress(p, places, 3, 1);
    ascm_pool_destroy(p);
}

static void test_placement_switch_contiguous(void) {
    const int places[] = {ASCM_PLACE_KEPT_IN_PLACE, ASCM_PLACE_KEPT_TO_BEST_FIT, ASCM_PLACE_LOWEST_EQUAL,
                          ASCM_PLACE_BEST_FIT_END_LAST};
    ascm_pool *p;
    ascm_pool_config cfg = {.base = 1ull << 30, .size = 64u << 20, .min_block = 4096};
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    placement_switch_stress(p, places, 4, 0);
    CHECK(ascm_pool_set_thread_caches(p, ASCM_CACHES_ON) == ASCM_OK);
    placement_switch_stress(p, places, 4, 0);
    ascm_pool_destroy(p);
}

/* A device's unit (its configuration's min_block, Device(min_block=)) is
 * every pool's, those a reset makes included: two blocks of 41 KiB + 1 in a
 * row lie 42 KiB apart in 1 KiB units (44 KiB in 4 KiB ones). */
static void test_device_min_block(void) {
    ascm_device_config cfg = normal_only(1024);
    ascm_device *d;
    CHECK(ascm_device_create(&cfg, &d) == ASCM_OK);
    CHECK(ascm_device_min_block(d) == 1024);
    for (int round = 0; round < 2; round++) {
        CHECK(ascm_device_chunk(d, ASCM_KIND_NORMAL, 0, NULL, NULL)->gran == 1024);
        uint64_t a, b;
        int kind, events;
        CHECK(ascm_device_malloc(d, (41u << 10) + 1, 2, ASCM_SIZE_MALLOC, &a, &kind, &events) == ASCM_OK);
        CHECK(ascm_device_malloc(d, (41u << 10) + 1, 2, ASCM_SIZE_MALLOC, &b, &kind, &events) == ASCM_OK);
        CHECK(b - a == 42u << 10);
        CHECK(ascm_device_free(d, a, 1u << ASCM_KIND_NORMAL, &kind) == ASCM_OK);
        CHECK(ascm_device_free(d, b, 1u << ASCM_KIND_NORMAL, &kind) == ASCM_OK);
        POOL_OK(ascm_device_chunk(d, ASCM_KIND_NORMAL, 0, NULL, NULL));
        CHECK(ascm_device_reset(d, cfg.base) == ASCM_OK);
    }
    CHECK(ascm_device_min_block(d) == 1024);
    /* and the pool of a chunk added later */
    CHECK(ascm_device_add_chunk(d, ASCM_KIND_NORMAL, 1ull << 41, 8u << 20) == ASCM_OK);
    CHECK(ascm_device_chunk(d, ASCM_KIND_NORMAL, 1, NULL, NULL)->gran == 1024);
    ascm_device_destroy(d);
    /* a unit that is not a power of two is refused at creation, a device
     * whose kinds have no chunk yet (growable) included */
    ascm_device_config bad = {.min_block = 3000};
    bad.growable[ASCM_KIND_NORMAL] = 1;
    bad.budget.shared = 1ull << 30;
    d = NULL;
    CHECK(ascm_device_create(&bad, &d) == ASCM_ERR_INVAL && d == NULL);
    bad.min_block = 0;
    CHECK(ascm_device_create(&bad, &d) == ASCM_ERR_INVAL && d == NULL);
}

/* A device of two kinds, 16 MiB of huge pages and 16 MiB of normal ones;
 * the caller sets the budget. */
static ascm_device_config huge_and_normal(void) {
    ascm_device_config cfg = {.min_block = 4096};
    cfg.base[ASCM_KIND_HUGE] = 1ull << 40;
    cfg.size[ASCM_KIND_HUGE] = 16u << 20;
    cfg.base[ASCM_KIND_NORMAL] = 1ull << 41;
    cfg.size[ASCM_KIND_NORMAL] = 16u << 20;
    return cfg;
}

/* aclrtMalloc's default policy is routed inline (device.c, device_try):
 * the same kinds, sizes and events as the general route, at its edges and
 * when huge pages run out. */
static void test_device_default_route(void) {
    ascm_device_config cfg = huge_and_normal();
    cfg.budget.reserve = 4u << 20; /* two huge pages, and no growth past them */
    cfg.budget.shared = 64u << 20;
    ascm_device *d;
    CHECK(ascm_device_create(&cfg, &d) == ASCM_OK);
    const uint64_t mib = 1u << 20;
    const uint64_t sizes[] = {1, 64, 1000, mib - 64, mib - 32, mib - 31, mib, 3 * mib};
    int kind, events;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        ascm_route r;
        uint64_t a, usable;
        CHECK(ascm_device_route(d, sizes[i], 0, ASCM_SIZE_MALLOC, &r) == ASCM_OK);
        CHECK(ascm_device_malloc(d, sizes[i], 0, ASCM_SIZE_MALLOC, &a, &kind, &events) == ASCM_OK);
        CHECK(kind == r.kinds[0] && events == 0);
        CHECK(kind == (sizes[i] <= mib - 32 ? ASCM_KIND_NORMAL : ASCM_KIND_HUGE));
        CHECK(ascm_pool_usable_size(ascm_device_pool_at(d, a, NULL), a, &usable) == ASCM_OK);
        CHECK(usable >= r.rounded && r.rounded == ((sizes[i] + 31) & ~31ull) + 32);
        CHECK(ascm_device_free(d, a, 0x1F, &kind) == ASCM_OK);
    }
    uint64_t h, n;
    CHECK(ascm_device_malloc(d, 0, 0, ASCM_SIZE_MALLOC, &h, &kind, &events) == ASCM_ERR_INVAL);
    CHECK(ascm_device_malloc(d, (1ull << 62) + 1, 0, ASCM_SIZE_MALLOC, &h, &kind, &events) == ASCM_ERR_NOMEM);
    /* huge pages run out: the second 3 MiB gets normal pages, and says so */
    CHECK(ascm_device_malloc(d, 3 * mib, 0, ASCM_SIZE_MALLOC, &h, &kind, &events) == ASCM_OK);
    CHECK(kind == ASCM_KIND_HUGE && events == 0);
    CHECK(ascm_device_malloc(d, 3 * mib, 0, ASCM_SIZE_MALLOC, &n, &kind, &events) == ASCM_OK);
    CHECK(kind == ASCM_KIND_NORMAL && events == (ASCM_EVENT_HUGE_FALLBACK | ASCM_EVENT_RESERVE_FULL));
    CHECK(ascm_device_kind_of(d, n) == ASCM_KIND_NORMAL);
    CHECK(ascm_device_free(d, n, 0x1F, &kind) == ASCM_OK && kind == ASCM_KIND_NORMAL);
    CHECK(ascm_device_free(d, h, 0x1F, &kind) == ASCM_OK && kind == ASCM_KIND_HUGE);
    POOL_OK(ascm_device_pool(d, ASCM_KIND_HUGE));
    POOL_OK(ascm_device_pool(d, ASCM_KIND_NORMAL));
    ascm_device_destroy(d);
}

/* ASCM_SIZE_EXACT (a CPU allocator's blocks, ascmem.torch): aclrtMalloc's
 * kinds, the size as asked as both the requested and the placed size (no
 * tail), a 64-byte start; a block of whole pages holds exactly them. */
static void test_device_exact_route(void) {
    ascm_device_config cfg = huge_and_normal();
    cfg.budget.reserve = 16u << 20;
    cfg.budget.shared = 64u << 20;
    ascm_device *d;
    CHECK(ascm_device_create(&cfg, &d) == ASCM_OK);
    const uint64_t mib = 1u << 20;
    const uint64_t sizes[] = {1, 33, 4096, mib - 32, mib - 31, mib, 2 * mib, 4 * mib + 1};
    int kind, events;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        ascm_route r, m;
        uint64_t a, usable, requested;
        CHECK(ascm_device_route(d, sizes[i], 0, ASCM_SIZE_EXACT, &r) == ASCM_OK);
        CHECK(ascm_device_route(d, sizes[i], 0, ASCM_SIZE_MALLOC, &m) == ASCM_OK);
        CHECK(r.rounded == sizes[i] && r.pad == 0 && r.align == 64);
        CHECK(r.nkinds == m.nkinds && r.kinds[0] == m.kinds[0]);
        CHECK(ascm_device_malloc(d, sizes[i], 0, ASCM_SIZE_EXACT, &a, &kind, &events) == ASCM_OK);
        CHECK(kind == (sizes[i] <= mib - 32 ? ASCM_KIND_NORMAL : ASCM_KIND_HUGE) && a % 64 == 0);
        ascm_pool *p = ascm_device_pool_at(d, a, NULL);
        CHECK(ascm_pool_requested_size(p, a, &requested) == ASCM_OK && requested == sizes[i]);
        CHECK(ascm_pool_usable_size(p, a, &usable) == ASCM_OK && usable >= sizes[i]);
        if (sizes[i] % (2 * mib) == 0) { /* whole huge pages: no page more */
            ascm_stats st;
            ascm_pool_stats(p, &st);
            CHECK(usable == sizes[i] && st.pages_in_use * st.page_size == sizes[i]);
        }
        CHECK(ascm_device_free(d, a, 0x1F, &kind) == ASCM_OK);
    }
    POOL_OK(ascm_device_pool(d, ASCM_KIND_HUGE));
    POOL_OK(ascm_device_pool(d, ASCM_KIND_NORMAL));
    ascm_device_destroy(d);
}

/* An aligned group's request (ascm_device_try_malloc_aligned_held): start
 * and usable size multiples of the alignment whatever the call and policy;
 * an alignment that is not a power of two is refused; other requests keep
 * their placement. */
static void test_device_aligned_requests(void) {
    ascm_device_config cfg = huge_and_normal();
    cfg.budget.reserve = 16u << 20;
    cfg.budget.shared = 64u << 20;
    ascm_device *d;
    CHECK(ascm_device_create(&cfg, &d) == ASCM_OK);
    const uint64_t mib = 1u << 20;
    const uint64_t sizes[] = {1, 100, 40000, mib + 3, 3 * mib};
    const uint64_t aligns[] = {64, 4096, 65536, 2 * mib};
    int kind, events;
    for (size_t m = 0; m < 2; m++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            for (size_t j = 0; j < sizeof aligns / sizeof aligns[0]; j++) {
                uint64_t a, usable, plain;
                CHECK(ascm_device_try_malloc_aligned_held(d, sizes[i], 0, (int)m, aligns[j], &a, &kind,
                                                          &events) == ASCM_OK);
                CHECK(a % aligns[j] == 0);
                CHECK(ascm_pool_usable_size(ascm_device_pool_at(d, a, NULL), a, &usable) == ASCM_OK);
                CHECK(usable % aligns[j] == 0 && usable >= sizes[i] + 32);
                CHECK(ascm_device_malloc(d, 100, 0, ASCM_SIZE_MALLOC, &plain, &kind, &events) == ASCM_OK);
                CHECK(ascm_pool_usable_size(ascm_device_pool_at(d, plain, NULL), plain, &usable) == ASCM_OK);
                CHECK(usable < 4096); /* an unaligned neighbour stays small */
                CHECK(ascm_device_free(d, plain, 0x1F, &kind) == ASCM_OK);
                CHECK(ascm_device_free(d, a, 0x1F, &kind) == ASCM_OK);
            }
    uint64_t a;
    CHECK(ascm_device_try_malloc_aligned_held(d, 100, 0, ASCM_SIZE_MALLOC, 3, &a, &kind, &events) == ASCM_ERR_INVAL);
    CHECK(ascm_device_try_malloc_aligned_held(d, 100, 0, ASCM_SIZE_MALLOC, 0, &a, &kind, &events) == ASCM_ERR_INVAL);
    CHECK(ascm_device_try_malloc_aligned_held(d, 0, 0, ASCM_SIZE_MALLOC, 64, &a, &kind, &events) == ASCM_ERR_INVAL);
    CHECK(ascm_device_try_malloc_aligned_held(d, 100, 0, ASCM_SIZE_MALLOC, 1ull << 63, &a, &kind,
                                              &events) != ASCM_OK);
    POOL_OK(ascm_device_pool(d, ASCM_KIND_HUGE));
    POOL_OK(ascm_device_pool(d, ASCM_KIND_NORMAL));
    ascm_device_destroy(d);
}

/* A free looks first where the last free found its block (device.c,
 * device_free): whatever that hint says, a free finds the block's kind, and
 * a block of a kind the caller did not name is refused with its kind said. */
static void test_device_free_kind_hint(void) {
    ascm_device_config cfg = huge_and_normal();
    cfg.budget.reserve = 16u << 20;
    cfg.budget.shared = 64u << 20;
    ascm_device *d;
    CHECK(ascm_device_create(&cfg, &d) == ASCM_OK);
    const unsigned huge = 1u << ASCM_KIND_HUGE, normal = 1u << ASCM_KIND_NORMAL;
    int kind, events;
    uint64_t n[4], h[4];
    for (int i = 0; i < 4; i++) {
        CHECK(ascm_device_malloc(d, 64, 0, ASCM_SIZE_MALLOC, &n[i], &kind, &events) == ASCM_OK);
        CHECK(kind == ASCM_KIND_NORMAL);
        CHECK(ascm_device_malloc(d, 2u << 20, 0, ASCM_SIZE_MALLOC, &h[i], &kind, &events) == ASCM_OK);
        CHECK(kind == ASCM_KIND_HUGE);
    }
    /* the hint on normal pages: a huge block freed as normal is refused */
    CHECK(ascm_device_free(d, n[0], normal | huge, &kind) == ASCM_OK && kind == ASCM_KIND_NORMAL);
    CHECK(ascm_device_free(d, h[0], normal, &kind) == ASCM_ERR_BADFREE && kind == ASCM_KIND_HUGE);
    CHECK(ascm_device_free(d, n[1], normal, &kind) == ASCM_OK && kind == ASCM_KIND_NORMAL);
    /* a huge free moves it; a normal block freed as huge is refused, then frees */
    CHECK(ascm_device_free(d, h[0], normal | huge, &kind) == ASCM_OK && kind == ASCM_KIND_HUGE);
    CHECK(ascm_device_free(d, n[2], huge, &kind) == ASCM_ERR_BADFREE && kind == ASCM_KIND_NORMAL);
    CHECK(ascm_device_free(d, h[1], huge, &kind) == ASCM_OK && kind == ASCM_KIND_HUGE);
    CHECK(ascm_device_free(d, h[2], normal, &kind) == ASCM_ERR_BADFREE && kind == ASCM_KIND_HUGE);
    CHECK(ascm_device_free(d, n[2], normal | huge, &kind) == ASCM_OK && kind == ASCM_KIND_NORMAL);
    /* alternating kinds, and no kind at all */
    for (int i = 2; i < 4; i++) {
        CHECK(ascm_device_free(d, h[i], normal | huge, &kind) == ASCM_OK && kind == ASCM_KIND_HUGE);
        if (i == 3) break;
        CHECK(ascm_device_free(d, n[i + 1], normal | huge, &kind) == ASCM_OK && kind == ASCM_KIND_NORMAL);
    }
    CHECK(ascm_device_free(d, 12345, normal | huge, &kind) == ASCM_ERR_BADFREE && kind == -1);
    CHECK(ascm_device_free(d, n[3], normal | huge, &kind) == ASCM_ERR_BADFREE); /* freed already */
    POOL_OK(ascm_device_pool(d, ASCM_KIND_HUGE));
    POOL_OK(ascm_device_pool(d, ASCM_KIND_NORMAL));
    CHECK(ascm_pool_used(ascm_device_pool(d, ASCM_KIND_HUGE)) == 0);
    CHECK(ascm_pool_used(ascm_device_pool(d, ASCM_KIND_NORMAL)) == 0);
    ascm_device_destroy(d);
}

/* Relabel and the padded allocation refuse what ascm_pool_alloc refuses: a
 * size of 0, and a size whose pad wraps past 2^64 (it looked like a small
 * request and relabel handed the block over with a requested size no block
 * has: check() then failed).  A host reservation whose size wraps with its
 * alignment is refused too. */
static void test_pool_refuses_wrapping_requests(void) {
    ascm_pool *p;
    ascm_pool_config cfg = {.base = 1ull << 40, .size = 64u << 20, .min_block = 4096};
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    uint64_t a, b, c, n;
    CHECK(ascm_pool_alloc(p, 64, 64, &a) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, 8192 + 1, 64, &b) == ASCM_OK);
    CHECK(ascm_pool_relabel(p, a, ~0ull - 31, 64, 64) == ASCM_ERR_INVAL);
    CHECK(ascm_pool_relabel(p, b, ~0ull - 4095, 64, 64) == ASCM_ERR_INVAL);
    CHECK(ascm_pool_relabel(p, a, 0, 64, 64) == ASCM_ERR_INVAL);
    CHECK(ascm_pool_relabel(p, a, 1, 65, 64) == ASCM_ERR_INVAL);
    CHECK(ascm_pool_alloc_padded(p, 0, 32, 64, &c) == ASCM_ERR_INVAL);
    CHECK(ascm_pool_alloc_padded(p, ~0ull - 15, 32, 64, &c) == ASCM_ERR_INVAL);
    int got; /* the host range: a size that wraps with its alignment reserved a page before */
    CHECK(ascm_os_reserve(~0ull - 4095, 8192, 0, &c, &got) == ASCM_ERR_INVAL);
    CHECK(ascm_os_reserve(~0ull - 4095, 8192, 1, &c, &got) == ASCM_ERR_INVAL);
    CHECK(ascm_pool_requested_size(p, a, &n) == ASCM_OK && n == 64);
    CHECK(ascm_pool_relabel(p, a, 40, 0, 64) == ASCM_OK); /* a valid one still works */
    CHECK(ascm_pool_requested_size(p, a, &n) == ASCM_OK && n == 40);
    POOL_OK(p);
    CHECK(ascm_pool_free(p, a) == ASCM_OK && ascm_pool_free(p, b) == ASCM_OK);
    POOL_OK(p);
    ascm_pool_destroy(p);
}

/* A freed large block's discharge is deferred until anything else happens
 * under its lock (pool.c, "Deferred discharge"): nothing may read the pages
 * as still taken -- not a peak, not the budget, not another pool of the
 * device. */
static void test_pool_deferred_discharge(void) {
    ascm_pool *p;
    ascm_pool_config cfg = {.base = 1u << 30, .size = 64u << 20, .min_block = 4096, .page_size = 2u << 20};
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    uint64_t a, b, c;
    ascm_stats st;
    CHECK(ascm_pool_alloc(p, 4u << 20, 64, &a) == ASCM_OK && a == cfg.base); /* 2 pages */
    CHECK(ascm_pool_free(p, a) == ASCM_OK);
    ascm_pool_stats(p, &st);
    CHECK(st.pages_in_use == 0 && st.peak_pages == 2 && st.pages_given == 2); /* read: given */
    for (int i = 0; i < 5; i++) { /* the loop: taken back each time, pages never given */
        CHECK(ascm_pool_alloc(p, 4u << 20, 64, &b) == ASCM_OK && b == a);
        CHECK(ascm_pool_free(p, b) == ASCM_OK);
    }
    /* a request of another size after a deferred free: 6 MiB at the same
     * place needs 3 pages; the peak is 3, not 2 + 3 */
    CHECK(ascm_pool_alloc(p, 6u << 20, 64, &c) == ASCM_OK && c == a);
    ascm_pool_stats(p, &st);
    CHECK(st.pages_in_use == 3 && st.peak_pages == 3);
    POOL_OK(p);
    /* a slab request after a deferred free settles too */
    CHECK(ascm_pool_free(p, c) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, 64, 64, &b) == ASCM_OK);
    ascm_pool_stats(p, &st);
    CHECK(st.pages_in_use == 1 && st.peak_pages == 3);
    POOL_OK(p);
    /* a free of another block while one is deferred: both given */
    CHECK(ascm_pool_alloc(p, 8u << 20, 64, &a) == ASCM_OK && ascm_pool_alloc(p, 8u << 20, 64, &c) == ASCM_OK);
    CHECK(ascm_pool_free(p, a) == ASCM_OK && ascm_pool_free(p, c) == ASCM_OK && ascm_pool_free(p, b) == ASCM_OK);
    ascm_pool_stats(p, &st);
    CHECK(st.pages_in_use == 0 && st.used == 0);
    POOL_OK(p);
    ascm_pool_destroy(p);
}

static void test_device_deferred_discharge(void) {
    /* 6 MiB for huge growth and normal pages together: 3 MiB of huge pages
     * (4 MiB of 2 MiB pages) and 3 MiB of normal ones never fit at once */
    ascm_device_config cfg = huge_and_normal();
    cfg.budget.shared = 6u << 20;
    cfg.budget.huge_grows = 1;
    ascm_device *d;
    CHECK(ascm_device_create(&cfg, &d) == ASCM_OK);
    uint64_t h, h2, n, charged, held;
    int kind, events;
    ascm_budget b;
    CHECK(ascm_device_malloc(d, 3u << 20, 1 /* HUGE_ONLY */, ASCM_SIZE_MALLOC, &h, &kind, &events) == ASCM_OK);
    for (int i = 0; i < 3; i++) { /* the reuse loop, pages kept charged in between */
        CHECK(ascm_device_free(d, h, 1u << ASCM_KIND_HUGE, &kind) == ASCM_OK);
        CHECK(ascm_device_malloc(d, 3u << 20, 1, ASCM_SIZE_MALLOC, &h2, &kind, &events) == ASCM_OK && h2 == h);
    }
    CHECK(ascm_device_free(d, h, 1u << ASCM_KIND_HUGE, &kind) == ASCM_OK);
    /* another pool of the device: the huge pages are free for it */
    CHECK(ascm_device_malloc(d, 3u << 20, 2 /* NORMAL_ONLY */, ASCM_SIZE_MALLOC, &n, &kind, &events) == ASCM_OK);
    ascm_device_budget(d, &b);
    CHECK(b.huge_used == 0 && b.normal_used == (3u << 20) + 4096 && b.peak_huge == 4u << 20);
    CHECK(ascm_device_malloc(d, 3u << 20, 1, ASCM_SIZE_MALLOC, &h, &kind, &events) == ASCM_ERR_BUDGET);
    CHECK(ascm_device_free(d, n, 1u << ASCM_KIND_NORMAL, &kind) == ASCM_OK);
    /* the budget read right after a free sees it given */
    CHECK(ascm_device_malloc(d, 3u << 20, 1, ASCM_SIZE_MALLOC, &h, &kind, &events) == ASCM_OK);
    CHECK(ascm_device_free(d, h, 1u << ASCM_KIND_HUGE, &kind) == ASCM_OK);
    ascm_device_budget(d, &b);
    CHECK(b.huge_used == 0 && b.normal_used == 0);
    ascm_device_huge_pages(d, &charged, &held);
    CHECK(charged == 0 && held == 0);
    /* fixed runtime memory after a deferred free takes the room */
    CHECK(ascm_device_malloc(d, 3u << 20, 1, ASCM_SIZE_MALLOC, &h, &kind, &events) == ASCM_OK);
    CHECK(ascm_device_free(d, h, 1u << ASCM_KIND_HUGE, &kind) == ASCM_OK);
    CHECK(ascm_device_charge_fixed(d, 5u << 20) == ASCM_OK);
    CHECK(ascm_device_malloc(d, 3u << 20, 1, ASCM_SIZE_MALLOC, &h, &kind, &events) == ASCM_ERR_BUDGET);
    CHECK(ascm_device_charge_fixed(d, -(int64_t)(5u << 20) - 1) == ASCM_ERR_INVAL); /* more than taken */
    CHECK(ascm_device_charge_fixed(d, INT64_MIN) == ASCM_ERR_INVAL);
    CHECK(ascm_device_charge_fixed(d, -(int64_t)(5u << 20)) == ASCM_OK);
    CHECK(ascm_device_charge_fixed(d, -1) == ASCM_ERR_INVAL);
    ascm_device_budget(d, &b);
    CHECK(b.fixed == 0);
    for (int k = 0; k < 2; k++) {
        int kinds[2] = {ASCM_KIND_HUGE, ASCM_KIND_NORMAL};
        for (int i = 0; i < ascm_device_chunk_count(d, kinds[k]); i++)
            POOL_OK(ascm_device_chunk(d, kinds[k], i, NULL, NULL));
    }
    ascm_device_destroy(d);
}

/* ---- failure paths: threads racing a reset, fork, statistics that lie ---- */

static ascm_device *small_device(uint64_t base) {
    ascm_device_config cfg = {.min_block = 4096};
    for (int k = 0; k < ASCM_KINDS - 1; k++) {
        cfg.base[k] = base + ((uint64_t)k << 32);
        cfg.size[k] = 16u << 20;
    }
    cfg.budget.reserve = 16u << 20;
    cfg.budget.shared = 32u << 20;
    cfg.budget.huge_grows = 1;
    ascm_device *d = NULL;
    CHECK(ascm_device_create(&cfg, &d) == ASCM_OK);
    return d;
}

typedef struct raw_caller {
    ascm_device *d;
    _Atomic int *stop;
    unsigned seed;
    int bad; /* a status no caller may ever see */
} raw_caller;

static void *raw_calls(void *arg) {
    raw_caller *c = arg;
    uint64_t live[16] = {0};
    for (unsigned i = 0; !atomic_load(c->stop); i++) {
        unsigned slot = (c->seed * 7919u + i * 104729u) % 16;
        int kind, events;
        if (live[slot]) {
            int st = ascm_device_free(c->d, live[slot], 0x1F, &kind);
            if (st != ASCM_OK && st != ASCM_ERR_BADFREE && st != ASCM_ERR_CLOSED) c->bad = st;
            live[slot] = 0;
        } else {
            int st = ascm_device_malloc(c->d, 100 + (i * 4099u) % (3u << 20), 0, ASCM_SIZE_MALLOC,
                                        &live[slot], &kind, &events);
            if (st != ASCM_OK) live[slot] = 0;
            if (st != ASCM_OK && st != ASCM_ERR_NOMEM && st != ASCM_ERR_BUDGET && st != ASCM_ERR_CLOSED)
                c->bad = st;
        }
    }
    return NULL;
}

/* Guarded blocks: the GIL-free free refuses them and changes nothing; the
 * held free (the Python layer's) frees them; reset forgets every guard.
 * Many guards at once exercise the address set's growth and its removal
 * by backward shift. */
static void test_device_guards(void) {
    ascm_device *d = small_device(1ull << 41);
    uint64_t a[300];
    int kind, events;
    for (int i = 0; i < 300; i++)
        CHECK(ascm_device_malloc(d, 100 + (uint64_t)i * 40, 2 /* NORMAL_ONLY */, ASCM_SIZE_MALLOC,
                                 &a[i], &kind, &events) == ASCM_OK);
    for (int i = 0; i < 300; i += 2) CHECK(ascm_device_guard(d, a[i]) == ASCM_OK);
    CHECK(ascm_device_guard(d, a[0]) == ASCM_OK); /* twice: still one guard */
    for (int i = 0; i < 300; i++) {
        int st = ascm_device_free(d, a[i], 0x1F, &kind);
        CHECK(st == (i % 2 ? ASCM_OK : ASCM_ERR_BADFREE));
        if (i % 2 == 0) CHECK(kind == ASCM_KIND_NORMAL);
    }
    for (int i = 0; i < 300; i += 4) { /* the held free, then the guard goes */
        CHECK(ascm_device_free_held(d, a[i], 0x1F, &kind) == ASCM_OK);
        ascm_device_unguard(d, a[i]);
    }
    for (int i = 2; i < 300; i += 4) CHECK(ascm_device_free(d, a[i], 0x1F, &kind) == ASCM_ERR_BADFREE);
    uint64_t base[ASCM_KINDS];
    for (int k = 0; k < ASCM_KINDS; k++) base[k] = (1ull << 41) + ((uint64_t)k << 32);
    CHECK(ascm_device_reset(d, base) == ASCM_OK);
    uint64_t b;
    CHECK(ascm_device_malloc(d, 100, 2, ASCM_SIZE_MALLOC, &b, &kind, &events) == ASCM_OK);
    CHECK(ascm_device_free(d, b, 0x1F, &kind) == ASCM_OK); /* no guard left after the reset */
    ascm_device_destroy(d);
}

/* Reset and close wait out the callers inside the device; callers arriving
 * meanwhile are refused with ASCM_ERR_CLOSED; none ever runs on a freed pool
 * (ASan would say so). */
static void test_device_reset_and_close_under_raw_callers(void) {
    ascm_device *d = small_device(1ull << 40);
    _Atomic int stop = 0;
    raw_caller c[3];
    pthread_t t[3];
    for (int i = 0; i < 3; i++) {
        c[i] = (raw_caller){.d = d, .stop = &stop, .seed = (unsigned)i + 1};
        CHECK(pthread_create(&t[i], NULL, raw_calls, &c[i]) == 0);
    }
    for (int r = 0; r < 300; r++) {
        uint64_t base[ASCM_KINDS];
        for (int k = 0; k < ASCM_KINDS; k++) base[k] = (1ull << 40) + ((uint64_t)k << 32) + ((uint64_t)(r + 1) << 26);
        CHECK(ascm_device_reset(d, base) == ASCM_OK);
    }
    CHECK(ascm_device_close(d) == ASCM_OK);
    uint64_t a;
    int kind, events;
    CHECK(ascm_device_malloc(d, 64, 0, ASCM_SIZE_MALLOC, &a, &kind, &events) == ASCM_ERR_CLOSED);
    CHECK(ascm_device_reset(d, (uint64_t[ASCM_KINDS]){0}) == ASCM_ERR_CLOSED);
    CHECK(ascm_device_wait_open(d) == ASCM_ERR_CLOSED);
    atomic_store(&stop, 1);
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        CHECK(c[i].bad == 0);
    }
    ascm_device_destroy(d);
}

typedef struct batcher {
    ascm_pool *p;
    _Atomic int *stop;
} batcher;

static void *batches(void *arg) {
    batcher *b = arg;
    enum { N = 20000 };
    static _Thread_local uint64_t sizes[N], addrs[N];
    for (int i = 0; i < N; i++) sizes[i] = 64 + (uint64_t)(i % 7) * 700;
    char m[128];
    while (!atomic_load(b->stop)) {
        size_t done;
        if (ascm_pool_alloc_many(b->p, sizes, N, 64, addrs, &done) == ASCM_OK)
            ascm_pool_free_many(b->p, addrs, N, &done);
        else
            ascm_pool_free_many(b->p, addrs, done, &done);
        ascm_pool_check(b->p, m, sizeof m);
    }
    return NULL;
}

/* fork() while other threads are inside long locked sections: the child
 * must find every lock free and every structure whole. */
static void test_fork_while_threads_hold_locks(void) {
    ascm_pool_config pc = {.base = 1ull << 32, .size = 1u << 30, .min_block = 4096};
    ascm_pool *p;
    CHECK(ascm_pool_create(&pc, &p) == ASCM_OK);
    ascm_device *d = small_device(1ull << 41);
    _Atomic int stop = 0;
    batcher b = {.p = p, .stop = &stop};
    raw_caller c = {.d = d, .stop = &stop, .seed = 9};
    pthread_t t[2];
    CHECK(pthread_create(&t[0], NULL, batches, &b) == 0);
    CHECK(pthread_create(&t[1], NULL, raw_calls, &c) == 0);
    for (int i = 0; i < 20; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            uint64_t a;
            int kind, events;
            char m[128];
            /* the forking thread waited for the pool lock: no one waits here */
            int ok = atomic_load(&p->lock.waiters) == 0 &&
                     ascm_pool_alloc(p, 4096, 64, &a) == ASCM_OK && ascm_pool_free(p, a) == ASCM_OK &&
                     ascm_pool_check(p, m, sizeof m) == ASCM_OK &&
                     ascm_device_malloc(d, 4096, 0, ASCM_SIZE_MALLOC, &a, &kind, &events) == ASCM_OK &&
                     ascm_device_free(d, a, 0x1F, &kind) == ASCM_OK;
            ascm_device_quiesce(d); /* no raw caller of the parent is counted inside here */
            _exit(ok ? 0 : 3);
        }
        CHECK(pid > 0);
        int status = -1;
        for (int waited = 0; waited < 2000; waited++) { /* 20 s */
            if (waitpid(pid, &status, WNOHANG) == pid) break;
            nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
            status = -1;
        }
        if (status == -1) {
            kill(pid, 9);
            waitpid(pid, &status, 0);
            fprintf(stderr, "fork %d: the child hung\n", i);
            failures++;
            break;
        }
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    atomic_store(&stop, 1);
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
    POOL_OK(p);
    ascm_pool_destroy(p);
    ascm_device_destroy(d);
}

/* One refused request counts once: the HUGE_FIRST fallback to normal pages
 * and a caller that retries (try_malloc) included. */
static void test_device_counts_a_failure_once(void) {
    ascm_device *d = small_device(1ull << 42);
    uint64_t a;
    int kind, events;
    ascm_stats h, n;
    CHECK(ascm_device_malloc(d, 64u << 20, 0, ASCM_SIZE_MALLOC, &a, &kind, &events) == ASCM_ERR_NOMEM);
    CHECK(ascm_device_try_malloc(d, 64u << 20, 0, ASCM_SIZE_MALLOC, &a, &kind, &events) == ASCM_ERR_NOMEM);
    ascm_device_kind_stats(d, ASCM_KIND_HUGE, &h);
    ascm_device_kind_stats(d, ASCM_KIND_NORMAL, &n);
    CHECK(h.failed_count + n.failed_count == 1);
    ascm_device_destroy(d);
}

/* Empty slabs kept as spares are free space: an empty pool reports its
 * whole capacity as free and as its largest free block. */
static void test_pool_spares_count_as_free(void) {
    ascm_pool_config pc = {.base = 1ull << 32, .size = 64u << 20, .min_block = 4096};
    ascm_pool *p;
    CHECK(ascm_pool_create(&pc, &p) == ASCM_OK);
    uint64_t a[3000];
    for (int i = 0; i < 3000; i++) CHECK(ascm_pool_alloc(p, 64 + (uint64_t)(i % 40) * 800, 64, &a[i]) == ASCM_OK);
    uint64_t big;
    CHECK(ascm_pool_alloc(p, 8u << 20, 64, &big) == ASCM_OK); /* large blocks between the slabs */
    for (int i = 0; i < 3000; i++) CHECK(ascm_pool_free(p, a[i]) == ASCM_OK);
    ascm_stats s;
    ascm_pool_stats(p, &s);
    CHECK(s.cached_bytes > 0 && s.peak_live_count == 3001 && s.live_count == 1);
    CHECK(s.free == s.capacity - (8u << 20));
    CHECK(ascm_pool_free(p, big) == ASCM_OK);
    ascm_pool_stats(p, &s);
    CHECK(s.largest_free == s.capacity && s.free == s.capacity);
    CHECK(ascm_pool_alloc(p, s.capacity, 64, &big) == ASCM_OK && ascm_pool_free(p, big) == ASCM_OK);
    POOL_OK(p);
    ascm_pool_destroy(p);
}

/* Idle descriptors (slab.c): released slabs of a class keep up to
 * IDLE_DESCRIPTORS descriptors for the class's next slabs and free the
 * rest; the next slabs take the idle ones first. */
static void test_slab_idle_descriptors(void) {
    ascm_pool_config pc = {.base = 1ull << 32, .size = 64u << 20, .min_block = 4096};
    ascm_pool *p;
    CHECK(ascm_pool_create(&pc, &p) == ASCM_OK);
    int cls = ascm_pool_class_of(p, 64, 64);
    ascm_slab_class *k = &p->classes[cls];
    enum { N = 8 * 128 }; /* eight slabs of the 64-byte class (8 KiB, 128 slots) */
    static uint64_t a[N];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) CHECK(ascm_pool_alloc(p, 64, 64, &a[i]) == ASCM_OK);
        CHECK(k->nidle == 0); /* every idle descriptor was taken again */
        for (int i = 0; i < N; i++) CHECK(ascm_pool_free(p, a[i]) == ASCM_OK);
        ascm_pool_trim(p); /* the spares go too */
        uint32_t chained = 0;
        for (uint32_t si = k->idle; si; si = p->slabs[si]->next) {
            CHECK(p->slabs[si]->idle && p->slabs[si]->cls == (uint32_t)cls);
            chained++;
        }
        CHECK(k->nidle == 4 && chained == 4);
        POOL_OK(p);
    }
    ascm_pool_destroy(p);
}

/* A map hook that records the mapped granules in a bitmap of its own and
 * refuses when told to. */
typedef struct map_log {
    uint64_t base, granule;
    uint8_t mapped[256];
    int refuse, calls;
} map_log;

static int log_map(void *ctx, uint64_t addr, uint64_t size, int map) {
    map_log *m = ctx;
    m->calls++;
    if (map && m->refuse) return 1;
    for (uint64_t a = addr; a < addr + size; a += m->granule) {
        uint64_t g = (a - m->base) / m->granule;
        if (map && m->mapped[g]) return 2; /* mapped twice: a bug */
        m->mapped[g] = (uint8_t)map;
    }
    return 0;
}

static uint64_t log_mapped(const map_log *m) {
    uint64_t n = 0;
    for (int i = 0; i < 256; i++) n += m->mapped[i];
    return n * m->granule;
}

static void test_paged_pool(void) {
    const uint64_t G = 64 << 10, BASE = 1ull << 32;
    map_log log = {.base = BASE, .granule = G};
    ascm_pool_config cfg = {.base = BASE, .size = 256 * G, .min_block = 4096, .page_size = G,
                            .paged = 1, .map = log_map, .map_ctx = &log,
                            .release_threshold = 2 * G};
    ascm_pool *p;
    ascm_stats st;
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    uint64_t a, b, c;
    CHECK(ascm_pool_alloc(p, 3 * G, 64, &a) == ASCM_OK);     /* three granules mapped */
    ascm_pool_stats(p, &st);
    CHECK(st.mapped == 3 * G && log_mapped(&log) == 3 * G && st.map_calls == 1);
    CHECK(ascm_pool_alloc(p, 100, 64, &b) == ASCM_OK);        /* a slab: one more granule */
    CHECK(ascm_pool_alloc(p, 5 * G, 64, &c) == ASCM_OK);
    ascm_pool_stats(p, &st);
    CHECK(st.mapped == log_mapped(&log) && st.peak_mapped == st.mapped);
    POOL_OK(p);
    CHECK(ascm_pool_free(p, c) == ASCM_OK);                   /* 5 granules free: 2 kept */
    ascm_pool_stats(p, &st);
    CHECK(st.mapped == log_mapped(&log) && st.mapped == st.pages_in_use * G + 2 * G);
    POOL_OK(p);
    CHECK(ascm_pool_alloc(p, 2 * G, 64, &c) == ASCM_OK);      /* reuses kept granules: no call */
    int calls = log.calls;
    ascm_pool_stats(p, &st);
    CHECK(st.mapped == log_mapped(&log));
    log.refuse = 1;                                           /* the backend refuses */
    uint64_t d;
    CHECK(ascm_pool_alloc(p, 20 * G, 64, &d) == ASCM_ERR_NOMEM);
    ascm_stats after;
    ascm_pool_stats(p, &after);
    CHECK(after.mapped == st.mapped && after.used == st.used && log_mapped(&log) == st.mapped);
    CHECK(log.calls > calls);
    POOL_OK(p);
    log.refuse = 0;
    CHECK(ascm_pool_free(p, a) == ASCM_OK && ascm_pool_free(p, b) == ASCM_OK &&
          ascm_pool_free(p, c) == ASCM_OK);
    ascm_pool_stats(p, &st);
    CHECK(st.mapped <= 2 * G + st.slab_bytes + G && st.mapped == log_mapped(&log));
    CHECK(ascm_pool_trim(p) > 0);
    ascm_pool_stats(p, &st);
    CHECK(st.mapped == 0 && log_mapped(&log) == 0 && st.unmap_calls > 0);
    POOL_OK(p);
    for (int i = 0; i < 2000; i++) { /* random churn: the hook's view and the pool's agree */
        uint64_t x;
        if (ascm_pool_alloc(p, 1 + next_rand() % (3 * G), 64, &x) == ASCM_OK && next_rand() % 3)
            ascm_pool_free(p, x);
    }
    ascm_pool_stats(p, &st);
    CHECK(st.mapped == log_mapped(&log) && st.mapped <= st.pages_in_use * G + 2 * G);
    POOL_OK(p);
    ascm_pool_reset(p);
    ascm_pool_stats(p, &st);
    CHECK(st.mapped == 0);
    POOL_OK(p);
    /* sleep: a large block gives its granules back but keeps its address */
    uint64_t big, small, other;
    CHECK(ascm_pool_alloc(p, 6 * G + 100, 64, &big) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, 100, 64, &small) == ASCM_OK);
    ascm_pool_stats(p, &st);
    uint64_t awake = st.mapped, gone = 1, woke = 1;
    CHECK(st.mapped - st.pages_in_use * G == 0); /* nothing kept before the sleep */
    CHECK(ascm_pool_sleep(p, big, &gone) == ASCM_OK && gone >= 6 * G);
    CHECK(ascm_pool_sleep(p, big, &gone) == ASCM_ERR_INVAL && gone == 0); /* asleep already */
    CHECK(ascm_pool_sleep(p, small, NULL) == ASCM_ERR_INVAL); /* a slab slot */
    CHECK(ascm_pool_wake(p, small, &woke) == ASCM_ERR_INVAL && woke == 0);
    ascm_pool_stats(p, &st);
    /* all unmapped: the release threshold (2 granules) keeps none of a sleeper's */
    CHECK(st.mapped == st.pages_in_use * G && st.mapped == log_mapped(&log) && st.live_count == 2);
    CHECK(awake - st.mapped >= 6 * G);
    POOL_OK(p);
    CHECK(ascm_pool_alloc(p, 3 * G, 64, &other) == ASCM_OK); /* lands elsewhere */
    uint64_t big_len;
    CHECK(ascm_pool_usable_size(p, big, &big_len) == ASCM_OK && big_len >= 6 * G + 100);
    CHECK(other >= big + big_len || other + 3 * G <= big); /* never inside the sleeper */
    log.refuse = 1;
    CHECK(ascm_pool_wake(p, big, NULL) == ASCM_ERR_NOMEM); /* refused: still asleep */
    log.refuse = 0;
    POOL_OK(p);
    uint64_t mapped_asleep = st.mapped;
    CHECK(ascm_pool_wake(p, big, &woke) == ASCM_OK && woke >= 6 * G);
    CHECK(ascm_pool_wake(p, big, NULL) == ASCM_ERR_INVAL);
    ascm_pool_stats(p, &st);
    CHECK(st.mapped == log_mapped(&log) && st.mapped >= mapped_asleep + woke - 2 * G);
    POOL_OK(p);
    CHECK(ascm_pool_sleep(p, big, &gone) == ASCM_OK && gone == woke);
    ascm_pool_stats(p, &st);
    /* not handed over asleep (issue 45.1): its next owner would find nothing mapped */
    CHECK(ascm_pool_relabel(p, big, big_len, 0, 64) == ASCM_ERR_INVAL);
    ascm_pool_stats(p, &after);
    CHECK(after.alloc_count == st.alloc_count && after.free_count == st.free_count);
    CHECK(ascm_pool_free(p, big) == ASCM_OK); /* freeing a sleeping block */
    CHECK(ascm_pool_free(p, small) == ASCM_OK && ascm_pool_free(p, other) == ASCM_OK);
    ascm_pool_trim(p);
    ascm_pool_stats(p, &st);
    CHECK(st.mapped == 0 && st.live_count == 0 && log_mapped(&log) == 0);
    POOL_OK(p);
    ascm_pool_destroy(p);
    cfg.page_size = 1024; /* a granule smaller than the unit */
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_ERR_INVAL);
    /* granules reaching past the range (issue 45.5): one larger than the
     * pool, a range not a whole number of them, a granule no range holds */
    cfg.page_size = 512 * G; /* the range is 256 granules of G */
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_ERR_INVAL);
    cfg.page_size = 64 * G;
    cfg.size = 256 * G + 64 * G / 2;
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_ERR_INVAL);
    cfg.size = 1024 * G;
    cfg.page_size = 1ull << 55;
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_ERR_INVAL);
}

/* Issue 45.10: a paged pool keeps no spare slabs -- what it keeps mapped is
 * its release threshold's to say: at 0, nothing once every block is freed. */
static void test_paged_no_spares(void) {
    for (uint64_t g = 4096; g <= (64u << 10); g *= 16) {
        ascm_pool_config cfg = {.base = 1ull << 32, .size = 64ull << 20, .min_block = 4096,
                                .page_size = g, .paged = 1};
        ascm_pool *p;
        ascm_stats st;
        CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
        static const uint64_t sizes[] = {100, 5000, 20000, 3000, 700, 32000, 9000};
        uint64_t live[210];
        for (int i = 0; i < 210; i++) CHECK(ascm_pool_alloc(p, sizes[i % 7], 64, &live[i]) == ASCM_OK);
        for (int i = 0; i < 210; i++) CHECK(ascm_pool_free(p, live[i]) == ASCM_OK);
        ascm_pool_stats(p, &st);
        CHECK(st.mapped == 0 && st.cached_bytes == 0 && st.pages_in_use == 0);
        POOL_OK(p);
        ascm_pool_destroy(p);
    }
}

typedef struct acl_caller {
    void *allocator;
    _Atomic int *stop;
    _Atomic uint64_t served;
} acl_caller;

static void *acl_calls(void *arg) {
    acl_caller *c = arg;
    void *live[8] = {0};
    unsigned k = 0;
    while (!atomic_load(c->stop)) {
        k = (k + 3) % 8;
        if (live[k]) {
            ascmem_acl_free(c->allocator, live[k]);
            live[k] = NULL;
        } else if ((live[k] = ascmem_acl_alloc(c->allocator, 64 + k * 5000)) != NULL) {
            atomic_fetch_add(&c->served, 1);
        }
    }
    for (k = 0; k < 8; k++) ascmem_acl_free(c->allocator, live[k]);
    return NULL;
}

/* The external allocator's callbacks while the slot is rebound from one
 * device to another and unbound: a callback never runs on a device after
 * bind() returned (ASan would see the destroyed device), an unbound slot
 * serves NULL, and pointers that are not slots are refused unread. */
static void test_acl_allocator_slots_under_callers(void) {
    ascm_device *a = small_device(1ull << 40), *b = small_device(1ull << 44);
    void *h = ascm_acl_allocator_handle(5);
    _Atomic int stop = 0;
    acl_caller c[3];
    pthread_t t[3];
    CHECK(ascm_acl_allocator_handle(ASCM_ACL_ALLOCATOR_SLOTS) == NULL);
    CHECK(ascm_acl_allocator_bind(-1, a) == ASCM_ERR_INVAL);
    CHECK(ascm_acl_allocator_bind(5, a) == ASCM_OK);
    for (int i = 0; i < 3; i++) {
        c[i].allocator = h;
        c[i].stop = &stop;
        atomic_store(&c[i].served, 0);
        CHECK(pthread_create(&t[i], NULL, acl_calls, &c[i]) == 0);
    }
    /* every caller inside the slot at least once before the rebinding starts
     * (a loaded machine may not have run them yet) */
    for (int i = 0; i < 3; i++)
        while (atomic_load(&c[i].served) == 0) sched_yield();
    for (int r = 0; r < 2000; r++) CHECK(ascm_acl_allocator_bind(5, r % 3 == 2 ? NULL : r % 2 ? b : a) == ASCM_OK);
    CHECK(ascm_acl_allocator_bind(5, a) == ASCM_OK);
    atomic_store(&stop, 1);
    uint64_t served = 0;
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        served += atomic_load(&c[i].served);
    }
    CHECK(served >= 3);
    CHECK(ascm_acl_allocator_bind(5, NULL) == ASCM_OK);
    CHECK(ascmem_acl_alloc(h, 64) == NULL);
    char local[64];
    CHECK(ascmem_acl_alloc(local, 64) == NULL);
    CHECK(ascmem_acl_alloc((char *)h + 1, 64) == NULL);
    ascmem_acl_free(local, local);
    CHECK(ascmem_acl_get_addr_from_block(local) == local);
    /* a block freed while the slot named the other device was refused
     * there and stays live in its own: destroy takes it */
    ascm_device_destroy(a);
    ascm_device_destroy(b);
}

int main(void) {
    static const test_case tests[] = {
        {"buddy_basic", test_buddy_basic},
        {"buddy_random", test_buddy_random},
        {"paged_held_runs", test_paged_held_runs},
        {"pool_basic", test_pool_basic},
        {"paged_best_fit_past_the_first_region", test_paged_best_fit_past_the_first_region},
        {"placement_switch_paged", test_placement_switch_paged},
        {"placement_switch_contiguous", test_placement_switch_contiguous},
        {"pool_reuses_the_last_freed_large_block", test_pool_reuses_the_last_freed_large_block},
        {"pool_remembered_slab", test_pool_remembered_slab},
        {"pool_deferred_discharge", test_pool_deferred_discharge},
        {"device_deferred_discharge", test_device_deferred_discharge},
        {"pool_random", test_pool_random},
        {"pool_handles", test_pool_handles},
        {"pool_refuses_wrapping_requests", test_pool_refuses_wrapping_requests},
        {"paged_regions", test_paged_regions},
        {"paged_granule_placement", test_paged_granule_placement},
        {"paged_packed_placement", test_paged_packed_placement},
        {"paged_best_fit_placement", test_paged_best_fit_placement},
        {"contiguous_placements", test_contiguous_placements},
        {"device_contiguous_placement", test_device_contiguous_placement},
        {"slab_max", test_slab_max},
        {"device_min_block", test_device_min_block},
        {"paged_mapped_first", test_paged_mapped_first},
        {"pool_batch", test_pool_batch},
        {"exhaustion_soak", test_exhaustion_soak},
        {"device_chunks", test_device_chunks},
        {"device_default_route", test_device_default_route},
        {"device_exact_route", test_device_exact_route},
        {"device_aligned_requests", test_device_aligned_requests},
        {"device_free_kind_hint", test_device_free_kind_hint},
        {"check_detects_corruption", test_check_detects_corruption},
        {"check_detects_bad_placement_and_adaptive_state", test_check_detects_bad_placement_and_adaptive_state},
        {"device_reset_and_close_under_raw_callers", test_device_reset_and_close_under_raw_callers},
        {"device_guards", test_device_guards},
        {"fork_while_threads_hold_locks", test_fork_while_threads_hold_locks},
        {"device_counts_a_failure_once", test_device_counts_a_failure_once},
        {"pool_spares_count_as_free", test_pool_spares_count_as_free},
        {"slab_idle_descriptors", test_slab_idle_descriptors},
        {"paged_pool", test_paged_pool},
        {"paged_no_spares", test_paged_no_spares},
        {"acl_allocator_slots_under_callers", test_acl_allocator_slots_under_callers},
    };
    return run_tests(tests, (int)(sizeof tests / sizeof tests[0]));
}
