/* test_deadline.c: the call budget, saturating, with an explicit "never". */
#include "om_test.h"

#include "om_deadline.h"
#include "om_errno.h"

#define MS 1000000ull
#define NEVER OM_DEADLINE_NEVER

static void remaining_counts_down_to_zero(void **state) {
  om_deadline_t d = om_deadline_after(1000 * MS, 250 * MS);
  (void)state;
  assert_int_equal(om_deadline_at_ns(d), 1250 * MS);
  assert_false(om_deadline_is_never(d));
  assert_int_equal(om_deadline_remaining(d, 1000 * MS), 250 * MS);
  assert_int_equal(om_deadline_remaining(d, 1100 * MS), 150 * MS);
  assert_int_equal(om_deadline_remaining(d, 1250 * MS), 0);
  assert_int_equal(om_deadline_remaining(d, 9999 * MS), 0); /* no wrap */
  /* A clock reading before the start still only sees the full budget
   * plus the gap, never garbage. */
  assert_int_equal(om_deadline_remaining(d, 0), 1250 * MS);
  assert_false(om_deadline_expired(d, 1249 * MS));
  assert_true(om_deadline_expired(d, 1250 * MS)); /* at == now: expired */
  assert_true(om_deadline_expired(d, 1251 * MS));
}

static void zero_budget_is_expired_at_once(void **state) {
  om_deadline_t d = om_deadline_after(5 * MS, 0);
  (void)state;
  assert_true(om_deadline_expired(d, 5 * MS));
  assert_int_equal(om_deadline_remaining(d, 5 * MS), 0);
  assert_int_equal(om_deadline_attempt_timeout(d, 5 * MS, 100 * MS), 0);
  assert_false(om_deadline_can_start_attempt(d, 5 * MS, 0));
}

static void overflow_saturates_to_never(void **state) {
  om_deadline_t d;
  (void)state;
  d = om_deadline_after(NEVER - 10, 11);
  assert_true(om_deadline_is_never(d));
  d = om_deadline_after(NEVER - 10, 10);
  assert_true(om_deadline_is_never(d)); /* lands exactly on the end */
  d = om_deadline_after(NEVER - 10, 9);
  assert_int_equal(om_deadline_at_ns(d), NEVER - 1);
  assert_false(om_deadline_is_never(d));
  d = om_deadline_after(12345, NEVER);
  assert_true(om_deadline_is_never(d));
  d = om_deadline_after(NEVER, 0);
  assert_true(om_deadline_is_never(d));
}

static void never_never_expires(void **state) {
  om_deadline_t d = om_deadline_never();
  (void)state;
  assert_true(om_deadline_is_never(d));
  assert_int_equal(om_deadline_at_ns(d), NEVER);
  assert_int_equal(om_deadline_remaining(d, 0), NEVER);
  assert_int_equal(om_deadline_remaining(d, NEVER - 1), NEVER);
  assert_int_equal(om_deadline_remaining(d, NEVER), NEVER);
  assert_false(om_deadline_expired(d, 0));
  assert_false(om_deadline_expired(d, NEVER));
  assert_int_equal(om_deadline_attempt_timeout(d, 7, 300 * MS), 300 * MS);
  assert_int_equal(om_deadline_attempt_timeout(d, 7, NEVER), NEVER);
  assert_true(om_deadline_can_start_attempt(d, NEVER, NEVER));
  assert_int_equal(om_deadline_at_ns(om_deadline_at(NEVER)), NEVER);
}

static void attempt_timeout_is_min_of_per_try_and_remaining(void **state) {
  om_deadline_t d = om_deadline_after(0, 1000 * MS);
  (void)state;
  assert_int_equal(om_deadline_attempt_timeout(d, 0, 300 * MS), 300 * MS);
  assert_int_equal(om_deadline_attempt_timeout(d, 800 * MS, 300 * MS),
                   200 * MS);
  assert_int_equal(om_deadline_attempt_timeout(d, 700 * MS, 300 * MS),
                   300 * MS);
  assert_int_equal(om_deadline_attempt_timeout(d, 0, NEVER), 1000 * MS);
  assert_int_equal(om_deadline_attempt_timeout(d, 1000 * MS, 300 * MS), 0);
  assert_int_equal(om_deadline_attempt_timeout(d, 2000 * MS, NEVER), 0);
  assert_int_equal(om_deadline_attempt_timeout(d, 0, 0), 0);
}

static void can_start_attempt_needs_useful_budget(void **state) {
  om_deadline_t d = om_deadline_at(100 * MS);
  (void)state;
  assert_true(om_deadline_can_start_attempt(d, 0, 100 * MS));
  assert_true(om_deadline_can_start_attempt(d, 50 * MS, 50 * MS));
  assert_false(om_deadline_can_start_attempt(d, 51 * MS, 50 * MS));
  assert_true(om_deadline_can_start_attempt(d, 99 * MS, 0));
  assert_false(om_deadline_can_start_attempt(d, 100 * MS, 0));
  assert_false(om_deadline_can_start_attempt(d, 200 * MS, 0));
}

static void signed_budgets_are_checked(void **state) {
  om_deadline_t d = om_deadline_at(42);
  (void)state;
  assert_int_equal(om_deadline_from_signed(0, -1, &d), OM_EINVAL);
  assert_int_equal(om_deadline_at_ns(d), 42); /* untouched */
  assert_int_equal(om_deadline_from_signed(0, INT64_MIN, &d), OM_EINVAL);
  assert_int_equal(om_deadline_at_ns(d), 42);
  assert_int_equal(om_deadline_from_signed(0, 5, NULL), OM_EINVAL);
  assert_int_equal(om_deadline_from_signed(10, 0, &d), 0);
  assert_int_equal(om_deadline_at_ns(d), 10);
  assert_int_equal(om_deadline_from_signed(10, INT64_MAX, &d), 0);
  assert_int_equal(om_deadline_at_ns(d), (uint64_t)INT64_MAX + 10);
  assert_int_equal(om_deadline_from_signed(NEVER - 1, INT64_MAX, &d), 0);
  assert_true(om_deadline_is_never(d));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(remaining_counts_down_to_zero),
      cmocka_unit_test(zero_budget_is_expired_at_once),
      cmocka_unit_test(overflow_saturates_to_never),
      cmocka_unit_test(never_never_expires),
      cmocka_unit_test(attempt_timeout_is_min_of_per_try_and_remaining),
      cmocka_unit_test(can_start_attempt_needs_useful_budget),
      cmocka_unit_test(signed_budgets_are_checked),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
