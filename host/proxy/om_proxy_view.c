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

/* ------------------------------------------------------------------ */
/* peers and views */

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

void om__proxy_view_unref(om__proxy_view_t *v) {
  if (v == NULL || --v->refs > 0)
    return;
  for (size_t i = 0; i < v->n; i++)
    om__proxy_peer_unref(v->peers[i]);
  free(v->peers);
  om_rendezvous_free(v->rdv);
  om_p2c_free(v->p2c);
  om_snapshot_unref(v->snap);
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
                         const om__proxy_view_t *old, om_snapshot_t *snap,
                         om__proxy_view_t **out) {
  size_t n = om_snapshot_count(snap), j = 0;
  om__proxy_view_t *v = calloc(1, sizeof *v);
  om_rendezvous_peer_t *rp = NULL;
  double *weights = NULL;
  int rc = OM_ENOMEM;
  if (v == NULL)
    return OM_ENOMEM;
  v->peers = calloc(n ? n : 1, sizeof *v->peers);
  rp = calloc(n ? n : 1, sizeof *rp);
  weights = calloc(n ? n : 1, sizeof *weights);
  if (v->peers == NULL || rp == NULL || weights == NULL)
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
    rp[i].id = peer->id;
    rp[i].weight = in->weight;
    weights[i] = in->weight;
  }
  if (n > 0) {
    om_rendezvous_opts_t ro = {rp, n, 0};
    om_p2c_opts_t po;
    memset(&po, 0, sizeof po);
    po.npeers = n;
    po.weights = weights;
    if ((rc = om_rendezvous_new(&ro, &v->rdv)) != 0 ||
        (rc = om_p2c_new(&po, &v->p2c)) != 0)
      goto fail;
  }
  free(rp);
  free(weights);
  v->snap = om_snapshot_ref(snap);
  v->refs = 1;
  *out = v;
  return 0;
fail:
  free(rp);
  free(weights);
  for (size_t i = 0; i < v->n; i++)
    om__proxy_peer_unref(v->peers[i]);
  free(v->peers);
  om_rendezvous_free(v->rdv);
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

/*
 * Give the policy the view's peers (its Lua view is built once per
 * revision). Returns om_policy_set_peers's code (or OM_ENOMEM).
 */
int om__proxy_policy_set_peers(om_policy_t *pol, const om__proxy_view_t *v) {
  size_t n = v->n, nmd = 0, k = 0;
  om_policy_peer_t *pp;
  om_policy_kv_t *kv;
  int rc;
  for (size_t i = 0; i < n; i++)
    nmd += om_snapshot_instance(v->snap, i)->n_metadata;
  pp = calloc(n ? n : 1, sizeof *pp);
  kv = calloc(nmd ? nmd : 1, sizeof *kv);
  if (pp == NULL || kv == NULL) {
    free(pp);
    free(kv);
    return OM_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    const om_instance_t *in = om_snapshot_instance(v->snap, i);
    pp[i].id = in->id;
    pp[i].url = in->url;
    pp[i].zone = in->zone;
    pp[i].weight = in->weight;
    pp[i].metadata = kv + k;
    pp[i].n_metadata = in->n_metadata;
    for (size_t m = 0; m < in->n_metadata; m++, k++) {
      kv[k].name = in->metadata[m].key;
      kv[k].name_len = strlen(in->metadata[m].key);
      kv[k].value = in->metadata[m].value;
      kv[k].value_len = strlen(in->metadata[m].value);
    }
  }
  rc = om_policy_set_peers(pol, pp, n);
  free(pp);
  free(kv);
  return rc;
}
