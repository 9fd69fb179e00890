/* om_test.c: allocation fault injection for the C tests (see om_test.h). */
#include "om_test.h"

#include <stdlib.h>

void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t size);
void *__wrap_malloc(size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t size);

/* Test-only state: the test binary is single-threaded. */
static long budget = -1; /* -1: never fail */
static long failures;

void om_test_fail_alloc_after(long n) {
  budget = n;
  failures = 0;
}

void om_test_alloc_reset(void) {
  budget = -1;
}

long om_test_alloc_failures(void) {
  return failures;
}

static int should_fail(void) {
  if (budget < 0)
    return 0;
  if (budget == 0) {
    failures++;
    return 1;
  }
  budget--;
  return 0;
}

void *__wrap_malloc(size_t size) {
  return should_fail() ? NULL : __real_malloc(size);
}

void *__wrap_calloc(size_t n, size_t size) {
  return should_fail() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t size) {
  /* A shrink never fails: callers rely on it (as Lua's allocator does). */
  if (p != NULL && size == 0)
    return __real_realloc(p, size);
  return should_fail() ? NULL : __real_realloc(p, size);
}
