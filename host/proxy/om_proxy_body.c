/*
 * om_proxy_body.c: streamed request bodies through the proxy. The
 * service, the policy and admission are decided at the head (the server
 * runs with stream_bodies); the body is read from the client only once
 * an attempt is under way, and each span goes straight to the upstream
 * request (om_upstream_body_write), with backpressure both ways: above
 * the proxy's high-water mark of queued upstream bytes the client's body
 * is paused (TCP holds the client back) until the upstream took all but
 * a quarter of it. Memory per request is the server's read buffers that the
 * upstream queue and the replay hold, up to the high-water mark and
 * replay_limit.
 *
 * No byte of the body is copied on the way: each span stays in the
 * server's read buffer, and the upstream write and the replay hold that
 * buffer by reference (om_http_request_body_ref) until they are done
 * with it; the server reads on into a new buffer meanwhile.
 *
 * Replay: every span sent is also held while the whole body so far fits
 * the service's replay_limit, so a retry can send it again; the first
 * byte past it lets the spans go and makes the call non-replayable, so a
 * larger body is never retried once its first byte left (and a retry of
 * a failure before the send is refused rather than sent short). Once the
 * response is committed no retry can come, so nothing more is held.
 * Every call's held bytes together stay within the proxy's replay_budget
 * (64 MiB; the buffers around them add at most one read buffer, 64 KiB,
 * per span boundary): a span that would pass it is let go the same way,
 * so memory stays bounded however many uploads run at once. Between
 * attempts (a backoff) the client's body is paused and what arrives is
 * held with the replay.
 *
 * A small body that came complete with its head (up to WHOLE_BODY_MAX,
 * the server's whole_body_max) is not streamed: the server copies it
 * into the request, which holds it for every attempt, and the upstream
 * gets head and body in one write, as nginx sends a buffered body.
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

int om__proxy_body_too_large(uint64_t max, const om_http_request_t *req) {
  if (max == 0)
    return 0;
  if (!req->body_streamed) /* none, or a small one that came whole */
    return req->body_len > max;
  return req->content_length > 0 && (uint64_t)req->content_length > max;
}

void om__proxy_body_init(om__proxy_call_t *c) {
  om__proxy_body_t *b = &c->body;
  memset(b, 0, sizeof *b);
  b->streamed = c->req->body_streamed;
  c->replayable = 1; /* until a byte sent does not fit the replay buffer */
  if (b->streamed) {
    om_http_request_body_idle_timeout(c->req, c->set.body_idle_ms);
  } else if (c->req->body_len > 0) {
    /* a small body that came with its head (the server's whole_body_max):
     * the request holds it, so head and body go out in one write and a
     * retry sends it again, within replay_limit as a streamed one */
    b->received = c->req->body_len;
    om_metric_add(c->s->m_body_bytes, (double)c->req->body_len);
    c->replayable = c->req->body_len <= c->set.replay_limit;
  }
  om__proxy_splice_upload_consider(c);
}

void om__proxy_body_free(om__proxy_call_t *c) {
  om__proxy_body_t *b = &c->body;
  size_t i;
  c->p->replay_held -= b->replay_len;
  for (i = 0; i < b->n_replay; i++) {
    if (b->replay[i].ref != NULL)
      om_http_body_ref_release(b->replay[i].ref);
    else
      free((char *)b->replay[i].data);
  }
  free(b->replay);
  b->replay = NULL;
  b->n_replay = b->replay_cap = b->replay_len = 0;
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

/* No replay from here on: what was kept is let go. */
static void lose_replay(om__proxy_call_t *c) {
  om__proxy_body_free(c);
  c->body.lost = 1;
  c->replayable = 0;
}

/* Keep data for a replay while the whole body fits the limit: by
 * reference on the server's buffer (ref), a span right after the last
 * one in the same buffer only lengthening it; copied when the server
 * could not lend it (ref NULL). */
static void keep(om__proxy_call_t *c, const char *data, size_t len,
                 om_http_body_ref_t *ref) {
  om__proxy_body_t *b = &c->body;
  om__proxy_span_t *last;
  if (b->lost)
    return;
  if (b->replay_len + len > c->set.replay_limit) {
    lose_replay(c);
    return;
  }
  /* every call's held bytes together stay within the proxy's budget:
   * past it this body goes on without a replay (counted), as past
   * replay_limit */
  if (c->p->replay_held + len > c->p->opts.replay_budget) {
    c->p->replay_refused++;
    lose_replay(c);
    return;
  }
  last = b->n_replay > 0 ? &b->replay[b->n_replay - 1] : NULL;
  if (ref != NULL && last != NULL && last->ref == ref &&
      last->data + last->len == data) {
    last->len += len;
  } else {
    om__proxy_span_t sp = {ref, data, len};
    if (b->n_replay == b->replay_cap) {
      size_t cap = b->replay_cap ? b->replay_cap * 2 : 8;
      om__proxy_span_t *nb = realloc(b->replay, cap * sizeof *nb);
      if (nb == NULL) { /* no replay then, but the call goes on */
        lose_replay(c);
        return;
      }
      b->replay = nb;
      b->replay_cap = cap;
    }
    if (ref == NULL) {
      char *copy = malloc(len);
      if (copy == NULL) {
        lose_replay(c);
        return;
      }
      memcpy(copy, data, len);
      sp.data = copy;
    } else {
      om_http_body_ref_retain(ref);
    }
    b->replay[b->n_replay++] = sp;
  }
  b->replay_len += len;
  c->p->replay_held += len;
}

/* The upstream is done with a lent span: its buffer reference goes. */
static void release_ref(void *ud) {
  om_http_body_ref_release(ud);
}

/* Queue a span on the attempt: lent when ref (a reference of its own is
 * taken for the upstream), else copied. om_upstream_body_write's
 * returns. */
static int send_span(om__proxy_call_t *c, const char *data, size_t len,
                     om_http_body_ref_t *ref) {
  int rc;
  if (ref == NULL)
    return om_upstream_body_write(c->up, data, len);
  om_http_body_ref_retain(ref);
  rc = om_upstream_body_write_ref(c->up, data, len, release_ref, ref);
  if (rc != 0)
    om_http_body_ref_release(ref);
  return rc;
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
  om_http_body_ref_t *ref;
  char msg[160];
  int rc;
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
    return;           /* answered already: what is left is dropped */
  if (c->committed) { /* an upload under a committed response is traffic,
                         and never replayed: nothing is held for it */
    om__proxy_stream_activity(c);
    if (!b->lost)
      lose_replay(c);
  }
  /* the span stays in the server's read buffer, which the replay and the
   * upstream write hold by reference: no copy of it is made */
  ref = om_http_request_body_ref(req);
  keep(c, data, len, ref);
  if (!attempt_takes_body(c)) {
    /* between attempts: held for the next one, if it fits */
    if (b->lost) {
      om_http_body_ref_release(ref);
      om__proxy_call_refuse(c, OM__PROXY_UPSTREAM,
                            "the request body outgrew the replay buffer "
                            "between attempts");
      return;
    }
    om_http_body_ref_release(ref);
    pause_client(c);
    return;
  }
  rc = send_span(c, data, len, ref);
  om_http_body_ref_release(ref);
  switch (rc) {
  case 0:
    break;
  case OM_ENOMEM:
    out_of_memory(c);
    return;
  default:
    return; /* the attempt is ending (an early answer): its on_done says */
  }
  if (c->usplice_want && om__proxy_splice_upload(c))
    return; /* the rest goes socket to socket */
  if (om_upstream_body_pending(c->up) > p->opts.high_water) {
    if (om_upstream_body_on_drain(c->up, p->opts.high_water / 4,
                                  on_upstream_drained) == 0)
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
  size_t i;
  if (!b->streamed || c->up == NULL || c->req == NULL)
    return;
  if (b->lost && b->received > 0) {
    /* bytes of the body went to an earlier attempt and were not kept (a
     * retry of a failure before anything was sent): the upstream would
     * get it short */
    om__proxy_call_refuse(c, OM__PROXY_UPSTREAM,
                          "the request body outgrew the replay buffer "
                          "before a retry");
    return;
  }
  for (i = 0; i < b->n_replay; i++) {
    const om__proxy_span_t *sp = &b->replay[i];
    int rc = send_span(c, sp->data, sp->len, sp->ref);
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
