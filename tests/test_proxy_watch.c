/*
 * test_proxy_watch.c: the data plane fed by the control plane's watch
 * stream, end to end on real loopback sockets, everything on one libuv
 * loop in this thread (what it proves: "a malformed snapshot pushed by a fake
 * control plane leaves routing on the last good one").
 *
 *   fake control plane (om_http_server, SSE written step by step)
 *     -> om_watch (om_curl_uv on the same loop)
 *     -> on_snapshot -> om_proxy_set_snapshot, wired exactly as
 *        `openmesh proxy --control` does (host/cli/cmd_proxy.c)
 *     -> om_proxy (policies/traffic.lua) -> upstreams A and B
 *
 * Every bad event is sent alone and the test waits until the watch has
 * judged it before calling through the proxy, so each check is about that
 * one event. Nothing is mocked.
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
#include "om_log.h"
#include "om_proxy.h"
#include "om_snapshot.h"
#include "om_watch.h"

#define SERVICE "orders"
#define CALLS 8 /* per check: P2C over one peer must pick it every time */

/* ------------------------------------------------------------------ */
/* upstreams: 200 with their name */

typedef struct up_s {
  om_http_server_t *srv;
  char name[8];
  char url[64];
  unsigned requests;
  int closed;
} up_t;

static void up_on_request(om_http_request_t *req, void *ud) {
  up_t *u = ud;
  static const om_http_header_t h[] = {{"content-type", "text/plain", 12, 10}};
  u->requests++;
  om_http_respond(req, 200, h, 1, u->name, strlen(u->name));
}

static void up_start(uv_loop_t *loop, up_t *u, const char *name) {
  memset(u, 0, sizeof *u);
  snprintf(u->name, sizeof u->name, "%s", name);
  assert_int_equal(om_http_server_new(loop, NULL, up_on_request, u, &u->srv),
                   0);
  assert_int_equal(om_http_server_listen(u->srv, "127.0.0.1", 0), 0);
  snprintf(u->url, sizeof u->url, "http://127.0.0.1:%d",
           om_http_server_port(u->srv));
}

static void up_closed(om_http_server_t *srv, void *ud) {
  (void)srv;
  ((up_t *)ud)->closed = 1;
}

/* ------------------------------------------------------------------ */
/* the fake control plane: holds the watch request open and writes what
 * the test tells it to */

typedef struct cp_s {
  om_http_server_t *srv;
  int port;
  om_http_request_t *stream; /* the held watch stream; NULL when gone */
  unsigned requests;
  char path[128];
  int closed;
} cp_t;

static void cp_on_gone(om_http_request_t *req) {
  cp_t *cp = req->user;
  cp->stream = NULL;
}

static void cp_on_request(om_http_request_t *req, void *ud) {
  cp_t *cp = ud;
  static const om_http_header_t h[] = {
      {"content-type", "text/event-stream", 12, 17}};
  cp->requests++;
  snprintf(cp->path, sizeof cp->path, "%.*s", (int)req->path_len, req->path);
  if (cp->stream != NULL ||
      strcmp(cp->path, "/v1/watch/services/" SERVICE) != 0) {
    om_http_respond(req, 404, NULL, 0, NULL, 0);
    return;
  }
  assert_int_equal(om_http_response_start(req, 200, h, 1), 0);
  req->user = cp;
  assert_int_equal(om_http_request_on_close(req, cp_on_gone), 0);
  cp->stream = req;
}

static void cp_closed(om_http_server_t *srv, void *ud) {
  (void)srv;
  ((cp_t *)ud)->closed = 1;
}

/* ------------------------------------------------------------------ */
/* the process under test, wired as host/cli/cmd_proxy.c wires it */

typedef struct app_s {
  uv_loop_t loop;
  om_proxy_t *proxy;
  om_curl_uv_t *curl;
  om_watch_t *watch;
  int stopping;
  /* observation only: what the proxy answered each delivery */
  unsigned delivered, refused;
  int last_rc;
  char last_err[512];
  int watch_closed, curl_closed, proxy_closed;
  up_t a, b;
  cp_t cp;
} app_t;

/* cmd_proxy.c's on_watch_check: the proxy's rules, before the watch
 * takes a snapshot as current. */
static int on_watch_check(void *ud, const om_snapshot_t *snap, char *err,
                          size_t errlen) {
  app_t *app = ud;
  return app->proxy != NULL
             ? om_proxy_check_snapshot(app->proxy, snap, err, errlen)
             : 0;
}

/* cmd_proxy.c's on_watch_snapshot, plus recording the outcome. */
static void on_watch_snapshot(void *ud, om_snapshot_t *snap) {
  app_t *app = ud;
  char err[512], rev[32];
  int rc;
  if (app->proxy == NULL || app->stopping)
    return;
  snprintf(rev, sizeof rev, "%llu",
           (unsigned long long)om_snapshot_revision(snap));
  app->delivered++;
  rc = om_proxy_set_snapshot(app->proxy, snap, err, sizeof err);
  app->last_rc = rc;
  if (rc != 0) {
    app->refused++;
    snprintf(app->last_err, sizeof app->last_err, "%s", err);
    om_log(OM_LOG_WARN, "snapshot_rejected", "service",
           om_snapshot_service(snap), "revision", rev, "error", err, NULL);
  }
}

static void on_watch_closed(void *ud) {
  ((app_t *)ud)->watch_closed = 1;
}

static void on_curl_closed(void *ud) {
  ((app_t *)ud)->curl_closed = 1;
}

static void on_proxy_closed(void *ud) {
  ((app_t *)ud)->proxy_closed = 1;
}

/* Turn the loop until cond holds or ms pass. */
#define SPIN_UNTIL(app, cond, ms)                                              \
  do {                                                                         \
    uint64_t t0_ = htc_now_ms();                                               \
    while (!(cond) && htc_now_ms() - t0_ < (uint64_t)(ms))                     \
      htc_step(&(app)->loop, NULL, 1);                                         \
  } while (0)

static om_watch_stats_t wstats(const app_t *app) {
  om_watch_stats_t s;
  memset(&s, 0xff, sizeof s);
  om_watch_stats(app->watch, &s);
  return s;
}

static om_proxy_stats_t pstats(const app_t *app) {
  om_proxy_stats_t s;
  memset(&s, 0xff, sizeof s);
  assert_int_equal(om_proxy_stats(app->proxy, SERVICE, &s), 0);
  return s;
}

static void app_start(app_t *app) {
  om_proxy_opts_t po;
  om_watch_opts_t wo;
  char err[512], control[64];
  memset(app, 0, sizeof *app);
  assert_int_equal(uv_loop_init(&app->loop), 0);
  up_start(&app->loop, &app->a, "A");
  up_start(&app->loop, &app->b, "B");
  assert_int_equal(om_http_server_new(&app->loop, NULL, cp_on_request, &app->cp,
                                      &app->cp.srv),
                   0);
  assert_int_equal(om_http_server_listen(app->cp.srv, "127.0.0.1", 0), 0);
  app->cp.port = om_http_server_port(app->cp.srv);

  memset(&po, 0, sizeof po);
  po.policy_path = OM_SOURCE_DIR "/policies/traffic.lua";
  po.seed = 42;
  po.server.drain_timeout_ms = 500;
  if (om_proxy_new(&app->loop, &po, &app->proxy, err, sizeof err) != 0)
    fail_msg("om_proxy_new: %s", err);
  assert_int_equal(om_proxy_listen(app->proxy, "127.0.0.1", 0), 0);

  /* cmd_proxy.c: the glue, then one watch per service, on_snapshot only */
  assert_int_equal(om_curl_uv_new(&app->loop, &app->curl), 0);
  snprintf(control, sizeof control, "http://127.0.0.1:%d", app->cp.port);
  wo = (om_watch_opts_t){.control_url = control,
                         .service = SERVICE,
                         .token = NULL,
                         .on_snapshot = on_watch_snapshot,
                         .check = on_watch_check,
                         .ud = app};
  assert_int_equal(om_watch_new(&app->loop, app->curl, &wo, &app->watch), 0);
  SPIN_UNTIL(app,
             app->cp.stream != NULL && wstats(app).state == OM_WATCH_STREAMING,
             3000);
  assert_non_null(app->cp.stream);
  assert_int_equal(wstats(app).state, OM_WATCH_STREAMING);
  assert_string_equal(app->cp.path, "/v1/watch/services/" SERVICE);
  /* no topology yet: the service is unknown to the proxy */
  {
    om_proxy_stats_t s;
    assert_int_equal(om_proxy_stats(app->proxy, SERVICE, &s), OM_ENOTFOUND);
  }
}

/* Close as cmd_proxy.c does: the watch, then the glue, then the proxy;
 * then the servers. The loop must end empty. */
static void app_stop(app_t *app) {
  app->stopping = 1;
  assert_int_equal(om_watch_close(app->watch, on_watch_closed, app), 0);
  SPIN_UNTIL(app, app->watch_closed, 3000);
  assert_true(app->watch_closed);
  app->watch = NULL;
  assert_int_equal(om_curl_uv_close(app->curl, on_curl_closed, app), 0);
  SPIN_UNTIL(app, app->curl_closed, 3000);
  assert_true(app->curl_closed);
  app->curl = NULL;
  assert_int_equal(om_proxy_close(app->proxy, on_proxy_closed, app), 0);
  SPIN_UNTIL(app, app->proxy_closed, 3000);
  assert_true(app->proxy_closed);
  app->proxy = NULL;
  if (app->cp.stream != NULL) {
    om_http_request_t *req = app->cp.stream;
    app->cp.stream = NULL;
    om_http_request_on_close(req, NULL);
    om_http_response_abort(req);
  }
  assert_int_equal(om_http_server_close(app->cp.srv, cp_closed), 0);
  assert_int_equal(om_http_server_close(app->a.srv, up_closed), 0);
  assert_int_equal(om_http_server_close(app->b.srv, up_closed), 0);
  SPIN_UNTIL(app, app->cp.closed && app->a.closed && app->b.closed, 3000);
  assert_true(app->cp.closed && app->a.closed && app->b.closed);
  assert_int_equal(uv_run(&app->loop, UV_RUN_NOWAIT), 0);
  assert_int_equal(uv_loop_close(&app->loop), 0);
}

/* ------------------------------------------------------------------ */
/* steps */

/* Write one SSE event on the held stream and wait until the watch has
 * dispatched it, then let the deferred on_snapshot timer run. */
static void push(app_t *app, const char *event) {
  uint64_t before = wstats(app).events;
  assert_non_null(app->cp.stream);
  assert_int_equal(om_http_response_write(app->cp.stream, event, strlen(event)),
                   0);
  SPIN_UNTIL(app, wstats(app).events > before, 3000);
  assert_int_equal(wstats(app).events, before + 1);
  /* on_snapshot runs from a loop timer right after the read */
  for (int i = 0; i < 5; i++)
    htc_step(&app->loop, NULL, 1);
}

static void snapshot_event(char *out, size_t cap, const char *svc, uint64_t rev,
                           const char *instances) {
  int n = snprintf(out, cap,
                   "event: snapshot\nid: %" PRIu64
                   "\ndata: {\"service\":\"%s\",\"revision\":%" PRIu64
                   ",\"instances\":[%s]}\n\n",
                   rev, svc, rev, instances);
  OM_ASSERT_CMP(n, >, 0);
  OM_ASSERT_CMP((size_t)n, <, cap);
}

static void instance(char *out, size_t cap, const char *id, const char *url) {
  int n = snprintf(out, cap,
                   "{\"id\":\"%s\",\"url\":\"%s\",\"weight\":1,"
                   "\"ttl_ms\":10000}",
                   id, url);
  OM_ASSERT_CMP(n, >, 0);
  OM_ASSERT_CMP((size_t)n, <, cap);
}

/* CALLS GETs through the proxy, each on a fresh connection with
 * Host: orders; every one must be answered 200 by want (and be counted
 * by want's server only). */
static void all_reach(app_t *app, up_t *want, up_t *other) {
  static htc_resp_t r;
  unsigned want0 = want->requests, other0 = other->requests;
  int port = om_proxy_port(app->proxy);
  char peer[16];
  OM_ASSERT_CMP(port, >, 0);
  for (int i = 0; i < CALLS; i++) {
    htc_t *c = htc_new("127.0.0.1", port);
    uint64_t t0 = htc_now_ms();
    int n = 0;
    assert_non_null(c);
    assert_int_equal(htc_sends(&app->loop, c,
                               "GET /v1/orders/42 HTTP/1.1\r\nHost: " SERVICE
                               "\r\nConnection: close\r\n\r\n"),
                     0);
    while (n == 0 && !c->eof && htc_now_ms() - t0 < 3000) {
      htc_step(&app->loop, c, 1);
      n = htc_responses(c, NULL, &r, 1);
    }
    if (n == 0)
      n = htc_responses(c, NULL, &r, 1);
    assert_int_equal(n, 1);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, want->name);
    assert_int_equal(htc_header(&r, "x-openmesh-peer", peer, sizeof peer), 0);
    htc_free(c);
  }
  assert_int_equal(want->requests, want0 + CALLS);
  assert_int_equal(other->requests, other0);
}

/* ------------------------------------------------------------------ */
/* the test */

static void bad_snapshots_leave_routing_on_the_last_good_one(void **state) {
  static app_t app;
  char ev[1024], ia[160], ib[160], ib2[160], ihttps[160], two[400];
  om_watch_stats_t ws;
  om_circuit_state_t cs;
  (void)state;
  app_start(&app);
  instance(ia, sizeof ia, "a", app.a.url);
  instance(ib, sizeof ib, "b", app.b.url);

  /* (1) rev 10, only A */
  snapshot_event(ev, sizeof ev, SERVICE, 10, ia);
  push(&app, ev);
  assert_int_equal(app.delivered, 1);
  assert_int_equal(app.last_rc, 0);
  assert_int_equal(pstats(&app).revision, 10);
  assert_int_equal(pstats(&app).peers, 1);
  assert_int_equal(om_proxy_peer_circuit(app.proxy, SERVICE, "a", &cs), 0);
  assert_int_equal(om_proxy_peer_circuit(app.proxy, SERVICE, "b", &cs),
                   OM_ENOTFOUND);
  all_reach(&app, &app.a, &app.b);

  /* (2) every bad event alone; after each, routing stays on rev 10 / A */

  /* malformed JSON */
  push(&app, "event: snapshot\nid: 12\ndata: {\"service\":\"" SERVICE
             "\",\"revision\":12,\"instances\":[\n\n");
  ws = wstats(&app);
  assert_int_equal(ws.rejected_malformed, 1);
  assert_int_equal(app.delivered, 1);
  assert_int_equal(pstats(&app).revision, 10);
  all_reach(&app, &app.a, &app.b);

  /* an older revision, with B */
  snapshot_event(ev, sizeof ev, SERVICE, 5, ib);
  push(&app, ev);
  ws = wstats(&app);
  assert_int_equal(ws.rejected_stale, 1);
  assert_int_equal(app.delivered, 1);
  assert_int_equal(pstats(&app).revision, 10);
  all_reach(&app, &app.a, &app.b);

  /* another service's snapshot, newer, with B */
  snapshot_event(ev, sizeof ev, "payments", 20, ib);
  push(&app, ev);
  ws = wstats(&app);
  assert_int_equal(ws.rejected_service, 1);
  assert_int_equal(app.delivered, 1);
  assert_int_equal(pstats(&app).revision, 10);
  all_reach(&app, &app.a, &app.b);

  /* a duplicate id (B twice, under one id) */
  instance(ib2, sizeof ib2, "b", app.a.url);
  snprintf(two, sizeof two, "%s,%s", ib, ib2);
  snapshot_event(ev, sizeof ev, SERVICE, 13, two);
  push(&app, ev);
  ws = wstats(&app);
  assert_int_equal(ws.rejected_malformed, 2);
  assert_int_equal(app.delivered, 1);
  assert_int_equal(pstats(&app).revision, 10);
  all_reach(&app, &app.a, &app.b);

  /* a peer by name: a valid snapshot document (the registry takes
   * names), refused by the proxy, whose upstream client takes addresses.
   * The watch asks the proxy (opts.check) before taking it as current, so
   * it keeps revision 10: a good snapshot at the same revision 11 later
   * is not mistaken for a duplicate of the refused one. */
  {
    char https[64];
    snprintf(https, sizeof https, "http://localhost:%d",
             om_http_server_port(app.b.srv));
    instance(ihttps, sizeof ihttps, "b", https);
  }
  snapshot_event(ev, sizeof ev, SERVICE, 11, ihttps);
  push(&app, ev);
  ws = wstats(&app);
  assert_int_equal(ws.rejected_refused, 1);
  assert_int_equal(ws.revision, 10);
  assert_non_null(strstr(ws.last_error, "names are not resolved"));
  assert_int_equal(app.delivered, 1); /* never handed over */
  assert_int_equal(app.refused, 0);
  assert_int_equal(pstats(&app).revision, 10);
  assert_int_equal(pstats(&app).peers, 1);
  assert_int_equal(om_proxy_peer_circuit(app.proxy, SERVICE, "b", &cs),
                   OM_ENOTFOUND);
  all_reach(&app, &app.a, &app.b);

  /* the watch judged every one, on one stream, with no reconnect */
  ws = wstats(&app);
  assert_int_equal(ws.events, 6);
  assert_int_equal(ws.rejected_malformed, 2);
  assert_int_equal(ws.rejected_stale, 1);
  assert_int_equal(ws.rejected_service, 1);
  assert_int_equal(ws.rejected_too_big, 0);
  assert_int_equal(ws.connects, 1);
  assert_int_equal(ws.reconnects, 0);
  assert_int_equal(ws.state, OM_WATCH_STREAMING);
  assert_int_equal(app.cp.requests, 1);

  /* (3) the next good revision, only B, at the refused one's 11: routing
   * moves */
  snapshot_event(ev, sizeof ev, SERVICE, 11, ib);
  push(&app, ev);
  assert_int_equal(app.delivered, 2);
  assert_int_equal(app.refused, 0);
  assert_int_equal(app.last_rc, 0);
  assert_int_equal(pstats(&app).revision, 11);
  assert_int_equal(pstats(&app).peers, 1);
  assert_int_equal(om_proxy_peer_circuit(app.proxy, SERVICE, "a", &cs),
                   OM_ENOTFOUND);
  assert_int_equal(om_proxy_peer_circuit(app.proxy, SERVICE, "b", &cs), 0);
  all_reach(&app, &app.b, &app.a);
  ws = wstats(&app);
  assert_int_equal(ws.revision, 11);
  assert_int_equal(ws.duplicates, 0);
  assert_int_equal(ws.events, 7);
  assert_int_equal(pstats(&app).requests, 7 * CALLS);
  assert_int_equal(app.a.requests, 6 * CALLS);
  assert_int_equal(app.b.requests, CALLS);

  app_stop(&app);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(bad_snapshots_leave_routing_on_the_last_good_one),
  };
  om_log_set_level(getenv("OM_TEST_LOG") != NULL ? OM_LOG_DEBUG : OM_LOG_ERROR);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
