/* Small pieces every part of the core uses: the lock's slow path, status
 * names and the failure formatter of check(). */
#include "internal.h"

#include <sched.h>
void ascm_lock_slow(ascm_lock *l) {
    /* Exponential backoff between looks (1, 2, 4 ... 64 pauses), then a yield:
     * waiters that poll the line less often let the holder keep it, which
     * gave two threads on one pool 1.5x and a producer-consumer pair 1.8x
     * the pairs per second of polling after every pause, one thread
     * unchanged (benchmarks/c threads; BENCHMARKS.md). */
    unsigned backoff = 1;
    for (unsigned spins = 0;; spins++) {
        if (!atomic_load_explicit(&l->held, memory_order_relaxed) &&
            !atomic_exchange_explicit(&l->held, 1, memory_order_acquire))
            return;
        if (spins >= 16) {
            sched_yield(); /* the holder may have been descheduled */
            spins = 0;
            backoff = 1;
        } else {
            for (unsigned i = 0; i < backoff; i++) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#elif defined(__aarch64__)
                __asm__ __volatile__("yield");
#endif
            }
            if (backoff < 64) backoff <<= 1;
        }
    }
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
