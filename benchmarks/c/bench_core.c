/* Times the C core without Python, on one core.
 *   steady: 10,000 live blocks; each step frees a random live block and
 *           allocates a new one; sizes log-uniform in [64 B, 4 MiB]; every
 *           random draw is made before the timed loop.
 *   lifo:   allocate 1,000 mixed sizes, free them in reverse; repeated.
 * Prints the median of several runs, in ns per allocate+free pair. */
#define _POSIX_C_SOURCE 199309L
#include "ascmem.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LIVE 10000
#define STEPS 2000000
#define LIFO_N 1000
#define LIFO_ROUNDS 2000
#define RUNS 7

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static uint64_t log_uniform(void) { /* 64 B .. 4 MiB */
    double u = (double)(next_rand() >> 11) / 9007199254740992.0;
    return (uint64_t)exp(log(64.0) + u * (log(4194304.0) - log(64.0)));
}
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static ascm_pool *make_pool(uint64_t size) {
    ascm_pool *p;
    ascm_pool_config cfg = {.base = 1ull << 40, .size = size, .min_block = 4096};
    if (ascm_pool_create(&cfg, &p) != ASCM_OK) {
        fprintf(stderr, "pool create failed\n");
        exit(1);
    }
    return p;
}

static double steady(void) {
    static uint64_t sizes[STEPS], victims[STEPS], live[LIVE];
    for (int i = 0; i < STEPS; i++) {
        sizes[i] = log_uniform();
        victims[i] = next_rand() % LIVE;
    }
    ascm_pool *p = make_pool(64ull << 30);
    for (int i = 0; i < LIVE; i++)
        if (ascm_pool_alloc(p, log_uniform(), 64, &live[i]) != ASCM_OK) exit(2);
    double t0 = now();
    for (int i = 0; i < STEPS; i++) {
        uint64_t v = victims[i];
        ascm_pool_free(p, live[v]);
        if (ascm_pool_alloc(p, sizes[i], 64, &live[v]) != ASCM_OK) exit(3);
    }
    double ns = (now() - t0) * 1e9 / STEPS;
    ascm_pool_destroy(p);
    return ns;
}

static double lifo(void) {
    static uint64_t sizes[LIFO_N], addrs[LIFO_N];
    for (int i = 0; i < LIFO_N; i++) sizes[i] = log_uniform();
    ascm_pool *p = make_pool(8ull << 30);
    double t0 = now();
    for (int r = 0; r < LIFO_ROUNDS; r++) {
        for (int i = 0; i < LIFO_N; i++)
            if (ascm_pool_alloc(p, sizes[i], 64, &addrs[i]) != ASCM_OK) exit(4);
        for (int i = LIFO_N - 1; i >= 0; i--) ascm_pool_free(p, addrs[i]);
    }
    double ns = (now() - t0) * 1e9 / ((double)LIFO_N * LIFO_ROUNDS);
    ascm_pool_destroy(p);
    return ns;
}

int main(int argc, char **argv) {
    int runs = argc > 1 ? atoi(argv[1]) : RUNS;
    if (runs < 1 || runs > 99) runs = RUNS;
    double s[99], l[99];
    for (int i = 0; i < runs; i++) {
        s[i] = steady();
        l[i] = lifo();
    }
    qsort(s, runs, sizeof s[0], cmp);
    qsort(l, runs, sizeof l[0], cmp);
    printf("steady_ns_per_pair %.2f\nlifo_ns_per_pair %.2f\n", s[runs / 2], l[runs / 2]);
    return 0;
}
