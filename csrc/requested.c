/* torch's requested_bytes for the pluggable functions: the sizes torch asked
 * for (before the CANN rounding the pools see, so the pools' own counts
 * cannot give them), per device index and stat type, with peaks.
 *
 * Each thread counts in a record of its own: a load and a store on its own
 * line per call, no locked instruction, where one shared counter per type
 * would be a line every call of every thread writes.  A reader sums the shared part
 * and every record, so the current bytes are exact whenever no call is
 * under way.
 *
 * Peaks: a thread compares the shared part plus its own unmerged bytes with
 * the peak at each allocation.  A thread's unmerged bytes of a device go
 * into the shared part once they pass MERGE_BYTES either way, so with one
 * thread calling the peak is exact, and with several it may be off by less
 * than MERGE_BYTES per other thread -- the pools' thread caches give their
 * peaks the same kind of bound (tcache.c).  A read never reports a peak
 * below the current bytes.
 *
 * Records are never freed: a list that only grows lets readers walk it with
 * no lock (and so is safe across fork).  A thread that exits merges its
 * counts and leaves its record for the next new thread. */
#include "requested.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define MERGE_BYTES ((int64_t)1 << 20)
#define RELAXED memory_order_relaxed

typedef struct counts {
    struct counts *next; /* set before the record is pushed, never changed */
    _Atomic int taken;   /* a running thread owns the record */
    /* written by the owner alone, read by anyone */
    _Alignas(64) _Atomic int64_t delta[ASCM_REQ_DEVICES][ASCM_REQ_TYPES];
} counts;

/* per device index on a line of its own: written at merges and new peaks */
typedef struct shared_line {
    _Alignas(64) _Atomic int64_t v[ASCM_REQ_TYPES];
} shared_line;

static shared_line merged[ASCM_REQ_DEVICES], peaks[ASCM_REQ_DEVICES];
static _Atomic(counts *) records;
static __thread counts *mine;
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static int key_made;

static void raise_peak(int device, int t, int64_t now) {
    _Atomic int64_t *peak = &peaks[device].v[t];
    int64_t seen = atomic_load_explicit(peak, RELAXED);
    while (now > seen && !atomic_compare_exchange_weak_explicit(peak, &seen, now, RELAXED, RELAXED)) {
    }
}

/* The owner's unmerged bytes of one device and type into the shared part. */
static void merge(counts *c, int device, int t) {
    int64_t d = atomic_load_explicit(&c->delta[device][t], RELAXED);
    if (!d) return;
    atomic_store_explicit(&c->delta[device][t], 0, RELAXED);
    atomic_fetch_add_explicit(&merged[device].v[t], d, RELAXED);
}

static void thread_exits(void *arg) {
    counts *c = arg;
    for (int device = 0; device < ASCM_REQ_DEVICES; device++)
        for (int t = 0; t < ASCM_REQ_TYPES; t++) merge(c, device, t);
    mine = NULL; /* a later call in this thread's exit claims a record anew */
    atomic_store_explicit(&c->taken, 0, memory_order_release);
}

static void make_key(void) { key_made = pthread_key_create(&exit_key, thread_exits) == 0; }

/* The calling thread's record: a left one, or a new one; NULL without memory. */
static counts *claim(void) {
    pthread_once(&key_once, make_key);
    counts *c = NULL;
    if (key_made) /* without the key no record is ever left, so none is looked for */
        for (c = atomic_load_explicit(&records, memory_order_acquire); c; c = c->next) {
            int free_one = 0;
            if (atomic_load_explicit(&c->taken, RELAXED) == 0 &&
                atomic_compare_exchange_strong_explicit(&c->taken, &free_one, 1, memory_order_acquire,
                                                        RELAXED))
                break;
        }
    if (!c) {
        c = aligned_alloc(64, (sizeof *c + 63) & ~(size_t)63);
        if (!c) return NULL;
        memset(c, 0, sizeof *c);
        atomic_store_explicit(&c->taken, 1, RELAXED);
        counts *head = atomic_load_explicit(&records, RELAXED);
        do c->next = head;
        while (!atomic_compare_exchange_weak_explicit(&records, &head, c, memory_order_release, RELAXED));
    }
    if (key_made) pthread_setspecific(exit_key, c);
    return mine = c;
}

void ascm_requested_add(int device, int t, int64_t delta) {
    counts *c = mine;
    if (__builtin_expect(c == NULL, 0)) c = claim();
    int types[2] = {0, t};
    for (int i = 0; i < 2; i++) {
        int ty = types[i];
        int64_t now;
        if (__builtin_expect(c == NULL, 0)) { /* no memory for a record: the shared part directly */
            now = atomic_fetch_add_explicit(&merged[device].v[ty], delta, RELAXED) + delta;
        } else {
            int64_t d = atomic_load_explicit(&c->delta[device][ty], RELAXED) + delta;
            if (d >= MERGE_BYTES || d <= -MERGE_BYTES) {
                atomic_store_explicit(&c->delta[device][ty], 0, RELAXED);
                now = atomic_fetch_add_explicit(&merged[device].v[ty], d, RELAXED) + d;
            } else {
                atomic_store_explicit(&c->delta[device][ty], d, RELAXED);
                now = atomic_load_explicit(&merged[device].v[ty], RELAXED) + d;
            }
        }
        if (delta > 0) raise_peak(device, ty, now);
    }
}

void ascm_requested_read(int device, int64_t now[ASCM_REQ_TYPES], int64_t peak[ASCM_REQ_TYPES]) {
    for (int t = 0; t < ASCM_REQ_TYPES; t++) now[t] = atomic_load_explicit(&merged[device].v[t], RELAXED);
    for (counts *c = atomic_load_explicit(&records, memory_order_acquire); c; c = c->next)
        for (int t = 0; t < ASCM_REQ_TYPES; t++) now[t] += atomic_load_explicit(&c->delta[device][t], RELAXED);
    for (int t = 0; t < ASCM_REQ_TYPES; t++) {
        peak[t] = atomic_load_explicit(&peaks[device].v[t], RELAXED);
        if (peak[t] < now[t]) peak[t] = now[t];
    }
}

void ascm_requested_clear(int device) {
    for (counts *c = atomic_load_explicit(&records, memory_order_acquire); c; c = c->next)
        for (int t = 0; t < ASCM_REQ_TYPES; t++) atomic_store_explicit(&c->delta[device][t], 0, RELAXED);
    for (int t = 0; t < ASCM_REQ_TYPES; t++) {
        atomic_store_explicit(&merged[device].v[t], 0, RELAXED);
        atomic_store_explicit(&peaks[device].v[t], 0, RELAXED);
    }
}

void ascm_requested_reset_peaks(int device) {
    int64_t now[ASCM_REQ_TYPES], peak[ASCM_REQ_TYPES];
    ascm_requested_read(device, now, peak);
    for (int t = 0; t < ASCM_REQ_TYPES; t++) atomic_store_explicit(&peaks[device].v[t], now[t], RELAXED);
}
