/*
 * om_proxy_select.c: which peer an attempt goes to, and whether a failed
 * attempt may be retried (docs/PROXY.md "The call path", steps 5 and 7).
 * Split from om_proxy_call.c, which runs the attempts: these functions
 * decide, they never send.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "om_backoff.h"
#include "om_errno.h"
#include "om_proxy_internal.h"

/* ------------------------------------------------------------------ */
/* tried peers */

int om__proxy_tried(const om__proxy_call_t *c, uint32_t i) {
  if (c->tried_map != NULL)
    return (int)((c->tried_map[i / 64] >> (i % 64)) & 1u);
  for (size_t k = 0; k < c->n_tried; k++)
    if (c->tried_list[k] == i)
      return 1;
  return 0;
}

/*
 * Attempts are few: the list holds them. A run of retries longer than
 * the list (a policy that asks for many) moves them to a bitmap over the
 * view, the one allocation sized by the view, made only then.
 */
int om__proxy_tried_add(om__proxy_call_t *c, uint32_t i) {
  if (c->tried_map == NULL && c->n_tried < OM__PROXY_TRIED_INLINE) {
    c->tried_list[c->n_tried++] = i;
    return 0;
  }
  if (c->tried_map == NULL) {
    size_t n = c->view->n > i ? c->view->n : (size_t)i + 1;
    c->tried_map = calloc(OM_P2C_BITMAP_WORDS(n), sizeof *c->tried_map);
    if (c->tried_map == NULL)
      return OM_ENOMEM;
    for (size_t k = 0; k < c->n_tried; k++)
      om_p2c_bitmap_set(c->tried_map, c->tried_list[k]);
  }
  om_p2c_bitmap_set(c->tried_map, i);
  return 0;
}

void om__proxy_tried_remove(om__proxy_call_t *c, uint32_t i) {
  if (c->tried_map != NULL) {
    c->tried_map[i / 64] &= ~(UINT64_C(1) << (i % 64));
    return;
  }
  for (size_t k = 0; k < c->n_tried; k++)
    if (c->tried_list[k] == i) {
      c->tried_list[k] = c->tried_list[--c->n_tried];
      return;
    }
}

/* ------------------------------------------------------------------ */
/* selection */

/*
 * What a selection pass looks at: the call, the time, the peers refused
 * by their circuit in this pass (allow said no after peek said yes: a
 * half-open probe taken meanwhile), and whether an untried, ready peer
 * was seen (for *all_open).
 */
typedef struct {
  om__proxy_call_t *c;
  uint64_t now;
  uint32_t refused[4];
  size_t n_refused;
  int untried;
} pass_t;

/* Untried and ready (an address, TLS): a peer a retry may go to. */
static int usable(const om__proxy_call_t *c, uint32_t i) {
  return !om__proxy_tried(c, i) && om__proxy_peer_ready(c->view->peers[i]);
}

/* A candidate of the pass: usable, its circuit lets a request through,
 * not refused earlier in this pass. */
static int accept_peer(void *ud, uint32_t i) {
  pass_t *ps = ud;
  if (!usable(ps->c, i))
    return 0;
  ps->untried = 1;
  for (size_t k = 0; k < ps->n_refused; k++)
    if (ps->refused[k] == i)
      return 0;
  return om__proxy_circuit_peek(ps->c->view->peers[i]->circuit, ps->now);
}

/* Whether an untried, ready peer is in the subset (the failure path). */
static int any_usable(const om__proxy_call_t *c) {
  for (size_t k = 0; k < c->n_subset; k++)
    if (usable(c, OM__PROXY_SUBSET_AT(c, k)))
      return 1;
  return 0;
}

/*
 * The next peer for this call, its circuit's permission taken: the
 * subset's best untried peer in the key's rendezvous order (keyed: one
 * pass over the subset, no rank; a retry makes the next pass, so the
 * attempts walk the rank of the subset), or a P2C pick among the untried
 * subset peers whose circuit allows (unkeyed: two draws from the subset
 * list, whatever its size). Neither touches every peer of the view. NULL
 * when none; *all_open then says whether untried peers exist but every
 * one is behind an open circuit.
 */
om__proxy_peer_t *om__proxy_select_peer(om__proxy_call_t *c, uint64_t now,
                                        int *all_open) {
  om__proxy_view_t *v = c->view;
  pass_t ps = {c, now, {0}, 0, 0};
  *all_open = 0;
  if (v->n == 0)
    return NULL;
  for (;;) {
    uint32_t i;
    if (c->keyed) {
      /* The first attempt's best peer is nearly always usable: find it
       * with the bare mixing loop, and filter only when it is not. */
      i = UINT32_MAX;
      if (c->n_tried == 0 && c->tried_map == NULL && ps.n_refused == 0) {
        i = om_rendezvous_best_hash(v->rdv, c->key_hash, c->subset, c->n_subset,
                                    NULL, NULL);
        if (i != UINT32_MAX && !accept_peer(&ps, i))
          i = UINT32_MAX;
      }
      if (i == UINT32_MAX)
        i = om_rendezvous_best_hash(v->rdv, c->key_hash, c->subset, c->n_subset,
                                    accept_peer, &ps);
    } else if (om_p2c_pick_among(v->p2c, &c->p->rng, c->subset, c->n_subset,
                                 accept_peer, &ps, now, &i) != 0) {
      i = UINT32_MAX;
    }
    if (i == UINT32_MAX)
      break;
    if (om__proxy_circuit_allow(v->peers[i]->circuit, now)) {
      if (om__proxy_tried_add(c, i) != 0) {
        om__proxy_circuit_release(v->peers[i]->circuit, now);
        return NULL; /* no memory for a long run of retries: it ends */
      }
      return v->peers[i];
    }
    if (ps.n_refused == sizeof ps.refused / sizeof ps.refused[0])
      break; /* probes taken under our feet, again and again */
    ps.refused[ps.n_refused++] = i;
  }
  *all_open = ps.untried || any_usable(c);
  return NULL;
}

/* Whether select_peer could find a peer now (nothing is taken). */
static int has_candidate(const om__proxy_call_t *c, uint64_t now) {
  for (size_t k = 0; k < c->n_subset; k++) {
    uint32_t i = OM__PROXY_SUBSET_AT(c, k);
    if (usable(c, i) && om__proxy_circuit_peek(c->view->peers[i]->circuit, now))
      return 1;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* retry decisions */

/*
 * om_retry_decide for this call's request as forwarded (its
 * Idempotency-Key is the one the upstream sees) and the given outcome.
 */
int om__proxy_request_allows(const om__proxy_call_t *c, int status,
                             om_retry_error_t err, om_retry_phase_t phase) {
  const om_proxy_t *p = c->p;
  om_retry_req_t rr;
  if (c->grpc_retry) /* a status the policy's grpc_retry_on lists */
    return 1;
  memset(&rr, 0, sizeof rr);
  rr.method = c->req->method;
  rr.method_len = c->req->method_len;
  rr.idempotency_key = c->idem_key;
  rr.idempotency_key_len = c->idem_len;
  rr.status = status;
  rr.error = err;
  rr.opt_in = c->set.retry_non_idempotent != 0;
  rr.policy = c->set.retry_429 ? &p->retry_policy_429 : &p->retry_policy;
  rr.phase = phase;
  return om_retry_decide(&rr, NULL);
}

/*
 * May the failed attempt be retried, and after how long? Every gate of
 * the call path in turn (docs/PROXY.md): attempts left, a replayable body
 * (unless nothing was sent), the send phase, the method (or
 * Idempotency-Key, or the policy's opt-in) with a retryable outcome, a
 * Retry-After that fits, room in the deadline for a useful attempt after
 * the wait, a peer left in the subset, and last the retry budget (spent
 * only when everything else said yes). Records the phase of the retry for
 * the metrics of the next attempt.
 */
int om__proxy_decide_retry(om__proxy_call_t *c, int status,
                           om_retry_error_t err, om_retry_phase_t phase,
                           int has_ra, uint64_t ra_ns, uint64_t now,
                           uint64_t *wait_out) {
  om_proxy_t *p = c->p;
  uint64_t remaining, min_ns = p->opts.min_attempt_ms * NS_PER_MS, wait;
  int pre = phase == OM_RETRY_PHASE_PRE_SEND;
  if (c->attempts > c->set.retries || (!c->replayable && !pre))
    return 0;
  if (c->upgrade[0] != '\0' && c->upgrade_sent)
    return 0; /* an upgrade that may have reached the peer is never replayed */
  if (!om__proxy_request_allows(c, status, err, phase))
    return 0;
  remaining = om_deadline_remaining(c->deadline, now);
  if (remaining <= min_ns)
    return 0;
  wait = om_backoff_ns(c->attempts, p->opts.backoff_base_ms * NS_PER_MS,
                       p->opts.backoff_cap_ms * NS_PER_MS, &p->rng);
  if (has_ra) {
    if (remaining != OM_DEADLINE_NEVER && ra_ns > remaining - min_ns)
      return 0; /* the server asks for more than the call has left */
    if (ra_ns > wait)
      wait = ra_ns;
  } else if (remaining != OM_DEADLINE_NEVER && wait > remaining - min_ns) {
    wait = remaining - min_ns;
  }
  if (!has_candidate(c, now))
    return 0;
  if (!om_retry_budget_try_withdraw(c->s->budget, now)) {
    c->s->budget_exhausted++;
    om_metric_inc(c->s->m_budget);
    return 0;
  }
  *wait_out = wait;
  c->retry_pre_send = pre;
  return 1;
}

/* Retry-After of a 429/503 head, in ns (RFC 9110 10.2.3). */
int om__proxy_retry_after(const om_upstream_response_t *r, uint64_t ceiling_ms,
                          uint64_t *out_ns) {
  for (size_t i = 0; i < r->n_headers; i++) {
    const om_http_header_t *h = &r->headers[i];
    uint64_t ms;
    if (h->name_len == 11 && strncasecmp(h->name, "retry-after", 11) == 0 &&
        om_retry_after_parse(h->value, h->value_len, (int64_t)time(NULL),
                             ceiling_ms, &ms) == 0) {
      *out_ns = ms * NS_PER_MS;
      return 1;
    }
  }
  return 0;
}

om_retry_error_t om__proxy_retry_class(om_upstream_fail_t f) {
  switch (f) {
  case OM_UPSTREAM_FAIL_CONNECT:
  case OM_UPSTREAM_FAIL_TIMEOUT_CONNECT:
    return OM_RETRY_ERR_CONNECT;
  case OM_UPSTREAM_FAIL_TIMEOUT_FIRST_BYTE:
  case OM_UPSTREAM_FAIL_TIMEOUT_TOTAL:
    return OM_RETRY_ERR_TIMEOUT;
  case OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE:
  case OM_UPSTREAM_FAIL_MALFORMED:
    return OM_RETRY_ERR_RESET;
  default:
    return OM_RETRY_ERR_NONE; /* not a peer failure we retry */
  }
}
