/*
 * om_proxy_view.c: the peers of a service and the view one snapshot
 * revision becomes (selection structures, carried-over estimates), and
 * the peers handed to the traffic policy.
 */
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_policy.h"
#include "om_proxy_internal.h"
#include "om_url.h"

void om__proxy_peer_unref(om__proxy_peer_t *peer) {
  if (peer == NULL || --peer->refs > 0)
    return;
  om__proxy_resolve_detach(peer);
  om__proxy_circuit_unref(peer->circuit);
  free(peer->id);
  free(peer->url);
  free(peer->prefix);
  free(peer);
}

/* ------------------------------------------------------------------ */
/* the topology of a revision (shared by the workers) */

static void topo_free(om__proxy_topo_t *t) {
  om_rendezvous_free(t->rdv);
  free(t->weights);
  free(t->pp);
  free(t->kv);
  om_snapshot_unref(t->snap);
  free(t);
}

om__proxy_topo_t *om__proxy_topo_ref(om__proxy_topo_t *t) {
  atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
  return t;
}

void om__proxy_topo_unref(om__proxy_topo_t *t) {
  if (t != NULL &&
      atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) == 1)
    topo_free(t);
}

/* The peers as the traffic policy is given them, into snap's strings. */
static int topo_policy_peers(om__proxy_topo_t *t, size_t n) {
  size_t nmd = 0, k = 0;
  for (size_t i = 0; i < n; i++)
    nmd += om_snapshot_instance(t->snap, i)->n_metadata;
  t->pp = calloc(n ? n : 1, sizeof *t->pp);
  t->kv = calloc(nmd ? nmd : 1, sizeof *t->kv);
  if (t->pp == NULL || t->kv == NULL)
    return OM_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    const om_instance_t *in = om_snapshot_instance(t->snap, i);
    om_policy_peer_t *pe = &t->pp[i];
    pe->id = in->id;
    pe->url = in->url;
    pe->zone = in->zone;
    pe->weight = in->weight;
    pe->metadata = t->kv + k;
    pe->n_metadata = in->n_metadata;
    for (size_t m = 0; m < in->n_metadata; m++, k++) {
      t->kv[k].name = in->metadata[m].key;
      t->kv[k].name_len = strlen(in->metadata[m].key);
      t->kv[k].value = in->metadata[m].value;
      t->kv[k].value_len = strlen(in->metadata[m].value);
    }
  }
  return 0;
}

int om__proxy_topo_new(const om_proxy_t *p, om_snapshot_t *snap,
                       om__proxy_topo_t **out, char *err, size_t errlen) {
  size_t n = om_snapshot_count(snap);
  om__proxy_topo_t *t;
  om_rendezvous_peer_t *rp;
  int rc = om_proxy_check_snapshot(p, snap, err, errlen);
  if (rc != 0)
    return rc;
  if ((t = calloc(1, sizeof *t)) == NULL)
    goto nomem;
  atomic_init(&t->refs, 1);
  t->snap = om_snapshot_ref(snap);
  t->weights = calloc(n ? n : 1, sizeof *t->weights);
  rp = calloc(n ? n : 1, sizeof *rp);
  if (t->weights == NULL || rp == NULL || topo_policy_peers(t, n) != 0) {
    free(rp);
    topo_free(t);
    goto nomem;
  }
  for (size_t i = 0; i < n; i++) {
    const om_instance_t *in = om_snapshot_instance(snap, i);
    rp[i].id = in->id;
    rp[i].weight = in->weight;
    t->weights[i] = in->weight;
  }
  if (n > 0) {
    om_rendezvous_opts_t ro = {rp, n, 0};
    rc = om_rendezvous_new(&ro, &t->rdv);
  }
  free(rp);
  if (rc != 0) {
    topo_free(t);
    om_errbuf(err, errlen, "service '%s': %s", om_snapshot_service(snap),
              om_strerror(rc));
    return rc;
  }
  *out = t;
  return 0;
nomem:
  om_errbuf(err, errlen, "out of memory");
  return OM_ENOMEM;
}

/* ------------------------------------------------------------------ */
/* peers and views */

void om__proxy_view_unref(om__proxy_view_t *v) {
  if (v == NULL || --v->refs > 0)
    return;
  for (size_t i = 0; i < v->n; i++)
    om__proxy_peer_unref(v->peers[i]);
  free(v->peers);
  om_p2c_free(v->p2c);
  om__proxy_topo_unref(v->topo);
  free(v);
}

/*
 * A peer's upstream target and path prefix from its URL (the one URL rule,
 * om_url.h). A literal gets its address here; a name (*is_name set) gets
 * everything but the address, which om_proxy_resolve.c fills. OM_EINVAL
 * with *why for a URL the rule refuses.
 */
int om__proxy_peer_target(const char *url, om_upstream_target_t *t, om_url_t *u,
                          int *is_name, const char **why) {
  int rc = om_url_parse(url, u, why);
  if (rc == 0)
    rc = om_upstream_target_from_url(t, url, why);
  *is_name = rc == OM_ENOTFOUND;
  return rc == 0 || rc == OM_ENOTFOUND ? 0 : OM_EINVAL;
}

static om__proxy_peer_t *peer_new(om_proxy_t *p, om__proxy_service_t *s,
                                  const om_circuit_opts_t *co,
                                  const om_instance_t *in) {
  om__proxy_peer_t *peer = calloc(1, sizeof *peer);
  const char *prefix, *why;
  size_t plen;
  om_url_t u;
  int is_name = 0;
  if (peer == NULL)
    return NULL;
  if (om__proxy_peer_target(in->url, &peer->target, &u, &is_name, &why) != 0 ||
      (peer->id = strdup(in->id)) == NULL ||
      (peer->url = strdup(in->url)) == NULL) {
    free(peer->id);
    free(peer);
    return NULL;
  }
  prefix = u.path;
  plen = u.path_len;
  /* "/api/" + "/x" must read "/api/x" */
  while (plen > 0 && prefix[plen - 1] == '/')
    plen--;
  if ((peer->prefix = malloc(plen + 1)) == NULL) {
    free(peer->id);
    free(peer->url);
    free(peer);
    return NULL;
  }
  memcpy(peer->prefix, prefix, plen);
  peer->prefix[plen] = '\0';
  peer->prefix_len = plen;
  peer->weight = in->weight;
  peer->port = u.port;
  peer->circuit =
      om__proxy_circuit_get(p->opts.circuits, s->name, in->id, in->url, co);
  if (peer->circuit == NULL) {
    free(peer->id);
    free(peer->url);
    free(peer->prefix);
    free(peer);
    return NULL;
  }
  peer->refs = 1;
  peer->index = -1;
  if (is_name && om__proxy_resolve_attach(p, s, peer, u.host) != 0) {
    om__proxy_peer_unref(peer);
    return NULL;
  }
  return peer;
}

/*
 * The view of snap. Peers present in old with the same id and URL are
 * taken over (a reference more), others are new. Both lists are in id
 * order (snapshots sort by id), so one merge pass pairs them.
 */
int om__proxy_view_build(om_proxy_t *p, om__proxy_service_t *s,
                         const om_circuit_opts_t *co,
                         const om__proxy_view_t *old, om__proxy_topo_t *topo,
                         om__proxy_view_t **out) {
  om_snapshot_t *snap = topo->snap;
  size_t n = om_snapshot_count(snap), j = 0;
  om__proxy_view_t *v = calloc(1, sizeof *v);
  int rc = OM_ENOMEM;
  if (v == NULL)
    return OM_ENOMEM;
  v->peers = calloc(n ? n : 1, sizeof *v->peers);
  if (v->peers == NULL)
    goto fail;
  for (size_t i = 0; i < n; i++) {
    const om_instance_t *in = om_snapshot_instance(snap, i);
    om__proxy_peer_t *peer = NULL;
    while (old != NULL && j < old->n && strcmp(old->peers[j]->id, in->id) < 0)
      j++;
    if (old != NULL && j < old->n && strcmp(old->peers[j]->id, in->id) == 0 &&
        strcmp(old->peers[j]->url, in->url) == 0) {
      peer = old->peers[j];
      peer->refs++;
    } else if ((peer = peer_new(p, s, co, in)) == NULL) {
      goto fail;
    }
    peer->weight = in->weight;
    if (peer->prefix_len > v->max_prefix) /* a call's target buffer */
      v->max_prefix = peer->prefix_len;
    v->peers[v->n++] = peer;
  }
  if (n > 0) {
    om_p2c_opts_t po;
    memset(&po, 0, sizeof po);
    po.npeers = n;
    po.weights = topo->weights;
    if ((rc = om_p2c_new(&po, &v->p2c)) != 0)
      goto fail;
  }
  v->topo = om__proxy_topo_ref(topo);
  v->snap = topo->snap;
  v->rdv = topo->rdv;
  v->refs = 1;
  *out = v;
  return 0;
fail:
  for (size_t i = 0; i < v->n; i++)
    om__proxy_peer_unref(v->peers[i]);
  free(v->peers);
  om_p2c_free(v->p2c);
  free(v);
  return rc;
}

/*
 * Make v current: carry each kept peer's P2C state (latency estimate,
 * Retry-After penalty, attempts in flight) from the old view's selector
 * into v's, then re-index the peers. Cannot fail: the new selector has
 * room for every peer and each call is in range.
 */
void om__proxy_view_install(om__proxy_service_t *s, om__proxy_view_t *v) {
  om__proxy_view_t *old = s->view;
  uint64_t now = uv_hrtime();
  for (size_t i = 0; i < v->n; i++) {
    om__proxy_peer_t *peer = v->peers[i];
    uint64_t pen =
        peer->penalty_until_ns > now ? peer->penalty_until_ns - now : 0;
    if (old != NULL && peer->index >= 0 && peer->sampled) {
      double lat = om_p2c_latency_ns(old->p2c, (size_t)peer->index, now);
      double ewma = lat - (double)pen;
      /* the first sample replaces the default: the estimate carries over */
      om_p2c_start(v->p2c, i);
      om_p2c_finish(v->p2c, i, ewma > 0 ? (uint64_t)ewma : 0, 1, now);
    }
    if (pen > 0)
      om_p2c_penalize(v->p2c, i, pen, now);
    for (uint32_t k = 0; k < peer->inflight; k++)
      om_p2c_start(v->p2c, i);
  }
  if (old != NULL)
    for (size_t i = 0; i < old->n; i++)
      old->peers[i]->index = -1;
  for (size_t i = 0; i < v->n; i++)
    v->peers[i]->index = (int64_t)i;
  s->view = v;
  om__proxy_cache_invalidate(&s->cache);
  om__proxy_view_unref(old);
}

static int same_str(const char *a, const char *b) {
  return a == b || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

/* Whether the policy would see a and b (same id) as the same peer. */
static int instance_same(const om_instance_t *a, const om_instance_t *b) {
  if (a->weight != b->weight || a->n_metadata != b->n_metadata ||
      !same_str(a->url, b->url) || !same_str(a->zone, b->zone))
    return 0;
  for (size_t m = 0; m < a->n_metadata; m++)
    if (!same_str(a->metadata[m].key, b->metadata[m].key) ||
        !same_str(a->metadata[m].value, b->metadata[m].value))
      return 0;
  return 1;
}

/*
 * Give the policy the view's peers (its Lua view is built once per
 * revision). With old, a merge over both snapshots (id order) tells the
 * policy which peers are unchanged, so that a change of one instance in
 * 10,000 builds one Lua table, not 10,000. Returns om_policy_set_peers's
 * code (or OM_ENOMEM).
 */
int om__proxy_policy_set_peers(om_policy_t *pol, const om__proxy_view_t *v,
                               const om__proxy_view_t *old) {
  size_t n = v->n, j = 0;
  int32_t *prev = NULL;
  int rc;
  if (old != NULL && old->n > 0 && n > 0 &&
      (prev = malloc(n * sizeof *prev)) != NULL) {
    for (size_t i = 0; i < n; i++) {
      const om_instance_t *in = om_snapshot_instance(v->snap, i);
      int c = 1;
      prev[i] = -1;
      while (j < old->n &&
             (c = strcmp(om_snapshot_instance(old->snap, j)->id, in->id)) < 0)
        j++;
      if (j < old->n && c == 0 &&
          instance_same(om_snapshot_instance(old->snap, j), in))
        prev[i] = (int32_t)j;
    }
  }
  rc = om_policy_set_peers_from(pol, v->topo->pp, n, prev,
                                old != NULL ? (uint64_t)(uintptr_t)old : 0,
                                (uint64_t)(uintptr_t)v);
  free(prev);
  return rc;
}
