/* test_circuit.c: every transition of the per-peer circuit breaker. */
#include "om_test.h"

#include <math.h>
#include <string.h>

#include "om_circuit.h"
#include "om_errno.h"

#define MS UINT64_C(1000000)
#define SEC UINT64_C(1000000000)
#define T0 (UINT64_C(1000) * SEC) /* a clock that is not at 0 */

static const char *st(const om_circuit_t *c, uint64_t now) {
  return om_circuit_state_name(om_circuit_state(c, now));
}

/* Only the consecutive rule: the ratio rule off. */
static void init_consecutive(om_circuit_t *c, uint32_t failures) {
  om_circuit_opts_t o;
  om_circuit_opts_default(&o);
  o.failures = failures;
  o.window_ns = 0;
  assert_int_equal(om_circuit_init(c, &o), 0);
}

/* Only the ratio rule: 10 s window (1 s buckets), 20 requests, 50%. */
static void init_ratio(om_circuit_t *c) {
  om_circuit_opts_t o;
  om_circuit_opts_default(&o);
  o.failures = 0;
  assert_int_equal(om_circuit_init(c, &o), 0);
}

/* Trip a closed circuit at now via the consecutive rule. */
static void fail_n(om_circuit_t *c, uint64_t now, int n) {
  for (int i = 0; i < n; i++) {
    assert_true(om_circuit_allow(c, now));
    om_circuit_record(c, now, false);
  }
}

static void defaults_and_validation(void **state) {
  (void)state;
  om_circuit_opts_t o, bad;
  om_circuit_t c, before;
  om_circuit_opts_default(&o);
  assert_int_equal(o.failures, 5);
  assert_int_equal(o.cooldown_ns, 30 * SEC);
  assert_int_equal(o.max_cooldown_ns, 300 * SEC);
  assert_int_equal(o.window_ns, 10 * SEC);
  assert_int_equal(o.min_requests, 20);
  OM_ASSERT_NEAR(o.failure_ratio, 0.5, 0);
  assert_int_equal(o.reset_ns, 300 * SEC);
  assert_int_equal(o.probe_timeout_ns, 0);
  assert_int_equal(om_circuit_init(&c, NULL), 0);
  assert_string_equal(st(&c, 0), "closed");
  assert_int_equal(om_circuit_init(NULL, &o), OM_EINVAL);
  OM_TEST_NOTE("sizeof(om_circuit_t) = %zu bytes", sizeof(om_circuit_t));

  memset(&before, 0xA5, sizeof before);
  for (int i = 0; i < 9; i++) {
    bad = o;
    switch (i) {
    case 0:
      bad.cooldown_ns = 0;
      break;
    case 1:
      bad.max_cooldown_ns = bad.cooldown_ns - 1;
      break;
    case 2:
      bad.failures = 0;
      bad.window_ns = 0;
      break;
    case 3:
      bad.window_ns = OM_CIRCUIT_BUCKETS - 1;
      break;
    case 4:
      bad.min_requests = 0;
      break;
    case 5:
      bad.failure_ratio = 0.0;
      break;
    case 6:
      bad.failure_ratio = 1.5;
      break;
    case 7:
      bad.failure_ratio = NAN;
      break;
    default:
      bad.failure_ratio = -0.1;
      break;
    }
    memcpy(&c, &before, sizeof c);
    if (om_circuit_init(&c, &bad) != OM_EINVAL)
      fail_msg("case %d accepted", i);
    assert_memory_equal(&c, &before, sizeof c); /* untouched */
  }
  /* ratio rule off: its parameters no longer matter */
  bad = o;
  bad.window_ns = 0;
  bad.min_requests = 0;
  bad.failure_ratio = 7;
  assert_int_equal(om_circuit_init(&c, &bad), 0);
}

static void new_and_free_under_alloc_failure(void **state) {
  (void)state;
  om_circuit_t *c = NULL, *sentinel = (om_circuit_t *)&c;
  om_circuit_opts_t o;
  om_circuit_opts_default(&o);
  for (long n = 0;; n++) {
    om_circuit_t *out = sentinel;
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_circuit_new(&o, &out);
    om_test_alloc_reset();
    if (rc == 0) {
      c = out;
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    assert_ptr_equal(out, sentinel); /* nothing handed out */
  }
  assert_string_equal(st(c, 0), "closed");
  om_circuit_free(c);
  om_circuit_free(NULL);
  o.cooldown_ns = 0;
  assert_int_equal(om_circuit_new(&o, &c), OM_EINVAL);
  assert_int_equal(om_circuit_new(NULL, NULL), OM_EINVAL);
}

static void consecutive_failures_trip(void **state) {
  (void)state;
  om_circuit_t c;
  init_consecutive(&c, 5);
  fail_n(&c, T0, 4);
  assert_string_equal(st(&c, T0), "closed");
  /* a success resets the streak */
  assert_true(om_circuit_allow(&c, T0));
  assert_int_equal(om_circuit_record(&c, T0, true), OM_CIRCUIT_CLOSED);
  fail_n(&c, T0, 4);
  assert_string_equal(st(&c, T0), "closed");
  assert_true(om_circuit_allow(&c, T0));
  assert_int_equal(om_circuit_record(&c, T0, false), OM_CIRCUIT_OPEN);
  assert_string_equal(st(&c, T0), "open");
  assert_false(om_circuit_allow(&c, T0));
  assert_false(om_circuit_peek(&c, T0));
  assert_int_equal(om_circuit_trips(&c, T0), 1);
  assert_int_equal(om_circuit_open_until(&c, T0), T0 + 30 * SEC);
  assert_int_equal(om_circuit_open_until(&c, T0 + 30 * SEC), 0);
}

static void ratio_trips_with_minimum(void **state) {
  (void)state;
  om_circuit_t c;
  uint64_t t = T0;
  init_ratio(&c);
  /* 19 requests, 10 failures: above 50% but under the minimum of 20 */
  for (int i = 0; i < 9; i++)
    om_circuit_record(&c, t, true);
  for (int i = 0; i < 10; i++)
    assert_int_equal(om_circuit_record(&c, t, false), OM_CIRCUIT_CLOSED);
  /* the 20th request is a success: 10/20 is 50%, but only a failure can
   * push the ratio up, so the check waits for one */
  assert_int_equal(om_circuit_record(&c, t, true), OM_CIRCUIT_CLOSED);
  assert_int_equal(om_circuit_record(&c, t, false), OM_CIRCUIT_OPEN);
  assert_int_equal(om_circuit_trips(&c, t), 1);

  /* below the ratio: 20 requests, 9 failures (45%) stay closed */
  init_ratio(&c);
  for (int i = 0; i < 11; i++)
    om_circuit_record(&c, t, true);
  for (int i = 0; i < 9; i++)
    assert_int_equal(om_circuit_record(&c, t, false), OM_CIRCUIT_CLOSED);
  /* the 21st: 10/21 < 50% */
  assert_int_equal(om_circuit_record(&c, t, false), OM_CIRCUIT_CLOSED);
  /* the 22nd: 11/22 = 50% */
  assert_int_equal(om_circuit_record(&c, t, false), OM_CIRCUIT_OPEN);
}

static void ratio_window_rolls_over(void **state) {
  (void)state;
  om_circuit_t a, b;
  /* Both see 10 successes at 0.5 s and 9 failures at 9.5 s (epochs 0, 9). */
  init_ratio(&a);
  init_ratio(&b);
  for (int i = 0; i < 10; i++) {
    om_circuit_record(&a, T0 + 500 * MS, true);
    om_circuit_record(&b, T0 + 500 * MS, true);
  }
  for (int i = 0; i < 9; i++) {
    om_circuit_record(&a, T0 + 9500 * MS, false);
    om_circuit_record(&b, T0 + 9500 * MS, false);
  }
  /* a: one more failure while the successes are in the window: 10/20 */
  assert_int_equal(om_circuit_record(&a, T0 + 9900 * MS, false),
                   OM_CIRCUIT_OPEN);
  /* b: at 10.2 s the bucket of the successes has left the window: 10/10,
   * but only 10 requests, under the minimum */
  assert_int_equal(om_circuit_record(&b, T0 + 10200 * MS, false),
                   OM_CIRCUIT_CLOSED);
  for (int i = 0; i < 10; i++)
    om_circuit_record(&b, T0 + 10300 * MS, true);
  /* 11/21 > 50% */
  assert_int_equal(om_circuit_record(&b, T0 + 10300 * MS, false),
                   OM_CIRCUIT_OPEN);

  /* a whole idle window clears everything */
  init_ratio(&a);
  for (int i = 0; i < 19; i++)
    om_circuit_record(&a, T0, false);
  assert_int_equal(om_circuit_record(&a, T0 + 10 * SEC, false),
                   OM_CIRCUIT_CLOSED);
  /* and a result stamped before the window is dropped, not counted */
  for (int i = 0; i < 30; i++)
    assert_int_equal(om_circuit_record(&a, T0 - 1, false), OM_CIRCUIT_CLOSED);
  /* one stamped inside the window (a late completion) still counts */
  for (int i = 0; i < 18; i++)
    om_circuit_record(&a, T0 + 9 * SEC, false);
  assert_int_equal(om_circuit_record(&a, T0 + 1 * SEC, false), OM_CIRCUIT_OPEN);
}

static void both_rules_together(void **state) {
  (void)state;
  om_circuit_t c;
  assert_int_equal(om_circuit_init(&c, NULL), 0);
  /* alternating: never 5 in a row, but 50% of 20 */
  for (int i = 0; i < 10; i++) {
    om_circuit_record(&c, T0, true);
    if (i < 9)
      assert_int_equal(om_circuit_record(&c, T0, false), OM_CIRCUIT_CLOSED);
  }
  assert_int_equal(om_circuit_record(&c, T0, false), OM_CIRCUIT_OPEN);
  /* 5 in a row with few requests */
  assert_int_equal(om_circuit_init(&c, NULL), 0);
  fail_n(&c, T0, 5);
  assert_string_equal(st(&c, T0), "open");
}

static void half_open_admits_one_probe(void **state) {
  (void)state;
  om_circuit_t c;
  init_consecutive(&c, 5);
  fail_n(&c, T0, 5);
  assert_string_equal(st(&c, T0 + 30 * SEC - 1), "open");
  assert_false(om_circuit_allow(&c, T0 + 30 * SEC - 1));
  /* state() reports half_open once the cooldown passed, before allow() */
  assert_string_equal(st(&c, T0 + 30 * SEC), "half_open");
  assert_true(om_circuit_peek(&c, T0 + 30 * SEC));
  assert_string_equal(st(&c, T0 + 30 * SEC), "half_open");
  /* exactly one probe */
  assert_true(om_circuit_allow(&c, T0 + 31 * SEC));
  assert_false(om_circuit_peek(&c, T0 + 31 * SEC));
  for (int i = 0; i < 100; i++)
    assert_false(om_circuit_allow(&c, T0 + 31 * SEC + (uint64_t)i * SEC));
  assert_string_equal(st(&c, T0 + 200 * SEC), "half_open");
  /* probe success closes, consecutive failures start from zero */
  assert_int_equal(om_circuit_record(&c, T0 + 200 * SEC, true),
                   OM_CIRCUIT_CLOSED);
  assert_true(om_circuit_allow(&c, T0 + 200 * SEC));
  fail_n(&c, T0 + 201 * SEC, 4);
  assert_string_equal(st(&c, T0 + 201 * SEC), "closed");
  /* a close does not forgive trips: a quick relapse waits 60 s */
  fail_n(&c, T0 + 201 * SEC, 1);
  assert_int_equal(om_circuit_trips(&c, T0 + 201 * SEC), 2);
  assert_int_equal(om_circuit_open_until(&c, T0 + 201 * SEC), T0 + 261 * SEC);
}

/* A probe that never reached the peer gives its slot back: the next
 * allow() admits another probe at once, trips and cooldown unchanged. */
static void released_probe_frees_the_slot(void **state) {
  (void)state;
  om_circuit_t c;
  init_consecutive(&c, 5); /* no probe timeout: a lost probe blocks for ever */
  fail_n(&c, T0, 5);
  assert_true(om_circuit_allow(&c, T0 + 30 * SEC)); /* the probe */
  assert_false(om_circuit_peek(&c, T0 + 31 * SEC));
  om_circuit_release(&c, T0 + 31 * SEC);
  assert_true(om_circuit_peek(&c, T0 + 31 * SEC));
  assert_true(om_circuit_allow(&c, T0 + 31 * SEC)); /* a new probe */
  assert_false(om_circuit_allow(&c, T0 + 31 * SEC));
  OM_ASSERT_CMP(om_circuit_trips(&c, T0 + 31 * SEC), ==, 1);
  /* its failure reopens for the next, longer cooldown as usual */
  assert_int_equal(om_circuit_record(&c, T0 + 32 * SEC, false),
                   OM_CIRCUIT_OPEN);
  OM_ASSERT_CMP(om_circuit_trips(&c, T0 + 32 * SEC), ==, 2);
  /* closed and open: nothing changes */
  om_circuit_release(&c, T0 + 33 * SEC);
  assert_string_equal(st(&c, T0 + 33 * SEC), "open");
  assert_false(om_circuit_allow(&c, T0 + 33 * SEC));
  init_consecutive(&c, 5);
  om_circuit_release(&c, T0);
  assert_string_equal(st(&c, T0), "closed");
}

static void probe_failure_reopens_longer(void **state) {
  (void)state;
  om_circuit_t c;
  uint64_t t = T0;
  init_consecutive(&c, 5);
  fail_n(&c, t, 5);
  /* 30, 60, 90, ..., 300, then capped at 300 */
  for (uint32_t trip = 1; trip <= 14; trip++) {
    uint64_t want = 30 * SEC * trip;
    if (want > 300 * SEC)
      want = 300 * SEC;
    assert_int_equal(om_circuit_trips(&c, t), trip);
    assert_int_equal(om_circuit_open_until(&c, t), t + want);
    assert_string_equal(st(&c, t + want - 1), "open");
    assert_false(om_circuit_allow(&c, t + want - 1));
    assert_string_equal(st(&c, t + want), "half_open");
    t += want;
    assert_true(om_circuit_allow(&c, t));
    t += 5 * MS;
    assert_int_equal(om_circuit_record(&c, t, false), OM_CIRCUIT_OPEN);
  }
}

static void trips_reset_after_healthy_period(void **state) {
  (void)state;
  om_circuit_t c;
  uint64_t t = T0;
  init_consecutive(&c, 1);
  fail_n(&c, t, 1);
  t += 30 * SEC;
  assert_true(om_circuit_allow(&c, t));
  om_circuit_record(&c, t, false); /* trips 2: 60 s */
  t += 60 * SEC;
  assert_true(om_circuit_allow(&c, t));
  assert_int_equal(om_circuit_record(&c, t, true), OM_CIRCUIT_CLOSED);
  assert_int_equal(om_circuit_trips(&c, t + 300 * SEC - 1), 2);
  assert_int_equal(om_circuit_trips(&c, t + 300 * SEC), 0);
  /* healthy for 300 s: the next trip starts again at 30 s */
  t += 300 * SEC;
  fail_n(&c, t, 1);
  assert_int_equal(om_circuit_trips(&c, t), 1);
  assert_int_equal(om_circuit_open_until(&c, t), t + 30 * SEC);
}

static void results_while_open_are_ignored(void **state) {
  (void)state;
  om_circuit_t c;
  init_consecutive(&c, 5);
  fail_n(&c, T0, 5);
  /* late completions of requests admitted before the trip */
  for (int i = 0; i < 10; i++) {
    assert_int_equal(om_circuit_record(&c, T0 + 1 * SEC, i % 2 == 0),
                     OM_CIRCUIT_OPEN);
    assert_int_equal(om_circuit_open_until(&c, T0 + 1 * SEC), T0 + 30 * SEC);
  }
  /* also after the cooldown, before the probe was admitted */
  assert_int_equal(om_circuit_record(&c, T0 + 40 * SEC, true), OM_CIRCUIT_OPEN);
  assert_string_equal(st(&c, T0 + 40 * SEC), "half_open");
  assert_int_equal(om_circuit_trips(&c, T0 + 40 * SEC), 1);
}

static void probe_timeout_admits_a_replacement(void **state) {
  (void)state;
  om_circuit_t c;
  om_circuit_opts_t o;
  om_circuit_opts_default(&o);
  o.probe_timeout_ns = 5 * SEC;
  assert_int_equal(om_circuit_init(&c, &o), 0);
  fail_n(&c, T0, 5);
  assert_true(om_circuit_allow(&c, T0 + 30 * SEC));
  assert_false(om_circuit_allow(&c, T0 + 35 * SEC - 1));
  assert_false(om_circuit_peek(&c, T0 + 35 * SEC - 1));
  assert_true(om_circuit_peek(&c, T0 + 35 * SEC));
  assert_true(om_circuit_allow(&c, T0 + 35 * SEC));
  assert_false(om_circuit_allow(&c, T0 + 36 * SEC));
  assert_int_equal(om_circuit_record(&c, T0 + 36 * SEC, true),
                   OM_CIRCUIT_CLOSED);
}

static void extremes_saturate(void **state) {
  (void)state;
  om_circuit_t c;
  om_circuit_opts_t o;
  om_circuit_opts_default(&o);
  o.window_ns = 0;
  o.failures = 1;
  o.cooldown_ns = UINT64_MAX / 2;
  o.max_cooldown_ns = UINT64_MAX;
  assert_int_equal(om_circuit_init(&c, &o), 0);
  fail_n(&c, UINT64_MAX - 10, 1);
  /* now + cooldown clamps to the end of the clock instead of wrapping */
  assert_int_equal(om_circuit_open_until(&c, UINT64_MAX - 10), UINT64_MAX);
  assert_false(om_circuit_allow(&c, UINT64_MAX - 1));
  /* trips x cooldown compared before multiplying */
  om_circuit_opts_default(&o);
  o.failures = 1;
  o.window_ns = 0;
  o.cooldown_ns = 1;
  o.max_cooldown_ns = 3;
  assert_int_equal(om_circuit_init(&c, &o), 0);
  fail_n(&c, 0, 1);
  for (uint64_t t = 1; t < 20; t++) {
    om_circuit_allow(&c, t * 10);
    om_circuit_record(&c, t * 10, false);
    assert_int_equal(om_circuit_open_until(&c, t * 10),
                     t * 10 + (t + 1 < 3 ? t + 1 : 3));
  }
  assert_string_equal(om_circuit_state_name((om_circuit_state_t)9), "unknown");
  assert_string_equal(om_circuit_state_name(OM_CIRCUIT_OPEN), "open");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(defaults_and_validation),
      cmocka_unit_test(new_and_free_under_alloc_failure),
      cmocka_unit_test(consecutive_failures_trip),
      cmocka_unit_test(ratio_trips_with_minimum),
      cmocka_unit_test(ratio_window_rolls_over),
      cmocka_unit_test(both_rules_together),
      cmocka_unit_test(half_open_admits_one_probe),
      cmocka_unit_test(probe_failure_reopens_longer),
      cmocka_unit_test(trips_reset_after_healthy_period),
      cmocka_unit_test(results_while_open_are_ignored),
      cmocka_unit_test(probe_timeout_admits_a_replacement),
      cmocka_unit_test(released_probe_frees_the_slot),
      cmocka_unit_test(extremes_saturate),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
