/*
 * om_upstream_h2.c: the upstream client's HTTP/2 connections (RFC 9113),
 * an nghttp2 client session per connection driven from the libuv loop
 * (om_upstream.h, "HTTP/2"); TLS connections (h2 by ALPN) are
 * om_upstream_h2_tls.c's.
 *
 * A connection carries up to the peer's SETTINGS_MAX_CONCURRENT_STREAMS
 * (at most H2_MAX_STREAMS) requests; om_upstream_send puts a request on
 * the first connection of its peer with room, else opens one, and the
 * request is submitted to nghttp2 at once (its fields are copied there),
 * so a connection that is still connecting already holds its streams.
 * Bytes read go to nghttp2_session_mem_recv; what nghttp2_session_mem_send
 * produces is gathered into one buffer per write, at most one uv_write in
 * flight, and frames are produced only while less than H2_OUT_HIGH waits
 * (nghttp2 pulls request bodies lazily, so nothing else queues).
 *
 * Re-entrancy: nghttp2 must not be driven from inside its own callbacks.
 * The callbacks deliver on_headers, on_body and on_trailers (a caller may
 * call any om_upstream_* function inside them: submitting and resetting
 * streams is allowed there, sending is deferred to the end of the read),
 * and on_done always comes from the kick (the pool's api count is held
 * across mem_recv). A connection is freed only from its handles' close
 * callbacks, never under nghttp2.
 *
 * Flow control: automatic WINDOW_UPDATE is off; a stream's window is
 * given back (nghttp2_session_consume) as its bytes reach on_body. A
 * paused request keeps what arrives in its own buffer (bounded by the
 * stream window) and consumes it when resumed, so the server sees the
 * backpressure of that stream only.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <nghttp2/nghttp2.h>

#include "om_errno.h"
#include "om_http_chars.h"
#include "om_upstream_h2_internal.h"
#include "om_upstream_internal.h"

static void conn_arm_at(h2c_t *h, uint64_t due);

/* ------------------------------------------------------------------ */
/* streams */

/* Connection counters: a connection with streams is active, one
 * without is idle (om_upstream_stats_t). */
static void count_busy(h2c_t *h) {
  if (h->counted_idle) {
    h->counted_idle = 0;
    h->peer->st.idle--;
    h->pool->st.idle--;
    h->peer->st.active++;
    h->pool->st.active++;
  }
}

static void count_idle(h2c_t *h) {
  if (!h->counted_idle && !h->closing) {
    h->counted_idle = 1;
    h->peer->st.active--;
    h->pool->st.active--;
    h->peer->st.idle++;
    h->pool->st.idle++;
  }
}

/* Take r off its connection; nghttp2 forgets it as the stream's data. */
static void stream_detach(req_t *r) {
  h2c_t *h = r->h2;
  if (h == NULL)
    return;
  if (r->sid > 0 && h->ss != NULL)
    nghttp2_session_set_stream_user_data(h->ss, r->sid, NULL);
  /* bytes it still holds are delivered without the stream: they go back
   * to the connection's window now */
  if (r->held_len > r->held_off && !h->closing)
    nghttp2_session_consume_connection(h->ss, r->held_len - r->held_off);
  om_list_remove(&r->h2link);
  r->h2 = NULL;
  r->sid = 0;
  if (--h->nstreams == 0) {
    h->idle_since = now_ms(h->pool);
    count_idle(h);
    if (h->connected)
      conn_arm_at(h, h->idle_since + h->idle_ms);
  }
}

static int arena_put(req_t *r, const uint8_t *p, size_t n, size_t *off) {
  if (r->harena_len + n + 1 > r->harena_cap) {
    size_t cap = r->harena_cap ? r->harena_cap * 2 : 1024;
    char *na;
    while (cap < r->harena_len + n + 1)
      cap *= 2;
    na = realloc(r->harena, cap);
    if (na == NULL)
      return OM_ENOMEM;
    r->harena = na;
    r->harena_cap = cap;
  }
  memcpy(r->harena + r->harena_len, p, n);
  r->harena[r->harena_len + n] = '\0';
  *off = r->harena_len;
  r->harena_len += n + 1;
  return 0;
}

static void fields_reset(req_t *r) {
  r->harena_len = 0;
  r->n_hf = 0;
  r->hbytes = 0;
}

/* The fields collected so far as om_http_header_t, into a buffer of the
 * caller's (stack) or allocated; NULL when out of memory. */
static om_http_header_t *fields_view(req_t *r, om_http_header_t *stack,
                                     size_t cap) {
  om_http_header_t *v = stack;
  if (r->n_hf > cap)
    v = malloc(r->n_hf * sizeof *v);
  if (v == NULL)
    return NULL;
  for (size_t i = 0; i < r->n_hf; i++)
    v[i] = (om_http_header_t){r->harena + r->hf[i].no, r->harena + r->hf[i].vo,
                              r->hf[i].nl, r->hf[i].vl};
  return v;
}

/* End r (detached) with its recorded outcome; a success hands the
 * trailers over first. */
static void stream_finish(req_t *r) {
  if (r->h2_fail == OM_UPSTREAM_OK && r->n_hf > 0 && r->cb.on_trailers) {
    om_http_header_t stack[16], *v = fields_view(r, stack, 16);
    if (v != NULL) {
      r->in_cb = 1;
      r->cb.on_trailers(r->ud, v, r->n_hf);
      r->in_cb = 0;
      if (v != stack)
        free(v);
      if (r->cancelled) {
        om__up_req_recycle(r);
        return;
      }
    }
  }
  om__up_req_end(r, r->h2_fail, r->h2_err, r->h2_detail);
}

/* Record how r ends; the first outcome recorded stands. */
static void stream_outcome(req_t *r, om_upstream_fail_t fail, int err,
                           const char *detail) {
  if (r->h2_closed)
    return;
  r->h2_closed = 1;
  r->h2_fail = fail;
  r->h2_err = err;
  r->h2_detail = detail;
}

/* r's stream ended (closed by nghttp2, reset by a timeout, or its
 * connection failed): finish now, or once the bytes it holds are
 * delivered (a paused request). */
static void stream_closed(req_t *r) {
  stream_detach(r);
  if (r->paused && r->held_len > r->held_off)
    return; /* om__up_h2_resume delivers, then finishes */
  stream_finish(r);
}

/* The failure class of a stream that ended without a complete response,
 * by what it had reached. */
static void stream_broke(req_t *r, uint32_t code, const char *detail) {
  if (r->h2_bad) {
    stream_outcome(r, OM_UPSTREAM_FAIL_MALFORMED, OM_ETOOBIG,
                   "the response head exceeds max_header_bytes or "
                   "max_headers");
  } else if (r->h2_head) {
    stream_outcome(r, OM_UPSTREAM_FAIL_RESET_MID_BODY, 0, detail);
  } else {
    if (code == NGHTTP2_REFUSED_STREAM)
      r->res.sent = 0; /* RFC 9113 8.7: not processed */
    stream_outcome(r, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, 0, detail);
  }
}

/* ------------------------------------------------------------------ */
/* nghttp2 callbacks */

static req_t *req_of(nghttp2_session *ss, int32_t id) {
  return id > 0 ? nghttp2_session_get_stream_user_data(ss, id) : NULL;
}

static int cb_begin_headers(nghttp2_session *ss, const nghttp2_frame *f,
                            void *ud) {
  req_t *r = req_of(ss, f->hd.stream_id);
  (void)ud;
  if (r != NULL && f->hd.type == NGHTTP2_HEADERS)
    fields_reset(r); /* a head (after a 1xx too) or the trailers */
  return 0;
}

static int cb_header(nghttp2_session *ss, const nghttp2_frame *f,
                     const uint8_t *name, size_t nl, const uint8_t *value,
                     size_t vl, uint8_t flags, void *ud) {
  req_t *r = req_of(ss, f->hd.stream_id);
  om_upstream_pool_t *p;
  h2f_t *hf;
  (void)flags;
  (void)ud;
  if (r == NULL || f->hd.type != NGHTTP2_HEADERS)
    return 0;
  p = r->pool;
  r->hbytes += nl + vl + 32; /* RFC 9113 6.5.2's accounting */
  if (r->hbytes > p->o.max_header_bytes) {
    r->h2_bad = 1;
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  }
  if (nl > 0 && name[0] == ':') {
    if (nl == 7 && memcmp(name, ":status", 7) == 0 && vl == 3 &&
        om__http_is_digit(value[0]) && om__http_is_digit(value[1]) &&
        om__http_is_digit(value[2]))
      r->h2_status =
          (value[0] - '0') * 100 + (value[1] - '0') * 10 + (value[2] - '0');
    return 0; /* nghttp2 checked the pseudo-fields (RFC 9113 8.3.2) */
  }
  if (r->n_hf >= p->o.max_headers) {
    r->h2_bad = 1;
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  }
  if (r->n_hf == r->cap_hf) {
    size_t cap = r->cap_hf ? r->cap_hf * 2 : 16;
    h2f_t *nf = realloc(r->hf, cap * sizeof *nf);
    if (nf == NULL)
      return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    r->hf = nf;
    r->cap_hf = cap;
  }
  hf = &r->hf[r->n_hf];
  hf->nl = nl;
  hf->vl = vl;
  if (arena_put(r, name, nl, &hf->no) != 0 ||
      arena_put(r, value, vl, &hf->vo) != 0)
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  r->n_hf++;
  return 0;
}

static int64_t content_length_of(const om_http_header_t *h, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (h[i].name_len == 14 && memcmp(h[i].name, "content-length", 14) == 0) {
      int64_t v = 0;
      for (size_t k = 0; k < h[i].value_len; k++)
        v = v * 10 + (h[i].value[k] - '0'); /* nghttp2 checked 1*DIGIT */
      return v;
    }
  return -1;
}

/* The final response head of r is complete: on_headers. */
static int deliver_head(nghttp2_session *ss, req_t *r, int end_stream) {
  om_http_header_t stack[32], *v;
  om_upstream_response_t resp;
  int rc;
  v = fields_view(r, stack, 32);
  if (v == NULL)
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  memset(&resp, 0, sizeof resp);
  resp.status = r->h2_status;
  resp.version_minor = 1;
  resp.reason = "";
  resp.headers = v;
  resp.n_headers = r->n_hf;
  resp.has_body =
      !end_stream && !r->is_head && r->h2_status != 204 && r->h2_status != 304;
  resp.content_length = resp.has_body ? content_length_of(v, r->n_hf) : 0;
  r->h2_head = 1;
  r->res.headers_delivered = 1;
  r->in_cb = 1;
  rc = r->cb.on_headers != NULL ? r->cb.on_headers(r->ud, &resp) : 0;
  r->in_cb = 0;
  if (v != stack)
    free(v);
  fields_reset(r); /* the arena is the trailers' from here */
  if (r->cancelled) {
    om__up_req_recycle(r);
    return 0;
  }
  if (rc != 0) {
    nghttp2_submit_rst_stream(ss, NGHTTP2_FLAG_NONE, r->sid, NGHTTP2_CANCEL);
    stream_outcome(r, OM_UPSTREAM_FAIL_ABORTED, 0,
                   "on_headers refused the response");
    stream_closed(r);
  }
  return 0;
}

static int cb_frame_recv(nghttp2_session *ss, const nghttp2_frame *f,
                         void *ud) {
  h2c_t *h = ud;
  req_t *r;
  int end = (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
  if (f->hd.type == NGHTTP2_GOAWAY) {
    /* no new stream here; nghttp2 closes those past last_stream_id with
     * REFUSED_STREAM (not processed) */
    h->goaway = 1;
    return 0;
  }
  r = req_of(ss, f->hd.stream_id);
  if (r == NULL)
    return 0;
  if (f->hd.type == NGHTTP2_DATA) {
    if (end)
      r->h2_end = 1;
    return 0;
  }
  if (f->hd.type != NGHTTP2_HEADERS)
    return 0;
  if (end)
    r->h2_end = 1;
  if (r->h2_head)
    return 0; /* the trailers: handed over at the end */
  if (r->h2_status >= 100 && r->h2_status < 200) {
    r->h2_status = 0; /* an interim head (RFC 9110 15.2): skipped */
    return 0;
  }
  return deliver_head(ss, r, end);
}

static void deliver_body(nghttp2_session *ss, req_t *r, const uint8_t *d,
                         size_t len) {
  int32_t sid = r->sid;
  r->res.body_bytes += len;
  if (r->cb.on_body != NULL) {
    r->in_cb = 1;
    r->cb.on_body(r->ud, (const char *)d, len);
    r->in_cb = 0;
  }
  if (sid == 0 || nghttp2_session_consume(ss, sid, len) != 0)
    nghttp2_session_consume_connection(ss, len);
  if (r->cancelled)
    om__up_req_recycle(r);
}

static int cb_data_chunk(nghttp2_session *ss, uint8_t flags, int32_t id,
                         const uint8_t *d, size_t len, void *ud) {
  req_t *r = req_of(ss, id);
  (void)flags;
  (void)ud;
  if (r == NULL || len == 0) {
    nghttp2_session_consume_connection(ss, len);
    return 0;
  }
  if (r->paused || r->held_len > r->held_off) {
    /* held until resumed: at most the stream window, which is not given
     * back meanwhile */
    if (r->held_off > 0 && r->held_off == r->held_len)
      r->held_off = r->held_len = 0;
    if (r->held_len + len > r->held_cap) {
      size_t cap = r->held_cap ? r->held_cap * 2 : 16384;
      char *nb;
      while (cap < r->held_len + len)
        cap *= 2;
      nb = realloc(r->held, cap);
      if (nb == NULL)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
      r->held = nb;
      r->held_cap = cap;
    }
    memcpy(r->held + r->held_len, d, len);
    r->held_len += len;
    return 0;
  }
  deliver_body(ss, r, d, len);
  return 0;
}

static int cb_stream_close(nghttp2_session *ss, int32_t id, uint32_t code,
                           void *ud) {
  req_t *r = req_of(ss, id);
  (void)ud;
  if (r == NULL)
    return 0;
  if (r->h2_head && r->h2_end && !r->h2_bad)
    /* the whole response came; a reset behind it (NO_ERROR: the server
     * needs no more of our body, RFC 9113 8.1) changes nothing */
    stream_outcome(r, OM_UPSTREAM_OK, 0, NULL);
  else
    stream_broke(r, code,
                 code == NGHTTP2_REFUSED_STREAM
                     ? "the server refused the stream (REFUSED_STREAM)"
                     : "the stream was reset");
  stream_closed(r);
  return 0;
}

static int cb_frame_send(nghttp2_session *ss, const nghttp2_frame *f,
                         void *ud) {
  req_t *r;
  (void)ud;
  if (f->hd.type != NGHTTP2_HEADERS)
    return 0;
  r = req_of(ss, f->hd.stream_id);
  if (r != NULL)
    r->res.sent = 1;
  return 0;
}

/* The request body for DATA frames: the buffered body, or the queued
 * pieces of a streamed one (each freed as it is framed; its lent bytes
 * given back). */
static ssize_t cb_data_read(nghttp2_session *ss, int32_t id, uint8_t *buf,
                            size_t length, uint32_t *flags,
                            nghttp2_data_source *src, void *ud) {
  req_t *r = req_of(ss, id);
  size_t n = 0;
  (void)src;
  (void)ud;
  if (r == NULL)
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  if (!r->streamed) {
    n = r->body_len - r->body_off;
    if (n > length)
      n = length;
    memcpy(buf, r->body + r->body_off, n);
    r->body_off += n;
    if (r->body_off == r->body_len)
      *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
  }
  while (n < length && r->bq_head != NULL) {
    bchunk_t *b = r->bq_head;
    const char *bytes = b->ref != NULL ? b->ref : b->data;
    size_t blen = b->ref != NULL ? b->ref_len : b->len;
    size_t take = blen - r->bq_off;
    if (take > length - n)
      take = length - n;
    memcpy(buf + n, bytes + r->bq_off, take);
    n += take;
    r->bq_off += take;
    if (r->bq_off == blen) {
      r->bq_head = b->next;
      if (r->bq_head == NULL)
        r->bq_tail = NULL;
      r->body_pending -= b->len < r->body_pending ? b->len : r->body_pending;
      r->bq_off = 0;
      om__up_piece_free(b);
    }
  }
  r->body_moved = 1;
  if (r->drain_armed && r->body_pending <= r->drain_low && !r->h2_drain_due) {
    r->h2_drain_due = 1;
    om__up_pend_push(r, PEND_PROCESS);
  }
  if (r->bq_head == NULL && r->body_ended) {
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
  }
  if (n == 0) {
    r->h2_deferred = 1;
    return NGHTTP2_ERR_DEFERRED;
  }
  return (ssize_t)n;
}

/* ------------------------------------------------------------------ */
/* the connection */

static void on_closed(uv_handle_t *hd) {
  h2c_t *h = hd->data;
  om_upstream_pool_t *p = h->pool;
  if (--h->handles > 0)
    return;
  om__up_peer_unref(h->peer);
  nghttp2_session_del(h->ss);
  om_tls_free(h->tls);
  free(h->pbuf);
  free(h->rbuf);
  free(h->wbuf);
  free(h->qbuf);
  free(h);
  p->nconns--;
  om__up_pool_maybe_finish(p);
}

/* Close h: every stream on it ends with fail (a stream's own class when
 * it reached its head, see stream_broke). */
void om__h2c_close(h2c_t *h, om_upstream_fail_t fail, int err,
                   const char *detail) {
  om_list_t *it;
  if (h->closing)
    return;
  while ((it = om_list_first(&h->streams)) != NULL) {
    req_t *r = OM_LIST_ENTRY(it, req_t, h2link);
    if (fail == OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE && r->h2_head)
      stream_outcome(r, OM_UPSTREAM_FAIL_RESET_MID_BODY, err, detail);
    else if (fail == OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE)
      stream_broke(r, 0, detail);
    else
      stream_outcome(r, fail, err, detail);
    stream_closed(r);
  }
  if (h->counted_idle) {
    h->peer->st.idle--;
    h->pool->st.idle--;
  } else {
    h->peer->st.active--;
    h->pool->st.active--;
  }
  h->closing = 1;
  om_list_remove(&h->link);
  om_list_remove(&h->plink);
  uv_close((uv_handle_t *)&h->tcp, on_closed);
  uv_close((uv_handle_t *)&h->timer, on_closed);
}

void om__h2c_fail(h2c_t *h, om_upstream_fail_t fail, int err,
                  const char *detail) {
  om_upstream_pool_t *p = h->pool;
  p->api++; /* on_done from the kick */
  om__h2c_close(h, fail, err, detail);
  p->api--;
}

void om__h2c_on_write(uv_write_t *w, int status) {
  h2c_t *h = w->data;
  h->writing = 0;
  h->wlen = 0;
  if (h->closing)
    return;
  if (status < 0) {
    om__h2c_fail(h, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, 0,
                 "the connection failed while writing");
    return;
  }
  om__h2c_flush(h);
}

/* Produce frames while little waits, and write what was produced. */
void om__h2c_flush(h2c_t *h) {
  uv_buf_t b;
  if (h->closing)
    return;
  if (!h->connected) {
    /* a TLS handshake under way: only its own bytes go */
    if (h->tls != NULL && om__h2c_tls_push(h) != 0)
      om__h2c_fail(h, OM_UPSTREAM_FAIL_CONNECT, 0,
                   "cannot write the handshake");
    return;
  }
  if (h->in_ng) {
    h->flush_due = 1;
    return;
  }
  h->in_ng = 1;
  h->pool->api++;
  while (h->qlen < H2_OUT_HIGH) {
    const uint8_t *data;
    ssize_t n = nghttp2_session_mem_send(h->ss, &data);
    if (n < 0) {
      h->in_ng = 0;
      om__h2c_close(h, OM_UPSTREAM_FAIL_INTERNAL, OM_ENOMEM,
                    nghttp2_strerror((int)n));
      h->pool->api--;
      return;
    }
    if (n == 0)
      break;
    if (h->qlen + (size_t)n > h->qcap) {
      size_t cap = h->qcap ? h->qcap * 2 : 16384;
      char *nb;
      while (cap < h->qlen + (size_t)n)
        cap *= 2;
      nb = realloc(h->qbuf, cap);
      if (nb == NULL) {
        h->in_ng = 0;
        om__h2c_close(h, OM_UPSTREAM_FAIL_INTERNAL, OM_ENOMEM,
                      "out of memory for HTTP/2 frames");
        h->pool->api--;
        return;
      }
      h->qbuf = nb;
      h->qcap = cap;
    }
    memcpy(h->qbuf + h->qlen, data, (size_t)n);
    h->qlen += (size_t)n;
  }
  h->in_ng = 0;
  h->flush_due = 0;
  if (h->tls != NULL) {
    if (om__h2c_tls_push(h) != 0)
      om__h2c_close(h, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, 0,
                    "the connection failed while writing");
  } else if (!h->writing && h->qlen > 0) {
    char *t = h->wbuf;
    size_t tc = h->wcap;
    h->wbuf = h->qbuf;
    h->wcap = h->qcap;
    h->wlen = h->qlen;
    h->qbuf = t;
    h->qcap = tc;
    h->qlen = 0;
    b = uv_buf_init(h->wbuf, (unsigned)h->wlen);
    h->wreq.data = h;
    if (uv_write(&h->wreq, (uv_stream_t *)&h->tcp, &b, 1, om__h2c_on_write) !=
        0) {
      om__h2c_close(h, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, 0,
                    "the connection failed while writing");
      h->pool->api--;
      return;
    }
    h->writing = 1;
  }
  if (!h->writing && !nghttp2_session_want_read(h->ss) &&
      !nghttp2_session_want_write(h->ss))
    om__h2c_close(h, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, 0,
                  "the server ended the connection (GOAWAY)");
  h->pool->api--;
}

static void on_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf) {
  h2c_t *h = hd->data;
  (void)suggested;
  buf->base = h->rbuf;
  buf->len = H2_READ;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  h2c_t *h = s->data;
  om_upstream_pool_t *p = h->pool;
  ssize_t rc;
  (void)buf;
  if (h->closing || nread == 0)
    return;
  if (nread < 0) {
    om__h2c_fail(h, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, 0,
                 nread == UV_EOF ? "the server closed the connection"
                                 : "the connection was reset");
    return;
  }
  if (h->tls != NULL) {
    om__h2c_tls_read(h, (size_t)nread);
    return;
  }
  p->api++;
  h->in_ng = 1;
  rc = nghttp2_session_mem_recv(h->ss, (const uint8_t *)h->rbuf, (size_t)nread);
  h->in_ng = 0;
  if (rc < 0) {
    om__h2c_close(h, OM_UPSTREAM_FAIL_MALFORMED, OM_EPARSE,
                  nghttp2_strerror((int)rc));
  } else if (!h->closing) {
    om__h2c_flush(h);
  }
  p->api--;
  om__up_pool_maybe_finish(p);
}

/* Every stream of h failed to get a connection (nothing was sent). */
void om__h2c_connect_failed(h2c_t *h, om_upstream_fail_t fail, int os_err,
                            const char *detail) {
  OM_LIST_FOREACH(it, &h->streams) {
    req_t *r = OM_LIST_ENTRY(it, req_t, h2link);
    r->res.os_err = os_err;
    r->res.sent = 0;
  }
  om__h2c_fail(h, fail, 0, detail);
}

static void on_connect(uv_connect_t *cr, int status) {
  h2c_t *h = cr->data;
  if (h->closing)
    return;
  if (status < 0) {
    om__h2c_connect_failed(h, om__up_connect_class(status), status,
                           uv_strerror(status));
    return;
  }
  if (uv_read_start((uv_stream_t *)&h->tcp, on_alloc, on_read) != 0) {
    om__h2c_connect_failed(h, OM_UPSTREAM_FAIL_CONNECT, 0, "cannot read");
    return;
  }
  if (h->peer->target.tls) {
    /* the handshake first, offering h2 only: the connect timeout covers
     * it, and nothing of a request goes before the peer proved its name */
    if (om__h2c_tls_start(h) == 0)
      om__h2c_flush(h);
    return;
  }
  h->connected = 1;
  om__h2c_flush(h);
  om__h2c_rearm(h);
}

/* The earliest due time of h and its streams (loop ms; 0: none). */
static uint64_t earliest(uint64_t a, uint64_t b) {
  return a == 0 ? b : b == 0 ? a : a < b ? a : b;
}

static void on_timer(uv_timer_t *t);

/*
 * The timer is lazy: a stream that starts brings the timer forward to
 * its own earliest due time (conn_arm_at, O(1)); nothing moves it back
 * when a stream gets its head or ends, so it may fire early, and then
 * on_timer looks at every stream once and sets it to the real earliest
 * (conn_rearm). The hot path never walks the streams.
 */
static void conn_arm_at(h2c_t *h, uint64_t due) {
  uint64_t now;
  if (h->closing || due == 0 || (h->timer_due != 0 && h->timer_due <= due))
    return;
  h->timer_due = due;
  now = now_ms(h->pool);
  uv_timer_start(&h->timer, on_timer, due > now ? due - now : 0, 0);
}

void om__h2c_rearm(h2c_t *h) {
  uint64_t due = 0;
  if (h->closing)
    return;
  if (!h->connected)
    due = h->connect_due;
  OM_LIST_FOREACH(it, &h->streams) {
    req_t *r = OM_LIST_ENTRY(it, req_t, h2link);
    due = earliest(due, r->total_due);
    if (!r->h2_head) {
      due = earliest(due, r->head_due);
      due = earliest(due, r->first_byte_due);
      if (!h->connected)
        due = earliest(due, r->connect_due);
    }
  }
  if (h->nstreams == 0 && h->connected)
    due = earliest(due, h->idle_since + h->idle_ms);
  uv_timer_stop(&h->timer);
  h->timer_due = 0;
  conn_arm_at(h, due);
}

static void on_timer(uv_timer_t *t) {
  h2c_t *h = t->data;
  om_upstream_pool_t *p = h->pool;
  uint64_t now = now_ms(p);
  h->timer_due = 0;
  if (h->closing)
    return;
  if (h->nstreams == 0 && h->connected) {
    if (h->idle_since + h->idle_ms <= now) {
      om__h2c_fail(h, OM_UPSTREAM_FAIL_CLOSED, 0, "idle");
      return;
    }
  }
  if (!h->connected && h->connect_due != 0 && h->connect_due <= now) {
    om__h2c_connect_failed(h, OM_UPSTREAM_FAIL_TIMEOUT_CONNECT, 0,
                           "connect_timeout_ms passed");
    return;
  }
  p->api++;
  OM_LIST_FOREACH_SAFE(it, &h->streams) {
    req_t *r = OM_LIST_ENTRY(it, req_t, h2link);
    om_upstream_fail_t fail = OM_UPSTREAM_OK;
    const char *detail = NULL;
    if (r->total_due != 0 && r->total_due <= now) {
      fail = OM_UPSTREAM_FAIL_TIMEOUT_TOTAL;
      detail = "timeout_ms passed";
    } else if (!r->h2_head &&
               ((r->head_due != 0 && r->head_due <= now) ||
                (r->first_byte_due != 0 && r->first_byte_due <= now))) {
      fail = h->connected ? OM_UPSTREAM_FAIL_TIMEOUT_FIRST_BYTE
                          : OM_UPSTREAM_FAIL_TIMEOUT_CONNECT;
      detail = h->connected ? "no response head in time"
                            : "connect_timeout_ms passed";
    } else if (!r->h2_head && !h->connected && r->connect_due != 0 &&
               r->connect_due <= now) {
      fail = OM_UPSTREAM_FAIL_TIMEOUT_CONNECT;
      detail = "connect_timeout_ms passed";
    }
    if (fail == OM_UPSTREAM_OK)
      continue;
    if (!h->connected)
      r->res.sent = 0;
    if (r->sid > 0)
      nghttp2_submit_rst_stream(h->ss, NGHTTP2_FLAG_NONE, r->sid,
                                NGHTTP2_CANCEL);
    stream_outcome(r, fail, 0, detail);
    stream_closed(r);
  }
  if (!h->closing) {
    om__h2c_flush(h);
    om__h2c_rearm(h);
  }
  p->api--;
}

static int conn_new(req_t *r, h2c_t **out) {
  om_upstream_pool_t *p = r->pool;
  peer_t *e = r->peer;
  nghttp2_session_callbacks *cbs;
  nghttp2_option *opt;
  nghttp2_settings_entry iv[3];
  h2c_t *h = calloc(1, sizeof *h);
  int rc;
  if (h == NULL)
    return OM_ENOMEM;
  h->rbuf = malloc(H2_READ);
  if (h->rbuf == NULL || nghttp2_session_callbacks_new(&cbs) != 0) {
    free(h->rbuf);
    free(h);
    return OM_ENOMEM;
  }
  nghttp2_session_callbacks_set_on_begin_headers_callback(cbs,
                                                          cb_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(cbs, cb_header);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, cb_frame_recv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, cb_data_chunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs, cb_stream_close);
  nghttp2_session_callbacks_set_on_frame_send_callback(cbs, cb_frame_send);
  if (nghttp2_option_new(&opt) != 0) {
    nghttp2_session_callbacks_del(cbs);
    free(h->rbuf);
    free(h);
    return OM_ENOMEM;
  }
  nghttp2_option_set_no_auto_window_update(opt, 1);
  /* until the server's SETTINGS say otherwise */
  nghttp2_option_set_peer_max_concurrent_streams(opt, H2_MAX_STREAMS);
  rc = nghttp2_session_client_new2(&h->ss, cbs, h, opt);
  nghttp2_option_del(opt);
  nghttp2_session_callbacks_del(cbs);
  if (rc != 0) {
    free(h->rbuf);
    free(h);
    return OM_ENOMEM;
  }
  iv[0] = (nghttp2_settings_entry){NGHTTP2_SETTINGS_ENABLE_PUSH, 0};
  iv[1] = (nghttp2_settings_entry){NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE,
                                   H2_STREAM_WINDOW};
  iv[2] = (nghttp2_settings_entry){NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE,
                                   (uint32_t)p->o.max_header_bytes};
  if (nghttp2_submit_settings(h->ss, NGHTTP2_FLAG_NONE, iv, 3) != 0 ||
      nghttp2_session_set_local_window_size(h->ss, NGHTTP2_FLAG_NONE, 0,
                                            H2_CONN_WINDOW) != 0) {
    nghttp2_session_del(h->ss);
    free(h->rbuf);
    free(h);
    return OM_ENOMEM;
  }
  om_list_init(&h->streams);
  om_list_init(&h->link);
  om_list_init(&h->plink);
  h->pool = p;
  h->peer = e;
  e->refs++;
  p->nconns++;
  uv_tcp_init(p->loop, &h->tcp);
  uv_timer_init(p->loop, &h->timer);
  h->tcp.data = h->timer.data = h->creq.data = h;
  h->handles = 2;
  om_list_push_back(&p->h2conns, &h->link);
  om_list_push_back(&e->h2, &h->plink);
  e->st.active++;
  p->st.active++;
  e->st.connects++;
  p->st.connects++;
  h->idle_ms = r->idle_ms;
  h->connect_due = r->connect_ms != 0 ? now_ms(p) + r->connect_ms : 0;
  uv_tcp_nodelay(&h->tcp, 1);
  *out = h;
  return 0;
}

/* A connection of r's peer with room for one more stream, or NULL. */
static h2c_t *conn_find(req_t *r) {
  OM_LIST_FOREACH(it, &r->peer->h2) {
    h2c_t *h = OM_LIST_ENTRY(it, h2c_t, plink);
    uint32_t limit = H2_MAX_STREAMS;
    if (h->closing || h->goaway)
      continue;
    if (h->connected) {
      uint32_t remote = nghttp2_session_get_remote_settings(
          h->ss, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
      if (remote < limit)
        limit = remote;
    }
    if (h->nstreams < limit)
      return h;
  }
  return NULL;
}

/* ------------------------------------------------------------------ */
/* requests */

/* Whether a TE value lists "trailers". */
static int te_trailers(const char *v, size_t n) {
  for (size_t i = 0; i + 8 <= n; i++)
    if (strncasecmp(v + i, "trailers", 8) == 0 &&
        (i == 0 || v[i - 1] == ',' || v[i - 1] == ' ' || v[i - 1] == '\t') &&
        (i + 8 == n || v[i + 8] == ',' || v[i + 8] == ' ' || v[i + 8] == ';' ||
         v[i + 8] == '\t'))
      return 1;
  return 0;
}

static size_t slen(const char *s, size_t n) {
  return n != 0 ? n : strlen(s);
}

/* Submit r's HEADERS (and its body's data source) to h. */
static int submit(h2c_t *h, req_t *r, const om_upstream_target_t *t,
                  const om_upstream_request_t *q) {
  const om_http_header_t *hd = q->headers;
  size_t n = q->n_headers, i, k = 0, names = 0, off = 0;
  nghttp2_nv stack_nv[40], *nv = stack_nv;
  char stack_names[2048], *lower = stack_names, clbuf[24];
  const char *auth = t->authority;
  size_t auth_len = strlen(t->authority);
  int named = 0, has_te = 0, body, rc;
  nghttp2_data_provider dp;
  for (i = 0; i < n; i++) {
    size_t nl = slen(hd[i].name, hd[i].name_len);
    int kind = om__up_field_kind(hd[i].name, nl);
    if (kind == F_CONNECTION) {
      conn_opts_t co = {0, 0};
      size_t vl = slen(hd[i].value, hd[i].value_len);
      if (om__up_conn_walk(hd[i].value, vl, om__up_conn_opt, &co) != 0)
        return OM_EINVAL;
      named |= co.others;
    }
    names += nl;
  }
  if (n + 6 > sizeof stack_nv / sizeof stack_nv[0])
    nv = malloc((n + 6) * sizeof *nv);
  if (names > sizeof stack_names)
    lower = malloc(names);
  if (nv == NULL || lower == NULL) {
    rc = OM_ENOMEM;
    goto out;
  }
  for (i = 0; i < n; i++) {
    size_t nl = slen(hd[i].name, hd[i].name_len);
    int kind = om__up_field_kind(hd[i].name, nl);
    if (kind == F_HOST) {
      auth = hd[i].value;
      auth_len = slen(hd[i].value, hd[i].value_len);
    }
  }
  nv[k++] = (nghttp2_nv){(uint8_t *)":method", (uint8_t *)q->method, 7,
                         slen(q->method, q->method_len), NGHTTP2_NV_FLAG_NONE};
  nv[k++] =
      (nghttp2_nv){(uint8_t *)":scheme", (uint8_t *)(t->tls ? "https" : "http"),
                   7, t->tls ? 5u : 4u, NGHTTP2_NV_FLAG_NONE};
  nv[k++] = (nghttp2_nv){(uint8_t *)":authority", (uint8_t *)auth, 10, auth_len,
                         NGHTTP2_NV_FLAG_NONE};
  nv[k++] = (nghttp2_nv){(uint8_t *)":path", (uint8_t *)q->target, 5,
                         slen(q->target, q->target_len), NGHTTP2_NV_FLAG_NONE};
  for (i = 0; i < n; i++) {
    size_t nl = slen(hd[i].name, hd[i].name_len);
    size_t vl = slen(hd[i].value, hd[i].value_len);
    int kind = om__up_field_kind(hd[i].name, nl);
    if (nl == 2 && om__http_ci_eq(hd[i].name, 2, "te")) {
      /* TE: only "trailers" may go (RFC 9113 8.2.2); gRPC needs it */
      if (!has_te && te_trailers(hd[i].value, vl)) {
        has_te = 1;
        nv[k++] = (nghttp2_nv){(uint8_t *)"te", (uint8_t *)"trailers", 2, 8,
                               NGHTTP2_NV_FLAG_NONE};
      }
      continue;
    }
    if (kind == F_HOST || kind == F_HOP || kind == F_CONNECTION ||
        kind == F_TE || kind == F_CONTENT_LENGTH ||
        (named && om__up_named_in_connection(hd, n, hd[i].name, nl)))
      continue;
    for (size_t j = 0; j < nl; j++) {
      char ch = hd[i].name[j];
      lower[off + j] = (char)(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch);
    }
    nv[k++] = (nghttp2_nv){(uint8_t *)lower + off, (uint8_t *)hd[i].value, nl,
                           vl, NGHTTP2_NV_FLAG_NONE};
    off += nl;
  }
  body = r->streamed || r->body_len > 0;
  if (r->streamed ? q->body_stream_length >= 0 : r->body_len > 0) {
    uint64_t cl = r->streamed ? (uint64_t)q->body_stream_length : r->body_len;
    nv[k++] = (nghttp2_nv){(uint8_t *)"content-length", (uint8_t *)clbuf, 14,
                           om__http_u64_dec(clbuf, cl), NGHTTP2_NV_FLAG_NONE};
  }
  dp.source.ptr = NULL;
  dp.read_callback = cb_data_read;
  rc = nghttp2_submit_request(h->ss, NULL, nv, k, body ? &dp : NULL, r);
  if (rc < 0) {
    rc = rc == NGHTTP2_ERR_NOMEM ? OM_ENOMEM : OM_EINVAL;
    goto out;
  }
  r->sid = rc;
  rc = 0;
out:
  if (nv != stack_nv)
    free(nv);
  if (lower != stack_names)
    free(lower);
  return rc;
}

int om__up_h2_send(req_t *r, const om_upstream_target_t *t,
                   const om_upstream_request_t *q) {
  om_upstream_pool_t *p = r->pool;
  h2c_t *h;
  int fresh = 0, rc;
  if (q->upgrade != NULL && slen(q->upgrade, q->upgrade_len) > 0)
    return OM_EINVAL; /* RFC 9113 8.6: no Upgrade in HTTP/2 */
  if (!q->headers_valid)
    for (size_t i = 0; i < q->n_headers; i++) {
      const om_http_header_t *f = &q->headers[i];
      size_t nl = slen(f->name, f->name_len);
      for (size_t j = 0; j < nl; j++)
        if (!om__http_is_tchar((unsigned char)f->name[j]))
          return OM_EINVAL;
      if (!om__up_valid_value(f->value, slen(f->value, f->value_len)))
        return OM_EINVAL;
    }
  h = conn_find(r);
  if (h == NULL) {
    rc = conn_new(r, &h);
    if (rc != 0)
      return rc;
    fresh = 1;
  }
  rc = submit(h, r, t, q);
  if (rc != 0) {
    if (fresh) {
      h->counted_idle = 0;
      om__h2c_close(h, OM_UPSTREAM_FAIL_CLOSED, 0, NULL);
    }
    return rc;
  }
  r->h2 = h;
  om_list_push_back(&h->streams, &r->h2link);
  if (h->nstreams++ == 0)
    count_busy(h);
  if (fresh) {
    r->res.connects++;
    r->connect_due = r->connect_ms != 0 ? now_ms(p) + r->connect_ms : 0;
    rc =
        uv_tcp_connect(&h->creq, &h->tcp, &h->peer->target.addr.sa, on_connect);
    if (rc != 0) {
      om__h2c_connect_failed(h, om__up_connect_class(rc), rc, uv_strerror(rc));
      return 0;
    }
  } else {
    r->res.reused = 1;
    r->res.reuses++;
    r->peer->st.reuses++;
    p->st.reuses++;
  }
  if (!r->streamed && r->first_byte_ms != 0)
    r->first_byte_due = now_ms(p) + r->first_byte_ms;
  if (h->idle_ms < r->idle_ms)
    h->idle_ms = r->idle_ms;
  conn_arm_at(h, earliest(earliest(r->total_due, r->head_due),
                          earliest(r->first_byte_due,
                                   h->connected ? 0 : r->connect_due)));
  if (!h->connected)
    conn_arm_at(h, h->connect_due);
  om__h2c_flush(h);
  return 0;
}

void om__up_h2_cancel(req_t *r) {
  h2c_t *h = r->h2;
  if (h == NULL)
    return;
  if (r->sid > 0 && !h->closing)
    nghttp2_submit_rst_stream(h->ss, NGHTTP2_FLAG_NONE, r->sid, NGHTTP2_CANCEL);
  stream_detach(r);
  om__h2c_flush(h);
}

void om__up_h2_resume(req_t *r) {
  if (r->held_len > r->held_off || r->h2_closed)
    om__up_pend_push(r, PEND_PROCESS);
}

void om__up_h2_process(req_t *r) {
  h2c_t *h = r->h2;
  if (r->h2_drain_due) {
    r->h2_drain_due = 0;
    if (r->drain_armed && r->body_pending <= r->drain_low) {
      r->drain_armed = 0;
      r->in_cb = 1;
      r->on_drain(r->ud);
      r->in_cb = 0;
      if (r->cancelled) {
        om__up_req_recycle(r);
        return;
      }
    }
  }
  if (r->paused)
    return;
  while (r->held_len > r->held_off && !r->paused) {
    size_t n = r->held_len - r->held_off;
    const char *d = r->held + r->held_off;
    r->held_off += n;
    r->res.body_bytes += n;
    if (r->cb.on_body != NULL) {
      r->in_cb = 1;
      r->cb.on_body(r->ud, d, n);
      r->in_cb = 0;
    }
    if (h != NULL && !h->closing &&
        nghttp2_session_consume(h->ss, r->sid, n) != 0)
      nghttp2_session_consume_connection(h->ss, n);
    if (r->cancelled) {
      om__up_req_recycle(r);
      return;
    }
  }
  if (r->held_len == r->held_off)
    r->held_off = r->held_len = 0;
  if (h != NULL)
    om__h2c_flush(h); /* the WINDOW_UPDATEs */
  else if (r->h2_closed && !r->paused)
    stream_finish(r);
}

void om__up_h2_body_more(req_t *r) {
  h2c_t *h = r->h2;
  if (h == NULL || h->closing)
    return;
  if (r->h2_deferred) {
    r->h2_deferred = 0;
    nghttp2_session_resume_data(h->ss, r->sid);
  }
  if (r->body_ended && r->first_byte_ms != 0 && !r->h2_head) {
    r->first_byte_due = now_ms(r->pool) + r->first_byte_ms;
    conn_arm_at(h, r->first_byte_due);
  }
  om__h2c_flush(h);
}

void om__up_h2_close_all(om_upstream_pool_t *p) {
  om_list_t *it;
  while ((it = om_list_first(&p->h2conns)) != NULL)
    om__h2c_close(OM_LIST_ENTRY(it, h2c_t, link), OM_UPSTREAM_FAIL_CLOSED, 0,
                  "the pool was closed");
}

void om__up_h2_req_free(req_t *r) {
  free(r->harena);
  free(r->hf);
  free(r->held);
}
