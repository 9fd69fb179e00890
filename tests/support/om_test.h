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

#endif /* OM_TEST_H */
