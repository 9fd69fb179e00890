/*
 * om_ewma.h: peak-EWMA latency estimate (Finagle's PeakEwma, also
 * linkerd2/tower's PeakEwma load).
 *
 * - A sample above the estimate replaces it at once: a peer that got slow
 *   stops attracting load on its next response, not ten responses later.
 * - A sample below decays the estimate toward it with a time constant tau:
 *   est = s + (est - s) * exp(-dt / tau), where dt is the time since the
 *   previous sample. Weighting by elapsed time rather than per sample keeps
 *   the memory the same whether a peer answers 10 or 10,000 times a second.
 * - Until the first sample the estimate is a default (30 ms in P2C), the
 *   first sample replaces it whatever its value.
 *
 * Header-only and pure: time is the caller's now_ns; time going backwards
 * counts as no time elapsed.
 */
#ifndef OM_EWMA_H
#define OM_EWMA_H

#include <math.h>
#include <stdint.h>

typedef struct om_ewma_s {
  double value_ns;  /* the estimate (the default until the first sample) */
  uint64_t last_ns; /* time of the latest sample */
  int has_sample;
} om_ewma_t;

/* om_ewma_init: an estimate with no samples yet, reading default_ns. */
static inline void om_ewma_init(om_ewma_t *e, double default_ns) {
  e->value_ns = default_ns;
  e->last_ns = 0;
  e->has_sample = 0;
}

/*
 * om_ewma_observe: fold in one latency sample (ns, >= 0) taken at now_ns,
 * with decay time constant tau_ns (> 0).
 */
static inline void om_ewma_observe(om_ewma_t *e, double sample_ns,
                                   uint64_t now_ns, double tau_ns) {
  if (!e->has_sample || sample_ns >= e->value_ns) {
    e->value_ns = sample_ns;
  } else {
    uint64_t dt = now_ns > e->last_ns ? now_ns - e->last_ns : 0;
    double w = exp(-(double)dt / tau_ns);
    e->value_ns = sample_ns + (e->value_ns - sample_ns) * w;
  }
  if (!e->has_sample || now_ns > e->last_ns)
    e->last_ns = now_ns;
  e->has_sample = 1;
}

/* om_ewma_value: the current estimate in nanoseconds. */
static inline double om_ewma_value(const om_ewma_t *e) {
  return e->value_ns;
}

#endif /* OM_EWMA_H */
