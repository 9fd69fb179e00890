/*
 * test_watch.c: the topology watch client (host/proxy/om_watch.h) on real
 * loopback sockets, everything on one libuv loop in this thread: the real
 * control plane (om_control + the memory store) for the happy paths and
 * restarts, and a scripted fake control plane (om_http_server) for the
 * misbehaving ones. Each test owns its loop and closes it fully
 * (uv_loop_close must succeed, so nothing is left behind).
 */
#include "om_test.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "om_auth.h"
#include "om_control.h"
#include "om_curl_uv.h"
#include "om_errno.h"
#include "om_http_server.h"
#include "om_log.h"
#include "om_metrics.h"
#include "om_snapshot.h"
#include "om_sse.h"
#include "om_store_memory.h"
#include "om_watch.h"

/* ------------------------------------------------------------------ */
/* fixture */

/* One answer of the fake control plane, by request index (the last one
 * repeats). */
typedef struct chunk_s {
  const char *p;
  size_t n; /* 0: strlen */
} chunk_t;

#define MAX_CHUNKS 16
typedef struct step_s {
  int status;        /* 0: hold the request and never answer */
  const char *ctype; /* NULL: text/event-stream */
  chunk_t chunks[MAX_CHUNKS];
  int end;     /* end the response after the chunks (else hold it open) */
  int ping_ms; /* while held open: ": ping" every ping_ms */
} step_t;

typedef struct seen_s {
  uint64_t t_ms;
  int has_last_id;
  char last_id[32];
  char auth[80];
  char path[160];
  om_http_request_t *req; /* held open; NULL when answered or gone */
  int ping_ms;
  uint64_t next_ping;
} seen_t;

#define MAX_SEEN 64
#define MAX_REVS 64

typedef struct fx_s {
  uv_loop_t loop;
  uv_timer_t ticker;
  om_curl_uv_t *cu;
  /* the real control plane */
  om_store_t *store;
  om_control_t *ctl;
  int port;
  /* the fake one */
  om_http_server_t *fake;
  int fake_port;
  const step_t *script;
  size_t n_script;
  seen_t seen[MAX_SEEN];
  size_t n_seen;
  /* the watch and what it delivered */
  om_watch_t *w;
  uint64_t revs[MAX_REVS];
  size_t n_revs;
  size_t last_count; /* instances in the last delivered snapshot */
  int order_broken;  /* a delivered revision was not above the previous */
  int wrong_current; /* on_snapshot's snapshot was not om_watch_current */
  size_t n_errors;
  char last_reason[32];
  int close_in_snapshot;
  /* closings */
  int watch_closed, ctl_closed, store_closed, fake_closed, cu_closed;
} fx_t;

static uint64_t now_ms(void) {
  return uv_hrtime() / 1000000u;
}

static void on_tick(uv_timer_t *t) {
  fx_t *fx = t->data;
  uint64_t now = now_ms();
  for (size_t i = 0; i < fx->n_seen; i++) {
    seen_t *s = &fx->seen[i];
    if (s->req != NULL && s->ping_ms > 0 && now >= s->next_ping) {
      om_http_response_write(s->req, ": ping\n\n", 8);
      s->next_ping = now + (uint64_t)s->ping_ms;
    }
  }
}

/* Run the loop until cond holds or ms pass; the ticker keeps each turn
 * short. */
#define RUN_UNTIL(fx, cond, ms)                                                \
  do {                                                                         \
    uint64_t t0_ = now_ms();                                                   \
    while (!(cond) && now_ms() - t0_ < (uint64_t)(ms))                         \
      uv_run(&(fx)->loop, UV_RUN_ONCE);                                        \
  } while (0)

static void run_for(fx_t *fx, uint64_t ms) {
  uint64_t t0 = now_ms();
  while (now_ms() - t0 < ms)
    uv_run(&fx->loop, UV_RUN_ONCE);
}

static fx_t *fx_new(void) {
  fx_t *fx = calloc(1, sizeof *fx);
  assert_non_null(fx);
  assert_int_equal(uv_loop_init(&fx->loop), 0);
  assert_int_equal(uv_timer_init(&fx->loop, &fx->ticker), 0);
  fx->ticker.data = fx;
  assert_int_equal(uv_timer_start(&fx->ticker, on_tick, 5, 5), 0);
  assert_int_equal(om_curl_uv_new(&fx->loop, &fx->cu), 0);
  return fx;
}

/* ---- the real control plane ---- */

static void on_ctl_closed(void *ud) {
  ((fx_t *)ud)->ctl_closed = 1;
}

static void on_store_closed(void *ud) {
  ((fx_t *)ud)->store_closed = 1;
}

static void store_new(fx_t *fx) {
  fx->store_closed = 0;
  assert_int_equal(om_store_memory_new(&fx->loop, NULL, &fx->store), 0);
}

/* A control plane on the store, on port (0: any; then fx->port). Short
 * pings and retry so restarts are quick. */
static void ctl_new_auth(fx_t *fx, int port, om_auth_t *auth) {
  om_control_opts_t co;
  memset(&co, 0, sizeof co);
  co.store = fx->store;
  co.auth = auth;
  co.ping_interval_ms = 100;
  co.retry_ms = 20;
  fx->ctl_closed = 0;
  assert_int_equal(om_control_new(&fx->loop, &co, &fx->ctl), 0);
  assert_int_equal(om_control_listen(fx->ctl, "127.0.0.1", port), 0);
  fx->port = om_control_port(fx->ctl);
  OM_ASSERT_CMP(fx->port, >, 0);
}

static void ctl_new(fx_t *fx, int port) {
  ctl_new_auth(fx, port, NULL);
}

static void ctl_close(fx_t *fx) {
  if (fx->ctl == NULL)
    return;
  assert_int_equal(om_control_close(fx->ctl, on_ctl_closed, fx), 0);
  RUN_UNTIL(fx, fx->ctl_closed, 10000);
  assert_true(fx->ctl_closed);
  fx->ctl = NULL;
}

static void store_close(fx_t *fx) {
  if (fx->store == NULL)
    return;
  om_store_close(fx->store, on_store_closed, fx);
  RUN_UNTIL(fx, fx->store_closed, 5000);
  assert_true(fx->store_closed);
  fx->store = NULL;
}

static void on_put(void *ud, int status, om_store_change_t change,
                   uint64_t revision) {
  int *st = ud;
  (void)change;
  (void)revision;
  *st = status;
}

static void put(fx_t *fx, const char *svc, const char *id, const char *url) {
  om_instance_t in;
  int st = 1;
  memset(&in, 0, sizeof in);
  in.id = (char *)id;
  in.url = (char *)url;
  in.weight = 1.0;
  in.ttl_ms = 60000;
  assert_int_equal(om_store_put_instance(fx->store, svc, &in, on_put, &st), 0);
  RUN_UNTIL(fx, st != 1, 1000);
  assert_int_equal(st, 0);
}

static void del(fx_t *fx, const char *svc, const char *id) {
  int st = 1;
  assert_int_equal(om_store_delete_instance(fx->store, svc, id, on_put, &st),
                   0);
  RUN_UNTIL(fx, st != 1, 1000);
  assert_int_equal(st, 0);
}

/* ---- the fake control plane ---- */

static void on_seen_close(om_http_request_t *req) {
  seen_t *s = req->user;
  s->req = NULL;
}

static void hold(seen_t *s, om_http_request_t *req) {
  s->req = req;
  req->user = s;
  assert_int_equal(om_http_request_on_close(req, on_seen_close), 0);
}

static void copy_header(const om_http_request_t *req, const char *name,
                        char *out, size_t cap, int *has) {
  size_t n = 0;
  const char *v = om_http_request_header(req, name, &n);
  if (has != NULL)
    *has = v != NULL;
  snprintf(out, cap, "%.*s", v != NULL ? (int)n : 0, v != NULL ? v : "");
}

static void fake_handler(om_http_request_t *req, void *ud) {
  fx_t *fx = ud;
  const step_t *st;
  seen_t *s;
  om_http_header_t h[1];
  OM_ASSERT_CMP(fx->n_seen, <, MAX_SEEN);
  s = &fx->seen[fx->n_seen];
  st = &fx->script[fx->n_seen < fx->n_script ? fx->n_seen : fx->n_script - 1];
  fx->n_seen++;
  memset(s, 0, sizeof *s);
  s->t_ms = now_ms();
  copy_header(req, "last-event-id", s->last_id, sizeof s->last_id,
              &s->has_last_id);
  copy_header(req, "authorization", s->auth, sizeof s->auth, NULL);
  snprintf(s->path, sizeof s->path, "%.*s", (int)req->path_len, req->path);
  if (st->status == 0) {
    hold(s, req);
    return;
  }
  memset(h, 0, sizeof h);
  h[0].name = "Content-Type";
  h[0].value = st->ctype != NULL ? st->ctype : "text/event-stream";
  if (st->status != 200) {
    om_http_respond(req, st->status, h, 1, "{\"error\":\"nope\"}", 16);
    return;
  }
  assert_int_equal(om_http_response_start(req, 200, h, 1), 0);
  for (int i = 0; i < MAX_CHUNKS && st->chunks[i].p != NULL; i++) {
    size_t n = st->chunks[i].n ? st->chunks[i].n : strlen(st->chunks[i].p);
    assert_int_equal(om_http_response_write(req, st->chunks[i].p, n), 0);
  }
  if (st->end) {
    om_http_response_end(req);
    return;
  }
  hold(s, req);
  s->ping_ms = st->ping_ms;
  s->next_ping = now_ms() + (uint64_t)st->ping_ms;
}

static void fake_new(fx_t *fx, const step_t *script, size_t n) {
  fx->script = script;
  fx->n_script = n;
  assert_int_equal(
      om_http_server_new(&fx->loop, NULL, fake_handler, fx, &fx->fake), 0);
  assert_int_equal(om_http_server_listen(fx->fake, "127.0.0.1", 0), 0);
  fx->fake_port = om_http_server_port(fx->fake);
  OM_ASSERT_CMP(fx->fake_port, >, 0);
}

static void on_fake_closed(om_http_server_t *srv, void *ud) {
  (void)srv;
  ((fx_t *)ud)->fake_closed = 1;
}

static void fake_close(fx_t *fx) {
  if (fx->fake == NULL)
    return;
  for (size_t i = 0; i < fx->n_seen; i++) {
    om_http_request_t *req = fx->seen[i].req;
    if (req != NULL) {
      fx->seen[i].req = NULL;
      om_http_request_on_close(req, NULL);
      om_http_response_abort(req);
    }
  }
  assert_int_equal(om_http_server_close(fx->fake, on_fake_closed), 0);
  RUN_UNTIL(fx, fx->fake_closed, 10000);
  assert_true(fx->fake_closed);
  fx->fake = NULL;
}

/* ---- the watch ---- */

static void on_snapshot(void *ud, om_snapshot_t *snap) {
  fx_t *fx = ud;
  uint64_t rev = om_snapshot_revision(snap);
  if (fx->n_revs > 0 && rev <= fx->revs[fx->n_revs - 1])
    fx->order_broken = 1;
  if (snap != om_watch_current(fx->w))
    fx->wrong_current = 1;
  if (fx->n_revs < MAX_REVS)
    fx->revs[fx->n_revs++] = rev;
  fx->last_count = om_snapshot_count(snap);
  if (fx->close_in_snapshot)
    assert_int_equal(om_watch_close(fx->w, NULL, NULL), 0);
}

static void on_error(void *ud, const char *reason, const char *detail) {
  fx_t *fx = ud;
  assert_non_null(detail);
  fx->n_errors++;
  snprintf(fx->last_reason, sizeof fx->last_reason, "%s", reason);
}

static void on_watch_closed(void *ud) {
  ((fx_t *)ud)->watch_closed = 1;
}

static om_watch_opts_t opts_for(fx_t *fx, int port) {
  static char url[64];
  om_watch_opts_t o;
  memset(&o, 0, sizeof o);
  snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
  o.control_url = url;
  o.service = "web";
  o.backoff_base_ms = 10;
  o.backoff_cap_ms = 100;
  o.seed = 42;
  o.on_snapshot = on_snapshot;
  o.on_error = on_error;
  o.ud = fx;
  return o;
}

static void watch_start(fx_t *fx, const om_watch_opts_t *o) {
  fx->watch_closed = 0;
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, o, &fx->w), 0);
}

static void watch_close(fx_t *fx) {
  if (fx->w == NULL)
    return;
  assert_int_equal(om_watch_close(fx->w, on_watch_closed, fx), 0);
  assert_int_equal(fx->watch_closed, 0); /* never synchronously */
  RUN_UNTIL(fx, fx->watch_closed, 5000);
  assert_true(fx->watch_closed);
  fx->w = NULL;
}

static om_watch_stats_t stats(fx_t *fx) {
  om_watch_stats_t s;
  memset(&s, 0xff, sizeof s);
  om_watch_stats(fx->w, &s);
  return s;
}

static void on_cu_closed(void *ud) {
  ((fx_t *)ud)->cu_closed = 1;
}

static void fx_free(fx_t *fx) {
  watch_close(fx);
  ctl_close(fx);
  store_close(fx);
  fake_close(fx);
  assert_int_equal(om_curl_uv_close(fx->cu, on_cu_closed, fx), 0);
  uv_close((uv_handle_t *)&fx->ticker, NULL);
  uv_run(&fx->loop, UV_RUN_DEFAULT);
  assert_true(fx->cu_closed);
  assert_int_equal(uv_loop_close(&fx->loop), 0);
  free(fx);
}

/* A free loopback port, found by binding port 0 (nobody listens on it
 * once this returns). */
static int free_port(void) {
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM, 0), port;
  OM_ASSERT_CMP(fd, >=, 0);
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  port = ntohs(a.sin_port);
  close(fd);
  return port;
}

/* An SSE snapshot event; instances is the JSON array's inside. */
static char *snap_event(char *out, size_t cap, const char *svc, uint64_t rev,
                        const char *instances) {
  snprintf(out, cap,
           "event: snapshot\nid: %" PRIu64 "\ndata: {\"service\":\"%s\","
           "\"revision\":%" PRIu64 ",\"instances\":[%s]}\n\n",
           rev, svc, rev, instances);
  return out;
}

#define INST_A                                                                 \
  "{\"id\":\"a\",\"url\":\"http://10.0.0.1:80\",\"weight\":1,"                 \
  "\"ttl_ms\":10000}"
#define INST_B                                                                 \
  "{\"id\":\"b\",\"url\":\"http://10.0.0.2:80\",\"weight\":1,"                 \
  "\"ttl_ms\":10000}"

/* ------------------------------------------------------------------ */
/* options */

static void rejects_bad_options(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o = opts_for(fx, 1), b;
  om_watch_t *w = NULL;
  char longtok[OM_WATCH_TOKEN_MAX + 2];
  (void)state;
  assert_int_equal(om_watch_new(NULL, fx->cu, &o, &w), OM_EINVAL);
  assert_int_equal(om_watch_new(&fx->loop, NULL, &o, &w), OM_EINVAL);
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, NULL, &w), OM_EINVAL);
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &o, NULL), OM_EINVAL);
  const char *bad_urls[] = {
      "ftp://127.0.0.1", "http://",      "127.0.0.1:7600",  "http://h/x?y=1",
      "http://h/#f",     "http://u:p@h", "http://h/ space", "http://h:99999"};
  for (size_t i = 0; i < sizeof bad_urls / sizeof bad_urls[0]; i++) {
    b = o;
    b.control_url = bad_urls[i];
    if (om_watch_new(&fx->loop, fx->cu, &b, &w) != OM_EINVAL)
      fail_msg("url '%s' accepted", bad_urls[i]);
  }
  b = o;
  b.control_url = NULL;
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &b, &w), OM_EINVAL);
  const char *bad_services[] = {"", "a/b", "..", "sp ace", "caf\xc3\xa9"};
  for (size_t i = 0; i < sizeof bad_services / sizeof bad_services[0]; i++) {
    b = o;
    b.service = bad_services[i];
    if (om_watch_new(&fx->loop, fx->cu, &b, &w) != OM_EINVAL)
      fail_msg("service '%s' accepted", bad_services[i]);
  }
  b = o;
  b.service = NULL;
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &b, &w), OM_EINVAL);
  const char *bad_tokens[] = {"", "a\r\nX-Evil: 1", "sp ace", "t\x7f"};
  for (size_t i = 0; i < sizeof bad_tokens / sizeof bad_tokens[0]; i++) {
    b = o;
    b.token = bad_tokens[i];
    if (om_watch_new(&fx->loop, fx->cu, &b, &w) != OM_EINVAL)
      fail_msg("token %zu accepted", i);
  }
  memset(longtok, 'x', sizeof longtok - 1);
  longtok[sizeof longtok - 1] = '\0';
  b = o;
  b.token = longtok;
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &b, &w), OM_EINVAL);
  b = o;
  b.max_event_bytes = OM_SSE_MAX_EVENT_BYTES_LIMIT + 1;
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &b, &w), OM_EINVAL);
  b = o;
  b.heartbeat_ms = UINT64_MAX;
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &b, &w), OM_EINVAL);
  assert_null(w);
  assert_int_equal(om_curl_uv_active(fx->cu), 0);
  assert_int_equal(om_watch_close(NULL, NULL, NULL), OM_EINVAL);
  assert_string_equal(om_watch_state_name(OM_WATCH_STREAMING), "streaming");
  assert_string_equal(om_watch_state_name((om_watch_state_t)99), "?");
  fx_free(fx);
}

/* Fail the Nth allocation until om_watch_new passes: each failure is
 * OM_ENOMEM with nothing left on the loop or in the glue (uv_loop_close
 * in fx_free and ASan check that). */
static void new_fault_injection(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o = opts_for(fx, free_port());
  om_metrics_t *m = om_metrics_new();
  (void)state;
  assert_non_null(m);
  o.token = "tok";
  o.metrics = m;
  for (int n = 0;; n++) {
    om_watch_t *w = NULL;
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_watch_new(&fx->loop, fx->cu, &o, &w);
    om_test_alloc_reset();
    if (rc == 0) {
      OM_ASSERT_CMP(n, >, 0);
      fx->w = w;
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    assert_null(w);
    assert_int_equal(om_curl_uv_active(fx->cu), 0);
  }
  assert_string_equal(om_watch_service(fx->w), "web");
  assert_int_equal(stats(fx).state, OM_WATCH_CONNECTING);
  watch_close(fx);
  om_metrics_free(m);
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* against the real control plane */

static void first_snapshot_and_changes(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o;
  om_watch_stats_t s;
  om_metrics_t *m = om_metrics_new();
  char *text, *at;
  static const char rev_series[] = "openmesh_watch_revision{service=\"web\"} ";
  uint64_t r1;
  (void)state;
  assert_non_null(m);
  store_new(fx);
  ctl_new(fx, 0);
  o = opts_for(fx, fx->port);
  o.metrics = m;
  /* watching before the service exists: the stream waits for it */
  watch_start(fx, &o);
  RUN_UNTIL(fx, stats(fx).state == OM_WATCH_STREAMING, 2000);
  assert_int_equal(stats(fx).state, OM_WATCH_STREAMING);
  assert_null(om_watch_current(fx->w));
  put(fx, "web", "a", "http://127.0.0.1:9001");
  put(fx, "other", "x", "http://127.0.0.1:9009"); /* not ours */
  RUN_UNTIL(fx, fx->n_revs >= 1, 2000);
  assert_int_equal(fx->n_revs, 1);
  assert_int_equal(fx->last_count, 1);
  r1 = fx->revs[0];
  OM_ASSERT_CMP(r1, >, 0);
  assert_non_null(om_watch_current(fx->w));
  assert_int_equal(om_snapshot_revision(om_watch_current(fx->w)), r1);
  assert_string_equal(om_snapshot_service(om_watch_current(fx->w)), "web");
  assert_non_null(om_snapshot_find(om_watch_current(fx->w), "a"));
  /* a registration change brings a newer snapshot */
  put(fx, "web", "b", "http://127.0.0.1:9002");
  RUN_UNTIL(fx, fx->n_revs >= 2, 2000);
  assert_int_equal(fx->n_revs, 2);
  OM_ASSERT_CMP(fx->revs[1], >, r1);
  assert_int_equal(fx->last_count, 2);
  del(fx, "web", "a");
  RUN_UNTIL(fx, fx->n_revs >= 3, 2000);
  assert_int_equal(fx->n_revs, 3);
  assert_int_equal(fx->last_count, 1);
  assert_null(om_snapshot_find(om_watch_current(fx->w), "a"));
  assert_false(fx->order_broken);
  assert_false(fx->wrong_current);
  s = stats(fx);
  assert_int_equal(s.connects, 1);
  assert_int_equal(s.streams, 1);
  assert_int_equal(s.reconnects, 0);
  assert_int_equal(s.snapshots, 3);
  assert_int_equal(s.events, 3);
  assert_int_equal(s.rejected_malformed + s.rejected_stale +
                       s.rejected_service + s.rejected_too_big,
                   0);
  assert_int_equal(s.revision, fx->revs[2]);
  assert_int_equal(s.last_status, 200);
  assert_int_equal(fx->n_errors, 0);
  /* the metrics say the same */
  text = om_metrics_render(m, NULL);
  assert_non_null(text);
  assert_non_null(strstr(text, "openmesh_watch_events_total{service=\"web\","
                               "result=\"accepted\"} 3\n"));
  at = strstr(text, rev_series);
  assert_non_null(at);
  OM_ASSERT_CMP(strtod(at + sizeof rev_series - 1, NULL), ==,
                (double)fx->revs[2]);
  assert_non_null(
      strstr(text, "openmesh_watch_streaming{service=\"web\"} 1\n"));
  free(text);
  fx_free(fx);
  om_metrics_free(m);
}

/* The control plane restarts on the same port with the same state: the
 * watch resumes with Last-Event-ID and gets no duplicate; later changes
 * flow again. */
static void restart_resumes_without_duplicate(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o;
  om_watch_stats_t s;
  int port;
  uint64_t r;
  (void)state;
  store_new(fx);
  ctl_new(fx, 0);
  port = fx->port;
  put(fx, "web", "a", "http://127.0.0.1:9001");
  o = opts_for(fx, port);
  watch_start(fx, &o);
  RUN_UNTIL(fx, fx->n_revs >= 1, 2000);
  assert_int_equal(fx->n_revs, 1);
  r = fx->revs[0];
  ctl_close(fx); /* ends the stream cleanly: the watch sees EOF */
  RUN_UNTIL(fx, stats(fx).reconnects >= 2, 2000); /* EOF, then refused */
  s = stats(fx);
  OM_ASSERT_CMP(s.reconnects, >=, 2);
  OM_ASSERT_CMP(s.transport_errors, >=, 1);
  assert_int_not_equal(s.state, OM_WATCH_STREAMING);
  assert_ptr_not_equal(om_watch_current(fx->w), NULL); /* last good stays */
  ctl_new(fx, port);
  RUN_UNTIL(fx, stats(fx).state == OM_WATCH_STREAMING, 3000);
  s = stats(fx);
  assert_int_equal(s.state, OM_WATCH_STREAMING);
  assert_int_equal(s.streams, 2);
  run_for(fx, 100);
  s = stats(fx);
  /* the control plane had our revision: nothing was resent */
  assert_int_equal(s.events, 1);
  assert_int_equal(s.duplicates, 0);
  assert_int_equal(fx->n_revs, 1);
  put(fx, "web", "b", "http://127.0.0.1:9002");
  RUN_UNTIL(fx, fx->n_revs >= 2, 2000);
  assert_int_equal(fx->n_revs, 2);
  OM_ASSERT_CMP(fx->revs[1], >, r);
  assert_false(fx->order_broken);
  assert_string_equal(fx->last_reason, "transport");
  fx_free(fx);
}

/* A real restart of a memory control plane: the state is gone and comes
 * back as services re-register; revisions keep increasing, the watch
 * resumes and gets the new topology, and never an older revision. */
static void restart_with_new_store(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o;
  om_watch_stats_t s;
  int port = free_port();
  (void)state;
  store_new(fx);
  ctl_new(fx, port);
  assert_int_equal(fx->port, port);
  put(fx, "web", "a", "http://127.0.0.1:9001");
  put(fx, "web", "b", "http://127.0.0.1:9002");
  o = opts_for(fx, port);
  watch_start(fx, &o);
  RUN_UNTIL(fx, fx->n_revs >= 1 && fx->last_count == 2, 2000);
  assert_int_equal(fx->last_count, 2);
  ctl_close(fx);
  store_close(fx);
  run_for(fx, 50);
  store_new(fx);
  put(fx, "web", "c", "http://127.0.0.1:9003");
  ctl_new(fx, port);
  RUN_UNTIL(fx, fx->last_count == 1 && fx->n_revs >= 2, 3000);
  assert_int_equal(fx->last_count, 1);
  assert_non_null(om_snapshot_find(om_watch_current(fx->w), "c"));
  assert_null(om_snapshot_find(om_watch_current(fx->w), "a"));
  assert_false(fx->order_broken);
  s = stats(fx);
  OM_ASSERT_CMP(s.connects, >=, 2);
  assert_int_equal(s.rejected_stale, 0);
  assert_int_equal(s.state, OM_WATCH_STREAMING);
  fx_free(fx);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* Bearer tokens against the real control plane's auth. */
static void auth_with_real_control(void **state) {
  char path[] = "/tmp/om_test_watch_tokensXXXXXX", err[256];
  int fd = mkstemp(path);
  om_auth_t *auth = NULL;
  fx_t *fx = fx_new();
  om_watch_opts_t o;
  om_watch_stats_t s;
  (void)state;
  OM_ASSERT_CMP(fd, >=, 0);
  close(fd);
  write_file(path, "r-token read\ng-token register\n");
  assert_int_equal(om_auth_load(path, &auth, err, sizeof err), 0);
  unlink(path);
  store_new(fx);
  ctl_new_auth(fx, 0, auth);
  put(fx, "web", "a", "http://127.0.0.1:9001");
  /* without a token: 401, retried, nothing delivered */
  o = opts_for(fx, fx->port);
  o.backoff_cap_ms = 40;
  watch_start(fx, &o);
  RUN_UNTIL(fx, stats(fx).auth_errors >= 2, 2000);
  s = stats(fx);
  OM_ASSERT_CMP(s.auth_errors, >=, 2);
  assert_int_equal(s.last_status, 401);
  assert_int_equal(fx->n_revs, 0);
  assert_string_equal(fx->last_reason, "unauthorized");
  watch_close(fx);
  /* a token without the read role: 403 */
  o.token = "g-token";
  watch_start(fx, &o);
  RUN_UNTIL(fx, stats(fx).auth_errors >= 1, 2000);
  assert_int_equal(stats(fx).last_status, 403);
  watch_close(fx);
  /* the right one */
  o.token = "r-token";
  watch_start(fx, &o);
  RUN_UNTIL(fx, fx->n_revs >= 1, 2000);
  assert_int_equal(fx->n_revs, 1);
  assert_int_equal(stats(fx).auth_errors, 0);
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* against a misbehaving control plane */

static void only_valid_newer_snapshots_delivered(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o;
  om_watch_stats_t s;
  char v10[512], old5[512], eq10[512], other[512], v11[512], badurl[512],
      dupids[512];
  char *big = malloc(8192);
  static const char garbage[] =
      "\x00\xff\xfe garbage without a colon\n"
      ":::\n"
      "\x80\x81\x82\x83\r\n"
      "\n"
      "event: snapshot\ndata: \x80\x81 {not json\x00\n\n";
  (void)state;
  assert_non_null(big);
  snap_event(v10, sizeof v10, "web", 10, INST_A);
  snap_event(old5, sizeof old5, "web", 5, INST_A "," INST_B);
  snap_event(eq10, sizeof eq10, "web", 10, INST_A);
  snap_event(other, sizeof other, "api", 20, INST_A);
  snap_event(badurl, sizeof badurl, "web", 30,
             "{\"id\":\"a\",\"url\":\"ftp://x\",\"weight\":1,"
             "\"ttl_ms\":10000}");
  snap_event(dupids, sizeof dupids, "web", 31, INST_A "," INST_A);
  snap_event(v11, sizeof v11, "web", 11, INST_A "," INST_B);
  snprintf(big, 8192, "event: snapshot\nid: 40\ndata: ");
  memset(big + strlen(big), 'x', 8192 - strlen(big) - 3);
  memcpy(big + 8192 - 3, "\n\n", 3);
  step_t script[2];
  memset(script, 0, sizeof script);
  /* first connection: one good snapshot, then everything wrong; the
   * oversized event ends the stream */
  script[0].status = 200;
  script[0].chunks[0].p = v10;
  script[0].chunks[1].p = "event: snapshot\nid: 12\ndata: {\"service\":\"web\","
                          "\n\n"; /* malformed JSON */
  script[0].chunks[2].p = old5;
  script[0].chunks[3].p = eq10;
  script[0].chunks[4].p = other;
  script[0].chunks[5].p = badurl;
  script[0].chunks[6].p = dupids;
  script[0].chunks[7].p = "event: hello\ndata: from the future\n\n";
  script[0].chunks[8].p = big;
  script[0].chunks[9].p = v11; /* never read: the stream is dropped */
  /* second connection: garbage bytes, then a valid newer one */
  script[1].status = 200;
  script[1].chunks[0].p = garbage;
  script[1].chunks[0].n = sizeof garbage - 1;
  script[1].chunks[1].p = v11;
  fake_new(fx, script, 2);
  o = opts_for(fx, fx->fake_port);
  o.max_event_bytes = 4096;
  watch_start(fx, &o);
  RUN_UNTIL(fx, fx->n_revs >= 2, 3000);
  run_for(fx, 50);
  assert_int_equal(fx->n_revs, 2);
  assert_int_equal(fx->revs[0], 10);
  assert_int_equal(fx->revs[1], 11);
  assert_int_equal(fx->last_count, 2);
  assert_int_equal(om_snapshot_revision(om_watch_current(fx->w)), 11);
  s = stats(fx);
  assert_int_equal(s.snapshots, 2);
  assert_int_equal(s.rejected_malformed, 4); /* JSON, url, dup ids, garbage */
  assert_int_equal(s.rejected_stale, 1);
  assert_int_equal(s.duplicates, 1);
  assert_int_equal(s.rejected_service, 1);
  assert_int_equal(s.rejected_too_big, 1);
  assert_int_equal(s.ignored, 1);
  assert_int_equal(s.events, 10);
  assert_int_equal(s.connects, 2);
  assert_int_equal(s.reconnects, 1);
  assert_int_equal(s.state, OM_WATCH_STREAMING);
  /* the first request had nothing to resume; the second resumed from the
   * last GOOD revision, not the last event id seen (40, 31, ...) */
  assert_int_equal(fx->n_seen, 2);
  assert_false(fx->seen[0].has_last_id);
  assert_true(fx->seen[1].has_last_id);
  assert_string_equal(fx->seen[1].last_id, "10");
  assert_string_equal(fx->seen[0].path, "/v1/watch/services/web");
  assert_string_equal(fx->seen[0].auth, "");
  OM_ASSERT_CMP(fx->n_errors, >=, 1);
  assert_false(fx->order_broken);
  fx_free(fx);
  free(big);
}

/* No byte for 3 heartbeats: the stream is dead, the watch reconnects;
 * pings keep a stream alive. */
static void silence_reconnects_pings_keep_alive(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o;
  om_watch_stats_t s;
  char v10[512];
  step_t script[2];
  uint64_t gap;
  (void)state;
  snap_event(v10, sizeof v10, "web", 10, INST_A);
  memset(script, 0, sizeof script);
  script[0].status = 200; /* one snapshot, then silence */
  script[0].chunks[0].p = v10;
  script[1].status = 200; /* the resume: same revision, then pings */
  script[1].chunks[0].p = v10;
  script[1].ping_ms = 40;
  fake_new(fx, script, 2);
  o = opts_for(fx, fx->fake_port);
  o.heartbeat_ms = 100;
  watch_start(fx, &o);
  RUN_UNTIL(fx, fx->n_seen >= 2, 3000);
  assert_int_equal(fx->n_seen, 2);
  gap = fx->seen[1].t_ms - fx->seen[0].t_ms;
  OM_TEST_NOTE("silence detected and reconnected after %" PRIu64 " ms", gap);
  /* not before 3 heartbeats of silence (10 ms for the loop clock); at most
   * those, the backoff (cap 100) and room for a sanitized build on a
   * loaded machine: far under the 3 s a stream nobody watched would hang */
  OM_ASSERT_CMP(gap, >=, 290);
  OM_ASSERT_CMP(gap, <=, 300 + 100 + 600);
  assert_string_equal(fx->seen[1].last_id, "10");
  RUN_UNTIL(fx, stats(fx).state == OM_WATCH_STREAMING, 1000);
  run_for(fx, 600); /* 6 heartbeats, kept alive by pings */
  s = stats(fx);
  assert_int_equal(s.silent, 1);
  assert_int_equal(s.connects, 2);
  assert_int_equal(s.duplicates, 1);
  assert_int_equal(s.state, OM_WATCH_STREAMING);
  assert_int_equal(fx->n_revs, 1);
  assert_int_equal(fx->n_seen, 2);
  fx_free(fx);
}

/* HTTP errors and a wrong content type are retried with backoff until a
 * stream comes. */
static void http_errors_then_stream(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o;
  om_watch_stats_t s;
  char v10[512];
  step_t script[5];
  (void)state;
  snap_event(v10, sizeof v10, "web", 10, INST_A);
  memset(script, 0, sizeof script);
  script[0].status = 500;
  script[1].status = 404; /* the service does not exist yet */
  script[2].status = 503;
  script[3].status = 200;
  script[3].ctype = "text/plain";
  script[3].chunks[0].p = v10; /* not an event stream: not read */
  script[4].status = 200;
  script[4].chunks[0].p = v10;
  fake_new(fx, script, 5);
  o = opts_for(fx, fx->fake_port);
  watch_start(fx, &o);
  RUN_UNTIL(fx, fx->n_revs >= 1, 3000);
  assert_int_equal(fx->n_revs, 1);
  s = stats(fx);
  assert_int_equal(s.connects, 5);
  assert_int_equal(s.streams, 1);
  assert_int_equal(s.http_errors, 4);
  assert_int_equal(s.auth_errors, 0);
  assert_int_equal(s.reconnects, 4);
  assert_int_equal(s.last_status, 200);
  assert_int_equal(s.events, 1);
  /* every retry after the first resumed nothing: no good revision yet */
  for (size_t i = 0; i < 5; i++)
    assert_false(fx->seen[i].has_last_id);
  /* full-jitter waits under ceilings 10, 20, 40, 80 ms: all four sum
   * below 10 ms with probability < 0.1% (and the seed is fixed) */
  OM_ASSERT_CMP(fx->seen[4].t_ms - fx->seen[0].t_ms, >=, 10);
  fx_free(fx);
}

/* 401/403 wait between half the cap and the cap, and the token is sent. */
static void auth_errors_wait_at_cap(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o;
  char v10[512];
  step_t script[3];
  (void)state;
  snap_event(v10, sizeof v10, "web", 10, INST_A);
  memset(script, 0, sizeof script);
  script[0].status = 401;
  script[1].status = 403;
  script[2].status = 200;
  script[2].chunks[0].p = v10;
  fake_new(fx, script, 3);
  o = opts_for(fx, fx->fake_port);
  o.token = "s3cret.token-1";
  o.backoff_cap_ms = 200;
  watch_start(fx, &o);
  RUN_UNTIL(fx, fx->n_revs >= 1, 3000);
  assert_int_equal(fx->n_revs, 1);
  assert_int_equal(fx->n_seen, 3);
  for (size_t i = 0; i < 3; i++)
    assert_string_equal(fx->seen[i].auth, "Bearer s3cret.token-1");
  for (size_t i = 1; i < 3; i++) {
    uint64_t gap = fx->seen[i].t_ms - fx->seen[i - 1].t_ms;
    OM_TEST_NOTE("auth retry %zu after %" PRIu64 " ms", i, gap);
    /* never sooner than the 100 ms floor; at most the 200 ms cap and room
     * for a sanitized build on a loaded machine */
    OM_ASSERT_CMP(gap, >=, 99);
    OM_ASSERT_CMP(gap, <=, 200 + 600);
  }
  assert_int_equal(stats(fx).auth_errors, 2);
  fx_free(fx);
}

/* The stream's `retry:` is a floor on the reconnect delay, clamped to the
 * backoff cap. */
static void retry_field_is_the_floor(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o;
  char v10[512], v11[512];
  step_t script[3];
  uint64_t gap1, gap2;
  (void)state;
  snap_event(v10, sizeof v10, "web", 10, INST_A);
  snap_event(v11, sizeof v11, "web", 11, INST_A);
  memset(script, 0, sizeof script);
  script[0].status = 200;
  script[0].chunks[0].p = "retry: 250\n\n";
  script[0].chunks[1].p = v10;
  script[0].end = 1; /* EOF */
  script[1].status = 200;
  script[1].chunks[0].p = "retry: 100000\n\n"; /* beyond the cap */
  script[1].end = 1;
  script[2].status = 200;
  script[2].chunks[0].p = v11;
  fake_new(fx, script, 3);
  o = opts_for(fx, fx->fake_port);
  o.backoff_cap_ms = 400;
  watch_start(fx, &o);
  RUN_UNTIL(fx, fx->n_revs >= 2, 4000);
  assert_int_equal(fx->n_revs, 2);
  assert_int_equal(fx->n_seen, 3);
  gap1 = fx->seen[1].t_ms - fx->seen[0].t_ms;
  gap2 = fx->seen[2].t_ms - fx->seen[1].t_ms;
  OM_TEST_NOTE("reconnects after %" PRIu64 " ms (retry 250) and %" PRIu64
               " ms (retry 100000, cap 400)",
               gap1, gap2);
  /* the floors: retry 250, and 100000 clamped to the 400 cap, never
   * sooner; the upper bounds say the cap held (100 s would time out the
   * run), with room for a sanitized build on a loaded machine */
  OM_ASSERT_CMP(gap1, >=, 245);
  OM_ASSERT_CMP(gap1, <=, 400 + 600);
  OM_ASSERT_CMP(gap2, >=, 395);
  OM_ASSERT_CMP(gap2, <=, 400 + 600);
  assert_string_equal(fx->seen[1].last_id, "10");
  assert_string_equal(fx->seen[2].last_id, "10");
  assert_string_equal(fx->last_reason, "eof");
  fx_free(fx);
}

/* An allocation failure while decoding an event must not lose it: the
 * stream is dropped and the resume brings the snapshot again. */
static void decode_oom_resumes(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o;
  om_watch_stats_t s;
  char v10[512], v11[512];
  step_t script[2];
  (void)state;
  snap_event(v10, sizeof v10, "web", 10, INST_A);
  snap_event(v11, sizeof v11, "web", 11, INST_A "," INST_B);
  memset(script, 0, sizeof script);
  /* held, silent until the test writes; `retry` keeps the reconnect
   * well after the failure window (UV_RUN_ONCE may run due timers twice) */
  script[0].status = 200;
  script[0].chunks[0].p = "retry: 300\n\n";
  script[1].status = 200;
  script[1].chunks[0].p = v11;
  fake_new(fx, script, 2);
  o = opts_for(fx, fx->fake_port);
  watch_start(fx, &o);
  RUN_UNTIL(fx, stats(fx).state == OM_WATCH_STREAMING, 2000);
  assert_int_equal(stats(fx).state, OM_WATCH_STREAMING);
  assert_non_null(fx->seen[0].req);
  assert_int_equal(om_http_response_write(fx->seen[0].req, v10, strlen(v10)),
                   0);
  om_test_fail_alloc_after(0);
  RUN_UNTIL(fx, stats(fx).reconnects >= 1, 2000);
  om_test_alloc_reset();
  s = stats(fx);
  assert_int_equal(s.reconnects, 1);
  assert_int_equal(s.snapshots, 0);
  assert_int_equal(s.rejected_malformed, 0); /* not the server's fault */
  assert_string_equal(fx->last_reason, "no_memory");
  RUN_UNTIL(fx, fx->n_revs >= 1, 2000);
  assert_int_equal(fx->n_revs, 1);
  assert_int_equal(fx->revs[0], 11);
  assert_false(fx->seen[1].has_last_id);
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* closing in every state */

static void close_while_connecting(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o;
  step_t script[1];
  uint64_t gap;
  (void)state;
  memset(script, 0, sizeof script); /* status 0: never answer */
  fake_new(fx, script, 1);
  o = opts_for(fx, fx->fake_port);
  o.heartbeat_ms = 100;
  watch_start(fx, &o);
  /* a request that never gets an answer is silence too */
  RUN_UNTIL(fx, fx->n_seen >= 2, 3000);
  assert_int_equal(fx->n_seen, 2);
  gap = fx->seen[1].t_ms - fx->seen[0].t_ms;
  OM_ASSERT_CMP(gap, >=, 290);
  assert_int_equal(stats(fx).silent, 1);
  assert_int_equal(stats(fx).state, OM_WATCH_CONNECTING);
  assert_int_equal(om_curl_uv_active(fx->cu), 1);
  watch_close(fx);
  assert_int_equal(om_curl_uv_active(fx->cu), 0);
  fx_free(fx);
}

static void close_during_backoff(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o = opts_for(fx, free_port()); /* nobody listens */
  om_watch_stats_t s;
  (void)state;
  o.backoff_base_ms = 1000;
  o.backoff_cap_ms = 1000;
  watch_start(fx, &o);
  RUN_UNTIL(fx, stats(fx).state == OM_WATCH_BACKOFF, 2000);
  s = stats(fx);
  assert_int_equal(s.state, OM_WATCH_BACKOFF);
  assert_int_equal(s.transport_errors, 1);
  assert_string_equal(fx->last_reason, "transport");
  OM_ASSERT_CMP(strlen(s.last_error), >, 0);
  assert_int_equal(om_watch_close(fx->w, on_watch_closed, fx), 0);
  assert_int_equal(om_watch_close(fx->w, on_watch_closed, fx), OM_ESTATE);
  RUN_UNTIL(fx, fx->watch_closed, 2000);
  assert_true(fx->watch_closed);
  fx->w = NULL;
  fx_free(fx);
}

static void close_while_streaming_and_from_callback(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o;
  char v10[512], v11[512];
  step_t script[1];
  (void)state;
  snap_event(v10, sizeof v10, "web", 10, INST_A);
  snap_event(v11, sizeof v11, "web", 11, INST_A);
  memset(script, 0, sizeof script);
  script[0].status = 200;
  script[0].chunks[0].p = v10;
  script[0].ping_ms = 20;
  fake_new(fx, script, 1);
  o = opts_for(fx, fx->fake_port);
  /* close while streaming, events flowing */
  watch_start(fx, &o);
  RUN_UNTIL(fx, fx->n_revs >= 1, 2000);
  assert_int_equal(stats(fx).state, OM_WATCH_STREAMING);
  watch_close(fx);
  assert_int_equal(om_curl_uv_active(fx->cu), 0);
  /* close from inside on_snapshot: no later callback, freed cleanly */
  fx->n_revs = 0;
  fx->close_in_snapshot = 1;
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &o, &fx->w), 0);
  RUN_UNTIL(fx, fx->n_revs >= 1, 2000);
  assert_int_equal(fx->n_revs, 1);
  OM_ASSERT_CMP(fx->n_seen, >, 0);
  assert_non_null(fx->seen[fx->n_seen - 1].req);
  om_http_response_write(fx->seen[fx->n_seen - 1].req, v11, strlen(v11));
  run_for(fx, 100);
  assert_int_equal(fx->n_revs, 1);
  assert_int_equal(om_curl_uv_active(fx->cu), 0);
  fx->w = NULL; /* freed by now; nothing else to close */
  fx_free(fx);
}

/* om_watch_close from inside a libcurl callback (another transfer's write
 * function on the same glue): the cancel is deferred to the loop, the
 * watch still closes completely. */
static size_t closing_write(char *data, size_t size, size_t nmemb, void *ud) {
  fx_t *fx = ud;
  (void)data;
  if (fx->w != NULL) {
    assert_int_equal(om_watch_close(fx->w, on_watch_closed, fx), 0);
    fx->w = NULL;
  }
  return size * nmemb;
}

static void never_done(void *ud, CURL *easy, CURLcode result) {
  (void)ud;
  (void)easy;
  (void)result;
  fail_msg("the raw transfer was cancelled, it cannot complete");
}

static void close_from_inside_libcurl(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o;
  char v10[512], url[96];
  step_t script[1];
  CURL *raw = curl_easy_init();
  (void)state;
  assert_non_null(raw);
  snap_event(v10, sizeof v10, "web", 10, INST_A);
  memset(script, 0, sizeof script);
  script[0].status = 200;
  script[0].chunks[0].p = v10;
  fake_new(fx, script, 1);
  o = opts_for(fx, fx->fake_port);
  watch_start(fx, &o);
  RUN_UNTIL(fx, fx->n_revs >= 1, 2000);
  assert_int_equal(stats(fx).state, OM_WATCH_STREAMING);
  snprintf(url, sizeof url, "http://127.0.0.1:%d/raw", fx->fake_port);
  curl_easy_setopt(raw, CURLOPT_URL, url);
  curl_easy_setopt(raw, CURLOPT_WRITEFUNCTION, closing_write);
  curl_easy_setopt(raw, CURLOPT_WRITEDATA, fx);
  assert_int_equal(om_curl_uv_add(fx->cu, raw, never_done, fx), 0);
  RUN_UNTIL(fx, fx->watch_closed, 2000);
  assert_true(fx->watch_closed);
  assert_null(fx->w);
  assert_int_equal(fx->n_revs, 1);
  assert_int_equal(om_curl_uv_active(fx->cu), 1); /* only the raw one */
  assert_int_equal(om_curl_uv_cancel(fx->cu, raw), 0);
  curl_easy_cleanup(raw);
  fx_free(fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(rejects_bad_options),
      cmocka_unit_test(new_fault_injection),
      cmocka_unit_test(first_snapshot_and_changes),
      cmocka_unit_test(restart_resumes_without_duplicate),
      cmocka_unit_test(restart_with_new_store),
      cmocka_unit_test(auth_with_real_control),
      cmocka_unit_test(only_valid_newer_snapshots_delivered),
      cmocka_unit_test(silence_reconnects_pings_keep_alive),
      cmocka_unit_test(http_errors_then_stream),
      cmocka_unit_test(auth_errors_wait_at_cap),
      cmocka_unit_test(retry_field_is_the_floor),
      cmocka_unit_test(decode_oom_resumes),
      cmocka_unit_test(close_while_connecting),
      cmocka_unit_test(close_during_backoff),
      cmocka_unit_test(close_while_streaming_and_from_callback),
      cmocka_unit_test(close_from_inside_libcurl),
  };
  om_log_set_level(getenv("OM_TEST_LOG") != NULL ? OM_LOG_DEBUG : OM_LOG_ERROR);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
