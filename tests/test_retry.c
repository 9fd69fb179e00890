/* test_retry.c: retry eligibility (method, key, opt-in, outcome, send
 * phase) and the retry budget (ratio, floor, sliding window). */
#include "om_test.h"

#include <math.h>
#include <string.h>

#include "om_errno.h"
#include "om_retry.h"

#define MS UINT64_C(1000000)
#define SEC UINT64_C(1000000000)
#define T0 (UINT64_C(5000) * SEC)

/* Decide for method + status (or error), returning the reason's name. */
static const char *decide(const char *method, const char *key, bool opt_in,
                          int status, om_retry_error_t err,
                          const om_retry_policy_t *p, bool *retry) {
  om_retry_req_t r;
  om_retry_reason_t why = (om_retry_reason_t)-1;
  memset(&r, 0, sizeof r);
  r.method = method;
  r.method_len = method != NULL ? strlen(method) : 0;
  r.idempotency_key = key;
  r.idempotency_key_len = key != NULL ? strlen(key) : 0;
  r.status = status;
  r.error = err;
  r.opt_in = opt_in;
  r.policy = p;
  *retry = om_retry_decide(&r, &why);
  return om_retry_reason_name(why);
}

#define EXPECT(want_retry, want_reason, ...)                                   \
  do {                                                                         \
    bool om__r;                                                                \
    const char *om__why = decide(__VA_ARGS__, &om__r);                         \
    if (om__r != (want_retry) || strcmp(om__why, want_reason) != 0)            \
      fail_msg("decide(%s) = %d %s, want %d %s", #__VA_ARGS__, om__r, om__why, \
               (int)(want_retry), want_reason);                                \
  } while (0)

static void idempotent_methods(void **state) {
  (void)state;
  static const char *const idem[] = {"GET", "HEAD",   "OPTIONS",
                                     "PUT", "DELETE", "TRACE"};
  static const char *const other[] = {"POST", "PATCH",    "CONNECT", "get",
                                      "Get",  "put",      "GETX",    "GE",
                                      "",     "PROPFIND", "GET "};
  for (size_t i = 0; i < sizeof idem / sizeof idem[0]; i++) {
    assert_true(om_retry_method_idempotent(idem[i], strlen(idem[i])));
    EXPECT(true, "idempotent_method", idem[i], NULL, false, 503, 0, NULL);
  }
  for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
    if (om_retry_method_idempotent(other[i], strlen(other[i])))
      fail_msg("\"%s\" is not idempotent", other[i]);
    EXPECT(false, "non_idempotent", other[i], NULL, false, 503, 0, NULL);
  }
  /* the length is what counts, not a NUL */
  assert_false(om_retry_method_idempotent("GETS", 4));
  assert_true(om_retry_method_idempotent("GETS", 3));
  assert_false(om_retry_method_idempotent(NULL, 3));
}

static void idempotency_key_and_opt_in(void **state) {
  (void)state;
  EXPECT(true, "idempotency_key", "POST", "8e03978e-40d5", false, 503, 0, NULL);
  EXPECT(true, "idempotency_key", "PATCH", " k ", false, 502, 0, NULL);
  EXPECT(true, "idempotency_key", "POST", "\"k\"", false, 503, 0, NULL);
  /* empty values are no key */
  EXPECT(false, "non_idempotent", "POST", "", false, 503, 0, NULL);
  EXPECT(false, "non_idempotent", "POST", " \t ", false, 503, 0, NULL);
  EXPECT(false, "non_idempotent", "POST", "\"\"", false, 503, 0, NULL);
  EXPECT(false, "non_idempotent", "POST", NULL, false, 503, 0, NULL);
  /* the policy's opt-in */
  EXPECT(true, "opt_in", "POST", NULL, true, 503, 0, NULL);
  EXPECT(true, "opt_in", "POST", "", true, 504, 0, NULL);
  /* a key beats opt-in in the reason; an idempotent method beats both */
  EXPECT(true, "idempotency_key", "POST", "k", true, 503, 0, NULL);
  EXPECT(true, "idempotent_method", "GET", "k", true, 503, 0, NULL);
}

static void statuses(void **state) {
  (void)state;
  om_retry_policy_t p, before;
  static const int no[] = {100, 200, 204, 301, 400, 404,
                           409, 429, 500, 501, 505, 599};
  EXPECT(true, "idempotent_method", "GET", NULL, false, 502, 0, NULL);
  EXPECT(true, "idempotent_method", "GET", NULL, false, 503, 0, NULL);
  EXPECT(true, "idempotent_method", "GET", NULL, false, 504, 0, NULL);
  for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
    /* the outcome is the stronger reason: not retryable even with a key */
    EXPECT(false, "status_not_retryable", "GET", NULL, false, no[i], 0, NULL);
    EXPECT(false, "status_not_retryable", "POST", "k", true, no[i], 0, NULL);
  }
  om_retry_policy_default(&p);
  assert_true(om_retry_policy_has_status(&p, 503));
  assert_false(om_retry_policy_has_status(&p, 429));
  assert_int_equal(om_retry_policy_set_status(&p, 429, true), 0);
  assert_int_equal(om_retry_policy_set_status(&p, 503, false), 0);
  EXPECT(true, "idempotent_method", "GET", NULL, false, 429, 0, &p);
  EXPECT(false, "status_not_retryable", "GET", NULL, false, 503, 0, &p);
  EXPECT(true, "idempotent_method", "GET", NULL, false, 502, 0, &p);
  /* the edges of the bitmap */
  assert_int_equal(om_retry_policy_set_status(&p, 100, true), 0);
  assert_int_equal(om_retry_policy_set_status(&p, 599, true), 0);
  assert_int_equal(om_retry_policy_set_status(&p, 163, true), 0);
  assert_int_equal(om_retry_policy_set_status(&p, 164, true), 0);
  assert_true(om_retry_policy_has_status(&p, 100));
  assert_true(om_retry_policy_has_status(&p, 599));
  assert_true(om_retry_policy_has_status(&p, 163));
  assert_true(om_retry_policy_has_status(&p, 164));
  assert_false(om_retry_policy_has_status(&p, 162));
  assert_false(om_retry_policy_has_status(&p, 600));
  assert_false(om_retry_policy_has_status(&p, 99));
  before = p;
  assert_int_equal(om_retry_policy_set_status(&p, 99, true), OM_EINVAL);
  assert_int_equal(om_retry_policy_set_status(&p, 600, true), OM_EINVAL);
  assert_int_equal(om_retry_policy_set_status(&p, -503, true), OM_EINVAL);
  assert_int_equal(om_retry_policy_set_status(NULL, 503, true), OM_EINVAL);
  assert_memory_equal(&p, &before, sizeof p);
}

static void error_classes(void **state) {
  (void)state;
  om_retry_policy_t p;
  EXPECT(true, "idempotent_method", "GET", NULL, false, 0, OM_RETRY_ERR_CONNECT,
         NULL);
  EXPECT(true, "idempotent_method", "PUT", NULL, false, 0, OM_RETRY_ERR_TIMEOUT,
         NULL);
  EXPECT(true, "idempotent_method", "DELETE", NULL, false, 0,
         OM_RETRY_ERR_RESET, NULL);
  EXPECT(false, "non_idempotent", "POST", NULL, false, 0, OM_RETRY_ERR_CONNECT,
         NULL);
  EXPECT(false, "non_idempotent", "POST", NULL, false, 0, OM_RETRY_ERR_TIMEOUT,
         NULL);
  EXPECT(true, "idempotency_key", "POST", "k", false, 0, OM_RETRY_ERR_RESET,
         NULL);
  om_retry_policy_default(&p);
  p.error_bits &= ~OM_RETRY_ERR_BIT(OM_RETRY_ERR_RESET);
  EXPECT(false, "error_not_retryable", "GET", NULL, false, 0,
         OM_RETRY_ERR_RESET, &p);
  EXPECT(true, "idempotent_method", "GET", NULL, false, 0, OM_RETRY_ERR_TIMEOUT,
         &p);
}

static void invalid_requests(void **state) {
  (void)state;
  om_retry_reason_t why = OM_RETRY_OPT_IN;
  EXPECT(false, "invalid_request", NULL, NULL, false, 503, 0, NULL);
  EXPECT(false, "invalid_request", "GET", NULL, false, 0, 0, NULL);
  EXPECT(false, "invalid_request", "GET", NULL, false, 503,
         OM_RETRY_ERR_TIMEOUT, NULL);
  EXPECT(false, "invalid_request", "GET", NULL, false, 99, 0, NULL);
  EXPECT(false, "invalid_request", "GET", NULL, false, 600, 0, NULL);
  EXPECT(false, "invalid_request", "GET", NULL, false, -1, 0, NULL);
  EXPECT(false, "invalid_request", "GET", NULL, false, 0, (om_retry_error_t)17,
         NULL);
  assert_false(om_retry_decide(NULL, &why));
  assert_int_equal(why, OM_RETRY_INVALID);
  {
    om_retry_req_t r;
    memset(&r, 0, sizeof r);
    r.method = "GET";
    r.method_len = 3;
    r.status = 503;
    assert_true(om_retry_decide(&r, NULL)); /* reason is optional */
  }
}

/* Decide a transport error in a send phase, returning the reason's name. */
static const char *decide_phase(const char *method, const char *key, int status,
                                om_retry_error_t err, om_retry_phase_t phase,
                                const om_retry_policy_t *p, bool *retry) {
  om_retry_req_t r;
  om_retry_reason_t why = (om_retry_reason_t)-1;
  memset(&r, 0, sizeof r);
  r.method = method;
  r.method_len = strlen(method);
  r.idempotency_key = key;
  r.idempotency_key_len = key != NULL ? strlen(key) : 0;
  r.status = status;
  r.error = err;
  r.phase = phase;
  r.policy = p;
  *retry = om_retry_decide(&r, &why);
  return om_retry_reason_name(why);
}

#define EXPECT_PHASE(want_retry, want_reason, ...)                             \
  do {                                                                         \
    bool om__r;                                                                \
    const char *om__why = decide_phase(__VA_ARGS__, &om__r);                   \
    if (om__r != (want_retry) || strcmp(om__why, want_reason) != 0)            \
      fail_msg("decide_phase(%s) = %d %s, want %d %s", #__VA_ARGS__, om__r,    \
               om__why, (int)(want_retry), want_reason);                       \
  } while (0)

static void send_phases(void **state) {
  (void)state;
  om_retry_policy_t p;
  /* nothing left: any method, any retryable error class */
  EXPECT_PHASE(true, "not_sent", "POST", NULL, 0, OM_RETRY_ERR_CONNECT,
               OM_RETRY_PHASE_PRE_SEND, NULL);
  EXPECT_PHASE(true, "not_sent", "PATCH", NULL, 0, OM_RETRY_ERR_TIMEOUT,
               OM_RETRY_PHASE_PRE_SEND, NULL);
  EXPECT_PHASE(true, "not_sent", "POST", NULL, 0, OM_RETRY_ERR_RESET,
               OM_RETRY_PHASE_PRE_SEND, NULL);
  /* the method or key is the reason when it alone would allow it */
  EXPECT_PHASE(true, "idempotent_method", "GET", NULL, 0, OM_RETRY_ERR_CONNECT,
               OM_RETRY_PHASE_PRE_SEND, NULL);
  EXPECT_PHASE(true, "idempotency_key", "POST", "k", 0, OM_RETRY_ERR_CONNECT,
               OM_RETRY_PHASE_PRE_SEND, NULL);
  /* after bytes left, and when the phase is unknown: the method rules */
  EXPECT_PHASE(false, "non_idempotent", "POST", NULL, 0, OM_RETRY_ERR_RESET,
               OM_RETRY_PHASE_POST_SEND, NULL);
  EXPECT_PHASE(false, "non_idempotent", "POST", NULL, 0, OM_RETRY_ERR_CONNECT,
               OM_RETRY_PHASE_UNKNOWN, NULL);
  EXPECT_PHASE(true, "idempotency_key", "POST", "k", 0, OM_RETRY_ERR_RESET,
               OM_RETRY_PHASE_POST_SEND, NULL);
  /* the outcome gate still comes first */
  om_retry_policy_default(&p);
  p.error_bits &= ~OM_RETRY_ERR_BIT(OM_RETRY_ERR_CONNECT);
  EXPECT_PHASE(false, "error_not_retryable", "POST", NULL, 0,
               OM_RETRY_ERR_CONNECT, OM_RETRY_PHASE_PRE_SEND, &p);
  /* a status means a server answered: pre-send with one is a contradiction */
  EXPECT_PHASE(false, "invalid_request", "GET", NULL, 503, OM_RETRY_ERR_NONE,
               OM_RETRY_PHASE_PRE_SEND, NULL);
  EXPECT_PHASE(true, "idempotent_method", "GET", NULL, 503, OM_RETRY_ERR_NONE,
               OM_RETRY_PHASE_POST_SEND, NULL);
  EXPECT_PHASE(false, "invalid_request", "POST", NULL, 0, OM_RETRY_ERR_CONNECT,
               (om_retry_phase_t)9, NULL);
}

static void reason_names(void **state) {
  (void)state;
  assert_string_equal(om_retry_reason_name(OM_RETRY_IDEMPOTENT_METHOD),
                      "idempotent_method");
  assert_string_equal(om_retry_reason_name(OM_RETRY_IDEMPOTENCY_KEY),
                      "idempotency_key");
  assert_string_equal(om_retry_reason_name(OM_RETRY_OPT_IN), "opt_in");
  assert_string_equal(om_retry_reason_name(OM_RETRY_NOT_SENT), "not_sent");
  assert_string_equal(om_retry_reason_name(OM_RETRY_NON_IDEMPOTENT),
                      "non_idempotent");
  assert_string_equal(om_retry_reason_name(OM_RETRY_STATUS_NOT_RETRYABLE),
                      "status_not_retryable");
  assert_string_equal(om_retry_reason_name(OM_RETRY_ERROR_NOT_RETRYABLE),
                      "error_not_retryable");
  assert_string_equal(om_retry_reason_name(OM_RETRY_INVALID),
                      "invalid_request");
  assert_string_equal(om_retry_reason_name((om_retry_reason_t)99), "unknown");
}

/* ---- budget ------------------------------------------------------------- */

static om_retry_budget_t *budget(double ratio, uint64_t window_ns,
                                 double min_per_s) {
  om_retry_budget_opts_t o = {ratio, window_ns, min_per_s};
  om_retry_budget_t *b = NULL;
  assert_int_equal(om_retry_budget_new(&o, &b), 0);
  return b;
}

static int withdraw_all(om_retry_budget_t *b, uint64_t now) {
  int n = 0;
  while (om_retry_budget_try_withdraw(b, now))
    n++;
  return n;
}

static void budget_new_validates_and_survives_alloc_failure(void **state) {
  (void)state;
  om_retry_budget_opts_t o, bad;
  om_retry_budget_t *b = NULL, *sentinel = (om_retry_budget_t *)&o;
  om_retry_budget_opts_default(&o);
  OM_ASSERT_NEAR(o.ratio, 0.2, 0);
  assert_int_equal(o.window_ns, 10 * SEC);
  OM_ASSERT_NEAR(o.min_per_s, 10, 0);
  for (int i = 0; i < 8; i++) {
    om_retry_budget_t *out = sentinel;
    bad = o;
    switch (i) {
    case 0:
      bad.ratio = -0.1;
      break;
    case 1:
      bad.ratio = NAN;
      break;
    case 2:
      bad.ratio = 100.5;
      break;
    case 3:
      bad.window_ns = OM_RETRY_BUDGET_BUCKETS - 1;
      break;
    case 4:
      bad.window_ns = 3601 * SEC;
      break;
    case 5:
      bad.min_per_s = -1;
      break;
    case 6:
      bad.min_per_s = NAN;
      break;
    default:
      bad.min_per_s = INFINITY;
      break;
    }
    if (om_retry_budget_new(&bad, &out) != OM_EINVAL || out != sentinel)
      fail_msg("case %d accepted", i);
  }
  assert_int_equal(om_retry_budget_new(&o, NULL), OM_EINVAL);
  for (long n = 0;; n++) {
    om_retry_budget_t *out = sentinel;
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_retry_budget_new(NULL, &out);
    om_test_alloc_reset();
    if (rc == 0) {
      b = out;
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    assert_ptr_equal(out, sentinel);
  }
  assert_int_equal(om_retry_budget_balance(b, T0), 100);
  om_retry_budget_free(b);
  om_retry_budget_free(NULL);
}

static void budget_floor_at_low_traffic(void **state) {
  (void)state;
  om_retry_budget_t *b = budget(0.2, 10 * SEC, 10);
  /* no traffic at all: the reserve is 10/s x 10 s = 100 retries */
  assert_int_equal(om_retry_budget_balance(b, T0), 100);
  assert_int_equal(withdraw_all(b, T0), 100);
  assert_false(om_retry_budget_try_withdraw(b, T0 + 9 * SEC));
  assert_int_equal(om_retry_budget_balance(b, T0 + 9 * SEC), 0);
  /* the withdrawals expire with their bucket */
  assert_int_equal(om_retry_budget_balance(b, T0 + 10 * SEC), 100);
  assert_int_equal(withdraw_all(b, T0 + 10 * SEC), 100);
  om_retry_budget_free(b);

  /* a fractional floor: 0.5/s x 10 s = 5 */
  b = budget(0.2, 10 * SEC, 0.5);
  assert_int_equal(withdraw_all(b, T0), 5);
  om_retry_budget_free(b);
  /* no floor and no traffic: no retries */
  b = budget(0.2, 10 * SEC, 0);
  assert_int_equal(withdraw_all(b, T0), 0);
  om_retry_budget_free(b);
}

static void budget_ratio_is_exact(void **state) {
  (void)state;
  om_retry_budget_t *b = budget(0.2, 10 * SEC, 0);
  for (int i = 0; i < 4; i++)
    om_retry_budget_record_request(b, T0);
  assert_int_equal(withdraw_all(b, T0), 0); /* 0.8 retries */
  om_retry_budget_record_request(b, T0);
  assert_int_equal(withdraw_all(b, T0), 1); /* 5 x 0.2 = 1, exactly */
  for (int i = 0; i < 995; i++)
    om_retry_budget_record_request(b, T0);
  assert_int_equal(withdraw_all(b, T0), 199); /* 200 in all */
  om_retry_budget_free(b);

  /* with the default floor: 20% of requests on top of 100 */
  b = budget(0.2, 10 * SEC, 10);
  for (int i = 0; i < 1000; i++)
    om_retry_budget_record_request(b, T0);
  assert_int_equal(om_retry_budget_balance(b, T0), 300);
  assert_int_equal(withdraw_all(b, T0), 300);
  om_retry_budget_free(b);
}

static void budget_window_slides(void **state) {
  (void)state;
  om_retry_budget_t *b = budget(0.2, 10 * SEC, 0);
  /* 100 requests at 0.5 s, 100 at 5.5 s */
  for (int i = 0; i < 100; i++)
    om_retry_budget_record_request(b, T0 + 500 * MS);
  for (int i = 0; i < 100; i++)
    om_retry_budget_record_request(b, T0 + 5500 * MS);
  assert_int_equal(om_retry_budget_balance(b, T0 + 9999 * MS), 40);
  /* at 10 s the first bucket leaves: only the later 100 still count */
  assert_int_equal(om_retry_budget_balance(b, T0 + 10 * SEC), 20);
  assert_int_equal(withdraw_all(b, T0 + 10 * SEC), 20);
  /* at 15.5 s the rest leaves, but the 20 retries (at 10 s) remain: the
   * balance is negative, reported as 0 */
  assert_int_equal(om_retry_budget_balance(b, T0 + 15500 * MS), 0);
  for (int i = 0; i < 100; i++)
    om_retry_budget_record_request(b, T0 + 15500 * MS);
  assert_int_equal(om_retry_budget_balance(b, T0 + 15500 * MS), 0);
  assert_false(om_retry_budget_try_withdraw(b, T0 + 15500 * MS));
  /* once those retries expire (20 s) the 100 requests earn 20 */
  assert_int_equal(om_retry_budget_balance(b, T0 + 20 * SEC), 20);
  /* a time before the whole window counts nowhere */
  assert_false(om_retry_budget_try_withdraw(b, T0));
  om_retry_budget_record_request(b, T0);
  assert_int_equal(om_retry_budget_balance(b, T0 + 20 * SEC), 20);
  om_retry_budget_free(b);
}

/*
 * The point of the budget: under a total outage where every request wants
 * a retry, retries stay within 20% of requests plus the floor, in every
 * window, at high and at low traffic.
 */
static void budget_bounds_amplification(void **state) {
  (void)state;
  static const int rates[] = {2, 20, 1000, 20000}; /* requests per second */
  for (size_t r = 0; r < sizeof rates / sizeof rates[0]; r++) {
    om_retry_budget_t *b = budget(0.2, 10 * SEC, 10);
    uint64_t step = SEC / (uint64_t)rates[r];
    long reqs = 0, rets = 0;
    /* per-second counts over 60 s, to check every 10 s window */
    long rq[60] = {0}, rt[60] = {0};
    for (uint64_t t = 0; t < 60 * SEC; t += step) {
      int s = (int)(t / SEC);
      om_retry_budget_record_request(b, T0 + t);
      rq[s]++;
      reqs++;
      if (om_retry_budget_try_withdraw(b, T0 + t)) {
        rt[s]++;
        rets++;
      }
    }
    for (int s = 0; s + 10 <= 60; s++) {
      long wq = 0, wt = 0;
      for (int k = s; k < s + 10; k++) {
        wq += rq[k];
        wt += rt[k];
      }
      if ((double)wt > 0.2 * (double)wq + 100 + 1e-9)
        fail_msg("rate %d/s, window at %d s: %ld retries for %ld requests",
                 rates[r], s, wt, wq);
    }
    /* low traffic: every failed request could be retried (floor) */
    if (rates[r] <= 10)
      assert_int_equal(rets, reqs);
    else /* high traffic: about 20% (plus the floor's share) */
      OM_ASSERT_CMP(rets, <=, (long)(0.2 * (double)reqs) + 6 * 100);
    if (rates[r] == 20000)
      OM_TEST_NOTE("20000 req/s for 60 s: %ld retries for %ld requests "
                   "(%.1f%%)",
                   rets, reqs, 100.0 * (double)rets / (double)reqs);
    om_retry_budget_free(b);
  }
}

/* Tokens as the unit: 10,000 tokens of successes at ratio 0.2 earn 2,000
 * tokens of retries on top of the reserve (0 here); a retry that would go
 * past it is refused and leaves the balance as it was; the window expires
 * both sides. Bad amounts change nothing. */
static void budget_amounts(void **state) {
  (void)state;
  om_retry_budget_t *b = budget(0.2, 10 * SEC, 0);
  uint64_t t0 = 100 * SEC;
  OM_ASSERT_NEAR(om_retry_budget_amount_left(b, t0), 0, 0);
  assert_false(om_retry_budget_try_spend(b, t0, 1));
  om_retry_budget_deposit(b, t0, 10000);
  OM_ASSERT_NEAR(om_retry_budget_amount_left(b, t0), 2000, 1e-9);
  assert_true(om_retry_budget_try_spend(b, t0, 1500));
  assert_false(om_retry_budget_try_spend(b, t0, 501));
  OM_ASSERT_NEAR(om_retry_budget_amount_left(b, t0), 500, 1e-9);
  assert_true(om_retry_budget_try_spend(b, t0 + SEC, 500));
  assert_false(om_retry_budget_try_spend(b, t0 + SEC, 0.001));
  /* hostile amounts: ignored or refused, balance unchanged */
  om_retry_budget_deposit(b, t0, NAN);
  om_retry_budget_deposit(b, t0, -5);
  om_retry_budget_deposit(b, t0, INFINITY);
  assert_false(om_retry_budget_try_spend(b, t0, NAN));
  assert_false(om_retry_budget_try_spend(b, t0, -1));
  OM_ASSERT_NEAR(om_retry_budget_amount_left(b, t0 + SEC), 0, 1e-9);
  /* a whole window later, everything has expired */
  OM_ASSERT_NEAR(om_retry_budget_amount_left(b, t0 + 11 * SEC), 0, 0);
  om_retry_budget_deposit(b, t0 + 11 * SEC, 100);
  OM_ASSERT_NEAR(om_retry_budget_amount_left(b, t0 + 11 * SEC), 20, 1e-9);
  om_retry_budget_free(b);
  /* the reserve is min_per_s x window in the unit: 0.5 USD/s x 10 s */
  b = budget(0.2, 10 * SEC, 0.5);
  OM_ASSERT_NEAR(om_retry_budget_amount_left(b, t0), 5, 1e-9);
  assert_true(om_retry_budget_try_spend(b, t0, 4.99));
  assert_false(om_retry_budget_try_spend(b, t0, 0.02));
  om_retry_budget_free(b);
  /* NULL is harmless */
  om_retry_budget_deposit(NULL, t0, 1);
  assert_false(om_retry_budget_try_spend(NULL, t0, 1));
  OM_ASSERT_NEAR(om_retry_budget_amount_left(NULL, t0), 0, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(idempotent_methods),
      cmocka_unit_test(idempotency_key_and_opt_in),
      cmocka_unit_test(statuses),
      cmocka_unit_test(error_classes),
      cmocka_unit_test(invalid_requests),
      cmocka_unit_test(send_phases),
      cmocka_unit_test(reason_names),
      cmocka_unit_test(budget_new_validates_and_survives_alloc_failure),
      cmocka_unit_test(budget_floor_at_low_traffic),
      cmocka_unit_test(budget_ratio_is_exact),
      cmocka_unit_test(budget_window_slides),
      cmocka_unit_test(budget_bounds_amplification),
      cmocka_unit_test(budget_amounts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
