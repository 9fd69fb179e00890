/*
 * test_upstream_pool.c: the upstream client's keep-alive limits
 * (om_upstream_request_t.max_idle_per_peer, idle_timeout_ms,
 * max_requests_per_connection) against a keep-alive server written here
 * with raw libuv TCP on loopback, on the same loop. Unlike
 * test_upstream.c's fixture it takes any number of connections, so a
 * pool can be filled past the old fixed limit of 32.
 */
#include "om_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "om_errno.h"
#include "om_upstream.h"

/* ------------------------------------------------------------------ */
/* a keep-alive server: every request (a head, no body) gets "ok" */

typedef struct srv_s srv_t;

typedef struct sconn_s {
  uv_tcp_t tcp;
  srv_t *srv;
  char in[4096];
  size_t in_len;
  uv_write_t wr;
} sconn_t;

struct srv_s {
  uv_loop_t *loop;
  uv_tcp_t lis;
  int port;
  int accepts, requests, eofs, open;
};

static const char OK[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

static void on_sc_closed(uv_handle_t *h) {
  sconn_t *sc = h->data;
  sc->srv->open--;
  free(sc);
}

static void on_sc_write(uv_write_t *w, int status) {
  (void)w;
  (void)status;
}

static void on_sc_alloc(uv_handle_t *h, size_t sug, uv_buf_t *buf) {
  sconn_t *sc = h->data;
  (void)sug;
  buf->base = sc->in + sc->in_len;
  buf->len = sizeof sc->in - sc->in_len;
}

static void on_sc_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  sconn_t *sc = st->data;
  size_t i;
  (void)buf;
  if (n < 0) {
    sc->srv->eofs++;
    uv_close((uv_handle_t *)&sc->tcp, on_sc_closed);
    return;
  }
  sc->in_len += (size_t)n;
  /* one request at a time (the client never pipelines): a head, no body */
  for (;;) {
    uv_buf_t b = uv_buf_init((char *)OK, sizeof OK - 1);
    int w;
    i = 0;
    while (i + 4 <= sc->in_len && memcmp(sc->in + i, "\r\n\r\n", 4) != 0)
      i++;
    if (i + 4 > sc->in_len)
      return;
    memmove(sc->in, sc->in + i + 4, sc->in_len - i - 4);
    sc->in_len -= i + 4;
    sc->srv->requests++;
    w = uv_try_write(st, &b, 1);
    if (w != (int)b.len) {
      OM_ASSERT_CMP(w, <, 0); /* a 39-byte answer goes out whole or not */
      uv_write(&sc->wr, st, &b, 1, on_sc_write);
    }
  }
}

static void on_sc_conn(uv_stream_t *l, int status) {
  srv_t *s = l->data;
  sconn_t *sc;
  if (status < 0)
    return;
  sc = calloc(1, sizeof *sc);
  assert_non_null(sc);
  sc->srv = s;
  uv_tcp_init(s->loop, &sc->tcp);
  sc->tcp.data = sc;
  assert_int_equal(uv_accept(l, (uv_stream_t *)&sc->tcp), 0);
  uv_read_start((uv_stream_t *)&sc->tcp, on_sc_alloc, on_sc_read);
  s->accepts++;
  s->open++;
}

static void srv_listen(srv_t *s, uv_loop_t *loop) {
  struct sockaddr_in sa;
  int len = sizeof sa;
  memset(s, 0, sizeof *s);
  s->loop = loop;
  uv_tcp_init(loop, &s->lis);
  s->lis.data = s;
  uv_ip4_addr("127.0.0.1", 0, &sa);
  assert_int_equal(uv_tcp_bind(&s->lis, (struct sockaddr *)&sa, 0), 0);
  assert_int_equal(uv_listen((uv_stream_t *)&s->lis, 512, on_sc_conn), 0);
  uv_tcp_getsockname(&s->lis, (struct sockaddr *)&sa, &len);
  s->port = ntohs(sa.sin_port);
}

/* ------------------------------------------------------------------ */
/* fixture */

typedef struct {
  uv_loop_t loop;
  uv_timer_t guard; /* wakes the loop so RUN_UNTIL sees its clock */
  srv_t srv;
  om_upstream_pool_t *pool;
  om_upstream_target_t tgt;
  int pool_closed;
  int done, ok;
  unsigned connects, reuses;
} fx_t;

static void on_guard(uv_timer_t *t) {
  (void)t;
}

static fx_t *fx_new(const om_upstream_pool_opts_t *o) {
  fx_t *fx = calloc(1, sizeof *fx);
  assert_non_null(fx);
  assert_int_equal(uv_loop_init(&fx->loop), 0);
  uv_timer_init(&fx->loop, &fx->guard);
  uv_timer_start(&fx->guard, on_guard, 2, 2);
  srv_listen(&fx->srv, &fx->loop);
  assert_int_equal(om_upstream_pool_new(&fx->loop, o, &fx->pool), 0);
  assert_int_equal(om_upstream_target_init(&fx->tgt, "127.0.0.1", fx->srv.port),
                   0);
  return fx;
}

#define RUN_UNTIL(fx, cond, ms)                                                \
  do {                                                                         \
    uint64_t t0_ = uv_hrtime();                                                \
    while (!(cond) && uv_hrtime() - t0_ < (uint64_t)(ms)*1000000u)             \
      uv_run(&(fx)->loop, UV_RUN_ONCE);                                        \
  } while (0)

static void on_pool_closed(void *ud) {
  *(int *)ud = 1;
}

static void fx_free(fx_t *fx) {
  assert_int_equal(
      om_upstream_pool_close(fx->pool, on_pool_closed, &fx->pool_closed), 0);
  RUN_UNTIL(fx, fx->pool_closed, 3000);
  assert_true(fx->pool_closed);
  /* the server's connections see the pool's FIN and close themselves */
  RUN_UNTIL(fx, fx->srv.open == 0, 3000);
  OM_ASSERT_CMP(fx->srv.open, ==, 0);
  uv_close((uv_handle_t *)&fx->srv.lis, NULL);
  uv_close((uv_handle_t *)&fx->guard, NULL);
  uv_run(&fx->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&fx->loop), 0);
  free(fx);
}

static void on_done(void *ud, const om_upstream_result_t *res) {
  fx_t *fx = ud;
  fx->done++;
  fx->ok += res->err == 0;
  fx->connects += res->connects;
  fx->reuses += res->reuses;
}

static const om_upstream_callbacks_t CB = {NULL, NULL, on_done, NULL};

/* n requests at once with the given limits; waits for all of them. */
static void burst(fx_t *fx, int n, size_t max_idle, uint64_t idle_ms,
                  uint64_t max_reqs) {
  om_upstream_request_t q;
  om_upstream_req_t *r;
  int start = fx->done;
  memset(&q, 0, sizeof q);
  q.method = "GET";
  q.target = "/";
  q.max_idle_per_peer = max_idle;
  q.idle_timeout_ms = idle_ms;
  q.max_requests_per_connection = max_reqs;
  for (int i = 0; i < n; i++)
    assert_int_equal(om_upstream_send(fx->pool, &fx->tgt, &q, &CB, fx, &r), 0);
  RUN_UNTIL(fx, fx->done - start == n, 5000);
  OM_ASSERT_CMP(fx->done - start, ==, n);
}

static om_upstream_stats_t peer_st(fx_t *fx) {
  om_upstream_stats_t st;
  memset(&st, 0, sizeof st);
  assert_int_equal(om_upstream_peer_stats(fx->pool, &fx->tgt, &st), 0);
  return st;
}

/* ------------------------------------------------------------------ */
/* tests */

/* A request's limit above the pool's 32 keeps all 100 connections of a
 * burst, and the next burst reuses every one of them. */
static void a_limit_above_32_keeps_100_idle(void **state) {
  fx_t *fx = fx_new(NULL);
  om_upstream_stats_t st;
  (void)state;
  burst(fx, 100, 100, 0, 0);
  OM_ASSERT_CMP(fx->ok, ==, 100);
  OM_ASSERT_CMP(fx->srv.accepts, ==, 100);
  OM_ASSERT_CMP(fx->connects, ==, 100);
  st = peer_st(fx);
  OM_ASSERT_CMP(st.idle, ==, 100);
  OM_ASSERT_CMP(st.idle_evicted, ==, 0);
  burst(fx, 100, 100, 0, 0);
  OM_ASSERT_CMP(fx->ok, ==, 200);
  OM_ASSERT_CMP(fx->srv.accepts, ==, 100); /* not one new connection */
  OM_ASSERT_CMP(fx->reuses, ==, 100);
  OM_ASSERT_CMP(fx->connects, ==, 100);
  st = peer_st(fx);
  OM_ASSERT_CMP(st.idle, ==, 100);
  OM_ASSERT_CMP(st.reuses, ==, 100);
  OM_ASSERT_CMP(st.connects, ==, 100);
  fx_free(fx);
}

/* Without a limit of its own a request gets the pool's (32): a burst of
 * 100 keeps 32 and closes the other 68, oldest first; the server sees
 * them go. */
static void without_a_limit_the_pools_applies(void **state) {
  fx_t *fx = fx_new(NULL);
  om_upstream_stats_t st;
  (void)state;
  burst(fx, 100, 0, 0, 0);
  st = peer_st(fx);
  OM_ASSERT_CMP(st.idle, ==, 32);
  OM_ASSERT_CMP(st.idle_evicted, ==, 68);
  RUN_UNTIL(fx, fx->srv.eofs == 68, 3000);
  OM_ASSERT_CMP(fx->srv.eofs, ==, 68);
  fx_free(fx);
}

/* A smaller limit on a returning request trims the peer's idle list to
 * it, keeping the most recently used: the one just returned stays, and
 * the next request goes out on it. */
static void a_smaller_limit_trims_the_oldest(void **state) {
  fx_t *fx = fx_new(NULL);
  om_upstream_stats_t st;
  (void)state;
  burst(fx, 10, 64, 0, 0);
  OM_ASSERT_CMP(peer_st(fx).idle, ==, 10);
  burst(fx, 1, 3, 0, 0);
  st = peer_st(fx);
  OM_ASSERT_CMP(st.idle, ==, 3);
  OM_ASSERT_CMP(st.idle_evicted, ==, 7);
  burst(fx, 3, 64, 0, 0);
  OM_ASSERT_CMP(fx->srv.accepts, ==, 10);
  OM_ASSERT_CMP(peer_st(fx).idle, ==, 3);
  fx_free(fx);
}

/* max_requests_per_connection: after N requests the connection is closed
 * instead of pooled; the next request opens a fresh one. */
static void max_requests_closes_after_n(void **state) {
  fx_t *fx = fx_new(NULL);
  om_upstream_stats_t st;
  (void)state;
  for (int i = 0; i < 7; i++)
    burst(fx, 1, 0, 0, 3);
  OM_ASSERT_CMP(fx->ok, ==, 7);
  OM_ASSERT_CMP(fx->srv.requests, ==, 7);
  /* 1-3, 4-6, 7 */
  OM_ASSERT_CMP(fx->srv.accepts, ==, 3);
  OM_ASSERT_CMP(fx->connects, ==, 3);
  OM_ASSERT_CMP(fx->reuses, ==, 4);
  st = peer_st(fx);
  OM_ASSERT_CMP(st.retired, ==, 2);
  OM_ASSERT_CMP(st.idle, ==, 1);
  RUN_UNTIL(fx, fx->srv.eofs == 2, 3000);
  OM_ASSERT_CMP(fx->srv.eofs, ==, 2);
  fx_free(fx);
}

/* The pool's own max_requests_per_connection applies to requests that
 * set none; 1 means no reuse at all. */
static void pool_max_requests_is_the_default(void **state) {
  om_upstream_pool_opts_t o = {0};
  fx_t *fx;
  (void)state;
  o.max_requests_per_connection = 1;
  fx = fx_new(&o);
  for (int i = 0; i < 4; i++)
    burst(fx, 1, 0, 0, 0);
  OM_ASSERT_CMP(fx->srv.accepts, ==, 4);
  OM_ASSERT_CMP(peer_st(fx).retired, ==, 4);
  OM_ASSERT_CMP(peer_st(fx).idle, ==, 0);
  /* a request's own limit wins over the pool's */
  burst(fx, 1, 0, 0, 5);
  burst(fx, 1, 0, 0, 5);
  OM_ASSERT_CMP(fx->srv.accepts, ==, 5);
  fx_free(fx);
}

/* idle_timeout_ms on the request: its connection closes after that long
 * idle, though the pool's own timeout is a minute. */
static void idle_timeout_closes(void **state) {
  fx_t *fx = fx_new(NULL);
  uint64_t t0, t1;
  (void)state;
  t0 = uv_hrtime();
  burst(fx, 3, 0, 80, 0);
  OM_ASSERT_CMP(peer_st(fx).idle, ==, 3);
  /* the most recent goes out again and comes back with the pool's
   * timeout (a minute): it outlives the other two */
  burst(fx, 1, 0, 0, 0);
  RUN_UNTIL(fx, fx->srv.eofs == 2, 3000);
  t1 = uv_hrtime();
  OM_ASSERT_CMP(fx->srv.eofs, ==, 2);
  OM_ASSERT_CMP(peer_st(fx).idle, ==, 1);
  /* not before its time (the loop's clock counts whole ms) */
  OM_ASSERT_CMP((t1 - t0) / 1000000u, >=, 79);
  /* twice the timeout after the first two closed, the third is there */
  RUN_UNTIL(fx, uv_hrtime() - t1 > 160u * 1000000u, 1000);
  OM_ASSERT_CMP(peer_st(fx).idle, ==, 1);
  OM_ASSERT_CMP(fx->srv.eofs, ==, 2);
  OM_ASSERT_CMP(fx->srv.accepts, ==, 3);
  fx_free(fx);
}

/* Limits out of range are refused at send, and nothing is sent. */
static void out_of_range_limits_are_refused(void **state) {
  fx_t *fx = fx_new(NULL);
  om_upstream_pool_opts_t o = {0};
  om_upstream_pool_t *p = NULL;
  om_upstream_request_t q;
  om_upstream_req_t *r;
  (void)state;
  memset(&q, 0, sizeof q);
  q.method = "GET";
  q.target = "/";
  q.max_idle_per_peer = 1000001;
  assert_int_equal(om_upstream_send(fx->pool, &fx->tgt, &q, &CB, fx, &r),
                   OM_EINVAL);
  q.max_idle_per_peer = 0;
  q.idle_timeout_ms = UINT64_MAX;
  assert_int_equal(om_upstream_send(fx->pool, &fx->tgt, &q, &CB, fx, &r),
                   OM_EINVAL);
  o.max_idle_per_peer = 1000001;
  assert_int_equal(om_upstream_pool_new(&fx->loop, &o, &p), OM_EINVAL);
  assert_null(p);
  OM_ASSERT_CMP(fx->srv.accepts, ==, 0);
  fx_free(fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_limit_above_32_keeps_100_idle),
      cmocka_unit_test(without_a_limit_the_pools_applies),
      cmocka_unit_test(a_smaller_limit_trims_the_oldest),
      cmocka_unit_test(max_requests_closes_after_n),
      cmocka_unit_test(pool_max_requests_is_the_default),
      cmocka_unit_test(idle_timeout_closes),
      cmocka_unit_test(out_of_range_limits_are_refused),
  };
  signal(SIGPIPE, SIG_IGN);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
