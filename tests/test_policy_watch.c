/*
 * test_policy_watch.c: hot reload on a real loop with real files: a valid
 * edit becomes the next version, every kind of bad edit keeps the last good
 * one, editors that write by rename are seen, and many reloads leak nothing.
 */
#include "om_test.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "om_errno.h"
#include "om_policy_watch.h"

#define LIB_DIR OM_SOURCE_DIR "/lua"

typedef struct {
  char dir[64];
  char path[96];
  uv_loop_t loop;
  om_policy_watch_t *w;
  int swaps;
} fixture_t;

static const char *version_src(int v) {
  static char buf[512];
  snprintf(buf, sizeof buf,
           "return {kind = 'traffic', name = 'v%d', max_inflight = %d,\n"
           "  subset = function(req, peers) return peers end,\n"
           "  examples = {{peers = {{id = 'a'}}, expect = {'a'}}}}\n",
           v, v);
  return buf;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  OM_ASSERT_CMP(fputs(text, f), >=, 0);
  assert_int_equal(fclose(f), 0);
}

/* Write via a temporary file and rename(2), as vim and many editors do. */
static void write_by_rename(const char *path, const char *text) {
  char tmp[128];
  snprintf(tmp, sizeof tmp, "%s.swp", path);
  write_file(tmp, text);
  assert_int_equal(rename(tmp, path), 0);
}

static int on_swap(void *ud, om_policy_t *next, om_policy_t *prev) {
  fixture_t *f = ud;
  (void)next;
  (void)prev;
  f->swaps++;
  return 0;
}

static int setup(void **state) {
  fixture_t *f = calloc(1, sizeof *f);
  char err[1024];
  snprintf(f->dir, sizeof f->dir, "/tmp/om-watch-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->path, sizeof f->path, "%s/traffic.lua", f->dir);
  write_file(f->path, version_src(1));
  assert_int_equal(uv_loop_init(&f->loop), 0);
  /* The wall-clock cap is lifted as test_policy.c does: a sanitized build
   * on two busy cores can take more than the default 100 ms to load and
   * check a policy; the runaway case still trips the instruction budget. */
  om_policy_watch_opts_t o = {
      .path = f->path,
      .policy = {.lib_dir = LIB_DIR, .wall_limit_ns = 20000000000u},
      .debounce_ms = 20,
      .kind = OM_POLICY_TRAFFIC,
      .on_swap = on_swap,
      .ud = f};
  int rc = om_policy_watch_start(&f->loop, &o, &f->w, err, sizeof err);
  if (rc != 0)
    fail_msg("start: %s", err);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture_t *f = *state;
  char cmd[128];
  om_policy_watch_stop(f->w);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&f->loop), 0);
  snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
  assert_int_equal(system(cmd), 0);
  free(f);
  return 0;
}

static void on_tick(uv_timer_t *t) {
  (void)t;
}

/* Run the loop until the version or the failure count moves (or 3 s). */
static void run_until_change(fixture_t *f) {
  uint64_t v = om_policy_watch_version(f->w);
  uint64_t fails = om_policy_watch_failures(f->w);
  uv_timer_t tick;
  uv_timer_init(&f->loop, &tick);
  uv_timer_start(&tick, on_tick, 10, 10);
  for (int i = 0; i < 300; i++) {
    uv_run(&f->loop, UV_RUN_ONCE);
    if (om_policy_watch_version(f->w) != v ||
        om_policy_watch_failures(f->w) != fails)
      break;
  }
  uv_close((uv_handle_t *)&tick, NULL);
  uv_run(&f->loop, UV_RUN_NOWAIT);
}

static void valid_edits_swap(void **state) {
  fixture_t *f = *state;
  assert_int_equal(om_policy_watch_version(f->w), 1);
  assert_string_equal(om_policy_name(om_policy_watch_current(f->w)), "v1");
  write_file(f->path, version_src(2));
  run_until_change(f);
  assert_int_equal(om_policy_watch_version(f->w), 2);
  assert_string_equal(om_policy_name(om_policy_watch_current(f->w)), "v2");
  write_by_rename(f->path, version_src(3));
  run_until_change(f);
  assert_int_equal(om_policy_watch_version(f->w), 3);
  assert_string_equal(om_policy_name(om_policy_watch_current(f->w)), "v3");
  assert_int_equal(f->swaps, 3); /* the first load, then two reloads */
  assert_int_equal(om_policy_watch_failures(f->w), 0);
}

static void bad_edits_keep_the_last_good(void **state) {
  fixture_t *f = *state;
  static const struct {
    const char *src, *want;
  } bad[] = {
      {"return {kind = 'traffic',\n\n subset = }", "traffic.lua:3:"},
      {"return {kind = 'traffic', max_inflight = 0,\n"
       " subset = function(r, p) return p end}",
       "max_inflight"},
      {"return {kind = 'traffic', subset = function(r, p) return {} end,\n"
       " examples = {{peers = {{id = 'a'}}, expect = {'a'}}}}",
       "example 1"},
      {"while true do end", "budget"},
      {"return {kind = 'fallback', routes = {{name = 'r', provider = "
       "'openai', base_url = 'http://127.0.0.1:1/v1', model = 'm'}}}",
       "expected 'traffic'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_by_rename(f->path, bad[i].src);
    run_until_change(f);
    assert_int_equal(om_policy_watch_failures(f->w), i + 1);
    assert_int_equal(om_policy_watch_version(f->w), 1);
    assert_string_equal(om_policy_name(om_policy_watch_current(f->w)), "v1");
    if (strstr(om_policy_watch_last_error(f->w), bad[i].want) == NULL)
      fail_msg("case %zu: last error '%s', want '%s'", i,
               om_policy_watch_last_error(f->w), bad[i].want);
  }
  write_file(f->path, version_src(4)); /* and recovery */
  run_until_change(f);
  assert_int_equal(om_policy_watch_version(f->w), 2);
}

/*
 * A rejection is kept with its time and the revision it refused; the next
 * good version moves it to previous_error, and /status shows both.
 */
static void errors_carry_time_and_revision(void **state) {
  fixture_t *f = *state;
  const om_policy_watch_error_t *e;
  char bad[256], good[768];
  json_t *st = json_object();
  uint64_t loaded = om_policy_watch_loaded_at_ms(f->w);
  OM_ASSERT_CMP(loaded, >, 0);
  assert_null(om_policy_watch_error(f->w, 0));
  snprintf(bad, sizeof bad,
           "while true do end\n" OM_POLICY_TRAILER
           "control:orders revision 7\n");
  write_by_rename(f->path, bad);
  run_until_change(f);
  e = om_policy_watch_error(f->w, 0);
  assert_non_null(e);
  OM_ASSERT_CMP(e->revision, ==, 7);
  OM_ASSERT_CMP(e->at_ms, >=, loaded);
  if (strstr(e->message, "budget: instruction limit exceeded at ") == NULL)
    fail_msg("last error '%s', want a budget trip with its line", e->message);
  assert_int_equal(om_policy_watch_status(f->w, st), 0);
  OM_ASSERT_CMP(json_integer_value(json_object_get(st, "last_error_revision")),
                ==, 7);
  OM_ASSERT_CMP(json_integer_value(json_object_get(st, "revision")), ==, 0);
  assert_true(json_is_string(json_object_get(st, "last_error_at")));
  assert_true(json_is_null(json_object_get(st, "previous_error_at")));
  snprintf(good, sizeof good,
           "%s" OM_POLICY_TRAILER "control:orders revision 8\n",
           version_src(2));
  write_by_rename(f->path, good);
  run_until_change(f);
  assert_int_equal(om_policy_watch_version(f->w), 2);
  assert_null(om_policy_watch_error(f->w, 0));
  assert_string_equal(om_policy_watch_last_error(f->w), "");
  e = om_policy_watch_error(f->w, 1);
  assert_non_null(e);
  OM_ASSERT_CMP(e->revision, ==, 7);
  json_object_clear(st);
  assert_int_equal(om_policy_watch_status(f->w, st), 0);
  assert_string_equal(json_string_value(json_object_get(st, "source")),
                      "control:orders");
  OM_ASSERT_CMP(json_integer_value(json_object_get(st, "revision")), ==, 8);
  assert_string_equal(json_string_value(json_object_get(st, "last_error")), "");
  OM_ASSERT_CMP(
      json_integer_value(json_object_get(st, "previous_error_revision")), ==,
      7);
  const char *at = json_string_value(json_object_get(st, "loaded_at"));
  if (at == NULL || strlen(at) != 24 || at[10] != 'T' || at[23] != 'Z')
    fail_msg("loaded_at '%s', want RFC 3339 like 2026-01-02T03:04:05.678Z",
             at ? at : "(null)");
  json_decref(st);
}

static void unchanged_content_is_not_a_version(void **state) {
  fixture_t *f = *state;
  assert_int_equal(om_policy_watch_reload(f->w), 1);
  write_file(f->path, version_src(1)); /* same bytes, new mtime */
  assert_int_equal(om_policy_watch_reload(f->w), 1);
  assert_int_equal(om_policy_watch_version(f->w), 1);
}

/* Many reloads while routing between them: ASan reports any leak. */
static void many_reloads_under_load(void **state) {
  fixture_t *f = *state;
  const om_policy_peer_t peers[] = {{"a", NULL, NULL, 1, NULL, 0},
                                    {"b", NULL, NULL, 1, NULL, 0}};
  const int reloads = 1000;
  for (int i = 0; i < reloads; i++) {
    uint32_t out[2];
    size_t n = 0;
    char err[256];
    om_policy_req_t req = {"svc", "GET", "/",  NULL, 0, NULL,
                           0,     NULL,  NULL, NULL, 0, 0};
    write_file(f->path, i % 7 == 3 ? "return {" : version_src(10 + i));
    om_policy_watch_reload(f->w);
    om_policy_t *p = om_policy_watch_current(f->w);
    assert_int_equal(om_policy_set_peers(p, peers, 2), 0);
    for (int k = 0; k < 20; k++) {
      assert_int_equal(
          om_policy_route(p, &req, out, &n, NULL, NULL, err, sizeof err), 0);
      assert_int_equal(n, 2);
    }
  }
  OM_TEST_NOTE("reloads %d, versions %llu, failures %llu", reloads,
               (unsigned long long)om_policy_watch_version(f->w),
               (unsigned long long)om_policy_watch_failures(f->w));
  assert_int_equal(om_policy_watch_failures(f->w), reloads / 7 + 1);
  assert_int_equal(om_policy_watch_version(f->w) +
                       om_policy_watch_failures(f->w),
                   (uint64_t)reloads + 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(valid_edits_swap, setup, teardown),
      cmocka_unit_test_setup_teardown(bad_edits_keep_the_last_good, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(errors_carry_time_and_revision, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(unchanged_content_is_not_a_version, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(many_reloads_under_load, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
