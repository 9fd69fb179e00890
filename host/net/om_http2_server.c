/*
 * om_http2_server.c: HTTP/2 (RFC 9113) on the HTTP server's connections,
 * with nghttp2 driven from the libuv loop (see om_http_server.h, "HTTP/2").
 *
 * A connection becomes HTTP/2 when its first bytes are the client preface
 * (prior knowledge, h2c) or when TLS selected "h2" by ALPN; from then on
 * the bytes the server reads (decrypted for TLS) go to
 * nghttp2_session_mem_recv and what nghttp2_session_mem_send produces is
 * written through the connection's send path (encrypted for TLS).
 *
 * Each stream is a request that the holder sees through the same
 * om_http_request_t interface as an HTTP/1.1 request: the public
 * om_http_* functions hand a request whose version_major is 2 to the
 * om__http2_* functions here. The holder's callbacks (on_request, body
 * spans, on_close, on_drain) never run inside an nghttp2 callback nor
 * inside an om_http_* call: nghttp2 callbacks only record, and the pump
 * (after a read, from the server's check phase, after a write) delivers.
 *
 * Memory: a request body is copied out of the DATA frames into the
 * stream's buffer and handed to the holder from there; the stream's
 * receive window is given back (nghttp2_session_consume) only as the
 * holder takes the bytes, so a paused holder holds at most one window
 * (64 KiB) per stream and the connection window (1 MiB) per connection.
 * Output: the holder's bytes wait in the stream's buffer until nghttp2
 * pulls them into DATA frames; frames are produced only while the
 * connection's write queue is under H2_OUT_HIGH, and reading stops while
 * it is over, so a client that does not read cannot grow our memory.
 *
 * Limits, each counted in om_http_server_metrics_t: concurrent streams
 * (SETTINGS_MAX_CONCURRENT_STREAMS; nghttp2 refuses the extra ones with
 * REFUSED_STREAM), the header list (max_header_bytes, max_headers:
 * answered 431 on the stream), CONTINUATION frames per header block
 * (nghttp2's bound), RST_STREAM per connection per second (over
 * H2_MAX_RESETS_PER_SEC: GOAWAY ENHANCE_YOUR_CALM and the connection
 * closes once it is sent: the "rapid reset" attack), and GOAWAY when the
 * server drains.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nghttp2/nghttp2.h>

#include "om_errno.h"
#include "om_http_chars.h"
#include "om_http_server_internal.h"
#include "om_list.h"
#include "om_log.h"

#define H2_MAX_STREAMS 100u
#define H2_STREAM_WINDOW 65535u
#define H2_CONN_WINDOW (1u << 20)
#define H2_OUT_HIGH (64u * 1024u) /* queued output past which we wait */
#define H2_MAX_RESETS_PER_SEC 100u
#define H2_MAX_CONTINUATIONS 8u

typedef struct h2s_s h2s_t;

typedef struct om_http2_s {
  conn_t *c;
  nghttp2_session *ss;
  om_list_t streams; /* every h2s_t attached, by link */
  uint64_t rst_sec;  /* the second rst_count counts in */
  unsigned rst_count;
  unsigned in_pump : 1, pump_again : 1, draining : 1, calm : 1, dead : 1;
} h2_t;

struct h2s_s {
  om_http_request_t pub; /* first: the holder's pointer is ours */
  h2_t *h;               /* NULL once the connection is gone */
  int32_t id;
  om_list_t link;
  /* the head as it arrives: strings in arena, headers as offsets until
   * dispatch fixes them up */
  char *arena;
  size_t arena_len, arena_cap;
  om_http_header_t *hdrs;
  size_t n_hdrs, cap_hdrs, hdr_bytes;
  long off_method, off_path, off_authority;
  size_t len_method, len_path, len_authority;
  /* the request body: bytes not yet handed to the holder */
  char *in;
  size_t in_off, in_len, in_cap;
  uint64_t in_total, discarded;
  om_http_body_fn on_body;
  om_http_body_end_fn on_body_end;
  /* the response: bytes nghttp2 has not pulled yet */
  char *out;
  size_t out_off, out_len, out_cap;
  uint64_t resp_left;
  /* trailer fields to send when the body is out (one block: the nv array,
   * then the lower-cased names and the values) */
  nghttp2_nv *tnv;
  size_t tn;
  om_http_close_fn on_close;
  om_http_drain_fn on_drain;
  size_t drain_low;
  /* head_done: the header block ended; ready: to be dispatched; held:
   * the holder has the request; started / ended: the response; closed:
   * nghttp2 closed the stream; notified: on_close ran or is not owed */
  unsigned head_done : 1, ready : 1, held : 1, started : 1, out_ended : 1,
      deferred : 1, closed : 1, in_ended : 1, body_on : 1, body_paused : 1,
      end_told : 1, too_large : 1, is_head : 1, has_cl : 1, in_close_cb : 1,
      bad : 1;
};

static void h2_pump(h2_t *h);

/* ------------------------------------------------------------------ */
/* streams */

static h2s_t *stream_of(const om_http_request_t *req) {
  return (h2s_t *)req;
}

static void stream_free(h2s_t *st) {
  if (st->h != NULL)
    om_list_remove(&st->link);
  free(st->arena);
  free(st->hdrs);
  free(st->in);
  free(st->out);
  free(st->tnv);
  free(st);
}

static int arena_put(h2s_t *st, const uint8_t *p, size_t n, long *off) {
  if (st->arena_len + n + 1 > st->arena_cap) {
    size_t cap = st->arena_cap ? st->arena_cap * 2 : 512;
    char *na;
    while (cap < st->arena_len + n + 1)
      cap *= 2;
    na = realloc(st->arena, cap);
    if (na == NULL)
      return OM_ENOMEM;
    st->arena = na;
    st->arena_cap = cap;
  }
  memcpy(st->arena + st->arena_len, p, n);
  st->arena[st->arena_len + n] = 0;
  *off = (long)st->arena_len;
  st->arena_len += n + 1;
  return 0;
}

static int buf_append(char **b, size_t *off, size_t *len, size_t *cap,
                      const char *data, size_t n) {
  if (*off > 0 && *off == *len)
    *off = *len = 0;
  if (*len + n > *cap) {
    size_t nc = *cap ? *cap : 4096;
    char *nb;
    if (*off > 0) { /* compact first */
      memmove(*b, *b + *off, *len - *off);
      *len -= *off;
      *off = 0;
    }
    while (nc < *len + n)
      nc *= 2;
    if (nc != *cap) {
      nb = realloc(*b, nc);
      if (nb == NULL)
        return OM_ENOMEM;
      *b = nb;
      *cap = nc;
    }
  }
  memcpy(*b + *len, data, n);
  *len += n;
  return 0;
}

/* The request's strings, fixed up to pointers once the arena is final. */
static int stream_finish_head(h2s_t *st) {
  om_http_request_t *q = &st->pub;
  size_t i, host = SIZE_MAX;
  const char *qm;
  if (st->off_method < 0 || st->off_path < 0)
    return OM_EINVAL;
  for (i = 0; i < st->n_hdrs; i++)
    if (st->hdrs[i].name_len == 4 &&
        memcmp(st->arena + (size_t)st->hdrs[i].name, "host", 4) == 0)
      host = i;
  if (host == SIZE_MAX && st->off_authority >= 0) {
    /* RFC 9113 8.3.1: :authority stands for Host; an HTTP/1.1 holder (and
     * upstream) reads Host */
    long noff;
    if (arena_put(st, (const uint8_t *)"host", 4, &noff) != 0)
      return OM_ENOMEM;
    if (st->n_hdrs == st->cap_hdrs) {
      size_t cap = st->cap_hdrs ? st->cap_hdrs * 2 : 8;
      om_http_header_t *nh = realloc(st->hdrs, cap * sizeof *nh);
      if (nh == NULL)
        return OM_ENOMEM;
      st->hdrs = nh;
      st->cap_hdrs = cap;
    }
    st->hdrs[st->n_hdrs].name = (const char *)(uintptr_t)noff;
    st->hdrs[st->n_hdrs].name_len = 4;
    st->hdrs[st->n_hdrs].value = (const char *)(uintptr_t)st->off_authority;
    st->hdrs[st->n_hdrs].value_len = st->len_authority;
    st->n_hdrs++;
  }
  for (i = 0; i < st->n_hdrs; i++) {
    st->hdrs[i].name = st->arena + (uintptr_t)st->hdrs[i].name;
    st->hdrs[i].value = st->arena + (uintptr_t)st->hdrs[i].value;
  }
  q->headers = st->hdrs;
  q->n_headers = st->n_hdrs;
  q->method = st->arena + st->off_method;
  q->method_len = st->len_method;
  q->target = st->arena + st->off_path;
  q->target_len = st->len_path;
  q->path = q->target;
  q->path_len = q->target_len;
  qm = memchr(q->target, '?', q->target_len);
  if (qm != NULL) {
    q->path_len = (size_t)(qm - q->target);
    q->query = qm + 1;
    q->query_len = q->target_len - q->path_len - 1;
  }
  /* the target goes on an HTTP/1.1 request line: only what RFC 3986
   * allows there, origin-form or "*" */
  if (q->target_len == 0 ||
      (q->target[0] != '/' && !(q->target_len == 1 && q->target[0] == '*')))
    return OM_EINVAL;
  for (i = 0; i < q->target_len; i++) {
    unsigned ch = (unsigned char)q->target[i];
    if (ch <= 0x20 || ch >= 0x7f || ch == '#')
      return OM_EINVAL;
  }
  for (i = 0; i < q->method_len; i++)
    if (!om__http_is_tchar((unsigned char)q->method[i]))
      return OM_EINVAL;
  st->is_head = q->method_len == 4 && memcmp(q->method, "HEAD", 4) == 0;
  return 0;
}

/* ------------------------------------------------------------------ */
/* nghttp2 callbacks: they record; the pump acts */

static ssize_t cb_send(nghttp2_session *ss, const uint8_t *data, size_t len,
                       int flags, void *ud) {
  (void)ss;
  (void)data;
  (void)len;
  (void)flags;
  (void)ud;
  return NGHTTP2_ERR_CALLBACK_FAILURE; /* mem_send only */
}

static int cb_begin_headers(nghttp2_session *ss, const nghttp2_frame *f,
                            void *ud) {
  h2_t *h = ud;
  h2s_t *st;
  if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
    return 0;
  st = calloc(1, sizeof *st);
  if (st == NULL)
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  st->h = h;
  st->id = f->hd.stream_id;
  st->off_method = st->off_path = st->off_authority = -1;
  st->pub.version_major = 2;
  st->pub.version_minor = 0;
  st->pub.body = "";
  st->pub.body_error = -1;
  st->pub.remote = h->c->remote;
  memcpy(st->pub.remote_ip, h->c->remote_ip, sizeof st->pub.remote_ip);
  st->pub.remote_port = h->c->remote_port;
  om_list_push_back(&h->streams, &st->link);
  nghttp2_session_set_stream_user_data(ss, st->id, st);
  h->c->srv->m.h2_streams++;
  return 0;
}

static int cb_header(nghttp2_session *ss, const nghttp2_frame *f,
                     const uint8_t *name, size_t nl, const uint8_t *value,
                     size_t vl, uint8_t flags, void *ud) {
  h2_t *h = ud;
  const om_http_server_opts_t *o = &h->c->srv->o;
  h2s_t *st = nghttp2_session_get_stream_user_data(ss, f->hd.stream_id);
  long noff, voff;
  (void)flags;
  if (st == NULL || st->head_done || f->hd.type != NGHTTP2_HEADERS)
    return 0; /* trailers of a request body: checked by nghttp2, dropped */
  st->hdr_bytes += nl + vl + 32; /* RFC 9113 6.5.2's accounting */
  if (st->too_large || st->hdr_bytes > o->max_header_bytes ||
      st->n_hdrs >= o->max_headers) {
    st->too_large = 1; /* answered 431 once the block ends */
    return 0;
  }
  if (nl > 0 && name[0] == ':') {
    long *off = NULL;
    size_t *len = NULL;
    if (nl == 7 && memcmp(name, ":method", 7) == 0) {
      off = &st->off_method;
      len = &st->len_method;
    } else if (nl == 5 && memcmp(name, ":path", 5) == 0) {
      off = &st->off_path;
      len = &st->len_path;
    } else if (nl == 10 && memcmp(name, ":authority", 10) == 0) {
      off = &st->off_authority;
      len = &st->len_authority;
    }
    if (off == NULL)
      return 0; /* :scheme: nghttp2 checked it */
    if (arena_put(st, value, vl, off) != 0)
      return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    *len = vl;
    return 0;
  }
  if (arena_put(st, name, nl, &noff) != 0 ||
      arena_put(st, value, vl, &voff) != 0)
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  if (st->n_hdrs == st->cap_hdrs) {
    size_t cap = st->cap_hdrs ? st->cap_hdrs * 2 : 16;
    om_http_header_t *nh = realloc(st->hdrs, cap * sizeof *nh);
    if (nh == NULL)
      return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    st->hdrs = nh;
    st->cap_hdrs = cap;
  }
  st->hdrs[st->n_hdrs].name = (const char *)(uintptr_t)noff;
  st->hdrs[st->n_hdrs].name_len = nl;
  st->hdrs[st->n_hdrs].value = (const char *)(uintptr_t)voff;
  st->hdrs[st->n_hdrs].value_len = vl;
  st->n_hdrs++;
  return 0;
}

/* One more RST_STREAM from the client: past the bound in a second, the
 * connection is told to calm down and closes. */
static void count_reset(h2_t *h) {
  om_http_server_t *s = h->c->srv;
  uint64_t sec = om__http_now_ms(h->c) / 1000;
  s->m.h2_resets++;
  if (sec != h->rst_sec) {
    h->rst_sec = sec;
    h->rst_count = 0;
  }
  if (++h->rst_count > H2_MAX_RESETS_PER_SEC && !h->calm) {
    h->calm = 1;
    s->m.h2_rapid_reset++;
    om_log(OM_LOG_WARN, "http2_rapid_reset", "remote", h->c->remote_ip, NULL);
    nghttp2_session_terminate_session(h->ss, NGHTTP2_ENHANCE_YOUR_CALM);
  }
}

static int cb_frame_recv(nghttp2_session *ss, const nghttp2_frame *f,
                         void *ud) {
  h2_t *h = ud;
  h2s_t *st = nghttp2_session_get_stream_user_data(ss, f->hd.stream_id);
  if (f->hd.type == NGHTTP2_RST_STREAM) {
    count_reset(h);
    return 0;
  }
  if (st == NULL)
    return 0;
  if (f->hd.type == NGHTTP2_HEADERS && !st->head_done &&
      f->headers.cat == NGHTTP2_HCAT_REQUEST) {
    st->head_done = 1;
    st->ready = 1;
    if (f->hd.flags & NGHTTP2_FLAG_END_STREAM)
      st->in_ended = 1;
  } else if ((f->hd.type == NGHTTP2_DATA || f->hd.type == NGHTTP2_HEADERS) &&
             (f->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
    st->in_ended = 1;
  }
  return 0;
}

static int cb_data_chunk(nghttp2_session *ss, uint8_t flags, int32_t id,
                         const uint8_t *data, size_t len, void *ud) {
  h2s_t *st = nghttp2_session_get_stream_user_data(ss, id);
  (void)flags;
  (void)ud;
  if (st == NULL || st->bad || st->too_large || (!st->held && st->started)) {
    /* nobody will read it: give the window back at once. After a
     * complete response RFC 9113 8.1 allows a reset of the rest of the
     * upload; it comes only past DISCARD_MAX because some clients (curl
     * 7.88) read a reset right behind the response as a failure */
    nghttp2_session_consume(ss, id, len);
    if (st != NULL && st->discarded <= DISCARD_MAX &&
        (st->discarded += len) > DISCARD_MAX && !st->closed)
      nghttp2_submit_rst_stream(ss, NGHTTP2_FLAG_NONE, id, NGHTTP2_NO_ERROR);
    return 0;
  }
  if (buf_append(&st->in, &st->in_off, &st->in_len, &st->in_cap,
                 (const char *)data, len) != 0) {
    nghttp2_submit_rst_stream(ss, NGHTTP2_FLAG_NONE, id,
                              NGHTTP2_INTERNAL_ERROR);
    nghttp2_session_consume(ss, id, len);
    return 0;
  }
  st->in_total += len;
  return 0;
}

static int cb_stream_close(nghttp2_session *ss, int32_t id, uint32_t code,
                           void *ud) {
  h2s_t *st = nghttp2_session_get_stream_user_data(ss, id);
  (void)code;
  (void)ud;
  if (st == NULL)
    return 0;
  /* bytes never handed over go back to the connection window */
  if (st->in_len > st->in_off)
    nghttp2_session_consume_connection(ss, st->in_len - st->in_off);
  st->in_off = st->in_len = 0;
  st->closed = 1;
  nghttp2_session_set_stream_user_data(ss, id, NULL);
  return 0;
}

static int cb_frame_send(nghttp2_session *ss, const nghttp2_frame *f,
                         void *ud) {
  h2_t *h = ud;
  (void)ss;
  if (f->hd.type == NGHTTP2_RST_STREAM &&
      f->rst_stream.error_code == NGHTTP2_REFUSED_STREAM)
    h->c->srv->m.h2_refused++;
  return 0;
}

/* The body is out: END_STREAM on the last DATA frame, or on the
 * trailers' HEADERS when there are trailers. */
static void data_eof(nghttp2_session *ss, h2s_t *st, uint32_t *flags) {
  *flags |= NGHTTP2_DATA_FLAG_EOF;
  if (st->tnv != NULL &&
      nghttp2_submit_trailer(ss, st->id, st->tnv, st->tn) == 0)
    *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
  free(st->tnv);
  st->tnv = NULL;
}

static ssize_t cb_data_read(nghttp2_session *ss, int32_t id, uint8_t *buf,
                            size_t length, uint32_t *flags,
                            nghttp2_data_source *src, void *ud) {
  h2s_t *st = src->ptr;
  size_t avail = st->out_len - st->out_off, n;
  (void)id;
  (void)ud;
  if (avail == 0) {
    if (st->out_ended) {
      data_eof(ss, st, flags);
      return 0;
    }
    st->deferred = 1;
    return NGHTTP2_ERR_DEFERRED;
  }
  n = avail < length ? avail : length;
  memcpy(buf, st->out + st->out_off, n);
  st->out_off += n;
  if (st->out_off == st->out_len) {
    st->out_off = st->out_len = 0;
    if (st->out_ended)
      data_eof(ss, st, flags);
  }
  return (ssize_t)n;
}

/* ------------------------------------------------------------------ */
/* the connection */

int om__http2_take(conn_t *c) {
  nghttp2_session_callbacks *cbs;
  nghttp2_option *opt;
  nghttp2_settings_entry iv[3];
  h2_t *h = calloc(1, sizeof *h);
  int rc;
  if (h == NULL)
    return OM_ENOMEM;
  om_list_init(&h->streams);
  h->c = c;
  if (nghttp2_session_callbacks_new(&cbs) != 0) {
    free(h);
    return OM_ENOMEM;
  }
  nghttp2_session_callbacks_set_send_callback(cbs, cb_send);
  nghttp2_session_callbacks_set_on_begin_headers_callback(cbs,
                                                          cb_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(cbs, cb_header);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, cb_frame_recv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, cb_data_chunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs, cb_stream_close);
  nghttp2_session_callbacks_set_on_frame_send_callback(cbs, cb_frame_send);
  if (nghttp2_option_new(&opt) != 0) {
    nghttp2_session_callbacks_del(cbs);
    free(h);
    return OM_ENOMEM;
  }
  nghttp2_option_set_no_auto_window_update(opt, 1);
  nghttp2_option_set_max_continuations(opt, H2_MAX_CONTINUATIONS);
  rc = nghttp2_session_server_new2(&h->ss, cbs, h, opt);
  nghttp2_option_del(opt);
  nghttp2_session_callbacks_del(cbs);
  if (rc != 0) {
    free(h);
    return OM_ENOMEM;
  }
  iv[0].settings_id = NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS;
  iv[0].value = H2_MAX_STREAMS;
  iv[1].settings_id = NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE;
  iv[1].value = (uint32_t)c->srv->o.max_header_bytes;
  iv[2].settings_id = NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE;
  iv[2].value = H2_STREAM_WINDOW;
  if (nghttp2_submit_settings(h->ss, NGHTTP2_FLAG_NONE, iv, 3) != 0 ||
      nghttp2_session_set_local_window_size(h->ss, NGHTTP2_FLAG_NONE, 0,
                                            H2_CONN_WINDOW) != 0) {
    nghttp2_session_del(h->ss);
    free(h);
    return OM_ENOMEM;
  }
  c->h2 = h;
  c->phase = PH_H2;
  c->fresh = 0;
  c->hstart_set = 0;
  c->t_idle = om__http_now_ms(c);
  c->srv->m.h2_connections++;
  return 0;
}

/* Bytes of this connection not yet taken by the kernel. */
static size_t conn_pending(const conn_t *c) {
  if (c->phase == PH_CLOSING)
    return 0;
  return c->ob_len +
         uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp);
}

void om__http2_on_read(conn_t *c) {
  h2_t *h = c->h2;
  size_t avail = c->in_len - c->in_off;
  ssize_t n;
  if (h == NULL || h->dead || avail == 0)
    return;
  n = nghttp2_session_mem_recv(h->ss, (const uint8_t *)c->in + c->in_off,
                               avail);
  c->in_off = c->in_len = 0;
  if (n < 0) {
    c->srv->m.h2_protocol_errors++;
    if (n == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS)
      c->srv->m.h2_continuation_flood++;
    om_log(OM_LOG_INFO, "http2_protocol_error", "remote", c->remote_ip, "error",
           nghttp2_strerror((int)n), NULL);
    /* nghttp2 queued a GOAWAY for a protocol error: send it, then close */
    h->dead = 1;
  }
  h2_pump(h);
}

int om__http2_want_read(const conn_t *c) {
  const h2_t *h = c->h2;
  return h != NULL && !h->dead && nghttp2_session_want_read(h->ss) &&
         conn_pending(c) < H2_OUT_HIGH;
}

int om__http2_idle(const conn_t *c) {
  return c->h2 != NULL && om_list_empty(&c->h2->streams);
}

/* Produce frames while the socket keeps up. They are corked
 * (om__http_conn_write: gathered up to OB_CAP, flushed from the loop's
 * check phase, larger ones written behind what is gathered), so the
 * frames every stream of a loop iteration produced leave in one write:
 * nghttp2 hands out one frame per mem_send, and a write each cost two to
 * three write(2) per request under 100 concurrent streams. */
static void h2_send(h2_t *h) {
  conn_t *c = h->c;
  while (c->phase == PH_H2 && conn_pending(c) < H2_OUT_HIGH) {
    const uint8_t *data;
    ssize_t n = nghttp2_session_mem_send(h->ss, &data);
    uv_buf_t b;
    if (n < 0) {
      om__http_conn_fail(c);
      return;
    }
    if (n == 0)
      return;
    b = uv_buf_init((char *)data, (unsigned)n);
    if (om__http_conn_write(c, &b, 1) != 0)
      return;
  }
}

static void deliver_body(h2s_t *st) {
  h2_t *h = st->h;
  while (st->h != NULL && st->held && st->body_on && !st->body_paused &&
         !st->in_close_cb && st->in_len > st->in_off) {
    size_t n = st->in_len - st->in_off;
    const char *p = st->in + st->in_off;
    st->in_off = st->in_len = 0; /* the holder may pause inside */
    /* the buffer stays ours during the call: appends only happen in
     * mem_recv, never inside a holder callback */
    if (!st->closed)
      nghttp2_session_consume(h->ss, st->id, n);
    st->on_body(&st->pub, p, n);
  }
  if (st->h != NULL && st->held && st->body_on && !st->body_paused &&
      st->in_ended && st->in_len == st->in_off && !st->end_told &&
      !st->in_close_cb) {
    st->end_told = 1;
    st->on_body_end(&st->pub);
  }
}

static void refuse_stream(h2s_t *st, int status, const char *body);

/* Run the holder's side of every stream: dispatch, body, close, drain. */
static void h2_pump(h2_t *h) {
  conn_t *c = h->c;
  om_http_server_t *s = c->srv;
  if (h->in_pump) {
    h->pump_again = 1;
    return;
  }
  h->in_pump = 1;
  do {
    h->pump_again = 0;
    OM_LIST_FOREACH_SAFE(it, &h->streams) {
      h2s_t *st = OM_LIST_ENTRY(it, h2s_t, link);
      if (c->phase != PH_H2)
        break;
      if (st->ready) {
        st->ready = 0;
        if (st->too_large) {
          s->m.h2_headers_too_large++;
          s->m.rejected[OM_HTTP_REJECT_HEADERS_TOO_LARGE]++;
          refuse_stream(st, 431, "{\"error\":\"headers_too_large\"}");
        } else if (stream_finish_head(st) != 0) {
          st->bad = 1;
          s->m.rejected[OM_HTTP_REJECT_BAD_TARGET]++;
          refuse_stream(st, 400, "{\"error\":\"bad_target\"}");
        } else if (!st->closed && !h->draining) {
          const char *cl =
              om_http_request_header(&st->pub, "content-length", NULL);
          /* a body that came whole with its head (a gRPC unary call:
           * HEADERS and one DATA frame) is streamed like any other, from
           * the stream's buffer, its length then known */
          int whole = st->in_ended;
          size_t have = st->in_len - st->in_off;
          st->pub.body_streamed = !whole || have > 0;
          st->pub.content_length =
              whole ? (int64_t)have : (cl != NULL ? strtoll(cl, NULL, 10) : -1);
          st->held = 1;
          s->m.requests++;
          s->on_request(&st->pub, s->ud);
          h->pump_again = 1;
        }
      }
      if (st->held)
        deliver_body(st);
      if (st->held && st->closed && !(st->started && st->out_ended) &&
          !st->in_close_cb) {
        /* the client reset the stream (or the session ended it) before
         * the response ended */
        s->m.responses_aborted++;
        if (st->on_close != NULL) {
          st->in_close_cb = 1;
          st->on_close(&st->pub);
          st->held = 0;
        } else {
          /* orphaned: the holder's next call releases it */
          om_list_remove(&st->link);
          st->h = NULL;
          continue;
        }
      }
      if (st->held && st->on_drain != NULL && st->started &&
          st->out_len - st->out_off + conn_pending(c) <= st->drain_low) {
        om_http_drain_fn cb = st->on_drain;
        st->on_drain = NULL;
        cb(&st->pub);
      }
    }
    if (c->phase != PH_H2)
      break;
    h2_send(h);
    /* reap what neither side needs any more; a drain owed now (the
     * socket may have taken every frame at once, so no write completes
     * to pump again) runs on the next round */
    OM_LIST_FOREACH_SAFE(it, &h->streams) {
      h2s_t *st = OM_LIST_ENTRY(it, h2s_t, link);
      if (st->closed && !st->held)
        stream_free(st);
      else if (st->held && st->on_drain != NULL && st->started &&
               st->out_len - st->out_off + conn_pending(c) <= st->drain_low)
        h->pump_again = 1;
    }
  } while (h->pump_again && c->phase == PH_H2);
  h->in_pump = 0;
  if (c->phase != PH_H2)
    return;
  if (!om_list_empty(&h->streams))
    c->t_idle = om__http_now_ms(c);
  if (!nghttp2_session_want_read(h->ss) && !nghttp2_session_want_write(h->ss)) {
    om__http_conn_finish(c, 1); /* GOAWAY sent and every stream done */
    return;
  }
  if (h->dead && !nghttp2_session_want_write(h->ss)) {
    om__http_conn_finish(c, 1);
    return;
  }
  om__http_conn_update(c);
}

void om__http2_pump(conn_t *c) {
  if (c->h2 != NULL && c->phase == PH_H2)
    h2_pump(c->h2);
}

/* Ask for the pump from the loop: API calls only record. */
static void schedule(h2_t *h) {
  if (h != NULL && h->c->phase == PH_H2)
    om__http_conn_mark_dirty(h->c);
}

void om__http2_drain(conn_t *c) {
  h2_t *h = c->h2;
  if (h == NULL || h->draining)
    return;
  h->draining = 1;
  c->srv->m.h2_goaway_drain++;
  nghttp2_submit_goaway(h->ss, NGHTTP2_FLAG_NONE,
                        nghttp2_session_get_last_proc_stream_id(h->ss),
                        NGHTTP2_NO_ERROR, NULL, 0);
  schedule(h); /* from the loop: this runs inside om_http_server_close */
}

void om__http2_close(conn_t *c) {
  h2_t *h = c->h2;
  if (h == NULL)
    return;
  c->h2 = NULL;
  OM_LIST_FOREACH_SAFE(it, &h->streams) {
    h2s_t *st = OM_LIST_ENTRY(it, h2s_t, link);
    om_list_remove(&st->link);
    st->h = NULL;
    if (!st->held || st->in_close_cb) {
      if (!st->in_close_cb)
        stream_free(st);
      continue;
    }
    if (!(st->started && st->out_ended))
      c->srv->m.responses_aborted++;
    if (st->on_close != NULL) {
      st->in_close_cb = 1;
      st->on_close(&st->pub);
      stream_free(st);
    } /* else orphaned: the holder's next call releases it */
  }
  nghttp2_session_del(h->ss);
  free(h);
}

conn_t *om__http2_conn_of(const om_http_request_t *req) {
  const h2s_t *st = stream_of(req);
  return st->h != NULL ? st->h->c : NULL;
}

/* ------------------------------------------------------------------ */
/* responses */

/* The holder is done with st: free it now if the connection is gone,
 * else when nghttp2 closes the stream. */
static void release(h2s_t *st) {
  st->held = 0;
  st->on_close = NULL;
  st->on_drain = NULL;
  if (st->h == NULL) {
    stream_free(st);
    return;
  }
  schedule(st->h);
}

static int is_conn_specific(const char *n, size_t nl) {
  return om__http_ci_eq(n, nl, "connection") ||
         om__http_ci_eq(n, nl, "keep-alive") ||
         om__http_ci_eq(n, nl, "proxy-connection") ||
         om__http_ci_eq(n, nl, "transfer-encoding") ||
         om__http_ci_eq(n, nl, "upgrade");
}

/* Submit the HEADERS of the response; with_body: DATA frames follow from
 * st->out. Names are lower-cased (RFC 9113 8.2.1). */
static int submit_head(h2s_t *st, int status, const om_http_header_t *hdrs,
                       size_t n, const rh_t *rh, int add_cl, uint64_t cl,
                       int with_body) {
  h2_t *h = st->h;
  nghttp2_nv stack_nv[32], *nv = stack_nv;
  char stack_names[2048], *names = stack_names, sbuf[4], clbuf[24];
  size_t names_need = 0, i, k = 0, off = 0;
  nghttp2_data_provider dp;
  int rc;
  for (i = 0; i < n; i++)
    names_need += hdrs[i].name_len ? hdrs[i].name_len : strlen(hdrs[i].name);
  if (n + 3 > sizeof stack_nv / sizeof stack_nv[0])
    nv = malloc((n + 3) * sizeof *nv);
  if (names_need > sizeof stack_names)
    names = malloc(names_need);
  if (nv == NULL || names == NULL) {
    if (nv != stack_nv)
      free(nv);
    if (names != stack_names)
      free(names);
    return OM_ENOMEM;
  }
  snprintf(sbuf, sizeof sbuf, "%03d", status);
  nv[k++] = (nghttp2_nv){(uint8_t *)":status", (uint8_t *)sbuf, 7, 3,
                         NGHTTP2_NV_FLAG_NONE};
  for (i = 0; i < n; i++) {
    size_t nl = hdrs[i].name_len ? hdrs[i].name_len : strlen(hdrs[i].name);
    size_t vl = hdrs[i].value_len ? hdrs[i].value_len : strlen(hdrs[i].value);
    size_t j;
    if (is_conn_specific(hdrs[i].name, nl))
      continue;
    for (j = 0; j < nl; j++) {
      char ch = hdrs[i].name[j];
      names[off + j] = (char)(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch);
    }
    nv[k++] = (nghttp2_nv){(uint8_t *)names + off, (uint8_t *)hdrs[i].value, nl,
                           vl, NGHTTP2_NV_FLAG_NONE};
    off += nl;
  }
  if (!rh->has_date) {
    const char *d = om__http_date(h->c->srv);
    nv[k++] = (nghttp2_nv){(uint8_t *)"date", (uint8_t *)d, 4, strlen(d),
                           NGHTTP2_NV_FLAG_NONE};
  }
  if (add_cl) {
    int m = snprintf(clbuf, sizeof clbuf, "%llu", (unsigned long long)cl);
    nv[k++] = (nghttp2_nv){(uint8_t *)"content-length", (uint8_t *)clbuf, 14,
                           (size_t)m, NGHTTP2_NV_FLAG_NONE};
  }
  dp.source.ptr = st;
  dp.read_callback = cb_data_read;
  rc = nghttp2_submit_response(h->ss, st->id, nv, k, with_body ? &dp : NULL);
  if (nv != stack_nv)
    free(nv);
  if (names != stack_names)
    free(names);
  return rc == 0 ? 0 : OM_EIO;
}

static void refuse_stream(h2s_t *st, int status, const char *body) {
  static const om_http_header_t ct = {"content-type", "application/json", 12,
                                      16};
  rh_t rh;
  size_t len = strlen(body);
  memset(&rh, 0, sizeof rh);
  if (st->closed)
    return;
  if (buf_append(&st->out, &st->out_off, &st->out_len, &st->out_cap, body,
                 len) == 0) {
    st->out_ended = 1;
    st->started = 1;
    (void)submit_head(st, status, &ct, 1, &rh, 1, len, 1);
  }
}

int om__http2_respond(om_http_request_t *req, int status,
                      const om_http_header_t *headers, size_t n,
                      const char *body, size_t len) {
  h2s_t *st = stream_of(req);
  rh_t rh;
  int rc, no_content, with_body;
  if (status < 200 || status > 599 || (len > 0 && body == NULL))
    return OM_EINVAL;
  if (st->started || st->in_close_cb)
    return OM_ESTATE;
  no_content = status == 204 || status == 304;
  if (no_content && len > 0)
    return OM_EINVAL;
  rc = om__http_check_resp_headers(headers, n, 0, 0, &rh);
  if (rc != 0)
    return rc;
  if (st->h == NULL || st->closed || st->h->c->phase != PH_H2) {
    release(st);
    return OM_ESTATE;
  }
  with_body = !st->is_head && !no_content && len > 0;
  if (with_body && buf_append(&st->out, &st->out_off, &st->out_len,
                              &st->out_cap, body, len) != 0) {
    nghttp2_submit_rst_stream(st->h->ss, NGHTTP2_FLAG_NONE, st->id,
                              NGHTTP2_INTERNAL_ERROR);
    release(st);
    return OM_ENOMEM;
  }
  st->started = 1;
  st->out_ended = 1;
  /* no body: HEADERS with END_STREAM, which for gRPC is Trailers-Only */
  rc = submit_head(st, status, headers, n, &rh, !no_content, len, with_body);
  if (rc != 0)
    nghttp2_submit_rst_stream(st->h->ss, NGHTTP2_FLAG_NONE, st->id,
                              NGHTTP2_INTERNAL_ERROR);
  release(st);
  return rc == 0 ? 0 : OM_ESTATE;
}

int om__http2_response_start(om_http_request_t *req, int status,
                             const om_http_header_t *headers, size_t n,
                             int checked) {
  h2s_t *st = stream_of(req);
  rh_t rh;
  int rc, no_body;
  if (status < 200 || status > 599)
    return OM_EINVAL;
  if (st->started || st->in_close_cb)
    return OM_ESTATE;
  rc = om__http_check_resp_headers(headers, n, 1, checked, &rh);
  if (rc != 0)
    return rc;
  if (status == 204 && rh.has_cl)
    return OM_EINVAL;
  if (st->h == NULL || st->closed || st->h->c->phase != PH_H2)
    return OM_ESTATE;
  no_body = st->is_head || status == 204 || status == 304;
  st->has_cl = rh.has_cl && !no_body;
  st->resp_left = rh.cl;
  st->started = 1;
  if (no_body)
    st->out_ended = 0; /* writes dropped; the end sends END_STREAM */
  rc = submit_head(st, status, headers, n, &rh, 0, 0, 1);
  if (rc != 0)
    return OM_ENOMEM;
  st->is_head = no_body ? 1 : 0; /* writes dropped from here on */
  schedule(st->h);
  return 0;
}

int om__http2_response_write(om_http_request_t *req, const char *data,
                             size_t len) {
  h2s_t *st = stream_of(req);
  if (len > 0 && data == NULL)
    return OM_EINVAL;
  if (!st->started || st->out_ended)
    return OM_ESTATE;
  if (len == 0)
    return 0;
  if (st->has_cl && (uint64_t)len > st->resp_left)
    return OM_EINVAL;
  if (st->h == NULL || st->closed || st->h->c->phase != PH_H2)
    return OM_ESTATE;
  if (st->is_head)
    return 0;
  if (buf_append(&st->out, &st->out_off, &st->out_len, &st->out_cap, data,
                 len) != 0)
    return OM_ENOMEM;
  st->resp_left -= st->has_cl ? len : 0;
  if (st->deferred) {
    st->deferred = 0;
    nghttp2_session_resume_data(st->h->ss, st->id);
  }
  schedule(st->h);
  return 0;
}

int om__http2_response_end(om_http_request_t *req) {
  h2s_t *st = stream_of(req);
  int short_body;
  if (st->in_close_cb)
    return OM_ESTATE;
  if (!st->started) {
    /* Nothing was started (the stream closed under a response_start that
     * failed, say): the holder is done with req all the same (the
     * lifetime rule of om_http_server.h), so the stream is reset and
     * released; keeping it held would leave on_close pointing at a holder
     * that is gone. */
    om__http2_response_abort(req);
    return OM_ESTATE;
  }
  if (st->h == NULL || st->closed || st->h->c->phase != PH_H2) {
    release(st);
    return OM_ESTATE;
  }
  short_body = st->has_cl && st->resp_left > 0;
  if (short_body) {
    nghttp2_submit_rst_stream(st->h->ss, NGHTTP2_FLAG_NONE, st->id,
                              NGHTTP2_INTERNAL_ERROR);
    st->h->c->srv->m.responses_aborted++;
  } else {
    st->out_ended = 1;
    if (st->deferred) {
      st->deferred = 0;
      nghttp2_session_resume_data(st->h->ss, st->id);
    }
  }
  release(st);
  return short_body ? OM_ESTATE : 0;
}

int om__http2_response_end_trailers(om_http_request_t *req,
                                    const om_http_header_t *t, size_t n) {
  h2s_t *st = stream_of(req);
  size_t bytes = 0, k = 0, i;
  char *w;
  if (n > 0 && t == NULL)
    return OM_EINVAL;
  for (i = 0; i < n; i++)
    bytes += (t[i].name_len ? t[i].name_len : strlen(t[i].name)) +
             (t[i].value_len ? t[i].value_len : strlen(t[i].value));
  if (n > 0 && st->started && !st->out_ended && !st->is_head &&
      st->tnv == NULL) {
    st->tnv = malloc(n * sizeof *st->tnv + bytes);
    if (st->tnv == NULL) {
      om__http2_response_abort(req);
      return OM_ENOMEM;
    }
    w = (char *)(st->tnv + n);
    for (i = 0; i < n; i++) {
      size_t nl = t[i].name_len ? t[i].name_len : strlen(t[i].name);
      size_t vl = t[i].value_len ? t[i].value_len : strlen(t[i].value);
      if (!om__http_trailer_ok(t[i].name, nl, t[i].value, vl))
        continue;
      for (size_t j = 0; j < nl; j++) {
        char ch = t[i].name[j];
        w[j] = (char)(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch);
      }
      memcpy(w + nl, t[i].value, vl);
      st->tnv[k++] = (nghttp2_nv){(uint8_t *)w, (uint8_t *)w + nl, nl, vl,
                                  NGHTTP2_NV_FLAG_NONE};
      w += nl + vl;
    }
    st->tn = k;
    if (k == 0) {
      free(st->tnv);
      st->tnv = NULL;
    }
  }
  return om__http2_response_end(req);
}

void om__http2_response_abort(om_http_request_t *req) {
  h2s_t *st = stream_of(req);
  if (st->in_close_cb)
    return;
  if (st->h != NULL && !st->closed) {
    /* RST_STREAM: the client sees an incomplete response, not an end */
    nghttp2_submit_rst_stream(st->h->ss, NGHTTP2_FLAG_NONE, st->id,
                              NGHTTP2_INTERNAL_ERROR);
    st->h->c->srv->m.responses_aborted++;
    st->in_ended = 1; /* no second reset from release */
  }
  release(st);
}

size_t om__http2_response_pending(const om_http_request_t *req) {
  const h2s_t *st = stream_of(req);
  if (st->h == NULL)
    return 0;
  return st->out_len - st->out_off + conn_pending(st->h->c);
}

int om__http2_response_on_drain(om_http_request_t *req, size_t low_water,
                                om_http_drain_fn cb) {
  h2s_t *st = stream_of(req);
  if (st->h == NULL || st->closed || !st->started || st->in_close_cb)
    return OM_ESTATE;
  st->on_drain = NULL;
  if (cb == NULL)
    return 0;
  if (om__http2_response_pending(req) <= low_water)
    return 1;
  st->on_drain = cb;
  st->drain_low = low_water;
  return 0;
}

int om__http2_on_close(om_http_request_t *req, om_http_close_fn cb) {
  h2s_t *st = stream_of(req);
  if (st->h == NULL || st->closed)
    return OM_ESTATE;
  st->on_close = cb;
  return 0;
}

/* ------------------------------------------------------------------ */
/* request bodies */

int om__http2_body_start(om_http_request_t *req, om_http_body_fn on_data,
                         om_http_body_end_fn on_end) {
  h2s_t *st = stream_of(req);
  if (on_data == NULL || on_end == NULL)
    return OM_EINVAL;
  if (st->h == NULL || st->closed || !st->pub.body_streamed || st->body_on ||
      st->in_close_cb)
    return OM_ESTATE;
  st->on_body = on_data;
  st->on_body_end = on_end;
  st->body_on = 1;
  schedule(st->h);
  return 0;
}

void om__http2_body_pause(om_http_request_t *req) {
  h2s_t *st = stream_of(req);
  if (st->body_on)
    st->body_paused = 1;
}

void om__http2_body_resume(om_http_request_t *req) {
  h2s_t *st = stream_of(req);
  if (!st->body_paused)
    return;
  st->body_paused = 0;
  schedule(st->h);
}
