/*
 * test_p2c.c: power of two choices. Cost order, peak EWMA, Retry-After
 * penalty, eligibility and exclusions, the bounded fallback, fair ties,
 * and a load simulation against random choice.
 */
#include "om_test.h"

#include <math.h>
#include <string.h>

#include "om_errno.h"
#include "om_p2c.h"
#include "om_rng.h"

#define MS UINT64_C(1000000)
#define SEC UINT64_C(1000000000)

static om_p2c_t *make(size_t n, const double *weights) {
  om_p2c_opts_t opts = {0};
  om_p2c_t *p = NULL;
  opts.npeers = n;
  opts.weights = weights;
  assert_int_equal(om_p2c_new(&opts, &p), 0);
  assert_non_null(p);
  return p;
}

static uint32_t pick(const om_p2c_t *p, om_rng_t *rng, const uint64_t *ex,
                     uint64_t now) {
  uint32_t out = UINT32_MAX;
  assert_int_equal(om_p2c_pick(p, rng, ex, now, &out), 0);
  OM_ASSERT_CMP(out, <, om_p2c_size(p));
  return out;
}

static void rejects_bad_input(void **state) {
  om_p2c_opts_t opts = {0};
  om_p2c_t *p = (om_p2c_t *)&opts; /* a canary: never written on error */
  double w[3] = {1, 1, 1};
  const double bad[] = {0.0, -2.0, NAN, INFINITY};
  (void)state;
  assert_int_equal(om_p2c_new(NULL, &p), OM_EINVAL);
  assert_int_equal(om_p2c_new(&opts, NULL), OM_EINVAL);
  assert_int_equal(om_p2c_new(&opts, &p), OM_ENOPEERS);
  opts.npeers = 3;
  opts.weights = w;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    w[2] = bad[i];
    assert_int_equal(om_p2c_new(&opts, &p), OM_EINVAL);
  }
  assert_ptr_equal(p, (om_p2c_t *)&opts);
  om_p2c_free(NULL);
}

static void construction_fails_cleanly(void **state) {
  om_p2c_opts_t opts = {0};
  int n;
  (void)state;
  opts.npeers = 200;
  for (n = 0;; n++) {
    om_p2c_t *p = NULL;
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_p2c_new(&opts, &p);
    om_test_alloc_reset();
    if (rc == 0) {
      assert_int_equal(om_p2c_size(p), 200);
      assert_int_equal(om_p2c_eligible_count(p), 200);
      om_p2c_free(p);
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    assert_null(p);
  }
  assert_int_equal(n, 3);
}

static void one_or_zero_candidates(void **state) {
  om_p2c_t *p = make(1, NULL);
  om_rng_t rng;
  uint32_t out = 77;
  (void)state;
  om_rng_seed(&rng, 1);
  for (int i = 0; i < 100; i++)
    assert_int_equal(pick(p, &rng, NULL, 0), 0);
  assert_int_equal(om_p2c_set_eligible(p, 0, 0), 0);
  assert_int_equal(om_p2c_pick(p, &rng, NULL, 0, &out), OM_ENOPEERS);
  assert_int_equal(out, 77);
  assert_int_equal(om_p2c_set_eligible(p, 1, 1), OM_ERANGE);
  om_p2c_free(p);
}

static void eligibility_and_exclusions(void **state) {
  om_p2c_t *p = make(100, NULL);
  uint64_t ex[OM_P2C_BITMAP_WORDS(100)];
  om_rng_t rng;
  uint32_t out;
  (void)state;
  om_rng_seed(&rng, 2);
  /* Open circuits on every third peer; idempotent marking. */
  for (size_t i = 0; i < 100; i += 3) {
    assert_int_equal(om_p2c_set_eligible(p, i, 0), 0);
    assert_int_equal(om_p2c_set_eligible(p, i, 0), 0);
  }
  assert_int_equal(om_p2c_eligible_count(p), 66);
  assert_false(om_p2c_is_eligible(p, 3));
  assert_true(om_p2c_is_eligible(p, 4));
  assert_false(om_p2c_is_eligible(p, 100));
  /* A retry excludes the peers it tried. */
  memset(ex, 0, sizeof ex);
  for (size_t i = 1; i < 100; i += 2)
    om_p2c_bitmap_set(ex, i);
  ex[1] |= UINT64_C(1) << 63; /* bits past the last peer are ignored */
  for (int i = 0; i < 5000; i++) {
    uint32_t x = pick(p, &rng, ex, 0);
    OM_ASSERT_CMP(x % 3, !=, 0);
    OM_ASSERT_CMP(x % 2, ==, 0);
  }
  /* Everything excluded or open: no peers. */
  memset(ex, 0xff, sizeof ex);
  assert_int_equal(om_p2c_pick(p, &rng, ex, 0, &out), OM_ENOPEERS);
  for (size_t i = 0; i < 100; i++)
    om_p2c_set_eligible(p, i, 0);
  assert_int_equal(om_p2c_eligible_count(p), 0);
  assert_int_equal(om_p2c_pick(p, &rng, NULL, 0, &out), OM_ENOPEERS);
  /* A closed circuit makes the peer a candidate again. */
  om_p2c_set_eligible(p, 42, 1);
  assert_int_equal(pick(p, &rng, NULL, 0), 42);
  om_p2c_free(p);
}

/* Few candidates among many: random draws give up, the scan finds them. */
static void bounded_fallback(void **state) {
  om_p2c_t *p = make(64, NULL);
  uint64_t ex[1] = {0};
  long count[64] = {0};
  om_rng_t rng;
  (void)state;
  om_rng_seed(&rng, 3);
  for (size_t i = 0; i < 64; i++)
    om_p2c_set_eligible(p, i, i == 37);
  for (int i = 0; i < 10000; i++)
    assert_int_equal(pick(p, &rng, NULL, 0), 37);
  /* Three eligible, equal cost: each is chosen a third of the time (a
   * uniform pair and a fair tie-break). */
  om_p2c_set_eligible(p, 5, 1);
  om_p2c_set_eligible(p, 63, 1);
  for (int i = 0; i < 30000; i++)
    count[pick(p, &rng, NULL, 0)]++;
  OM_ASSERT_NEAR(count[5] / 30000.0, 1 / 3.0, 0.02);
  OM_ASSERT_NEAR(count[37] / 30000.0, 1 / 3.0, 0.02);
  OM_ASSERT_NEAR(count[63] / 30000.0, 1 / 3.0, 0.02);
  /* All 64 eligible but 63 excluded: the draws see only the excluded ones
   * and stop after max_tries; the scan returns the one left. */
  for (size_t i = 0; i < 64; i++)
    om_p2c_set_eligible(p, i, 1);
  ex[0] = ~(UINT64_C(1) << 11);
  for (int i = 0; i < 1000; i++)
    assert_int_equal(pick(p, &rng, ex, 0), 11);
  om_p2c_free(p);
}

static void lower_cost_wins(void **state) {
  static const double w[2] = {3.0, 1.0};
  om_p2c_t *p = make(2, NULL), *pw = make(2, w);
  om_rng_t rng;
  (void)state;
  om_rng_seed(&rng, 4);
  /* In flight: (3 + 1) x 30 ms against (0 + 1) x 30 ms. */
  for (int i = 0; i < 3; i++)
    om_p2c_start(p, 0);
  for (int i = 0; i < 200; i++)
    assert_int_equal(pick(p, &rng, NULL, 0), 1);
  assert_int_equal(om_p2c_inflight(p, 0), 3);
  /* Latency: peer 0 answers in 30 ms, peer 1 slows to 200 ms; with 3 in
   * flight peer 0 costs 120 ms against 200 ms. */
  om_p2c_start(p, 0);
  om_p2c_finish(p, 0, 30 * MS, 1, SEC);
  om_p2c_start(p, 1);
  om_p2c_finish(p, 1, 200 * MS, 1, SEC);
  for (int i = 0; i < 200; i++)
    assert_int_equal(pick(p, &rng, NULL, SEC), 0);
  /* Weights: 2 x 30 / 3 = 20 ms against 1 x 30 / 1 = 30 ms, compared as
   * 2 x 30 x 1 < 1 x 30 x 3. */
  om_p2c_start(pw, 0);
  for (int i = 0; i < 200; i++)
    assert_int_equal(pick(pw, &rng, NULL, 0), 0);
  /* Two in flight: 3 x 30 / 3 = 30 against 30, a tie. */
  om_p2c_start(pw, 0);
  {
    int zero = 0;
    for (int i = 0; i < 2000; i++)
      zero += pick(pw, &rng, NULL, 0) == 0;
    OM_ASSERT_NEAR(zero / 2000.0, 0.5, 0.05);
  }
  om_p2c_free(p);
  om_p2c_free(pw);
}

static void ties_are_broken_at_random(void **state) {
  om_p2c_t *p = make(2, NULL);
  om_rng_t rng;
  long zero = 0, runs = 0, longest = 0;
  uint32_t last = 2;
  (void)state;
  om_rng_seed(&rng, 5);
  for (int i = 0; i < 20000; i++) {
    uint32_t x = pick(p, &rng, NULL, 0);
    zero += x == 0;
    runs = x == last ? runs + 1 : 1;
    longest = runs > longest ? runs : longest;
    last = x;
  }
  OM_ASSERT_NEAR(zero / 20000.0, 0.5, 0.02);
  /* Not alternating or stuck either: the longest streak of a fair coin over
   * 20000 flips is about log2(20000) ~ 14. */
  assert_in_range(longest, 8, 30);
  om_p2c_free(p);
}

static void peak_ewma(void **state) {
  om_p2c_t *p = make(3, NULL);
  const double tol = 1e-6 * (double)MS;
  (void)state;
  /* No samples: the 30 ms default. */
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 0, 0), 30.0 * MS, tol);
  /* The first sample replaces the default, even a lower one. */
  om_p2c_start(p, 0);
  om_p2c_finish(p, 0, 5 * MS, 1, 1 * SEC);
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 0, 1 * SEC), 5.0 * MS, tol);
  /* A higher sample: up at once. */
  om_p2c_start(p, 0);
  om_p2c_finish(p, 0, 100 * MS, 1, 2 * SEC);
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 0, 2 * SEC), 100.0 * MS, tol);
  /* A lower sample at the same instant: no time has passed, no decay. */
  om_p2c_start(p, 0);
  om_p2c_finish(p, 0, 10 * MS, 1, 2 * SEC);
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 0, 2 * SEC), 100.0 * MS, tol);
  /* One time constant (10 s) later: 10 + 90 / e. */
  om_p2c_start(p, 0);
  om_p2c_finish(p, 0, 10 * MS, 1, 12 * SEC);
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 0, 12 * SEC),
                 (10.0 + 90.0 * exp(-1.0)) * MS, tol);
  /* Time going backwards counts as no time. */
  {
    double before = om_p2c_latency_ns(p, 0, 0);
    om_p2c_start(p, 0);
    om_p2c_finish(p, 0, 1 * MS, 1, 5 * SEC);
    OM_ASSERT_NEAR(om_p2c_latency_ns(p, 0, 0), before, tol);
  }
  /* Many lower samples converge towards them. */
  for (int i = 1; i <= 100; i++) {
    om_p2c_start(p, 0);
    om_p2c_finish(p, 0, 20 * MS, 1, 12 * SEC + (uint64_t)i * SEC);
  }
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 0, 0), 20.0 * MS, 0.01 * MS);
  /* Fast failures never lower the estimate (peer 1 starts from the prior,
   * peer 0's 20 ms); slow ones raise it. */
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 1, 1 * SEC), 20.0 * MS, 0.01 * MS);
  om_p2c_start(p, 1);
  om_p2c_finish(p, 1, 1 * MS, 0, 1 * SEC);
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 1, 1 * SEC), 20.0 * MS, 0.01 * MS);
  om_p2c_start(p, 1);
  om_p2c_finish(p, 1, 1 * MS, 0, 100 * SEC);
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 1, 100 * SEC), 20.0 * MS, 0.01 * MS);
  om_p2c_start(p, 1);
  om_p2c_finish(p, 1, 400 * MS, 0, 101 * SEC);
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 1, 101 * SEC), 400.0 * MS, tol);
  om_p2c_free(p);
}

/*
 * A peer without a sample looks like the average sampled peer. With a fixed
 * 30 ms default a new peer next to 1 ms peers would never be picked while
 * they had fewer than 30 requests in flight, and without picks it never
 * gets the sample that would lower its estimate: starved for good.
 */
static void new_peer_gets_its_share(void **state) {
  om_p2c_t *p = make(4, NULL);
  om_rng_t rng;
  const double tol = 1e-6 * (double)MS;
  size_t hits[4] = {0};
  (void)state;
  om_rng_seed(&rng, 7);
  for (size_t i = 0; i < 3; i++) { /* peers 0..2 answer in 1, 2, 3 ms */
    om_p2c_start(p, i);
    om_p2c_finish(p, i, (i + 1) * MS, 1, 1 * SEC);
  }
  /* peer 3 has no sample: the mean of the others, not 30 ms */
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 3, 1 * SEC), 2.0 * MS, tol);
  for (int k = 0; k < 4000; k++)
    hits[pick(p, &rng, NULL, 1 * SEC)]++;
  OM_TEST_NOTE("picks with nothing in flight: %zu %zu %zu %zu", hits[0],
               hits[1], hits[2], hits[3]);
  /* Pairs are uniform, the cheaper wins: peer 3 (2 ms) wins against peers 1
   * (tie: half) and 2, loses against 0: (0.5 + 1) / 3 of the pairs it is
   * in, half of all pairs: 1/4 of the picks. */
  OM_ASSERT_NEAR(hits[3] / 4000.0, 0.25, 0.04);
  /* Its first sample replaces the prior; the prior no longer counts it. */
  om_p2c_start(p, 3);
  om_p2c_finish(p, 3, 8 * MS, 1, 2 * SEC);
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 3, 2 * SEC), 8.0 * MS, tol);
  om_p2c_free(p);
  /* No sample anywhere: the configured default. */
  p = make(2, NULL);
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 1, 0), 30.0 * MS, tol);
  /* A fast failure as the first sample is no lower than the prior. */
  om_p2c_start(p, 0);
  om_p2c_finish(p, 0, 4 * MS, 1, 1 * SEC);
  om_p2c_start(p, 1);
  om_p2c_finish(p, 1, 1 * MS, 0, 1 * SEC);
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 1, 1 * SEC), 4.0 * MS, tol);
  om_p2c_free(p);
}

static void start_finish_misuse(void **state) {
  om_p2c_t *p = make(2, NULL);
  (void)state;
  assert_int_equal(om_p2c_start(p, 2), OM_ERANGE);
  assert_int_equal(om_p2c_finish(p, 2, MS, 1, 0), OM_ERANGE);
  assert_int_equal(om_p2c_finish(p, 0, MS, 1, 0), OM_ESTATE);
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 0, 0), 30.0 * MS, 1); /* unchanged */
  assert_int_equal(om_p2c_start(p, 0), 0);
  assert_int_equal(om_p2c_start(p, 0), 0);
  assert_int_equal(om_p2c_inflight(p, 0), 2);
  assert_int_equal(om_p2c_finish(p, 0, MS, 1, 0), 0);
  assert_int_equal(om_p2c_inflight(p, 0), 1);
  assert_int_equal(om_p2c_inflight(p, 9), 0);
  assert_int_equal(om_p2c_penalize(p, 9, SEC, 0), OM_ERANGE);
  OM_ASSERT_CMP(om_p2c_latency_ns(p, 9, 0), ==, 0);
  om_p2c_free(p);
}

static void retry_after_penalty_decays(void **state) {
  om_p2c_opts_t opts = {0};
  om_p2c_t *p = NULL;
  const double tol = 1e-3 * (double)MS;
  const uint64_t t = 50 * SEC;
  (void)state;
  opts.npeers = 2;
  opts.max_penalty_ns = 30 * SEC;
  assert_int_equal(om_p2c_new(&opts, &p), 0);
  /* Retry-After 2 s: the remaining wait adds to the 30 ms estimate and
   * falls linearly to nothing at the end of the window. */
  assert_int_equal(om_p2c_penalize(p, 0, 2 * SEC, t), 0);
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 0, t), 2030.0 * MS, tol);
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 0, t + SEC / 2), 1530.0 * MS, tol);
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 0, t + 2 * SEC), 30.0 * MS, tol);
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 0, t + 9 * SEC), 30.0 * MS, tol);
  /* A shorter, later Retry-After does not cut a longer window short. */
  om_p2c_penalize(p, 0, 2 * SEC, t);
  om_p2c_penalize(p, 0, SEC / 10, t + SEC);
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 0, t + SEC), 1030.0 * MS, tol);
  /* No Retry-After: the default 1 s window. Too long: clamped to 30 s. */
  om_p2c_penalize(p, 1, 0, t);
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 1, t), 1030.0 * MS, tol);
  om_p2c_penalize(p, 1, 3600 * SEC, t);
  OM_ASSERT_NEAR(om_p2c_latency_ns(p, 1, t), 30030.0 * MS, tol);
  /* Saturates rather than wrapping into the past. */
  om_p2c_penalize(p, 1, 3600 * SEC, UINT64_MAX - SEC);
  OM_ASSERT_CMP(om_p2c_latency_ns(p, 1, UINT64_MAX - SEC), >, 0.9 * SEC);
  om_p2c_free(p);
}

/*
 * A peer that rejects fast (429 after 1 ms) must not draw load: its
 * failures do not lower its estimate and its Retry-After penalizes it.
 */
static void fast_rejections_do_not_attract_load(void **state) {
  om_p2c_t *p = make(4, NULL);
  om_rng_t rng;
  long to_bad = 0, picks = 20000;
  uint64_t now = 0;
  (void)state;
  om_rng_seed(&rng, 6);
  for (long i = 0; i < picks; i++) {
    uint32_t x = pick(p, &rng, NULL, now);
    om_p2c_start(p, x);
    if (x == 0) { /* the bad peer: instant 429, Retry-After 1 s */
      to_bad++;
      om_p2c_finish(p, x, 1 * MS, 0, now + MS);
      om_p2c_penalize(p, x, SEC, now + MS);
    } else {
      om_p2c_finish(p, x, 30 * MS, 1, now + 30 * MS);
    }
    now += 5 * MS;
  }
  OM_TEST_NOTE("share of picks to the rejecting peer: %.4f",
               (double)to_bad / (double)picks);
  /* A fair share is 1/4; it gets at most a sliver as its windows end. */
  OM_ASSERT_CMP((double)to_bad / (double)picks, <, 0.05);
  om_p2c_free(p);
}

static void same_seed_same_choices(void **state) {
  om_p2c_t *p = make(50, NULL);
  om_rng_t a, b;
  (void)state;
  om_rng_seed(&a, 99);
  om_rng_seed(&b, 99);
  for (int i = 0; i < 1000; i++)
    assert_int_equal(pick(p, &a, NULL, 0), pick(p, &b, NULL, 0));
  om_p2c_free(p);
}

/*
 * 1,000,000 picks over 100 peers. Each pick starts a request that ends 100
 * picks later (unit work, 100 in flight, one per peer on average). The
 * figure is the highest in-flight count any peer ever reached.
 */
#define SIM_PEERS 100
#define SIM_PICKS 1000000
#define SIM_SPAN 100

static long simulate(int use_p2c, uint64_t seed) {
  om_p2c_t *p = make(SIM_PEERS, NULL);
  om_rng_t rng;
  uint32_t ring[SIM_SPAN], load[SIM_PEERS] = {0};
  long max = 0;
  om_rng_seed(&rng, seed);
  for (long i = 0; i < SIM_PICKS; i++) {
    uint64_t now = (uint64_t)i * MS;
    uint32_t x;
    if (i >= SIM_SPAN) {
      uint32_t done = ring[i % SIM_SPAN];
      assert_int_equal(om_p2c_finish(p, done, 10 * MS, 1, now), 0);
      load[done]--;
    }
    x = use_p2c ? pick(p, &rng, NULL, now) : om_rng_below(&rng, SIM_PEERS);
    assert_int_equal(om_p2c_start(p, x), 0);
    load[x]++;
    if (load[x] > max)
      max = load[x];
    ring[i % SIM_SPAN] = x;
  }
  for (uint32_t i = 0; i < SIM_PEERS; i++)
    assert_int_equal(om_p2c_inflight(p, i), load[i]);
  om_p2c_free(p);
  return max;
}

static void p2c_max_load_far_below_random(void **state) {
  long p2c = simulate(1, 7), random = simulate(0, 7);
  (void)state;
  OM_TEST_NOTE("max in-flight per peer: p2c %ld, random %ld", p2c, random);
  /* Theory (balls into bins, mean 1): random reaches ~ln n / ln ln n
   * above the mean over many rounds (here ~9), p2c ~ln ln n (here ~3). */
  OM_ASSERT_CMP(p2c * 2, <=, random);
  OM_ASSERT_CMP(p2c, <=, 4);
}

static int not_marked(void *ud, uint32_t i) {
  const unsigned char *marked = ud;
  return !marked[i];
}

/*
 * pick_among: only listed, eligible, accepted peers; uniform over them at
 * equal cost; the lower cost of a pair wins; the scan finds the last one
 * left when the draws keep missing; nothing accepted is OM_ENOPEERS.
 */
static void pick_among_a_list(void **state) {
  om_p2c_t *p = make(1000, NULL);
  uint32_t list[3] = {5, 500, 999}, out = 0;
  unsigned char marked[1000] = {0};
  long count[1000] = {0};
  om_rng_t rng;
  (void)state;
  om_rng_seed(&rng, 21);
  for (int i = 0; i < 30000; i++) {
    assert_int_equal(
        om_p2c_pick_among(p, &rng, list, 3, not_marked, marked, 0, &out), 0);
    count[out]++;
  }
  OM_ASSERT_CMP(count[5] + count[500] + count[999], ==, 30000);
  OM_ASSERT_NEAR(count[5] / 30000.0, 1 / 3.0, 0.02);
  OM_ASSERT_NEAR(count[500] / 30000.0, 1 / 3.0, 0.02);
  OM_ASSERT_NEAR(count[999] / 30000.0, 1 / 3.0, 0.02);
  /* a peer busier than the others is never chosen from the pair {it, x}
   * when the other is idle: with two listed it never wins */
  assert_int_equal(om_p2c_start(p, 500), 0);
  for (int i = 0; i < 1000; i++) {
    assert_int_equal(
        om_p2c_pick_among(p, &rng, list + 1, 2, NULL, NULL, 0, &out), 0);
    OM_ASSERT_CMP(out, ==, 999);
  }
  /* the whole set (NULL list), all marked but one: the scan finds it */
  memset(marked, 1, sizeof marked);
  marked[777] = 0;
  for (int i = 0; i < 100; i++) {
    assert_int_equal(
        om_p2c_pick_among(p, &rng, NULL, 1000, not_marked, marked, 0, &out), 0);
    OM_ASSERT_CMP(out, ==, 777);
  }
  /* ineligible counts as not accepted */
  assert_int_equal(om_p2c_set_eligible(p, 777, 0), 0);
  assert_int_equal(
      om_p2c_pick_among(p, &rng, NULL, 1000, not_marked, marked, 0, &out),
      OM_ENOPEERS);
  assert_int_equal(om_p2c_pick_among(p, &rng, list, 0, NULL, NULL, 0, &out),
                   OM_ENOPEERS);
  om_p2c_free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(rejects_bad_input),
      cmocka_unit_test(construction_fails_cleanly),
      cmocka_unit_test(one_or_zero_candidates),
      cmocka_unit_test(eligibility_and_exclusions),
      cmocka_unit_test(bounded_fallback),
      cmocka_unit_test(lower_cost_wins),
      cmocka_unit_test(ties_are_broken_at_random),
      cmocka_unit_test(peak_ewma),
      cmocka_unit_test(new_peer_gets_its_share),
      cmocka_unit_test(start_finish_misuse),
      cmocka_unit_test(retry_after_penalty_decays),
      cmocka_unit_test(fast_rejections_do_not_attract_load),
      cmocka_unit_test(same_seed_same_choices),
      cmocka_unit_test(pick_among_a_list),
      cmocka_unit_test(p2c_max_load_far_below_random),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
