/*
 * om_proxy_admin.c: the proxy's admin listener. /metrics (Prometheus text
 * format 0.0.4: the registry's series, then the per-peer and per-pool
 * gauges rendered from live state, so a peer that leaves the topology
 * leaves the exposition too), /status (JSON: policy versions, snapshot
 * revisions, pools, circuit states) and /healthz.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "om_errno.h"
#include "om_http_tls.h"
#include "om_proxy_internal.h"

typedef struct {
  char *buf;
  size_t len, cap;
  int oom;
} sbuf_t;

static void sb_printf(sbuf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void sb_printf(sbuf_t *b, const char *fmt, ...) {
  va_list ap;
  int n;
  if (b->oom)
    return;
  for (;;) {
    size_t room = b->cap - b->len;
    va_start(ap, fmt);
    n = vsnprintf(b->buf ? b->buf + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->oom = 1;
      return;
    }
    if ((size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    {
      size_t cap = b->cap ? b->cap * 2 : 4096;
      char *x;
      while (cap - b->len <= (size_t)n)
        cap *= 2;
      x = realloc(b->buf, cap);
      if (x == NULL) {
        b->oom = 1;
        return;
      }
      b->buf = x;
      b->cap = cap;
    }
  }
}

static const om_http_header_t TEXT[] = {
    {"content-type", "text/plain; version=0.0.4; charset=utf-8", 12, 0}};
static const om_http_header_t JSON[] = {
    {"content-type", "application/json", 12, 16}};

typedef enum {
  G_QUEUE,
  G_INFLIGHT,
  G_LIMIT,
  G_REVISION,
  G_POLICY_VERSION,
  G_POLICY_FAILURES,
  G_PEERS
} gauge_t;

static double service_value(const om__proxy_service_t *s, gauge_t g) {
  switch (g) {
  case G_QUEUE:
    return om_admission_queued(s->adm);
  case G_INFLIGHT:
    return om_admission_inflight(s->adm);
  case G_LIMIT:
    return om_admission_limit(s->adm);
  case G_REVISION:
    return (double)om_snapshot_revision(s->view->snap);
  case G_POLICY_VERSION:
    return s->watch ? (double)om_policy_watch_version(s->watch) : 0;
  case G_POLICY_FAILURES:
    return s->watch ? (double)om_policy_watch_failures(s->watch) : 0;
  default:
    return (double)s->view->n;
  }
}

/* Connections a listener answered 503 at accept for want of descriptors. */
static uint64_t shed_of(const om_http_server_t *srv) {
  const om_http_server_metrics_t *m = om_http_server_metrics(srv);
  return m != NULL ? m->connections_shed : 0;
}

/* The HTTP/2 counters of the listener (docs/PROXY.md "HTTP/2"). */
static void render_h2(const om_proxy_t *p, sbuf_t *b) {
  const om_http_server_metrics_t *m = om_http_server_metrics(p->server);
  if (m == NULL)
    return;
  const struct {
    const char *name, *help;
    uint64_t v;
  } rows[] = {
      {"connections", "HTTP/2 connections accepted.", m->h2_connections},
      {"streams", "HTTP/2 streams (requests) opened.", m->h2_streams},
      {"streams_refused",
       "Streams refused over SETTINGS_MAX_CONCURRENT_STREAMS.", m->h2_refused},
      {"resets", "RST_STREAM frames received.", m->h2_resets},
      {"rapid_reset",
       "Connections told ENHANCE_YOUR_CALM for too many resets a second.",
       m->h2_rapid_reset},
      {"headers_too_large", "Header lists over the limit (431).",
       m->h2_headers_too_large},
      {"continuation_flood", "Header blocks with too many CONTINUATIONs.",
       m->h2_continuation_flood},
      {"protocol_errors", "Sessions ended by a protocol error.",
       m->h2_protocol_errors},
      {"goaway_drain", "GOAWAY sent because the proxy drains.",
       m->h2_goaway_drain},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
    sb_printf(b,
              "# HELP openmesh_proxy_h2_%s_total %s\n"
              "# TYPE openmesh_proxy_h2_%s_total counter\n"
              "openmesh_proxy_h2_%s_total %llu\n",
              rows[i].name, rows[i].help, rows[i].name, rows[i].name,
              (unsigned long long)rows[i].v);
}

static void render_live(const om_proxy_t *p, sbuf_t *b) {
  static const struct {
    gauge_t g;
    const char *name, *type, *help;
  } per_service[] = {
      {G_QUEUE, "openmesh_proxy_queue_depth", "gauge",
       "Calls waiting for an admission slot."},
      {G_INFLIGHT, "openmesh_proxy_inflight", "gauge",
       "Admitted calls in flight."},
      {G_LIMIT, "openmesh_proxy_admission_limit", "gauge",
       "The in-flight limit (max_inflight, or the adaptive limit)."},
      {G_REVISION, "openmesh_proxy_snapshot_revision", "gauge",
       "Revision of the topology in force."},
      {G_POLICY_VERSION, "openmesh_proxy_policy_version", "gauge",
       "Version of the traffic policy in force (1: first load)."},
      {G_POLICY_FAILURES, "openmesh_proxy_policy_reload_failures_total",
       "counter", "Policy reloads rejected (the previous version stayed)."},
      {G_PEERS, "openmesh_proxy_peers", "gauge",
       "Peers in the topology in force."},
  };
  uint64_t now = uv_hrtime();
  char esc[2 * OM_NAME_MAX + 2], pesc[2 * OM_NAME_MAX + 2];
  for (size_t k = 0; k < sizeof per_service / sizeof per_service[0]; k++) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", per_service[k].name,
              per_service[k].help, per_service[k].name, per_service[k].type);
    for (size_t i = 0; i < p->n_services; i++) {
      const om__proxy_service_t *s = p->services[i];
      om_metrics_escape(s->name, esc, sizeof esc);
      sb_printf(b, "%s{service=\"%s\"} %.17g\n", per_service[k].name, esc,
                service_value(s, per_service[k].g));
    }
  }
  sb_printf(b, "# HELP openmesh_proxy_unresolved_peers Peers whose host "
               "name never resolved: not selected.\n"
               "# TYPE openmesh_proxy_unresolved_peers gauge\n");
  for (size_t i = 0; i < p->n_services; i++) {
    om_metrics_escape(p->services[i]->name, esc, sizeof esc);
    sb_printf(b, "openmesh_proxy_unresolved_peers{service=\"%s\"} %zu\n", esc,
              om__proxy_unresolved_peers(p->services[i]));
  }
  sb_printf(b, "# HELP openmesh_proxy_peer_circuit_state Circuit per peer: "
               "0 closed, 1 open, 2 half_open.\n"
               "# TYPE openmesh_proxy_peer_circuit_state gauge\n");
  for (size_t i = 0; i < p->n_services; i++) {
    const om__proxy_service_t *s = p->services[i];
    om_metrics_escape(s->name, esc, sizeof esc);
    for (size_t j = 0; j < s->view->n; j++) {
      const om__proxy_peer_t *peer = s->view->peers[j];
      om_metrics_escape(peer->id, pesc, sizeof pesc);
      sb_printf(b,
                "openmesh_proxy_peer_circuit_state{service=\"%s\",peer=\"%s\"}"
                " %d\n",
                esc, pesc, (int)om__proxy_circuit_state(peer->circuit, now));
    }
  }
  sb_printf(b, "# HELP openmesh_proxy_peer_inflight Attempts in flight per "
               "peer.\n# TYPE openmesh_proxy_peer_inflight gauge\n");
  for (size_t i = 0; i < p->n_services; i++) {
    const om__proxy_service_t *s = p->services[i];
    om_metrics_escape(s->name, esc, sizeof esc);
    for (size_t j = 0; j < s->view->n; j++) {
      const om__proxy_peer_t *peer = s->view->peers[j];
      om_metrics_escape(peer->id, pesc, sizeof pesc);
      sb_printf(b,
                "openmesh_proxy_peer_inflight{service=\"%s\",peer=\"%s\"} "
                "%u\n",
                esc, pesc, peer->inflight);
    }
  }
  sb_printf(b, "# HELP openmesh_proxy_peer_latency_seconds The latency "
               "estimate P2C uses per peer (peak EWMA plus Retry-After "
               "penalty).\n# TYPE openmesh_proxy_peer_latency_seconds "
               "gauge\n");
  for (size_t i = 0; i < p->n_services; i++) {
    const om__proxy_service_t *s = p->services[i];
    om_metrics_escape(s->name, esc, sizeof esc);
    for (size_t j = 0; j < s->view->n; j++) {
      om_metrics_escape(s->view->peers[j]->id, pesc, sizeof pesc);
      sb_printf(b,
                "openmesh_proxy_peer_latency_seconds{service=\"%s\",peer="
                "\"%s\"} %.9g\n",
                esc, pesc, om_p2c_latency_ns(s->view->p2c, j, now) / 1e9);
    }
  }
  sb_printf(b,
            "# HELP openmesh_proxy_accept_shed_total Connections answered 503 "
            "at accept while the process was out of descriptors.\n"
            "# TYPE openmesh_proxy_accept_shed_total counter\n"
            "openmesh_proxy_accept_shed_total{listener=\"proxy\"} %llu\n"
            "openmesh_proxy_accept_shed_total{listener=\"admin\"} %llu\n",
            (unsigned long long)shed_of(p->server),
            (unsigned long long)shed_of(p->admin));
  render_h2(p, b);
}

static void metrics(const om_proxy_t *p, om_http_request_t *req) {
  size_t len = 0;
  char *reg = om_metrics_render(p->metrics, &len);
  sbuf_t b = {0};
  if (reg == NULL) {
    om_http_respond(req, 500, JSON, 1, "{\"reason\":\"out_of_memory\"}\n", 27);
    return;
  }
  sb_printf(&b, "%s", reg);
  free(reg);
  render_live(p, &b);
  if (b.oom) {
    free(b.buf);
    om_http_respond(req, 500, JSON, 1, "{\"reason\":\"out_of_memory\"}\n", 27);
    return;
  }
  om_http_respond(req, 200, TEXT, 1, b.buf, b.len);
  free(b.buf);
}

/* A timeout in ms for /status; null when it is none (NEVER). */
static json_t *ms_or_null(uint64_t ns) {
  return ns == OM_DEADLINE_NEVER ? json_null() : json_real((double)ns / 1e6);
}

/*
 * The service's timeouts as its policy set them (docs/PROXY.md
 * "Timeouts"): a null per_try_timeout_ms is what is left of the deadline,
 * a null max_stream_ms is no limit.
 */
static json_t *timeouts_status(const om__proxy_settings_t *set) {
  return json_pack("{s:o, s:o, s:o, s:o, s:o}", "deadline_ms",
                   ms_or_null(set->deadline_ns), "max_deadline_ms",
                   ms_or_null(set->max_deadline_ns), "per_try_timeout_ms",
                   ms_or_null(set->per_try_ns), "stream_idle_timeout_ms",
                   ms_or_null(set->stream_idle_ns), "max_stream_ms",
                   ms_or_null(set->max_stream_ns));
}

static json_t *service_status(const om__proxy_service_t *s, uint64_t now) {
  json_t *peers = json_array();
  json_t *o;
  for (size_t j = 0; peers != NULL && j < s->view->n; j++) {
    const om__proxy_peer_t *peer = s->view->peers[j];
    om_circuit_state_t st = om__proxy_circuit_state(peer->circuit, now);
    uint64_t until = om__proxy_circuit_open_until(peer->circuit, now);
    json_t *po = json_pack(
        "{s:s, s:s, s:f, s:s, s:I, s:I, s:i, s:I, s:I, s:f}", "id", peer->id,
        "url", peer->url, "weight", peer->weight, "circuit",
        om_circuit_state_name(st), "circuit_open_ms",
        (json_int_t)(until > now ? (until - now) / 1000000 : 0), "trips",
        (json_int_t)om__proxy_circuit_trips(peer->circuit, now), "inflight",
        (int)peer->inflight, "attempts", (json_int_t)peer->attempts, "failures",
        (json_int_t)peer->failures, "latency_ms",
        om_p2c_latency_ns(s->view->p2c, j, now) / 1e6);
    om__proxy_resolve_status(peer, po, now);
    json_array_append_new(peers, po);
  }
  o = json_pack(
      "{s:I, s:{s:s, s:s, s:I, s:I, s:s}, s:{s:i, s:i, s:i, s:i, s:b}, "
      "s:{s:I, s:I, s:I, s:{s:I, s:I}, s:I, s:I}, s:o*}",
      "revision", (json_int_t)om_snapshot_revision(s->view->snap), "policy",
      "path", s->policy_path, "name",
      s->watch ? om_policy_name(om_policy_watch_current(s->watch)) : "",
      "version", (json_int_t)(s->watch ? om_policy_watch_version(s->watch) : 0),
      "reload_failures",
      (json_int_t)(s->watch ? om_policy_watch_failures(s->watch) : 0),
      "last_error", s->watch ? om_policy_watch_last_error(s->watch) : "",
      "pool", "inflight", (int)om_admission_inflight(s->adm), "queued",
      (int)om_admission_queued(s->adm), "limit",
      (int)om_admission_limit(s->adm), "max_queue", (int)s->set.max_queue,
      "adaptive", s->set.adaptive, "calls", "requests", (json_int_t)s->requests,
      "attempts", (json_int_t)s->attempts, "retries", (json_int_t)s->retries,
      "retries_by_phase", "pre_send", (json_int_t)s->retries_pre_send,
      "post_send", (json_int_t)(s->retries - s->retries_pre_send),
      "retry_budget_exhausted", (json_int_t)s->budget_exhausted, "paused",
      (json_int_t)s->paused, "peers", peers);
  if (o != NULL &&
      json_object_set_new(o, "timeouts", timeouts_status(&s->set)) != 0) {
    json_decref(o);
    return NULL;
  }
  if (o != NULL && s->watch != NULL) {
    /* where the active policy came from: "file:PATH" or "control:NAME",
     * and its revision there (the control plane's; 0 for a file) */
    if (om_policy_watch_status(s->watch, json_object_get(o, "policy")) != 0) {
      json_decref(o);
      return NULL;
    }
  }
  if (o != NULL && /* how peers are spoken to: the policy's protocol */
      json_object_set_new(o, "protocol",
                          json_string(s->set.http2 ? "h2" : "http1")) != 0) {
    json_decref(o);
    return NULL;
  }
  if (o != NULL &&
      json_object_set_new(o, "upgrades", om__proxy_tunnel_status(s)) != 0) {
    json_decref(o);
    return NULL;
  }
  if (o != NULL && /* request bodies: 0 max_body_bytes is no limit */
      json_object_set_new(
          o, "body",
          json_pack("{s:I, s:I, s:I}", "max_body_bytes",
                    (json_int_t)s->set.max_body_bytes, "replay_limit",
                    (json_int_t)s->set.replay_limit, "body_idle_timeout_ms",
                    (json_int_t)s->set.body_idle_ms)) != 0) {
    json_decref(o);
    return NULL;
  }
  if (o != NULL && /* peers by name: how often a name is looked up */
      json_object_set_new(
          o, "resolve_interval_ms",
          json_integer((json_int_t)(s->set.resolve_interval_ms
                                        ? s->set.resolve_interval_ms
                                        : 30000))) != 0) {
    json_decref(o);
    return NULL;
  }
  if (o != NULL && /* refused by the policy's authorize (403 forbidden) */
      json_object_set_new(json_object_get(o, "calls"), "denied",
                          json_integer((json_int_t)s->denied)) != 0) {
    json_decref(o);
    return NULL;
  }
  if (o != NULL)
    om__proxy_isolation_status(s, o, now);
  if (o != NULL)
    om__proxy_tls_status(s, o);
  if (o != NULL)
    om__proxy_pool_status(s, o);
  return o;
}

/* The callers' listener's TLS (null: plaintext). */
static json_t *listener_tls_status(const om_http_tls_t *t) {
  const om_http_tls_stats_t *st = om_http_tls_stats(t);
  if (st == NULL)
    return json_null();
  return json_pack(
      "{s:b, s:I, s:{s:I, s:I, s:I}, s:{s:I, s:I}}", "client_certificates",
      om_http_tls_verifies_clients(t), "generation", (json_int_t)st->generation,
      "handshakes", "ok", (json_int_t)st->handshakes[OM_HTTP_TLS_OK], "error",
      (json_int_t)st->handshakes[OM_HTTP_TLS_ERROR], "incomplete",
      (json_int_t)st->handshakes[OM_HTTP_TLS_INCOMPLETE], "reloads", "ok",
      (json_int_t)st->reloads_ok, "error", (json_int_t)st->reloads_error);
}

char *om_proxy_live_metrics(const om_proxy_t *p, size_t *len) {
  sbuf_t b = {0};
  sb_printf(&b, "%s", "");
  render_live(p, &b);
  if (b.oom) {
    free(b.buf);
    return NULL;
  }
  if (len != NULL)
    *len = b.len;
  return b.buf;
}

json_t *om_proxy_status_json(const om_proxy_t *p) {
  uint64_t now = uv_hrtime();
  const om_http_server_metrics_t *sm = om_http_server_metrics(p->server);
  json_t *root = json_object(), *services = json_object();
  if (root != NULL && services != NULL) {
    for (size_t i = 0; i < p->n_services; i++) {
      json_t *o = service_status(p->services[i], now);
      if (o == NULL ||
          json_object_set_new(services, p->services[i]->name, o) != 0)
        goto oom;
    }
    if (json_object_set_new(root, "draining", json_boolean(p->closing)) != 0 ||
        json_object_set_new(root, "local_errors",
                            json_integer((json_int_t)p->local_errors)) != 0 ||
        json_object_set_new(
            root, "replay",
            json_pack("{s:I, s:I, s:I}", "held_bytes",
                      (json_int_t)p->replay_held, "budget_bytes",
                      (json_int_t)p->opts.replay_budget, "refused",
                      (json_int_t)p->replay_refused)) != 0 ||
        json_object_set_new(root, "listener_tls",
                            listener_tls_status(p->opts.server.tls)) != 0 ||
        json_object_set_new(
            root, "connections_accepted",
            json_integer((json_int_t)(sm != NULL ? sm->connections_accepted
                                                 : 0))) != 0 ||
        json_object_set(root, "services", services) != 0)
      goto oom;
    json_decref(services);
    return root;
  }
oom:
  json_decref(services);
  json_decref(root);
  return NULL;
}

static void status(const om_proxy_t *p, om_http_request_t *req) {
  json_t *root = om_proxy_status_json(p);
  char *text = NULL;
  if (root != NULL && p->status_fn != NULL) {
    json_t *extra = p->status_fn(p->status_ud);
    if (extra != NULL && json_object_set_new(root, p->status_key, extra) != 0) {
      json_decref(root);
      root = NULL;
    }
  }
  if (root != NULL)
    text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  if (text == NULL) {
    om_http_respond(req, 500, JSON, 1, "{\"reason\":\"out_of_memory\"}\n", 27);
    return;
  }
  om_http_respond(req, 200, JSON, 1, text, strlen(text));
  free(text);
}

void om__proxy_on_admin(om_http_request_t *req, void *ud) {
  const om_proxy_t *p = ud;
  int get = (req->method_len == 3 && memcmp(req->method, "GET", 3) == 0) ||
            (req->method_len == 4 && memcmp(req->method, "HEAD", 4) == 0);
  if (req->path_len == 8 && memcmp(req->path, "/metrics", 8) == 0 && get) {
    metrics(p, req);
  } else if (req->path_len == 7 && memcmp(req->path, "/status", 7) == 0 &&
             get) {
    status(p, req);
  } else if (req->path_len == 8 && memcmp(req->path, "/healthz", 8) == 0 &&
             get) {
    if (p->closing)
      om_http_respond(req, 503, JSON, 1, "{\"status\":\"draining\"}\n", 22);
    else
      om_http_respond(req, 200, JSON, 1, "{\"status\":\"ok\"}\n", 16);
  } else if ((req->path_len == 8 && (memcmp(req->path, "/metrics", 8) == 0 ||
                                     memcmp(req->path, "/healthz", 8) == 0)) ||
             (req->path_len == 7 && memcmp(req->path, "/status", 7) == 0)) {
    static const om_http_header_t allow[] = {
        {"content-type", "application/json", 12, 16},
        {"allow", "GET, HEAD", 5, 9}};
    om_http_respond(req, 405, allow, 2, "{\"reason\":\"method_not_allowed\"}\n",
                    32);
  } else {
    om_http_respond(req, 404, JSON, 1, "{\"reason\":\"not_found\"}\n", 23);
  }
}
