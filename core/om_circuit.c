/*
 * om_circuit.c: the per-peer circuit breaker (see om_circuit.h for the
 * state machine and the defaults).
 */
#include "om_circuit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"

#define SEC UINT64_C(1000000000)

void om_circuit_opts_default(om_circuit_opts_t *opts) {
  opts->failures = 5;
  opts->cooldown_ns = 30 * SEC;
  opts->max_cooldown_ns = 300 * SEC;
  opts->window_ns = 10 * SEC;
  opts->min_requests = 20;
  opts->failure_ratio = 0.5;
  opts->reset_ns = 300 * SEC;
  opts->probe_timeout_ns = 0;
}

static bool opts_valid(const om_circuit_opts_t *o) {
  bool window = o->window_ns != 0;
  if (o->cooldown_ns == 0 || o->max_cooldown_ns < o->cooldown_ns)
    return false;
  if (o->failures == 0 && !window)
    return false; /* a breaker that can never trip is a configuration bug */
  if (window && (o->window_ns < OM_CIRCUIT_BUCKETS || o->min_requests == 0 ||
                 !(o->failure_ratio > 0.0 && o->failure_ratio <= 1.0)))
    return false;
  return true;
}

int om_circuit_init(om_circuit_t *c, const om_circuit_opts_t *opts) {
  om_circuit_opts_t def;
  if (c == NULL)
    return OM_EINVAL;
  if (opts == NULL) {
    om_circuit_opts_default(&def);
    opts = &def;
  }
  if (!opts_valid(opts))
    return OM_EINVAL;
  memset(c, 0, sizeof *c);
  c->cooldown_ns = opts->cooldown_ns;
  c->max_cooldown_ns = opts->max_cooldown_ns;
  c->bucket_ns = opts->window_ns / OM_CIRCUIT_BUCKETS;
  c->reset_ns = opts->reset_ns;
  c->probe_timeout_ns = opts->probe_timeout_ns;
  c->failures = opts->failures;
  c->min_requests = opts->min_requests;
  if (c->bucket_ns != 0) {
    /* Parts per million: the trip test stays in exact integer math. */
    double ppm = round(opts->failure_ratio * 1e6);
    c->ratio_ppm = ppm < 1.0 ? 1 : (uint32_t)ppm;
  }
  c->state = OM_CIRCUIT_CLOSED;
  return 0;
}

int om_circuit_new(const om_circuit_opts_t *opts, om_circuit_t **out) {
  om_circuit_t tmp, *c;
  int rc;
  if (out == NULL)
    return OM_EINVAL;
  rc = om_circuit_init(&tmp, opts);
  if (rc != 0)
    return rc;
  c = malloc(sizeof *c);
  if (c == NULL)
    return OM_ENOMEM;
  *c = tmp;
  *out = c;
  return 0;
}

void om_circuit_free(om_circuit_t *c) {
  free(c);
}

/* ---- the rolling window ------------------------------------------------ */

static void window_clear(om_circuit_t *c) {
  memset(c->req, 0, sizeof c->req);
  memset(c->fail, 0, sizeof c->fail);
  c->total = c->failed = 0;
}

/* Move the ring forward to now's bucket, expiring what fell out. */
static void window_advance(om_circuit_t *c, uint64_t epoch) {
  uint64_t gap;
  if (epoch <= c->head)
    return;
  gap = epoch - c->head;
  if (gap >= OM_CIRCUIT_BUCKETS) {
    window_clear(c);
  } else {
    for (uint64_t e = c->head + 1; e <= epoch; e++) {
      unsigned i = (unsigned)(e % OM_CIRCUIT_BUCKETS);
      c->total -= c->req[i];
      c->failed -= c->fail[i];
      c->req[i] = c->fail[i] = 0;
    }
  }
  c->head = epoch;
}

/* Saturating: the ratio stays meaningful even if a bucket fills up. */
static void add_sat(uint32_t *v) {
  if (*v != UINT32_MAX)
    (*v)++;
}

static void window_add(om_circuit_t *c, uint64_t now_ns, bool ok) {
  uint64_t epoch = now_ns / c->bucket_ns;
  unsigned i;
  window_advance(c, epoch);
  /* A result stamped before the window (a late completion) is dropped. */
  if (c->head - epoch >= OM_CIRCUIT_BUCKETS)
    return;
  i = (unsigned)(epoch % OM_CIRCUIT_BUCKETS);
  if (c->req[i] == UINT32_MAX || c->total == UINT32_MAX)
    return;
  c->req[i]++;
  c->total++;
  if (!ok) {
    c->fail[i]++;
    c->failed++;
  }
}

static bool ratio_tripped(const om_circuit_t *c) {
  return c->total >= c->min_requests &&
         (uint64_t)c->failed * 1000000u >=
             (uint64_t)c->ratio_ppm * (uint64_t)c->total;
}

/* ---- transitions -------------------------------------------------------- */

static uint64_t cooldown(const om_circuit_t *c) {
  /* cooldown x trips, capped; compared before multiplying (no overflow). */
  if (c->trips > c->max_cooldown_ns / c->cooldown_ns)
    return c->max_cooldown_ns;
  return c->cooldown_ns * c->trips;
}

static uint64_t add_clamp(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static void trip(om_circuit_t *c, uint64_t now_ns) {
  add_sat(&c->trips);
  c->state = OM_CIRCUIT_OPEN;
  c->at_ns = add_clamp(now_ns, cooldown(c));
  c->consecutive = 0;
  window_clear(c);
}

static bool healed(const om_circuit_t *c, uint64_t now_ns) {
  return c->state == OM_CIRCUIT_CLOSED && now_ns >= c->at_ns &&
         now_ns - c->at_ns >= c->reset_ns;
}

bool om_circuit_allow(om_circuit_t *c, uint64_t now_ns) {
  switch (c->state) {
  case OM_CIRCUIT_CLOSED:
    return true;
  case OM_CIRCUIT_OPEN:
    if (now_ns < c->at_ns)
      return false;
    c->state = OM_CIRCUIT_HALF_OPEN;
    c->at_ns = now_ns;
    return true;
  default: /* half_open: the probe is out */
    if (c->probe_timeout_ns != 0 && now_ns >= c->at_ns &&
        now_ns - c->at_ns >= c->probe_timeout_ns) {
      c->at_ns = now_ns; /* presume it lost; admit a replacement */
      return true;
    }
    return false;
  }
}

void om_circuit_release(om_circuit_t *c, uint64_t now_ns) {
  if (c->state != OM_CIRCUIT_HALF_OPEN)
    return;
  /* back to open with the cooldown over: the next allow() goes half_open
   * and admits the probe, as when the cooldown first ended */
  c->state = OM_CIRCUIT_OPEN;
  c->at_ns = now_ns;
}

bool om_circuit_peek(const om_circuit_t *c, uint64_t now_ns) {
  switch (c->state) {
  case OM_CIRCUIT_CLOSED:
    return true;
  case OM_CIRCUIT_OPEN:
    return now_ns >= c->at_ns;
  default:
    return c->probe_timeout_ns != 0 && now_ns >= c->at_ns &&
           now_ns - c->at_ns >= c->probe_timeout_ns;
  }
}

om_circuit_state_t om_circuit_record(om_circuit_t *c, uint64_t now_ns,
                                     bool ok) {
  switch (c->state) {
  case OM_CIRCUIT_CLOSED:
    if (c->bucket_ns != 0)
      window_add(c, now_ns, ok);
    if (ok) {
      c->consecutive = 0;
      break;
    }
    add_sat(&c->consecutive);
    if ((c->failures != 0 && c->consecutive >= c->failures) ||
        (c->bucket_ns != 0 && ratio_tripped(c))) {
      if (healed(c, now_ns))
        c->trips = 0;
      trip(c, now_ns);
    }
    break;
  case OM_CIRCUIT_OPEN:
    break; /* a late result from before the trip: no news about now */
  default: /* half_open: the probe's result */
    if (ok) {
      c->state = OM_CIRCUIT_CLOSED;
      c->at_ns = now_ns;
      c->consecutive = 0;
      window_clear(c);
    } else {
      trip(c, now_ns);
    }
    break;
  }
  return (om_circuit_state_t)c->state;
}

om_circuit_state_t om_circuit_state(const om_circuit_t *c, uint64_t now_ns) {
  if (c->state == OM_CIRCUIT_OPEN && now_ns >= c->at_ns)
    return OM_CIRCUIT_HALF_OPEN;
  return (om_circuit_state_t)c->state;
}

const char *om_circuit_state_name(om_circuit_state_t state) {
  switch (state) {
  case OM_CIRCUIT_CLOSED:
    return "closed";
  case OM_CIRCUIT_OPEN:
    return "open";
  case OM_CIRCUIT_HALF_OPEN:
    return "half_open";
  default:
    return "unknown";
  }
}

uint32_t om_circuit_trips(const om_circuit_t *c, uint64_t now_ns) {
  return healed(c, now_ns) ? 0 : c->trips;
}

uint64_t om_circuit_open_until(const om_circuit_t *c, uint64_t now_ns) {
  return om_circuit_state(c, now_ns) == OM_CIRCUIT_OPEN ? c->at_ns : 0;
}
