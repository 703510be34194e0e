/* Address map: a 32-bit key (a unit or slab-granule index) -> a 32-bit value.
 *
 * The pool finds the metadata of a freed address here.  A flat per-unit array
 * did the same in one load, but that array spans the whole range (64 MiB for
 * 64 GiB at 4 KiB units) and each free landed on a cold line of it; this
 * table holds only live blocks, 8 bytes each at most half full, so for ten
 * thousand live blocks it is 256 KiB and stays in cache.  Open addressing
 * with linear probing and backward-shift deletion: no tombstones, so probe
 * runs stay short however long the pool runs.
 */
#include "internal.h"

#include <stdlib.h>

#define MAP_MIN_SLOTS 64u


int ascm_map_init(ascm_addrmap *m) {
    m->slots = calloc(MAP_MIN_SLOTS, sizeof *m->slots);
    m->mask = MAP_MIN_SLOTS - 1;
    m->count = 0;
    return m->slots ? ASCM_OK : ASCM_ERR_HOSTMEM;
}

void ascm_map_destroy(ascm_addrmap *m) {
    free(m->slots);
    m->slots = NULL;
    m->mask = m->count = 0;
}

void ascm_map_clear(ascm_addrmap *m) {
    ascm_map_entry *small = calloc(MAP_MIN_SLOTS, sizeof *small);
    if (small) { /* shrink back; if the host is out of memory keep the big table */
        free(m->slots);
        m->slots = small;
        m->mask = MAP_MIN_SLOTS - 1;
    } else {
        memset(m->slots, 0, ((size_t)m->mask + 1) * sizeof *m->slots);
    }
    m->count = 0;
}

static void place(ascm_addrmap *m, ascm_map_entry e) {
    uint32_t i = ascm_map_home(m, e.key);
    while (m->slots[i].key) i = (i + 1) & m->mask;
    m->slots[i] = e;
}

int ascm_map_grow(ascm_addrmap *m, uint32_t more) {
    uint64_t slots = (uint64_t)m->mask + 1, need = (uint64_t)m->count + more;
    if (need * 2 <= slots) return ASCM_OK;
    while (need * 2 > slots) slots *= 2;
    if (slots > (1ull << 31)) return ASCM_ERR_HOSTMEM;
    ascm_map_entry *old = m->slots, *fresh = calloc(slots, sizeof *fresh);
    if (!fresh) return ASCM_ERR_HOSTMEM;
    uint32_t old_n = m->mask + 1;
    m->slots = fresh;
    m->mask = (uint32_t)slots - 1;
    for (uint32_t i = 0; i < old_n; i++)
        if (old[i].key) place(m, old[i]);
    free(old);
    return ASCM_OK;
}

void ascm_map_put(ascm_addrmap *m, uint32_t key, uint32_t value) {
    ascm_map_entry e = {key + 1, value};
    place(m, e);
    m->count++;
}

static inline int64_t find_slot(const ascm_addrmap *m, uint32_t key) {
    uint32_t k = key + 1;
    for (uint32_t i = ascm_map_home(m, k);; i = (i + 1) & m->mask) {
        if (m->slots[i].key == k) return i;
        if (!m->slots[i].key) return -1;
    }
}

uint32_t ascm_map_take(ascm_addrmap *m, uint32_t key) {
    int64_t found = find_slot(m, key);
    if (found < 0) return 0;
    uint32_t hole = (uint32_t)found, value = m->slots[hole].value;
    /* backward shift: pull later entries of the probe run into the hole */
    for (uint32_t i = (hole + 1) & m->mask; m->slots[i].key; i = (i + 1) & m->mask) {
        uint32_t home = ascm_map_home(m, m->slots[i].key);
        if (((i - home) & m->mask) >= ((i - hole) & m->mask)) {
            m->slots[hole] = m->slots[i];
            hole = i;
        }
    }
    m->slots[hole].key = 0;
    m->count--;
    return value;
}

uint64_t ascm_map_bytes(const ascm_addrmap *m) { return ((uint64_t)m->mask + 1) * sizeof *m->slots; }
