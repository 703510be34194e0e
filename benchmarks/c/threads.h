/* The multi-thread workloads, shared by bench_threads.c (ascmem's pool,
 * its own lock) and peer_threads.cpp (OffsetAllocator behind a mutex), so
 * both run the same draws:
 *   steady:   N threads on one allocator, each with T_LIVE live blocks of
 *             log-uniform sizes [64 B, 4 MiB]; each step frees one of its
 *             own blocks at random and allocates a new one;
 *   prodcons: one thread allocates and hands each block over a ring to a
 *             second thread, which frees it (a decode thread feeding a
 *             post-processing one).
 * With the argument "small" (after the runs), steady sizes stop at 32 KiB:
 * the slab classes alone, where thread caches apply.
 * Printed: pairs per second, in all and per thread (median of runs), and
 * the round trip of a cache line between two threads (line_round_trip_ns).
 * Written with GCC's __atomic builtins and pthreads so that C and C++ share it. */
#ifndef ASCMEM_BENCH_THREADS_H
#define ASCMEM_BENCH_THREADS_H

#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

#include "workload.h"

#define T_LIVE 4096
#define T_STEPS 400000
#define RING 1024
#define T_RUNS 5

typedef struct backend {
    const char *name;
    void *(*make)(void);
    int (*alloc)(void *a, uint64_t size, uint64_t *handle); /* 0: done */
    void (*free)(void *a, uint64_t handle, uint64_t size); /* size: as allocated */
    void (*destroy)(void *a);
} backend;

typedef struct worker {
    const backend *b;
    void *a;
    pthread_barrier_t *start, *stop;
    uint64_t seed;
    int failed;
} worker;

static inline uint64_t rand_of(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static double t_max_size = 4194304.0; /* steady sizes' top: 4 MiB, or 32 KiB with "small" */

static inline uint64_t size_of(uint64_t *s) { /* 64 B .. t_max_size, log-uniform */
    double u = (double)(rand_of(s) >> 11) / 9007199254740992.0;
    return (uint64_t)exp(log(64.0) + u * (log(t_max_size) - log(64.0)));
}

static void *steady_worker(void *arg) {
    worker *w = (worker *)arg;
    uint64_t *sizes = (uint64_t *)malloc(T_STEPS * sizeof *sizes);
    uint32_t *victims = (uint32_t *)malloc(T_STEPS * sizeof *victims);
    uint64_t live[T_LIVE], live_size[T_LIVE];
    uint64_t s = w->seed;
    for (int i = 0; i < T_STEPS; i++) {
        sizes[i] = size_of(&s);
        victims[i] = (uint32_t)(rand_of(&s) % T_LIVE);
    }
    for (int i = 0; i < T_LIVE; i++)
        if (w->b->alloc(w->a, live_size[i] = size_of(&s), &live[i])) w->failed = 1;
    pthread_barrier_wait(w->start);
    for (int i = 0; i < T_STEPS && !w->failed; i++) {
        uint32_t v = victims[i];
        w->b->free(w->a, live[v], live_size[v]);
        if (w->b->alloc(w->a, live_size[v] = sizes[i], &live[v])) w->failed = 1;
    }
    pthread_barrier_wait(w->stop);
    for (int i = 0; i < T_LIVE; i++) w->b->free(w->a, live[i], live_size[i]);
    free(sizes);
    free(victims);
    return NULL;
}

/* total pairs per second of n threads on one allocator */
static double steady_threads(const backend *b, int n) {
    pthread_t t[64];
    worker w[64];
    pthread_barrier_t start, stop;
    pthread_barrier_init(&start, NULL, n + 1);
    pthread_barrier_init(&stop, NULL, n + 1);
    void *a = b->make();
    for (int i = 0; i < n; i++) {
        w[i] = (worker){b, a, &start, &stop, 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1), 0};
        pthread_create(&t[i], NULL, steady_worker, &w[i]);
    }
    pthread_barrier_wait(&start);
    double t0 = now();
    pthread_barrier_wait(&stop);
    double seconds = now() - t0;
    for (int i = 0; i < n; i++) {
        pthread_join(t[i], NULL);
        if (w[i].failed) {
            fprintf(stderr, "%s: an allocation failed\n", b->name);
            exit(2);
        }
    }
    b->destroy(a);
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&stop);
    return (double)n * T_STEPS / seconds;
}

typedef struct ring {
    uint64_t slot[RING], size[RING];
    uint64_t head, tail; /* __atomic: head written by the producer, tail by the consumer */
    const backend *b;
    void *a;
    int failed;
} ring;

static void *consumer(void *arg) {
    ring *r = (ring *)arg;
    for (uint64_t done = 0; done < T_STEPS;) {
        uint64_t head = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
        while (r->tail < head) {
            r->b->free(r->a, r->slot[r->tail % RING], r->size[r->tail % RING]);
            __atomic_store_n(&r->tail, r->tail + 1, __ATOMIC_RELEASE);
            done++;
        }
    }
    return NULL;
}

/* pairs per second: one thread allocates, another frees */
static double producer_consumer(const backend *b) {
    ring *r = (ring *)calloc(1, sizeof *r);
    r->b = b;
    r->a = b->make();
    uint64_t s = 12345;
    uint64_t *sizes = (uint64_t *)malloc(T_STEPS * sizeof *sizes);
    for (int i = 0; i < T_STEPS; i++) sizes[i] = size_of(&s) % (64 << 10) + 64; /* frames, tensors */
    if (t_max_size < 65536) /* small: the same draws, within the slab classes */
        for (int i = 0; i < T_STEPS; i++) sizes[i] = sizes[i] % 32704 + 64;
    pthread_t t;
    double t0 = now();
    pthread_create(&t, NULL, consumer, r);
    for (uint64_t i = 0; i < T_STEPS; i++) {
        while (i - __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE) >= RING) {
        }
        r->size[i % RING] = sizes[i];
        if (b->alloc(r->a, sizes[i], &r->slot[i % RING])) {
            fprintf(stderr, "%s: an allocation failed\n", b->name);
            exit(2);
        }
        __atomic_store_n(&r->head, i + 1, __ATOMIC_RELEASE);
    }
    pthread_join(t, NULL);
    double seconds = now() - t0;
    b->destroy(r->a);
    free(sizes);
    free(r);
    return T_STEPS / seconds;
}

/* The round trip of one cache line between two threads that take turns
 * writing it: what each shared line costs between this machine's cores at
 * the moment.  On shared virtual machines it moves from run to run, and
 * with it every multi-thread figure, so it is printed beside them.  Skipped (0) with one CPU: the turns would wait for
 * the scheduler. */
#define RT_TURNS 200000
static long rt_turn; /* __atomic */

/* This thread's turns: first, first + 2, ... (the other thread has the rest). */
static void rt_take_turns(long first) {
    for (long i = first; i < 2 * RT_TURNS; i += 2) {
        for (unsigned spins = 1; __atomic_load_n(&rt_turn, __ATOMIC_ACQUIRE) != i; spins++)
            if (spins % 4096 == 0) sched_yield();
        __atomic_store_n(&rt_turn, i + 1, __ATOMIC_RELEASE);
    }
}

static void *rt_other(void *arg) {
    (void)arg;
    rt_take_turns(1);
    return NULL;
}

static double line_round_trip_ns(void) {
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) return 0;
    pthread_t t;
    __atomic_store_n(&rt_turn, 0, __ATOMIC_RELAXED);
    if (pthread_create(&t, NULL, rt_other, NULL)) return 0;
    double t0 = now();
    rt_take_turns(0);
    pthread_join(t, NULL);
    return (now() - t0) / RT_TURNS * 1e9;
}

static int run_threads(const backend *b, int argc, char **argv) {
    int runs = argc > 1 ? atoi(argv[1]) : T_RUNS;
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "small")) t_max_size = 32768.0;
    if (runs < 1 || runs > 99) runs = T_RUNS;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int counts[3] = {1, 2, (int)(cpus > 64 ? 64 : cpus)};
    int ncounts = counts[2] > 2 ? 3 : 2;
    /* Rounds of every thread count in turn, so that the scaling figure is
     * the median of quotients measured within a second of each other: this
     * host's speed moves by a third from minute to minute, and medians of
     * separate series (2 threads from one minute over 1 thread from the
     * last) read 0.9x to 1.3x for the same code in one morning. */
    static double v[3][99], ratio[3][99];
    for (int i = 0; i < runs; i++)
        for (int c = 0; c < ncounts; c++) {
            v[c][i] = steady_threads(b, counts[c]);
            ratio[c][i] = v[c][i] / v[0][i];
        }
    for (int c = 0; c < ncounts; c++) {
        double m = median(v[c], runs);
        printf("steady_%d_threads_pairs_per_s %.0f\nsteady_%d_threads_pairs_per_s_per_thread %.0f\n",
               counts[c], m, counts[c], m / counts[c]);
        if (c) printf("steady_%d_threads_scaling %.3f\n", counts[c], median(ratio[c], runs));
    }
    double pc[99];
    for (int i = 0; i < runs; i++) pc[i] = producer_consumer(b);
    printf("producer_consumer_pairs_per_s %.0f\n", median(pc, runs));
    printf("line_round_trip_ns %.0f\n", line_round_trip_ns());
    return 0;
}

#endif
