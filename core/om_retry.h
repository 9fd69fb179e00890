/*
 * om_retry.h: whether a failed attempt may be retried, and whether the
 * service can afford it.
 *
 * Two independent gates, both required before a retry:
 *
 * 1. om_retry_decide: is this outcome retryable, and is the request safe to
 *    send again? Outcome first (status in the retryable set, or a transport
 *    error class in the retryable set), then the send phase: a transport
 *    failure before any byte of the request left (connect refused, connect
 *    timeout, a fresh connection reset before its first write) reached no
 *    server, so any method may go again; then the method: idempotent methods
 *    (RFC 9110 section 9.2.2: GET, HEAD, OPTIONS, PUT, DELETE, TRACE; method
 *    names are case-sensitive, section 9.1) always; any other method only
 *    with a non-empty `Idempotency-Key` (draft-ietf-httpapi-idempotency-key-
 *    header) or an explicit policy opt-in.
 *
 * 2. om_retry_budget_t: retries cannot amplify an outage. The Finagle /
 *    Linkerd / tower retry budget: over a sliding window (a ring of
 *    OM_RETRY_BUDGET_BUCKETS time buckets),
 *        retries <= ratio x requests + min_per_s x window_seconds
 *    so at most ~20% extra load under failure (defaults), while a quiet
 *    service still gets min_per_s retries per second (the reserve is added
 *    to, not maxed with, the ratio share, as in Finagle's default of "20% of
 *    requests on top of 10 retries per second").
 */
#ifndef OM_RETRY_H
#define OM_RETRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Transport failures without an HTTP status. */
typedef enum {
  OM_RETRY_ERR_NONE = 0, /* a status was received: see status */
  OM_RETRY_ERR_CONNECT,  /* connection could not be established */
  OM_RETRY_ERR_TIMEOUT,  /* the attempt timed out */
  OM_RETRY_ERR_RESET,    /* the connection was reset / closed early */
} om_retry_error_t;

#define OM_RETRY_ERR_BIT(e) (1u << (e))

/*
 * How far the failed attempt got in sending the request. Unknown is the
 * zero value and is read as post-send: only a client that can prove no
 * byte left (om_upstream_result_t.sent == 0) says pre-send.
 */
typedef enum {
  OM_RETRY_PHASE_UNKNOWN = 0, /* treated as post-send */
  OM_RETRY_PHASE_PRE_SEND,    /* provably nothing of the request left */
  OM_RETRY_PHASE_POST_SEND,   /* bytes left: the server may have acted */
} om_retry_phase_t;

/* Why om_retry_decide answered as it did; stable names for logs/metrics. */
#define OM_RETRY_REASON_MAP(XX)                                                \
  XX(IDEMPOTENT_METHOD, "idempotent_method")       /* retry */                 \
  XX(IDEMPOTENCY_KEY, "idempotency_key")           /* retry */                 \
  XX(OPT_IN, "opt_in")                             /* retry */                 \
  XX(NOT_SENT, "not_sent")                         /* retry */                 \
  XX(NON_IDEMPOTENT, "non_idempotent")             /* no */                    \
  XX(STATUS_NOT_RETRYABLE, "status_not_retryable") /* no */                    \
  XX(ERROR_NOT_RETRYABLE, "error_not_retryable")   /* no */                    \
  XX(INVALID, "invalid_request")                   /* no: malformed input */

typedef enum {
#define OM__RETRY_REASON_ENUM(name, str) OM_RETRY_##name,
  OM_RETRY_REASON_MAP(OM__RETRY_REASON_ENUM)
#undef OM__RETRY_REASON_ENUM
} om_retry_reason_t;

/*
 * Which outcomes are retryable. A plain value: copy it, keep one per
 * service. Statuses 100-599 only.
 */
typedef struct om_retry_policy_s {
  uint64_t status_bits[8]; /* bit (status - 100) */
  unsigned error_bits;     /* OM_RETRY_ERR_BIT(class) */
} om_retry_policy_t;

/*
 * om_retry_policy_default: 502, 503, 504 and every transport error class.
 * 429 is not retryable by default: a rate limit is usually better met with
 * the server's Retry-After than with another immediate attempt; opt in with
 * om_retry_policy_set_status(p, 429, true).
 */
void om_retry_policy_default(om_retry_policy_t *policy);

/*
 * om_retry_policy_set_status: add (on) or remove a status. Returns 0, or
 * OM_EINVAL for a status outside 100-599 (policy unchanged).
 */
int om_retry_policy_set_status(om_retry_policy_t *policy, int status, bool on);

/* om_retry_policy_has_status: is status in the retryable set? */
bool om_retry_policy_has_status(const om_retry_policy_t *policy, int status);

typedef struct om_retry_req_s {
  const char *method; /* as received; case-sensitive; required */
  size_t method_len;
  /* The Idempotency-Key field value; NULL when the field is absent. An
   * empty value (after OWS trimming, or the empty sf-string "") counts as
   * absent: it cannot deduplicate anything. */
  const char *idempotency_key;
  size_t idempotency_key_len;
  int status;             /* HTTP status, or 0 with error set */
  om_retry_error_t error; /* OM_RETRY_ERR_NONE with a status */
  bool opt_in;            /* the policy declares this request retry-safe */
  const om_retry_policy_t *policy; /* NULL: om_retry_policy_default */
  /* OM_RETRY_PHASE_PRE_SEND only with error set (a status means the
   * request reached a server) */
  om_retry_phase_t phase;
} om_retry_req_t;

/*
 * om_retry_decide: may the failed attempt described by *req be retried (as
 * far as the request itself is concerned: the budget, deadline and attempt
 * limits are separate gates)? Sets *reason (if not NULL) to why.
 * Exactly one of status (100-599) and error must be set; otherwise, or with
 * req/method NULL, a phase out of range, or PRE_SEND with a status, the
 * answer is false with OM_RETRY_INVALID. A retryable error in the pre-send
 * phase is retried whatever the method (OM_RETRY_NOT_SENT): the reason is
 * the phase only when the method or key would not have allowed it.
 */
bool om_retry_decide(const om_retry_req_t *req, om_retry_reason_t *reason);

/*
 * om_retry_method_idempotent: is this method idempotent per RFC 9110
 * section 9.2.2 (exact, case-sensitive match)?
 */
bool om_retry_method_idempotent(const char *method, size_t len);

/* "idempotent_method", ...; "unknown" for other values. Static. */
const char *om_retry_reason_name(om_retry_reason_t reason);

/* ---- the retry budget ---------------------------------------------------- */

#define OM_RETRY_BUDGET_BUCKETS 10

typedef struct om_retry_budget_s om_retry_budget_t;

typedef struct om_retry_budget_opts_s {
  double ratio;       /* retries per request; [0, 100]; default 0.2 */
  uint64_t window_ns; /* [BUCKETS ns, 1 h]; default 10 s */
  double min_per_s;   /* reserve, retries per second; [0, 1e6]; default 10 */
} om_retry_budget_opts_t;

/* om_retry_budget_opts_default: ratio 0.2, window 10 s, min_per_s 10. */
void om_retry_budget_opts_default(om_retry_budget_opts_t *opts);

/*
 * om_retry_budget_new: an empty budget (only the reserve available). opts
 * NULL: defaults. Returns 0 and *out (free with om_retry_budget_free),
 * OM_EINVAL for out NULL or options out of range (NaN included), OM_ENOMEM;
 * *out untouched on error.
 */
int om_retry_budget_new(const om_retry_budget_opts_t *opts,
                        om_retry_budget_t **out);

/* om_retry_budget_free: NULL is a no-op. */
void om_retry_budget_free(om_retry_budget_t *b);

/*
 * om_retry_budget_record_request: count one original request (not a
 * retry) at now_ns; it earns `ratio` retries for the next window.
 */
void om_retry_budget_record_request(om_retry_budget_t *b, uint64_t now_ns);

/*
 * om_retry_budget_try_withdraw: if the window leaves room for one more
 * retry, count it and return true; otherwise change nothing and return
 * false. Times should be monotonic; a time before the window's newest
 * bucket is counted in its own bucket if still inside the window.
 */
bool om_retry_budget_try_withdraw(om_retry_budget_t *b, uint64_t now_ns);

/* om_retry_budget_balance: whole retries available now (no side effect
 * other than expiring old buckets). */
uint64_t om_retry_budget_balance(om_retry_budget_t *b, uint64_t now_ns);

/*
 * The same budget in amounts rather than counts: tokens, or money. A
 * successful call deposits what it spent (its tokens, its cost) and earns
 * ratio x that; a retry spends an amount (its estimated cost); the reserve
 * is min_per_s x window in the same unit. So a retry storm spends at most
 * ratio of what the successes spent, plus the reserve. The amount path has
 * its own sums beside the count path; a budget normally uses one of them.
 * Amounts must be finite, >= 0 and < 1e15: others are ignored (deposit)
 * or refused (try_spend). b NULL: no-op, false, 0.
 */
void om_retry_budget_deposit(om_retry_budget_t *b, uint64_t now_ns,
                             double amount);

/* om_retry_budget_try_spend: if the window leaves at least amount, count
 * it and return true; otherwise change nothing and return false. */
bool om_retry_budget_try_spend(om_retry_budget_t *b, uint64_t now_ns,
                               double amount);

/* om_retry_budget_amount_left: what the window leaves now, >= 0. */
double om_retry_budget_amount_left(om_retry_budget_t *b, uint64_t now_ns);

#endif /* OM_RETRY_H */
