/*
 * om_proxy_internal.h: the structures shared by om_proxy.c (lifecycle,
 * services, snapshots, policies), om_proxy_call.c (the call path) and
 * om_proxy_admin.c (/metrics, /status, /healthz). The decision cache has
 * its own interface (om_proxy_cache.h). Not a public API.
 */
#ifndef OM_PROXY_INTERNAL_H
#define OM_PROXY_INTERNAL_H

#include <stdint.h>

#include "om_admission.h"
#include "om_circuit.h"
#include "om_deadline.h"
#include "om_limiter.h"
#include "om_metrics.h"
#include "om_p2c.h"
#include "om_policy_watch.h"
#include "om_proxy.h"
#include "om_proxy_cache.h"
#include "om_rendezvous.h"
#include "om_retry.h"
#include "om_rng.h"
#include "om_upstream.h"

typedef struct om__proxy_service_s om__proxy_service_t;

/*
 * One peer, by id, as long as a view or an attempt holds it. Its state
 * outlives snapshot revisions: a new view takes over the record of a peer
 * with the same id and URL.
 */
typedef struct om__proxy_peer_s {
  char *id, *url;
  om_upstream_target_t target;
  char *prefix; /* the URL's path without a trailing '/'; "" when none */
  size_t prefix_len;
  double weight;
  om_circuit_t circuit;
  uint32_t inflight;         /* attempts in flight */
  uint32_t refs;             /* views + attempts holding it */
  int64_t index;             /* in the service's current view; -1: gone */
  int sampled;               /* the P2C estimate has a real sample */
  uint64_t penalty_until_ns; /* end of the latest Retry-After window */
  uint64_t attempts, failures;
} om__proxy_peer_t;

/* The peers of one snapshot revision, immutable once built. */
typedef struct om__proxy_view_s {
  uint32_t refs; /* the service + calls routed on it */
  om_snapshot_t *snap;
  size_t n;
  om__proxy_peer_t **peers; /* n, in snapshot (id) order; refs held */
  om_rendezvous_t *rdv;     /* NULL when n == 0 */
  om_p2c_t *p2c;            /* NULL when n == 0 */
} om__proxy_view_t;

/* Pool and retry settings from a traffic policy (defaults filled in). */
typedef struct om__proxy_settings_s {
  uint32_t max_inflight, max_queue, retries;
  int adaptive, retry_non_idempotent;
  int retry_429; /* the policy's retry_429, else the proxy's --retry-429 */
  om_circuit_opts_t circuit; /* the proxy's, with the policy's circuit = */
  uint64_t deadline_ns, per_try_ns;
} om__proxy_settings_t;

/*
 * How a call ended, for metrics: relayed, cut, client gone, or a reason.
 * Each row is (name, HTTP status of the proxy's own error response, the
 * reason string of its body and of the metric label). The first three are
 * not refusals: status 0, no response of the proxy's own.
 */
#define OM__PROXY_OUTCOME_MAP(XX)                                              \
  XX(OK, 0, "ok")                                                              \
  XX(ABORTED, 0, "aborted")                                                    \
  XX(CLIENT_CLOSED, 0, "client_closed")                                        \
  XX(NO_PEERS, 503, "no_peers")                                                \
  XX(OVERLOADED, 503, "overloaded")                                            \
  XX(DEADLINE, 504, "deadline_exceeded")                                       \
  XX(POLICY_ERROR, 500, "policy_error")                                        \
  XX(ALL_OPEN, 503, "all_circuits_open")                                       \
  XX(UPSTREAM, 502, "upstream")                                                \
  XX(LOCAL, 503, "local_resources")

typedef enum {
#define OM__PROXY_OUTCOME_ENUM(name, status, str) OM__PROXY_##name,
  OM__PROXY_OUTCOME_MAP(OM__PROXY_OUTCOME_ENUM)
#undef OM__PROXY_OUTCOME_ENUM
      OM__PROXY_OUTCOME_COUNT
} om__proxy_outcome_t;

const char *om__proxy_outcome_name(om__proxy_outcome_t o);

/* The HTTP status of the proxy's own response for o; 0 when o is not a
 * refusal (ok, aborted, client_closed) or out of range. */
int om__proxy_outcome_status(om__proxy_outcome_t o);

struct om__proxy_service_s {
  om_proxy_t *proxy;
  char *name;
  const char *policy_path; /* borrowed from the proxy's options */
  om__proxy_view_t *view;  /* current; never NULL once created */
  om_policy_watch_t *watch;
  om__proxy_settings_t set;
  om_admission_t *adm;
  om_limiter_t *limiter; /* when the policy says adaptive */
  om_retry_budget_t *budget;
  uv_timer_t queue_timer; /* queued calls' deadlines */
  uint64_t queue_timer_at;
  int queue_timer_open;
  uint64_t requests, attempts, retries, budget_exhausted, paused;
  om_metric_t *outcomes[OM__PROXY_OUTCOME_COUNT];
  om_metric_t *m_attempts, *m_retries, *m_budget, *m_latency;
  om_circuit_opts_t circuit_applied; /* what the view's circuits run on */
  om__proxy_cache_t cache;           /* the vary policy's decisions */
  /* policy budget overruns and shedding (om_proxy_isolation.c) */
  uint64_t policy_trips, policy_sheds, shed_refused;
  uint64_t trip_window_ns, shed_until_ns, shed_cooldown_ns;
  uint32_t trips_in_window;
  om_metric_t *m_policy_trips, *m_policy_sheds, *m_policy_shed_refused;
};

struct om_proxy_s {
  uv_loop_t *loop;
  om_proxy_opts_t opts; /* strings below are the proxy's copies */
  char *policy_path, *lib_dir;
  om_proxy_service_policy_t *service_policies;
  om_circuit_opts_t circuit;
  om_retry_budget_opts_t budget;
  om_retry_policy_t retry_policy;
  om_retry_policy_t retry_policy_429; /* the same, with 429 retryable */
  om_rng_t rng;
  om_http_server_t *server, *admin;
  om_upstream_pool_t *pool;
  om_metrics_t *metrics;
  om_metric_t *unknown_service; /* no_peers for a Host we do not know */
  om__proxy_service_t **services;
  size_t n_services, cap_services;
  uint32_t *scratch; /* policy route output, sized for the largest view */
  size_t scratch_cap;
  uint64_t calls; /* live call objects */
  int closing, server_open, admin_open, pool_open;
  void (*on_closed)(void *ud);
  void *closed_ud;
  /* local resource errors (om_proxy_isolation.c) */
  uint64_t local_errors, local_log_ns, local_suppressed;
};

/*
 * One call through the proxy, from admission to the caller's answer
 * (om_proxy_call.c). Everything it carries is in one allocation
 * (call_new): bitmaps, the subset, the rank, the forwarded headers, the
 * target and the X-Forwarded-For value.
 */
typedef struct om__proxy_call_s om__proxy_call_t;
struct om__proxy_call_s {
  om_proxy_t *p;
  om__proxy_service_t *s;
  om__proxy_view_t *view; /* the view the policy routed on */
  om_http_request_t *req; /* NULL once released or gone */
  om_admission_waiter_t waiter;
  om__proxy_settings_t set;
  om_deadline_t deadline;
  uint64_t t0;
  /* the subset, as indices into view, and bitmaps over the view */
  uint32_t *subset;
  size_t n_subset, words;
  uint64_t *in_subset, *tried, *exclude;
  uint32_t *rank; /* keyed: the view's rendezvous rank for the key */
  uint64_t key_hash;
  int keyed, ranked;
  const char *idem_key;
  size_t idem_len;
  int replayable, admitted, queued;
  unsigned attempts;
  /* the attempt in flight */
  om__proxy_peer_t *peer;
  om_upstream_req_t *up;
  uint64_t attempt_t0, head_ns;
  int status;           /* of the attempt's response head; 0 before */
  int circuit_pending;  /* allowed, outcome not yet recorded */
  int deadline_limited; /* the attempt's timeout was the deadline */
  int committed, discarding, paused;
  uint64_t wait_ns; /* backoff before the next attempt */
  /* why the latest attempt failed, for the caller's error */
  om_upstream_fail_t last_fail;
  int last_status, last_timeout, last_deadline_limited;
  char last_peer[OM_NAME_MAX + 1];
  uv_timer_t timer; /* backoff */
  int timer_init;
  /* the forwarded request */
  om_http_header_t *fwd;
  size_t n_fwd, n_fwd_fixed;
  char *target; /* prefix + path[?query], rebuilt per peer */
  const char *path_q;
  size_t path_q_len;
  char attempt_buf[24], deadline_buf[24], request_id[33];
  char *xff;
  int local_retried; /* an attempt after a local failure was made */
};

/* om_proxy.c */
om__proxy_service_t *om__proxy_find_service(const om_proxy_t *p,
                                            const char *name, size_t len);
void om__proxy_view_unref(om__proxy_view_t *v);
void om__proxy_peer_unref(om__proxy_peer_t *peer);
om_policy_t *om__proxy_policy(const om__proxy_service_t *s);

/* A call object was freed (the proxy may be waiting for the last one). */
void om__proxy_call_gone(om_proxy_t *p);

/* om_proxy_call.c: the downstream handler, admission and the queue timer. */
void om__proxy_on_request(om_http_request_t *req, void *ud);
void om__proxy_admitted(om_admission_waiter_t *w, int status, void *ud);
void om__proxy_arm_queue_timer(om__proxy_service_t *s);

/* om_proxy_admin.c: the admin listener's handler. */
void om__proxy_on_admin(om_http_request_t *req, void *ud);

/*
 * om_proxy_isolation.c. om__proxy_local_error: a call failed for want of
 * this process's own resources (os_err: the libuv code, or 0 for an
 * allocation): count it by errno and log it, at most once a second.
 */
void om__proxy_local_error(om_proxy_t *p, const char *service, int os_err,
                           const char *detail, uint64_t now);

/* The service's shedding counters, registered under labels. */
void om__proxy_shed_metrics(om_proxy_t *p, om__proxy_service_t *s,
                            const char *labels);

/* A new policy version: no trips, not shed. */
void om__proxy_shed_reset(om__proxy_service_t *s);

/*
 * om__proxy_shed_gate: 1 when the service's policy is shed now: the call
 * must fail with policy_error without running it (err says why and for
 * how long); 0 when the policy may run (after a cooldown, as the probe).
 */
int om__proxy_shed_gate(om__proxy_service_t *s, uint64_t now, char *err,
                        size_t errlen);

/*
 * om__proxy_shed_outcome: what a route call returned (rc; ran: the policy
 * ran, not a cached decision). A budget overrun counts towards shedding;
 * a probe that kept within its budget ends it.
 */
void om__proxy_shed_outcome(om__proxy_service_t *s, int rc, int ran,
                            uint64_t now);

/* Budget and shedding fields into the service's /status object o. */
typedef struct json_t json_t;
void om__proxy_isolation_status(const om__proxy_service_t *s, json_t *o,
                                uint64_t now);

#endif /* OM_PROXY_INTERNAL_H */
