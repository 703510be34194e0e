/* A set of 64-bit addresses (device.c's guarded blocks): open addressing
 * with linear probing, deletion by backward shift (no tombstones), grown
 * when half full.  Not thread-safe: its owner holds a lock around it. */
#include "internal.h"

#include <stdlib.h>

/* Addresses are stored plus one, so that 0 marks an empty slot. */
static inline uint64_t home(const ascm_addrset *s, uint64_t stored) {
    return ((stored >> 5) * 0x9E3779B97F4A7C15ull >> 17) & s->mask;
}

static uint64_t find(const ascm_addrset *s, uint64_t stored) {
    if (!s->keys) return UINT64_MAX;
    for (uint64_t i = home(s, stored);; i = (i + 1) & s->mask) {
        if (s->keys[i] == stored) return i;
        if (!s->keys[i]) return UINT64_MAX;
    }
}

static void place(ascm_addrset *s, uint64_t stored) {
    uint64_t i = home(s, stored);
    while (s->keys[i]) i = (i + 1) & s->mask;
    s->keys[i] = stored;
    s->count++;
}

static int grow(ascm_addrset *s) {
    uint64_t cap = s->keys ? (s->mask + 1) * 2 : 64;
    uint64_t *keys = calloc(cap, sizeof *keys);
    if (!keys) return ASCM_ERR_HOSTMEM;
    ascm_addrset old = *s;
    s->keys = keys;
    s->mask = cap - 1;
    s->count = 0;
    for (uint64_t i = 0; old.keys && i <= old.mask; i++)
        if (old.keys[i]) place(s, old.keys[i]);
    free(old.keys);
    return ASCM_OK;
}

int ascm_set_add(ascm_addrset *s, uint64_t addr) {
    uint64_t stored = addr + 1;
    if (find(s, stored) != UINT64_MAX) return ASCM_OK;
    if ((!s->keys || (s->count + 1) * 2 > s->mask + 1) && grow(s) != ASCM_OK) return ASCM_ERR_HOSTMEM;
    place(s, stored);
    return ASCM_OK;
}

int ascm_set_has(const ascm_addrset *s, uint64_t addr) {
    return find(s, addr + 1) != UINT64_MAX;
}

void ascm_set_remove(ascm_addrset *s, uint64_t addr) {
    uint64_t hole = find(s, addr + 1);
    if (hole == UINT64_MAX) return;
    s->keys[hole] = 0;
    s->count--;
    /* later entries of the run move into the hole unless their home lies
     * cyclically in (hole, j]: a probe from their home would not reach it */
    for (uint64_t j = (hole + 1) & s->mask; s->keys[j]; j = (j + 1) & s->mask) {
        uint64_t h = home(s, s->keys[j]);
        int stays = hole < j ? (hole < h && h <= j) : (hole < h || h <= j);
        if (stays) continue;
        s->keys[hole] = s->keys[j];
        s->keys[j] = 0;
        hole = j;
    }
}

void ascm_set_clear(ascm_addrset *s) {
    free(s->keys);
    s->keys = NULL;
    s->mask = s->count = 0;
}
