/*
 * om_proxy_cache.h: the proxy's decision cache, internal.
 *
 * The decision cache, for a traffic policy that declares `vary`: such a
 * policy sees only the service and the declared fields (om_policy_vary),
 * so for one peer view and one policy version its authorize, subset and
 * key are a function of those fields (the caller's identity among them
 * when the vary names ":identity": its subject and SANs are part of the
 * slot's key), and the answer for one request serves every request that
 * agrees on them; a refusal is cached with its reason. Direct-mapped by a hash
 * of the fields; a slot is valid for one generation (bumped on every view or
 * policy change). Bounded: SLOTS entries per service, each one allocation of at
 * most KEY_MAX bytes of request fields, KEY_MAX of the policy's key and
 * SUBSET_MAX peers (a larger answer is not cached): under 24 KiB a slot.
 */
#ifndef OM_PROXY_CACHE_H
#define OM_PROXY_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "om_metrics.h"
#include "om_policy.h"

#define OM__PROXY_CACHE_SLOTS 256
#define OM__PROXY_CACHE_KEY_MAX 1024    /* request fields, policy key */
#define OM__PROXY_CACHE_SUBSET_MAX 4096 /* peers in a cached subset */

typedef struct om__proxy_cache_slot_s om__proxy_cache_slot_t;

/* One service's cache; embedded in the service, zeroed by _init. */
typedef struct om__proxy_cache_s {
  om__proxy_cache_slot_t *slots; /* NULL until a vary policy needs them */
  uint64_t gen, hits, misses;
  om_metric_t *m_hits, *m_misses;
} om__proxy_cache_t;

/*
 * om__proxy_cache_init: an empty cache whose hit and miss counters are
 * registered in metrics under labels (a failed registration leaves a NULL
 * metric, which om_metric_inc ignores). Allocates no slots.
 */
void om__proxy_cache_init(om__proxy_cache_t *c, om_metrics_t *metrics,
                          const char *labels);

/* A view or policy change: every cached decision is void (O(1)). */
void om__proxy_cache_invalidate(om__proxy_cache_t *c);

/* Free the slots; the cache is empty and usable again. Idempotent. */
void om__proxy_cache_free(om__proxy_cache_t *c);

/*
 * om__proxy_cache_route: om_policy_route (same arguments and results),
 * answered from the cache when pol declares vary and the request's vary
 * fields match a slot of the current generation (a cached refusal returns
 * OM_POLICY_DENIED with its reason in err). On a hit the subset is
 * copied to scratch and *key points into the slot, valid until the next
 * call, as the policy's own key would be. Errors are never cached; a
 * failed allocation only means the policy runs.
 */
int om__proxy_cache_route(om__proxy_cache_t *c, om_policy_t *pol,
                          const om_policy_req_t *preq, uint32_t *scratch,
                          size_t *n_subset, const char **key, size_t *key_len,
                          char *err, size_t errlen);

#endif /* OM_PROXY_CACHE_H */
