/*
 * test_http_server.c: the HTTP/1.1 server over real loopback sockets. The
 * server runs on a loop in this thread; the clients are non-blocking raw
 * sockets (tests/support/http_test_client.h) and every wait turns the loop.
 * Each test owns its loop and closes it fully (uv_loop_close must succeed).
 */
#define _DEFAULT_SOURCE /* struct tcp_info */
#include "om_test.h"

#include <inttypes.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_test_client.h"
#include "om_errno.h"
#include "om_http_chars.h"
#include "om_http_server.h"
#include "om_rng.h"

/* ------------------------------------------------------------------ */
/* fixture */

typedef struct fx_s {
  uv_loop_t loop;
  uv_timer_t timer;
  om_http_server_t *srv;
  int port;
  int closed;
  om_http_server_metrics_t final;
  int seen;
  char targets[64][48];
  int in_flight, max_in_flight;
  om_http_request_t *held[8];
  int n_held;
  int on_close_calls, on_close_end_rc;
  om_http_request_t *later;
  int later_rc;
  int misuse[15];
  size_t pending_after_write;
  int big_rc;
  om_tunnel_t *tun;
  int tun_rc, tun_eofs, tun_closes, tun_err;
  size_t tun_bytes;
  int lent_released, lent_rc, lent_released_at_return;
  size_t lent_pending;
} fx_t;

static char echo_buf[1 << 16]; /* test-only, single thread */
static htc_resp_t R[8];

static void on_later(uv_timer_t *t) {
  fx_t *fx = t->data;
  om_http_request_t *req = fx->later;
  fx->later = NULL;
  if (req == NULL)
    return;
  fx->in_flight--; /* before: responding may dispatch the next one */
  fx->later_rc = om_http_respond(req, 200, NULL, 0, "late", 4);
}

static void on_hold_close(om_http_request_t *req) {
  fx_t *fx = req->user;
  int i;
  fx->on_close_calls++;
  /* inside on_close the API refuses and does nothing */
  fx->on_close_end_rc = om_http_response_end(req);
  om_http_response_abort(req);
  for (i = 0; i < fx->n_held; i++)
    if (fx->held[i] == req) {
      fx->held[i] = fx->held[--fx->n_held];
      break;
    }
  fx->in_flight--;
}

static void echo(om_http_request_t *req) {
  const char *xv = om_http_request_header(req, "X-V", NULL);
  int k = snprintf(echo_buf, sizeof echo_buf,
                   "%s %s %s %s 1.%d %zu %zu [%s] %s\n", req->method,
                   req->target, req->path, req->query ? req->query : "-",
                   req->version_minor, req->n_headers, req->body_len,
                   xv ? xv : "-", req->n_headers ? req->headers[0].name : "-");
  size_t n = (size_t)k, b = req->body_len;
  om_http_header_t h[] = {{"Content-Type", "text/plain", 0, 0}};
  if (b > sizeof echo_buf - n)
    b = sizeof echo_buf - n;
  memcpy(echo_buf + n, req->body, b);
  om_http_respond(req, 200, h, 1, echo_buf, n + b);
}

static void misuse(fx_t *fx, om_http_request_t *req) {
  om_http_header_t crlf[] = {{"X-A", "a\r\nX-B: b", 0, 0}};
  om_http_header_t badname[] = {{"X A", "b", 0, 0}};
  om_http_header_t cl[] = {{"Content-Length", "3", 0, 0}};
  om_http_header_t te[] = {{"Transfer-Encoding", "chunked", 0, 0}};
  om_http_header_t conn[] = {{"Connection", "keep-alive", 0, 0}};
  fx->misuse[0] = om_http_respond(req, 200, crlf, 1, "x", 1);
  fx->misuse[1] = om_http_respond(req, 200, badname, 1, "x", 1);
  fx->misuse[2] = om_http_respond(req, 200, cl, 1, "abc", 3);
  fx->misuse[3] = om_http_respond(req, 204, NULL, 0, "x", 1);
  fx->misuse[4] = om_http_respond(req, 99, NULL, 0, NULL, 0);
  fx->misuse[5] = om_http_response_start(req, 200, te, 1);
  fx->misuse[6] = om_http_respond(req, 200, conn, 1, NULL, 0);
  /* fields the caller vouches for: the framing ones are still ours */
  fx->misuse[12] = om_http_response_start_checked(req, 200, te, 1);
  fx->misuse[13] = om_http_response_start_checked(req, 200, conn, 1);
  fx->misuse[14] = om_http_response_start_checked(req, 204, cl, 1);
  fx->misuse[7] = om_http_response_write(req, "x", 1); /* not started */
  fx->misuse[8] = om_http_response_start(req, 200, cl, 1);
  fx->misuse[9] = om_http_response_write(req, "abcd", 4); /* > CL */
  fx->misuse[10] = om_http_response_write(req, "abc", 3);
  fx->misuse[11] = om_http_response_end(req);
}

/* The tunnel echoes what it reads, and carries the client's half-close
 * back as its own. */
static void tun_data(void *ud, const char *data, size_t len) {
  fx_t *fx = ud;
  fx->tun_bytes += len;
  om_tunnel_write(fx->tun, data, len);
}

static void tun_eof(void *ud) {
  fx_t *fx = ud;
  fx->tun_eofs++;
  om_tunnel_shutdown(fx->tun);
}

static void tun_close(void *ud, int err) {
  fx_t *fx = ud;
  fx->tun_closes++;
  fx->tun_err = err;
  fx->tun = NULL;
}

static void upgrade_to_echo(fx_t *fx, om_http_request_t *req) {
  static const om_tunnel_callbacks_t cb = {tun_data, tun_eof, NULL, tun_close};
  om_http_header_t h[] = {{"Upgrade", "echo", 0, 0}};
  om_http_header_t conn[] = {{"Connection", "close", 0, 0}};
  /* the framing fields are the server's */
  fx->misuse[0] = om_http_response_upgrade(req, conn, 1, &cb, fx, &fx->tun);
  fx->tun_rc = om_http_response_upgrade(req, h, 1, &cb, fx, &fx->tun);
}

/* A lent buffer of the /lent routes: freed by its release, counted. */
typedef struct {
  fx_t *fx;
  char data[];
} lent_t;

static void lent_release(void *ud) {
  lent_t *l = ud;
  l->fx->lent_released++;
  free(l);
}

/* /lent: 8 MiB lent; /lent-small: 10 bytes lent (gathered, so copied) */
static void lent_route(fx_t *fx, om_http_request_t *req, int small) {
  size_t n = small ? 10 : 8u << 20;
  lent_t *l = malloc(sizeof *l + n);
  if (l == NULL) {
    om_http_response_abort(req);
    return;
  }
  l->fx = fx;
  memset(l->data, 'q', n);
  om_http_response_start(req, 200, NULL, 0);
  fx->lent_rc = om_http_response_write_lent(req, l->data, n, lent_release, l);
  fx->lent_pending = om_http_response_pending(req);
  fx->lent_released_at_return = fx->lent_released;
  om_http_response_end(req);
}

static void handler(om_http_request_t *req, void *ud) {
  fx_t *fx = ud;
  const char *p = req->path;
  snprintf(fx->targets[fx->seen++ % 64], sizeof fx->targets[0], "%s",
           req->target);
  if (++fx->in_flight > fx->max_in_flight)
    fx->max_in_flight = fx->in_flight;
  req->user = fx;
  if (strcmp(p, "/hold") == 0) {
    om_http_request_on_close(req, on_hold_close);
    om_http_response_start(req, 200, NULL, 0);
    om_http_response_write(req, "data: x\n\n", 9);
    fx->held[fx->n_held++] = req;
    return;
  }
  if (strcmp(p, "/later") == 0 || strcmp(p, "/orphan") == 0) {
    fx->later = req;
    uv_timer_start(&fx->timer, on_later, p[1] == 'l' ? 50 : 150, 0);
    return;
  }
  fx->in_flight--;
  if (strcmp(p, "/ws") == 0 && om_http_request_is_upgrade(req)) {
    upgrade_to_echo(fx, req);
  } else if (strcmp(p, "/stream") == 0) {
    om_http_header_t h[] = {{"Content-Type", "text/plain", 0, 0}};
    om_http_response_start(req, 200, h, 1);
    om_http_response_write(req, "hello ", 6);
    om_http_response_write(req, "", 0); /* must not end the stream */
    om_http_response_write(req, "world", 5);
    om_http_response_end(req);
  } else if (strcmp(p, "/trailers") == 0) {
    /* a chunked body, then trailers: a framing field among them never
     * travels, nor one whose value is not field-content */
    om_http_header_t t[] = {{"grpc-status", "0", 0, 0},
                            {"Content-Length", "9", 0, 0},
                            {"x-bad", "a\r\nX-Injected: 1", 0, 0},
                            {"x-sum", "abc", 0, 0}};
    om_http_response_start(req, 200, NULL, 0);
    om_http_response_write(req, "body", 4);
    om_http_response_end_trailers(req, t, 4);
  } else if (strcmp(p, "/fixed") == 0) {
    om_http_header_t h[] = {{"Content-Length", "5", 0, 0}};
    om_http_response_start(req, 200, h, 1);
    om_http_response_write(req, "ab", 2);
    om_http_response_write(req, "cde", 3);
    om_http_response_end(req);
  } else if (strcmp(p, "/abort") == 0) {
    om_http_response_start(req, 200, NULL, 0);
    om_http_response_write(req, "partial", 7);
    om_http_response_abort(req);
  } else if (strcmp(p, "/close") == 0) {
    om_http_header_t h[] = {{"Connection", "close", 0, 0}};
    om_http_respond(req, 200, h, 1, "bye", 3);
  } else if (strcmp(p, "/nocontent") == 0) {
    om_http_respond(req, 204, NULL, 0, NULL, 0);
  } else if (strcmp(p, "/misuse") == 0) {
    misuse(fx, req);
  } else if (strcmp(p, "/lent") == 0 || strcmp(p, "/lent-small") == 0) {
    lent_route(fx, req, p[5] == '-');
  } else if (strcmp(p, "/big") == 0) {
    size_t n = 8u << 20;
    char *b = malloc(n);
    if (b == NULL) {
      om_http_response_abort(req);
      return;
    }
    memset(b, 'z', n);
    om_http_response_start(req, 200, NULL, 0);
    fx->big_rc = om_http_response_write(req, b, n);
    fx->pending_after_write = om_http_response_pending(req);
    free(b);
    om_http_response_end(req);
  } else {
    echo(req);
  }
}

static void on_closed(om_http_server_t *srv, void *ud) {
  fx_t *fx = ud;
  fx->final = *om_http_server_metrics(srv);
  fx->closed = 1;
}

static fx_t *fx_new_at(const om_http_server_opts_t *o, const char *host) {
  fx_t *fx = calloc(1, sizeof *fx);
  assert_non_null(fx);
  assert_int_equal(uv_loop_init(&fx->loop), 0);
  uv_timer_init(&fx->loop, &fx->timer);
  fx->timer.data = fx;
  assert_int_equal(om_http_server_new(&fx->loop, o, handler, fx, &fx->srv), 0);
  assert_int_equal(om_http_server_listen(fx->srv, host, 0), 0);
  fx->port = om_http_server_port(fx->srv);
  OM_ASSERT_CMP(fx->port, >, 0);
  return fx;
}

static fx_t *fx_new(const om_http_server_opts_t *o) {
  return fx_new_at(o, "127.0.0.1");
}

static void fx_free(fx_t *fx) {
  uint64_t t0 = htc_now_ms();
  if (!fx->closed) {
    if (fx->srv != NULL)
      assert_int_equal(om_http_server_close(fx->srv, on_closed), 0);
    while (!fx->closed && htc_now_ms() - t0 < 10000)
      htc_step(&fx->loop, NULL, 1);
    assert_true(fx->closed);
  }
  uv_close((uv_handle_t *)&fx->timer, NULL);
  uv_run(&fx->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&fx->loop), 0);
  free(fx);
}

static const om_http_server_metrics_t *M(fx_t *fx) {
  return om_http_server_metrics(fx->srv);
}

/* Turn the loop until c has n complete responses (heads: which answer a
 * HEAD) or closed, or ms passed. Returns the number of responses. */
static int wait_responses(fx_t *fx, htc_t *c, const int *heads, int n, int ms) {
  uint64_t t0 = htc_now_ms();
  for (;;) {
    int k = htc_responses(c, heads, R, 8);
    if (k < 0 || k >= n || c->eof || htc_now_ms() - t0 > (uint64_t)ms) {
      if (c->eof) /* parse again: eof ends close-delimited bodies */
        k = htc_responses(c, heads, R, 8);
      return k;
    }
    htc_step(&fx->loop, c, 1);
  }
}

static int wait_eof(fx_t *fx, htc_t *c, int ms) {
  uint64_t t0 = htc_now_ms();
  while (!c->eof && htc_now_ms() - t0 < (uint64_t)ms)
    htc_step(&fx->loop, c, 1);
  return c->eof;
}

static void spin(fx_t *fx, htc_t *c, int ms) {
  uint64_t t0 = htc_now_ms();
  while (htc_now_ms() - t0 < (uint64_t)ms)
    htc_step(&fx->loop, c, 1);
}

static int seen_target(const fx_t *fx, const char *t) {
  int i, n = fx->seen < 64 ? fx->seen : 64;
  for (i = 0; i < n; i++)
    if (strcmp(fx->targets[i], t) == 0)
      return 1;
  return 0;
}

#define GET(path) "GET " path " HTTP/1.1\r\nHost: t\r\n\r\n"
#define SMUGGLED "GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n"
#define H11 " HTTP/1.1\r\nHost: t\r\n"
#define CHUNKED                                                                \
  "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"

/* ------------------------------------------------------------------ */
/* construction */

static void new_rejects_bad_arguments(void **state) {
  uv_loop_t loop;
  om_http_server_t *s = NULL;
  om_http_server_opts_t o;
  (void)state;
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(om_http_server_new(NULL, NULL, handler, NULL, &s),
                   OM_EINVAL);
  assert_int_equal(om_http_server_new(&loop, NULL, NULL, NULL, &s), OM_EINVAL);
  assert_int_equal(om_http_server_new(&loop, NULL, handler, NULL, NULL),
                   OM_EINVAL);
  memset(&o, 0, sizeof o);
  o.max_header_bytes = 70000; /* over http-parser's safe range */
  assert_int_equal(om_http_server_new(&loop, &o, handler, NULL, &s), OM_EINVAL);
  o.max_header_bytes = 10;
  assert_int_equal(om_http_server_new(&loop, &o, handler, NULL, &s), OM_EINVAL);
  assert_null(s);
  /* nothing was added to the loop */
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void new_fails_cleanly_without_memory(void **state) {
  uv_loop_t loop;
  int n;
  (void)state;
  assert_int_equal(uv_loop_init(&loop), 0);
  for (n = 0;; n++) {
    om_http_server_t *s = NULL;
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_http_server_new(&loop, NULL, handler, NULL, &s);
    om_test_alloc_reset();
    if (rc == 0) {
      assert_int_equal(om_http_server_close(s, NULL), 0);
      assert_int_equal(om_http_server_close(s, NULL), OM_ESTATE);
      uv_run(&loop, UV_RUN_DEFAULT);
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    assert_null(s);
  }
  OM_ASSERT_CMP(n, >=, 1);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void listen_errors(void **state) {
  fx_t *fx = fx_new(NULL), *fx2;
  om_http_server_t *s;
  (void)state;
  assert_int_equal(om_http_server_listen(fx->srv, "127.0.0.1", 0), OM_ESTATE);
  assert_int_equal(om_http_server_new(&fx->loop, NULL, handler, fx, &s), 0);
  assert_int_equal(om_http_server_port(s), OM_ESTATE);
  assert_int_equal(om_http_server_listen(s, "localhost", 0), OM_EINVAL);
  assert_int_equal(om_http_server_listen(s, "127.0.0.1", 65536), OM_EINVAL);
  assert_int_equal(om_http_server_listen(s, "127.0.0.1", -1), OM_EINVAL);
  assert_int_equal(om_http_server_listen(s, NULL, 0), OM_EINVAL);
  /* the port is taken */
  assert_int_equal(om_http_server_listen(s, "127.0.0.1", fx->port), OM_EIO);
  assert_int_equal(om_http_server_close(s, NULL), 0);
  fx_free(fx);
  /* IPv6 */
  fx2 = fx_new_at(NULL, "::1");
  {
    htc_t *c = htc_new("::1", fx2->port);
    assert_non_null(c);
    assert_int_equal(htc_sends(&fx2->loop, c, GET("/v6")), 0);
    assert_int_equal(wait_responses(fx2, c, NULL, 1, 2000), 1);
    assert_int_equal(R[0].status, 200);
    htc_free(c);
  }
  fx_free(fx2);
}

/* ------------------------------------------------------------------ */
/* the basics */

static void keep_alive_and_request_fields(void **state) {
  fx_t *fx = fx_new(NULL);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  char v[128];
  (void)state;
  assert_int_equal(
      htc_sends(&fx->loop, c,
                "GET /a/%2Fb?x=1&y HTTP/1.1\r\nHost: t\r\nX-V: \t hi  there "
                "\t\r\nAccept: */*\r\n\r\n"),
      0);
  assert_int_equal(wait_responses(fx, c, NULL, 1, 2000), 1);
  assert_int_equal(R[0].status, 200);
  assert_int_equal(R[0].close, 0);
  assert_int_equal(htc_header(&R[0], "date", v, sizeof v), 0);
  assert_non_null(strstr(v, " GMT"));
  assert_int_equal(htc_header(&R[0], "content-length", v, sizeof v), 0);
  /* raw path, separate raw query, trimmed value, lower-cased names */
  assert_string_equal(R[0].body,
                      "GET /a/%2Fb?x=1&y /a/%2Fb x=1&y 1.1 3 0 [hi  there] "
                      "host\n");
  /* the same connection serves the next request */
  assert_int_equal(
      htc_sends(&fx->loop, c,
                "GET http://example.com:8080?q HTTP/1.1\r\nHost: t\r\n\r\n"),
      0);
  assert_int_equal(wait_responses(fx, c, NULL, 2, 2000), 2);
  assert_string_equal(R[1].body,
                      "GET http://example.com:8080?q / q 1.1 1 0 [-] host\n");
  assert_int_equal(
      htc_sends(&fx->loop, c, "OPTIONS * HTTP/1.1\r\nHost: t\r\n\r\n"), 0);
  assert_int_equal(wait_responses(fx, c, NULL, 3, 2000), 3);
  assert_string_equal(R[2].body, "OPTIONS * * - 1.1 1 0 [-] host\n");
  assert_false(c->eof);
  assert_int_equal(M(fx)->connections_accepted, 1);
  assert_int_equal(M(fx)->requests, 3);
  htc_free(c);
  fx_free(fx);
}

static void pipelined_requests_answered_in_order(void **state) {
  fx_t *fx = fx_new(NULL);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  (void)state;
  /* three in one write */
  assert_int_equal(htc_sends(&fx->loop, c, GET("/1") GET("/2") GET("/3")), 0);
  assert_int_equal(wait_responses(fx, c, NULL, 3, 2000), 3);
  OM_ASSERT_PREFIX(R[0].body, "GET /1 ");
  OM_ASSERT_PREFIX(R[1].body, "GET /2 ");
  OM_ASSERT_PREFIX(R[2].body, "GET /3 ");
  /* an asynchronous answer holds back the next one: one at a time */
  assert_int_equal(
      htc_sends(&fx->loop, c, GET("/later") GET("/4") "\r\n" GET("/5")), 0);
  assert_int_equal(wait_responses(fx, c, NULL, 6, 2000), 6);
  assert_string_equal(R[3].body, "late");
  OM_ASSERT_PREFIX(R[4].body, "GET /4 ");
  OM_ASSERT_PREFIX(R[5].body, "GET /5 ");
  assert_int_equal(fx->max_in_flight, 1);
  assert_int_equal(fx->later_rc, 0);
  htc_free(c);
  fx_free(fx);
}

static void valid_edge_cases_are_accepted(void **state) {
  static const char *reqs[] = {
      "\r\n\r\n" GET("/after-empty-lines"),
      "GET /a;b=c/d:e@f!$&'()*+,=~-._%20?q=/?:@&x%41 HTTP/1.1\r\nHost: t"
      "\r\n\r\n",
      "GET http://[::1]:8080/p?q HTTP/1.1\r\nHost: t\r\n\r\n",
      "GET HTTPS://Example.COM HTTP/1.1\r\nHost: t\r\n\r\n",
      "GET http://h.example:/x HTTP/1.1\r\nHost: t\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
      "GET / HTTP/1.1\r\nHost:\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: a-b_c~d!x$&'()*+,;=%41\r\n\r\n",
      "GET /" H11 "X-V: caf\xc3\xa9 \x80\xff\r\n\r\n",
      "GET /" H11 "!#$%&'*+-.^_`|~09azAZ: v\r\n\r\n",
      "GET /" H11 "X-Empty:\r\nX-Blank:   \r\n\r\n",
      "POST /" H11 "Transfer-Encoding:\tChUnKeD\r\n\r\n0\r\n\r\n",
      "GET /" H11 "Connection: keep-alive, Upgrade\r\nUpgrade: h2c\r\n\r\n",
      "GET /" H11 "Content-Length: 0\r\n\r\n",
      "GET /" H11 "Expect: 100-continue\r\n\r\n",
      "PUT /p" H11 "Content-Length: 1\r\n\r\nx",
      "DELETE /d" H11 "\r\n",
      "PATCH /p" H11 "Content-Length: 0\r\n\r\n",
      "PROPFIND /w" H11 "\r\n",
      "OPTIONS /o" H11 "\r\n",
      "POST /" H11 "Content-Length: 0000000000000000000000003\r\n\r\nabc",
      "POST /" H11 "Transfer-Encoding: chunked\r\n\r\n"
      "0000000000000000000000001\r\nx\r\n0\r\n\r\n",
      "GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
  };
  size_t n = sizeof reqs / sizeof reqs[0], i;
  fx_t *fx = fx_new(NULL);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  (void)state;
  for (i = 0; i < n; i++) {
    int k;
    assert_int_equal(htc_sends(&fx->loop, c, reqs[i]), 0);
    k = wait_responses(fx, c, NULL, (int)(i % 8) + 1, 2000);
    if (k != (int)(i % 8) + 1 || R[i % 8].status != 200)
      fail_msg("case %zu (%.40s...): %d responses, last status %d (%s)", i,
               reqs[i], k, k > 0 ? R[k - 1].status : 0,
               k > 0 ? R[k - 1].body : "");
    if (i % 8 == 7) { /* start a fresh buffer */
      htc_t *d = htc_new("127.0.0.1", fx->port);
      htc_free(c);
      c = d;
    }
  }
  assert_int_equal(M(fx)->requests, n);
  htc_free(c);
  fx_free(fx);
}

static void pipeline_limit_pauses_reading(void **state) {
  om_http_server_opts_t o;
  fx_t *fx;
  htc_t *c;
  char v[32];
  int i;
  (void)state;
  memset(&o, 0, sizeof o);
  o.max_pipelined = 2;
  fx = fx_new(&o);
  c = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, c,
                             GET("/later") GET("/1") GET("/2") GET("/3")
                                 GET("/4") GET("/5") GET("/6")),
                   0);
  spin(fx, c, 20);
  /* one in the handler, two read ahead, the rest left in the socket */
  assert_int_equal(fx->seen, 1);
  assert_int_equal(wait_responses(fx, c, NULL, 7, 3000), 7);
  assert_string_equal(R[0].body, "late");
  for (i = 1; i < 7; i++) {
    snprintf(v, sizeof v, "GET /%d ", i);
    OM_ASSERT_PREFIX(R[i].body, v);
  }
  /* half-close after pipelined requests: all answered, then closed */
  htc_free(c);
  c = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, c, GET("/a") GET("/b") GET("/c")), 0);
  shutdown(c->fd, SHUT_WR);
  assert_true(wait_eof(fx, c, 2000));
  assert_int_equal(htc_responses(c, NULL, R, 8), 3);
  /* a bad request behind an asynchronous one: answered in order */
  htc_free(c);
  c = htc_new("127.0.0.1", fx->port);
  assert_int_equal(
      htc_sends(&fx->loop, c, GET("/later") "GET /a#b" H11 "\r\n" SMUGGLED), 0);
  assert_true(wait_eof(fx, c, 2000));
  assert_int_equal(htc_responses(c, NULL, R, 8), 2);
  assert_string_equal(R[0].body, "late");
  assert_int_equal(R[1].status, 400);
  assert_false(seen_target(fx, "/smuggled"));
  htc_free(c);
  fx_free(fx);
}

static void http10_close_and_keep_alive(void **state) {
  fx_t *fx = fx_new(NULL);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  htc_t *d;
  char v[64];
  (void)state;
  assert_int_equal(htc_sends(&fx->loop, c, "GET /x HTTP/1.0\r\n\r\n"), 0);
  assert_int_equal(wait_responses(fx, c, NULL, 1, 2000), 1);
  assert_int_equal(R[0].status, 200);
  assert_int_equal(R[0].minor, 1); /* RFC 9110 6.2: our version */
  assert_int_equal(R[0].close, 1);
  assert_true(wait_eof(fx, c, 2000));
  htc_free(c);
  /* keep-alive, then a close-delimited stream */
  d = htc_new("127.0.0.1", fx->port);
  assert_int_equal(
      htc_sends(&fx->loop, d,
                "GET /y HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"),
      0);
  assert_int_equal(wait_responses(fx, d, NULL, 1, 2000), 1);
  assert_int_equal(htc_header(&R[0], "connection", v, sizeof v), 0);
  assert_string_equal(v, "keep-alive");
  assert_int_equal(htc_sends(&fx->loop, d,
                             "GET /stream HTTP/1.0\r\nConnection: "
                             "keep-alive\r\n\r\n"),
                   0);
  assert_true(wait_eof(fx, d, 2000));
  assert_int_equal(wait_responses(fx, d, NULL, 2, 10), 2);
  assert_int_equal(R[1].chunked, 0);
  assert_int_equal(R[1].has_cl, 0);
  assert_int_equal(R[1].close, 1);
  assert_string_equal(R[1].body, "hello world");
  htc_free(d);
  fx_free(fx);
}

static void head_and_no_content(void **state) {
  fx_t *fx = fx_new(NULL);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  int heads[4] = {1, 1, 0, 0};
  char v[64];
  (void)state;
  assert_int_equal(htc_sends(&fx->loop, c,
                             "HEAD /h HTTP/1.1\r\nHost: t\r\n\r\nHEAD /stream "
                             "HTTP/1.1\r\nHost: t\r\n\r\n" GET("/nocontent")
                                 GET("/z")),
                   0);
  assert_int_equal(wait_responses(fx, c, heads, 4, 2000), 4);
  assert_int_equal(htc_header(&R[0], "content-length", v, sizeof v), 0);
  OM_ASSERT_CMP(atoi(v), >, 0);      /* the length a GET would have */
  assert_int_equal(R[1].chunked, 0); /* no framing for a body never sent */
  assert_int_equal(R[2].status, 204);
  assert_int_equal(R[2].has_cl, 0);
  OM_ASSERT_PREFIX(R[3].body, "GET /z ");
  /* nothing more than these four on the wire */
  assert_int_equal(
      R[0].wire_len + R[1].wire_len + R[2].wire_len + R[3].wire_len, c->len);
  htc_free(c);
  fx_free(fx);
}

/* Append the two bytes of pair n times to the request (*w) and to what
 * the handler must echo (*x). */
static void put_pairs(char **w, char **x, const char *pair, size_t n) {
  size_t i;
  for (i = 0; i < n; i++, *w += 2, *x += 2) {
    memcpy(*w, pair, 2);
    memcpy(*x, pair, 2);
  }
}

/* HTAB as whitespace in bulk: a value and a chunked body with thousands
 * of HTABs, each across read slices, are read whole and as they were
 * sent. */
static void many_htabs_across_slices(void **state) {
  static char req[16384], want[16384];
  char *w = req, *x = want;
  fx_t *fx = fx_new(NULL);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  (void)state;
  w += sprintf(w, "POST /t HTTP/1.1\r\nHost: t\r\nX-V:\t");
  x += sprintf(x, "POST /t /t - 1.1 3 6000 [");
  put_pairs(&w, &x, "a\t", 3000);
  w += sprintf(w, "z\t\r\nTransfer-Encoding:\tchunked\t\r\n\r\n1770\t;e=f\r\n");
  x += sprintf(x, "z] host\n");
  put_pairs(&w, &x, "\tb", 3000);
  w += sprintf(w, "\r\n0\r\n\r\n");
  *x = 0;
  assert_int_equal(htc_send(&fx->loop, c, req, (size_t)(w - req)), 0);
  assert_int_equal(wait_responses(fx, c, NULL, 1, 2000), 1);
  assert_int_equal(R[0].status, 200);
  assert_string_equal(R[0].body, want);
  assert_int_equal(M(fx)->requests, 1);
  htc_free(c);
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* rejections */

typedef struct {
  const char *name;
  const char *req;
  size_t len;
  int status;
  const char *reason;
} bad_t;

#define BAD(name, lit, st, why)                                                \
  { name, lit, sizeof(lit) - 1, st, why }

static const bad_t bad_cases[] = {
    /* Content-Length (RFC 9110 8.6, RFC 9112 6.3) */
    BAD("cl+te",
        "POST /" H11 "Content-Length: 5\r\nTransfer-Encoding: "
        "chunked\r\n\r\n0\r\n\r\n",
        400, "content_length_and_transfer_encoding"),
    BAD("te+cl",
        "POST /" H11 "Transfer-Encoding: chunked\r\nContent-Length: "
        "5\r\n\r\n0\r\n\r\n",
        400, "content_length_and_transfer_encoding"),
    BAD("cl twice equal",
        "POST /" H11 "Content-Length: 3\r\nContent-Length: "
        "3\r\n\r\nabc",
        400, "bad_content_length"),
    BAD("cl twice differ",
        "POST /" H11 "Content-Length: 3\r\nContent-Length: "
        "4\r\n\r\nabcd",
        400, "bad_content_length"),
    BAD("cl list", "POST /" H11 "Content-Length: 1, 1\r\n\r\na", 400,
        "bad_content_length"),
    BAD("cl plus", "POST /" H11 "Content-Length: +1\r\n\r\na", 400,
        "bad_content_length"),
    BAD("cl minus", "POST /" H11 "Content-Length: -1\r\n\r\na", 400,
        "bad_content_length"),
    BAD("cl hex", "POST /" H11 "Content-Length: 0x1\r\n\r\na", 400,
        "bad_content_length"),
    BAD("cl empty", "POST /" H11 "Content-Length: \r\n\r\n", 400,
        "bad_content_length"),
    BAD("cl inner space", "POST /" H11 "Content-Length: 1 2\r\n\r\na", 400,
        "bad_content_length"),
    BAD("cl decimal", "POST /" H11 "Content-Length: 1.0\r\n\r\na", 400,
        "bad_content_length"),
    BAD("cl vtab", "POST /" H11 "Content-Length: \v1\r\n\r\na", 400,
        "bad_header"),
    BAD("cl over limit", "POST /" H11 "Content-Length: 65\r\n\r\n", 413,
        "body_too_large"),
    BAD("cl overflow",
        "POST /" H11 "Content-Length: 99999999999999999999999"
        "\r\n\r\n",
        413, "body_too_large"),
    /* Transfer-Encoding (RFC 9112 6.1, 6.3, 7) */
    BAD("te gzip", "POST /" H11 "Transfer-Encoding: gzip\r\n\r\nabc", 400,
        "bad_transfer_encoding"),
    BAD("te identity", "POST /" H11 "Transfer-Encoding: identity\r\n\r\n", 400,
        "bad_transfer_encoding"),
    BAD("te chunked,gzip",
        "POST /" H11 "Transfer-Encoding: chunked, gzip"
        "\r\n\r\n0\r\n\r\n",
        400, "bad_transfer_encoding"),
    BAD("te gzip,chunked",
        "POST /" H11 "Transfer-Encoding: gzip, chunked"
        "\r\n\r\n0\r\n\r\n",
        501, "unsupported_transfer_coding"),
    BAD("te chunked twice",
        "POST /" H11 "Transfer-Encoding: chunked, chunked"
        "\r\n\r\n0\r\n\r\n",
        400, "bad_transfer_encoding"),
    BAD("te two lines",
        "POST /" H11 "Transfer-Encoding: chunked\r\n"
        "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        400, "bad_transfer_encoding"),
    BAD("te params",
        "POST /" H11 "Transfer-Encoding: chunked;q=1\r\n\r\n"
        "0\r\n\r\n",
        400, "bad_transfer_encoding"),
    BAD("te empty element",
        "POST /" H11 "Transfer-Encoding: , chunked\r\n"
        "\r\n0\r\n\r\n",
        400, "bad_transfer_encoding"),
    BAD("te xchunked", "POST /" H11 "Transfer-Encoding: xchunked\r\n\r\n", 400,
        "bad_transfer_encoding"),
    BAD("te space inside", "POST /" H11 "Transfer-Encoding: chun ked\r\n\r\n",
        400, "bad_transfer_encoding"),
    BAD("te empty", "POST /" H11 "Transfer-Encoding: \r\n\r\n", 400,
        "bad_transfer_encoding"),
    BAD("te in 1.0",
        "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"
        "0\r\n\r\n",
        400, "bad_transfer_encoding"),
    /* field lines (RFC 9112 5, 2.2; RFC 9110 5.5) */
    BAD("obs-fold", "GET /" H11 "X-A: a\r\n b\r\n\r\n", 400, "obs_fold"),
    BAD("obs-fold tab", "GET /" H11 "X-A: a\r\n\tb\r\n\r\n", 400, "obs_fold"),
    BAD("ws before first field", "GET / HTTP/1.1\r\n Host: t\r\n\r\n", 400,
        "bad_header"),
    BAD("space before colon", "GET / HTTP/1.1\r\nHost : t\r\n\r\n", 400,
        "bad_header"),
    BAD("tab before colon", "GET /" H11 "X-A\t: a\r\n\r\n", 400, "bad_header"),
    BAD("name with @", "GET /" H11 "X@A: a\r\n\r\n", 400, "bad_header"),
    BAD("name with space", "GET /" H11 "X A: a\r\n\r\n", 400, "bad_header"),
    BAD("empty name", "GET /" H11 ": a\r\n\r\n", 400, "bad_header"),
    BAD("name non-ascii", "GET /" H11 "X\xc3\xa9: a\r\n\r\n", 400,
        "bad_header"),
    BAD("no colon", "GET /" H11 "X-A\r\n\r\n", 400, "bad_header"),
    BAD("bare cr in value", "GET /" H11 "X-A: a\rb\r\n\r\n", 400, "bad_header"),
    BAD("cr cr lf", "GET /" H11 "X-A: a\r\r\n\r\n", 400, "bad_header"),
    BAD("bare lf in value", "GET /" H11 "X-A: a\nb\r\n\r\n", 400, "bad_header"),
    BAD("bare lf line ends", "GET / HTTP/1.1\nHost: t\n\n", 400,
        "bad_request_line"),
    BAD("bare lf header end", "GET /" H11 "X-A: a\n\r\n", 400, "bad_header"),
    BAD("bare lf section end", "GET /" H11 "\n", 400, "bad_header"),
    BAD("nul in value", "GET /" H11 "X-A: a\0b\r\n\r\n", 400, "bad_header"),
    BAD("del in value", "GET /" H11 "X-A: a\x7f\r\n\r\n", 400, "bad_header"),
    BAD("ctl in value", "GET /" H11 "X-A: \x01\r\n\r\n", 400, "bad_header"),
    /* Host (RFC 9112 3.2, RFC 9110 7.2) */
    BAD("no host", "GET / HTTP/1.1\r\n\r\n", 400, "bad_host"),
    BAD("two hosts", "GET /" H11 "Host: t\r\n\r\n", 400, "bad_host"),
    BAD("host with space", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400,
        "bad_host"),
    BAD("host userinfo", "GET / HTTP/1.1\r\nHost: u@h\r\n\r\n", 400,
        "bad_host"),
    BAD("host path", "GET / HTTP/1.1\r\nHost: h/p\r\n\r\n", 400, "bad_host"),
    BAD("host port junk", "GET / HTTP/1.1\r\nHost: h:8x\r\n\r\n", 400,
        "bad_host"),
    BAD("host empty brackets", "GET / HTTP/1.1\r\nHost: []\r\n\r\n", 400,
        "bad_host"),
    /* request-target (RFC 9112 3.2, RFC 3986) */
    BAD("target relative", "GET x" H11 "\r\n", 400, "bad_target"),
    BAD("target fragment", "GET /a#b" H11 "\r\n", 400, "bad_target"),
    BAD("target bad escape", "GET /%zz" H11 "\r\n", 400, "bad_target"),
    BAD("target short escape", "GET /%2" H11 "\r\n", 400, "bad_target"),
    BAD("target pipe", "GET /a|b" H11 "\r\n", 400, "bad_target"),
    BAD("target quote", "GET /a\"b" H11 "\r\n", 400, "bad_target"),
    BAD("target backslash", "GET /a\\b" H11 "\r\n", 400, "bad_target"),
    BAD("target high bit", "GET /\xc3\xa9" H11 "\r\n", 400, "bad_target"),
    BAD("target ctl", "GET /\x01" H11 "\r\n", 400, "bad_target"),
    BAD("target tab", "GET /a\tb" H11 "\r\n", 400, "bad_target"),
    BAD("target ftp", "GET ftp://h/" H11 "\r\n", 400, "bad_target"),
    BAD("target userinfo", "GET http://u@h/" H11 "\r\n", 400, "bad_target"),
    BAD("target empty host", "GET http:///a" H11 "\r\n", 400, "bad_target"),
    BAD("asterisk not options", "GET *" H11 "\r\n", 400, "bad_target"),
    BAD("authority form", "GET h:80" H11 "\r\n", 400, "bad_target"),
    /* request line (RFC 9112 3, 2.3) */
    BAD("two spaces", "GET  /" H11 "\r\n", 400, "bad_request_line"),
    BAD("trailing space", "GET / HTTP/1.1 \r\nHost: t\r\n\r\n", 400,
        "bad_request_line"),
    BAD("http/0.9", "GET /\r\n\r\n", 400, "bad_request_line"),
    BAD("bare cr in line", "GET /\r HTTP/1.1\r\nHost: t\r\n\r\n", 400,
        "bad_request_line"),
    BAD("leading bare lf", "\nGET /" H11 "\r\n", 400, "bad_request_line"),
    BAD("method junk", "G(T /" H11 "\r\n", 400, "bad_request_line"),
    BAD("lower-case method", "get /" H11 "\r\n", 501, "method_not_implemented"),
    BAD("unknown method", "FOO /" H11 "\r\n", 501, "method_not_implemented"),
    BAD("connect", "CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n", 501,
        "method_not_implemented"),
    BAD("version 2.0", "GET / HTTP/2.0\r\nHost: t\r\n\r\n", 505,
        "version_not_supported"),
    /* HTTP/1.2 is read as HTTP/1.1 (RFC 9110 6.2): test_http_smuggling */
    BAD("version 3.0", "GET / HTTP/3.0\r\nHost: t\r\n\r\n", 505,
        "version_not_supported"),
    BAD("version 0.9", "GET / HTTP/0.9\r\nHost: t\r\n\r\n", 505,
        "version_not_supported"),
    BAD("h2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505,
        "version_not_supported"),
    BAD("version 1.10", "GET / HTTP/1.10\r\nHost: t\r\n\r\n", 400,
        "bad_request_line"),
    BAD("version lower", "GET / http/1.1\r\nHost: t\r\n\r\n", 400,
        "bad_request_line"),
    BAD("version short", "GET / HTTP/1\r\nHost: t\r\n\r\n", 400,
        "bad_request_line"),
    BAD("version junk", "GET / HTTP/1.1x\r\nHost: t\r\n\r\n", 400,
        "bad_request_line"),
    BAD("expect", "POST /" H11 "Expect: teapot\r\nContent-Length: 1\r\n\r\na",
        417, "expectation_failed"),
    /* chunked framing (RFC 9112 7.1); the size, extension and line-end
     * cases, in every split of the bytes: test_http_smuggling */
    BAD("chunk over limit", CHUNKED "41\r\n", 413, "body_too_large"),
    BAD("chunk ext ctl", CHUNKED "3;\x01\r\nabc\r\n0\r\n\r\n", 400,
        "bad_chunk"),
    BAD("chunk ext ws at end", CHUNKED "3;a \r\nabc\r\n0\r\n\r\n", 400,
        "bad_chunk"),
    BAD("chunk end junk", CHUNKED "0\r\n\rX", 400, "bad_chunk"),
    BAD("trailer obs-fold", CHUNKED "0\r\nX-T: a\r\n b\r\n\r\n", 400,
        "obs_fold"),
    /* framing fields in the trailer section are dropped, not refused
     * (RFC 9112 7.1.2): test_http_smuggling */
    BAD("trailer bad name", CHUNKED "0\r\nX Y: a\r\n\r\n", 400, "bad_header"),
    BAD("trailer bare lf", CHUNKED "0\r\nX-T: a\n\r\n", 400, "bad_header"),
};

static om_http_server_opts_t small_limits(void) {
  om_http_server_opts_t o;
  memset(&o, 0, sizeof o);
  o.max_header_bytes = 1024;
  o.max_headers = 20;
  o.max_body_bytes = 64;
  return o;
}

/* Send bad, then a second request on the same write; the answer must be
 * exactly one error with Connection: close, then the close. */
static void expect_rejected(fx_t *fx, const char *name, const char *req,
                            size_t len, int status, const char *reason) {
  htc_t *c = htc_new("127.0.0.1", fx->port);
  static char wire[8192];
  char body[128];
  int seen = fx->seen, n;
  assert_non_null(c);
  OM_ASSERT_CMP(len + sizeof SMUGGLED, <, sizeof wire);
  memcpy(wire, req, len);
  memcpy(wire + len, SMUGGLED, sizeof SMUGGLED - 1);
  assert_int_equal(htc_send(&fx->loop, c, wire, len + sizeof SMUGGLED - 1), 0);
  if (!wait_eof(fx, c, 3000))
    fail_msg("%s: the connection stayed open", name);
  n = htc_responses(c, NULL, R, 8);
  if (n != 1)
    fail_msg("%s: %d responses (%zu bytes: %.*s)", name, n, c->len,
             (int)(c->len > 200 ? 200 : c->len), c->buf);
  if (R[0].status != status)
    fail_msg("%s: status %d, want %d (%s)", name, R[0].status, status,
             R[0].body);
  snprintf(body, sizeof body, "{\"error\":\"%s\"}", reason);
  if (strcmp(R[0].body, body) != 0)
    fail_msg("%s: body %s, want %s", name, R[0].body, body);
  if (!R[0].close)
    fail_msg("%s: no Connection: close", name);
  if (fx->seen != seen || seen_target(fx, "/smuggled"))
    fail_msg("%s: the handler saw a request", name);
  htc_free(c);
}

static void rejections_answer_once_and_close(void **state) {
  om_http_server_opts_t o = small_limits();
  fx_t *fx = fx_new(&o);
  size_t i;
  uint64_t total = 0;
  (void)state;
  for (i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
    const bad_t *b = &bad_cases[i];
    expect_rejected(fx, b->name, b->req, b->len, b->status, b->reason);
  }
  for (i = 0; i < OM_HTTP_REJECT__COUNT; i++)
    total += M(fx)->rejected[i];
  assert_int_equal(total, sizeof bad_cases / sizeof bad_cases[0]);
  assert_int_equal(M(fx)->rejected[OM_HTTP_REJECT_OBS_FOLD], 3);
  assert_int_equal(M(fx)->requests, 0);
  OM_TEST_NOTE("rejection cases: %zu", sizeof bad_cases / sizeof bad_cases[0]);
  /* and the server still serves */
  {
    htc_t *c = htc_new("127.0.0.1", fx->port);
    assert_int_equal(htc_sends(&fx->loop, c, GET("/ok")), 0);
    assert_int_equal(wait_responses(fx, c, NULL, 1, 2000), 1);
    assert_int_equal(R[0].status, 200);
    htc_free(c);
  }
  fx_free(fx);
}

/* A GET whose header section is exactly `total` bytes. */
static void big_section(char *req, size_t total) {
  int k = snprintf(req, 64, "GET / HTTP/1.1\r\nHost: t\r\nX-Big: ");
  size_t fill = total - (size_t)k - 4;
  memset(req + k, 'a', fill);
  memcpy(req + k + fill, "\r\n\r\n", 5);
}

static void limits_431_414_413(void **state) {
  om_http_server_opts_t o = small_limits();
  fx_t *fx = fx_new(&o);
  char req[4096];
  int i, k;
  (void)state;
  /* a header section one byte over the limit */
  big_section(req, 1025);
  expect_rejected(fx, "431", req, strlen(req), 431, "headers_too_large");
  /* exactly at the limit is fine */
  {
    htc_t *c = htc_new("127.0.0.1", fx->port);
    big_section(req, 1024);
    assert_int_equal(strlen(req), 1024);
    assert_int_equal(htc_sends(&fx->loop, c, req), 0);
    assert_int_equal(wait_responses(fx, c, NULL, 1, 2000), 1);
    assert_int_equal(R[0].status, 200);
    htc_free(c);
  }
  /* a request-target that does not fit: 414 (RFC 9112 3) */
  k = snprintf(req, sizeof req, "GET /");
  memset(req + k, 'p', 1100);
  snprintf(req + k + 1100, sizeof req - (size_t)k - 1100, H11 "\r\n");
  expect_rejected(fx, "414", req, strlen(req), 414, "target_too_long");
  /* too many fields */
  k = snprintf(req, sizeof req, "GET /" H11);
  for (i = 0; i < 20; i++)
    k += snprintf(req + k, sizeof req - (size_t)k, "X-%d: v\r\n", i);
  snprintf(req + k, sizeof req - (size_t)k, "\r\n");
  expect_rejected(fx, "431 count", req, strlen(req), 431, "headers_too_large");
  /* too many empty lines before the request line count too */
  memset(req, 0, sizeof req);
  for (i = 0; i < 600; i++)
    memcpy(req + 2 * i, "\r\n", 2);
  expect_rejected(fx, "431 empty lines", req, strlen(req), 431,
                  "headers_too_large");
  /* the sum of chunks over the body limit */
  k = snprintf(req, sizeof req, CHUNKED "40\r\n");
  memset(req + k, 'b', 64);
  snprintf(req + k + 64, sizeof req - (size_t)k - 64,
           "\r\n1\r\nc\r\n0\r\n\r\n");
  expect_rejected(fx, "413 chunks", req, strlen(req), 413, "body_too_large");
  /* a chunk line over 4 KiB */
  {
    static char line[6000];
    k = snprintf(line, sizeof line, CHUNKED "1;e=");
    memset(line + k, 'x', 4200);
    snprintf(line + k + 4200, sizeof line - (size_t)k - 4200,
             "\r\na\r\n0\r\n\r\n");
    expect_rejected(fx, "chunk line", line, strlen(line), 400, "bad_chunk");
  }
  /* tiny chunks with long extensions: framing is bounded too */
  {
    static char wire[80000];
    htc_t *c = htc_new("127.0.0.1", fx->port);
    int j;
    k = snprintf(wire, sizeof wire, CHUNKED);
    for (j = 0; j < 17; j++) {
      k += snprintf(wire + k, sizeof wire - (size_t)k, "1;e=");
      memset(wire + k, 'x', 4000);
      k += 4000;
      k += snprintf(wire + k, sizeof wire - (size_t)k, "\r\na\r\n");
    }
    k += snprintf(wire + k, sizeof wire - (size_t)k, "0\r\n\r\n");
    assert_int_equal(htc_send(&fx->loop, c, wire, (size_t)k), 0);
    assert_true(wait_eof(fx, c, 3000));
    assert_int_equal(htc_responses(c, NULL, R, 8), 1);
    assert_int_equal(R[0].status, 400);
    assert_string_equal(R[0].body, "{\"error\":\"bad_chunk\"}");
    htc_free(c);
  }
  /* trailers count against the header limit */
  {
    static char tr[3000];
    k = snprintf(tr, sizeof tr, CHUNKED "0\r\nX-T: ");
    memset(tr + k, 't', 1100);
    snprintf(tr + k + 1100, sizeof tr - (size_t)k - 1100, "\r\n\r\n");
    expect_rejected(fx, "431 trailer", tr, strlen(tr), 431,
                    "headers_too_large");
  }
  /* the body limit exactly is fine */
  {
    htc_t *c = htc_new("127.0.0.1", fx->port);
    k = snprintf(req, sizeof req, "POST /" H11 "Content-Length: 64\r\n\r\n");
    memset(req + k, 'q', 64);
    req[k + 64] = 0;
    assert_int_equal(htc_sends(&fx->loop, c, req), 0);
    assert_int_equal(wait_responses(fx, c, NULL, 1, 2000), 1);
    assert_int_equal(R[0].status, 200);
    assert_non_null(strstr(R[0].body, " 64 ["));
    htc_free(c);
  }
  fx_free(fx);
}

static void head_request_rejection_has_no_body(void **state) {
  om_http_server_opts_t o = small_limits();
  fx_t *fx = fx_new(&o);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  int heads[1] = {1};
  (void)state;
  assert_int_equal(htc_sends(&fx->loop, c, "HEAD / HTTP/1.1\r\n\r\n"), 0);
  assert_true(wait_eof(fx, c, 2000));
  assert_int_equal(htc_responses(c, heads, R, 8), 1);
  assert_int_equal(R[0].status, 400);
  assert_int_equal(R[0].wire_len, c->len); /* no content after the head */
  htc_free(c);
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* bodies */

static void chunked_request_bodies(void **state) {
  fx_t *fx = fx_new(NULL);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  (void)state;
  assert_int_equal(
      htc_sends(&fx->loop, c,
                /* plain */
                CHUNKED
                "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
                /* extensions, upper-case hex, leading zeros, BWS */
                CHUNKED "00A;name=val;q=\"a \\\"b\\\" c\" ; flag\r\n0123456789"
                "\r\n1 ;x\r\n!\r\n000;last=1\r\n\r\n"
                /* trailers */
                CHUNKED "3\r\nabc\r\n0\r\nX-Checksum: 1\r\nX-Other: 2\r\n\r\n"
                /* Chunked is case-insensitive */
                "POST /u HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: Chunked"
                "\r\n\r\n1\r\nZ\r\n0\r\n\r\n"
                /* Content-Length with OWS around it */
                "POST /l HTTP/1.1\r\nHost: t\r\nContent-Length: \t 003  "
                "\r\n\r\nxyz"),
      0);
  assert_int_equal(wait_responses(fx, c, NULL, 5, 2000), 5);
  assert_string_equal(R[0].body, "POST /c /c - 1.1 2 11 [-] host\nhello world");
  assert_string_equal(R[1].body, "POST /c /c - 1.1 2 11 [-] host\n0123456789!");
  assert_string_equal(R[2].body, "POST /c /c - 1.1 2 3 [-] host\nabc");
  assert_string_equal(R[3].body, "POST /u /u - 1.1 2 1 [-] host\nZ");
  assert_string_equal(R[4].body, "POST /l /l - 1.1 2 3 [-] host\nxyz");
  assert_false(c->eof);
  htc_free(c);
  fx_free(fx);
}

static void expect_100_continue(void **state) {
  om_http_server_opts_t o = small_limits();
  fx_t *fx = fx_new(&o);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  (void)state;
  assert_int_equal(htc_sends(&fx->loop, c,
                             "POST /e HTTP/1.1\r\nHost: t\r\nExpect: "
                             "100-continue\r\nContent-Length: 5\r\n\r\n"),
                   0);
  assert_int_equal(wait_responses(fx, c, NULL, 1, 2000), 1);
  assert_int_equal(R[0].status, 100);
  assert_int_equal(fx->seen, 0);
  assert_int_equal(htc_sends(&fx->loop, c, "hello"), 0);
  assert_int_equal(wait_responses(fx, c, NULL, 2, 2000), 2);
  assert_int_equal(R[1].status, 200);
  assert_non_null(strstr(R[1].body, "\nhello"));
  htc_free(c);
  /* a body that would be refused is refused before it is sent */
  expect_rejected(fx, "expect 413",
                  "POST /e HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
                  "Content-Length: 500\r\n\r\n",
                  strlen("POST /e HTTP/1.1\r\nHost: t\r\nExpect: "
                         "100-continue\r\nContent-Length: 500\r\n\r\n"),
                  413, "body_too_large");
  /* HTTP/1.0 ignores Expect (RFC 9110 10.1.1) */
  c = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, c,
                             "POST /e HTTP/1.0\r\nExpect: teapot\r\n"
                             "Content-Length: 2\r\n\r\nhi"),
                   0);
  assert_int_equal(wait_responses(fx, c, NULL, 1, 2000), 1);
  assert_int_equal(R[0].status, 200);
  htc_free(c);
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* byte at a time */

static size_t strip_date(const char *in, size_t n, char *out) {
  size_t i = 0, k = 0;
  while (i < n) {
    const char *eol = memchr(in + i, '\n', n - i);
    size_t len = eol ? (size_t)(eol - (in + i)) + 1 : n - i;
    if (!(len > 6 && memcmp(in + i, "Date: ", 6) == 0)) {
      memcpy(out + k, in + i, len);
      k += len;
    }
    i += len;
  }
  return k;
}

static size_t transcript(fx_t *fx, const char *req, size_t len, int bytewise,
                         int want, char *out, int *closed) {
  htc_t *c = htc_new("127.0.0.1", fx->port);
  size_t i, n;
  assert_non_null(c);
  if (bytewise) {
    for (i = 0; i < len; i++) {
      assert_int_equal(htc_send(&fx->loop, c, req + i, 1), 0);
      uv_run(&fx->loop, UV_RUN_NOWAIT);
    }
  } else {
    assert_int_equal(htc_send(&fx->loop, c, req, len), 0);
  }
  want = wait_responses(fx, c, NULL, want, 2000);
  if (want > 0 && R[want - 1].close)
    wait_eof(fx, c, 2000);
  else
    spin(fx, c, 5);
  *closed = c->eof;
  n = strip_date(c->buf, c->len, out);
  htc_free(c);
  return n;
}

static void byte_at_a_time_parses_the_same(void **state) {
  static const bad_t inputs[] = {
      BAD("get", GET("/a"), 1, ""),
      BAD("pipelined", "\r\n" GET("/a") GET("/b?c") GET("/d"), 3, ""),
      BAD("chunked ext trailer",
          CHUNKED "5;a=\"x\\\"y\"\r\nhello\r\n0\r\nX-T: 1\r\n\r\n" GET("/n"), 2,
          ""),
      BAD("content-length", "POST /p" H11 "Content-Length: 4\r\n\r\nbody", 1,
          ""),
      BAD("http/1.0", "GET /x HTTP/1.0\r\nX-V: v\r\n\r\n", 1, ""),
      BAD("obs-fold", "GET /" H11 "X-A: a\r\n b\r\n\r\n" GET("/s"), 1, ""),
      BAD("cl+te",
          "POST /" H11 "Content-Length: 5\r\nTransfer-Encoding: "
          "chunked\r\n\r\n0\r\n\r\n",
          1, ""),
      BAD("bad chunk", CHUNKED "3\r\nabcXX0\r\n\r\n" GET("/s"), 1, ""),
      BAD("bare cr", "GET /" H11 "X: a\rb\r\n\r\n", 1, ""),
      BAD("space colon", "GET / HTTP/1.1\r\nHost : t\r\n\r\n", 1, ""),
      BAD("version", "GET / HTTP/2.0\r\nHost: t\r\n\r\n", 1, ""),
      BAD("te gzip", "POST /" H11 "Transfer-Encoding: gzip, chunked\r\n\r\n", 1,
          ""),
      BAD("valid then bad", GET("/ok") "GET /a#b" H11 "\r\n", 2, ""),
      BAD("expect",
          "POST /e" H11 "Expect: 100-continue\r\nContent-Length: "
          "2\r\n\r\nhi",
          2, ""),
  };
  om_http_server_opts_t o = small_limits();
  fx_t *fx = fx_new(&o);
  static char a[65536], b[65536];
  size_t i;
  (void)state;
  for (i = 0; i < sizeof inputs / sizeof inputs[0]; i++) {
    int ca, cb;
    size_t na = transcript(fx, inputs[i].req, inputs[i].len, 0,
                           inputs[i].status, a, &ca);
    size_t nb = transcript(fx, inputs[i].req, inputs[i].len, 1,
                           inputs[i].status, b, &cb);
    if (na != nb || memcmp(a, b, na) != 0 || ca != cb)
      fail_msg("%s: whole (%zu bytes, closed %d):\n%.*s\nbytewise (%zu "
               "bytes, closed %d):\n%.*s",
               inputs[i].name, na, ca, (int)na, a, nb, cb, (int)nb, b);
    OM_ASSERT_CMP(na, >, 0);
  }
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* timeouts and connection limits */

static om_http_server_opts_t short_timeouts(void) {
  om_http_server_opts_t o;
  memset(&o, 0, sizeof o);
  o.header_timeout_ms = 500;
  o.idle_timeout_ms = 300;
  return o;
}

static void slow_loris_gets_408_by_the_header_timeout(void **state) {
  om_http_server_opts_t o = short_timeouts();
  fx_t *fx = fx_new(&o);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  const char *req = "GET / HTTP/1.1\r\nHost: t\r\nX-Slow: aaaaaaaaaaaaaaaa";
  uint64_t t0 = htc_now_ms(), el;
  size_t i = 0;
  (void)state;
  /* one byte every 100 ms: each byte is well inside any per-byte timeout,
   * the section as a whole is not */
  while (!c->eof && htc_now_ms() - t0 < 3000) {
    if (req[i] != 0 && htc_now_ms() - t0 >= i * 100) {
      if (htc_send(&fx->loop, c, req + i, 1) != 0)
        break;
      i++;
    }
    htc_step(&fx->loop, c, 5);
  }
  el = htc_now_ms() - t0;
  assert_true(c->eof);
  assert_int_equal(htc_responses(c, NULL, R, 8), 1);
  assert_int_equal(R[0].status, 408);
  assert_string_equal(R[0].body, "{\"error\":\"request_timeout\"}");
  OM_TEST_NOTE("slow loris closed after %" PRIu64 " ms, %zu bytes sent", el, i);
  /* Not before the 500 ms header timeout (50 ms for the server's cached
   * loop clock and ms rounding). Under 1.5 s: the timer ran from the first
   * byte, not from the end of the request line (1.6 s of bytes) nor was it
   * re-armed by each byte (the loop would run to its 3 s cap); the rest is
   * room for a sanitized build on a loaded machine. */
  OM_ASSERT_CMP(el, >=, 450);
  OM_ASSERT_CMP(el, <, 1500);
  assert_int_equal(M(fx)->rejected[OM_HTTP_REJECT_REQUEST_TIMEOUT], 1);
  htc_free(c);
  /* a connection that sends nothing is closed silently */
  c = htc_new("127.0.0.1", fx->port);
  t0 = htc_now_ms();
  assert_true(wait_eof(fx, c, 3000));
  el = htc_now_ms() - t0;
  assert_int_equal(c->total, 0);
  /* the header timeout again, from the accept; under the 3 s wait */
  OM_ASSERT_CMP(el, >=, 450);
  OM_ASSERT_CMP(el, <, 1500);
  htc_free(c);
  fx_free(fx);
}

static void idle_and_body_timeouts(void **state) {
  om_http_server_opts_t o = short_timeouts();
  fx_t *fx = fx_new(&o);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  uint64_t t0, el;
  (void)state;
  /* keep-alive idle: closed without a word after idle_timeout */
  assert_int_equal(htc_sends(&fx->loop, c, GET("/a")), 0);
  assert_int_equal(wait_responses(fx, c, NULL, 1, 2000), 1);
  t0 = htc_now_ms();
  assert_true(wait_eof(fx, c, 3000));
  el = htc_now_ms() - t0;
  assert_int_equal(htc_responses(c, NULL, R, 8), 1);
  /* Not before the 300 ms idle timeout (50 ms for the cached loop clock);
   * well under the 3 s wait, so it was the server's timer that closed it,
   * with room for a sanitized build on a loaded machine. */
  OM_ASSERT_CMP(el, >=, 250);
  OM_ASSERT_CMP(el, <, 1500);
  htc_free(c);
  /* a body that stalls: 408 */
  c = htc_new("127.0.0.1", fx->port);
  assert_int_equal(
      htc_sends(&fx->loop, c, "POST /" H11 "Content-Length: 10\r\n\r\nabc"), 0);
  t0 = htc_now_ms();
  assert_true(wait_eof(fx, c, 3000));
  el = htc_now_ms() - t0;
  assert_int_equal(htc_responses(c, NULL, R, 8), 1);
  assert_int_equal(R[0].status, 408);
  /* the 300 ms timeout between body bytes, not early; under the 3 s wait */
  OM_ASSERT_CMP(el, >=, 250);
  OM_ASSERT_CMP(el, <, 1500);
  htc_free(c);
  fx_free(fx);
}

static void write_stall_cuts_the_connection(void **state) {
  om_http_server_opts_t o = short_timeouts();
  fx_t *fx = fx_new(&o);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  int rcvbuf = 4096;
  uint64_t t0;
  (void)state;
  setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  assert_int_equal(htc_sends(&fx->loop, c, GET("/big")), 0);
  /* never read: the server must give up after idle_timeout without
   * progress */
  t0 = htc_now_ms();
  while (M(fx)->connections_active > 0 && htc_now_ms() - t0 < 3000) {
    uv_run(&fx->loop, UV_RUN_NOWAIT);
    poll(NULL, 0, 2);
  }
  assert_int_equal(M(fx)->connections_active, 0);
  assert_int_equal(fx->big_rc, 0);
  OM_TEST_NOTE("pending after an 8 MiB write: %zu bytes",
               fx->pending_after_write);
  OM_ASSERT_CMP(fx->pending_after_write, >, 0);
  htc_free(c);
  fx_free(fx);
}

static void max_connections_rejects_and_counts(void **state) {
  om_http_server_opts_t o;
  fx_t *fx;
  htc_t *a, *b, *c, *d;
  uint64_t t0;
  (void)state;
  memset(&o, 0, sizeof o);
  o.max_connections = 2;
  fx = fx_new(&o);
  a = htc_new("127.0.0.1", fx->port);
  b = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, a, GET("/a")), 0);
  assert_int_equal(wait_responses(fx, a, NULL, 1, 2000), 1);
  assert_int_equal(htc_sends(&fx->loop, b, GET("/b")), 0);
  assert_int_equal(wait_responses(fx, b, NULL, 1, 2000), 1);
  c = htc_new("127.0.0.1", fx->port);
  assert_true(wait_eof(fx, c, 2000));
  if (c->len > 0) /* 503 if the socket took it before the close */
    OM_ASSERT_PREFIX(c->buf, "HTTP/1.1 503 ");
  assert_int_equal(M(fx)->connections_rejected, 1);
  assert_int_equal(M(fx)->connections_active, 2);
  /* a slot frees up when a client leaves */
  htc_free(a);
  t0 = htc_now_ms();
  while (M(fx)->connections_active > 1 && htc_now_ms() - t0 < 2000)
    htc_step(&fx->loop, NULL, 1);
  d = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, d, GET("/d")), 0);
  assert_int_equal(wait_responses(fx, d, NULL, 1, 2000), 1);
  assert_int_equal(R[0].status, 200);
  assert_int_equal(M(fx)->connections_accepted, 3);
  htc_free(b);
  htc_free(c);
  htc_free(d);
  fx_free(fx);
}

/* The connections waiting in a listening socket's accept queue (Linux:
 * TCP_INFO's tcpi_unacked on a listener). */
static unsigned accept_queue(int lfd) {
  struct tcp_info ti;
  socklen_t len = sizeof ti;
  memset(&ti, 0, sizeof ti);
  assert_int_equal(getsockopt(lfd, IPPROTO_TCP, TCP_INFO, &ti, &len), 0);
  return ti.tcpi_unacked;
}

/* A server on a socket of its own making (as workers share one), three
 * connections queued on it before its loop runs: how many one turn of the
 * loop takes. */
static uint64_t accepted_in_one_turn(size_t batch) {
  om_http_server_opts_t o;
  fx_t *fx = calloc(1, sizeof *fx);
  htc_t *c[3];
  char err[128];
  int lfd;
  uint64_t t0, n;
  memset(&o, 0, sizeof o);
  o.accept_batch = batch;
  assert_non_null(fx);
  assert_int_equal(uv_loop_init(&fx->loop), 0);
  uv_timer_init(&fx->loop, &fx->timer);
  assert_int_equal(om_http_server_new(&fx->loop, &o, handler, fx, &fx->srv), 0);
  assert_int_equal(om_http_listen_socket("127.0.0.1", 0, &lfd, err, sizeof err),
                   0);
  assert_int_equal(om_http_server_listen_fd(fx->srv, dup(lfd)), 0);
  fx->port = om_http_server_port(fx->srv);
  for (int i = 0; i < 3; i++)
    assert_non_null(c[i] = htc_new("127.0.0.1", fx->port));
  t0 = htc_now_ms();
  while (accept_queue(lfd) < 3 && htc_now_ms() - t0 < 2000)
    uv_sleep(1);
  assert_int_equal(accept_queue(lfd), 3);
  uv_run(&fx->loop, UV_RUN_NOWAIT);
  n = M(fx)->connections_accepted;
  for (int i = 0; i < 3; i++)
    htc_free(c[i]);
  close(lfd);
  fx_free(fx);
  return n;
}

static void accept_batch_is_what_one_turn_takes(void **state) {
  om_http_server_opts_t o;
  om_http_server_t *srv = NULL;
  uv_loop_t loop;
  (void)state;
  /* by default a turn drains the queue; workers sharing a socket take one
   * each, so that a burst spreads over their loops */
  assert_int_equal(accepted_in_one_turn(0), 3);
  assert_int_equal(accepted_in_one_turn(1), 1);
  assert_int_equal(accepted_in_one_turn(2), 2);
  memset(&o, 0, sizeof o);
  o.accept_batch = 65;
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(om_http_server_new(&loop, &o, handler, NULL, &srv),
                   OM_EINVAL);
  assert_null(srv);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* ------------------------------------------------------------------ */
/* garbage */

static void random_garbage_is_refused_and_the_server_lives(void **state) {
  static const char alphabet[] = "GET /HTP1.0\r\n:; \t,=\"chunkedContent-"
                                 "Length0123456789abcdefxyz\x00\x7f\xff";
  static const char *prefixes[] = {
      "", "GET / HTTP/1.1\r\n", "POST / HTTP/1.1\r\nHost: t\r\n", CHUNKED,
      "GET / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n"};
  om_http_server_opts_t o = small_limits();
  fx_t *fx;
  om_rng_t rng;
  char buf[512];
  int round, answered = 0;
  (void)state;
  o.header_timeout_ms = 1000;
  fx = fx_new(&o);
  om_rng_seed(&rng, 20240611);
  for (round = 0; round < 60; round++) {
    htc_t *c = htc_new("127.0.0.1", fx->port);
    const char *pre = prefixes[om_rng_below(&rng, 5)];
    size_t n = strlen(pre), len = n + 1 + om_rng_below(&rng, 300), i;
    int k;
    memcpy(buf, pre, n);
    for (i = n; i < len; i++)
      buf[i] = om_rng_below(&rng, 4) == 0
                   ? (char)om_rng_below(&rng, 256)
                   : alphabet[om_rng_below(&rng, sizeof alphabet - 1)];
    if (htc_send(&fx->loop, c, buf, len) == 0)
      shutdown(c->fd, SHUT_WR); /* and no more: the server must not wait */
    assert_true(wait_eof(fx, c, 3000));
    k = htc_responses(c, NULL, R, 8);
    OM_ASSERT_CMP(k, >=, 0);
    for (i = 0; i < (size_t)k; i++) {
      if (R[i].status != 200)
        OM_ASSERT_CMP(R[i].status, >=, 400);
      if (R[i].status >= 400)
        assert_true(R[i].close);
    }
    answered += k > 0;
    htc_free(c);
  }
  OM_TEST_NOTE("garbage rounds answered: %d of 60", answered);
  OM_ASSERT_CMP(answered, >, 10);
  {
    htc_t *c = htc_new("127.0.0.1", fx->port);
    assert_int_equal(htc_sends(&fx->loop, c, GET("/alive")), 0);
    assert_int_equal(wait_responses(fx, c, NULL, 1, 2000), 1);
    assert_int_equal(R[0].status, 200);
    htc_free(c);
  }
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* streaming responses */

static void streaming_responses(void **state) {
  fx_t *fx = fx_new(NULL);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  (void)state;
  assert_int_equal(
      htc_sends(&fx->loop, c, GET("/stream") GET("/fixed") GET("/after")), 0);
  assert_int_equal(wait_responses(fx, c, NULL, 3, 2000), 3);
  assert_int_equal(R[0].chunked, 1);
  assert_string_equal(R[0].body, "hello world");
  assert_non_null(strstr(c->buf, "6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n"));
  assert_int_equal(R[1].chunked, 0);
  assert_int_equal(R[1].cl, 5);
  assert_string_equal(R[1].body, "abcde");
  OM_ASSERT_PREFIX(R[2].body, "GET /after ");
  htc_free(c);
  /* abort: the chunked body is cut before its last chunk */
  c = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, c, GET("/abort") GET("/never")), 0);
  assert_true(wait_eof(fx, c, 2000));
  assert_int_equal(htc_responses(c, NULL, R, 8), 0); /* incomplete */
  OM_ASSERT_CMP(c->len, >, 0);
  assert_non_null(strstr(c->buf, "7\r\npartial\r\n"));
  assert_null(strstr(c->buf, "0\r\n\r\n"));
  assert_false(seen_target(fx, "/never"));
  assert_int_equal(M(fx)->responses_aborted, 1);
  htc_free(c);
  /* the client may read a big stream at its own pace */
  c = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, c, GET("/big")), 0);
  {
    uint64_t t0 = htc_now_ms();
    while (
        !(c->total > (8u << 20) && memcmp(c->tail + 3, "0\r\n\r\n", 5) == 0) &&
        htc_now_ms() - t0 < 5000)
      htc_step(&fx->loop, c, 1);
    OM_ASSERT_CMP(c->total, >, (8u << 20));
    assert_memory_equal(c->tail + 3, "0\r\n\r\n", 5);
  }
  htc_free(c);
  fx_free(fx);
}

/*
 * Trailers go in the trailer section of a chunked response when the
 * request's TE lists "trailers" (RFC 9110 10.1.4), are dropped without
 * it, and never carry a framing field or a CR/LF.
 */
static void trailers_only_when_te_lists_them(void **state) {
  fx_t *fx = fx_new(NULL);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  (void)state;
  assert_int_equal(htc_sends(&fx->loop, c,
                             "GET /trailers HTTP/1.1\r\nHost: t\r\n"
                             "TE: gzip, trailers\r\n\r\n" GET("/trailers")),
                   0);
  assert_int_equal(wait_responses(fx, c, NULL, 2, 2000), 2);
  assert_string_equal(R[0].body, "body");
  assert_string_equal(R[1].body, "body");
  /* the first, and only the first, ends with its trailer section */
  assert_non_null(
      strstr(c->buf, "4\r\nbody\r\n0\r\ngrpc-status: 0\r\nx-sum: abc\r\n\r\n"));
  assert_non_null(strstr(c->buf, "4\r\nbody\r\n0\r\n\r\n"));
  assert_null(strstr(c->buf, "X-Injected"));
  assert_null(strstr(c->buf, "Content-Length: 9"));
  htc_free(c);
  fx_free(fx);
}

/*
 * A lent buffer is not copied: what the kernel does not take waits as a
 * pointer into it (pending counts it), and its release runs exactly once,
 * after the client took every byte, or when the client leaves mid-way; a
 * write small enough to be gathered is copied and released at once.
 */
static void lent_writes_are_released_once(void **state) {
  fx_t *fx = fx_new(NULL);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  uint64_t t0;
  (void)state;
  assert_int_equal(htc_sends(&fx->loop, c, GET("/lent")), 0);
  t0 = htc_now_ms();
  while (fx->seen == 0 && htc_now_ms() - t0 < 2000)
    htc_step(&fx->loop, NULL, 1); /* the client does not read yet */
  assert_int_equal(fx->lent_rc, 0);
  assert_int_equal(fx->lent_released_at_return, 0);
  OM_ASSERT_CMP(fx->lent_pending, >, (4u << 20));
  spin(fx, NULL, 20);
  assert_int_equal(fx->lent_released, 0); /* still queued, still lent */
  t0 = htc_now_ms();
  while (!(c->total > (8u << 20) && memcmp(c->tail + 3, "0\r\n\r\n", 5) == 0) &&
         htc_now_ms() - t0 < 5000)
    htc_step(&fx->loop, c, 1);
  OM_ASSERT_CMP(c->total, >, (8u << 20));
  assert_memory_equal(c->tail + 3, "0\r\n\r\n", 5);
  assert_memory_equal(c->tail, "q\r\n0\r\n\r\n", 8);
  assert_int_equal(fx->lent_released, 1);
  htc_free(c);
  /* the client leaves with most of it unread */
  c = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, c, GET("/lent")), 0);
  t0 = htc_now_ms();
  while (fx->seen < 2 && htc_now_ms() - t0 < 2000)
    htc_step(&fx->loop, NULL, 1);
  assert_int_equal(fx->lent_released, 1);
  htc_free(c);
  t0 = htc_now_ms();
  while (fx->lent_released < 2 && htc_now_ms() - t0 < 2000)
    htc_step(&fx->loop, NULL, 1);
  assert_int_equal(fx->lent_released, 2);
  /* small: gathered (copied), released before the write returned */
  c = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, c, GET("/lent-small")), 0);
  assert_int_equal(wait_responses(fx, c, NULL, 1, 2000), 1);
  assert_string_equal(R[0].body, "qqqqqqqqqq");
  assert_int_equal(fx->lent_released_at_return, 3);
  assert_int_equal(fx->lent_released, 3);
  htc_free(c);
  fx_free(fx);
}

static void client_close_mid_stream_runs_on_close(void **state) {
  fx_t *fx = fx_new(NULL);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  uint64_t t0;
  (void)state;
  assert_int_equal(htc_sends(&fx->loop, c, GET("/hold")), 0);
  while (c->len < 20)
    htc_step(&fx->loop, c, 1);
  assert_int_equal(fx->n_held, 1);
  assert_non_null(strstr(c->buf, "data: x"));
  htc_free(c);
  t0 = htc_now_ms();
  while (fx->on_close_calls == 0 && htc_now_ms() - t0 < 2000)
    htc_step(&fx->loop, NULL, 1);
  assert_int_equal(fx->on_close_calls, 1);
  assert_int_equal(fx->on_close_end_rc, OM_ESTATE);
  assert_int_equal(fx->n_held, 0);
  assert_int_equal(M(fx)->responses_aborted, 1);
  /* an async holder without on_close gets OM_ESTATE and no leak */
  c = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, c, GET("/orphan")), 0);
  spin(fx, c, 20);
  htc_free(c);
  fx->later_rc = 1;
  t0 = htc_now_ms();
  while (fx->later != NULL && htc_now_ms() - t0 < 2000)
    htc_step(&fx->loop, NULL, 1);
  assert_int_equal(fx->later_rc, OM_ESTATE);
  fx_free(fx);
}

/* The byte-class table of om_http_chars.h, entry by entry, against the
 * grammar written out as RFC 9110 states it (5.6.2 tchar, 5.5
 * field-vchar, 5.6.3 OWS). */
static void byte_classes_follow_the_grammar(void **state) {
  static const char tspecial_ok[] = "!#$%&'*+-.^_`|~";
  (void)state;
  for (unsigned c = 0; c < 300; c++) {
    int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    int digit = c >= '0' && c <= '9';
    int tchar = c < 256 && (alpha || digit ||
                            (c != 0 && strchr(tspecial_ok, (int)c) != NULL));
    int vchar = c < 256 && ((c >= 0x21 && c <= 0x7e) || c >= 0x80);
    int ows = c == ' ' || c == '\t';
    if (!!om__http_is_tchar(c) != tchar || !!om__http_is_fvchar(c) != vchar ||
        !!om__http_is_ows(c) != ows)
      fail_msg("byte 0x%02x: tchar %d/%d vchar %d/%d ows %d/%d", c,
               !!om__http_is_tchar(c), tchar, !!om__http_is_fvchar(c), vchar,
               !!om__http_is_ows(c), ows);
  }
  /* the length-first compare: equal, other case, shorter, longer */
  assert_true(om__http_ci_eq("Content-Length", 14, "content-length"));
  assert_false(om__http_ci_eq("Content-Lengt", 13, "content-length"));
  assert_false(om__http_ci_eq("content-lengths", 15, "content-length"));
  assert_false(om__http_ci_eq("content_length", 14, "content-length"));
  assert_false(om__http_ci_eq("\x0dontent-length", 14, "content-length"));
}

static void response_api_misuse_is_refused(void **state) {
  fx_t *fx = fx_new(NULL);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  (void)state;
  assert_int_equal(htc_sends(&fx->loop, c, GET("/misuse") GET("/next")), 0);
  assert_int_equal(wait_responses(fx, c, NULL, 2, 2000), 2);
  assert_int_equal(fx->misuse[0], OM_EINVAL);  /* CRLF in a value */
  assert_int_equal(fx->misuse[1], OM_EINVAL);  /* name not a token */
  assert_int_equal(fx->misuse[2], OM_EINVAL);  /* Content-Length is ours */
  assert_int_equal(fx->misuse[3], OM_EINVAL);  /* 204 with a body */
  assert_int_equal(fx->misuse[4], OM_EINVAL);  /* status */
  assert_int_equal(fx->misuse[5], OM_EINVAL);  /* Transfer-Encoding */
  assert_int_equal(fx->misuse[6], OM_EINVAL);  /* Connection other than close */
  assert_int_equal(fx->misuse[12], OM_EINVAL); /* checked: Transfer-Encoding */
  assert_int_equal(fx->misuse[13], OM_EINVAL); /* checked: Connection */
  assert_int_equal(fx->misuse[14], OM_EINVAL); /* checked: 204 with a length */
  assert_int_equal(fx->misuse[7], OM_ESTATE);  /* write before start */
  assert_int_equal(fx->misuse[8], 0);
  assert_int_equal(fx->misuse[9], OM_EINVAL); /* past Content-Length */
  assert_int_equal(fx->misuse[10], 0);
  assert_int_equal(fx->misuse[11], 0);
  assert_string_equal(R[0].body, "abc");
  OM_ASSERT_PREFIX(R[1].body, "GET /next ");
  assert_null(strstr(c->buf, "X-B"));
  htc_free(c);
  fx_free(fx);
}

static void connection_close_from_client_and_handler(void **state) {
  fx_t *fx = fx_new(NULL);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  (void)state;
  assert_int_equal(htc_sends(&fx->loop, c,
                             "GET /a HTTP/1.1\r\nHost: t\r\nConnection: "
                             "close\r\n\r\n" GET("/b")),
                   0);
  assert_true(wait_eof(fx, c, 2000));
  assert_int_equal(htc_responses(c, NULL, R, 8), 1);
  assert_int_equal(R[0].close, 1);
  assert_false(seen_target(fx, "/b"));
  htc_free(c);
  c = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, c, GET("/close") GET("/b")), 0);
  assert_true(wait_eof(fx, c, 2000));
  assert_int_equal(htc_responses(c, NULL, R, 8), 1);
  assert_string_equal(R[0].body, "bye");
  assert_int_equal(R[0].close, 1);
  htc_free(c);
  fx_free(fx);
}

/* After a request that ends the connection (RFC 9112 9.6) nothing is
 * parsed; what the client sends while that response is still on its way
 * is read and dropped up to a point, then no longer read, so TCP holds the
 * client back (memory and our CPU stay bounded) and the response is still
 * delivered whole. */
static void bytes_after_a_last_request_stop_being_read(void **state) {
  static char junk[1 << 16];
  fx_t *fx = fx_new(NULL);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  size_t sent = 0;
  uint64_t t0, progress;
  (void)state;
  memset(junk, 'j', sizeof junk);
  assert_int_equal(htc_sends(&fx->loop, c,
                             "GET /hold HTTP/1.1\r\nHost: t\r\n"
                             "Connection: close\r\n\r\n"),
                   0);
  t0 = htc_now_ms();
  while (fx->n_held < 1 && htc_now_ms() - t0 < 2000)
    htc_step(&fx->loop, c, 1);
  assert_int_equal(fx->n_held, 1);
  /* push as much as the server takes: up to 256 MiB, or until it has
   * taken nothing for 300 ms */
  t0 = progress = htc_now_ms();
  while (sent < (256u << 20) && htc_now_ms() - progress < 300 &&
         htc_now_ms() - t0 < 20000) {
    ssize_t k = write(c->fd, junk, sizeof junk);
    if (k > 0) {
      sent += (size_t)k;
      progress = htc_now_ms();
    } else {
      {
        static const LargestIntegralType would_block[] = {EAGAIN, EWOULDBLOCK};
        OM_ASSERT_CMP(k, <, 0);
        assert_in_set(errno, would_block, 2);
      }
      htc_step(&fx->loop, c, 1);
    }
  }
  /* more than the drop budget (1 MiB) went in, then only what the two
   * sockets' buffers hold */
  OM_ASSERT_CMP(sent, >, (1u << 20));
  OM_ASSERT_CMP(sent, <, (32u << 20));
  assert_false(c->eof);
  /* the response is still whole: end it, and the client reads its end */
  assert_int_equal(om_http_response_write(fx->held[0], "data: y\n\n", 9), 0);
  fx->in_flight--;
  assert_int_equal(om_http_response_end(fx->held[0]), 0);
  fx->n_held = 0;
  t0 = htc_now_ms();
  while (!c->eof && htc_now_ms() - t0 < 5000)
    htc_step(&fx->loop, c, 1);
  assert_true(c->eof);
  assert_int_equal(htc_responses(c, NULL, R, 8), 1);
  assert_int_equal(R[0].status, 200);
  assert_int_equal(R[0].close, 1);
  assert_string_equal(R[0].body, "data: x\n\ndata: y\n\n");
  htc_free(c);
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* shutdown */

static void close_drains_in_flight_then_cuts(void **state) {
  om_http_server_opts_t o;
  fx_t *fx;
  htc_t *idle, *late, *held;
  uint64_t t0;
  (void)state;
  memset(&o, 0, sizeof o);
  o.drain_timeout_ms = 300;
  fx = fx_new(&o);
  idle = htc_new("127.0.0.1", fx->port);
  late = htc_new("127.0.0.1", fx->port);
  held = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, idle, GET("/i")), 0);
  assert_int_equal(wait_responses(fx, idle, NULL, 1, 2000), 1);
  assert_int_equal(htc_sends(&fx->loop, held, GET("/hold")), 0);
  while (fx->n_held == 0)
    htc_step(&fx->loop, held, 1);
  assert_int_equal(htc_sends(&fx->loop, late, GET("/later") GET("/dropped")),
                   0);
  while (fx->later == NULL)
    htc_step(&fx->loop, late, 1);
  t0 = htc_now_ms();
  assert_int_equal(om_http_server_close(fx->srv, on_closed), 0);
  assert_int_equal(om_http_server_close(fx->srv, on_closed), OM_ESTATE);
  assert_false(fx->closed); /* never synchronous */
  /* the idle connection goes at once: before the 300 ms drain timeout,
   * which is what would close it if the server waited for it */
  assert_true(wait_eof(fx, idle, 290));
  /* the in-flight one is answered, with Connection: close, then closed */
  assert_true(wait_eof(fx, late, 1000));
  assert_int_equal(htc_responses(late, NULL, R, 8), 1);
  assert_string_equal(R[0].body, "late");
  assert_int_equal(R[0].close, 1);
  assert_false(seen_target(fx, "/dropped"));
  /* the stream that never ends is cut at the drain timeout */
  assert_true(wait_eof(fx, held, 2000));
  assert_int_equal(fx->on_close_calls, 1);
  while (!fx->closed && htc_now_ms() - t0 < 3000)
    htc_step(&fx->loop, NULL, 1);
  assert_true(fx->closed);
  OM_ASSERT_CMP(htc_now_ms() - t0, >=, 250);
  assert_int_equal(fx->final.connections_active, 0);
  assert_int_equal(fx->final.requests, 3);
  htc_free(idle);
  htc_free(late);
  htc_free(held);
  fx_free(fx);
}

/* ------------------------------------------------------------------ */
/* out of memory while serving */

/* ------------------------------------------------------------------ */
/* upgrades */

/* Where the n bytes of what first occur in c's buffer; NULL if nowhere. */
static const char *find(const htc_t *c, const char *what, size_t n) {
  size_t i;
  for (i = 0; n <= c->len && i <= c->len - n; i++)
    if (memcmp(c->buf + i, what, n) == 0)
      return c->buf + i;
  return NULL;
}

/* Turn the loop until c's buffer holds what, or ms passed. */
static int wait_for(fx_t *fx, htc_t *c, const char *what, int ms) {
  uint64_t t0 = htc_now_ms();
  while (htc_now_ms() - t0 < (uint64_t)ms) {
    if (find(c, what, strlen(what)) != NULL)
      return 1;
    if (c->eof)
      break;
    htc_step(&fx->loop, c, 1);
  }
  return find(c, what, strlen(what)) != NULL;
}

static void upgrade_hands_the_connection_over(void **state) {
  fx_t *fx = fx_new(NULL);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  const char *head_end;
  uint64_t t0;
  (void)state;
  /* the first frame right behind the head, in the same segment: it is
   * the tunnel's first data, never parsed as HTTP */
  assert_int_equal(htc_sends(&fx->loop, c,
                             "GET /ws" H11 "Connection: Upgrade\r\n"
                             "Upgrade: echo\r\n\r\nGET /not-http"),
                   0);
  assert_true(wait_for(fx, c, "GET /not-http", 2000));
  assert_int_equal(fx->tun_rc, 0);
  assert_int_equal(fx->misuse[0], OM_EINVAL);
  assert_int_equal(strncmp(c->buf, "HTTP/1.1 101 Switching Protocols\r\n", 34),
                   0);
  assert_non_null(find(c, "\r\nUpgrade: echo\r\n", 17));
  assert_non_null(find(c, "\r\nConnection: upgrade\r\n", 23));
  head_end = find(c, "\r\n\r\n", 4);
  assert_non_null(head_end);
  OM_ASSERT_CMP((size_t)(head_end + 4 - c->buf) + 13, ==, c->len);
  assert_false(seen_target(fx, "/not-http"));
  /* raw bytes both ways */
  assert_int_equal(htc_sends(&fx->loop, c, "\x81\x02hi\r\n\r\n"), 0);
  assert_true(wait_for(fx, c, "\x81\x02hi\r\n\r\n", 2000));
  OM_ASSERT_CMP(M(fx)->upgrades, ==, 1);
  OM_ASSERT_CMP(M(fx)->connections_active, ==, 1);
  /* the client's half-close is carried: the echo's FIN comes back, and
   * the tunnel ends cleanly once both directions are closed */
  shutdown(c->fd, SHUT_WR);
  assert_true(wait_eof(fx, c, 2000));
  assert_false(c->reset);
  t0 = htc_now_ms();
  while (fx->tun_closes == 0 && htc_now_ms() - t0 < 2000)
    htc_step(&fx->loop, NULL, 1);
  OM_ASSERT_CMP(fx->tun_eofs, ==, 1);
  OM_ASSERT_CMP(fx->tun_closes, ==, 1);
  OM_ASSERT_CMP(fx->tun_err, ==, 0);
  OM_ASSERT_CMP(fx->tun_bytes, ==, 13 + 8);
  t0 = htc_now_ms();
  while (M(fx)->connections_active > 0 && htc_now_ms() - t0 < 2000)
    htc_step(&fx->loop, NULL, 1);
  OM_ASSERT_CMP(M(fx)->connections_active, ==, 0);
  htc_free(c);
  fx_free(fx);
}

static void upgrade_reset_and_shutdown_reach_the_holder(void **state) {
  fx_t *fx = fx_new(NULL);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  struct linger lg = {1, 0};
  uint64_t t0;
  (void)state;
  assert_int_equal(htc_sends(&fx->loop, c,
                             "GET /ws" H11 "Connection: upgrade\r\n"
                             "Upgrade: echo\r\n\r\n"),
                   0);
  assert_true(wait_for(fx, c, "\r\n\r\n", 2000));
  assert_int_equal(fx->tun_rc, 0);
  /* a reset from the client ends the tunnel with an error */
  setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  htc_free(c);
  t0 = htc_now_ms();
  while (fx->tun_closes == 0 && htc_now_ms() - t0 < 2000)
    htc_step(&fx->loop, NULL, 1);
  OM_ASSERT_CMP(fx->tun_closes, ==, 1);
  OM_ASSERT_CMP(fx->tun_err, ==, OM_EIO);
  /* a tunnel open when the server closes hears OM_ESTATE */
  fx->tun_closes = 0;
  c = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, c,
                             "GET /ws" H11 "Connection: upgrade\r\n"
                             "Upgrade: echo\r\n\r\n"),
                   0);
  assert_true(wait_for(fx, c, "\r\n\r\n", 2000));
  assert_non_null(fx->tun);
  assert_int_equal(om_http_server_close(fx->srv, on_closed), 0);
  t0 = htc_now_ms();
  while (!fx->closed && htc_now_ms() - t0 < 10000)
    htc_step(&fx->loop, c, 1);
  assert_true(fx->closed);
  OM_ASSERT_CMP(fx->tun_closes, ==, 1);
  OM_ASSERT_CMP(fx->tun_err, ==, OM_ESTATE);
  OM_ASSERT_CMP(fx->final.upgrades, ==, 2);
  htc_free(c);
  fx_free(fx);
}

static void upgrade_answered_otherwise_stays_http(void **state) {
  fx_t *fx = fx_new(NULL);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  (void)state;
  /* not taken: an ordinary response, and the bytes behind the request
   * are read as the next request */
  assert_int_equal(htc_sends(&fx->loop, c,
                             "GET /plain" H11 "Connection: upgrade\r\n"
                             "Upgrade: echo\r\n\r\n" GET("/next")),
                   0);
  assert_int_equal(wait_responses(fx, c, NULL, 2, 2000), 2);
  assert_int_equal(R[0].status, 200);
  assert_int_equal(R[1].status, 200);
  assert_true(seen_target(fx, "/next"));
  OM_ASSERT_CMP(M(fx)->upgrades, ==, 0);
  /* with a body it is no upgrade request: answered as HTTP */
  assert_int_equal(htc_sends(&fx->loop, c,
                             "POST /ws" H11 "Connection: upgrade\r\n"
                             "Upgrade: echo\r\nContent-Length: 2\r\n\r\nab"),
                   0);
  assert_int_equal(wait_responses(fx, c, NULL, 3, 2000), 3);
  assert_int_equal(R[2].status, 200);
  OM_ASSERT_CMP(M(fx)->upgrades, ==, 0);
  htc_free(c);
  fx_free(fx);
}

static void allocation_failures_while_serving(void **state) {
  fx_t *fx = fx_new(NULL);
  htc_t *warm[12];
  int n, i, ok = 0;
  const char *req =
      CHUNKED "5;x=y\r\nhello\r\n0\r\nX-T: 1\r\n\r\n" GET("/b") GET("/stream");
  (void)state;
  /* libuv aborts if it cannot grow its watcher array: make it big first */
  for (i = 0; i < 12; i++) {
    warm[i] = htc_new("127.0.0.1", fx->port);
    assert_int_equal(htc_sends(&fx->loop, warm[i], GET("/w")), 0);
    assert_int_equal(wait_responses(fx, warm[i], NULL, 1, 2000), 1);
  }
  for (i = 0; i < 12; i++)
    htc_free(warm[i]);
  spin(fx, NULL, 20);
  for (n = 0; n < 200; n++) {
    htc_t *c = htc_new("127.0.0.1", fx->port);
    long failures;
    int k;
    assert_non_null(c);
    om_test_fail_alloc_after(n);
    htc_send(&fx->loop, c, req, strlen(req));
    k = wait_responses(fx, c, NULL, 3, 1000);
    failures = om_test_alloc_failures();
    om_test_alloc_reset();
    htc_free(c);
    spin(fx, NULL, 2);
    if (failures == 0) {
      assert_int_equal(k, 3);
      assert_non_null(strstr(R[0].body, "\nhello"));
      assert_string_equal(R[2].body, "hello world");
      ok = 1;
      break;
    }
    /* a failure may cost the connection (or a 503 when even the
     * connection could not be set up), never a wrong answer */
    for (i = 0; i < k; i++) {
      if (R[i].status == 503) {
        assert_int_equal(i, 0);
        continue;
      }
      assert_int_equal(R[i].status, 200);
      if (i == 0)
        assert_non_null(strstr(R[0].body, "\nhello"));
      if (i == 1)
        OM_ASSERT_PREFIX(R[1].body, "GET /b ");
    }
  }
  OM_TEST_NOTE("allocations on the request path: %d", n);
  assert_true(ok);
  {
    uint64_t t0 = htc_now_ms();
    while (M(fx)->connections_active > 0 && htc_now_ms() - t0 < 3000)
      htc_step(&fx->loop, NULL, 1);
    assert_int_equal(M(fx)->connections_active, 0);
  }
  fx_free(fx);
}

static void reject_names_and_statuses(void **state) {
  (void)state;
  assert_string_equal(om_http_reject_name(OM_HTTP_REJECT_OBS_FOLD), "obs_fold");
  assert_int_equal(om_http_reject_status(OM_HTTP_REJECT_TARGET_TOO_LONG), 414);
  assert_int_equal(om_http_reject_status(OM_HTTP_REJECT_REQUEST_TIMEOUT), 408);
  assert_string_equal(om_http_reject_name(OM_HTTP_REJECT__COUNT), "unknown");
  assert_int_equal(om_http_reject_status(OM_HTTP_REJECT__COUNT), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(new_rejects_bad_arguments),
      cmocka_unit_test(new_fails_cleanly_without_memory),
      cmocka_unit_test(listen_errors),
      cmocka_unit_test(reject_names_and_statuses),
      cmocka_unit_test(keep_alive_and_request_fields),
      cmocka_unit_test(many_htabs_across_slices),
      cmocka_unit_test(pipelined_requests_answered_in_order),
      cmocka_unit_test(valid_edge_cases_are_accepted),
      cmocka_unit_test(pipeline_limit_pauses_reading),
      cmocka_unit_test(http10_close_and_keep_alive),
      cmocka_unit_test(head_and_no_content),
      cmocka_unit_test(rejections_answer_once_and_close),
      cmocka_unit_test(limits_431_414_413),
      cmocka_unit_test(head_request_rejection_has_no_body),
      cmocka_unit_test(chunked_request_bodies),
      cmocka_unit_test(expect_100_continue),
      cmocka_unit_test(byte_at_a_time_parses_the_same),
      cmocka_unit_test(slow_loris_gets_408_by_the_header_timeout),
      cmocka_unit_test(idle_and_body_timeouts),
      cmocka_unit_test(write_stall_cuts_the_connection),
      cmocka_unit_test(max_connections_rejects_and_counts),
      cmocka_unit_test(accept_batch_is_what_one_turn_takes),
      cmocka_unit_test(random_garbage_is_refused_and_the_server_lives),
      cmocka_unit_test(streaming_responses),
      cmocka_unit_test(lent_writes_are_released_once),
      cmocka_unit_test(trailers_only_when_te_lists_them),
      cmocka_unit_test(client_close_mid_stream_runs_on_close),
      cmocka_unit_test(byte_classes_follow_the_grammar),
      cmocka_unit_test(response_api_misuse_is_refused),
      cmocka_unit_test(connection_close_from_client_and_handler),
      cmocka_unit_test(bytes_after_a_last_request_stop_being_read),
      cmocka_unit_test(close_drains_in_flight_then_cuts),
      cmocka_unit_test(allocation_failures_while_serving),
      cmocka_unit_test(upgrade_hands_the_connection_over),
      cmocka_unit_test(upgrade_reset_and_shutdown_reach_the_holder),
      cmocka_unit_test(upgrade_answered_otherwise_stays_http),
  };
  signal(SIGPIPE, SIG_IGN); /* libuv writes with writev */
  return cmocka_run_group_tests(tests, NULL, NULL);
}
