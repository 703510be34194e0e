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
