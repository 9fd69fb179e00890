/*
 * om_limiter.c: the gradient concurrency limit (see om_limiter.h).
 */
#include "om_limiter.h"

#include <math.h>
#include <stdlib.h>

#include "om_errno.h"

/* Windows averaged plainly before the exponential average takes over, so
 * the baseline is not dominated by the very first window (Netflix
 * ExpAvgMeasurement warmupWindow). */
#define WARMUP_WINDOWS 10
/* When the baseline is more than twice the current latency, decay it by
 * this much per window (Netflix Gradient2Limit: recovery after overload). */
#define LONG_DECAY 0.9

struct om_limiter_s {
  om_limiter_opts_t o;
  double limit;
  double long_rtt;
  double short_rtt;
  uint32_t long_count; /* windows in the baseline, up to WARMUP_WINDOWS */
  /* the open window */
  int win_open;
  uint64_t win_start;
  uint32_t win_samples; /* drops included */
  uint32_t win_rtts;    /* successful samples in win_rtt_sum */
  double win_rtt_sum;
  uint32_t win_max_inflight;
  int win_dropped;
  uint64_t windows;
  uint64_t drop_windows;
};

void om_limiter_opts_init(om_limiter_opts_t *opts) {
  opts->min_limit = 1;
  opts->max_limit = 1000;
  opts->initial_limit = 20;
  opts->tolerance = 1.5;
  opts->smoothing = 0.2;
  opts->backoff = 0.9;
  opts->window_ns = 100000000u;
  opts->window_samples = 10;
  opts->long_window = 600;
}

static int opts_valid(const om_limiter_opts_t *o) {
  /* Comparisons written so that NaN fails them. */
  return o->min_limit >= 1 && o->max_limit >= o->min_limit &&
         o->initial_limit >= o->min_limit && o->initial_limit <= o->max_limit &&
         o->tolerance >= 1.0 && isfinite(o->tolerance) && o->smoothing > 0.0 &&
         o->smoothing <= 1.0 && o->backoff > 0.0 && o->backoff < 1.0 &&
         o->window_samples >= 1 && o->long_window >= 1;
}

int om_limiter_new(const om_limiter_opts_t *opts, om_limiter_t **out) {
  om_limiter_opts_t o;
  om_limiter_t *l;
  if (out == NULL)
    return OM_EINVAL;
  if (opts != NULL)
    o = *opts;
  else
    om_limiter_opts_init(&o);
  if (!opts_valid(&o))
    return OM_EINVAL;
  l = calloc(1, sizeof *l);
  if (l == NULL)
    return OM_ENOMEM;
  l->o = o;
  l->limit = o.initial_limit;
  *out = l;
  return 0;
}

void om_limiter_free(om_limiter_t *l) {
  free(l);
}

static double clamp(double v, double lo, double hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

static void long_add(om_limiter_t *l, double rtt) {
  if (l->long_count < WARMUP_WINDOWS) {
    l->long_count++;
    l->long_rtt += (rtt - l->long_rtt) / l->long_count; /* running mean */
  } else {
    double f = 2.0 / ((double)l->o.long_window + 1.0);
    l->long_rtt = l->long_rtt * (1.0 - f) + rtt * f;
  }
}

static void close_window(om_limiter_t *l) {
  const om_limiter_opts_t *o = &l->o;
  double lo = o->min_limit, hi = o->max_limit;

  l->windows++;
  if (l->win_rtts > 0) {
    l->short_rtt = l->win_rtt_sum / l->win_rtts;
    long_add(l, l->short_rtt);
    if (l->long_rtt / l->short_rtt > 2.0)
      l->long_rtt *= LONG_DECAY;
  }

  if (l->win_dropped) {
    l->drop_windows++;
    l->limit = clamp(l->limit * o->backoff, lo, hi);
  } else if (l->win_rtts > 0 && (double)l->win_max_inflight >= l->limit / 2) {
    double g = clamp(o->tolerance * l->long_rtt / l->short_rtt, 0.5, 1.0);
    double next = l->limit * g + sqrt(l->limit);
    next = l->limit * (1.0 - o->smoothing) + next * o->smoothing;
    l->limit = clamp(next, lo, hi);
  }

  l->win_open = 0;
}

uint32_t om_limiter_sample(om_limiter_t *l, uint64_t now_ns, uint64_t rtt_ns,
                           uint32_t inflight, int dropped) {
  if (!l->win_open) {
    l->win_open = 1;
    l->win_start = now_ns;
    l->win_samples = 0;
    l->win_rtts = 0;
    l->win_rtt_sum = 0;
    l->win_max_inflight = 0;
    l->win_dropped = 0;
  }
  if (l->win_samples < UINT32_MAX)
    l->win_samples++;
  if (inflight > l->win_max_inflight)
    l->win_max_inflight = inflight;
  if (dropped) {
    /* A timeout's duration is the timeout, not the upstream's latency. */
    l->win_dropped = 1;
  } else if (l->win_rtts < UINT32_MAX) {
    l->win_rtts++;
    l->win_rtt_sum += rtt_ns > 0 ? (double)rtt_ns : 1.0;
  }
  /* A clock that steps back counts as no time elapsed. */
  if (l->win_samples >= l->o.window_samples && now_ns >= l->win_start &&
      now_ns - l->win_start >= l->o.window_ns)
    close_window(l);
  return om_limiter_limit(l);
}

uint32_t om_limiter_limit(const om_limiter_t *l) {
  return (uint32_t)l->limit; /* >= min_limit >= 1, <= max_limit */
}

void om_limiter_stats(const om_limiter_t *l, om_limiter_stats_t *out) {
  out->limit = om_limiter_limit(l);
  out->estimate = l->limit;
  out->long_rtt_ns = l->long_rtt;
  out->short_rtt_ns = l->short_rtt;
  out->windows = l->windows;
  out->drop_windows = l->drop_windows;
}
