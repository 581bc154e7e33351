/* sl_test.h - a minimal test harness.
 *
 *   static void test_something(void) { CHECK(x == 1); CHECK_NEAR(a, b, 1e-6); }
 *   int main(void) { RUN(test_something); return sl_test_done(); }
 *
 * A failed CHECK prints file:line and the expression and marks the test
 * failed but keeps going. sl_test_skip() makes the whole executable report
 * "skipped" (exit 77, which meson counts as SKIP) with a printed reason. */
#ifndef SL_TEST_H
#define SL_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int sl_test_failures = 0;
static int sl_test_checks = 0;
static int sl_test_case_failed = 0;

#define CHECK(cond)                                                                     \
    do {                                                                                \
        sl_test_checks++;                                                               \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);    \
            sl_test_failures++;                                                         \
            sl_test_case_failed = 1;                                                    \
        }                                                                               \
    } while (0)

#define CHECKF(cond, ...)                                                               \
    do {                                                                                \
        sl_test_checks++;                                                               \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                               \
            fputc('\n', stderr);                                                        \
            sl_test_failures++;                                                         \
            sl_test_case_failed = 1;                                                    \
        }                                                                               \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                           \
    do {                                                                                \
        double sl_a_ = (double)(a), sl_b_ = (double)(b);                                \
        CHECKF(fabs(sl_a_ - sl_b_) <= (tol), "%s = %.9g, %s = %.9g, tol %g", #a, sl_a_, \
               #b, sl_b_, (double)(tol));                                               \
    } while (0)

#define RUN(fn)                                                                         \
    do {                                                                                \
        sl_test_case_failed = 0;                                                        \
        fn();                                                                           \
        printf("%s %s\n", sl_test_case_failed ? "FAIL" : "ok  ", #fn);                  \
        fflush(stdout);                                                                 \
    } while (0)

static inline int sl_test_done(void)
{
    printf("%d checks, %d failed\n", sl_test_checks, sl_test_failures);
    return sl_test_failures ? 1 : 0;
}

static inline void sl_test_skip(const char *reason)
{
    printf("SKIP: %s\n", reason);
    exit(77);
}

#endif
