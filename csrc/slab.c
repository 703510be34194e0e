/* Slabs: size classes for requests up to ASCM_SLAB_MAX bytes.
 *
 * Classes are multiples of 32 bytes: every 32 up to 256, then four per power
 * of two, so rounding wastes at most 25% (a 257-byte request gets 320).  A
 * slab is one large block of the pool cut into equal slots; its occupancy
 * bitmap and per-slot rounding slack live in a host-side descriptor.  Slabs
 * are multiples of the slab granule (8 KiB, or the unit if larger) and
 * aligned to it; the pool's slab table points each granule of a slab at
 * its descriptor, so free finds the descriptor of any slot in two loads.
 * While thread caches are on, no descriptor is freed: a released slab's
 * stays, idle, for the next slab of its class, so that a thread cache may
 * read one without the lock (tcache.c); with caches off, a class keeps up
 * to IDLE_DESCRIPTORS idle (below).  A slot's live flag (in its word, with its
 * slack), not its taken bit, then says whether a caller holds it.  A slab that empties is kept as a spare while its
 * class's spares stay within SLAB_SPARE_BYTES (always at least one), then goes
 * back to the large-block path.  Spares absorb alloc/free waves: building and
 * tearing down a slab costs a descriptor malloc, a block split and map
 * updates; they never cost capacity, since an allocation that fails trims
 * them and retries, and they go back before another class's slab is
 * placed or a fresh large block is: a spare splits the free space that
 * block would take (docs/ARCHITECTURE.md, Note [Slabs], "Spares").  Pools
 * whose pages are larger
 * than the slab (huge pages) keep no spare, which would pin a whole page.
 * Paged pools keep none either: a spare holds mapped granules, and what a
 * paged pool keeps mapped is its release threshold's to say (0: nothing
 * once every block is freed).  A released slab's granules
 * are free granules, kept mapped up to the threshold.
 */
#include "internal.h"
#include "pool_core.h"

#include <stdlib.h>

#define SLAB_MIN_BYTES 8192u
#define SLAB_MIN_SLOTS 4u
#define SLAB_SPARE_BYTES (256u << 10) /* empty slabs kept per class */

const uint32_t ascm_slab_sizes[ASCM_SLAB_CLASSES] = {
    32,   64,   96,   128,  160,  192,   224,   256,   320,   384,   448,   512,
    640,  768,  896,  1024, 1280, 1536,  1792,  2048,  2560,  3072,  3584,  4096,
    5120, 6144, 7168, 8192, 10240, 12288, 14336, 16384, 20480, 24576, 28672, 32768,
};

void ascm_slab_init_classes(ascm_pool *p) {
    for (int c = 0; c < ASCM_SLAB_CLASSES; c++) {
        ascm_slab_class *k = &p->classes[c];
        uint64_t size = ascm_slab_sizes[c];
        uint64_t want = size * SLAB_MIN_SLOTS > SLAB_MIN_BYTES ? size * SLAB_MIN_SLOTS : SLAB_MIN_BYTES;
        k->size = (uint32_t)size;
        uint64_t granule = 1ull << p->sgshift;
        k->slab_bytes = (want + granule - 1) & ~(granule - 1);
        uint64_t count = k->slab_bytes / size;
        k->count = (uint32_t)(count > ASCM_SLAB_MAX_SLOTS ? ASCM_SLAB_MAX_SLOTS : count);
        k->div_magic = ((1ull << 48) + size - 1) / size;
        k->partial = 0;
        k->empty = 0;
    }
}

void ascm_slab_list_push(ascm_pool *p, ascm_slab_class *k, uint32_t si) {
    ascm_slab *s = p->slabs[si];
    s->prev = 0;
    s->next = k->partial;
    if (k->partial) p->slabs[k->partial]->prev = si;
    k->partial = si;
}

void ascm_slab_list_unlink(ascm_pool *p, ascm_slab_class *k, uint32_t si) {
    ascm_slab *s = p->slabs[si];
    if (s->prev) p->slabs[s->prev]->next = s->next;
    else k->partial = s->next;
    if (s->next) p->slabs[s->next]->prev = s->prev;
}

/* Points the table's entries for [off, off + bytes) at s (NULL: clears
 * them).  Leaves exist already: ascm_slab_new made them. */
static void map_slab(ascm_pool *p, uint64_t off, uint64_t bytes, ascm_slab *s) {
    ascm_slab_table *t = &p->slabtab;
    for (uint64_t g = off >> p->sgshift, end = (off + bytes) >> p->sgshift; g < end; g++) {
        ascm_slab **leaf = t->leaves[g >> ASCM_SLAB_LEAF_BITS];
        __atomic_store_n(&leaf[g & ((1u << ASCM_SLAB_LEAF_BITS) - 1)], s, __ATOMIC_RELEASE);
    }
    if (s) p->slab_granules += bytes >> p->sgshift;
    else p->slab_granules -= bytes >> p->sgshift;
}

static int make_leaves(ascm_pool *p, uint64_t off, uint64_t bytes) {
    ascm_slab_table *t = &p->slabtab;
    if (!t->leaves) {
        t->nleaves = ((p->size >> p->sgshift) >> ASCM_SLAB_LEAF_BITS) + 1;
        t->leaves = ascm_zalloc_big(t->nleaves * sizeof *t->leaves);
        if (!t->leaves) return ASCM_ERR_HOSTMEM;
    }
    uint64_t first = (off >> p->sgshift) >> ASCM_SLAB_LEAF_BITS;
    uint64_t last = (((off + bytes) >> p->sgshift) - 1) >> ASCM_SLAB_LEAF_BITS;
    for (uint64_t i = first; i <= last; i++) {
        if (t->leaves[i]) continue;
        ascm_slab **leaf = calloc(1u << ASCM_SLAB_LEAF_BITS, sizeof *leaf);
        if (!leaf) return ASCM_ERR_HOSTMEM;
        __atomic_store_n(&t->leaves[i], leaf, __ATOMIC_RELEASE);
        p->slab_leaves++;
    }
    return ASCM_OK;
}

/* A descriptor is the struct and its taken bits, then each slot's word
 * (slack and live flag) on cache lines of their own: thread caches change
 * them without the lock. */
static size_t words_offset(uint32_t count) {
    return (sizeof(ascm_slab) + (count + 63) / 64 * sizeof(uint64_t) + 63) & ~(size_t)63;
}
static size_t descriptor_bytes(uint32_t count) {
    size_t end = words_offset(count) + count * sizeof(uint16_t);
    return (end + 63) & ~(size_t)63;
}

/* A descriptor for class cls: an idle one of the class, or a new one at a
 * free index. */
static int descriptor_for(ascm_pool *p, int cls, ascm_slab **out) {
    ascm_slab_class *k = &p->classes[cls];
    if (k->idle) {
        *out = p->slabs[k->idle];
        k->idle = (*out)->next;
        k->nidle--;
        return ASCM_OK;
    }
    uint32_t si;
    if (p->slab_free_index) {
        si = p->slab_free_index;
    } else if (p->nslabs_used == p->nslabs_cap) {
        uint32_t cap = p->nslabs_cap ? p->nslabs_cap * 2 : 64;
        if (cap >= (1u << 31)) return ASCM_ERR_HOSTMEM;
        ascm_slab **grown = realloc(p->slabs, cap * sizeof *grown);
        if (!grown) return ASCM_ERR_HOSTMEM;
        p->slabs = grown;
        p->nslabs_cap = cap;
        if (p->nslabs_used == 0) p->slabs[p->nslabs_used++] = NULL; /* index 0 = none */
        si = p->nslabs_used;
    } else {
        si = p->nslabs_used;
    }
    uint32_t nwords = (k->count + 63) / 64;
    size_t bytes = descriptor_bytes(k->count);
    /* aligned by hand: aligned_alloc is slower on this path */
    void *mem = malloc(bytes + 63);
    if (!mem) return ASCM_ERR_HOSTMEM;
    ascm_slab *s = (ascm_slab *)(((uintptr_t)mem + 63) & ~(uintptr_t)63); /* ascm_slab_new fills it */
    s->mem = mem;
    if (si == p->slab_free_index) p->slab_free_index = (uint32_t)((uintptr_t)p->slabs[si] >> 1);
    else p->nslabs_used++;
    s->cls = (uint32_t)cls;
    s->count = k->count;
    s->nwords = nwords;
    s->slack = (uint16_t *)((char *)s + words_offset(k->count));
    s->index = si;
    s->idle = 1;
    p->slabs[si] = s;
    *out = s;
    return ASCM_OK;
}

/* A descriptor no slab uses waits, idle, for the next slab of its class:
 * all of them while thread caches are on (a cache may be reading it), else
 * up to IDLE_DESCRIPTORS per class, so that a class that empties and refills
 * does not free and allocate one each time (at most ~51 KB of host memory a
 * pool; one per class is too few for rounds that release several slabs of a
 * class at once, and more than four gain nothing).  The others are freed, their index chained through its
 * pointer slot, tagged odd so that a walk over the array tells it from a
 * descriptor. */
#define IDLE_DESCRIPTORS 4u
static void free_descriptor(ascm_pool *p, ascm_slab *s) {
    uint32_t si = s->index;
    free(s->mem);
    p->slabs[si] = (ascm_slab *)(uintptr_t)(((uintptr_t)p->slab_free_index << 1) | 1u);
    p->slab_free_index = si;
}

static void make_idle(ascm_pool *p, ascm_slab *s) {
    ascm_slab_class *k = &p->classes[s->cls];
    s->idle = 1;
    if (k->nidle >= IDLE_DESCRIPTORS && !ascm_caches_on(p)) {
        free_descriptor(p, s);
        return;
    }
    s->next = k->idle;
    k->idle = s->index;
    k->nidle++;
}

/* Every slot's live flag from its taken bit (see ascm_slab_is_live). */
static void sync_slots(ascm_slab *s) {
    for (uint32_t slot = 0; slot < s->count; slot++) {
        uint16_t w = __atomic_load_n(&s->slack[slot], __ATOMIC_RELAXED) & (uint16_t)~ASCM_SLOT_LIVE;
        if ((s->bits[slot >> 6] >> (slot & 63)) & 1u) w |= ASCM_SLOT_LIVE;
        __atomic_store_n(&s->slack[slot], w, __ATOMIC_RELAXED);
    }
}

void ascm_slab_sync_live(ascm_pool *p) {
    for (uint32_t si = 1; si < p->nslabs_used; si++) {
        ascm_slab *s = ascm_slab_in_use(p, si);
        if (s) sync_slots(s);
    }
}

void ascm_slab_free_idle(ascm_pool *p) {
    for (int c = 0; c < ASCM_SLAB_CLASSES; c++) {
        ascm_slab_class *k = &p->classes[c];
        while (k->idle) {
            ascm_slab *s = p->slabs[k->idle];
            k->idle = s->next;
            free_descriptor(p, s);
        }
        k->nidle = 0;
    }
}

int ascm_slab_new(ascm_pool *p, int cls, uint32_t *out) {
    ascm_slab_class *k = &p->classes[cls];
    ascm_slab *s;
    /* Other classes' spares go back before a new slab is placed: where they
     * sit they split free space the new slab (or a large block after it)
     * would use, as before a fresh large block (pool.c); this class has
     * none, or it would not need a new slab. */
    if (p->empty_slabs) ascm_slab_trim(p);
    int st = descriptor_for(p, cls, &s);
    if (st != ASCM_OK) return st;
    uint32_t node;
    uint64_t off;
    const ascm_block_source *src = &p->slab_storage;
    st = src->take(src->ctx, k->slab_bytes, 1ull << p->sgshift, &node, &off);
    if (st == ASCM_OK && (st = make_leaves(p, off, k->slab_bytes)) != ASCM_OK) src->give(src->ctx, node);
    if (st != ASCM_OK) {
        make_idle(p, s);
        return st;
    }
    s->node = node;
    __atomic_store_n(&s->off, off, __ATOMIC_RELEASE);
    s->nfree = k->count;
    s->hint = 0;
    s->idle = 0;
    memset(s->bits, 0, s->nwords * sizeof(uint64_t));
    if (k->count & 63) s->bits[s->nwords - 1] = ~0ull << (k->count & 63);
    if (ascm_caches_on(p)) sync_slots(s); /* no slot live (else the sync when caches come on) */
    map_slab(p, off, k->slab_bytes, s);
    p->slab_bytes += k->slab_bytes;
    ascm_slab_list_push(p, k, s->index);
    k->empty++;
    p->empty_slabs++;
    *out = s->index;
    return ASCM_OK;
}

static void slab_release(ascm_pool *p, uint32_t si) {
    ascm_slab *s = p->slabs[si];
    ascm_slab_class *k = &p->classes[s->cls];
    if (p->hot_slab == si) ascm_slab_remember(p, 0);
    ascm_slab_list_unlink(p, k, si);
    map_slab(p, s->off, k->slab_bytes, NULL);
    p->slab_storage.give(p->slab_storage.ctx, s->node);
    p->slab_bytes -= k->slab_bytes;
    make_idle(p, s);
}

int ascm_slab_replace_spare(ascm_pool *p, int cls, uint32_t *out) {
    ascm_slab_class *k = &p->classes[cls];
    slab_release(p, k->partial);
    k->empty--;
    p->empty_slabs--;
    if (k->partial) {
        *out = k->partial;
        return ASCM_OK;
    }
    return ascm_slab_new(p, cls, out);
}

int ascm_slab_lookup(const ascm_pool *p, uint64_t off, uint64_t *usable, uint64_t *requested) {
    const ascm_slab *s = ascm_slab_of(p, off);
    if (!s) return ASCM_ERR_BADFREE;
    int64_t slot = ascm_slab_live_slot(p, s, off);
    if (slot < 0) return ASCM_ERR_BADFREE;
    *usable = p->classes[s->cls].size;
    *requested = *usable - ascm_slab_slack(s, (uint64_t)slot);
    return ASCM_OK;
}

void ascm_slab_emptied(ascm_pool *p, ascm_slab_class *k, uint32_t si) {
    if ((k->empty && (k->empty + 1) * k->slab_bytes > SLAB_SPARE_BYTES) || p->page_size > k->slab_bytes ||
        p->paging)
        slab_release(p, si);
    else {
        k->empty++;
        p->empty_slabs++;
    }
}

uint64_t ascm_slab_trim(ascm_pool *p) {
    uint64_t released = 0;
    for (int c = 0; c < ASCM_SLAB_CLASSES; c++) {
        ascm_slab_class *k = &p->classes[c];
        for (uint32_t si = k->partial; k->empty && si;) {
            uint32_t next = p->slabs[si]->next;
            if (p->slabs[si]->nfree == p->slabs[si]->count) {
                slab_release(p, si);
                k->empty--;
                p->empty_slabs--;
                released += k->slab_bytes;
            }
            si = next;
        }
    }
    return released;
}

void ascm_slab_forget_all(ascm_pool *p) {
    for (int c = 0; c < ASCM_SLAB_CLASSES; c++) p->classes[c].partial = p->classes[c].empty = 0;
    for (uint32_t si = 1; si < p->nslabs_used; si++) {
        ascm_slab *s = ascm_slab_in_use(p, si);
        if (!s) continue;
        map_slab(p, s->off, p->classes[s->cls].slab_bytes, NULL);
        make_idle(p, s);
    }
    ascm_slab_remember(p, 0);
    p->slab_bytes = 0;
    p->empty_slabs = 0;
}

void ascm_slab_destroy(ascm_pool *p) {
    for (uint32_t si = 1; si < p->nslabs_used; si++)
        if (!((uintptr_t)p->slabs[si] & 1u)) free(p->slabs[si]->mem);
    free(p->slabs);
    ascm_slab_table *t = &p->slabtab;
    for (uint64_t i = 0; t->leaves && i < t->nleaves; i++) free(t->leaves[i]);
    if (t->leaves) ascm_free_big(t->leaves, t->nleaves * sizeof *t->leaves);
}

uint64_t ascm_slab_cached_bytes(const ascm_pool *p) {
    uint64_t bytes = 0;
    for (int c = 0; c < ASCM_SLAB_CLASSES; c++) bytes += (uint64_t)p->classes[c].empty * p->classes[c].slab_bytes;
    return bytes;
}

int ascm_slab_is_empty_at(const ascm_pool *p, uint64_t off) {
    const ascm_slab *s = ascm_slab_of(p, off);
    return s && s->nfree == s->count;
}

uint64_t ascm_slab_metadata_bytes(const ascm_pool *p) {
    uint64_t bytes = p->nslabs_cap * sizeof(ascm_slab *);
    bytes += p->slabtab.nleaves * sizeof(ascm_slab **) + p->slab_leaves * (sizeof(ascm_slab *) << ASCM_SLAB_LEAF_BITS);
    for (uint32_t si = 1; si < p->nslabs_used; si++) {
        const ascm_slab *s = p->slabs[si];
        if ((uintptr_t)s & 1u) continue;
        bytes += descriptor_bytes(s->count);
    }
    return bytes;
}

void ascm_slab_walk(ascm_pool *p, ascm_block_fn fn, void *ctx) {
    for (uint32_t si = 1; si < p->nslabs_used; si++) {
        const ascm_slab *s = ascm_slab_in_use(p, si);
        if (!s) continue;
        uint32_t size = p->classes[s->cls].size;
        for (uint32_t slot = 0; slot < s->count; slot++)
            if (ascm_slab_is_live(p, s, slot))
                fn(ctx, p->base + s->off + (uint64_t)slot * size, size, size - ascm_slab_slack(s, slot));
    }
}

#define FAIL(...)                          \
    do {                                   \
        st = ascm_fail(__VA_ARGS__);       \
        goto out;                          \
    } while (0)

int ascm_slab_check(const ascm_pool *p, uint64_t *live, uint64_t *used, uint64_t *requested,
                    char *msg, size_t msglen) {
    uint32_t empty[ASCM_SLAB_CLASSES] = {0};
    uint64_t bytes = 0, granules = 0;
    int st = ASCM_OK;
    uint8_t *listed = calloc(p->nslabs_used + 1, 1);
    if (!listed) return ASCM_ERR_HOSTMEM;
    for (int c = 0; c < ASCM_SLAB_CLASSES; c++) {
        uint32_t prev = 0;
        for (uint32_t i = p->classes[c].partial; i; prev = i, i = p->slabs[i]->next) {
            if (i >= p->nslabs_used || !ascm_slab_in_use(p, i) || listed[i] ||
                p->slabs[i]->cls != (uint32_t)c || p->slabs[i]->prev != prev) {
                free(listed);
                return ascm_fail(msg, msglen, "class %d list is broken at slab %u", c, i);
            }
            listed[i] = 1;
        }
    }
    for (uint32_t si = 1; si < p->nslabs_used; si++) {
        const ascm_slab *s = ascm_slab_in_use(p, si);
        if (!s) continue;
        if (s->index != si) FAIL(msg, msglen, "slab %u holds index %u", si, s->index);
        if (s->cls >= ASCM_SLAB_CLASSES || s->count != p->classes[s->cls].count)
            FAIL(msg, msglen, "slab %u has a bad class", si);
        const ascm_slab_class *k = &p->classes[s->cls];
        if (!p->slab_storage.lent(p->slab_storage.ctx, s->node, s->off))
            FAIL(msg, msglen, "slab %u is not owned by its block", si);
        for (uint64_t g = s->off >> p->sgshift; g < (s->off + k->slab_bytes) >> p->sgshift; g++)
            if (ascm_slab_of(p, g << p->sgshift) != s)
                FAIL(msg, msglen, "slab %u granule %llu is not in the slab map", si, (unsigned long long)g);
        granules += k->slab_bytes >> p->sgshift;
        uint32_t inuse = 0;
        for (uint32_t slot = 0; slot < s->nwords * 64; slot++) {
            int bit = (int)((s->bits[slot >> 6] >> (slot & 63)) & 1u);
            int live = slot < s->count && ascm_slab_is_live(p, s, slot);
            if (slot >= s->count) {
                if (!bit) FAIL(msg, msglen, "slab %u has a free bit past its end", si);
                continue;
            }
            if (bit != live) /* check() runs with every thread cache flushed */
                FAIL(msg, msglen, "slab %u slot %u is %s", si, slot, live ? "live but free" : "taken but not live");
            if (!bit) continue;
            inuse++;
            if (ascm_slab_slack(s, slot) >= k->size)
                FAIL(msg, msglen, "slab %u slot %u has a bad size", si, slot);
            *used += k->size;
            *requested += k->size - ascm_slab_slack(s, slot);
        }
        for (uint32_t w = 0; w < s->hint; w++)
            if (s->bits[w] != ~0ull) FAIL(msg, msglen, "slab %u hint skips a free slot", si);
        if (inuse + s->nfree != s->count)
            FAIL(msg, msglen, "slab %u free count is wrong", si);
        *live += inuse;
        if (s->nfree == s->count) empty[s->cls]++;
        bytes += k->slab_bytes;
        if (listed[si] != (s->nfree > 0))
            FAIL(msg, msglen, "slab %u is %s its class's list", si,
                 listed[si] ? "wrongly on" : "missing from");
    }
out:
    free(listed);
    if (st != ASCM_OK) return st;
    for (int c = 0; c < ASCM_SLAB_CLASSES; c++)
        if (empty[c] != p->classes[c].empty ||
            (empty[c] > 1 && empty[c] * p->classes[c].slab_bytes > SLAB_SPARE_BYTES))
            return ascm_fail(msg, msglen, "class %d keeps %u empty slabs (counted %u)", c, empty[c],
                             p->classes[c].empty);
    uint64_t spares = 0;
    for (int c = 0; c < ASCM_SLAB_CLASSES; c++) spares += p->classes[c].empty;
    if (spares != p->empty_slabs) return ascm_fail(msg, msglen, "spare slab count is wrong");
    if (bytes != p->slab_bytes) return ascm_fail(msg, msglen, "slab byte count is wrong");
    if (granules != p->slab_granules) return ascm_fail(msg, msglen, "slab map has stale entries");
    return ASCM_OK;
}
