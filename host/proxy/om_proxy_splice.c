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
 *      om_upstream_body_lend) and the rest of the body is spliced;
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

static void on_done(void *ud, int err, uint64_t moved) {
  om__proxy_call_t *c = ud;
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
  if (om_upstream_body_unlend(c->up, moved, err != 0) == 0 && err == 0) {
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
  rc = om_upstream_body_lend(c->up, &ufd, &uleft);
  if (rc == 0 && uleft != dleft) { /* not reached: the head is relayed */
    (void)om_upstream_body_unlend(c->up, 0, 0);
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
    (void)om_upstream_body_unlend(c->up, 0, 0);
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

void om__proxy_splice_stop(om__proxy_call_t *c) {
  uint64_t moved;
  if (c->splice_wait) {
    c->splice_wait = 0;
    if (c->req != NULL)
      om_http_response_on_drain(c->req, 0, NULL);
  }
  if (c->splice == NULL)
    return;
  moved = om_splice_cancel(c->splice);
  c->splice = NULL;
  count(c, moved);
  /* given back so that whatever ends them next sees their own state;
   * the bytes in the pipe are lost: the stream is cut either way */
  if (c->req != NULL)
    (void)om_http_response_unlend(c->req, moved);
  if (c->up != NULL)
    (void)om_upstream_body_unlend(c->up, moved, 0);
}
