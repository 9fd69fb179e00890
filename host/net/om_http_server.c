/*
 * om_http_server.c: HTTP/1.1 server on libuv (see om_http_server.h).
 *
 * Reading a request, per connection:
 *   raw bytes -> scan_head (om_http1_head_parse, core/om_http1.c: the
 *   strict RFC 9112 head parser finds the end of the header section,
 *   enforces the limits, records every field) -> check_semantics
 *   (version, method, target, Host, Content-Length / Transfer-Encoding
 *   through om_http1_framing_*, Expect) -> body: decode (a length count,
 *   or om_http1_chunked_decode handing back spans) -> a complete request
 *   is queued; the queue is dispatched one at a time. Every message is
 *   parsed once; http-parser is a differential oracle in the tests
 *   (tests/test_http1_fuzz.c), not a second runtime parse.
 * After any rejection the connection is "dead": nothing more is parsed,
 * bytes are read and dropped (so the peer sees our answer, not a reset),
 * the error answer is sent once the responses before it have ended, and
 * the connection is half-closed, then closed.
 *
 * Closing: conn_close runs on_close callbacks, so it is called only from
 * loop callbacks; inside an API call a broken connection is marked
 * `failed` and closed from its timer on the next loop turn.
 */
#include "om_http_server.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "om_errno.h"
#include "om_http1.h"
#include "om_http_chars.h"
#include "om_log.h"

/* ------------------------------------------------------------------ */
/* limits and defaults */

#define DEF_MAX_HEADER_BYTES (16u * 1024u)
#define CAP_MAX_HEADER_BYTES (64u * 1024u)
#define MIN_MAX_HEADER_BYTES 64u
#define DEF_MAX_HEADERS 100u
#define DEF_MAX_BODY_BYTES (1024u * 1024u)
#define DEF_HEADER_TIMEOUT_MS 10000u
#define DEF_IDLE_TIMEOUT_MS 60000u
#define DEF_DRAIN_TIMEOUT_MS 5000u
#define DEF_MAX_CONNECTIONS 10000u
#define DEF_MAX_PIPELINED 16u

/* framing bytes allowed in one chunked body */
#define OVERHEAD_MAX(max_body) ((max_body) > 65536u ? (max_body) : 65536u)
#define LINGER_MS 2000u        /* RFC 9112 9.6: read after our FIN this long */
#define DISCARD_MAX (1u << 20) /* bytes dropped after an error before a cut */
#define READ_MIN 2048u         /* smallest read buffer we hand libuv */
#define READ_SLACK (16u * 1024u)
#define SCRATCH_BYTES (16u * 1024u)

/* ------------------------------------------------------------------ */
/* rejection names */

const char *om_http_reject_name(om_http_reject_t reason) {
  switch (reason) {
#define OM__HTTP_REJECT_NAME(name, status, str)                                \
  case OM_HTTP_REJECT_##name:                                                  \
    return str;
    OM_HTTP_REJECT_MAP(OM__HTTP_REJECT_NAME)
#undef OM__HTTP_REJECT_NAME
  default:
    return "unknown";
  }
}

int om_http_reject_status(om_http_reject_t reason) {
  switch (reason) {
#define OM__HTTP_REJECT_STATUS(name, status, str)                              \
  case OM_HTTP_REJECT_##name:                                                  \
    return status;
    OM_HTTP_REJECT_MAP(OM__HTTP_REJECT_STATUS)
#undef OM__HTTP_REJECT_STATUS
  default:
    return 0;
  }
}

/* ------------------------------------------------------------------ */
/* types */

/* The body being read: a Content-Length count, or the chunked decoder
 * (core/om_http1.c). */
typedef struct {
  int chunked;
  uint64_t left; /* Content-Length bytes still to come */
  om_http1_chunked_t ch;
} dec_t;

typedef struct om_http_conn_s conn_t;

/*
 * Output corking. A response's head, its body and the end of a chunked
 * stream are usually written from one callback (an upstream read that
 * carried all of them), and pipelined responses from one read of the
 * client. Small writes are gathered per connection and sent in one
 * syscall at the end of the loop turn (uv_check runs right after the I/O
 * callbacks), so a small response costs one write, as nginx's writev
 * does. Larger writes go out at once, behind what was gathered. Buffers
 * are lent by the server and returned at the flush, so an idle connection
 * holds none.
 */
#define OB_CAP 4096
#define OB_SPARES 16

enum { RS_NONE, RS_STREAMING };
enum { RF_NOBODY, RF_FIXED, RF_CHUNKED, RF_CLOSE };

typedef struct req_s {
  om_http_request_t pub; /* first: the handler's pointer is ours */
  conn_t *conn;          /* NULL once the client is gone */
  struct req_s *next;
  om_http_close_fn on_close;
  om_http_drain_fn on_drain;
  size_t drain_low;
  char *body;
  size_t body_cap;
  uint64_t resp_left;
  int rstate, rframe;
  unsigned keep_alive : 1, is_head : 1, want_continue : 1, continue_sent : 1,
      in_close_cb : 1, resp_close : 1;
} req_t;

/*
 * A connection's lifecycle, in order; a phase is never re-entered. Any
 * phase before FAILED may end in FAILED (a broken connection inside an
 * API call: closed from its timer on the next loop turn) or CLOSING.
 */
enum phase {
  PH_READING,   /* requests are parsed (ps) and dispatched in order */
  PH_LAST,      /* the last request is in ("close", HTTP/1.0): nothing
                   more is parsed, later bytes are read and dropped */
  PH_ERRORING,  /* a request was refused: nothing more is parsed; the
                   answer goes out once the responses before it end */
  PH_SHUTTING,  /* queued bytes flushed, then our FIN (uv_shutdown) */
  PH_LINGERING, /* FIN sent: reading and dropping until the client's EOF
                   or LINGER_MS (RFC 9112 9.6) */
  PH_FAILED,    /* to be closed from the timer on the next loop turn */
  PH_CLOSING    /* uv_close called: the handles are closing */
};

/* Where the parse of the next request stands, while PH_READING. */
enum { P_HEAD, P_BODY };

struct om_http_conn_s {
  uv_tcp_t tcp;
  uv_timer_t timer;
  uv_shutdown_t shut;
  om_http_server_t *srv;
  conn_t *prev, *next;
  int handles;
  char *in;
  size_t in_off, in_len, in_cap;
  om_http1_head_t sc; /* the header section being read */
  om_http1_field_t *fields;
  size_t fields_cap;
  enum phase phase;
  int ps;
  req_t *cur; /* request whose body is being read */
  dec_t dec;
  req_t *q_head, *q_tail;
  size_t q_len;
  req_t *active; /* dispatched, response not ended */
  om_http_reject_t err;
  /* facts independent of the phase: the error answer is to a HEAD; the
   * header timer's start (the accept for the first request, hstart_set
   * once its first byte came); the client's FIN came; libuv is reading;
   * the pump is running or asked to run again; on the corked list; how
   * the FIN ends (no_linger: no lingering read after it) */
  unsigned err_head : 1, fresh : 1, hstart_set : 1, eof : 1, reading : 1,
      in_pump : 1, pump_again : 1, dirty : 1, no_linger : 1;
  char *ob; /* corked output (OB_CAP), flushed at the loop's check phase */
  size_t ob_len;
  conn_t *dprev, *dnext; /* the server's list of corked connections */
  uint64_t t_header, t_read, t_idle, t_write, t_linger;
  size_t discarded;
  struct sockaddr_storage remote;
  char remote_ip[46];
  int remote_port;
};

typedef struct {
  uv_tcp_t tcp; /* first: freed through the handle pointer */
  om_http_server_t *srv;
} reject_conn_t;

struct om_http_server_s {
  uv_loop_t *loop;
  uv_tcp_t listener;
  uv_timer_t drain_timer;
  uv_check_t flush_check; /* flushes corked output once per loop turn */
  conn_t *dirty;
  char *ob_spare[OB_SPARES];
  size_t n_ob_spare;
  uv_tcp_t spare; /* rejects a connection when even malloc fails */
  om_http_server_opts_t o;
  om_http_handler_fn on_request;
  void *ud;
  om_http_closed_fn on_closed;
  conn_t *conns;
  size_t handles, rejects_open;
  unsigned listening : 1, listen_spent : 1, closing : 1, timer_closing : 1,
      spare_busy : 1, finished : 1;
  om_http_server_metrics_t m;
  time_t date_sec;
  char date[40];
  char scratch[SCRATCH_BYTES];
};

static void conn_pump(conn_t *c);
static void conn_update(conn_t *c);
static void on_timer(uv_timer_t *t);
static void conn_close(conn_t *c, int reset);
static void srv_maybe_finish(om_http_server_t *s);

/* ------------------------------------------------------------------ */
/* small helpers */

static uint64_t now_ms(const conn_t *c) {
  return uv_now(c->srv->loop);
}

static void req_free(req_t *r) {
  if (r == NULL)
    return;
  free(r->body);
  free(r);
}

static void conn_drop_requests(conn_t *c) {
  while (c->q_head != NULL) {
    req_t *r = c->q_head;
    c->q_head = r->next;
    req_free(r);
  }
  c->q_tail = NULL;
  c->q_len = 0;
  req_free(c->cur);
  c->cur = NULL;
}

/* Close from the timer on the next loop turn: safe inside API calls. */
static void conn_fail(conn_t *c) {
  if (c->phase >= PH_FAILED)
    return;
  c->phase = PH_FAILED;
  if (c->reading) {
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = 0;
  }
  uv_timer_start(&c->timer, on_timer, 0, 0);
}

/* IMF-fixdate (RFC 9110 5.6.7), cached per second; no locale. */
static const char *http_date(om_http_server_t *s) {
  static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed",
                                  "Thu", "Fri", "Sat"};
  static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  time_t now = time(NULL);
  if (now != s->date_sec || s->date[0] == 0) {
    struct tm tm;
    gmtime_r(&now, &tm);
    snprintf(s->date, sizeof s->date, "%s, %02d %s %04d %02d:%02d:%02d GMT",
             days[tm.tm_wday % 7], tm.tm_mday, months[tm.tm_mon % 12],
             tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
    s->date_sec = now;
  }
  return s->date;
}

/* ------------------------------------------------------------------ */
/* writing */

/* The active response's producer asked to hear when output drains. */
static void conn_check_drain(conn_t *c) {
  req_t *r = c->active;
  om_http_drain_fn cb;
  if (c->phase >= PH_FAILED || r == NULL || r->on_drain == NULL ||
      r->rstate != RS_STREAMING)
    return;
  if (c->ob_len + uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) >
      r->drain_low)
    return;
  cb = r->on_drain;
  r->on_drain = NULL;
  cb(&r->pub);
}

typedef struct {
  uv_write_t req;
  conn_t *c;
  char data[];
} wreq_t;

static void on_write(uv_write_t *wr, int status) {
  wreq_t *w = (wreq_t *)wr;
  conn_t *c = w->c;
  free(w);
  if (c->phase == PH_CLOSING || status == UV_ECANCELED)
    return;
  if (status < 0) {
    conn_close(c, 0);
    return;
  }
  c->t_write = now_ms(c);
  conn_update(c);
  conn_check_drain(c);
}

/*
 * Write bufs in order after everything queued before: straight to the
 * socket when nothing is queued, the rest copied. Returns 0, or OM_ESTATE
 * / OM_ENOMEM with the connection marked failed.
 */
static int conn_send(conn_t *c, const uv_buf_t *bufs, unsigned nb) {
  uv_stream_t *st = (uv_stream_t *)&c->tcp;
  size_t total = 0, done = 0, off = 0;
  unsigned i;
  wreq_t *w;
  uv_buf_t b;
  int idle_before;
  for (i = 0; i < nb; i++)
    total += bufs[i].len;
  if (c->phase >= PH_FAILED)
    return OM_ESTATE;
  if (total == 0)
    return 0;
  idle_before = uv_stream_get_write_queue_size(st) == 0;
  if (idle_before) {
    int n = uv_try_write(st, bufs, nb);
    if (n >= 0)
      done = (size_t)n;
    else if (n != UV_EAGAIN && n != UV_ENOSYS) {
      conn_fail(c);
      return OM_ESTATE;
    }
  }
  if (done == total)
    return 0;
  w = malloc(sizeof *w + (total - done));
  if (w == NULL) {
    conn_fail(c);
    return OM_ENOMEM;
  }
  w->c = c;
  for (i = 0; i < nb; i++) {
    size_t len = bufs[i].len, skip = 0;
    if (done >= len) {
      done -= len;
      continue;
    }
    skip = done;
    done = 0;
    memcpy(w->data + off, bufs[i].base + skip, len - skip);
    off += len - skip;
  }
  b = uv_buf_init(w->data, (unsigned)off);
  if (uv_write(&w->req, st, &b, 1, on_write) != 0) {
    free(w);
    conn_fail(c);
    return OM_ESTATE;
  }
  if (idle_before)
    c->t_write = now_ms(c);
  conn_update(c);
  return 0;
}

static void dirty_unlink(conn_t *c) {
  om_http_server_t *s = c->srv;
  if (!c->dirty)
    return;
  if (c->dprev != NULL)
    c->dprev->dnext = c->dnext;
  else
    s->dirty = c->dnext;
  if (c->dnext != NULL)
    c->dnext->dprev = c->dprev;
  c->dprev = c->dnext = NULL;
  c->dirty = 0;
}

/* Drop what is corked (sent or not) and lend the buffer back. */
static void ob_release(conn_t *c) {
  om_http_server_t *s = c->srv;
  dirty_unlink(c);
  if (c->ob != NULL) {
    if (s->n_ob_spare < OB_SPARES)
      s->ob_spare[s->n_ob_spare++] = c->ob;
    else
      free(c->ob);
  }
  c->ob = NULL;
  c->ob_len = 0;
}

/* Send what is corked now (in order before anything written later). */
static void conn_flush(conn_t *c) {
  if (c->ob_len > 0 && c->phase < PH_FAILED) {
    uv_buf_t b = uv_buf_init(c->ob, (unsigned)c->ob_len);
    (void)conn_send(c, &b, 1); /* a failure marks the connection */
  }
  ob_release(c);
}

static void on_flush_check(uv_check_t *h) {
  om_http_server_t *s = h->data;
  while (s->dirty != NULL) {
    conn_t *c = s->dirty;
    conn_flush(c);
    conn_check_drain(c);
  }
  uv_check_stop(h);
}

/*
 * Write bufs (at most 3) in order after everything written before:
 * gathered when small (see OB_CAP), else sent now behind the gathered
 * bytes. Returns 0, or OM_ESTATE / OM_ENOMEM with the connection marked
 * failed.
 */
static int conn_write(conn_t *c, const uv_buf_t *bufs, unsigned nb) {
  om_http_server_t *s = c->srv;
  size_t total = 0;
  uv_buf_t v[4];
  unsigned i;
  int rc;
  if (c->phase >= PH_FAILED)
    return OM_ESTATE;
  for (i = 0; i < nb; i++)
    total += bufs[i].len;
  if (total == 0)
    return 0;
  if (c->ob_len + total <= OB_CAP) {
    if (c->ob == NULL)
      c->ob = s->n_ob_spare > 0 ? s->ob_spare[--s->n_ob_spare] : malloc(OB_CAP);
    if (c->ob != NULL) {
      for (i = 0; i < nb; i++) {
        memcpy(c->ob + c->ob_len, bufs[i].base, bufs[i].len);
        c->ob_len += bufs[i].len;
      }
      if (!c->dirty) {
        if (s->dirty == NULL)
          uv_check_start(&s->flush_check, on_flush_check);
        c->dirty = 1;
        c->dprev = NULL;
        c->dnext = s->dirty;
        if (s->dirty != NULL)
          s->dirty->dprev = c;
        s->dirty = c;
      }
      return 0;
    }
    /* no buffer: send directly, it is only slower */
  }
  if (c->ob_len == 0) {
    ob_release(c);
    return conn_send(c, bufs, nb);
  }
  v[0] = uv_buf_init(c->ob, (unsigned)c->ob_len);
  for (i = 0; i < nb && i < 3; i++)
    v[i + 1] = bufs[i];
  rc = conn_send(c, v, i + 1);
  ob_release(c);
  return rc;
}

/* Bounded string builder; the caller reserves the capacity up front. */
typedef struct {
  char *p;
  size_t len;
} sb_t;

static void sb_put(sb_t *b, const char *s, size_t n) {
  memcpy(b->p + b->len, s, n);
  b->len += n;
}

static void sb_puts(sb_t *b, const char *s) {
  sb_put(b, s, strlen(s));
}

static void sb_u64(sb_t *b, uint64_t v) {
  char t[24];
  sb_put(b, t, om__http_u64_dec(t, v));
}

static const char *reason_phrase(int status) {
  return om_http1_reason_phrase(status);
}

/* ------------------------------------------------------------------ */
/* response headers from the caller */

typedef struct {
  int close, has_cl, has_date;
  uint64_t cl;
  size_t bytes; /* their size on the wire */
} rh_t;

static size_t hdr_len(const char *s, size_t n) {
  return n != 0 ? n : (s != NULL ? strlen(s) : 0);
}

/* Names are tokens, values field-content (no CTL but HTAB) so a caller
 * cannot split the response (RFC 9110 5.5); framing is ours. checked: the
 * caller has already held every byte to those rules (fields relayed from
 * om_upstream, which refuses a head that breaks them), so only the
 * fields that decide framing are examined. */
static int check_resp_headers(const om_http_header_t *h, size_t n, int allow_cl,
                              int checked, rh_t *out) {
  size_t i, j;
  memset(out, 0, sizeof *out);
  if (n > 0 && h == NULL)
    return OM_EINVAL;
  for (i = 0; i < n; i++) {
    const char *name = h[i].name, *value = h[i].value;
    size_t nl, vl;
    if (name == NULL || value == NULL)
      return OM_EINVAL;
    nl = hdr_len(name, h[i].name_len);
    vl = hdr_len(value, h[i].value_len);
    if (nl == 0)
      return OM_EINVAL;
    for (j = 0; j < nl && !checked; j++)
      if (!om__http_is_tchar((unsigned char)name[j]))
        return OM_EINVAL;
    for (j = 0; j < vl && !checked; j++) {
      unsigned ch = (unsigned char)value[j];
      if (!om__http_is_fvchar(ch) && !om__http_is_ows(ch))
        return OM_EINVAL;
    }
    if (om__http_ci_eq(name, nl, "content-length")) {
      uint64_t v = 0;
      if (!allow_cl || out->has_cl || vl == 0 || vl > 19)
        return OM_EINVAL;
      for (j = 0; j < vl; j++) {
        if (!om__http_is_digit((unsigned char)value[j]))
          return OM_EINVAL;
        v = v * 10 + (uint64_t)(value[j] - '0');
      }
      out->has_cl = 1;
      out->cl = v;
    } else if (om__http_ci_eq(name, nl, "transfer-encoding")) {
      return OM_EINVAL;
    } else if (om__http_ci_eq(name, nl, "connection")) {
      if (!om__http_ci_eq(value, vl, "close"))
        return OM_EINVAL;
      out->close = 1;
    } else if (om__http_ci_eq(name, nl, "date")) {
      out->has_date = 1;
    }
    out->bytes += nl + vl + 4;
  }
  return 0;
}

enum { CH_NONE, CH_CLOSE, CH_KEEP_ALIVE };

/*
 * The status line and header section; returned in stackbuf when it fits,
 * else malloc'ed (the caller frees it when it differs from stackbuf).
 * NULL on ENOMEM.
 */
static char *build_head(om_http_server_t *s, char *stackbuf, size_t stackcap,
                        int status, const om_http_header_t *h, size_t n,
                        const rh_t *rh, int add_cl, uint64_t cl, int chunked,
                        int conn_hdr, size_t *len) {
  size_t cap = 256 + rh->bytes, i;
  sb_t b;
  char *p = cap <= stackcap ? stackbuf : malloc(cap);
  if (p == NULL)
    return NULL;
  b.p = p;
  b.len = 0;
  sb_puts(&b, "HTTP/1.1 ");
  sb_u64(&b, (uint64_t)status);
  sb_puts(&b, " ");
  /* reason phrases are at most 31 bytes in om_http1_reason_phrase */
  {
    const char *r = reason_phrase(status);
    size_t rl = strlen(r);
    sb_put(&b, r, rl > 40 ? 40 : rl);
  }
  sb_puts(&b, "\r\n");
  for (i = 0; i < n; i++) {
    sb_put(&b, h[i].name, hdr_len(h[i].name, h[i].name_len));
    sb_puts(&b, ": ");
    sb_put(&b, h[i].value, hdr_len(h[i].value, h[i].value_len));
    sb_puts(&b, "\r\n");
  }
  if (!rh->has_date) {
    sb_puts(&b, "Date: ");
    sb_puts(&b, http_date(s));
    sb_puts(&b, "\r\n");
  }
  if (add_cl) {
    sb_puts(&b, "Content-Length: ");
    sb_u64(&b, cl);
    sb_puts(&b, "\r\n");
  }
  if (chunked)
    sb_puts(&b, "Transfer-Encoding: chunked\r\n");
  if (conn_hdr == CH_CLOSE)
    sb_puts(&b, "Connection: close\r\n");
  else if (conn_hdr == CH_KEEP_ALIVE)
    sb_puts(&b, "Connection: keep-alive\r\n");
  sb_puts(&b, "\r\n");
  *len = b.len;
  return p;
}

/* ------------------------------------------------------------------ */
/* connection teardown */

static void on_conn_handle_closed(uv_handle_t *h) {
  conn_t *c = h->data;
  om_http_server_t *s = c->srv;
  if (--c->handles > 0)
    return;
  if (c->prev != NULL)
    c->prev->next = c->next;
  else
    s->conns = c->next;
  if (c->next != NULL)
    c->next->prev = c->prev;
  s->m.connections_active--;
  ob_release(c);
  free(c->in);
  free(c->fields);
  free(c);
  srv_maybe_finish(s);
}

/*
 * Close now. Runs on_close of the active request, so only from loop
 * callbacks (or when no request is active). reset: RST instead of FIN.
 */
static void conn_close(conn_t *c, int reset) {
  enum phase was = c->phase;
  req_t *r;
  if (c->phase == PH_CLOSING)
    return;
  if (!reset && c->phase != PH_FAILED && c->ob_len > 0) {
    /* what a write before the close would have sent at once */
    uv_buf_t b = uv_buf_init(c->ob, (unsigned)c->ob_len);
    (void)uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
  }
  ob_release(c);
  c->phase = PH_CLOSING;
  conn_drop_requests(c);
  r = c->active;
  c->active = NULL;
  if (r != NULL) {
    r->conn = NULL;
    c->srv->m.responses_aborted++;
    if (r->on_close != NULL) {
      r->in_close_cb = 1;
      r->on_close(&r->pub);
      req_free(r);
    }
  }
  if (c->reading) {
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = 0;
  }
  /* after our FIN, a reset would only destroy what the client has yet
   * to read */
  if (!reset || was == PH_SHUTTING || was == PH_LINGERING ||
      uv_tcp_close_reset(&c->tcp, on_conn_handle_closed) != 0)
    uv_close((uv_handle_t *)&c->tcp, on_conn_handle_closed);
  uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
}

static void on_shutdown(uv_shutdown_t *sr, int status) {
  conn_t *c = sr->handle->data;
  if (c->phase >= PH_FAILED || status == UV_ECANCELED)
    return; /* closing, or to be closed from the timer */
  if (status < 0 || c->no_linger || c->eof || c->srv->closing) {
    conn_close(c, 0);
    return;
  }
  /* RFC 9112 9.6: keep reading (and dropping) until the client closes,
   * so unread bytes do not turn our FIN into a reset that could destroy
   * the answer before the client reads it. */
  c->phase = PH_LINGERING;
  c->t_linger = now_ms(c);
  conn_update(c);
}

/*
 * Finish the connection gracefully: nothing more is parsed or dispatched,
 * queued bytes are flushed, then FIN (and a lingering read unless
 * no_linger). Safe inside API calls (no request is active).
 */
static void conn_finish(conn_t *c, int no_linger) {
  if (c->phase >= PH_SHUTTING)
    return;
  conn_drop_requests(c);
  conn_flush(c); /* uv_shutdown waits for queued writes, not corked ones */
  if (c->phase == PH_FAILED)
    return;
  c->phase = PH_SHUTTING;
  c->discarded = 0; /* what lingering may drop before the cut */
  c->no_linger = no_linger ? 1 : 0;
  c->shut.data = c;
  if (uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
    conn_fail(c);
    return;
  }
  conn_update(c);
}

/* ------------------------------------------------------------------ */
/* rejections */

static int scan_method_is_head(const conn_t *c);

static void reject(conn_t *c, om_http_reject_t why) {
  if (c->phase != PH_READING && c->phase != PH_LAST)
    return;
  c->srv->m.rejected[why]++;
  /* RFC 9110 9.3.2: the answer to a HEAD carries no content */
  if (c->cur != NULL)
    c->err_head = c->cur->is_head;
  else
    c->err_head = c->ps == P_HEAD && scan_method_is_head(c);
  c->phase = PH_ERRORING;
  c->err = why;
  req_free(c->cur);
  c->cur = NULL;
  c->in_off = c->in_len; /* never interpret another byte */
  om_log(OM_LOG_DEBUG, "http_reject", "reason", om_http_reject_name(why),
         "remote", c->remote_ip, NULL);
}

static void send_error(conn_t *c) {
  om_http_server_t *s = c->srv;
  int status = om_http_reject_status(c->err);
  char body[96], head[384];
  uv_buf_t bufs[2];
  int bl = snprintf(body, sizeof body, "{\"error\":\"%s\"}",
                    om_http_reject_name(c->err));
  int hl = snprintf(head, sizeof head,
                    "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                    "Content-Length: %d\r\nConnection: close\r\nDate: "
                    "%s\r\n\r\n",
                    status, reason_phrase(status), bl, http_date(s));
  bufs[0] = uv_buf_init(head, (unsigned)hl);
  bufs[1] = uv_buf_init(body, (unsigned)bl);
  /* RFC 9110 9.3.2: no content in a response to HEAD */
  conn_write(c, bufs, c->err_head ? 1 : 2);
}

/* ------------------------------------------------------------------ */
/* the header-section scanner (RFC 9112 2-5) */

/* The answer to a refusal of the framing module. */
static om_http_reject_t reject_of(om_http1_err_t e) {
  switch (e) {
  case OM_HTTP1_E_REQUEST_LINE:
    return OM_HTTP_REJECT_BAD_REQUEST_LINE;
  case OM_HTTP1_E_METHOD_TOO_LONG:
    return OM_HTTP_REJECT_METHOD_NOT_IMPLEMENTED;
  case OM_HTTP1_E_TARGET_BYTE:
    return OM_HTTP_REJECT_BAD_TARGET;
  case OM_HTTP1_E_TARGET_TOO_LONG:
    return OM_HTTP_REJECT_TARGET_TOO_LONG;
  case OM_HTTP1_E_BARE_LF:
  case OM_HTTP1_E_WS_BEFORE_FIRST_FIELD:
  case OM_HTTP1_E_NAME_NOT_TOKEN:
  case OM_HTTP1_E_WS_BEFORE_COLON:
  case OM_HTTP1_E_VALUE_CTL:
  case OM_HTTP1_E_VALUE_BARE_CR:
  case OM_HTTP1_E_END_BARE_CR:
  case OM_HTTP1_E_TRAILER_FIELD:
  case OM_HTTP1_E_TRAILER_BARE_LF:
    return OM_HTTP_REJECT_BAD_HEADER;
  case OM_HTTP1_E_OBS_FOLD:
  case OM_HTTP1_E_TRAILER_OBS_FOLD:
    return OM_HTTP_REJECT_OBS_FOLD;
  case OM_HTTP1_E_TOO_MANY_FIELDS:
  case OM_HTTP1_E_HEAD_TOO_LARGE:
  case OM_HTTP1_E_TRAILER_TOO_LARGE:
  case OM_HTTP1_E_TRAILER_TOO_MANY:
    return OM_HTTP_REJECT_HEADERS_TOO_LARGE;
  case OM_HTTP1_E_CL_INVALID:
  case OM_HTTP1_E_CL_REPEATED:
  case OM_HTTP1_E_TRAILER_CONTENT_LENGTH:
    return OM_HTTP_REJECT_BAD_CONTENT_LENGTH;
  case OM_HTTP1_E_CL_AND_TE:
    return OM_HTTP_REJECT_CONTENT_LENGTH_AND_TRANSFER_ENCODING;
  case OM_HTTP1_E_TE_BAD:
  case OM_HTTP1_E_TE_REPEATED:
  case OM_HTTP1_E_TE_NOT_CHUNKED:
  case OM_HTTP1_E_TE_HTTP10:
    return OM_HTTP_REJECT_BAD_TRANSFER_ENCODING;
  case OM_HTTP1_E_TE_UNSUPPORTED:
    return OM_HTTP_REJECT_UNSUPPORTED_TRANSFER_CODING;
  case OM_HTTP1_E_CHUNK_TOO_LARGE:
    return OM_HTTP_REJECT_BODY_TOO_LARGE;
  case OM_HTTP1_E_CHUNK_SIZE:
  case OM_HTTP1_E_CHUNK_EXT:
  case OM_HTTP1_E_CHUNK_BARE_CR:
  case OM_HTTP1_E_CHUNK_BARE_LF:
  case OM_HTTP1_E_CHUNK_LINE_TOO_LONG:
  case OM_HTTP1_E_CHUNK_DATA_CRLF:
  case OM_HTTP1_E_CHUNK_OVERHEAD:
  case OM_HTTP1_E_CHUNK_END:
    return OM_HTTP_REJECT_BAD_CHUNK;
  default: /* status-line errors: a request has none */
    return OM_HTTP_REJECT_BAD_REQUEST;
  }
}

/* A fresh header-section parser for the next request on c. */
static void scan_reset(conn_t *c) {
  om_http1_head_init(&c->sc, OM_HTTP1_REQUEST, c->fields, c->fields_cap,
                     c->srv->o.max_headers, c->srv->o.max_header_bytes);
}

enum { SCAN_MORE = 0, SCAN_DONE = 1, SCAN_ERROR = -1, SCAN_NOMEM = -2 };

/*
 * Scan b[0..len) (the request so far) from where the last call stopped,
 * growing the field array on demand (up to max_headers). SCAN_DONE with
 * c->sc.pos = the header section's length, SCAN_MORE, SCAN_NOMEM, or
 * SCAN_ERROR with *why.
 */
static int scan_head(conn_t *c, const char *b, size_t len,
                     om_http_reject_t *why) {
  for (;;) {
    int rc = om_http1_head_parse(&c->sc, b, len);
    if (rc == OM_HTTP1_GROW) {
      size_t cap = c->fields_cap ? c->fields_cap * 2 : 16;
      om_http1_field_t *nf;
      if (cap > c->srv->o.max_headers)
        cap = c->srv->o.max_headers;
      nf = realloc(c->fields, cap * sizeof *nf);
      if (nf == NULL)
        return SCAN_NOMEM;
      c->fields = c->sc.fields = nf;
      c->fields_cap = c->sc.fields_cap = cap;
      continue;
    }
    if (rc == OM_HTTP1_ERROR) {
      *why = reject_of(c->sc.err);
      return SCAN_ERROR;
    }
    return rc == OM_HTTP1_DONE ? SCAN_DONE : SCAN_MORE;
  }
}

/* ------------------------------------------------------------------ */
/* request-target and Host (RFC 9112 3.2, RFC 9110 4.2, 7.2, RFC 3986) */

/* ------------------------------------------------------------------ */
/* field semantics */

static size_t skip_ows(const char *v, size_t n, size_t i) {
  while (i < n && om__http_is_ows((unsigned char)v[i]))
    i++;
  return i;
}

/* Walk a #token list (Connection, Expect); calls fn per element. */
static void list_walk(const char *v, size_t n,
                      void (*fn)(const char *e, size_t len, void *arg),
                      void *arg) {
  size_t i = 0;
  while (i < n) {
    size_t s, e;
    i = skip_ows(v, n, i);
    s = i;
    while (i < n && v[i] != ',')
      i++;
    e = i;
    while (e > s && om__http_is_ows((unsigned char)v[e - 1]))
      e--;
    if (e > s)
      fn(v + s, e - s, arg);
    if (i < n)
      i++;
  }
}

typedef struct {
  int close, keep_alive;
} conn_opts_t;

static void conn_opt(const char *e, size_t n, void *arg) {
  conn_opts_t *o = arg;
  if (om__http_ci_eq(e, n, "close"))
    o->close = 1;
  else if (om__http_ci_eq(e, n, "keep-alive"))
    o->keep_alive = 1;
}

typedef struct {
  int cont, other;
} expect_t;

static void expect_opt(const char *e, size_t n, void *arg) {
  expect_t *x = arg;
  if (om__http_ci_eq(e, n, "100-continue"))
    x->cont = 1;
  else
    x->other = 1;
}

/* What the header section says, once it passed every check. */
typedef struct {
  om_http1_target_t tg;
  int minor, wire_minor, chunked, has_cl, has_host, is_head;
  uint64_t cl;
  conn_opts_t co;
  expect_t ex;
} head_t;

static int check_semantics(conn_t *c, const char *b, head_t *h,
                           om_http_reject_t *why) {
  const om_http1_head_t *s = &c->sc;
  const char *m = b + s->line_start;
  size_t ml = s->method_len, i, n_host = 0;
  om_http1_framing_t fr;
  om_http1_err_t fe;
  int body;
  memset(h, 0, sizeof *h);
  om_http1_framing_init(&fr, OM_HTTP1_REQUEST);
  h->is_head = ml == 4 && memcmp(m, "HEAD", 4) == 0;
  /* RFC 9110 15.6.6: 505 for a major version other than 1. RFC 9110 6.2:
   * a higher minor version than ours (HTTP/1.2 .. HTTP/1.9) SHOULD be
   * processed as the highest minor we conform to, 1.1; the version is
   * only a statement of capability, framing stays that of HTTP/1.1. */
  if (s->major != 1) {
    *why = OM_HTTP_REJECT_VERSION_NOT_SUPPORTED;
    return -1;
  }
  h->wire_minor = s->minor;
  h->minor = h->wire_minor > 1 ? 1 : h->wire_minor;
  /* CONNECT would turn the connection into a tunnel: not offered here. */
  if (ml == 7 && memcmp(m, "CONNECT", 7) == 0) {
    *why = OM_HTTP_REJECT_METHOD_NOT_IMPLEMENTED;
    return -1;
  }
  if (om_http1_target_parse(m, ml, b + s->target_off, s->target_len, &h->tg) !=
      0) {
    *why = OM_HTTP_REJECT_BAD_TARGET;
    return -1;
  }
  for (i = 0; i < s->n_fields; i++) {
    const om_http1_field_t *f = &c->fields[i];
    const char *name = b + f->name_off, *val = b + f->value_off;
    size_t nl = f->name_len, vl = f->value_len;
    if (om__http_ci_eq(name, nl, "host")) {
      if (++n_host > 1 || !om_http1_authority_valid(val, vl, 0)) {
        *why = OM_HTTP_REJECT_BAD_HOST;
        return -1;
      }
    } else if (om__http_ci_eq(name, nl, "connection")) {
      list_walk(val, vl, conn_opt, &h->co);
    } else if (om__http_ci_eq(name, nl, "expect")) {
      list_walk(val, vl, expect_opt, &h->ex);
    } else if ((fe = om_http1_framing_field(&fr, name, nl, val, vl)) !=
               OM_HTTP1_OK) {
      /* Content-Length and Transfer-Encoding (RFC 9112 6) */
      *why = reject_of(fe);
      return -1;
    }
  }
  h->has_host = n_host > 0;
  /* RFC 9112 3.2: HTTP/1.1 needs exactly one Host */
  if (h->minor == 1 && n_host != 1) {
    *why = OM_HTTP_REJECT_BAD_HOST;
    return -1;
  }
  fe = om_http1_framing_end(&fr, h->minor, 0, 0, &body);
  if (fe != OM_HTTP1_OK) {
    *why = reject_of(fe);
    return -1;
  }
  h->chunked = body == OM_HTTP1_BODY_CHUNKED;
  h->has_cl = fr.n_cl > 0;
  h->cl = fr.cl;
  if (h->has_cl && h->cl > c->srv->o.max_body_bytes) {
    *why = OM_HTTP_REJECT_BODY_TOO_LARGE;
    return -1;
  }
  /* RFC 9110 10.1.1: ignore Expect in HTTP/1.0; 417 for what we do not
   * meet */
  if (h->minor == 1 && h->ex.other) {
    *why = OM_HTTP_REJECT_EXPECTATION_FAILED;
    return -1;
  }
  /* RFC 9110 9.1: 501 for a method we do not know, last, after every
   * other check of the head has passed */
  if (!om_http1_method_known(m, ml)) {
    *why = OM_HTTP_REJECT_METHOD_NOT_IMPLEMENTED;
    return -1;
  }
  /* a field named like Transfer-Encoding ("Transfer-Encodings"): a
   * reader that takes it for one (http-parser 2.9 does) frames the
   * request otherwise, when there is a Content-Length or when it comes
   * after the last Transfer-Encoding; the answer names what that reader
   * would disagree on */
  if (fr.te_lookalike && (h->has_cl || fr.te_lookalike_last)) {
    *why = h->has_cl ? OM_HTTP_REJECT_BAD_CONTENT_LENGTH
                     : OM_HTTP_REJECT_BAD_TRANSFER_ENCODING;
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* building the request */

static char *put_str(char **p, const char *s, size_t n) {
  char *r = *p;
  memcpy(r, s, n);
  r[n] = 0;
  *p += n + 1;
  return r;
}

static req_t *build_request(conn_t *c, const char *b, const head_t *h) {
  const om_http1_head_t *s = &c->sc;
  size_t ml = s->method_len;
  size_t tl = s->target_len;
  const char *t = b + s->target_off;
  size_t nf = s->n_fields, text, i, n_out;
  /* RFC 9112 3.2.2: with an absolute-form target the server MUST ignore
   * Host and use the target's authority instead. The handler (the proxy
   * routes on Host) sees the authority as the Host value, so no reader
   * of the request can pick the other name; an HTTP/1.0 request without
   * Host gets one (appended last). */
  int add_host = h->tg.absolute && !h->has_host;
  om_http_header_t *hd;
  req_t *r;
  char *p;
  n_out = nf + (add_host ? 1 : 0);
  text = ml + 1 + tl + 1 + h->tg.path_len + 2 + h->tg.query_len + 1;
  for (i = 0; i < nf; i++)
    text += (size_t)c->fields[i].name_len + c->fields[i].value_len + 2;
  if (h->tg.absolute) /* "host" and the authority, in place of the value */
    text += 5 + h->tg.auth_len + 1;
  r = malloc(sizeof *r + n_out * sizeof *hd + text);
  if (r == NULL)
    return NULL;
  memset(r, 0, sizeof *r);
  hd = (om_http_header_t *)(r + 1);
  p = (char *)(hd + n_out);
  r->pub.method = put_str(&p, b + s->line_start, ml);
  r->pub.method_len = ml;
  r->pub.target = put_str(&p, t, tl);
  r->pub.target_len = tl;
  if (h->tg.root) {
    /* RFC 9112 3.2.4: OPTIONS http://host (empty path, no query) asks
     * about the server as a whole: the origin-form of that is "*" */
    int star = !h->tg.has_query && ml == 7 &&
               memcmp(b + s->line_start, "OPTIONS", 7) == 0;
    r->pub.path = put_str(&p, star ? "*" : "/", 1);
    r->pub.path_len = 1;
  } else {
    r->pub.path = put_str(&p, t + h->tg.path_off, h->tg.path_len);
    r->pub.path_len = h->tg.path_len;
  }
  if (h->tg.has_query) {
    r->pub.query = put_str(&p, t + h->tg.query_off, h->tg.query_len);
    r->pub.query_len = h->tg.query_len;
  }
  for (i = 0; i < nf; i++) {
    const om_http1_field_t *f = &c->fields[i];
    char *name = put_str(&p, b + f->name_off, f->name_len);
    size_t j;
    for (j = 0; j < f->name_len; j++)
      if (name[j] >= 'A' && name[j] <= 'Z')
        name[j] = (char)(name[j] | 0x20);
    hd[i].name = name;
    hd[i].name_len = f->name_len;
    if (h->tg.absolute && f->name_len == 4 && memcmp(name, "host", 4) == 0) {
      hd[i].value = put_str(&p, t + h->tg.auth_off, h->tg.auth_len);
      hd[i].value_len = h->tg.auth_len;
    } else {
      hd[i].value = put_str(&p, b + f->value_off, f->value_len);
      hd[i].value_len = f->value_len;
    }
  }
  if (add_host) {
    hd[nf].name = put_str(&p, "host", 4);
    hd[nf].name_len = 4;
    hd[nf].value = put_str(&p, t + h->tg.auth_off, h->tg.auth_len);
    hd[nf].value_len = h->tg.auth_len;
  }
  r->pub.headers = hd;
  r->pub.n_headers = n_out;
  r->pub.body = "";
  r->pub.version_major = 1;
  r->pub.version_minor = h->minor;
  memcpy(&r->pub.remote, &c->remote, sizeof c->remote);
  memcpy(r->pub.remote_ip, c->remote_ip, sizeof c->remote_ip);
  r->pub.remote_port = c->remote_port;
  r->conn = c;
  r->is_head = h->is_head ? 1 : 0;
  /* RFC 9112 9.3: persistent unless "close"; HTTP/1.0 only with
   * keep-alive (Appendix C.2.2) */
  r->keep_alive = !h->co.close && (h->minor == 1 || h->co.keep_alive);
  r->want_continue =
      h->minor == 1 && h->ex.cont && (h->chunked || h->cl > 0) ? 1 : 0;
  return r;
}

static void enqueue(conn_t *c, req_t *r) {
  r->next = NULL;
  if (c->q_tail != NULL)
    c->q_tail->next = r;
  else
    c->q_head = r;
  c->q_tail = r;
  c->q_len++;
  /* RFC 9112 9.6: after a request with "close" (or an HTTP/1.0 one
   * without keep-alive) the server MUST NOT process further requests on
   * the connection: what follows is dropped unparsed, read only to see
   * the client's EOF and keep our FIN from turning into a reset. */
  if (!r->keep_alive) {
    c->phase = PH_LAST;
    c->in_off = c->in_len;
  }
}

static int body_append(conn_t *c, req_t *r, const char *p, size_t k) {
  size_t need = r->pub.body_len + k + 1;
  if (k == 0)
    return 0;
  if (need > r->body_cap) {
    size_t cap = r->body_cap ? r->body_cap : 4096;
    char *nb;
    while (cap < need)
      cap *= 2;
    if (cap > c->srv->o.max_body_bytes + 1 &&
        need <= c->srv->o.max_body_bytes + 1)
      cap = c->srv->o.max_body_bytes + 1;
    nb = realloc(r->body, cap);
    if (nb == NULL)
      return -1;
    r->body = nb;
    r->body_cap = cap;
  }
  memcpy(r->body + r->pub.body_len, p, k);
  r->pub.body_len += k;
  r->body[r->pub.body_len] = 0;
  r->pub.body = r->body;
  return 0;
}

/* A complete, valid header section of `len` bytes at the buffer start. */
static int begin_request(conn_t *c, size_t len) {
  const char *b = c->in + c->in_off;
  om_http_reject_t why;
  head_t h;
  req_t *r;
  if (check_semantics(c, b, &h, &why) != 0) {
    reject(c, why);
    return -1;
  }
  r = build_request(c, b, &h);
  if (r == NULL) {
    conn_fail(c);
    return -1;
  }
  c->in_off += len;
  scan_reset(c);
  memset(&c->dec, 0, sizeof c->dec);
  if (h.chunked) {
    const om_http_server_opts_t *o = &c->srv->o;
    c->dec.chunked = 1;
    om_http1_chunked_init(&c->dec.ch, o->max_body_bytes, o->max_header_bytes);
    /* many tiny chunks with long extensions must not stretch a body
     * limit into gigabytes on the wire */
    c->dec.ch.max_overhead = OVERHEAD_MAX(o->max_body_bytes);
    c->dec.ch.max_trailer_fields = o->max_headers;
  } else if (h.cl > 0) {
    c->dec.left = h.cl;
  } else {
    enqueue(c, r);
    return 0;
  }
  c->cur = r;
  c->ps = P_BODY;
  return 0;
}

/* ------------------------------------------------------------------ */
/* the body decoder (RFC 9112 6.2 length, 7.1 chunked) */

enum { DEC_MORE = 0, DEC_DONE = 1, DEC_ERROR = -1, DEC_NOMEM = -2 };

/* Take body bytes from data[0, n): *used of them are consumed; DEC_DONE
 * when the body ended on the last of them, DEC_ERROR with *why. */
static int decode(conn_t *c, const char *data, size_t n, size_t *used,
                  om_http_reject_t *why) {
  dec_t *d = &c->dec;
  req_t *r = c->cur;
  size_t i = 0;
  if (!d->chunked) { /* RFC 9112 6.2: exactly Content-Length bytes */
    size_t k = (uint64_t)n > d->left ? (size_t)d->left : n;
    *used = 0;
    if (body_append(c, r, data, k) != 0)
      return DEC_NOMEM;
    d->left -= k;
    *used = k;
    return d->left == 0 ? DEC_DONE : DEC_MORE;
  }
  while (i < n) {
    const char *span;
    size_t span_len, u;
    int rc =
        om_http1_chunked_decode(&d->ch, data + i, n - i, &u, &span, &span_len);
    if (rc == OM_HTTP1_DATA) {
      if (body_append(c, r, span, span_len) != 0) {
        *used = i;
        return DEC_NOMEM;
      }
      i += u;
      continue;
    }
    i += u;
    *used = i;
    if (rc == OM_HTTP1_DONE)
      return DEC_DONE;
    if (rc == OM_HTTP1_ERROR) {
      *why = reject_of(d->ch.err);
      return DEC_ERROR;
    }
    return DEC_MORE;
  }
  *used = i;
  return DEC_MORE;
}

/* ------------------------------------------------------------------ */
/* parsing loop */

static int scan_method_is_head(const conn_t *c) {
  const om_http1_head_t *s = &c->sc;
  return om_http1_head_past_method(s) && s->method_len == 4 &&
         memcmp(c->in + c->in_off + s->line_start, "HEAD", 4) == 0;
}

static void conn_parse(conn_t *c) {
  om_http_server_t *s = c->srv;
  while (c->phase == PH_READING && c->q_len < s->o.max_pipelined) {
    size_t avail = c->in_len - c->in_off;
    om_http_reject_t why = OM_HTTP_REJECT_BAD_REQUEST;
    if (avail == 0)
      return;
    if (c->ps == P_HEAD) {
      int rc;
      if (!c->hstart_set) {
        c->t_header = now_ms(c);
        c->hstart_set = 1;
      }
      rc = scan_head(c, c->in + c->in_off, avail, &why);
      if (rc == SCAN_MORE)
        return;
      if (rc == SCAN_NOMEM) {
        conn_fail(c);
        return;
      }
      if (rc == SCAN_ERROR) {
        reject(c, why);
        return;
      }
      c->fresh = 0;
      c->hstart_set = 0;
      if (begin_request(c, c->sc.pos) != 0)
        return;
    } else {
      const char *p = c->in + c->in_off;
      size_t used = 0;
      int rc = decode(c, p, avail, &used, &why);
      if (rc == DEC_NOMEM) {
        conn_fail(c);
        return;
      }
      if (rc == DEC_ERROR) {
        reject(c, why);
        return;
      }
      c->in_off += used;
      if (rc == DEC_MORE)
        return;
      enqueue(c, c->cur);
      c->cur = NULL;
      c->ps = P_HEAD;
    }
  }
}

/*
 * RFC 9110 10.1.1: an HTTP/1.1 request with "Expect: 100-continue" and a
 * body gets one 100 Continue before its final response: as soon as it is
 * the next to be answered while its body is incomplete, else just before
 * dispatch. The server MAY omit it when the body already came; sending it
 * always keeps the bytes on the wire independent of how the request was
 * split into reads.
 */
static void send_continue(conn_t *c, req_t *r) {
  static const char msg[] = "HTTP/1.1 100 Continue\r\n\r\n";
  uv_buf_t b;
  if (r == NULL || !r->want_continue || r->continue_sent)
    return;
  r->continue_sent = 1;
  b = uv_buf_init((char *)msg, sizeof msg - 1);
  conn_write(c, &b, 1);
}

/*
 * Advance the connection: parse, dispatch the next request when none is
 * active, send a pending error answer, notice EOF. Re-entrant calls (a
 * handler answering synchronously) just ask the running pump to go again.
 */
static void conn_pump(conn_t *c) {
  om_http_server_t *s = c->srv;
  if (c->in_pump) {
    c->pump_again = 1;
    return;
  }
  c->in_pump = 1;
  do {
    c->pump_again = 0;
    if (c->phase >= PH_SHUTTING)
      break;
    conn_parse(c);
    if (c->phase >= PH_FAILED || c->active != NULL)
      break;
    if (c->q_head != NULL) {
      req_t *r = c->q_head;
      if (s->closing) {
        conn_finish(c, 1);
        break;
      }
      c->q_head = r->next;
      if (c->q_head == NULL)
        c->q_tail = NULL;
      c->q_len--;
      r->next = NULL;
      c->active = r;
      send_continue(c, r);
      s->m.requests++;
      s->on_request(&r->pub, s->ud);
      c->pump_again = 1;
      continue;
    }
    if (c->phase == PH_ERRORING) {
      send_error(c);
      conn_finish(c, 0);
      break;
    }
    if (s->closing || c->eof) {
      conn_finish(c, 1); /* flush what is queued, then close */
      break;
    }
    if (c->phase == PH_READING && c->ps == P_BODY)
      send_continue(c, c->cur);
  } while (c->pump_again);
  c->in_pump = 0;
  if ((c->phase == PH_READING || c->phase == PH_LAST) &&
      c->in_off == c->in_len && c->in_cap > READ_SLACK && c->ps == P_HEAD &&
      c->sc.pos == 0) {
    free(c->in); /* an idle keep-alive connection keeps no big buffer */
    c->in = NULL;
    c->in_cap = c->in_off = c->in_len = 0;
  }
  conn_update(c);
}

/* ------------------------------------------------------------------ */
/* reading and timers */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  conn_t *c = h->data;
  om_http_server_t *s = c->srv;
  size_t maxcap = s->o.max_header_bytes + READ_SLACK;
  (void)suggested;
  if (c->phase != PH_READING) {
    *buf = uv_buf_init(s->scratch, sizeof s->scratch);
    return;
  }
  if (c->in_off == c->in_len)
    c->in_off = c->in_len = 0;
  if (c->in_cap - c->in_len < READ_MIN && c->in_off > 0) {
    memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
    c->in_len -= c->in_off;
    c->in_off = 0;
  }
  if (c->in_cap - c->in_len < READ_MIN && c->in_cap < maxcap) {
    size_t cap = c->in_cap ? c->in_cap * 2 : 4096;
    char *nb;
    if (cap > maxcap)
      cap = maxcap;
    nb = realloc(c->in, cap);
    if (nb != NULL) {
      c->in = nb;
      c->in_cap = cap;
    }
  }
  *buf = uv_buf_init(c->in ? c->in + c->in_len : NULL,
                     (unsigned)(c->in_cap - c->in_len));
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  conn_t *c = st->data;
  om_http_server_t *s = c->srv;
  if (c->phase == PH_CLOSING)
    return;
  if (nread > 0) {
    c->t_read = now_ms(c);
    if (buf->base == s->scratch) { /* dead: read and drop */
      c->discarded += (size_t)nread;
      /* bytes after a refusal are cut off at some point; bytes after a
       * last request whose response is still on its way stop being read
       * there (conn_update), so TCP holds the client back until the
       * response is done; lingering bounds the rest */
      if (c->discarded > DISCARD_MAX) {
        if (c->phase == PH_LAST)
          conn_update(c);
        else
          conn_close(c, 0);
      }
      return;
    }
    c->in_len += (size_t)nread;
    conn_pump(c);
    return;
  }
  if (nread == 0)
    return;
  if (nread == UV_ENOBUFS) {
    /* on_alloc could not grow the buffer (reads stop before it is full):
     * out of memory, and no way to go on with this connection */
    conn_close(c, 0);
    return;
  }
  c->eof = 1;
  if (c->reading) {
    uv_read_stop(st);
    c->reading = 0;
  }
  /* An EOF while a response is owed means the client went away (as
   * nginx and Go read it): close, so on_close tells the holder. */
  if (nread != UV_EOF || c->phase == PH_LINGERING || c->active != NULL) {
    conn_close(c, 0);
    return;
  }
  conn_pump(c);
}

enum { K_NONE, K_HEADER, K_FRESH, K_IDLE, K_BODY, K_WRITE, K_LINGER, K_FAIL };

/* The earliest deadline that applies now, and which one it is. */
static int conn_deadline(const conn_t *c, uint64_t *dl) {
  const om_http_server_opts_t *o = &c->srv->o;
  int kind = K_NONE;
  *dl = UINT64_MAX;
  if (c->phase == PH_FAILED) {
    *dl = 0;
    return K_FAIL;
  }
  if (c->phase == PH_LINGERING) {
    *dl = c->t_linger + LINGER_MS;
    return K_LINGER;
  }
  if (c->reading && (c->phase == PH_READING || c->phase == PH_LAST)) {
    if (c->ps == P_HEAD) {
      if (c->in_len > c->in_off) {
        *dl = c->t_header + o->header_timeout_ms;
        kind = K_HEADER;
      } else if (c->fresh) {
        *dl = c->t_header + o->header_timeout_ms;
        kind = K_FRESH;
      } else if (c->active == NULL && c->q_len == 0 &&
                 uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp) ==
                     0) {
        /* idle only once the last response is flushed; until then the
         * write-progress deadline below applies */
        *dl = c->t_idle + o->idle_timeout_ms;
        kind = K_IDLE;
      }
    } else if (c->ps == P_BODY && !(c->cur != NULL && c->cur->want_continue &&
                                    !c->cur->continue_sent)) {
      *dl = c->t_read + o->idle_timeout_ms;
      kind = K_BODY;
    }
  }
  if (uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp) > 0 &&
      c->t_write + o->idle_timeout_ms < *dl) {
    *dl = c->t_write + o->idle_timeout_ms;
    kind = K_WRITE;
  }
  return kind;
}

static void on_timer(uv_timer_t *t) {
  conn_t *c = t->data;
  uint64_t dl, now = now_ms(c);
  int kind;
  if (c->phase == PH_CLOSING)
    return;
  kind = conn_deadline(c, &dl);
  if (kind == K_NONE || now < dl) {
    conn_update(c);
    return;
  }
  switch (kind) {
  case K_HEADER:
  case K_BODY:
    reject(c, OM_HTTP_REJECT_REQUEST_TIMEOUT);
    conn_pump(c);
    return;
  case K_WRITE:
    om_log(OM_LOG_INFO, "http_write_stalled", "remote", c->remote_ip, NULL);
    conn_close(c, 0);
    return;
  default: /* fresh or idle (nothing to answer), lingering, failed */
    conn_close(c, 0);
    return;
  }
}

/* Start or stop reading and re-arm the timer to match the state. */
static void conn_update(conn_t *c) {
  om_http_server_t *s = c->srv;
  uint64_t dl, now;
  int want;
  if (c->phase == PH_CLOSING)
    return;
  if (c->phase == PH_FAILED || c->eof)
    want = 0;
  else if (c->phase >= PH_ERRORING)
    want = 1; /* read and drop: see EOF, keep the peer from a reset */
  else if (c->phase == PH_LAST) /* the same while the last response is on
                                   its way, */
    want = c->discarded <= DISCARD_MAX; /* up to a point */
  else
    want = c->q_len < s->o.max_pipelined &&
           c->in_len - c->in_off < s->o.max_header_bytes + READ_SLACK;
  if (want && !c->reading) {
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0) {
      c->reading = 1;
      /* time spent paused by us is not the client's */
      c->t_read = now_ms(c);
      if (c->hstart_set && !c->fresh)
        c->t_header = c->t_read;
    } else {
      conn_fail(c);
    }
  } else if (!want && c->reading) {
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = 0;
  }
  if (conn_deadline(c, &dl) == K_NONE) {
    uv_timer_stop(&c->timer);
    return;
  }
  now = now_ms(c);
  uv_timer_start(&c->timer, on_timer, dl > now ? dl - now : 0, 0);
}

/* ------------------------------------------------------------------ */
/* accepting */

static void on_reject_closed(uv_handle_t *h) {
  om_http_server_t *s = h->data;
  if (h == (uv_handle_t *)&s->spare)
    s->spare_busy = 0;
  else
    free(h);
  s->rejects_open--;
  srv_maybe_finish(s);
}

/* Over the limit (or out of memory): answer 503 if the socket takes it at
 * once, and close. A handle is needed because libuv has already accepted
 * the descriptor. */
static void reject_connection(om_http_server_t *s) {
  static const char msg[] =
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
      "Content-Length: 32\r\nConnection: close\r\n\r\n"
      "{\"error\":\"too_many_connections\"}";
  reject_conn_t *rj = malloc(sizeof *rj);
  uv_tcp_t *h;
  if (rj != NULL) {
    h = &rj->tcp;
  } else if (!s->spare_busy) {
    h = &s->spare;
    s->spare_busy = 1;
  } else {
    om_log(OM_LOG_ERROR, "http_accept_failed", "error", "out of memory", NULL);
    return;
  }
  uv_tcp_init(s->loop, h);
  h->data = s;
  s->rejects_open++;
  s->m.connections_rejected++;
  if (uv_accept((uv_stream_t *)&s->listener, (uv_stream_t *)h) == 0) {
    uv_buf_t b = uv_buf_init((char *)msg, sizeof msg - 1);
    (void)uv_try_write((uv_stream_t *)h, &b, 1);
  }
  uv_close((uv_handle_t *)h, on_reject_closed);
}

static void on_connection(uv_stream_t *ls, int status) {
  om_http_server_t *s = ls->data;
  conn_t *c;
  int namelen = (int)sizeof(struct sockaddr_storage);
  if (status < 0) {
    om_log(OM_LOG_WARN, "http_accept_failed", "error", uv_strerror(status),
           NULL);
    return;
  }
  if (s->closing || s->m.connections_active >= s->o.max_connections) {
    reject_connection(s);
    return;
  }
  c = calloc(1, sizeof *c);
  if (c == NULL) {
    reject_connection(s);
    return;
  }
  c->srv = s;
  scan_reset(c);
  uv_tcp_init(s->loop, &c->tcp);
  uv_timer_init(s->loop, &c->timer);
  c->tcp.data = c;
  c->timer.data = c;
  c->handles = 2;
  c->next = s->conns;
  if (s->conns != NULL)
    s->conns->prev = c;
  s->conns = c;
  s->m.connections_active++;
  if (uv_accept(ls, (uv_stream_t *)&c->tcp) != 0) {
    conn_close(c, 0);
    return;
  }
  s->m.connections_accepted++;
  uv_tcp_nodelay(&c->tcp, 1);
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&c->remote, &namelen) ==
      0) {
    if (c->remote.ss_family == AF_INET6) {
      const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&c->remote;
      uv_ip6_name(a, c->remote_ip, sizeof c->remote_ip);
      c->remote_port = ntohs(a->sin6_port);
    } else {
      const struct sockaddr_in *a = (const struct sockaddr_in *)&c->remote;
      uv_ip4_name(a, c->remote_ip, sizeof c->remote_ip);
      c->remote_port = ntohs(a->sin_port);
    }
  }
  c->fresh = 1;
  c->hstart_set = 1;
  c->t_header = c->t_read = c->t_idle = c->t_write = now_ms(c);
  conn_update(c);
}

/* ------------------------------------------------------------------ */
/* the server */

int om_http_server_new(uv_loop_t *loop, const om_http_server_opts_t *opts,
                       om_http_handler_fn on_request, void *ud,
                       om_http_server_t **out) {
  om_http_server_opts_t o;
  om_http_server_t *s;
  if (loop == NULL || on_request == NULL || out == NULL)
    return OM_EINVAL;
  memset(&o, 0, sizeof o);
  if (opts != NULL)
    o = *opts;
  if (o.max_header_bytes == 0)
    o.max_header_bytes = DEF_MAX_HEADER_BYTES;
  if (o.max_header_bytes > CAP_MAX_HEADER_BYTES ||
      o.max_header_bytes < MIN_MAX_HEADER_BYTES)
    return OM_EINVAL;
  if (o.max_headers == 0)
    o.max_headers = DEF_MAX_HEADERS;
  if (o.max_headers > o.max_header_bytes)
    return OM_EINVAL;
  if (o.max_body_bytes == 0)
    o.max_body_bytes = DEF_MAX_BODY_BYTES;
  if (o.max_body_bytes > SIZE_MAX / 4)
    return OM_EINVAL;
  if (o.header_timeout_ms == 0)
    o.header_timeout_ms = DEF_HEADER_TIMEOUT_MS;
  if (o.idle_timeout_ms == 0)
    o.idle_timeout_ms = DEF_IDLE_TIMEOUT_MS;
  if (o.drain_timeout_ms == 0)
    o.drain_timeout_ms = DEF_DRAIN_TIMEOUT_MS;
  if (o.header_timeout_ms > UINT32_MAX || o.idle_timeout_ms > UINT32_MAX ||
      o.drain_timeout_ms > UINT32_MAX)
    return OM_EINVAL;
  if (o.max_connections == 0)
    o.max_connections = DEF_MAX_CONNECTIONS;
  if (o.max_pipelined == 0)
    o.max_pipelined = DEF_MAX_PIPELINED;
  s = calloc(1, sizeof *s);
  if (s == NULL)
    return OM_ENOMEM;
  s->loop = loop;
  s->o = o;
  s->on_request = on_request;
  s->ud = ud;
  /* neither can fail: AF_UNSPEC creates no socket yet */
  uv_tcp_init(loop, &s->listener);
  uv_timer_init(loop, &s->drain_timer);
  uv_check_init(loop, &s->flush_check);
  s->listener.data = s;
  s->drain_timer.data = s;
  s->flush_check.data = s;
  s->handles = 3;
  *out = s;
  return 0;
}

int om_http_server_listen(om_http_server_t *s, const char *host, int port) {
  struct sockaddr_storage ss;
  int rc;
  if (s == NULL || host == NULL || port < 0 || port > 65535)
    return OM_EINVAL;
  if (s->listening || s->listen_spent || s->closing)
    return OM_ESTATE;
  memset(&ss, 0, sizeof ss);
  if (strchr(host, ':') != NULL)
    rc = uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss);
  else
    rc = uv_ip4_addr(host, port, (struct sockaddr_in *)&ss);
  if (rc != 0)
    return OM_EINVAL;
  rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&ss, 0);
  if (rc == 0)
    rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection);
  if (rc != 0) {
    char p[8];
    snprintf(p, sizeof p, "%d", port);
    om_log(OM_LOG_ERROR, "http_listen_failed", "host", host, "port", p, "error",
           uv_strerror(rc), NULL);
    s->listen_spent = 1; /* the handle may hold a socket now */
    return OM_EIO;
  }
  s->listening = 1;
  return 0;
}

int om_http_server_port(const om_http_server_t *s) {
  struct sockaddr_storage ss;
  int len = (int)sizeof ss;
  if (s == NULL || !s->listening || s->closing)
    return OM_ESTATE;
  if (uv_tcp_getsockname(&s->listener, (struct sockaddr *)&ss, &len) != 0)
    return OM_ESTATE;
  if (ss.ss_family == AF_INET6)
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static void on_srv_handle_closed(uv_handle_t *h) {
  om_http_server_t *s = h->data;
  s->handles--;
  srv_maybe_finish(s);
}

static void srv_maybe_finish(om_http_server_t *s) {
  if (!s->closing || s->finished || s->conns != NULL || s->rejects_open > 0)
    return;
  if (!s->timer_closing) {
    s->timer_closing = 1;
    uv_close((uv_handle_t *)&s->drain_timer, on_srv_handle_closed);
    uv_close((uv_handle_t *)&s->flush_check, on_srv_handle_closed);
    return;
  }
  if (s->handles > 0)
    return;
  s->finished = 1;
  while (s->n_ob_spare > 0)
    free(s->ob_spare[--s->n_ob_spare]);
  if (s->on_closed != NULL)
    s->on_closed(s, s->ud);
  free(s);
}

static void on_drain(uv_timer_t *t) {
  om_http_server_t *s = t->data;
  conn_t *c, *next;
  for (c = s->conns; c != NULL; c = next) {
    next = c->next;
    conn_close(c, 0);
  }
}

int om_http_server_close(om_http_server_t *s, om_http_closed_fn on_closed) {
  conn_t *c, *next;
  if (s == NULL)
    return OM_EINVAL;
  if (s->closing)
    return OM_ESTATE;
  s->closing = 1;
  s->on_closed = on_closed;
  uv_close((uv_handle_t *)&s->listener, on_srv_handle_closed);
  for (c = s->conns; c != NULL; c = next) {
    next = c->next;
    /* a response in flight, or being flushed, may finish */
    if (c->phase >= PH_FAILED || c->active != NULL)
      continue;
    if (c->phase == PH_LINGERING)
      conn_close(c, 0);
    else
      conn_finish(c, 1);
  }
  if (s->conns != NULL)
    uv_timer_start(&s->drain_timer, on_drain, s->o.drain_timeout_ms, 0);
  srv_maybe_finish(s);
  return 0;
}

const om_http_server_metrics_t *
om_http_server_metrics(const om_http_server_t *s) {
  return s != NULL ? &s->m : NULL;
}

/* ------------------------------------------------------------------ */
/* requests and responses */

const char *om_http_request_header(const om_http_request_t *req,
                                   const char *name, size_t *len) {
  size_t i, nl;
  if (req == NULL || name == NULL)
    return NULL;
  nl = strlen(name);
  for (i = 0; i < req->n_headers; i++) {
    const om_http_header_t *h = &req->headers[i];
    if (h->name_len == nl && om__http_ci_eq(name, nl, h->name)) {
      if (len != NULL)
        *len = h->value_len;
      return h->value;
    }
  }
  return NULL;
}

int om_http_request_on_close(om_http_request_t *req, om_http_close_fn cb) {
  req_t *r = (req_t *)req;
  if (r == NULL)
    return OM_EINVAL;
  if (r->conn == NULL)
    return OM_ESTATE;
  r->on_close = cb;
  return 0;
}

/* The response ended: release req and move on (or close). */
static void req_finish(req_t *r, int close) {
  conn_t *c = r->conn;
  req_free(r);
  c->active = NULL;
  c->t_idle = now_ms(c);
  if (c->phase >= PH_FAILED)
    return;
  if (close)
    conn_finish(c, 0);
  else
    conn_pump(c);
}

static int resp_close(const req_t *r, const rh_t *rh) {
  const conn_t *c = r->conn;
  return !r->keep_alive || rh->close || c->srv->closing || c->eof;
}

static int conn_header(const req_t *r, int close) {
  if (close)
    return CH_CLOSE;
  return r->pub.version_minor == 0 ? CH_KEEP_ALIVE : CH_NONE;
}

int om_http_respond(om_http_request_t *req, int status,
                    const om_http_header_t *headers, size_t n, const char *body,
                    size_t len) {
  req_t *r = (req_t *)req;
  conn_t *c;
  char stackbuf[1024], *head;
  size_t hl;
  uv_buf_t bufs[2];
  rh_t rh;
  int rc, no_content, close, send_body;
  if (r == NULL || status < 200 || status > 599 || (len > 0 && body == NULL))
    return OM_EINVAL;
  if (r->rstate != RS_NONE || r->in_close_cb)
    return OM_ESTATE;
  no_content = status == 204 || status == 304;
  if (no_content && len > 0)
    return OM_EINVAL;
  rc = check_resp_headers(headers, n, 0, 0, &rh);
  if (rc != 0)
    return rc;
  c = r->conn;
  if (c == NULL || c->phase >= PH_FAILED) {
    if (c != NULL)
      req_finish(r, 1);
    else
      req_free(r);
    return OM_ESTATE;
  }
  close = resp_close(r, &rh);
  /* RFC 9110 8.6: no Content-Length in 204; none sent with 304 either */
  head = build_head(c->srv, stackbuf, sizeof stackbuf, status, headers, n, &rh,
                    !no_content, len, 0, conn_header(r, close), &hl);
  if (head == NULL) {
    conn_fail(c);
    req_finish(r, 1);
    return OM_ENOMEM;
  }
  send_body = !r->is_head && !no_content && len > 0;
  bufs[0] = uv_buf_init(head, (unsigned)hl);
  bufs[1] = uv_buf_init(send_body ? (char *)body : NULL,
                        send_body ? (unsigned)len : 0);
  rc = conn_write(c, bufs, send_body ? 2 : 1);
  if (head != stackbuf)
    free(head);
  req_finish(r, close);
  return rc == 0 ? 0 : OM_ESTATE;
}

static int response_start(om_http_request_t *req, int status,
                          const om_http_header_t *headers, size_t n,
                          int checked) {
  req_t *r = (req_t *)req;
  conn_t *c;
  char stackbuf[1024], *head;
  size_t hl;
  uv_buf_t b;
  rh_t rh;
  int rc, no_body, close;
  if (r == NULL || status < 200 || status > 599)
    return OM_EINVAL;
  if (r->rstate != RS_NONE || r->in_close_cb)
    return OM_ESTATE;
  rc = check_resp_headers(headers, n, 1, checked, &rh);
  if (rc != 0)
    return rc;
  if (status == 204 && rh.has_cl)
    return OM_EINVAL;
  c = r->conn;
  if (c == NULL || c->phase >= PH_FAILED)
    return OM_ESTATE;
  no_body = r->is_head || status == 204 || status == 304;
  if (no_body)
    r->rframe = RF_NOBODY;
  else if (rh.has_cl)
    r->rframe = RF_FIXED;
  else if (r->pub.version_minor == 1)
    r->rframe = RF_CHUNKED;
  else
    r->rframe = RF_CLOSE; /* HTTP/1.0: the body ends at the close */
  r->resp_left = rh.cl;
  close = resp_close(r, &rh) || r->rframe == RF_CLOSE;
  r->resp_close = close ? 1 : 0;
  head = build_head(c->srv, stackbuf, sizeof stackbuf, status, headers, n, &rh,
                    0, 0, r->rframe == RF_CHUNKED, conn_header(r, close), &hl);
  if (head == NULL)
    return OM_ENOMEM;
  r->rstate = RS_STREAMING;
  b = uv_buf_init(head, (unsigned)hl);
  rc = conn_write(c, &b, 1);
  if (head != stackbuf)
    free(head);
  return rc == 0 ? 0 : OM_ESTATE;
}

int om_http_response_start(om_http_request_t *req, int status,
                           const om_http_header_t *headers, size_t n) {
  return response_start(req, status, headers, n, 0);
}

int om_http_response_start_checked(om_http_request_t *req, int status,
                                   const om_http_header_t *headers, size_t n) {
  return response_start(req, status, headers, n, 1);
}

int om_http_response_write(om_http_request_t *req, const char *data,
                           size_t len) {
  req_t *r = (req_t *)req;
  conn_t *c;
  if (r == NULL || (len > 0 && data == NULL))
    return OM_EINVAL;
  if (r->rstate != RS_STREAMING)
    return OM_ESTATE;
  if (len == 0)
    return 0;
  if (r->rframe == RF_FIXED && (uint64_t)len > r->resp_left)
    return OM_EINVAL;
  c = r->conn;
  if (c == NULL || c->phase >= PH_FAILED)
    return OM_ESTATE;
  switch (r->rframe) {
  case RF_NOBODY:
    return 0;
  case RF_CHUNKED: { /* chunk = chunk-size CRLF chunk-data CRLF (7.1) */
    char line[24];
    uv_buf_t bufs[3];
    int k = snprintf(line, sizeof line, "%zx\r\n", len);
    bufs[0] = uv_buf_init(line, (unsigned)k);
    bufs[1] = uv_buf_init((char *)data, (unsigned)len);
    bufs[2] = uv_buf_init((char *)"\r\n", 2);
    return conn_write(c, bufs, 3) == 0 ? 0 : OM_ESTATE;
  }
  default: {
    uv_buf_t b = uv_buf_init((char *)data, (unsigned)len);
    if (r->rframe == RF_FIXED)
      r->resp_left -= len;
    return conn_write(c, &b, 1) == 0 ? 0 : OM_ESTATE;
  }
  }
}

/* Cut the connection after what is queued, so the message stays
 * incomplete; reset for a close-delimited body, where a FIN would read as
 * a normal end. */
static void cut(req_t *r) {
  conn_t *c = r->conn;
  int reset = r->rstate == RS_STREAMING && r->rframe == RF_CLOSE;
  req_free(r);
  c->active = NULL;
  c->srv->m.responses_aborted++;
  if (c->phase >= PH_FAILED)
    return;
  if (reset) {
    conn_drop_requests(c);
    conn_close(c, 1); /* no request is active: no callbacks run */
  } else {
    conn_finish(c, 1);
  }
}

int om_http_response_end(om_http_request_t *req) {
  req_t *r = (req_t *)req;
  conn_t *c;
  int rc = 0;
  if (r == NULL)
    return OM_EINVAL;
  if (r->rstate != RS_STREAMING || r->in_close_cb)
    return OM_ESTATE;
  c = r->conn;
  if (c == NULL) {
    req_free(r);
    return OM_ESTATE;
  }
  if (c->phase >= PH_FAILED) {
    req_finish(r, 1);
    return OM_ESTATE;
  }
  if (r->rframe == RF_FIXED && r->resp_left > 0) {
    cut(r);
    return OM_ESTATE;
  }
  if (r->rframe == RF_CHUNKED) { /* last-chunk, no trailers, CRLF */
    uv_buf_t b = uv_buf_init((char *)"0\r\n\r\n", 5);
    rc = conn_write(c, &b, 1);
  }
  req_finish(r, r->resp_close);
  return rc == 0 ? 0 : OM_ESTATE;
}

void om_http_response_abort(om_http_request_t *req) {
  req_t *r = (req_t *)req;
  if (r == NULL || r->in_close_cb)
    return;
  if (r->conn == NULL) {
    req_free(r);
    return;
  }
  cut(r);
}

int om_http_response_on_drain(om_http_request_t *req, size_t low_water,
                              om_http_drain_fn cb) {
  req_t *r = (req_t *)req;
  conn_t *c;
  if (r == NULL)
    return OM_EINVAL;
  c = r->conn;
  if (c == NULL || c->phase >= PH_FAILED || r->rstate != RS_STREAMING ||
      r->in_close_cb)
    return OM_ESTATE;
  r->on_drain = NULL;
  if (cb == NULL)
    return 0;
  if (om_http_response_pending(req) <= low_water)
    return 1;
  r->on_drain = cb;
  r->drain_low = low_water;
  return 0;
}

size_t om_http_response_pending(const om_http_request_t *req) {
  const req_t *r = (const req_t *)req;
  if (r == NULL || r->conn == NULL || r->conn->phase == PH_CLOSING)
    return 0;
  return r->conn->ob_len +
         uv_stream_get_write_queue_size((const uv_stream_t *)&r->conn->tcp);
}
