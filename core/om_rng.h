/*
 * om_rng.h: the seeded random generator the caller owns (xoshiro256**,
 * seeded through splitmix64). Core code never calls rand() or reads a clock:
 * a primitive that needs randomness takes an om_rng_t *, so every decision is
 * reproducible under test from the seed.
 */
#ifndef OM_RNG_H
#define OM_RNG_H

#include <stdint.h>

typedef struct om_rng_s {
  uint64_t s[4];
} om_rng_t;

/* Seed the generator; any seed (0 included) gives a valid state. */
void om_rng_seed(om_rng_t *rng, uint64_t seed);

static inline uint64_t om__rng_rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

/* The next 64 random bits. */
static inline uint64_t om_rng_next(om_rng_t *rng) {
  uint64_t *s = rng->s;
  uint64_t result = om__rng_rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = om__rng_rotl(s[3], 45);
  return result;
}

/* A uniform double in [0, 1) with 53 random bits. */
static inline double om_rng_double(om_rng_t *rng) {
  return (double)(om_rng_next(rng) >> 11) * 0x1.0p-53;
}

/*
 * A uniform integer in [0, n) for n >= 1, without modulo bias (Lemire's
 * multiply-shift with rejection). n == 0 returns 0.
 */
static inline uint32_t om_rng_below(om_rng_t *rng, uint32_t n) {
  uint64_t m;
  uint32_t l;
  if (n == 0)
    return 0;
  m = (uint64_t)(uint32_t)(om_rng_next(rng) >> 32) * n;
  l = (uint32_t)m;
  if (l < n) {
    uint32_t t = (uint32_t)(-n) % n;
    while (l < t) {
      m = (uint64_t)(uint32_t)(om_rng_next(rng) >> 32) * n;
      l = (uint32_t)m;
    }
  }
  return (uint32_t)(m >> 32);
}

#endif /* OM_RNG_H */
