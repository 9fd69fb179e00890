/*
 * om_test.h: what every C test needs beside cmocka.
 *
 * Allocation fault injection: test binaries are linked with
 * -Wl,--wrap=malloc,calloc,realloc, so every allocation in core and
 * bindings passes through here. om_test_fail_alloc_after(n) lets the next n
 * allocations succeed and fails every one after that (returns NULL) until
 * om_test_alloc_reset(). The idiom (SQLite's malloc tests):
 *
 *   for (int n = 0;; n++) {
 *     om_test_fail_alloc_after(n);
 *     int rc = om_thing_new(&opts, &t);
 *     om_test_alloc_reset();
 *     if (rc == 0) { om_thing_free(t); break; }
 *     assert_int_equal(rc, OM_ENOMEM);   // and nothing leaked: ASan checks
 *   }
 */
#ifndef OM_TEST_H
#define OM_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

/* Let the next n allocations succeed, then fail every later one. */
void om_test_fail_alloc_after(long n);
/* Stop failing allocations. */
void om_test_alloc_reset(void);
/* Allocations that were failed since the last om_test_fail_alloc_after. */
long om_test_alloc_failures(void);

/* Print a recorded figure in test output ("# name: value"). */
#define OM_TEST_NOTE(...)                                                      \
  do {                                                                         \
    printf("# ");                                                              \
    printf(__VA_ARGS__);                                                       \
    printf("\n");                                                              \
    fflush(stdout);                                                            \
  } while (0)

/* Assert a double is within tol of want, printing both on failure. */
#define OM_ASSERT_NEAR(got, want, tol)                                         \
  do {                                                                         \
    double om__g = (got), om__w = (want), om__t = (tol);                       \
    if (!(om__g >= om__w - om__t && om__g <= om__w + om__t))                   \
      fail_msg("%s = %g, want %g +- %g", #got, om__g, om__w, om__t);           \
  } while (0)

/*
 * Assert `a op b` for numbers (op is one of < <= > >= == !=), printing both
 * sides on failure, as libuv's ASSERT_GT does:
 *
 *   OM_ASSERT_CMP(n, >, 0)  ->  n > 0: n = 0, 0 = 0
 *
 * Both sides are compared as long double, which holds every int64_t and
 * uint64_t exactly, so a signed and an unsigned side compare by value (no
 * -1 > 0u surprise). Pointers are not numbers here: use assert_ptr_*.
 */
#define OM_ASSERT_CMP(a, op, b)                                                \
  do {                                                                         \
    long double om__a = (long double)(a), om__b = (long double)(b);            \
    if (!(om__a op om__b))                                                     \
      fail_msg("%s %s %s: %s = %.20Lg, %s = %.20Lg", #a, #op, #b, #a, om__a,   \
               #b, om__b);                                                     \
  } while (0)

/*
 * Assert that the NUL-ended string s starts with prefix, printing the start
 * of s on failure (at most 32 bytes past the prefix's length, so a long
 * buffer stays readable). Compares as strncmp(s, prefix, strlen(prefix)).
 */
#define OM_ASSERT_PREFIX(s, prefix)                                            \
  do {                                                                         \
    const char *om__s = (s), *om__p = (prefix);                                \
    size_t om__n = strlen(om__p);                                              \
    if (strncmp(om__s, om__p, om__n) != 0)                                     \
      fail_msg("%s starts with %s: %s = \"%.*s\"", #s, #prefix, #s,            \
               (int)om__n + 32, om__s);                                        \
  } while (0)

#endif /* OM_TEST_H */
