/* Hierarchical bitmap: a 64-ary tree of words, so that "lowest set bit" costs
 * one word per level instead of a scan of the whole map. */
#include "internal.h"

#include <stdlib.h>

int ascm_hbm_init(ascm_hbm *h, uint64_t nbits) {
    memset(h, 0, sizeof *h);
    h->nbits = nbits;
    uint64_t n = nbits ? nbits : 1;
    do {
        if (h->levels == ASCM_HBM_LEVELS) return ASCM_ERR_INVAL;
        uint64_t words = (n + 63) / 64;
        h->words[h->levels] = calloc(words, sizeof(uint64_t));
        if (!h->words[h->levels]) {
            ascm_hbm_destroy(h);
            return ASCM_ERR_HOSTMEM;
        }
        h->nwords[h->levels++] = words;
        n = words;
    } while (n > 1);
    return ASCM_OK;
}

void ascm_hbm_destroy(ascm_hbm *h) {
    for (int l = 0; l < ASCM_HBM_LEVELS; l++) free(h->words[l]);
    memset(h, 0, sizeof *h);
}

void ascm_hbm_clear_all(ascm_hbm *h) {
    for (int l = 0; l < h->levels; l++) memset(h->words[l], 0, h->nwords[l] * sizeof(uint64_t));
}

uint64_t ascm_hbm_bytes(const ascm_hbm *h) {
    uint64_t b = 0;
    for (int l = 0; l < h->levels; l++) b += h->nwords[l] * sizeof(uint64_t);
    return b;
}

int ascm_hbm_check(const ascm_hbm *h, char *msg, size_t msglen) {
    uint64_t last = h->nbits & 63;
    if (last && (h->words[0][h->nwords[0] - 1] >> last))
        return ascm_fail(msg, msglen, "bitmap has bits set past its end (%llu bits)",
                         (unsigned long long)h->nbits);
    for (int l = 0; l + 1 < h->levels; l++) {
        for (uint64_t w = 0; w < h->nwords[l]; w++) {
            int summary = (int)((h->words[l + 1][w >> 6] >> (w & 63)) & 1u);
            if (summary != (h->words[l][w] != 0))
                return ascm_fail(msg, msglen, "bitmap summary level %d word %llu disagrees", l + 1,
                                 (unsigned long long)w);
        }
    }
    return ASCM_OK;
}

/* Bits of word w (level 0) that lie in [lo, hi). */
static inline uint64_t range_mask(uint64_t w, uint64_t lo, uint64_t hi) {
    uint64_t mask = ~0ull;
    if (w == lo >> 6) mask &= ~0ull << (lo & 63);
    if (w == (hi - 1) >> 6 && (hi & 63)) mask &= ~(~0ull << (hi & 63));
    return mask;
}

/* A word at level l - 1 became non-empty (set) or empty (clear): bit i at
 * level l and up follows. */
static void mark_upper(ascm_hbm *h, int l, uint64_t i, int set) {
    for (; l < h->levels; l++) {
        uint64_t *w = &h->words[l][i >> 6];
        int was_empty = *w == 0;
        if (set) *w |= 1ull << (i & 63);
        else *w &= ~(1ull << (i & 63));
        if (set ? !was_empty : *w != 0) return;
        i >>= 6;
    }
}

void ascm_hbm_set_range(ascm_hbm *h, uint64_t lo, uint64_t hi) {
    for (uint64_t w = lo >> 6; lo < hi && w <= (hi - 1) >> 6; w++) {
        int was_empty = h->words[0][w] == 0;
        h->words[0][w] |= range_mask(w, lo, hi);
        if (was_empty) mark_upper(h, 1, w, 1);
    }
}

void ascm_hbm_clear_range(ascm_hbm *h, uint64_t lo, uint64_t hi) {
    for (uint64_t w = lo >> 6; lo < hi && w <= (hi - 1) >> 6; w++) {
        if (!h->words[0][w]) continue;
        h->words[0][w] &= ~range_mask(w, lo, hi);
        if (!h->words[0][w]) mark_upper(h, 1, w, 0);
    }
}

uint64_t ascm_hbm_count_range(const ascm_hbm *h, uint64_t lo, uint64_t hi) {
    uint64_t n = 0;
    for (uint64_t w = lo >> 6; lo < hi && w <= (hi - 1) >> 6; w++)
        n += (uint64_t)__builtin_popcountll(h->words[0][w] & range_mask(w, lo, hi));
    return n;
}
