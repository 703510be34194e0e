/* Times the C core without Python, on one core: the workloads of
 * workload.h, against ascm_pool with a 4 KiB unit -- as Python gets it (the
 * pool takes its lock on every call) and single-threaded (the caller
 * serialises calls, as OffsetAllocator's callers must); by address, or
 * built with -DBY_HANDLE (bench_core_handle) by handle: the caller keeps the
 * handle, as OffsetAllocator's keeps its node. */
#define _POSIX_C_SOURCE 199309L
#include "ascmem.h"
#include "workload.h"

static int single_threaded;

static ascm_pool *make_pool(uint64_t size) {
    ascm_pool *p;
    ascm_pool_config cfg = {.base = 1ull << 40, .size = size, .min_block = 4096,
                            .single_threaded = single_threaded};
    if (ascm_pool_create(&cfg, &p) != ASCM_OK) {
        fprintf(stderr, "pool create failed\n");
        exit(1);
    }
    return p;
}

static double steady(void) {
    static uint64_t sizes[STEPS], victims[STEPS], live[LIVE];
    static ascm_handle handles[LIVE];
    for (int i = 0; i < STEPS; i++) {
        sizes[i] = log_uniform();
        victims[i] = next_rand() % LIVE;
    }
    ascm_pool *p = make_pool(64ull << 30);
    for (int i = 0; i < LIVE; i++)
        if (pair_alloc(p, log_uniform(), &live[i], &handles[i]) != ASCM_OK) exit(2);
    double t0 = now();
    for (int i = 0; i < STEPS; i++) {
        uint64_t v = victims[i];
        pair_free(p, live[v], handles[v]);
        if (pair_alloc(p, sizes[i], &live[v], &handles[v]) != ASCM_OK) exit(3);
    }
    double ns = (now() - t0) * 1e9 / STEPS;
    ascm_pool_destroy(p);
    return ns;
}

static double lifo(void) {
    static uint64_t sizes[LIFO_N], addrs[LIFO_N];
    static ascm_handle handles[LIFO_N];
    for (int i = 0; i < LIFO_N; i++) sizes[i] = log_uniform();
    ascm_pool *p = make_pool(8ull << 30);
    double t0 = now();
    for (int r = 0; r < LIFO_ROUNDS; r++) {
        for (int i = 0; i < LIFO_N; i++)
            if (pair_alloc(p, sizes[i], &addrs[i], &handles[i]) != ASCM_OK) exit(4);
        for (int i = LIFO_N - 1; i >= 0; i--) pair_free(p, addrs[i], handles[i]);
    }
    double ns = (now() - t0) * 1e9 / ((double)LIFO_N * LIFO_ROUNDS);
    ascm_pool_destroy(p);
    return ns;
}

#ifndef BY_HANDLE
/* A Device's pair of 1 MiB (HUGE_FIRST), as the Python Device gets it below
 * the binding (workload.h, bench_device). */
static double device_pair(void) {
    ascm_device *d = bench_device();
    unsigned mask = ascm_kind_mask(ASCM_FREE_DEVICE);
    uint64_t addr;
    int kind, events;
    double t0 = now();
    for (int i = 0; i < STEPS; i++) {
        if (ascm_device_malloc(d, 1 << 20, 0, ASCM_SIZE_MALLOC, &addr, &kind, &events) != ASCM_OK) exit(8);
        if (ascm_device_free(d, addr, mask, &kind) != ASCM_OK) exit(9);
    }
    double ns = (now() - t0) * 1e9 / STEPS;
    ascm_device_destroy(d);
    return ns;
}
#endif

static double batch(void) {
    static uint64_t sizes[BATCH_N], addrs[BATCH_N];
    for (int i = 0; i < BATCH_N; i++) sizes[i] = log_uniform();
    ascm_pool *p = make_pool(64ull << 30);
    size_t done;
    double t0 = now();
    for (int r = 0; r < BATCH_ROUNDS; r++) {
        if (ascm_pool_alloc_many(p, sizes, BATCH_N, 64, addrs, &done) != ASCM_OK) exit(5);
        if (ascm_pool_free_many(p, addrs, BATCH_N, &done) != ASCM_OK) exit(6);
    }
    double ns = (now() - t0) * 1e9 / ((double)BATCH_N * BATCH_ROUNDS);
    ascm_pool_destroy(p);
    return ns;
}

int main(int argc, char **argv) {
    int runs = argc > 1 ? atoi(argv[1]) : RUNS;
    if (runs < 1 || runs > 99) runs = RUNS;
    double s[99], l[99], su[99], lu[99], b[99], dv[99];
    for (int i = 0; i < runs; i++) {
        single_threaded = 0;
        s[i] = steady();
        l[i] = lifo();
        b[i] = batch();
#ifndef BY_HANDLE
        dv[i] = device_pair();
#endif
        single_threaded = 1;
        su[i] = steady();
        lu[i] = lifo();
    }
    printf("steady" PATH "_ns_per_pair %.2f\nlifo" PATH "_ns_per_pair %.2f\n", median(s, runs),
           median(l, runs));
    printf("steady" PATH "_single_threaded_ns_per_pair %.2f\nlifo" PATH
           "_single_threaded_ns_per_pair %.2f\n", median(su, runs), median(lu, runs));
    printf("batch_ns_per_pair %.2f\n", median(b, runs));
#ifndef BY_HANDLE
    printf("device_1mib_ns_per_pair %.2f\n", median(dv, runs));
#endif
    return 0;
}
