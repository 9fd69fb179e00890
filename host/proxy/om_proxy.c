/*
 * om_proxy.c: the proxy's lifecycle, its services, their snapshots (the
 * om_proxy_set_snapshot seam) and their traffic policies. The peers and
 * views a snapshot becomes are in om_proxy_view.c, the call path in
 * om_proxy_call.c, the admin endpoints in om_proxy_admin.c.
 */
#include "om_proxy.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <strings.h>

#include <lauxlib.h>
#include <lua.h>

#include "om_errno.h"
#include "om_http_tls.h"
#include "om_log.h"
#include "om_paths.h"
#include "om_policy.h"
#include "om_proxy_internal.h"
#include "om_sandbox.h"
#include "om_url.h"

/* Pool settings for a policy that leaves them out (policies/traffic.lua
 * spells out the same values). */
#define DEF_MAX_INFLIGHT 256u
#define DEF_MAX_QUEUE 1024u
#define DEF_DEADLINE_MS 10000.0
/* none: an attempt may wait for its head as long as the deadline has left,
 * as Envoy's per_try_timeout defaults to the route timeout */
#define DEF_PER_TRY_MS INFINITY
/* after commit: a minute of silence either way ends a stream (SSE
 * heartbeats come far more often); no cap on a stream that flows */
#define DEF_STREAM_IDLE_MS 60000.0
#define DEF_MAX_STREAM_MS INFINITY
#define DEF_RETRIES 2u
/* retries beyond this are clamped: the budget bounds them anyway */
#define MAX_RETRIES 100u

#define DEF_BODY_IDLE_MS 30000.0
/* a resolved peer name is looked up again this often */
#define DEF_RESOLVE_MS 30000.0
#define DEF_REPLAY ((size_t)1 << 20)
#define DEF_REPLAY_BUDGET ((size_t)64 << 20)
#define DEF_HIGH_WATER ((size_t)256 << 10)
#define DEF_SPLICE_MIN (UINT64_C(1) << 20)
/* a body this small that came with its head is read whole, not streamed:
 * head and body go upstream in one write (om_proxy_body.c) */
#define WHOLE_BODY_MAX ((size_t)16 << 10)
/* the policy's pool fields are clamped here: the upstream client's
 * ceilings (om_upstream.h), and a request count no connection reaches */
#define POOL_MAX_IDLE 1000000u
#define POOL_MAX_IDLE_MS 4.0e18
#define POOL_MAX_REQUESTS 1.0e18

static const char *const OUTCOME_NAMES[] = {
#define OM__PROXY_OUTCOME_STR(name, status, label, reason, grpc) label,
    OM__PROXY_OUTCOME_MAP(OM__PROXY_OUTCOME_STR)
#undef OM__PROXY_OUTCOME_STR
};

static const char *const OUTCOME_REASONS[] = {
#define OM__PROXY_OUTCOME_REASON(name, status, label, reason, grpc) reason,
    OM__PROXY_OUTCOME_MAP(OM__PROXY_OUTCOME_REASON)
#undef OM__PROXY_OUTCOME_REASON
};

static const int OUTCOME_STATUS[] = {
#define OM__PROXY_OUTCOME_STATUS(name, status, label, reason, grpc) status,
    OM__PROXY_OUTCOME_MAP(OM__PROXY_OUTCOME_STATUS)
#undef OM__PROXY_OUTCOME_STATUS
};

const char *om__proxy_outcome_name(om__proxy_outcome_t o) {
  return (unsigned)o < OM__PROXY_OUTCOME_COUNT ? OUTCOME_NAMES[o] : "unknown";
}

const char *om__proxy_outcome_reason(om__proxy_outcome_t o) {
  return (unsigned)o < OM__PROXY_OUTCOME_COUNT ? OUTCOME_REASONS[o] : "unknown";
}

int om__proxy_outcome_status(om__proxy_outcome_t o) {
  return (unsigned)o < OM__PROXY_OUTCOME_COUNT ? OUTCOME_STATUS[o] : 0;
}

static const int OUTCOME_GRPC[] = {
#define OM__PROXY_OUTCOME_GRPC(name, status, label, reason, grpc) grpc,
    OM__PROXY_OUTCOME_MAP(OM__PROXY_OUTCOME_GRPC)
#undef OM__PROXY_OUTCOME_GRPC
};

int om__proxy_outcome_grpc(om__proxy_outcome_t o) {
  return (unsigned)o < OM__PROXY_OUTCOME_COUNT ? OUTCOME_GRPC[o] : 0;
}

/* ------------------------------------------------------------------ */
/* policy settings */

static double num_field(lua_State *L, int t, const char *name, double def) {
  double v = def;
  lua_pushstring(L, name);
  if (lua_rawget(L, t) == LUA_TNUMBER)
    v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

static int bool_field(lua_State *L, int t, const char *name, int def) {
  int v = def;
  lua_pushstring(L, name);
  if (lua_rawget(L, t) == LUA_TBOOLEAN)
    v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

static uint32_t clamp_u32(double v, uint32_t lo, uint32_t hi) {
  if (!(v >= lo)) /* NaN too: the contract refuses it, be safe anyway */
    return lo;
  return v >= hi ? hi : (uint32_t)v;
}

static uint64_t ms_to_ns(double ms) {
  if (!(ms > 0))
    return 1;
  return ms >= 1.8e13 ? OM_DEADLINE_NEVER : (uint64_t)(ms * 1e6);
}

/* Runs protected (pushing field names may allocate). [policy, settings] */
static int read_settings_l(lua_State *L) {
  om_policy_t *pol = lua_touserdata(L, 1);
  om__proxy_settings_t *set = lua_touserdata(L, 2);
  int t;
  om_policy_push(pol);
  t = lua_gettop(L);
  if (lua_type(L, t) != LUA_TTABLE)
    return luaL_error(L, "the policy is not a table");
  set->max_inflight = clamp_u32(
      num_field(L, t, "max_inflight", DEF_MAX_INFLIGHT), 1, UINT32_MAX / 2);
  set->max_queue =
      clamp_u32(num_field(L, t, "max_queue", DEF_MAX_QUEUE), 0, UINT32_MAX / 2);
  set->retries =
      clamp_u32(num_field(L, t, "retries", DEF_RETRIES), 0, MAX_RETRIES);
  set->adaptive = bool_field(L, t, "adaptive", 0);
  set->retry_non_idempotent = bool_field(L, t, "retry_non_idempotent", 0);
  set->retry_429 = bool_field(L, t, "retry_429", set->retry_429);
  set->deadline_ns = ms_to_ns(num_field(L, t, "deadline_ms", DEF_DEADLINE_MS));
  set->per_try_ns =
      ms_to_ns(num_field(L, t, "per_try_timeout_ms", DEF_PER_TRY_MS));
  set->stream_idle_ns =
      ms_to_ns(num_field(L, t, "stream_idle_timeout_ms", DEF_STREAM_IDLE_MS));
  set->max_stream_ns =
      ms_to_ns(num_field(L, t, "max_stream_ms", DEF_MAX_STREAM_MS));
  /* a caller's deadline is capped here; by default at the service's own */
  set->max_deadline_ns =
      ms_to_ns(num_field(L, t, "max_deadline_ms",
                         num_field(L, t, "deadline_ms", DEF_DEADLINE_MS)));
  /* request bodies: the proxy's values (pre-filled) when the policy is
   * silent; sizes in bytes, validated by the contract */
  set->max_body_bytes =
      (uint64_t)num_field(L, t, "max_body_bytes", (double)set->max_body_bytes);
  set->replay_limit =
      (uint64_t)num_field(L, t, "replay_limit", (double)set->replay_limit);
  set->body_idle_ms =
      (uint64_t)num_field(L, t, "body_idle_timeout_ms", DEF_BODY_IDLE_MS);
  if (set->body_idle_ms > UINT32_MAX)
    set->body_idle_ms = UINT32_MAX;
  /* peers by name (om_proxy_resolve.c); validated by the contract */
  set->resolve_interval_ms =
      (uint64_t)num_field(L, t, "resolve_interval_ms", DEF_RESOLVE_MS);
  lua_pushstring(L, "circuit");
  if (lua_rawget(L, t) == LUA_TTABLE) { /* validated by the contract */
    int c = lua_gettop(L);
    om_circuit_opts_t *co = &set->circuit;
    co->failures =
        clamp_u32(num_field(L, c, "failures", co->failures), 1, UINT32_MAX / 2);
    co->cooldown_ns =
        ms_to_ns(num_field(L, c, "cooldown_ms", (double)co->cooldown_ns / 1e6));
    co->max_cooldown_ns = ms_to_ns(
        num_field(L, c, "max_cooldown_ms", (double)co->max_cooldown_ns / 1e6));
    if (co->max_cooldown_ns < co->cooldown_ns) /* only one of them given */
      co->max_cooldown_ns = co->cooldown_ns;
  }
  lua_pop(L, 1);
  om__proxy_read_upgrades_l(L, t, &set->upgrades);
  lua_pushstring(L, "protocol"); /* validated by the contract */
  set->http2 = lua_rawget(L, t) == LUA_TSTRING &&
               strcmp(lua_tostring(L, -1), "http1") != 0;
  lua_pop(L, 1);
  set->grpc_retry_mask = UINT32_C(1) << 14; /* UNAVAILABLE */
  lua_pushstring(L, "grpc_retry_on");       /* validated by the contract */
  if (lua_rawget(L, t) == LUA_TTABLE) {
    int g = lua_gettop(L);
    set->grpc_retry_mask = 0;
    for (lua_Integer i = 1; lua_rawgeti(L, g, i) == LUA_TSTRING; i++) {
      int code = om__proxy_grpc_code(lua_tostring(L, -1));
      if (code > 0)
        set->grpc_retry_mask |= UINT32_C(1) << code;
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  lua_pushstring(L, "pool");
  if (lua_rawget(L, t) == LUA_TTABLE) { /* validated by the contract */
    int k = lua_gettop(L);
    /* whole numbers; 0 (absent) keeps each default (om_proxy_pool.c) */
    set->pool_max_idle =
        clamp_u32(num_field(L, k, "max_idle_per_peer", 0), 0, POOL_MAX_IDLE);
    set->pool_idle_timeout_ms = (uint64_t)ceil(
        fmax(0, fmin(num_field(L, k, "idle_timeout_ms", 0), POOL_MAX_IDLE_MS)));
    set->pool_max_requests = (uint64_t)fmax(
        0, fmin(num_field(L, k, "max_requests_per_connection", 0),
                POOL_MAX_REQUESTS));
  }
  lua_pop(L, 1);
  return 0;
}

static int read_settings(om_policy_t *pol, om__proxy_settings_t *set) {
  om_sandbox_t *sb = om_policy_sandbox(pol);
  lua_State *L = om_sandbox_state(sb);
  int rc;
  lua_settop(L, 0);
  lua_pushcfunction(L, read_settings_l);
  lua_pushlightuserdata(L, pol);
  lua_pushlightuserdata(L, set);
  rc = om_sandbox_call(sb, 2, 0);
  lua_settop(L, 0);
  return rc == LUA_OK ? 0 : OM_ENOMEM;
}

/*
 * Apply settings to the service's pool. Allocations first, so a failure
 * changes nothing.
 */
/* This worker's share of a process-wide limit (om_proxy_opts_t.workers):
 * the shares of all workers sum to v exactly. */
static uint32_t worker_share(const om_proxy_t *p, uint32_t v, uint32_t min) {
  uint32_t n = p->opts.workers, share;
  if (n <= 1)
    return v;
  share = v / n + (p->opts.worker < v % n ? 1 : 0);
  return share < min ? min : share;
}

static int apply_settings(om__proxy_service_t *s,
                          const om__proxy_settings_t *whole) {
  om__proxy_settings_t shared = *whole, *set = &shared;
  om_admission_t *adm = NULL;
  om_limiter_t *lim = NULL;
  uint32_t limit;
  set->max_inflight = worker_share(s->proxy, set->max_inflight, 1);
  /* the queue is not split: the shared socket spreads connections
   * unevenly (700 and 300 of 1,000 is common), and a worker that holds
   * more than its share of the callers must queue them, not refuse what
   * the process as a whole would have queued (docs/PROXY.md "Workers") */
  /* each worker has its own upstream pool: the policy's idle limit per
   * peer is the process's, shared out like the admission limits (the
   * default follows from the worker's max_inflight share already) */
  if (set->pool_max_idle != 0)
    set->pool_max_idle = worker_share(s->proxy,
                                      set->pool_max_idle > UINT32_MAX
                                          ? UINT32_MAX
                                          : (uint32_t)set->pool_max_idle,
                                      1);
  limit = set->max_inflight;
  if (s->adm == NULL) {
    om_admission_opts_t ao = {set->max_inflight, UINT32_MAX};
    if (om_admission_new(&ao, &adm) != 0)
      return OM_ENOMEM;
  }
  if (set->adaptive && (s->limiter == NULL || !s->set.adaptive ||
                        s->set.max_inflight != set->max_inflight)) {
    om_limiter_opts_t lo;
    om_limiter_opts_init(&lo);
    lo.min_limit = 1;
    lo.max_limit = set->max_inflight;
    lo.initial_limit = set->max_inflight;
    if (om_limiter_new(&lo, &lim) != 0) {
      om_admission_free(adm);
      return OM_ENOMEM;
    }
  }
  if (adm != NULL)
    s->adm = adm;
  if (lim != NULL) {
    om_limiter_free(s->limiter);
    s->limiter = lim;
  } else if (!set->adaptive) {
    om_limiter_free(s->limiter);
    s->limiter = NULL;
  }
  if (s->limiter != NULL)
    limit = om_limiter_limit(s->limiter);
  s->set = *set;
  om_admission_set_limit(s->adm, limit, uv_hrtime(), om__proxy_admitted, NULL);
  om__proxy_arm_queue_timer(s);
  return 0;
}

/*
 * The policy's circuit settings, on every peer of the view. Changed
 * settings start every circuit afresh (closed, no history): a policy edit
 * is a decision about how to judge the peers from now on.
 */
static void apply_circuits(om__proxy_service_t *s) {
  const om_circuit_opts_t *co = &s->set.circuit, *was = &s->circuit_applied;
  if (co->failures == was->failures && co->cooldown_ns == was->cooldown_ns &&
      co->max_cooldown_ns == was->max_cooldown_ns &&
      co->window_ns == was->window_ns &&
      co->min_requests == was->min_requests &&
      co->failure_ratio == was->failure_ratio &&
      co->reset_ns == was->reset_ns &&
      co->probe_timeout_ns == was->probe_timeout_ns)
    return;
  for (size_t i = 0; i < s->view->n; i++)
    om__proxy_circuit_init(s->view->peers[i]->circuit, co);
  s->circuit_applied = *co;
}

/*
 * A new policy version passed validation: give it the current peers and
 * take its settings. Non-zero keeps the previous version.
 */
static int on_policy_swap(void *ud, om_policy_t *next, om_policy_t *prev) {
  om__proxy_service_t *s = ud;
  om__proxy_settings_t set;
  om__proxy_tls_staged_t tls;
  (void)prev;
  om_circuit_t probe;
  memset(&set, 0, sizeof set);
  set.retry_429 = s->proxy->opts.retry_429; /* when the policy is silent */
  set.circuit = s->proxy->circuit;
  set.max_body_bytes = s->proxy->opts.max_body_bytes;
  set.replay_limit = s->proxy->opts.replay_limit;
  if (read_settings(next, &set) != 0 ||
      om__proxy_policy_set_peers(next, s->view, NULL) != 0)
    return -1;
  if (om_circuit_init(&probe, &set.circuit) != 0)
    return -1; /* the contract keeps these valid: be safe anyway */
  if (om__proxy_tls_prepare(s, next, &tls) != 0)
    return -1; /* a TLS file that does not load: logged, in /status */
  om__proxy_cache_invalidate(&s->cache);
  if (apply_settings(s, &set) != 0) {
    om__proxy_tls_discard(&tls);
    return -1;
  }
  om__proxy_tls_commit(s, &tls);
  apply_circuits(s);
  om__proxy_shed_reset(s); /* a new version is judged afresh */
  return 0;
}

om_policy_t *om__proxy_policy(const om__proxy_service_t *s) {
  return om_policy_watch_current(s->watch);
}

/* ------------------------------------------------------------------ */
/* services */

om__proxy_service_t *om__proxy_find_service(const om_proxy_t *p,
                                            const char *name, size_t len) {
  om__proxy_service_t *ci = NULL;
  for (size_t i = 0; i < p->n_services; i++) {
    om__proxy_service_t *s = p->services[i];
    if (strlen(s->name) != len)
      continue;
    if (memcmp(s->name, name, len) == 0)
      return s;
    /* Host is case-insensitive (RFC 9110 4.2.3): an exact match wins */
    if (ci == NULL && strncasecmp(s->name, name, len) == 0)
      ci = s;
  }
  return ci;
}

static const char *policy_for(const om_proxy_t *p, const char *service) {
  for (size_t i = 0; i < p->opts.n_service_policies; i++)
    if (strcmp(p->service_policies[i].service, service) == 0)
      return p->service_policies[i].path;
  return p->policy_path;
}

static void register_metrics(om_proxy_t *p, om__proxy_service_t *s) {
  static const double bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01,
                                  0.025,  0.05,  0.1,    0.25,  0.5,
                                  1,      2.5,   5,      10};
  char esc[2 * OM_NAME_MAX], labels[512];
  om_metrics_escape(s->name, esc, sizeof esc);
  for (int o = 0; o < OM__PROXY_OUTCOME_COUNT; o++) {
    snprintf(labels, sizeof labels, "service=\"%s\",outcome=\"%s\"", esc,
             om__proxy_outcome_name((om__proxy_outcome_t)o));
    s->outcomes[o] = om_metrics_counter(
        p->metrics, "openmesh_proxy_requests_total",
        "Calls by service and outcome (ok: relayed to the end; aborted: "
        "relayed and cut; client_closed; policy_runtime, policy_budget, "
        "policy_answer: the policy raised, overran a budget or answered "
        "no subset, all answered as policy_error; else the reason of the "
        "proxy's error).",
        labels);
  }
  snprintf(labels, sizeof labels, "service=\"%s\"", esc);
  s->m_attempts =
      om_metrics_counter(p->metrics, "openmesh_proxy_attempts_total",
                         "Upstream attempts started.", labels);
  {
    static const char help[] =
        "Attempts after a call's first, by the send phase of the failure "
        "retried (pre_send: no byte of the request had left; post_send).";
    char ph[600];
    snprintf(ph, sizeof ph, "%s,phase=\"pre_send\"", labels);
    s->m_retries_pre = om_metrics_counter(
        p->metrics, "openmesh_proxy_retries_total", help, ph);
    snprintf(ph, sizeof ph, "%s,phase=\"post_send\"", labels);
    s->m_retries_post = om_metrics_counter(
        p->metrics, "openmesh_proxy_retries_total", help, ph);
  }
  s->m_denied = om_metrics_counter(
      p->metrics, "openmesh_proxy_denied_total",
      "Calls the traffic policy's authorize refused (403 forbidden): no "
      "peer was reached.",
      labels);
  s->m_budget = om_metrics_counter(
      p->metrics, "openmesh_proxy_retry_budget_exhausted_total",
      "Retries refused because the service's retry budget was spent.", labels);
  om__proxy_cache_init(&s->cache, p->metrics, labels);
  s->m_latency = om_metrics_histogram(
      p->metrics, "openmesh_proxy_upstream_latency_seconds",
      "Upstream attempt latency to the response head.", labels, bounds,
      sizeof bounds / sizeof bounds[0]);
  {
    static const char help[] =
        "Committed streams cut by a stream timeout (idle: no byte either "
        "way for stream_idle_timeout_ms; max_stream: max_stream_ms "
        "reached).";
    snprintf(labels, sizeof labels, "service=\"%s\",reason=\"idle\"", esc);
    s->m_cut_idle = om_metrics_counter(
        p->metrics, "openmesh_proxy_streams_cut_total", help, labels);
    snprintf(labels, sizeof labels, "service=\"%s\",reason=\"max_stream\"",
             esc);
    s->m_cut_max = om_metrics_counter(
        p->metrics, "openmesh_proxy_streams_cut_total", help, labels);
  }
  om__proxy_tunnel_metrics(p, s, esc);
  snprintf(labels, sizeof labels, "service=\"%s\"", esc);
  s->m_body_bytes =
      om_metrics_counter(p->metrics, "openmesh_proxy_request_body_bytes_total",
                         "Request body bytes read from clients.", labels);
  s->m_spliced = om_metrics_counter(
      p->metrics, "openmesh_proxy_spliced_bytes_total",
      "Response body bytes relayed socket to socket by splice(2).", labels);
  om__proxy_shed_metrics(p, s, labels);
  om__proxy_resolve_metrics(p, s, labels);
  om__proxy_pool_metrics(p, s, labels);
}

static void on_queue_timer_closed(uv_handle_t *h);

static void service_free(om__proxy_service_t *s) {
  om__proxy_cache_free(&s->cache);
  om__proxy_view_unref(s->view);
  om_admission_free(s->adm);
  om_limiter_free(s->limiter);
  om_retry_budget_free(s->budget);
  om__proxy_tls_service_free(s);
  om__proxy_grpc_free(s);
  free(s->name);
  free(s);
}

/* A new service with view v (taken) and its policy loaded. */
static int service_new(om_proxy_t *p, om__proxy_topo_t *topo, char *err,
                       size_t errlen, om__proxy_service_t **out) {
  om_snapshot_t *snap = topo->snap;
  om__proxy_service_t *s = calloc(1, sizeof *s);
  om_policy_watch_opts_t wo;
  char perr[2048];
  int rc;
  if (s == NULL)
    return OM_ENOMEM;
  s->proxy = p;
  s->policy_path = policy_for(p, om_snapshot_service(snap));
  if ((s->name = strdup(om_snapshot_service(snap))) == NULL ||
      om_retry_budget_new(&p->budget, &s->budget) != 0) {
    service_free(s);
    return OM_ENOMEM;
  }
  /* the proxy's circuit settings until the policy's are read */
  s->set.circuit = s->circuit_applied = p->circuit;
  if ((rc = om__proxy_view_build(p, s, &p->circuit, NULL, topo, &s->view)) !=
      0) {
    service_free(s);
    return rc;
  }
  for (size_t i = 0; i < s->view->n; i++)
    s->view->peers[i]->index = (int64_t)i;
  memset(&wo, 0, sizeof wo);
  wo.path = s->policy_path;
  wo.policy.lib_dir = p->lib_dir;
  wo.kind = OM_POLICY_TRAFFIC;
  wo.on_swap = on_policy_swap;
  wo.ud = s;
  rc = om_policy_watch_start(p->loop, &wo, &s->watch, perr, sizeof perr);
  if (rc != 0) {
    om_errbuf(err, errlen, "service '%s': %s", s->name, perr);
    service_free(s);
    return rc == OM_ENOMEM ? OM_ENOMEM : OM_EPOLICY;
  }
  uv_timer_init(p->loop, &s->queue_timer);
  s->queue_timer.data = s;
  s->queue_timer_open = 1;
  s->queue_timer_at = OM_DEADLINE_NEVER;
  register_metrics(p, s);
  om__proxy_tls_metrics(p, s);
  *out = s;
  return 0;
}

static int scratch_reserve(om_proxy_t *p, size_t n) {
  uint32_t *x;
  if (n <= p->scratch_cap)
    return 0;
  x = realloc(p->scratch, n * sizeof *x);
  if (x == NULL)
    return OM_ENOMEM;
  p->scratch = x;
  p->scratch_cap = n;
  return 0;
}

int om_proxy_check_snapshot(const om_proxy_t *p, const om_snapshot_t *snap,
                            char *err, size_t errlen) {
  const char *name;
  size_t n;
  if (p == NULL || snap == NULL) {
    om_errbuf(err, errlen, "invalid arguments");
    return OM_EINVAL;
  }
  name = om_snapshot_service(snap);
  n = om_snapshot_count(snap);
  for (size_t i = 0; i < n; i++) {
    const om_instance_t *in = om_snapshot_instance(snap, i);
    om_upstream_target_t t;
    om_url_t u;
    const char *why = "invalid";
    int is_name;
    if (om__proxy_peer_target(in->url, &t, &u, &is_name, &why) != 0) {
      om_errbuf(err, errlen, "service '%s': instance '%s': url '%s': %s", name,
                in->id, in->url, why);
      return OM_EINVAL;
    }
  }
  return 0;
}

/*
 * Whether snap may replace what p has for its service: 1 to apply, 0 when
 * it is the current revision (nothing to do), or OM_ESTATE (older, or the
 * proxy closing) with err. *sp: the service, NULL when new.
 */
static int snapshot_gate(om_proxy_t *p, const om_snapshot_t *snap, char *err,
                         size_t errlen, om__proxy_service_t **sp) {
  const char *name = om_snapshot_service(snap);
  om__proxy_service_t *s;
  if (p->closing) {
    om_errbuf(err, errlen, "the proxy is closing");
    return OM_ESTATE;
  }
  s = om__proxy_find_service(p, name, strlen(name));
  if (s != NULL && strcmp(s->name, name) != 0)
    s = NULL; /* a case-insensitive match is another service here */
  *sp = s;
  if (s != NULL) {
    uint64_t cur = om_snapshot_revision(s->view->snap);
    if (om_snapshot_revision(snap) < cur) {
      om_errbuf(err, errlen,
                "service '%s': revision %llu is older than the current %llu",
                name, (unsigned long long)om_snapshot_revision(snap),
                (unsigned long long)cur);
      return OM_ESTATE;
    }
    if (om_snapshot_revision(snap) == cur)
      return 0;
  }
  return 1;
}

int om_proxy_set_snapshot(om_proxy_t *p, om_snapshot_t *snap, char *err,
                          size_t errlen) {
  om__proxy_service_t *s;
  om__proxy_topo_t *topo;
  int rc;
  if (p == NULL || snap == NULL) {
    om_errbuf(err, errlen, "invalid arguments");
    return OM_EINVAL;
  }
  if ((rc = snapshot_gate(p, snap, err, errlen, &s)) <= 0)
    return rc;
  if ((rc = om__proxy_topo_new(p, snap, &topo, err, errlen)) != 0)
    return rc;
  rc = om__proxy_set_topo(p, topo, err, errlen);
  om__proxy_topo_unref(topo);
  return rc;
}

int om__proxy_set_topo(om_proxy_t *p, om__proxy_topo_t *topo, char *err,
                       size_t errlen) {
  om_snapshot_t *snap = topo->snap;
  om__proxy_service_t *s;
  om__proxy_view_t *v = NULL;
  const char *name = om_snapshot_service(snap);
  size_t n = om_snapshot_count(snap);
  int rc;
  if ((rc = snapshot_gate(p, snap, err, errlen, &s)) <= 0)
    return rc;
  if (scratch_reserve(p, n) != 0) {
    om_errbuf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  if (s == NULL && p->n_services == p->cap_services) {
    size_t cap = p->cap_services ? 2 * p->cap_services : 4;
    om__proxy_service_t **x = realloc(p->services, cap * sizeof *x);
    if (x == NULL) {
      om_errbuf(err, errlen, "out of memory");
      return OM_ENOMEM;
    }
    p->services = x;
    p->cap_services = cap;
  }
  if (s == NULL) {
    rc = service_new(p, topo, err, errlen, &s);
    if (rc != 0) {
      if (rc == OM_ENOMEM)
        om_errbuf(err, errlen, "out of memory");
      return rc;
    }
    p->services[p->n_services++] = s;
  } else {
    rc = om__proxy_view_build(p, s, &s->circuit_applied, s->view, topo, &v);
    if (rc == 0 && (rc = om__proxy_policy_set_peers(om__proxy_policy(s), v,
                                                    s->view)) != 0) {
      om__proxy_view_unref(v);
      v = NULL;
    }
    if (rc != 0) {
      om_errbuf(err, errlen, "service '%s': %s", name, om_strerror(rc));
      return rc;
    }
    om__proxy_view_install(s, v);
  }
  {
    char rev[24], count[24];
    snprintf(rev, sizeof rev, "%llu",
             (unsigned long long)om_snapshot_revision(snap));
    snprintf(count, sizeof count, "%zu", n);
    om_log(OM_LOG_INFO, "proxy_snapshot", "service", name, "revision", rev,
           "peers", count, NULL);
  }
  return 0;
}

int om_proxy_reload_policies(om_proxy_t *p) {
  int failed = 0;
  if (p == NULL)
    return 0;
  for (size_t i = 0; i < p->n_services; i++)
    if (om_policy_watch_reload(p->services[i]->watch) < 0)
      failed++;
  return failed;
}

/* ------------------------------------------------------------------ */
/* lifecycle */

char *om__proxy_dup_or_null(const char *s, int *bad) {
  char *d;
  if (s == NULL)
    return NULL;
  d = strdup(s);
  if (d == NULL)
    *bad = 1;
  return d;
}

static int readable(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return 0;
  fclose(f);
  return 1;
}

static void proxy_free(om_proxy_t *p) {
  for (size_t i = 0; i < p->n_services; i++)
    service_free(p->services[i]);
  free(p->services);
  for (size_t i = 0; i < p->opts.n_service_policies; i++) {
    free((char *)p->service_policies[i].service);
    free((char *)p->service_policies[i].path);
  }
  free(p->service_policies);
  free(p->policy_path);
  free(p->lib_dir);
  free(p->scratch);
  om__proxy_resolve_free(p);
  om__proxy_tls_fini(p);
  if (p->own_metrics)
    om_metrics_free(p->metrics);
  free(p);
}

/* Every handle and call is gone: free, then tell the owner. */
static void maybe_finish(om_proxy_t *p) {
  void (*cb)(void *);
  void *ud;
  if (!p->closing || p->server_open || p->admin_open || p->pool_open ||
      p->calls > 0 || om__proxy_resolve_busy(p))
    return;
  for (size_t i = 0; i < p->n_services; i++)
    if (p->services[i]->queue_timer_open || p->services[i]->watch != NULL)
      return;
  cb = p->on_closed;
  ud = p->closed_ud;
  proxy_free(p);
  if (cb != NULL)
    cb(ud);
}

void om__proxy_maybe_finish(om_proxy_t *p) {
  maybe_finish(p);
}

void om__proxy_call_gone(om_proxy_t *p) {
  p->calls--;
  if (p->closing)
    maybe_finish(p);
}

static void on_queue_timer_closed(uv_handle_t *h) {
  om__proxy_service_t *s = h->data;
  s->queue_timer_open = 0;
  maybe_finish(s->proxy);
}

static void on_pool_closed(void *ud) {
  om_proxy_t *p = ud;
  p->pool = NULL;
  p->pool_open = 0;
  maybe_finish(p);
}

static void on_admin_closed(om_http_server_t *srv, void *ud) {
  om_proxy_t *p = ud;
  (void)srv;
  p->admin = NULL;
  p->admin_open = 0;
  maybe_finish(p);
}

/*
 * The call listener has drained: every downstream request ended or was
 * cut, so no call is left but those whose timer is still closing.
 */
static void on_server_closed(om_http_server_t *srv, void *ud) {
  om_proxy_t *p = ud;
  (void)srv;
  p->server = NULL;
  p->server_open = 0;
  if (p->admin != NULL)
    om_http_server_close(p->admin, on_admin_closed);
  if (p->pool != NULL)
    om_upstream_pool_close(p->pool, on_pool_closed, p);
  om__proxy_resolve_close(p);
  om__proxy_tls_unwatch(p);
  for (size_t i = 0; i < p->n_services; i++) {
    om__proxy_service_t *s = p->services[i];
    om_policy_watch_stop(s->watch);
    s->watch = NULL;
    if (s->queue_timer_open)
      uv_close((uv_handle_t *)&s->queue_timer, on_queue_timer_closed);
  }
  maybe_finish(p);
}

int om_proxy_new(uv_loop_t *loop, const om_proxy_opts_t *opts, om_proxy_t **out,
                 char *err, size_t errlen) {
  om_proxy_t *p;
  om_http_server_opts_t so;
  int bad = 0, rc;
  if (loop == NULL || opts == NULL || out == NULL) {
    om_errbuf(err, errlen, "invalid arguments");
    return OM_EINVAL;
  }
  if (opts->policy_path == NULL) {
    om_errbuf(err, errlen, "a traffic policy file is required");
    return OM_EINVAL;
  }
  for (size_t i = 0; i < opts->n_service_policies; i++) {
    const om_proxy_service_policy_t *sp = &opts->service_policies[i];
    if (sp->service == NULL || sp->path == NULL ||
        !om_valid_name(sp->service, strlen(sp->service))) {
      om_errbuf(err, errlen,
                "service policy %zu: needs a valid service name "
                "and a file",
                i + 1);
      return OM_EINVAL;
    }
    if (!readable(sp->path)) {
      om_errbuf(err, errlen, "%s: cannot read the policy file", sp->path);
      return OM_ENOTFOUND;
    }
  }
  if (opts->workers > 0 && opts->worker >= opts->workers) {
    om_errbuf(err, errlen, "worker %u of %u", (unsigned)opts->worker,
              (unsigned)opts->workers);
    return OM_EINVAL;
  }
  if (!readable(opts->policy_path)) {
    om_errbuf(err, errlen, "%s: cannot read the policy file",
              opts->policy_path);
    return OM_ENOTFOUND;
  }
  if (opts->circuit != NULL) {
    om_circuit_t probe;
    if (om_circuit_init(&probe, opts->circuit) != 0) {
      om_errbuf(err, errlen, "invalid circuit options");
      return OM_EINVAL;
    }
  }
  if (opts->budget != NULL) {
    om_retry_budget_t *b;
    if ((rc = om_retry_budget_new(opts->budget, &b)) != 0) {
      om_errbuf(err, errlen,
                rc == OM_ENOMEM ? "out of memory"
                                : "invalid retry budget options");
      return rc;
    }
    om_retry_budget_free(b);
  }
  p = calloc(1, sizeof *p);
  if (p == NULL) {
    om_errbuf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  p->loop = loop;
  p->opts = *opts;
  p->policy_path = om__proxy_dup_or_null(opts->policy_path, &bad);
  p->lib_dir =
      om__proxy_dup_or_null(opts->lib_dir ? opts->lib_dir : om_lib_dir(), &bad);
  if (opts->n_service_policies > 0) {
    p->service_policies =
        calloc(opts->n_service_policies, sizeof *p->service_policies);
    if (p->service_policies == NULL) {
      bad = 1;
      p->opts.n_service_policies = 0;
    }
    for (size_t i = 0; p->service_policies && i < opts->n_service_policies;
         i++) {
      p->service_policies[i].service =
          om__proxy_dup_or_null(opts->service_policies[i].service, &bad);
      p->service_policies[i].path =
          om__proxy_dup_or_null(opts->service_policies[i].path, &bad);
    }
  }
  p->opts.service_policies = p->service_policies;
  p->opts.policy_path = p->policy_path;
  p->opts.lib_dir = p->lib_dir;
  if (opts->circuit != NULL) {
    p->circuit = *opts->circuit;
  } else {
    om_circuit_opts_default(&p->circuit);
    p->circuit.probe_timeout_ns = UINT64_C(10000000000);
  }
  p->opts.circuit = &p->circuit;
  if (opts->budget != NULL)
    p->budget = *opts->budget;
  else
    om_retry_budget_opts_default(&p->budget);
  if (opts->workers > 1) /* each worker its share of the reserve */
    p->budget.min_per_s /= opts->workers;
  p->opts.budget = &p->budget;
  om_retry_policy_default(&p->retry_policy);
  p->retry_policy_429 = p->retry_policy;
  om_retry_policy_set_status(&p->retry_policy_429, 429, true);
  if (p->opts.replay_limit == 0)
    p->opts.replay_limit = DEF_REPLAY;
  if (p->opts.replay_budget == 0)
    p->opts.replay_budget = DEF_REPLAY_BUDGET;
  if (p->opts.backoff_base_ms == 0)
    p->opts.backoff_base_ms = 25;
  if (p->opts.backoff_cap_ms == 0)
    p->opts.backoff_cap_ms = 1000;
  if (p->opts.min_attempt_ms == 0)
    p->opts.min_attempt_ms = 5;
  if (p->opts.retry_after_ceiling_ms == 0)
    p->opts.retry_after_ceiling_ms = 10000;
  if (p->opts.high_water == 0)
    p->opts.high_water = DEF_HIGH_WATER;
  if (p->opts.splice_min_bytes == 0)
    p->opts.splice_min_bytes = DEF_SPLICE_MIN;
  om_rng_seed(&p->rng, opts->seed ? opts->seed : uv_hrtime() ^ (uint64_t)p);
  so = opts->server;
  /* bodies are forwarded as they come: the proxy counts them against
   * each service's max_body_bytes (no limit of the server's own unless
   * the caller set one) */
  so.stream_bodies = 1;
  so.whole_body_max = WHOLE_BODY_MAX;
  so.http2 = 1; /* h2c prior knowledge, h2 by ALPN (docs/PROXY.md) */
  if (p->opts.workers > 1 && so.accept_batch == 0)
    so.accept_batch = 1; /* the workers share one socket: spread a burst */
  p->opts.server = so;
  p->own_metrics = opts->metrics == NULL;
  p->metrics = opts->metrics != NULL ? opts->metrics : om_metrics_new();
  if (bad || p->metrics == NULL) {
    proxy_free(p);
    om_errbuf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  p->unknown_service = om_metrics_counter(
      p->metrics, "openmesh_proxy_requests_total",
      "Calls by service and outcome (ok: relayed to the end; aborted: "
      "relayed and cut; client_closed; else the reason of the proxy's "
      "error).",
      "service=\"\",outcome=\"no_peers\"");
  if ((rc = om__proxy_tls_init(p, err, errlen)) != 0) {
    proxy_free(p);
    return rc;
  }
  /* the handles last: once one exists, only an asynchronous close frees */
  rc = om_upstream_pool_new(loop, &p->opts.upstream, &p->pool);
  if (rc != 0) {
    proxy_free(p);
    om_errbuf(err, errlen,
              rc == OM_ENOMEM ? "out of memory"
                              : "invalid upstream pool options");
    return rc;
  }
  rc = om_http_server_new(loop, &so, om__proxy_on_request, p, &p->server);
  if (rc == 0) {
    om_http_server_opts_t ao = opts->server;
    ao.tls = NULL; /* TLS is the callers' listener's; admin stays plain */
    rc = om_http_server_new(loop, &ao, om__proxy_on_admin, p, &p->admin);
    om_http_tls_metrics(so.tls, p->metrics, "openmesh_proxy_listener");
  }
  if (rc != 0) {
    /* close what was opened; once the loop has run, maybe_finish frees */
    om_errbuf(err, errlen,
              rc == OM_ENOMEM ? "out of memory" : "invalid server options");
    p->closing = 1;
    p->pool_open = 1;
    om_upstream_pool_close(p->pool, on_pool_closed, p);
    if (p->server != NULL) {
      p->server_open = 1;
      om_http_server_close(p->server, on_server_closed);
    }
    return rc;
  }
  p->server_open = p->admin_open = p->pool_open = 1;
  om__proxy_tls_watch(p);
  *out = p;
  return 0;
}

int om_proxy_listen(om_proxy_t *p, const char *host, int port) {
  if (p == NULL || host == NULL)
    return OM_EINVAL;
  if (p->closing)
    return OM_ESTATE;
  return om_http_server_listen(p->server, host, port);
}

int om_proxy_listen_fd(om_proxy_t *p, int fd) {
  if (p == NULL || p->closing) {
    if (fd >= 0)
      close(fd);
    return p == NULL ? OM_EINVAL : OM_ESTATE;
  }
  return om_http_server_listen_fd(p->server, fd);
}

int om_proxy_listen_admin(om_proxy_t *p, const char *host, int port) {
  if (p == NULL || host == NULL)
    return OM_EINVAL;
  if (p->closing)
    return OM_ESTATE;
  return om_http_server_listen(p->admin, host, port);
}

int om_proxy_port(const om_proxy_t *p) {
  return p == NULL || p->server == NULL ? OM_ESTATE
                                        : om_http_server_port(p->server);
}

int om_proxy_admin_port(const om_proxy_t *p) {
  return p == NULL || p->admin == NULL ? OM_ESTATE
                                       : om_http_server_port(p->admin);
}

int om_proxy_close(om_proxy_t *p, void (*on_closed)(void *ud), void *ud) {
  if (p == NULL)
    return OM_EINVAL;
  if (p->closing)
    return OM_ESTATE;
  p->closing = 1;
  p->on_closed = on_closed;
  p->closed_ud = ud;
  om_http_server_close(p->server, on_server_closed);
  return 0;
}

/* ------------------------------------------------------------------ */
/* inspection */

int om_proxy_stats(const om_proxy_t *p, const char *service,
                   om_proxy_stats_t *out) {
  om__proxy_service_t *s;
  if (p == NULL || service == NULL || out == NULL)
    return OM_EINVAL;
  s = om__proxy_find_service(p, service, strlen(service));
  if (s == NULL)
    return OM_ENOTFOUND;
  memset(out, 0, sizeof *out);
  out->revision = om_snapshot_revision(s->view->snap);
  if (s->watch != NULL) {
    out->policy_version = om_policy_watch_version(s->watch);
    out->policy_failures = om_policy_watch_failures(s->watch);
  }
  out->requests = s->requests;
  out->attempts = s->attempts;
  out->retries = s->retries;
  out->retries_pre_send = s->retries_pre_send;
  out->budget_exhausted = s->budget_exhausted;
  out->paused = s->paused;
  out->spliced_bytes = s->spliced_bytes;
  out->inflight = om_admission_inflight(s->adm);
  out->queued = om_admission_queued(s->adm);
  out->limit = om_admission_limit(s->adm);
  out->peers = s->view->n;
  out->policy_cache_hits = s->cache.hits;
  out->policy_cache_misses = s->cache.misses;
  out->denied = s->denied;
  return 0;
}

int om_proxy_peer_circuit(const om_proxy_t *p, const char *service,
                          const char *id, om_circuit_state_t *out) {
  om__proxy_service_t *s;
  if (p == NULL || service == NULL || id == NULL || out == NULL)
    return OM_EINVAL;
  s = om__proxy_find_service(p, service, strlen(service));
  if (s == NULL)
    return OM_ENOTFOUND;
  for (size_t i = 0; i < s->view->n; i++)
    if (strcmp(s->view->peers[i]->id, id) == 0) {
      *out = om__proxy_circuit_state(s->view->peers[i]->circuit, uv_hrtime());
      return 0;
    }
  return OM_ENOTFOUND;
}
