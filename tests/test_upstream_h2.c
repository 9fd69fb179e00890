/*
 * test_upstream_h2.c: the upstream client over HTTP/2 (prior knowledge,
 * om_upstream_request_t.http2) on real loopback sockets, against the
 * project's own HTTP/2 server (om_http_server with http2) on the same
 * loop: trailers reach on_trailers before on_done, a bodiless answer is
 * Trailers-Only, streams share one connection, a streamed body arrives
 * whole, a paused stream holds the server back at its window and
 * resumes whole, a stalled server trips the first-byte timeout without
 * losing the connection, a refused connect says nothing was sent, and
 * closing the pool ends what is in flight. Over TLS (certificates from
 * tests/fixtures/tls_certs.sh): h2 by ALPN, and a server that does not
 * select h2 fails the connect. Against a misbehaving server scripted here
 * with nghttp2's server side: a refused stream and one above a GOAWAY's
 * last stream id end with nothing sent (any method may go again), a
 * reset after the head is a cut body, a head over max_header_bytes is
 * malformed.
 */
#include "om_test.h"

#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nghttp2/nghttp2.h>
#include <uv.h>

#include "om_errno.h"
#include "om_http_server.h"
#include "om_http_tls.h"
#include "om_tls.h"
#include "om_upstream.h"

#define MAXR 32

typedef struct call_s {
  int status, has_body, done, err, sent, reused, connects, order;
  om_upstream_fail_t fail;
  int64_t content_length;
  char body[256];
  size_t body_len, body_total;
  char trailers[256];
  int trailers_at; /* the order on_trailers ran in: before on_done */
  int pause_first;
  om_upstream_req_t *r;
} call_t;

typedef struct fx_s {
  uv_loop_t loop;
  om_http_server_t *srv;
  om_http_tls_t *tls;
  om_upstream_pool_t *pool;
  om_upstream_target_t target;
  int port, srv_closed, pool_closed, seq;
  om_http_request_t *held[MAXR];
  int n_held;
  om_http_request_t *big; /* the /big response, for its pending bytes */
  size_t echo_got;
} fx_t;

static fx_t *F;

/* ------------------------------------------------------------------ */
/* the upstream: om_http_server speaking HTTP/2 */

static void on_echo_body(om_http_request_t *req, const char *d, size_t n) {
  (void)req;
  (void)d;
  F->echo_got += n;
}

static void on_echo_end(om_http_request_t *req) {
  char b[64];
  int n = snprintf(b, sizeof b, "got %zu", F->echo_got);
  om_http_respond(req, 200, NULL, 0, b, (size_t)n);
}

static int path_is(const om_http_request_t *req, const char *p) {
  return req->path_len == strlen(p) && memcmp(req->path, p, req->path_len) == 0;
}

static void on_request(om_http_request_t *req, void *ud) {
  fx_t *fx = ud;
  if (path_is(req, "/never")) {
    fx->held[fx->n_held++] = req;
    return;
  }
  if (path_is(req, "/echo")) {
    fx->echo_got = 0;
    om_http_request_body_start(req, on_echo_body, on_echo_end);
    return;
  }
  if (path_is(req, "/trailers")) {
    om_http_header_t ct[] = {{"content-type", "application/grpc", 12, 16}};
    om_http_header_t tr[] = {{"grpc-status", "0", 11, 1},
                             {"Grpc-Message", "fine", 12, 4},
                             {"content-length", "9", 14, 1}};
    om_http_response_start(req, 200, ct, 1);
    om_http_response_write(req, "abc", 3);
    om_http_response_end_trailers(req, tr, 3);
    return;
  }
  if (path_is(req, "/only")) {
    om_http_header_t gs[] = {{"grpc-status", "14", 11, 2}};
    om_http_respond(req, 200, gs, 1, NULL, 0);
    return;
  }
  if (path_is(req, "/big")) {
    static char chunk[65536];
    om_http_header_t cl[] = {{"content-length", "2000000", 14, 7}};
    memset(chunk, 'b', sizeof chunk);
    om_http_response_start(req, 200, cl, 1);
    for (size_t left = 2000000; left > 0;) {
      size_t n = left < sizeof chunk ? left : sizeof chunk;
      om_http_response_write(req, chunk, n);
      left -= n;
    }
    fx->big = req; /* ended by the test */
    return;
  }
  om_http_respond(req, 200, NULL, 0, "hello", 5);
}

static void on_srv_closed(om_http_server_t *s, void *ud) {
  (void)s;
  ((fx_t *)ud)->srv_closed = 1;
}

static void on_pool_closed(void *ud) {
  ((fx_t *)ud)->pool_closed = 1;
}

static char certs[] = "/tmp/om_test_uph2_XXXXXX";

static const char *cert(const char *name) {
  static char b[4][512];
  static int i;
  char *s = b[i++ % 4];
  snprintf(s, sizeof b[0], "%s/%s", certs, name);
  return s;
}

/* alpn NULL: plaintext (h2c); else a TLS listener offering alpn, and a
 * pool that trusts the test CA */
static fx_t *fx_new_with(const char *alpn) {
  fx_t *fx = calloc(1, sizeof *fx);
  om_http_server_opts_t o;
  om_upstream_pool_opts_t po;
  om_tls_ctx_t *cctx = NULL;
  char url[64];
  assert_non_null(fx);
  F = fx;
  memset(&o, 0, sizeof o);
  memset(&po, 0, sizeof po);
  o.stream_bodies = 1;
  o.http2 = 1;
  assert_int_equal(uv_loop_init(&fx->loop), 0);
  if (alpn != NULL) {
    om_http_tls_opts_t to = {.cert_file = cert("server.pem"),
                             .key_file = cert("server.key"),
                             .alpn = alpn};
    om_tls_opts_t co = {.role = OM_TLS_CLIENT, .ca_file = cert("ca.pem")};
    char err[256];
    assert_int_equal(om_http_tls_new(&fx->loop, &to, &fx->tls, err, sizeof err),
                     0);
    o.tls = fx->tls;
    assert_int_equal(om_tls_ctx_new(&co, &cctx, err, sizeof err), 0);
    po.tls_ctx = cctx;
  }
  assert_int_equal(om_http_server_new(&fx->loop, &o, on_request, fx, &fx->srv),
                   0);
  assert_int_equal(om_http_server_listen(fx->srv, "127.0.0.1", 0), 0);
  fx->port = om_http_server_port(fx->srv);
  assert_int_equal(om_upstream_pool_new(&fx->loop, &po, &fx->pool), 0);
  om_tls_ctx_unref(cctx); /* the pool holds its own */
  snprintf(url, sizeof url, "%s://127.0.0.1:%d", alpn ? "https" : "http",
           fx->port);
  assert_int_equal(om_upstream_target_from_url(&fx->target, url, NULL), 0);
  return fx;
}

static fx_t *fx_new(void) {
  return fx_new_with(NULL);
}

static void run_until(fx_t *fx, const int *flag, int ms) {
  uint64_t t0 = uv_hrtime();
  while (!*flag && uv_hrtime() - t0 < (uint64_t)ms * 1000000u)
    uv_run(&fx->loop, UV_RUN_NOWAIT);
}

static void run_for(fx_t *fx, int ms) {
  uint64_t t0 = uv_hrtime();
  while (uv_hrtime() - t0 < (uint64_t)ms * 1000000u)
    uv_run(&fx->loop, UV_RUN_NOWAIT);
}

static void fx_free(fx_t *fx) {
  for (int i = 0; i < fx->n_held; i++)
    om_http_response_abort(fx->held[i]);
  if (!fx->pool_closed) {
    om_upstream_pool_close(fx->pool, on_pool_closed, fx);
    run_until(fx, &fx->pool_closed, 3000);
  }
  om_http_server_close(fx->srv, on_srv_closed);
  run_until(fx, &fx->srv_closed, 3000);
  assert_true(fx->srv_closed && fx->pool_closed);
  if (fx->tls != NULL)
    om_http_tls_close(fx->tls);
  uv_run(&fx->loop, UV_RUN_NOWAIT);
  assert_int_equal(uv_loop_close(&fx->loop), 0);
  free(fx);
}

/* ------------------------------------------------------------------ */
/* the client's callbacks */

static int cb_headers(void *ud, const om_upstream_response_t *resp) {
  call_t *c = ud;
  c->status = resp->status;
  c->has_body = resp->has_body;
  c->content_length = resp->content_length;
  if (c->pause_first)
    om_upstream_pause(c->r);
  return 0;
}

static void cb_body(void *ud, const char *d, size_t n) {
  call_t *c = ud;
  size_t k = n < sizeof c->body - 1 - c->body_len
                 ? n
                 : sizeof c->body - 1 - c->body_len;
  memcpy(c->body + c->body_len, d, k);
  c->body_len += k;
  c->body[c->body_len] = '\0';
  c->body_total += n;
}

static void cb_trailers(void *ud, const om_http_header_t *h, size_t n) {
  call_t *c = ud;
  size_t off = 0;
  for (size_t i = 0; i < n; i++)
    off += (size_t)snprintf(c->trailers + off, sizeof c->trailers - off,
                            "%.*s=%.*s;", (int)h[i].name_len, h[i].name,
                            (int)h[i].value_len, h[i].value);
  c->trailers_at = ++F->seq;
}

static void cb_done(void *ud, const om_upstream_result_t *res) {
  call_t *c = ud;
  c->err = res->err;
  c->fail = res->fail;
  c->sent = res->sent;
  c->reused = res->reused;
  c->connects = (int)res->connects;
  c->order = ++F->seq;
  c->done = 1;
}

static const om_upstream_callbacks_t CB = {cb_headers, cb_body, cb_done,
                                           cb_trailers};

static void send_get(fx_t *fx, call_t *c, const char *path,
                     uint64_t first_byte_ms) {
  om_upstream_request_t q;
  memset(&q, 0, sizeof q);
  q.method = "GET";
  q.target = path;
  q.http2 = 1;
  q.first_byte_timeout_ms = first_byte_ms;
  assert_int_equal(om_upstream_send(fx->pool, &fx->target, &q, &CB, c, &c->r),
                   0);
}

/* ------------------------------------------------------------------ */
/* tests */

static void trailers_reach_on_trailers_before_done(void **state) {
  fx_t *fx = fx_new();
  call_t c;
  (void)state;
  memset(&c, 0, sizeof c);
  send_get(fx, &c, "/trailers", 0);
  run_until(fx, &c.done, 3000);
  assert_int_equal(c.done, 1);
  assert_int_equal(c.err, 0);
  assert_int_equal(c.status, 200);
  assert_string_equal(c.body, "abc");
  /* names lower-cased; the framing field never travels as a trailer */
  assert_string_equal(c.trailers, "grpc-status=0;grpc-message=fine;");
  OM_ASSERT_CMP(c.trailers_at, <, c.order);
  fx_free(fx);
}

static void bodiless_answer_is_trailers_only(void **state) {
  fx_t *fx = fx_new();
  call_t c;
  (void)state;
  memset(&c, 0, sizeof c);
  send_get(fx, &c, "/only", 0);
  run_until(fx, &c.done, 3000);
  assert_int_equal(c.err, 0);
  assert_int_equal(c.status, 200);
  assert_int_equal(c.has_body, 0);
  assert_int_equal(c.body_total, 0);
  assert_string_equal(c.trailers, "");
  fx_free(fx);
}

static void streams_share_one_connection(void **state) {
  fx_t *fx = fx_new();
  call_t c[20];
  om_upstream_stats_t st;
  int connects = 0, ok = 0;
  (void)state;
  memset(c, 0, sizeof c);
  for (int i = 0; i < 20; i++)
    send_get(fx, &c[i], "/hello", 0);
  for (int i = 0; i < 20; i++) {
    run_until(fx, &c[i].done, 3000);
    connects += c[i].connects;
    ok += c[i].err == 0 && strcmp(c[i].body, "hello") == 0;
  }
  assert_int_equal(ok, 20);
  assert_int_equal(connects, 1);
  assert_int_equal(om_upstream_pool_stats(fx->pool, &st), 0);
  OM_ASSERT_CMP(st.connects, ==, 1);
  OM_ASSERT_CMP(st.reuses, ==, 19);
  OM_ASSERT_CMP(st.idle, ==, 1); /* no stream left: idle, kept */
  fx_free(fx);
}

static void release_count(void *ud) {
  (*(int *)ud)++;
}

static void streamed_body_arrives_whole(void **state) {
  fx_t *fx = fx_new();
  static char piece[10240];
  om_upstream_request_t q;
  call_t c;
  int released = 0;
  (void)state;
  memset(&c, 0, sizeof c);
  memset(piece, 'p', sizeof piece);
  memset(&q, 0, sizeof q);
  q.method = "POST";
  q.target = "/echo";
  q.http2 = 1;
  q.body_stream = 1;
  q.body_stream_length = -1;
  assert_int_equal(om_upstream_send(fx->pool, &fx->target, &q, &CB, &c, &c.r),
                   0);
  for (int i = 0; i < 30; i++) {
    if (i % 2 == 0)
      assert_int_equal(om_upstream_body_write(c.r, piece, sizeof piece), 0);
    else
      assert_int_equal(om_upstream_body_write_ref(c.r, piece, sizeof piece,
                                                  release_count, &released),
                       0);
    run_for(fx, 2);
  }
  assert_int_equal(om_upstream_body_end(c.r), 0);
  run_until(fx, &c.done, 5000);
  assert_int_equal(c.err, 0);
  assert_string_equal(c.body, "got 307200");
  assert_int_equal(released, 15); /* every lent piece given back once */
  fx_free(fx);
}

static void paused_stream_holds_the_server_at_its_window(void **state) {
  fx_t *fx = fx_new();
  call_t c;
  size_t seen;
  (void)state;
  memset(&c, 0, sizeof c);
  c.pause_first = 1;
  send_get(fx, &c, "/big", 0);
  run_until(fx, &c.status, 3000);
  assert_int_equal(c.status, 200);
  assert_int_equal(c.content_length, 2000000);
  run_for(fx, 300);
  seen = c.body_total;
  assert_int_equal(seen, 0); /* paused inside on_headers: nothing yet */
  assert_int_equal(c.done, 0);
  /* what the client did not give back stays at the server: at most one
   * stream window (256 KiB) left it, whatever the socket buffers hold */
  assert_non_null(fx->big);
  OM_ASSERT_CMP(om_http_response_pending(fx->big), >=, 2000000 - 262144);
  assert_int_equal(om_http_response_end(fx->big), 0);
  fx->big = NULL;
  assert_int_equal(om_upstream_resume(c.r), 0);
  run_until(fx, &c.done, 5000);
  assert_int_equal(c.err, 0);
  OM_ASSERT_CMP(c.body_total, ==, 2000000);
  fx_free(fx);
}

static void
stalled_server_trips_first_byte_and_keeps_the_connection(void **state) {
  fx_t *fx = fx_new();
  call_t a, b;
  (void)state;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  send_get(fx, &a, "/never", 200);
  run_until(fx, &a.done, 3000);
  assert_int_equal(a.done, 1);
  assert_int_equal(a.fail, OM_UPSTREAM_FAIL_TIMEOUT_FIRST_BYTE);
  assert_int_equal(a.sent, 1);
  send_get(fx, &b, "/hello", 0);
  run_until(fx, &b.done, 3000);
  assert_int_equal(b.err, 0);
  assert_int_equal(b.reused, 1); /* the reset stream cost no connection */
  fx_free(fx);
}

static void refused_connect_sent_nothing(void **state) {
  fx_t *fx = fx_new();
  om_upstream_target_t dead;
  om_upstream_request_t q;
  uv_tcp_t probe;
  struct sockaddr_in sa;
  int len = sizeof sa, port;
  call_t c;
  (void)state;
  /* a port that was just free: bound, read, closed */
  uv_tcp_init(&fx->loop, &probe);
  uv_ip4_addr("127.0.0.1", 0, &sa);
  assert_int_equal(uv_tcp_bind(&probe, (struct sockaddr *)&sa, 0), 0);
  uv_tcp_getsockname(&probe, (struct sockaddr *)&sa, &len);
  port = ntohs(sa.sin_port);
  uv_close((uv_handle_t *)&probe, NULL);
  uv_run(&fx->loop, UV_RUN_NOWAIT);
  assert_int_equal(om_upstream_target_init(&dead, "127.0.0.1", port), 0);
  memset(&c, 0, sizeof c);
  memset(&q, 0, sizeof q);
  q.method = "POST";
  q.target = "/x";
  q.body = "abc";
  q.body_len = 3;
  q.http2 = 1;
  assert_int_equal(om_upstream_send(fx->pool, &dead, &q, &CB, &c, &c.r), 0);
  run_until(fx, &c.done, 3000);
  assert_int_equal(c.fail, OM_UPSTREAM_FAIL_CONNECT);
  assert_int_equal(c.sent, 0);
  fx_free(fx);
}

static void pool_close_ends_streams_in_flight(void **state) {
  fx_t *fx = fx_new();
  call_t a, b;
  (void)state;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  send_get(fx, &a, "/never", 0);
  send_get(fx, &b, "/never", 0);
  run_until(fx, &fx->n_held, 3000);
  run_for(fx, 20);
  assert_int_equal(om_upstream_pool_close(fx->pool, on_pool_closed, fx), 0);
  assert_int_equal(a.done, 0); /* never from inside the call */
  run_until(fx, &fx->pool_closed, 3000);
  assert_int_equal(a.fail, OM_UPSTREAM_FAIL_CLOSED);
  assert_int_equal(b.fail, OM_UPSTREAM_FAIL_CLOSED);
  fx_free(fx);
}

static void upgrade_is_refused(void **state) {
  fx_t *fx = fx_new();
  om_upstream_request_t q;
  om_upstream_req_t *r = NULL;
  call_t c;
  (void)state;
  memset(&q, 0, sizeof q);
  q.method = "GET";
  q.target = "/ws";
  q.http2 = 1;
  q.upgrade = "websocket";
  assert_int_equal(om_upstream_send(fx->pool, &fx->target, &q, &CB, &c, &r),
                   OM_EINVAL);
  fx_free(fx);
}

static void allocation_failures_in_send_leave_nothing(void **state) {
  fx_t *fx = fx_new();
  (void)state;
  for (long n = 0;; n++) {
    call_t c;
    om_upstream_request_t q;
    int rc;
    memset(&c, 0, sizeof c);
    memset(&q, 0, sizeof q);
    q.method = "POST";
    q.target = "/echo";
    q.body = "abcdef";
    q.body_len = 6;
    q.http2 = 1;
    om_test_fail_alloc_after(n);
    rc = om_upstream_send(fx->pool, &fx->target, &q, &CB, &c, &c.r);
    om_test_alloc_reset();
    if (rc != 0) {
      assert_int_equal(rc, OM_ENOMEM); /* and nothing leaked: ASan */
      continue;
    }
    run_until(fx, &c.done, 3000);
    assert_int_equal(c.done, 1);
    if (c.err == 0) {
      assert_string_equal(c.body, "got 6");
      break;
    }
  }
  fx_free(fx);
}

static void h2_over_tls_by_alpn(void **state) {
  fx_t *fx = fx_new_with("h2,http/1.1");
  om_upstream_stats_t st;
  call_t a, b;
  (void)state;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  send_get(fx, &a, "/trailers", 0);
  send_get(fx, &b, "/hello", 0);
  run_until(fx, &a.done, 5000);
  run_until(fx, &b.done, 5000);
  assert_int_equal(a.err, 0);
  assert_string_equal(a.body, "abc");
  assert_string_equal(a.trailers, "grpc-status=0;grpc-message=fine;");
  assert_int_equal(b.err, 0);
  assert_string_equal(b.body, "hello");
  assert_int_equal(om_upstream_pool_stats(fx->pool, &st), 0);
  OM_ASSERT_CMP(st.connects, ==, 1); /* both streams on one TLS connection */
  OM_ASSERT_CMP(st.tls_handshakes, ==, 1);
  fx_free(fx);
}

static void server_without_h2_fails_the_connect(void **state) {
  fx_t *fx = fx_new_with("http/1.1");
  call_t c;
  (void)state;
  memset(&c, 0, sizeof c);
  send_get(fx, &c, "/hello", 0);
  run_until(fx, &c.done, 5000);
  assert_int_equal(c.fail, OM_UPSTREAM_FAIL_CONNECT);
  assert_int_equal(c.sent, 0);
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* a scripted HTTP/2 server: raw nghttp2 on a libuv socket */

enum { RAW_REFUSE, RAW_GOAWAY, RAW_RESET_AFTER_HEAD, RAW_BIG_HEAD };

typedef struct raw_s {
  uv_tcp_t lis, conn;
  nghttp2_session *ss;
  int mode, port, accepted;
  int32_t reset_id; /* reset after the head went out */
  char rbuf[65536];
} raw_t;

static void raw_send(raw_t *rs) {
  const uint8_t *d;
  ssize_t n;
  while ((n = nghttp2_session_mem_send(rs->ss, &d)) > 0) {
    uv_buf_t b = uv_buf_init((char *)d, (unsigned)n);
    /* small frames: the kernel takes them at once on loopback */
    assert_int_equal(uv_try_write((uv_stream_t *)&rs->conn, &b, 1), n);
  }
}

static int raw_frame(nghttp2_session *ss, const nghttp2_frame *f, void *ud) {
  raw_t *rs = ud;
  static char big[2000];
  int32_t id = f->hd.stream_id;
  if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
    return 0;
  switch (rs->mode) {
  case RAW_REFUSE:
    nghttp2_submit_rst_stream(ss, NGHTTP2_FLAG_NONE, id,
                              NGHTTP2_REFUSED_STREAM);
    break;
  case RAW_GOAWAY: /* nothing was processed */
    nghttp2_submit_goaway(ss, NGHTTP2_FLAG_NONE, 0, NGHTTP2_NO_ERROR, NULL, 0);
    break;
  case RAW_RESET_AFTER_HEAD: {
    nghttp2_nv nv[] = {{(uint8_t *)":status", (uint8_t *)"200", 7, 3, 0}};
    nghttp2_submit_headers(ss, NGHTTP2_FLAG_NONE, id, NULL, nv, 1, NULL);
    rs->reset_id = id; /* once the head is on the wire (raw_read) */
    break;
  }
  case RAW_BIG_HEAD: {
    nghttp2_nv nv[] = {{(uint8_t *)":status", (uint8_t *)"200", 7, 3, 0},
                       {(uint8_t *)"x-big", (uint8_t *)big, 5, sizeof big, 0}};
    memset(big, 'b', sizeof big);
    nghttp2_submit_headers(ss, NGHTTP2_FLAG_END_STREAM, id, NULL, nv, 2, NULL);
    break;
  }
  }
  return 0;
}

static void raw_alloc(uv_handle_t *h, size_t sz, uv_buf_t *b) {
  raw_t *rs = h->data;
  (void)sz;
  *b = uv_buf_init(rs->rbuf, sizeof rs->rbuf);
}

static void raw_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b) {
  raw_t *rs = st->data;
  if (n <= 0)
    return;
  assert_true(nghttp2_session_mem_recv(rs->ss, (const uint8_t *)b->base,
                                       (size_t)n) >= 0);
  raw_send(rs);
  if (rs->reset_id > 0) {
    nghttp2_submit_rst_stream(rs->ss, NGHTTP2_FLAG_NONE, rs->reset_id,
                              NGHTTP2_INTERNAL_ERROR);
    rs->reset_id = 0;
    raw_send(rs);
  }
}

static void raw_accept(uv_stream_t *lis, int status) {
  raw_t *rs = lis->data;
  nghttp2_session_callbacks *cbs;
  nghttp2_settings_entry iv = {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 100};
  assert_int_equal(status, 0);
  assert_int_equal(rs->accepted++, 0);
  uv_tcp_init(lis->loop, &rs->conn);
  rs->conn.data = rs;
  assert_int_equal(uv_accept(lis, (uv_stream_t *)&rs->conn), 0);
  nghttp2_session_callbacks_new(&cbs);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, raw_frame);
  assert_int_equal(nghttp2_session_server_new(&rs->ss, cbs, rs), 0);
  nghttp2_session_callbacks_del(cbs);
  nghttp2_submit_settings(rs->ss, NGHTTP2_FLAG_NONE, &iv, 1);
  uv_read_start((uv_stream_t *)&rs->conn, raw_alloc, raw_read);
}

static void raw_start(fx_t *fx, raw_t *rs, int mode) {
  struct sockaddr_in sa;
  int len = sizeof sa;
  memset(rs, 0, sizeof *rs);
  rs->mode = mode;
  uv_tcp_init(&fx->loop, &rs->lis);
  rs->lis.data = rs;
  uv_ip4_addr("127.0.0.1", 0, &sa);
  assert_int_equal(uv_tcp_bind(&rs->lis, (struct sockaddr *)&sa, 0), 0);
  assert_int_equal(uv_listen((uv_stream_t *)&rs->lis, 8, raw_accept), 0);
  uv_tcp_getsockname(&rs->lis, (struct sockaddr *)&sa, &len);
  rs->port = ntohs(sa.sin_port);
}

static void raw_stop(fx_t *fx, raw_t *rs) {
  uv_close((uv_handle_t *)&rs->lis, NULL);
  if (rs->accepted)
    uv_close((uv_handle_t *)&rs->conn, NULL);
  run_for(fx, 10);
  nghttp2_session_del(rs->ss);
}

/* One POST to the scripted server in mode, from a pool whose response
 * heads may be max_header_bytes (0: the default); how it ended. */
static void raw_post(int mode, size_t max_header_bytes, call_t *c) {
  fx_t *fx = fx_new();
  raw_t rs;
  om_upstream_target_t t;
  om_upstream_request_t q;
  if (max_header_bytes != 0) {
    om_upstream_pool_opts_t po = {.max_header_bytes = max_header_bytes};
    om_upstream_pool_close(fx->pool, NULL, NULL);
    assert_int_equal(om_upstream_pool_new(&fx->loop, &po, &fx->pool), 0);
  }
  raw_start(fx, &rs, mode);
  assert_int_equal(om_upstream_target_init(&t, "127.0.0.1", rs.port), 0);
  memset(c, 0, sizeof *c);
  memset(&q, 0, sizeof q);
  q.method = "POST";
  q.target = "/pay";
  q.body = "{}";
  q.body_len = 2;
  q.http2 = 1;
  assert_int_equal(om_upstream_send(fx->pool, &t, &q, &CB, c, &c->r), 0);
  run_until(fx, &c->done, 3000);
  assert_int_equal(c->done, 1);
  om_upstream_pool_close(fx->pool, on_pool_closed, fx);
  run_until(fx, &fx->pool_closed, 3000);
  raw_stop(fx, &rs);
  fx_free(fx);
}

static void refused_stream_was_not_processed(void **state) {
  call_t c;
  (void)state;
  raw_post(RAW_REFUSE, 0, &c);
  assert_int_equal(c.fail, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE);
  assert_int_equal(c.sent, 0); /* RFC 9113 8.7: safe to send again */
}

static void stream_past_goaway_was_not_processed(void **state) {
  call_t c;
  (void)state;
  raw_post(RAW_GOAWAY, 0, &c);
  assert_int_equal(c.fail, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE);
  assert_int_equal(c.sent, 0);
}

static void reset_after_head_cuts_the_body(void **state) {
  call_t c;
  (void)state;
  raw_post(RAW_RESET_AFTER_HEAD, 0, &c);
  assert_int_equal(c.status, 200);
  assert_int_equal(c.fail, OM_UPSTREAM_FAIL_RESET_MID_BODY);
  assert_int_equal(c.sent, 1);
}

static void head_over_the_limit_is_malformed(void **state) {
  call_t c;
  (void)state;
  raw_post(RAW_BIG_HEAD, 1024, &c); /* 2,000 bytes sent */
  assert_int_equal(c.status, 0);    /* never delivered */
  assert_int_equal(c.fail, OM_UPSTREAM_FAIL_MALFORMED);
  assert_int_equal(c.err, OM_ETOOBIG);
}

static int group_setup(void **state) {
  char cmd[1024];
  (void)state;
  if (!mkdtemp(certs))
    return -1;
  snprintf(cmd, sizeof cmd, "%s/tests/fixtures/tls_certs.sh %s", OM_SOURCE_DIR,
           certs);
  return system(cmd) == 0 ? 0 : -1;
}

static int group_teardown(void **state) {
  char cmd[600];
  (void)state;
  snprintf(cmd, sizeof cmd, "rm -rf %s", certs);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(trailers_reach_on_trailers_before_done),
      cmocka_unit_test(bodiless_answer_is_trailers_only),
      cmocka_unit_test(streams_share_one_connection),
      cmocka_unit_test(streamed_body_arrives_whole),
      cmocka_unit_test(paused_stream_holds_the_server_at_its_window),
      cmocka_unit_test(
          stalled_server_trips_first_byte_and_keeps_the_connection),
      cmocka_unit_test(refused_connect_sent_nothing),
      cmocka_unit_test(pool_close_ends_streams_in_flight),
      cmocka_unit_test(upgrade_is_refused),
      cmocka_unit_test(allocation_failures_in_send_leave_nothing),
      cmocka_unit_test(h2_over_tls_by_alpn),
      cmocka_unit_test(server_without_h2_fails_the_connect),
      cmocka_unit_test(refused_stream_was_not_processed),
      cmocka_unit_test(stream_past_goaway_was_not_processed),
      cmocka_unit_test(reset_after_head_cuts_the_body),
      cmocka_unit_test(head_over_the_limit_is_malformed),
  };
  signal(SIGPIPE, SIG_IGN);
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
