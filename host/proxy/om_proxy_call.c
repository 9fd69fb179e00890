/*
 * om_proxy_call.c: one call through the proxy (docs/ARCHITECTURE.md "A proxied
 * request").
 *
 * The handler routes first (service from Host, then the traffic policy)
 * and refuses what it can without allocating: an unknown service, a
 * policy error, an empty subset, a full pool. Only a call that is
 * admitted or queued gets a call object, so memory stays bounded by
 * max_inflight + max_queue per service however hard callers push.
 *
 * Then, per attempt: select a peer inside the subset (rendezvous rank
 * when keyed, P2C otherwise; open circuits skipped; peers already tried
 * excluded), send with the head due within min(per_try, remaining), and
 * classify.
 * A retryable 5xx head is never shown to the caller when a retry will
 * follow: its body is discarded (the connection stays reusable) and the
 * next attempt starts after a full-jitter backoff. Any other head commits
 * the response: it streams through, and a later upstream failure aborts
 * the caller's response instead of replaying it (RFC 9112 7.1: a chunked
 * message without its last chunk is incomplete). The deadline ends at the
 * commit: from there the stream timeouts (om_proxy_stream.c) bound it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "om_backoff.h"
#include "om_errno.h"
#include "om_http_chars.h"
#include "om_http_tls.h"
#include "om_log.h"
#include "om_policy.h"
#include "om_proxy_cache.h"
#include "om_proxy_internal.h"

/* response heads up to this many fields go through a stack array */
#define STACK_HEADERS 128

static void start_attempt(om__proxy_call_t *c);

/* ------------------------------------------------------------------ */
/* small helpers */

static uint64_t ceil_ms(uint64_t ns) {
  if (ns == OM_DEADLINE_NEVER)
    return 0; /* "no timeout" for the upstream client */
  return ns / NS_PER_MS + (ns % NS_PER_MS != 0);
}

/* "123" -> 123 ms: 1..15 digits, nothing else (RFC 9110 5.6.3 OWS is
 * already trimmed by the server). */
static int parse_ms(const char *v, size_t len, uint64_t *out) {
  uint64_t x = 0;
  if (v == NULL || len == 0 || len > 15)
    return -1;
  for (size_t i = 0; i < len; i++) {
    if (v[i] < '0' || v[i] > '9')
      return -1;
    x = x * 10 + (uint64_t)(v[i] - '0');
  }
  *out = x;
  return 0;
}

/* ------------------------------------------------------------------ */
/* the end of a call */

static void on_call_timer_closed(uv_handle_t *h) {
  om__proxy_call_t *c = h->data;
  om_proxy_t *p = c->p;
  free(c);
  om__proxy_call_gone(p);
}

/*
 * The caller has its answer (or is gone): count the outcome, give the
 * slot back (which may admit the next queued call) and free the call.
 */
static void call_end(om__proxy_call_t *c, om__proxy_outcome_t o) {
  om__proxy_service_t *s = c->s;
  om_metric_inc(s->outcomes[o]);
  if (c->grpc) {
    /* the status the caller saw (om_proxy_grpc.c) */
    int st = o == OM__PROXY_OK              ? c->grpc_status
             : o == OM__PROXY_CLIENT_CLOSED ? 1  /* CANCELLED */
             : o == OM__PROXY_ABORTED       ? 13 /* INTERNAL: a reset */
                                            : om__proxy_outcome_grpc(o);
    om__proxy_grpc_count(s, c->grpc_m, st, uv_hrtime() - c->t0);
  }
  om__proxy_access_log_end(c, o);
  if (c->queued) {
    om_admission_cancel(s->adm, &c->waiter);
    c->queued = 0;
  }
  om__proxy_view_unref(c->view);
  c->view = NULL;
  om__proxy_subset_unref(c->shared);
  c->shared = NULL;
  free(c->tried_map);
  c->tried_map = NULL;
  om__proxy_body_free(c);
  if (c->admitted) {
    c->admitted = 0;
    om_admission_release(s->adm, uv_hrtime(), om__proxy_admitted, NULL);
    om__proxy_arm_queue_timer(s);
  }
  if (c->timer_init) {
    uv_close((uv_handle_t *)&c->timer, on_call_timer_closed);
  } else {
    om_proxy_t *p = c->p;
    free(c);
    om__proxy_call_gone(p);
  }
}

void om__proxy_call_end(om__proxy_call_t *c, om__proxy_outcome_t o) {
  call_end(c, o);
}

static void fail(om__proxy_call_t *c, om__proxy_outcome_t o,
                 const char *message) {
  if (c->req != NULL) {
    om_http_request_t *req = c->req;
    /* the id the upstream saw: ours when the caller's was absent or
     * named in its Connection */
    const char *rid = c->request_id[0] != '\0'
                          ? c->request_id
                          : om_http_request_header(req, "x-request-id", NULL);
    c->req = NULL;
    om__proxy_respond_error(req, o, message, c->attempts, rid);
  }
  call_end(c, o);
}

/* No (further) attempt: tell the caller why the last one failed. */
static void fail_last(om__proxy_call_t *c, uint64_t now) {
  char msg[512];
  if (c->last_fail == OM_UPSTREAM_FAIL_LOCAL && c->last_status == 0) {
    snprintf(msg, sizeof msg,
             "the proxy is out of local resources (descriptors, buffers or "
             "ports) to reach peer '%s' (%u attempt%s)",
             c->last_peer, c->attempts, c->attempts == 1 ? "" : "s");
    fail(c, OM__PROXY_LOCAL, msg);
    return;
  }
  if (om_deadline_expired(c->deadline, now + NS_PER_MS) ||
      (c->last_timeout && c->last_deadline_limited)) {
    snprintf(msg, sizeof msg,
             "the call's deadline passed after %u attempt%s (last peer '%s': "
             "%s)",
             c->attempts, c->attempts == 1 ? "" : "s", c->last_peer,
             c->last_status ? "retryable status"
                            : om_upstream_fail_name(c->last_fail));
    fail(c, OM__PROXY_DEADLINE, msg);
    return;
  }
  if (c->last_grpc != 0)
    snprintf(msg, sizeof msg,
             "peer '%s' answered grpc-status %d and no other attempt could "
             "be made (%u attempt%s)",
             c->last_peer, c->last_grpc, c->attempts,
             c->attempts == 1 ? "" : "s");
  else if (c->last_status != 0)
    snprintf(msg, sizeof msg,
             "peer '%s' answered %d and no other attempt could be made "
             "(%u attempt%s)",
             c->last_peer, c->last_status, c->attempts,
             c->attempts == 1 ? "" : "s");
  else
    snprintf(msg, sizeof msg, "peer '%s': %s (%u attempt%s)", c->last_peer,
             om_upstream_fail_name(c->last_fail), c->attempts,
             c->attempts == 1 ? "" : "s");
  fail(c, OM__PROXY_UPSTREAM, msg);
}

/* ------------------------------------------------------------------ */
/* attempts */

/*
 * The attempt is over (or was cancelled): in-flight counts, the peer's
 * latency estimate, its circuit (if the head did not already decide it)
 * and the adaptive limit learn its outcome.
 */
static void attempt_done(om__proxy_call_t *c, int ok, int dropped, int record,
                         uint64_t now) {
  om__proxy_peer_t *peer = c->peer;
  om__proxy_service_t *s = c->s;
  uint64_t lat = (c->head_ns ? c->head_ns : now) - c->attempt_t0;
  if (peer == NULL)
    return;
  peer->inflight--;
  if (peer->index >= 0) {
    om_p2c_finish(s->view->p2c, (size_t)peer->index, record ? lat : 0,
                  record && ok, now);
    if (record)
      peer->sampled = 1;
  }
  if (c->circuit_pending && record)
    om__proxy_circuit_record(peer->circuit, now, ok != 0);
  else if (c->circuit_pending) /* a probe that learned nothing: free it */
    om__proxy_circuit_release(peer->circuit, now);
  c->circuit_pending = 0;
  if (!ok && record)
    peer->failures++;
  if (s->limiter != NULL && record) {
    uint32_t old = om_limiter_limit(s->limiter);
    uint32_t lim = om_limiter_sample(s->limiter, now, lat,
                                     om_admission_inflight(s->adm), dropped);
    if (lim != old) {
      om_admission_set_limit(s->adm, lim, now, om__proxy_admitted, NULL);
      om__proxy_arm_queue_timer(s);
    }
  }
  om__proxy_peer_unref(peer);
  c->peer = NULL;
}

static void stop_timer(om__proxy_call_t *c) {
  if (c->timer_init)
    uv_timer_stop(&c->timer);
}

static void ensure_timer(om__proxy_call_t *c) {
  if (!c->timer_init) {
    uv_timer_init(c->p->loop, &c->timer);
    c->timer.data = c;
    c->timer_init = 1;
  }
}

static void on_backoff(uv_timer_t *t) {
  start_attempt(t->data);
}

static void schedule_retry(om__proxy_call_t *c) {
  if (c->wait_ns == 0) {
    start_attempt(c);
    return;
  }
  ensure_timer(c);
  uv_update_time(c->p->loop);
  uv_timer_start(&c->timer, on_backoff, ceil_ms(c->wait_ns), 0);
}

/* Downstream drained below the low-water mark: read upstream again. */
static void on_client_drained(om_http_request_t *req) {
  om__proxy_call_t *c = req->user;
  if (c == NULL || !c->paused || c->up == NULL)
    return;
  c->paused = 0;
  om__proxy_stream_activity(c); /* the client took bytes */
  om_upstream_resume(c->up);
}

/*
 * The body of a retryable head being discarded stalled until the
 * deadline: nothing was committed, so the deadline still bounds it. The
 * connection is closed and the next attempt finds the deadline passed.
 */
static void on_discard_timeout(uv_timer_t *t) {
  om__proxy_call_t *c = t->data;
  if (!c->discarding || c->up == NULL)
    return;
  om_upstream_cancel(c->up);
  c->up = NULL;
  attempt_done(c, 0, c->status == 503, 1, uv_hrtime());
  c->discarding = 0;
  c->status = 0;
  start_attempt(c);
}

static int up_on_headers(void *ud, const om_upstream_response_t *r) {
  om__proxy_call_t *c = ud;
  om_proxy_t *p = c->p;
  om__proxy_peer_t *peer = c->peer;
  om_http_header_t stack[STACK_HEADERS], *h = stack;
  uint64_t now = uv_hrtime(), ra = 0, wait, push = 0;
  int has_ra = 0, ok = r->status < 500, rc, has_push = 0;
  int grpc = om__proxy_grpc_retryable(c, r, &push, &has_push);
  char att[24];
  size_t n = 0, att_len;
  if (c->req == NULL)
    return 1; /* not reached: on_close cancels the attempt */
  if (grpc != 0)
    ok = 0; /* UNAVAILABLE and the like: the peer's failure */
  c->head_ns = now;
  c->status = r->status;
  c->upgrade_sent = 1;
  om_metric_observe(c->s->m_latency, (double)(now - c->attempt_t0) / 1e9);
  if (c->circuit_pending) {
    om__proxy_circuit_record(peer->circuit, now, ok);
    c->circuit_pending = 0;
  }
  if (r->status == 429 || r->status == 503) {
    has_ra = om__proxy_retry_after(r, p->opts.retry_after_ceiling_ms, &ra);
    if (peer->index >= 0) {
      /* mirror om_p2c's window so it can be carried across revisions */
      uint64_t win = has_ra ? ra : UINT64_C(1000000000);
      if (win > UINT64_C(60000000000))
        win = UINT64_C(60000000000);
      if (now + win > peer->penalty_until_ns)
        peer->penalty_until_ns = now + win;
      om_p2c_penalize(c->s->view->p2c, (size_t)peer->index, has_ra ? ra : 0,
                      now);
    }
    if (!c->set.retry_429 && r->status == 429)
      has_ra = 0;
  }
  if (r->status == 101) /* only ever to an upgrade the policy allowed */
    return om__proxy_tunnel_start(c, r);
  if (c->upgrade[0] != '\0')
    om__proxy_upgrade_count(c->s, OM__PROXY_UPG_DECLINED);
  if (grpc > 0) {
    /* proposal A6: a Trailers-Only answer with a retryable status was
     * not committed; it goes to another peer of the subset within the
     * deadline and the budget, after the server's pushback if it gave
     * one, whatever the method (the policy listed the status) */
    int again;
    c->grpc_retry = 1;
    again = om__proxy_decide_retry(c, r->status, OM_RETRY_ERR_NONE,
                                   OM_RETRY_PHASE_POST_SEND, has_push, push,
                                   now, &wait);
    c->grpc_retry = 0;
    if (again) {
      c->discarding = 1; /* on_done follows: nothing more comes */
      c->wait_ns = has_push ? push : wait;
      c->last_status = r->status;
      c->last_grpc = grpc;
      c->last_timeout = 0;
      return 0;
    }
  }
  if (om_retry_policy_has_status(c->set.retry_429 ? &p->retry_policy_429
                                                  : &p->retry_policy,
                                 r->status) &&
      om__proxy_decide_retry(c, r->status, OM_RETRY_ERR_NONE,
                             OM_RETRY_PHASE_POST_SEND, has_ra, ra, now,
                             &wait)) {
    uint64_t left = om_deadline_remaining(c->deadline, now);
    c->discarding = 1; /* its body goes nowhere; the next attempt follows */
    c->wait_ns = wait;
    c->last_status = r->status;
    c->last_timeout = 0;
    if (r->has_body && left != OM_DEADLINE_NEVER) {
      ensure_timer(c);
      uv_timer_start(&c->timer, on_discard_timeout, ceil_ms(left), 0);
    }
    return 0;
  }
  if (r->n_headers + 2 > STACK_HEADERS) {
    h = malloc((r->n_headers + 2) * sizeof *h);
    if (h == NULL)
      return 1;
  }
  for (size_t i = 0; i < r->n_headers; i++) {
    const om_http_header_t *f = &r->headers[i];
    if (!om__proxy_response_field_dropped(f, r->status))
      h[n++] = *f;
  }
  att_len = om__http_u64_dec(att, c->attempts);
  h[n++] = (om_http_header_t){"x-openmesh-peer", peer->id, 15, 0};
  h[n++] = (om_http_header_t){"x-openmesh-attempts", att, 19, att_len};
  /* om_upstream refused a head whose names are not tokens or whose values
   * are not field-content; ours are a peer id (a snapshot name) and a
   * number: no second pass over the bytes */
  if (!r->has_body && c->req->version_major == 2 &&
      !(c->req->method_len == 4 && memcmp(c->req->method, "HEAD", 4) == 0)) {
    om__proxy_grpc_respond_bodiless(c, r->status, h, n);
    if (h != stack)
      free(h);
    return 0;
  }
  rc = om_http_response_start_checked(c->req, r->status, h, n);
  if (h != stack)
    free(h);
  if (rc == OM_EINVAL) {
    /* a head the server will not relay (a field it refuses): 502 */
    c->last_status = 0;
    c->last_fail = OM_UPSTREAM_FAIL_MALFORMED;
    return 1;
  }
  c->committed = 1; /* OM_ESTATE: the client is gone; on_close follows */
  if (rc == 0 && r->has_body) {
    om__proxy_stream_start(c);
    om__proxy_splice_consider(c, r);
  }
  return 0;
}

static void up_on_body(void *ud, const char *data, size_t len) {
  om__proxy_call_t *c = ud;
  if (!c->committed || c->req == NULL)
    return;
  om__proxy_stream_activity(c);
  om_http_response_write(c->req, data, len);
  if (c->splice_want && om__proxy_splice_body(c))
    return; /* the rest goes socket to socket */
  if (!c->paused && om_http_response_pending(c->req) > c->p->opts.high_water) {
    /* TCP flow control pushes back on the upstream from here, until the
     * client has taken all but a quarter of the high-water mark */
    int rc = om_http_response_on_drain(c->req, c->p->opts.high_water / 4,
                                       on_client_drained);
    if (rc == 0 && om_upstream_pause(c->up) == 0) {
      c->paused = 1;
      c->s->paused++;
    } else if (rc == 0) {
      om_http_response_on_drain(c->req, 0, NULL);
    }
  }
}

/*
 * The attempt's peer is no longer tried. peer->index is its place in the
 * service's current view, which is the call's view unless the topology
 * changed since the call was routed; then the subset is searched (a rare
 * path: a local failure or a name's next address on a changed view).
 */
static void untry(om__proxy_call_t *c) {
  om__proxy_view_t *v = c->view;
  if (c->peer == NULL)
    return;
  if (c->peer->index >= 0 && (size_t)c->peer->index < v->n &&
      v->peers[c->peer->index] == c->peer) {
    om__proxy_tried_remove(c, (uint32_t)c->peer->index);
    return;
  }
  for (size_t k = 0; k < c->n_subset; k++) {
    uint32_t i = OM__PROXY_SUBSET_AT(c, k);
    if (v->peers[i] == c->peer) {
      om__proxy_tried_remove(c, i);
      return;
    }
  }
}

static void up_on_done(void *ud, const om_upstream_result_t *res) {
  om__proxy_call_t *c = ud;
  uint64_t now = uv_hrtime();
  int timeout = res->fail == OM_UPSTREAM_FAIL_TIMEOUT_CONNECT ||
                res->fail == OM_UPSTREAM_FAIL_TIMEOUT_FIRST_BYTE ||
                res->fail == OM_UPSTREAM_FAIL_TIMEOUT_TOTAL;
  int local = res->fail == OM_UPSTREAM_FAIL_LOCAL;
  int ok, dropped, record = res->fail != OM_UPSTREAM_FAIL_CLOSED && !local;
  int next_addr;
  c->up = NULL;
  om__proxy_splice_stop(c); /* the attempt ended under a splice */
  om__proxy_pool_done(c->s, res);
  if (res->tls_handshake != 0 || res->tls_fail != 0)
    om__proxy_tls_done(c->s, c->peer, res, now);
  if (local)
    /* the process's trouble, not the peer's */
    om__proxy_local_error(c->p, c->s->name, res->os_err, res->detail, now);
  /* a peer by name that failed to connect moves to its next address; while
   * one is untried the failure is the address's, not the peer's */
  next_addr = !local && om__proxy_resolve_outcome(c->peer, res->fail, now);
  if (next_addr)
    record = 0;
  if (local || next_addr) /* it may be picked again */
    untry(c);
  if (c->paused) {
    if (c->req != NULL)
      om_http_response_on_drain(c->req, 0, NULL);
    c->paused = 0;
  }
  ok = res->headers_delivered ? c->status < 500 : 0;
  if (res->fail == OM_UPSTREAM_FAIL_ABORTED && c->status != 0)
    ok = 0; /* we refused its head */
  dropped = (!res->headers_delivered && res->err != 0) || c->status == 503;
  attempt_done(c, ok, dropped, record, now);
  if (c->tun != NULL)
    return; /* upgraded: the tunnel ends the call */
  c->upgrade_sent = res->sent;
  if (c->committed) {
    om_http_request_t *req = c->req;
    c->req = NULL;
    if (req == NULL && c->finished && res->err == 0) {
      call_end(c, OM__PROXY_OK); /* ended by its trailers, or Trailers-Only */
    } else if (req == NULL) {
      call_end(c, OM__PROXY_CLIENT_CLOSED);
    } else if (res->err == 0) {
      om_http_response_end(req);
      call_end(c, OM__PROXY_OK);
    } else {
      /* committed: never replayed; the caller sees a cut message */
      om_http_response_abort(req);
      om_log(OM_LOG_WARN, "proxy_stream_aborted", "service", c->s->name, "peer",
             c->last_peer, "reason", res->reason, "detail", res->detail, NULL);
      call_end(c, OM__PROXY_ABORTED);
    }
    return;
  }
  if (c->discarding) {
    c->discarding = 0;
    c->status = 0;
    stop_timer(c); /* the discard's bound */
    schedule_retry(c);
    return;
  }
  if (c->req == NULL) { /* cannot happen: on_close cancels first */
    call_end(c, OM__PROXY_CLIENT_CLOSED);
    return;
  }
  if (res->fail != OM_UPSTREAM_FAIL_ABORTED) {
    c->last_fail = res->fail;
    c->last_status = 0;
  }
  c->last_timeout = timeout;
  c->last_deadline_limited = c->deadline_limited;
  if (local) {
    /* nothing was sent: one more attempt, after the usual backoff (time
     * for descriptors to come back), never a tight loop over the subset */
    if (!c->local_retried) {
      c->local_retried = 1;
      c->wait_ns =
          om_backoff_ns(1, c->p->opts.backoff_base_ms * NS_PER_MS,
                        c->p->opts.backoff_cap_ms * NS_PER_MS, &c->p->rng);
      schedule_retry(c);
      return;
    }
    fail_last(c, now);
    return;
  }
  {
    om_retry_error_t rc = om__proxy_retry_class(res->fail);
    /* nothing left (res->sent 0, exact on every path): no server saw the
     * request, any method may go again; a streamed body cut under a
     * reused connection ends with sent 1 and follows the method rules */
    om_retry_phase_t ph =
        res->sent ? OM_RETRY_PHASE_POST_SEND : OM_RETRY_PHASE_PRE_SEND;
    uint64_t wait;
    if (rc != OM_RETRY_ERR_NONE && !res->headers_delivered &&
        om__proxy_decide_retry(c, 0, rc, ph, 0, 0, now, &wait)) {
      c->wait_ns = wait;
      schedule_retry(c);
      return;
    }
  }
  fail_last(c, now);
}

/*
 * The trailers of an HTTP/2 upstream's response (gRPC's grpc-status):
 * the response ends with them here, on_done follows.
 */
static void up_on_trailers(void *ud, const om_http_header_t *h, size_t n) {
  om__proxy_call_t *c = ud;
  om_http_request_t *req = c->req;
  if (!c->committed || req == NULL)
    return;
  c->req = NULL;
  c->finished = 1;
  c->grpc_status = om__proxy_grpc_status_of(h, n);
  om_http_response_end_trailers(req, h, n);
}

static const om_upstream_callbacks_t UP_CB = {up_on_headers, up_on_body,
                                              up_on_done, up_on_trailers};

/* Build prefix + path[?query] for peer into c->target. */
static void build_target(om__proxy_call_t *c, const om__proxy_peer_t *peer) {
  size_t k = 0;
  if (!(c->path_q_len == 1 && c->path_q[0] == '*')) {
    memcpy(c->target, peer->prefix, peer->prefix_len);
    k = peer->prefix_len;
  }
  memcpy(c->target + k, c->path_q, c->path_q_len);
  c->target[k + c->path_q_len] = '\0';
}

static void start_attempt(om__proxy_call_t *c) {
  om_proxy_t *p = c->p;
  om__proxy_service_t *s = c->s;
  om_upstream_request_t ur;
  om__proxy_peer_t *peer;
  uint64_t now = uv_hrtime(), attempt_ns, remaining;
  int all_open, rc;
  if (c->req == NULL) {
    call_end(c, OM__PROXY_CLIENT_CLOSED);
    return;
  }
  if (!om_deadline_can_start_attempt(c->deadline, now,
                                     p->opts.min_attempt_ms * NS_PER_MS)) {
    if (c->attempts == 0)
      fail(c, OM__PROXY_DEADLINE,
           "the call's deadline passed before an attempt could start");
    else
      fail_last(c, now);
    return;
  }
  peer = om__proxy_select_peer(c, now, &all_open);
  if (peer == NULL) {
    if (c->attempts > 0)
      fail_last(c, now);
    else if (all_open)
      fail(c, OM__PROXY_ALL_OPEN,
           "every peer the policy allows is behind an open circuit");
    else
      fail(c, OM__PROXY_NO_PEERS, "no peer to select");
    return;
  }
  if (c->attempts == 0)
    om_retry_budget_record_request(s->budget, now);
  c->attempts++;
  s->attempts++;
  om_metric_inc(s->m_attempts);
  if (c->attempts > 1) {
    s->retries++;
    if (c->retry_pre_send)
      s->retries_pre_send++;
    om_metric_inc(c->retry_pre_send ? s->m_retries_pre : s->m_retries_post);
  }
  peer->refs++;
  peer->inflight++;
  peer->attempts++;
  if (peer->index >= 0)
    om_p2c_start(s->view->p2c, (size_t)peer->index);
  c->peer = peer;
  c->circuit_pending = 1;
  c->status = 0;
  c->head_ns = 0;
  c->attempt_t0 = now;
  {
    size_t idl = strlen(peer->id);
    if (idl >= sizeof c->last_peer)
      idl = sizeof c->last_peer - 1;
    memcpy(c->last_peer, peer->id, idl);
    c->last_peer[idl] = '\0';
  }
  remaining = om_deadline_remaining(c->deadline, now);
  attempt_ns = om_deadline_attempt_timeout(c->deadline, now, c->set.per_try_ns);
  c->deadline_limited = attempt_ns == remaining;
  c->n_fwd = c->n_fwd_fixed;
  /* only a retry says which attempt it is: the first (nearly every call)
   * costs the upstream no extra field */
  if (c->attempts > 1)
    c->fwd[c->n_fwd++] =
        (om_http_header_t){"x-openmesh-attempt", c->attempt_buf, 18,
                           om__http_u64_dec(c->attempt_buf, c->attempts)};
  if (remaining != OM_DEADLINE_NEVER) {
    c->fwd[c->n_fwd++] = (om_http_header_t){
        "x-openmesh-deadline-ms", c->deadline_buf, 22,
        om__http_u64_dec(c->deadline_buf, remaining / NS_PER_MS)};
    if (c->grpc_deadline) /* deadlines propagate hop by hop: what is left */
      c->fwd[c->n_fwd++] = (om_http_header_t){
          "grpc-timeout", c->grpc_timeout_buf, 12,
          om__proxy_grpc_timeout_format(c->grpc_timeout_buf, remaining)};
  }
  build_target(c, peer);
  memset(&ur, 0, sizeof ur);
  ur.method = c->req->method;
  ur.method_len = c->req->method_len;
  ur.target = c->target;
  ur.headers = c->fwd;
  ur.n_headers = c->n_fwd;
  ur.body = c->req->body;
  ur.body_len = c->req->body_len;
  om__proxy_body_request(c, &ur);
  if (ur.body_stream) {
    /* a streamed upload takes as long as the client sends: the
     * wait for the head starts when the body is complete (as Envoy
     * starts its route timeout once the request is in); the body
     * idle timeout bounds a stalled one */
    ur.connect_timeout_ms = ceil_ms(attempt_ns);
    ur.first_byte_timeout_ms = ceil_ms(attempt_ns);
  } else {
    /* connect and the wait for the head; never the body, which the stream
     * timeouts bound once the head is committed */
    ur.head_timeout_ms = ceil_ms(attempt_ns);
  }
  /* the caller's fields passed om_http_server's RFC 9112 checks; ours are
   * built from ids, numbers and an address */
  ur.headers_valid = 1;
  /* a stale pooled connection may re-send only what the retry rules would
   * send again after bytes left (as nginx and Envoy): safe or keyed */
  ur.retry_stale =
      c->replayable && om__proxy_request_allows(c, 0, OM_RETRY_ERR_RESET,
                                                OM_RETRY_PHASE_POST_SEND);
  ur.upgrade = c->upgrade[0] != '\0' ? c->upgrade : NULL;
  ur.http2 = c->set.http2;
  if (peer->target.tls)
    om__proxy_tls_request(c->s, &ur);
  om__proxy_pool_request(c, &ur); /* the service's keep-alive limits */
  rc = om_upstream_send(p->pool, &peer->target, &ur, &UP_CB, c, &c->up);
  if (rc != 0) {
    char msg[256];
    attempt_done(c, 0, 0, 0, now); /* not the peer's doing: nothing */
    snprintf(msg, sizeof msg, "cannot send to peer '%s': %s", c->last_peer,
             om_strerror(rc));
    if (rc == OM_ENOMEM)
      om__proxy_local_error(p, s->name, 0, "out of memory", now);
    fail(c, rc == OM_ENOMEM ? OM__PROXY_LOCAL : OM__PROXY_UPSTREAM, msg);
    return;
  }
  om__proxy_pool_sent(s, c->up);
  om__proxy_body_sent(c);
}

void om__proxy_call_refuse(om__proxy_call_t *c, om__proxy_outcome_t o,
                           const char *message) {
  stop_timer(c);
  om__proxy_splice_stop(c);
  if (c->up != NULL) {
    om_upstream_cancel(c->up);
    c->up = NULL;
    /* says nothing about the peer: its circuit and estimate stay */
    attempt_done(c, 0, 0, 0, uv_hrtime());
  }
  if (c->committed) {
    om_http_request_t *req = c->req;
    c->req = NULL;
    if (req != NULL)
      om_http_response_abort(req);
    call_end(c, o);
    return;
  }
  fail(c, o, message);
}

void om__proxy_call_cut(om__proxy_call_t *c) {
  om_http_request_t *req = c->req;
  c->streaming = 0;
  om__proxy_splice_stop(c);
  if (c->up != NULL) {
    om_upstream_cancel(c->up);
    c->up = NULL;
    /* the head already judged the peer: the cut is the stream's limit */
    attempt_done(c, c->status < 500, 0, 1, uv_hrtime());
  }
  c->paused = 0;
  c->req = NULL;
  if (req != NULL)
    om_http_response_abort(req);
  call_end(c, OM__PROXY_ABORTED);
}

/* ------------------------------------------------------------------ */
/* admission */

void om__proxy_admitted(om_admission_waiter_t *w, int status, void *ud) {
  om__proxy_call_t *c = w->data;
  (void)ud;
  c->queued = 0;
  if (status != 0) {
    fail(c, OM__PROXY_DEADLINE,
         "the call's deadline passed while it waited for a slot");
    return;
  }
  c->admitted = 1;
  start_attempt(c);
}

static void on_queue_timer(uv_timer_t *t) {
  om__proxy_service_t *s = t->data;
  s->queue_timer_at = OM_DEADLINE_NEVER;
  om_admission_expire(s->adm, uv_hrtime(), om__proxy_admitted, NULL);
  om__proxy_arm_queue_timer(s);
}

void om__proxy_arm_queue_timer(om__proxy_service_t *s) {
  uint64_t next, now;
  if (!s->queue_timer_open || s->adm == NULL)
    return;
  next = om_admission_next_deadline(s->adm);
  if (next == OM_DEADLINE_NEVER) {
    uv_timer_stop(&s->queue_timer);
    s->queue_timer_at = OM_DEADLINE_NEVER;
    return;
  }
  if (uv_is_active((uv_handle_t *)&s->queue_timer) && s->queue_timer_at <= next)
    return;
  uv_update_time(s->proxy->loop);
  now = uv_hrtime();
  uv_timer_start(&s->queue_timer, on_queue_timer,
                 next > now ? ceil_ms(next - now) : 0, 0);
  s->queue_timer_at = next;
}

/* ------------------------------------------------------------------ */
/* the handler */

static void on_client_close(om_http_request_t *req) {
  om__proxy_call_t *c = req->user;
  om__proxy_splice_stop(c); /* before the sockets' owners let go */
  c->req = NULL;
  stop_timer(c);
  c->paused = 0;
  if (c->up != NULL) {
    om_upstream_cancel(c->up);
    c->up = NULL;
    /* says nothing about the peer: its circuit and estimate stay */
    attempt_done(c, 0, 0, 0, uv_hrtime());
  }
  call_end(c, om__proxy_body_close_outcome(req));
}

/*
 * One allocation for the call and everything it carries: the subset
 * (unless it is every peer or a cached list shared by reference), the
 * forwarded headers, the target and the bytes of the fields the proxy
 * builds (om__proxy_headers_size says how many). Nothing is sized by
 * the view: at 10,000 peers a call costs what it costs at 2. Takes the
 * route's reference to a shared list (released with the call, or here
 * on failure).
 */
static om__proxy_call_t *call_new(om_proxy_t *p, om__proxy_service_t *s,
                                  om_http_request_t *req,
                                  const om__proxy_route_t *rt, int keyed) {
  om__proxy_view_t *v = s->view;
  size_t own = rt->all || rt->shared != NULL ? 0 : rt->n_subset;
  size_t n_fwd, hdr_bytes, path_q_len, size;
  char *at;
  om__proxy_call_t *c;
  om__proxy_headers_size(req, rt->decision, &n_fwd, &hdr_bytes);
  path_q_len = req->path_len + (req->query ? 1 + req->query_len : 0);
  size = sizeof *c + n_fwd * sizeof(om_http_header_t) + own * sizeof(uint32_t) +
         v->max_prefix + 2 * path_q_len + 2 + hdr_bytes;
  c = calloc(1, size);
  if (c == NULL) {
    om__proxy_subset_unref(rt->shared);
    return NULL;
  }
  at = (char *)(c + 1);
  c->fwd = (om_http_header_t *)at;
  at += n_fwd * sizeof(om_http_header_t);
  if (rt->shared != NULL) {
    c->shared = rt->shared;
    c->subset = rt->shared->ids;
  } else if (!rt->all) {
    uint32_t *mine = (uint32_t *)at;
    memcpy(mine, p->scratch, own * sizeof *mine);
    c->subset = mine;
    at += own * sizeof(uint32_t);
  }
  /* path[?query] once, then the per-peer target buffer */
  {
    char *pq = at;
    memcpy(pq, req->path, req->path_len);
    if (req->query != NULL) {
      pq[req->path_len] = '?';
      memcpy(pq + req->path_len + 1, req->query, req->query_len);
    }
    pq[path_q_len] = '\0';
    c->path_q = pq;
    c->path_q_len = path_q_len;
    at += path_q_len + 1;
  }
  c->target = at;
  at += v->max_prefix + path_q_len + 1;
  c->xff = at;
  c->p = p;
  c->s = s;
  c->view = v;
  v->refs++;
  c->req = req;
  c->grpc = om__proxy_is_grpc(req);
  c->grpc_status = -1;
  if (c->grpc)
    c->grpc_m = om__proxy_grpc_method(s, req->path, req->path_len);
  c->n_subset = rt->all ? v->n : rt->n_subset;
  c->keyed = keyed;
  c->waiter.data = c;
  /* the forwarded set (om_proxy_headers.c); the retry rules read its
   * Idempotency-Key */
  om__proxy_headers_build(c, req, rt->decision, c->xff);
  om__proxy_access_log_begin(c, req);
  p->calls++;
  return c;
}

/*
 * om_policy_route, through the service's decision cache when the policy
 * declares vary (om_proxy_cache.h), behind the shedding gate
 * (om_proxy_isolation.c): 1, with err saying why, while the service's
 * policy is shed; else the route's result, which the gate learns from.
 */
static int route(om__proxy_service_t *s, const om_policy_req_t *preq,
                 om__proxy_route_t *rt, char *err, size_t errlen,
                 uint64_t now) {
  uint64_t hits = s->cache.hits;
  int rc;
  memset(rt, 0, sizeof *rt);
  if (om__proxy_shed_gate(s, now, err, errlen))
    return 1; /* shed: refused without running the policy, not logged */
  rc = om__proxy_cache_route(&s->cache, om__proxy_policy(s), preq,
                             s->proxy->scratch, &s->proxy->decision, rt, err,
                             errlen);
  if (rc != 0) { /* no subset goes with a refusal or an error */
    om__proxy_subset_unref(rt->shared);
    rt->shared = NULL;
  }
  om__proxy_shed_outcome(s, rc, s->cache.hits == hits, uv_hrtime());
  return rc;
}

/*
 * The id of a request the proxy answers itself before a call exists: the
 * caller's X-Request-Id, else a fresh one in buf (32 hex digits), so every
 * error the proxy produces can be found in its log by the id the caller
 * holds. Drawn only on a refusal: the relayed path pays nothing.
 */
static const char *own_id(om_proxy_t *p, om_http_request_t *req, char buf[33]) {
  static const char hex[] = "0123456789abcdef";
  const char *id = om_http_request_header(req, "x-request-id", NULL);
  if (id != NULL && id[0] != '\0')
    return id;
  uint64_t w[2] = {om_rng_next(&p->rng), om_rng_next(&p->rng)};
  for (int i = 0; i < 32; i++)
    buf[i] = hex[(w[i / 16] >> (60 - 4 * (i % 16))) & 0xf];
  buf[32] = '\0';
  return buf;
}

/*
 * A route call failed: the outcome tells the operator which of the three
 * it was (a shed policy is a budget outcome: it is shed for its trips).
 * Logged at most once a second per service, with what finds the request
 * (its id, method, path) and the policy revision that failed it.
 */
static om__proxy_outcome_t policy_failed(om__proxy_service_t *s,
                                         om_http_request_t *req, int rc,
                                         const char *id, const char *err,
                                         uint64_t now) {
  om_policy_t *pol = om__proxy_policy(s);
  int why = rc == 1 || pol == NULL ? OM_POLICY_FAIL_BUDGET
                                   : om_policy_last_failure(pol);
  om__proxy_outcome_t o = why == OM_POLICY_FAIL_BUDGET ? OM__PROXY_POLICY_BUDGET
                          : why == OM_POLICY_FAIL_ANSWER
                              ? OM__PROXY_POLICY_ANSWER
                              : OM__PROXY_POLICY_RUNTIME;
  uint64_t held;
  if (rc < 0 && om__proxy_log_limit(&s->policy_log, now, &held)) {
    char sup[24], rev[24];
    snprintf(sup, sizeof sup, "%llu", (unsigned long long)held);
    snprintf(rev, sizeof rev, "%llu",
             (unsigned long long)(s->watch != NULL
                                      ? om_policy_watch_revision(s->watch)
                                      : 0));
    om_log(OM_LOG_WARN, "proxy_policy_error", "service", s->name, "outcome",
           om__proxy_outcome_name(o), "request_id", id, "method",
           req->method != NULL ? req->method : "", "path",
           req->path != NULL ? req->path : "", "policy_source",
           s->watch != NULL ? om_policy_watch_source(s->watch) : "",
           "policy_revision", rev, "error", err, "suppressed", sup, NULL);
  }
  return o;
}

/*
 * A per-request decision over the service's settings (docs/POLICIES.md
 * "Per-request decisions"). The service's fields are the defaults; its
 * max_deadline_ms caps the decision's deadline, which in turn caps what
 * the caller's x-openmesh-deadline-ms may ask for (the policy said how
 * long this request may take: a caller may shorten it, not raise it);
 * its max_body_bytes caps the decision's (a decision can only lower
 * it). Retries stay under the service's retry budget whatever the
 * decision says.
 */
static void apply_decision(om__proxy_settings_t *set,
                           const om_policy_decision_t *d) {
  if (d->fields & OM_DECIDE_DEADLINE) {
    uint64_t ns = d->deadline_ms * NS_PER_MS;
    set->deadline_ns = ns < set->max_deadline_ns ? ns : set->max_deadline_ns;
    set->max_deadline_ns = set->deadline_ns;
  }
  if (d->fields & OM_DECIDE_PER_TRY)
    set->per_try_ns = d->per_try_ms * NS_PER_MS;
  if (d->fields & OM_DECIDE_RETRIES)
    set->retries = d->retries;
  if (d->fields & OM_DECIDE_RETRY_UNSAFE)
    set->retry_non_idempotent = d->retry_non_idempotent;
  if (d->fields & OM_DECIDE_STREAM_IDLE)
    set->stream_idle_ns = d->stream_idle_ms * NS_PER_MS;
  if (d->fields & OM_DECIDE_MAX_STREAM)
    set->max_stream_ns = d->max_stream_ms * NS_PER_MS;
  if ((d->fields & OM_DECIDE_MAX_BODY) && d->max_body_bytes != 0 &&
      (set->max_body_bytes == 0 || d->max_body_bytes < set->max_body_bytes))
    set->max_body_bytes = d->max_body_bytes;
}

/* The service named by Host (an optional :port ignored). */
static om__proxy_service_t *service_of(const om_proxy_t *p,
                                       const om_http_request_t *req,
                                       const char **host, size_t *host_len) {
  size_t len;
  const char *h = om_http_request_header(req, "host", &len);
  if (h == NULL) {
    *host = "";
    *host_len = 0;
    return NULL;
  }
  *host = h;
  if (h[0] != '[') { /* an IPv6 literal is never a service name */
    const char *colon = memchr(h, ':', len);
    if (colon != NULL)
      len = (size_t)(colon - h);
  }
  *host_len = len;
  return om__proxy_find_service(p, h, len);
}

void om__proxy_on_request(om_http_request_t *req, void *ud) {
  om_proxy_t *p = ud;
  om__proxy_service_t *s;
  om_policy_req_t preq;
  om_policy_kv_t kv_stack[64], *kv = kv_stack;
  const char *host, *key = NULL;
  size_t host_len, key_len = 0, vlen;
  om__proxy_route_t rt;
  om__proxy_settings_t set;
  uint64_t now = uv_hrtime(), budget_ms;
  om_deadline_t deadline;
  uint32_t limit, inflight, queued;
  char err[1024], upg[sizeof((om__proxy_call_t *)0)->upgrade], rid[33];
  const char *v;
  om__proxy_call_t *c;
  int rc, upgrade, grpc_deadline;
  s = service_of(p, req, &host, &host_len);
  if (s == NULL) {
    char msg[256];
    snprintf(msg, sizeof msg, "no service named '%.*s' (from Host)",
             (int)(host_len > 128 ? 128 : host_len), host);
    om_metric_inc(p->unknown_service);
    om__proxy_refused(p, s, req, OM__PROXY_NO_PEERS);
    om__proxy_respond_error(req, OM__PROXY_NO_PEERS, msg, 0,
                            own_id(p, req, rid));
    return;
  }
  s->requests++;
  upgrade =
      om__proxy_upgrade_classify(s, req, upg, sizeof upg, err, sizeof err);
  if (upgrade < 0) {
    om__proxy_upgrade_count(s, OM__PROXY_UPG_NOT_ALLOWED);
    om_metric_inc(s->outcomes[OM__PROXY_UPGRADE_NOT_ALLOWED]);
    om__proxy_refused(p, s, req, OM__PROXY_UPGRADE_NOT_ALLOWED);
    om__proxy_respond_error(req, OM__PROXY_UPGRADE_NOT_ALLOWED, err, 0,
                            own_id(p, req, rid));
    return;
  }
  if (om__proxy_body_too_large(s->set.max_body_bytes, req)) {
    om__proxy_refuse_body(s, req, s->set.max_body_bytes, own_id(p, req, rid));
    return;
  }
  /* the policy narrows the peers: its answer is final, never widened */
  if (req->n_headers > sizeof kv_stack / sizeof kv_stack[0]) {
    kv = malloc(req->n_headers * sizeof *kv);
    if (kv == NULL) {
      om_metric_inc(s->outcomes[OM__PROXY_OVERLOADED]);
      om__proxy_refused(p, s, req, OM__PROXY_OVERLOADED);
      om__proxy_respond_error(req, OM__PROXY_OVERLOADED, "out of memory", 0,
                              own_id(p, req, rid));
      return;
    }
  }
  for (size_t i = 0; i < req->n_headers; i++)
    kv[i] = (om_policy_kv_t){req->headers[i].name, req->headers[i].name_len,
                             req->headers[i].value, req->headers[i].value_len};
  memset(&preq, 0, sizeof preq);
  preq.service = s->name;
  preq.method = req->method;
  preq.path = req->path;
  preq.headers = kv;
  preq.n_headers = req->n_headers;
  if (om__proxy_is_grpc(req) &&
      om__proxy_grpc_split(req->path, req->path_len, &preq.grpc_service,
                           &preq.grpc_service_len, &preq.grpc_method,
                           &preq.grpc_method_len) != 0)
    preq.grpc_service = preq.grpc_method = NULL;
  const om_tls_identity_t *tid = om_http_request_identity(req);
  om_policy_identity_t pid; /* the caller's client certificate: req.identity */
  if (tid != NULL) {
    pid = (om_policy_identity_t){tid->subject, (const char *const *)tid->uris,
                                 tid->n_uris, (const char *const *)tid->dns,
                                 tid->n_dns};
    preq.identity = &pid;
  }
  rc = route(s, &preq, &rt, err, sizeof err, now);
  key = rt.key;
  key_len = rt.key_len;
  if (kv != kv_stack)
    free(kv);
  if (rc == OM_POLICY_DENIED) {
    om__proxy_deny(s, req, err, preq.identity, own_id(p, req, rid), now);
    return;
  }
  if (rc != 0) {
    const char *id = own_id(p, req, rid);
    om__proxy_outcome_t o = policy_failed(s, req, rc, id, err, now);
    om_metric_inc(s->outcomes[o]);
    om__proxy_refused(p, s, req, o);
    om__proxy_respond_error(req, o, err, 0, id);
    return;
  }
  /* the service's settings, with what decide(req) said for this one */
  set = s->set;
  if (rt.decision != NULL)
    apply_decision(&set, rt.decision);
  if (set.max_body_bytes != s->set.max_body_bytes &&
      om__proxy_body_too_large(set.max_body_bytes, req)) {
    om__proxy_subset_unref(rt.shared);
    om__proxy_refuse_body(s, req, set.max_body_bytes, own_id(p, req, rid));
    return;
  }
  v = om_http_request_header(req, "x-openmesh-deadline-ms", &vlen);
  /* a malformed value is ignored, as Envoy ignores a malformed
   * x-envoy-upstream-rq-timeout-ms: the policy's deadline applies; a
   * valid one may shorten the deadline, never raise it past the cap */
  if (v == NULL || parse_ms(v, vlen, &budget_ms) != 0) {
    /* a gRPC caller's grpc-timeout, when it sent no deadline of ours */
    v = om_http_request_header(req, "grpc-timeout", &vlen);
    if (v != NULL && om__proxy_grpc_timeout_parse(v, vlen, &budget_ms) != 0)
      v = NULL;
  }
  /* a gRPC caller that set a deadline gets it propagated (start_attempt);
   * one that set none keeps none past the proxy: the proxy's own bounds
   * the wait for the head, not the stream */
  grpc_deadline = om_http_request_header(req, "grpc-timeout", NULL) != NULL;
  if (v != NULL)
    deadline =
        om_deadline_after(now, budget_ms >= set.max_deadline_ns / NS_PER_MS
                                   ? set.max_deadline_ns
                                   : budget_ms * NS_PER_MS);
  else
    deadline = om_deadline_after(now, set.deadline_ns);
  if (rt.n_subset == 0) {
    om__proxy_subset_unref(rt.shared);
    om_metric_inc(s->outcomes[OM__PROXY_NO_PEERS]);
    om__proxy_refused(p, s, req, OM__PROXY_NO_PEERS);
    om__proxy_respond_error(req, OM__PROXY_NO_PEERS,
                            s->view->n == 0 ? "the service has no peers"
                                            : "the traffic policy left no peer",
                            0, own_id(p, req, rid));
    return;
  }
  /* the key: the policy's, else the caller's header */
  if (key == NULL || key_len == 0) {
    key = om_http_request_header(req, "x-openmesh-key", &key_len);
    if (key != NULL && key_len == 0)
      key = NULL;
  }
  /* full pool: refused before anything is allocated */
  limit = om_admission_limit(s->adm);
  inflight = om_admission_inflight(s->adm);
  queued = om_admission_queued(s->adm);
  if ((inflight >= limit || queued > 0) && queued >= s->set.max_queue) {
    om__proxy_subset_unref(rt.shared);
    om_metric_inc(s->outcomes[OM__PROXY_OVERLOADED]);
    om__proxy_refused(p, s, req, OM__PROXY_OVERLOADED);
    om__proxy_respond_error(req, OM__PROXY_OVERLOADED,
                            "the service's in-flight limit and queue are full",
                            0, own_id(p, req, rid));
    return;
  }
  c = call_new(p, s, req, &rt, key != NULL);
  if (c == NULL) {
    om_metric_inc(s->outcomes[OM__PROXY_OVERLOADED]);
    om__proxy_refused(p, s, req, OM__PROXY_OVERLOADED);
    om__proxy_respond_error(req, OM__PROXY_OVERLOADED, "out of memory", 0,
                            own_id(p, req, rid));
    return;
  }
  if (key !=
      NULL) /* hashed now: the policy's string lives until its next call */
    c->key_hash = om_rendezvous_key_hash(c->view->rdv, key, key_len);
  c->deadline = deadline;
  c->grpc_deadline = c->grpc && grpc_deadline;
  c->set = set;
  c->t0 = now;
  if (upgrade > 0)
    memcpy(c->upgrade, upg, sizeof c->upgrade);
  om__proxy_body_init(c);
  req->user = c;
  if (om_http_request_on_close(req, on_client_close) != 0) {
    c->req = NULL; /* already gone */
    om_http_response_abort(req);
    call_end(c, OM__PROXY_CLIENT_CLOSED);
    return;
  }
  rc = om_admission_acquire(s->adm, &c->waiter, om_deadline_at_ns(deadline),
                            now);
  switch (rc) {
  case OM_ADMISSION_ADMITTED:
    c->admitted = 1;
    start_attempt(c);
    break;
  case OM_ADMISSION_QUEUED:
    c->queued = 1;
    om__proxy_arm_queue_timer(s);
    break;
  case OM_EDEADLINE:
    fail(c, OM__PROXY_DEADLINE,
         "the call's deadline passed before it was admitted");
    break;
  default:
    fail(c, OM__PROXY_OVERLOADED,
         "the service's in-flight limit and queue are full");
    break;
  }
}
