/*
 * om_http_server_body.c: streamed request bodies (stream_bodies; see
 * om_http_request_body_start). The request is dispatched at its head;
 * its body stays on the wire until the holder asks for it, and then
 * flows through the connection's read buffer, span by span, to the
 * holder's callback: the server holds no more of it than one read. A
 * holder that keeps a span (queued for the upstream, kept for a replay)
 * takes a reference on that buffer instead of copying it; the server
 * then reads on into a new one.
 * Pausing stops reading the socket, so TCP pushes back on the client.
 *
 * The holder's callbacks run only from loop callbacks (a read, or the
 * connection's timer when delivery resumes over bytes already read),
 * never from inside an om_http_* call, so a holder never re-enters its
 * own code; they may end the request, which this file notices after
 * every call.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_http1.h"
#include "om_http_server_internal.h"
#include "om_log.h"

int om__http_body_wanted(const conn_t *c) {
  const req_t *r = c->sbody;
  return r != NULL && r == c->active && r->body_on && !r->body_paused &&
         !r->body_lent && c->phase == PH_READING;
}

/* Deliver on the next loop turn, from the connection's timer. */
static void kick(conn_t *c) {
  c->kick = 1;
  om__http_conn_update(c);
}

/* The body is in whole: the parse goes on with what follows it. */
static void body_done(conn_t *c, req_t *r) {
  c->sbody = NULL;
  c->ps = P_HEAD;
  /* RFC 9112 9.6: after a "close" request nothing more is parsed */
  if (!r->keep_alive && c->phase == PH_READING) {
    c->phase = PH_LAST;
    c->in_off = c->in_len;
  }
  r->on_body_end(&r->pub);
}

/* Hand a span to the holder; while it runs the span's buffer can be
 * referenced (om_http_request_body_ref). c outlives the call (closing is
 * asynchronous); r may not. */
static void deliver(conn_t *c, req_t *r, const char *p, size_t n) {
  c->span_live = 1;
  r->on_body(&r->pub, p, n);
  c->span_live = 0;
}

void om__http_body_pump(conn_t *c) {
  req_t *r = c->sbody;
  dec_t *d = &c->dec;
  while (om__http_body_wanted(c) && c->sbody == r) {
    const char *p = c->in + c->in_off, *span;
    size_t n = c->in_len - c->in_off, used, span_len;
    int rc;
    if (!d->chunked) { /* RFC 9112 6.2: exactly Content-Length bytes */
      size_t k = (uint64_t)n > d->left ? (size_t)d->left : n;
      if (d->left == 0) { /* the end waits for a pause to be lifted */
        body_done(c, r);
        return;
      }
      if (k == 0)
        return;
      c->in_off += k;
      d->left -= k;
      deliver(c, r, p, k);
      continue;
    }
    if (n == 0)
      return;
    rc = om_http1_chunked_decode(&d->ch, p, n, &used, &span, &span_len);
    c->in_off += used;
    if (rc == OM_HTTP1_DATA) {
      deliver(c, r, span, span_len);
      continue;
    }
    if (rc == OM_HTTP1_DONE) {
      body_done(c, r);
      return;
    }
    if (rc == OM_HTTP1_ERROR) {
      om__http_body_fail(c, om__http_reject_of(d->ch.err));
      return;
    }
    return; /* OM_HTTP1_MORE: every byte taken, more to come */
  }
}

void om__http_body_fail(conn_t *c, om_http_reject_t why) {
  req_t *r = c->sbody;
  if (r == NULL || c->phase != PH_READING)
    return;
  c->sbody = NULL;
  c->srv->m.rejected[why]++;
  r->pub.body_error = (int)why;
  om_log(OM_LOG_DEBUG, "http_body_failed", "reason", om_http_reject_name(why),
         "remote", c->remote_ip, NULL);
  if (r != c->active || r->rstate != RS_NONE) {
    /* a response is on its way: cut it, so the client sees it short */
    int reset = r->rstate != RS_NONE && r->rframe == RF_CLOSE;
    om__http_conn_close(c, reset); /* on_close tells the holder */
    return;
  }
  /* nothing answered yet: the holder is told, then the server answers
   * with why, as for a refusal at the head */
  c->active = NULL;
  r->conn = NULL;
  c->phase = PH_ERRORING;
  c->err = why;
  c->err_head = r->is_head;
  c->in_off = c->in_len; /* never interpret another byte */
  if (r->on_close != NULL) {
    r->in_close_cb = 1;
    r->on_close(&r->pub);
    om__http_req_free(r);
  } /* else orphaned: the holder's next call releases it */
}

om_http_body_ref_t *om_http_request_body_ref(om_http_request_t *req) {
  req_t *r = (req_t *)req;
  conn_t *c = r != NULL ? r->conn : NULL;
  if (OM__HTTP_IS_H2(req))
    return NULL; /* HTTP/2 spans are the stream's copy: not lent */
  if (c == NULL || !c->span_live || c->inb == NULL)
    return NULL;
  c->inb->refs++;
  return c->inb;
}

void om_http_body_ref_retain(om_http_body_ref_t *ref) {
  if (ref != NULL)
    ref->refs++;
}

void om_http_body_ref_release(om_http_body_ref_t *ref) {
  if (ref != NULL && --ref->refs == 0)
    free(ref);
}

int om_http_request_body_start(om_http_request_t *req, om_http_body_fn on_data,
                               om_http_body_end_fn on_end) {
  req_t *r = (req_t *)req;
  conn_t *c;
  if (r == NULL || on_data == NULL || on_end == NULL)
    return OM_EINVAL;
  if (OM__HTTP_IS_H2(req))
    return om__http2_body_start(req, on_data, on_end);
  c = r->conn;
  if (c == NULL || c->phase >= PH_FAILED || c->sbody != r || r->body_on ||
      r->in_close_cb)
    return OM_ESTATE;
  r->on_body = on_data;
  r->on_body_end = on_end;
  r->body_on = 1;
  /* RFC 9110 10.1.1: the invitation goes out when the body is wanted,
   * and never after a final answer started */
  if (r->rstate == RS_NONE)
    om__http_send_continue(c, r);
  kick(c);
  return 0;
}

void om_http_request_body_pause(om_http_request_t *req) {
  req_t *r = (req_t *)req;
  if (OM__HTTP_IS_H2(req)) {
    om__http2_body_pause(req);
    return;
  }
  if (r == NULL || r->conn == NULL || r->conn->sbody != r || !r->body_on)
    return;
  r->body_paused = 1;
  if (!r->in_close_cb)
    om__http_conn_update(r->conn);
}

void om_http_request_body_resume(om_http_request_t *req) {
  req_t *r = (req_t *)req;
  if (OM__HTTP_IS_H2(req)) {
    om__http2_body_resume(req);
    return;
  }
  if (r == NULL || r->conn == NULL || r->conn->sbody != r || !r->body_paused)
    return;
  r->body_paused = 0;
  kick(r->conn);
}

int om_http_request_body_idle_timeout(om_http_request_t *req, uint64_t ms) {
  req_t *r = (req_t *)req;
  if (r == NULL || ms > UINT32_MAX)
    return OM_EINVAL;
  if (OM__HTTP_IS_H2(req))
    return 0; /* bounded by the stream window and the connection's idle */
  if (ms > 0) {
    r->body_idle_ms = ms;
    if (r->conn != NULL && r->conn->phase < PH_FAILED && !r->in_close_cb)
      om__http_conn_update(r->conn);
  }
  return 0;
}

int om_http_request_body_lend(om_http_request_t *req, int *fd, uint64_t *left) {
  req_t *r = (req_t *)req;
  conn_t *c;
  uv_os_fd_t s;
  if (r == NULL || fd == NULL || left == NULL)
    return OM_EINVAL;
  if (OM__HTTP_IS_H2(req))
    return OM_ESTATE; /* DATA frames, not bytes of one body */
  c = r->conn;
  if (c == NULL || c->phase != PH_READING || c->tls != NULL || c->eof ||
      c->sbody != r || c->active != r || !r->body_on || r->body_lent ||
      r->in_close_cb || c->dec.chunked || c->dec.left == 0 ||
      c->in_off != c->in_len ||
      uv_fileno((const uv_handle_t *)&c->tcp, &s) != 0)
    return OM_ESTATE;
  r->body_lent = 1;
  c->t_read = om__http_now_ms(c);
  om__http_conn_update(c); /* stops reading; the body idle timer runs */
  *fd = s;
  *left = c->dec.left;
  return 0;
}

void om_http_request_body_lent_progress(om_http_request_t *req) {
  req_t *r = (req_t *)req;
  if (r != NULL && !OM__HTTP_IS_H2(req) && r->body_lent && r->conn != NULL)
    r->conn->t_read = om__http_now_ms(r->conn);
}

int om_http_request_body_unlend(om_http_request_t *req, uint64_t taken) {
  req_t *r = (req_t *)req;
  conn_t *c;
  if (r == NULL)
    return OM_EINVAL;
  if (OM__HTTP_IS_H2(req) || !r->body_lent)
    return OM_ESTATE;
  c = r->conn;
  if (c == NULL || c->sbody != r) { /* gone, or its body failed */
    r->body_lent = 0;
    return 0;
  }
  if (taken > c->dec.left)
    return OM_EINVAL;
  r->body_lent = 0;
  c->dec.left -= taken;
  c->t_read = om__http_now_ms(c);
  if (!r->in_close_cb)
    kick(c); /* the rest, or the end, from the loop */
  return 0;
}
