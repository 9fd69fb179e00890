/*
 * om_proxy_body.c: streamed request bodies through the proxy. The
 * service, the policy and admission are decided at the head (the server
 * runs with stream_bodies); the body is read from the client only once
 * an attempt is under way, and each span goes straight to the upstream
 * request (om_upstream_body_write), with backpressure both ways: above
 * the proxy's high-water mark of queued upstream bytes the client's body
 * is paused (TCP holds the client back) until the upstream took all but
 * a quarter of it. Memory per request is the server's read buffer, the
 * upstream queue up to the high-water mark, and the replay buffer.
 *
 * Replay: every byte sent is also kept while the whole body so far fits
 * the service's replay_limit, so a retry can send it again; the first
 * byte past it drops the buffer and makes the call non-replayable, so a
 * larger body is never retried once its first byte left. Every call's
 * copies together stay within the proxy's replay_budget (64 MiB): a copy
 * that would pass it is dropped the same way, so memory stays bounded
 * however many uploads run at once. Between
 * attempts (a backoff) the client's body is paused and what arrives is
 * held in the replay buffer.
 *
 * Limits: max_body_bytes (0: none) refuses a Content-Length over it at
 * the head (413, before any byte of the body is read) and a body whose
 * running count passes it (the upstream request is cancelled; 413 if
 * nothing was committed, else the response is cut). body_idle_ms is the
 * server's body idle timeout for the request: a stall past it is
 * answered 408 by the server (or cuts a committed response), and
 * on_close tells the call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_log.h"
#include "om_proxy_internal.h"

int om__proxy_body_too_large(const om__proxy_service_t *s,
                             const om_http_request_t *req) {
  uint64_t max = s->set.max_body_bytes;
  return req->body_streamed && max != 0 && req->content_length > 0 &&
         (uint64_t)req->content_length > max;
}

void om__proxy_body_init(om__proxy_call_t *c) {
  om__proxy_body_t *b = &c->body;
  memset(b, 0, sizeof *b);
  b->streamed = c->req->body_streamed;
  c->replayable = 1; /* until a byte sent does not fit the replay buffer */
  if (b->streamed)
    om_http_request_body_idle_timeout(c->req, c->set.body_idle_ms);
}

void om__proxy_body_free(om__proxy_call_t *c) {
  c->p->replay_held -= c->body.replay_cap;
  free(c->body.replay);
  c->body.replay = NULL;
  c->body.replay_len = c->body.replay_cap = 0;
}

void om__proxy_body_request(om__proxy_call_t *c, om_upstream_request_t *ur) {
  if (!c->body.streamed)
    return;
  ur->body = NULL;
  ur->body_len = 0;
  ur->body_stream = 1;
  ur->body_stream_length = c->req->content_length; /* -1: chunked */
}

om__proxy_outcome_t om__proxy_body_close_outcome(const om_http_request_t *req) {
  if (req->body_error == OM_HTTP_REJECT_REQUEST_TIMEOUT)
    return OM__PROXY_BODY_TIMEOUT;
  if (req->body_error == OM_HTTP_REJECT_BODY_TOO_LARGE)
    return OM__PROXY_BODY_TOO_LARGE;
  return OM__PROXY_CLIENT_CLOSED;
}

/* Keep data for a replay while the whole body fits the limit. */
static void keep(om__proxy_call_t *c, const char *data, size_t len) {
  om__proxy_body_t *b = &c->body;
  size_t need = b->replay_len + len;
  if (b->lost)
    return;
  if (need > c->set.replay_limit) {
    om__proxy_body_free(c);
    b->lost = 1;
    c->replayable = 0;
    return;
  }
  if (need > b->replay_cap) {
    size_t cap = b->replay_cap ? b->replay_cap : 16384;
    char *nb;
    while (cap < need)
      cap *= 2;
    if (cap > c->set.replay_limit)
      cap = (size_t)c->set.replay_limit;
    /* every call's copies together stay within the proxy's budget: past
     * it this body goes on without one (counted), as past replay_limit */
    if (c->p->replay_held - b->replay_cap + cap > c->p->opts.replay_budget) {
      c->p->replay_refused++;
      om__proxy_body_free(c);
      b->lost = 1;
      c->replayable = 0;
      return;
    }
    nb = realloc(b->replay, cap);
    if (nb == NULL) { /* no replay then, but the call goes on */
      om__proxy_body_free(c);
      b->lost = 1;
      c->replayable = 0;
      return;
    }
    c->p->replay_held += cap - b->replay_cap;
    b->replay = nb;
    b->replay_cap = cap;
  }
  memcpy(b->replay + b->replay_len, data, len);
  b->replay_len += len;
}

static void pause_client(om__proxy_call_t *c) {
  if (c->body.client_paused || c->req == NULL)
    return;
  c->body.client_paused = 1;
  om_http_request_body_pause(c->req);
}

static void resume_client(om__proxy_call_t *c) {
  if (!c->body.client_paused || c->req == NULL)
    return;
  c->body.client_paused = 0;
  om_http_request_body_resume(c->req);
}

/* The upstream took all but a quarter of the high-water mark. */
static void on_upstream_drained(void *ud) {
  resume_client(ud);
}

static int attempt_takes_body(const om__proxy_call_t *c) {
  return c->up != NULL && !c->discarding;
}

/* A piece of the body could not be queued: the upstream would get a
 * short body, so the call ends here. */
static void out_of_memory(om__proxy_call_t *c) {
  om__proxy_call_refuse(c, OM__PROXY_OVERLOADED,
                        "out of memory for the request body");
}

static void on_data(om_http_request_t *req, const char *data, size_t len) {
  om__proxy_call_t *c = req->user;
  om__proxy_body_t *b = &c->body;
  om_proxy_t *p = c->p;
  char msg[160];
  b->received += len;
  om_metric_add(c->s->m_body_bytes, (double)len);
  if (c->set.max_body_bytes != 0 && b->received > c->set.max_body_bytes) {
    snprintf(msg, sizeof msg,
             "the request body passed max_body_bytes (%llu bytes)",
             (unsigned long long)c->set.max_body_bytes);
    om__proxy_call_refuse(c, OM__PROXY_BODY_TOO_LARGE, msg);
    return;
  }
  if (c->committed && c->up == NULL)
    return;         /* answered already: what is left is dropped */
  if (c->committed) /* an upload under a committed response is traffic */
    om__proxy_stream_activity(c);
  keep(c, data, len);
  if (!attempt_takes_body(c)) {
    /* between attempts: held for the next one, if it fits */
    if (b->lost) {
      om__proxy_call_refuse(c, OM__PROXY_UPSTREAM,
                            "the request body outgrew the replay buffer "
                            "between attempts");
      return;
    }
    pause_client(c);
    return;
  }
  switch (om_upstream_body_write(c->up, data, len)) {
  case 0:
    break;
  case OM_ENOMEM:
    out_of_memory(c);
    return;
  default:
    return; /* the attempt is ending (an early answer): its on_done says */
  }
  if (om_upstream_body_pending(c->up) > p->opts.high_water) {
    int rc = om_upstream_body_on_drain(c->up, p->opts.high_water / 4,
                                       on_upstream_drained);
    if (rc == 0)
      pause_client(c);
  }
}

static void on_end(om_http_request_t *req) {
  om__proxy_call_t *c = req->user;
  c->body.ended = 1;
  if (attempt_takes_body(c) && om_upstream_body_end(c->up) == OM_ENOMEM)
    out_of_memory(c);
}

void om__proxy_body_sent(om__proxy_call_t *c) {
  om__proxy_body_t *b = &c->body;
  if (!b->streamed || c->up == NULL || c->req == NULL)
    return;
  if (b->replay_len > 0) {
    int rc = om_upstream_body_write(c->up, b->replay, b->replay_len);
    if (rc == OM_ENOMEM)
      out_of_memory(c);
    if (rc != 0)
      return;
  }
  if (b->ended) {
    if (om_upstream_body_end(c->up) == OM_ENOMEM)
      out_of_memory(c);
    return;
  }
  if (!b->started) {
    b->started = 1;
    if (om_http_request_body_start(c->req, on_data, on_end) != 0)
      om_log(OM_LOG_WARN, "proxy_body_start_failed", "service", c->s->name,
             NULL);
    return;
  }
  resume_client(c);
}
