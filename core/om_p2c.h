/*
 * om_p2c.h: power of two choices over peers with load and latency.
 *
 * A pick draws two distinct peers uniformly at random among the eligible
 * ones and takes the cheaper. With n peers and n requests in flight, the
 * most loaded peer carries O(log log n) requests instead of the
 * O(log n / log log n) of one random choice (Mitzenmacher, "The Power of Two
 * Choices in Randomized Load Balancing", 2001), and the decision looks at two
 * peers only: no global scan, no shared sorted structure.
 *
 * Cost of peer i at time now:
 *   cost_i = (inflight_i + 1) * latency_i(now) / weight_i
 *   latency_i(now) = peak-EWMA estimate (om_ewma.h, 10 s decay) +
 * penalty_i(now) before peer i's first sample its estimate is the mean estimate
 * of the peers that have one (30 ms while none has): a new peer looks average,
 *   so it gets its share at once instead of starving behind fast peers.
 *   penalty_i(now) = time remaining until the end of the latest Retry-After
 *                    window (om_p2c_penalize), 0 once it has passed.
 * Two costs are compared by cross-multiplying the weights, never dividing
 * (as nginx's ngx_http_upstream_random_module.c compares conns / weight).
 *
 * Why the penalty: a peer answering 429/503 answers fast, and fast
 * responses would lower its latency estimate and pull more load onto it.
 * So a failed response (ok == 0 in om_p2c_finish) never lowers the
 * estimate, and a Retry-After adds the remaining wait to the latency: a
 * request sent there now would effectively wait that long. The penalty
 * decays linearly to zero at the end of the window, so the peer gets load
 * back gradually instead of all at once when the window ends.
 *
 * Ties: the two candidates are an ordered pair drawn uniformly (the first
 * uniform over the eligible peers, the second over the rest), so keeping
 * the first on equal cost is a fair coin between them without another draw.
 *
 * Eligibility: om_p2c_set_eligible marks peers with an open circuit (or
 * drained) as ineligible, and a pick may also take an exclusion bitmap
 * (peers already tried by this request). Random draws are retried a bounded
 * number of times (max_tries); when they keep hitting ineligible peers, or
 * too few peers are eligible for draws to be likely to succeed, the pick
 * counts the eligible peers and draws among them exactly (nginx random
 * module's bounded fallback, without its round-robin step).
 *
 * Peers are indices 0..n-1 (the caller maps its ids). Not thread-safe: one
 * object per worker, like the rest of the per-loop state.
 */
#ifndef OM_P2C_H
#define OM_P2C_H

#include <stddef.h>
#include <stdint.h>

#include "om_rng.h"

typedef struct om_p2c_s om_p2c_t;

typedef struct om_p2c_opts_s {
  size_t npeers; /* >= 1 */
  /* npeers weights, each finite and > 0; NULL: every peer weighs 1. */
  const double *weights;
  uint64_t decay_ns; /* EWMA time constant; 0: 10 s */
  uint64_t
      default_latency_ns; /* estimate while no peer has a sample; 0: 30 ms */
  /* Penalty window when a 429/503 came without Retry-After; 0: 1 s. */
  uint64_t default_penalty_ns;
  /* Longest penalty window honoured (longer ones are clamped); 0: 60 s. */
  uint64_t max_penalty_ns;
  /*
   * Random draws per pick before the exact fallback; 0: 16. A pick skips
   * the draws when fewer than 2 * npeers / max_tries peers are eligible,
   * as they would likely all miss.
   */
  uint32_t max_tries;
} om_p2c_opts_t;

/* Words of a bitmap with one bit per peer (bit i%64 of word i/64). */
#define OM_P2C_BITMAP_WORDS(n) (((n) + 63) / 64)

/* Set peer i's bit in a bitmap of OM_P2C_BITMAP_WORDS(n) words. */
static inline void om_p2c_bitmap_set(uint64_t *bitmap, size_t i) {
  bitmap[i / 64] |= UINT64_C(1) << (i % 64);
}

/*
 * om_p2c_new: a selector over opts->npeers peers, all eligible, none in
 * flight, no samples. Returns 0 and sets *out, or OM_EINVAL (opts/out NULL,
 * a weight <= 0, NaN or infinite), OM_ENOPEERS (npeers == 0), OM_ERANGE
 * (more than INT32_MAX peers), OM_ENOMEM. On error *out is untouched and
 * nothing is allocated. opts and weights are copied, not kept.
 */
int om_p2c_new(const om_p2c_opts_t *opts, om_p2c_t **out);

/* om_p2c_free: release p. NULL is a no-op. */
void om_p2c_free(om_p2c_t *p);

/* om_p2c_size: the number of peers. */
size_t om_p2c_size(const om_p2c_t *p);

/*
 * om_p2c_pick: choose a peer for the next request; *out gets its index.
 * Only peers that are eligible and not in exclude are candidates. exclude
 * is NULL or a bitmap of OM_P2C_BITMAP_WORDS(size) words (borrowed; bits
 * past size are ignored). rng is the caller's generator (advanced). now_ns
 * is used for the Retry-After penalties only. One candidate: that one.
 * Returns 0, or OM_ENOPEERS when no peer is a candidate (*out untouched).
 * A pick changes nothing in p: call om_p2c_start when the request starts.
 */
int om_p2c_pick(const om_p2c_t *p, om_rng_t *rng, const uint64_t *exclude,
                uint64_t now_ns, uint32_t *out);

/* A filter for om_p2c_pick_among: nonzero when peer i may be chosen. */
typedef int (*om_p2c_accept_fn)(void *ud, uint32_t i);

/*
 * om_p2c_pick_among: om_p2c_pick over a subset given as a list: the
 * candidates are the eligible peers of cand[0..n) (indices; NULL: every
 * peer 0..n-1, n clamped to the size) that accept (NULL: all) lets
 * through. The two draws are uniform over the list, so a pick costs two
 * looks whatever the size of the list or of the peer set; when the
 * bounded draws keep missing, an exact scan of the list (O(n)) draws
 * among the accepted ones. accept must give the same answer for a peer
 * throughout one pick. Returns 0 with *out, or OM_ENOPEERS when no
 * candidate is accepted (*out untouched). Changes nothing in p.
 */
int om_p2c_pick_among(const om_p2c_t *p, om_rng_t *rng, const uint32_t *cand,
                      size_t n, om_p2c_accept_fn accept, void *ud,
                      uint64_t now_ns, uint32_t *out);

/*
 * om_p2c_set_eligible: mark peer i eligible (nonzero) or not (0), e.g. when
 * its circuit opens or closes. In-flight counts and estimates are kept.
 * Returns 0 or OM_ERANGE (i out of range, nothing changed).
 */
int om_p2c_set_eligible(om_p2c_t *p, size_t i, int eligible);

/* om_p2c_is_eligible: 1 or 0; 0 for i out of range. */
int om_p2c_is_eligible(const om_p2c_t *p, size_t i);

/* om_p2c_eligible_count: how many peers are eligible. */
size_t om_p2c_eligible_count(const om_p2c_t *p);

/*
 * om_p2c_start: a request to peer i started (in flight + 1). Returns 0 or
 * OM_ERANGE (i out of range; nothing changed).
 */
int om_p2c_start(om_p2c_t *p, size_t i);

/*
 * om_p2c_finish: a request to peer i ended after latency_ns, at now_ns.
 * In flight - 1, and the latency feeds the peak EWMA; a failed request
 * (ok == 0) can raise the estimate but never lower it. Returns 0,
 * OM_ERANGE (i out of range) or OM_ESTATE (nothing in flight on i: a finish
 * without a start); on error nothing changed.
 */
int om_p2c_finish(om_p2c_t *p, size_t i, uint64_t latency_ns, int ok,
                  uint64_t now_ns);

/*
 * om_p2c_penalize: peer i answered 429 or 503 at now_ns with Retry-After
 * retry_after_ns (0 when absent: the default window). Until now + window
 * (clamped to max_penalty_ns) the peer's latency carries the remaining wait;
 * an earlier, longer window is kept. Returns 0 or OM_ERANGE (nothing
 * changed).
 */
int om_p2c_penalize(om_p2c_t *p, size_t i, uint64_t retry_after_ns,
                    uint64_t now_ns);

/* om_p2c_inflight: requests in flight on peer i; 0 for i out of range. */
uint32_t om_p2c_inflight(const om_p2c_t *p, size_t i);

/*
 * om_p2c_latency_ns: the latency a pick at now_ns uses for peer i (EWMA
 * estimate plus remaining penalty), for metrics and tests; 0 out of range.
 */
double om_p2c_latency_ns(const om_p2c_t *p, size_t i, uint64_t now_ns);

#endif /* OM_P2C_H */
