/* Counters of callers inside something (a device's gate, a pluggable or
 * external-allocator slot), one per cache line per stripe of threads: a
 * thread counts itself in the stripe its id hashes to, so two threads'
 * calls rarely write the same line, and whoever waits for the callers to
 * leave reads every stripe.  A thread's id is stable while it runs, so the
 * decrement of a call finds the counter its increment raised.  One shared
 * counter would be a line every call of every thread writes, and two
 * threads would run slower than one.  Header-only: the exported-function files
 * (pluggable.c, acl_allocator.c) include the public header and this alone. */
#ifndef ASCMEM_STRIPES_H
#define ASCMEM_STRIPES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define ASCM_STRIPES 16 /* the hash below takes 4 bits */

typedef struct ascm_stripe {
    _Alignas(64) _Atomic uint64_t n;
} ascm_stripe;

/* The calling thread's counter among s[0 .. ASCM_STRIPES). */
static inline _Atomic uint64_t *ascm_stripe_of(ascm_stripe *s) {
    uint64_t id = (uint64_t)(uintptr_t)pthread_self();
    return &s[(id * 0x9E3779B97F4A7C15ull) >> (64 - 4)].n;
}

/* Whether no caller is counted in any stripe (sequentially consistent
 * loads, for the Dekker pattern of the callers' increment and flag look). */
static inline int ascm_stripes_empty(ascm_stripe *s) {
    for (int i = 0; i < ASCM_STRIPES; i++)
        if (atomic_load(&s[i].n)) return 0;
    return 1;
}

static inline void ascm_stripes_clear(ascm_stripe *s) {
    for (int i = 0; i < ASCM_STRIPES; i++) atomic_store(&s[i].n, 0);
}

#endif /* ASCMEM_STRIPES_H */
