/*
 * om_proxy_cache.c: the decision cache of a traffic policy that declares
 * vary (om_proxy_cache.h). Used by om_proxy.c (create with the service,
 * invalidate on a view or policy change, free) and om_proxy_call.c
 * (route through it).
 */
#include "om_proxy_cache.h"

#include <stdlib.h>
#include <string.h>

#include "om_hash.h"

struct om__proxy_cache_slot_s {
  uint64_t gen, hash; /* gen 0: empty */
  size_t key_len, pkey_len, cap;
  int has_pkey;
  int denied;  /* authorize refused: no subset, the reason as the pkey */
  int all;     /* the subset is every peer of the view */
  int has_dec; /* dec holds decide's answer for this entry */
  om__proxy_subset_t *subset; /* otherwise (a reference; NULL: empty) */
  char *mem;                  /* the key bytes, the policy's key */
  /* what decide(req) answered (its om_policy_decision_size bytes), NULL
   * for none; dec_cap bytes allocated */
  om_policy_decision_t *dec;
  size_t dec_cap;
};

void om__proxy_subset_unref(om__proxy_subset_t *s) {
  if (s != NULL && --s->refs == 0)
    free(s);
}

/* A list of n indices from ids: the latest one stored when it is equal
 * (a canary's many keys mostly share two answers), else a new one. A
 * new reference, or NULL without memory. */
static om__proxy_subset_t *subset_for(om__proxy_cache_t *c, const uint32_t *ids,
                                      size_t n) {
  om__proxy_subset_t *s = c->last;
  if (s == NULL || s->n != n || memcmp(s->ids, ids, n * sizeof *ids) != 0) {
    s = malloc(sizeof *s + n * sizeof *ids);
    if (s == NULL)
      return NULL;
    s->refs = 1; /* the cache's "last" */
    s->n = n;
    memcpy(s->ids, ids, n * sizeof *ids);
    om__proxy_subset_unref(c->last);
    c->last = s;
  }
  s->refs++;
  return s;
}

void om__proxy_cache_init(om__proxy_cache_t *c, om_metrics_t *metrics,
                          const char *labels) {
  memset(c, 0, sizeof *c);
  c->m_hits = om_metrics_counter(
      metrics, "openmesh_proxy_policy_cache_hits_total",
      "Calls routed by a cached decision of a traffic policy that declares "
      "vary.",
      labels);
  c->m_misses = om_metrics_counter(
      metrics, "openmesh_proxy_policy_cache_misses_total",
      "Calls of a traffic policy with vary that ran the policy.", labels);
}

void om__proxy_cache_invalidate(om__proxy_cache_t *c) {
  c->gen++; /* slots of older generations read as empty */
}

void om__proxy_cache_free(om__proxy_cache_t *c) {
  om__proxy_subset_unref(c->last);
  c->last = NULL;
  if (c->slots == NULL)
    return;
  for (size_t i = 0; i < OM__PROXY_CACHE_SLOTS; i++) {
    free(c->slots[i].mem);
    free(c->slots[i].dec);
    om__proxy_subset_unref(c->slots[i].subset);
  }
  free(c->slots);
  c->slots = NULL;
}

static void put_field(char *buf, size_t *len, const char *v, size_t vl) {
  uint32_t n = v != NULL ? (uint32_t)vl : UINT32_MAX; /* absent != "" */
  memcpy(buf + *len, &n, sizeof n);
  *len += sizeof n;
  if (v != NULL) {
    memcpy(buf + *len, v, vl);
    *len += vl;
  }
}

/* The bytes the caller's identity takes in a key (see put_identity). */
static size_t identity_size(const om_policy_identity_t *id) {
  size_t need = 4;
  if (id == NULL)
    return need;
  need += 4 + 4 + (id->subject != NULL ? strlen(id->subject) : 0);
  for (size_t i = 0; i < id->n_uris; i++)
    need += 4 + strlen(id->uris[i]);
  for (size_t i = 0; i < id->n_dns; i++)
    need += 4 + strlen(id->dns[i]);
  return need;
}

/* The identity's canonical text: absent, or the subject, then the URI
 * SANs and the DNS SANs each with its count first, so that no two
 * identities the policy can tell apart share a key. */
static void put_identity(char *buf, size_t *len,
                         const om_policy_identity_t *id) {
  uint32_t counts[2];
  if (id == NULL) {
    put_field(buf, len, NULL, 0);
    return;
  }
  counts[0] = (uint32_t)id->n_uris;
  counts[1] = (uint32_t)id->n_dns;
  put_field(buf, len, (const char *)counts, sizeof counts);
  put_field(buf, len, id->subject != NULL ? id->subject : "",
            id->subject != NULL ? strlen(id->subject) : 0);
  for (size_t i = 0; i < id->n_uris; i++)
    put_field(buf, len, id->uris[i], strlen(id->uris[i]));
  for (size_t i = 0; i < id->n_dns; i++)
    put_field(buf, len, id->dns[i], strlen(id->dns[i]));
}

/* The bytes of the fields a vary policy sees; 0, or -1 when too long. */
static int vary_key(const om_policy_req_t *req, const char *const *names,
                    size_t n, int method, int path, int identity, char *buf,
                    size_t *len) {
  size_t need = 0;
  const om_policy_kv_t *kv[64];
  if (n > sizeof kv / sizeof kv[0])
    return -1;
  for (size_t i = 0; i < n; i++) {
    kv[i] = om_policy_req_header(req, names[i]);
    need += 4 + (kv[i] != NULL ? kv[i]->value_len : 0);
  }
  if (method)
    need += 4 + strlen(req->method);
  if (path)
    need += 4 + strlen(req->path);
  if (identity)
    need += identity_size(req->identity);
  if (need > OM__PROXY_CACHE_KEY_MAX)
    return -1;
  *len = 0;
  if (method)
    put_field(buf, len, req->method, strlen(req->method));
  if (path)
    put_field(buf, len, req->path, strlen(req->path));
  if (identity)
    put_identity(buf, len, req->identity);
  for (size_t i = 0; i < n; i++)
    put_field(buf, len, kv[i] != NULL ? kv[i]->value : NULL,
              kv[i] != NULL ? kv[i]->value_len : 0);
  return 0;
}

/* Keep a copy of decide's answer d (NULL: none) in slot: 0, or -1
 * without memory (the slot is then left as it was). */
static int store_decision(om__proxy_cache_slot_t *slot,
                          const om_policy_decision_t *d) {
  size_t need = d != NULL ? om_policy_decision_size(d) : 0;
  if (need > slot->dec_cap) {
    om_policy_decision_t *m = malloc(need);
    if (m == NULL)
      return -1;
    free(slot->dec);
    slot->dec = m;
    slot->dec_cap = need;
  }
  if (d != NULL)
    memcpy(slot->dec, d, need);
  return 0;
}

/* Store a decision in slot: the subset (all, or sub: the slot takes one
 * reference of its own), the request's key bytes, the policy's key and
 * what decide answered (dec, NULL for none). */
static void cache_store(om__proxy_cache_slot_t *slot, uint64_t gen,
                        uint64_t hash, const char *kb, size_t kl, int all,
                        om__proxy_subset_t *sub, const char *pkey, size_t pkl,
                        int denied, const om_policy_decision_t *dec) {
  size_t need = kl + pkl;
  if (store_decision(slot, dec) != 0)
    return; /* not cached: only slower */
  if (need > slot->cap || slot->mem == NULL) {
    char *m = malloc(need > 0 ? need : 1);
    if (m == NULL)
      return; /* not cached: only slower */
    free(slot->mem);
    slot->mem = m;
    slot->cap = need > 0 ? need : 1;
  }
  memcpy(slot->mem, kb, kl);
  if (pkey != NULL)
    memcpy(slot->mem + kl, pkey, pkl);
  if (sub != NULL)
    sub->refs++;
  om__proxy_subset_unref(slot->subset);
  slot->subset = sub;
  slot->all = all;
  slot->gen = gen;
  slot->hash = hash;
  slot->key_len = kl;
  slot->has_pkey = pkey != NULL;
  slot->pkey_len = pkl;
  slot->denied = denied;
  slot->has_dec = dec != NULL;
}

static int run_policy(om_policy_t *pol, const om_policy_req_t *preq,
                      uint32_t *scratch, om_policy_decision_t *dscratch,
                      om__proxy_route_t *out, char *err, size_t errlen) {
  int decided = 0, rc;
  out->shared = NULL;
  out->all = 0;
  out->n_subset = 0;
  out->key = NULL;
  out->key_len = 0;
  out->decision = NULL;
  rc = om_policy_route_decide(pol, preq, scratch, &out->n_subset, &out->all,
                              &out->key, &out->key_len, dscratch, &decided, err,
                              errlen);
  if (rc == 0 && decided)
    out->decision = dscratch;
  return rc;
}

int om__proxy_cache_route(om__proxy_cache_t *c, om_policy_t *pol,
                          const om_policy_req_t *preq, uint32_t *scratch,
                          om_policy_decision_t *dscratch,
                          om__proxy_route_t *out, char *err, size_t errlen) {
  const char *const *names;
  size_t n_names, kl;
  int method, path, identity, rc;
  char kb[OM__PROXY_CACHE_KEY_MAX];
  uint64_t hash;
  om__proxy_cache_slot_t *slot;
  om__proxy_subset_t *sub = NULL;
  if (!om_policy_vary(pol, &names, &n_names, &method, &path, &identity))
    return run_policy(pol, preq, scratch, dscratch, out, err, errlen);
  if (vary_key(preq, names, n_names, method, path, identity, kb, &kl) != 0 ||
      (c->slots == NULL &&
       (c->slots = calloc(OM__PROXY_CACHE_SLOTS, sizeof *c->slots)) == NULL)) {
    c->misses++; /* too long to cache (or no memory): the policy runs */
    om_metric_inc(c->m_misses);
    return run_policy(pol, preq, scratch, dscratch, out, err, errlen);
  }
  if (c->gen == 0)
    c->gen = 1;
  hash = om_hash(kb, kl, 0);
  slot = &c->slots[hash % OM__PROXY_CACHE_SLOTS];
  if (slot->gen == c->gen && slot->hash == hash && slot->key_len == kl &&
      memcmp(slot->mem, kb, kl) == 0) {
    c->hits++;
    om_metric_inc(c->m_hits);
    memset(out, 0, sizeof *out);
    if (slot->denied) { /* the refusal's reason is where a key would be */
      size_t rl = slot->pkey_len < errlen ? slot->pkey_len : errlen - 1;
      if (errlen > 0) {
        memcpy(err, slot->mem + slot->key_len, rl);
        err[rl] = '\0';
      }
      return OM_POLICY_DENIED;
    }
    if (slot->all) {
      out->all = 1;
      out->n_subset = om_policy_peer_count(pol);
    } else if (slot->subset != NULL) {
      out->shared = slot->subset;
      out->shared->refs++;
      out->n_subset = slot->subset->n;
    }
    out->key = slot->has_pkey ? slot->mem + slot->key_len : NULL;
    out->key_len = slot->pkey_len;
    out->decision = slot->has_dec ? slot->dec : NULL;
    return 0;
  }
  c->misses++;
  om_metric_inc(c->m_misses);
  rc = run_policy(pol, preq, scratch, dscratch, out, err, errlen);
  /* Errors are not cached (each one is logged and counted), nor keys
   * too long for a slot's bound. A refusal is a decision, cached as one. */
  if (rc == OM_POLICY_DENIED) {
    cache_store(slot, c->gen, hash, kb, kl, 0, NULL, err != NULL ? err : "",
                err != NULL ? strlen(err) : 0, 1, NULL);
  } else if (rc == 0 &&
             (out->key == NULL || out->key_len <= OM__PROXY_CACHE_KEY_MAX)) {
    if (!out->all && out->n_subset > 0 &&
        (sub = subset_for(c, scratch, out->n_subset)) == NULL)
      return rc; /* no memory: not stored, the answer is in scratch */
    cache_store(slot, c->gen, hash, kb, kl, out->all, sub, out->key,
                out->key != NULL ? out->key_len : 0, 0, out->decision);
    out->shared = sub; /* subset_for's reference is the caller's now */
  }
  return rc;
}
