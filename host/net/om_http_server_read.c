/*
 * om_http_server_read.c: the HTTP server's read side (see
 * om_http_server.c for the whole path): rejections, the header section
 * (om_http1), field semantics, building the request, the body, the
 * parse-and-dispatch loop, reading and the connection's timers.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "om_errno.h"
#include "om_http1.h"
#include "om_http_chars.h"
#include "om_http_server_internal.h"
#include "om_log.h"

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
  om__http_req_free(c->cur);
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
  int hl =
      snprintf(head, sizeof head,
               "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\nConnection: close\r\nDate: "
               "%s\r\n\r\n",
               status, om__http_reason_phrase(status), bl, om__http_date(s));
  bufs[0] = uv_buf_init(head, (unsigned)hl);
  bufs[1] = uv_buf_init(body, (unsigned)bl);
  /* RFC 9110 9.3.2: no content in a response to HEAD */
  om__http_conn_write(c, bufs, c->err_head ? 1 : 2);
}

/* ------------------------------------------------------------------ */
/* the header-section scanner (RFC 9112 2-5) */

/* The answer to a refusal of the framing module. */
om_http_reject_t om__http_reject_of(om_http1_err_t e) {
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
void om__http_scan_reset(conn_t *c) {
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
      *why = om__http_reject_of(c->sc.err);
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
  int close, keep_alive, upgrade;
} conn_opts_t;

static void conn_opt(const char *e, size_t n, void *arg) {
  conn_opts_t *o = arg;
  if (om__http_ci_eq(e, n, "close"))
    o->close = 1;
  else if (om__http_ci_eq(e, n, "keep-alive"))
    o->keep_alive = 1;
  else if (om__http_ci_eq(e, n, "upgrade"))
    o->upgrade = 1;
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
  int minor, wire_minor, chunked, has_cl, has_host, is_head, has_upgrade;
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
    } else if (om__http_ci_eq(name, nl, "upgrade")) {
      h->has_upgrade = 1;
    } else if ((fe = om_http1_framing_field(&fr, name, nl, val, vl)) !=
               OM_HTTP1_OK) {
      /* Content-Length and Transfer-Encoding (RFC 9112 6) */
      *why = om__http_reject_of(fe);
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
    *why = om__http_reject_of(fe);
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
  if (c->reserved) /* one answer, then the reserve slot is free again */
    r->keep_alive = 0;
  r->want_continue =
      h->minor == 1 && h->ex.cont && (h->chunked || h->cl > 0) ? 1 : 0;
  r->pub.body_error = -1;
  r->pub.content_length = h->chunked ? -1 : (int64_t)h->cl;
  r->body_idle_ms = c->srv->o.idle_timeout_ms;
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
  if (r == c->sbody)
    return; /* the body follows: "close" applies once it is in */
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

/* With stream_bodies: is r's body small enough for whole_body_max and
 * all of it in the buffer already (its head consumed)? Only while no
 * other request is queued or being answered: a streamed body holds the
 * parse until it is read, so requests pipelined behind a whole one are
 * streamed, and a connection holds at most one copied body (not one per
 * max_pipelined). */
static int whole_now(const conn_t *c, const req_t *r, const head_t *h) {
  size_t max = c->srv->o.whole_body_max;
  return max > 0 && c->q_len == 0 && c->active == NULL && !h->chunked &&
         h->cl > 0 && h->cl <= max && !r->want_continue && !r->upgrade &&
         c->in_len - c->in_off >= (size_t)h->cl;
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
    om__http_conn_fail(c);
    return -1;
  }
  c->in_off += len;
  om__http_scan_reset(c);
  memset(&c->dec, 0, sizeof c->dec);
  /* RFC 9110 7.8 (ignored in HTTP/1.0): what follows may not be HTTP, so
   * nothing behind it is parsed until its answer is known */
  if (h.co.upgrade && h.has_upgrade && h.minor == 1 && !h.chunked &&
      h.cl == 0) {
    r->upgrade = 1;
    c->held = 1;
  }
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
  c->ps = P_BODY;
  if (c->srv->o.stream_bodies && whole_now(c, r, &h)) {
    /* every byte of a small body is here: copied whole, dispatched as a
     * complete request (whole_body_max) */
    int rc = body_append(c, r, c->in + c->in_off, (size_t)h.cl);
    if (rc != 0) {
      om__http_req_free(r);
      om__http_conn_fail(c);
      return -1;
    }
    c->in_off += (size_t)h.cl;
    c->dec.left = 0;
    c->ps = P_HEAD;
    enqueue(c, r);
    return 0;
  }
  if (c->srv->o.stream_bodies) {
    /* dispatched at the head; the body is delivered to the holder */
    r->pub.body_streamed = 1;
    c->sbody = r;
    enqueue(c, r);
    return 0;
  }
  c->cur = r;
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
      *why = om__http_reject_of(d->ch.err);
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
  while (c->phase == PH_READING && c->q_len < s->o.max_pipelined && !c->held) {
    size_t avail = c->in_len - c->in_off;
    om_http_reject_t why = OM_HTTP_REJECT_BAD_REQUEST;
    if (avail == 0)
      return;
    if (c->ps == P_HEAD) {
      int rc;
      if (!c->hstart_set) {
        c->t_header = om__http_now_ms(c);
        c->hstart_set = 1;
      }
      rc = scan_head(c, c->in + c->in_off, avail, &why);
      if (rc == SCAN_MORE)
        return;
      if (rc == SCAN_NOMEM) {
        om__http_conn_fail(c);
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
    } else if (c->sbody != NULL) {
      return; /* a streamed body: om__http_body_pump delivers it */
    } else {
      const char *p = c->in + c->in_off;
      size_t used = 0;
      int rc = decode(c, p, avail, &used, &why);
      if (rc == DEC_NOMEM) {
        om__http_conn_fail(c);
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
void om__http_send_continue(conn_t *c, req_t *r) {
  static const char msg[] = "HTTP/1.1 100 Continue\r\n\r\n";
  uv_buf_t b;
  if (r == NULL || !r->want_continue || r->continue_sent)
    return;
  r->continue_sent = 1;
  b = uv_buf_init((char *)msg, sizeof msg - 1);
  om__http_conn_write(c, &b, 1);
}

/*
 * Advance the connection: parse, dispatch the next request when none is
 * active, send a pending error answer, notice EOF. Re-entrant calls (a
 * handler answering synchronously) just ask the running pump to go again.
 */
void om__http_conn_pump(conn_t *c) {
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
        om__http_conn_finish(c, 1);
        break;
      }
      c->q_head = r->next;
      if (c->q_head == NULL)
        c->q_tail = NULL;
      c->q_len--;
      r->next = NULL;
      if (c->reserved && !om__http_reserve_admits(s, r)) {
        /* the reserve is for probes: the answer of a connection over
         * max_connections */
        uv_buf_t b = uv_buf_init((char *)om__http_busy_503,
                                 (unsigned)om__http_busy_503_len);
        om__http_req_free(r);
        s->m.connections_rejected++;
        om__http_conn_write(c, &b, 1);
        om__http_conn_finish(c, 0);
        break;
      }
      c->active = r;
      if (r != c->sbody) /* a streamed body: when the holder asks */
        om__http_send_continue(c, r);
      s->m.requests++;
      s->on_request(&r->pub, s->ud);
      c->pump_again = 1;
      continue;
    }
    if (c->phase == PH_ERRORING) {
      send_error(c);
      om__http_conn_finish(c, 0);
      break;
    }
    if (s->closing || c->eof) {
      om__http_conn_finish(c, 1); /* flush what is queued, then close */
      break;
    }
    if (c->phase == PH_READING && c->ps == P_BODY)
      om__http_send_continue(c, c->cur);
  } while (c->pump_again);
  c->in_pump = 0;
  if ((c->phase == PH_READING || c->phase == PH_LAST) &&
      c->in_off == c->in_len && c->in_cap > READ_SLACK && c->ps == P_HEAD &&
      c->sc.pos == 0) {
    om__http_in_release(c); /* an idle keep-alive connection keeps no big
                               buffer */
  }
  om__http_conn_update(c);
}

/* ------------------------------------------------------------------ */
/* reading and timers */

void om__http_in_release(conn_t *c) {
  om_http_body_ref_release(c->inb);
  c->inb = NULL;
  c->in = NULL;
  c->in_cap = c->in_off = c->in_len = 0;
}

/* A fresh read buffer of cap bytes for c, the unparsed bytes of the old
 * one moved in, c's reference on the old one given up (others still hold
 * it); 0, or OM_ENOMEM with nothing changed. */
static int in_fresh(conn_t *c, size_t cap) {
  size_t tail = c->in_len - c->in_off;
  om_http_body_ref_t *b = malloc(sizeof *b + cap);
  if (b == NULL)
    return OM_ENOMEM;
  b->refs = 1;
  b->cap = cap;
  if (tail > 0)
    memcpy(b->data, c->in + c->in_off, tail);
  om_http_body_ref_release(c->inb);
  c->inb = b;
  c->in = b->data;
  c->in_cap = cap;
  c->in_off = 0;
  c->in_len = tail;
  return 0;
}

void om__http_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  conn_t *c = h->data;
  om_http_server_t *s = c->srv;
  size_t maxcap = s->o.max_header_bytes + READ_SLACK;
  (void)suggested;
  if (c->sbody != NULL && maxcap < STREAM_READ_MAX)
    maxcap = STREAM_READ_MAX; /* a streamed body: fewer, larger reads */
  if (c->phase == PH_H2 && maxcap < STREAM_READ_MAX)
    maxcap = STREAM_READ_MAX;
  if (c->phase != PH_READING && c->phase != PH_H2) {
    *buf = uv_buf_init(s->scratch, sizeof s->scratch);
    return;
  }
  if (c->inb != NULL && c->inb->refs > 1) {
    /* spans of it are held: read on behind them, and into a new buffer
     * once this one is full (only the unparsed tail moves, never a held
     * byte) */
    if (c->in_cap - c->in_len < READ_MIN) {
      size_t cap = maxcap;
      if (cap < c->in_len - c->in_off + READ_MIN)
        cap = c->in_len - c->in_off + READ_MIN;
      (void)in_fresh(c, cap); /* else what is left of the held one */
    }
  } else {
    if (c->in_off == c->in_len)
      c->in_off = c->in_len = 0;
    if (c->in_cap - c->in_len < READ_MIN && c->in_off > 0) {
      memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
      c->in_len -= c->in_off;
      c->in_off = 0;
    }
    if (c->in_cap - c->in_len < READ_MIN && c->in_cap < maxcap) {
      /* a streamed body goes straight to the largest buffer: a 256 KiB
       * upload in four reads, not in a doubling series of small ones */
      size_t cap = c->sbody != NULL ? maxcap
                   : c->in_cap      ? c->in_cap * 2
                                    : READ_FIRST;
      om_http_body_ref_t *nb;
      if (cap > maxcap)
        cap = maxcap;
      nb = realloc(c->inb, sizeof *nb + cap);
      if (nb != NULL) {
        if (c->inb == NULL)
          nb->refs = 1;
        nb->cap = cap;
        c->inb = nb;
        c->in = nb->data;
        c->in_cap = cap;
      }
    }
  }
  *buf = uv_buf_init(c->in ? c->in + c->in_len : NULL,
                     (unsigned)(c->in_cap - c->in_len));
}

/*
 * A fresh connection of a server with http2: its first bytes are the
 * client preface (RFC 9113 3.4), or TLS selected "h2" (RFC 9113 3.3):
 * the connection becomes HTTP/2. Returns 1 while the bytes so far are a
 * proper prefix of the preface (nothing is parsed until the rest
 * comes), else 0 (c is HTTP/2 now, or stays HTTP/1).
 */
static int h2_detect(conn_t *c) {
  static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  size_t avail = c->in_len - c->in_off, n = sizeof preface - 1;
  int alpn_h2 = 0;
  if (c->tls != NULL) {
    char proto[16];
    alpn_h2 = om_tls_alpn(c->tls, proto, sizeof proto) == 2 &&
              memcmp(proto, "h2", 2) == 0;
  }
  if (!alpn_h2) {
    if (memcmp(c->in + c->in_off, preface, avail < n ? avail : n) != 0)
      return 0;
    if (avail < n)
      return 1;
  }
  if (om__http2_take(c) != 0)
    om__http_conn_fail(c);
  return 0;
}

void om__http_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  conn_t *c = st->data;
  om_http_server_t *s = c->srv;
  if (c->phase == PH_CLOSING)
    return;
  if (nread > 0) {
    c->t_read = om__http_now_ms(c);
    if (buf->base == s->scratch) { /* dead: read and drop */
      size_t max = c->phase >= PH_SHUTTING ? LINGER_DISCARD_MAX : DISCARD_MAX;
      c->discarded += (size_t)nread;
      /* bytes after a refusal are cut off at some point; bytes after a
       * last request whose response is still on its way stop being read
       * there (om__http_conn_update), so TCP holds the client back until the
       * response is done; lingering bounds the rest */
      if (c->discarded > max) {
        if (c->phase == PH_LAST)
          om__http_conn_update(c);
        else
          om__http_conn_close(c, 0);
      }
      return;
    }
    c->in_len += (size_t)nread;
    if (c->phase == PH_READING && c->fresh && s->o.http2 && !c->reserved &&
        h2_detect(c) != 0) {
      om__http_conn_update(c); /* a prefix of the preface: more, please */
      return;
    }
    if (c->phase == PH_H2) {
      om__http2_on_read(c);
      return;
    }
    if (om__http_body_wanted(c))
      om__http_body_pump(c);
    if (c->phase != PH_CLOSING)
      om__http_conn_pump(c);
    return;
  }
  if (nread == 0)
    return;
  if (nread == UV_ENOBUFS) {
    /* on_alloc could not grow the buffer (reads stop before it is full):
     * out of memory, and no way to go on with this connection */
    om__http_conn_close(c, 0);
    return;
  }
  c->eof = 1;
  if (c->reading) {
    uv_read_stop(st);
    c->reading = 0;
  }
  /* An EOF while a response is owed means the client went away (as
   * nginx and Go read it): close, so on_close tells the holder. */
  if (nread != UV_EOF || c->phase == PH_LINGERING || c->active != NULL ||
      c->phase == PH_H2) {
    om__http_conn_close(c, 0);
    return;
  }
  om__http_conn_pump(c);
}

enum {
  K_NONE,
  K_HEADER,
  K_FRESH,
  K_IDLE,
  K_BODY,
  K_WRITE,
  K_LINGER,
  K_FAIL,
  K_KICK,
  K_TLS
};

/* The earliest deadline that applies now, and which one it is. */
static int conn_deadline(const conn_t *c, uint64_t *dl) {
  const om_http_server_opts_t *o = &c->srv->o;
  int kind = K_NONE;
  *dl = UINT64_MAX;
  if (c->phase == PH_FAILED) {
    *dl = 0;
    return K_FAIL;
  }
  if (c->tls_in && c->reading) {
    *dl = 0;
    return K_TLS;
  }
  if (c->phase == PH_LINGERING) {
    uint64_t last = c->t_read > c->t_linger ? c->t_read : c->t_linger;
    *dl = last + LINGER_MS;
    if (c->t_linger + LINGER_TOTAL_MS < *dl)
      *dl = c->t_linger + LINGER_TOTAL_MS;
    return K_LINGER;
  }
  if (c->kick && c->phase == PH_READING) {
    *dl = 0;
    return K_KICK;
  }
  if (c->reading && !c->held &&
      (c->phase == PH_READING || c->phase == PH_LAST)) {
    uint64_t head_ms =
        c->reserved ? o->reserve_timeout_ms : o->header_timeout_ms;
    if (c->ps == P_HEAD) {
      if (c->in_len > c->in_off) {
        *dl = c->t_header + head_ms;
        kind = K_HEADER;
      } else if (c->fresh) {
        *dl = c->t_header + head_ms;
        kind = K_FRESH;
      } else if (c->active == NULL && c->q_len == 0 &&
                 uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp) ==
                     0) {
        /* idle only once the last response is flushed; until then the
         * write-progress deadline below applies */
        *dl = c->t_idle + o->idle_timeout_ms;
        kind = K_IDLE;
      }
    } else if (c->ps == P_BODY && c->sbody != NULL) {
      if (om__http_body_wanted(c)) {
        *dl = c->t_read + c->sbody->body_idle_ms;
        kind = K_BODY;
      }
    } else if (c->ps == P_BODY && !(c->cur != NULL && c->cur->want_continue &&
                                    !c->cur->continue_sent)) {
      *dl = c->t_read + o->idle_timeout_ms;
      kind = K_BODY;
    }
  }
  if (kind == K_NONE && c->phase == PH_READING && c->sbody != NULL &&
      c->sbody->body_lent && c->sbody->body_idle_ms != 0) {
    /* a body read by the caller (om_http_request_body_lend): its progress
     * stamps t_read */
    *dl = c->t_read + c->sbody->body_idle_ms;
    kind = K_BODY;
  }
  if (c->phase == PH_H2 && c->reading && om__http2_idle(c) &&
      uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp) == 0) {
    *dl = c->t_idle + o->idle_timeout_ms;
    kind = K_IDLE;
  }
  /* output waits for the client: queued here, or in a lent socket's
   * writer (om_http_response_lend), whose progress stamps t_write */
  if ((uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp) > 0 ||
       (c->active != NULL && c->active->lent)) &&
      c->t_write + o->idle_timeout_ms < *dl) {
    *dl = c->t_write + o->idle_timeout_ms;
    kind = K_WRITE;
  }
  return kind;
}

void om__http_on_timer(uv_timer_t *t) {
  conn_t *c = t->data;
  uint64_t dl, now = om__http_now_ms(c);
  int kind;
  if (c->phase == PH_CLOSING)
    return;
  kind = conn_deadline(c, &dl);
  if (kind == K_NONE || now < dl) {
    om__http_conn_update(c);
    return;
  }
  switch (kind) {
  case K_TLS:
    om__http_tls_pump(c);
    if (c->phase != PH_CLOSING)
      om__http_conn_update(c);
    return;
  case K_KICK:
    c->kick = 0;
    if (om__http_body_wanted(c))
      om__http_body_pump(c);
    if (c->phase != PH_CLOSING)
      om__http_conn_pump(c);
    return;
  case K_BODY:
    if (c->sbody != NULL) {
      om__http_body_fail(c, OM_HTTP_REJECT_REQUEST_TIMEOUT);
      if (c->phase != PH_CLOSING)
        om__http_conn_pump(c);
      return;
    }
    /* fall through */
  case K_HEADER:
    reject(c, OM_HTTP_REJECT_REQUEST_TIMEOUT);
    om__http_conn_pump(c);
    return;
  case K_WRITE:
    om_log(OM_LOG_INFO, "http_write_stalled", "remote", c->remote_ip, NULL);
    om__http_conn_close(c, 0);
    return;
  default: /* fresh or idle (nothing to answer), lingering, failed */
    om__http_conn_close(c, 0);
    return;
  }
}

/* Start or stop reading and re-arm the timer to match the state. */
void om__http_conn_update(conn_t *c) {
  om_http_server_t *s = c->srv;
  uint64_t dl, now;
  int want;
  if (c->phase == PH_CLOSING || c->phase == PH_TUNNEL)
    return;
  if (c->phase == PH_FAILED || c->eof)
    want = 0;
  else if (c->phase >= PH_ERRORING)
    want = 1; /* read and drop: see EOF, keep the peer from a reset */
  else if (c->phase == PH_H2)
    want = om__http2_want_read(c);
  else if (c->phase == PH_LAST) /* the same while the last response is on
                                   its way, */
    want = c->discarded <= DISCARD_MAX; /* up to a point */
  else if (c->sbody != NULL) /* a streamed body: while the holder wants it */
    want = om__http_body_wanted(c) &&
           c->in_len - c->in_off < s->o.max_header_bytes + READ_SLACK;
  else
    want = c->q_len < s->o.max_pipelined &&
           c->in_len - c->in_off < s->o.max_header_bytes + READ_SLACK;
  if (want && !c->reading) {
    if (uv_read_start((uv_stream_t *)&c->tcp,
                      c->tls ? om__http_tls_alloc : om__http_on_alloc,
                      c->tls ? om__http_tls_read : om__http_on_read) == 0) {
      c->reading = 1;
      /* time spent paused by us is not the client's */
      c->t_read = om__http_now_ms(c);
      if (c->hstart_set && !c->fresh)
        c->t_header = c->t_read;
    } else {
      om__http_conn_fail(c);
    }
  } else if (!want && c->reading) {
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = 0;
  }
  if (conn_deadline(c, &dl) == K_NONE) {
    uv_timer_stop(&c->timer);
    return;
  }
  now = om__http_now_ms(c);
  uv_timer_start(&c->timer, om__http_on_timer, dl > now ? dl - now : 0, 0);
}
