/*
 * test_config_watch.c: om_watch in config mode (opts.config), against a
 * fake control plane on a real loopback socket, one libuv loop: the
 * document's revision is the event id; only newer revisions are
 * delivered, as they arrived (multi-line data joined with LF); stale,
 * duplicate and id-less events are counted and dropped; the first
 * request carries opts.last_event_id and a reconnect the last revision
 * delivered.
 */
#include "om_test.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "http_test_client.h"
#include "om_curl_uv.h"
#include "om_errno.h"
#include "om_http_server.h"
#include "om_watch.h"

typedef struct app_s {
  uv_loop_t loop;
  om_http_server_t *srv;
  om_http_request_t *stream;
  unsigned requests;
  char path[128], last_id[32];
  int srv_closed, watch_closed, curl_closed;
  om_curl_uv_t *curl;
  om_watch_t *watch;
  unsigned delivered;
  uint64_t rev;
  char doc[256];
} app_t;

static void on_gone(om_http_request_t *req) {
  ((app_t *)req->user)->stream = NULL;
}

static void on_request(om_http_request_t *req, void *ud) {
  app_t *app = ud;
  static const om_http_header_t h[] = {
      {"content-type", "text/event-stream", 12, 17}};
  const char *id = om_http_request_header(req, "last-event-id", NULL);
  app->requests++;
  snprintf(app->path, sizeof app->path, "%.*s", (int)req->path_len, req->path);
  snprintf(app->last_id, sizeof app->last_id, "%s", id != NULL ? id : "");
  assert_int_equal(om_http_response_start(req, 200, h, 1), 0);
  req->user = app;
  assert_int_equal(om_http_request_on_close(req, on_gone), 0);
  app->stream = req;
}

static void on_document(void *ud, uint64_t rev, const char *data, size_t len) {
  app_t *app = ud;
  app->delivered++;
  app->rev = rev;
  snprintf(app->doc, sizeof app->doc, "%.*s", (int)len, data);
}

static void on_srv_closed(om_http_server_t *s, void *ud) {
  (void)s;
  ((app_t *)ud)->srv_closed = 1;
}
static void on_watch_closed(void *ud) {
  ((app_t *)ud)->watch_closed = 1;
}
static void on_curl_closed(void *ud) {
  ((app_t *)ud)->curl_closed = 1;
}

#define SPIN_UNTIL(app, cond, ms)                                              \
  do {                                                                         \
    uint64_t t0_ = htc_now_ms();                                               \
    while (!(cond) && htc_now_ms() - t0_ < (uint64_t)(ms))                     \
      htc_step(&(app)->loop, NULL, 1);                                         \
  } while (0)

static om_watch_stats_t wstats(const app_t *app) {
  om_watch_stats_t s;
  memset(&s, 0, sizeof s);
  om_watch_stats(app->watch, &s);
  return s;
}

static void push(app_t *app, const char *event) {
  uint64_t before = wstats(app).events;
  assert_non_null(app->stream);
  assert_int_equal(om_http_response_write(app->stream, event, strlen(event)),
                   0);
  SPIN_UNTIL(app, wstats(app).events > before, 3000);
  OM_ASSERT_CMP(wstats(app).events, ==, before + 1);
  for (int i = 0; i < 5; i++)
    htc_step(&app->loop, NULL, 1);
}

static void revisions_and_resume(void **state) {
  app_t *app = calloc(1, sizeof *app);
  om_watch_opts_t wo;
  char base[64];
  om_watch_stats_t st;
  (void)state;
  assert_non_null(app);
  assert_int_equal(uv_loop_init(&app->loop), 0);
  assert_int_equal(
      om_http_server_new(&app->loop, NULL, on_request, app, &app->srv), 0);
  assert_int_equal(om_http_server_listen(app->srv, "127.0.0.1", 0), 0);
  snprintf(base, sizeof base, "http://127.0.0.1:%d",
           om_http_server_port(app->srv));
  assert_int_equal(om_curl_uv_new(&app->loop, &app->curl), 0);

  /* service and config together, or neither: refused */
  memset(&wo, 0, sizeof wo);
  wo.control_url = base;
  assert_int_equal(om_watch_new(&app->loop, app->curl, &wo, &app->watch),
                   OM_EINVAL);
  wo.service = "web";
  wo.config = "traffic";
  assert_int_equal(om_watch_new(&app->loop, app->curl, &wo, &app->watch),
                   OM_EINVAL);
  wo.service = NULL;
  wo.config = "bad/name";
  assert_int_equal(om_watch_new(&app->loop, app->curl, &wo, &app->watch),
                   OM_EINVAL);

  wo.config = "traffic";
  wo.last_event_id = 5; /* a cached copy of revision 5 */
  wo.on_document = on_document;
  wo.ud = app;
  assert_int_equal(om_watch_new(&app->loop, app->curl, &wo, &app->watch), 0);
  SPIN_UNTIL(app, app->stream != NULL, 3000);
  assert_string_equal(app->path, "/v1/watch/config/traffic");
  assert_string_equal(app->last_id, "5");

  push(app, "event: snapshot\nid: 5\ndata: return 5\n\n");  /* held already */
  push(app, "event: snapshot\nid: 4\ndata: return 4\n\n");  /* older */
  push(app, "event: snapshot\nid: x7\ndata: return 7\n\n"); /* no revision */
  push(app, "event: snapshot\ndata: return 7\n\n");         /* no id */
  OM_ASSERT_CMP(app->delivered, ==, 0);
  st = wstats(app);
  OM_ASSERT_CMP(st.duplicates, ==, 1);
  OM_ASSERT_CMP(st.rejected_stale, ==, 1);
  OM_ASSERT_CMP(st.rejected_malformed, ==, 2);

  push(app, "event: snapshot\nid: 9\ndata: -- line 1\ndata: return 9\n\n");
  OM_ASSERT_CMP(app->delivered, ==, 1);
  OM_ASSERT_CMP(app->rev, ==, 9);
  assert_string_equal(app->doc, "-- line 1\nreturn 9");
  OM_ASSERT_CMP(wstats(app).revision, ==, 9);
  push(app, "event: other\nid: 10\ndata: x\n\n"); /* other kinds: ignored */
  OM_ASSERT_CMP(app->delivered, ==, 1);

  /* the plane ends the stream: the reconnect resumes from 9 */
  om_http_request_on_close(app->stream, NULL);
  assert_int_equal(om_http_response_end(app->stream), 0);
  app->stream = NULL;
  SPIN_UNTIL(app, app->requests == 2 && app->stream != NULL, 5000);
  OM_ASSERT_CMP(app->requests, ==, 2);
  assert_string_equal(app->last_id, "9");

  assert_int_equal(om_watch_close(app->watch, on_watch_closed, app), 0);
  SPIN_UNTIL(app, app->watch_closed, 3000);
  assert_true(app->watch_closed);
  assert_int_equal(om_curl_uv_close(app->curl, on_curl_closed, app), 0);
  SPIN_UNTIL(app, app->curl_closed, 3000);
  if (app->stream != NULL) {
    om_http_request_on_close(app->stream, NULL);
    om_http_response_abort(app->stream);
  }
  assert_int_equal(om_http_server_close(app->srv, on_srv_closed), 0);
  SPIN_UNTIL(app, app->srv_closed, 3000);
  assert_int_equal(uv_run(&app->loop, UV_RUN_NOWAIT), 0);
  assert_int_equal(uv_loop_close(&app->loop), 0);
  free(app);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(revisions_and_resume),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
