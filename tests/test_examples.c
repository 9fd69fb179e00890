/*
 * test_examples.c: what examples/ ships is valid input for the commands its
 * README names (a stale example is a bug a new user meets first).
 */
#include "om_test.h"

#include <jansson.h>

#include "om_auth.h"
#include "om_proxy.h"

#define EXAMPLES OM_SOURCE_DIR "/examples"

static void static_topology_loads(void **state) {
  (void)state;
  om_snapshot_t **snaps = NULL;
  size_t n = 0;
  char err[512];
  int rc = om_proxy_static_load(EXAMPLES "/static.json", &snaps, &n, err,
                                sizeof err);
  if (rc != 0)
    fail_msg("static.json: %s", err);
  assert_int_equal(n, 1);
  assert_string_equal(om_snapshot_service(snaps[0]), "orders");
  assert_int_equal(om_snapshot_count(snaps[0]), 3);
  om_proxy_static_free(snaps, n);
}

static void token_file_loads(void **state) {
  (void)state;
  om_auth_t *a = NULL;
  char err[512];
  int rc = om_auth_load(EXAMPLES "/tokens.example", &a, err, sizeof err);
  if (rc != 0)
    fail_msg("tokens.example: %s", err);
  assert_int_equal(om_auth_count(a), 3);
  assert_int_equal(
      om_auth_check(a, "Bearer change-me-admin", 22, OM_ROLE_ADMIN),
      OM_AUTH_OK);
  om_auth_free(a);
}

static void up_json_parses(void **state) {
  (void)state;
  json_error_t e;
  json_t *conf =
      json_load_file(EXAMPLES "/up.json", JSON_REJECT_DUPLICATES, &e);
  if (conf == NULL)
    fail_msg("up.json:%d: %s", e.line, e.text);
  assert_int_equal(json_array_size(json_object_get(conf, "services")), 5);
  assert_non_null(json_object_get(conf, "control"));
  assert_non_null(json_object_get(conf, "proxy"));
  json_decref(conf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(static_topology_loads),
      cmocka_unit_test(token_file_loads),
      cmocka_unit_test(up_json_parses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
