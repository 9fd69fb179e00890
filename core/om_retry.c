/*
 * om_retry.c: retry eligibility and the retry budget (see om_retry.h).
 */
#include "om_retry.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"

/* ---- eligibility --------------------------------------------------------- */

void om_retry_policy_default(om_retry_policy_t *policy) {
  memset(policy, 0, sizeof *policy);
  om_retry_policy_set_status(policy, 502, true);
  om_retry_policy_set_status(policy, 503, true);
  om_retry_policy_set_status(policy, 504, true);
  policy->error_bits = OM_RETRY_ERR_BIT(OM_RETRY_ERR_CONNECT) |
                       OM_RETRY_ERR_BIT(OM_RETRY_ERR_TIMEOUT) |
                       OM_RETRY_ERR_BIT(OM_RETRY_ERR_RESET);
}

int om_retry_policy_set_status(om_retry_policy_t *policy, int status, bool on) {
  unsigned bit;
  if (policy == NULL || status < 100 || status > 599)
    return OM_EINVAL;
  bit = (unsigned)(status - 100);
  if (on)
    policy->status_bits[bit / 64] |= UINT64_C(1) << (bit % 64);
  else
    policy->status_bits[bit / 64] &= ~(UINT64_C(1) << (bit % 64));
  return 0;
}

bool om_retry_policy_has_status(const om_retry_policy_t *policy, int status) {
  unsigned bit;
  if (status < 100 || status > 599)
    return false;
  bit = (unsigned)(status - 100);
  return (policy->status_bits[bit / 64] >> (bit % 64)) & 1u;
}

bool om_retry_method_idempotent(const char *method, size_t len) {
  /* RFC 9110 section 9.2.2: "the request methods defined by this
   * specification" that are idempotent: PUT, DELETE and the safe methods
   * (section 9.2.1: GET, HEAD, OPTIONS, TRACE). Case-sensitive (9.1). */
  static const char *const idem[] = {"GET", "HEAD",   "OPTIONS",
                                     "PUT", "DELETE", "TRACE"};
  if (method == NULL)
    return false;
  for (size_t i = 0; i < sizeof idem / sizeof idem[0]; i++)
    if (strlen(idem[i]) == len && memcmp(idem[i], method, len) == 0)
      return true;
  return false;
}

static bool key_present(const char *v, size_t len) {
  if (v == NULL)
    return false;
  while (len > 0 && (v[0] == ' ' || v[0] == '\t')) {
    v++;
    len--;
  }
  while (len > 0 && (v[len - 1] == ' ' || v[len - 1] == '\t'))
    len--;
  /* The draft defines the value as an sf-string: "" is an empty key. */
  return len > 0 && !(len == 2 && v[0] == '"' && v[1] == '"');
}

bool om_retry_decide(const om_retry_req_t *req, om_retry_reason_t *reason) {
  om_retry_reason_t why;
  bool retry = false;
  om_retry_policy_t def;
  const om_retry_policy_t *p;
  if (req == NULL || req->method == NULL ||
      (req->status != 0) == (req->error != OM_RETRY_ERR_NONE) ||
      (req->status != 0 && (req->status < 100 || req->status > 599)) ||
      (unsigned)req->error > OM_RETRY_ERR_RESET ||
      (unsigned)req->phase > OM_RETRY_PHASE_POST_SEND ||
      (req->phase == OM_RETRY_PHASE_PRE_SEND && req->status != 0)) {
    why = OM_RETRY_INVALID;
    goto done;
  }
  p = req->policy;
  if (p == NULL) {
    om_retry_policy_default(&def);
    p = &def;
  }
  /* The outcome first: a non-retryable outcome is the stronger answer. */
  if (req->status != 0 && !om_retry_policy_has_status(p, req->status)) {
    why = OM_RETRY_STATUS_NOT_RETRYABLE;
    goto done;
  }
  if (req->error != OM_RETRY_ERR_NONE &&
      !(p->error_bits & OM_RETRY_ERR_BIT(req->error))) {
    why = OM_RETRY_ERROR_NOT_RETRYABLE;
    goto done;
  }
  retry = true;
  if (om_retry_method_idempotent(req->method, req->method_len))
    why = OM_RETRY_IDEMPOTENT_METHOD;
  else if (key_present(req->idempotency_key, req->idempotency_key_len))
    why = OM_RETRY_IDEMPOTENCY_KEY;
  else if (req->opt_in)
    why = OM_RETRY_OPT_IN;
  else if (req->phase == OM_RETRY_PHASE_PRE_SEND)
    why = OM_RETRY_NOT_SENT; /* no server saw it: nothing to duplicate */
  else {
    why = OM_RETRY_NON_IDEMPOTENT;
    retry = false;
  }
done:
  if (reason != NULL)
    *reason = why;
  return retry;
}

const char *om_retry_reason_name(om_retry_reason_t reason) {
  switch (reason) {
#define OM__RETRY_REASON_NAME(name, str)                                       \
  case OM_RETRY_##name:                                                        \
    return str;
    OM_RETRY_REASON_MAP(OM__RETRY_REASON_NAME)
#undef OM__RETRY_REASON_NAME
  default:
    return "unknown";
  }
}

/* ---- the budget -------------------------------------------------------- */

/*
 * Amounts are in micro-retries so the test "one more retry fits" is exact
 * integer arithmetic: a request deposits ratio_u, a retry costs 1e6, and the
 * reserve (min_per_s x window) is always there. Bounds: requests in a window
 * <= 10 x 2^32, ratio_u <= 1e8, so the products stay below 2^63.
 */
#define MICRO UINT64_C(1000000)
#define MAX_WINDOW_NS (UINT64_C(3600) * 1000000000u)

struct om_retry_budget_s {
  uint64_t bucket_ns, ratio_u, reserve_u;
  uint64_t head;              /* epoch of the newest bucket */
  uint64_t requests, retries; /* sums over the window */
  uint32_t req[OM_RETRY_BUDGET_BUCKETS], ret[OM_RETRY_BUDGET_BUCKETS];
  /* the amount path (om_retry_budget_deposit / _try_spend): per bucket,
   * summed on use (ten additions) so expiry never accumulates rounding */
  double ratio, reserve; /* reserve: min_per_s x window, in the unit */
  double dep[OM_RETRY_BUDGET_BUCKETS], spd[OM_RETRY_BUDGET_BUCKETS];
};

void om_retry_budget_opts_default(om_retry_budget_opts_t *opts) {
  opts->ratio = 0.2;
  opts->window_ns = UINT64_C(10) * 1000000000u;
  opts->min_per_s = 10.0;
}

int om_retry_budget_new(const om_retry_budget_opts_t *opts,
                        om_retry_budget_t **out) {
  om_retry_budget_opts_t def;
  om_retry_budget_t *b;
  if (out == NULL)
    return OM_EINVAL;
  if (opts == NULL) {
    om_retry_budget_opts_default(&def);
    opts = &def;
  }
  if (!(opts->ratio >= 0.0 && opts->ratio <= 100.0) ||
      opts->window_ns < OM_RETRY_BUDGET_BUCKETS ||
      opts->window_ns > MAX_WINDOW_NS ||
      !(opts->min_per_s >= 0.0 && opts->min_per_s <= 1e6))
    return OM_EINVAL;
  b = calloc(1, sizeof *b);
  if (b == NULL)
    return OM_ENOMEM;
  b->bucket_ns = opts->window_ns / OM_RETRY_BUDGET_BUCKETS;
  b->ratio_u = (uint64_t)llround(opts->ratio * 1e6);
  /* retries/s x window_ns x 1e-9 s/ns x 1e6 micro-retries */
  b->reserve_u =
      (uint64_t)llround(opts->min_per_s * (double)opts->window_ns / 1e3);
  b->ratio = opts->ratio;
  b->reserve = opts->min_per_s * (double)opts->window_ns / 1e9;
  *out = b;
  return 0;
}

void om_retry_budget_free(om_retry_budget_t *b) {
  free(b);
}

/* Move to now's bucket, expiring the ones that left the window; returns the
 * bucket index for now, or -1 if now is older than the whole window. */
static int budget_slot(om_retry_budget_t *b, uint64_t now_ns) {
  uint64_t epoch = now_ns / b->bucket_ns;
  if (epoch > b->head) {
    if (epoch - b->head >= OM_RETRY_BUDGET_BUCKETS) {
      memset(b->req, 0, sizeof b->req);
      memset(b->ret, 0, sizeof b->ret);
      memset(b->dep, 0, sizeof b->dep);
      memset(b->spd, 0, sizeof b->spd);
      b->requests = b->retries = 0;
    } else {
      for (uint64_t e = b->head + 1; e <= epoch; e++) {
        unsigned i = (unsigned)(e % OM_RETRY_BUDGET_BUCKETS);
        b->requests -= b->req[i];
        b->retries -= b->ret[i];
        b->req[i] = b->ret[i] = 0;
        b->dep[i] = b->spd[i] = 0.0;
      }
    }
    b->head = epoch;
  }
  if (b->head - epoch >= OM_RETRY_BUDGET_BUCKETS)
    return -1;
  return (int)(epoch % OM_RETRY_BUDGET_BUCKETS);
}

void om_retry_budget_record_request(om_retry_budget_t *b, uint64_t now_ns) {
  int i = budget_slot(b, now_ns);
  if (i < 0 || b->req[i] == UINT32_MAX)
    return;
  b->req[i]++;
  b->requests++;
}

static uint64_t budget_credit(const om_retry_budget_t *b) {
  return b->requests * b->ratio_u + b->reserve_u;
}

bool om_retry_budget_try_withdraw(om_retry_budget_t *b, uint64_t now_ns) {
  int i = budget_slot(b, now_ns);
  if (i < 0 || b->ret[i] == UINT32_MAX)
    return false; /* too late to count it: refuse rather than overspend */
  if (budget_credit(b) < (b->retries + 1) * MICRO)
    return false;
  b->ret[i]++;
  b->retries++;
  return true;
}

uint64_t om_retry_budget_balance(om_retry_budget_t *b, uint64_t now_ns) {
  uint64_t credit, spent;
  (void)budget_slot(b, now_ns);
  credit = budget_credit(b);
  spent = b->retries * MICRO;
  return credit > spent ? (credit - spent) / MICRO : 0;
}

/* ---- the budget in amounts ------------------------------------------------
 */

/* ratio x deposits + reserve - spent over the window, in the unit. */
static double amount_left(const om_retry_budget_t *b) {
  double dep = 0.0, spd = 0.0;
  for (unsigned i = 0; i < OM_RETRY_BUDGET_BUCKETS; i++) {
    dep += b->dep[i];
    spd += b->spd[i];
  }
  return b->ratio * dep + b->reserve - spd;
}

/* A finite amount >= 0 and below 1e15 (a quadrillion tokens, or dollars:
 * anything larger is a bug upstream, not a figure). */
static int amount_ok(double amount) {
  return amount >= 0.0 && amount < 1e15;
}

void om_retry_budget_deposit(om_retry_budget_t *b, uint64_t now_ns,
                             double amount) {
  int i;
  if (b == NULL || !amount_ok(amount))
    return;
  if ((i = budget_slot(b, now_ns)) >= 0)
    b->dep[i] += amount;
}

bool om_retry_budget_try_spend(om_retry_budget_t *b, uint64_t now_ns,
                               double amount) {
  int i;
  if (b == NULL || !amount_ok(amount) || (i = budget_slot(b, now_ns)) < 0)
    return false;
  if (amount_left(b) < amount)
    return false;
  b->spd[i] += amount;
  return true;
}

double om_retry_budget_amount_left(om_retry_budget_t *b, uint64_t now_ns) {
  double left;
  if (b == NULL)
    return 0.0;
  (void)budget_slot(b, now_ns);
  left = amount_left(b);
  return left > 0.0 ? left : 0.0;
}
