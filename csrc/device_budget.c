/* The device's physical budget (CANN "Memory Management" precautions; see
 * ascmem/profiles.py):
 *   huge_used <= reserve + (huge_grows ? what shared has left : 0)
 *   max(0, huge_used - reserve) + normal_used + fixed <= shared
 *   huge_used + normal_used + fixed <= limit        (when a limit is set)
 * Pools report page deltas through their charge hook, which runs with the
 * pool's lock held.  Every pool the budget charges shares one lock, the
 * device's (ascm_pool_create_shared), so the hook needs no lock of its own:
 * with a lock of the budget's own, a pair that empties and refills a huge
 * page would take a second lock twice.  The cost: pools of different kinds wait for each other, where before they met
 * only at page changes (with thread caches, slab sizes take no lock).
 */
#include "device_internal.h"

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

/* The pools' charge hook: their lock, which is the device's, is held. */
int ascm_device_charge(void *vctx, int64_t delta) {
    charge_ctx *c = vctx;
    ascm_budget *b = &c->dev->b;
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
    return ok ? 0 : 1;
}

/* The budget's lock, for the device's own reads and changes of the budget:
 * a pool's kept block whose pages are still charged gives them first
 * (pool.c, "Deferred discharge"), so the budget reads as if at its free. */
static void budget_lock(ascm_device *d) {
    ascm_lock_acquire(&d->lock);
    ascm_lock_settle(&d->lock);
}

void ascm_device_budget(ascm_device *d, ascm_budget *out) {
    budget_lock(d);
    *out = d->b;
    ascm_lock_release(&d->lock);
}

/* Read in one moment under the device lock, which every charged pool takes
 * as its own: no page can change between the two figures.  (Summing the
 * pools' statistics and then reading the budget saw another thread's
 * allocation in between, and Device.check() reported a mismatch that was
 * not there.) */
void ascm_device_huge_pages(ascm_device *d, uint64_t *charged, uint64_t *held) {
    uint64_t bytes = 0;
    budget_lock(d);
    for (int k = 0; k < ASCM_KINDS; k++) {
        chunk_table *t = ascm_kind(k)->huge ? table_of(d, k) : NULL;
        for (uint32_t i = 0; t && i < t->n; i++) {
            bytes += ascm_pool_held_bytes_locked(t->c[i].pool); /* kept granules are charged too */
        }
    }
    *charged = d->b.huge_used;
    ascm_lock_release(&d->lock);
    *held = bytes;
}

int ascm_device_charge_fixed(ascm_device *d, int64_t delta) {
    budget_lock(d);
    uint64_t old = d->b.fixed;
    /* more given back than was taken would wrap `fixed` to nearly 2^64, and
     * every later allocation would fail the budget */
    int st = delta < 0 && 0 - (uint64_t)delta > old ? ASCM_ERR_INVAL : ASCM_OK;
    if (st == ASCM_OK) {
        d->b.fixed += (uint64_t)delta;
        if (delta > 0 && !fits(&d->b, d->b.huge_used, d->b.normal_used)) {
            d->b.fixed = old;
            st = ASCM_ERR_NOMEM;
        }
    }
    ascm_lock_release(&d->lock);
    return st;
}

int ascm_device_set_limit(ascm_device *d, uint64_t limit) {
    budget_lock(d);
    d->b.limit = limit;
    ascm_lock_release(&d->lock);
    return ASCM_OK;
}

void ascm_device_reset_peaks(ascm_device *d) {
    for (int k = 0; k < ASCM_KINDS; k++) {
        chunk_table *t = table_of(d, k);
        for (uint32_t i = 0; t && i < t->n; i++) ascm_pool_reset_peaks(t->c[i].pool);
        d->retired_totals[k].peak_used = d->retired_totals[k].peak_requested = 0;
    }
    budget_lock(d);
    d->b.peak_huge = d->b.huge_used;
    d->b.peak_normal = d->b.normal_used;
    ascm_lock_release(&d->lock);
}
