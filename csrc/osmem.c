/* Memory from the OS for the core's own big metadata arrays. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MADV_HUGEPAGE under -std=c11 */
#include "internal.h"

#include <stdlib.h>
#include <sys/mman.h>

#define BIG_ARRAY (1u << 21) /* below this, plain calloc */

void *ascm_zalloc_big(size_t bytes) {
    if (bytes < BIG_ARRAY) return calloc(1, bytes ? bytes : 1);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE); /* advice only: failure changes nothing */
#endif
    return p;
}

void ascm_free_big(void *p, size_t bytes) {
    if (!p) return;
    if (bytes < BIG_ARRAY) free(p);
    else munmap(p, bytes);
}

/* ---- real memory for the host backend ---------------------------------- */

#ifndef MAP_HUGETLB
#define MAP_HUGETLB 0x40000
#endif
#ifndef MAP_NORESERVE
#define MAP_NORESERVE 0x4000
#endif

int ascm_os_reserve(uint64_t size, uint64_t align, int want_huge, uint64_t *addr, int *got) {
    *got = ASCM_OS_NORMAL;
    /* size + align wrapping past 2^64 would reserve a few pages and report
     * success for the whole size */
    if (size == 0 || !ascm_is_pow2(align) || size + align < size) return ASCM_ERR_INVAL;
    if (want_huge && size % (2u << 20) == 0) {
        /* explicit huge pages, when configured: without MAP_NORESERVE the
         * kernel reserves them now and refuses if too few are free (with it,
         * a later page fault could raise SIGBUS instead) */
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB,
                       -1, 0);
        if (p != MAP_FAILED) {
            *addr = (uint64_t)(uintptr_t)p;
            *got = ASCM_OS_HUGETLB;
            return ASCM_OK;
        }
    }
    /* reserve extra to cut an aligned range out of it; pages come on first touch */
    uint64_t span = size + align;
    void *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) return ASCM_ERR_HOSTMEM;
    uint64_t start = ((uint64_t)(uintptr_t)p + align - 1) & ~(align - 1);
    uint64_t head = start - (uint64_t)(uintptr_t)p, tail = span - head - size;
    if (head) munmap(p, head);
    if (tail) munmap((void *)(uintptr_t)(start + size), tail);
#ifdef MADV_HUGEPAGE
    if (want_huge && madvise((void *)(uintptr_t)start, size, MADV_HUGEPAGE) == 0)
        *got = ASCM_OS_THP;
#endif
    *addr = start;
    return ASCM_OK;
}

int ascm_os_release(uint64_t addr, uint64_t size) {
    return munmap((void *)(uintptr_t)addr, size) == 0 ? ASCM_OK : ASCM_ERR_INVAL;
}

int ascm_os_quarantine(uint64_t addr, uint64_t size) {
    /* a fresh mapping over the old one: its pages go back to the OS at once,
     * and the addresses stay taken (no access, no commit charge) */
    void *p = mmap((void *)(uintptr_t)addr, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? ASCM_ERR_INVAL : ASCM_OK;
}

uint64_t ascm_os_resident(uint64_t addr, uint64_t size) {
    uint64_t page = 4096, n = (size + page - 1) / page, resident = 0;
    unsigned char vec[4096];
    for (uint64_t done = 0; done < n;) { /* a window of pages at a time */
        uint64_t m = n - done < sizeof vec ? n - done : sizeof vec;
        if (mincore((void *)(uintptr_t)(addr + done * page), m * page, vec) != 0) return resident;
        for (uint64_t i = 0; i < m; i++) resident += (vec[i] & 1u) ? page : 0;
        done += m;
    }
    return resident;
}

int ascm_os_discard(uint64_t addr, uint64_t size) {
    return madvise((void *)(uintptr_t)addr, size, MADV_DONTNEED) == 0 ? ASCM_OK : ASCM_ERR_INVAL;
}

int ascm_os_map(void *ctx, uint64_t addr, uint64_t size, int map) {
    (void)ctx;
    void *p = (void *)(uintptr_t)addr;
    if (map) /* pages appear, zeroed, on first touch */
        return mprotect(p, size, PROT_READ | PROT_WRITE) == 0 ? 0 : 1;
    /* the pages go back to the OS, then the range refuses access again */
    int gone = madvise(p, size, MADV_DONTNEED) == 0;
    return mprotect(p, size, PROT_NONE) == 0 && gone ? 0 : 1;
}
