/*
 * test_access_log.c: the access log's line (every field, parsed back with
 * jansson), its escaping (quotes, control bytes, invalid UTF-8: no input
 * ends a line or forges a field), its bound, and the writer: lines reach
 * the file, a renamed file is followed within about a second, a reopen
 * asked for is done, a full buffer drops and counts.
 */
#include "om_test.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "om_proxy_access_log.h"

static om_access_log_entry_t sample(void) {
  static const om_policy_kv_t kv[] = {{"x-user", 6, "u-1", 3}};
  om_access_log_entry_t e;
  memset(&e, 0, sizeof e);
  e.wall_ms = UINT64_C(1764687779123); /* 2025-12-02T15:02:59.123Z */
  e.request_id = "abc";
  e.service = "orders";
  e.method = "GET";
  e.path = "/a?b=1";
  e.path_len = 6;
  e.fields = kv;
  e.n_fields = 1;
  e.status = 200;
  e.peer_id = "p1";
  e.peer_url = "http://127.0.0.1:9";
  e.attempts = 1;
  e.duration_ms = 1.5;
  e.policy = "canary";
  e.policy_version = 2;
  e.policy_revision = 7;
  e.outcome = "ok";
  return e;
}

static json_t *parse_line(const char *line, size_t len) {
  json_error_t je;
  json_t *j;
  OM_ASSERT_CMP(len, >, 1);
  OM_ASSERT_CMP(line[len - 1], ==, '\n');
  OM_ASSERT_CMP((size_t)((const char *)memchr(line, '\n', len) - line), ==,
                len - 1);
  j = json_loadb(line, len, 0, &je);
  if (j == NULL)
    fail_msg("not JSON (%s): %.*s", je.text, (int)len, line);
  return j;
}

static void test_line_fields(void **state) {
  om_access_log_entry_t e = sample();
  char line[OM_ACCESS_LOG_LINE_MAX];
  size_t n = om_access_log_format(&e, line, sizeof line);
  json_t *j = parse_line(line, n);
  (void)state;
  assert_string_equal(json_string_value(json_object_get(j, "time")),
                      "2025-12-02T15:02:59.123Z");
  assert_string_equal(json_string_value(json_object_get(j, "request_id")),
                      "abc");
  assert_string_equal(json_string_value(json_object_get(j, "path")), "/a?b=1");
  assert_string_equal(json_string_value(json_object_get(
                          json_object_get(j, "fields"), "x-user")),
                      "u-1");
  OM_ASSERT_CMP(json_integer_value(json_object_get(j, "status")), ==, 200);
  assert_string_equal(
      json_string_value(json_object_get(json_object_get(j, "peer"), "address")),
      "http://127.0.0.1:9");
  OM_ASSERT_CMP(json_integer_value(
                    json_object_get(json_object_get(j, "policy"), "revision")),
                ==, 7);
  assert_string_equal(json_string_value(json_object_get(j, "outcome")), "ok");
  assert_null(json_object_get(j, "truncated"));
  json_decref(j);
  /* a refusal: no peer */
  e.peer_id = NULL;
  n = om_access_log_format(&e, line, sizeof line);
  j = parse_line(line, n);
  assert_true(json_is_null(json_object_get(j, "peer")));
  json_decref(j);
}

static void test_escaping(void **state) {
  /* a path that tries to end the line and forge a field, with control
   * bytes, an invalid byte, an overlong '/' and a surrogate */
  static const char path[] = "/x\",\"outcome\":\"forged\"}\n{\"a\":\"\x01\xff"
                             "\xc0\xaf\xed\xa0\x80\xe2\x82\xac\\";
  om_access_log_entry_t e = sample();
  char line[OM_ACCESS_LOG_LINE_MAX];
  size_t n;
  json_t *j;
  (void)state;
  e.path = path;
  e.path_len = sizeof path - 1;
  n = om_access_log_format(&e, line, sizeof line);
  j = parse_line(line, n);
  assert_string_equal(json_string_value(json_object_get(j, "outcome")), "ok");
  assert_string_equal(json_string_value(json_object_get(j, "path")),
                      "/x\",\"outcome\":\"forged\"}\n{\"a\":\"\x01"
                      "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                      "\xef\xbf\xbd\xef\xbf\xbd\xe2\x82\xac\\");
  json_decref(j);
}

static void test_bounded(void **state) {
  static char big[64 * 1024];
  om_policy_kv_t kv[40];
  om_access_log_entry_t e = sample();
  char line[OM_ACCESS_LOG_LINE_MAX];
  size_t n;
  json_t *j;
  (void)state;
  memset(big, '"', sizeof big); /* each byte escapes to two */
  for (size_t i = 0; i < 40; i++)
    kv[i] = (om_policy_kv_t){"x-long", 6, big, sizeof big};
  e.path = big;
  e.path_len = sizeof big;
  e.fields = kv;
  e.n_fields = 40;
  n = om_access_log_format(&e, line, sizeof line);
  OM_ASSERT_CMP(n, <=, (size_t)OM_ACCESS_LOG_LINE_MAX);
  j = parse_line(line, n);
  assert_true(json_is_true(json_object_get(j, "truncated")));
  assert_string_equal(json_string_value(json_object_get(j, "outcome")), "ok");
  json_decref(j);
}

static size_t count_lines(const char *path) {
  FILE *f = fopen(path, "r");
  size_t n = 0;
  int c;
  if (f == NULL)
    return 0;
  while ((c = fgetc(f)) != EOF)
    n += c == '\n';
  fclose(f);
  return n;
}

/* Wait up to ms for path to hold want lines. */
static size_t wait_lines(const char *path, size_t want, int ms) {
  size_t n = 0;
  for (int i = 0; i < ms / 10; i++) {
    if ((n = count_lines(path)) >= want)
      return n;
    uv_sleep(10);
  }
  return n;
}

static void test_writer_rotation(void **state) {
  char dir[] = "/tmp/om-alog-XXXXXX", path[64], rotated[80], err[256];
  char line[OM_ACCESS_LOG_LINE_MAX];
  om_access_log_t *l = NULL;
  om_access_log_producer_t *pr;
  om_access_log_entry_t e = sample();
  size_t n = om_access_log_format(&e, line, sizeof line);
  (void)state;
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/access.log", dir);
  OM_ASSERT_CMP(om_access_log_open(path, &l, err, sizeof err), ==, 0);
  assert_non_null(pr = om_access_log_producer(l));
  for (int i = 0; i < 3; i++)
    OM_ASSERT_CMP(om_access_log_append(pr, line, n), ==, 0);
  OM_ASSERT_CMP(wait_lines(path, 3, 2000), ==, 3);
  /* renamed away: followed within about a second */
  snprintf(rotated, sizeof rotated, "%s.1", path);
  OM_ASSERT_CMP(rename(path, rotated), ==, 0);
  for (int i = 0; i < 300 && count_lines(path) == 0; i++) {
    om_access_log_append(pr, line, n);
    uv_sleep(10);
  }
  OM_ASSERT_CMP(count_lines(path), >, 0);
  /* an explicit reopen */
  OM_ASSERT_CMP(rename(path, rotated), ==, 0);
  om_access_log_reopen(l);
  for (int i = 0; i < 200 && access(path, F_OK) != 0; i++)
    uv_sleep(10);
  OM_ASSERT_CMP(access(path, F_OK), ==, 0);
  OM_ASSERT_CMP(om_access_log_append(pr, line, n), ==, 0);
  OM_ASSERT_CMP(wait_lines(path, 1, 2000), ==, 1);
  /* more than a buffer between two flushes: some drop, all counted */
  {
    size_t fit = OM_ACCESS_LOG_BUF / n, dropped = 0;
    for (size_t i = 0; i < 3 * fit; i++)
      dropped += om_access_log_append(pr, line, n) != 0;
    OM_ASSERT_CMP(dropped, >, 0);
    om_access_log_close(l);
    l = NULL;
    OM_ASSERT_CMP(count_lines(path), ==, 1 + 3 * fit - dropped);
  }
  remove(path);
  remove(rotated);
  rmdir(dir);
}

static void test_open_error(void **state) {
  char err[256];
  om_access_log_t *l = NULL;
  (void)state;
  OM_ASSERT_CMP(
      om_access_log_open("/nonexistent-dir/x.log", &l, err, sizeof err), <, 0);
  assert_null(l);
  assert_non_null(strstr(err, "/nonexistent-dir/x.log"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_line_fields),
      cmocka_unit_test(test_escaping),
      cmocka_unit_test(test_bounded),
      cmocka_unit_test(test_writer_rotation),
      cmocka_unit_test(test_open_error),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
