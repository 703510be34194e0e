/* Functions with the prototypes that PyTorch's CUDAPluggableAllocator and
 * torch_npu's NPUPluggableAllocator load by name from a shared library (this
 * extension's own .so: ascmem.pluggable.library_path()).  Each forwards to the
 * Device that Python registered for that device index; all of them are
 * thread-safe without the GIL (the device's pools and budget are locked).
 *
 * Prototypes (torch_npu, torch_npu/csrc/npu/NPUPluggableAllocator.h):
 *   alloc  void*(size_t, int, aclrtStream)      free  void(void*, size_t, int, aclrtStream)
 *   init   void(int)                            reset void(bool)
 *   memory_fraction void(double, int)           base_alloc void*(void*, size_t*)
 *   record_stream / erase_stream void(void*, aclrtStream)
 *   reset_peak_status void(int)
 */
#include "internal.h"

#include <stdbool.h>
#include <sys/types.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 64

static _Atomic(ascm_device *) registered[MAX_DEVICES];

int ascm_pluggable_register(int device, ascm_device *d) {
    if (device < 0 || device >= MAX_DEVICES) return ASCM_ERR_INVAL;
    atomic_store(&registered[device], d);
    return ASCM_OK;
}

static ascm_device *device_at(int device) {
    return device >= 0 && device < MAX_DEVICES ? atomic_load(&registered[device]) : NULL;
}

/* the device a pointer belongs to, for calls that pass no device index */
static ascm_device *device_of_ptr(uint64_t addr) {
    for (int i = 0; i < MAX_DEVICES; i++) {
        ascm_device *d = atomic_load(&registered[i]);
        if (d && ascm_device_kind_of(d, addr) >= 0) return d;
    }
    return NULL;
}

EXPORT void *ascmem_pluggable_alloc(ssize_t size, int device, void *stream) {
    (void)stream;
    ascm_device *d = device_at(device);
    uint64_t addr;
    int kind, events;
    if (!d || size <= 0) return NULL;
    if (ascm_device_malloc(d, (uint64_t)size, 0 /* HUGE_FIRST */, ASCM_SIZE_MALLOC, &addr, &kind,
                           &events) != ASCM_OK)
        return NULL;
    return (void *)(uintptr_t)addr;
}

EXPORT void ascmem_pluggable_free(void *ptr, ssize_t size, int device, void *stream) {
    (void)size;
    (void)stream;
    ascm_device *d = device_at(device);
    int kind;
    if (d && ptr)
        ascm_device_free(d, (uint64_t)(uintptr_t)ptr,
                         (1u << ASCM_KIND_HUGE) | (1u << ASCM_KIND_NORMAL) | (1u << ASCM_KIND_HUGE1G),
                         &kind);
}

EXPORT void ascmem_pluggable_init(int device_count) { (void)device_count; }

/* torch calls this from empty_cache(): give spare slabs back to the budget */
EXPORT void ascmem_pluggable_reset(bool check_error) {
    (void)check_error;
    for (int i = 0; i < MAX_DEVICES; i++) {
        ascm_device *d = atomic_load(&registered[i]);
        for (int k = 0; d && k < ASCM_KINDS; k++)
            for (int c = 0; c < ascm_device_chunk_count(d, k); c++) {
                ascm_pool *p = ascm_device_chunk(d, k, c, NULL, NULL);
                if (p) ascm_pool_trim(p);
            }
    }
}

EXPORT void ascmem_pluggable_memory_fraction(double fraction, int device) {
    ascm_device *d = device_at(device);
    if (!d || !(fraction > 0.0) || fraction > 1.0) return;
    ascm_budget b;
    ascm_device_budget(d, &b);
    ascm_device_set_limit(d, fraction >= 1.0 ? 0 : (uint64_t)((double)(b.reserve + b.shared) * fraction));
}

/* Every block is its own base allocation here. */
EXPORT void *ascmem_pluggable_base_alloc(void *ptr, size_t *size) {
    uint64_t addr = (uint64_t)(uintptr_t)ptr, n = 0;
    ascm_device *d = device_of_ptr(addr);
    ascm_pool *p = d ? ascm_device_pool_at(d, addr, NULL) : NULL;
    if (!p || ascm_pool_usable_size(p, addr, &n) != ASCM_OK) n = 0;
    if (size) *size = (size_t)n;
    return n ? ptr : NULL;
}

/* Stream-ordered reuse is not modelled yet: a block is reusable as soon as it
 * is freed, so there is nothing to record. */
EXPORT void ascmem_pluggable_record_stream(void *ptr, void *stream) {
    (void)ptr;
    (void)stream;
}
EXPORT void ascmem_pluggable_erase_stream(void *ptr, void *stream) {
    (void)ptr;
    (void)stream;
}

EXPORT void ascmem_pluggable_reset_peak_status(int device) {
    ascm_device *d = device_at(device);
    if (d) ascm_device_reset_peaks(d);
}
