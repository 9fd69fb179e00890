/* om_rng.c: seeding for the caller-owned generator (om_rng.h). */
#include "om_rng.h"

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

void om_rng_seed(om_rng_t *rng, uint64_t seed) {
  for (int i = 0; i < 4; i++)
    rng->s[i] = splitmix64(&seed);
}
