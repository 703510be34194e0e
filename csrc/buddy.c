/* Buddy allocator over [base, base + size) in units of min_block.
 *
 * Metadata, all out-of-band:
 *   - one hierarchical bitmap per order: bit i set = block i of that order is
 *     free.  These are the free lists, kept in address order, so allocation
 *     takes the lowest free block and O(log n) holds for find, split and merge.
 *     Two bits per unit over all orders.
 *   - the live blocks: the address map (addrmap.c, the pool's too) from first
 *     unit to an index into a record array of (units, requested bytes); both
 *     follow the number of live blocks, not the range.
 *
 * Exact-size allocations: n units take a block of order ceil(log2 n), keep
 * the first n units and free the tail at once as smaller buddies, as Linux's
 * alloc_pages_exact does.  The n units are then the binary decomposition of n
 * (pieces of decreasing order, each a valid buddy block), and freeing the
 * allocation frees each piece, merging as usual.
 */
#include "internal.h"

#include <stdlib.h>

typedef struct live_block {
    uint64_t units;     /* 0: a recycled record */
    uint64_t requested; /* a recycled record: the next recycled index */
} live_block;

struct ascm_buddy {
    uint64_t base, size, min_block, nunits;
    unsigned shift;
    int max_order;
    uint64_t nonempty; /* bit k: order k has a free block */
    ascm_hbm free_map[64];
    ascm_addrmap live;  /* first unit -> index of its record (1..) */
    live_block *records;
    uint32_t records_cap, records_used, recycled; /* records[0] unused */
    uint64_t used_units, requested, peak_used, peak_requested;
    uint64_t alloc_count, free_count, failed_count;
    uint64_t alloc_units, freed_units, alloc_requested, freed_requested; /* cumulative */
};

static void mark_free(ascm_buddy *b, uint64_t unit, int order) {
    ascm_hbm_set(&b->free_map[order], unit >> order);
    b->nonempty |= 1ull << order;
}

static void unmark_free(ascm_buddy *b, uint64_t unit, int order) {
    ascm_hbm_clear(&b->free_map[order], unit >> order);
    if (!ascm_hbm_any(&b->free_map[order])) b->nonempty &= ~(1ull << order);
}

static int is_free_block(const ascm_buddy *b, uint64_t unit, int order) {
    uint64_t idx = unit >> order;
    return idx < b->free_map[order].nbits && ascm_hbm_test(&b->free_map[order], idx);
}

/* Frees [unit, end) as the largest aligned blocks that fit, without merging:
 * callers guarantee that no piece has a free buddy. */
static void free_span(ascm_buddy *b, uint64_t unit, uint64_t end) {
    while (unit < end) {
        int o = unit ? (int)ascm_ctz64(unit) : b->max_order;
        if (o > b->max_order) o = b->max_order;
        while (unit + (1ull << o) > end) o--;
        mark_free(b, unit, o);
        unit += 1ull << o;
    }
}

/* Frees one block and merges it with its free buddies. */
static void free_block(ascm_buddy *b, uint64_t unit, int order) {
    while (order < b->max_order) {
        uint64_t buddy = unit ^ (1ull << order);
        if (!is_free_block(b, buddy, order)) break;
        unmark_free(b, buddy, order);
        unit &= ~(1ull << order);
        order++;
    }
    mark_free(b, unit, order);
}

/* A record for one more live block, from the recycled ones first; 0 if the
 * host is out of memory. */
static uint32_t record_new(ascm_buddy *b) {
    uint32_t i = b->recycled;
    if (i) {
        b->recycled = (uint32_t)b->records[i].requested;
        return i;
    }
    if (b->records_used == b->records_cap) {
        uint64_t cap = b->records_cap ? (uint64_t)b->records_cap * 2 : 64;
        if (cap > UINT32_MAX) return 0;
        live_block *grown = realloc(b->records, cap * sizeof *grown);
        if (!grown) return 0;
        b->records = grown;
        b->records_cap = (uint32_t)cap;
        if (b->records_used == 0) b->records_used = 1; /* index 0 = none */
    }
    return b->records_used++;
}

static void record_recycle(ascm_buddy *b, uint32_t i) {
    b->records[i].units = 0;
    b->records[i].requested = b->recycled;
    b->recycled = i;
}

static void init_state(ascm_buddy *b) {
    for (int o = 0; o <= b->max_order; o++) ascm_hbm_clear_all(&b->free_map[o]);
    ascm_map_clear(&b->live);
    b->records_used = b->records_cap ? 1 : 0;
    b->recycled = 0;
    b->nonempty = 0;
    free_span(b, 0, b->nunits);
    b->used_units = b->requested = b->peak_used = b->peak_requested = 0;
    b->alloc_count = b->free_count = b->failed_count = 0;
    b->alloc_units = b->freed_units = b->alloc_requested = b->freed_requested = 0;
}

void ascm_buddy_destroy(ascm_buddy *b) {
    if (!b) return;
    for (int o = 0; o < 64; o++) ascm_hbm_destroy(&b->free_map[o]);
    ascm_map_destroy(&b->live);
    free(b->records);
    free(b);
}

int ascm_buddy_create(uint64_t base, uint64_t size, uint64_t min_block, ascm_buddy **out) {
    *out = NULL;
    if (!ascm_is_pow2(min_block) || size == 0 || size % min_block || base % min_block ||
        base + size < base || size / min_block >= (1ull << 32) - 1) /* map keys are 32-bit */
        return ASCM_ERR_INVAL;
    ascm_buddy *b = calloc(1, sizeof *b);
    if (!b) return ASCM_ERR_HOSTMEM;
    b->base = base;
    b->size = size;
    b->min_block = min_block;
    b->shift = ascm_log2_floor(min_block);
    b->nunits = size >> b->shift;
    b->max_order = (int)ascm_log2_floor(b->nunits);
    int st = ascm_map_init(&b->live);
    for (int o = 0; st == ASCM_OK && o <= b->max_order; o++)
        st = ascm_hbm_init(&b->free_map[o], b->nunits >> o);
    if (st != ASCM_OK) {
        ascm_buddy_destroy(b);
        return ASCM_ERR_HOSTMEM;
    }
    init_state(b);
    *out = b;
    return ASCM_OK;
}

int ascm_buddy_alloc(ascm_buddy *b, uint64_t size, uint64_t align, uint64_t *addr) {
    if (size == 0 || !ascm_is_pow2(align)) return ASCM_ERR_INVAL;
    if (size > b->size) { /* a failed request, counted as the Pool and the Device count it */
        b->failed_count++;
        return ASCM_ERR_NOMEM;
    }
    /* alignment comes from the block's offset, so base must carry it too */
    if (align > b->min_block && (b->base & (align - 1))) return ASCM_ERR_INVAL;
    uint64_t n = (size + b->min_block - 1) >> b->shift;
    unsigned k = ascm_log2_ceil(n);
    if (align > b->min_block) {
        unsigned ka = ascm_log2_floor(align) - b->shift;
        if (ka > k) k = ka;
    }
    uint64_t candidates = k > (unsigned)b->max_order ? 0 : (b->nonempty >> k) << k;
    if (!candidates) {
        b->failed_count++;
        return ASCM_ERR_NOMEM;
    }
    uint32_t rec = ascm_map_reserve(&b->live, 1) == ASCM_OK ? record_new(b) : 0;
    if (!rec) return ASCM_ERR_HOSTMEM;
    int j = (int)ascm_ctz64(candidates);
    uint64_t unit = ascm_hbm_first(&b->free_map[j]) << j;
    unmark_free(b, unit, j);
    while (j > (int)k) { /* split, keeping the lower half */
        j--;
        mark_free(b, unit + (1ull << j), j);
    }
    free_span(b, unit + n, unit + (1ull << k)); /* exact size: the tail goes back */
    b->records[rec] = (live_block){n, size};
    ascm_map_put(&b->live, (uint32_t)unit, rec); /* cannot fail: room reserved above */
    b->used_units += n;
    b->requested += size;
    b->alloc_units += n;
    b->alloc_requested += size;
    if (b->used_units > b->peak_used) b->peak_used = b->used_units;
    if (b->requested > b->peak_requested) b->peak_requested = b->requested;
    b->alloc_count++;
    *addr = b->base + (unit << b->shift);
    return ASCM_OK;
}

/* The first unit of the live block at addr, or -1. */
static int64_t unit_of(const ascm_buddy *b, uint64_t addr) {
    if (addr < b->base || addr - b->base >= b->size) return -1;
    uint64_t off = addr - b->base;
    if (off & (b->min_block - 1)) return -1;
    return (int64_t)(off >> b->shift);
}

static const live_block *lookup(const ascm_buddy *b, uint64_t addr) {
    int64_t unit = unit_of(b, addr);
    uint32_t rec = unit < 0 ? 0 : ascm_map_get(&b->live, (uint32_t)unit);
    return rec ? &b->records[rec] : NULL;
}

int ascm_buddy_free(ascm_buddy *b, uint64_t addr) {
    int64_t first = unit_of(b, addr);
    uint32_t rec = first < 0 ? 0 : ascm_map_take(&b->live, (uint32_t)first);
    if (!rec) return ASCM_ERR_BADFREE;
    uint64_t unit = (uint64_t)first, n = b->records[rec].units;
    b->used_units -= n;
    b->requested -= b->records[rec].requested;
    b->freed_units += n;
    b->freed_requested += b->records[rec].requested;
    b->free_count++;
    record_recycle(b, rec);
    while (n) { /* the pieces, largest first */
        int o = (int)ascm_log2_floor(n);
        free_block(b, unit, o);
        unit += 1ull << o;
        n -= 1ull << o;
    }
    return ASCM_OK;
}

int ascm_buddy_usable_size(const ascm_buddy *b, uint64_t addr, uint64_t *size) {
    const live_block *e = lookup(b, addr);
    if (!e) return ASCM_ERR_BADFREE;
    *size = e->units << b->shift;
    return ASCM_OK;
}

int ascm_buddy_requested_size(const ascm_buddy *b, uint64_t addr, uint64_t *size) {
    const live_block *e = lookup(b, addr);
    if (!e) return ASCM_ERR_BADFREE;
    *size = e->requested;
    return ASCM_OK;
}

void ascm_buddy_stats(const ascm_buddy *b, ascm_stats *st) {
    memset(st, 0, sizeof *st);
    st->capacity = b->size;
    st->used = b->used_units << b->shift;
    st->requested = b->requested;
    st->peak_used = b->peak_used << b->shift;
    st->peak_requested = b->peak_requested;
    st->free = b->size - st->used;
    st->largest_free = b->nonempty ? (b->min_block << ascm_log2_floor(b->nonempty)) : 0;
    st->live_count = b->live.count;
    st->alloc_count = b->alloc_count;
    st->alloc_bytes = b->alloc_units << b->shift;
    st->freed_bytes = b->freed_units << b->shift;
    st->alloc_requested = b->alloc_requested;
    st->freed_requested = b->freed_requested;
    st->free_count = b->free_count;
    st->failed_count = b->failed_count;
    st->page_size = b->min_block;
    st->pages_in_use = b->used_units;
    uint64_t meta = sizeof *b + ascm_map_bytes(&b->live) + (uint64_t)b->records_cap * sizeof *b->records;
    for (int o = 0; o <= b->max_order; o++) meta += ascm_hbm_bytes(&b->free_map[o]);
    st->metadata_bytes = meta;
}

void ascm_buddy_reset(ascm_buddy *b) { init_state(b); }

int ascm_buddy_check(const ascm_buddy *b, char *msg, size_t msglen) {
    int st;
    for (int o = 0; o <= b->max_order; o++) {
        if ((st = ascm_hbm_check(&b->free_map[o], msg, msglen)) != ASCM_OK) return st;
        if (((b->nonempty >> o) & 1) != (uint64_t)ascm_hbm_any(&b->free_map[o]))
            return ascm_fail(msg, msglen, "non-empty mask wrong for order %d", o);
    }
    if (b->nonempty >> (b->max_order + 1))
        return ascm_fail(msg, msglen, "non-empty mask has orders above the maximum");
    /* Paint every unit: 1 = allocated, 2 = free; each exactly once. */
    uint8_t *paint = calloc(b->nunits, 1);
    if (!paint) return ASCM_ERR_HOSTMEM;
    uint64_t used = 0, requested = 0, live = 0;
    st = ASCM_OK;
    for (uint64_t i = 0; i <= b->live.mask && st == ASCM_OK; i++) {
        const ascm_map_entry *m = &b->live.slots[i];
        if (!m->key) continue;
        uint64_t unit = m->key - 1;
        if (m->value >= b->records_used || !b->records[m->value].units) {
            st = ascm_fail(msg, msglen, "live block at unit %llu has no record",
                           (unsigned long long)unit);
            break;
        }
        const live_block *e = &b->records[m->value];
        live++;
        used += e->units;
        requested += e->requested;
        if (e->units == 0 || unit + e->units > b->nunits || e->requested == 0 ||
            e->requested > (e->units << b->shift) || e->requested <= ((e->units - 1) << b->shift)) {
            st = ascm_fail(msg, msglen, "live block at unit %llu has a bad size",
                           (unsigned long long)unit);
            break;
        }
        for (uint64_t u = unit; u < unit + e->units; u++) {
            if (paint[u]) {
                st = ascm_fail(msg, msglen, "unit %llu belongs to two live blocks",
                               (unsigned long long)u);
                break;
            }
            paint[u] = 1;
        }
    }
    for (int o = 0; o <= b->max_order && st == ASCM_OK; o++) {
        const ascm_hbm *h = &b->free_map[o];
        for (uint64_t idx = 0; idx < h->nbits && st == ASCM_OK; idx++) {
            if (!ascm_hbm_test(h, idx)) continue;
            uint64_t unit = idx << o;
            if (o < b->max_order && is_free_block(b, unit ^ (1ull << o), o)) {
                st = ascm_fail(msg, msglen, "free block at unit %llu order %d was not merged",
                               (unsigned long long)unit, o);
                break;
            }
            for (uint64_t u = unit; u < unit + (1ull << o); u++) {
                if (paint[u]) {
                    st = ascm_fail(msg, msglen, "free block at unit %llu order %d overlaps",
                                   (unsigned long long)unit, o);
                    break;
                }
                paint[u] = 2;
            }
        }
    }
    for (uint64_t u = 0; u < b->nunits && st == ASCM_OK; u++)
        if (!paint[u])
            st = ascm_fail(msg, msglen, "unit %llu is neither free nor allocated (lost)",
                           (unsigned long long)u);
    free(paint);
    if (st != ASCM_OK) return st;
    if (live != b->live.count || used != b->used_units || requested != b->requested)
        return ascm_fail(msg, msglen, "statistics disagree with the live blocks");
    if (b->alloc_count - b->free_count != live)
        return ascm_fail(msg, msglen, "alloc_count - free_count != live blocks");
    return ASCM_OK;
}
