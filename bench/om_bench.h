/*
 * om_bench.h: shared by the benchmarks in bench/. Each figure is printed as
 * one machine-readable line, "name value unit", and a benchmark measures its
 * own baseline in the same run where a ratio says more than a time.
 */
#ifndef OM_BENCH_H
#define OM_BENCH_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline uint64_t om_bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Keep the compiler from optimizing a result away. */
#define OM_BENCH_SINK(x) __asm__ volatile("" : : "r"(x) : "memory")

static inline void om_bench_report(const char *name, double value,
                                   const char *unit) {
  printf("%s %.2f %s\n", name, value, unit);
  fflush(stdout);
}

static int om_bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of n samples (sorts them in place). */
static inline double om_bench_median(double *v, size_t n) {
  qsort(v, n, sizeof v[0], om_bench_cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif /* OM_BENCH_H */
