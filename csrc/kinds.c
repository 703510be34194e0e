/* The memory kinds of a device: one table for every layer (device*.c size
 * pages and charges from it, pluggable.c picks the aclrtFree kinds, the
 * Python layer reads it through ascm_kind).  Page sizes: CANN hands out huge
 * pages in 2 MB units and 1 GB pages for the HUGE1G policies; normal pages
 * and host memory come in 4 KB pages. */
#include "ascmem.h"

#include <stddef.h>

#define KIB 1024ull
#define MIB (1024ull * KIB)

static const ascm_kind_info kinds[ASCM_KINDS] = {
    [ASCM_KIND_HUGE] = {"huge", 2 * MIB, 1, 1, ASCM_FREE_DEVICE},
    [ASCM_KIND_NORMAL] = {"normal", 4 * KIB, 0, 1, ASCM_FREE_DEVICE},
    [ASCM_KIND_DVPP] = {"dvpp", 2 * MIB, 1, 1, ASCM_FREE_DVPP},
    [ASCM_KIND_HOST] = {"host", 4 * KIB, 0, 0, ASCM_FREE_HOST},
    [ASCM_KIND_HUGE1G] = {"huge1g", 1024 * MIB, 1, 1, ASCM_FREE_DEVICE},
};

const ascm_kind_info *ascm_kind(int kind) {
    return kind >= 0 && kind < ASCM_KINDS ? &kinds[kind] : NULL;
}

unsigned ascm_kind_mask(int call) {
    unsigned mask = 0;
    for (int k = 0; k < ASCM_KINDS; k++)
        if (kinds[k].freed_by == call) mask |= 1u << k;
    return mask;
}
