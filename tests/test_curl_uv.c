/*
 * test_curl_uv.c: libcurl multi on libuv (host/net/om_curl_uv.h) against a
 * real HTTP server (host/net/om_http_server.h) on loopback, both on one loop
 * in this thread.
 */
#include "om_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "om_curl_uv.h"
#include "om_errno.h"
#include "om_http_server.h"

/* ---- the fixture: a server with a few routes, a glue, one loop ---- */

enum held_kind { HELD_NONE, HELD_HANG, HELD_SLOW, HELD_STREAM };

typedef struct held_s {
  om_http_request_t *req;
  enum held_kind kind;
  int alive;
  uint64_t due_ms;
  int stage;
} held_t;

#define MAX_HELD 128

typedef struct fx_s {
  uv_loop_t loop;
  uv_timer_t ticker;
  om_http_server_t *srv;
  int srv_closed;
  int port;
  om_curl_uv_t *cu;
  int cu_closed;
  held_t held[MAX_HELD];
  size_t n_held;
  size_t requests; /* seen by the server */
  size_t client_closes;
  int stream_got_first; /* set by the client's write function */
} fx_t;

static uint64_t now_ms(void) {
  return uv_hrtime() / 1000000u;
}

static void on_held_close(om_http_request_t *req) {
  held_t *h = req->user;
  h->alive = 0;
  h->req = NULL;
}

static held_t *hold(fx_t *fx, om_http_request_t *req, enum held_kind kind) {
  held_t *h;
  OM_ASSERT_CMP(fx->n_held, <, MAX_HELD);
  h = &fx->held[fx->n_held++];
  h->req = req;
  h->kind = kind;
  h->alive = 1;
  req->user = h;
  assert_int_equal(om_http_request_on_close(req, on_held_close), 0);
  return h;
}

static void respond_text(om_http_request_t *req, int status, const char *s) {
  om_http_header_t h[] = {{"Content-Type", "text/plain", 0, 0}};
  om_http_respond(req, status, h, 1, s, strlen(s));
}

static int path_is(const om_http_request_t *req, const char *p) {
  return req->path_len == strlen(p) && memcmp(req->path, p, req->path_len) == 0;
}

static void handler(om_http_request_t *req, void *ud) {
  fx_t *fx = ud;
  fx->requests++;
  if (path_is(req, "/hello")) {
    respond_text(req, 200, "hello");
  } else if (path_is(req, "/echo")) {
    /* METHOD|body|content-type|x-test */
    const char *ct = om_http_request_header(req, "content-type", NULL);
    const char *xt = om_http_request_header(req, "x-test", NULL);
    size_t n = req->body_len + 256;
    char *b = malloc(n);
    assert_non_null(b);
    snprintf(b, n, "%s|%s|%s|%s", req->method, req->body, ct ? ct : "-",
             xt ? xt : "-");
    respond_text(req, 200, b);
    free(b);
  } else if (req->path_len > 8 && memcmp(req->path, "/status/", 8) == 0) {
    respond_text(req, atoi(req->path + 8), "s");
  } else if (path_is(req, "/big") || path_is(req, "/bigchunked")) {
    size_t n = 2u << 20;
    char *b = malloc(n);
    assert_non_null(b);
    memset(b, 'x', n);
    if (path_is(req, "/big")) {
      om_http_respond(req, 200, NULL, 0, b, n);
    } else {
      om_http_response_start(req, 200, NULL, 0);
      for (size_t off = 0; off < n; off += 65536)
        om_http_response_write(req, b + off, 65536);
      om_http_response_end(req);
    }
    free(b);
  } else if (path_is(req, "/hang")) {
    hold(fx, req, HELD_HANG);
  } else if (path_is(req, "/slow")) {
    hold(fx, req, HELD_SLOW)->due_ms = now_ms() + 200;
  } else if (path_is(req, "/stream")) {
    held_t *h = hold(fx, req, HELD_STREAM);
    assert_int_equal(om_http_response_start(req, 200, NULL, 0), 0);
    assert_int_equal(om_http_response_write(req, "first\n", 6), 0);
    h->stage = 1;
  } else {
    respond_text(req, 404, "no such route");
  }
}

/* Every 5 ms: answer due slow requests; advance streams. */
static void on_tick(uv_timer_t *t) {
  fx_t *fx = t->data;
  for (size_t i = 0; i < fx->n_held; i++) {
    held_t *h = &fx->held[i];
    if (!h->alive)
      continue;
    if (h->kind == HELD_SLOW && now_ms() >= h->due_ms) {
      h->alive = 0;
      respond_text(h->req, 200, "slow");
    } else if (h->kind == HELD_STREAM && h->stage == 1 &&
               fx->stream_got_first) {
      /* the client has read the first chunk before the second exists:
       * delivery is incremental, not buffered until the end */
      om_http_response_write(h->req, "second\n", 7);
      h->alive = 0;
      om_http_response_end(h->req);
    }
  }
}

static void on_srv_closed(om_http_server_t *srv, void *ud) {
  fx_t *fx = ud;
  (void)srv;
  fx->srv_closed = 1;
}

static void on_cu_closed(void *ud) {
  fx_t *fx = ud;
  fx->cu_closed++;
}

static fx_t *fx_new(void) {
  fx_t *fx = calloc(1, sizeof *fx);
  assert_non_null(fx);
  assert_int_equal(uv_loop_init(&fx->loop), 0);
  uv_timer_init(&fx->loop, &fx->ticker);
  fx->ticker.data = fx;
  uv_timer_start(&fx->ticker, on_tick, 5, 5);
  assert_int_equal(om_http_server_new(&fx->loop, NULL, handler, fx, &fx->srv),
                   0);
  assert_int_equal(om_http_server_listen(fx->srv, "127.0.0.1", 0), 0);
  fx->port = om_http_server_port(fx->srv);
  OM_ASSERT_CMP(fx->port, >, 0);
  assert_int_equal(om_curl_uv_new(&fx->loop, &fx->cu), 0);
  return fx;
}

/* Run the loop until *flag is non-zero or timeout_ms passes. */
static int run_until(fx_t *fx, const int *flag, uint64_t timeout_ms) {
  uint64_t t0 = now_ms();
  while (!*flag && now_ms() - t0 < timeout_ms)
    uv_run(&fx->loop, UV_RUN_ONCE);
  return *flag;
}

static void run_for(fx_t *fx, uint64_t ms) {
  int never = 0;
  run_until(fx, &never, ms);
}

static void fx_free(fx_t *fx) {
  for (size_t i = 0; i < fx->n_held; i++)
    if (fx->held[i].alive) {
      fx->held[i].alive = 0;
      om_http_response_abort(fx->held[i].req);
    }
  if (fx->cu != NULL && !fx->cu_closed) {
    assert_int_equal(om_curl_uv_close(fx->cu, on_cu_closed, fx), 0);
    assert_true(run_until(fx, &fx->cu_closed, 5000));
  }
  assert_int_equal(om_http_server_close(fx->srv, on_srv_closed), 0);
  assert_true(run_until(fx, &fx->srv_closed, 5000));
  uv_close((uv_handle_t *)&fx->ticker, NULL);
  uv_run(&fx->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&fx->loop), 0);
  free(fx);
}

static void url(fx_t *fx, char *buf, size_t n, const char *path) {
  snprintf(buf, n, "http://127.0.0.1:%d%s", fx->port, path);
}

/* ---- a request's outcome ---- */

typedef struct got_s {
  int calls;
  CURLcode result;
  long status;
  char *body;
  size_t body_len;
  char error[CURL_ERROR_SIZE + 64];
  char clen[32];
  uint64_t at_ms;
} got_t;

static void on_resp(void *ud, om_curl_resp_t *resp) {
  got_t *g = ud;
  const char *cl = om_curl_resp_header(resp, "Content-Length");
  g->calls++;
  g->result = resp->result;
  g->status = resp->status;
  g->body = resp->body; /* take it */
  g->body_len = resp->body_len;
  resp->body = NULL;
  snprintf(g->error, sizeof g->error, "%s", resp->error);
  snprintf(g->clen, sizeof g->clen, "%s", cl ? cl : "");
  g->at_ms = now_ms();
}

static void got_clear(got_t *g) {
  free(g->body);
  memset(g, 0, sizeof *g);
}

static int start(fx_t *fx, const char *method, const char *path,
                 const char *body, uint64_t timeout_ms, got_t *g,
                 om_curl_request_t **h) {
  char u[128];
  om_curl_req_t req = {0};
  url(fx, u, sizeof u, path);
  req.method = method;
  req.url = u;
  req.body = body;
  req.body_len = body ? strlen(body) : 0;
  req.timeout_ms = timeout_ms;
  return om_curl_uv_request(fx->cu, &req, on_resp, g, h);
}

/* ---- tests ---- */

static void simple_get(void **state) {
  fx_t *fx = fx_new();
  got_t g = {0};
  (void)state;
  assert_int_equal(start(fx, NULL, "/hello", NULL, 0, &g, NULL), 0);
  assert_int_equal(om_curl_uv_active(fx->cu), 1);
  assert_true(run_until(fx, &g.calls, 5000));
  assert_int_equal(g.calls, 1);
  assert_int_equal(g.result, CURLE_OK);
  assert_int_equal(g.status, 200);
  assert_int_equal(g.body_len, 5);
  assert_string_equal(g.body, "hello");
  assert_string_equal(g.error, "");
  assert_string_equal(g.clen, "5");
  assert_int_equal(om_curl_uv_active(fx->cu), 0);
  got_clear(&g);
  /* a status is an answer, not an error */
  assert_int_equal(start(fx, "GET", "/status/503", NULL, 0, &g, NULL), 0);
  assert_true(run_until(fx, &g.calls, 5000));
  assert_int_equal(g.result, CURLE_OK);
  assert_int_equal(g.status, 503);
  got_clear(&g);
  fx_free(fx);
}

static void methods_headers_body(void **state) {
  fx_t *fx = fx_new();
  got_t g = {0};
  char u[128];
  const char *hdrs[] = {"X-Test: yes", "Content-Type: application/json"};
  om_curl_req_t req = {0};
  (void)state;
  url(fx, u, sizeof u, "/echo");
  req.method = "PUT";
  req.url = u;
  req.headers = hdrs;
  req.n_headers = 2;
  req.body = "{\"a\":1}";
  req.body_len = 7;
  assert_int_equal(om_curl_uv_request(fx->cu, &req, on_resp, &g, NULL), 0);
  assert_true(run_until(fx, &g.calls, 5000));
  assert_string_equal(g.body, "PUT|{\"a\":1}|application/json|yes");
  got_clear(&g);
  /* no Content-Type unless asked: libcurl's form default is removed */
  assert_int_equal(start(fx, "POST", "/echo", "k=v", 0, &g, NULL), 0);
  assert_true(run_until(fx, &g.calls, 5000));
  assert_string_equal(g.body, "POST|k=v|-|-");
  got_clear(&g);
  assert_int_equal(start(fx, "POST", "/echo", NULL, 0, &g, NULL), 0);
  assert_true(run_until(fx, &g.calls, 5000));
  assert_string_equal(g.body, "POST||-|-");
  got_clear(&g);
  assert_int_equal(start(fx, "DELETE", "/echo", NULL, 0, &g, NULL), 0);
  assert_true(run_until(fx, &g.calls, 5000));
  assert_string_equal(g.body, "DELETE||-|-");
  got_clear(&g);
  assert_int_equal(start(fx, "GET", "/echo", "q", 0, &g, NULL), 0);
  assert_true(run_until(fx, &g.calls, 5000));
  assert_string_equal(g.body, "GET|q|-|-");
  got_clear(&g);
  assert_int_equal(start(fx, "HEAD", "/hello", NULL, 0, &g, NULL), 0);
  assert_true(run_until(fx, &g.calls, 5000));
  assert_int_equal(g.result, CURLE_OK);
  assert_int_equal(g.status, 200);
  assert_null(g.body);
  assert_string_equal(g.clen, "5");
  got_clear(&g);
  fx_free(fx);
}

#define MANY 300

static void many_concurrent(void **state) {
  fx_t *fx = fx_new();
  static got_t g[MANY];
  char body[16], want[64];
  int done = 0;
  uint64_t t0 = now_ms();
  (void)state;
  memset(g, 0, sizeof g);
  for (int i = 0; i < MANY; i++) {
    snprintf(body, sizeof body, "%d", i);
    assert_int_equal(start(fx, "POST", "/echo", body, 10000, &g[i], NULL), 0);
  }
  assert_int_equal(om_curl_uv_active(fx->cu), MANY);
  while (!done && now_ms() - t0 < 20000) {
    uv_run(&fx->loop, UV_RUN_ONCE);
    done = 1;
    for (int i = 0; i < MANY; i++)
      done &= g[i].calls == 1;
  }
  for (int i = 0; i < MANY; i++) {
    assert_int_equal(g[i].calls, 1);
    assert_int_equal(g[i].result, CURLE_OK);
    snprintf(want, sizeof want, "POST|%d|-|-", i);
    assert_string_equal(g[i].body, want);
    got_clear(&g[i]);
  }
  assert_int_equal(om_curl_uv_active(fx->cu), 0);
  assert_int_equal(fx->requests, MANY);
  OM_TEST_NOTE("%d concurrent requests in %llu ms", MANY,
               (unsigned long long)(now_ms() - t0));
  fx_free(fx);
}

/* ---- raw transfers: the caller's own easy handle ---- */

typedef struct raw_s {
  fx_t *fx;
  char buf[256];
  size_t len;
  int writes;
  int calls;
  CURLcode result;
  CURL *easy;
  /* misuse from inside a libcurl callback */
  int probe;
  int rc_add, rc_cancel, rc_close, rc_request;
  int readd;    /* re-add the handle from its own callback this often */
  int readd_rc; /* what the last re-add returned */
  char *private_in_cb;
} raw_t;

static void raw_done(void *ud, CURL *easy, CURLcode result);

static size_t raw_write(char *p, size_t size, size_t n, void *ud) {
  raw_t *r = ud;
  size_t len = size * n;
  if (r->probe) {
    static got_t dummy;
    char u[128];
    om_curl_req_t req = {0};
    url(r->fx, u, sizeof u, "/hello");
    req.url = u;
    r->probe = 0;
    r->rc_add = om_curl_uv_add(r->fx->cu, r->easy, raw_done, r);
    r->rc_cancel = om_curl_uv_cancel(r->fx->cu, r->easy);
    r->rc_close = om_curl_uv_close(r->fx->cu, NULL, NULL);
    r->rc_request = om_curl_uv_request(r->fx->cu, &req, on_resp, &dummy, NULL);
  }
  if (len > sizeof r->buf - 1 - r->len)
    return 0;
  memcpy(r->buf + r->len, p, len);
  r->len += len;
  r->buf[r->len] = '\0';
  r->writes++;
  if (strstr(r->buf, "first\n") != NULL)
    r->fx->stream_got_first = 1;
  return len;
}

static void raw_done(void *ud, CURL *easy, CURLcode result) {
  raw_t *r = ud;
  assert_ptr_equal(easy, r->easy);
  curl_easy_getinfo(easy, CURLINFO_PRIVATE, &r->private_in_cb);
  r->calls++;
  r->result = result;
  if (r->readd > 0) {
    r->readd--;
    r->len = 0;
    r->buf[0] = '\0';
    r->fx->stream_got_first = 0;
    r->readd_rc = om_curl_uv_add(r->fx->cu, easy, raw_done, r);
  }
}

static CURL *raw_easy(fx_t *fx, raw_t *r, const char *path) {
  char u[128];
  CURL *e = curl_easy_init();
  assert_non_null(e);
  url(fx, u, sizeof u, path);
  curl_easy_setopt(e, CURLOPT_URL, u);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, raw_write);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
  r->fx = fx;
  r->easy = e;
  return e;
}

static void streaming_incremental(void **state) {
  fx_t *fx = fx_new();
  raw_t r = {0};
  CURL *e = raw_easy(fx, &r, "/stream");
  (void)state;
  curl_easy_setopt(e, CURLOPT_PRIVATE, (char *)"mine");
  r.readd = 1; /* the callback starts the same handle again */
  assert_int_equal(om_curl_uv_add(fx->cu, e, raw_done, &r), 0);
  /* the server sends "second" only after we have read "first": if the
   * glue did not deliver data as it arrives, this would time out */
  assert_true(run_until(fx, &r.calls, 5000));
  assert_int_equal(r.readd_rc, 0);
  assert_string_equal(r.private_in_cb, "mine"); /* handed back before cb */
  while (r.calls < 2 && om_curl_uv_active(fx->cu) > 0)
    uv_run(&fx->loop, UV_RUN_ONCE);
  assert_int_equal(r.calls, 2);
  assert_int_equal(r.result, CURLE_OK);
  assert_string_equal(r.buf, "first\nsecond\n");
  OM_ASSERT_CMP(r.writes, >=, 4);
  /* the caller owns the handle again: reuse it */
  memset(r.buf, 0, sizeof r.buf);
  r.len = 0;
  r.calls = 0;
  fx->stream_got_first = 0;
  assert_int_equal(om_curl_uv_add(fx->cu, e, raw_done, &r), 0);
  assert_true(run_until(fx, &r.calls, 5000));
  assert_string_equal(r.buf, "first\nsecond\n");
  curl_easy_cleanup(e);
  fx_free(fx);
}

static void cancel_mid_transfer(void **state) {
  fx_t *fx = fx_new();
  got_t g = {0};
  raw_t r = {0};
  om_curl_request_t *h = NULL;
  CURL *e = raw_easy(fx, &r, "/stream");
  uint64_t t0;
  (void)state;
  /* a request the server holds */
  assert_int_equal(start(fx, "GET", "/hang", NULL, 0, &g, &h), 0);
  assert_non_null(h);
  while (fx->n_held < 1 && !g.calls)
    uv_run(&fx->loop, UV_RUN_ONCE);
  assert_int_equal(om_curl_request_cancel(h), 0);
  assert_int_equal(om_curl_uv_active(fx->cu), 0);
  /* the server sees the client go: the connection was closed */
  t0 = now_ms();
  while (fx->held[0].alive && now_ms() - t0 < 5000)
    uv_run(&fx->loop, UV_RUN_ONCE);
  assert_int_equal(fx->held[0].alive, 0);
  assert_int_equal(g.calls, 0);
  /* a raw stream cut after its first chunk */
  fx->stream_got_first = 0;
  curl_easy_setopt(e, CURLOPT_PRIVATE, (char *)"mine");
  assert_int_equal(om_curl_uv_add(fx->cu, e, raw_done, &r), 0);
  assert_int_equal(om_curl_uv_add(fx->cu, e, raw_done, &r), OM_ESTATE);
  /* stop before the server can send "second" (it waits for the tick) */
  while (!fx->stream_got_first)
    uv_run(&fx->loop, UV_RUN_ONCE);
  assert_int_equal(om_curl_uv_cancel(fx->cu, e), 0);
  assert_int_equal(om_curl_uv_cancel(fx->cu, e), OM_ENOTFOUND);
  {
    char *p = NULL;
    curl_easy_getinfo(e, CURLINFO_PRIVATE, &p);
    assert_string_equal(p, "mine"); /* the caller's value is back */
  }
  run_for(fx, 50);
  assert_int_equal(r.calls, 0);
  assert_string_equal(r.buf, "first\n");
  curl_easy_cleanup(e);
  fx_free(fx);
}

static void timeout_and_refused(void **state) {
  fx_t *fx = fx_new();
  got_t g = {0};
  uint64_t t0 = now_ms();
  struct sockaddr_in a;
  socklen_t al = sizeof a;
  int s, port;
  char u[64];
  om_curl_req_t req = {0};
  (void)state;
  assert_int_equal(start(fx, "GET", "/hang", NULL, 200, &g, NULL), 0);
  assert_true(run_until(fx, &g.calls, 5000));
  assert_int_equal(g.result, CURLE_OPERATION_TIMEDOUT);
  assert_int_equal(g.status, 0);
  OM_ASSERT_CMP(strlen(g.error), >, 0);
  OM_ASSERT_CMP(g.at_ms - t0, >=, 150);
  got_clear(&g);
  /* a port nobody listens on: bound, then closed */
  s = socket(AF_INET, SOCK_STREAM, 0);
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(getsockname(s, (struct sockaddr *)&a, &al), 0);
  port = ntohs(a.sin_port);
  close(s);
  snprintf(u, sizeof u, "http://127.0.0.1:%d/", port);
  req.url = u;
  assert_int_equal(om_curl_uv_request(fx->cu, &req, on_resp, &g, NULL), 0);
  assert_true(run_until(fx, &g.calls, 5000));
  assert_int_equal(g.result, CURLE_COULDNT_CONNECT);
  assert_int_equal(g.status, 0);
  assert_null(g.body);
  assert_non_null(strstr(g.error, "onnect"));
  got_clear(&g);
  /* not http(s): refused by libcurl, reported through the callback */
  req.url = "file:///etc/passwd";
  assert_int_equal(om_curl_uv_request(fx->cu, &req, on_resp, &g, NULL), 0);
  assert_true(run_until(fx, &g.calls, 5000));
  assert_int_equal(g.result, CURLE_UNSUPPORTED_PROTOCOL);
  assert_null(g.body);
  got_clear(&g);
  fx_free(fx);
}

static void body_cap(void **state) {
  fx_t *fx = fx_new();
  got_t g = {0};
  char u[128];
  om_curl_req_t req = {0};
  (void)state;
  req.url = u;
  req.max_body = 1000;
  url(fx, u, sizeof u, "/big"); /* Content-Length known: refused early */
  assert_int_equal(om_curl_uv_request(fx->cu, &req, on_resp, &g, NULL), 0);
  assert_true(run_until(fx, &g.calls, 5000));
  assert_int_equal(g.result, CURLE_FILESIZE_EXCEEDED);
  assert_null(g.body);
  assert_string_equal(g.error, "response body exceeds 1000 bytes");
  got_clear(&g);
  url(fx, u, sizeof u, "/bigchunked"); /* no length: cut while reading */
  assert_int_equal(om_curl_uv_request(fx->cu, &req, on_resp, &g, NULL), 0);
  assert_true(run_until(fx, &g.calls, 5000));
  assert_int_equal(g.result, CURLE_FILESIZE_EXCEEDED);
  assert_int_equal(g.status, 200);
  assert_null(g.body);
  got_clear(&g);
  req.max_body = 5; /* exactly the body: fine */
  url(fx, u, sizeof u, "/hello");
  assert_int_equal(om_curl_uv_request(fx->cu, &req, on_resp, &g, NULL), 0);
  assert_true(run_until(fx, &g.calls, 5000));
  assert_int_equal(g.result, CURLE_OK);
  assert_string_equal(g.body, "hello");
  got_clear(&g);
  req.max_body = 0; /* default 1 MiB: 2 MiB is too much */
  url(fx, u, sizeof u, "/bigchunked");
  assert_int_equal(om_curl_uv_request(fx->cu, &req, on_resp, &g, NULL), 0);
  assert_true(run_until(fx, &g.calls, 5000));
  assert_int_equal(g.result, CURLE_FILESIZE_EXCEEDED);
  got_clear(&g);
  fx_free(fx);
}

static void close_with_transfers_in_flight(void **state) {
  fx_t *fx = fx_new();
  static got_t g[40];
  raw_t r = {0};
  CURL *e = raw_easy(fx, &r, "/hang");
  (void)state;
  memset(g, 0, sizeof g);
  for (int i = 0; i < 20; i++) {
    assert_int_equal(start(fx, "GET", "/hang", NULL, 0, &g[i], NULL), 0);
    assert_int_equal(start(fx, "PUT", "/slow", "x", 0, &g[20 + i], NULL), 0);
  }
  assert_int_equal(om_curl_uv_add(fx->cu, e, raw_done, &r), 0);
  while (fx->n_held < 41)
    uv_run(&fx->loop, UV_RUN_ONCE);
  assert_int_equal(om_curl_uv_close(fx->cu, on_cu_closed, fx), 0);
  assert_int_equal(fx->cu_closed, 0); /* never synchronously */
  assert_int_equal(om_curl_uv_close(fx->cu, on_cu_closed, fx), OM_ESTATE);
  assert_int_equal(om_curl_uv_add(fx->cu, e, raw_done, &r), OM_ESTATE);
  assert_int_equal(start(fx, "GET", "/hello", NULL, 0, &g[0], NULL), OM_ESTATE);
  assert_int_equal(om_curl_uv_cancel(fx->cu, e), OM_ENOTFOUND);
  assert_true(run_until(fx, &fx->cu_closed, 5000));
  assert_int_equal(fx->cu_closed, 1);
  run_for(fx, 300); /* past /slow's due time */
  for (int i = 0; i < 40; i++)
    assert_int_equal(g[i].calls, 0);
  assert_int_equal(r.calls, 0);
  curl_easy_cleanup(e); /* still the caller's */
  fx->cu = NULL;
  fx_free(fx);
}

/* ---- re-entrancy ---- */

typedef struct chain_s {
  fx_t *fx;
  int done, target, failed;
  om_curl_request_t *h[64];
  int state[64]; /* 0 pending, 1 completed, 2 cancelled */
  int n;
  int close_at; /* close the glue from the callback of this completion */
} chain_t;

static void on_chain(void *ud, om_curl_resp_t *resp) {
  chain_t *c = ud;
  char u[128];
  om_curl_req_t req = {0};
  if (resp->result != CURLE_OK || resp->status != 200)
    c->failed++;
  if (++c->done < c->target) {
    url(c->fx, u, sizeof u, "/hello");
    req.url = u;
    if (om_curl_uv_request(c->fx->cu, &req, on_chain, c, NULL) != 0)
      c->failed++;
  }
}

typedef struct slot_ud_s {
  chain_t *c;
  int i;
} slot_ud_t;

static void on_cancel_next(void *ud, om_curl_resp_t *resp) {
  slot_ud_t *s = ud;
  chain_t *c = s->c;
  (void)resp;
  if (c->state[s->i] != 0)
    c->failed++; /* reported twice, or after a cancel */
  c->state[s->i] = 1;
  c->h[s->i] = NULL;
  c->done++;
  if (c->close_at && c->done == c->close_at) {
    if (om_curl_uv_close(c->fx->cu, on_cu_closed, c->fx) != 0)
      c->failed++;
    return;
  }
  /* cancel the next one still pending, which may have finished in this
   * very batch: its completion must then never be reported */
  for (int j = s->i + 1; j < c->n; j++)
    if (c->state[j] == 0) {
      if (om_curl_request_cancel(c->h[j]) != 0)
        c->failed++;
      c->state[j] = 2;
      c->h[j] = NULL;
      break;
    }
}

static void reentrant_add(void **state) {
  fx_t *fx = fx_new();
  chain_t c = {.fx = fx, .target = 25};
  char u[128];
  om_curl_req_t req = {0};
  (void)state;
  url(fx, u, sizeof u, "/hello");
  req.url = u;
  assert_int_equal(om_curl_uv_request(fx->cu, &req, on_chain, &c, NULL), 0);
  {
    uint64_t t0 = now_ms();
    while (c.done < c.target && now_ms() - t0 < 5000)
      uv_run(&fx->loop, UV_RUN_ONCE);
  }
  assert_int_equal(c.done, 25);
  assert_int_equal(c.failed, 0);
  assert_int_equal(fx->requests, 25);
  fx_free(fx);
}

static void reentrant_cancel(void **state) {
  fx_t *fx = fx_new();
  static chain_t c;
  static slot_ud_t s[64];
  char u[128];
  om_curl_req_t req = {0};
  uint64_t t0 = now_ms();
  int completed = 0, cancelled = 0;
  (void)state;
  memset(&c, 0, sizeof c);
  c.fx = fx;
  c.n = 60;
  url(fx, u, sizeof u, "/hello");
  req.url = u;
  for (int i = 0; i < c.n; i++) {
    s[i].c = &c;
    s[i].i = i;
    assert_int_equal(
        om_curl_uv_request(fx->cu, &req, on_cancel_next, &s[i], &c.h[i]), 0);
  }
  while (om_curl_uv_active(fx->cu) > 0 && now_ms() - t0 < 5000)
    uv_run(&fx->loop, UV_RUN_ONCE);
  for (int i = 0; i < c.n; i++) {
    completed += c.state[i] == 1;
    cancelled += c.state[i] == 2;
  }
  assert_int_equal(c.failed, 0);
  assert_int_equal(completed + cancelled, c.n);
  OM_ASSERT_CMP(completed, >=, c.n / 2); /* each completion cancels at most 1 */
  assert_int_equal(completed, c.done);
  fx_free(fx);
}

static void close_from_callback(void **state) {
  fx_t *fx = fx_new();
  static chain_t c;
  static slot_ud_t s[64];
  char u[128];
  om_curl_req_t req = {0};
  (void)state;
  memset(&c, 0, sizeof c);
  c.fx = fx;
  c.n = 10;
  c.close_at = 1;
  url(fx, u, sizeof u, "/hello");
  req.url = u;
  for (int i = 0; i < c.n; i++) {
    s[i].c = &c;
    s[i].i = i;
    if (i > 0) { /* the others stay in flight */
      url(fx, u, sizeof u, "/slow");
    }
    assert_int_equal(
        om_curl_uv_request(fx->cu, &req, on_cancel_next, &s[i], &c.h[i]), 0);
  }
  assert_true(run_until(fx, &fx->cu_closed, 5000));
  run_for(fx, 300);
  assert_int_equal(c.done, 1);
  assert_int_equal(c.failed, 0);
  assert_int_equal(fx->cu_closed, 1);
  fx->cu = NULL;
  fx_free(fx);
}

static void misuse_from_libcurl_callback(void **state) {
  fx_t *fx = fx_new();
  raw_t r = {0};
  CURL *e = raw_easy(fx, &r, "/hello");
  (void)state;
  r.probe = 1;
  assert_int_equal(om_curl_uv_add(fx->cu, e, raw_done, &r), 0);
  assert_true(run_until(fx, &r.calls, 5000));
  assert_int_equal(r.rc_add, OM_ESTATE);
  assert_int_equal(r.rc_cancel, OM_ESTATE);
  assert_int_equal(r.rc_close, OM_ESTATE);
  assert_int_equal(r.rc_request, OM_ESTATE);
  assert_int_equal(r.result, CURLE_OK);
  assert_string_equal(r.buf, "hello");
  curl_easy_cleanup(e);
  fx_free(fx);
}

static void argument_errors(void **state) {
  fx_t *fx = fx_new();
  got_t g = {0};
  om_curl_req_t req = {0};
  const char *crlf[] = {"X-A: b\r\nX-Evil: 1"};
  const char *nul[] = {NULL};
  CURL *e = curl_easy_init();
  om_curl_uv_t *cu2;
  (void)state;
  assert_int_equal(om_curl_uv_new(NULL, &cu2), OM_EINVAL);
  assert_int_equal(om_curl_uv_new(&fx->loop, NULL), OM_EINVAL);
  assert_int_equal(om_curl_uv_add(NULL, e, raw_done, NULL), OM_EINVAL);
  assert_int_equal(om_curl_uv_add(fx->cu, NULL, raw_done, NULL), OM_EINVAL);
  assert_int_equal(om_curl_uv_add(fx->cu, e, NULL, NULL), OM_EINVAL);
  assert_int_equal(om_curl_uv_cancel(fx->cu, e), OM_ENOTFOUND);
  assert_int_equal(om_curl_uv_cancel(NULL, e), OM_EINVAL);
  assert_int_equal(om_curl_uv_close(NULL, NULL, NULL), OM_EINVAL);
  assert_int_equal(om_curl_uv_active(NULL), 0);
  assert_int_equal(om_curl_uv_request(fx->cu, &req, on_resp, &g, NULL),
                   OM_EINVAL); /* no url */
  req.url = "http://127.0.0.1:1/";
  assert_int_equal(om_curl_uv_request(NULL, &req, on_resp, &g, NULL),
                   OM_EINVAL);
  assert_int_equal(om_curl_uv_request(fx->cu, &req, NULL, &g, NULL), OM_EINVAL);
  req.method = "GE T";
  assert_int_equal(om_curl_uv_request(fx->cu, &req, on_resp, &g, NULL),
                   OM_EINVAL);
  req.method = "";
  assert_int_equal(om_curl_uv_request(fx->cu, &req, on_resp, &g, NULL),
                   OM_EINVAL);
  req.method = "GET";
  req.headers = crlf;
  req.n_headers = 1;
  assert_int_equal(om_curl_uv_request(fx->cu, &req, on_resp, &g, NULL),
                   OM_EINVAL);
  req.headers = nul;
  assert_int_equal(om_curl_uv_request(fx->cu, &req, on_resp, &g, NULL),
                   OM_EINVAL);
  req.headers = NULL;
  assert_int_equal(om_curl_uv_request(fx->cu, &req, on_resp, &g, NULL),
                   OM_EINVAL);
  req.n_headers = 0;
  req.body_len = 3;
  assert_int_equal(om_curl_uv_request(fx->cu, &req, on_resp, &g, NULL),
                   OM_EINVAL);
  assert_int_equal(om_curl_uv_active(fx->cu), 0);
  assert_int_equal(om_curl_request_cancel(NULL), 0);
  assert_int_equal(g.calls, 0);
  curl_easy_cleanup(e);
  fx_free(fx);
}

/* ---- allocation failures ---- */

/* A server in a child process (so its allocations are not failed): answers
 * every connection with a fixed response and closes it. */
static pid_t fork_server(int *port) {
  struct sockaddr_in a;
  socklen_t al = sizeof a;
  int s = socket(AF_INET, SOCK_STREAM, 0);
  pid_t pid, parent = getpid();
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(s, 64), 0);
  assert_int_equal(getsockname(s, (struct sockaddr *)&a, &al), 0);
  *port = ntohs(a.sin_port);
  pid = fork();
  OM_ASSERT_CMP(pid, >=, 0);
  if (pid == 0) {
    /* die with the test, even when an assertion cut it short, and hold no
     * pipe of whoever reads the test's output */
    static const char resp[] = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n"
                               "Connection: close\r\n\r\nhello";
    int devnull = open("/dev/null", O_RDWR);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(0);
    dup2(devnull, 1);
    dup2(devnull, 2);
    for (;;) {
      char buf[4096];
      size_t got = 0;
      int c = accept(s, NULL, NULL);
      if (c < 0)
        _exit(1);
      while (got < sizeof buf - 1) {
        ssize_t n = read(c, buf + got, sizeof buf - 1 - got);
        if (n <= 0)
          break;
        got += (size_t)n;
        buf[got] = '\0';
        if (strstr(buf, "\r\n\r\n") != NULL)
          break;
      }
      if (write(c, resp, sizeof resp - 1) < 0) {
        /* the client gave up: fine */
      }
      close(c);
    }
  }
  close(s);
  return pid;
}

static void alloc_failures(void **state) {
  uv_loop_t loop;
  int port, oom_results = 0, oom_returns = 0;
  char u[64];
  pid_t pid = fork_server(&port);
  (void)state;
  assert_int_equal(uv_loop_init(&loop), 0);
  /* om_curl_uv_new */
  for (long n = 0;; n++) {
    om_curl_uv_t *cu = NULL;
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_curl_uv_new(&loop, &cu);
    om_test_alloc_reset();
    if (rc == 0) {
      assert_int_equal(om_curl_uv_close(cu, NULL, NULL), 0);
      uv_run(&loop, UV_RUN_DEFAULT);
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    assert_null(cu);
  }
  /* a whole exchange: every allocation of ours on its path fails in turn */
  snprintf(u, sizeof u, "http://127.0.0.1:%d/x", port);
  for (long n = 0; n < 100; n++) {
    om_curl_uv_t *cu;
    got_t g = {0};
    om_curl_req_t req = {.url = u, .timeout_ms = 5000};
    long failures;
    int rc;
    uint64_t t0 = now_ms();
    assert_int_equal(om_curl_uv_new(&loop, &cu), 0);
    om_test_fail_alloc_after(n);
    rc = om_curl_uv_request(cu, &req, on_resp, &g, NULL);
    while (rc == 0 && !g.calls && now_ms() - t0 < 5000)
      uv_run(&loop, UV_RUN_ONCE);
    om_test_alloc_reset();
    failures = om_test_alloc_failures();
    assert_int_equal(om_curl_uv_close(cu, NULL, NULL), 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    if (rc != 0) {
      assert_int_equal(rc, OM_ENOMEM);
      assert_int_equal(g.calls, 0);
      oom_returns++;
      continue;
    }
    assert_int_equal(g.calls, 1);
    if (g.result == CURLE_OUT_OF_MEMORY) {
      assert_null(g.body);
      oom_results++;
      got_clear(&g);
      continue;
    }
    assert_int_equal(g.result, CURLE_OK);
    assert_string_equal(g.body, "hello");
    got_clear(&g);
    if (failures == 0)
      break;
  }
  OM_TEST_NOTE("ENOMEM returns %d, CURLE_OUT_OF_MEMORY results %d", oom_returns,
               oom_results);
  OM_ASSERT_CMP(oom_returns, >=, 2); /* the request, the slot array */
  OM_ASSERT_CMP(oom_results, >=, 2); /* the socket watcher, the body buffer */
  assert_int_equal(uv_loop_close(&loop), 0);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* The TLS options: a certificate goes with its key, NULL is the defaults,
 * a request refuses a half pair before anything starts, and the message
 * of a failed verification says what failed. */
static void tls_options(void **state) {
  fx_t *fx = fx_new();
  got_t g = {0};
  om_curl_req_t req = {0};
  om_curl_tls_t half = {.cert_file = "c.pem"}, key_only = {.key_file = "k"};
  om_curl_tls_t full = {
      .ca_file = "ca.pem", .cert_file = "c.pem", .key_file = "k.pem"};
  char out[CURL_ERROR_SIZE + 64];
  CURL *e = curl_easy_init();
  (void)state;
  assert_non_null(e);
  OM_ASSERT_CMP(om_curl_easy_tls(NULL, &full), ==, OM_EINVAL);
  OM_ASSERT_CMP(om_curl_easy_tls(e, NULL), ==, 0);
  OM_ASSERT_CMP(om_curl_easy_tls(e, &full), ==, 0);
  OM_ASSERT_CMP(om_curl_easy_tls(e, &half), ==, OM_EINVAL);
  OM_ASSERT_CMP(om_curl_easy_tls(e, &key_only), ==, OM_EINVAL);
  curl_easy_cleanup(e);
  req.url = "https://127.0.0.1:1/";
  req.tls = &half;
  OM_ASSERT_CMP(om_curl_uv_request(fx->cu, &req, on_resp, &g, NULL), ==,
                OM_EINVAL);
  OM_ASSERT_CMP(om_curl_uv_active(fx->cu), ==, 0);
  assert_string_equal(
      om_curl_error_text(CURLE_PEER_FAILED_VERIFICATION,
                         "SSL certificate problem: x", out, sizeof out),
      "TLS verification of the server failed: SSL certificate problem: x");
  assert_string_equal(
      om_curl_error_text(CURLE_COULDNT_CONNECT, "", out, sizeof out),
      curl_easy_strerror(CURLE_COULDNT_CONNECT));
  fx_free(fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(simple_get),
      cmocka_unit_test(methods_headers_body),
      cmocka_unit_test(many_concurrent),
      cmocka_unit_test(streaming_incremental),
      cmocka_unit_test(cancel_mid_transfer),
      cmocka_unit_test(timeout_and_refused),
      cmocka_unit_test(body_cap),
      cmocka_unit_test(close_with_transfers_in_flight),
      cmocka_unit_test(reentrant_add),
      cmocka_unit_test(reentrant_cancel),
      cmocka_unit_test(close_from_callback),
      cmocka_unit_test(misuse_from_libcurl_callback),
      cmocka_unit_test(argument_errors),
      cmocka_unit_test(alloc_failures),
      cmocka_unit_test(tls_options),
  };
  signal(SIGPIPE, SIG_IGN); /* libuv and libcurl write to closed peers */
  return cmocka_run_group_tests(tests, NULL, NULL);
}
