/*
 * om_upstream_conn.c: the upstream client's connections (connect, pool,
 * timers, write the request) and reading their responses with the
 * HTTP/1.1 framing module (core/om_http1.h): the head, then a length,
 * chunked or close-delimited body delivered in place.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_http1.h"
#include "om_http_chars.h"
#include "om_tunnel_internal.h"
#include "om_upstream_internal.h"

static void conn_arm(conn_t *c);

void om__up_conn_arm(conn_t *c) {
  conn_arm(c);
}

/* ------------------------------------------------------------------ */
/* connections */

static void on_conn_closed(uv_handle_t *h) {
  conn_t *c = h->data;
  om_upstream_pool_t *p = c->pool;
  if (--c->handles > 0)
    return;
  om__up_peer_unref(c->peer);
  while (c->inflight != NULL) { /* on_write ran for each: none is left */
    bchunk_t *b = c->inflight;
    c->inflight = b->next;
    om__up_piece_free(b);
  }
  free(c->buf);
  free(c->hdrs);
  free(c->fields);
  om_tls_free(c->tls);
  free(c->tin);
  free(c->tout);
  free(c);
  p->nconns--;
  om__up_pool_maybe_finish(p);
}

void om__up_idle_unlink(conn_t *c) {
  peer_t *e = c->peer;
  om_list_remove(&c->ilink);
  e->st.idle--;
  c->pool->st.idle--;
}

/* Close c (its request, if any, must be detached first). */
void om__up_conn_close(conn_t *c) {
  if (c->closing)
    return;
  c->closing = 1;
  if (c->phase == PH_IDLE)
    om__up_idle_unlink(c);
  if (c->tunnel != NULL) { /* the pool closes under a tunnel */
    om__tunnel_owner_gone(c->tunnel);
    c->tunnel = NULL;
  }
  om_list_remove(&c->link);
  uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
  uv_close((uv_handle_t *)&c->timer, on_conn_closed);
}

/* Make room in c's read buffer (compact, grow) and return it. */
size_t om__up_buf_room(conn_t *c) {
  if (c->pos == c->len) {
    c->pos = c->len = 0;
  } else if (c->pos > 0 && c->cap - c->len < READ_MIN) {
    memmove(c->buf, c->buf + c->pos, c->len - c->pos);
    c->len -= c->pos;
    c->pos = 0;
  }
  if (c->cap - c->len < READ_MIN && c->cap < c->cap_max) {
    size_t n = c->cap * 2 < c->cap_max ? c->cap * 2 : c->cap_max;
    char *nb = realloc(c->buf, n);
    if (nb != NULL) {
      c->buf = nb;
      c->cap = n;
    }
  } else if (c->read_full && c->len == 0 && c->cap < BODY_READ &&
             (c->phase == PH_BODY_CL || c->phase == PH_CHUNKED ||
              c->phase == PH_BODY_EOF)) {
    /* a body that fills every read: fewer, larger reads (a quarter of the
     * syscalls of 16 KiB ones for a download); back to read_buffer_bytes
     * when the connection is pooled */
    char *nb = realloc(c->buf, BODY_READ);
    if (nb != NULL) {
      c->buf = nb;
      c->cap = BODY_READ;
    }
  }
  return c->cap - c->len;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  conn_t *c = h->data;
  (void)suggested;
  if (c->tls != NULL) { /* ciphertext: decrypted into buf by the reader */
    buf->base = c->tin;
    buf->len = OM__UP_TLS_IN;
    return;
  }
  buf->len = om__up_buf_room(c); /* 0 makes libuv report UV_ENOBUFS */
  buf->base = c->buf + c->len;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void head_reset(conn_t *c);

void om__up_read_on(conn_t *c) {
  if (!c->reading && !c->closing && !c->lent &&
      uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
    c->reading = 1;
}

void om__up_read_off(conn_t *c) {
  if (c->reading) {
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = 0;
  }
}

/*
 * Pool c after a complete response of r, under r's limits: c goes first
 * on the peer's idle list (most recently used first) and the oldest
 * beyond r's max_idle are closed, so a caller with a larger limit never
 * loses its connections to one with a smaller limit for longer than one
 * return.
 */
static void conn_make_idle(conn_t *c, const req_t *r) {
  om_upstream_pool_t *p = c->pool;
  peer_t *e = c->peer;
  c->phase = PH_IDLE;
  c->pos = c->len = 0;
  c->read_full = 0;
  if (c->cap > p->o.read_buffer_bytes && c->cap == BODY_READ) {
    /* pooled connections hold the small buffer, whatever they carried */
    char *nb = realloc(c->buf, p->o.read_buffer_bytes);
    if (nb != NULL) {
      c->buf = nb;
      c->cap = p->o.read_buffer_bytes;
    }
  }
  c->idle_since = now_ms(p);
  c->idle_ms = r->idle_ms;
  om_list_push_front(&e->idle, &c->ilink);
  e->st.idle++;
  p->st.idle++;
  om__up_read_on(c); /* an EOF or a stray byte closes it */
  while (e->st.idle > r->max_idle) {
    conn_t *old = OM_LIST_ENTRY(om_list_last(&e->idle), conn_t, ilink);
    e->st.idle_evicted++;
    p->st.idle_evicted++;
    om__up_conn_close(old);
    if (old == c)
      return;
  }
  conn_arm(c);
}

/* The earliest deadline that applies to c now; 0 for none. */
static uint64_t conn_deadline(const conn_t *c) {
  const req_t *r = c->req;
  uint64_t d = 0, x = 0;
  if (r == NULL)
    return c->phase == PH_IDLE ? c->idle_since + c->idle_ms : 0;
  d = r->total_due;
  if (c->phase == PH_CONNECTING)
    x = r->connect_due;
  else if (c->phase == PH_HEAD)
    x = r->first_byte_due;
  if (x != 0 && (d == 0 || x < d))
    d = x;
  if ((c->phase == PH_CONNECTING || c->phase == PH_HEAD) && r->head_due != 0 &&
      (d == 0 || r->head_due < d))
    d = r->head_due;
  return d;
}

static void on_timer(uv_timer_t *t);

/*
 * Arm the timer for c's deadline, lazily: a timer already due earlier is
 * left alone and re-armed when it fires. So a request on a pooled
 * connection costs at most one timer update, not one per phase.
 */
static void conn_arm(conn_t *c) {
  uint64_t d = conn_deadline(c), now;
  if (d == 0 || (c->timer_due != 0 && c->timer_due <= d))
    return;
  now = now_ms(c->pool);
  uv_timer_start(&c->timer, on_timer, d > now ? d - now : 0, 0);
  c->timer_due = d;
}

/*
 * The attempt on c failed. c is closed. A request that met a stale pooled
 * connection (nothing of a response came back) goes again, once, on a
 * fresh connection when the caller allowed it (retry_stale: the server may
 * have read the request) or when provably nothing of it left (the first
 * write failed at once); any other ends.
 */
void om__up_attempt_fail(conn_t *c, om_upstream_fail_t fail, int err,
                         const char *detail) {
  req_t *r = c->req;
  om_upstream_pool_t *p = c->pool;
  om__up_detach(c);
  om__up_conn_close(c);
  if (r == NULL)
    return;
  /* a streamed body is re-sent only while every byte of it is held */
  if (fail == OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE && r->res.reused &&
      !r->got_bytes && (r->retry_stale || !r->res.sent) &&
      r->res.attempts == 1 && !p->closing && !r->body_moved) {
    r->res.attempts = 2;
    r->peer->st.retries++;
    p->st.retries++;
    if (om__up_conn_connect(r) == 0)
      return;
    fail = OM_UPSTREAM_FAIL_INTERNAL;
    err = OM_ENOMEM;
    detail = "out of memory for a retry connection";
  }
  om__up_req_end(r, fail, err, detail);
}

static void attempt_fail(conn_t *c, om_upstream_fail_t fail, int err,
                         const char *detail) {
  om__up_attempt_fail(c, fail, err, detail);
}

static void on_timer(uv_timer_t *t) {
  conn_t *c = t->data;
  req_t *r = c->req;
  uint64_t now = now_ms(c->pool);
  c->timer_due = 0;
  if (c->closing)
    return;
  if (r != NULL) {
    if (r->total_due != 0 && now >= r->total_due) {
      attempt_fail(c, OM_UPSTREAM_FAIL_TIMEOUT_TOTAL, 0,
                   "the total timeout passed");
      return;
    }
    if (c->phase == PH_CONNECTING &&
        ((r->connect_due != 0 && now >= r->connect_due) ||
         (r->head_due != 0 && now >= r->head_due))) {
      attempt_fail(c, OM_UPSTREAM_FAIL_TIMEOUT_CONNECT, 0,
                   c->tls != NULL ? "the connect timeout passed in the TLS "
                                    "handshake"
                                  : "the connect timeout passed");
      return;
    }
    if (c->phase == PH_HEAD &&
        ((r->first_byte_due != 0 && now >= r->first_byte_due) ||
         (r->head_due != 0 && now >= r->head_due))) {
      attempt_fail(c, OM_UPSTREAM_FAIL_TIMEOUT_FIRST_BYTE, 0,
                   "no response head within the first-byte timeout");
      return;
    }
  } else if (c->phase == PH_IDLE && now >= c->idle_since + c->idle_ms) {
    om__up_conn_close(c);
    return;
  }
  conn_arm(c);
}

void om__up_on_write(uv_write_t *w, int status) {
  conn_t *c = w->data;
  c->writing = 0;
  if (om__up_body_written(c, status) != 0 || c->closing)
    return;
  if (status == 0 && c->tls != NULL) /* what was encrypted meanwhile */
    status = om__up_tls_flush(c);
  if (status == 0)
    return;
  if (c->req != NULL && c->phase == PH_HEAD) {
    attempt_fail(c, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, 0,
                 uv_strerror(status));
    return;
  }
  /* the response is already under way: let the read side end it; the
   * connection is out of sync either way */
  c->broken = 1;
}

/* Send the request head and body: one writev when the socket takes it
 * all (the usual case), uv_write for what a short write left. */
static void conn_write(conn_t *c) {
  req_t *r = c->req;
  uv_buf_t b[2];
  unsigned nb = 1, k = 0;
  size_t total = r->head_len + r->body_len, left;
  int n, rc;
  if (c->tls != NULL) {
    om__up_tls_write_request(c);
    return;
  }
  b[0] = uv_buf_init(r->head, (unsigned)r->head_len);
  if (r->body_len > 0) {
    b[1] = uv_buf_init((char *)r->body, (unsigned)r->body_len);
    nb = 2;
  }
  n = uv_try_write((uv_stream_t *)&c->tcp, b, nb);
  if (n == UV_EAGAIN || n == UV_ENOSYS)
    n = 0;
  if (n < 0) {
    /* refused at once (a reset that came before our first byte): nothing
     * of this attempt left, so res.sent keeps what earlier attempts did */
    attempt_fail(c, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, 0, uv_strerror(n));
    return;
  }
  if (n > 0)
    r->res.sent = 1;
  if ((size_t)n == total) {
    om__up_body_flush(c);
    return;
  }
  left = (size_t)n;
  while (left >= b[k].len) {
    left -= b[k].len;
    k++;
  }
  b[k].base += left;
  b[k].len -= (unsigned)left;
  c->wreq.data = c;
  rc = uv_write(&c->wreq, (uv_stream_t *)&c->tcp, b + k, nb - k,
                om__up_on_write);
  if (rc != 0) {
    attempt_fail(c, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, 0, uv_strerror(rc));
    return;
  }
  r->res.sent = 1; /* queued: bytes may leave from here on */
  c->writing = 1;
}

/* c (connected or pooled) starts carrying its request. */
void om__up_conn_start(conn_t *c) {
  req_t *r = c->req;
  c->phase = PH_HEAD;
  c->nreqs++;
  c->pos = c->len = 0;
  c->interim_bytes = 0;
  head_reset(c);
  c->broken = 0;
  r->got_bytes = 0;
  /* a streamed body: the wait for the answer starts at its end */
  r->first_byte_due = r->first_byte_ms != 0 && (!r->streamed || r->body_ended)
                          ? now_ms(c->pool) + r->first_byte_ms
                          : 0;
  conn_arm(c);
  if (r->paused)
    om__up_read_off(c);
  else
    om__up_read_on(c);
  conn_write(c);
}

/*
 * The class of a connect error: LOCAL when this process lacks the
 * resource (a descriptor, kernel buffers or memory, an ephemeral port:
 * connect(2) says EADDRNOTAVAIL when the local port range is spent), so
 * the peer is not to blame; CONNECT otherwise (refused, unreachable, ...).
 */
om_upstream_fail_t om__up_connect_class(int uverr) {
  switch (uverr) {
  case UV_EMFILE:
  case UV_ENFILE:
  case UV_ENOBUFS:
  case UV_ENOMEM:
  case UV_EADDRNOTAVAIL:
    return OM_UPSTREAM_FAIL_LOCAL;
  default:
    return OM_UPSTREAM_FAIL_CONNECT;
  }
}

static void on_connect(uv_connect_t *cr, int status) {
  conn_t *c = cr->data;
  if (c->closing || c->req == NULL)
    return;
  if (status < 0) {
    c->req->res.os_err = status;
    attempt_fail(c, om__up_connect_class(status), 0, uv_strerror(status));
    return;
  }
  if (c->peer->target.tls) {
    om__up_tls_start(c); /* the request starts after the handshake */
    return;
  }
  om__up_conn_start(c);
}

/*
 * A new connection for r to r->peer. Returns 0 (connecting; or a
 * synchronous connect error already ended r), OM_ENOMEM with nothing
 * changed.
 */
int om__up_conn_connect(req_t *r) {
  om_upstream_pool_t *p = r->pool;
  peer_t *e = r->peer;
  conn_t *c = calloc(1, sizeof *c);
  int rc;
  if (c == NULL)
    return OM_ENOMEM;
  om_list_init(&c->link);
  om_list_init(&c->ilink);
  c->cap = p->o.read_buffer_bytes;
  c->cap_max = p->o.max_header_bytes + READ_MIN > c->cap
                   ? p->o.max_header_bytes + READ_MIN
                   : c->cap;
  c->buf = malloc(c->cap);
  if (c->buf == NULL) {
    free(c);
    return OM_ENOMEM;
  }
  c->pool = p;
  c->peer = e;
  e->refs++;
  p->nconns++;
  uv_tcp_init(p->loop, &c->tcp);
  uv_timer_init(p->loop, &c->timer);
  c->tcp.data = c->timer.data = c->creq.data = c->wreq.data = c;
  c->handles = 2;
  om_list_push_front(&p->conns, &c->link);
  c->phase = PH_CONNECTING;
  c->req = r;
  r->conn = c;
  e->st.active++;
  p->st.active++;
  e->st.connects++;
  p->st.connects++;
  r->res.connects++;
  r->res.reused = 0;
  r->connect_due = r->connect_ms != 0 ? now_ms(p) + r->connect_ms : 0;
  uv_tcp_nodelay(&c->tcp, 1);
  rc = uv_tcp_connect(&c->creq, &c->tcp, &e->target.addr.sa, on_connect);
  if (rc != 0) {
    om__up_detach(c);
    om__up_conn_close(c);
    r->res.os_err = rc;
    om__up_req_end(r, om__up_connect_class(rc), 0, uv_strerror(rc));
    return 0;
  }
  conn_arm(c);
  return 0;
}

/* ------------------------------------------------------------------ */
/* response parsing (the grammar is core/om_http1.c's) */

enum { STEP_GO, STEP_MORE, STEP_STOP };

/* The failure detail for a refusal of the framing module (the client's
 * own wording, stable for callers and tests), and its error code. */
static const char *fail_detail(om_http1_err_t e, int *err) {
  *err = OM_EPARSE;
  switch (e) {
  case OM_HTTP1_E_STATUS_VERSION:
    return "the status line does not start with HTTP/1.0 or HTTP/1.1";
  case OM_HTTP1_E_BARE_LF:
    return "a bare LF in the response head";
  case OM_HTTP1_E_END_BARE_CR:
    return "a bare CR in the response head";
  case OM_HTTP1_E_TOO_MANY_FIELDS:
    *err = OM_ETOOBIG;
    return "more response header fields than max_headers";
  case OM_HTTP1_E_HEAD_TOO_LARGE:
    *err = OM_ETOOBIG;
    return "the response head exceeds max_header_bytes";
  case OM_HTTP1_E_TE_HTTP10:
    return "Transfer-Encoding in an HTTP/1.0 response";
  case OM_HTTP1_E_TE_BAD:
  case OM_HTTP1_E_TE_NOT_CHUNKED:
  case OM_HTTP1_E_TE_UNSUPPORTED:
    return "a Transfer-Encoding other than chunked";
  case OM_HTTP1_E_CHUNK_TOO_LARGE:
    return "a chunk size over 2^63-1";
  case OM_HTTP1_E_CHUNK_BARE_CR:
    return "a malformed chunk extension";
  case OM_HTTP1_E_CHUNK_LINE_TOO_LONG:
    return "a chunk line over 4 KiB";
  case OM_HTTP1_E_TRAILER_TOO_LARGE:
    *err = OM_ETOOBIG;
    return "the trailer section exceeds max_header_bytes";
  case OM_HTTP1_E_TRAILER_OBS_FOLD:
  case OM_HTTP1_E_CHUNK_END:
    return "a malformed trailer field";
  case OM_HTTP1_E_TRAILER_CONTENT_LENGTH:
    return "an invalid Content-Length in the trailer section";
  default: /* the module's own description is the client's wording */
    return om_http1_err_desc(e);
  }
}

/* A response broke the framing rules: end the attempt. */
static int malformed(conn_t *c, int err, const char *detail) {
  attempt_fail(c, OM_UPSTREAM_FAIL_MALFORMED, err, detail);
  return STEP_STOP;
}

static int refused(conn_t *c, om_http1_err_t e) {
  int err;
  const char *detail = fail_detail(e, &err);
  return malformed(c, err, detail);
}

/* A fresh head parser at c->pos; 1xx heads already skipped count
 * against the limit. */
static void head_reset(conn_t *c) {
  size_t max = c->pool->o.max_header_bytes;
  om_http1_head_init(&c->head, OM_HTTP1_RESPONSE, c->fields, c->fields_cap,
                     c->pool->o.max_headers,
                     max > c->interim_bytes ? max - c->interim_bytes : 0);
}

/*
 * After a user callback: 0 to go on, or STEP_STOP when the request was
 * cancelled (released here), ended (the pool closed) or paused.
 */
static int after_cb(conn_t *c, req_t *r) {
  if (r->cancelled) {
    om__up_req_recycle(r);
    return STEP_STOP;
  }
  if (c->req != r || c->closing || r->paused)
    return STEP_STOP;
  return 0;
}

/* The response ended cleanly: pool or close c, then on_done. */
static int msg_complete(conn_t *c) {
  req_t *r = c->req;
  om_upstream_pool_t *p = c->pool;
  /* reused only when the whole request went out, a streamed body too */
  int reuse = c->keepalive && !c->writing && !c->broken && !c->lent_out &&
              c->pos == c->len && !p->closing &&
              (!r->streamed || (r->body_ended && r->bq_head == NULL)) &&
              (c->tls == NULL || !om__up_tls_stray(c));
  /* a connection that carried its share is retired, not pooled */
  int retire = reuse && r->max_reqs != 0 && c->nreqs >= r->max_reqs;
  om__up_detach(c);
  if (retire) {
    c->peer->st.retired++;
    p->st.retired++;
  }
  if (reuse && !retire)
    conn_make_idle(c, r);
  else
    om__up_conn_close(c);
  om__up_req_end(r, OM_UPSTREAM_OK, 0, "");
  return STEP_STOP;
}

static int deliver(conn_t *c, req_t *r, const char *data, size_t n) {
  r->res.body_bytes += n;
  if (r->cb.on_body == NULL)
    return 0;
  r->in_cb = 1;
  r->cb.on_body(r->ud, data, n);
  r->in_cb = 0;
  return after_cb(c, r);
}

/* What the head says about the connection and the body. */
typedef struct {
  int body; /* OM_HTTP1_BODY_* */
  int te_lookalike;
  uint64_t cl;
  conn_opts_t co;
} head_t;

/*
 * The complete head b[0, c->head.pos): fields to c->hdrs (exact lengths,
 * not yet NUL-terminated), then the framing decision (RFC 9112 6). 0, or
 * a module error (and *oom for no memory for the fields).
 */
static om_http1_err_t head_fields(conn_t *c, const char *b, head_t *h,
                                  int *oom) {
  const om_http1_head_t *hd = &c->head;
  om_http1_framing_t fr;
  om_http1_err_t e;
  size_t i, n = hd->n_fields;
  memset(h, 0, sizeof *h);
  *oom = 0;
  if (n > c->hdrs_cap) {
    om_http_header_t *nh = realloc(c->hdrs, n * sizeof *nh);
    if (nh == NULL) {
      *oom = 1;
      return OM_HTTP1_OK;
    }
    c->hdrs = nh;
    c->hdrs_cap = n;
  }
  om_http1_framing_init(&fr, OM_HTTP1_RESPONSE);
  for (i = 0; i < n; i++) {
    const om_http1_field_t *f = &c->fields[i];
    om_http_header_t *o = &c->hdrs[i];
    o->name = b + f->name_off;
    o->name_len = f->name_len;
    o->value = b + f->value_off;
    o->value_len = f->value_len;
    e = om_http1_framing_field(&fr, o->name, o->name_len, o->value,
                               o->value_len);
    if (e != OM_HTTP1_OK)
      return e;
    if (om__up_field_kind(o->name, o->name_len) == F_CONNECTION &&
        om__up_conn_walk(o->value, o->value_len, om__up_conn_opt, &h->co) != 0)
      return OM_HTTP1_E__COUNT; /* see step_head */
  }
  h->cl = fr.cl;
  /* beside a real Transfer-Encoding only: alone it changes nothing the
   * client reads (see om_http1_framing_t) */
  h->te_lookalike = fr.te_lookalike_last && fr.n_te > 0;
  return om_http1_framing_end(&fr, hd->minor, hd->status, c->req->is_head,
                              &h->body);
}

/* Keep only the end-to-end fields, NUL-terminate them in place. */
static size_t filter_fields(conn_t *c, size_t n, int named) {
  size_t i, k = 0;
  for (i = 0; i < n; i++) {
    om_http_header_t f = c->hdrs[i];
    int kind = om__up_field_kind(f.name, f.name_len);
    int drop =
        kind == F_HOP || kind == F_CONNECTION || kind == F_TE ||
        (named && om__up_named_in_connection(c->hdrs, n, f.name, f.name_len));
    if (drop)
      continue;
    c->hdrs[k++] = f;
  }
  /* only now: the Connection values were needed intact until here */
  for (i = 0; i < k; i++) {
    ((char *)c->hdrs[i].name)[c->hdrs[i].name_len] = 0;
    ((char *)c->hdrs[i].value)[c->hdrs[i].value_len] = 0;
  }
  return k;
}

/* The tunnel is done with an upstream connection. */
static void tunnel_release(void *owner, int reset) {
  conn_t *c = owner;
  c->tunnel = NULL;
  if (reset && !c->closing) {
    c->closing = 1;
    om_list_remove(&c->link);
    if (uv_tcp_close_reset(&c->tcp, on_conn_closed) != 0)
      uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
    uv_close((uv_handle_t *)&c->timer, on_conn_closed);
    return;
  }
  om__up_conn_close(c);
}

int om_upstream_take_tunnel(om_upstream_req_t *r,
                            const om_tunnel_callbacks_t *cb, void *ud,
                            om_tunnel_t **out) {
  conn_t *c;
  int rc;
  if (r == NULL || cb == NULL || cb->on_data == NULL || cb->on_close == NULL ||
      out == NULL)
    return OM_EINVAL;
  c = r->conn;
  if (!r->in_101 || c == NULL || c->tunnel != NULL || c->closing)
    return OM_ESTATE;
  om__up_read_off(c);
  rc = om__tunnel_new(&c->tcp, c->buf + c->pos, c->len - c->pos, tunnel_release,
                      c, cb, ud, &c->tunnel);
  if (rc != 0) {
    om__up_read_on(c);
    return rc;
  }
  /* over TLS the tunnel decrypts and encrypts with the connection's
   * engine, which lives until the handle closes (on_conn_closed) */
  if (c->tls != NULL)
    om__tunnel_use_tls(c->tunnel, c->tls, om_tls_in_pending(c->tls));
  c->pos = c->len = 0;
  uv_timer_stop(&c->timer);
  c->timer_due = 0;
  c->phase = PH_TUNNEL;
  *out = c->tunnel;
  return 0;
}

/*
 * A 101 (RFC 9110 15.2.2): only to a request that asked, and with the
 * Upgrade field that names the protocol switched to. on_headers takes the
 * connection as a tunnel or the request ends "aborted".
 */
static int step_101(conn_t *c, char *b, size_t end) {
  req_t *r = c->req;
  const om_http1_head_t *hd = &c->head;
  size_t i;
  if (!r->upgrade)
    return malformed(c, OM_EPARSE,
                     "101 Switching Protocols (no upgrade was asked for)");
  c->resp.upgrade = NULL;
  c->resp.upgrade_len = 0;
  for (i = 0; i < hd->n_fields; i++) {
    om_http_header_t *f = &c->hdrs[i];
    if (f->name_len == 7 && om__http_ci_eq(f->name, 7, "upgrade") &&
        c->resp.upgrade == NULL) {
      c->resp.upgrade = f->value;
      c->resp.upgrade_len = f->value_len;
    }
  }
  if (c->resp.upgrade == NULL || c->resp.upgrade_len == 0)
    return malformed(c, OM_EPARSE, "101 Switching Protocols without Upgrade");
  ((char *)c->resp.upgrade)[c->resp.upgrade_len] = 0;
  c->pos += end;
  b[hd->reason_off + hd->reason_len] = 0;
  c->resp.status = 101;
  c->resp.version_minor = hd->minor;
  c->resp.reason = b + hd->reason_off;
  c->resp.reason_len = hd->reason_len;
  c->resp.n_headers = filter_fields(c, hd->n_fields, 1);
  c->resp.headers = c->hdrs;
  c->resp.has_body = 0;
  c->resp.content_length = 0;
  r->res.headers_delivered = 1;
  if (r->cb.on_headers != NULL) {
    r->in_cb = 1;
    r->in_101 = 1;
    (void)r->cb.on_headers(r->ud, &c->resp);
    r->in_101 = 0;
    r->in_cb = 0;
    if (r->cancelled) {
      om__up_req_recycle(r);
      return STEP_STOP;
    }
    if (c->req != r)
      return STEP_STOP; /* the pool closed: the request ended there */
  }
  /* a tunnel taken and closed inside on_headers closed c: aborted */
  om__up_detach(c);
  if (c->tunnel != NULL && !c->closing) {
    r->res.upgraded = 1;
    om__up_req_end(r, OM_UPSTREAM_OK, 0, "");
    return STEP_STOP;
  }
  om__up_conn_close(c);
  om__up_req_end(r, OM_UPSTREAM_FAIL_ABORTED, 0,
                 "the 101 tunnel was not taken");
  return STEP_STOP;
}

/* The response head: parse, check, skip 1xx, hand it over. */
static int step_head(conn_t *c) {
  req_t *r = c->req;
  om_http1_head_t *hd = &c->head;
  head_t h;
  char *b = c->buf + c->pos;
  size_t end;
  int rc, oom;
  om_http1_err_t e;
  for (;;) {
    rc = om_http1_head_parse(hd, b, c->len - c->pos);
    if (rc != OM_HTTP1_GROW)
      break;
    {
      size_t cap = c->fields_cap ? c->fields_cap * 2 : HDRS_INITIAL;
      om_http1_field_t *nf;
      if (cap > c->pool->o.max_headers)
        cap = c->pool->o.max_headers;
      nf = realloc(c->fields, cap * sizeof *nf);
      if (nf == NULL) {
        attempt_fail(c, OM_UPSTREAM_FAIL_INTERNAL, OM_ENOMEM,
                     "out of memory for the response fields");
        return STEP_STOP;
      }
      c->fields = hd->fields = nf;
      c->fields_cap = hd->fields_cap = cap;
    }
  }
  if (rc == OM_HTTP1_MORE)
    return STEP_MORE;
  if (rc == OM_HTTP1_ERROR)
    return refused(c, hd->err);
  end = hd->pos;
  e = head_fields(c, b, &h, &oom);
  if (oom) {
    attempt_fail(c, OM_UPSTREAM_FAIL_INTERNAL, OM_ENOMEM,
                 "out of memory for the response fields");
    return STEP_STOP;
  }
  if (e == OM_HTTP1_E__COUNT)
    return malformed(c, OM_EPARSE, "a Connection element that is not a token");
  if (e != OM_HTTP1_OK)
    return refused(c, e);
  if (hd->status == 101)
    return step_101(c, b, end);
  if (h.te_lookalike)
    return malformed(c, OM_EPARSE,
                     "a field named like Transfer-Encoding beside it");
  if (hd->status < 200) {
    /* an interim response: skip it, the final one follows (RFC 9110
     * 15.2); its bytes count against the head limit */
    c->interim_bytes += end;
    c->pos += end;
    head_reset(c);
    return STEP_GO;
  }
  c->pos += end;
  c->keepalive = hd->minor == 1 && !h.co.close && h.body != OM_HTTP1_BODY_CLOSE;
  b[hd->reason_off + hd->reason_len] = 0;
  c->resp.status = hd->status;
  c->resp.version_minor = hd->minor;
  c->resp.reason = b + hd->reason_off;
  c->resp.reason_len = hd->reason_len;
  c->resp.n_headers = filter_fields(c, hd->n_fields, h.co.others);
  c->resp.headers = c->hdrs;
  c->resp.has_body = h.body != OM_HTTP1_BODY_NONE;
  c->resp.content_length = h.body == OM_HTTP1_BODY_LENGTH ? (int64_t)h.cl
                           : h.body == OM_HTTP1_BODY_NONE ? 0
                                                          : -1;
  switch (h.body) {
  case OM_HTTP1_BODY_LENGTH:
    c->phase = PH_BODY_CL;
    c->remaining = h.cl;
    break;
  case OM_HTTP1_BODY_CHUNKED:
    c->phase = PH_CHUNKED;
    /* the trailer limit counts the section's last LF too */
    om_http1_chunked_init(&c->ch, (uint64_t)INT64_MAX,
                          c->pool->o.max_header_bytes - 1);
    break;
  case OM_HTTP1_BODY_CLOSE:
    c->phase = PH_BODY_EOF;
    break;
  default:
    c->phase = PH_BODY_CL;
    c->remaining = 0;
    break;
  }
  r->res.headers_delivered = 1;
  if (r->cb.on_headers != NULL) {
    int verdict;
    r->in_cb = 1;
    verdict = r->cb.on_headers(r->ud, &c->resp);
    r->in_cb = 0;
    if (r->cancelled) {
      om__up_req_recycle(r);
      return STEP_STOP;
    }
    if (c->req != r || c->closing)
      return STEP_STOP;
    if (verdict != 0) {
      om__up_detach(c);
      om__up_conn_close(c);
      om__up_req_end(r, OM_UPSTREAM_FAIL_ABORTED, 0,
                     "on_headers asked to abort");
      return STEP_STOP;
    }
  }
  if (h.body == OM_HTTP1_BODY_NONE)
    return msg_complete(c);
  return r->paused ? STEP_STOP : STEP_GO;
}

/* A chunked body (RFC 9112 7.1): the decoder hands back spans of data in
 * place, which are delivered as they come. */
static int step_chunked(conn_t *c) {
  const char *b = c->buf + c->pos, *span;
  size_t avail = c->len - c->pos, used, span_len;
  int rc;
  if (avail == 0)
    return STEP_MORE;
  rc = om_http1_chunked_decode(&c->ch, b, avail, &used, &span, &span_len);
  if (rc == OM_HTTP1_ERROR)
    return refused(c, c->ch.err);
  c->pos += used;
  if (rc == OM_HTTP1_DONE)
    return msg_complete(c);
  if (rc == OM_HTTP1_DATA)
    return deliver(c, c->req, span, span_len);
  return STEP_MORE;
}

/* Body bytes in place: Content-Length or close-delimited. */
static int step_data(conn_t *c) {
  req_t *r = c->req;
  const char *b = c->buf + c->pos;
  size_t avail = c->len - c->pos, n = avail;
  int rc;
  if (c->phase == PH_BODY_CL && c->remaining == 0)
    return msg_complete(c); /* paused in the on_body of the last bytes */
  if (c->phase != PH_BODY_EOF && c->remaining < n)
    n = (size_t)c->remaining;
  if (n == 0)
    return STEP_MORE;
  c->pos += n;
  if (c->phase != PH_BODY_EOF)
    c->remaining -= n;
  rc = deliver(c, r, b, n);
  if (rc != 0)
    return rc;
  if (c->phase == PH_BODY_CL && c->remaining == 0)
    return msg_complete(c);
  return STEP_GO;
}

/* Run c's request through what is buffered, until more bytes are needed
 * or the request stops (ended, paused, cancelled). */
void om__up_conn_process(conn_t *c) {
  for (;;) {
    int rc;
    if (c->closing || c->req == NULL || c->req->paused)
      return;
    switch (c->phase) {
    case PH_HEAD:
      rc = step_head(c);
      break;
    case PH_BODY_CL:
    case PH_BODY_EOF:
      rc = step_data(c);
      break;
    case PH_CHUNKED:
      rc = step_chunked(c);
      break;
    default:
      return;
    }
    /* TLS: what was read is decrypted as the parser asks for it */
    if (rc == STEP_MORE && c->tls != NULL && om__up_tls_pull(c) == 1)
      continue;
    if (rc != STEP_GO)
      return;
  }
}

/* EOF or a read error on a connection carrying a request. */
void om__up_conn_eof(conn_t *c, ssize_t err) {
  int eof = err == UV_EOF;
  if (err == UV_ENOBUFS) {
    attempt_fail(c, OM_UPSTREAM_FAIL_INTERNAL, OM_ENOMEM,
                 "out of memory for the read buffer");
    return;
  }
  switch (c->phase) {
  case PH_HEAD:
    attempt_fail(c, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, 0,
                 !eof                ? uv_strerror((int)err)
                 : c->req->got_bytes ? "the connection closed inside the "
                                       "response head"
                                     : "the connection closed before any "
                                       "response byte");
    return;
  case PH_BODY_EOF:
    if (eof) { /* a close-delimited body ends here (RFC 9112 6.3 item 8) */
      msg_complete(c);
      return;
    }
    break;
  default:
    break;
  }
  attempt_fail(c, OM_UPSTREAM_FAIL_RESET_MID_BODY, 0,
               eof ? "the connection closed before the end of the body"
                   : uv_strerror((int)err));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  conn_t *c = s->data;
  if (nread == 0 || c->closing)
    return;
  if (c->tls != NULL) {
    om__up_tls_on_read(c, nread);
    return;
  }
  c->read_full = nread > 0 && (size_t)nread == buf->len;
  if (c->req == NULL) {
    /* pooled: the server closed it, or sent what nobody asked for */
    om__up_conn_close(c);
    return;
  }
  if (nread > 0) {
    c->len += (size_t)nread;
    c->req->got_bytes = 1;
    om__up_conn_process(c);
    return;
  }
  om__up_conn_eof(c, nread);
}
