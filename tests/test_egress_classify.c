/* test_egress_classify.c: Layer A rules (core/om_egress_rules.h), one by one.
 */
#include "om_test.h"

#include <string.h>

#include "om_egress_rules.h"
#include "om_errno.h"

#define MS UINT64_C(1000000)
#define S (1000 * MS)
#define NOW_S INT64_C(784111777) /* Sun, 06 Nov 1994 08:49:37 GMT */

static om_egress_verdict_t verdict_of(const om_egress_outcome_t *o) {
  om_egress_verdict_t v;
  assert_int_equal(om_egress_classify(o, NOW_S, &v), 0);
  return v;
}

static om_egress_verdict_t status(int st) {
  om_egress_outcome_t o = {.status = st};
  return verdict_of(&o);
}

static om_egress_verdict_t status_code(int st, const char *type,
                                       const char *code) {
  om_egress_outcome_t o = {
      .status = st, .error_type = type, .error_code = code};
  return verdict_of(&o);
}

static om_egress_verdict_t transport(om_egress_transport_t t) {
  om_egress_outcome_t o = {.transport = t};
  return verdict_of(&o);
}

static void retryable_statuses(void **state) {
  (void)state;
  int st[] = {500, 502, 503, 504, 599, 529, 408, 409};
  const char *names[] = {"server_error",    "server_error", "server_error",
                         "server_error",    "server_error", "overloaded",
                         "request_timeout", "conflict"};
  for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
    om_egress_verdict_t v = status(st[i]);
    assert_string_equal(v.name, names[i]);
    assert_int_equal(v.retryable, 1);
    assert_int_equal(v.scope, OM_EGRESS_SCOPE_NONE);
    assert_int_equal(v.is_timeout, 0);
  }
}

static void rate_limit_vs_quota(void **state) {
  (void)state;
  om_egress_verdict_t v = status_code(429, "requests", "rate_limit_exceeded");
  assert_string_equal(v.name, "rate_limited");
  assert_int_equal(v.retryable, 1);
  v = status_code(429, "rate_limit_error", NULL); /* Anthropic */
  assert_string_equal(v.name, "rate_limited");
  v = status(429); /* no body: a rate limit */
  assert_string_equal(v.name, "rate_limited");
  v = status_code(429, "insufficient_quota", "insufficient_quota");
  assert_string_equal(v.name, "quota_exhausted");
  assert_int_equal(v.retryable, 0);
  assert_int_equal(v.scope, OM_EGRESS_SCOPE_ROUTE);
  v = status_code(429, "requests", "billing_hard_limit_reached");
  assert_string_equal(v.name, "quota_exhausted");
  v = status_code(429, NULL, "spend_limit_exceeded");
  assert_string_equal(v.name, "quota_exhausted");
  assert_int_equal(v.retryable, 0);
}

static void retry_after_ms_then_seconds_then_date(void **state) {
  (void)state;
  om_egress_outcome_t o = {.status = 429,
                           .retry_after_ms = "1500",
                           .retry_after_ms_len = 4,
                           .retry_after = "30",
                           .retry_after_len = 2};
  om_egress_verdict_t v = verdict_of(&o);
  assert_int_equal(v.has_server_wait, 1);
  assert_int_equal(v.server_wait_ms, 1500);
  /* malformed retry-after-ms: absent, the next source wins */
  o.retry_after_ms = "soon";
  o.retry_after_ms_len = 4;
  v = verdict_of(&o);
  assert_int_equal(v.server_wait_ms, 30000);
  o.retry_after_ms = NULL;
  o.retry_after = "Sun, 06 Nov 1994 08:49:47 GMT"; /* now + 10 s */
  o.retry_after_len = strlen(o.retry_after);
  v = verdict_of(&o);
  assert_int_equal(v.server_wait_ms, 10000);
  o.retry_after = "-5";
  o.retry_after_len = 2;
  v = verdict_of(&o);
  assert_int_equal(v.has_server_wait, 0);
  /* 3600 s is kept as asked (the ceiling applies in om_egress_next) */
  o.retry_after = "3600";
  o.retry_after_len = 4;
  v = verdict_of(&o);
  assert_int_equal(v.server_wait_ms, 3600000);
  /* a success ignores wait headers */
  o.status = 200;
  v = verdict_of(&o);
  assert_string_equal(v.name, "ok");
  assert_int_equal(v.has_server_wait, 0);
}

static void transport_failures(void **state) {
  (void)state;
  om_egress_verdict_t v = transport(OM_EGRESS_T_RESET);
  assert_string_equal(v.name, "connection_reset");
  assert_int_equal(v.retryable, 1);
  assert_int_equal(v.is_timeout, 0);
  v = transport(OM_EGRESS_T_REFUSED);
  assert_string_equal(v.name, "connection_refused");
  assert_int_equal(v.retryable, 1);
  v = transport(OM_EGRESS_T_ATTEMPT_TIMEOUT);
  assert_string_equal(v.name, "timeout");
  assert_int_equal(v.retryable, 1);
  assert_int_equal(v.is_timeout, 1);
  v = transport(OM_EGRESS_T_FIRST_BYTE_TIMEOUT);
  assert_string_equal(v.name, "first_byte_timeout");
  assert_int_equal(v.is_timeout, 1);
}

static void semantic_failures_of_a_2xx(void **state) {
  (void)state;
  om_egress_outcome_t o = {.status = 200, .empty_completion = 1};
  om_egress_verdict_t v = verdict_of(&o);
  assert_string_equal(v.name, "empty_completion");
  assert_int_equal(v.retryable, 1);
  o.empty_completion = 0;
  o.tool_json_invalid = 1;
  v = verdict_of(&o);
  assert_string_equal(v.name, "tool_json_invalid");
  assert_int_equal(v.retryable, 1);
  o.tool_json_invalid = 0;
  o.length_no_content = 1;
  v = verdict_of(&o);
  assert_string_equal(v.name, "length_no_content");
  assert_int_equal(v.retryable, 0);
  assert_int_equal(v.scope, OM_EGRESS_SCOPE_ROUTE);
  o.length_no_content = 0;
  v = verdict_of(&o);
  assert_string_equal(v.name, "ok");
  assert_int_equal(v.retryable, 0);
}

static void terminal_statuses(void **state) {
  (void)state;
  om_egress_verdict_t v = status_code(400, "invalid_request_error", NULL);
  assert_string_equal(v.name, "bad_request");
  assert_int_equal(v.retryable, 0);
  assert_int_equal(v.scope, OM_EGRESS_SCOPE_REQUEST);
  v = status(422);
  assert_string_equal(v.name, "bad_request");
  v = status(401);
  assert_string_equal(v.name, "auth");
  assert_int_equal(v.scope, OM_EGRESS_SCOPE_ROUTE);
  v = status(403);
  assert_string_equal(v.name, "auth");
  v = status_code(400, "invalid_request_error", "context_length_exceeded");
  assert_string_equal(v.name, "context_length");
  assert_int_equal(v.retryable, 0);
  assert_int_equal(v.scope, OM_EGRESS_SCOPE_ROUTE);
  assert_int_equal(v.health, 0);
  om_egress_outcome_t o = {.status = 400, .context_overflow = 1};
  v = verdict_of(&o);
  assert_string_equal(v.name, "context_length");
  v = status(404);
  assert_string_equal(v.name, "not_found");
  assert_int_equal(v.scope, OM_EGRESS_SCOPE_ROUTE);
  v = status(418);
  assert_string_equal(v.name, "client_error");
  v = status(302);
  assert_string_equal(v.name, "unexpected_status");
  assert_int_equal(v.retryable, 0);
}

static void x_should_retry_overrides(void **state) {
  (void)state;
  om_egress_outcome_t o = {
      .status = 400, .x_should_retry = " true ", .x_should_retry_len = 6};
  om_egress_verdict_t v = verdict_of(&o);
  assert_string_equal(v.name, "bad_request");
  assert_int_equal(v.retryable, 1);
  assert_int_equal(v.scope, OM_EGRESS_SCOPE_NONE);
  o.status = 503;
  o.x_should_retry = "FALSE";
  o.x_should_retry_len = 5;
  v = verdict_of(&o);
  assert_int_equal(v.retryable, 0);
  assert_int_equal(v.scope, OM_EGRESS_SCOPE_ROUTE);
  o.x_should_retry = "maybe";
  v = verdict_of(&o);
  assert_int_equal(v.retryable, 1);
  o.status = 200; /* no override for a success */
  o.x_should_retry = "true";
  o.x_should_retry_len = 4;
  v = verdict_of(&o);
  assert_int_equal(v.retryable, 0);
}

static void classify_rejects_bad_input(void **state) {
  (void)state;
  om_egress_verdict_t v;
  memset(&v, 0x5a, sizeof v);
  om_egress_outcome_t none = {0};
  om_egress_outcome_t both = {.status = 500, .transport = OM_EGRESS_T_RESET};
  om_egress_outcome_t range = {.status = 99};
  om_egress_outcome_t range2 = {.status = 600};
  assert_int_equal(om_egress_classify(&none, 0, &v), OM_EINVAL);
  assert_int_equal(om_egress_classify(&both, 0, &v), OM_EINVAL);
  assert_int_equal(om_egress_classify(&range, 0, &v), OM_EINVAL);
  assert_int_equal(om_egress_classify(&range2, 0, &v), OM_EINVAL);
  assert_int_equal(om_egress_classify(NULL, 0, &v), OM_EINVAL);
  assert_int_equal(om_egress_classify(&range, 0, NULL), OM_EINVAL);
  assert_int_equal(v.retryable, 0x5a5a5a5a); /* untouched */
  assert_string_equal(om_egress_class_name(OM_EGRESS_C__COUNT), "unknown");
  assert_string_equal(om_egress_class_name(OM_EGRESS_C_RATE_LIMITED),
                      "rate_limited");
}

/* ---- om_egress_next: the deadline rule ---------------------------------- */

static om_egress_step_t next(om_egress_verdict_t v, uint32_t attempts,
                             int later, uint64_t remaining_ns) {
  om_egress_limits_t lim;
  om_egress_step_t st;
  om_rng_t rng;
  om_rng_seed(&rng, 7);
  om_egress_limits_default(&lim);
  assert_int_equal(om_egress_next(&lim, &v, attempts, later,
                                  om_deadline_after(1000 * S, remaining_ns),
                                  1000 * S, &rng, &st),
                   0);
  return st;
}

static void timeout_abandons_route_when_a_later_one_exists(void **state) {
  (void)state;
  om_egress_step_t st =
      next(transport(OM_EGRESS_T_ATTEMPT_TIMEOUT), 1, 1, 60 * S);
  assert_int_equal(st.action, OM_EGRESS_NEXT_ROUTE);
  assert_int_equal(st.wait_ns, 0);
  assert_string_equal(st.why, "timeout_with_fallback");
  st = next(transport(OM_EGRESS_T_FIRST_BYTE_TIMEOUT), 1, 1, 60 * S);
  assert_int_equal(st.action, OM_EGRESS_NEXT_ROUTE);
  /* the last (or only) route retries a timeout like anything retryable */
  st = next(transport(OM_EGRESS_T_ATTEMPT_TIMEOUT), 1, 0, 60 * S);
  assert_int_equal(st.action, OM_EGRESS_RETRY_SAME);
  assert_string_equal(st.why, "backoff");
  OM_ASSERT_CMP(st.wait_ns, <=, 500 * MS);
}

static void non_timeout_retries_same_route_first(void **state) {
  (void)state;
  om_egress_step_t st = next(status(503), 1, 1, 60 * S);
  assert_int_equal(st.action, OM_EGRESS_RETRY_SAME);
  OM_ASSERT_CMP(st.wait_ns, <=, 500 * MS);
  st = next(status(503), 2, 1, 60 * S);
  assert_int_equal(st.action, OM_EGRESS_RETRY_SAME);
  OM_ASSERT_CMP(st.wait_ns, <=, 1000 * MS);
  /* max attempts per route reached: next route, or stop on the last */
  st = next(status(503), 3, 1, 60 * S);
  assert_int_equal(st.action, OM_EGRESS_NEXT_ROUTE);
  assert_string_equal(st.why, "attempts_exhausted");
  st = next(status(503), 3, 0, 60 * S);
  assert_int_equal(st.action, OM_EGRESS_STOP);
}

static void backoff_is_full_jitter_and_bounded(void **state) {
  (void)state;
  om_egress_limits_t lim;
  om_egress_verdict_t v = status(500);
  om_rng_t rng;
  uint64_t max_seen = 0, min_seen = UINT64_MAX;
  om_egress_limits_default(&lim);
  lim.max_attempts = 100;
  om_rng_seed(&rng, 1);
  for (int i = 0; i < 2000; i++) {
    om_egress_step_t st;
    assert_int_equal(
        om_egress_next(&lim, &v, 10, 0, om_deadline_never(), 0, &rng, &st), 0);
    assert_int_equal(st.action, OM_EGRESS_RETRY_SAME);
    OM_ASSERT_CMP(st.wait_ns, <=, 8000 * MS); /* cap 8 s */
    if (st.wait_ns > max_seen)
      max_seen = st.wait_ns;
    if (st.wait_ns < min_seen)
      min_seen = st.wait_ns;
  }
  /* full jitter spans [0, cap]: both ends are reached */
  OM_ASSERT_CMP(max_seen, >, 7500 * MS);
  OM_ASSERT_CMP(min_seen, <, 500 * MS);
  /* a lower per-wait ceiling bounds the backoff too */
  lim.per_wait_ceiling_ns = 100 * MS;
  for (int i = 0; i < 100; i++) {
    om_egress_step_t st;
    om_egress_next(&lim, &v, 10, 0, om_deadline_never(), 0, &rng, &st);
    OM_ASSERT_CMP(st.wait_ns, <=, 100 * MS);
  }
}

static void retry_after_is_honoured_and_clamped(void **state) {
  (void)state;
  om_egress_outcome_t o = {
      .status = 429, .retry_after = "2", .retry_after_len = 1};
  om_egress_step_t st = next(verdict_of(&o), 1, 1, 60 * S);
  assert_int_equal(st.action, OM_EGRESS_RETRY_SAME);
  assert_int_equal(st.wait_ns, 2 * S);
  assert_string_equal(st.why, "retry_after");
  /* 30 s with a 60 s deadline: clamped to the 8 s ceiling */
  o.retry_after = "30";
  o.retry_after_len = 2;
  st = next(verdict_of(&o), 1, 1, 60 * S);
  assert_int_equal(st.action, OM_EGRESS_RETRY_SAME);
  assert_int_equal(st.wait_ns, 8 * S);
  /* 3600 s: longer than the remaining deadline -> the next route at once */
  o.retry_after = "3600";
  o.retry_after_len = 4;
  st = next(verdict_of(&o), 1, 1, 60 * S);
  assert_int_equal(st.action, OM_EGRESS_NEXT_ROUTE);
  assert_int_equal(st.wait_ns, 0);
  assert_string_equal(st.why, "retry_after_beyond_deadline");
  st = next(verdict_of(&o), 1, 0, 60 * S);
  assert_int_equal(st.action, OM_EGRESS_STOP);
  /* without a deadline, 3600 s is clamped to the ceiling and waited */
  {
    om_egress_limits_t lim;
    om_rng_t rng;
    om_egress_verdict_t v = verdict_of(&o);
    om_egress_limits_default(&lim);
    om_rng_seed(&rng, 3);
    assert_int_equal(
        om_egress_next(&lim, &v, 1, 1, om_deadline_never(), 0, &rng, &st), 0);
    assert_int_equal(st.action, OM_EGRESS_RETRY_SAME);
    assert_int_equal(st.wait_ns, 8 * S);
  }
}

static void deadline_stops_recovery(void **state) {
  (void)state;
  om_egress_step_t st = next(status(503), 1, 1, 0);
  assert_int_equal(st.action, OM_EGRESS_STOP);
  assert_string_equal(st.why, "deadline");
  st = next(transport(OM_EGRESS_T_ATTEMPT_TIMEOUT), 1, 1, 0);
  assert_int_equal(st.action, OM_EGRESS_STOP);
  st = next(status(401), 1, 1, 0);
  assert_int_equal(st.action, OM_EGRESS_STOP);
  /* a wait that does not fit the deadline moves on (or stops) */
  {
    om_egress_outcome_t o = {
        .status = 503, .retry_after_ms = "900", .retry_after_ms_len = 3};
    st = next(verdict_of(&o), 1, 1, 900 * MS);
    assert_int_equal(st.action, OM_EGRESS_NEXT_ROUTE);
    st = next(verdict_of(&o), 1, 0, 950 * MS);
    assert_int_equal(st.action, OM_EGRESS_RETRY_SAME);
    assert_int_equal(st.wait_ns, 900 * MS);
  }
}

static void terminal_scopes(void **state) {
  (void)state;
  om_egress_step_t st = next(status(400), 1, 1, 60 * S);
  assert_int_equal(st.action, OM_EGRESS_STOP);
  assert_string_equal(st.why, "terminal");
  st = next(status(401), 1, 1, 60 * S);
  assert_int_equal(st.action, OM_EGRESS_NEXT_ROUTE);
  st = next(status(401), 1, 0, 60 * S);
  assert_int_equal(st.action, OM_EGRESS_STOP);
  st = next(status_code(400, NULL, "context_length_exceeded"), 1, 1, 60 * S);
  assert_int_equal(st.action, OM_EGRESS_NEXT_ROUTE);
  st = next(status_code(429, NULL, "insufficient_quota"), 1, 1, 60 * S);
  assert_int_equal(st.action, OM_EGRESS_NEXT_ROUTE);
  om_egress_outcome_t o = {.status = 200, .length_no_content = 1};
  st = next(verdict_of(&o), 1, 1, 60 * S);
  assert_int_equal(st.action, OM_EGRESS_NEXT_ROUTE);
}

static void next_rejects_bad_input(void **state) {
  (void)state;
  om_egress_limits_t lim;
  om_egress_verdict_t v = status(500);
  om_egress_step_t st = {.action = 0};
  om_rng_t rng;
  om_rng_seed(&rng, 1);
  om_egress_limits_default(&lim);
  lim.max_attempts = 0;
  assert_int_equal(
      om_egress_next(&lim, &v, 1, 0, om_deadline_never(), 0, &rng, &st),
      OM_EINVAL);
  assert_int_equal(st.action, 0);
  om_egress_limits_default(&lim);
  assert_int_equal(
      om_egress_next(&lim, &v, 1, 0, om_deadline_never(), 0, NULL, &st),
      OM_EINVAL);
  assert_int_equal(
      om_egress_next(NULL, &v, 1, 0, om_deadline_never(), 0, &rng, &st),
      OM_EINVAL);
}

/* ---- cooldown ------------------------------------------------------------ */

static void cooldown_grows_and_resets_on_success(void **state) {
  (void)state;
  om_egress_route_state_t rs = {0};
  om_egress_verdict_t fail = status(503), ok = status(200);
  om_egress_verdict_t bad = status(400);
  uint64_t t = 100 * S;
  assert_true(om_egress_route_available(&rs, t));
  om_egress_route_record(&rs, NULL, &fail, t);
  om_egress_route_record(&rs, NULL, &fail, t);
  assert_true(om_egress_route_available(&rs, t));
  /* the request's own fault says nothing about the route */
  om_egress_route_record(&rs, NULL, &bad, t);
  assert_int_equal(rs.consecutive, 2);
  om_egress_route_record(&rs, NULL, &fail, t); /* 3rd: cool down 2 s */
  assert_false(om_egress_route_available(&rs, t));
  assert_false(om_egress_route_available(&rs, t + 2 * S - 1));
  assert_true(om_egress_route_available(&rs, t + 2 * S));
  t += 2 * S;
  for (int i = 0; i < 3; i++)
    om_egress_route_record(&rs, NULL, &fail, t); /* again: 4 s */
  assert_false(om_egress_route_available(&rs, t + 4 * S - 1));
  assert_true(om_egress_route_available(&rs, t + 4 * S));
  for (int k = 0; k < 20; k++)
    for (int i = 0; i < 3; i++)
      om_egress_route_record(&rs, NULL, &fail, t);
  assert_int_equal(rs.until_ns, t + 60 * S); /* capped */
  om_egress_route_record(&rs, NULL, &ok, t);
  assert_true(om_egress_route_available(&rs, t));
  assert_int_equal(rs.cooldowns, 0);
  assert_int_equal(rs.consecutive, 0);
  assert_true(om_egress_route_available(NULL, 0));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(retryable_statuses),
      cmocka_unit_test(rate_limit_vs_quota),
      cmocka_unit_test(retry_after_ms_then_seconds_then_date),
      cmocka_unit_test(transport_failures),
      cmocka_unit_test(semantic_failures_of_a_2xx),
      cmocka_unit_test(terminal_statuses),
      cmocka_unit_test(x_should_retry_overrides),
      cmocka_unit_test(classify_rejects_bad_input),
      cmocka_unit_test(timeout_abandons_route_when_a_later_one_exists),
      cmocka_unit_test(non_timeout_retries_same_route_first),
      cmocka_unit_test(backoff_is_full_jitter_and_bounded),
      cmocka_unit_test(retry_after_is_honoured_and_clamped),
      cmocka_unit_test(deadline_stops_recovery),
      cmocka_unit_test(terminal_scopes),
      cmocka_unit_test(next_rejects_bad_input),
      cmocka_unit_test(cooldown_grows_and_resets_on_success),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
