/*
 * om_upstream_body.c: streamed request bodies (om_upstream_request_t
 * body_stream). The caller's bytes become framed pieces (a chunk of a
 * chunked body carries its size line and CRLF): copied
 * (om_upstream_body_write) or lent (om_upstream_body_write_ref: only the
 * framing is allocated, the bytes go to the kernel from the caller's
 * buffer, given back when the write is done), queued on the request, and
 * handed to the connection one write at a time once the head went out; a
 * piece belongs to the connection while its write is in flight and is
 * freed when libuv reports it (cancelled writes included).
 * What is queued is bounded by the caller, through body_pending and the
 * on_drain callback (the proxy stops reading its client above a high
 * water mark).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_http_chars.h"
#include "om_upstream_internal.h"

#define FLUSH_PIECES 16u /* pieces per write (3 buffers at most each) */

static void bq_push(req_t *r, bchunk_t *b) {
  b->next = NULL;
  if (r->bq_tail != NULL)
    r->bq_tail->next = b;
  else
    r->bq_head = b;
  r->bq_tail = b;
  r->body_pending += b->len;
}

unsigned om__up_piece_bufs(bchunk_t *b, uv_buf_t out[3]) {
  unsigned n = 0;
  if (b->ref == NULL) {
    out[0] = uv_buf_init(b->data, (unsigned)b->len);
    return 1;
  }
  if (b->head_len > 0)
    out[n++] = uv_buf_init(b->data, b->head_len);
  out[n++] = uv_buf_init((char *)b->ref, (unsigned)b->ref_len);
  if (b->tail)
    out[n++] = uv_buf_init(b->data + b->head_len, 2);
  return n;
}

void om__up_piece_free(bchunk_t *b) {
  if (b->release != NULL)
    b->release(b->rel_ud);
  free(b);
}

void om__up_body_free(req_t *r) {
  while (r->bq_head != NULL) {
    bchunk_t *b = r->bq_head;
    r->bq_head = b->next;
    om__up_piece_free(b);
  }
  r->bq_tail = NULL;
  r->body_pending = 0;
}

void om__up_body_flush(conn_t *c) {
  req_t *r = c->req;
  uv_buf_t bufs[FLUSH_PIECES * 3];
  bchunk_t *b, *last = NULL;
  unsigned n = 0, k = 0;
  size_t bytes = 0;
  if (r == NULL || !r->streamed || c->writing || c->closing || c->lent_out ||
      c->phase == PH_CONNECTING || r->bq_head == NULL)
    return;
  if (c->tls != NULL) {
    om__up_tls_body_flush(c);
    return;
  }
  for (b = r->bq_head; b != NULL && k < FLUSH_PIECES; b = b->next, k++) {
    n += om__up_piece_bufs(b, bufs + n);
    bytes += b->len;
    last = b;
  }
  /* the pieces move to the connection: from now on they are gone for a
   * retry, whatever becomes of the write */
  c->inflight = r->bq_head;
  c->inflight_bytes = bytes;
  r->bq_head = last->next;
  if (r->bq_head == NULL)
    r->bq_tail = NULL;
  last->next = NULL;
  r->body_moved = 1;
  c->wreq.data = c;
  if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, bufs, n, om__up_on_write) !=
      0) {
    /* only when the handle is closing or broken: the read side or the
     * close ends the request; the pieces are no longer needed */
    while (c->inflight != NULL) {
      b = c->inflight;
      c->inflight = b->next;
      om__up_piece_free(b);
    }
    r->body_pending -= bytes;
    c->inflight_bytes = 0;
    c->broken = 1;
    return;
  }
  c->writing = 1;
}

int om__up_body_written(conn_t *c, int status) {
  req_t *r = c->req;
  while (c->inflight != NULL) {
    bchunk_t *b = c->inflight;
    c->inflight = b->next;
    om__up_piece_free(b);
  }
  if (r != NULL && r->streamed)
    r->body_pending -= c->inflight_bytes < r->body_pending ? c->inflight_bytes
                                                           : r->body_pending;
  c->inflight_bytes = 0;
  if (status != 0 || c->closing || r == NULL || !r->streamed)
    return 0;
  om__up_body_flush(c);
  if (r->drain_armed && r->body_pending <= r->drain_low &&
      r->state == R_ACTIVE) {
    r->drain_armed = 0;
    r->in_cb = 1;
    r->on_drain(r->ud);
    r->in_cb = 0;
    if (r->cancelled) {
      om__up_req_recycle(r);
      return 1;
    }
  }
  return 0;
}

/* A piece of len bytes of data, framed for r's body: the bytes copied
 * in, or (lent) referenced and given back through release(ud). */
static bchunk_t *piece(const req_t *r, const char *data, size_t len, int lent,
                       om_upstream_release_fn release, void *ud) {
  char line[24];
  int chunked = r->body_left < 0 && !r->http2; /* HTTP/2 frames it */
  int k = 0;
  size_t inner = lent ? 0 : len;
  bchunk_t *b;
  if (chunked) { /* chunk-size CRLF (RFC 9112 7.1) */
    k = (int)om__http_u64_hex(line, len);
    line[k++] = '\r';
    line[k++] = '\n';
  }
  b = malloc(sizeof *b + (size_t)k + inner + 2);
  if (b == NULL)
    return NULL;
  memset(b, 0, sizeof *b);
  memcpy(b->data, line, (size_t)k);
  if (lent) {
    b->ref = data;
    b->ref_len = len;
    b->release = release;
    b->rel_ud = ud;
    b->head_len = (unsigned)k;
    b->tail = (unsigned)chunked;
  } else {
    memcpy(b->data + k, data, len);
  }
  b->len = (size_t)k + len;
  if (chunked) { /* chunk-data CRLF (RFC 9112 7.1) */
    memcpy(b->data + k + inner, "\r\n", 2);
    b->len += 2;
  }
  return b;
}

/* om_upstream_body_write and its lending twin. */
static int body_write(om_upstream_req_t *r, const char *data, size_t len,
                      int lent, om_upstream_release_fn release, void *ud) {
  bchunk_t *b;
  if (r == NULL || (data == NULL && len > 0) || !r->streamed ||
      len > UINT32_MAX / 2)
    return OM_EINVAL;
  if (r->state != R_ACTIVE || r->pend == PEND_DONE || r->body_ended ||
      (r->conn != NULL && r->conn->lent_out))
    return OM_ESTATE;
  if (len == 0)
    return 0;
  if (r->body_left >= 0 && (uint64_t)len > (uint64_t)r->body_left)
    return OM_EINVAL;
  b = piece(r, data, len, lent, release, ud);
  if (b == NULL)
    return OM_ENOMEM;
  if (r->body_left >= 0)
    r->body_left -= (int64_t)len;
  bq_push(r, b);
  if (r->conn != NULL)
    om__up_body_flush(r->conn);
  else if (r->http2)
    om__up_h2_body_more(r);
  return 0;
}

int om_upstream_body_write(om_upstream_req_t *r, const char *data, size_t len) {
  return body_write(r, data, len, 0, NULL, NULL);
}

int om_upstream_body_write_ref(om_upstream_req_t *r, const char *data,
                               size_t len, om_upstream_release_fn release,
                               void *ud) {
  return body_write(r, data, len, 1, release, ud);
}

int om_upstream_body_end(om_upstream_req_t *r) {
  if (r == NULL || !r->streamed)
    return OM_EINVAL;
  if (r->state != R_ACTIVE || r->pend == PEND_DONE || r->body_ended)
    return OM_ESTATE;
  if (r->body_left > 0)
    return OM_EINVAL;
  if (r->body_left < 0 && !r->http2) { /* last-chunk, no trailer, CRLF */
    bchunk_t *b = malloc(sizeof *b + 5);
    if (b == NULL)
      return OM_ENOMEM;
    memset(b, 0, sizeof *b);
    memcpy(b->data, "0\r\n\r\n", 5);
    b->len = 5;
    bq_push(r, b);
  }
  r->body_ended = 1;
  if (r->http2)
    om__up_h2_body_more(r);
  if (r->conn != NULL) {
    conn_t *c = r->conn;
    if (c->phase == PH_HEAD && r->first_byte_ms != 0) {
      r->first_byte_due = now_ms(r->pool) + r->first_byte_ms;
      om__up_conn_arm(c);
    }
    om__up_body_flush(c);
  }
  return 0;
}

size_t om_upstream_body_pending(const om_upstream_req_t *r) {
  return r != NULL && r->streamed ? r->body_pending : 0;
}

int om_upstream_body_on_drain(om_upstream_req_t *r, size_t low_water,
                              om_upstream_drain_fn cb) {
  if (r == NULL || !r->streamed || cb == NULL)
    return OM_EINVAL;
  if (r->state != R_ACTIVE || r->pend == PEND_DONE)
    return OM_ESTATE;
  if (r->body_pending <= low_water) {
    r->drain_armed = 0;
    return 1;
  }
  r->drain_low = low_water;
  r->on_drain = cb;
  r->drain_armed = 1;
  return 0;
}

int om_upstream_body_lend(om_upstream_req_t *r, int *fd, uint64_t *left) {
  conn_t *c;
  uv_os_fd_t s;
  if (r == NULL || fd == NULL || left == NULL)
    return OM_EINVAL;
  c = r->conn;
  if (r->state != R_ACTIVE || r->pend == PEND_DONE || !r->streamed ||
      r->http2 || r->body_ended || r->body_left <= 0 || r->bq_head != NULL ||
      r->body_pending != 0 || c == NULL || c->closing || c->broken ||
      c->lent_out || c->tls != NULL || c->phase == PH_CONNECTING ||
      c->writing || c->inflight != NULL ||
      uv_fileno((const uv_handle_t *)&c->tcp, &s) != 0)
    return OM_ESTATE;
  c->lent_out = 1;
  r->body_moved = 1; /* bytes leave from a socket we do not see */
  r->res.sent = 1;
  *fd = s;
  *left = (uint64_t)r->body_left;
  return 0;
}

int om_upstream_body_unlend(om_upstream_req_t *r, uint64_t wrote, int broken) {
  conn_t *c;
  if (r == NULL)
    return OM_EINVAL;
  c = r->conn;
  if (r->state != R_ACTIVE || c == NULL || !c->lent_out)
    return OM_ESTATE;
  if (wrote > (uint64_t)r->body_left)
    return OM_EINVAL;
  c->lent_out = 0;
  r->body_left -= (int64_t)wrote;
  if (broken) {
    om_upstream_pool_t *p = r->pool;
    p->api++; /* on_done from the loop, never from inside this call */
    om__up_attempt_fail(c,
                        c->phase == PH_HEAD
                            ? OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE
                            : OM_UPSTREAM_FAIL_RESET_MID_BODY,
                        0, "the request body's socket failed while lent");
    p->api--;
  }
  return 0;
}
