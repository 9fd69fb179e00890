/*
 * om_backoff.h: how long to wait before a retry.
 *
 * Two sources, in the order a caller should prefer them:
 *
 * 1. What the server asked for: `Retry-After` (RFC 9110 section 10.2.3),
 *    either delay-seconds or an HTTP-date (RFC 9110 section 5.6.7), and the
 *    `retry-after-ms` extension some model providers send (Azure OpenAI).
 *    A server's value is never trusted blindly: anything that does not match
 *    the grammar is "absent" (OM_EPARSE), and every value is clamped to a
 *    caller-chosen ceiling, so one bad header cannot park a request forever.
 * 2. Our own exponential backoff with AWS "full jitter"
 *    (sleep = random_between(0, min(cap, base * 2^(attempt-1)))), which
 *    spreads synchronized clients apart instead of retrying in lockstep.
 *
 * Everything here is pure: the current time and the random draw are
 * arguments, so every result is reproducible under test.
 */
#ifndef OM_BACKOFF_H
#define OM_BACKOFF_H

#include <stddef.h>
#include <stdint.h>

#include "om_rng.h"

/* The ceiling the Lua face applies when the caller gives none: 60 s. */
#define OM_RETRY_AFTER_DEFAULT_CEILING_MS UINT64_C(60000)

/*
 * om_backoff_ceiling_ns: the upper bound of the jitter interval for a retry,
 * min(cap_ns, base_ns * 2^(attempt-1)).
 *
 * attempt counts retries from 1: attempt 1 (the first retry) -> base_ns,
 * attempt 2 -> 2*base_ns, ... attempt 0 is treated as 1, so a caller that
 * counts from 0 still waits instead of hammering. Never overflows: any
 * attempt (up to UINT32_MAX) whose doubling would exceed cap_ns yields
 * cap_ns. base_ns > cap_ns yields cap_ns. Pure; no error cases.
 */
uint64_t om_backoff_ceiling_ns(uint32_t attempt, uint64_t base_ns,
                               uint64_t cap_ns);

/*
 * om_backoff_full_jitter_ns: AWS "full jitter": r * ceiling, where ceiling
 * is om_backoff_ceiling_ns(attempt, base_ns, cap_ns) and r is the caller's
 * uniform draw in [0, 1). The result is in [0, ceiling] (rounding can only
 * touch the upper end when ceiling is not representable as a double).
 * r outside [0, 1) is clamped into it; NaN is treated as 0. Pure.
 */
uint64_t om_backoff_full_jitter_ns(uint32_t attempt, uint64_t base_ns,
                                   uint64_t cap_ns, double r);

/*
 * om_backoff_ns: om_backoff_full_jitter_ns with the draw taken from the
 * caller's generator (advances *rng by one step). rng must not be NULL.
 */
uint64_t om_backoff_ns(uint32_t attempt, uint64_t base_ns, uint64_t cap_ns,
                       om_rng_t *rng);

/*
 * om_http_date_parse: an HTTP-date (RFC 9110 section 5.6.7) to seconds since
 * the Unix epoch (may be negative for dates before 1970).
 *
 * Accepts exactly the three forms of the grammar, case-sensitively:
 *   IMF-fixdate  "Sun, 06 Nov 1994 08:49:37 GMT"
 *   rfc850-date  "Sunday, 06-Nov-94 08:49:37 GMT"   (obsolete)
 *   asctime-date "Sun Nov  6 08:49:37 1994"         (obsolete)
 * Ranges are checked: hour 00-23, minute 00-59, second 00-59 (60 only in
 * 23:59:60, the leap second the grammar allows), day-of-month against the
 * month and leap years (proleptic Gregorian). The day name must be the
 * weekday of the date: an inconsistent date is corrupt, and ignoring a
 * corrupt Retry-After only falls back to our own backoff.
 * A two-digit rfc850 year is resolved against now_s as section 5.6.7
 * requires: the latest year with those two digits whose timestamp is not
 * more than 50 years after now_s.
 * No leading/trailing whitespace is accepted here (the field parser trims
 * OWS). Computes the epoch arithmetically (days from civil), never timegm.
 *
 * Returns 0 and sets *out_s; OM_EPARSE if s[0..len) is not an HTTP-date;
 * OM_EINVAL if out_s is NULL or s is NULL with len > 0. *out_s is untouched
 * on error.
 */
int om_http_date_parse(const char *s, size_t len, int64_t now_s,
                       int64_t *out_s);

/*
 * om_retry_after_parse: the `Retry-After` field value (RFC 9110 section
 * 10.2.3: Retry-After = HTTP-date / delay-seconds; delay-seconds = 1*DIGIT)
 * to a wait in milliseconds, given the current time now_s (epoch seconds).
 *
 * - Surrounding OWS (SP / HTAB, RFC 9110 section 5.6.3) is trimmed; nothing
 *   else is tolerated: signs, fractions, trailing junk, an empty value are
 *   OM_EPARSE ("absent": fall back to our own backoff).
 * - delay-seconds of any length is accepted and saturates instead of
 *   wrapping (the rule RFC 9111 section 1.2.2 gives caches for delta-seconds),
 *   then is clamped to ceiling_ms: a huge value means "a long time", which
 *   the ceiling bounds.
 * - An HTTP-date in the past (or now) -> 0; in the future -> the difference.
 * - The result never exceeds ceiling_ms (UINT64_MAX: no ceiling).
 *
 * Returns 0 and sets *out_ms; OM_EPARSE when malformed; OM_EINVAL if out_ms
 * is NULL or s is NULL with len > 0. *out_ms is untouched on error.
 */
int om_retry_after_parse(const char *s, size_t len, int64_t now_s,
                         uint64_t ceiling_ms, uint64_t *out_ms);

/*
 * om_retry_after_ms_parse: the `retry-after-ms` field some providers send
 * (Azure OpenAI): a non-negative number of milliseconds. There is no RFC;
 * the accepted grammar is `1*DIGIT [ "." 1*DIGIT ]` after trimming OWS, and a
 * fraction rounds up to the next whole millisecond (waiting a little longer
 * than asked never violates the server's request). Saturates, then clamps to
 * ceiling_ms. Same return values as om_retry_after_parse.
 */
int om_retry_after_ms_parse(const char *s, size_t len, uint64_t ceiling_ms,
                            uint64_t *out_ms);

#endif /* OM_BACKOFF_H */
