/*
 * om_proxy_cache.h: the proxy's decision cache, internal.
 *
 * The decision cache, for a traffic policy that declares `vary`: such a
 * policy sees only the service and the declared fields (om_policy_vary),
 * so for one peer view and one policy version its authorize, subset, key
 * and decide are a function of those fields (the caller's identity among them
 * when the vary names ":identity": its subject and SANs are part of the
 * slot's key), and the answer for one request serves every request that
 * agrees on them; a refusal is cached with its reason. Direct-mapped by a
 * hash of the fields; a slot is valid for one generation (bumped on every
 * view or policy change). Bounded: SLOTS entries per service, each of at
 * most KEY_MAX bytes of request fields and KEY_MAX of the policy's key, and
 * a subset: "every peer of the view" as a flag, otherwise a reference to an
 * immutable, reference-counted list of peer indices that the calls routed
 * by it share (no copy per call; consecutive equal answers share one
 * list). So any peer count is cached, and applying a cached decision costs
 * the same at 10,000 peers as at 2.
 */
#ifndef OM_PROXY_CACHE_H
#define OM_PROXY_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "om_metrics.h"
#include "om_policy.h"

#define OM__PROXY_CACHE_SLOTS 256
#define OM__PROXY_CACHE_KEY_MAX 1024 /* request fields, policy key */

typedef struct om__proxy_cache_slot_s om__proxy_cache_slot_t;

/*
 * A subset as peer indices of one view, immutable once made and shared
 * by reference (the cache slot and every call routed by it hold one).
 */
typedef struct om__proxy_subset_s {
  uint32_t refs;
  size_t n;
  uint32_t ids[];
} om__proxy_subset_t;

/* Drop a reference; the last one frees. NULL is a no-op. */
void om__proxy_subset_unref(om__proxy_subset_t *s);

/* One service's cache; embedded in the service, zeroed by _init. */
typedef struct om__proxy_cache_s {
  om__proxy_cache_slot_t *slots; /* NULL until a vary policy needs them */
  om__proxy_subset_t *last;      /* the latest list stored (a reference) */
  uint64_t gen, hits, misses;
  om_metric_t *m_hits, *m_misses;
} om__proxy_cache_t;

/*
 * What a route decided. The subset is every peer of the view (all; no
 * index is written), or n_subset indices: in shared (a reference the
 * caller now holds and releases with om__proxy_subset_unref) or, when
 * shared is NULL, in the caller's scratch. key as om_policy_route's.
 */
typedef struct om__proxy_route_s {
  size_t n_subset;
  int all;
  om__proxy_subset_t *shared;
  const char *key;
  size_t key_len;
  /* what decide(req) answered: the caller's dscratch or a slot's copy
   * (valid until the next route through the cache); NULL for none */
  const om_policy_decision_t *decision;
} om__proxy_route_t;

/*
 * om__proxy_cache_init: an empty cache whose hit and miss counters are
 * registered in metrics under labels (a failed registration leaves a NULL
 * metric, which om_metric_inc ignores). Allocates no slots.
 */
void om__proxy_cache_init(om__proxy_cache_t *c, om_metrics_t *metrics,
                          const char *labels);

/* A view or policy change: every cached decision is void (O(1); the
 * lists of older generations go as their slots are reused or freed). */
void om__proxy_cache_invalidate(om__proxy_cache_t *c);

/* Free the slots; the cache is empty and usable again. Idempotent. */
void om__proxy_cache_free(om__proxy_cache_t *c);

/*
 * om__proxy_cache_route: om_policy_route_decide (same request, scratch and
 * error arguments, dscratch for decide's answer; its results in *out), answered
 * from the cache when pol declares vary and the request's vary fields match a
 * slot of the current generation (a cached refusal returns OM_POLICY_DENIED
 * with its reason in err). On a hit nothing is copied: out->all, or out->shared
 * (a reference for the caller); out->key points into the slot, valid until the
 * next call, as the policy's own key would be. A miss that is stored hands the
 * caller a reference to the stored list too. Errors are never cached; a failed
 * allocation only means the policy runs (or its answer is not stored).
 */
int om__proxy_cache_route(om__proxy_cache_t *c, om_policy_t *pol,
                          const om_policy_req_t *preq, uint32_t *scratch,
                          om_policy_decision_t *dscratch,
                          om__proxy_route_t *out, char *err, size_t errlen);

#endif /* OM_PROXY_CACHE_H */
