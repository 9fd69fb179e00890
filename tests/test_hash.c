/* test_hash.c: XXH3 wrapper, the mix finalizer, unit mapping, variates. */
#include "om_test.h"

#include <math.h>
#include <string.h>

#include <xxhash.h>

#include "om_hash.h"
#include "om_rng.h"

static void hash_is_xxh3(void **state) {
  static const char *inputs[] = {"", "a", "user-42", "10.0.0.1:8080",
                                 "a somewhat longer key, past 16 and 128 "
                                 "bytes so that XXH3 takes its long path: "
                                 "0123456789abcdef0123456789abcdef0123"};
  (void)state;
  /* Reference value of XXH3_64bits("") from the xxHash test vectors. */
  assert_int_equal(om_hash("", 0, 0), UINT64_C(0x2D06800538D394C2));
  assert_int_equal(om_hash(NULL, 0, 0), UINT64_C(0x2D06800538D394C2));
  for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) {
    size_t len = strlen(inputs[i]);
    assert_int_equal(om_hash(inputs[i], len, 0), XXH3_64bits(inputs[i], len));
    assert_int_equal(om_hash(inputs[i], len, 7),
                     XXH3_64bits_withSeed(inputs[i], len, 7));
    assert_int_not_equal(om_hash(inputs[i], len, 7),
                         om_hash(inputs[i], len, 8));
  }
}

static int popcount64(uint64_t x) {
  int c = 0;
  for (; x != 0; x &= x - 1)
    c++;
  return c;
}

static void mix64_avalanche(void **state) {
  om_rng_t rng;
  double total = 0;
  long samples = 0;
  (void)state;
  /* fmix64 fixes 0: why peers are salted */
  assert_int_equal(om_hash_mix64(0), 0);
  assert_int_not_equal(om_hash_mix64(1), om_hash_mix64(2));
  om_rng_seed(&rng, 1);
  /* Flipping any one input bit flips each output bit with p ~ 1/2. */
  for (int t = 0; t < 2000; t++) {
    uint64_t x = om_rng_next(&rng), hx = om_hash_mix64(x);
    for (int b = 0; b < 64; b++) {
      total += popcount64(hx ^ om_hash_mix64(x ^ (UINT64_C(1) << b)));
      samples++;
    }
  }
  OM_ASSERT_NEAR(total / (double)samples, 32.0, 0.2);
}

static void unit_bounds_and_exactness(void **state) {
  om_rng_t rng;
  (void)state;
  OM_ASSERT_CMP(om_hash_unit(0), ==, 0x1p-53);
  OM_ASSERT_CMP(om_hash_unit(UINT64_MAX), ==, 1.0 - 0x1p-53);
  OM_ASSERT_CMP(om_hash_unit_complement(UINT64_MAX), ==, 0x1p-53);
  OM_ASSERT_CMP(om_hash_unit_complement(0), ==, 1.0 - 0x1p-53);
  /* The low 12 bits do not count. */
  OM_ASSERT_CMP(om_hash_unit(0xfff), ==, om_hash_unit(0));
  om_rng_seed(&rng, 2);
  for (int i = 0; i < 100000; i++) {
    uint64_t h = om_rng_next(&rng);
    double u = om_hash_unit(h), v = om_hash_unit_complement(h);
    OM_ASSERT_CMP(u, >, 0);
    OM_ASSERT_CMP(u, <, 1);
    OM_ASSERT_CMP(v, >, 0);
    OM_ASSERT_CMP(v, <, 1);
    OM_ASSERT_CMP(u + v, ==, 1.0); /* exact complements */
    /* Same value as the plain integer-to-double formula. */
    OM_ASSERT_CMP(u, ==, ((double)(h >> 12) + 0.5) * 0x1p-52);
  }
}

static void exp_variate_accuracy(void **state) {
  static const uint64_t edges[] = {0,
                                   1,
                                   UINT64_C(0xfff),
                                   UINT64_C(0x1000),
                                   UINT64_C(0x6a09e667f3bcc908), /* ~sqrt2/2 */
                                   UINT64_C(0x8000000000000000),
                                   UINT64_C(0xb504f333f9de6484), /* ~sqrt2/2 */
                                   UINT64_C(0xfffffffffffff000),
                                   UINT64_MAX};
  om_rng_t rng;
  double worst = 0, sum = 0, sum2 = 0;
  const int n = 200000;
  (void)state;
  om_rng_seed(&rng, 3);
  for (int i = 0; i < n + (int)(sizeof edges / sizeof edges[0]); i++) {
    uint64_t h = i < n ? om_rng_next(&rng) : edges[i - n];
    /* Skew half the samples towards u close to 1, where rendezvous lives. */
    if (i < n && (i & 1))
      h |= UINT64_C(0xffffff0000000000);
    long double ref = -logl((long double)om_hash_unit(h));
    double e = om_hash_exp_variate(h);
    double rel = (double)fabsl(((long double)e - ref) / ref);
    if (rel > worst)
      worst = rel;
    OM_ASSERT_CMP(e, >=, om_hash_unit_complement(h)); /* the pruning bound */
    if (i < n && !(i & 1)) {
      sum += e;
      sum2 += e * e;
    }
  }
  OM_TEST_NOTE("exp_variate worst relative error: %.3g", worst);
  OM_ASSERT_CMP(worst, <, 0x1p-50);
  /* Exp(1): mean 1, second moment 2. */
  OM_ASSERT_NEAR(sum / (n / 2), 1.0, 0.015);
  OM_ASSERT_NEAR(sum2 / (n / 2), 2.0, 0.05);
  /* Extremes: u = 2^-53 gives 53 ln 2; u = 1 - 2^-53 gives ~2^-53. */
  OM_ASSERT_NEAR(om_hash_exp_variate(0), 53 * log(2.0), 1e-12);
  OM_ASSERT_NEAR(om_hash_exp_variate(UINT64_MAX) / 0x1p-53, 1.0, 1e-9);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(hash_is_xxh3),
      cmocka_unit_test(mix64_avalanche),
      cmocka_unit_test(unit_bounds_and_exactness),
      cmocka_unit_test(exp_variate_accuracy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
