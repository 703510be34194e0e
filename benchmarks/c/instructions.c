/* Instruction counts per pair, for `make instructions` (valgrind's
 * cachegrind counts instructions exactly, whatever the machine's load, where
 * the timings of bench_core move by a third between runs on shared hosts).
 *
 *   instructions steady N LO HI   the steady workload, N steps, sizes in [LO, HI]
 *   instructions lifo R           R rounds of the LIFO workload
 *   instructions batch R          R rounds of the 100,000-block batch
 *   instructions device N         N Device pairs of 1 MiB (HUGE_FIRST): each
 *                                 empties and refills a 2 MiB huge page, so
 *                                 the page budget is charged twice a pair
 * Built with -DBY_HANDLE (instructions_handle_bin), steady and lifo go by handle.
 *
 * Each is run twice (N or R, and a baseline of 0 steps or 1 round) and the
 * difference divided by the pairs, so set-up and the random draws cancel. */
#define _POSIX_C_SOURCE 199309L
#include "ascmem.h"
#include "workload.h"

#include <string.h>

static ascm_pool *make_pool(uint64_t size) {
    ascm_pool *p;
    ascm_pool_config cfg = {.base = 1ull << 40, .size = size, .min_block = 4096};
    if (ascm_pool_create(&cfg, &p) != ASCM_OK) exit(1);
    return p;
}

static uint64_t draw(uint64_t lo, uint64_t hi) {
    for (;;) {
        uint64_t s = log_uniform();
        if (s >= lo && s <= hi) return s;
    }
}

int main(int argc, char **argv) {
    if (argc >= 5 && !strcmp(argv[1], "steady")) {
        int n = atoi(argv[2]);
        uint64_t lo = strtoull(argv[3], NULL, 10), hi = strtoull(argv[4], NULL, 10);
        static uint64_t sizes[STEPS], victims[STEPS], live[LIVE];
        static ascm_handle handles[LIVE];
        if (n < 0 || n > STEPS) return 2;
        for (int i = 0; i < STEPS / 10; i++) {
            sizes[i] = draw(lo, hi);
            victims[i] = next_rand() % LIVE;
        }
        ascm_pool *p = make_pool(64ull << 30);
        for (int i = 0; i < LIVE; i++)
            if (pair_alloc(p, draw(lo, hi), &live[i], &handles[i]) != ASCM_OK) return 3;
        for (int i = 0; i < n; i++) {
            int k = i % (STEPS / 10);
            uint64_t v = victims[k];
            pair_free(p, live[v], handles[v]);
            if (pair_alloc(p, sizes[k], &live[v], &handles[v]) != ASCM_OK) return 3;
        }
        ascm_pool_destroy(p);
        return 0;
    }
    if (argc >= 3 && !strcmp(argv[1], "lifo")) {
        static uint64_t sizes[LIFO_N], addrs[LIFO_N];
        static ascm_handle handles[LIFO_N];
        for (int i = 0; i < LIFO_N; i++) sizes[i] = log_uniform();
        ascm_pool *p = make_pool(8ull << 30);
        for (int r = atoi(argv[2]); r > 0; r--) {
            for (int i = 0; i < LIFO_N; i++)
                if (pair_alloc(p, sizes[i], &addrs[i], &handles[i]) != ASCM_OK) return 3;
            for (int i = LIFO_N - 1; i >= 0; i--) pair_free(p, addrs[i], handles[i]);
        }
        ascm_pool_destroy(p);
        return 0;
    }
    if (argc >= 3 && !strcmp(argv[1], "batch")) {
        static uint64_t sizes[BATCH_N], addrs[BATCH_N];
        for (int i = 0; i < BATCH_N; i++) sizes[i] = log_uniform();
        ascm_pool *p = make_pool(64ull << 30);
        size_t done;
        for (int r = atoi(argv[2]); r > 0; r--) {
            if (ascm_pool_alloc_many(p, sizes, BATCH_N, 64, addrs, &done) != ASCM_OK) return 3;
            ascm_pool_free_many(p, addrs, BATCH_N, &done);
        }
        ascm_pool_destroy(p);
        return 0;
    }
    if (argc >= 3 && !strcmp(argv[1], "loop")) { /* one size freed and taken again: Python's pair */
        ascm_pool *p = make_pool(1ull << 30);
        uint64_t addr;
        ascm_handle h;
        for (int n = atoi(argv[2]); n > 0; n--) {
            if (pair_alloc(p, 1 << 20, &addr, &h) != ASCM_OK) return 3;
            pair_free(p, addr, h);
        }
        ascm_pool_destroy(p);
        return 0;
    }
    if (argc >= 3 && !strcmp(argv[1], "device")) {
        ascm_device *d = bench_device();
        unsigned mask = ascm_kind_mask(ASCM_FREE_DEVICE);
        uint64_t addr;
        int kind, events;
        for (int n = atoi(argv[2]); n > 0; n--) {
            if (ascm_device_malloc(d, 1 << 20, 0, ASCM_SIZE_MALLOC, &addr, &kind, &events) != ASCM_OK)
                return 3;
            if (ascm_device_free(d, addr, mask, &kind) != ASCM_OK) return 3;
        }
        ascm_device_destroy(d);
        return 0;
    }
    fprintf(stderr, "usage: instructions steady N LO HI | lifo ROUNDS | batch ROUNDS | loop N | device N\n");
    return 2;
}
