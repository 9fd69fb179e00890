/*
 * om_hash.h: the hashing every selection decision is built on.
 *
 * - om_hash: XXH3-64 (libxxhash), the one string hash of OpenMesh, so a key
 *   hashed in Lua (openmesh.hash) and in C gives the same integer.
 * - om_hash_mix64: a 64-bit finalizer (MurmurHash3 fmix64). Rendezvous
 *   scores a peer for a key as mix64(key_hash ^ peer_hash): one multiply
 *   chain per peer instead of hashing the key again for every peer.
 * - om_hash_unit / om_hash_unit_complement / om_hash_exp_variate: turn a
 *   mixed hash into u in (0, 1) (0 and 1 excluded, so ln(u) is finite and
 *   non-zero), into 1 - u exactly, and into -ln(u), a standard exponential
 *   variate, for weighted rendezvous.
 *
 * Everything here is a pure function of its arguments and uses only IEEE-754
 * basic operations (no libm), so every process of a mesh, on any platform,
 * maps a key to the same peer.
 */
#ifndef OM_HASH_H
#define OM_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/*
 * om_hash: XXH3-64 of len bytes at data with a seed. Seed 0 gives the same
 * value as XXH3_64bits (xxhash.h guarantees it). data may be NULL when len
 * is 0. Exists so that callers do not depend on xxhash.h directly and every
 * key in the mesh is hashed the same way.
 */
uint64_t om_hash(const void *data, size_t len, uint64_t seed);

/*
 * om_hash_mix64: MurmurHash3's 64-bit finalizer (fmix64, Austin Appleby,
 * MurmurHash3.cpp). A bijection on 64-bit values with full avalanche: every
 * input bit flips each output bit with probability close to 1/2. Used to
 * derive an independent-looking score per (key, peer) from two precomputed
 * hashes.
 */
static inline uint64_t om_hash_mix64(uint64_t x) {
  x ^= x >> 33;
  x *= UINT64_C(0xff51afd7ed558ccd);
  x ^= x >> 33;
  x *= UINT64_C(0xc4ceb9fe1a85ec53);
  x ^= x >> 33;
  return x;
}

/*
 * Build the double 1 + m * 2^-52 from a 52-bit m by setting the exponent of
 * 1.0, then subtract 1 - 2^-53: the result, (m + 1/2) * 2^-52, is exact
 * (Sterbenz: both operands lie within a factor of two of each other). One
 * OR and one subtraction instead of an integer-to-double conversion.
 */
static inline double om__hash_unit_bits(uint64_t m52) {
  uint64_t bits = UINT64_C(0x3ff0000000000000) | m52;
  double d;
  memcpy(&d, &bits, sizeof d);
  return d - (1.0 - 0x1p-53);
}

/*
 * om_hash_unit: u = (floor(h / 2^12) + 1/2) / 2^52, strictly inside (0, 1):
 * the smallest value is 2^-53, the largest 1 - 2^-53. Exact (no rounding),
 * and non-decreasing in h (equal only for h sharing their top 52 bits).
 */
static inline double om_hash_unit(uint64_t h) {
  return om__hash_unit_bits(h >> 12);
}

/*
 * om_hash_unit_complement: 1 - om_hash_unit(h), computed exactly from the
 * complemented bits rather than by a subtraction, so it keeps full relative
 * precision when u is close to 1.
 */
static inline double om_hash_unit_complement(uint64_t h) {
  return om__hash_unit_bits(~h >> 12);
}

/*
 * om_hash_exp_variate: -ln(u) for u = om_hash_unit(h), a standard
 * exponential variate (mean 1) when h is uniform. Relative error below
 * 1e-15, and never below om_hash_unit_complement(h) (since -ln(u) > 1 - u
 * for u in (0, 1)), so 1 - u is a safe lower bound for pruning. Computed
 * with basic IEEE-754 operations only (fdlibm's e_log.c method), so the
 * result is bit-identical across platforms and C libraries.
 */
double om_hash_exp_variate(uint64_t h);

#endif /* OM_HASH_H */
