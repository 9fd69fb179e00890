/*
 * test_watch_failover.c: a topology watch (host/proxy/om_watch.h) given
 * several control planes, on real loopback sockets, one libuv loop in this
 * thread: two real control planes (om_control) sharing one memory store,
 * as two processes share Redis, and scripted fake planes (om_http_server)
 * that answer one fixed status or never answer. What is checked: the move
 * to the next plane on EOF, 5xx and silence; the resume there without a
 * duplicate; no backoff between the planes of a round and a backoff after
 * it; staying on a plane that answers 404; the options.
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

#include "om_control.h"
#include "om_curl_uv.h"
#include "om_errno.h"
#include "om_http_server.h"
#include "om_log.h"
#include "om_metrics.h"
#include "om_snapshot.h"
#include "om_store_memory.h"
#include "om_watch.h"

#define MAX_SEEN 128
#define MAX_FAKES 2

typedef struct fake_s {
  struct fx_s *fx;
  om_http_server_t *srv;
  int port;
  int status; /* 0: hold every request, never answer */
  om_http_request_t *held[MAX_SEEN];
  size_t n_held;
} fake_t;

typedef struct seen_s {
  int plane; /* index of the fake */
  uint64_t t_ms;
} seen_t;

typedef struct fx_s {
  uv_loop_t loop;
  uv_timer_t ticker;
  om_curl_uv_t *cu;
  om_store_t *store;
  om_control_t *ctl[2];
  int ctl_port[2];
  fake_t fakes[MAX_FAKES];
  seen_t seen[MAX_SEEN];
  size_t n_seen;
  om_watch_t *w;
  uint64_t revs[64];
  size_t n_revs;
  int closed; /* callbacks of closes, counted */
} fx_t;

static uint64_t now_ms(void) {
  return uv_hrtime() / 1000000u;
}

static void on_tick(uv_timer_t *t) {
  (void)t; /* wakes uv_run(UV_RUN_ONCE) */
}

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

static void on_closed(void *ud) {
  ((fx_t *)ud)->closed++;
}

static fx_t *fx_new(void) {
  fx_t *fx = calloc(1, sizeof *fx);
  assert_non_null(fx);
  assert_int_equal(uv_loop_init(&fx->loop), 0);
  assert_int_equal(uv_timer_init(&fx->loop, &fx->ticker), 0);
  assert_int_equal(uv_timer_start(&fx->ticker, on_tick, 5, 5), 0);
  assert_int_equal(om_curl_uv_new(&fx->loop, &fx->cu), 0);
  return fx;
}

/* ---- two real planes on one store ---- */

static void planes_new(fx_t *fx) {
  assert_int_equal(om_store_memory_new(&fx->loop, NULL, &fx->store), 0);
  for (int i = 0; i < 2; i++) {
    om_control_opts_t co;
    memset(&co, 0, sizeof co);
    co.store = fx->store;
    co.ping_interval_ms = 100;
    co.retry_ms = 20;
    assert_int_equal(om_control_new(&fx->loop, &co, &fx->ctl[i]), 0);
    assert_int_equal(om_control_listen(fx->ctl[i], "127.0.0.1", 0), 0);
    fx->ctl_port[i] = om_control_port(fx->ctl[i]);
    OM_ASSERT_CMP(fx->ctl_port[i], >, 0);
  }
}

static void plane_close(fx_t *fx, int i) {
  int want = fx->closed + 1;
  if (fx->ctl[i] == NULL)
    return;
  assert_int_equal(om_control_close(fx->ctl[i], on_closed, fx), 0);
  RUN_UNTIL(fx, fx->closed >= want, 10000);
  OM_ASSERT_CMP(fx->closed, >=, want);
  fx->ctl[i] = NULL;
}

static void on_put(void *ud, int status, om_store_change_t change,
                   uint64_t revision) {
  (void)change;
  (void)revision;
  *(int *)ud = status;
}

static void put(fx_t *fx, const char *id, const char *url) {
  om_instance_t in;
  int st = 1;
  memset(&in, 0, sizeof in);
  in.id = (char *)id;
  in.url = (char *)url;
  in.weight = 1.0;
  in.ttl_ms = 60000;
  assert_int_equal(om_store_put_instance(fx->store, "web", &in, on_put, &st),
                   0);
  RUN_UNTIL(fx, st != 1, 1000);
  assert_int_equal(st, 0);
}

/* ---- fake planes ---- */

static void on_held_close(om_http_request_t *req) {
  fake_t *f = req->user;
  for (size_t i = 0; i < f->n_held; i++)
    if (f->held[i] == req)
      f->held[i] = NULL;
}

static void fake_handler(om_http_request_t *req, void *ud) {
  fake_t *f = ud;
  fx_t *fx = f->fx;
  om_http_header_t h[1] = {{"Content-Type", "application/json", 0, 0}};
  OM_ASSERT_CMP(fx->n_seen, <, MAX_SEEN);
  fx->seen[fx->n_seen].plane = (int)(f - fx->fakes);
  fx->seen[fx->n_seen].t_ms = now_ms();
  fx->n_seen++;
  if (f->status == 0) {
    OM_ASSERT_CMP(f->n_held, <, MAX_SEEN);
    req->user = f;
    f->held[f->n_held++] = req;
    assert_int_equal(om_http_request_on_close(req, on_held_close), 0);
    return;
  }
  om_http_respond(req, f->status, h, 1, "{\"error\":\"nope\"}", 16);
}

static int fake_new(fx_t *fx, int i, int status) {
  fake_t *f = &fx->fakes[i];
  f->fx = fx;
  f->status = status;
  assert_int_equal(
      om_http_server_new(&fx->loop, NULL, fake_handler, f, &f->srv), 0);
  assert_int_equal(om_http_server_listen(f->srv, "127.0.0.1", 0), 0);
  f->port = om_http_server_port(f->srv);
  OM_ASSERT_CMP(f->port, >, 0);
  return f->port;
}

static void on_fake_closed(om_http_server_t *srv, void *ud) {
  (void)srv;
  ((fake_t *)ud)->fx->closed++; /* ud: the handler's, the fake */
}

static void fake_close(fx_t *fx, int i) {
  fake_t *f = &fx->fakes[i];
  int want = fx->closed + 1;
  if (f->srv == NULL)
    return;
  for (size_t k = 0; k < f->n_held; k++)
    if (f->held[k] != NULL) {
      om_http_request_on_close(f->held[k], NULL);
      om_http_response_abort(f->held[k]);
      f->held[k] = NULL;
    }
  assert_int_equal(om_http_server_close(f->srv, on_fake_closed), 0);
  RUN_UNTIL(fx, fx->closed >= want, 10000);
  f->srv = NULL;
}

/* ---- the watch ---- */

static void on_snapshot(void *ud, om_snapshot_t *snap) {
  fx_t *fx = ud;
  if (fx->n_revs < 64)
    fx->revs[fx->n_revs++] = om_snapshot_revision(snap);
}

static char urls[4][64];
static const char *url_ptrs[4];

/* Options for a watch of "web" on the given ports, in that order. */
static om_watch_opts_t opts_for(fx_t *fx, const int *ports, size_t n) {
  om_watch_opts_t o;
  memset(&o, 0, sizeof o);
  for (size_t i = 0; i < n; i++) {
    snprintf(urls[i], sizeof urls[i], "http://127.0.0.1:%d", ports[i]);
    url_ptrs[i] = urls[i];
  }
  o.control_urls = url_ptrs;
  o.n_control_urls = n;
  o.service = "web";
  o.backoff_base_ms = 10;
  o.backoff_cap_ms = 100;
  o.seed = 42;
  o.on_snapshot = on_snapshot;
  o.ud = fx;
  return o;
}

static om_watch_stats_t stats(fx_t *fx) {
  om_watch_stats_t s;
  memset(&s, 0xff, sizeof s);
  om_watch_stats(fx->w, &s);
  return s;
}

static void fx_free(fx_t *fx) {
  if (fx->w != NULL) {
    int want = fx->closed + 1;
    assert_int_equal(om_watch_close(fx->w, on_closed, fx), 0);
    RUN_UNTIL(fx, fx->closed >= want, 5000);
    OM_ASSERT_CMP(fx->closed, >=, want);
  }
  plane_close(fx, 0);
  plane_close(fx, 1);
  if (fx->store != NULL) {
    int want = fx->closed + 1;
    om_store_close(fx->store, on_closed, fx);
    RUN_UNTIL(fx, fx->closed >= want, 5000);
  }
  for (int i = 0; i < MAX_FAKES; i++)
    fake_close(fx, i);
  assert_int_equal(om_curl_uv_close(fx->cu, NULL, NULL), 0);
  uv_close((uv_handle_t *)&fx->ticker, NULL);
  uv_run(&fx->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&fx->loop), 0);
  free(fx);
}

/* A free loopback port (nobody listens on it once this returns). */
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

/* ------------------------------------------------------------------ */

static void rejects_bad_plane_lists(void **state) {
  fx_t *fx = fx_new();
  int ports[2] = {1, 2};
  om_watch_opts_t o = opts_for(fx, ports, 2), b;
  const char *dup[] = {"http://127.0.0.1:1", "http://127.0.0.1:1/"};
  const char *bad[] = {"http://127.0.0.1:1", "ftp://127.0.0.1:2"};
  const char *hole[] = {"http://127.0.0.1:1", NULL};
  const char *many[OM_WATCH_MAX_PLANES + 1];
  char many_urls[OM_WATCH_MAX_PLANES + 1][32];
  (void)state;
  b = o;
  b.control_urls = dup;
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &b, &fx->w), OM_EINVAL);
  b.control_urls = bad;
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &b, &fx->w), OM_EINVAL);
  b.control_urls = hole;
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &b, &fx->w), OM_EINVAL);
  b = o;
  b.control_url = "http://127.0.0.1:3"; /* and a list: which one? */
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &b, &fx->w), OM_EINVAL);
  for (size_t i = 0; i <= OM_WATCH_MAX_PLANES; i++) {
    snprintf(many_urls[i], sizeof many_urls[i], "http://127.0.0.1:%zu",
             1000 + i);
    many[i] = many_urls[i];
  }
  b = o;
  b.control_urls = many;
  b.n_control_urls = OM_WATCH_MAX_PLANES + 1;
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &b, &fx->w), OM_EINVAL);
  assert_null(fx->w);
  assert_int_equal(om_curl_uv_active(fx->cu), 0);
  /* the most allowed is fine */
  b.n_control_urls = OM_WATCH_MAX_PLANES;
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &b, &fx->w), 0);
  assert_string_equal(om_watch_control_url(fx->w), many_urls[0]);
  fx_free(fx);
}

/* The plane in use ends its streams (it stops): the watch is on the other
 * one at once, resumes with the revision it holds, gets nothing again,
 * and sees later changes there. */
static void moves_and_resumes_without_duplicate(void **state) {
  fx_t *fx = fx_new();
  om_metrics_t *m = om_metrics_new();
  om_watch_opts_t o;
  om_watch_stats_t s;
  char *text, line[160];
  size_t len;
  uint64_t t_close;
  (void)state;
  assert_non_null(m);
  planes_new(fx);
  put(fx, "a", "http://127.0.0.1:9001");
  o = opts_for(fx, fx->ctl_port, 2);
  o.metrics = m;
  /* a wait that would show: a backoff, had there been one, is >= 0.5 s
   * with probability 1 - 500/3000 per try (and the seed is fixed) */
  o.backoff_base_ms = 3000;
  o.backoff_cap_ms = 3000;
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &o, &fx->w), 0);
  RUN_UNTIL(fx, fx->n_revs >= 1 && stats(fx).state == OM_WATCH_STREAMING, 2000);
  assert_int_equal(fx->n_revs, 1);
  assert_int_equal(stats(fx).plane, 0);
  t_close = now_ms();
  plane_close(fx, 0);
  RUN_UNTIL(fx, stats(fx).plane == 1 && stats(fx).state == OM_WATCH_STREAMING,
            3000);
  s = stats(fx);
  OM_TEST_NOTE("streaming on the second plane %" PRIu64 " ms after the close",
               now_ms() - t_close);
  assert_int_equal(s.state, OM_WATCH_STREAMING);
  assert_int_equal(s.plane, 1);
  assert_int_equal(s.failovers, 1);
  assert_int_equal(s.streams, 2);
  assert_int_equal(s.connects, 2);
  OM_ASSERT_CMP(now_ms() - t_close, <, 500);
  assert_string_equal(om_watch_control_url(fx->w), urls[1]);
  run_for(fx, 150); /* a ping or two; nothing else may come */
  s = stats(fx);
  assert_int_equal(s.events, 1);
  assert_int_equal(s.duplicates, 0);
  assert_int_equal(s.snapshots, 1);
  assert_int_equal(fx->n_revs, 1);
  put(fx, "b", "http://127.0.0.1:9002");
  RUN_UNTIL(fx, fx->n_revs >= 2, 2000);
  assert_int_equal(fx->n_revs, 2);
  OM_ASSERT_CMP(fx->revs[1], >, fx->revs[0]);
  text = om_metrics_render(m, &len);
  assert_non_null(text);
  assert_non_null(
      strstr(text, "openmesh_proxy_watch_failovers_total{service=\"web\"} 1"));
  snprintf(line, sizeof line,
           "openmesh_proxy_watch_plane{service=\"web\",plane=\"%s\"} 1",
           urls[1]);
  assert_non_null(strstr(text, line));
  snprintf(line, sizeof line,
           "openmesh_proxy_watch_plane{service=\"web\",plane=\"%s\"} 0",
           urls[0]);
  assert_non_null(strstr(text, line));
  free(text);
  fx_free(fx);
  om_metrics_free(m);
}

/* 503 from the first plane, a stream from the second: the second is asked
 * at once; a plane that answers 404 is kept (it is alive; the service is
 * what is missing), with backoff, as with one plane. */
static void five_xx_moves_404_stays(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o;
  om_watch_stats_t s;
  int ports[2];
  (void)state;
  planes_new(fx);
  put(fx, "a", "http://127.0.0.1:9001");
  ports[0] = fake_new(fx, 0, 503);
  ports[1] = fx->ctl_port[1];
  o = opts_for(fx, ports, 2);
  o.backoff_base_ms = 3000;
  o.backoff_cap_ms = 3000;
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &o, &fx->w), 0);
  RUN_UNTIL(fx, fx->n_revs >= 1, 2000);
  s = stats(fx);
  assert_int_equal(fx->n_revs, 1);
  assert_int_equal(fx->n_seen, 1); /* the 503, once */
  assert_int_equal(s.failovers, 1);
  assert_int_equal(s.plane, 1);
  assert_int_equal(s.http_errors, 1);
  OM_ASSERT_CMP(now_ms() - fx->seen[0].t_ms, <, 500);
  fx_free(fx);

  fx = fx_new();
  ports[0] = fake_new(fx, 0, 404);
  ports[1] = fake_new(fx, 1, 503);
  o = opts_for(fx, ports, 2);
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &o, &fx->w), 0);
  RUN_UNTIL(fx, fx->n_seen >= 5, 3000);
  s = stats(fx);
  OM_ASSERT_CMP(fx->n_seen, >=, 5);
  for (size_t i = 0; i < fx->n_seen; i++)
    assert_int_equal(fx->seen[i].plane, 0);
  assert_int_equal(s.failovers, 0);
  assert_int_equal(s.plane, 0);
  fx_free(fx);
}

/* Both planes fail: within a round the next plane is asked at once, and
 * the backoff comes between rounds. */
static void backoff_between_rounds_not_planes(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o;
  int ports[2];
  uint64_t within = 0, between = 0;
  size_t rounds = 0;
  (void)state;
  ports[0] = fake_new(fx, 0, 503);
  ports[1] = fake_new(fx, 1, 502);
  o = opts_for(fx, ports, 2);
  o.backoff_base_ms = 200;
  o.backoff_cap_ms = 200;
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &o, &fx->w), 0);
  RUN_UNTIL(fx, fx->n_seen >= 21, 8000);
  OM_ASSERT_CMP(fx->n_seen, >=, 21);
  for (size_t i = 0; i + 1 < 21; i++) {
    uint64_t gap = fx->seen[i + 1].t_ms - fx->seen[i].t_ms;
    /* round robin, starting with the first plane given */
    assert_int_equal(fx->seen[i].plane, (int)(i % 2));
    if (i % 2 == 0) {
      within += gap;
    } else {
      between += gap;
      rounds++;
    }
  }
  OM_TEST_NOTE("%zu rounds: %" PRIu64 " ms between planes, %" PRIu64
               " ms between rounds (full jitter under 200 ms each)",
               rounds, within, between);
  /* ten waits drawn under 200 ms sum to ~1 s (below 200 ms with a
   * vanishing probability, and the seed is fixed); ten immediate moves to
   * little more than ten loopback exchanges */
  OM_ASSERT_CMP(between, >, 200);
  OM_ASSERT_CMP(within * 3, <, between);
  OM_ASSERT_CMP(stats(fx).failovers, >=, 20);
  fx_free(fx);
}

/* A plane that accepts and never answers: silence (3 heartbeats) moves the
 * watch to the next one. */
static void silence_moves(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o;
  om_watch_stats_t s;
  int ports[2];
  (void)state;
  planes_new(fx);
  put(fx, "a", "http://127.0.0.1:9001");
  ports[0] = fake_new(fx, 0, 0);
  ports[1] = fx->ctl_port[1];
  o = opts_for(fx, ports, 2);
  o.heartbeat_ms = 50;
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &o, &fx->w), 0);
  RUN_UNTIL(fx, fx->n_revs >= 1, 3000);
  s = stats(fx);
  assert_int_equal(fx->n_revs, 1);
  assert_int_equal(s.silent, 1);
  assert_int_equal(s.failovers, 1);
  assert_int_equal(s.plane, 1);
  fx_free(fx);
}

/* A refused connect (nobody listens) moves too; the one plane that works
 * is kept, whichever place it has in the list. */
static void refused_connect_moves_and_sticks(void **state) {
  fx_t *fx = fx_new();
  om_watch_opts_t o;
  om_watch_stats_t s;
  int ports[2];
  (void)state;
  planes_new(fx);
  put(fx, "a", "http://127.0.0.1:9001");
  ports[0] = free_port();
  ports[1] = fx->ctl_port[1];
  o = opts_for(fx, ports, 2);
  assert_int_equal(om_watch_new(&fx->loop, fx->cu, &o, &fx->w), 0);
  RUN_UNTIL(fx, fx->n_revs >= 1, 3000);
  run_for(fx, 300);
  s = stats(fx);
  assert_int_equal(fx->n_revs, 1);
  assert_int_equal(s.transport_errors, 1);
  assert_int_equal(s.failovers, 1);
  assert_int_equal(s.connects, 2);
  assert_int_equal(s.state, OM_WATCH_STREAMING);
  fx_free(fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(rejects_bad_plane_lists),
      cmocka_unit_test(moves_and_resumes_without_duplicate),
      cmocka_unit_test(five_xx_moves_404_stays),
      cmocka_unit_test(backoff_between_rounds_not_planes),
      cmocka_unit_test(silence_moves),
      cmocka_unit_test(refused_connect_moves_and_sticks),
  };
  om_log_set_level(getenv("OM_TEST_LOG") != NULL ? OM_LOG_DEBUG : OM_LOG_ERROR);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
