/* The multi-thread workloads of threads.h against one shared ascm_pool (the
 * pool's own lock, freeing by address), the same with thread caches on
 * ("cached"), and against one shared Device (its chunks' pools and its
 * budget; "device cached": with thread caches), and through the pluggable-
 * allocator functions on such a Device ("pluggable [cached]"); "auto" in
 * place of "cached" asks for the caches' AUTO mode.
 * make -C benchmarks/c threads */
#define _GNU_SOURCE
#include "ascmem.h"
#include "threads.h"

#include <string.h>
#include <sys/types.h>

static void *pool_make(void) {
    ascm_pool *p;
    ascm_pool_config cfg = {.base = 1ull << 40, .size = 256ull << 30, .min_block = 4096};
    if (ascm_pool_create(&cfg, &p) != ASCM_OK) exit(1);
    return p;
}
static int pool_alloc(void *a, uint64_t size, uint64_t *h) {
    return ascm_pool_alloc((ascm_pool *)a, size, 64, h) != ASCM_OK;
}
static void pool_free(void *a, uint64_t h, uint64_t size) {
    (void)size;
    ascm_pool_free((ascm_pool *)a, h);
}
static void pool_destroy(void *a) { ascm_pool_destroy((ascm_pool *)a); }

static const backend pool_backend = {"ascmem pool", pool_make, pool_alloc, pool_free, pool_destroy};

/* "cached": ON; "auto": AUTO (on from the first time two threads meet at a
 * lock), the mode Python's Pool and Device start in */
static int caches_mode = ASCM_CACHES_ON;

static void *cached_make(void) {
    ascm_pool *p = pool_make();
    if (ascm_pool_set_thread_caches(p, caches_mode) != ASCM_OK) exit(1);
    return p;
}
static const backend cached_backend = {"ascmem pool, thread caches", cached_make, pool_alloc, pool_free,
                                       pool_destroy};

static void *device_make(void) {
    ascm_device_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.min_block = 4096;
    for (int k = 0; k < ASCM_KINDS; k++) {
        cfg.base[k] = (1ull << 44) + ((uint64_t)k << 40);
        cfg.size[k] = k == ASCM_KIND_HUGE1G ? 0 : 128ull << 30;
    }
    cfg.budget.reserve = 0;
    cfg.budget.shared = 256ull << 30;
    cfg.budget.huge_grows = 1;
    ascm_device *d;
    if (ascm_device_create(&cfg, &d) != ASCM_OK) exit(1);
    return d;
}
static int device_alloc(void *a, uint64_t size, uint64_t *h) {
    int kind, events;
    return ascm_device_malloc((ascm_device *)a, size, 0, ASCM_SIZE_MALLOC, h, &kind, &events) !=
           ASCM_OK;
}
static void device_free(void *a, uint64_t h, uint64_t size) {
    (void)size;
    int kind;
    ascm_device_free((ascm_device *)a, h, ascm_kind_mask(ASCM_FREE_DEVICE), &kind);
}
static void device_destroy(void *a) { ascm_device_destroy((ascm_device *)a); }

static const backend device_backend = {"ascmem device", device_make, device_alloc, device_free,
                                       device_destroy};

static void *device_cached_make(void) {
    ascm_device *d = device_make();
    if (ascm_device_set_thread_caches(d, caches_mode) != ASCM_OK) exit(1);
    return d;
}
static const backend device_cached_backend = {"ascmem device, thread caches", device_cached_make,
                                              device_alloc, device_free, device_destroy};

/* The pluggable-allocator functions (pluggable.c), which torch_npu calls, on
 * the Device registered at index 0: its slot's bookkeeping (the requested
 * bytes, by the size torch passes to free too) on top of the Device's calls. */
void *ascmem_pluggable_alloc(ssize_t size, int device, void *stream);
void ascmem_pluggable_free(void *ptr, ssize_t size, int device, void *stream);
static int plug_cached;
static void *pluggable_make(void) {
    ascm_device *d = plug_cached ? device_cached_make() : device_make();
    if (ascm_pluggable_register(0, d) != ASCM_OK) exit(1);
    return d;
}
static int pluggable_alloc(void *a, uint64_t size, uint64_t *h) {
    (void)a;
    void *p = ascmem_pluggable_alloc((ssize_t)size, 0, NULL);
    *h = (uint64_t)(uintptr_t)p;
    return p == NULL;
}
static void pluggable_free(void *a, uint64_t h, uint64_t size) {
    (void)a;
    ascmem_pluggable_free((void *)(uintptr_t)h, (ssize_t)size, 0, NULL);
}
static void pluggable_destroy(void *a) {
    ascm_pluggable_register(0, NULL);
    device_destroy(a);
}
static const backend pluggable_backend = {"ascmem pluggable", pluggable_make, pluggable_alloc,
                                          pluggable_free, pluggable_destroy};

int main(int argc, char **argv) {
    const backend *b = &pool_backend;
    int device = 0, cached = 0, pluggable = 0;
    for (int i = 2; i < argc; i++) {
        device |= !strcmp(argv[i], "device");
        cached |= !strcmp(argv[i], "cached") || !strcmp(argv[i], "auto");
        pluggable |= !strcmp(argv[i], "pluggable");
        if (!strcmp(argv[i], "auto")) caches_mode = ASCM_CACHES_AUTO;
    }
    plug_cached = cached;
    if (pluggable) b = &pluggable_backend;
    else if (device) b = cached ? &device_cached_backend : &device_backend;
    else if (cached) b = &cached_backend;
    return run_threads(b, argc, argv);
}
