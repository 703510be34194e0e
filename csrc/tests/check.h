/* What the C test programs share: CHECK (counts a failure and goes on),
 * POOL_OK (check() passes, or its message is printed) and the runner. */
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

typedef struct test_case {
    const char *name;
    void (*fn)(void);
} test_case;

/* Runs every test, names the failed ones; the exit status for main. */
static int run_tests(const test_case *tests, int n) {
    int passed = 0;
    for (int i = 0; i < n; i++) {
        int before = failures;
        tests[i].fn();
        if (failures == before) passed++;
        else fprintf(stderr, "FAILED: %s\n", tests[i].name);
    }
    printf("%d passed, %d failed\n", passed, n - passed);
    return passed == n ? 0 : 1;
}

#endif
