/* The device gate's way in and out (device_gate.c says what the gate is):
 * included by device.c alone, so that the thread's table of seats is local
 * to one file and the calls go in line in the entry points (out of line,
 * the calls and the register spills around them would be paid on every
 * call).  Only the thread that entered leaves. */
#ifndef ASCMEM_DEVICE_GATE_H
#define ASCMEM_DEVICE_GATE_H

#include "device_internal.h"

/* A thread's seats: the device (and its uid, since a new device may come
 * at a freed one's address) and the seat claimed there. */
typedef struct gate_entry {
    const ascm_device *d;
    uint64_t uid;
    ascm_gate_seat *seat;
    uint64_t depth; /* the seat's count, kept here too: an entry's device may be gone */
} gate_entry;
/* Room for a thread that serves many devices to keep a seat in each: a
 * missing entry claims a new seat, and a device's 64 would run out.  Only
 * the first entry is on the fast path, so more cost nothing there. */
#define GATE_ENTRIES 16

static __thread gate_entry entries[GATE_ENTRIES];

/* The thread's entry for d, past the first: another entry (moved to the
 * front), or with claim a new seat, in an entry whose count is zero (an
 * entry in use is never replaced: its leave must find it).  NULL: the
 * stripes. */
static __attribute__((noinline)) gate_entry *entry_slow(ascm_device *d, int claim) {
    if (!atomic_load_explicit(&ascm_barrier_on, memory_order_relaxed)) return NULL;
    int spare = -1;
    for (int i = 0; i < GATE_ENTRIES; i++) {
        gate_entry *e = &entries[i];
        if (e->d == d && e->uid == d->uid) {
            gate_entry hit = *e;
            *e = entries[0];
            entries[0] = hit;
            return &entries[0];
        }
        if (spare < 0 && !e->depth) spare = i; /* only the copy here is read: e->d may be gone */
    }
    if (!claim || spare < 0) return NULL;
    for (int i = 0; i < ASCM_GATE_SEATS; i++) {
        int free_seat = 0;
        if (!atomic_load_explicit(&d->seats[i].taken, memory_order_relaxed) &&
            atomic_compare_exchange_strong(&d->seats[i].taken, &free_seat, 1)) {
            entries[spare] = entries[0];
            entries[0] = (gate_entry){d, d->uid, &d->seats[i], 0};
            return &entries[0];
        }
    }
    return NULL;
}

/* Without the barrier no entry is ever made, so the first look misses and
 * entry_slow says NULL: the stripes. */
static inline gate_entry *entry_of(ascm_device *d, int claim) {
    if (ASCM_LIKELY(entries[0].d == d) && ASCM_LIKELY(entries[0].uid == d->uid)) return &entries[0];
    return entry_slow(d, claim);
}

static inline int gate_enter(ascm_device *d) {
    gate_entry *e = entry_of(d, 1);
    if (ASCM_LIKELY(e != NULL)) {
        atomic_store_explicit(&e->seat->depth, ++e->depth, memory_order_relaxed);
        atomic_signal_fence(memory_order_seq_cst); /* the count before the look, for the compiler */
        if (ASCM_LIKELY(!atomic_load_explicit(&d->shut, memory_order_acquire))) return 1;
        atomic_store_explicit(&e->seat->depth, --e->depth, memory_order_release);
        return 0;
    }
    _Atomic uint64_t *c = ascm_stripe_of(d->inflight);
    atomic_fetch_add(c, 1); /* sequentially consistent with quiesce's shut */
    if (ASCM_LIKELY(!atomic_load(&d->shut))) return 1;
    atomic_fetch_sub_explicit(c, 1, memory_order_release);
    return 0;
}

static inline void gate_leave(ascm_device *d) {
    gate_entry *e = entry_of(d, 0); /* the entry the enter used: in use, so still there */
    if (ASCM_LIKELY(e != NULL)) {
        atomic_store_explicit(&e->seat->depth, --e->depth, memory_order_release);
        return;
    }
    atomic_fetch_sub_explicit(ascm_stripe_of(d->inflight), 1, memory_order_release);
}

#endif /* ASCMEM_DEVICE_GATE_H */
