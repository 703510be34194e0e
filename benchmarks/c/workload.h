/* The two workloads of the C benchmarks, shared by bench_core.c (ascmem) and
 * peer_offset.cpp (OffsetAllocator), so both draw the same sizes.
 *   steady: LIVE live blocks; each step frees a random live block and
 *           allocates a new one; sizes log-uniform in [64 B, 4 MiB]; every
 *           random draw is made before the timed loop.
 *   lifo:   allocate LIFO_N mixed sizes, free them in reverse; repeated.
 *   batch:  (ascmem only) alloc_many of BATCH_N mixed sizes, then free_many
 *           of them in the same order: what Python's Pool.alloc_many +
 *           free_many does below the binding.
 * Results are the median of several runs, in ns per allocate+free pair. */
#ifndef ASCMEM_BENCH_WORKLOAD_H
#define ASCMEM_BENCH_WORKLOAD_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define LIVE 10000
#define STEPS 2000000
#define LIFO_N 1000
#define LIFO_ROUNDS 2000
#define BATCH_N 100000
#define BATCH_ROUNDS 10
#define RUNS 7

static uint64_t bench_rng = 88172645463325252ull;
static inline uint64_t next_rand(void) {
    bench_rng ^= bench_rng << 13;
    bench_rng ^= bench_rng >> 7;
    bench_rng ^= bench_rng << 17;
    return bench_rng;
}
static inline uint64_t log_uniform(void) { /* 64 B .. 4 MiB */
    double u = (double)(next_rand() >> 11) / 9007199254740992.0;
    return (uint64_t)exp(log(64.0) + u * (log(4194304.0) - log(64.0)));
}
static inline double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static inline double median(double *v, int n) {
    qsort(v, n, sizeof v[0], cmp_double);
    return v[n / 2];
}

#ifdef ASCMEM_H /* ascmem's programs (bench_core.c, instructions.c) */
/* One allocation and one free: by address, or, built with -DBY_HANDLE, by
 * handle (a binary of its own, so that each loop inlines one path). */
#ifdef BY_HANDLE
#define pair_alloc(p, size, addr, h) ascm_pool_alloc_handle(p, size, 64, addr, h)
#define pair_free(p, addr, h) ascm_pool_free_handle(p, h)
#define PATH "_handle"
#else
#define pair_alloc(p, size, addr, h) ascm_pool_alloc(p, size, 64, addr)
#define pair_free(p, addr, h) ((void)(h), ascm_pool_free(p, addr))
#define PATH ""
#endif

#include <string.h>

/* The Device of the 1 MiB Device pair: huge and normal memory and a budget
 * that never refuses; HUGE_FIRST puts 1 MiB on huge pages, so each pair
 * empties and refills a 2 MiB page and charges the budget twice. */
static inline ascm_device *bench_device(void) {
    ascm_device_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.min_block = 4096;
    cfg.base[ASCM_KIND_HUGE] = 1ull << 44;
    cfg.size[ASCM_KIND_HUGE] = 8ull << 30;
    cfg.base[ASCM_KIND_NORMAL] = 1ull << 45;
    cfg.size[ASCM_KIND_NORMAL] = 8ull << 30;
    cfg.budget.shared = 32ull << 30;
    cfg.budget.huge_grows = 1;
    ascm_device *d;
    if (ascm_device_create(&cfg, &d) != ASCM_OK) exit(7);
    return d;
}
#endif

#endif
