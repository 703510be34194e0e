/* ascmem's C API for other Python C extensions, imported at run time from a
 * capsule (the way numpy's C API is):
 *
 *     #include "ascmem_capi.h"        // include dir: ascmem.get_include()
 *     ...in your module init:  if (ascm_import_capi() < 0) return NULL;
 *     ascm_pool *p = ascm_api->pool_of(py_pool);   // a Pool made in Python
 *     ascm_api->pool_alloc(p, 4096, 64, &addr);
 *
 * The table is versioned: fields are only ever appended, and `size` says how
 * many bytes of it this ascmem provides.  Pointers returned by pool_of and
 * device_of are borrowed: keep the Python object alive while you use them.
 * Every function but pool_of/device_of may be called without the GIL.
 */
#ifndef ASCMEM_CAPI_H
#define ASCMEM_CAPI_H

#include <Python.h>

#include "ascmem.h"

/* 2: ascm_pool_config gained single_threaded, so pool_create reads a larger
 * struct; extensions built against 1 are refused at import, not misread.
 * 3: ascm_stats gained cached_bytes and peak_live_count, so pool_stats writes
 * a larger struct; device calls may return ASCM_ERR_CLOSED.
 * 4: ascm_pool_config gained paged, map, map_ctx and release_threshold, and
 * ascm_stats mapped, peak_mapped, map_calls and unmap_calls (paged pools).
 * Functions appended without a new version (older extensions still work; a
 * newer one is refused by an older ascmem, whose table is smaller):
 * pool_alloc_handle and pool_free_handle; then pool_set_thread_caches; then
 * pool_thread_caches_on; then pool_set_placement, pool_placement,
 * device_set_placement and device_placement; then pool_set_slab_max,
 * pool_slab_max, device_set_slab_max and device_slab_max. */
#define ASCM_CAPI_VERSION 4
#define ASCM_CAPI_CAPSULE "ascmem._core._C_API"

typedef struct ascm_capi {
    unsigned version;
    size_t size;
    /* pools */
    int (*pool_create)(const ascm_pool_config *cfg, ascm_pool **out);
    void (*pool_destroy)(ascm_pool *p);
    int (*pool_alloc)(ascm_pool *p, uint64_t size, uint64_t align, uint64_t *addr);
    int (*pool_free)(ascm_pool *p, uint64_t addr);
    int (*pool_usable_size)(ascm_pool *p, uint64_t addr, uint64_t *size);
    void (*pool_stats)(ascm_pool *p, ascm_stats *st);
    int (*pool_check)(ascm_pool *p, char *msg, size_t msglen);
    /* the C objects behind Python ones (NULL, with no exception set, if the
     * object is not an ascmem.Pool / ascmem.Device); need the GIL */
    ascm_pool *(*pool_of)(PyObject *pool);
    ascm_device *(*device_of)(PyObject *device);
    /* devices: CANN rules (mode: ASCM_SIZE_*, policy: aclrtMemMallocPolicy) */
    int (*device_malloc)(ascm_device *d, uint64_t size, uint32_t policy, int mode,
                         uint64_t *addr, int *kind, int *events);
    int (*device_free)(ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind);
    const char *(*status_str)(int status);
    /* handles: free without a lookup by address (ascmem.h) */
    int (*pool_alloc_handle)(ascm_pool *p, uint64_t size, uint64_t align, uint64_t *addr,
                             ascm_handle *h);
    int (*pool_free_handle)(ascm_pool *p, ascm_handle h);
    /* thread caches (ascmem.h): ASCM_CACHES_OFF, _ON or _AUTO */
    int (*pool_set_thread_caches)(ascm_pool *p, int mode);
    int (*pool_thread_caches_on)(const ascm_pool *p); /* 1 while they are on */
    /* placements (ascmem.h): ASCM_PLACE_*, of the pool's or device's kind
     * (paged or contiguous), ASCM_ERR_INVAL for another; a device's applies to
     * its pools, those of chunks added later and after a reset included, and
     * is ASCM_ERR_CLOSED once the device is closed or while it resets */
    int (*pool_set_placement)(ascm_pool *p, int placement);
    int (*pool_placement)(ascm_pool *p);
    int (*device_set_placement)(ascm_device *d, int placement);
    int (*device_placement)(ascm_device *d);
    /* the largest request served from slabs (ascmem.h, ascm_pool_set_slab_max;
     * 0: none), for a plan's slab_max; a device's as its placement */
    int (*pool_set_slab_max)(ascm_pool *p, uint64_t bytes);
    uint64_t (*pool_slab_max)(ascm_pool *p);
    int (*device_set_slab_max)(ascm_device *d, uint64_t bytes);
    uint64_t (*device_slab_max)(ascm_device *d);
} ascm_capi;

static const ascm_capi *ascm_api = NULL;

/* Returns 0, or -1 with a Python exception set. */
static inline int ascm_import_capi(void) {
    const ascm_capi *api = (const ascm_capi *)PyCapsule_Import(ASCM_CAPI_CAPSULE, 0);
    if (!api) return -1;
    if (api->version != ASCM_CAPI_VERSION || api->size < sizeof(ascm_capi)) {
        PyErr_Format(PyExc_ImportError, "ascmem C API version %u (size %zu) does not match "
                     "this extension's (%u, %zu): rebuild it against this ascmem",
                     api->version, api->size, ASCM_CAPI_VERSION, sizeof(ascm_capi));
        return -1;
    }
    ascm_api = api;
    return 0;
}

#endif /* ASCMEM_CAPI_H */
