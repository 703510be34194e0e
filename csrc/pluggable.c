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
 *   get_device_stats  c10_npu::NPUCachingAllocator::DeviceStats(int)
 *
 * DeviceStats is a C++ aggregate of int64 counters returned by value; a C
 * struct with the same members in the same order has the same layout and is
 * returned the same way (through a hidden result pointer, on x86-64 and
 * AArch64 alike), so C can provide it -- but only if the sizes agree exactly:
 * writing a larger struct than the caller expects would overrun its stack.
 * Two layouts are exported; see docs/EMBEDDING.md for how to tell which one
 * a torch_npu build has.  The snapshot hook returns std::vector members and
 * needs C++ built against the user's torch_npu; it is not exported.
 */
#include "internal.h"

#include <stdbool.h>
#include <stddef.h>
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

/* ---- get_device_stats ---------------------------------------------------- */

typedef struct npu_stat { int64_t current, peak, allocated, freed; } npu_stat;
enum { STAT_ALL = 0, STAT_SMALL = 1, STAT_LARGE = 2, STAT_TYPES = 3 };
typedef npu_stat npu_stat_array[STAT_TYPES];

/* The members every layout starts with, in order. */
#define NPU_STATS_COMMON                                                              \
    npu_stat_array allocation, segment, active, inactive_split;                      \
    npu_stat_array allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes; \
    npu_stat_array requested_bytes;                                                   \
    int64_t num_alloc_retries, num_ooms;                                              \
    npu_stat oversize_allocations, oversize_segments;

/* torch_npu built for PyTorch 2.1-2.4: 952 bytes */
typedef struct npu_device_stats {
    NPU_STATS_COMMON
    int64_t max_split_size;
} npu_device_stats;

/* later builds add three counters before max_split_size: 976 bytes */
typedef struct npu_device_stats_ext {
    NPU_STATS_COMMON
    int64_t num_sync_all_streams, num_device_alloc, num_device_free;
    int64_t max_split_size;
} npu_device_stats_ext;

_Static_assert(sizeof(npu_device_stats) == 952, "DeviceStats layout");
_Static_assert(sizeof(npu_device_stats_ext) == 976, "DeviceStats layout (ext)");

static void fill_stat(npu_stat *st, const ascm_stats *s, int bytes) {
    st->current += (int64_t)(bytes ? s->used : s->live_count);
    st->peak += (int64_t)(bytes ? s->peak_used : s->live_count);
    st->allocated += (int64_t)(bytes ? 0 : s->alloc_count);
    st->freed += (int64_t)(bytes ? 0 : s->free_count);
}

/* Device memory as torch sees it: HUGE (requests above 1 MiB under the
 * default policy) is the large pool, NORMAL the small one; HUGE1G counts as
 * large.  Bytes: "allocated" is what blocks occupy after rounding,
 * "requested" what callers asked for, "reserved" what the chunks hold. */
static void fill_common(npu_device_stats *out, int device) {
    memset(out, 0, sizeof *out);
    ascm_device *d = device_at(device);
    out->max_split_size = INT64_MAX; /* every block may be split */
    if (!d) return;
    static const int kinds[] = {ASCM_KIND_HUGE, ASCM_KIND_NORMAL, ASCM_KIND_HUGE1G};
    for (unsigned i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        int k = kinds[i];
        if (!ascm_device_has_kind(d, k)) continue;
        ascm_stats s;
        ascm_device_kind_stats(d, k, &s);
        for (int t = 0; t < STAT_TYPES; t++) {
            if (t == STAT_SMALL && k != ASCM_KIND_NORMAL) continue;
            if (t == STAT_LARGE && k == ASCM_KIND_NORMAL) continue;
            fill_stat(&out->allocation[t], &s, 0);
            fill_stat(&out->active[t], &s, 0);
            fill_stat(&out->allocated_bytes[t], &s, 1);
            fill_stat(&out->active_bytes[t], &s, 1);
            out->requested_bytes[t].current += (int64_t)s.requested;
            out->requested_bytes[t].peak += (int64_t)s.peak_requested;
            out->reserved_bytes[t].current += (int64_t)s.capacity;
            out->reserved_bytes[t].peak += (int64_t)s.capacity;
            int64_t chunks = ascm_device_chunk_count(d, k);
            out->segment[t].current += chunks;
            out->segment[t].peak += chunks;
        }
        out->num_ooms += (int64_t)s.failed_count;
    }
}

EXPORT npu_device_stats ascmem_pluggable_get_device_stats(int device) {
    npu_device_stats out;
    fill_common(&out, device);
    return out;
}

EXPORT npu_device_stats_ext ascmem_pluggable_get_device_stats_ext(int device) {
    npu_device_stats common;
    fill_common(&common, device);
    npu_device_stats_ext out;
    memset(&out, 0, sizeof out);
    memcpy(&out, &common, offsetof(npu_device_stats, max_split_size));
    out.max_split_size = common.max_split_size;
    return out;
}

/* ---- what a snapshot needs --------------------------------------------------
 * The snapshot hook must return torch_npu's SnapshotInfo (std::vector
 * members), which only C++ built against the user's torch_npu can make: the
 * shim installed as ascmem/include/ascmem_npu_snapshot.cpp does, from this
 * walk.  For each chunk of device memory (HUGE, NORMAL, HUGE1G): segment()
 * once, then block() for each live block and each free span of the chunk's
 * large-block path (free slots inside slabs are not listed). */
typedef void (*ascmem_segment_fn)(void *ctx, int kind, uint64_t base, uint64_t size);
typedef void (*ascmem_walk_block_fn)(void *ctx, uint64_t addr, uint64_t size, uint64_t requested,
                                     int allocated);

typedef struct walk_ctx {
    ascmem_walk_block_fn block;
    void *ctx;
    int allocated;
} walk_ctx;

static void walk_one(void *vctx, uint64_t addr, uint64_t usable, uint64_t requested) {
    walk_ctx *w = vctx;
    w->block(w->ctx, addr, usable, requested, w->allocated);
}

EXPORT int ascmem_pluggable_walk(int device, ascmem_segment_fn segment, ascmem_walk_block_fn block,
                                 void *ctx) {
    ascm_device *d = device_at(device);
    if (!d) return ASCM_ERR_INVAL;
    static const int kinds[] = {ASCM_KIND_HUGE, ASCM_KIND_NORMAL, ASCM_KIND_HUGE1G};
    for (unsigned i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        for (int c = 0; c < ascm_device_chunk_count(d, kinds[i]); c++) {
            uint64_t base, size;
            ascm_pool *p = ascm_device_chunk(d, kinds[i], c, &base, &size);
            if (!p) continue;
            segment(ctx, kinds[i], base, size);
            walk_ctx w = {block, ctx, 1};
            ascm_pool_walk(p, walk_one, &w);
            w.allocated = 0;
            ascm_pool_walk_free(p, walk_one, &w);
        }
    return ASCM_OK;
}

EXPORT void ascmem_pluggable_reset_peak_status(int device) {
    ascm_device *d = device_at(device);
    if (d) ascm_device_reset_peaks(d);
}
