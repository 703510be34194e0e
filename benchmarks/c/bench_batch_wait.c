/* How long a single allocation waits for the pool lock while another thread
 * runs batches (`make -C benchmarks/c batch-wait`).  One thread runs ROUNDS
 * of alloc_many + free_many of BATCH_N mixed sizes (workload.h); another
 * makes 64-byte pairs back to back and times each.  Printed, a `name value`
 * line each (`ascmem bench` reads them): its pairs, its longest wait, how
 * many waits were over 100 us and over 1 ms, and the longest batch pair.  A batch hands the lock to a waiter every 256 blocks
 * (pool.c), so the waits should be a slice's length, not a batch's. */
#define _POSIX_C_SOURCE 199309L
#include "ascmem.h"
#include "workload.h"

#include <pthread.h>
#include <stdatomic.h>

#define ROUNDS 20

static ascm_pool *pool;
static atomic_int running, stop;

static void *single_pairs(void *arg) {
    (void)arg;
    double worst = 0;
    long pairs = 0, over_100us = 0, over_1ms = 0;
    while (!atomic_load(&running)) ;
    while (!atomic_load(&stop)) {
        double t0 = now();
        uint64_t a;
        if (ascm_pool_alloc(pool, 64, 64, &a) == ASCM_OK) ascm_pool_free(pool, a);
        double d = now() - t0;
        if (d > worst) worst = d;
        pairs++;
        over_100us += d > 1e-4;
        over_1ms += d > 1e-3;
    }
    printf("single_pairs %ld\nlongest_wait_us %.0f\nwaits_over_100us %ld\nwaits_over_1ms %ld\n", pairs,
           worst * 1e6, over_100us, over_1ms);
    return NULL;
}

int main(void) {
    ascm_pool_config cfg = {.base = 1ull << 40, .size = 64ull << 30, .min_block = 4096};
    if (ascm_pool_create(&cfg, &pool) != ASCM_OK) return 1;
    static uint64_t sizes[BATCH_N], addrs[BATCH_N];
    for (int i = 0; i < BATCH_N; i++) sizes[i] = log_uniform();
    pthread_t t;
    if (pthread_create(&t, NULL, single_pairs, NULL) != 0) return 1;
    atomic_store(&running, 1);
    double longest = 0;
    for (int r = 0; r < ROUNDS; r++) {
        size_t done;
        double t0 = now();
        if (ascm_pool_alloc_many(pool, sizes, BATCH_N, 64, addrs, &done) != ASCM_OK) return 3;
        ascm_pool_free_many(pool, addrs, BATCH_N, &done);
        if (now() - t0 > longest) longest = now() - t0;
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    printf("batch_blocks %d\nlongest_batch_pair_ms %.1f\n", BATCH_N, longest * 1e3);
    ascm_pool_destroy(pool);
    return 0;
}
