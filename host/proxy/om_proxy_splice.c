/*
 * om_proxy_splice.c: a committed response body relayed by splice(2)
 * (docs/PROXY.md "Large bodies").
 *
 * Relaying a body the ordinary way costs the kernel two copies per byte
 * (the upstream socket into our buffer, our buffer into the caller's
 * socket) and this process a read and a write per 64 KiB. When both
 * sides are plaintext HTTP/1.1 and the response declares a
 * Content-Length of at least opts.splice_min_bytes, the body goes from
 * one socket to the other through a pipe instead (om_splice.h), after
 * the head and the first bytes went the ordinary way:
 *
 *   1. on_body delivered what the upstream's read buffer held and it was
 *      written to the caller: the upstream is paused;
 *   2. the caller's output drains (the head and those bytes reach the
 *      kernel; until then nothing may be written behind them);
 *   3. both sockets are lent (om_http_response_lend,
 *      om_upstream_response_lend) and the rest of the body is spliced;
 *   4. at the end both are given back with the bytes moved: the upstream
 *      completes its response (its connection is pooled as usual) and
 *      the caller's response ends; a failure of either socket cuts the
 *      stream (the caller sees a short body) as any mid-body failure.
 *
 * The stream timeouts still judge the stream: the splice's progress is
 * its activity. Anything that stops the call (a stream timeout, the
 * caller's close, a total timeout of the attempt) cancels the splice
 * first (om__proxy_splice_stop). Whenever a step cannot be taken (TLS,
 * HTTP/2, out of descriptors for the pipe) the body goes on the
 * ordinary way: the splice is an optimisation, never a requirement.
 *
 * Uploads the same way round: once a Content-Length request body is past
 * what a replay may hold (nothing of it needs keeping: no retry can send
 * it again) and at least opts.splice_min_bytes of it is still to come,
 * the client's body is paused, what was queued for the upstream drains,
 * both sockets are lent (om_http_request_body_lend, om_upstream_body_lend)
 * and the rest moves client to upstream. Given back, the server delivers
 * the body's end (the upstream body is ended as usual); a failure of the
 * upstream's socket fails the attempt (sent: the method's rules decide,
 * and the body cannot be replayed); a failure of the client's is seen by
 * the server once it reads again (its EOF or reset ends the call as a
 * client's close would). The body idle timeout judges the client: the
 * splice's progress restarts it.
 */
#include "om_errno.h"
#include "om_proxy_internal.h"
#include "om_splice.h"

/* Count what moved since the last report (the metric moves as the
 * body does, not only at its end). */
static void count(om__proxy_call_t *c, uint64_t moved) {
  uint64_t d = moved - c->splice_counted;
  c->splice_counted = moved;
  c->s->spliced_bytes += d;
  om_metric_add(c->s->m_spliced, (double)d);
}

static void on_progress(void *ud, uint64_t moved) {
  om__proxy_call_t *c = ud;
  count(c, moved);
  om__proxy_stream_activity(c);
  if (c->req != NULL)
    om_http_response_lent_progress(c->req);
}

static void on_done(void *ud, const om_splice_result_t *res) {
  om__proxy_call_t *c = ud;
  uint64_t moved = res->moved;
  int err = res->err;
  c->splice = NULL;
  c->splice_want = 0;
  count(c, moved);
  if (c->req != NULL)
    (void)om_http_response_unlend(c->req, moved);
  if (c->up == NULL)
    return; /* not reached: the attempt's end stops the splice first */
  /* every byte moved: the upstream completes (and pools) on resume, then
   * up_on_done ends the caller's response; a failure: the attempt ends
   * reset_mid_body and up_on_done cuts the caller's response */
  if (om_upstream_response_unlend(c->up, moved, err != 0) == 0 && err == 0) {
    c->paused = 0;
    om_upstream_resume(c->up);
  }
  if (err == 0)
    om__proxy_stream_activity(c);
}

static const om_splice_callbacks_t SPLICE_CB = {on_progress, on_done};

/* The body goes on the ordinary way from here. */
static void ordinary(om__proxy_call_t *c) {
  c->splice_want = 0;
  if (c->paused && c->up != NULL) {
    c->paused = 0;
    om_upstream_resume(c->up);
  }
}

static void on_drained(om_http_request_t *req);

/* Steps 2 and 3: both sockets lent and the splice started, or waiting
 * for the caller's output to drain, or back to the ordinary way. */
static void start(om__proxy_call_t *c) {
  int dfd, ufd, rc;
  uint64_t dleft, uleft;
  if (c->req == NULL || c->up == NULL)
    return;
  rc = om_http_response_lend(c->req, &dfd, &dleft);
  if (rc == 1) {
    rc = om_http_response_on_drain(c->req, 0, on_drained);
    if (rc == 0) {
      c->splice_wait = 1;
      return;
    }
    if (rc == 1) /* drained meanwhile */
      rc = om_http_response_lend(c->req, &dfd, &dleft);
  }
  if (rc != 0) {
    ordinary(c);
    return;
  }
  rc = om_upstream_response_lend(c->up, &ufd, &uleft);
  if (rc == 0 && uleft != dleft) { /* not reached: the head is relayed */
    (void)om_upstream_response_unlend(c->up, 0, 0);
    rc = OM_ESTATE;
  }
  if (rc != 0) { /* bytes still buffered, TLS, HTTP/2: nothing moved */
    (void)om_http_response_unlend(c->req, 0);
    ordinary(c);
    return;
  }
  c->splice_counted = 0;
  if (om_splice_start(c->p->loop, ufd, dfd, uleft, &SPLICE_CB, c, &c->splice) !=
      0) {
    /* no pipe or no descriptor for it: copy instead */
    (void)om_upstream_response_unlend(c->up, 0, 0);
    (void)om_http_response_unlend(c->req, 0);
    ordinary(c);
  }
}

static void on_drained(om_http_request_t *req) {
  om__proxy_call_t *c = req->user;
  if (c == NULL || !c->splice_wait)
    return;
  c->splice_wait = 0;
  start(c);
}

void om__proxy_splice_consider(om__proxy_call_t *c,
                               const om_upstream_response_t *r) {
  uint64_t min = c->p->opts.splice_min_bytes;
  c->splice_want = r->content_length > 0 && min != UINT64_MAX &&
                   (uint64_t)r->content_length >= min &&
                   c->req->version_major == 1 && !c->set.http2 &&
                   !c->peer->target.tls;
}

int om__proxy_splice_body(om__proxy_call_t *c) {
  if (!c->splice_want)
    return 0;
  if (c->splice != NULL || c->splice_wait)
    return 1; /* not reached: the upstream is paused meanwhile */
  if (!c->paused) {
    if (om_upstream_pause(c->up) != 0) {
      c->splice_want = 0;
      return 0;
    }
    c->paused = 1;
  }
  start(c);
  return 1;
}

/* ------------------------------------------------------------------ */
/* uploads */

static void up_count(om__proxy_call_t *c, uint64_t taken) {
  uint64_t d = taken - c->usplice_counted;
  c->usplice_counted = taken;
  c->body.received += d;
  c->s->spliced_bytes += d;
  om_metric_add(c->s->m_body_bytes, (double)d);
  om_metric_add(c->s->m_spliced, (double)d);
}

static void up_progress(void *ud, uint64_t moved) {
  om__proxy_call_t *c = ud;
  up_count(c, moved); /* taken is at least moved: the rest at the end */
  if (c->req != NULL)
    om_http_request_body_lent_progress(c->req);
  om__proxy_stream_activity(c); /* traffic, once a response is committed */
}

/* The client's body goes on the ordinary way from here. */
static void up_ordinary(om__proxy_call_t *c) {
  c->usplice_want = 0;
  if (c->body.client_paused && c->req != NULL) {
    c->body.client_paused = 0;
    om_http_request_body_resume(c->req);
  }
}

static void up_done(void *ud, const om_splice_result_t *res) {
  om__proxy_call_t *c = ud;
  c->usplice = NULL;
  up_count(c, res->taken);
  /* the upstream's socket failed, or bytes were taken and lost: the
   * upstream's body is short; a failure of the client's alone is the
   * server's to see when it reads again */
  if (c->up != NULL)
    (void)om_upstream_body_unlend(
        c->up, res->moved,
        res->err != 0 && (!res->src_failed || res->taken != res->moved));
  if (c->req != NULL)
    (void)om_http_request_body_unlend(c->req, res->taken);
  up_ordinary(c);
}

static const om_splice_callbacks_t UPLOAD_CB = {up_progress, up_done};

static void up_drained(void *ud);

static void up_start(om__proxy_call_t *c) {
  int cfd, ufd;
  uint64_t cleft, uleft;
  if (c->req == NULL || c->up == NULL)
    return;
  if (om_http_request_body_lend(c->req, &cfd, &cleft) != 0) {
    up_ordinary(c);
    return;
  }
  if (om_upstream_body_lend(c->up, &ufd, &uleft) != 0) {
    (void)om_http_request_body_unlend(c->req, 0);
    up_ordinary(c);
    return;
  }
  c->usplice_counted = 0;
  if (uleft != cleft || /* not reached: both count the same body */
      om_splice_start(c->p->loop, cfd, ufd, cleft, &UPLOAD_CB, c,
                      &c->usplice) != 0) {
    (void)om_upstream_body_unlend(c->up, 0, 0);
    (void)om_http_request_body_unlend(c->req, 0);
    up_ordinary(c);
  }
}

static void up_drained(void *ud) {
  om__proxy_call_t *c = ud;
  if (!c->usplice_wait)
    return;
  c->usplice_wait = 0;
  up_start(c);
}

int om__proxy_splice_upload(om__proxy_call_t *c) {
  uint64_t min = c->p->opts.splice_min_bytes, left;
  int rc;
  if (c->usplice != NULL || c->usplice_wait)
    return 1; /* not reached: the client's body is paused meanwhile */
  if (!c->body.lost || c->committed || c->up == NULL || c->req == NULL ||
      c->req->content_length < 0)
    return 0; /* held for a replay, or an answer under way: copied */
  left = (uint64_t)c->req->content_length - c->body.received;
  if (left < min || left == 0) {
    c->usplice_want = 0;
    return 0;
  }
  if (!c->body.client_paused) {
    c->body.client_paused = 1;
    om_http_request_body_pause(c->req);
  }
  rc = om_upstream_body_on_drain(c->up, 0, up_drained);
  if (rc == 0) {
    c->usplice_wait = 1;
    return 1;
  }
  if (rc != 1) { /* the attempt is ending: its on_done says what next */
    up_ordinary(c);
    return 1;
  }
  up_start(c);
  return 1;
}

void om__proxy_splice_upload_consider(om__proxy_call_t *c) {
  uint64_t min = c->p->opts.splice_min_bytes;
  c->usplice_want = c->body.streamed && min != UINT64_MAX &&
                    c->req->content_length > 0 &&
                    (uint64_t)c->req->content_length >= min &&
                    c->req->version_major == 1 && !c->set.http2;
}

/* ------------------------------------------------------------------ */

void om__proxy_splice_stop(om__proxy_call_t *c) {
  uint64_t moved;
  if (c->usplice_wait) {
    c->usplice_wait = 0; /* the drain callback finds nothing to do */
  }
  if (c->usplice != NULL) {
    om_splice_result_t res;
    (void)om_splice_cancel(c->usplice, &res);
    c->usplice = NULL;
    up_count(c, res.taken);
    if (c->up != NULL)
      (void)om_upstream_body_unlend(c->up, res.moved, 0);
    if (c->req != NULL)
      (void)om_http_request_body_unlend(c->req, res.taken);
  }
  if (c->splice_wait) {
    c->splice_wait = 0;
    if (c->req != NULL)
      om_http_response_on_drain(c->req, 0, NULL);
  }
  if (c->splice == NULL)
    return;
  moved = om_splice_cancel(c->splice, NULL);
  c->splice = NULL;
  count(c, moved);
  /* given back so that whatever ends them next sees their own state;
   * the bytes in the pipe are lost: the stream is cut either way */
  if (c->req != NULL)
    (void)om_http_response_unlend(c->req, moved);
  if (c->up != NULL)
    (void)om_upstream_response_unlend(c->up, moved, 0);
}
