/* Small pieces every part of the core uses: the lock's slow path and
 * hand-over, status names and the failure formatter of check(). */
#include "internal.h"

#include <sched.h>

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

void ascm_lock_slow(ascm_lock *l) {
    /* Exponential backoff between looks (1, 2, 4 ... 64 pauses), then a yield:
     * waiters that poll the line less often let the holder keep it, so the
     * holder finishes sooner and the lock changes hands less often. */
    unsigned backoff = 1;
    atomic_fetch_add_explicit(&l->waiters, 1, memory_order_relaxed);
    for (unsigned spins = 0;; spins++) {
        if (!atomic_load_explicit(&l->held, memory_order_relaxed) &&
            !atomic_exchange_explicit(&l->held, 1, memory_order_acquire))
            break;
        if (spins >= 16) {
            sched_yield(); /* the holder may have been descheduled */
            spins = 0;
            backoff = 1;
        } else {
            for (unsigned i = 0; i < backoff; i++) cpu_relax();
            if (backoff < 64) backoff <<= 1;
        }
    }
    atomic_fetch_sub_explicit(&l->waiters, 1, memory_order_relaxed);
}

/* Looks of the hand-over, a yield every HAND_OVER_YIELD_EVERY: a waiter looks
 * at least every 64 pauses while it runs, and a yield lets one that shares
 * the holder's CPU run.  Bounded, so that a waiter descheduled for long
 * cannot stall the holder: it then waits for the next hand-over. */
#define HAND_OVER_LOOKS 2048u
#define HAND_OVER_YIELD_EVERY 128u

void ascm_lock_hand_over(ascm_lock *l) {
    ascm_lock_release(l);
    for (unsigned i = 1; i <= HAND_OVER_LOOKS; i++) {
        if (atomic_load_explicit(&l->held, memory_order_relaxed) || !ascm_lock_waited_for(l)) break;
        if (i % HAND_OVER_YIELD_EVERY == 0)
            sched_yield();
        else
            cpu_relax();
    }
    ascm_lock_acquire(l);
}

int ascm_fail(char *msg, size_t msglen, const char *fmt, ...) {
    if (msg && msglen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msglen, fmt, ap);
        va_end(ap);
    }
    return ASCM_ERR_CORRUPT;
}

const char *ascm_status_str(int status) {
    switch (status) {
    case ASCM_OK: return "ok";
    case ASCM_ERR_NOMEM: return "out of memory";
    case ASCM_ERR_INVAL: return "invalid argument";
    case ASCM_ERR_BADFREE: return "not the start of a live block";
    case ASCM_ERR_CORRUPT: return "allocator state is corrupt";
    case ASCM_ERR_HOSTMEM: return "host memory for metadata ran out";
    case ASCM_ERR_BUDGET: return "page budget exhausted";
    case ASCM_ERR_UNSUPPORTED: return "not supported by this product";
    case ASCM_ERR_CLOSED: return "the device is closed or being reset";
    default: return "unknown status";
    }
}
