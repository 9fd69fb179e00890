/*
 * test_http2_server.c: HTTP/2 on the HTTP server (om_http_server_opts_t
 * .http2) over real loopback sockets, with an nghttp2 client session on
 * a raw socket: the preface turns the connection into HTTP/2, a stream is
 * a request through the ordinary om_http_* calls, streams multiplex and
 * are answered out of order, a paused holder holds a client's upload at
 * the stream window, a response without a body is one HEADERS frame
 * ending the stream (gRPC's Trailers-Only), a rapid-reset flood gets
 * GOAWAY ENHANCE_YOUR_CALM, and a server without http2 still answers the
 * preface 505.
 */
#include "om_test.h"

#include <nghttp2/nghttp2.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_test_client.h"
#include "om_errno.h"
#include "om_http_server.h"

#define MAXS 64

typedef struct fx_s {
  uv_loop_t loop;
  om_http_server_t *srv;
  int port, closed;
  /* the server side */
  om_http_request_t *held[MAXS];
  om_http_request_t *up; /* the /upload request */
  int n_held, seen, version;
  char path[64], host[64];
  size_t got;
  int ended, pause_first, paused;
  /* the client side */
  htc_t *c;
  nghttp2_session *cs;
  int status[MAXS * 8];
  char body[MAXS * 8][64];
  size_t body_len[MAXS * 8], data_bytes[MAXS * 8];
  int drained;
  int done[MAXS * 8], data_frames[MAXS * 8], headers_end[MAXS * 8];
  int reset[MAXS * 8];
  uint32_t goaway;
  int got_goaway;
} fx_t;

static fx_t *F;

/* ------------------------------------------------------------------ */
/* the holder */

static void on_body(om_http_request_t *req, const char *data, size_t len) {
  (void)data;
  F->got += len;
  if (F->pause_first && !F->paused) {
    F->paused = 1;
    om_http_request_body_pause(req);
  }
}

static void on_body_end(om_http_request_t *req) {
  char msg[32];
  int n = snprintf(msg, sizeof msg, "%zu", F->got);
  F->ended++;
  om_http_respond(req, 200, NULL, 0, msg, (size_t)n);
}

static void on_request(om_http_request_t *req, void *ud) {
  fx_t *fx = ud;
  const char *h = om_http_request_header(req, "host", NULL);
  fx->seen++;
  fx->version = req->version_major;
  snprintf(fx->path, sizeof fx->path, "%.*s", (int)req->target_len,
           req->target);
  snprintf(fx->host, sizeof fx->host, "%s", h ? h : "");
  if (req->path_len == 5 && memcmp(req->path, "/hold", 5) == 0) {
    fx->held[fx->n_held++] = req; /* answered by the test */
    return;
  }
  if (req->path_len == 7 && memcmp(req->path, "/upload", 7) == 0) {
    fx->up = req;
    om_http_request_body_start(req, on_body, on_body_end);
    return;
  }
  if (req->path_len == 8 && memcmp(req->path, "/trailer", 8) == 0) {
    om_http_header_t gs[] = {{"grpc-status", "14", 11, 2}};
    om_http_respond(req, 200, gs, 1, NULL, 0);
    return;
  }
  om_http_respond(req, 200, NULL, 0, "hello", 5);
}

static void on_closed(om_http_server_t *s, void *ud) {
  (void)s;
  ((fx_t *)ud)->closed = 1;
}

static fx_t *fx_new(int http2) {
  fx_t *fx = calloc(1, sizeof *fx);
  om_http_server_opts_t o;
  memset(&o, 0, sizeof o);
  o.stream_bodies = 1;
  o.http2 = http2;
  assert_non_null(fx);
  F = fx;
  assert_int_equal(uv_loop_init(&fx->loop), 0);
  assert_int_equal(om_http_server_new(&fx->loop, &o, on_request, fx, &fx->srv),
                   0);
  assert_int_equal(om_http_server_listen(fx->srv, "127.0.0.1", 0), 0);
  fx->port = om_http_server_port(fx->srv);
  return fx;
}

static void fx_free(fx_t *fx) {
  if (fx->cs != NULL)
    nghttp2_session_del(fx->cs);
  if (fx->c != NULL)
    htc_free(fx->c);
  om_http_server_close(fx->srv, on_closed);
  while (!fx->closed)
    uv_run(&fx->loop, UV_RUN_ONCE);
  uv_loop_close(&fx->loop);
  free(fx);
}

/* ------------------------------------------------------------------ */
/* the client: nghttp2 on the raw socket */

static int c_header(nghttp2_session *s, const nghttp2_frame *f,
                    const uint8_t *name, size_t nl, const uint8_t *value,
                    size_t vl, uint8_t flags, void *ud) {
  fx_t *fx = ud;
  (void)s;
  (void)flags;
  if (f->hd.type == NGHTTP2_HEADERS && nl == 7 &&
      memcmp(name, ":status", 7) == 0 && f->hd.stream_id < MAXS * 8)
    fx->status[f->hd.stream_id] = atoi((const char *)value);
  (void)vl;
  return 0;
}

static int c_data(nghttp2_session *s, uint8_t flags, int32_t id,
                  const uint8_t *data, size_t len, void *ud) {
  fx_t *fx = ud;
  (void)s;
  (void)flags;
  if (id < MAXS * 8)
    fx->data_bytes[id] += len;
  if (id < MAXS * 8 && fx->body_len[id] + len < sizeof fx->body[0]) {
    memcpy(fx->body[id] + fx->body_len[id], data, len);
    fx->body_len[id] += len;
  }
  return 0;
}

static int c_frame(nghttp2_session *s, const nghttp2_frame *f, void *ud) {
  fx_t *fx = ud;
  int32_t id = f->hd.stream_id;
  (void)s;
  if (f->hd.type == NGHTTP2_GOAWAY) {
    fx->got_goaway = 1;
    fx->goaway = f->goaway.error_code;
  }
  if (id <= 0 || id >= MAXS * 8)
    return 0;
  if (f->hd.type == NGHTTP2_DATA)
    fx->data_frames[id]++;
  if (f->hd.type == NGHTTP2_RST_STREAM)
    fx->reset[id] = 1;
  if (f->hd.flags & NGHTTP2_FLAG_END_STREAM) {
    fx->done[id] = 1;
    if (f->hd.type == NGHTTP2_HEADERS)
      fx->headers_end[id] = 1;
  }
  return 0;
}

static void client_new(fx_t *fx) {
  nghttp2_session_callbacks *cb;
  fx->c = htc_new("127.0.0.1", fx->port);
  assert_non_null(fx->c);
  assert_int_equal(nghttp2_session_callbacks_new(&cb), 0);
  nghttp2_session_callbacks_set_on_header_callback(cb, c_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, c_data);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, c_frame);
  assert_int_equal(nghttp2_session_client_new(&fx->cs, cb, fx), 0);
  nghttp2_session_callbacks_del(cb);
  assert_int_equal(nghttp2_submit_settings(fx->cs, NGHTTP2_FLAG_NONE, NULL, 0),
                   0);
}

/* Send what the client session has, read what came, feed it. */
static void client_step(fx_t *fx, int ms) {
  for (;;) {
    const uint8_t *d;
    ssize_t n = nghttp2_session_mem_send(fx->cs, &d);
    assert_true(n >= 0);
    if (n == 0)
      break;
    if (htc_send(&fx->loop, fx->c, (const char *)d, (size_t)n) != 0)
      break;
  }
  htc_step(&fx->loop, fx->c, ms);
  if (fx->c->len > 0) {
    ssize_t n = nghttp2_session_mem_recv(fx->cs, (const uint8_t *)fx->c->buf,
                                         fx->c->len);
    assert_true(n >= 0);
    fx->c->len = 0;
  }
}

static int32_t get(fx_t *fx, const char *path) {
  nghttp2_nv nv[] = {
      {(uint8_t *)":method", (uint8_t *)"GET", 7, 3, 0},
      {(uint8_t *)":scheme", (uint8_t *)"http", 7, 4, 0},
      {(uint8_t *)":authority", (uint8_t *)"svc.test", 10, 8, 0},
      {(uint8_t *)":path", (uint8_t *)path, 5, strlen(path), 0},
  };
  int32_t id = nghttp2_submit_request(fx->cs, NULL, nv, 4, NULL, NULL);
  assert_true(id > 0);
  return id;
}

static void run_until(fx_t *fx, int *flag, int ms) {
  uint64_t t0 = htc_now_ms();
  while (!*flag && htc_now_ms() - t0 < (uint64_t)ms)
    client_step(fx, 1);
}

/* ------------------------------------------------------------------ */
/* tests */

static void preface_makes_a_stream_a_request(void **state) {
  fx_t *fx = fx_new(1);
  int32_t id;
  (void)state;
  client_new(fx);
  id = get(fx, "/x?y=1");
  run_until(fx, &fx->done[id], 3000);
  OM_ASSERT_CMP(fx->done[id], ==, 1);
  OM_ASSERT_CMP(fx->status[id], ==, 200);
  OM_ASSERT_CMP(fx->body_len[id], ==, 5);
  assert_memory_equal(fx->body[id], "hello", 5);
  OM_ASSERT_CMP(fx->version, ==, 2);
  assert_string_equal(fx->path, "/x?y=1");
  assert_string_equal(fx->host, "svc.test"); /* from :authority */
  OM_ASSERT_CMP(om_http_server_metrics(fx->srv)->h2_connections, ==, 1);
  OM_ASSERT_CMP(om_http_server_metrics(fx->srv)->h2_streams, ==, 1);
  fx_free(fx);
}

static void streams_multiplex_out_of_order(void **state) {
  fx_t *fx = fx_new(1);
  int32_t ids[10];
  int i, all = 0;
  uint64_t t0;
  (void)state;
  client_new(fx);
  for (i = 0; i < 10; i++)
    ids[i] = get(fx, "/hold");
  t0 = htc_now_ms();
  while (fx->n_held < 10 && htc_now_ms() - t0 < 3000)
    client_step(fx, 1);
  OM_ASSERT_CMP(fx->n_held, ==, 10);
  for (i = 9; i >= 0; i--) { /* the last first */
    char b[8];
    int n = snprintf(b, sizeof b, "r%d", i);
    assert_int_equal(om_http_response_start(fx->held[i], 200, NULL, 0), 0);
    assert_int_equal(om_http_response_write(fx->held[i], b, (size_t)n), 0);
    assert_int_equal(om_http_response_end(fx->held[i]), 0);
  }
  t0 = htc_now_ms();
  while (all < 10 && htc_now_ms() - t0 < 3000) {
    client_step(fx, 1);
    for (all = 0, i = 0; i < 10; i++)
      all += fx->done[ids[i]];
  }
  OM_ASSERT_CMP(all, ==, 10);
  for (i = 0; i < 10; i++) {
    char b[8];
    int n = snprintf(b, sizeof b, "r%d", i);
    OM_ASSERT_CMP(fx->body_len[ids[i]], ==, n);
    assert_memory_equal(fx->body[ids[i]], b, (size_t)n);
  }
  fx_free(fx);
}

/* The upload a paused holder does not take stops at the stream window:
 * the window is given back only as the holder takes bytes. */
static uint8_t upload[300000];
static size_t upload_off;

static ssize_t up_read(nghttp2_session *s, int32_t id, uint8_t *buf,
                       size_t length, uint32_t *flags, nghttp2_data_source *src,
                       void *ud) {
  size_t n = sizeof upload - upload_off;
  (void)s;
  (void)id;
  (void)src;
  (void)ud;
  if (n > length)
    n = length;
  memcpy(buf, upload + upload_off, n);
  upload_off += n;
  if (upload_off == sizeof upload)
    *flags |= NGHTTP2_DATA_FLAG_EOF;
  return (ssize_t)n;
}

static void paused_upload_stops_at_the_window(void **state) {
  fx_t *fx = fx_new(1);
  nghttp2_nv nv[] = {
      {(uint8_t *)":method", (uint8_t *)"POST", 7, 4, 0},
      {(uint8_t *)":scheme", (uint8_t *)"http", 7, 4, 0},
      {(uint8_t *)":authority", (uint8_t *)"svc.test", 10, 8, 0},
      {(uint8_t *)":path", (uint8_t *)"/upload", 5, 7, 0},
  };
  nghttp2_data_provider dp;
  int32_t id;
  uint64_t t0;
  (void)state;
  memset(upload, 'u', sizeof upload);
  upload_off = 0;
  fx->pause_first = 1;
  client_new(fx);
  dp.read_callback = up_read;
  id = nghttp2_submit_request(fx->cs, NULL, nv, 4, &dp, NULL);
  assert_true(id > 0);
  t0 = htc_now_ms();
  while (htc_now_ms() - t0 < 300)
    client_step(fx, 1);
  OM_ASSERT_CMP(fx->paused, ==, 1);
  /* what the client could send: one stream window (65535), of which the
   * holder took the first span */
  OM_ASSERT_CMP(upload_off, <=, 65535);
  OM_ASSERT_CMP(fx->got, <=, 65535);
  OM_ASSERT_CMP(fx->ended, ==, 0);
  om_http_response_abort(fx->up);
  fx_free(fx);
}

static void paused_upload_resumes_whole(void **state) {
  fx_t *fx = fx_new(1);
  (void)state;
  /* no pause: the whole body arrives and the answer says its length */
  nghttp2_nv nv[] = {
      {(uint8_t *)":method", (uint8_t *)"POST", 7, 4, 0},
      {(uint8_t *)":scheme", (uint8_t *)"http", 7, 4, 0},
      {(uint8_t *)":authority", (uint8_t *)"svc.test", 10, 8, 0},
      {(uint8_t *)":path", (uint8_t *)"/upload", 5, 7, 0},
  };
  nghttp2_data_provider dp;
  int32_t id;
  upload_off = 0;
  client_new(fx);
  dp.read_callback = up_read;
  id = nghttp2_submit_request(fx->cs, NULL, nv, 4, &dp, NULL);
  assert_true(id > 0);
  run_until(fx, &fx->done[id], 5000);
  OM_ASSERT_CMP(fx->done[id], ==, 1);
  OM_ASSERT_CMP(fx->status[id], ==, 200);
  assert_string_equal(fx->body[id], "300000");
  fx_free(fx);
}

static void bodiless_answer_is_one_headers_frame(void **state) {
  fx_t *fx = fx_new(1);
  int32_t id;
  (void)state;
  client_new(fx);
  id = get(fx, "/trailer");
  run_until(fx, &fx->done[id], 3000);
  OM_ASSERT_CMP(fx->headers_end[id], ==, 1);
  OM_ASSERT_CMP(fx->data_frames[id], ==, 0);
  OM_ASSERT_CMP(fx->status[id], ==, 200);
  fx_free(fx);
}

static void rapid_reset_gets_enhance_your_calm(void **state) {
  fx_t *fx = fx_new(1);
  int i;
  (void)state;
  client_new(fx);
  for (i = 0; i < 300 && !fx->got_goaway; i++) {
    int32_t id = get(fx, "/hold");
    /* HEADERS out first: a reset before them would cancel both */
    client_step(fx, 0);
    nghttp2_submit_rst_stream(fx->cs, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
  }
  run_until(fx, &fx->got_goaway, 3000);
  OM_ASSERT_CMP(fx->got_goaway, ==, 1);
  OM_ASSERT_CMP(fx->goaway, ==, NGHTTP2_ENHANCE_YOUR_CALM);
  OM_ASSERT_CMP(om_http_server_metrics(fx->srv)->h2_rapid_reset, ==, 1);
  OM_ASSERT_CMP(om_http_server_metrics(fx->srv)->h2_resets, >, 100);
  for (i = 0; i < fx->n_held; i++) /* the holder ends what it was given */
    om_http_response_abort(fx->held[i]);
  fx->n_held = 0;
  fx_free(fx);
}

static void without_http2_the_preface_is_505(void **state) {
  fx_t *fx = fx_new(0);
  htc_t *c = htc_new("127.0.0.1", fx->port);
  uint64_t t0;
  (void)state;
  assert_int_equal(htc_sends(&fx->loop, c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
                   0);
  t0 = htc_now_ms();
  while (c->len < 12 && htc_now_ms() - t0 < 3000)
    htc_step(&fx->loop, c, 1);
  c->buf[c->len < HTC_BUF ? c->len : HTC_BUF - 1] = 0;
  OM_ASSERT_PREFIX(c->buf, "HTTP/1.1 505");
  htc_free(c);
  fx_free(fx);
}

/* A producer waiting for its output to drain hears of it even when the
 * socket takes every byte at once (no write is left to complete): the
 * holder writes, asks for the drain, and writes the rest from there, as
 * the proxy does with an upstream body. */
static char chunk[20000];

static void on_drained(om_http_request_t *req) {
  F->drained++;
  assert_int_equal(om_http_response_write(req, chunk, sizeof chunk), 0);
  assert_int_equal(om_http_response_end(req), 0);
}

static void drain_fires_when_the_socket_took_everything(void **state) {
  fx_t *fx = fx_new(1);
  int32_t id;
  uint64_t t0;
  int i;
  (void)state;
  memset(chunk, 'x', sizeof chunk);
  client_new(fx);
  id = get(fx, "/hold");
  t0 = htc_now_ms();
  while (fx->n_held < 1 && htc_now_ms() - t0 < 3000)
    client_step(fx, 1);
  OM_ASSERT_CMP(fx->n_held, ==, 1);
  /* the SETTINGS acknowledgement and all else the client owes, read now:
   * nothing from the client may wake the server later */
  for (i = 0; i < 5; i++)
    client_step(fx, 10);
  assert_int_equal(om_http_response_start(fx->held[0], 200, NULL, 0), 0);
  assert_int_equal(om_http_response_write(fx->held[0], chunk, sizeof chunk), 0);
  /* the bytes are still ours, not the socket's: the drain is owed */
  assert_int_equal(om_http_response_on_drain(fx->held[0], 0, on_drained), 0);
  run_until(fx, &fx->done[id], 3000);
  OM_ASSERT_CMP(fx->drained, ==, 1);
  OM_ASSERT_CMP(fx->done[id], ==, 1);
  OM_ASSERT_CMP(fx->data_bytes[id], ==, 2 * sizeof chunk);
  fx_free(fx);
}

static int close_calls;
static void count_close(om_http_request_t *req) {
  (void)req;
  close_calls++;
}

/* om_http_response_end on a response never started releases the request
 * (whatever it returns, as om_http_server.h says): the client's stream is
 * reset rather than left waiting, and when the connection goes later the
 * holder's on_close is not called for a request it has already let go
 * (it was: a proxy call freed after its upstream ended was then called
 * back, a use after free under h2load). */
static void end_without_start_releases(void **state) {
  fx_t *fx = fx_new(1);
  int32_t id;
  uint64_t t0;
  (void)state;
  client_new(fx);
  id = get(fx, "/hold");
  run_until(fx, &fx->n_held, 3000);
  OM_ASSERT_CMP(fx->n_held, ==, 1);
  close_calls = 0;
  OM_ASSERT_CMP(om_http_request_on_close(fx->held[0], count_close), ==, 0);
  OM_ASSERT_CMP(om_http_response_end(fx->held[0]), ==, OM_ESTATE);
  fx->n_held = 0;
  run_until(fx, &fx->reset[id], 3000);
  OM_ASSERT_CMP(fx->reset[id], ==, 1);
  htc_free(fx->c);
  fx->c = NULL;
  t0 = htc_now_ms();
  while (om_http_server_metrics(fx->srv)->connections_active > 0 &&
         htc_now_ms() - t0 < 3000)
    uv_run(&fx->loop, UV_RUN_NOWAIT);
  OM_ASSERT_CMP(om_http_server_metrics(fx->srv)->connections_active, ==, 0);
  OM_ASSERT_CMP(close_calls, ==, 0);
  fx_free(fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(preface_makes_a_stream_a_request),
      cmocka_unit_test(streams_multiplex_out_of_order),
      cmocka_unit_test(paused_upload_stops_at_the_window),
      cmocka_unit_test(paused_upload_resumes_whole),
      cmocka_unit_test(bodiless_answer_is_one_headers_frame),
      cmocka_unit_test(rapid_reset_gets_enhance_your_calm),
      cmocka_unit_test(without_http2_the_preface_is_505),
      cmocka_unit_test(drain_fires_when_the_socket_took_everything),
      cmocka_unit_test(end_without_start_releases),
  };
  signal(SIGPIPE, SIG_IGN); /* libuv writes with writev */
  return cmocka_run_group_tests(tests, NULL, NULL);
}
