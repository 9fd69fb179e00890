/* om_p2c.c: power of two choices (om_p2c.h). */
#include "om_p2c.h"

#include <math.h>
#include <stdlib.h>

#include "om_errno.h"
#include "om_ewma.h"

#define DEFAULT_DECAY_NS UINT64_C(10000000000)       /* 10 s */
#define DEFAULT_LATENCY_NS UINT64_C(30000000)        /* 30 ms */
#define DEFAULT_PENALTY_NS UINT64_C(1000000000)      /* 1 s */
#define DEFAULT_MAX_PENALTY_NS UINT64_C(60000000000) /* 60 s */
#define DEFAULT_MAX_TRIES 16

/*
 * Array of structs here, unlike rendezvous: a pick reads two random peers,
 * so everything a cost needs sits together (one cache line per candidate).
 */
typedef struct {
  om_ewma_t lat;
  double weight;
  uint64_t penalty_until_ns;
  uint32_t inflight;
} peer_t;

struct om_p2c_s {
  size_t n;
  size_t nwords;
  size_t n_eligible;
  double decay_ns;
  uint64_t default_penalty_ns;
  uint64_t max_penalty_ns;
  uint32_t max_tries;
  uint64_t *eligible; /* bitmap, nwords words, no bits set past n */
  peer_t *peers;
  /* the estimates of the peers with a sample: their mean is the prior */
  double sampled_sum;
  size_t n_sampled;
};

int om_p2c_new(const om_p2c_opts_t *opts, om_p2c_t **out) {
  om_p2c_t *p;
  size_t i, n;
  double def_lat;

  if (opts == NULL || out == NULL)
    return OM_EINVAL;
  n = opts->npeers;
  if (n == 0)
    return OM_ENOPEERS;
  if (n > INT32_MAX)
    return OM_ERANGE;
  if (opts->weights != NULL) {
    for (i = 0; i < n; i++) {
      double w = opts->weights[i];
      if (!(w > 0) || isinf(w)) /* !(w > 0) also rejects NaN */
        return OM_EINVAL;
    }
  }
  p = calloc(1, sizeof *p);
  if (p == NULL)
    return OM_ENOMEM;
  p->n = n;
  p->nwords = OM_P2C_BITMAP_WORDS(n);
  p->eligible = calloc(p->nwords, sizeof *p->eligible);
  p->peers = calloc(n, sizeof *p->peers);
  if (p->eligible == NULL || p->peers == NULL) {
    om_p2c_free(p);
    return OM_ENOMEM;
  }
  p->decay_ns =
      (double)(opts->decay_ns != 0 ? opts->decay_ns : DEFAULT_DECAY_NS);
  p->default_penalty_ns = opts->default_penalty_ns != 0
                              ? opts->default_penalty_ns
                              : DEFAULT_PENALTY_NS;
  p->max_penalty_ns =
      opts->max_penalty_ns != 0 ? opts->max_penalty_ns : DEFAULT_MAX_PENALTY_NS;
  p->max_tries = opts->max_tries != 0 ? opts->max_tries : DEFAULT_MAX_TRIES;
  def_lat = (double)(opts->default_latency_ns != 0 ? opts->default_latency_ns
                                                   : DEFAULT_LATENCY_NS);
  for (i = 0; i < n; i++) {
    om_ewma_init(&p->peers[i].lat, def_lat);
    p->peers[i].weight = opts->weights != NULL ? opts->weights[i] : 1.0;
    om_p2c_bitmap_set(p->eligible, i);
  }
  p->n_eligible = n;
  *out = p;
  return 0;
}

void om_p2c_free(om_p2c_t *p) {
  if (p == NULL)
    return;
  free(p->eligible);
  free(p->peers);
  free(p);
}

size_t om_p2c_size(const om_p2c_t *p) {
  return p->n;
}

static inline uint64_t candidates_word(const om_p2c_t *p,
                                       const uint64_t *exclude, size_t w) {
  uint64_t bits = p->eligible[w];
  if (exclude != NULL)
    bits &= ~exclude[w];
  return bits;
}

static inline int is_candidate(const om_p2c_t *p, const uint64_t *exclude,
                               uint32_t i) {
  return (int)((candidates_word(p, exclude, i / 64) >> (i % 64)) & 1);
}

/*
 * A peer without a sample looks like the average sampled peer: a fixed
 * default would either starve a new peer (above the others' estimates,
 * and it never gets the sample that would lower it) or flood it (below).
 * The default applies only while no peer has a sample.
 */
static inline double estimate(const om_p2c_t *p, const peer_t *q) {
  if (!q->lat.has_sample && p->n_sampled > 0)
    return p->sampled_sum / (double)p->n_sampled;
  return om_ewma_value(&q->lat);
}

static inline double latency_at(const om_p2c_t *p, const peer_t *q,
                                uint64_t now_ns) {
  uint64_t rem =
      q->penalty_until_ns > now_ns ? q->penalty_until_ns - now_ns : 0;
  return estimate(p, q) + (double)rem;
}

/* The r-th (from 0) candidate in index order; r < number of candidates. */
static uint32_t select_candidate(const om_p2c_t *p, const uint64_t *exclude,
                                 uint32_t r) {
  for (size_t w = 0;; w++) {
    uint64_t bits = candidates_word(p, exclude, w);
    uint32_t c = (uint32_t)__builtin_popcountll(bits);
    if (r < c) {
      while (r-- > 0)
        bits &= bits - 1; /* drop the lowest set bit */
      return (uint32_t)(w * 64 + (size_t)__builtin_ctzll(bits));
    }
    r -= c;
  }
}

/*
 * The exact fallback: count the candidates, then draw an ordered pair
 * uniformly among them. Returns how many were found, capped at 2.
 */
static int scan_pair(const om_p2c_t *p, om_rng_t *rng, const uint64_t *exclude,
                     uint32_t *a, uint32_t *b) {
  uint32_t m = 0, r1, r2;
  for (size_t w = 0; w < p->nwords; w++)
    m += (uint32_t)__builtin_popcountll(candidates_word(p, exclude, w));
  if (m == 0)
    return 0;
  if (m == 1) {
    *a = select_candidate(p, exclude, 0);
    return 1;
  }
  r1 = om_rng_below(rng, m);
  r2 = om_rng_below(rng, m - 1);
  if (r2 >= r1)
    r2++;
  *a = select_candidate(p, exclude, r1);
  *b = select_candidate(p, exclude, r2);
  return 2;
}

int om_p2c_pick(const om_p2c_t *p, om_rng_t *rng, const uint64_t *exclude,
                uint64_t now_ns, uint32_t *out) {
  uint32_t n = (uint32_t)p->n, a = 0, b = 0, tries;
  const peer_t *pa, *pb;
  double ca, cb;
  int found = 0;

  if (p->n_eligible == 0)
    return OM_ENOPEERS;
  /*
   * Random draws, bounded. Expected draws for a pair are about 2n/m with m
   * candidates; when that exceeds the budget, go straight to the scan.
   */
  if (p->n_eligible >= 2 && (uint64_t)p->n_eligible * p->max_tries >= 2u * n) {
    for (tries = p->max_tries; tries > 0; tries--) {
      uint32_t x = om_rng_below(rng, n);
      if (!is_candidate(p, exclude, x))
        continue;
      if (found == 0) {
        a = x;
        found = 1;
      } else if (x != a) {
        b = x;
        found = 2;
        break;
      }
    }
  }
  if (found < 2) {
    found = scan_pair(p, rng, exclude, &a, &b);
    if (found == 0)
      return OM_ENOPEERS;
    if (found == 1) {
      *out = a;
      return 0;
    }
  }
  /*
   * (in_a + 1) * lat_a / w_a  vs  (in_b + 1) * lat_b / w_b, cross-multiplied.
   * Doubles: no overflow for any inflight and latency, exact for integers
   * below 2^53. a wins ties (a fair coin, see om_p2c.h).
   */
  pa = &p->peers[a];
  pb = &p->peers[b];
  ca = ((double)pa->inflight + 1.0) * latency_at(p, pa, now_ns) * pb->weight;
  cb = ((double)pb->inflight + 1.0) * latency_at(p, pb, now_ns) * pa->weight;
  *out = cb < ca ? b : a;
  return 0;
}

static inline int among_ok(const om_p2c_t *p, om_p2c_accept_fn accept, void *ud,
                           uint32_t i) {
  return i < p->n && ((p->eligible[i / 64] >> (i % 64)) & 1) &&
         (accept == NULL || accept(ud, i));
}

static inline uint32_t among_at(const uint32_t *cand, size_t k) {
  return cand != NULL ? cand[k] : (uint32_t)k;
}

/*
 * The exact fallback of pick_among: count the accepted candidates, draw
 * an ordered pair of ranks among them, and find those two in a second
 * pass (accept is asked twice per candidate here: it must not change its
 * answer within a pick). Returns how many were found, capped at 2.
 */
static int among_scan(const om_p2c_t *p, om_rng_t *rng, const uint32_t *cand,
                      size_t n, om_p2c_accept_fn accept, void *ud, uint32_t *a,
                      uint32_t *b) {
  uint32_t m = 0, r1, r2, seen = 0;
  int got = 0;
  for (size_t k = 0; k < n; k++)
    m += (uint32_t)among_ok(p, accept, ud, among_at(cand, k));
  if (m == 0)
    return 0;
  r1 = m == 1 ? 0 : om_rng_below(rng, m);
  r2 = m == 1 ? 0 : om_rng_below(rng, m - 1);
  if (m > 1 && r2 >= r1)
    r2++;
  for (size_t k = 0; k < n && got < (m == 1 ? 1 : 2); k++) {
    uint32_t i = among_at(cand, k);
    if (!among_ok(p, accept, ud, i))
      continue;
    if (seen == r1) {
      *a = i;
      got++;
    }
    if (m > 1 && seen == r2) {
      *b = i;
      got++;
    }
    seen++;
  }
  return m == 1 ? 1 : 2;
}

int om_p2c_pick_among(const om_p2c_t *p, om_rng_t *rng, const uint32_t *cand,
                      size_t n, om_p2c_accept_fn accept, void *ud,
                      uint64_t now_ns, uint32_t *out) {
  uint32_t a = 0, b = 0, tries;
  const peer_t *pa, *pb;
  double ca, cb;
  int found = 0;
  if (cand == NULL && n > p->n)
    n = p->n;
  if (p->n_eligible == 0 || n == 0 || n > UINT32_MAX)
    return OM_ENOPEERS;
  /* Draws among the candidates, bounded as om_p2c_pick's. A list with a
   * repeat (or an index out of range) is the caller's mistake; draws only
   * take two distinct accepted peers, the scan treats a repeat as two. */
  if (n >= 2) {
    for (tries = p->max_tries; tries > 0; tries--) {
      uint32_t x = among_at(cand, om_rng_below(rng, (uint32_t)n));
      if (!among_ok(p, accept, ud, x))
        continue;
      if (found == 0) {
        a = x;
        found = 1;
      } else if (x != a) {
        b = x;
        found = 2;
        break;
      }
    }
  }
  if (found < 2) {
    found = among_scan(p, rng, cand, n, accept, ud, &a, &b);
    if (found == 0)
      return OM_ENOPEERS;
    if (found == 1 || a == b) {
      *out = a;
      return 0;
    }
  }
  pa = &p->peers[a];
  pb = &p->peers[b];
  ca = ((double)pa->inflight + 1.0) * latency_at(p, pa, now_ns) * pb->weight;
  cb = ((double)pb->inflight + 1.0) * latency_at(p, pb, now_ns) * pa->weight;
  *out = cb < ca ? b : a;
  return 0;
}

int om_p2c_set_eligible(om_p2c_t *p, size_t i, int eligible) {
  uint64_t bit;
  int was;
  if (i >= p->n)
    return OM_ERANGE;
  bit = UINT64_C(1) << (i % 64);
  was = (p->eligible[i / 64] & bit) != 0;
  if (eligible && !was) {
    p->eligible[i / 64] |= bit;
    p->n_eligible++;
  } else if (!eligible && was) {
    p->eligible[i / 64] &= ~bit;
    p->n_eligible--;
  }
  return 0;
}

int om_p2c_is_eligible(const om_p2c_t *p, size_t i) {
  if (i >= p->n)
    return 0;
  return (int)((p->eligible[i / 64] >> (i % 64)) & 1);
}

size_t om_p2c_eligible_count(const om_p2c_t *p) {
  return p->n_eligible;
}

int om_p2c_start(om_p2c_t *p, size_t i) {
  if (i >= p->n)
    return OM_ERANGE;
  if (p->peers[i].inflight == UINT32_MAX)
    return OM_ERANGE;
  p->peers[i].inflight++;
  return 0;
}

int om_p2c_finish(om_p2c_t *p, size_t i, uint64_t latency_ns, int ok,
                  uint64_t now_ns) {
  peer_t *q;
  double s, before;
  if (i >= p->n)
    return OM_ERANGE;
  q = &p->peers[i];
  if (q->inflight == 0)
    return OM_ESTATE;
  q->inflight--;
  s = (double)latency_ns;
  before = estimate(p, q);
  /* A fast failure must not make the peer look fast. */
  if (!ok && s < before)
    s = before;
  if (q->lat.has_sample) {
    p->sampled_sum -= om_ewma_value(&q->lat);
  } else {
    p->n_sampled++;
  }
  om_ewma_observe(&q->lat, s, now_ns, p->decay_ns);
  p->sampled_sum += om_ewma_value(&q->lat);
  if (p->sampled_sum < 0) /* rounding over many updates */
    p->sampled_sum = 0;
  return 0;
}

int om_p2c_penalize(om_p2c_t *p, size_t i, uint64_t retry_after_ns,
                    uint64_t now_ns) {
  uint64_t window, until;
  if (i >= p->n)
    return OM_ERANGE;
  window = retry_after_ns != 0 ? retry_after_ns : p->default_penalty_ns;
  if (window > p->max_penalty_ns)
    window = p->max_penalty_ns;
  until = now_ns + window;
  if (until < now_ns) /* saturate rather than wrap into the past */
    until = UINT64_MAX;
  if (until > p->peers[i].penalty_until_ns)
    p->peers[i].penalty_until_ns = until;
  return 0;
}

uint32_t om_p2c_inflight(const om_p2c_t *p, size_t i) {
  return i < p->n ? p->peers[i].inflight : 0;
}

double om_p2c_latency_ns(const om_p2c_t *p, size_t i, uint64_t now_ns) {
  return i < p->n ? latency_at(p, &p->peers[i], now_ns) : 0;
}
