/*
 * om_proxy_pool.c: the upstream keep-alive pool as each service sets it
 * (docs/PROXY.md "Upstream keep-alive").
 *
 * The proxy's upstream client keeps one pool for every service, keyed by
 * peer address (and, for TLS, server name and context), so two services
 * that share a peer share its idle connections. A limit fixed in C cannot
 * fit them all: a peer that carries 100 calls at once needs 100 idle
 * connections between bursts, or a fifth of its requests pay a TCP (and
 * TLS) handshake. So every attempt carries its service's limits
 * (om_upstream_request_t's max_idle_per_peer, idle_timeout_ms,
 * max_requests_per_connection) and the client applies them when the
 * connection comes back.
 *
 * By default a peer may keep as many idle connections as it can have
 * calls: its share of the service's max_inflight, ceil(max_inflight /
 * peers in the view), at least POOL_MIN_IDLE (a small service still rides
 * out a burst). A policy's pool.max_idle_per_peer replaces that share.
 * The cost is descriptors and one read buffer per idle connection
 * (om_upstream_pool_opts_t.read_buffer_bytes, 16 KiB): 256 idle
 * connections over 2 peers hold about 4 MiB.
 *
 * Each service counts the connections its attempts opened and the pooled
 * ones they reused (openmesh_proxy_upstream_connections_total{service,
 * reason}), which is how an operator sees a pool that churns: new over
 * new + reused is the share of attempts that paid for a connection.
 */
#include <stdio.h>

#include <jansson.h>

#include "om_proxy_internal.h"

/* idle connections per peer a service keeps whatever its share */
#define POOL_MIN_IDLE 8u
/* the upstream client's own default (om_upstream.h): what applies when
 * neither the policy nor the proxy's upstream options set one */
#define POOL_DEF_IDLE_MS 60000u

size_t om__proxy_pool_max_idle(const om__proxy_settings_t *set,
                               size_t n_peers) {
  size_t share;
  if (set->pool_max_idle != 0)
    return (size_t)set->pool_max_idle;
  if (n_peers == 0)
    return POOL_MIN_IDLE;
  share = ((size_t)set->max_inflight + n_peers - 1) / n_peers;
  return share > POOL_MIN_IDLE ? share : POOL_MIN_IDLE;
}

void om__proxy_pool_request(const om__proxy_call_t *c,
                            om_upstream_request_t *ur) {
  ur->max_idle_per_peer = om__proxy_pool_max_idle(&c->set, c->view->n);
  ur->idle_timeout_ms = c->set.pool_idle_timeout_ms;
  ur->max_requests_per_connection = c->set.pool_max_requests;
}

void om__proxy_pool_sent(om__proxy_service_t *s, const om_upstream_req_t *up) {
  /* counted at the send, so an attempt cancelled later (the caller went
   * away) still counts the connection it opened */
  if (om_upstream_req_reused(up) == 1) {
    s->conns_reused++;
    om_metric_inc(s->m_conns_reused);
  } else {
    s->conns_new++;
    om_metric_inc(s->m_conns_new);
  }
}

void om__proxy_pool_done(om__proxy_service_t *s,
                         const om_upstream_result_t *res) {
  /* beyond the first (counted at the send): a stale keep-alive retry's
   * fresh connection */
  unsigned more = res->connects + res->reuses;
  if (more > 1) {
    s->conns_new += more - 1;
    om_metric_add(s->m_conns_new, more - 1);
  }
}

void om__proxy_pool_metrics(om_proxy_t *p, om__proxy_service_t *s,
                            const char *labels) {
  static const char help[] =
      "Upstream connections the service's attempts used, by reason: new "
      "(opened for the attempt, a stale keep-alive retry's too) or reused "
      "(taken from the keep-alive pool). new / (new + reused) is the share "
      "of attempts that paid for a connection.";
  char l[600];
  snprintf(l, sizeof l, "%s,reason=\"new\"", labels);
  s->m_conns_new = om_metrics_counter(
      p->metrics, "openmesh_proxy_upstream_connections_total", help, l);
  snprintf(l, sizeof l, "%s,reason=\"reused\"", labels);
  s->m_conns_reused = om_metrics_counter(
      p->metrics, "openmesh_proxy_upstream_connections_total", help, l);
}

/* The idle connections the pool holds now for the peers of s's view
 * (under the key s's requests use: its TLS context and server name). */
static uint64_t idle_now(const om__proxy_service_t *s) {
  uint64_t n = 0;
  for (size_t i = 0; i < s->view->n; i++) {
    const om__proxy_peer_t *peer = s->view->peers[i];
    om_upstream_request_t ur = {0};
    om_upstream_stats_t st;
    ur.http2 = s->set.http2; /* HTTP/2 connections are a key of their own */
    if (peer->target.addr.sa.sa_family == AF_UNSPEC)
      continue; /* a name not resolved yet: no connection */
    if (peer->target.tls)
      om__proxy_tls_request(s, &ur);
    if (om_upstream_peer_stats_for(s->proxy->pool, &peer->target, &ur, &st) ==
        0)
      n += st.idle;
  }
  return n;
}

void om__proxy_pool_status(const om__proxy_service_t *s, json_t *o) {
  const om__proxy_settings_t *set = &s->set;
  uint64_t idle_ms = set->pool_idle_timeout_ms;
  json_t *j;
  if (idle_ms == 0)
    idle_ms = s->proxy->opts.upstream.idle_timeout_ms != 0
                  ? s->proxy->opts.upstream.idle_timeout_ms
                  : POOL_DEF_IDLE_MS;
  j = json_pack(
      "{s:I, s:I, s:I, s:I, s:I, s:I}", "max_idle_per_peer",
      (json_int_t)om__proxy_pool_max_idle(set, s->view->n), "idle_timeout_ms",
      (json_int_t)idle_ms, "max_requests_per_connection",
      (json_int_t)set->pool_max_requests, "idle", (json_int_t)idle_now(s),
      "connections_new", (json_int_t)s->conns_new, "connections_reused",
      (json_int_t)s->conns_reused);
  if (j != NULL)
    json_object_set_new(o, "upstream_pool", j);
}
