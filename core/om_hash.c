/* om_hash.c: XXH3-64 and the exponential variate of a hash (om_hash.h). */
#include "om_hash.h"

#include <string.h>

#include <xxhash.h>

uint64_t om_hash(const void *data, size_t len, uint64_t seed) {
  static const char empty[1] = {0};
  if (data == NULL) /* len is 0: XXH3 reads nothing, but wants a pointer */
    data = empty;
  return (uint64_t)XXH3_64bits_withSeed(data, len, (XXH64_hash_t)seed);
}

/*
 * ln(u) by the method of fdlibm's e_log.c (Sun Microsystems, 1993):
 * u = 2^k * m with m in [sqrt(2)/2, sqrt(2)), f = m - 1, s = f / (2 + f),
 * ln(m) = 2 atanh(s) = f - (f^2/2 - s (f^2/2 + R(s^2))), where R is the
 * minimax polynomial below (coefficients Lg1..Lg7 from e_log.c, error below
 * 2^-58.45), and k ln 2 is added in two parts (ln2_hi has trailing zero bits
 * so k * ln2_hi is exact). Libm's log() would do as well, but its last bit
 * differs between C libraries, and a rendezvous score must not.
 */
static const double ln2_hi =
    6.93147180369123816490e-01; /* 0x3fe62e42fee00000 */
static const double ln2_lo =
    1.90821492927058770002e-10; /* 0x3dea39ef35793c76 */
static const double Lg1 = 6.666666666666735130e-01;
static const double Lg2 = 3.999999999940941908e-01;
static const double Lg3 = 2.857142874366239149e-01;
static const double Lg4 = 2.222219843214978396e-01;
static const double Lg5 = 1.818357216161805012e-01;
static const double Lg6 = 1.531383769920937332e-01;
static const double Lg7 = 1.479819860511658591e-01;
static const double sqrt2 = 1.41421356237309504880;

double om_hash_exp_variate(uint64_t h) {
  double u = om_hash_unit(h);
  double v = om_hash_unit_complement(h);
  double m, f, s, z, w, r, hfsq, dk, ln_u, e;
  uint64_t bits;
  int k;

  /* u is a normal double >= 2^-53: split exponent and mantissa by bits. */
  memcpy(&bits, &u, sizeof bits);
  k = (int)(bits >> 52) - 1023;
  bits = (bits & UINT64_C(0x000fffffffffffff)) | UINT64_C(0x3ff0000000000000);
  memcpy(&m, &bits, sizeof m);
  if (m > sqrt2) {
    m *= 0.5;
    k += 1;
  }
  f = m - 1.0; /* exact (Sterbenz) */
  s = f / (2.0 + f);
  z = s * s;
  w = z * z;
  r = z * (Lg1 + w * (Lg3 + w * (Lg5 + w * Lg7))) +
      w * (Lg2 + w * (Lg4 + w * Lg6));
  hfsq = 0.5 * f * f;
  dk = (double)k;
  ln_u = dk * ln2_hi - ((hfsq - (s * (hfsq + r) + dk * ln2_lo)) - f);
  e = -ln_u;
  /* -ln(u) > 1 - u holds exactly; keep it true after rounding too, since
   * rendezvous prunes peers on 1 - u. */
  return e > v ? e : v;
}
