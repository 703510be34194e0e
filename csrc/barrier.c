/* A memory barrier on every thread of the process, paid by the caller alone:
 * thread caches let their owner in by a flag instead of a lock (tcache.c,
 * "The owner's way in"), and whoever needs the owners out -- statistics,
 * check(), trims, resets -- raises each cache's stop flag and then calls
 * this, after which every owner either sees the flag or has its busy flag
 * visible.  That moves the fence of a Dekker pair from every allocation to
 * the rare stop.
 *
 * Linux's membarrier(2) does it (MEMBARRIER_CMD_PRIVATE_EXPEDITED: an
 * interrupt to each CPU running one of the process's threads, a few
 * microseconds; the registration is inherited across fork).  If a call fails
 * after registration succeeded, the global command, and last a change of a
 * page's protection, which makes the kernel interrupt every CPU that may
 * hold the process's mappings (the fallback .NET's runtime uses), still give
 * the barrier.  Where none exists ascm_heavy_barrier_init says so, and the
 * caches keep their locks.  Asked once per process (ascm_heavy_barrier_ready),
 * before any cache or gate seat is used; ASCMEM_NO_BARRIER=1 in the
 * environment says no, and ASCMEM_BARRIER starts at a fallback (CI runs the
 * thread-cache tests each way).  The device's gate uses it too
 * (device_gate.c). */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__linux__)
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__linux__) && defined(__NR_membarrier)
/* The commands' numbers (the kernel's ABI, linux/membarrier.h), written out
 * so that older kernel headers, which lack some of them, still build this. */
enum { MB_GLOBAL = 1, MB_PRIVATE_EXPEDITED = 8, MB_REGISTER_PRIVATE_EXPEDITED = 16 };

static long membarrier(int cmd) { return syscall(__NR_membarrier, cmd, 0, 0); }

static ascm_lock page_lock; /* one protection change at a time */
static volatile char *page; /* made at init, so that the last resort never allocates */
/* ASCMEM_BARRIER=global or =page: start at that fallback, for the tests of
 * the fallbacks themselves (csrc/Makefile runs test_tcache with each) */
static enum { EXPEDITED, GLOBAL, PAGE } first;

int ascm_heavy_barrier_init(void) {
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 0;
    page = m;
    const char *env = getenv("ASCMEM_BARRIER");
    first = env && !strcmp(env, "global") ? GLOBAL : env && !strcmp(env, "page") ? PAGE : EXPEDITED;
    if (first == GLOBAL) return membarrier(MB_GLOBAL) == 0;
    if (first == PAGE) return 1;
    return membarrier(MB_REGISTER_PRIVATE_EXPEDITED) == 0 &&
           membarrier(MB_PRIVATE_EXPEDITED) == 0;
}

/* A protection change of a page present in this CPU's mappings: the kernel
 * interrupts every CPU that may hold them (a TLB shootdown), a barrier there. */
static int by_page_protection(void) {
    ascm_lock_acquire(&page_lock);
    int ok = mprotect((void *)page, 4096, PROT_READ | PROT_WRITE) == 0;
    if (ok) {
        page[0]++;
        ok = mprotect((void *)page, 4096, PROT_NONE) == 0;
    }
    ascm_lock_release(&page_lock);
    return ok;
}

int ascm_heavy_barrier(void) {
    if (first == EXPEDITED) {
        if (membarrier(MB_PRIVATE_EXPEDITED) == 0) return 1;
        if (membarrier(MB_REGISTER_PRIVATE_EXPEDITED) == 0 &&
            membarrier(MB_PRIVATE_EXPEDITED) == 0)
            return 1;
    }
    if (first != PAGE && membarrier(MB_GLOBAL) == 0) return 1; /* the global command, once named _SHARED */
    return by_page_protection();
}
#else
int ascm_heavy_barrier_init(void) { return 0; }
int ascm_heavy_barrier(void) { return 0; }
#endif

/* Once per process: ASCMEM_NO_BARRIER=1 says no, for the tests of the
 * paths without it (thread caches' locks, the gate's stripes). */
static pthread_once_t ready_once = PTHREAD_ONCE_INIT;
_Atomic int ascm_barrier_on;

static void probe(void) {
    const char *no = getenv("ASCMEM_NO_BARRIER");
    atomic_store_explicit(&ascm_barrier_on, !(no && no[0] == '1') && ascm_heavy_barrier_init(),
                          memory_order_relaxed);
}

int ascm_heavy_barrier_ready(void) {
    pthread_once(&ready_once, probe);
    return atomic_load_explicit(&ascm_barrier_on, memory_order_relaxed);
}
