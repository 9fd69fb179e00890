/*
 * test_upstream_tls.c: the upstream client to https:// peers, on real
 * loopback sockets, against a TLS HTTP/1.1 server written here with raw
 * libuv TCP and the server side of the same engine (om_tls.h), with
 * throwaway certificates from tests/fixtures/tls_certs.sh.
 *
 * The server answers every request with `200` and a body of the size the
 * path asks for (`/size/N`), keeps connections alive unless the path is
 * `/close`, reads request bodies by Content-Length or chunked (counted,
 * echoed as X-Got), and can be told to never answer (a stalled handshake)
 * or to speak plaintext on a TLS port.
 */
#define _GNU_SOURCE /* memmem, strcasestr */
#include "om_test.h"

#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <uv.h>

#include "om_errno.h"
#include "om_tls.h"
#include "om_upstream.h"

static char dir[] = "/tmp/om_test_uptls_XXXXXX";

static const char *P(const char *name) {
  static char b[8][512];
  static int i;
  char *s = b[i++ % 8];
  snprintf(s, sizeof b[0], "%s/%s", dir, name);
  return s;
}

static int setup(void **state) {
  char cmd[1024];
  signal(SIGPIPE, SIG_IGN);
  if (!mkdtemp(dir))
    return -1;
  snprintf(cmd, sizeof cmd, "%s/tests/fixtures/tls_certs.sh %s", OM_SOURCE_DIR,
           dir);
  return system(cmd) == 0 ? 0 : -1;
}

static int teardown(void **state) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) == 0 ? 0 : -1;
}

/* ------------------------------------------------------------------ */
/* the TLS server */

enum { S_TLS, S_SILENT, S_PLAIN };

typedef struct srv_s srv_t;

typedef struct {
  uv_tcp_t tcp;
  srv_t *srv;
  om_tls_t *tls;
  char in[1 << 19];
  size_t in_len;
  int closing;
} sconn_t;

typedef struct wr_s {
  uv_write_t w;
  size_t len;
  char data[];
} wr_t;

struct srv_s {
  uv_tcp_t lis;
  om_tls_ctx_t *ctx;
  int mode;
  int port;
  int accepted, requests, handshakes;
  size_t last_body;
  char last_identity[128];
};

static void sc_closed(uv_handle_t *h) {
  sconn_t *sc = h->data;
  om_tls_free(sc->tls);
  free(sc);
}

static void sc_close(sconn_t *sc) {
  if (!sc->closing) {
    sc->closing = 1;
    uv_close((uv_handle_t *)&sc->tcp, sc_closed);
  }
}

static void on_wr(uv_write_t *w, int status) {
  free(w);
}

static void sc_send_raw(sconn_t *sc, const char *d, size_t n) {
  wr_t *w = malloc(sizeof *w + n);
  if (w == NULL) { /* allocation fault injection reaches here too */
    sc_close(sc);
    return;
  }
  memcpy(w->data, d, n);
  uv_buf_t b = uv_buf_init(w->data, (unsigned)n);
  if (uv_write(&w->w, (uv_stream_t *)&sc->tcp, &b, 1, on_wr) != 0)
    free(w);
}

static void sc_flush(sconn_t *sc) {
  size_t n = om_tls_out_pending(sc->tls);
  if (n == 0)
    return;
  char *buf = malloc(n);
  if (buf == NULL) {
    sc_close(sc);
    return;
  }
  n = om_tls_out_take(sc->tls, buf, n);
  sc_send_raw(sc, buf, n);
  free(buf);
}

/* Answer the requests complete in sc->in; returns 0 to go on. */
static int sc_serve(sconn_t *sc) {
  for (;;) {
    char *end = memmem(sc->in, sc->in_len, "\r\n\r\n", 4);
    if (end == NULL)
      return 0;
    size_t head = (size_t)(end - sc->in) + 4, body = 0, used;
    char h[4096];
    snprintf(h, sizeof h, "%.*s", (int)head, sc->in);
    const char *cl = strcasestr(h, "\r\ncontent-length:");
    int chunked = strcasestr(h, "\r\ntransfer-encoding: chunked") != NULL;
    if (cl != NULL)
      body = strtoul(cl + 17, NULL, 10);
    used = head + body;
    if (chunked) { /* count the data of complete chunks up to 0\r\n\r\n */
      size_t i = head;
      body = 0;
      for (;;) {
        char *e = memmem(sc->in + i, sc->in_len - i, "\r\n", 2);
        if (e == NULL)
          return 0;
        size_t sz = strtoul(sc->in + i, NULL, 16);
        i = (size_t)(e - sc->in) + 2;
        if (i + sz + 2 > sc->in_len)
          return 0;
        i += sz + 2;
        body += sz;
        if (sz == 0)
          break;
      }
      used = i;
    }
    if (used > sc->in_len)
      return 0;
    sc->srv->requests++;
    sc->srv->last_body = body;
    int close = strncmp(strchr(h, ' ') + 1, "/close", 6) == 0;
    size_t size = 5;
    const char *sz = strstr(h, " /size/");
    if (sz != NULL)
      size = strtoul(sz + 7, NULL, 10);
    char hd[256];
    int hn = snprintf(hd, sizeof hd,
                      "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nX-Got: "
                      "%zu\r\n%s\r\n",
                      size, body, close ? "Connection: close\r\n" : "");
    om_tls_write(sc->tls, hd, (size_t)hn);
    char *b = malloc(size + 1);
    if (b == NULL) {
      sc_close(sc);
      return 1;
    }
    for (size_t i = 0; i < size; i++)
      b[i] = (char)('a' + i % 26);
    om_tls_write(sc->tls, b, size);
    free(b);
    if (close)
      om_tls_shutdown(sc->tls);
    sc_flush(sc);
    memmove(sc->in, sc->in + used, sc->in_len - used);
    sc->in_len -= used;
    if (close) {
      sc_close(sc);
      return 1;
    }
  }
}

static void sc_alloc(uv_handle_t *h, size_t sug, uv_buf_t *b) {
  static char buf[1 << 16];
  b->base = buf;
  b->len = sizeof buf;
}

static void sc_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  sconn_t *sc = s->data;
  if (n < 0) {
    sc_close(sc);
    return;
  }
  if (n == 0 || sc->closing)
    return;
  srv_t *srv = sc->srv;
  if (srv->mode == S_SILENT)
    return;
  if (srv->mode == S_PLAIN) {
    static const char r[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0"
                            "\r\nConnection: close\r\n\r\n";
    sc_send_raw(sc, r, sizeof r - 1);
    sc_close(sc);
    return;
  }
  om_tls_feed(sc->tls, b->base, (size_t)n);
  if (!om_tls_handshake_done(sc->tls)) {
    int rc = om_tls_handshake(sc->tls);
    sc_flush(sc);
    if (rc == OM_EIO) {
      sc_close(sc);
      return;
    }
    if (rc != 0)
      return;
    srv->handshakes++;
    om_tls_identity_t *id = NULL;
    srv->last_identity[0] = 0;
    if (om_tls_peer_identity(sc->tls, &id) == 0) {
      snprintf(srv->last_identity, sizeof srv->last_identity, "%s",
               id->n_uris ? id->uris[0] : id->subject);
      om_tls_identity_free(id);
    }
  }
  for (;;) {
    size_t got = 0;
    int rc = om_tls_read(sc->tls, sc->in + sc->in_len,
                         sizeof sc->in - sc->in_len, &got);
    sc_flush(sc);
    if (rc != 0) {
      if (rc != OM_TLS_WANT_READ)
        sc_close(sc);
      break;
    }
    sc->in_len += got;
    if (sc_serve(sc) != 0)
      return;
  }
}

static void on_accept(uv_stream_t *l, int status) {
  srv_t *srv = l->data;
  sconn_t *sc = calloc(1, sizeof *sc);
  if (sc == NULL)
    return; /* the connection waits in the backlog */
  sc->srv = srv;
  uv_tcp_init(l->loop, &sc->tcp);
  sc->tcp.data = sc;
  if (uv_accept(l, (uv_stream_t *)&sc->tcp) != 0) {
    sc_close(sc);
    return;
  }
  srv->accepted++;
  if (om_tls_new(srv->ctx, NULL, &sc->tls, NULL, 0) != 0) {
    sc_close(sc); /* only under allocation fault injection */
    return;
  }
  uv_read_start((uv_stream_t *)&sc->tcp, sc_alloc, sc_read);
}

static void srv_start(srv_t *srv, uv_loop_t *loop, const char *cert,
                      const char *key, const char *client_ca) {
  memset(srv, 0, sizeof *srv);
  om_tls_opts_t o = {.role = OM_TLS_SERVER,
                     .cert_file = P(cert),
                     .key_file = P(key),
                     .client_ca_file = client_ca ? P(client_ca) : NULL};
  char err[256];
  if (om_tls_ctx_new(&o, &srv->ctx, err, sizeof err) != 0)
    fail_msg("server ctx: %s", err);
  struct sockaddr_in a;
  uv_ip4_addr("127.0.0.1", 0, &a);
  uv_tcp_init(loop, &srv->lis);
  srv->lis.data = srv;
  assert_int_equal(uv_tcp_bind(&srv->lis, (struct sockaddr *)&a, 0), 0);
  assert_int_equal(uv_listen((uv_stream_t *)&srv->lis, 64, on_accept), 0);
  struct sockaddr_storage ss;
  int len = sizeof ss;
  uv_tcp_getsockname(&srv->lis, (struct sockaddr *)&ss, &len);
  srv->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static void walk_close(uv_handle_t *h, void *arg) {
  if (!uv_is_closing(h)) {
    if (h->type == UV_TCP && h->data != NULL && h->data != arg) {
      sc_close(h->data);
      return;
    }
    uv_close(h, NULL);
  }
}

/* ------------------------------------------------------------------ */
/* the client side */

typedef struct {
  uv_loop_t loop;
  srv_t srv;
  om_upstream_pool_t *pool;
  om_tls_ctx_t *cctx;
  om_upstream_target_t tgt;
  int closed;
} fx_t;

typedef struct {
  int done, status;
  om_upstream_result_t res;
  size_t body;
  char got[32];
} call_t;

static int on_headers(void *ud, const om_upstream_response_t *r) {
  call_t *c = ud;
  c->status = r->status;
  for (size_t i = 0; i < r->n_headers; i++)
    if (strcasecmp(r->headers[i].name, "x-got") == 0)
      snprintf(c->got, sizeof c->got, "%s", r->headers[i].value);
  return 0;
}

static void on_body(void *ud, const char *d, size_t n) {
  call_t *c = ud;
  for (size_t i = 0; i < n; i++)
    if (d[i] != (char)('a' + (c->body + i) % 26))
      fail_msg("body byte %zu: %c", c->body + i, d[i]);
  c->body += n;
}

static void on_done(void *ud, const om_upstream_result_t *res) {
  call_t *c = ud;
  c->res = *res;
  c->done = 1;
}

static const om_upstream_callbacks_t CB = {on_headers, on_body, on_done, NULL};

#define RUN_UNTIL(fx, cond, ms)                                                \
  do {                                                                         \
    uint64_t t0_ = uv_hrtime();                                                \
    while (!(cond) && uv_hrtime() - t0_ < (uint64_t)(ms)*1000000u)             \
      uv_run(&(fx)->loop, UV_RUN_NOWAIT);                                      \
  } while (0)

static om_tls_ctx_t *client_ctx(const char *ca, const char *cert,
                                const char *key) {
  om_tls_opts_t o = {.role = OM_TLS_CLIENT,
                     .ca_file = ca ? P(ca) : NULL,
                     .cert_file = cert ? P(cert) : NULL,
                     .key_file = key ? P(key) : NULL};
  om_tls_ctx_t *c;
  char err[256];
  if (om_tls_ctx_new(&o, &c, err, sizeof err) != 0)
    fail_msg("client ctx: %s", err);
  return c;
}

static fx_t *fx_new(const char *cert, const char *key, const char *client_ca,
                    om_tls_ctx_t *cctx) {
  fx_t *fx = calloc(1, sizeof *fx);
  assert_int_equal(uv_loop_init(&fx->loop), 0);
  srv_start(&fx->srv, &fx->loop, cert, key, client_ca);
  fx->cctx = cctx ? cctx : client_ctx("ca.pem", NULL, NULL);
  om_upstream_pool_opts_t po = {.tls_ctx = fx->cctx};
  assert_int_equal(om_upstream_pool_new(&fx->loop, &po, &fx->pool), 0);
  char url[64];
  snprintf(url, sizeof url, "https://127.0.0.1:%d", fx->srv.port);
  const char *why = NULL;
  assert_int_equal(om_upstream_target_from_url(&fx->tgt, url, &why), 0);
  return fx;
}

static void on_closed(void *ud) {
  *(int *)ud = 1;
}

static void fx_free(fx_t *fx) {
  om_upstream_pool_close(fx->pool, on_closed, &fx->closed);
  RUN_UNTIL(fx, fx->closed, 3000);
  assert_true(fx->closed);
  uv_walk(&fx->loop, walk_close, &fx->srv);
  uv_run(&fx->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&fx->loop), 0);
  om_tls_ctx_unref(fx->srv.ctx);
  om_tls_ctx_unref(fx->cctx);
  free(fx);
}

static void call_on(fx_t *fx, const om_upstream_target_t *t,
                    om_upstream_request_t *q, call_t *c) {
  om_upstream_req_t *r;
  memset(c, 0, sizeof *c);
  if (q->connect_timeout_ms == 0)
    q->connect_timeout_ms = 3000;
  q->timeout_ms = 5000;
  assert_int_equal(om_upstream_send(fx->pool, t, q, &CB, c, &r), 0);
  RUN_UNTIL(fx, c->done, 6000);
  assert_true(c->done);
}

static void get(fx_t *fx, const char *path, call_t *c) {
  om_upstream_request_t q = {.method = "GET", .target = path};
  call_on(fx, &fx->tgt, &q, c);
}

/* ------------------------------------------------------------------ */
/* tests */

static void https_url_sets_tls_host_and_port(void **state) {
  om_upstream_url_t u;
  om_upstream_target_t t;
  const char *why = NULL;
  assert_int_equal(om_upstream_parse_url("https://127.0.0.1/p", &u, &why), 0);
  assert_int_equal(u.tls, 1);
  assert_int_equal(u.port, 443);
  assert_int_equal(om_upstream_parse_url("HTTPS://[::1]:8443", &u, &why), 0);
  assert_int_equal(u.port, 8443);
  assert_int_equal(om_upstream_target_from_url(&t, "https://10.0.0.1", &why),
                   0);
  assert_int_equal(t.tls, 1);
  assert_string_equal(t.host, "10.0.0.1");
  assert_string_equal(t.authority, "10.0.0.1");
  assert_int_equal(ntohs(t.addr.in4.sin_port), 443);
  assert_int_equal(om_upstream_target_from_url(&t, "https://[::1]:80", &why),
                   0);
  assert_string_equal(t.authority, "[::1]:80");
  assert_string_equal(t.host, "::1");
  assert_int_equal(om_upstream_target_from_url(&t, "http://10.0.0.1", &why), 0);
  assert_int_equal(t.tls, 0);
  assert_string_equal(t.host, "");
  assert_int_equal(om_upstream_parse_url("https://1.2.3.4?q", &u, &why),
                   OM_EPARSE);
}

static void requests_over_tls_reuse_and_resume(void **state) {
  fx_t *fx = fx_new("server.pem", "server.key", NULL, NULL);
  call_t c;
  get(fx, "/size/5", &c);
  assert_int_equal(c.res.err, 0);
  assert_int_equal(c.status, 200);
  OM_ASSERT_CMP(c.body, ==, 5);
  assert_int_equal(c.res.tls_handshake, 1);
  assert_int_equal(c.res.reused, 0);

  /* keep-alive: the same TLS connection */
  get(fx, "/size/300000", &c);
  assert_int_equal(c.res.err, 0);
  OM_ASSERT_CMP(c.body, ==, 300000);
  assert_int_equal(c.res.reused, 1);
  assert_int_equal(c.res.tls_handshake, 0);
  OM_ASSERT_CMP(fx->srv.accepted, ==, 1);

  /* a POST body, then a closing answer */
  static char big[100000];
  memset(big, 'x', sizeof big);
  om_upstream_request_t q = {.method = "POST",
                             .target = "/close",
                             .body = big,
                             .body_len = sizeof big};
  call_on(fx, &fx->tgt, &q, &c);
  assert_int_equal(c.res.err, 0);
  assert_string_equal(c.got, "100000");

  /* a new connection resumes the session */
  get(fx, "/size/7", &c);
  assert_int_equal(c.res.err, 0);
  assert_int_equal(c.res.reused, 0);
  assert_int_equal(c.res.tls_handshake, 2);
  OM_ASSERT_CMP(fx->srv.accepted, ==, 2);

  om_upstream_stats_t st;
  assert_int_equal(om_upstream_peer_stats(fx->pool, &fx->tgt, &st), 0);
  OM_ASSERT_CMP(st.tls_handshakes, ==, 2);
  OM_ASSERT_CMP(st.tls_resumed, ==, 1);
  OM_ASSERT_CMP(st.tls_failures, ==, 0);
  OM_ASSERT_CMP(st.requests, ==, 4);
  OM_ASSERT_CMP(st.reuses, ==, 2);
  fx_free(fx);
}

static void pool_keys_by_name(void **state) {
  fx_t *fx = fx_new("server.pem", "server.key", NULL, NULL);
  call_t c;
  get(fx, "/", &c);
  assert_int_equal(c.res.err, 0);
  /* the same address by name: its own connection, verified as localhost */
  om_upstream_target_t byname = fx->tgt;
  snprintf(byname.host, sizeof byname.host, "localhost");
  om_upstream_request_t q = {.method = "GET", .target = "/"};
  call_on(fx, &byname, &q, &c);
  assert_int_equal(c.res.err, 0);
  assert_int_equal(c.res.reused, 0);
  OM_ASSERT_CMP(fx->srv.accepted, ==, 2);
  call_on(fx, &byname, &q, &c);
  assert_int_equal(c.res.reused, 1);
  /* the plaintext peer at the same address is another peer again */
  om_upstream_target_t plain = fx->tgt;
  plain.tls = 0;
  plain.host[0] = 0;
  om_upstream_stats_t st;
  assert_int_equal(om_upstream_peer_stats(fx->pool, &plain, &st), OM_ENOTFOUND);
  /* the address, told to prove a name: another peer again */
  om_upstream_request_t qn = {
      .method = "GET", .target = "/", .tls_server_name = "localhost"};
  call_on(fx, &fx->tgt, &qn, &c);
  assert_int_equal(c.res.err, 0);
  assert_int_equal(c.res.reused, 0);
  OM_ASSERT_CMP(fx->srv.accepted, ==, 3);
  qn.tls_server_name = "wrong.example";
  call_on(fx, &fx->tgt, &qn, &c);
  assert_int_equal(c.res.tls_fail, OM_TLS_FAIL_HOSTNAME);
  /* a name the certificate does not carry fails on its own */
  snprintf(byname.host, sizeof byname.host, "other.example");
  call_on(fx, &byname, &q, &c);
  assert_int_equal(c.res.fail, OM_UPSTREAM_FAIL_CONNECT);
  assert_int_equal(c.res.tls_fail, OM_TLS_FAIL_HOSTNAME);
  fx_free(fx);
}

static void expect_verify_failure(const char *cert, const char *key,
                                  om_tls_fail_t want, const char *detail) {
  fx_t *fx = fx_new(cert, key, NULL, NULL);
  call_t c;
  om_upstream_request_t q = {
      .method = "POST", .target = "/", .body = "x", .body_len = 1};
  call_on(fx, &fx->tgt, &q, &c);
  assert_int_equal(c.res.fail, OM_UPSTREAM_FAIL_CONNECT);
  assert_string_equal(c.res.reason, "connect");
  assert_int_equal(c.res.sent, 0); /* pre-send: any method may go again */
  assert_int_equal(c.res.headers_delivered, 0);
  if (c.res.tls_fail != (int)want)
    fail_msg("%s: tls_fail %s, want %s (%s)", cert,
             om_tls_fail_name(c.res.tls_fail), om_tls_fail_name(want),
             c.res.detail);
  assert_string_equal(c.res.detail, detail);
  OM_ASSERT_CMP(fx->srv.requests, ==, 0);
  om_upstream_stats_t st;
  assert_int_equal(om_upstream_pool_stats(fx->pool, &st), 0);
  OM_ASSERT_CMP(st.tls_failures, ==, 1);
  OM_ASSERT_CMP(st.tls_handshakes, ==, 0);
  fx_free(fx);
}

static void verification_failures_are_connect_failures(void **state) {
  expect_verify_failure("wrong.pem", "wrong.key", OM_TLS_FAIL_HOSTNAME,
                        "certificate verify failed: hostname mismatch");
  expect_verify_failure("expired.pem", "expired.key", OM_TLS_FAIL_EXPIRED,
                        "certificate verify failed: certificate has expired");
  expect_verify_failure(
      "untrusted.pem", "untrusted.key", OM_TLS_FAIL_UNTRUSTED,
      "certificate verify failed: unable to get local issuer certificate");
}

static void handshake_within_the_connect_timeout(void **state) {
  fx_t *fx = fx_new("server.pem", "server.key", NULL, NULL);
  fx->srv.mode = S_SILENT;
  call_t c;
  om_upstream_request_t q = {
      .method = "GET", .target = "/", .connect_timeout_ms = 150};
  uint64_t t0 = uv_hrtime();
  call_on(fx, &fx->tgt, &q, &c);
  uint64_t ms = (uv_hrtime() - t0) / 1000000u;
  assert_int_equal(c.res.fail, OM_UPSTREAM_FAIL_TIMEOUT_CONNECT);
  assert_int_equal(c.res.sent, 0);
  assert_string_equal(c.res.detail,
                      "the connect timeout passed in the TLS handshake");
  OM_ASSERT_CMP(ms, >=, 140);
  OM_ASSERT_CMP(ms, <, 2000);

  /* a plaintext server on the TLS port: the handshake fails */
  fx->srv.mode = S_PLAIN;
  q.connect_timeout_ms = 0;
  call_on(fx, &fx->tgt, &q, &c);
  assert_int_equal(c.res.fail, OM_UPSTREAM_FAIL_CONNECT);
  assert_int_equal(c.res.sent, 0);
  OM_ASSERT_CMP(c.res.tls_fail, !=, 0);
  fx_free(fx);
}

static void client_certificate_to_upstream(void **state) {
  om_tls_ctx_t *cc = client_ctx("ca.pem", "client-a.pem", "client-a.key");
  fx_t *fx = fx_new("server.pem", "server.key", "ca.pem", cc);
  call_t c;
  get(fx, "/", &c);
  assert_int_equal(c.res.err, 0);
  assert_string_equal(fx->srv.last_identity, "spiffe://mesh/ns/a/sa/x");

  /* the request's own context overrides the pool's: no certificate, and
   * the server refuses it (TLS 1.3: after the client's handshake) */
  om_tls_ctx_t *anon = client_ctx("ca.pem", NULL, NULL);
  om_upstream_request_t q = {.method = "GET", .target = "/", .tls_ctx = anon};
  call_on(fx, &fx->tgt, &q, &c);
  assert_int_not_equal(c.res.err, 0);
  assert_int_equal(c.res.headers_delivered, 0);
  OM_ASSERT_CMP(fx->srv.requests, ==, 1);
  om_tls_ctx_unref(anon);
  fx_free(fx);
}

/* A streamed request body (chunked) over TLS. */
typedef struct {
  om_upstream_req_t *r;
  int left;
} feeder_t;

static void streamed_body_over_tls(void **state) {
  fx_t *fx = fx_new("server.pem", "server.key", NULL, NULL);
  call_t c;
  memset(&c, 0, sizeof c);
  om_upstream_request_t q = {.method = "POST",
                             .target = "/size/3",
                             .body_stream = 1,
                             .body_stream_length = -1,
                             .timeout_ms = 5000};
  om_upstream_req_t *r;
  assert_int_equal(om_upstream_send(fx->pool, &fx->tgt, &q, &CB, &c, &r), 0);
  static char piece[20000];
  memset(piece, 'y', sizeof piece);
  for (int i = 0; i < 10; i++) {
    assert_int_equal(om_upstream_body_write(r, piece, sizeof piece), 0);
    RUN_UNTIL(fx, om_upstream_body_pending(r) == 0, 2000);
  }
  assert_int_equal(om_upstream_body_end(r), 0);
  RUN_UNTIL(fx, c.done, 5000);
  assert_true(c.done);
  assert_int_equal(c.res.err, 0);
  assert_string_equal(c.got, "200000");
  OM_ASSERT_CMP(c.body, ==, 3);
  fx_free(fx);
}

/* A response paused after every piece and resumed from the loop: the
 * bytes the engine still holds (decrypted or not) come out on resume. */
typedef struct {
  call_t c;
  om_upstream_req_t *r;
  uv_idle_t idle;
  int pauses;
} pauser_t;

static void on_resume_idle(uv_idle_t *h) {
  pauser_t *p = h->data;
  uv_idle_stop(h);
  if (!p->c.done)
    om_upstream_resume(p->r);
}

static void on_body_pause(void *ud, const char *d, size_t n) {
  pauser_t *p = ud;
  on_body(&p->c, d, n);
  if (om_upstream_pause(p->r) == 0) {
    p->pauses++;
    uv_idle_start(&p->idle, on_resume_idle);
  }
}

static int on_headers_p(void *ud, const om_upstream_response_t *r) {
  return on_headers(&((pauser_t *)ud)->c, r);
}

static void on_done_p(void *ud, const om_upstream_result_t *res) {
  on_done(&((pauser_t *)ud)->c, res);
}

static void paused_responses_resume_from_the_engine(void **state) {
  fx_t *fx = fx_new("server.pem", "server.key", NULL, NULL);
  static const om_upstream_callbacks_t PCB = {on_headers_p, on_body_pause,
                                              on_done_p, NULL};
  pauser_t p;
  memset(&p, 0, sizeof p);
  uv_idle_init(&fx->loop, &p.idle);
  p.idle.data = &p;
  om_upstream_request_t q = {
      .method = "GET", .target = "/size/500000", .timeout_ms = 5000};
  assert_int_equal(om_upstream_send(fx->pool, &fx->tgt, &q, &PCB, &p, &p.r), 0);
  RUN_UNTIL(fx, p.c.done, 6000);
  assert_true(p.c.done);
  if (p.c.res.err != 0)
    fail_msg("%s (%s) after %zu bytes, %d pauses", p.c.res.reason,
             p.c.res.detail, p.c.body, p.pauses);
  OM_ASSERT_CMP(p.c.body, ==, 500000);
  OM_ASSERT_CMP(p.pauses, >, 5);
  uv_close((uv_handle_t *)&p.idle, NULL);
  /* and the connection went back to the pool in sync */
  call_t c;
  get(fx, "/size/10", &c);
  assert_int_equal(c.res.err, 0);
  assert_int_equal(c.res.reused, 1);
  OM_ASSERT_CMP(c.body, ==, 10);
  fx_free(fx);
}

static void allocation_failures(void **state) {
  fx_t *fx = fx_new("server.pem", "server.key", NULL, NULL);
  for (long n = 0;; n++) {
    call_t c;
    om_upstream_request_t q = {.method = "GET",
                               .target = "/close",
                               .connect_timeout_ms = 3000,
                               .timeout_ms = 5000};
    om_upstream_req_t *r;
    memset(&c, 0, sizeof c);
    om_test_fail_alloc_after(n);
    int rc = om_upstream_send(fx->pool, &fx->tgt, &q, &CB, &c, &r);
    if (rc != 0) {
      om_test_alloc_reset();
      assert_int_equal(rc, OM_ENOMEM);
      continue;
    }
    RUN_UNTIL(fx, c.done, 6000);
    om_test_alloc_reset();
    assert_true(c.done);
    if (c.res.err == 0)
      break;
    /* the client's own allocations, or the server's (same process) */
    OM_ASSERT_CMP(n, <, 10000);
  }
  fx_free(fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(https_url_sets_tls_host_and_port),
      cmocka_unit_test(requests_over_tls_reuse_and_resume),
      cmocka_unit_test(pool_keys_by_name),
      cmocka_unit_test(verification_failures_are_connect_failures),
      cmocka_unit_test(handshake_within_the_connect_timeout),
      cmocka_unit_test(client_certificate_to_upstream),
      cmocka_unit_test(streamed_body_over_tls),
      cmocka_unit_test(paused_responses_resume_from_the_engine),
      cmocka_unit_test(allocation_failures),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
