/*
 * om_proxy_select.c: which peer an attempt goes to, and whether a failed
 * attempt may be retried (docs/PROXY.md "The call path", steps 5 and 7).
 * Split from om_proxy_call.c, which runs the attempts: these functions
 * decide, they never send.
 */
#include <string.h>
#include <strings.h>
#include <time.h>

#include "om_backoff.h"
#include "om_proxy_internal.h"

#define NS_PER_MS UINT64_C(1000000)

static inline int bit(const uint64_t *b, size_t i) {
  return (int)((b[i / 64] >> (i % 64)) & 1u);
}

/* ------------------------------------------------------------------ */
/* selection */

/*
 * The next peer for this call, its circuit's permission taken: the best
 * untried peer of the subset in rendezvous rank (keyed), or a P2C pick
 * among the untried subset peers whose circuit allows (unkeyed). NULL
 * when none; *all_open then says whether untried peers exist but every
 * one is behind an open circuit.
 */
om__proxy_peer_t *om__proxy_select_peer(om__proxy_call_t *c, uint64_t now,
                                        int *all_open) {
  om__proxy_view_t *v = c->view;
  size_t untried = 0;
  *all_open = 0;
  if (c->keyed && !c->ranked) {
    if (om_rendezvous_rank_hash(v->rdv, c->key_hash, c->rank, v->n) < 0)
      c->keyed = 0; /* no memory for the rank: P2C within the subset */
    else
      c->ranked = 1;
  }
  if (c->keyed) {
    for (size_t r = 0; r < v->n; r++) {
      uint32_t i = c->rank[r];
      if (!bit(c->in_subset, i) || bit(c->tried, i) ||
          !om__proxy_peer_ready(v->peers[i]))
        continue;
      untried++;
      if (om__proxy_circuit_allow(v->peers[i]->circuit, now)) {
        om_p2c_bitmap_set(c->tried, i);
        return v->peers[i];
      }
    }
    *all_open = untried > 0;
    return NULL;
  }
  for (size_t w = 0; w < c->words; w++)
    c->exclude[w] = ~c->in_subset[w] | c->tried[w];
  for (size_t k = 0; k < c->n_subset; k++) {
    uint32_t i = c->subset[k];
    if (bit(c->tried, i))
      continue;
    if (!om__proxy_peer_ready(v->peers[i])) {
      /* no address (a name never resolved) or no TLS: skipped as an
       * open circuit is, but not counted as one */
      om_p2c_bitmap_set(c->exclude, i);
      continue;
    }
    untried++;
    if (!om__proxy_circuit_peek(v->peers[i]->circuit, now))
      om_p2c_bitmap_set(c->exclude, i);
  }
  for (;;) {
    uint32_t i;
    if (om_p2c_pick(v->p2c, &c->p->rng, c->exclude, now, &i) != 0) {
      *all_open = untried > 0;
      return NULL;
    }
    if (om__proxy_circuit_allow(v->peers[i]->circuit, now)) {
      om_p2c_bitmap_set(c->tried, i);
      return v->peers[i];
    }
    om_p2c_bitmap_set(c->exclude, i); /* a probe already out */
  }
}

/* Whether select_peer could find a peer now (nothing is taken). */
static int has_candidate(const om__proxy_call_t *c, uint64_t now) {
  for (size_t k = 0; k < c->n_subset; k++) {
    uint32_t i = c->subset[k];
    if (!bit(c->tried, i) && om__proxy_peer_ready(c->view->peers[i]) &&
        om__proxy_circuit_peek(c->view->peers[i]->circuit, now))
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
