/*
 * test_http_server_stream.c: the HTTP server's streamed request bodies
 * (om_http_server_opts_t.stream_bodies) over real loopback sockets: the
 * handler runs at the head, the body arrives through callbacks with
 * backpressure, 100 Continue only when the body is asked for, early
 * answers readable by a client that keeps sending, the body idle timeout,
 * framing errors inside a streamed body, the same answers however the
 * client's bytes are split into reads, and spans held by reference past
 * on_data staying intact while the server reads on.
 */
#include "om_test.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "http_test_client.h"
#include "om_errno.h"
#include "om_http_server.h"

typedef struct fx_s {
  uv_loop_t loop;
  uv_timer_t timer;
  om_http_server_t *srv;
  int port;
  int closed;
  int seen;
  om_http_request_t *req; /* the request whose body is being read */
  int64_t content_length;
  int body_streamed;
  size_t got;      /* body bytes delivered */
  uint64_t hash;   /* FNV-1a of them */
  size_t spans;    /* on_data calls */
  int ended;       /* on_end calls */
  int close_calls; /* on_close calls */
  int body_error;  /* body_error seen in on_close */
  int paused;      /* the handler paused on the first span */
  int start_rc;    /* om_http_request_body_start's answer */
  int lend_rc;     /* /lend: om_http_request_body_lend's answer */
  int lend_fd;
  uint64_t lend_left;
  om_http_request_t *resp_req; /* /lend-resp, /lend-chunked: streaming */
  char echo[65536];            /* the body, for small ones */
} fx_t;

static htc_resp_t R[8];

/* /hold: every span is kept by reference (om_http_request_body_ref), as
 * the proxy keeps them for the upstream write and the replay, and checked
 * against the bytes delivered after the server read on past them. */
#define HOLD_MAX 4096
typedef struct {
  om_http_body_ref_t *ref;
  const char *p;
  size_t n;
} held_t;
static held_t H[HOLD_MAX];
static size_t n_held;
static int hold_null;    /* om_http_request_body_ref gave NULL inside on_data */
static int hold_outside; /* ... and something outside it */

static uint64_t fnv(uint64_t h, const char *p, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) {
    h ^= (unsigned char)p[i];
    h *= 1099511628211ull;
  }
  return h;
}

static void held_release(void) {
  size_t i;
  for (i = 0; i < n_held; i++)
    om_http_body_ref_release(H[i].ref);
  n_held = 0;
}

static uint64_t held_hash(void) {
  uint64_t h = 14695981039346656037ull;
  size_t i;
  for (i = 0; i < n_held; i++)
    h = fnv(h, H[i].p, H[i].n);
  return h;
}

static void on_data(om_http_request_t *req, const char *p, size_t n) {
  fx_t *fx = req->user;
  if (strcmp(req->path, "/hold") == 0) {
    om_http_body_ref_t *ref = om_http_request_body_ref(req);
    if (ref == NULL || n_held == HOLD_MAX) {
      hold_null++;
      om_http_body_ref_release(ref);
    } else {
      H[n_held++] = (held_t){ref, p, n};
    }
  }
  if (fx->got + n <= sizeof fx->echo)
    memcpy(fx->echo + fx->got, p, n);
  fx->got += n;
  fx->hash = fnv(fx->hash, p, n);
  fx->spans++;
  if (strcmp(req->path, "/pause") == 0 && fx->spans == 1) {
    om_http_request_body_pause(req);
    fx->paused = 1;
  } else if (strcmp(req->path, "/respond-mid") == 0 && fx->got >= 4) {
    /* an answer from inside the callback, before the body ended */
    fx->req = NULL;
    om_http_respond(req, 200, NULL, 0, "mid", 3);
  } else if (strcmp(req->path, "/relay") == 0) {
    om_http_response_write(req, p, n);
  } else if (strcmp(req->path, "/lend") == 0 && fx->spans == 1) {
    fx->lend_rc = om_http_request_body_lend(req, &fx->lend_fd, &fx->lend_left);
  }
}

static void on_end(om_http_request_t *req) {
  fx_t *fx = req->user;
  char line[64];
  int k;
  fx->ended++;
  fx->req = NULL;
  if (strcmp(req->path, "/relay") == 0) {
    om_http_response_end(req);
    return;
  }
  if (fx->got <= 1024) {
    om_http_respond(req, 200, NULL, 0, fx->echo, fx->got);
    return;
  }
  k = snprintf(line, sizeof line, "%zu %016" PRIx64, fx->got, fx->hash);
  om_http_respond(req, 200, NULL, 0, line, (size_t)k);
}

static void on_req_close(om_http_request_t *req) {
  fx_t *fx = req->user;
  fx->close_calls++;
  fx->body_error = req->body_error;
  fx->req = NULL;
}

static void handler(om_http_request_t *req, void *ud) {
  fx_t *fx = ud;
  const char *p = req->path;
  fx->seen++;
  req->user = fx;
  fx->content_length = req->content_length;
  fx->body_streamed = req->body_streamed;
  if (strcmp(p, "/lend-resp") == 0) { /* 10 bytes, 5 of them written */
    om_http_header_t h[] = {{"Content-Length", "10", 0, 0}};
    fx->resp_req = req;
    om_http_response_start(req, 200, h, 1);
    om_http_response_write(req, "hello", 5);
    return;
  }
  if (strcmp(p, "/lend-chunked") == 0) {
    fx->resp_req = req;
    om_http_response_start(req, 200, NULL, 0);
    return;
  }
  if (!req->body_streamed && req->body_len > 0) { /* whole_body_max */
    char out[128];
    int k =
        snprintf(out, sizeof out, "whole:%.*s", (int)req->body_len, req->body);
    om_http_respond(req, 200, NULL, 0, out, (size_t)k);
    return;
  }
  if (!req->body_streamed) {
    om_http_respond(req, 200, NULL, 0, "nobody", 6);
    return;
  }
  fx->got = 0;
  fx->spans = 0;
  fx->hash = 14695981039346656037ull;
  fx->req = req;
  om_http_request_on_close(req, on_req_close);
  if (strcmp(p, "/early") == 0) { /* answer without reading the body */
    om_http_header_t h[] = {{"Content-Type", "application/json", 0, 0}};
    fx->req = NULL;
    om_http_respond(req, 413, h, 1, "{\"error\":\"body_too_large\"}", 26);
    return;
  }
  if (strcmp(p, "/idle") == 0 || strcmp(p, "/idle-started") == 0)
    om_http_request_body_idle_timeout(req, 150);
  if (strcmp(p, "/relay") == 0 || strcmp(p, "/idle-started") == 0)
    om_http_response_start(req, 200, NULL, 0);
  if (strcmp(p, "/wait") == 0)
    return; /* the test starts the body later */
  if (om_http_request_body_ref(req) != NULL) /* only inside on_data */
    hold_outside++;
  fx->start_rc = om_http_request_body_start(req, on_data, on_end);
}

static void on_closed(om_http_server_t *srv, void *ud) {
  fx_t *fx = ud;
  (void)srv;
  fx->closed = 1;
}

static size_t whole_max; /* whole_body_max of the next fx_new only */

static fx_t *fx_new(size_t max_body) {
  om_http_server_opts_t o;
  fx_t *fx = calloc(1, sizeof *fx);
  assert_non_null(fx);
  memset(&o, 0, sizeof o);
  o.stream_bodies = 1;
  o.max_body_bytes = max_body;
  o.max_header_bytes = 4096;
  o.whole_body_max = whole_max;
  whole_max = 0; /* for this fixture only */
  assert_int_equal(uv_loop_init(&fx->loop), 0);
  uv_timer_init(&fx->loop, &fx->timer);
  fx->timer.data = fx;
  assert_int_equal(om_http_server_new(&fx->loop, &o, handler, fx, &fx->srv), 0);
  assert_int_equal(om_http_server_listen(fx->srv, "127.0.0.1", 0), 0);
  fx->port = om_http_server_port(fx->srv);
  OM_ASSERT_CMP(fx->port, >, 0);
  return fx;
}

static void fx_free(fx_t *fx) {
  uint64_t t0 = htc_now_ms();
  assert_int_equal(om_http_server_close(fx->srv, on_closed), 0);
  while (!fx->closed && htc_now_ms() - t0 < 10000)
    htc_step(&fx->loop, NULL, 1);
  assert_true(fx->closed);
  uv_close((uv_handle_t *)&fx->timer, NULL);
  uv_run(&fx->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&fx->loop), 0);
  free(fx);
}

static const om_http_server_metrics_t *M(fx_t *fx) {
  return om_http_server_metrics(fx->srv);
}

static int wait_responses(fx_t *fx, htc_t *c, int n, int ms) {
  uint64_t t0 = htc_now_ms();
  for (;;) {
    int k = htc_responses(c, NULL, R, 8);
    if (k < 0 || k >= n || c->eof || htc_now_ms() - t0 > (uint64_t)ms) {
      if (c->eof)
        k = htc_responses(c, NULL, R, 8);
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

/* ------------------------------------------------------------------ */

/* The handler runs at the head; the body arrives through the callbacks;
 * the connection stays usable for the next request. */
static void content_length_body_is_streamed(void **state) {
  fx_t *fx = fx_new(0);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  (void)state;
  assert_int_equal(htc_sends(&fx->loop, c,
                             "POST /echo HTTP/1.1\r\nHost: t\r\n"
                             "Content-Length: 10\r\n\r\nhello"),
                   0);
  {
    uint64_t t0 = htc_now_ms();
    while (fx->got < 5 && htc_now_ms() - t0 < 2000)
      htc_step(&fx->loop, c, 1);
  }
  /* dispatched before the body is whole, and its first half delivered */
  assert_int_equal(fx->seen, 1);
  assert_int_equal(fx->body_streamed, 1);
  assert_int_equal((int)fx->content_length, 10);
  assert_int_equal(fx->start_rc, 0);
  OM_ASSERT_CMP(fx->got, ==, 5);
  assert_int_equal(fx->ended, 0);
  assert_int_equal(htc_sends(&fx->loop, c,
                             "world"
                             "GET /after HTTP/1.1\r\nHost: t\r\n\r\n"),
                   0);
  assert_int_equal(wait_responses(fx, c, 2, 2000), 2);
  assert_int_equal(R[0].status, 200);
  assert_string_equal(R[0].body, "helloworld");
  assert_false(R[0].close);
  assert_int_equal(R[1].status, 200);
  assert_string_equal(R[1].body, "nobody");
  assert_int_equal(fx->ended, 1);
  htc_free(c);
  fx_free(fx);
}

/* whole_body_max: a small Content-Length body that came with its head is
 * dispatched whole (body_streamed 0, the bytes in body); one still on its
 * way, one over the bound, one behind "Expect: 100-continue", a chunked
 * one and one pipelined behind another request are streamed as before;
 * what follows a whole body is parsed as usual. */
static void small_complete_body_is_whole(void **state) {
  static const struct {
    const char *first, *rest; /* sent apart, a turn of the loop between */
    int streamed;
    const char *body;
  } cases[] = {
      {"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n"
       "helloworld",
       "", 0, "whole:helloworld"},
      {"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nhello",
       "world", 1, "helloworld"},
      {"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 17\r\n\r\n"
       "over-the-16-bytes",
       "", 1, "over-the-16-bytes"},
      {"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
       "Content-Length: 5\r\n\r\nasked",
       "", 1, "asked"},
      {"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
       "3\r\nabc\r\n0\r\n\r\n",
       "", 1, "abc"},
  };
  size_t i;
  (void)state;
  /* two small POSTs pipelined in one write: the first whole, the second
   * (a request queued before it) streamed, so a connection never holds
   * more than one copied body */
  {
    fx_t *fx;
    htc_t *c;
    whole_max = 16;
    fx = fx_new(0);
    c = htc_new("127.0.0.1", fx->port);
    assert_int_equal(
        htc_sends(&fx->loop, c,
                  "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\n"
                  "one"
                  "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\n"
                  "two"),
        0);
    assert_int_equal(wait_responses(fx, c, 2, 2000), 2);
    assert_string_equal(R[0].body, "whole:one");
    assert_string_equal(R[1].body, "two");
    assert_int_equal(fx->ended, 1);
    htc_free(c);
    fx_free(fx);
  }
  for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fx_t *fx;
    whole_max = 16;
    fx = fx_new(0);
    htc_t *c = htc_new("127.0.0.1", fx->port);
    int j, k;
    assert_int_equal(htc_sends(&fx->loop, c, cases[i].first), 0);
    if (cases[i].rest[0] != '\0') {
      uint64_t t0 = htc_now_ms();
      while (fx->seen == 0 && htc_now_ms() - t0 < 2000)
        htc_step(&fx->loop, c, 1);
      assert_int_equal(htc_sends(&fx->loop, c, cases[i].rest), 0);
    }
    assert_int_equal(
        htc_sends(&fx->loop, c, "GET /n HTTP/1.1\r\nHost: t\r\n\r\n"), 0);
    /* the Expect case gets its 100 Continue first */
    j = strstr(cases[i].first, "100-continue") != NULL;
    k = wait_responses(fx, c, 2 + j, 2000);
    assert_int_equal(k, 2 + j);
    if (j)
      assert_int_equal(R[0].status, 100);
    assert_int_equal(R[j].status, 200);
    assert_string_equal(R[j].body, cases[i].body);
    assert_int_equal(R[j + 1].status, 200);
    assert_string_equal(R[j + 1].body, "nobody");
    /* a streamed body ends through on_end, a whole one never does */
    assert_int_equal(fx->seen, 2);
    OM_ASSERT_CMP((size_t)fx->ended, ==, (size_t)cases[i].streamed);
    htc_free(c);
    fx_free(fx);
  }
}

/* The rest of a Content-Length body read by the caller from the lent
 * socket: the server reads nothing meanwhile (a pipelined request behind
 * it stays on the wire), and once given back the body ends and the next
 * request is served. */
static void a_lent_body_socket_carries_the_rest(void **state) {
  fx_t *fx = fx_new(0);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  char buf[16];
  size_t got = 0;
  uint64_t left = 0;
  int fd;
  (void)state;
  fx->lend_rc = 1;
  assert_int_equal(htc_sends(&fx->loop, c,
                             "POST /lend HTTP/1.1\r\nHost: t\r\n"
                             "Content-Length: 10\r\n\r\nhello"),
                   0);
  {
    uint64_t t0 = htc_now_ms();
    while (fx->lend_rc == 1 && htc_now_ms() - t0 < 2000)
      htc_step(&fx->loop, c, 1);
  }
  assert_int_equal(fx->lend_rc, 0);
  OM_ASSERT_CMP(fx->lend_left, ==, 5);
  assert_int_equal(om_http_request_body_lend(fx->req, &fd, &left), OM_ESTATE);
  assert_int_equal(htc_sends(&fx->loop, c,
                             "world"
                             "GET /after HTTP/1.1\r\nHost: t\r\n\r\n"),
                   0);
  {
    uint64_t t0 = htc_now_ms();
    while (got < 5 && htc_now_ms() - t0 < 2000) {
      ssize_t k = read(fx->lend_fd, buf + got, 5 - got);
      if (k > 0)
        got += (size_t)k;
      htc_step(&fx->loop, c, 1);
    }
  }
  assert_int_equal(got, 5);
  assert_int_equal(fx->spans, 1); /* nothing delivered behind our back */
  assert_int_equal(fx->seen, 1);  /* nor the pipelined request parsed */
  memcpy(fx->echo + fx->got, buf, 5);
  fx->got += 5;
  assert_int_equal(om_http_request_body_unlend(fx->req, 6), OM_EINVAL);
  assert_int_equal(om_http_request_body_unlend(fx->req, 5), 0);
  assert_int_equal(fx->ended, 0); /* from the loop */
  assert_int_equal(wait_responses(fx, c, 2, 2000), 2);
  assert_int_equal(R[0].status, 200);
  assert_string_equal(R[0].body, "helloworld");
  assert_int_equal(R[1].status, 200);
  assert_string_equal(R[1].body, "nobody");
  assert_int_equal(fx->ended, 1);
  htc_free(c);
  fx_free(fx);
}

/* The rest of a Content-Length response written by the caller to the lent
 * socket, after what was corked went first; writes and the end are
 * refused meanwhile; a chunked response is never lent. */
static void a_lent_response_socket_carries_the_rest(void **state) {
  fx_t *fx = fx_new(0);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  uint64_t left = 0, t0;
  int fd = -1, rc = 1;
  (void)state;
  assert_int_equal(
      htc_sends(&fx->loop, c, "GET /lend-resp HTTP/1.1\r\nHost: t\r\n\r\n"), 0);
  t0 = htc_now_ms();
  while (fx->resp_req == NULL && htc_now_ms() - t0 < 2000)
    htc_step(&fx->loop, c, 1);
  assert_non_null(fx->resp_req);
  t0 = htc_now_ms();
  while ((rc = om_http_response_lend(fx->resp_req, &fd, &left)) == 1 &&
         htc_now_ms() - t0 < 2000)
    htc_step(&fx->loop, c, 1);
  assert_int_equal(rc, 0);
  OM_ASSERT_CMP(left, ==, 5);
  assert_int_equal(om_http_response_write(fx->resp_req, "x", 1), OM_ESTATE);
  assert_int_equal(om_http_response_end(fx->resp_req), OM_ESTATE);
  assert_int_equal(om_http_response_pending(fx->resp_req), 0);
  assert_int_equal(write(fd, "world", 5), 5);
  om_http_response_lent_progress(fx->resp_req);
  assert_int_equal(om_http_response_unlend(fx->resp_req, 6), OM_EINVAL);
  assert_int_equal(om_http_response_unlend(fx->resp_req, 5), 0);
  assert_int_equal(om_http_response_unlend(fx->resp_req, 0), OM_ESTATE);
  assert_int_equal(om_http_response_end(fx->resp_req), 0);
  assert_int_equal(wait_responses(fx, c, 1, 2000), 1);
  assert_int_equal(R[0].status, 200);
  assert_string_equal(R[0].body, "helloworld");
  assert_false(R[0].close);
  /* chunked: not lent */
  fx->resp_req = NULL;
  assert_int_equal(
      htc_sends(&fx->loop, c, "GET /lend-chunked HTTP/1.1\r\nHost: t\r\n\r\n"),
      0);
  t0 = htc_now_ms();
  while (fx->resp_req == NULL && htc_now_ms() - t0 < 2000)
    htc_step(&fx->loop, c, 1);
  assert_non_null(fx->resp_req);
  assert_int_equal(om_http_response_lend(fx->resp_req, &fd, &left), OM_ESTATE);
  assert_int_equal(om_http_response_lend(NULL, &fd, &left), OM_EINVAL);
  assert_int_equal(om_http_response_end(fx->resp_req), 0);
  htc_free(c);
  fx_free(fx);
}

/* Chunked bodies are de-chunked, trailers dropped; a bad chunk after the
 * dispatch ends the request with its reason and on_close. */
static void chunked_body_is_streamed_and_checked(void **state) {
  fx_t *fx = fx_new(0);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  (void)state;
  assert_int_equal(htc_sends(&fx->loop, c,
                             "POST /echo HTTP/1.1\r\nHost: t\r\n"
                             "Transfer-Encoding: chunked\r\n\r\n"
                             "3\r\nabc\r\n4;x=y\r\ndefg\r\n0\r\nT: v\r\n\r\n"),
                   0);
  assert_int_equal(wait_responses(fx, c, 1, 2000), 1);
  assert_int_equal((int)fx->content_length, -1);
  assert_string_equal(R[0].body, "abcdefg");
  htc_free(c);
  c = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, c,
                             "POST /echo HTTP/1.1\r\nHost: t\r\n"
                             "Transfer-Encoding: chunked\r\n\r\n"
                             "3\r\nabc\r\nzz\r\n"),
                   0);
  assert_int_equal(wait_responses(fx, c, 1, 2000), 1);
  assert_int_equal(R[0].status, 400);
  assert_non_null(strstr(R[0].body, "bad_chunk"));
  assert_int_equal(fx->close_calls, 1);
  assert_int_equal(fx->body_error, OM_HTTP_REJECT_BAD_CHUNK);
  assert_true(wait_eof(fx, c, 3000));
  htc_free(c);
  fx_free(fx);
}

/* max_body_bytes 0 is no limit in this mode; a set one is enforced at the
 * head for Content-Length and at the chunk that passes it. */
static void body_limits_in_streaming_mode(void **state) {
  fx_t *fx = fx_new(0);
  htc_t *c;
  static char big[3u << 20];
  char head[128];
  (void)state;
  memset(big, 'b', sizeof big);
  c = htc_new("127.0.0.1", fx->port);
  snprintf(head, sizeof head,
           "PUT /echo HTTP/1.1\r\nHost: t\r\nContent-Length: %zu\r\n\r\n",
           sizeof big);
  assert_int_equal(htc_sends(&fx->loop, c, head), 0);
  assert_int_equal(htc_send(&fx->loop, c, big, sizeof big), 0);
  assert_int_equal(wait_responses(fx, c, 1, 5000), 1);
  assert_int_equal(R[0].status, 200);
  OM_ASSERT_CMP(fx->got, ==, sizeof big);
  htc_free(c);
  fx_free(fx);
  fx = fx_new(100);
  c = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, c,
                             "PUT /echo HTTP/1.1\r\nHost: t\r\n"
                             "Content-Length: 101\r\n\r\n"),
                   0);
  assert_int_equal(wait_responses(fx, c, 1, 2000), 1);
  assert_int_equal(R[0].status, 413);
  assert_int_equal(fx->seen, 0);
  htc_free(c);
  c = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, c,
                             "PUT /echo HTTP/1.1\r\nHost: t\r\n"
                             "Transfer-Encoding: chunked\r\n\r\n"
                             "50\r\n"),
                   0);
  {
    char chunk[80];
    memset(chunk, 'c', sizeof chunk);
    assert_int_equal(htc_send(&fx->loop, c, chunk, sizeof chunk), 0);
  }
  assert_int_equal(htc_sends(&fx->loop, c, "\r\n20\r\n"), 0);
  assert_int_equal(wait_responses(fx, c, 1, 2000), 1);
  assert_int_equal(R[0].status, 413);
  assert_int_equal(fx->body_error, OM_HTTP_REJECT_BODY_TOO_LARGE);
  OM_ASSERT_CMP(fx->got, ==, 80);
  htc_free(c);
  fx_free(fx);
}

/* RFC 9110 10.1.1: 100 Continue when the holder asks for the body, never
 * when it answers first. */
static void continue_only_when_the_body_is_asked_for(void **state) {
  fx_t *fx = fx_new(0);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  uint64_t t0;
  (void)state;
  assert_int_equal(htc_sends(&fx->loop, c,
                             "POST /wait HTTP/1.1\r\nHost: t\r\nExpect: "
                             "100-continue\r\nContent-Length: 5\r\n\r\n"),
                   0);
  t0 = htc_now_ms();
  while (fx->seen < 1 && htc_now_ms() - t0 < 2000)
    htc_step(&fx->loop, c, 1);
  assert_int_equal(fx->seen, 1);
  /* dispatched, body not asked for: nothing on the wire yet */
  t0 = htc_now_ms();
  while (htc_now_ms() - t0 < 100)
    htc_step(&fx->loop, c, 1);
  OM_ASSERT_CMP(c->total, ==, 0);
  assert_int_equal(om_http_request_body_start(fx->req, on_data, on_end), 0);
  assert_int_equal(om_http_request_body_start(fx->req, on_data, on_end),
                   OM_ESTATE);
  assert_int_equal(wait_responses(fx, c, 1, 2000), 1);
  assert_int_equal(R[0].status, 100);
  assert_int_equal(htc_sends(&fx->loop, c, "hello"), 0);
  assert_int_equal(wait_responses(fx, c, 2, 2000), 2);
  assert_int_equal(R[1].status, 200);
  assert_string_equal(R[1].body, "hello");
  htc_free(c);
  /* an early answer: no 100, the final answer, then the connection
   * closes (the body was never read) */
  c = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, c,
                             "POST /early HTTP/1.1\r\nHost: t\r\nExpect: "
                             "100-continue\r\nContent-Length: 5\r\n\r\n"),
                   0);
  assert_int_equal(wait_responses(fx, c, 1, 2000), 1);
  assert_int_equal(R[0].status, 413);
  assert_true(R[0].close);
  assert_null(strstr(c->buf, "100 Continue"));
  assert_true(wait_eof(fx, c, 3000));
  htc_free(c);
  fx_free(fx);
}

/* RFC 9112 9.6: an answer before the body was read is readable by a
 * client that goes on sending the whole body (no Expect), as Python's
 * http.client does: the server reads and drops it, then closes. */
static void early_answer_is_readable_while_the_client_sends(void **state) {
  fx_t *fx = fx_new(0);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  static char big[9u << 20];
  char head[128];
  (void)state;
  memset(big, 'x', sizeof big);
  snprintf(head, sizeof head,
           "PUT /early HTTP/1.1\r\nHost: t\r\nContent-Length: %zu\r\n\r\n",
           sizeof big);
  assert_int_equal(htc_sends(&fx->loop, c, head), 0);
  /* the whole body goes in, past the 1 MiB a refusal drops */
  assert_int_equal(htc_send(&fx->loop, c, big, sizeof big), 0);
  assert_true(wait_eof(fx, c, 5000));
  assert_false(c->reset);
  assert_int_equal(wait_responses(fx, c, 1, 100), 1);
  assert_int_equal(R[0].status, 413);
  assert_non_null(strstr(R[0].body, "body_too_large"));
  htc_free(c);
  fx_free(fx);
}

/* Pausing stops reading: the client is held back by TCP and the server
 * holds no more than its read buffer; resuming delivers the rest. */
static void pause_holds_the_client_back(void **state) {
  fx_t *fx = fx_new(0);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  static char junk[1 << 16];
  const size_t total = 64u << 20;
  size_t sent = 0;
  uint64_t t0, progress;
  char head[128];
  (void)state;
  memset(junk, 'p', sizeof junk);
  snprintf(head, sizeof head,
           "PUT /pause HTTP/1.1\r\nHost: t\r\nContent-Length: %zu\r\n\r\n",
           total);
  assert_int_equal(htc_sends(&fx->loop, c, head), 0);
  t0 = progress = htc_now_ms();
  while (sent < total && htc_now_ms() - progress < 300 &&
         htc_now_ms() - t0 < 20000) {
    ssize_t k = write(c->fd, junk, sizeof junk);
    if (k > 0) {
      sent += (size_t)k;
      progress = htc_now_ms();
    } else {
      htc_step(&fx->loop, c, 1);
    }
  }
  assert_int_equal(fx->paused, 1);
  /* what went in is what the sockets' buffers hold, not the body */
  OM_ASSERT_CMP(sent, <, (32u << 20));
  OM_ASSERT_CMP(fx->got, <=, 64u << 10); /* one read buffer at most */
  om_http_request_body_resume(fx->req);
  while (sent < total && htc_now_ms() - t0 < 20000) {
    size_t n = total - sent < sizeof junk ? total - sent : sizeof junk;
    ssize_t k = write(c->fd, junk, n);
    if (k > 0)
      sent += (size_t)k;
    else
      htc_step(&fx->loop, c, 1);
  }
  assert_int_equal(wait_responses(fx, c, 1, 10000), 1);
  assert_int_equal(R[0].status, 200);
  OM_ASSERT_CMP(fx->got, ==, total);
  htc_free(c);
  fx_free(fx);
}

/* A body that stalls past its idle timeout: 408 when nothing was
 * answered, a cut response when one started; on_close tells the holder. */
static void stalled_body_gets_408_or_a_cut(void **state) {
  fx_t *fx = fx_new(0);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  uint64_t t0;
  (void)state;
  assert_int_equal(htc_sends(&fx->loop, c,
                             "PUT /idle HTTP/1.1\r\nHost: t\r\n"
                             "Content-Length: 8388608\r\n\r\nsome"),
                   0);
  t0 = htc_now_ms();
  assert_int_equal(wait_responses(fx, c, 1, 3000), 1);
  OM_ASSERT_CMP(htc_now_ms() - t0, >=, 140);
  assert_int_equal(R[0].status, 408);
  assert_int_equal(fx->close_calls, 1);
  assert_int_equal(fx->body_error, OM_HTTP_REJECT_REQUEST_TIMEOUT);
  OM_ASSERT_CMP(M(fx)->rejected[OM_HTTP_REJECT_REQUEST_TIMEOUT], ==, 1);
  assert_true(wait_eof(fx, c, 3000));
  htc_free(c);
  c = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, c,
                             "PUT /idle-started HTTP/1.1\r\nHost: t\r\n"
                             "Content-Length: 100\r\n\r\nsome"),
                   0);
  assert_true(wait_eof(fx, c, 3000));
  /* the chunked response never got its last chunk */
  assert_int_equal(htc_responses(c, NULL, R, 8), 0);
  assert_int_equal(fx->close_calls, 2);
  assert_int_equal(fx->body_error, OM_HTTP_REJECT_REQUEST_TIMEOUT);
  htc_free(c);
  fx_free(fx);
}

/* A response started before the body ended keeps going: bytes relayed
 * as they come; answering from inside on_data closes after the answer. */
static void answers_during_the_body(void **state) {
  fx_t *fx = fx_new(0);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  (void)state;
  assert_int_equal(htc_sends(&fx->loop, c,
                             "POST /relay HTTP/1.1\r\nHost: t\r\n"
                             "Content-Length: 6\r\n\r\nabc"),
                   0);
  {
    uint64_t t0 = htc_now_ms();
    while (c->total == 0 && htc_now_ms() - t0 < 2000)
      htc_step(&fx->loop, c, 1);
  }
  OM_ASSERT_CMP(c->total, >, 0);
  assert_int_equal(htc_sends(&fx->loop, c, "def"), 0);
  assert_int_equal(wait_responses(fx, c, 1, 2000), 1);
  assert_string_equal(R[0].body, "abcdef");
  assert_true(R[0].close); /* started before the body ended */
  assert_true(wait_eof(fx, c, 3000));
  htc_free(c);
  c = htc_new("127.0.0.1", fx->port);
  assert_int_equal(htc_sends(&fx->loop, c,
                             "POST /respond-mid HTTP/1.1\r\nHost: t\r\n"
                             "Content-Length: 100\r\n\r\nabcdef"),
                   0);
  assert_int_equal(wait_responses(fx, c, 1, 2000), 1);
  assert_int_equal(R[0].status, 200);
  assert_string_equal(R[0].body, "mid");
  assert_true(R[0].close);
  assert_true(wait_eof(fx, c, 3000));
  htc_free(c);
  fx_free(fx);
}

/* The same bytes split into one-byte writes give the same answers and the
 * same body. */
static void split_reads_give_the_same_answers(void **state) {
  static const char *const cases[] = {
      "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 7\r\n\r\nabcdefg"
      "GET /n HTTP/1.1\r\nHost: t\r\n\r\n",
      "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
      "2\r\nab\r\n5;e=1\r\ncdefg\r\n0\r\nX: 1\r\n\r\n"
      "GET /n HTTP/1.1\r\nHost: t\r\n\r\n",
      "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
      "2\r\nab\r\nq\r\n",
      "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n"
      "Connection: close\r\n\r\nxyzGET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n",
  };
  size_t i;
  (void)state;
  for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char whole[2][1024];
    size_t got[2];
    int seen[2], split;
    for (split = 0; split < 2; split++) {
      fx_t *fx = fx_new(0);
      htc_t *c = htc_new("127.0.0.1", fx->port);
      const char *s = cases[i];
      size_t n = strlen(s), j;
      int k;
      if (split) {
        for (j = 0; j < n; j++) {
          assert_int_equal(htc_send(&fx->loop, c, s + j, 1), 0);
          htc_step(&fx->loop, c, 1);
        }
      } else {
        assert_int_equal(htc_send(&fx->loop, c, s, n), 0);
      }
      k = wait_responses(fx, c, 2, 1000);
      wait_eof(fx, c, 300);
      k = htc_responses(c, NULL, R, 8);
      snprintf(whole[split], sizeof whole[split], "%d", k);
      for (j = 0; j < (size_t)(k > 0 ? k : 0); j++) {
        size_t l = strlen(whole[split]);
        snprintf(whole[split] + l, sizeof whole[split] - l, " %d:%s",
                 R[j].status, R[j].body);
      }
      got[split] = fx->got;
      seen[split] = fx->seen;
      htc_free(c);
      fx_free(fx);
    }
    assert_string_equal(whole[0], whole[1]);
    OM_ASSERT_CMP(got[0], ==, got[1]);
    assert_int_equal(seen[0], seen[1]);
  }
}

/* Random chunked bodies (sizes, extensions, trailers), sent in random
 * splits: every body arrives whole and in order, with the same answer. */
static void random_chunked_bodies_in_random_splits(void **state) {
  static char wire[1 << 18], body[1 << 17]; /* up to 34 x 3000 bytes */
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  (void)state;
  for (int round = 0; round < 12; round++) {
    fx_t *fx = fx_new(0);
    htc_t *c = htc_new("127.0.0.1", fx->port);
    size_t wl = 0, bl = 0, off = 0;
    uint64_t want = 14695981039346656037ull;
    int k = snprintf(wire, sizeof wire,
                     "POST /echo HTTP/1.1\r\nHost: t\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n");
    wl = (size_t)k;
    for (int n = 0; n < 1 + round * 3; n++) {
      size_t len;
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      len = 1 + (size_t)(seed >> 33) % 3000;
      k = snprintf(wire + wl, sizeof wire - wl, "%zx%s\r\n", len,
                   (seed >> 20) & 1 ? ";ext=\"v\"" : "");
      wl += (size_t)k;
      for (size_t i = 0; i < len; i++)
        body[bl + i] = (char)('a' + (seed >> (i % 40)) % 26);
      memcpy(wire + wl, body + bl, len);
      want = fnv(want, body + bl, len);
      wl += len;
      bl += len;
      memcpy(wire + wl, "\r\n", 2);
      wl += 2;
    }
    k = snprintf(wire + wl, sizeof wire - wl, "0\r\nX-T: 1\r\n\r\n");
    wl += (size_t)k;
    while (off < wl) {
      size_t piece;
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      piece = 1 + (size_t)(seed >> 40) % 700;
      if (piece > wl - off)
        piece = wl - off;
      assert_int_equal(htc_send(&fx->loop, c, wire + off, piece), 0);
      off += piece;
      htc_step(&fx->loop, c, 0);
    }
    assert_int_equal(wait_responses(fx, c, 1, 5000), 1);
    assert_int_equal(R[0].status, 200);
    OM_ASSERT_CMP(fx->got, ==, bl);
    assert_true(fx->hash == want);
    htc_free(c);
    fx_free(fx);
  }
}

/* A body held span by span by reference: the held bytes stay what was
 * delivered while the server reads on (the body and a pipelined request
 * after it, in every split of the wire into two sends), the next request
 * is answered, and the references outlive the connection. */
static void held_spans_survive_every_split(void **state) {
  static const char *const cases[] = {
      "POST /hold HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\n"
      "hello world"
      "GET /n HTTP/1.1\r\nHost: t\r\n\r\n",
      "POST /hold HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
      "3\r\nabc\r\n5;e=1\r\ndefgh\r\n0\r\nX: 1\r\n\r\n"
      "GET /n HTTP/1.1\r\nHost: t\r\n\r\n",
  };
  size_t i, cut;
  (void)state;
  for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *w = cases[i];
    size_t n = strlen(w);
    for (cut = 1; cut < n; cut++) {
      fx_t *fx = fx_new(0);
      htc_t *c = htc_new("127.0.0.1", fx->port);
      uint64_t delivered;
      assert_int_equal(htc_send(&fx->loop, c, w, cut), 0);
      htc_step(&fx->loop, c, 1);
      assert_int_equal(htc_send(&fx->loop, c, w + cut, n - cut), 0);
      assert_int_equal(wait_responses(fx, c, 2, 2000), 2);
      assert_int_equal(R[0].status, 200);
      assert_string_equal(R[0].body, i == 0 ? "hello world" : "abcdefgh");
      assert_string_equal(R[1].body, "nobody");
      delivered = fx->hash;
      htc_free(c);
      fx_free(fx); /* the connection and the server are gone */
      OM_ASSERT_CMP(held_hash(), ==, delivered);
      OM_ASSERT_CMP(hold_null, ==, 0);
      held_release();
    }
  }
  OM_ASSERT_CMP(hold_outside, ==, 0);
}

/* A body larger than a read buffer, held whole: the server reads on into
 * fresh buffers (never over a held byte), with a pipelined request right
 * behind the body in the same send, then a second held body on the same
 * connection. */
static void held_big_body_then_pipelined(void **state) {
  static char wire[(300u << 10) + 512];
  fx_t *fx = fx_new(0);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  size_t body = 300u << 10, wl, j;
  uint64_t want = 14695981039346656037ull, first;
  char line[64];
  int round;
  (void)state;
  for (round = 0; round < 2; round++) {
    wl = (size_t)snprintf(wire, sizeof wire,
                          "POST /hold HTTP/1.1\r\nHost: t\r\n"
                          "Content-Length: %zu\r\n\r\n",
                          body);
    for (j = 0; j < body; j++)
      wire[wl + j] = (char)('a' + (j * 7 + (size_t)round) % 26);
    if (round == 0)
      want = fnv(want, wire + wl, body);
    wl += body;
    wl += (size_t)snprintf(wire + wl, sizeof wire - wl,
                           "GET /n HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_int_equal(htc_send(&fx->loop, c, wire, wl), 0);
    assert_int_equal(wait_responses(fx, c, 2 * (round + 1), 5000),
                     2 * (round + 1));
    snprintf(line, sizeof line, "%zu %016" PRIx64, body, fx->hash);
    assert_string_equal(R[2 * round].body, line);
    assert_string_equal(R[2 * round + 1].body, "nobody");
    OM_ASSERT_CMP(n_held, >, 1); /* more than one span, more than one read */
    if (round == 0) {
      first = held_hash();
      OM_ASSERT_CMP(first, ==, want);
      OM_ASSERT_CMP(first, ==, fx->hash);
      held_release();
    }
  }
  /* the second body's spans, after more reads of the same connection */
  OM_ASSERT_CMP(held_hash(), ==, fx->hash);
  OM_ASSERT_CMP(hold_null, ==, 0);
  htc_free(c);
  fx_free(fx);
  held_release();
}

/* The client goes away mid-body: on_close runs, and the spans held so
 * far stay readable until released. */
static void held_spans_outlive_a_client_gone_mid_body(void **state) {
  static char part[100u << 10];
  fx_t *fx = fx_new(0);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  uint64_t t0, want = 14695981039346656037ull;
  (void)state;
  memset(part, 'q', sizeof part);
  assert_int_equal(htc_sends(&fx->loop, c,
                             "POST /hold HTTP/1.1\r\nHost: t\r\n"
                             "Content-Length: 1000000\r\n\r\n"),
                   0);
  assert_int_equal(htc_send(&fx->loop, c, part, sizeof part), 0);
  t0 = htc_now_ms();
  while (fx->got < sizeof part && htc_now_ms() - t0 < 3000)
    htc_step(&fx->loop, c, 1);
  OM_ASSERT_CMP(fx->got, ==, sizeof part);
  htc_free(c);
  t0 = htc_now_ms();
  while (fx->close_calls == 0 && htc_now_ms() - t0 < 3000)
    htc_step(&fx->loop, NULL, 1);
  OM_ASSERT_CMP(fx->close_calls, ==, 1);
  OM_ASSERT_CMP(fx->ended, ==, 0);
  fx_free(fx);
  want = fnv(want, part, sizeof part);
  OM_ASSERT_CMP(held_hash(), ==, want);
  held_release();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(content_length_body_is_streamed),
      cmocka_unit_test(small_complete_body_is_whole),
      cmocka_unit_test(a_lent_body_socket_carries_the_rest),
      cmocka_unit_test(a_lent_response_socket_carries_the_rest),
      cmocka_unit_test(chunked_body_is_streamed_and_checked),
      cmocka_unit_test(body_limits_in_streaming_mode),
      cmocka_unit_test(continue_only_when_the_body_is_asked_for),
      cmocka_unit_test(early_answer_is_readable_while_the_client_sends),
      cmocka_unit_test(pause_holds_the_client_back),
      cmocka_unit_test(stalled_body_gets_408_or_a_cut),
      cmocka_unit_test(answers_during_the_body),
      cmocka_unit_test(split_reads_give_the_same_answers),
      cmocka_unit_test(random_chunked_bodies_in_random_splits),
      cmocka_unit_test(held_spans_survive_every_split),
      cmocka_unit_test(held_big_body_then_pipelined),
      cmocka_unit_test(held_spans_outlive_a_client_gone_mid_body),
  };
  signal(SIGPIPE, SIG_IGN); /* libuv writes with writev */
  return cmocka_run_group_tests(tests, NULL, NULL);
}
