/* test_config_status.c: the table of proxies' policy verdicts stays
 * within its bounds (entries per document, age, reason length). */
#include "om_test.h"

#include <stdio.h>
#include <string.h>

#include "om_config_status.h"
#include "om_errno.h"

#define S UINT64_C(1000000000)

static json_t *proxy_of(json_t *doc, size_t i) {
  return json_array_get(json_object_get(doc, "proxies"), i);
}

static void report_and_list(void **state) {
  om_cfg_status_t *t;
  om_cfg_report_t r = {.id = "b:2", .address = "10.0.0.2", .applied = 7};
  json_t *o, *p;
  (void)state;
  assert_int_equal(om_cfg_status_new(0, 0, &t), 0);
  assert_int_equal(om_cfg_status_report(t, "traffic", &r, 1 * S), 0);
  r.id = "a:1";
  r.refused = 9;
  r.reason = "traffic:3: module 'openmesh.tenants' not found";
  assert_int_equal(om_cfg_status_report(t, "traffic", &r, 2 * S), 0);
  o = om_cfg_status_json(t, "traffic", 3 * S, 1000.0);
  assert_non_null(o);
  OM_ASSERT_CMP(json_integer_value(json_object_get(o, "count")), ==, 2);
  p = proxy_of(o, 0); /* sorted by id */
  assert_string_equal(json_string_value(json_object_get(p, "id")), "a:1");
  OM_ASSERT_CMP(json_integer_value(json_object_get(p, "applied")), ==, 7);
  OM_ASSERT_CMP(json_integer_value(json_object_get(p, "refused")), ==, 9);
  assert_string_equal(json_string_value(json_object_get(p, "reason")),
                      r.reason);
  assert_true(json_real_value(json_object_get(p, "refused_at")) == 999.0);
  p = proxy_of(o, 1);
  assert_string_equal(json_string_value(json_object_get(p, "id")), "b:2");
  assert_true(json_is_null(json_object_get(p, "refused")));
  json_decref(o);
  /* a later report that applies clears the refusal */
  r.applied = 9;
  r.refused = 0;
  r.reason = NULL;
  assert_int_equal(om_cfg_status_report(t, "traffic", &r, 4 * S), 0);
  o = om_cfg_status_json(t, "traffic", 4 * S, 1000.0);
  assert_true(json_is_null(json_object_get(proxy_of(o, 0), "refused")));
  json_decref(o);
  om_cfg_status_free(t);
}

static void bounded_per_document(void **state) {
  om_cfg_status_t *t;
  om_cfg_status_stats_t st;
  om_cfg_report_t r = {.applied = 1};
  char id[32];
  json_t *o;
  (void)state;
  assert_int_equal(om_cfg_status_new(100, 0, &t), 0);
  for (int i = 0; i < 250; i++) {
    snprintf(id, sizeof id, "proxy-%03d", i);
    r.id = id;
    assert_int_equal(om_cfg_status_report(t, "traffic", &r, (uint64_t)i + 1),
                     0);
  }
  OM_ASSERT_CMP(om_cfg_status_count(t, "traffic", 300), ==, 100);
  om_cfg_status_stats(t, &st);
  OM_ASSERT_CMP(st.evicted, ==, 150);
  OM_ASSERT_CMP(st.entries, ==, 100);
  /* the oldest went first: the newest 100 remain */
  o = om_cfg_status_json(t, "traffic", 300, 0);
  assert_string_equal(json_string_value(json_object_get(proxy_of(o, 0), "id")),
                      "proxy-150");
  json_decref(o);
  om_cfg_status_free(t);
}

static void entries_expire(void **state) {
  om_cfg_status_t *t;
  om_cfg_status_stats_t st;
  om_cfg_report_t r = {.id = "old", .applied = 1};
  (void)state;
  assert_int_equal(om_cfg_status_new(0, 60 * S, &t), 0);
  assert_int_equal(om_cfg_status_report(t, "traffic", &r, 1 * S), 0);
  r.id = "fresh";
  assert_int_equal(om_cfg_status_report(t, "traffic", &r, 50 * S), 0);
  OM_ASSERT_CMP(om_cfg_status_count(t, "traffic", 60 * S), ==, 2);
  OM_ASSERT_CMP(om_cfg_status_count(t, "traffic", 62 * S), ==, 1);
  om_cfg_status_stats(t, &st);
  OM_ASSERT_CMP(st.expired, ==, 1);
  OM_ASSERT_CMP(st.entries, ==, 1);
  om_cfg_status_free(t);
}

static void reasons_cut_ids_checked(void **state) {
  om_cfg_status_t *t;
  om_cfg_report_t r = {.id = "p", .applied = 1, .refused = 2};
  char reason[2000];
  const char *field = NULL;
  json_t *o;
  size_t n;
  (void)state;
  /* 'é' is two bytes: 511 + 2 would pass 512, so the cut is at 511 */
  memset(reason, 'x', 511);
  strcpy(reason + 511, "\xc3\xa9yyyy");
  memset(reason + 517, 'z', 1000);
  reason[1517] = '\0';
  r.reason = reason;
  assert_int_equal(om_cfg_status_new(0, 0, &t), 0);
  assert_int_equal(om_cfg_status_report(t, "traffic", &r, 1), 0);
  o = om_cfg_status_json(t, "traffic", 1, 0);
  n = strlen(json_string_value(json_object_get(proxy_of(o, 0), "reason")));
  OM_ASSERT_CMP(n, ==, 511);
  json_decref(o);
  r.id = "has space";
  assert_int_equal(om_cfg_status_report(t, "traffic", &r, 1), OM_EINVAL);
  assert_false(om_cfg_report_valid(&r, &field));
  assert_string_equal(field, "id");
  r.id = "";
  assert_false(om_cfg_report_valid(&r, &field));
  memset(reason, 'a', 129);
  reason[129] = '\0';
  r.id = reason;
  assert_false(om_cfg_report_valid(&r, &field));
  reason[128] = '\0';
  assert_true(om_cfg_report_valid(&r, &field));
  om_cfg_status_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(report_and_list),
      cmocka_unit_test(bounded_per_document),
      cmocka_unit_test(entries_expire),
      cmocka_unit_test(reasons_cut_ids_checked),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
