/* test_limiter.c: the gradient limit under a fake clock. */
#include "om_test.h"

#include <math.h>

#include "om_errno.h"
#include "om_limiter.h"
#include "om_rng.h"

#define MS 1000000ull

static om_limiter_t *make(const om_limiter_opts_t *o) {
  om_limiter_t *l = NULL;
  assert_int_equal(om_limiter_new(o, &l), 0);
  assert_non_null(l);
  return l;
}

/* One request every 10 ms with latency rtt_ms, the pool saturated
 * (in flight == limit), until `windows` more windows have closed. */
static void run(om_limiter_t *l, uint64_t *now, double rtt_ms, int windows) {
  om_limiter_stats_t st;
  uint64_t target;
  om_limiter_stats(l, &st);
  target = st.windows + (uint64_t)windows;
  while (st.windows < target) {
    *now += 10 * MS;
    om_limiter_sample(l, *now, (uint64_t)(rtt_ms * 1e6), om_limiter_limit(l),
                      0);
    om_limiter_stats(l, &st);
  }
}

static void defaults(void **state) {
  om_limiter_opts_t o;
  om_limiter_t *l;
  om_limiter_stats_t st;
  (void)state;
  om_limiter_opts_init(&o);
  assert_int_equal(o.min_limit, 1);
  assert_int_equal(o.max_limit, 1000);
  assert_int_equal(o.initial_limit, 20);
  OM_ASSERT_NEAR(o.tolerance, 1.5, 0);
  OM_ASSERT_NEAR(o.smoothing, 0.2, 0);
  OM_ASSERT_NEAR(o.backoff, 0.9, 0);
  assert_int_equal(o.window_ns, 100 * MS);
  assert_int_equal(o.window_samples, 10);
  assert_int_equal(o.long_window, 600);
  l = make(NULL);
  assert_int_equal(om_limiter_limit(l), 20);
  om_limiter_stats(l, &st);
  assert_int_equal(st.windows, 0);
  OM_ASSERT_NEAR(st.long_rtt_ns, 0, 0);
  om_limiter_free(l);
  om_limiter_free(NULL);
}

static void rejects_bad_options(void **state) {
  om_limiter_opts_t base, o;
  om_limiter_t *l = (om_limiter_t *)0x1;
  (void)state;
  om_limiter_opts_init(&base);
#define BAD(field, value)                                                      \
  do {                                                                         \
    o = base;                                                                  \
    o.field = value;                                                           \
    assert_int_equal(om_limiter_new(&o, &l), OM_EINVAL);                       \
    assert_ptr_equal(l, (om_limiter_t *)0x1);                                  \
  } while (0)
  BAD(min_limit, 0);
  BAD(max_limit, 0);
  BAD(initial_limit, 0);
  BAD(initial_limit, 1001);
  BAD(tolerance, 0.99);
  BAD(tolerance, NAN);
  BAD(tolerance, INFINITY);
  BAD(smoothing, 0);
  BAD(smoothing, 1.01);
  BAD(smoothing, NAN);
  BAD(backoff, 0);
  BAD(backoff, 1);
  BAD(backoff, NAN);
  BAD(window_samples, 0);
  BAD(long_window, 0);
#undef BAD
  o = base;
  o.min_limit = 50;
  o.max_limit = 40;
  o.initial_limit = 45;
  assert_int_equal(om_limiter_new(&o, &l), OM_EINVAL);
  assert_int_equal(om_limiter_new(&base, NULL), OM_EINVAL);
  /* Edges that are valid. */
  o = base;
  o.smoothing = 1;
  o.tolerance = 1;
  o.min_limit = o.max_limit = o.initial_limit = 7;
  o.window_ns = 0;
  l = make(&o);
  assert_int_equal(om_limiter_limit(l), 7);
  om_limiter_free(l);
}

static void new_fault_injection(void **state) {
  (void)state;
  for (long n = 0;; n++) {
    om_limiter_t *l = NULL;
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_limiter_new(NULL, &l);
    om_test_alloc_reset();
    if (rc == 0) {
      assert_int_equal(om_limiter_limit(l), 20);
      om_limiter_free(l);
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    assert_null(l);
  }
}

static void window_needs_time_and_samples(void **state) {
  om_limiter_opts_t o;
  om_limiter_t *l;
  om_limiter_stats_t st;
  uint64_t now = 1000 * MS;
  (void)state;
  om_limiter_opts_init(&o);
  l = make(&o);
  /* Ten samples in 50 ms: enough samples, not enough time. */
  for (int i = 0; i < 10; i++)
    om_limiter_sample(l, now + (uint64_t)i * 5 * MS, 10 * MS, 20, 0);
  om_limiter_stats(l, &st);
  assert_int_equal(st.windows, 0);
  /* 200 ms later, one more: now old enough. */
  om_limiter_sample(l, now + 250 * MS, 10 * MS, 20, 0);
  om_limiter_stats(l, &st);
  assert_int_equal(st.windows, 1);
  OM_ASSERT_NEAR(st.short_rtt_ns, 10e6, 1);
  OM_ASSERT_NEAR(st.long_rtt_ns, 10e6, 1);
  /* Sparse traffic: old enough, too few samples; the window stretches. */
  for (int i = 1; i <= 9; i++)
    om_limiter_sample(l, now + 250 * MS + (uint64_t)i * 1000 * MS, 30 * MS, 20,
                      0);
  om_limiter_stats(l, &st);
  assert_int_equal(st.windows, 1);
  om_limiter_sample(l, now + 20000 * MS, 30 * MS, 20, 0);
  om_limiter_stats(l, &st);
  assert_int_equal(st.windows, 2);
  OM_ASSERT_NEAR(st.short_rtt_ns, 30e6, 1);
  OM_ASSERT_NEAR(st.long_rtt_ns, 20e6, 1); /* warm-up: plain mean */
  om_limiter_free(l);
}

/* The headline behaviour: steady latency lets the limit grow to the cap;
 * doubled latency (requests queueing upstream) pulls it down; back at the
 * baseline it recovers. */
static void falls_when_latency_doubles_then_recovers(void **state) {
  om_limiter_opts_t o;
  om_limiter_t *l;
  uint64_t now = 0;
  uint32_t at_base, worst, prev;
  (void)state;
  om_limiter_opts_init(&o);
  o.min_limit = 5;
  o.max_limit = 100;
  o.initial_limit = 50;
  l = make(&o);

  run(l, &now, 10, 100);
  at_base = om_limiter_limit(l);
  OM_TEST_NOTE("limit at 10 ms baseline: %u", at_base);
  assert_int_equal(at_base, 100);

  /* Latency doubles: the limit falls, window after window at first. */
  prev = at_base;
  for (int i = 0; i < 10; i++) {
    run(l, &now, 20, 1);
    OM_ASSERT_CMP(om_limiter_limit(l), <, prev);
    prev = om_limiter_limit(l);
  }
  run(l, &now, 20, 30);
  worst = om_limiter_limit(l);
  OM_TEST_NOTE("limit after 40 windows at 20 ms: %u", worst);
  OM_ASSERT_CMP(worst, <=, at_base * 6 / 10);
  OM_ASSERT_CMP(worst, >=, o.min_limit);

  /* Back to the baseline: it grows back to the cap. */
  run(l, &now, 10, 10);
  OM_ASSERT_CMP(om_limiter_limit(l), >, worst);
  run(l, &now, 10, 140);
  OM_TEST_NOTE("limit after 150 windows back at 10 ms: %u",
               om_limiter_limit(l));
  assert_int_equal(om_limiter_limit(l), at_base);
  om_limiter_free(l);
}

/* Gradient2 by design: the baseline is a long exponential average, so a
 * latency shift that lasts (a slower upstream release, not a queue) becomes
 * the new baseline and the limit climbs back. */
static void lasting_shift_becomes_the_baseline(void **state) {
  om_limiter_opts_t o;
  om_limiter_t *l;
  om_limiter_stats_t st;
  uint64_t now = 0;
  (void)state;
  om_limiter_opts_init(&o);
  o.max_limit = 100;
  o.initial_limit = 100;
  l = make(&o);
  run(l, &now, 10, 20);
  assert_int_equal(om_limiter_limit(l), 100);
  run(l, &now, 20, 20);
  OM_ASSERT_CMP(om_limiter_limit(l), <, 80);
  run(l, &now, 20, 200);
  om_limiter_stats(l, &st);
  OM_TEST_NOTE("after 220 windows at 20 ms: limit %u, baseline %.2f ms",
               st.limit, st.long_rtt_ns / 1e6);
  assert_int_equal(st.limit, 100);
  OM_ASSERT_CMP(st.long_rtt_ns * o.tolerance, >=, 20e6);
  om_limiter_free(l);
}

static void drops_cut_multiplicatively(void **state) {
  om_limiter_opts_t o;
  om_limiter_t *l;
  om_limiter_stats_t st;
  uint64_t now = 0;
  (void)state;
  om_limiter_opts_init(&o);
  o.min_limit = 10;
  o.initial_limit = 100;
  o.window_ns = 0;
  o.window_samples = 1; /* every sample is a window */
  l = make(&o);
  /* The rtt of a drop is ignored: a timeout says nothing of latency. */
  assert_int_equal(om_limiter_sample(l, now, 1, 100, 1), 90);
  assert_int_equal(om_limiter_sample(l, now, 1, 100, 1), 81);
  om_limiter_stats(l, &st);
  OM_ASSERT_NEAR(st.estimate, 81, 1e-9);
  assert_int_equal(st.drop_windows, 2);
  OM_ASSERT_NEAR(st.long_rtt_ns, 0, 0);
  for (int i = 0; i < 100; i++)
    om_limiter_sample(l, now, 5 * MS, 100, 1);
  assert_int_equal(om_limiter_limit(l), 10); /* floor at min_limit */
  om_limiter_free(l);

  /* One drop among many good samples still backs the window off. */
  o.window_samples = 10;
  l = make(&o);
  for (int i = 0; i < 9; i++)
    om_limiter_sample(l, now, 5 * MS, 100, 0);
  assert_int_equal(om_limiter_sample(l, now, 5 * MS, 100, 1), 90);
  om_limiter_free(l);
}

static void app_limited_holds_the_limit(void **state) {
  om_limiter_opts_t o;
  om_limiter_t *l;
  uint64_t now = 0;
  (void)state;
  om_limiter_opts_init(&o);
  o.initial_limit = 40;
  o.window_ns = 0;
  o.window_samples = 1;
  l = make(&o);
  for (int i = 0; i < 20; i++)
    om_limiter_sample(l, now += MS, 10 * MS, 40, 0);
  OM_ASSERT_CMP(om_limiter_limit(l), >, 40); /* used: grows */
  {
    uint32_t held = om_limiter_limit(l);
    /* Only a few in flight: latency, good or bad, says nothing. */
    for (int i = 0; i < 20; i++)
      om_limiter_sample(l, now += MS, (i % 2 ? 10 : 40) * MS, 3, 0);
    assert_int_equal(om_limiter_limit(l), held);
    /* Drops still count when app limited. */
    om_limiter_sample(l, now += MS, 0, 3, 1);
    OM_ASSERT_CMP(om_limiter_limit(l), <, held);
  }
  om_limiter_free(l);
}

static void bounds_hold_under_random_load(void **state) {
  om_limiter_opts_t o;
  om_limiter_t *l;
  om_rng_t rng;
  uint64_t now = 0;
  uint32_t lo = 100, hi = 0;
  (void)state;
  om_limiter_opts_init(&o);
  o.min_limit = 3;
  o.max_limit = 64;
  o.initial_limit = 10;
  o.window_ns = 5 * MS;
  o.window_samples = 4;
  o.long_window = 20;
  l = make(&o);
  om_rng_seed(&rng, 7);
  for (int i = 0; i < 200000; i++) {
    /* Latency from 0 (clamped to 1 ns) to seconds, 5% drops. */
    uint64_t rtt = om_rng_below(&rng, 4) == 0
                       ? (uint64_t)om_rng_below(&rng, 3000) * MS
                       : (uint64_t)om_rng_below(&rng, 50) * 100000u;
    uint32_t lim =
        om_limiter_sample(l, now += om_rng_below(&rng, 3) * MS, rtt,
                          om_rng_below(&rng, 80), om_rng_below(&rng, 20) == 0);
    om_limiter_stats_t st;
    assert_in_range(lim, o.min_limit, o.max_limit);
    om_limiter_stats(l, &st);
    assert_true(isfinite(st.estimate) && isfinite(st.long_rtt_ns));
    if (lim < lo)
      lo = lim;
    if (lim > hi)
      hi = lim;
  }
  OM_TEST_NOTE("random load: limit ranged over [%u, %u]", lo, hi);
  /* The load really moved it, both ways. */
  assert_int_equal(lo, o.min_limit);
  OM_ASSERT_CMP(hi, >, o.initial_limit);
  om_limiter_free(l);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(defaults),
      cmocka_unit_test(rejects_bad_options),
      cmocka_unit_test(new_fault_injection),
      cmocka_unit_test(window_needs_time_and_samples),
      cmocka_unit_test(falls_when_latency_doubles_then_recovers),
      cmocka_unit_test(lasting_shift_becomes_the_baseline),
      cmocka_unit_test(drops_cut_multiplicatively),
      cmocka_unit_test(app_limited_holds_the_limit),
      cmocka_unit_test(bounds_hold_under_random_load),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
