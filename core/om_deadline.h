/*
 * om_deadline.h: one time budget over a whole call (queueing, every attempt,
 * every backoff), as a value type.
 *
 * A deadline is an absolute point on the caller's unsigned 64-bit monotonic
 * clock (nanoseconds). It is a struct passed by value with inline functions
 * because it is consulted on every call's hot path, several times per call;
 * it owns nothing, so there is nothing to free.
 *
 * Arithmetic saturates: now + budget past the end of the clock clamps to
 * OM_DEADLINE_NEVER, the explicit "no deadline" value (as libuv's timers clamp
 * a timeout that overflows to UINT64_MAX, src/timer.c uv_timer_start). The
 * price is that a finite deadline landing exactly on UINT64_MAX ns (584 years
 * of uptime) is treated as "never"; no monotonic clock gets there.
 *
 * Budgets are unsigned in this header, so a negative budget cannot reach the
 * inline constructors. Input that arrives signed (a header, a config value)
 * goes through om_deadline_from_signed, which refuses negatives.
 */
#ifndef OM_DEADLINE_H
#define OM_DEADLINE_H

#include <stdint.h>

/* "No deadline": never expires; remaining() is OM_DEADLINE_NEVER. */
#define OM_DEADLINE_NEVER UINT64_MAX

typedef struct om_deadline_s {
  uint64_t at_ns; /* absolute; OM_DEADLINE_NEVER for none */
} om_deadline_t;

/* A deadline that never expires. */
static inline om_deadline_t om_deadline_never(void) {
  om_deadline_t d = {OM_DEADLINE_NEVER};
  return d;
}

/*
 * om_deadline_after: the deadline budget_ns after now_ns. Saturates: a sum
 * past UINT64_MAX, or budget_ns == OM_DEADLINE_NEVER, gives "never". A zero
 * budget gives a deadline that is already expired at now_ns.
 */
static inline om_deadline_t om_deadline_after(uint64_t now_ns,
                                              uint64_t budget_ns) {
  om_deadline_t d;
  d.at_ns = budget_ns > OM_DEADLINE_NEVER - now_ns ? OM_DEADLINE_NEVER
                                                   : now_ns + budget_ns;
  return d;
}

/* A deadline at an absolute time (OM_DEADLINE_NEVER for none). */
static inline om_deadline_t om_deadline_at(uint64_t at_ns) {
  om_deadline_t d = {at_ns};
  return d;
}

/* The absolute time of d, OM_DEADLINE_NEVER if it has none. */
static inline uint64_t om_deadline_at_ns(om_deadline_t d) {
  return d.at_ns;
}

static inline int om_deadline_is_never(om_deadline_t d) {
  return d.at_ns == OM_DEADLINE_NEVER;
}

/*
 * om_deadline_remaining: budget left at now_ns; 0 once expired (never
 * negative: the clock is unsigned and the result saturates at 0);
 * OM_DEADLINE_NEVER for a deadline that never expires.
 */
static inline uint64_t om_deadline_remaining(om_deadline_t d, uint64_t now_ns) {
  if (d.at_ns == OM_DEADLINE_NEVER)
    return OM_DEADLINE_NEVER;
  return d.at_ns > now_ns ? d.at_ns - now_ns : 0;
}

/* True once now_ns has reached the deadline (at == now is expired). */
static inline int om_deadline_expired(om_deadline_t d, uint64_t now_ns) {
  return d.at_ns != OM_DEADLINE_NEVER && now_ns >= d.at_ns;
}

/*
 * om_deadline_attempt_timeout: the timeout to give one attempt started at
 * now_ns, min(per_try_ns, remaining). per_try_ns == OM_DEADLINE_NEVER means
 * "no per-try timeout" (then the whole remaining budget, possibly NEVER).
 * 0 means the deadline has passed: start no attempt.
 */
static inline uint64_t om_deadline_attempt_timeout(om_deadline_t d,
                                                   uint64_t now_ns,
                                                   uint64_t per_try_ns) {
  uint64_t r = om_deadline_remaining(d, now_ns);
  return per_try_ns < r ? per_try_ns : r;
}

/*
 * om_deadline_can_start_attempt: whether an attempt started at now_ns would
 * have at least min_useful_ns of budget (and more than none at all). Retries
 * ask this so a retry that cannot finish is never sent: it would only add
 * load upstream and delay the caller's error.
 */
static inline int om_deadline_can_start_attempt(om_deadline_t d,
                                                uint64_t now_ns,
                                                uint64_t min_useful_ns) {
  uint64_t r = om_deadline_remaining(d, now_ns);
  return r > 0 && r >= min_useful_ns;
}

/*
 * om_deadline_from_signed: the checked constructor for a budget that arrives
 * as a signed number (a parsed header or config). A negative budget is
 * invalid input: returns OM_EINVAL and leaves *out unchanged. Otherwise sets
 * *out = om_deadline_after(now_ns, budget_ns) and returns 0.
 */
int om_deadline_from_signed(uint64_t now_ns, int64_t budget_ns,
                            om_deadline_t *out);

#endif /* OM_DEADLINE_H */
