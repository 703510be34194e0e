/* Thread caches (tcache.c) under threads, run by `make -C csrc test` under
 * ASan and UBSan: no block handed to two callers, check() and statistics
 * exact while other threads run, double and bad frees refused, cross-thread
 * frees, thread exit, pool destruction before a thread's exit, fork, an
 * allocation that only fits once the caches are flushed, and a Device's
 * kinds under threads, whose pools share the budget's lock, with and
 * without the device's thread caches; torch's requested bytes counted per
 * thread by the pluggable functions. */
#include "../ascmem.h"
#include "../internal.h"
#include "../pool_core.h" /* the tests read pool internals */

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define BASE (1ull << 32)
#define SIZE (64ull << 20)
#define CELL 32 /* the smallest slot: one owner byte per 32 bytes of the range */

static uint8_t owner[SIZE / CELL]; /* __atomic: thread id + 1 of a block starting there */

static uint64_t rand_of(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static ascm_pool *new_pool(uint64_t size, int mode) {
    ascm_pool_config cfg = {.base = BASE, .size = size, .min_block = 4096};
    ascm_pool *p;
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    CHECK(ascm_pool_set_thread_caches(p, mode) == ASCM_OK);
    return p;
}

/* claims the block's first cell for thread id: fails if another caller has it */
static void claim(uint64_t addr, int id) {
    uint8_t expected = 0;
    int ok = __atomic_compare_exchange_n(&owner[(addr - BASE) / CELL], &expected, (uint8_t)(id + 1), 0,
                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    if (!ok) fprintf(stderr, "block %#llx handed to thread %d while thread %d holds it\n",
                     (unsigned long long)addr, id, expected - 1);
    CHECK(ok);
}
static void unclaim(uint64_t addr) { __atomic_store_n(&owner[(addr - BASE) / CELL], 0, __ATOMIC_RELEASE); }

typedef struct steady {
    ascm_pool *p;
    int id, steps;
    uint64_t seed;
} steady;

#define LIVE 512

/* Random sizes, mostly slab classes, some large; frees its own blocks. */
static void *steady_worker(void *arg) {
    steady *w = arg;
    uint64_t live[LIVE] = {0}, s = w->seed;
    for (int i = 0; i < w->steps; i++) {
        int v = (int)(rand_of(&s) % LIVE);
        if (live[v]) {
            unclaim(live[v]);
            CHECK(ascm_pool_free(w->p, live[v]) == ASCM_OK);
            live[v] = 0;
        }
        uint64_t size = rand_of(&s) % 8 ? 1 + rand_of(&s) % 4096 : 1 + rand_of(&s) % 100000;
        if (ascm_pool_alloc(w->p, size, 16, &live[v]) == ASCM_OK) claim(live[v], w->id);
        else live[v] = 0;
    }
    for (int v = 0; v < LIVE; v++)
        if (live[v]) {
            unclaim(live[v]);
            CHECK(ascm_pool_free(w->p, live[v]) == ASCM_OK);
        }
    return NULL;
}

/* Four threads at once, while this one checks and reads statistics. */
static void test_threads_share_a_pool(void) {
    ascm_pool *p = new_pool(SIZE, ASCM_CACHES_ON);
    pthread_t t[4];
    steady w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (steady){p, i, 200000, 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1)};
        CHECK(pthread_create(&t[i], NULL, steady_worker, &w[i]) == 0);
    }
    for (int i = 0; i < 50; i++) {
        POOL_OK(p);
        ascm_stats st;
        ascm_pool_stats(p, &st);
        CHECK(st.alloc_count - st.free_count == st.live_count);
        CHECK(st.used <= st.peak_used && st.requested <= st.used);
        usleep(1000);
    }
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    ascm_stats st;
    ascm_pool_stats(p, &st);
    CHECK(st.live_count == 0 && st.used == 0 && st.requested == 0);
    CHECK(st.alloc_count == st.free_count && st.alloc_count > 0);
    POOL_OK(p);
    ascm_pool_trim(p);
    ascm_pool_stats(p, &st);
    CHECK(st.free == st.capacity && st.largest_free == st.capacity); /* every cached slot came back */
    ascm_pool_destroy(p);
}

/* slab_max switched (0, 100, 2048, the largest class, more) while four
 * threads allocate through their caches -- by address, by handle and in
 * batches -- and free their own blocks and each other's: a block keeps the
 * path it was placed by, so no block is handed to two callers, every free
 * of a live block succeeds, and the pool stays whole.  Under TSan: the
 * limit the caches read without the lock. */
typedef struct switcher {
    ascm_pool *p;
    int id, steps;
    uint64_t seed;
} switcher;

static void *switch_worker(void *arg) {
    switcher *w = arg;
    uint64_t live[LIVE] = {0}, s = w->seed;
    ascm_handle h[LIVE] = {0};
    for (int i = 0; i < w->steps; i++) {
        int v = (int)(rand_of(&s) % LIVE);
        if (live[v]) {
            unclaim(live[v]);
            CHECK((h[v] ? ascm_pool_free_handle(w->p, h[v]) : ascm_pool_free(w->p, live[v])) == ASCM_OK);
            live[v] = h[v] = 0;
        }
        uint64_t size = rand_of(&s) % 8 ? 1 + rand_of(&s) % 4096 : 1 + rand_of(&s) % 40000;
        int how = (int)(rand_of(&s) % 3), st;
        if (how == 0) {
            st = ascm_pool_alloc_handle(w->p, size, 16, &live[v], &h[v]);
        } else if (how == 1 && v + 4 <= LIVE && !live[v + 1] && !live[v + 2] && !live[v + 3]) {
            uint64_t sizes[4] = {size, 1 + size / 2, 1 + size / 3, 1 + size / 5};
            size_t done;
            st = ascm_pool_alloc_many(w->p, sizes, 4, 16, &live[v], &done);
            CHECK(st == ASCM_OK ? done == 4 : done == 0);
            for (int j = 1; st == ASCM_OK && j < 4; j++) claim(live[v + j], w->id);
        } else {
            st = ascm_pool_alloc(w->p, size, 16, &live[v]);
        }
        if (st == ASCM_OK) {
            claim(live[v], w->id);
        } else {
            CHECK(st == ASCM_ERR_NOMEM);
            live[v] = h[v] = 0;
        }
    }
    for (int v = 0; v < LIVE; v++)
        if (live[v]) {
            unclaim(live[v]);
            CHECK((h[v] ? ascm_pool_free_handle(w->p, h[v]) : ascm_pool_free(w->p, live[v])) == ASCM_OK);
        }
    return NULL;
}

static void test_slab_max_switched_under_threads(void) {
    ascm_pool *p = new_pool(SIZE, ASCM_CACHES_ON);
    pthread_t t[4];
    switcher w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (switcher){p, i, 60000, 0xD1B54A32D192ED03ull * (uint64_t)(i + 1)};
        CHECK(pthread_create(&t[i], NULL, switch_worker, &w[i]) == 0);
    }
    uint64_t limits[] = {0, 100, 2048, 32768, 1ull << 40, 0, 4096};
    int placements[] = {ASCM_PLACE_KEPT_IN_PLACE, ASCM_PLACE_LOWEST_EQUAL, ASCM_PLACE_KEPT_TO_BEST_FIT};
    for (int i = 0; i < 120; i++) {
        CHECK(ascm_pool_set_slab_max(p, limits[i % 7]) == ASCM_OK);
        if (i % 5 == 0) CHECK(ascm_pool_set_placement(p, placements[(i / 5) % 3]) == ASCM_OK);
        if (i % 10 == 0) ascm_pool_trim(p);
        if (i % 4 == 0) POOL_OK(p);
        usleep(300);
    }
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    ascm_stats st;
    ascm_pool_stats(p, &st);
    CHECK(st.live_count == 0 && st.used == 0 && st.requested == 0);
    POOL_OK(p);
    ascm_pool_trim(p);
    ascm_pool_stats(p, &st);
    CHECK(st.free == st.capacity && st.largest_free == st.capacity); /* every cached slot came back */
    ascm_pool_destroy(p);
}

typedef struct ring {
    ascm_pool *p;
    uint64_t slot[256];
    uint64_t head, tail; /* __atomic */
    int n;
} ring;

static void *consume(void *arg) {
    ring *r = arg;
    for (int done = 0; done < r->n;) {
        uint64_t head = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
        for (; r->tail < head; done++) {
            uint64_t a = r->slot[r->tail % 256];
            unclaim(a);
            CHECK(ascm_pool_free(r->p, a) == ASCM_OK);
            __atomic_store_n(&r->tail, r->tail + 1, __ATOMIC_RELEASE);
        }
    }
    return NULL;
}

/* One thread allocates, another frees: blocks move from cache to cache. */
static void test_cross_thread_frees(void) {
    ascm_pool *p = new_pool(SIZE, ASCM_CACHES_ON);
    ring *r = calloc(1, sizeof *r);
    r->p = p;
    r->n = 100000;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, consume, r) == 0);
    uint64_t s = 77;
    for (uint64_t i = 0; i < (uint64_t)r->n; i++) {
        while (i - __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE) >= 256) {
        }
        uint64_t a;
        CHECK(ascm_pool_alloc(p, 1 + rand_of(&s) % 20000, 8, &a) == ASCM_OK);
        claim(a, 0);
        r->slot[i % 256] = a;
        __atomic_store_n(&r->head, i + 1, __ATOMIC_RELEASE);
    }
    pthread_join(t, NULL);
    ascm_stats st;
    ascm_pool_stats(p, &st);
    CHECK(st.live_count == 0 && st.used == 0 && st.alloc_count == (uint64_t)r->n);
    POOL_OK(p);
    free(r);
    ascm_pool_destroy(p);
}

typedef struct victim {
    ascm_pool *p;
    uint64_t addr;
    int st;
} victim;

static void *free_it(void *arg) {
    victim *v = arg;
    v->st = ascm_pool_free(v->p, v->addr);
    return NULL;
}

/* A slot in a cache is free: freeing it again, from any thread, is a bad
 * free, and so is an address inside a slot. */
static void test_bad_frees(void) {
    ascm_pool *p = new_pool(SIZE, ASCM_CACHES_ON);
    uint64_t a, b;
    CHECK(ascm_pool_alloc(p, 100, 8, &a) == ASCM_OK);
    CHECK(ascm_pool_alloc(p, 100, 8, &b) == ASCM_OK);
    CHECK(ascm_pool_free(p, a + 8) == ASCM_ERR_BADFREE);
    CHECK(ascm_pool_free(p, a) == ASCM_OK);
    CHECK(ascm_pool_free(p, a) == ASCM_ERR_BADFREE);
    victim v = {p, a, 0};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, free_it, &v) == 0);
    pthread_join(t, NULL);
    CHECK(v.st == ASCM_ERR_BADFREE);
    v = (victim){p, b, 0}; /* another thread's free of a live block is fine */
    CHECK(pthread_create(&t, NULL, free_it, &v) == 0);
    pthread_join(t, NULL);
    CHECK(v.st == ASCM_OK);
    CHECK(ascm_pool_free(p, b) == ASCM_ERR_BADFREE);
    CHECK(ascm_pool_free(p, BASE + SIZE) == ASCM_ERR_BADFREE);
    CHECK(ascm_pool_free(p, BASE - 64) == ASCM_ERR_BADFREE);
    uint64_t usable;
    CHECK(ascm_pool_usable_size(p, a, &usable) == ASCM_ERR_BADFREE); /* cached: nobody's */
    ascm_stats st;
    ascm_pool_stats(p, &st);
    CHECK(st.live_count == 0 && st.alloc_count == 2 && st.free_count == 2);
    POOL_OK(p);
    ascm_pool_destroy(p);
}

typedef struct quitter {
    ascm_pool *p;
    pthread_barrier_t *cached, *gone;
} quitter;

/* Fills its cache, then waits while the pool is destroyed, then exits. */
static void *fill_then_wait(void *arg) {
    quitter *q = arg;
    uint64_t a[64];
    for (int i = 0; i < 64; i++) CHECK(ascm_pool_alloc(q->p, 64, 8, &a[i]) == ASCM_OK);
    for (int i = 0; i < 64; i++) CHECK(ascm_pool_free(q->p, a[i]) == ASCM_OK);
    pthread_barrier_wait(q->cached);
    if (q->gone) pthread_barrier_wait(q->gone); /* the pool is destroyed meanwhile */
    return NULL;
}

/* A thread's cache goes back when the thread ends; a pool destroyed before
 * its threads end leaves them nothing to touch (ASan would say). */
static void test_thread_exit_and_destroy(void) {
    ascm_pool *p = new_pool(SIZE, ASCM_CACHES_ON);
    pthread_barrier_t cached, gone;
    pthread_barrier_init(&cached, NULL, 2);
    pthread_barrier_init(&gone, NULL, 2);
    quitter q = {p, &cached, NULL};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, fill_then_wait, &q) == 0);
    pthread_barrier_wait(&cached);
    pthread_join(t, NULL);
    ascm_stats st;
    ascm_pool_stats(p, &st);
    CHECK(st.live_count == 0 && st.alloc_count == 64 && st.free_count == 64);
    POOL_OK(p);
    q.gone = &gone;
    CHECK(pthread_create(&t, NULL, fill_then_wait, &q) == 0);
    pthread_barrier_wait(&cached);
    ascm_pool_destroy(p);
    p = new_pool(SIZE, ASCM_CACHES_ON); /* likely at the same address */
    uint64_t a;
    CHECK(ascm_pool_alloc(p, 64, 8, &a) == ASCM_OK && ascm_pool_free(p, a) == ASCM_OK);
    pthread_barrier_wait(&gone);
    pthread_join(t, NULL);
    POOL_OK(p);
    ascm_pool_destroy(p);
    pthread_barrier_destroy(&cached);
    pthread_barrier_destroy(&gone);
}

/* Slots parked in caches do not make an allocation fail. */
static void test_full_pool_flushes_caches(void) {
    ascm_pool *p = new_pool(1u << 20, ASCM_CACHES_ON);
    uint64_t a[256];
    int n = 0;
    while (n < 256 && ascm_pool_alloc(p, 4096, 8, &a[n]) == ASCM_OK) n++;
    CHECK(n >= 200);
    for (int i = 0; i < n; i++) CHECK(ascm_pool_free(p, a[i]) == ASCM_OK);
    uint64_t big;
    CHECK(ascm_pool_alloc(p, 1u << 20, 4096, &big) == ASCM_OK); /* the whole range */
    CHECK(ascm_pool_free(p, big) == ASCM_OK);
    POOL_OK(p);
    ascm_pool_destroy(p);
}

/* The child of a fork gets the forking thread's pool without the other
 * threads' caches: their slots go back, and the counts follow. */
static void test_fork_with_caches(void) {
    ascm_pool *p = new_pool(SIZE, ASCM_CACHES_ON);
    pthread_barrier_t cached, gone;
    pthread_barrier_init(&cached, NULL, 2);
    pthread_barrier_init(&gone, NULL, 2);
    quitter q = {p, &cached, &gone};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, fill_then_wait, &q) == 0);
    pthread_barrier_wait(&cached); /* its cache holds slots now */
    uint64_t mine;
    CHECK(ascm_pool_alloc(p, 64, 8, &mine) == ASCM_OK);
    pid_t pid = fork();
    if (pid == 0) {
        char m[128];
        ascm_stats st;
        ascm_pool_stats(p, &st);
        int ok = ascm_pool_check(p, m, sizeof m) == ASCM_OK && st.live_count == 1 &&
                 ascm_pool_free(p, mine) == ASCM_OK && ascm_pool_trim(p) > 0;
        ascm_pool_stats(p, &st);
        _exit(ok && st.free == st.capacity ? 0 : 3);
    }
    int status = -1;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    pthread_barrier_wait(&gone);
    pthread_join(t, NULL);
    CHECK(ascm_pool_free(p, mine) == ASCM_OK);
    POOL_OK(p);
    ascm_pool_destroy(p);
    pthread_barrier_destroy(&cached);
    pthread_barrier_destroy(&gone);
}

/* Off by default; AUTO turns caches on when threads meet at the lock; OFF
 * flushes them. */
static void test_modes(void) {
    ascm_pool *p = new_pool(SIZE, ASCM_CACHES_OFF);
    ascm_pool_config plain = {.base = BASE, .size = SIZE, .min_block = 4096};
    ascm_pool *q;
    CHECK(ascm_pool_create(&plain, &q) == ASCM_OK);
    CHECK(q->caches_mode == ASCM_CACHES_OFF);
    ascm_pool_destroy(q);
    CHECK(ascm_pool_set_thread_caches(p, ASCM_CACHES_AUTO) == ASCM_OK);
    CHECK(!ascm_caches_on(p) && !ascm_pool_thread_caches_on(p));
    pthread_t t[2];
    steady w[2];
    for (int round = 0; round < 20 && !ascm_caches_on(p); round++) {
        for (int i = 0; i < 2; i++) {
            w[i] = (steady){p, i, 20000, 1234567ull * (uint64_t)(i + 1 + round)};
            CHECK(pthread_create(&t[i], NULL, steady_worker, &w[i]) == 0);
        }
        for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    }
    CHECK(ascm_caches_on(p) && ascm_pool_thread_caches_on(p));
    uint64_t a;
    CHECK(ascm_pool_alloc(p, 64, 8, &a) == ASCM_OK && ascm_pool_free(p, a) == ASCM_OK); /* cached */
    CHECK(ascm_pool_set_thread_caches(p, ASCM_CACHES_OFF) == ASCM_OK);
    CHECK(!ascm_caches_on(p) && !ascm_pool_thread_caches_on(p));
    CHECK(ascm_pool_set_thread_caches(p, 7) == ASCM_ERR_INVAL);
    ascm_stats st;
    ascm_pool_stats(p, &st);
    CHECK(st.live_count == 0 && st.alloc_count == st.free_count);
    POOL_OK(p);
    ascm_pool_destroy(p);
    ascm_pool_config cfg = {.base = BASE, .size = SIZE, .min_block = 4096, .single_threaded = 1};
    CHECK(ascm_pool_create(&cfg, &p) == ASCM_OK);
    CHECK(ascm_pool_set_thread_caches(p, ASCM_CACHES_ON) == ASCM_ERR_INVAL);
    CHECK(ascm_pool_set_thread_caches(p, ASCM_CACHES_OFF) == ASCM_OK);
    ascm_pool_destroy(p);
}

/* A thread keeps caches for 8 pools: the others are served by their lock,
 * and a destroyed pool's entry is taken by the next. */
static void test_more_pools_than_entries(void) {
    enum { N = 12 };
    ascm_pool *p[N];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            ascm_pool_config cfg = {.base = BASE + ((uint64_t)i << 28), .size = 1u << 24, .min_block = 4096};
            CHECK(ascm_pool_create(&cfg, &p[i]) == ASCM_OK);
            CHECK(ascm_pool_set_thread_caches(p[i], ASCM_CACHES_ON) == ASCM_OK);
        }
        for (int i = 0; i < N; i++) {
            uint64_t a[10];
            for (int j = 0; j < 10; j++) CHECK(ascm_pool_alloc(p[i], 100, 8, &a[j]) == ASCM_OK);
            for (int j = 0; j < 10; j++) CHECK(ascm_pool_free(p[i], a[j]) == ASCM_OK);
            CHECK(ascm_pool_free(p[i], a[0]) == ASCM_ERR_BADFREE);
        }
        for (int i = 0; i < N; i++) {
            ascm_stats st;
            ascm_pool_stats(p[i], &st);
            CHECK(st.live_count == 0 && st.alloc_count == 10 && st.free_count == 10);
            POOL_OK(p[i]);
            ascm_pool_destroy(p[i]);
        }
    }
}

typedef struct racer {
    ascm_pool *p;
    uint64_t seed;
    int stop; /* __atomic */
    int crashed_or_lost;
} racer;

/* Allocates and frees small blocks until told to stop; a free refused
 * because a reset came first is expected, anything else is not. */
static void *race(void *arg) {
    racer *r = arg;
    uint64_t live[64] = {0}, s = r->seed;
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
        int v = (int)(rand_of(&s) % 64);
        if (live[v]) {
            int st = ascm_pool_free(r->p, live[v]);
            if (st != ASCM_OK && st != ASCM_ERR_BADFREE) r->crashed_or_lost++;
            live[v] = 0;
        }
        int st = ascm_pool_alloc(r->p, 1 + rand_of(&s) % 30000, 8, &live[v]);
        if (st != ASCM_OK) {
            if (st != ASCM_ERR_NOMEM) r->crashed_or_lost++;
            live[v] = 0;
        }
    }
    for (int v = 0; v < 64; v++)
        if (live[v]) ascm_pool_free(r->p, live[v]);
    return NULL;
}

/* Modes switched, the pool reset and trimmed while threads allocate and
 * free through their caches: every call returns a status, and the pool
 * stays whole. */
static void test_modes_and_resets_race_the_caches(void) {
    ascm_pool *p = new_pool(SIZE, ASCM_CACHES_ON);
    pthread_t t[3];
    racer r[3];
    for (int i = 0; i < 3; i++) {
        r[i] = (racer){p, 99u + (uint64_t)i, 0, 0};
        CHECK(pthread_create(&t[i], NULL, race, &r[i]) == 0);
    }
    int modes[] = {ASCM_CACHES_OFF, ASCM_CACHES_ON, ASCM_CACHES_AUTO, ASCM_CACHES_ON};
    for (int i = 0; i < 200; i++) {
        CHECK(ascm_pool_set_thread_caches(p, modes[i % 4]) == ASCM_OK);
        if (i % 50 == 49) ascm_pool_reset(p);
        if (i % 10 == 0) ascm_pool_trim(p);
        if (i % 20 == 0) POOL_OK(p);
        usleep(200);
    }
    for (int i = 0; i < 3; i++) __atomic_store_n(&r[i].stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        CHECK(r[i].crashed_or_lost == 0);
    }
    POOL_OK(p);
    ascm_pool_reset(p);
    ascm_stats st;
    ascm_pool_stats(p, &st);
    CHECK(st.live_count == 0 && st.used == 0);
    POOL_OK(p);
    ascm_pool_destroy(p);
}

/* A Device's charged pools take the budget's lock as theirs (device.c): two
 * threads on huge pages (one pool with thread caches on), one on normal
 * pages, while the main thread reads the budget and the statistics, trims
 * and checks.  The budget must never pass its rules, must come back to zero,
 * and its peaks must stay within them. */
typedef struct device_worker {
    ascm_device *d;
    uint32_t policy; /* aclrtMemMallocPolicy: 1 HUGE_ONLY, 2 NORMAL_ONLY */
    uint64_t seed;
    int steps, refused;
} device_worker;

static void *device_churn(void *arg) {
    device_worker *w = arg;
    uint64_t live[64] = {0}, s = w->seed;
    int kind, events;
    for (int i = 0; i < w->steps; i++) {
        int v = (int)(rand_of(&s) % 64);
        if (live[v]) {
            CHECK(ascm_device_free(w->d, live[v], ascm_kind_mask(ASCM_FREE_DEVICE), &kind) == ASCM_OK);
            live[v] = 0;
        }
        uint64_t size = rand_of(&s) % 4 ? 1 + rand_of(&s) % 8192 : 1 + rand_of(&s) % (3u << 20);
        int st = ascm_device_malloc(w->d, size, w->policy, ASCM_SIZE_MALLOC, &live[v], &kind, &events);
        CHECK(st == ASCM_OK || st == ASCM_ERR_NOMEM || st == ASCM_ERR_BUDGET);
        if (st != ASCM_OK) {
            live[v] = 0;
            w->refused++;
        }
    }
    for (int v = 0; v < 64; v++)
        if (live[v]) CHECK(ascm_device_free(w->d, live[v], ascm_kind_mask(ASCM_FREE_DEVICE), &kind) == ASCM_OK);
    return NULL;
}

/* Runs of one size, each block freed at once: the kept block's reuse loop,
 * whose free leaves the discharge of its pages deferred (pool.c). */
static void *device_reuse_loop(void *arg) {
    device_worker *w = arg;
    uint64_t a;
    int kind, events;
    for (int i = 0; i < w->steps; i++) {
        uint64_t size = (uint64_t)(1 + (i / 500) % 3) << 20;
        int st = ascm_device_malloc(w->d, size, w->policy, ASCM_SIZE_MALLOC, &a, &kind, &events);
        CHECK(st == ASCM_OK || st == ASCM_ERR_NOMEM || st == ASCM_ERR_BUDGET);
        if (st == ASCM_OK)
            CHECK(ascm_device_free(w->d, a, ascm_kind_mask(ASCM_FREE_DEVICE), &kind) == ASCM_OK);
        else
            w->refused++;
    }
    return NULL;
}

/* A device of 1 GiB of huge pages at 2^40 and normal pages at normal_base. */
static ascm_device_config huge_and_normal(uint64_t normal_base, uint64_t normal_size) {
    ascm_device_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.min_block = 4096;
    cfg.base[ASCM_KIND_HUGE] = 1ull << 40;
    cfg.size[ASCM_KIND_HUGE] = 1ull << 30;
    cfg.base[ASCM_KIND_NORMAL] = normal_base;
    cfg.size[ASCM_KIND_NORMAL] = normal_size;
    return cfg;
}

static void test_device_kinds_share_the_budget_lock(void) {
    ascm_device_config cfg = huge_and_normal(1ull << 41, 1ull << 30);
    cfg.budget.reserve = 16ull << 20; /* far under what two threads ask: refusals happen */
    cfg.budget.shared = 32ull << 20;
    ascm_device *d;
    CHECK(ascm_device_create(&cfg, &d) == ASCM_OK);
    CHECK(ascm_pool_set_thread_caches(ascm_device_pool(d, ASCM_KIND_HUGE), ASCM_CACHES_ON) == ASCM_OK);
    /* and a reuse loop on normal pages (a pool without caches), and on huge
     * ones (caches on: every call settles) */
    device_worker w[5] = {{d, 1, 5, 40000, 0}, {d, 1, 6, 40000, 0}, {d, 2, 7, 40000, 0},
                          {d, 2, 8, 40000, 0}, {d, 1, 9, 40000, 0}};
    pthread_t t[5];
    for (int i = 0; i < 5; i++)
        CHECK(pthread_create(&t[i], NULL, i < 3 ? device_churn : device_reuse_loop, &w[i]) == 0);
    for (int i = 0; i < 200; i++) {
        ascm_budget b;
        uint64_t charged, held;
        ascm_device_huge_pages(d, &charged, &held);
        CHECK(charged == held);
        ascm_device_budget(d, &b);
        CHECK(b.huge_used <= b.reserve && b.normal_used <= b.shared);
        CHECK(b.peak_huge <= b.reserve && b.peak_normal <= b.shared);
        CHECK(b.huge_used <= b.peak_huge && b.normal_used <= b.peak_normal);
        CHECK(b.huge_used % (2u << 20) == 0 && b.normal_used % 4096 == 0);
        ascm_stats st;
        ascm_device_kind_stats(d, ASCM_KIND_HUGE, &st);
        if (i % 20 == 0) ascm_device_trim(d);
        if (i % 10 == 0) {
            POOL_OK(ascm_device_pool(d, ASCM_KIND_HUGE));
            POOL_OK(ascm_device_pool(d, ASCM_KIND_NORMAL));
        }
        usleep(200);
    }
    for (int i = 0; i < 5; i++) pthread_join(t[i], NULL);
    ascm_device_trim(d);
    ascm_budget b;
    ascm_device_budget(d, &b);
    CHECK(b.huge_used == 0 && b.normal_used == 0);
    CHECK(b.peak_huge > 0 && b.peak_huge <= b.reserve && b.peak_normal > 0 && b.peak_normal <= b.shared);
    CHECK(w[0].refused + w[1].refused > 0); /* the huge reserve was the limit, not the range */
    POOL_OK(ascm_device_pool(d, ASCM_KIND_HUGE));
    POOL_OK(ascm_device_pool(d, ASCM_KIND_NORMAL));
    ascm_device_destroy(d);
}

/* A Device with thread caches (ascm_device_set_thread_caches): the GIL-free
 * calls of four threads on normal pages, each block claimed by address, while
 * the main thread reads statistics and the budget, checks, trims, and shuts
 * the gate (quiesce, reopen): calls meanwhile are refused, never inside.  The
 * gate counts callers in one of several stripes by thread; quiesce must wait
 * for all of them. */
typedef struct device_claimer {
    ascm_device *d;
    int id, steps, closed;
} device_claimer;

static int device_free_retrying(device_claimer *w, uint64_t a) {
    int kind, st;
    while ((st = ascm_device_free(w->d, a, ascm_kind_mask(ASCM_FREE_DEVICE), &kind)) == ASCM_ERR_CLOSED) {
        w->closed++;
        sched_yield(); /* the gate is shut for a moment: the block is still ours */
    }
    return st;
}

static void *device_claim_churn(void *arg) {
    device_claimer *w = arg;
    uint64_t live[LIVE] = {0}, s = 0x9E3779B97F4A7C15ull * (uint64_t)(w->id + 1);
    int kind, events;
    for (int i = 0; i < w->steps; i++) {
        int v = (int)(rand_of(&s) % LIVE);
        if (live[v]) {
            unclaim(live[v]);
            CHECK(device_free_retrying(w, live[v]) == ASCM_OK);
            live[v] = 0;
        }
        uint64_t size = rand_of(&s) % 8 ? 1 + rand_of(&s) % 4096 : 1 + rand_of(&s) % 100000;
        int st = ascm_device_malloc(w->d, size, 2 /* NORMAL_ONLY */, ASCM_SIZE_MALLOC, &live[v], &kind, &events);
        CHECK(st == ASCM_OK || st == ASCM_ERR_CLOSED);
        if (st == ASCM_OK) claim(live[v], w->id);
        else live[v] = 0, w->closed++;
    }
    for (int v = 0; v < LIVE; v++)
        if (live[v]) {
            unclaim(live[v]);
            CHECK(device_free_retrying(w, live[v]) == ASCM_OK);
        }
    return NULL;
}

typedef struct gate_holder {
    ascm_device *d;
    int inside, release, left; /* __atomic */
} gate_holder;

static void *hold_the_gate(void *arg) {
    gate_holder *g = arg;
    CHECK(ascm_device_enter(g->d));
    __atomic_store_n(&g->inside, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&g->release, __ATOMIC_ACQUIRE)) sched_yield();
    usleep(20000); /* quiesce is waiting by now */
    __atomic_store_n(&g->left, 1, __ATOMIC_RELEASE);
    ascm_device_leave(g->d);
    return NULL;
}

static void test_device_thread_caches(void) {
    ascm_device_config cfg = huge_and_normal(BASE, SIZE / 2); /* normal pages: the owner table's range */
    cfg.growable[ASCM_KIND_NORMAL] = 1;
    cfg.base[ASCM_KIND_DVPP] = 1ull << 42;
    cfg.size[ASCM_KIND_DVPP] = 64ull << 20;
    cfg.budget.shared = 1ull << 30;
    ascm_device *d;
    CHECK(ascm_device_create(&cfg, &d) == ASCM_OK);
    CHECK(ascm_device_set_thread_caches(d, 7) == ASCM_ERR_INVAL);
    CHECK(ascm_device_set_thread_caches(d, ASCM_CACHES_ON) == ASCM_OK);
    CHECK(ascm_device_pool(d, ASCM_KIND_HUGE)->caches_mode == ASCM_CACHES_ON);
    CHECK(ascm_device_pool(d, ASCM_KIND_NORMAL)->caches_mode == ASCM_CACHES_ON);
    /* not the media window: its allocations read its bytes in use, which flushes */
    CHECK(ascm_device_pool(d, ASCM_KIND_DVPP)->caches_mode == ASCM_CACHES_OFF);
    /* a chunk added afterwards takes the device's mode */
    CHECK(ascm_device_add_chunk(d, ASCM_KIND_NORMAL, BASE + SIZE / 2, SIZE / 2) == ASCM_OK);
    CHECK(ascm_device_chunk(d, ASCM_KIND_NORMAL, 1, NULL, NULL)->caches_mode == ASCM_CACHES_ON);

    pthread_t t[4];
    device_claimer w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (device_claimer){d, i, 100000, 0};
        CHECK(pthread_create(&t[i], NULL, device_claim_churn, &w[i]) == 0);
    }
    for (int i = 0; i < 60; i++) {
        uint64_t charged, held;
        ascm_device_huge_pages(d, &charged, &held);
        CHECK(charged == held);
        ascm_stats st;
        ascm_device_kind_stats(d, ASCM_KIND_NORMAL, &st);
        CHECK(st.alloc_count - st.free_count == st.live_count);
        if (i % 10 == 0) {
            POOL_OK(ascm_device_pool(d, ASCM_KIND_NORMAL));
            ascm_device_trim(d);
        }
        /* slab_max switched under the callers: a block keeps the path it
         * was placed by, the caches read the limit without the lock */
        static const uint64_t limits[] = {0, 2048, 32768, 100};
        CHECK(ascm_device_set_slab_max(d, limits[i % 4]) == ASCM_OK);
        CHECK(ascm_device_slab_max(d) == limits[i % 4]);
        if (i % 15 == 7) { /* the gate shut: calls are refused meanwhile, then go on */
            ascm_device_quiesce(d);
            usleep(500);
            ascm_device_reopen(d);
        }
        usleep(1000);
    }
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    ascm_stats st;
    ascm_device_kind_stats(d, ASCM_KIND_NORMAL, &st);
    CHECK(st.live_count == 0 && st.used == 0 && st.alloc_count == st.free_count && st.alloc_count > 0);
    for (int c = 0; c < 2; c++) POOL_OK(ascm_device_chunk(d, ASCM_KIND_NORMAL, c, NULL, NULL));
    ascm_device_trim(d);
    ascm_budget b;
    ascm_device_budget(d, &b);
    CHECK(b.normal_used == 0); /* every cached slot came back, and its slab went */

    /* quiesce waits for a caller inside, whichever stripe it counted in */
    gate_holder g = {d, 0, 0, 0};
    pthread_t h;
    CHECK(pthread_create(&h, NULL, hold_the_gate, &g) == 0);
    while (!__atomic_load_n(&g.inside, __ATOMIC_ACQUIRE)) sched_yield();
    __atomic_store_n(&g.release, 1, __ATOMIC_RELEASE);
    ascm_device_quiesce(d);
    CHECK(__atomic_load_n(&g.left, __ATOMIC_ACQUIRE) == 1);
    ascm_device_reopen(d);
    pthread_join(h, NULL);

    uint64_t bases[ASCM_KINDS] = {0};
    bases[ASCM_KIND_HUGE] = 1ull << 41;
    bases[ASCM_KIND_NORMAL] = BASE;
    bases[ASCM_KIND_DVPP] = 1ull << 43;
    CHECK(ascm_device_reset(d, bases) == ASCM_OK); /* the new pools keep the device's caches */
    CHECK(ascm_device_pool(d, ASCM_KIND_HUGE)->caches_mode == ASCM_CACHES_ON);
    CHECK(ascm_device_pool(d, ASCM_KIND_DVPP)->caches_mode == ASCM_CACHES_OFF);
    CHECK(ascm_device_set_thread_caches(d, ASCM_CACHES_OFF) == ASCM_OK);
    CHECK(ascm_device_pool(d, ASCM_KIND_NORMAL)->caches_mode == ASCM_CACHES_OFF);
    ascm_device_destroy(d);

    cfg.paged = 1; /* not on a paged device */
    CHECK(ascm_device_create(&cfg, &d) == ASCM_OK);
    CHECK(ascm_device_set_thread_caches(d, ASCM_CACHES_ON) == ASCM_ERR_UNSUPPORTED);
    CHECK(ascm_device_set_thread_caches(d, ASCM_CACHES_OFF) == ASCM_OK);
    ascm_device_destroy(d);
}

/* ---- torch's requested bytes through the pluggable functions (requested.c) ----
 * The functions are this library's exports; declared here as torch_npu sees
 * them, DeviceStats as 119 int64 counters (requested_bytes: all, small and
 * large at 96, 100 and 104, each current, peak, allocated, freed). */
void *ascmem_pluggable_alloc(ssize_t size, int device, void *stream);
void ascmem_pluggable_free(void *ptr, ssize_t size, int device, void *stream);
void ascmem_pluggable_reset_peak_status(int8_t device); /* c10::DeviceIndex */
typedef struct { int64_t v[119]; } npu_stats;
npu_stats ascmem_pluggable_get_device_stats(int8_t device);
#define REQ_INDEX 9
enum { REQ_ALL = 96, REQ_SMALL = 100, REQ_LARGE = 104 };

typedef struct requester {
    uint64_t seed;
    void *left[64];         /* blocks the thread leaves live for the main thread to free */
    int64_t left_size[64];
    int64_t left_small, left_large;
} requester;

static void *request_churn(void *arg) {
    requester *r = arg;
    void *live[32];
    int64_t size[32];
    int n = 0;
    for (int i = 0; i < 4000; i++) {
        if (n == 32 || (n && rand_of(&r->seed) % 2)) { /* free one, with the size torch passes */
            int k = (int)(rand_of(&r->seed) % (uint64_t)n);
            ascmem_pluggable_free(live[k], size[k], REQ_INDEX, NULL);
            live[k] = live[--n];
            size[k] = size[n];
        } else { /* small ones, and now and then one of 1.5 MiB (huge pages: the large pool) */
            int64_t s = rand_of(&r->seed) % 8 ? (int64_t)(1 + rand_of(&r->seed) % 20000) : 3 << 19;
            void *p = ascmem_pluggable_alloc(s, REQ_INDEX, NULL);
            CHECK(p != NULL);
            if (!p) break;
            live[n] = p;
            size[n++] = s;
        }
    }
    for (int k = 0; k < n; k++) { /* left live: counted in this thread's record, merged at its exit */
        r->left[k] = live[k];
        r->left_size[k] = size[k];
        *(size[k] > (1 << 20) ? &r->left_large : &r->left_small) += size[k];
    }
    for (int k = n; k < 64; k++) r->left[k] = NULL;
    return NULL;
}

static void test_pluggable_requested_bytes(void) {
    ascm_device_config cfg = huge_and_normal(BASE, SIZE);
    cfg.budget.shared = 1ull << 30;
    cfg.budget.huge_grows = 1; /* huge pages out of shared: requests over 1 MiB land there */
    ascm_device *d;
    CHECK(ascm_device_create(&cfg, &d) == ASCM_OK);
    CHECK(ascm_device_set_thread_caches(d, ASCM_CACHES_ON) == ASCM_OK);
    CHECK(ascm_pluggable_register(REQ_INDEX, d) == ASCM_OK);

    /* one thread: current and peak exact */
    void *a = ascmem_pluggable_alloc(1000, REQ_INDEX, NULL), *b = ascmem_pluggable_alloc(3 << 20, REQ_INDEX, NULL);
    npu_stats st = ascmem_pluggable_get_device_stats(REQ_INDEX);
    CHECK(st.v[REQ_ALL] == 1000 + (3 << 20) && st.v[REQ_SMALL] == 1000 && st.v[REQ_LARGE] == 3 << 20);
    ascmem_pluggable_free(b, 3 << 20, REQ_INDEX, NULL);
    ascmem_pluggable_free(a, 1000, REQ_INDEX, NULL);
    st = ascmem_pluggable_get_device_stats(REQ_INDEX);
    CHECK(st.v[REQ_ALL] == 0 && st.v[REQ_ALL + 1] == 1000 + (3 << 20) && st.v[REQ_LARGE + 1] == 3 << 20);
    ascmem_pluggable_reset_peak_status(REQ_INDEX);
    CHECK(ascmem_pluggable_get_device_stats(REQ_INDEX).v[REQ_ALL + 1] == 0);

    /* four threads, statistics read meanwhile; rounds of new threads reuse
     * the records the last ones left */
    for (int round = 0; round < 3; round++) {
        pthread_t t[4];
        requester r[4];
        for (int i = 0; i < 4; i++) {
            memset(&r[i], 0, sizeof r[i]);
            r[i].seed = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1 + 4 * round);
            CHECK(pthread_create(&t[i], NULL, request_churn, &r[i]) == 0);
        }
        for (int i = 0; i < 200; i++) {
            st = ascmem_pluggable_get_device_stats(REQ_INDEX);
            CHECK(st.v[REQ_ALL + 1] >= st.v[REQ_ALL]); /* a peak is never below the current */
        }
        int64_t small = 0, large = 0;
        for (int i = 0; i < 4; i++) {
            CHECK(pthread_join(t[i], NULL) == 0);
            small += r[i].left_small;
            large += r[i].left_large;
        }
        st = ascmem_pluggable_get_device_stats(REQ_INDEX);
        CHECK(st.v[REQ_SMALL] == small && st.v[REQ_LARGE] == large && st.v[REQ_ALL] == small + large);
        CHECK(st.v[REQ_ALL + 1] >= small + large);
        for (int i = 0; i < 4; i++) /* freed by another thread than the one that counted them */
            for (int k = 0; k < 64 && r[i].left[k]; k++)
                ascmem_pluggable_free(r[i].left[k], r[i].left_size[k], REQ_INDEX, NULL);
        st = ascmem_pluggable_get_device_stats(REQ_INDEX);
        CHECK(st.v[REQ_ALL] == 0 && st.v[REQ_SMALL] == 0 && st.v[REQ_LARGE] == 0);
    }
    /* a device registered anew starts from zero */
    void *c = ascmem_pluggable_alloc(500, REQ_INDEX, NULL);
    CHECK(ascm_pluggable_register(REQ_INDEX, d) == ASCM_OK);
    st = ascmem_pluggable_get_device_stats(REQ_INDEX);
    CHECK(st.v[REQ_ALL] == 0 && st.v[REQ_ALL + 1] == 0);
    ascmem_pluggable_free(c, 0, REQ_INDEX, NULL); /* size 0: not counted, as torch's unknown size */
    CHECK(ascm_pluggable_register(REQ_INDEX, NULL) == ASCM_OK);
    char msg[256];
    CHECK(ascm_pool_check(ascm_device_pool(d, ASCM_KIND_NORMAL), msg, sizeof msg) == ASCM_OK);
    CHECK(ascm_pool_check(ascm_device_pool(d, ASCM_KIND_HUGE), msg, sizeof msg) == ASCM_OK);
    ascm_device_destroy(d);
}

int main(void) {
    static const test_case tests[] = {
        {"threads_share_a_pool", test_threads_share_a_pool},
        {"cross_thread_frees", test_cross_thread_frees},
        {"slab_max_switched_under_threads", test_slab_max_switched_under_threads},
        {"bad_frees", test_bad_frees},
        {"thread_exit_and_destroy", test_thread_exit_and_destroy},
        {"full_pool_flushes_caches", test_full_pool_flushes_caches},
        {"fork_with_caches", test_fork_with_caches},
        {"modes", test_modes},
        {"more_pools_than_entries", test_more_pools_than_entries},
        {"modes_and_resets_race_the_caches", test_modes_and_resets_race_the_caches},
        {"device_kinds_share_the_budget_lock", test_device_kinds_share_the_budget_lock},
        {"device_thread_caches", test_device_thread_caches},
        {"pluggable_requested_bytes", test_pluggable_requested_bytes},
    };
    return run_tests(tests, (int)(sizeof tests / sizeof tests[0]));
}
