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
 *   record_stream / erase_stream void(void*, c10_npu::NPUStream)
 *   reset_peak_status void(c10::DeviceIndex)
 *   get_device_stats  c10_npu::NPUCachingAllocator::DeviceStats(c10::DeviceIndex)
 * (torch_npu/csrc/npu/Module.cpp lines 400, 407, 414, 421 in Ascend/pytorch).
 * c10::DeviceIndex is int8_t: the caller sets only the low byte of the
 * argument register, so these take int8_t, not int.  NPUStream has a
 * user-declared destructor (NPUStream.h line 27), so under the Itanium C++
 * ABI it is passed by hidden reference: the record/erase hooks that read it
 * are C++ (torch_npu/ascmem_npu_streams.cpp), built against torch_npu.
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
#include "ascmem.h" /* the public API only: the device is reached through its functions */
#include "requested.h"
#include "stripes.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES ASCM_REQ_DEVICES

/* A slot per device index.  users counts the calls that have loaded the
 * slot's device and not finished with it: unregistering waits for them, so
 * Python may destroy the device once register() returns.  Each call also
 * passes the device's own gate, which refuses it while a reset or close is
 * under way.
 *
 * Layout: the device pointer, which every call reads, and the users counts,
 * which every call writes -- in the line of its thread's stripe
 * (stripes.h), as the device's gate counts -- on lines of their own: on
 * one shared line every call of every thread would move that line between
 * cores.  The requested bytes are counted per thread
 * (requested.c). */
typedef struct slot {
    _Alignas(64) _Atomic(ascm_device *) device;
    ascm_stripe users[ASCM_STRIPES];
} slot;

static slot slots[MAX_DEVICES];

int ascm_pluggable_register(int device, ascm_device *d) {
    if (device < 0 || device >= MAX_DEVICES) return ASCM_ERR_INVAL;
    atomic_store(&slots[device].device, d);
    while (!ascm_stripes_empty(slots[device].users)) sched_yield(); /* calls that may hold the old one */
    ascm_requested_clear(device);
    return ASCM_OK;
}

/* Bytes torch asked for, by stat type: small (normal pages) or large; torch
 * passes the size to free too. */
static void count_requested(int device, int kind, int64_t delta) {
    ascm_requested_add(device, kind == ASCM_KIND_NORMAL ? 1 : 2, delta);
}

/* The device registered at index, entered (release with put()), or NULL. */
static ascm_device *get(int device) {
    if (device < 0 || device >= MAX_DEVICES) return NULL;
    slot *s = &slots[device];
    _Atomic uint64_t *users = ascm_stripe_of(s->users);
    atomic_fetch_add(users, 1); /* sequentially consistent with register's store and look */
    ascm_device *d = atomic_load(&s->device);
    if (d && ascm_device_enter(d)) return d;
    atomic_fetch_sub(users, 1);
    return NULL;
}

/* As get(), but while a reset shuts the device's gate this waits for it to
 * reopen instead of failing: a free refused then would leak its block (and
 * keep it counted as handed out, so the device could never close), and an
 * allocation refused then would reach torch as an error.  NULL only when no
 * device is registered or it is closed. */
static ascm_device *get_waiting(int device) {
    if (device < 0 || device >= MAX_DEVICES) return NULL;
    for (;;) {
        ascm_device *d = get(device);
        if (d) return d;
        slot *s = &slots[device];
        _Atomic uint64_t *users = ascm_stripe_of(s->users);
        atomic_fetch_add(users, 1); /* holds the device while it waits: register() waits for this */
        ascm_device *now = atomic_load(&s->device);
        int st = now ? ascm_device_wait_open(now) : ASCM_ERR_CLOSED;
        atomic_fetch_sub(users, 1);
        if (st != ASCM_OK) return NULL;
    }
}

static void put(int device, ascm_device *d) {
    ascm_device_leave(d);
    atomic_fetch_sub(ascm_stripe_of(slots[device].users), 1);
}

/* the index of the device a pointer belongs to, entered, for calls that pass
 * no device index; -1 if none */
static int index_of_ptr(uint64_t addr, ascm_device **out) {
    for (int i = 0; i < MAX_DEVICES; i++) {
        ascm_device *d = get(i);
        if (!d) continue;
        if (ascm_device_kind_of(d, addr) >= 0) {
            *out = d;
            return i;
        }
        put(i, d);
    }
    return -1;
}

/* An allocation at a device index, sized by mode (ASCM_SIZE_*): ASCM_OK and
 * *out, or the status (ASCM_ERR_CLOSED also when no device is registered at
 * the index).  The block is handed out to C (marked). */
static int try_alloc(int64_t size, int device, int mode, void **out) {
    *out = NULL;
    if (size <= 0) return ASCM_ERR_INVAL;
    ascm_device *d = get_waiting(device);
    if (!d) return ASCM_ERR_CLOSED;
    uint64_t addr;
    int kind, events;
    int st = ascm_device_malloc_entered(d, (uint64_t)size, 0 /* HUGE_FIRST */, mode, &addr, &kind, &events);
    if (st == ASCM_OK && (st = ascm_device_hand_out_block(d, addr)) != ASCM_OK) {
        int k;
        ascm_device_free_entered(d, addr, ascm_kind_mask(ASCM_FREE_DEVICE), &k); /* unmarked: not handed out */
    }
    if (st == ASCM_OK) {
        count_requested(device, kind, size);
        *out = (void *)(uintptr_t)addr;
    }
    put(device, d);
    return st;
}

/* The pluggable alloc with its reason, for callers that tell their user why.
 * Blocks are placed by aclrtMalloc's rounding with their requested size kept
 * (ASCM_SIZE_MALLOC_KEEP), so a free that is not told the size reads it back. */
EXPORT int ascmem_pluggable_try_alloc(int64_t size, int device, void **out) {
    return try_alloc(size, device, ASCM_SIZE_MALLOC_KEEP, out);
}

/* The same for a CPU allocator (ascmem.torch's shim: torch's CPU tensors on
 * a host-backend Device): the size as asked at a 64-byte start, as torch's
 * own CPU allocator gives (ASCM_SIZE_EXACT).  aclrtMalloc's 32-byte tail is
 * a rule for pieces the runtime cuts from device memory; on a paged Device
 * it put every tensor of a whole number of granules (16 MiB, say) across
 * one granule more, resident once touched. */
EXPORT int ascmem_pluggable_try_alloc_cpu(int64_t size, int device, void **out) {
    return try_alloc(size, device, ASCM_SIZE_EXACT, out);
}

EXPORT void *ascmem_pluggable_alloc(ssize_t size, int device, void *stream) {
    (void)stream;
    void *p;
    return ascmem_pluggable_try_alloc((int64_t)size, device, &p) == ASCM_OK ? p : NULL;
}

/* Frees a block of device index `device` (or, if it is not one of that
 * device's, of whichever registered device holds it) and says the bytes it
 * was asked for: the size is read from the block, not taken from the
 * caller, so requested_bytes stays exact when the caller cannot say it
 * (torch's deleters pass only the pointer).  ASCM_ERR_BADFREE: no device
 * holds it as a live block, or the Python layer tracks it (nothing changed). */
static int free_at(ascm_device *d, int device, void *ptr, int64_t *requested) {
    uint64_t addr = (uint64_t)(uintptr_t)ptr, n = 0;
    ascm_pool *p = ascm_device_pool_at(d, addr, NULL);
    if (!p || ascm_pool_requested_size(p, addr, &n) != ASCM_OK) return ASCM_ERR_BADFREE;
    int kind;
    int st = ascm_device_free_entered(d, addr, ascm_kind_mask(ASCM_FREE_DEVICE), &kind);
    if (st != ASCM_OK) return st;
    count_requested(device, kind, -(int64_t)n); /* the free unmarked it (device.c) */
    *requested = (int64_t)n;
    return ASCM_OK;
}

EXPORT int ascmem_pluggable_free_requested(void *ptr, int device, int64_t *requested) {
    *requested = 0;
    if (!ptr) return ASCM_ERR_BADFREE;
    ascm_device *d = get_waiting(device);
    int st = d ? free_at(d, device, ptr, requested) : ASCM_ERR_BADFREE;
    if (d) put(device, d);
    if (st != ASCM_ERR_BADFREE) return st;
    for (int i = 0; i < MAX_DEVICES; i++) { /* another index's (a tag's device) */
        if (i == device || !(d = get_waiting(i))) continue;
        st = ascm_device_kind_of(d, (uint64_t)(uintptr_t)ptr) >= 0 ? free_at(d, i, ptr, requested)
                                                                    : ASCM_ERR_BADFREE;
        put(i, d);
        if (st != ASCM_ERR_BADFREE) return st;
    }
    return ASCM_ERR_BADFREE;
}

EXPORT void ascmem_pluggable_free(void *ptr, ssize_t size, int device, void *stream) {
    (void)stream;
    (void)size; /* read from the block: a caller's size may be missing or wrong */
    int64_t requested;
    ascmem_pluggable_free_requested(ptr, device, &requested);
}

/* Why an allocation at a device index failed, in words, for a caller's error
 * message (a static string). */
EXPORT const char *ascmem_pluggable_status_message(int status, int device) {
    (void)device;
    switch (status) {
    case ASCM_ERR_CLOSED:
        return "the ascmem Device is closed, being reset, or not registered at this index";
    case ASCM_ERR_BUDGET:
        return "the ascmem Device's limit or page budget is reached (Device.set_limit, memory=)";
    case ASCM_ERR_NOMEM:
        return "the ascmem Device is out of memory (no free block large enough)";
    default:
        return ascm_status_str(status);
    }
}

EXPORT void ascmem_pluggable_init(int device_count) { (void)device_count; }

/* torch calls this from empty_cache(): spare slabs go back to the budget,
 * and chunks that hold no live block back to their upstream, as
 * Device.empty_cache() does (through the device's release hook, which the
 * Python Device sets for pools that grow from an upstream). */
EXPORT void ascmem_pluggable_reset(bool check_error) {
    (void)check_error;
    for (int i = 0; i < MAX_DEVICES; i++) {
        ascm_device *d = get(i);
        if (!d) continue;
        ascm_device_trim(d);
        put(i, d);
        /* outside the gate: the hook may call back into the device */
        _Atomic uint64_t *users = ascm_stripe_of(slots[i].users);
        atomic_fetch_add(users, 1);
        ascm_device *again = atomic_load(&slots[i].device);
        if (again) ascm_device_release_idle(again);
        atomic_fetch_sub(users, 1);
    }
}

EXPORT void ascmem_pluggable_memory_fraction(double fraction, int device) {
    if (!(fraction > 0.0) || fraction > 1.0) return;
    ascm_device *d = get(device);
    if (!d) return;
    ascm_budget b;
    ascm_device_budget(d, &b);
    uint64_t limit = (uint64_t)((double)(b.reserve + b.shared) * fraction);
    /* a tiny fraction still caps: 0 would mean no limit at all */
    ascm_device_set_limit(d, fraction >= 1.0 ? 0 : limit ? limit : 1);
    put(device, d);
}

/* Every block is its own base allocation here. */
EXPORT void *ascmem_pluggable_base_alloc(void *ptr, size_t *size) {
    uint64_t addr = (uint64_t)(uintptr_t)ptr, n = 0;
    ascm_device *d = NULL;
    int i = index_of_ptr(addr, &d);
    ascm_pool *p = d ? ascm_device_pool_at(d, addr, NULL) : NULL;
    if (!p || ascm_pool_usable_size(p, addr, &n) != ASCM_OK) n = 0;
    if (d) put(i, d);
    if (size) *size = (size_t)n;
    return n ? ptr : NULL;
}

/* Kept for programs that named them; set_hooks no longer hands them to
 * torch_npu.  They do nothing: the second argument is the address of a
 * c10_npu::NPUStream (passed by hidden reference, see the top of this file),
 * which C cannot turn into a stream.  The stream shim
 * (torch_npu/ascmem_npu_streams.cpp, ascmem.pluggable.build_stream_shim)
 * honours record_stream. */
EXPORT void ascmem_pluggable_record_stream(void *ptr, const void *npu_stream) {
    (void)ptr;
    (void)npu_stream;
}
EXPORT void ascmem_pluggable_erase_stream(void *ptr, const void *npu_stream) {
    (void)ptr;
    (void)npu_stream;
}

/* ---- get_device_stats ---------------------------------------------------- */

typedef struct npu_stat { int64_t current, peak, allocated, freed; } npu_stat;
enum { STAT_ALL = 0, STAT_SMALL = 1, STAT_LARGE = 2, STAT_TYPES = ASCM_REQ_TYPES };
typedef npu_stat npu_stat_array[STAT_TYPES];

/* The members every layout starts with, in order. */
#define NPU_STATS_COMMON                                                              \
    npu_stat_array allocation, segment, active, inactive_split;                      \
    npu_stat_array allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes; \
    npu_stat_array requested_bytes;                                                   \
    int64_t num_alloc_retries, num_ooms;                                              \
    npu_stat oversize_allocations, oversize_segments;

/* every released torch_npu branch that has the stats hook: 952 bytes */
typedef struct npu_device_stats {
    NPU_STATS_COMMON
    int64_t max_split_size;
} npu_device_stats;

/* torch_npu master adds three counters before max_split_size: 976 bytes */
typedef struct npu_device_stats_ext {
    NPU_STATS_COMMON
    int64_t num_sync_all_streams, num_device_alloc, num_device_free;
    int64_t max_split_size;
} npu_device_stats_ext;

_Static_assert(sizeof(npu_device_stats) == 952, "DeviceStats layout");
_Static_assert(sizeof(npu_device_stats_ext) == 976, "DeviceStats layout (ext)");

static void fill_stat(npu_stat *st, const ascm_stats *s, int bytes) {
    st->current += (int64_t)(bytes ? s->used : s->live_count);
    st->peak += (int64_t)(bytes ? s->peak_used : s->peak_live_count);
    st->allocated += (int64_t)(bytes ? 0 : s->alloc_count);
    st->freed += (int64_t)(bytes ? 0 : s->free_count);
}

/* Device memory as torch sees it: HUGE (requests above 1 MiB under the
 * default policy) is the large pool, NORMAL the small one; HUGE1G counts as
 * large.  Bytes: "allocated" is what blocks occupy after rounding,
 * "requested" what callers asked for, "reserved" what the chunks hold. */
static void fill_common(npu_device_stats *out, int device) {
    memset(out, 0, sizeof *out);
    ascm_device *d = get(device);
    out->max_split_size = INT64_MAX; /* every block may be split */
    if (!d) return;
    for (int k = 0; k < ASCM_KINDS; k++) { /* the kinds torch's allocator frees: aclrtFree's */
        if (ascm_kind(k)->freed_by != ASCM_FREE_DEVICE || !ascm_device_has_kind(d, k)) continue;
        ascm_stats s;
        ascm_device_kind_stats(d, k, &s);
        for (int t = 0; t < STAT_TYPES; t++) {
            if (t == STAT_SMALL && k != ASCM_KIND_NORMAL) continue;
            if (t == STAT_LARGE && k == ASCM_KIND_NORMAL) continue;
            fill_stat(&out->allocation[t], &s, 0);
            fill_stat(&out->active[t], &s, 0);
            fill_stat(&out->allocated_bytes[t], &s, 1);
            fill_stat(&out->active_bytes[t], &s, 1);

            out->reserved_bytes[t].current += (int64_t)s.capacity;
            out->reserved_bytes[t].peak += (int64_t)s.capacity;
            int64_t chunks = ascm_device_chunk_count(d, k);
            out->segment[t].current += chunks;
            out->segment[t].peak += chunks;
        }
        out->num_ooms += (int64_t)s.failed_count;
    }
    int64_t now[ASCM_REQ_TYPES], peak[ASCM_REQ_TYPES]; /* what torch asked for, not the rounded sizes */
    ascm_requested_read(device, now, peak);
    for (int t = 0; t < STAT_TYPES; t++) {
        out->requested_bytes[t].current = now[t];
        out->requested_bytes[t].peak = peak[t];
    }
    put(device, d);
}

EXPORT npu_device_stats ascmem_pluggable_get_device_stats(int8_t device) {
    npu_device_stats out;
    fill_common(&out, device);
    return out;
}

EXPORT npu_device_stats_ext ascmem_pluggable_get_device_stats_ext(int8_t device) {
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
    ascm_device *d = get(device);
    if (!d) return ASCM_ERR_INVAL;
    for (int k = 0; k < ASCM_KINDS; k++)
        for (int c = 0; ascm_kind(k)->freed_by == ASCM_FREE_DEVICE && c < ascm_device_chunk_count(d, k); c++) {
            uint64_t base, size;
            ascm_pool *p = ascm_device_chunk(d, k, c, &base, &size);
            if (!p) continue;
            segment(ctx, k, base, size);
            walk_ctx w = {block, ctx, 1};
            ascm_pool_walk(p, walk_one, &w);
            w.allocated = 0;
            ascm_pool_walk_free(p, walk_one, &w);
        }
    put(device, d);
    return ASCM_OK;
}

EXPORT void ascmem_pluggable_reset_peak_status(int8_t device) {
    ascm_device *d = get(device);
    if (!d) return;
    ascm_device_reset_peaks(d);
    ascm_requested_reset_peaks(device);
    put(device, d);
}
