/*
 * bench_selection.c: the cost of one selection decision.
 *
 *   p2c_pick_64                  two candidates among 64 peers (8 with an
 *                                open circuit), cost from inflight and EWMA
 *   rendezvous_pick_{8,64,512}   equal weights, key hashing included
 *   rendezvous_pick_weighted_64  mixed weights (5 distinct values, the usual
 *                                shape: a few capacity classes)
 *   rendezvous_pick_distinct_weights_64  every weight different (worst case)
 *   key_hash                     baseline: XXH3 of the key alone
 *   rendezvous_best_{16,4096,10000}  a keyed call's choice inside a
 *                                subset of every peer (best_hash, key
 *                                hashed once, as the proxy does)
 *   rendezvous_best_half_4096    the same inside a listed half of them
 *   rendezvous_rank_4096         the full rank (what retries walked before
 *                                best_hash: the reference for the above)
 *
 * Each figure is the median of ROUNDS rounds after a warm-up round, in
 * nanoseconds per decision.
 */
#include "om_bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "om_hash.h"
#include "om_p2c.h"
#include "om_rendezvous.h"
#include "om_rng.h"

#define ROUNDS 9
#define NKEYS 4096 /* a power of two */

static char keys[NKEYS][24];
static size_t key_len[NKEYS];

static void make_keys(void) {
  for (int i = 0; i < NKEYS; i++)
    key_len[i] = (size_t)snprintf(keys[i], sizeof keys[i], "user-%d", i * 7919);
}

/* weighted: 0 equal, 1 five weight classes, 2 every weight distinct */
static om_rendezvous_t *make_rendezvous(size_t n, int weighted) {
  static char ids[512][48];
  om_rendezvous_peer_t peers[512];
  om_rendezvous_opts_t opts = {0};
  om_rendezvous_t *r = NULL;
  for (size_t i = 0; i < n; i++) {
    snprintf(ids[i], sizeof ids[i], "10.0.%zu.%zu:80", i / 256, i % 256);
    peers[i].id = ids[i];
    peers[i].id_len = 0;
    peers[i].weight = weighted == 0   ? 1.0
                      : weighted == 1 ? (double)(1 + i % 5) * 0.5
                      : weighted == 3 ? (double)(1 + i % 16)
                                      : 1.0 + (double)i / 64.0;
  }
  opts.peers = peers;
  opts.npeers = n;
  if (om_rendezvous_new(&opts, &r) != 0) {
    fprintf(stderr, "om_rendezvous_new failed\n");
    exit(1);
  }
  return r;
}

static double bench_rendezvous(const om_rendezvous_t *r, long iters) {
  double v[ROUNDS];
  uint64_t sink = 0;
  for (int round = -1; round < ROUNDS; round++) {
    uint64_t t0 = om_bench_now_ns();
    for (long i = 0; i < iters; i++) {
      size_t k = (size_t)i & (NKEYS - 1);
      sink += om_rendezvous_pick(r, keys[k], key_len[k]);
    }
    if (round >= 0)
      v[round] = (double)(om_bench_now_ns() - t0) / (double)iters;
  }
  OM_BENCH_SINK(sink);
  return om_bench_median(v, ROUNDS);
}

static double bench_key_hash(long iters) {
  double v[ROUNDS];
  uint64_t sink = 0;
  for (int round = -1; round < ROUNDS; round++) {
    uint64_t t0 = om_bench_now_ns();
    for (long i = 0; i < iters; i++) {
      size_t k = (size_t)i & (NKEYS - 1);
      sink += om_hash(keys[k], key_len[k], 0);
    }
    if (round >= 0)
      v[round] = (double)(om_bench_now_ns() - t0) / (double)iters;
  }
  OM_BENCH_SINK(sink);
  return om_bench_median(v, ROUNDS);
}

static double bench_p2c(long iters) {
  om_p2c_opts_t opts = {0};
  om_p2c_t *p = NULL;
  om_rng_t rng, load;
  double v[ROUNDS];
  uint64_t sink = 0, now = UINT64_C(1000000000);

  opts.npeers = 64;
  if (om_p2c_new(&opts, &p) != 0) {
    fprintf(stderr, "om_p2c_new failed\n");
    exit(1);
  }
  /* A loaded, realistic state: varied in-flight counts and latencies, a few
   * Retry-After penalties, and 8 peers with an open circuit. */
  om_rng_seed(&load, 7);
  for (size_t i = 0; i < 64; i++) {
    uint32_t in = om_rng_below(&load, 8);
    for (uint32_t j = 0; j < in + 1; j++)
      om_p2c_start(p, i);
    om_p2c_finish(p, i, UINT64_C(5000000) + om_rng_below(&load, 50000000), 1,
                  now);
    if (i % 16 == 3)
      om_p2c_penalize(p, i, UINT64_C(2000000000), now);
    if (i % 8 == 5)
      om_p2c_set_eligible(p, i, 0);
  }
  om_rng_seed(&rng, 42);
  for (int round = -1; round < ROUNDS; round++) {
    uint64_t t0 = om_bench_now_ns();
    for (long i = 0; i < iters; i++) {
      uint32_t pick = 0;
      om_p2c_pick(p, &rng, NULL, now + (uint64_t)i, &pick);
      sink += pick;
    }
    if (round >= 0)
      v[round] = (double)(om_bench_now_ns() - t0) / (double)iters;
  }
  OM_BENCH_SINK(sink);
  om_p2c_free(p);
  return om_bench_median(v, ROUNDS);
}

/* n peers "peer-<i>" with equal weights (no 512-peer cap). */
static om_rendezvous_t *make_fleet(size_t n) {
  om_rendezvous_peer_t *peers = calloc(n, sizeof *peers);
  char(*ids)[32] = calloc(n, sizeof *ids);
  om_rendezvous_opts_t opts = {0};
  om_rendezvous_t *r = NULL;
  if (peers == NULL || ids == NULL)
    exit(1);
  for (size_t i = 0; i < n; i++) {
    snprintf(ids[i], sizeof ids[i], "peer-%zu", i);
    peers[i].id = ids[i];
    peers[i].weight = 1.0;
  }
  opts.peers = peers;
  opts.npeers = n;
  if (om_rendezvous_new(&opts, &r) != 0)
    exit(1);
  free(peers);
  free(ids);
  return r;
}

/* best_hash over cand (NULL: all n), or the full rank when rank != NULL */
static double bench_best(const om_rendezvous_t *r, const uint32_t *cand,
                         size_t n, uint32_t *rank, long iters) {
  double v[ROUNDS];
  uint64_t sink = 0;
  for (int round = -1; round < ROUNDS; round++) {
    uint64_t t0 = om_bench_now_ns();
    for (long i = 0; i < iters; i++) {
      size_t k = (size_t)i & (NKEYS - 1);
      uint64_t kh = om_rendezvous_key_hash(r, keys[k], key_len[k]);
      if (rank != NULL) {
        om_rendezvous_rank_hash(r, kh, rank, n);
        sink += rank[0];
      } else {
        sink += om_rendezvous_best_hash(r, kh, cand, n, NULL, NULL);
      }
    }
    if (round >= 0)
      v[round] = (double)(om_bench_now_ns() - t0) / (double)iters;
  }
  OM_BENCH_SINK(sink);
  return om_bench_median(v, ROUNDS);
}

static void bench_fleet(void) {
  static const size_t sizes[] = {16, 4096, 10000};
  static const char *names[] = {"rendezvous_best_16", "rendezvous_best_4096",
                                "rendezvous_best_10000"};
  uint32_t *buf = malloc(10000 * sizeof *buf);
  om_rendezvous_t *r;
  if (buf == NULL)
    exit(1);
  for (int s = 0; s < 3; s++) {
    r = make_fleet(sizes[s]);
    om_bench_report(
        names[s],
        bench_best(r, NULL, sizes[s], NULL, 4000000 / (long)sizes[s] + 1000),
        "ns");
    if (sizes[s] == 4096) {
      for (uint32_t i = 0; i < 2048; i++)
        buf[i] = 2 * i + 1;
      om_bench_report("rendezvous_best_half_4096",
                      bench_best(r, buf, 2048, NULL, 2000), "ns");
      om_bench_report("rendezvous_rank_4096",
                      bench_best(r, NULL, 4096, buf, 300), "ns");
    }
    om_rendezvous_free(r);
  }
  free(buf);
}

int main(void) {
  static const size_t sizes[] = {8, 64, 512};
  static const char *names[] = {"rendezvous_pick_8", "rendezvous_pick_64",
                                "rendezvous_pick_512"};
  om_rendezvous_t *r;

  make_keys();
  om_bench_report("key_hash", bench_key_hash(2000000), "ns");
  om_bench_report("p2c_pick_64", bench_p2c(4000000), "ns");
  for (int s = 0; s < 3; s++) {
    r = make_rendezvous(sizes[s], 0);
    om_bench_report(names[s], bench_rendezvous(r, 20000000 / (long)sizes[s]),
                    "ns");
    om_rendezvous_free(r);
  }
  r = make_rendezvous(64, 1);
  om_bench_report("rendezvous_pick_weighted_64", bench_rendezvous(r, 300000),
                  "ns");
  om_rendezvous_free(r);
  r = make_rendezvous(64, 3);
  om_bench_report("rendezvous_pick_16_weights_64", bench_rendezvous(r, 300000),
                  "ns");
  om_rendezvous_free(r);
  r = make_rendezvous(64, 2);
  om_bench_report("rendezvous_pick_distinct_weights_64",
                  bench_rendezvous(r, 300000), "ns");
  om_rendezvous_free(r);
  bench_fleet();
  return 0;
}
