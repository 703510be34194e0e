/* What the C test programs share: CHECK (counts a failure and goes on) and
 * POOL_OK (check() passes, or its message is printed). */
#ifndef ASCMEM_TESTS_CHECK_H
#define ASCMEM_TESTS_CHECK_H

#include <stdio.h>

static int failures;
#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                              \
        }                                                                            \
    } while (0)

static char msg[256];
#define POOL_OK(p) CHECK(ascm_pool_check(p, msg, sizeof msg) == ASCM_OK || (fprintf(stderr, "  %s\n", msg), 0))

#endif
