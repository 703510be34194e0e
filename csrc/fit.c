/* Best fit with immediate coalescing over [0, nunits), all metadata
 * out-of-band.  The pool's path for large blocks and for slab storage.
 *
 * Why not the buddy here: a buddy places a block only at offsets aligned to
 * its size, which costs capacity on every recorded trace (BENCHMARKS.md,
 * efficiency).  Best fit, address-ordered among equal sizes, is the classic
 * fragmentation champion.  To keep it fast, free blocks
 * sit in size bins (64 per power of two, exact below 64 units) with a two-level
 * bitmap of non-empty bins: the bin of the request is scanned for the
 * smallest fit, else the next non-empty bin gives the smallest block larger
 * than any in the request's bin.  Scans stop after ASCM_FIT_SCAN (16) nodes:
 * each node looked at is a likely cache miss.  Taking just the head of a bin
 * is not enough: among equal sizes the lowest address matters.  Why sixteen
 * (a held-out trace whose bins hold many free blocks of near sizes):
 * docs/ARCHITECTURE.md, Note [Best fit].
 *
 * Large blocks are placed at the low end of the chosen free block.  Slabs
 * ("high" requests) go to the high end of a large free region, so long-lived
 * slabs cluster away from the large blocks' churn, but fill a smaller hole
 * (under HIGH_REGION times the slab) from its low end like any block: on the
 * recorded traces that beats both always-high and always-low, and the ratio
 * is not critical (Note [Slabs], "Where slabs go").
 *
 * Contiguous pools may ask best fit to spare the free block at the end of
 * the range (ascm_fit_take_sparing_end; below, "sparing the end").
 *
 * Every block (free or used) is a node; nodes are linked in address order,
 * so a freed block merges with free neighbours in O(1).
 *
 * Regions (paged pools only; a contiguous pool has one): the range is cut
 * into regions of a power of two of units, the last taking the rest, each
 * with bins of its own, and the pool sends each size class to a region
 * (pool.c, region_for: blocks under a granule to the first, larger ones to
 * the second).  Free blocks do not merge across a region boundary, so a
 * class keeps its region's space; a request its region cannot serve takes
 * best fit in the nearest region that can, and one no single free block
 * can serve joins free neighbours across boundaries (fuse_run).  Why: in a
 * paged pool a granule is mapped while any live byte is in it, and small
 * blocks mixed among large ones pin granules the large ones leave (the
 * figures, and why two regions, are in pool_lifecycle.c).
 */
#include "internal.h"

#include <stdlib.h>

#define INITIAL_NODES 256u
#define HIGH_REGION 64u /* see above: a "high" request in a smaller block goes low */

#define SUB ASCM_FIT_SUB_BITS
static inline uint32_t bin_of(uint64_t len) {
    if (len < (1u << SUB)) return (uint32_t)len;
    unsigned fl = ascm_log2_floor(len);
    return (1u << SUB) + ((fl - SUB) << SUB) + (uint32_t)((len >> (fl - SUB)) & ((1u << SUB) - 1));
}

#define BIN_MASK ((1u << ASCM_FIT_BIN_BITS) - 1)

/* Every function below that takes `regions` is called with a constant:
 * 0 for a fit with one region (the bins are f->one, a node's bin field is
 * its bin, nothing else is looked at: the contiguous pools' code as it was
 * before regions), 1 for a fit with several. */
ASCM_SPECIALISED ascm_fit_bins *bins_at(ascm_fit *f, uint32_t r, int regions) {
    return regions && r ? &f->extra[r - 1] : &f->one;
}

/* The region unit off lies in: the last one takes the rest of the range. */
static inline uint32_t region_of(const ascm_fit *f, uint32_t off) {
    uint32_t r = (uint32_t)((uint64_t)off >> f->region_shift);
    return r < f->nregions ? r : f->nregions - 1;
}

/* Into the bins of the region its start lies in (a node keeps that region
 * while it stays free, even if its start moves on: see ascm_fit_take). */
ASCM_SPECIALISED void bin_insert(ascm_fit *f, uint32_t i, int regions) {
    ascm_fit_node *n = &f->nodes[i];
    uint32_t b = bin_of(n->len), r = regions ? region_of(f, n->off) : 0;
    ascm_fit_bins *B = bins_at(f, r, regions);
    n->bin = (uint16_t)(b | (r << ASCM_FIT_BIN_BITS));
    n->is_free = 1;
    n->prev_free = ASCM_NODE_NONE;
    n->next_free = B->head[b];
    if (n->next_free) f->nodes[n->next_free].prev_free = i;
    B->head[b] = i;
    B->bits[b >> 6] |= 1ull << (b & 63);
    B->words |= 1ull << (b >> 6);
    f->free_units += n->len;
}

ASCM_SPECIALISED void bin_remove(ascm_fit *f, uint32_t i, int regions) {
    ascm_fit_node *n = &f->nodes[i];
    uint32_t b = regions ? n->bin & BIN_MASK : n->bin;
    ascm_fit_bins *B = bins_at(f, regions ? (uint32_t)n->bin >> ASCM_FIT_BIN_BITS : 0, regions);
    if (n->prev_free) f->nodes[n->prev_free].next_free = n->next_free;
    else B->head[b] = n->next_free;
    if (n->next_free) f->nodes[n->next_free].prev_free = n->prev_free;
    if (!B->head[b]) {
        B->bits[b >> 6] &= ~(1ull << (b & 63));
        if (!B->bits[b >> 6]) B->words &= ~(1ull << (b >> 6));
    }
    n->is_free = 0;
    f->free_units -= n->len;
}

/* First non-empty bin of B at or after b, or ASCM_FIT_BINS. */
static inline uint32_t next_bin(const ascm_fit_bins *B, uint32_t b) {
    if (b >= ASCM_FIT_BINS) return ASCM_FIT_BINS;
    uint32_t w = b >> 6;
    uint64_t bits = B->bits[w] & (~0ull << (b & 63));
    if (bits) return (w << 6) | ascm_ctz64(bits);
    uint64_t words = w + 1 < 64 ? B->words & (~0ull << (w + 1)) : 0;
    if (!words) return ASCM_FIT_BINS;
    w = ascm_ctz64(words);
    return (w << 6) | ascm_ctz64(B->bits[w]);
}

/* Whether unit off starts a region other than the first: free blocks do
 * not merge across it. */
ASCM_SPECIALISED int region_start(const ascm_fit *f, uint32_t off, int regions) {
    return regions && off && !(off & f->region_mask) && ((uint64_t)off >> f->region_shift) < f->nregions;
}

/* Makes room for two new nodes, so that node_take cannot fail or move the
 * array: the split in ascm_fit_take needs at most two, and must not move
 * the nodes while it holds pointers to them. */
static inline int nodes_reserve(ascm_fit *f) {
    if (ASCM_LIKELY(f->nused + 2 <= f->ncap)) return ASCM_OK;
    if (f->ncap >= (1u << 30)) return ASCM_ERR_HOSTMEM;
    ascm_fit_node *grown = realloc(f->nodes, (size_t)f->ncap * 2 * sizeof *grown);
    if (!grown) return ASCM_ERR_HOSTMEM;
    f->nodes = grown;
    f->ncap *= 2;
    return ASCM_OK;
}

static inline uint32_t node_take(ascm_fit *f) { /* after nodes_reserve */
    uint32_t i = f->recycled;
    if (i) {
        f->recycled = f->nodes[i].next_free;
        ASCM_PREFETCH(&f->nodes[f->recycled]); /* the next one: recycled nodes are scattered */
        return i;
    }
    return f->nused++;
}

static inline void node_recycle(ascm_fit *f, uint32_t i) {
    f->nodes[i].len = 0;
    f->nodes[i].is_free = 0;
    f->nodes[i].is_slab = 0;
    f->nodes[i].by_handle = 0;
    f->nodes[i].next_free = f->recycled;
    f->recycled = i;
}

/* A new node for the first len units of block x, linked in before it; x
 * keeps the rest.  Bins are the caller's business. */
static inline uint32_t split_front(ascm_fit *f, uint32_t x, uint32_t len) {
    uint32_t i = node_take(f);
    ascm_fit_node *n = &f->nodes[i], *blk = &f->nodes[x];
    n->off = blk->off;
    n->len = len;
    n->prev_phys = blk->prev_phys;
    n->next_phys = x;
    if (n->prev_phys) f->nodes[n->prev_phys].next_phys = i;
    blk->prev_phys = i;
    blk->off += len;
    blk->len -= len;
    return i;
}

/* One free node per region, in address order (nodes 1..nregions). */
void ascm_fit_reset(ascm_fit *f) {
    memset(&f->one, 0, sizeof f->one);
    if (f->extra) memset(f->extra, 0, (f->nregions - 1) * sizeof *f->extra);
    f->free_units = 0;
    f->recycled = ASCM_NODE_NONE;
    memset(&f->nodes[0], 0, sizeof f->nodes[0]);
    f->nused = 1 + f->nregions;
    for (uint32_t r = 0; r < f->nregions; r++) {
        ascm_fit_node *n = &f->nodes[1 + r];
        uint64_t start = (uint64_t)r << f->region_shift;
        uint64_t end = r + 1 < f->nregions ? start + f->region_mask + 1ull : f->nunits;
        memset(n, 0, sizeof *n);
        n->off = (uint32_t)start;
        n->len = (uint32_t)((end < f->nunits ? end : f->nunits) - start);
        n->prev_phys = r ? r : ASCM_NODE_NONE;
        n->next_phys = r + 1 < f->nregions ? r + 2 : ASCM_NODE_NONE;
        if (f->nregions > 1) bin_insert(f, 1 + r, 1);
        else bin_insert(f, 1 + r, 0);
    }
}

int ascm_fit_init(ascm_fit *f, uint64_t nunits, uint32_t nregions) {
    memset(f, 0, sizeof *f);
    f->nunits = nunits;
    f->nregions = 1;
    f->region_shift = 32;
    f->region_mask = UINT32_MAX;
    if (nregions > ASCM_FIT_MAX_REGIONS) nregions = ASCM_FIT_MAX_REGIONS;
    if (nregions > 1 && nunits >= nregions) {
        /* regions of the largest power of two of units of which nregions
         * fit in the range, the last taking the rest: a region's size is a
         * fixed part of the range (between 1/(2 nregions) and 1/nregions),
         * whatever the range's size */
        unsigned shift = 0;
        while (((uint64_t)nregions << (shift + 1)) <= nunits) shift++;
        f->nregions = nregions;
        if (f->nregions > 1) {
            f->region_shift = shift;
            f->region_mask = (uint32_t)((1ull << shift) - 1);
            f->extra = calloc(f->nregions - 1, sizeof *f->extra);
            if (!f->extra) return ASCM_ERR_HOSTMEM;
        }
    }
    f->ncap = INITIAL_NODES > 2 * f->nregions ? INITIAL_NODES : 2 * f->nregions;
    f->nodes = malloc(f->ncap * sizeof *f->nodes);
    if (!f->nodes) return ASCM_ERR_HOSTMEM;
    ascm_fit_reset(f);
    return ASCM_OK;
}

void ascm_fit_destroy(ascm_fit *f) {
    free(f->nodes);
    f->nodes = NULL;
    free(f->extra);
    f->extra = NULL;
}

/* Smallest block of at least need units in the list from head (ties: lowest
 * address, or highest when high). */
static inline uint32_t best_in_bin(const ascm_fit *f, uint32_t head, uint64_t need, int high) {
    uint32_t best = ASCM_NODE_NONE;
    unsigned seen = 0;
    for (uint32_t i = head; i && seen < ASCM_FIT_SCAN; i = f->nodes[i].next_free, seen++) {
        const ascm_fit_node *n = &f->nodes[i];
        if (n->len < need) continue;
        if (!best || n->len < f->nodes[best].len ||
            (n->len == f->nodes[best].len && (n->off < f->nodes[best].off) != high))
            best = i;
    }
    return best;
}

/* Best fit for need units among the free blocks of B other than node
 * other, or 0 (the bins from need's up, to the first that holds one; ties:
 * lowest address, or highest when high).  Node other takes none of a bin's
 * ASCM_FIT_SCAN looks: the scan sees what it would see were other not
 * there (a region's wild block, of a size that varies with the range). */
static uint32_t find_other(const ascm_fit *f, const ascm_fit_bins *B, uint64_t need, uint32_t other,
                           int high) {
    for (uint32_t b = next_bin(B, bin_of(need)); b < ASCM_FIT_BINS; b = next_bin(B, b + 1)) {
        uint32_t best = ASCM_NODE_NONE;
        unsigned seen = 0;
        for (uint32_t i = B->head[b]; i && seen < ASCM_FIT_SCAN; i = f->nodes[i].next_free) {
            const ascm_fit_node *n = &f->nodes[i];
            if (i == other) continue;
            seen++;
            if (n->len < need) continue;
            if (!best || n->len < f->nodes[best].len ||
                (n->len == f->nodes[best].len && (n->off < f->nodes[best].off) != high))
                best = i;
        }
        if (best) return best;
    }
    return ASCM_NODE_NONE;
}

/* Best fit for need units among the free blocks of one region, or 0. */
static inline uint32_t find_in(const ascm_fit *f, const ascm_fit_bins *B, uint64_t need, int high) {
    uint32_t b = bin_of(need);
    uint32_t x = B->head[b] ? best_in_bin(f, B->head[b], need, high) : ASCM_NODE_NONE;
    if (!x) {
        uint32_t b2 = next_bin(B, b + 1);
        if (b2 == ASCM_FIT_BINS) return ASCM_NODE_NONE;
        x = best_in_bin(f, B->head[b2], need, high);
    }
    return x;
}

/* Whether free block i reaches the end of its region (the end of the range
 * for the last). */
static inline int region_tail(const ascm_fit *f, uint32_t i) {
    uint32_t next = f->nodes[i].next_phys;
    return !next || region_start(f, f->nodes[next].off, 1);
}

/* Whether free block i of B's region is the largest there (ties: any). */
static int largest_in(const ascm_fit *f, const ascm_fit_bins *B, uint32_t i) {
    uint32_t w = 63 - (uint32_t)__builtin_clzll(B->words);
    uint32_t top = (w << 6) | ascm_log2_floor(B->bits[w]);
    if ((f->nodes[i].bin & BIN_MASK) != top) return 0;
    for (uint32_t j = B->head[top]; j; j = f->nodes[j].next_free)
        if (f->nodes[j].len > f->nodes[i].len) return 0;
    return 1;
}

/* The wild block of a region of a fit with regions: the part of the region
 * that nothing has used yet (or that was given back to it), whose size is
 * the region's less what is in use, and a region's size is a fixed part of
 * the range (ascm_fit_init).  Best fit takes it last, as if it were larger
 * than any other free block: compared by size, a block went to it in a
 * small range and to an older hole of the same region in a large one, so the
 * memory mapped moved with the range's size (speculative_decoding at 2 MiB:
 * 14 granules in a range of four times its peak, 13 in 64 GiB).  Taken last
 * it acts as the end of an unbounded arena, the reference best fit's
 * (ascmem.reference.bestfit_unmapped_peak).  In the first region blocks go
 * at the low end of their hole, and the wild block is the one reaching the
 * region's end.  In the others large blocks come from the top (Note
 * [Size-class regions]), and it lies between the two ends: the largest
 * free block, which in a range of any size that the trace does not fill is
 * that one. */
static inline int wild(const ascm_fit *f, uint32_t region, uint32_t i) {
    return region ? largest_in(f, bins_at((ascm_fit *)f, region, 1), i) : region_tail(f, i);
}

/* Best fit in one region of a fit with regions, the wild block last. */
static uint32_t find_wild_last(const ascm_fit *f, uint32_t region, uint64_t need, int high) {
    const ascm_fit_bins *B = bins_at((ascm_fit *)f, region, 1);
    uint32_t x = find_in(f, B, need, high);
    if (x && wild(f, region, x)) {
        uint32_t y = find_other(f, B, need, x, high);
        if (y) return y;
    }
    return x;
}

/* The region's bins had nothing: the nearest region that has, looking
 * alternately above and below. */
static uint32_t find_elsewhere(ascm_fit *f, uint32_t region, uint64_t need, int high) {
    for (uint32_t d = 1; d < f->nregions; d++) {
        uint32_t x = region + d < f->nregions ? find_wild_last(f, region + d, need, high) : 0;
        if (!x && d <= region) x = find_wild_last(f, region - d, need, high);
        if (x) return x;
    }
    return ASCM_NODE_NONE;
}

int ascm_fit_has_equal_below(const ascm_fit *f, uint64_t n, uint32_t off) {
    unsigned seen = 0;
    for (uint32_t i = f->one.head[bin_of(n)]; i && seen < ASCM_FIT_SCAN; i = f->nodes[i].next_free, seen++)
        if (f->nodes[i].len == n && f->nodes[i].off < off) return 1;
    return 0;
}

uint32_t ascm_fit_first(const ascm_fit *f) {
    for (uint32_t i = 1; i < f->nused; i++)
        if (f->nodes[i].len && f->nodes[i].off == 0) return i;
    return ASCM_NODE_NONE;
}

/* No single free block holds need units: joins the first run of free
 * neighbours (across region boundaries) that does and starts in a region
 * below `below` (f->nregions: any), into one block in the bins of the run's
 * first region; 0 if there is none.  O(blocks), on the way to an
 * out-of-memory error only, or past a best-fit pool's first region. */
static uint32_t fuse_run(ascm_fit *f, uint64_t need, uint32_t below) {
    uint32_t i, first = ASCM_NODE_NONE;
    uint64_t run = 0;
    for (i = ascm_fit_first(f); i; i = f->nodes[i].next_phys) {
        if (!first && region_of(f, f->nodes[i].off) >= below) return ASCM_NODE_NONE;
        if (!f->nodes[i].is_free) {
            first = ASCM_NODE_NONE;
            run = 0;
            continue;
        }
        if (!first) first = i;
        run += f->nodes[i].len;
        if (run >= need) break;
    }
    if (!i) return ASCM_NODE_NONE;
    uint32_t end = f->nodes[i].next_phys;
    bin_remove(f, first, 1);
    for (uint32_t j = f->nodes[first].next_phys; j != end;) {
        uint32_t next = f->nodes[j].next_phys;
        bin_remove(f, j, 1);
        f->nodes[first].len += f->nodes[j].len;
        node_recycle(f, j);
        j = next;
    }
    f->nodes[first].next_phys = end;
    if (end) f->nodes[end].prev_phys = first;
    bin_insert(f, first, 1);
    return first;
}

/* ---- granules (paged pools, ascm_fit_take_in with a granule of g units) --
 * A granule stays mapped while any live byte is in it, so where a block of
 * a granule or more sits inside its hole decides how many granules it pins:
 *  - one that fills its last granule all but a sixteenth starts at a granule
 *    boundary (whole: it then pins no more granules than it must, and the
 *    sliver it leaves is of no use to its class anyway);
 *  - one of one to sixteen granules goes, within the hole best fit chose,
 *    to whichever of the hole's two ends and the first and last granule
 *    boundaries in it makes it span the fewest granules (ties: the lowest).
 * Limits (docs/ARCHITECTURE.md, Note [Granule rules]): sixteen granules,
 * since larger blocks are a growing cache's, which the rule scatters; not
 * under a granule, where it scatters a growing cache over many granules
 * (scripts/paged_placement_sim.py models the rules on every trace).  Blocks
 * of six granules or more outside the first region go to the high end of
 * their hole instead, placed by granule_place_high (large blocks from the
 * top, below). */
static inline int whole_granules(uint64_t n, uint64_t g) { return n >= g && ((0 - n) & (g - 1)) <= g / 16; }

static inline uint64_t span(uint64_t s, uint64_t n, uint64_t g) { return (s + n - 1) / g - s / g; }

/* Where n units go in the free block [off, off + len) (see above). */
static inline uint64_t granule_place(uint64_t off, uint64_t len, uint64_t n, uint64_t g) {
    uint64_t end = off + len, up = (off + g - 1) & ~(g - 1);
    if (whole_granules(n, g)) return up; /* the caller chose a block where it fits */
    if (n < g || n >= 16 * g) return off;
    uint64_t c[3] = {end - n, up, (end & ~(g - 1)) - n}, best = off, best_span = span(off, n, g);
    for (int i = 0; i < 3; i++) {
        if (c[i] < off || c[i] > end - n) continue; /* (end & ~(g - 1)) - n may wrap: caught here */
        uint64_t sp = span(c[i], n, g);
        if (sp < best_span || (sp == best_span && c[i] < best)) {
            best = c[i];
            best_span = sp;
        }
    }
    return best;
}

/* Where n units go at the high end of the free block [off, off + len)
 * (large blocks from the top, below): against the block's end, or moved
 * down to the granule boundary at or below that start, or to end at the
 * last granule boundary in the block, whichever spans the fewest granules
 * (ties: the highest).  Against the end alone, a block that is not a whole
 * number of granules leaves the next one below it a start inside a granule,
 * and every large block after it straddles one granule more. */
static inline uint64_t granule_place_high(uint64_t off, uint64_t len, uint64_t n, uint64_t g) {
    uint64_t end = off + len, top = end - n;
    uint64_t c[2] = {top & ~(g - 1), (end & ~(g - 1)) - n}, best = top, best_span = span(top, n, g);
    for (int i = 0; i < 2; i++) {
        if (c[i] < off || c[i] > top) continue; /* (end & ~(g - 1)) - n may wrap: caught here */
        uint64_t sp = span(c[i], n, g);
        if (sp < best_span || (sp == best_span && c[i] > best)) {
            best = c[i];
            best_span = sp;
        }
    }
    return best;
}

/* Best fit among the free blocks of B that hold n units from a granule
 * boundary, looking at a few non-empty bins from n's, the region's tail
 * aside; 0 if none of those does (the caller then asks for n + g - 1
 * units, which any block holds, the tail last). */
static uint32_t find_whole(const ascm_fit *f, uint32_t region, uint64_t n, uint64_t g) {
    const ascm_fit_bins *B = bins_at((ascm_fit *)f, region, 1);
    uint32_t b = bin_of(n);
    for (int bins = 0; bins < 4; bins++, b++) {
        if ((b = next_bin(B, b)) == ASCM_FIT_BINS) return ASCM_NODE_NONE;
        uint32_t best = ASCM_NODE_NONE;
        unsigned seen = 0;
        for (uint32_t i = B->head[b]; i && seen < ASCM_FIT_SCAN; i = f->nodes[i].next_free, seen++) {
            const ascm_fit_node *x = &f->nodes[i];
            if (((x->off + g - 1) & ~(g - 1)) + n > (uint64_t)x->off + x->len) continue;
            if (wild(f, region, i)) continue; /* taken last (find_wild_last) */
            if (!best || x->len < f->nodes[best].len ||
                (x->len == f->nodes[best].len && x->off < f->nodes[best].off))
                best = i;
        }
        if (best) return best;
    }
    return ASCM_NODE_NONE;
}

/* Free block x (nodes reserved) becomes the used block [start, start + n);
 * what is left before and after it stays free. */
ASCM_SPECIALISED void carve(ascm_fit *f, uint32_t x, uint64_t start, uint64_t n, int regions) {
    ascm_fit_node *blk = &f->nodes[x];
    bin_remove(f, x, regions);
    if (start > blk->off) /* the part before start stays free */
        bin_insert(f, split_front(f, x, (uint32_t)(start - blk->off)), regions);
    if (blk->len > n) { /* the part after start + n stays free */
        uint32_t tail_node = node_take(f);
        ascm_fit_node *t = &f->nodes[tail_node];
        t->off = blk->off + (uint32_t)n;
        t->len = blk->len - (uint32_t)n;
        t->prev_phys = x;
        t->next_phys = blk->next_phys;
        if (t->next_phys) f->nodes[t->next_phys].prev_phys = tail_node;
        blk->next_phys = tail_node;
        blk->len = (uint32_t)n;
        bin_insert(f, tail_node, regions);
    }
    blk->slack = 0;
    blk->is_slab = 0;
    blk->by_handle = 0;
}

/* ---- sparing the end (contiguous pools; the pool decides which requests)
 * The free block that reaches the end of the range holds the part of the
 * arena never used yet.  Split for a request that another free block could
 * hold, it raises the arena's high-water mark for good.  Best fit keeps it
 * as a block like any other; the wilderness rule of the allocator
 * literature (Wilson et al. 1995) takes any other block first.  Neither
 * wins on every recorded trace, and the pool applies the rule only where it
 * helps: to a request of a size that has never been given back to best fit
 * (a working set that grows: the next stage, a new input shape), and only
 * when the end block is at least end_factor times the request; when it is
 * less, the end is a snug fit, which a layout that fills the arena exactly
 * depends on (docs/ARCHITECTURE.md, Note [Sparing the end], has the
 * figures). */
ASCM_SPECIALISED int reaches_end(const ascm_fit *f, uint32_t x) {
    return (uint64_t)f->nodes[x].off + f->nodes[x].len == f->nunits;
}

/* take's `regions` for a fit whose regions act as one (ascm_fit_take_across). */
#define ACROSS 2

ASCM_SPECIALISED int take(ascm_fit *f, uint64_t n, uint64_t align_units, int high, uint32_t region,
                          uint64_t g, uint32_t *out, int regions, uint64_t end_factor,
                          int (*spare_end)(const void *ctx, uint64_t n), const void *ctx) {
    if (align_units > 1) g = 0; /* the granule rules place requests with no alignment of their own */
    uint64_t need = n + align_units - 1; /* room to slide the start to alignment */
    if (need < n || need > f->nunits) return ASCM_ERR_NOMEM;
    uint32_t x = ASCM_NODE_NONE;
    if (regions && g && whole_granules(n, g)) {
        x = find_whole(f, region, n, g);
        if (!x && n + g - 1 <= f->nunits) { /* any block of n + g - 1 units holds it whole */
            x = find_wild_last(f, region, n + g - 1, high);
            if (!x) x = find_elsewhere(f, region, n + g - 1, high);
        }
        if (!x) g = 0; /* no free block holds it whole: placed as any block */
    }
    if (!x) x = regions ? find_wild_last(f, region, need, high)
                        : find_in(f, bins_at(f, region, regions), need, high);
    if (end_factor && x && reaches_end(f, x) && f->nodes[x].len / end_factor >= need && spare_end(ctx, n)) {
        uint32_t y = find_other(f, &f->one, need, x, 0);
        if (y) x = y;
    }
    /* the first region's free end joined to the next's free start only:
     * a run that starts further on is another region's, for best fit */
    if (regions == ACROSS && !x) x = fuse_run(f, need, 1);
    if (regions && !x && !(x = find_elsewhere(f, region, need, high))) x = fuse_run(f, need, f->nregions);
    if (!x) return ASCM_ERR_NOMEM;
    /* Room for the split's nodes first: growing the array moves it.  The low
     * end of a block is used unless high, so a head gap only comes from
     * alignment or high; an exact fit (the commonest case in the steady
     * benchmark) needs no node at all. */
    if (ASCM_UNLIKELY(nodes_reserve(f) != ASCM_OK)) return ASCM_ERR_HOSTMEM;
    ascm_fit_node *blk = &f->nodes[x];
    if (high && !regions && blk->len < n * HIGH_REGION) high = 0; /* paged pools: see above */
    uint64_t placed = regions && g ? granule_place(blk->off, blk->len, n, g) : blk->off;
    if (!high && placed == blk->off && blk->len > n && !(blk->off & (align_units - 1)) &&
        bin_of(blk->len - n) == (regions ? blk->bin & BIN_MASK : blk->bin)) {
        /* Carving the low end of a free block whose rest stays in the same
         * bin (a large free region: LIFO and batch use): the free block keeps
         * its node and its place in the bin (and region, should its start
         * move into the next), the carved part gets a new node, and no bin
         * list is touched. */
        uint32_t u = split_front(f, x, (uint32_t)n);
        ascm_fit_node *used = &f->nodes[u];
        used->is_free = 0;
        used->is_slab = 0;
        used->by_handle = 0;
        used->slack = 0;
        f->free_units -= n;
        *out = u;
        return ASCM_OK;
    }
    uint64_t start = high && regions && g ? granule_place_high(blk->off, blk->len, n, g)
                     : high ? (blk->off + blk->len - n) & ~(align_units - 1)
                            : regions && g ? placed : (blk->off + align_units - 1) & ~(align_units - 1);
    carve(f, x, start, n, regions);
    *out = x;
    return ASCM_OK;
}

/* Large blocks from the top (paged pools): in a region other than the
 * first, a block of HIGH_GRANULES granules or more takes the high end of
 * the free block best fit chose (placed by granule_place_high), smaller
 * ones its low end (the granule rules above).  The large blocks of a step
 * (activations of a resolution, a layer's weights) and the blocks of a few
 * granules then fill the region's free space from its two ends, as if each
 * had a region of its own, with no boundary between them whose place would
 * depend on the range.  Six, at 2 MiB: the two multi-resolution CNNs
 * 0.968 -> 0.979 and 0.965 -> 0.977, resnet18_train 0.980 -> 0.985, the
 * SDXL-shaped UNet at real scale 0.987 -> 0.996 (its 6.25-granule
 * activations); eight kept the UNet at 0.987 and resnet18 at 0.975, four
 * to six are alike; sixteen lost the CNNs' gain (docs/ARCHITECTURE.md, Note
 * [Size-class regions]). */
#define HIGH_GRANULES 6u

/* `inline`: a hint for LTO to inline it into the pool's one caller, as it
 * did before regions. */
inline int ascm_fit_take(ascm_fit *f, uint64_t n, uint64_t align_units, int high, uint32_t *out) {
    return take(f, n, align_units, high, 0, 0, out, 0, 0, NULL, NULL);
}

int ascm_fit_take_sparing_end(ascm_fit *f, uint64_t n, uint64_t align_units, uint64_t end_factor,
                              int (*spare_end)(const void *ctx, uint64_t n), const void *ctx,
                              uint32_t *out) {
    return take(f, n, align_units, 0, 0, 0, out, 0, end_factor, spare_end, ctx);
}

/* Plain best fit in the first region, which the others continue: a request
 * it cannot hold joins its free end to the free start of the next region
 * (fuse_run) before it goes to best fit in another region.  The first region
 * holds a quarter to a half of the range; sent to the next region's start,
 * such a request left the first one's end unused in a range of four times
 * the peak that in 64 GiB it would have taken (vit_train, 2 MiB: 521
 * granules against 520). */
int ascm_fit_take_across(ascm_fit *f, uint64_t n, uint64_t align_units, uint32_t *out) {
    return take(f, n, align_units, 0, 0, 0, out, ACROSS, 0, NULL, NULL);
}

int ascm_fit_take_in(ascm_fit *f, uint64_t n, uint64_t align_units, uint32_t region, uint64_t granule,
                     uint32_t *out) {
    int high = granule && region && n >= HIGH_GRANULES * granule;
    return take(f, n, align_units, high, region, granule, out, 1, 0, NULL, NULL);
}

/* ---- mapped granules first (paged pools; the pool decides which requests)
 * A block of a quarter granule or more, under a granule, of a size the pool
 * has freed before, goes where its bytes land only in granules mapped
 * already: at either end (the low one first) of the smallest free block of
 * its region where that holds, the lowest among equals.  Sizes that come
 * back are a step's tensors, which come back every step; in mapped granules
 * they map nothing.  Sizes seen once -- a KV cache grown by torch.cat, a new
 * size each step -- keep best fit, which packs them end to end: sent to
 * mapped granules they scatter (scripts/paged_placement_sim.py models it).
 * Looks at IN_MAPPED_SCAN free blocks at most, in size order: a longer
 * scan found no better place on any trace. */
#define IN_MAPPED_SCAN 16u

/* Whether n units at start s of free block x land in mapped granules only
 * (a block under a granule touches one or two: its first and last). */
static inline int in_mapped(uint64_t s, uint64_t n, uint64_t g,
                            int (*mapped)(const void *ctx, uint64_t granule), const void *ctx) {
    return mapped(ctx, s / g) && mapped(ctx, (s + n - 1) / g);
}

uint32_t ascm_fit_find_mapped(ascm_fit *f, uint64_t n, uint32_t region, uint64_t g,
                              int (*mapped)(const void *ctx, uint64_t granule), const void *ctx,
                              uint64_t *start) {
    const ascm_fit_bins *B = bins_at(f, region, 1);
    uint32_t best = ASCM_NODE_NONE, tail = ASCM_NODE_NONE;
    uint64_t best_start = 0;
    unsigned seen = 0;
    for (uint32_t b = next_bin(B, bin_of(n)); b < ASCM_FIT_BINS && !best && seen < IN_MAPPED_SCAN;
         b = next_bin(B, b + 1)) {
        for (uint32_t i = B->head[b]; i && seen < IN_MAPPED_SCAN; i = f->nodes[i].next_free) {
            const ascm_fit_node *x = &f->nodes[i];
            if (wild(f, region, i)) { /* looked at last, as best fit takes it (find_wild_last) */
                tail = i;
                continue;
            }
            seen++;
            if (x->len < n || (best && (x->len > f->nodes[best].len ||
                                        (x->len == f->nodes[best].len && x->off > f->nodes[best].off))))
                continue;
            uint64_t s = x->off, e = (uint64_t)x->off + x->len - n;
            if (in_mapped(s, n, g, mapped, ctx)) {
                best = i;
                best_start = s;
            } else if (in_mapped(e, n, g, mapped, ctx)) {
                best = i;
                best_start = e;
            }
        }
    }
    if (!best && tail && seen < IN_MAPPED_SCAN && f->nodes[tail].len >= n) {
        uint64_t s = f->nodes[tail].off, e = s + f->nodes[tail].len - n;
        if (in_mapped(s, n, g, mapped, ctx) || in_mapped(e, n, g, mapped, ctx)) {
            best = tail;
            best_start = in_mapped(s, n, g, mapped, ctx) ? s : e;
        }
    }
    *start = best_start;
    return best;
}

int ascm_fit_take_mapped(ascm_fit *f, uint64_t n, uint32_t region, uint64_t g,
                         int (*mapped)(const void *ctx, uint64_t granule), const void *ctx,
                         uint32_t *out) {
    uint64_t start;
    uint32_t x = ascm_fit_find_mapped(f, n, region, g, mapped, ctx, &start);
    if (!x) return ASCM_ERR_NOMEM;
    if (ASCM_UNLIKELY(nodes_reserve(f) != ASCM_OK)) return ASCM_ERR_HOSTMEM;
    carve(f, x, start, n, 1);
    *out = x;
    return ASCM_OK;
}

ASCM_SPECIALISED void give(ascm_fit *f, uint32_t i, int regions) {
    ascm_fit_node *n = &f->nodes[i];
    uint32_t prev = n->prev_phys, next = n->next_phys;
    if (prev && f->nodes[prev].is_free && !region_start(f, n->off, regions)) {
        bin_remove(f, prev, regions);
        ascm_fit_node *p = &f->nodes[prev];
        p->len += n->len;
        p->next_phys = next;
        if (next) f->nodes[next].prev_phys = prev;
        node_recycle(f, i);
        i = prev;
        n = p;
    }
    if (next && f->nodes[next].is_free && !region_start(f, f->nodes[next].off, regions)) {
        bin_remove(f, next, regions);
        n->len += f->nodes[next].len;
        n->next_phys = f->nodes[next].next_phys;
        if (n->next_phys) f->nodes[n->next_phys].prev_phys = i;
        node_recycle(f, next);
    }
    n->slack = 0;
    n->is_slab = 0;
    n->by_handle = 0;
    bin_insert(f, i, regions);
}

void ascm_fit_give(ascm_fit *f, uint32_t i) {
    if (ASCM_UNLIKELY(f->nregions > 1)) give(f, i, 1);
    else give(f, i, 0);
}

/* The largest request that succeeds: the largest free block, or with
 * regions the longest run of free neighbours (fuse_run joins them). */
uint64_t ascm_fit_largest(const ascm_fit *f) {
    uint64_t best = 0;
    if (f->nregions > 1) {
        uint64_t run = 0;
        for (uint32_t i = ascm_fit_first(f); i; i = f->nodes[i].next_phys) {
            run = f->nodes[i].is_free ? run + f->nodes[i].len : 0;
            if (run > best) best = run;
        }
        return best;
    }
    const ascm_fit_bins *B = &f->one;
    if (!B->words) return 0;
    uint32_t w = 63 - (uint32_t)__builtin_clzll(B->words);
    uint32_t b = (w << 6) | ascm_log2_floor(B->bits[w]);
    for (uint32_t i = B->head[b]; i; i = f->nodes[i].next_free)
        if (f->nodes[i].len > best) best = f->nodes[i].len;
    return best;
}

int ascm_fit_check(const ascm_fit *f, char *msg, size_t msglen) {
    /* address order covers [0, nunits) exactly, with no two free neighbours */
    uint32_t first = ascm_fit_first(f);
    if (!first) return ascm_fail(msg, msglen, "no block starts at unit 0");
    uint64_t off = 0, free_units = 0, nodes = 0;
    uint32_t prev = ASCM_NODE_NONE;
    for (uint32_t i = first; i; i = f->nodes[i].next_phys) {
        const ascm_fit_node *n = &f->nodes[i];
        if (++nodes > f->nused) return ascm_fail(msg, msglen, "address-order list has a cycle");
        if (n->off != off || n->len == 0)
            return ascm_fail(msg, msglen, "block at unit %llu does not follow its neighbour",
                             (unsigned long long)n->off);
        if (n->prev_phys != prev)
            return ascm_fail(msg, msglen, "block at unit %llu has a wrong back link",
                             (unsigned long long)n->off);
        if (n->is_free) {
            if (prev && f->nodes[prev].is_free && !region_start(f, n->off, f->nregions > 1))
                return ascm_fail(msg, msglen, "free blocks at units %llu and before were not merged",
                                 (unsigned long long)n->off);
            if ((n->bin & BIN_MASK) != bin_of(n->len) || (uint32_t)(n->bin >> ASCM_FIT_BIN_BITS) >= f->nregions)
                return ascm_fail(msg, msglen, "free block at unit %llu is in the wrong bin",
                                 (unsigned long long)n->off);
            free_units += n->len;
        }
        off += n->len;
        prev = i;
    }
    if (off != f->nunits) return ascm_fail(msg, msglen, "blocks cover %llu of %llu units",
                                           (unsigned long long)off, (unsigned long long)f->nunits);
    if (free_units != f->free_units) return ascm_fail(msg, msglen, "free unit count is wrong");
    uint64_t listed = 0, listed_units = 0;
    for (uint32_t r = 0; r < f->nregions; r++) {
        const ascm_fit_bins *B = r ? &f->extra[r - 1] : &f->one;
        for (uint32_t b = 0; b < ASCM_FIT_BINS; b++) {
            int bit = (int)((B->bits[b >> 6] >> (b & 63)) & 1);
            if (bit != (B->head[b] != 0)) return ascm_fail(msg, msglen, "bin %u bitmap is wrong", b);
            uint32_t p = ASCM_NODE_NONE;
            for (uint32_t i = B->head[b]; i; i = f->nodes[i].next_free) {
                if (!f->nodes[i].is_free || f->nodes[i].bin != (b | (r << ASCM_FIT_BIN_BITS)) ||
                    f->nodes[i].prev_free != p)
                    return ascm_fail(msg, msglen, "bin %u list is broken", b);
                if (++listed > f->nused) return ascm_fail(msg, msglen, "bin %u list has a cycle", b);
                listed_units += f->nodes[i].len;
                p = i;
            }
        }
        for (uint32_t w = 0; w < (ASCM_FIT_BINS + 63) / 64; w++)
            if ((int)((B->words >> w) & 1) != (B->bits[w] != 0))
                return ascm_fail(msg, msglen, "bin summary word %u is wrong", w);
    }
    if (listed_units != free_units) return ascm_fail(msg, msglen, "a free block is in no bin");
    return ASCM_OK;
}
