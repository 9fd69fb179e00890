/*
 * om_rendezvous.h: weighted rendezvous hashing (highest random weight).
 *
 * Every peer gets a score per key; the key goes to the best score, and the
 * ranked order is the order retries walk. Scores depend only on (key, peer),
 * so adding a peer moves to it about w_new / sum(w) of the keys (1/(n+1)
 * with equal weights) and moves nothing else; removing a peer moves only the
 * keys it held. (Thaler and Ravishankar, "Using name-based mappings to
 * increase hit rates", 1998; the weighted form -w / ln(u) is the
 * "logarithmic method" of Schindelhauer and Schomaker, "Weighted distributed
 * hash tables", SPAA 2005.)
 *
 * Score of peer i for a key: h = om_hash_mix64(key_hash ^ peer_hash[i]),
 * u = om_hash_unit(h) in (0, 1), score = -w_i / ln(u), highest wins.
 * Equivalently the smallest E_i = -ln(u) / w_i wins: E_i is an exponential
 * variate of rate w_i, and the minimum of independent exponentials is E_i
 * with probability w_i / sum(w).
 *
 * The order, exactly (it is what pick and rank compute, bit for bit):
 * peers of equal weight form a class; inside a class, E falls as h rises,
 * so peers are ordered by h, highest first; across classes, the order is
 * the merge of the class orders by E (om_hash_exp_variate(h) / w). Ties go
 * to the lower peer index. So with equal weights no logarithm is computed,
 * and with a few distinct weights (the usual case) one pass of integer
 * mixing finds each class's best and only those few are compared by E,
 * mostly through cheap bounds (1 - u <= -ln u <= (1 - u) / u) rather than
 * a logarithm. rank[0] is always pick, and rank[1] is what pick would
 * return with rank[0] removed. The relative order of two peers depends on
 * those two alone (a k-way merge interleaves two lists the same way
 * whatever the other lists hold), which is what makes adding and removing
 * peers disturb nothing else.
 *
 * Everything is a function of (seed, key, id, weight) of the peers
 * involved, computed with basic IEEE-754 operations: every process of a mesh
 * maps a key to the same peer.
 *
 * A rendezvous object is immutable after om_rendezvous_new: a new peer set
 * is a new object. Several threads may pick and rank on one object at once.
 */
#ifndef OM_RENDEZVOUS_H
#define OM_RENDEZVOUS_H

#include <stddef.h>
#include <stdint.h>

typedef struct om_rendezvous_s om_rendezvous_t;

typedef struct om_rendezvous_peer_s {
  const char *id; /* bytes of the id; copied by om_rendezvous_new */
  size_t id_len;  /* 0: id is NUL-terminated (strlen) */
  double weight;  /* finite and > 0; use 1.0 for unweighted */
} om_rendezvous_peer_t;

typedef struct om_rendezvous_opts_s {
  const om_rendezvous_peer_t *peers; /* npeers entries, borrowed */
  size_t npeers;                     /* >= 1 */
  /*
   * Seed of the key and peer hashes. Every process that must agree on the
   * mapping must use the same seed; 0 is a fine default.
   */
  uint64_t seed;
} om_rendezvous_opts_t;

/*
 * om_rendezvous_new: build the scorer for a peer set. Peer hashes and weight
 * reciprocals are computed here once, so a pick is one mix per peer.
 * Returns 0 and sets *out, or:
 *   OM_EINVAL     opts/out/peers NULL, an id NULL or empty, a weight <= 0,
 *                 NaN or infinite (weights are used as 1/w: keep them
 *                 within 1e-300..1e300, where 1/w is a normal double);
 *   OM_ENOPEERS   npeers == 0;
 *   OM_ERANGE     more than INT32_MAX peers;
 *   OM_EDUPLICATE two peers with the same id;
 *   OM_ENOMEM     allocation failed.
 * On error *out is untouched and nothing is allocated. The object owns
 * copies of the ids; the caller keeps ownership of opts and its peers.
 */
int om_rendezvous_new(const om_rendezvous_opts_t *opts, om_rendezvous_t **out);

/* om_rendezvous_free: release r and its id copies. NULL is a no-op. */
void om_rendezvous_free(om_rendezvous_t *r);

/* om_rendezvous_size: the number of peers (>= 1). */
size_t om_rendezvous_size(const om_rendezvous_t *r);

/*
 * om_rendezvous_id: the id of peer i (0 <= i < size), NUL-terminated, owned
 * by r (valid until om_rendezvous_free); *len (if not NULL) gets its length,
 * which counts embedded NULs. NULL for i out of range.
 */
const char *om_rendezvous_id(const om_rendezvous_t *r, size_t i, size_t *len);

/* om_rendezvous_weight: the weight of peer i as given; 0 if out of range. */
double om_rendezvous_weight(const om_rendezvous_t *r, size_t i);

/*
 * om_rendezvous_key_hash: the hash a key gets inside pick and rank (XXH3-64
 * with the object's seed). Hash once, then call the _hash variants for a
 * pick and later a rank of the same request.
 */
uint64_t om_rendezvous_key_hash(const om_rendezvous_t *r, const void *key,
                                size_t len);

/*
 * om_rendezvous_pick: the index of the peer that owns key (len bytes; key
 * may be NULL when len is 0). Always succeeds: a rendezvous has >= 1 peer.
 */
uint32_t om_rendezvous_pick(const om_rendezvous_t *r, const void *key,
                            size_t len);
uint32_t om_rendezvous_pick_hash(const om_rendezvous_t *r, uint64_t key_hash);

/*
 * om_rendezvous_rank: the first k peers of the key's ranked order, best
 * first, into out[0..k) (k larger than the peer count is clamped). out[0] is
 * om_rendezvous_pick(key); out[1] is where the key would go if out[0] were
 * removed, and so on, which is why retries walk this order. Returns the
 * number of indices written (min(k, size)), or OM_ENOMEM if scratch space
 * for more than 64 peers could not be allocated (out untouched then).
 * Cost: one score per peer plus O(k log n) for the order.
 */
int om_rendezvous_rank(const om_rendezvous_t *r, const void *key, size_t len,
                       uint32_t *out, size_t k);
int om_rendezvous_rank_hash(const om_rendezvous_t *r, uint64_t key_hash,
                            uint32_t *out, size_t k);

/*
 * A filter for om_rendezvous_best_hash: nonzero when peer i may be
 * chosen (untried, reachable, its circuit closed: the caller's rules).
 */
typedef int (*om_rendezvous_accept_fn)(void *ud, uint32_t i);

/*
 * om_rendezvous_best_hash: among the candidates cand[0..n) (peer indices;
 * NULL: every peer 0..n-1, n clamped to the size) that accept (NULL: all)
 * lets through, the one that comes first in om_rendezvous_rank's order for
 * key_hash. So a caller walks a key's rank inside a subset, skipping
 * peers it already tried, with one O(n) pass per step and no sort: the
 * k-th call that excludes the k-1 peers returned before returns what rank
 * restricted to the candidates has at k-1 (the relative order of two peers
 * depends on those two alone). Indices out of range are ignored; a
 * candidate listed twice counts once. Returns the index, or UINT32_MAX
 * when no candidate is accepted. Allocates nothing, cannot fail; accept
 * is called once per candidate, in cand order. Cost: one mix per
 * candidate, plus, with several weights, a bound compare (rarely a
 * logarithm) per candidate of another weight class than the best so far.
 */
uint32_t om_rendezvous_best_hash(const om_rendezvous_t *r, uint64_t key_hash,
                                 const uint32_t *cand, size_t n,
                                 om_rendezvous_accept_fn accept, void *ud);

#endif /* OM_RENDEZVOUS_H */
