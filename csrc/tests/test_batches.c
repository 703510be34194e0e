/* Batches under other threads: alloc_many and free_many hand the pool lock to
 * a thread that waits for it, and a reset or close that thread makes in the
 * middle is seen (pool.c, batch_hand_over).  Run by `make -C csrc test` under
 * ASan and UBSan, and by `make -C csrc tsan` under ThreadSanitizer.
 *
 * Each test learns where the batch is from the pool's charge hook, which the
 * batch calls under the lock whenever it takes or gives pages: so the other
 * thread starts only once the batch holds the lock, and the hook tells
 * whether the other thread's call finished while the batch still ran. */
#include "../ascmem.h"
#include "../internal.h"
#include "../pool_core.h" /* the tests read pool internals */

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define N 100000 /* a batch of ~20 ms: 390 hand-over points */

static ascm_pool *pool;
static atomic_int batch_running; /* set by the hook's first call of a batch */
static atomic_int other_done;    /* the other thread's call returned */
static atomic_int seen_mid_batch; /* ... and the batch's hook ran after that */
static atomic_int hook_calls;
static atomic_int batch_over; /* the batch returned: the other thread gives up waiting */

static int hook(void *ctx, int64_t delta) {
    (void)ctx;
    (void)delta;
    atomic_store(&batch_running, 1);
    if (atomic_load(&other_done) && atomic_load(&hook_calls) > 0) atomic_store(&seen_mid_batch, 1);
    atomic_fetch_add(&hook_calls, 1);
    return 0;
}

static void start_round(void) {
    atomic_store(&batch_running, 0);
    atomic_store(&other_done, 0);
    atomic_store(&seen_mid_batch, 0);
    atomic_store(&hook_calls, 0);
    atomic_store(&batch_over, 0);
}

/* For the other thread: 0 if the batch ended before it ran (it failed) */
static int wait_for_batch(void) {
    while (!atomic_load(&batch_running))
        if (atomic_load(&batch_over)) return 0;
        else sched_yield();
    return 1;
}

static ascm_pool *make_pool(void) {
    ascm_pool_config cfg = {.base = 1ull << 36, .size = 64ull << 30, .min_block = 4096, .charge = hook};
    ascm_pool *p;
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    return p;
}

/* sizes from 64 B to 1 MiB: most take pages, so the hook runs all along */
static uint64_t sizes[N], addrs[N], sorted[N];
static void draw_sizes(void) {
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (int i = 0; i < N; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        sizes[i] = 64 + x % (1u << 20);
    }
}

static void *one_pair(void *arg) {
    (void)arg;
    if (!wait_for_batch()) return NULL;
    uint64_t a;
    CHECK(ascm_pool_alloc(pool, 100, 64, &a) == ASCM_OK && ascm_pool_free(pool, a) == ASCM_OK);
    atomic_store(&other_done, 1);
    return NULL;
}

/* A look at the pool, which shows the batch part-way, then a reset. */
static uint64_t live_seen;
static void *look_then_reset(void *arg) {
    (void)arg;
    live_seen = 0;
    if (!wait_for_batch()) return NULL;
    ascm_stats s;
    ascm_pool_stats(pool, &s);
    live_seen = s.live_count;
    ascm_pool_reset(pool);
    atomic_store(&other_done, 1);
    return NULL;
}

static int by_value(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int all_distinct(const uint64_t *v, size_t n) {
    memcpy(sorted, v, n * sizeof *v);
    qsort(sorted, n, sizeof *sorted, by_value);
    for (size_t i = 1; i < n; i++)
        if (sorted[i] == sorted[i - 1]) return 0;
    return 1;
}

/* One batch (alloc_many of every size, or free_many of addrs) while another
 * thread runs `other` once the batch holds the lock; the batch's status. */
enum { ALLOC, FREE };
static int batch_beside(int which, void *(*other)(void *)) {
    size_t done;
    start_round();
    pthread_t t;
    CHECK(pthread_create(&t, NULL, other, NULL) == 0);
    int st = which == ALLOC ? ascm_pool_alloc_many(pool, sizes, N, 64, addrs, &done)
                            : ascm_pool_free_many(pool, addrs, N, &done);
    if (st == ASCM_OK) CHECK(done == N);
    atomic_store(&batch_over, 1);
    pthread_join(t, NULL);
    return st;
}

/* The other thread needs a CPU to take the lock when it is handed over: on
 * a host busy with other work it may get none during a whole batch, so each
 * test tries a few batches and asks that one was entered.  Before the
 * hand-over no batch ever was (the waiter waited 27-40 ms, a whole batch). */
#define ATTEMPTS 5

/* A thread that waits for the lock gets it during a batch, not after it. */
static void test_batches_hand_the_lock_over(void) {
    pool = make_pool();
    draw_sizes();
    int entered[2] = {0, 0};
    for (int attempt = 0; attempt < ATTEMPTS && !(entered[ALLOC] && entered[FREE]); attempt++) {
        CHECK(batch_beside(ALLOC, one_pair) == ASCM_OK);
        entered[ALLOC] |= atomic_load(&seen_mid_batch);
        CHECK(batch_beside(FREE, one_pair) == ASCM_OK);
        entered[FREE] |= atomic_load(&seen_mid_batch);
    }
    CHECK(entered[ALLOC] && entered[FREE]);
    ascm_stats s;
    ascm_pool_stats(pool, &s);
    CHECK(s.live_count == 0 && s.used == 0);
    POOL_OK(pool);
    ascm_pool_destroy(pool);
}

/* A reset made in a hand-over freed the blocks the batch had: alloc_many
 * starts again, so that every address it returns is live and none twice
 * (before, the blocks from before the reset were returned with the others,
 * some at the same addresses); free_many stops, the reset having freed the
 * rest (before, it went on to free what others had allocated there since). */
static void test_a_reset_in_a_hand_over(void) {
    draw_sizes();
    int entered[2] = {0, 0};
    ascm_stats s;
    size_t done;
    for (int attempt = 0; attempt < ATTEMPTS && !(entered[ALLOC] && entered[FREE]); attempt++) {
        pool = make_pool();
        CHECK(batch_beside(ALLOC, look_then_reset) == ASCM_OK);
        ascm_pool_stats(pool, &s);
        if (live_seen > 0 && live_seen < N) { /* the look and the reset came part-way */
            entered[ALLOC] = 1;
            CHECK(pool->resets == 1 && s.live_count == N && all_distinct(addrs, N));
        } else if (s.live_count != N) { /* the reset came after: start from an empty pool */
            CHECK(ascm_pool_alloc_many(pool, sizes, N, 64, addrs, &done) == ASCM_OK);
        }
        POOL_OK(pool);
        uint64_t resets = pool->resets;
        int st = batch_beside(FREE, look_then_reset);
        if (live_seen > 0 && live_seen < N) {
            entered[FREE] = 1;
            CHECK(st == ASCM_OK && pool->resets == resets + 1);
        }
        ascm_pool_stats(pool, &s);
        CHECK(s.live_count == 0 && s.used == 0 && s.largest_free == s.capacity);
        POOL_OK(pool);
        ascm_pool_destroy(pool);
    }
    CHECK(entered[ALLOC] && entered[FREE]);
}

/* A close is a reset and the closing in one step: made in a hand-over, the
 * batch, starting again, finds the pool closed.  (Python's close was a
 * reset, then a close-if-empty: a batch handed the lock between the two
 * allocated again, and the pool stayed open.) */
static void *one_close(void *arg) {
    (void)arg;
    if (!wait_for_batch()) return NULL;
    ascm_pool_close(pool);
    atomic_store(&other_done, 1);
    return NULL;
}

static void test_a_close_in_a_hand_over(void) {
    draw_sizes();
    int entered = 0;
    for (int attempt = 0; attempt < ATTEMPTS && !entered; attempt++) {
        pool = make_pool();
        size_t done = N;
        start_round();
        pthread_t t;
        CHECK(pthread_create(&t, NULL, one_close, NULL) == 0);
        int st = ascm_pool_alloc_many(pool, sizes, N, 64, addrs, &done);
        atomic_store(&batch_over, 1);
        pthread_join(t, NULL);
        ascm_stats s;
        ascm_pool_stats(pool, &s);
        if (st != ASCM_OK) { /* closed part-way (else it closed after the batch) */
            entered = 1;
            CHECK(st == ASCM_ERR_NOMEM && done == 0);
        }
        uint64_t a;
        CHECK(s.live_count == 0 && ascm_pool_alloc(pool, 64, 64, &a) == ASCM_ERR_NOMEM);
        POOL_OK(pool);
        ascm_pool_destroy(pool);
    }
    CHECK(entered);
}

int main(void) {
    static const test_case tests[] = {
        {"batches_hand_the_lock_over", test_batches_hand_the_lock_over},
        {"a_reset_in_a_hand_over", test_a_reset_in_a_hand_over},
        {"a_close_in_a_hand_over", test_a_close_in_a_hand_over},
    };
    return run_tests(tests, (int)(sizeof tests / sizeof tests[0]));
}
