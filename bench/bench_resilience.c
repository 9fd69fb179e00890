/*
 * bench_resilience.c: the per-request cost of the resilience primitives.
 *
 *   circuit_allow_record     one allow() + record() on a closed circuit
 *                            with both trip rules on (1 in 16 fails)
 *   retry_after_parse_date   Retry-After as an IMF-fixdate
 *   retry_after_parse_delta  Retry-After as delay-seconds
 *   backoff                  full-jitter backoff with an rng draw
 *
 * Each figure is the median over ROUNDS rounds of N calls, after a warm-up
 * round, in ns per call.
 */
#include "om_bench.h"

#include <string.h>

#include "om_backoff.h"
#include "om_circuit.h"

#define N 1000000
#define ROUNDS 7

typedef double (*round_fn)(void);

static double per_call(uint64_t t0, uint64_t t1) {
  return (double)(t1 - t0) / N;
}

static double bench_circuit(void) {
  om_circuit_t c;
  uint64_t now = UINT64_C(1000000000000), t0, t1, acc = 0;
  om_circuit_init(&c, NULL);
  t0 = om_bench_now_ns();
  for (uint32_t i = 0; i < N; i++) {
    now += 1000; /* 1M requests/s: every window bucket is busy */
    acc += om_circuit_allow(&c, now);
    acc += om_circuit_record(&c, now, (i & 15) != 0);
  }
  t1 = om_bench_now_ns();
  OM_BENCH_SINK(acc);
  if (om_circuit_state(&c, now) != OM_CIRCUIT_CLOSED)
    fprintf(stderr, "bench_resilience: circuit tripped unexpectedly\n");
  return per_call(t0, t1);
}

static double bench_date(void) {
  static const char v[] = "Sun, 06 Nov 1994 08:49:37 GMT";
  uint64_t t0, t1, acc = 0, ms = 0;
  int64_t now = 784111777 - 100;
  t0 = om_bench_now_ns();
  for (uint32_t i = 0; i < N; i++) {
    /* vary now so the call cannot be hoisted out of the loop */
    acc += (uint64_t)om_retry_after_parse(v, sizeof v - 1, now - (i & 7),
                                          UINT64_MAX, &ms);
    acc += ms;
  }
  t1 = om_bench_now_ns();
  OM_BENCH_SINK(acc);
  return per_call(t0, t1);
}

static double bench_delta(void) {
  static const char *const v[4] = {"1", "30", "120", "86400"};
  size_t len[4];
  uint64_t t0, t1, acc = 0, ms = 0;
  for (int k = 0; k < 4; k++)
    len[k] = strlen(v[k]);
  t0 = om_bench_now_ns();
  for (uint32_t i = 0; i < N; i++) {
    acc += (uint64_t)om_retry_after_parse(v[i & 3], len[i & 3], 0, 60000, &ms);
    acc += ms;
  }
  t1 = om_bench_now_ns();
  OM_BENCH_SINK(acc);
  return per_call(t0, t1);
}

static double bench_backoff(void) {
  om_rng_t rng;
  uint64_t t0, t1, acc = 0;
  om_rng_seed(&rng, 7);
  t0 = om_bench_now_ns();
  for (uint32_t i = 0; i < N; i++)
    acc += om_backoff_ns((i & 15) + 1, 100000000, 10000000000, &rng);
  t1 = om_bench_now_ns();
  OM_BENCH_SINK(acc);
  return per_call(t0, t1);
}

static void run(const char *name, round_fn fn) {
  double v[ROUNDS];
  (void)fn(); /* warm-up */
  for (int r = 0; r < ROUNDS; r++)
    v[r] = fn();
  om_bench_report(name, om_bench_median(v, ROUNDS), "ns");
}

int main(void) {
  run("circuit_allow_record", bench_circuit);
  run("retry_after_parse_date", bench_date);
  run("retry_after_parse_delta", bench_delta);
  run("backoff", bench_backoff);
  return 0;
}
