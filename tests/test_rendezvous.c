/*
 * test_rendezvous.c: weighted rendezvous hashing, by its properties:
 * minimal disruption on add and remove, weighted shares, rank order,
 * validation, and allocation failure.
 */
#include "om_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_rendezvous.h"
#include "om_rng.h"

#define NKEYS 100000
#define MAXP 600

static char idbuf[MAXP][24];

/* Peers "peer-<i + first>" with the given weights (NULL: all 1). */
static om_rendezvous_t *build(size_t n, size_t first, const double *w) {
  om_rendezvous_peer_t peers[MAXP];
  om_rendezvous_opts_t opts = {0};
  om_rendezvous_t *r = NULL;
  OM_ASSERT_CMP(n, <=, MAXP);
  OM_ASSERT_CMP(n + first, <=, MAXP);
  for (size_t i = 0; i < n; i++) {
    snprintf(idbuf[i + first], sizeof idbuf[0], "peer-%zu", i + first);
    peers[i].id = idbuf[i + first];
    peers[i].id_len = 0;
    peers[i].weight = w != NULL ? w[i] : 1.0;
  }
  opts.peers = peers;
  opts.npeers = n;
  assert_int_equal(om_rendezvous_new(&opts, &r), 0);
  assert_non_null(r);
  return r;
}

static size_t key_of(long k, char *buf) {
  return (size_t)snprintf(buf, 32, "key-%ld", k);
}

/* The id of the peer key k goes to. */
static const char *owner(const om_rendezvous_t *r, long k) {
  char buf[32];
  size_t len = key_of(k, buf);
  return om_rendezvous_id(r, om_rendezvous_pick(r, buf, len), NULL);
}

static void rejects_bad_input(void **state) {
  om_rendezvous_peer_t peers[3] = {{"a", 0, 1.0}, {"b", 0, 2.0}, {"c", 0, 3.0}};
  om_rendezvous_opts_t opts = {peers, 3, 0};
  om_rendezvous_t *r = (om_rendezvous_t *)&opts; /* a canary: never written */
  const double bad[] = {0.0, -1.0, NAN, INFINITY, -INFINITY, -0.0};
  (void)state;

  assert_int_equal(om_rendezvous_new(NULL, &r), OM_EINVAL);
  assert_int_equal(om_rendezvous_new(&opts, NULL), OM_EINVAL);
  opts.npeers = 0;
  assert_int_equal(om_rendezvous_new(&opts, &r), OM_ENOPEERS);
  opts.npeers = 3;
  opts.peers = NULL;
  assert_int_equal(om_rendezvous_new(&opts, &r), OM_EINVAL);
  opts.peers = peers;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    peers[1].weight = bad[i];
    assert_int_equal(om_rendezvous_new(&opts, &r), OM_EINVAL);
  }
  peers[1].weight = 2.0;
  peers[2].id = NULL;
  assert_int_equal(om_rendezvous_new(&opts, &r), OM_EINVAL);
  peers[2].id = "";
  assert_int_equal(om_rendezvous_new(&opts, &r), OM_EINVAL);
  peers[2].id = "a"; /* duplicate of peers[0] */
  assert_int_equal(om_rendezvous_new(&opts, &r), OM_EDUPLICATE);
  /* Explicit lengths: "a" and "a\0x" differ; "a\0x" twice does not. */
  peers[2].id = "a\0x";
  peers[2].id_len = 3;
  r = NULL;
  assert_int_equal(om_rendezvous_new(&opts, &r), 0);
  om_rendezvous_free(r);
  peers[1].id = "a\0x";
  peers[1].id_len = 3;
  r = (om_rendezvous_t *)&opts;
  assert_int_equal(om_rendezvous_new(&opts, &r), OM_EDUPLICATE);
  assert_ptr_equal(r, (om_rendezvous_t *)&opts);
  om_rendezvous_free(NULL);
}

static void owns_copies_of_ids(void **state) {
  char a[8] = "alpha", b[8] = "beta";
  char nul[3] = {'x', '\0', 'y'};
  om_rendezvous_peer_t peers[3] = {{a, 0, 1.0}, {b, 0, 2.5}, {nul, 3, 1.0}};
  om_rendezvous_opts_t opts = {peers, 3, 0};
  om_rendezvous_t *r = NULL;
  size_t len = 0;
  (void)state;
  assert_int_equal(om_rendezvous_new(&opts, &r), 0);
  strcpy(a, "XXXXX");
  strcpy(b, "YYYY");
  nul[2] = 'z';
  assert_int_equal(om_rendezvous_size(r), 3);
  assert_string_equal(om_rendezvous_id(r, 0, &len), "alpha");
  assert_int_equal(len, 5);
  assert_string_equal(om_rendezvous_id(r, 1, NULL), "beta");
  assert_memory_equal(om_rendezvous_id(r, 2, &len), "x\0y", 4);
  assert_int_equal(len, 3);
  assert_null(om_rendezvous_id(r, 3, &len));
  OM_ASSERT_CMP(om_rendezvous_weight(r, 1), ==, 2.5);
  OM_ASSERT_CMP(om_rendezvous_weight(r, 3), ==, 0);
  om_rendezvous_free(r);
}

static void deterministic_and_seeded(void **state) {
  om_rendezvous_t *r1 = build(20, 0, NULL), *r2 = build(20, 0, NULL);
  om_rendezvous_peer_t peers[20];
  om_rendezvous_opts_t opts = {peers, 20, 12345};
  om_rendezvous_t *r3 = NULL;
  int differ = 0;
  (void)state;
  for (size_t i = 0; i < 20; i++) {
    peers[i].id = idbuf[i];
    peers[i].id_len = 0;
    peers[i].weight = 1.0;
  }
  assert_int_equal(om_rendezvous_new(&opts, &r3), 0);
  for (long k = 0; k < 2000; k++) {
    assert_string_equal(owner(r1, k), owner(r2, k));
    differ += strcmp(owner(r1, k), owner(r3, k)) != 0;
  }
  OM_ASSERT_CMP(differ, >, 1500); /* another seed, another mapping */
  /* Key hashing is XXH3 with the seed; _hash and plain agree. */
  assert_int_equal(
      om_rendezvous_pick(r1, "k", 1),
      om_rendezvous_pick_hash(r1, om_rendezvous_key_hash(r1, "k", 1)));
  assert_int_equal(om_rendezvous_pick(r1, NULL, 0),
                   om_rendezvous_pick(r1, "", 0));
  om_rendezvous_free(r1);
  om_rendezvous_free(r2);
  om_rendezvous_free(r3);
}

/* Share of NKEYS keys per peer, checked against w / sum(w). */
static void check_shares(size_t n, const double *w, double tol) {
  om_rendezvous_t *r = build(n, 0, w);
  static long count[MAXP];
  double sum = 0, worst = 0;
  char buf[32];
  memset(count, 0, sizeof count);
  for (size_t i = 0; i < n; i++)
    sum += w != NULL ? w[i] : 1.0;
  for (long k = 0; k < NKEYS; k++) {
    size_t len = key_of(k, buf);
    count[om_rendezvous_pick(r, buf, len)]++;
  }
  for (size_t i = 0; i < n; i++) {
    double want = (w != NULL ? w[i] : 1.0) / sum;
    double got = (double)count[i] / NKEYS;
    if (fabs(got - want) > worst)
      worst = fabs(got - want);
    OM_ASSERT_NEAR(got, want, tol);
  }
  OM_TEST_NOTE("shares over %zu peers: worst absolute error %.4f", n, worst);
  om_rendezvous_free(r);
}

static void equal_shares(void **state) {
  (void)state;
  check_shares(1, NULL, 0);
  check_shares(7, NULL, 0.02);
  check_shares(64, NULL, 0.02);
}

static void weighted_shares(void **state) {
  static const double w1[] = {1, 2, 3, 4};
  static const double w2[] = {1, 1, 1, 10};
  static const double w3[] = {0.1, 0.2, 5};
  static const double w4[] = {100, 1, 1, 1, 1};
  static const double w5[] = {1e-3, 1, 1000};
  double w6[30], w7[16], w8[200];
  om_rng_t rng;
  (void)state;
  check_shares(4, w1, 0.02);
  check_shares(4, w2, 0.02);
  check_shares(3, w3, 0.02);
  check_shares(5, w4, 0.02);
  check_shares(3, w5, 0.02);
  /* Many peers per weight class (the class-by-class path). */
  for (size_t i = 0; i < 30; i++)
    w6[i] = (double)(1 + i % 3);
  check_shares(30, w6, 0.02);
  /* Every weight distinct (the peer-by-peer path). */
  om_rng_seed(&rng, 9);
  for (size_t i = 0; i < 16; i++)
    w7[i] = 0.5 + 4 * om_rng_double(&rng);
  check_shares(16, w7, 0.02);
  /* Many peers, 4 classes, small shares: a tighter absolute tolerance. */
  for (size_t i = 0; i < 200; i++)
    w8[i] = i % 4 == 0 ? 0.25 : i % 4 == 1 ? 1 : i % 4 == 2 ? 2 : 8;
  check_shares(200, w8, 0.005);
}

/*
 * Adding one peer moves about w_new / sum(w) of the keys, every one of them
 * to the new peer. Old peers are peer-0..n-1, the new one peer-n.
 */
static void check_add(size_t n, const double *w, double w_new) {
  double wn[MAXP], sum = w_new;
  om_rendezvous_t *before, *after;
  long moved = 0;
  for (size_t i = 0; i < n; i++) {
    wn[i] = w != NULL ? w[i] : 1.0;
    sum += wn[i];
  }
  wn[n] = w_new;
  before = build(n, 0, wn);
  after = build(n + 1, 0, wn);
  for (long k = 0; k < NKEYS; k++) {
    const char *a = owner(before, k), *b = owner(after, k);
    if (strcmp(a, b) != 0) {
      moved++;
      assert_string_equal(b, idbuf[n]); /* only to the new peer */
    }
  }
  OM_TEST_NOTE("add to %zu peers: moved %.4f, expected %.4f", n,
               (double)moved / NKEYS, w_new / sum);
  OM_ASSERT_NEAR((double)moved / NKEYS, w_new / sum, 0.01);
  om_rendezvous_free(before);
  om_rendezvous_free(after);
}

static void add_moves_one_share_to_new_peer(void **state) {
  static const double w[] = {1, 2, 3, 4};
  double w30[30];
  (void)state;
  check_add(1, NULL, 1.0);
  check_add(10, NULL, 1.0);  /* 1/11 */
  check_add(100, NULL, 1.0); /* 1/101 */
  check_add(4, w, 3.0);      /* 3/13 */
  check_add(4, w, 0.5);      /* a new weight class */
  for (size_t i = 0; i < 30; i++)
    w30[i] = (double)(1 + i % 3);
  check_add(30, w30, 2.0); /* joins an existing class */
}

/*
 * Removing a peer moves only its keys, and each goes to the peer that came
 * second in the old rank: that is why retries walk the rank.
 */
static void check_remove(size_t n, const double *w, size_t gone) {
  om_rendezvous_peer_t peers[MAXP];
  om_rendezvous_opts_t opts = {0};
  om_rendezvous_t *before = build(n, 0, w), *after = NULL;
  long moved = 0;
  char buf[32];
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (i == gone)
      continue;
    peers[m].id = idbuf[i];
    peers[m].id_len = 0;
    peers[m].weight = w != NULL ? w[i] : 1.0;
    m++;
  }
  opts.peers = peers;
  opts.npeers = m;
  assert_int_equal(om_rendezvous_new(&opts, &after), 0);
  for (long k = 0; k < NKEYS / 4; k++) {
    size_t len = key_of(k, buf);
    uint32_t rank[2];
    const char *a = owner(before, k), *b = owner(after, k);
    if (strcmp(a, idbuf[gone]) != 0) {
      assert_string_equal(a, b);
      continue;
    }
    moved++;
    assert_int_equal(om_rendezvous_rank(before, buf, len, rank, 2), 2);
    assert_string_equal(b, om_rendezvous_id(before, rank[1], NULL));
  }
  OM_ASSERT_CMP(moved, >, 0);
  om_rendezvous_free(before);
  om_rendezvous_free(after);
}

static void remove_moves_only_its_keys(void **state) {
  static const double w[] = {1, 2, 3, 4, 2, 2, 1};
  double w40[40], w12[12];
  (void)state;
  check_remove(10, NULL, 0);
  check_remove(10, NULL, 9);
  check_remove(7, w, 3); /* the only peer of its weight: a class goes away */
  check_remove(7, w, 4);
  for (size_t i = 0; i < 40; i++)
    w40[i] = (double)(1 + i % 4);
  check_remove(40, w40, 17);
  for (size_t i = 0; i < 12; i++)
    w12[i] = 1.0 + (double)i / 7.0;
  check_remove(12, w12, 5);
}

/* rank is a permutation, rank[0] == pick, and shorter ranks are prefixes. */
static void check_rank(size_t n, const double *w, long keys) {
  om_rendezvous_t *r = build(n, 0, w);
  uint32_t *full = malloc(n * sizeof *full), *part = malloc(n * sizeof *part);
  unsigned char *seen = malloc(n);
  char buf[32];
  assert_non_null(full);
  assert_non_null(part);
  assert_non_null(seen);
  for (long k = 0; k < keys; k++) {
    size_t len = key_of(k, buf), kk = (size_t)k % n + 1;
    assert_int_equal(om_rendezvous_rank(r, buf, len, full, n + 5), (int)n);
    memset(seen, 0, n);
    for (size_t i = 0; i < n; i++) {
      OM_ASSERT_CMP(full[i], <, n);
      assert_false(seen[full[i]]);
      seen[full[i]] = 1;
    }
    assert_int_equal(full[0], om_rendezvous_pick(r, buf, len));
    assert_int_equal(om_rendezvous_rank(r, buf, len, part, kk), (int)kk);
    assert_memory_equal(part, full, kk * sizeof *part);
  }
  assert_int_equal(om_rendezvous_rank(r, buf, 3, part, 0), 0);
  free(full);
  free(part);
  free(seen);
  om_rendezvous_free(r);
}

static void rank_is_the_retry_order(void **state) {
  double w[300];
  om_rng_t rng;
  (void)state;
  om_rng_seed(&rng, 4);
  check_rank(1, NULL, 10);
  check_rank(5, NULL, 500);
  check_rank(64, NULL, 300);  /* scratch on the stack */
  check_rank(300, NULL, 100); /* scratch allocated */
  for (size_t i = 0; i < 300; i++)
    w[i] = (double)(1 + i % 5);
  check_rank(5, w, 500);
  check_rank(64, w, 300);
  check_rank(300, w, 100);
  for (size_t i = 0; i < 300; i++)
    w[i] = 0.1 + om_rng_double(&rng);
  check_rank(9, w, 500);
  check_rank(100, w, 100);
}

/*
 * pick settles most weighted decisions with bounds instead of logarithms;
 * over many keys and shapes it must agree with rank, which always computes
 * the exact order.
 */
static void pick_bounds_agree_with_exact_order(void **state) {
  double w[64];
  om_rng_t rng;
  (void)state;
  om_rng_seed(&rng, 5);
  for (int shape = 0; shape < 4; shape++) {
    om_rendezvous_t *r;
    char buf[32];
    for (size_t i = 0; i < 64; i++)
      w[i] = shape == 0   ? (double)(1 + i % 2)
             : shape == 1 ? (double)(1 + i % 8)
             : shape == 2 ? 1.0 + (double)i / 64.0
                          : exp(8 * om_rng_double(&rng)); /* 1 .. 3000 */
    r = build(64, 0, w);
    for (long k = 0; k < 20000; k++) {
      size_t len = key_of(k, buf);
      uint32_t first;
      assert_int_equal(om_rendezvous_rank(r, buf, len, &first, 1), 1);
      assert_int_equal(first, om_rendezvous_pick(r, buf, len));
    }
    om_rendezvous_free(r);
  }
}

static void extreme_weights(void **state) {
  static const double w[] = {5e-324, 1.0, 1e-300, 1e300};
  om_rendezvous_t *r = build(4, 0, w);
  uint32_t rank[4];
  (void)state;
  /* The weight 1e300 takes every key; the subnormal one is never first. */
  for (long k = 0; k < 1000; k++)
    assert_string_equal(owner(r, k), idbuf[3]);
  assert_int_equal(om_rendezvous_rank(r, "k", 1, rank, 4), 4);
  assert_int_equal(rank[0], 3);
  om_rendezvous_free(r);
}

static void construction_fails_cleanly(void **state) {
  om_rendezvous_peer_t peers[100];
  om_rendezvous_opts_t opts = {peers, 100, 0};
  int n;
  (void)state;
  for (int shape = 0; shape < 3; shape++) {
    for (size_t i = 0; i < 100; i++) {
      snprintf(idbuf[i], sizeof idbuf[0], "peer-%zu", i);
      peers[i].id = idbuf[i];
      peers[i].id_len = 0;
      peers[i].weight = shape == 0   ? 1
                        : shape == 1 ? (double)(1 + i % 3)
                                     : 1 + (double)i;
    }
    for (n = 0;; n++) {
      om_rendezvous_t *r = NULL;
      int rc;
      om_test_fail_alloc_after(n);
      rc = om_rendezvous_new(&opts, &r);
      om_test_alloc_reset();
      if (rc == 0) {
        assert_int_equal(om_rendezvous_pick(r, "x", 1),
                         om_rendezvous_pick(r, "x", 1));
        om_rendezvous_free(r);
        break;
      }
      assert_int_equal(rc, OM_ENOMEM);
      assert_null(r);
    }
    OM_ASSERT_CMP(n, >=, 6);
  }
  /* A duplicate found after allocating still frees everything. */
  peers[50].id = idbuf[10];
  {
    om_rendezvous_t *r = NULL;
    assert_int_equal(om_rendezvous_new(&opts, &r), OM_EDUPLICATE);
    assert_null(r);
  }
}

static void rank_fails_cleanly(void **state) {
  om_rendezvous_t *r = build(100, 0, NULL);
  uint32_t out[3] = {7, 7, 7};
  (void)state;
  om_test_fail_alloc_after(0);
  assert_int_equal(om_rendezvous_rank(r, "k", 1, out, 3), OM_ENOMEM);
  om_test_alloc_reset();
  assert_int_equal(out[0], 7);
  assert_int_equal(out[2], 7);
  assert_int_equal(om_rendezvous_rank(r, "k", 1, out, 3), 3);
  om_rendezvous_free(r);
}

/* Filters for best_hash: skip the peers marked in a byte map. */
static int not_marked(void *ud, uint32_t i) {
  const unsigned char *marked = ud;
  return !marked[i];
}

/*
 * best_hash walks the rank restricted to a subset: over a random subset
 * (in random order), calling it again with the peers it returned
 * excluded yields exactly the full rank with the other peers filtered
 * out, for equal weights, a few weight classes and all-distinct weights.
 */
static void check_best(size_t n, const double *w, long keys, om_rng_t *rng) {
  om_rendezvous_t *r = build(n, 0, w);
  uint32_t *full = malloc(n * sizeof *full), *cand = malloc(n * sizeof *cand);
  unsigned char *in = malloc(n), *marked = malloc(n);
  char buf[32];
  assert_non_null(full);
  assert_non_null(cand);
  assert_non_null(in);
  assert_non_null(marked);
  for (long k = 0; k < keys; k++) {
    size_t len = key_of(k, buf), nc = 0, walked = 0;
    uint64_t kh = om_rendezvous_key_hash(r, buf, len);
    int whole = k % 4 == 0; /* NULL: every peer */
    assert_int_equal(om_rendezvous_rank_hash(r, kh, full, n), (int)n);
    for (size_t i = 0; i < n; i++) {
      in[i] = whole || om_rng_below(rng, 3) != 0;
      if (in[i])
        cand[nc++] = (uint32_t)i;
    }
    for (size_t i = nc; i > 1; i--) { /* any order: the answer is the same */
      size_t j = om_rng_below(rng, (uint32_t)i);
      uint32_t t = cand[i - 1];
      cand[i - 1] = cand[j];
      cand[j] = t;
    }
    memset(marked, 0, n);
    for (size_t f = 0; f < n; f++) {
      uint32_t got;
      if (!in[full[f]])
        continue;
      got = om_rendezvous_best_hash(r, kh, whole ? NULL : cand, whole ? n : nc,
                                    not_marked, marked);
      OM_ASSERT_CMP(got, ==, full[f]);
      marked[got] = 1;
      walked++;
      if (walked > 6 && n > 50)
        break; /* a retry walk is short; the first steps say enough */
    }
    if (walked == nc && !(walked > 6 && n > 50))
      OM_ASSERT_CMP(
          om_rendezvous_best_hash(r, kh, cand, nc, not_marked, marked), ==,
          UINT32_MAX);
    if (nc > 0) /* no filter: the first of the subset in rank order */
      for (size_t f = 0; f < n; f++)
        if (in[full[f]]) {
          OM_ASSERT_CMP(om_rendezvous_best_hash(r, kh, whole ? NULL : cand,
                                                whole ? n : nc, NULL, NULL),
                        ==, full[f]);
          break;
        }
  }
  assert_int_equal(om_rendezvous_best_hash(r, 1, cand, 0, NULL, NULL),
                   UINT32_MAX);
  free(full);
  free(cand);
  free(in);
  free(marked);
  om_rendezvous_free(r);
}

static void best_walks_the_rank_of_a_subset(void **state) {
  double w[600];
  om_rng_t rng;
  (void)state;
  om_rng_seed(&rng, 11);
  check_best(1, NULL, 20, &rng);
  check_best(2, NULL, 500, &rng);
  check_best(16, NULL, 500, &rng);
  check_best(600, NULL, 100, &rng);
  for (size_t i = 0; i < 600; i++)
    w[i] = (double)(1 + i % 3);
  check_best(16, w, 500, &rng);
  check_best(600, w, 100, &rng);
  for (size_t i = 0; i < 600; i++)
    w[i] = 0.1 + om_rng_double(&rng);
  check_best(9, w, 500, &rng);
  check_best(600, w, 100, &rng);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(rejects_bad_input),
      cmocka_unit_test(owns_copies_of_ids),
      cmocka_unit_test(deterministic_and_seeded),
      cmocka_unit_test(equal_shares),
      cmocka_unit_test(weighted_shares),
      cmocka_unit_test(add_moves_one_share_to_new_peer),
      cmocka_unit_test(remove_moves_only_its_keys),
      cmocka_unit_test(rank_is_the_retry_order),
      cmocka_unit_test(best_walks_the_rank_of_a_subset),
      cmocka_unit_test(pick_bounds_agree_with_exact_order),
      cmocka_unit_test(extreme_weights),
      cmocka_unit_test(construction_fails_cleanly),
      cmocka_unit_test(rank_fails_cleanly),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
