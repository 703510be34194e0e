/* Hash table of live allocations for the buddy allocator (see internal.h). */
#include "internal.h"

#include <stdlib.h>

#define LIVE_MIN_SLOTS 64u

static inline uint64_t slot_of(const ascm_live_table *t, uint64_t key) {
    return (key * 0x9E3779B97F4A7C15ull) >> 20 & t->mask;
}

int ascm_live_init(ascm_live_table *t) {
    t->slots = calloc(LIVE_MIN_SLOTS, sizeof *t->slots);
    t->mask = LIVE_MIN_SLOTS - 1;
    t->count = 0;
    return t->slots ? ASCM_OK : ASCM_ERR_HOSTMEM;
}

void ascm_live_destroy(ascm_live_table *t) {
    free(t->slots);
    t->slots = NULL;
    t->mask = t->count = 0;
}

void ascm_live_clear(ascm_live_table *t) {
    ascm_live_entry *small = calloc(LIVE_MIN_SLOTS, sizeof *small);
    if (small) { /* shrink back; if the host is out of memory keep the big table */
        free(t->slots);
        t->slots = small;
        t->mask = LIVE_MIN_SLOTS - 1;
    } else {
        memset(t->slots, 0, (t->mask + 1) * sizeof *t->slots);
    }
    t->count = 0;
}

static void insert_slot(ascm_live_table *t, const ascm_live_entry *e) {
    uint64_t i = slot_of(t, e->key);
    while (t->slots[i].key) i = (i + 1) & t->mask;
    t->slots[i] = *e;
}

static int grow(ascm_live_table *t) {
    uint64_t old_n = t->mask + 1;
    ascm_live_entry *old = t->slots;
    ascm_live_entry *fresh = calloc(old_n * 2, sizeof *fresh);
    if (!fresh) return ASCM_ERR_HOSTMEM;
    t->slots = fresh;
    t->mask = old_n * 2 - 1;
    for (uint64_t i = 0; i < old_n; i++)
        if (old[i].key) insert_slot(t, &old[i]);
    free(old);
    return ASCM_OK;
}

int ascm_live_reserve(ascm_live_table *t) {
    if ((t->count + 1) * 4 > (t->mask + 1) * 3) return grow(t);
    return ASCM_OK;
}

int ascm_live_put(ascm_live_table *t, uint64_t unit, uint64_t units, uint64_t requested) {
    if (ascm_live_reserve(t) != ASCM_OK) return ASCM_ERR_HOSTMEM;
    ascm_live_entry e = {unit + 1, units, requested};
    insert_slot(t, &e);
    t->count++;
    return ASCM_OK;
}

ascm_live_entry *ascm_live_find(const ascm_live_table *t, uint64_t unit) {
    uint64_t key = unit + 1;
    for (uint64_t i = slot_of(t, key);; i = (i + 1) & t->mask) {
        if (t->slots[i].key == key) return &t->slots[i];
        if (!t->slots[i].key) return NULL;
    }
}

void ascm_live_remove(ascm_live_table *t, ascm_live_entry *e) {
    uint64_t hole = (uint64_t)(e - t->slots);
    /* backward shift: pull later entries of the probe run into the hole */
    for (uint64_t i = (hole + 1) & t->mask; t->slots[i].key; i = (i + 1) & t->mask) {
        uint64_t home = slot_of(t, t->slots[i].key);
        if (((i - home) & t->mask) >= ((i - hole) & t->mask)) {
            t->slots[hole] = t->slots[i];
            hole = i;
        }
    }
    t->slots[hole].key = 0;
    t->count--;
}

uint64_t ascm_live_bytes(const ascm_live_table *t) { return (t->mask + 1) * sizeof *t->slots; }
