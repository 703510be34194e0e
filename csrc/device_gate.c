/* The device's gate: callers without the GIL (the capsule, cimport's raw
 * methods, the pluggable and external-allocator functions) may be inside
 * the device while Python resets or closes it.  Every entry point that reads
 * the chunk tables counts itself in and refuses with ASCM_ERR_CLOSED while
 * the gate is shut; reset and close shut it (quiesce) and wait for the
 * count to drain before they free anything, so no call ever runs on a freed
 * pool.
 *
 * Where the process has a barrier on every thread (barrier.c, as thread
 * caches use it), a thread counts itself in a seat of its own: a cache
 * line of the device it claimed once, found again through a small table
 * per thread.  Its count is written by that thread alone, with a plain store
 * and no fence, and quiesce raises `shut`, runs the barrier and waits for
 * every seat to read zero (the Dekker pattern again, its fence moved to the
 * rare side): a call pays a plain store instead of two atomic additions on
 * a line other threads write.  A thread that finds no free seat
 * (ASCM_GATE_SEATS threads have claimed them; seats are never given back,
 * since a thread's exit cannot know whether the device still exists), or
 * no barrier, counts in the stripes (stripes.h), with atomic additions. */
#include "device_internal.h"

#include <sched.h>

static _Atomic uint64_t next_uid = 1;

void ascm_gate_init(ascm_device *d) {
    ascm_heavy_barrier_ready(); /* before any call: seats if the barrier is there (ascm_barrier_on) */
    d->uid = atomic_fetch_add_explicit(&next_uid, 1, memory_order_relaxed);
}

static int seats_empty(ascm_device *d) {
    for (int i = 0; i < ASCM_GATE_SEATS; i++)
        if (atomic_load_explicit(&d->seats[i].depth, memory_order_acquire)) return 0;
    return 1;
}

void ascm_device_quiesce(ascm_device *d) {
    atomic_fetch_add(&d->shut, 1);
    if (atomic_load_explicit(&ascm_barrier_on, memory_order_relaxed))
        ascm_heavy_barrier(); /* every seat's count before its look at shut */
    for (unsigned spins = 0; !ascm_stripes_empty(d->inflight) || !seats_empty(d); spins++) {
        if (spins >= 64) {
            sched_yield();
            spins = 0;
        }
    }
}

void ascm_device_reopen(ascm_device *d) {
    if (!atomic_load(&d->closed)) atomic_fetch_sub(&d->shut, 1);
}

/* Waits, without spinning hard, until a reset in progress has reopened the
 * gate; returns ASCM_ERR_CLOSED if the device is closed for good. */
int ascm_device_wait_open(ascm_device *d) {
    while (atomic_load(&d->shut)) {
        if (atomic_load(&d->closed)) return ASCM_ERR_CLOSED;
        sched_yield();
    }
    return ASCM_OK;
}

/* In a child of fork(): the parent's other threads are not here. */
void ascm_gate_in_child(ascm_fork_node *n) {
    ascm_device *d = (ascm_device *)((char *)n - offsetof(ascm_device, fork_chunks));
    ascm_stripes_clear(d->inflight);
    for (int i = 0; i < ASCM_GATE_SEATS; i++) atomic_store(&d->seats[i].depth, 0);
    atomic_store(&d->shut, atomic_load(&d->closed) ? 1u : 0u);
}
