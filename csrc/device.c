/* Device: routes a CANN-style request to the pool of the right memory kind
 * and charges every page against one physical budget.
 *
 * Budget (CANN "Memory Management" precautions; see ascmem/profiles.py):
 *   huge_used <= reserve + (huge_grows ? what shared has left : 0)
 *   max(0, huge_used - reserve) + normal_used + fixed <= shared
 *   huge_used + normal_used + fixed <= limit        (when a limit is set)
 * Pools report page deltas through their charge hook; the budget has its own
 * lock because several pools charge it.
 */
#include "internal.h"

#include <stdlib.h>

#define MIB (1024ull * 1024ull)
#define POLICY_BASE(p) ((p) & 0xFFu)
#define POLICY_KNOWN_FLAGS (0x100u | 0x1000u | 0x100000u)

enum { HUGE_FIRST = 0, HUGE_ONLY = 1, NORMAL_ONLY = 2, HUGE_FIRST_P2P = 3, HUGE_ONLY_P2P = 4,
       NORMAL_ONLY_P2P = 5, HUGE1G_ONLY = 6, HUGE1G_ONLY_P2P = 7 };

struct ascm_device;

typedef struct charge_ctx {
    struct ascm_device *dev;
    int huge; /* charges huge pages (HUGE, DVPP, HUGE1G) or normal ones */
} charge_ctx;

struct ascm_device {
    ascm_lock lock; /* the budget's */
    ascm_budget b;
    ascm_pool *pool[ASCM_KINDS];
    uint64_t base[ASCM_KINDS], size[ASCM_KINDS], min_block;
    charge_ctx ctx[ASCM_KINDS];
    int p2p;
};

static uint64_t growth(const ascm_budget *b, uint64_t huge_used) {
    return huge_used > b->reserve ? huge_used - b->reserve : 0;
}

static int fits(const ascm_budget *b, uint64_t huge, uint64_t normal) {
    if (!b->huge_grows && huge > b->reserve) return 0;
    uint64_t from_shared = growth(b, huge) + normal + b->fixed;
    if (from_shared > b->shared) return 0;
    if (b->limit && huge + normal + b->fixed > b->limit) return 0;
    return 1;
}

static int charge(void *vctx, int64_t delta) {
    charge_ctx *c = vctx;
    ascm_budget *b = &c->dev->b;
    ascm_lock_acquire(&c->dev->lock);
    uint64_t huge = b->huge_used, normal = b->normal_used;
    if (c->huge) huge += (uint64_t)delta;
    else normal += (uint64_t)delta;
    int ok = delta <= 0 || fits(b, huge, normal);
    if (ok) {
        b->huge_used = huge;
        b->normal_used = normal;
        if (huge > b->peak_huge) b->peak_huge = huge;
        if (normal > b->peak_normal) b->peak_normal = normal;
    }
    ascm_lock_release(&c->dev->lock);
    return ok ? 0 : 1;
}

static int make_pools(ascm_device *d) {
    static const uint64_t page[ASCM_KINDS] = {2 * MIB, 0, 2 * MIB, 0, 1024 * MIB};
    for (int k = 0; k < ASCM_KINDS; k++) {
        if (!d->size[k]) continue;
        ascm_pool_config pc = {.base = d->base[k], .size = d->size[k], .min_block = d->min_block,
                               .page_size = page[k] ? page[k] : d->min_block};
        if (k != ASCM_KIND_HOST) { /* host memory is not device memory */
            pc.charge = charge;
            pc.charge_ctx = &d->ctx[k];
        }
        int st = ascm_pool_create(&pc, &d->pool[k]);
        if (st != ASCM_OK) return st;
    }
    return ASCM_OK;
}

static void drop_pools(ascm_device *d) {
    for (int k = 0; k < ASCM_KINDS; k++) {
        if (d->pool[k]) ascm_pool_reset(d->pool[k]); /* gives its pages back to the budget */
        ascm_pool_destroy(d->pool[k]);
        d->pool[k] = NULL;
    }
}

int ascm_device_create(const ascm_device_config *cfg, ascm_device **out) {
    *out = NULL;
    ascm_device *d = calloc(1, sizeof *d);
    if (!d) return ASCM_ERR_HOSTMEM;
    d->b = cfg->budget;
    d->b.huge_used = d->b.normal_used = d->b.peak_huge = d->b.peak_normal = 0;
    d->min_block = cfg->min_block;
    d->p2p = cfg->p2p;
    for (int k = 0; k < ASCM_KINDS; k++) {
        d->base[k] = cfg->base[k];
        d->size[k] = cfg->size[k];
        d->ctx[k].dev = d;
        d->ctx[k].huge = k == ASCM_KIND_HUGE || k == ASCM_KIND_DVPP || k == ASCM_KIND_HUGE1G;
    }
    int st = make_pools(d);
    if (st != ASCM_OK) {
        ascm_device_destroy(d);
        return st;
    }
    *out = d;
    return ASCM_OK;
}

void ascm_device_destroy(ascm_device *d) {
    if (!d) return;
    drop_pools(d);
    free(d);
}

int ascm_device_reset(ascm_device *d, const uint64_t base[ASCM_KINDS]) {
    drop_pools(d);
    for (int k = 0; k < ASCM_KINDS; k++) d->base[k] = base[k];
    ascm_lock_acquire(&d->lock);
    d->b.fixed = 0;
    d->b.peak_huge = d->b.huge_used;
    d->b.peak_normal = d->b.normal_used;
    ascm_lock_release(&d->lock);
    return make_pools(d);
}

static int try_kind(ascm_device *d, int kind, uint64_t size, uint64_t align, uint64_t *addr) {
    if (!d->pool[kind]) return ASCM_ERR_NOMEM;
    return ascm_pool_alloc(d->pool[kind], size, align, addr);
}

int ascm_device_malloc(ascm_device *d, uint64_t size, uint32_t policy, int mode, uint64_t *addr,
                       int *kind, int *events) {
    *events = 0;
    if (size == 0) return ASCM_ERR_INVAL;
    if (size > (1ull << 62)) return ASCM_ERR_NOMEM; /* no device has this much; rounding would wrap */
    uint64_t rounded = (size + 31) & ~31ull, align = 64;
    if (mode == ASCM_SIZE_MALLOC || mode == ASCM_SIZE_DVPP) rounded += 32;
    else if (mode == ASCM_SIZE_HOST) rounded = size;
    if (mode == ASCM_SIZE_DVPP) {
        *kind = ASCM_KIND_DVPP;
        int st = try_kind(d, ASCM_KIND_DVPP, rounded, 128, addr);
        if (st == ASCM_OK) {
            ascm_pool *p = d->pool[ASCM_KIND_DVPP];
            ascm_lock_acquire(&p->lock);
            uint64_t used = p->used;
            ascm_lock_release(&p->lock);
            if (used * 10 > d->size[ASCM_KIND_DVPP] * 9) *events |= ASCM_EVENT_MEDIA_90;
        }
        return st;
    }
    if (mode == ASCM_SIZE_HOST) {
        *kind = ASCM_KIND_HOST;
        return try_kind(d, ASCM_KIND_HOST, rounded, 64, addr);
    }
    uint32_t base = POLICY_BASE(policy);
    if (policy & ~(0xFFu | POLICY_KNOWN_FLAGS) || base > HUGE1G_ONLY_P2P) {
        /* out of aclrtMemMallocPolicy's range: CANN takes huge pages from 2 MB
         * up and normal pages below (aclrtMalloc, "policy") */
        *kind = size >= 2 * MIB ? ASCM_KIND_HUGE : ASCM_KIND_NORMAL;
        return try_kind(d, *kind, rounded, align, addr);
    }
    if (base >= HUGE_FIRST_P2P && base != HUGE1G_ONLY && !d->p2p) return ASCM_ERR_UNSUPPORTED;
    switch (base) {
    case HUGE1G_ONLY:
    case HUGE1G_ONLY_P2P:
        if (!d->pool[ASCM_KIND_HUGE1G]) return ASCM_ERR_UNSUPPORTED;
        *kind = ASCM_KIND_HUGE1G;
        /* 1 GiB pages: CANN rounds to 32 bytes without the extra 32 */
        return try_kind(d, ASCM_KIND_HUGE1G, (size + 31) & ~31ull, align, addr);
    case HUGE_ONLY:
    case HUGE_ONLY_P2P: {
        *kind = ASCM_KIND_HUGE;
        int st = try_kind(d, ASCM_KIND_HUGE, rounded, align, addr);
        if ((st == ASCM_ERR_BUDGET || st == ASCM_ERR_NOMEM) && !d->b.huge_grows)
            *events |= ASCM_EVENT_RESERVE_FULL;
        return st;
    }
    case NORMAL_ONLY:
    case NORMAL_ONLY_P2P:
        *kind = ASCM_KIND_NORMAL;
        return try_kind(d, ASCM_KIND_NORMAL, rounded, align, addr);
    default: { /* HUGE_FIRST, HUGE_FIRST_P2P, bandwidth flags alone */
        if (size > MIB) {
            *kind = ASCM_KIND_HUGE;
            int st = try_kind(d, ASCM_KIND_HUGE, rounded, align, addr);
            if (st == ASCM_OK) return st;
            if ((st == ASCM_ERR_BUDGET || st == ASCM_ERR_NOMEM) && !d->b.huge_grows)
                *events |= ASCM_EVENT_RESERVE_FULL;
            *events |= ASCM_EVENT_HUGE_FALLBACK;
        }
        *kind = ASCM_KIND_NORMAL;
        int st = try_kind(d, ASCM_KIND_NORMAL, rounded, align, addr);
        if (st != ASCM_OK) *events &= ~ASCM_EVENT_HUGE_FALLBACK;
        return st;
    }
    }
}

int ascm_device_kind_of(const ascm_device *d, uint64_t addr) {
    for (int k = 0; k < ASCM_KINDS; k++)
        if (d->pool[k] && addr - d->base[k] < d->size[k] && addr >= d->base[k]) return k;
    return -1;
}

int ascm_device_free(ascm_device *d, uint64_t addr, unsigned kind_mask, int *kind) {
    int k = ascm_device_kind_of(d, addr);
    *kind = k;
    if (k < 0 || !((kind_mask >> k) & 1u)) return ASCM_ERR_BADFREE;
    return ascm_pool_free(d->pool[k], addr);
}

ascm_pool *ascm_device_pool(ascm_device *d, int kind) {
    return kind >= 0 && kind < ASCM_KINDS ? d->pool[kind] : NULL;
}

void ascm_device_budget(ascm_device *d, ascm_budget *out) {
    ascm_lock_acquire(&d->lock);
    *out = d->b;
    ascm_lock_release(&d->lock);
}

int ascm_device_charge_fixed(ascm_device *d, int64_t delta) {
    ascm_lock_acquire(&d->lock);
    uint64_t old = d->b.fixed;
    d->b.fixed += (uint64_t)delta;
    int ok = delta <= 0 || fits(&d->b, d->b.huge_used, d->b.normal_used);
    if (!ok) d->b.fixed = old;
    ascm_lock_release(&d->lock);
    return ok ? ASCM_OK : ASCM_ERR_NOMEM;
}

int ascm_device_set_limit(ascm_device *d, uint64_t limit) {
    ascm_lock_acquire(&d->lock);
    d->b.limit = limit;
    ascm_lock_release(&d->lock);
    return ASCM_OK;
}

void ascm_device_reset_peaks(ascm_device *d) {
    for (int k = 0; k < ASCM_KINDS; k++)
        if (d->pool[k]) ascm_pool_reset_peaks(d->pool[k]);
    ascm_lock_acquire(&d->lock);
    d->b.peak_huge = d->b.huge_used;
    d->b.peak_normal = d->b.normal_used;
    ascm_lock_release(&d->lock);
}
