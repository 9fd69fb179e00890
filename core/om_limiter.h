/*
 * om_limiter.h: an adaptive concurrency limit from observed latency, the
 * gradient algorithm of Netflix concurrency-limits (Gradient2Limit, with
 * the WindowedLimit sampling window and ExpAvgMeasurement baseline) and
 * Envoy's adaptive concurrency filter (sqrt(limit) headroom).
 *
 * Why: a fixed max_inflight is either too low (wasted capacity) or too high
 * (queues build inside the upstream, latency explodes). The limiter lowers
 * the limit when latency rises above its long-term baseline, which is the
 * signal that requests are queueing upstream, and raises it while latency
 * stays at the baseline.
 *
 * Per window of samples:
 *   short    = mean RTT of the window's successful samples
 *   long     = exponential average of `short` over long_window windows
 *              (plain mean for the first 10; decayed x0.9 when long > 2 x
 *              short, so recovery after a long overload is quick)
 *   gradient = max(0.5, min(1, tolerance * long / short))
 *   new      = limit * gradient + sqrt(limit)          (headroom to probe)
 *   limit    = clamp(limit * (1 - smoothing) + new * smoothing,
 *                    min_limit, max_limit)
 * A window with a drop (timeout, 503, reset) instead multiplies the limit by
 * `backoff` (AIMD-style, Netflix AIMDLimit). A window whose peak in-flight
 * count stayed below limit / 2 leaves the limit alone: the caller was not
 * using it, so latency says nothing about it ("app limited").
 *
 * A window closes at the first sample at which it is at least window_ns old
 * and holds at least window_samples samples (drops included). Sparse
 * traffic therefore stretches a window rather than deciding on one sample.
 *
 * Use with om_admission: after om_limiter_sample, the caller passes
 * om_limiter_limit() to om_admission_set_limit (see om_admission.h for why
 * the two are separate objects). Time is the caller's now_ns; no clock here.
 * Not thread-safe.
 */
#ifndef OM_LIMITER_H
#define OM_LIMITER_H

#include <stdint.h>

typedef struct om_limiter_s om_limiter_t;

typedef struct om_limiter_opts_s {
  uint32_t min_limit;      /* >= 1; default 1 */
  uint32_t max_limit;      /* >= min_limit; default 1000 */
  uint32_t initial_limit;  /* in [min_limit, max_limit]; default 20 */
  double tolerance;        /* >= 1: latency growth tolerated; default 1.5 */
  double smoothing;        /* in (0, 1]; default 0.2 (Netflix) */
  double backoff;          /* in (0, 1): factor on a drop; default 0.9 */
  uint64_t window_ns;      /* min window length; default 100 ms */
  uint32_t window_samples; /* >= 1 min samples per window; default 10 */
  uint32_t long_window;    /* >= 1 windows in the baseline; default 600 */
} om_limiter_opts_t;

typedef struct om_limiter_stats_s {
  uint32_t limit;        /* what om_limiter_limit returns */
  double estimate;       /* the unrounded limit */
  double long_rtt_ns;    /* baseline; 0 before the first window */
  double short_rtt_ns;   /* last window's mean; 0 before the first window */
  uint64_t windows;      /* windows closed */
  uint64_t drop_windows; /* windows that backed off on a drop */
} om_limiter_stats_t;

/* Fill opts with the defaults above. */
void om_limiter_opts_init(om_limiter_opts_t *opts);

/*
 * om_limiter_new: create a limiter. opts NULL means the defaults. Returns 0
 * and sets *out (owned by the caller, free with om_limiter_free); OM_EINVAL
 * when out is NULL or an option is out of its range (also NaN); OM_ENOMEM.
 * On error *out is untouched and nothing is allocated.
 */
int om_limiter_new(const om_limiter_opts_t *opts, om_limiter_t **out);

/* Free the limiter; NULL is a no-op. */
void om_limiter_free(om_limiter_t *l);

/*
 * om_limiter_sample: record one finished request at now_ns: its round-trip
 * time rtt_ns (a 0 is read as 1 ns), the number of requests in flight when
 * it ran (UINT32_MAX when unknown: disables the app-limited hold), and
 * whether it was dropped (timed out, 503, reset: then rtt_ns is ignored).
 * May close a window and move the limit. Returns the limit after the
 * sample, the value to pass to om_admission_set_limit. Never fails.
 */
uint32_t om_limiter_sample(om_limiter_t *l, uint64_t now_ns, uint64_t rtt_ns,
                           uint32_t inflight, int dropped);

/* The current limit, in [min_limit, max_limit]. */
uint32_t om_limiter_limit(const om_limiter_t *l);

/* The limiter's state, for metrics and tests. */
void om_limiter_stats(const om_limiter_t *l, om_limiter_stats_t *out);

#endif /* OM_LIMITER_H */
