/*
 * om_proxy_internal.h: the structures shared by om_proxy.c (lifecycle,
 * services, snapshots, policies), om_proxy_call.c (the call path) and
 * om_proxy_admin.c (/metrics, /status, /healthz). The decision cache has
 * its own interface (om_proxy_cache.h). Not a public API.
 */
#ifndef OM_PROXY_INTERNAL_H
#define OM_PROXY_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "om_admission.h"
#include "om_circuit.h"
#include "om_deadline.h"
#include "om_file_watch.h"
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
#include "om_url.h"

typedef struct om__proxy_service_s om__proxy_service_t;

/*
 * A log line that a flood of calls could repeat (a policy that raises on
 * every request, a process out of descriptors) goes out at most once a
 * second per limiter, saying how many were held back; the metrics count
 * every one.
 */
typedef struct om__proxy_log_limit_s {
  uint64_t last_ns;    /* when the latest line went out; 0: never */
  uint64_t suppressed; /* held back since then */
} om__proxy_log_limit_t;

/* om_proxy_isolation.c: whether a line limited by l may go out at now;
 * when it may, *held is how many were held back since the last one. */
int om__proxy_log_limit(om__proxy_log_limit_t *l, uint64_t now, uint64_t *held);

/* The Upgrade tokens a traffic policy allows (`upgrades`), lower-cased;
 * the contract bounds their number and length. */
#define OM__PROXY_MAX_UPGRADES 8
#define OM__PROXY_UPGRADE_LEN 32
typedef struct {
  size_t n;
  char tok[OM__PROXY_MAX_UPGRADES][OM__PROXY_UPGRADE_LEN];
} om__proxy_upgrades_t;

/* How an upgrade request ended, for openmesh_proxy_upgrades_total:
 * switched (101, tunnel open), declined (the peer answered otherwise),
 * not_allowed (a token the policy does not allow: 403), failed (the
 * hand-over failed). */
enum {
  OM__PROXY_UPG_SWITCHED,
  OM__PROXY_UPG_DECLINED,
  OM__PROXY_UPG_NOT_ALLOWED,
  OM__PROXY_UPG_FAILED,
  OM__PROXY_UPG_COUNT
};

/*
 * One peer, by id, as long as a view or an attempt holds it. Its state
 * outlives snapshot revisions: a new view takes over the record of a peer
 * with the same id and URL.
 */
/*
 * A peer's circuit (om_proxy_circuits.c): one record per service, peer id
 * and URL in the process's table (om_proxy_opts_t.circuits), shared by
 * every worker's peer with that key, or private without a table. Every
 * om_circuit_* call on it goes through these, under the record's lock.
 */
typedef struct om__proxy_circuit_s om__proxy_circuit_t;
om__proxy_circuit_t *om__proxy_circuit_get(om_proxy_circuits_t *t,
                                           const char *service, const char *id,
                                           const char *url,
                                           const om_circuit_opts_t *co);
void om__proxy_circuit_unref(om__proxy_circuit_t *r);
void om__proxy_circuit_init(om__proxy_circuit_t *r,
                            const om_circuit_opts_t *co);
bool om__proxy_circuit_allow(om__proxy_circuit_t *r, uint64_t now);
bool om__proxy_circuit_peek(om__proxy_circuit_t *r, uint64_t now);
void om__proxy_circuit_release(om__proxy_circuit_t *r, uint64_t now);
om_circuit_state_t om__proxy_circuit_record(om__proxy_circuit_t *r,
                                            uint64_t now, bool ok);
om_circuit_state_t om__proxy_circuit_state(om__proxy_circuit_t *r,
                                           uint64_t now);
uint32_t om__proxy_circuit_trips(om__proxy_circuit_t *r, uint64_t now);
uint64_t om__proxy_circuit_open_until(om__proxy_circuit_t *r, uint64_t now);

typedef struct om__proxy_peer_s {
  char *id, *url;
  om_upstream_target_t target;
  char *prefix; /* the URL's path without a trailing '/'; "" when none */
  size_t prefix_len;
  double weight;
  om__proxy_circuit_t *circuit; /* shared by the workers (see above) */
  uint32_t inflight;            /* attempts in flight */
  uint32_t refs;                /* views + attempts holding it */
  int64_t index;                /* in the service's current view; -1: gone */
  int sampled;                  /* the P2C estimate has a real sample */
  uint64_t penalty_until_ns;    /* end of the latest Retry-After window */
  uint64_t attempts, failures;
  /* peers by name (om_proxy_resolve.c): the shared cache entry (NULL for
   * an IP literal), the URL's port, the entry's generation target.addr
   * was taken from, the address in use and the connect failures in a row
   * that moved it */
  struct om__proxy_name_s *name;
  int port;
  uint32_t name_gen, addr_i, addr_fails;
  const char *tls_error; /* the latest TLS handshake failure (static) */
} om__proxy_peer_t;

/*
 * What one snapshot revision of a service is before any worker touches
 * it: the snapshot, checked (every URL is one the proxy can call), the
 * rendezvous hashes of its peers, their weights, and the peers as the
 * traffic policy is given them (pointing into the snapshot). Built once,
 * on the control loop when there are workers, and shared read-only by
 * every worker's view of that revision; refs are atomic. What a worker
 * still does per revision is its own: peers' call state, P2C, the
 * policy's Lua view (om_proxy_view.c).
 */
typedef struct om__proxy_topo_s {
  atomic_size_t refs;
  om_snapshot_t *snap;
  om_rendezvous_t *rdv; /* NULL when empty */
  double *weights;      /* [n] */
  om_policy_peer_t *pp; /* [n] */
  om_policy_kv_t *kv;   /* the metadata pp points into */
} om__proxy_topo_t;

/* The peers of one snapshot revision, immutable once built. */
typedef struct om__proxy_view_s {
  uint32_t refs; /* the service + calls routed on it */
  om__proxy_topo_t *topo;
  om_snapshot_t *snap; /* topo's */
  size_t n;
  om__proxy_peer_t **peers; /* n, in snapshot (id) order; refs held */
  size_t max_prefix;        /* the longest peer URL path prefix */
  om_rendezvous_t *rdv;     /* topo's; NULL when n == 0 */
  om_p2c_t *p2c;            /* this worker's; NULL when n == 0 */
} om__proxy_view_t;

/* Pool and retry settings from a traffic policy (defaults filled in). */
typedef struct om__proxy_settings_s {
  uint32_t max_inflight, max_queue, retries;
  int adaptive, retry_non_idempotent;
  int retry_429; /* the policy's retry_429, else the proxy's --retry-429 */
  om_circuit_opts_t circuit; /* the proxy's, with the policy's circuit = */
  uint64_t deadline_ns, per_try_ns; /* per_try: NEVER = what is left */
  /* after commit (om_proxy_stream.c): no byte either way for
   * stream_idle_ns cuts the stream, and max_stream_ns (NEVER: none) cuts
   * it whatever flows; a caller's deadline header is capped at
   * max_deadline_ns */
  uint64_t stream_idle_ns, max_stream_ns, max_deadline_ns;
  om__proxy_upgrades_t upgrades;
  /* request bodies (om_proxy_body.c): the largest accepted (0: no
   * limit), what is kept for a replay, how long a body may stall */
  uint64_t max_body_bytes, replay_limit, body_idle_ms;
  /* peers by name: how often a resolved name is looked up again (0 until
   * a policy is read: the default) */
  uint64_t resolve_interval_ms;
  /* upstream keep-alive (om_proxy_pool.c), from the policy's `pool`; 0:
   * the default (idle per peer sized from max_inflight and the view, the
   * pool's idle timeout, no request limit) */
  uint64_t pool_max_idle, pool_idle_timeout_ms, pool_max_requests;
  /* the policy's `protocol`: nonzero for "h2c" / "h2", HTTP/2 to every
   * peer (prior knowledge to http://, ALPN to https://) */
  int http2;
  /* gRPC statuses (bit per code) whose Trailers-Only answer is retried:
   * the policy's grpc_retry_on, default UNAVAILABLE */
  uint32_t grpc_retry_mask;
} om__proxy_settings_t;

/*
 * How a call ended, for metrics and logs: relayed, cut, client gone, or a
 * reason. Each row is (name, HTTP status of the proxy's own error
 * response, the outcome label of the metric and the logs, the public
 * reason of the response body, the gRPC status of the Trailers-Only
 * answer a gRPC caller gets instead: docs/PROXY.md "gRPC"). The first
 * three are not refusals: status 0, no response of the proxy's own. The
 * three policy outcomes tell an operator what to fix (the code raised, a
 * budget tripped, the answer was not one); callers see one stable
 * reason, policy_error, for all three.
 */
#define OM__PROXY_OUTCOME_MAP(XX)                                              \
  XX(OK, 0, "ok", "ok", 0)                                                     \
  XX(ABORTED, 0, "aborted", "aborted", 0)                                      \
  XX(CLIENT_CLOSED, 0, "client_closed", "client_closed", 0)                    \
  XX(NO_PEERS, 503, "no_peers", "no_peers", 14)                                \
  XX(OVERLOADED, 503, "overloaded", "overloaded", 14)                          \
  XX(DEADLINE, 504, "deadline_exceeded", "deadline_exceeded", 4)               \
  XX(POLICY_RUNTIME, 500, "policy_runtime", "policy_error", 13)                \
  XX(POLICY_BUDGET, 500, "policy_budget", "policy_error", 13)                  \
  XX(POLICY_ANSWER, 500, "policy_answer", "policy_error", 13)                  \
  XX(ALL_OPEN, 503, "all_circuits_open", "all_circuits_open", 14)              \
  XX(UPSTREAM, 502, "upstream", "upstream", 14)                                \
  XX(UPGRADE_NOT_ALLOWED, 403, "upgrade_not_allowed", "upgrade_not_allowed",   \
     7)                                                                        \
  XX(BODY_TOO_LARGE, 413, "body_too_large", "body_too_large", 8)               \
  XX(BODY_TIMEOUT, 408, "request_timeout", "request_timeout", 4)               \
  XX(LOCAL, 503, "local_resources", "local_resources", 8)                      \
  XX(FORBIDDEN, 403, "forbidden", "forbidden", 7)

typedef enum {
#define OM__PROXY_OUTCOME_ENUM(name, status, label, reason, grpc)              \
  OM__PROXY_##name,
  OM__PROXY_OUTCOME_MAP(OM__PROXY_OUTCOME_ENUM)
#undef OM__PROXY_OUTCOME_ENUM
      OM__PROXY_OUTCOME_COUNT
} om__proxy_outcome_t;

const char *om__proxy_outcome_name(om__proxy_outcome_t o);
/* The reason of the body of the proxy's own response for o (the three
 * policy outcomes share policy_error). */
const char *om__proxy_outcome_reason(om__proxy_outcome_t o);

/* The HTTP status of the proxy's own response for o; 0 when o is not a
 * refusal (ok, aborted, client_closed) or out of range. */
int om__proxy_outcome_status(om__proxy_outcome_t o);

/* The gRPC status code of the proxy's own answer for o to a gRPC caller
 * (14 UNAVAILABLE, 4 DEADLINE_EXCEEDED, ...); 0 when o is no refusal. */
int om__proxy_outcome_grpc(om__proxy_outcome_t o);

#define NS_PER_MS UINT64_C(1000000)

/* gRPC methods a service keeps metrics for (the last is "other"), and
 * the longest "pkg.Service/Method" kept by name (om_proxy_grpc.c) */
#define OM__PROXY_GRPC_METHODS 64
#define OM__PROXY_GRPC_METHOD_LEN 160
typedef struct om__proxy_grpc_method_s om__proxy_grpc_method_t;

struct om__proxy_service_s {
  om_proxy_t *proxy;
  om__proxy_grpc_method_t *grpc; /* OM__PROXY_GRPC_METHODS, made on use */
  size_t n_grpc;
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
  uint64_t retries_pre_send; /* of retries: after nothing was sent */
  om_metric_t *outcomes[OM__PROXY_OUTCOME_COUNT];
  om_metric_t *m_attempts, *m_budget, *m_latency;
  om_metric_t *m_retries_pre, *m_retries_post; /* retries_total{phase} */
  om_metric_t *m_cut_idle, *m_cut_max;         /* streams_cut_total by reason */
  om_metric_t *m_spliced; /* spliced_bytes_total (om_proxy_splice.c) */
  uint64_t spliced_bytes;
  om_circuit_opts_t circuit_applied; /* what the view's circuits run on */
  om__proxy_cache_t cache;           /* the vary policy's decisions */
  /* upgrades (om_proxy_tunnel.c) */
  om_metric_t *m_upgrades[OM__PROXY_UPG_COUNT], *m_tunnels, *m_tunnel_bytes[2];
  uint64_t upgrades[OM__PROXY_UPG_COUNT], tunnels_open;
  om_metric_t *m_body_bytes; /* request body bytes from clients */
  /* policy budget overruns and shedding (om_proxy_isolation.c) */
  uint64_t policy_trips, policy_sheds, shed_refused;
  om__proxy_log_limit_t policy_log; /* proxy_policy_error lines */
  uint64_t trip_window_ns, shed_until_ns, shed_cooldown_ns;
  uint32_t trips_in_window;
  om_metric_t *m_policy_trips, *m_policy_sheds, *m_policy_shed_refused;
  om_metric_t *m_resolve_failures; /* om_proxy_resolve.c */
  uint64_t denied;                 /* calls the policy's authorize refused */
  om_metric_t *m_denied;
  om__proxy_log_limit_t deny_log; /* proxy_denied lines */
  struct om__proxy_tls_s *tls;    /* om_proxy_tls.c; NULL until the policy */
  /* upstream connections its attempts opened and reused (om_proxy_pool.c) */
  uint64_t conns_new, conns_reused;
  om_metric_t *m_conns_new, *m_conns_reused;
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
  int own_metrics;              /* metrics is the proxy's (else opts.metrics) */
  om_metric_t *unknown_service; /* no_peers for a Host we do not know */
  om__proxy_service_t **services;
  size_t n_services, cap_services;
  uint32_t *scratch; /* policy route output, sized for the largest view */
  size_t scratch_cap;
  om_policy_decision_t decision; /* decide's answer, for the call made now */
  uint64_t calls;                /* live call objects */
  int closing, server_open, admin_open, pool_open;
  void (*on_closed)(void *ud);
  void *closed_ud;
  /* local resource errors (om_proxy_isolation.c) */
  uint64_t local_errors;
  /* replay copies held by every call now (om_proxy_body.c), bytes, and the
   * bodies forwarded without one because the budget was spent */
  size_t replay_held;
  uint64_t replay_refused;
  om__proxy_log_limit_t local_log; /* proxy_local_resources lines */
  /* om_proxy_set_status_extra (om_proxy_hooks.c) */
  char status_key[32];
  om_proxy_status_fn status_fn;
  void *status_ud;
  struct om__proxy_resolver_s *resolver; /* peers by name; NULL until one */
  /* TLS to upstreams (om_proxy_tls.c): the context of --upstream-* (the
   * pool's default) and the proxy's copies of those file names */
  om_tls_ctx_t *tls_default;
  om_file_watch_t *tls_watch; /* the --upstream-* files; NULL: none */
  char *upstream_ca, *upstream_cert, *upstream_key;
  struct om_access_log_producer_s *alog; /* this worker's; NULL until used */
};

/*
 * One call through the proxy, from admission to the caller's answer
 * (om_proxy_call.c). Everything it carries is in one allocation
 * (call_new): bitmaps, the subset, the rank, the forwarded headers, the
 * target and the bytes of the fields the proxy builds (X-Forwarded-For,
 * traceparent).
 */
typedef struct om__proxy_call_s om__proxy_call_t;

/* A span of the body kept for a replay: the bytes in the server's read
 * buffer, which the reference keeps (ref NULL: data is a malloc'd copy,
 * taken when the server could not lend the span). */
typedef struct {
  om_http_body_ref_t *ref;
  const char *data;
  size_t len;
} om__proxy_span_t;
/* Peers a call lists as tried before it takes a bitmap over the view. */
#define OM__PROXY_TRIED_INLINE 8

/* om_proxy_call.c: c's k-th subset peer (a view index), k < n_subset. */
#define OM__PROXY_SUBSET_AT(c, k)                                              \
  ((c)->subset != NULL ? (c)->subset[(k)] : (uint32_t)(k))

/* om_proxy_select.c: whether c tried view peer i; mark it tried (0, or
 * OM_ENOMEM when the bitmap a long retry run needs cannot be had: the
 * peer is then not marked); unmark it (it may be picked again). */
int om__proxy_tried(const om__proxy_call_t *c, uint32_t i);
int om__proxy_tried_add(om__proxy_call_t *c, uint32_t i);
void om__proxy_tried_remove(om__proxy_call_t *c, uint32_t i);

/*
 * A call's streamed request body (om_proxy_body.c): read from the client
 * as the attempt in flight takes it, its spans held (by reference, not
 * copied) for a replay while everything so far fits replay_limit (then a
 * retry can re-send it); past that they are let go and the call is no
 * longer replayable.
 */
typedef struct om__proxy_body_s {
  int streamed;             /* the request has a body to forward */
  int started, ended, lost; /* delivery asked for; all in; replay gone */
  int client_paused;        /* we paused the client's body */
  uint64_t received;        /* bytes from the client */
  om__proxy_span_t *replay; /* the spans kept, in order */
  size_t n_replay, replay_cap;
  size_t replay_len; /* their bytes, counted against replay_budget */
} om__proxy_body_t;

struct om__proxy_call_s {
  om_proxy_t *p;
  om__proxy_service_t *s;
  om__proxy_view_t *view; /* the view the policy routed on */
  om_http_request_t *req; /* NULL once released or gone */
  om_admission_waiter_t waiter;
  om__proxy_settings_t set;
  om_deadline_t deadline;
  uint64_t t0;
  /* the subset: every peer of the view (subset NULL), or the indices
   * subset[0..n_subset) held by reference (shared: a cached decision) or
   * in the call's allocation. Nothing here is sized by the view. */
  const uint32_t *subset;
  size_t n_subset;
  om__proxy_subset_t *shared;
  /* the peers tried (view indices): a short list, and a bitmap over the
   * view allocated only when the attempts outgrow the list */
  uint32_t tried_list[OM__PROXY_TRIED_INLINE];
  size_t n_tried;
  uint64_t *tried_map;
  uint64_t key_hash;
  int keyed;
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
  /* the response body relayed by splice(2) (om_proxy_splice.c): wanted
   * (a large Content-Length, plaintext HTTP/1.1 both ways), waiting for
   * the caller's output to drain, running */
  int splice_want, splice_wait;
  struct om_splice_s *splice;
  uint64_t splice_counted; /* of its bytes, those counted in the metric */
  /* the request body the same way (client to upstream) */
  int usplice_want, usplice_wait;
  struct om_splice_s *usplice;
  uint64_t usplice_counted;
  uint64_t wait_ns; /* backoff before the next attempt */
  /* why the latest attempt failed, for the caller's error */
  om_upstream_fail_t last_fail;
  int last_status, last_timeout, last_deadline_limited;
  char last_peer[OM_NAME_MAX + 1];
  uv_timer_t timer; /* backoff before commit, stream timeouts after */
  int timer_init;
  /* the forwarded request */
  om_http_header_t *fwd;
  size_t n_fwd, n_fwd_fixed;
  char *target; /* prefix + path[?query], rebuilt per peer */
  const char *path_q;
  size_t path_q_len;
  char attempt_buf[24], deadline_buf[24], request_id[33];
  char *xff;          /* the buffer of om__proxy_headers_build */
  int retry_pre_send; /* the retry about to start follows a pre-send failure */
  /* the committed stream (om_proxy_stream.c), in loop ms */
  uint64_t stream_t0_ms, stream_last_ms, stream_due_ms;
  int streaming;
  /* an upgrade: the Upgrade list forwarded ("" for none), whether the
   * latest attempt may have reached the peer (then it is never retried),
   * and the relay once the peer switched */
  char upgrade[OM__PROXY_MAX_UPGRADES * (OM__PROXY_UPGRADE_LEN + 2)];
  int upgrade_sent;
  struct om__proxy_tunnel_s *tun;
  om__proxy_body_t body;
  int local_retried; /* an attempt after a local failure was made */
  /* a gRPC call (content-type application/grpc): its retry of a
   * Trailers-Only answer is the policy's grpc_retry_on, not the method's;
   * finished: the response was completed to the caller already (a
   * Trailers-Only relay, or the trailers ended it) */
  int grpc, grpc_retry, finished, last_grpc;
  int grpc_status; /* what the upstream said (-1: nothing yet) */
  om__proxy_grpc_method_t *grpc_m; /* its metrics entry */
  int grpc_deadline; /* the caller sent grpc-timeout: what is left goes on */
  char grpc_timeout_buf[24];
  struct om__proxy_alog_req_s *alog; /* the access log's request part */
};

/*
 * om_proxy_access_log.c: the access log's hooks, no-ops while it is off.
 * _refused: the proxy answered req itself before a call existed (s NULL:
 * no service by that Host). _begin: keep what the line needs of req
 * (call_new; the request is released before the call ends). _end: the
 * call ends with o: its line goes to the worker's buffer.
 */
void om__proxy_access_log_refused(om_proxy_t *p, om__proxy_service_t *s,
                                  const om_http_request_t *req,
                                  om__proxy_outcome_t o);
void om__proxy_access_log_begin(om__proxy_call_t *c,
                                const om_http_request_t *req);
void om__proxy_access_log_end(om__proxy_call_t *c, om__proxy_outcome_t o);

/* om_proxy_pool.c: the upstream keep-alive pool as each service sets it */

/* The idle connections per peer a service's calls let the pool keep: the
 * policy's pool.max_idle_per_peer, else the peer's share of max_inflight
 * over n_peers (at least a small floor). */
size_t om__proxy_pool_max_idle(const om__proxy_settings_t *set, size_t n_peers);
/* The keep-alive limits of c's attempt on ur. */
void om__proxy_pool_request(const om__proxy_call_t *c,
                            om_upstream_request_t *ur);
/* Count the connection an attempt just sent took (new or reused), and
 * when it ends the one a stale keep-alive retry opened. */
void om__proxy_pool_sent(om__proxy_service_t *s, const om_upstream_req_t *up);
void om__proxy_pool_done(om__proxy_service_t *s,
                         const om_upstream_result_t *res);
/* Register s's connection metrics (labels: its service="..." label). */
void om__proxy_pool_metrics(om_proxy_t *p, om__proxy_service_t *s,
                            const char *labels);
/* Add s's `upstream_pool` object to its /status object o. */
void om__proxy_pool_status(const om__proxy_service_t *s, struct json_t *o);

/* om_proxy.c */
om__proxy_service_t *om__proxy_find_service(const om_proxy_t *p,
                                            const char *name, size_t len);
om_policy_t *om__proxy_policy(const om__proxy_service_t *s);

/* om_proxy_view.c */
/* The topology of snap (a reference taken), after om_proxy_check_snapshot
 * (p: any proxy of the process; its state is not read). 0 and *out, or
 * that check's code with err, or OM_ENOMEM. Any thread. */
int om__proxy_topo_new(const om_proxy_t *p, om_snapshot_t *snap,
                       om__proxy_topo_t **out, char *err, size_t errlen);
om__proxy_topo_t *om__proxy_topo_ref(om__proxy_topo_t *t);
void om__proxy_topo_unref(om__proxy_topo_t *t);
void om__proxy_view_unref(om__proxy_view_t *v);
void om__proxy_peer_unref(om__proxy_peer_t *peer);
/* A peer's upstream target from its URL (the one URL rule, om_url.h): a
 * literal gets its address, a name (*is_name set) everything but the
 * address, which om_proxy_resolve.c fills. 0, or OM_EINVAL with *why. */
int om__proxy_peer_target(const char *url, om_upstream_target_t *t, om_url_t *u,
                          int *is_name, const char **why);
/* The view of snap: peers present in old with the same id and URL are
 * taken over (a reference more), others are new (names attached to the
 * service's resolver). Returns 0 and *out (one reference); OM_ENOMEM or
 * another code with nothing built. */
int om__proxy_view_build(om_proxy_t *p, om__proxy_service_t *s,
                         const om_circuit_opts_t *co,
                         const om__proxy_view_t *old, om__proxy_topo_t *topo,
                         om__proxy_view_t **out);
/* Make v the service's current view (taking its reference), carrying each
 * kept peer's selection state over; the old view is released. Cannot
 * fail. */
void om__proxy_view_install(om__proxy_service_t *s, om__proxy_view_t *v);
/* Give the policy the view's peers; with old (the view the policy has
 * now, or NULL), the tables of peers unchanged since old are kept.
 * Returns om_policy_set_peers's code (or OM_ENOMEM). */
int om__proxy_policy_set_peers(om_policy_t *pol, const om__proxy_view_t *v,
                               const om__proxy_view_t *old);
/* om_proxy_set_snapshot with the topology already built (topo: a
 * reference is taken when it is applied). */
int om__proxy_set_topo(om_proxy_t *p, om__proxy_topo_t *topo, char *err,
                       size_t errlen);

/* A call object was freed (the proxy may be waiting for the last one). */
void om__proxy_call_gone(om_proxy_t *p);

typedef struct json_t json_t;

/* Something the closing proxy waits for ended (a name lookup, the
 * resolver's timer): free it if nothing else is left. */
void om__proxy_maybe_finish(om_proxy_t *p);

/*
 * om_proxy_resolve.c: peers whose URL names a host, resolved off the loop
 * (uv_getaddrinfo on libuv's thread pool; or, for tests, a hosts-format
 * file named by OPENMESH_RESOLVE_HOSTS, read on the pool too), cached per
 * service and name, looked up again every resolve_interval_ms (default
 * 30 s) and soon after a connect failure. A lookup that fails keeps the
 * last good addresses; a name that never resolved leaves its peers
 * unselectable (docs/PROXY.md "Peers by name").
 *
 * om__proxy_resolve_attach: peer (of service s, its target made by
 * om_upstream_target_from_url) names host: share or make the cache entry
 * and schedule its first lookup. 0, or OM_ENOMEM (nothing changed).
 */
int om__proxy_resolve_attach(om_proxy_t *p, om__proxy_service_t *s,
                             om__proxy_peer_t *peer, const char *host);
/* The peer is being freed: drop its reference to the cache entry. */
void om__proxy_resolve_detach(om__proxy_peer_t *peer);
/* A named peer's readiness (see om__proxy_peer_ready): resolved at least
 * once; its target then holds the address in use. */
int om__proxy_resolve_ready(om__proxy_peer_t *peer);
/*
 * om__proxy_resolve_outcome: how an attempt on peer ended. A connect
 * failure (CONNECT, TIMEOUT_CONNECT) asks for a new lookup soon and moves
 * the peer to its next address; returns 1 when that address has not
 * failed in this run (the call may pick the peer again: the failure is
 * the address's, not yet the peer's), else 0. Any other outcome ends the
 * run. Literal peers: always 0.
 */
int om__proxy_resolve_outcome(om__proxy_peer_t *peer, om_upstream_fail_t fail,
                              uint64_t now);
/* Peers of s whose host name never resolved (not selected). */
size_t om__proxy_unresolved_peers(const om__proxy_service_t *s);

/* The service's resolution metrics, registered under labels. */
void om__proxy_resolve_metrics(om_proxy_t *p, om__proxy_service_t *s,
                               const char *labels);
/* peer's resolution state into its /status object o. */
void om__proxy_resolve_status(const om__proxy_peer_t *peer, json_t *o,
                              uint64_t now);
/* The proxy is closing: stop the timer, cancel lookups in flight. */
void om__proxy_resolve_close(om_proxy_t *p);
/* Whether a lookup or the timer is still to end (the proxy waits). */
int om__proxy_resolve_busy(const om_proxy_t *p);
/* Free the resolver (every peer is gone, nothing is busy). */
void om__proxy_resolve_free(om_proxy_t *p);

/*
 * Whether peer may take an attempt: its address is known (an IP literal,
 * or a name resolved at least once). Selection skips the others, as it skips
 * open circuits. Cheap for literals: the hot path pays one branch.
 */
static inline int om__proxy_peer_ready(om__proxy_peer_t *peer) {
  return peer->name == NULL || om__proxy_resolve_ready(peer);
}

/* om_proxy.c: a copy of s, or NULL for NULL; sets *bad when out of
 * memory (so a run of copies checks once). */
char *om__proxy_dup_or_null(const char *s, int *bad);

/* om_proxy_call.c: the downstream handler, admission and the queue timer. */
void om__proxy_on_request(om_http_request_t *req, void *ud);
void om__proxy_admitted(om_admission_waiter_t *w, int status, void *ud);
void om__proxy_arm_queue_timer(om__proxy_service_t *s);

/*
 * om_proxy_call.c: cut the committed stream of c now (a stream timeout):
 * the attempt is cancelled, the caller's response aborted (never a clean
 * end: an unterminated chunked body, or a connection closed short of its
 * Content-Length) and c freed, counted as "aborted".
 */
void om__proxy_call_cut(om__proxy_call_t *c);

/*
 * om_proxy_stream.c: the timeouts of a committed stream, one uv timer per
 * call (c->timer, idle since the backoffs are over) re-armed lazily from
 * a last-activity timestamp, so a byte costs a store, not a timer update.
 *
 * om__proxy_stream_start: c's response was committed; from now on
 * c->set.stream_idle_ns without a byte either way, or c->set.max_stream_ns
 * in all, cuts it (om__proxy_call_cut), counted in
 * openmesh_proxy_streams_cut_total and logged. Nothing to undo: the timer
 * is stopped and closed with the call.
 */
void om__proxy_stream_start(om__proxy_call_t *c);

/*
 * om__proxy_stream_activity: a byte of c's stream moved (response body
 * relayed, the client took queued output, request body bytes forwarded
 * after commit). A no-op before om__proxy_stream_start. Costs no syscall.
 */
void om__proxy_stream_activity(om__proxy_call_t *c);

/* End a call: count o, give the admission slot back, free the call. */
void om__proxy_call_end(om__proxy_call_t *c, om__proxy_outcome_t o);

/*
 * om_proxy_splice.c: a committed response body relayed socket to socket
 * with splice(2).
 * _consider: from on_headers once the head is committed: whether this
 * response's body should be spliced. _body: from on_body after its bytes
 * were written to the caller: 1 when the splice takes the rest over (the
 * upstream is paused for it; skip the high-water check), 0 to go on the
 * ordinary way. _stop: cancel a splice running or waiting (before the
 * attempt is cancelled or the caller's response ends); both sockets are
 * given back with the bytes moved.
 */
void om__proxy_splice_consider(om__proxy_call_t *c,
                               const om_upstream_response_t *r);
int om__proxy_splice_body(om__proxy_call_t *c);
void om__proxy_splice_stop(om__proxy_call_t *c);
/* The request body: _upload_consider once the body is known (a large
 * Content-Length, HTTP/1.1); _upload from on_data after its span went to
 * the upstream: 1 when the splice takes the rest over (the client's body
 * is paused for it), 0 to go on copying. */
void om__proxy_splice_upload_consider(om__proxy_call_t *c);
int om__proxy_splice_upload(om__proxy_call_t *c);

/* om_proxy_tunnel.c: upgrades and the tunnel relay. */

/* What to do with req's Upgrade: 0 none (no upgrade asked, or only h2c,
 * which is served over HTTP/1.1), 1 forward out (the list to send), -1
 * refuse (a token s's policy does not allow; *why says which). */
int om__proxy_upgrade_classify(const om__proxy_service_t *s,
                               const om_http_request_t *req, char *out,
                               size_t cap, char *why, size_t why_cap);
/* Count an upgrade outcome (OM__PROXY_UPG_*). */
void om__proxy_upgrade_count(om__proxy_service_t *s, int outcome);
/* A 101 from the peer: take both connections and relay; the verdict for
 * on_headers (nonzero: abort the attempt). */
int om__proxy_tunnel_start(om__proxy_call_t *c,
                           const om_upstream_response_t *r);
/* Register s's upgrade and tunnel metrics (esc: its escaped name). */
void om__proxy_tunnel_metrics(om_proxy_t *p, om__proxy_service_t *s,
                              const char *esc);
struct lua_State;
/* Read the policy table at index t's `upgrades` into *u (default
 * {"websocket"}); validated by the contract. */
void om__proxy_read_upgrades_l(struct lua_State *L, int t,
                               om__proxy_upgrades_t *u);
struct json_t;
/* s's upgrade settings and counters for /status; NULL without memory. */
struct json_t *om__proxy_tunnel_status(const om__proxy_service_t *s);

/* om_proxy_call.c: end the call with o now: the attempt in flight is
 * cancelled (nothing recorded against its peer), the caller gets the
 * proxy's error when nothing was committed, else a cut response. */
void om__proxy_call_refuse(om__proxy_call_t *c, om__proxy_outcome_t o,
                           const char *message);

/*
 * om_proxy_respond.c: the proxy's own answer for outcome o: {"reason",
 * "message"} with X-Openmesh-Attempts when attempts > 0 and X-Request-Id
 * when request_id is not NULL; to a gRPC caller (content-type
 * application/grpc*) Trailers-Only with the outcome's grpc-status.
 * Releases req (om_http_respond does, whatever it returns).
 */
void om__proxy_respond_error(om_http_request_t *req, om__proxy_outcome_t o,
                             const char *message, unsigned attempts,
                             const char *request_id);
/* Whether req is a gRPC call: content-type application/grpc, alone or
 * with a "+proto" or ";" suffix (the gRPC HTTP/2 protocol). */
int om__proxy_is_grpc(const om_http_request_t *req);
/* The code of a gRPC status name ("UNAVAILABLE": 14), -1 for none. */
int om__proxy_grpc_code(const char *name);

/*
 * om_proxy_grpc.c. _split: a gRPC :path "/pkg.Service/Method" into its
 * service and method (0), -1 when it is not one. _status_of: the
 * grpc-status of fields h[0, n) (0..16), -1 for none or a malformed one.
 * _method: s's metrics entry for the method of path (made on first use;
 * "other" past the bound or for a path that is not a method), NULL when
 * out of memory. _count: one call of m ended with status (outside 0..16:
 * UNKNOWN) after elapsed_ns. _free: with the service. _refused: a
 * refusal before any call existed (the access log, and a gRPC caller's
 * method metrics).
 */
int om__proxy_grpc_split(const char *path, size_t len, const char **svc,
                         size_t *svc_len, const char **method,
                         size_t *method_len);
int om__proxy_grpc_status_of(const om_http_header_t *h, size_t n);
/* A committed head without a body to an HTTP/2 caller, h[0, n) its
 * fields (reordered: Content-Length dropped): one HEADERS frame that ends
 * the stream, which is what a gRPC Trailers-Only answer must stay (its
 * grpc-status would otherwise arrive as headers of a stream that ends
 * without trailers). The call is finished; c->req is released. */
void om__proxy_grpc_respond_bodiless(om__proxy_call_t *c, int status,
                                     om_http_header_t *h, size_t n);
om__proxy_grpc_method_t *om__proxy_grpc_method(om__proxy_service_t *s,
                                               const char *path, size_t len);
void om__proxy_grpc_count(om__proxy_service_t *s, om__proxy_grpc_method_t *m,
                          int status, uint64_t elapsed_ns);
void om__proxy_grpc_free(om__proxy_service_t *s);
void om__proxy_refused(om_proxy_t *p, om__proxy_service_t *s,
                       const om_http_request_t *req, om__proxy_outcome_t o);
/* grpc-timeout: parse a caller's into ms (0, or -1 when malformed);
 * format ns for the next hop (its length); the code of a Trailers-Only
 * answer the policy's grpc_retry_on lists, with its pushback (0: not
 * one, -1: a malformed pushback, do not retry). */
int om__proxy_grpc_timeout_parse(const char *v, size_t len, uint64_t *out);
size_t om__proxy_grpc_timeout_format(char *buf, uint64_t ns);
int om__proxy_grpc_retryable(const om__proxy_call_t *c,
                             const om_upstream_response_t *r, uint64_t *push_ns,
                             int *has_push);

/* 403 forbidden for the policy's authorize refusal with its reason,
 * counted, logged at most once a second per service (proxy_denied, with
 * the caller's SPIFFE ID or subject), answered with request id id. */
void om__proxy_deny(om__proxy_service_t *s, om_http_request_t *req,
                    const char *reason, const om_policy_identity_t *who,
                    const char *id, uint64_t now);

/* 413 at the head: the Content-Length passes max (the service's, or the
 * lower one of the policy's decision); counted, answered with id. */
void om__proxy_refuse_body(om__proxy_service_t *s, om_http_request_t *req,
                           uint64_t max, const char *id);

/* om_proxy_body.c: streamed request bodies. */

/* A Content-Length over max_body_bytes (0: no limit): 413 at the head. */
int om__proxy_body_too_large(uint64_t max_body_bytes,
                             const om_http_request_t *req);
/* Set up c's body state when the call is created (c->set is set). */
void om__proxy_body_init(om__proxy_call_t *c);
/* The body's part of an attempt's request. */
void om__proxy_body_request(om__proxy_call_t *c, om_upstream_request_t *ur);
/* The attempt's request was sent: replay what is held, end it if the
 * client's body is in, and (the first time) start reading the client. */
void om__proxy_body_sent(om__proxy_call_t *c);
/* The call's outcome when the client side ended it (on_close): a body
 * stall (408) and an oversized chunked body (413) are the server's
 * answers, the rest is the client going away. */
om__proxy_outcome_t om__proxy_body_close_outcome(const om_http_request_t *req);
/* Free the replay buffer. */
void om__proxy_body_free(om__proxy_call_t *c);
/*
 * om_proxy_select.c: the decisions of the call path (om_proxy_call.c runs
 * the attempts).
 *
 * om__proxy_select_peer: the next peer for c, its circuit's permission
 * taken: the best untried peer of the subset in rendezvous rank (keyed),
 * or a P2C pick among the untried subset peers whose circuit allows
 * (unkeyed). NULL when none; *all_open then says whether untried peers
 * exist but every one is behind an open circuit.
 */
om__proxy_peer_t *om__proxy_select_peer(om__proxy_call_t *c, uint64_t now,
                                        int *all_open);

/* om_retry_decide for c's request as forwarded (its Idempotency-Key is the
 * one the upstream sees) and the given outcome. */
int om__proxy_request_allows(const om__proxy_call_t *c, int status,
                             om_retry_error_t err, om_retry_phase_t phase);

/* What retry rule applies to an attempt that failed with f (NONE: not a
 * failure of the peer that a retry could cure). */
om_retry_error_t om__proxy_retry_class(om_upstream_fail_t f);

/*
 * om__proxy_decide_retry: may c's failed attempt be retried, and after how
 * long (*wait_out, ns)? Every gate of the call path in turn (docs/PROXY.md):
 * attempts left, a replayable body (unless nothing was sent), an upgrade
 * never replayed once sent, the send phase, the method (or
 * Idempotency-Key, or the policy's opt-in) with a retryable outcome, a
 * Retry-After (has_ra, ra_ns) that fits, room in the deadline for a useful
 * attempt after the wait, a peer left in the subset, and last the retry
 * budget (spent only when everything else said yes). Records the phase of
 * the retry for the metrics of the next attempt.
 */
int om__proxy_decide_retry(om__proxy_call_t *c, int status,
                           om_retry_error_t err, om_retry_phase_t phase,
                           int has_ra, uint64_t ra_ns, uint64_t now,
                           uint64_t *wait_out);

/* The Retry-After of a 429/503 head r in *out_ns (RFC 9110 10.2.3), capped
 * at ceiling_ms; 0 when it has none that parses. */
int om__proxy_retry_after(const om_upstream_response_t *r, uint64_t ceiling_ms,
                          uint64_t *out_ns);

/* om_proxy_admin.c: the admin listener's handler. */
void om__proxy_on_admin(om_http_request_t *req, void *ud);

/*
 * om_proxy_headers.c: what the proxy forwards (the rules, RFC 9110 7.6.1,
 * 7.6.3, 11.7 and W3C Trace Context, are listed at the top of that file).
 *
 * om__proxy_headers_size: the header slots (*n_fields) and the bytes
 * (*n_bytes) the forwarded set of req needs, with the header edits of
 * the policy's decision dec (NULL: none): call_new sizes the call's one
 * allocation with them.
 */
void om__proxy_headers_size(const om_http_request_t *req,
                            const om_policy_decision_t *dec, size_t *n_fields,
                            size_t *n_bytes);

/*
 * om__proxy_headers_build: the forwarded set of req into c->fwd
 * (c->n_fwd_fixed fields, at most n_fields of om__proxy_headers_size):
 * the caller's fields without those its Connection names and without the
 * hop-by-hop and proxy-owned ones and those dec edits, then dec's set
 * fields (copied into buf), then ours (X-Forwarded-For, Via,
 * X-Request-Id when the caller has none, traceparent when the caller's is
 * missing or invalid). buf holds n_bytes and must live as long as c
 * (values point into it and into req). Sets c->idem_key to the forwarded
 * Idempotency-Key (NULL when none is forwarded) and c->request_id when it
 * made one. Cannot fail. Uses the proxy's generator (c->p->rng).
 */
void om__proxy_headers_build(om__proxy_call_t *c, const om_http_request_t *req,
                             const om_policy_decision_t *dec, char *buf);

/*
 * om__proxy_response_field_dropped: whether the response field f (of a
 * response with status) is kept from the caller: Proxy-Authenticate, a
 * 204's Content-Length, a chained proxy's X-Openmesh-Peer and
 * X-Openmesh-Attempts (ours replace them).
 */
int om__proxy_response_field_dropped(const om_http_header_t *f, int status);

/* om__proxy_traceparent_valid: v[0, len) is a traceparent the W3C rules
 * accept (version 00 exactly; a later version by its 00 prefix). */
int om__proxy_traceparent_valid(const char *v, size_t len);

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

/* ------------------------------------------------------------------ */
/* om_proxy_tls.c: TLS to a service's https:// peers */

typedef struct om__proxy_tls_s om__proxy_tls_t;

/* A policy version's tls settings, built and waiting for the swap. */
typedef struct {
  void *cfg; /* the new settings and context; NULL: nothing staged */
  int keep;  /* the same as the current ones: nothing changes */
} om__proxy_tls_staged_t;

/* Build the proxy's client context from opts.upstream_* (errors name the
 * flag and the file) and make it the pool's default. */
int om__proxy_tls_init(om_proxy_t *p, char *err, size_t errlen);
void om__proxy_tls_fini(om_proxy_t *p);
/* Watch the --upstream-* files (when any is given): a change reloads
 * every TLS context as SIGHUP does. A watch that cannot start is logged;
 * SIGHUP still works. om__proxy_tls_unwatch stops it (the proxy closing). */
void om__proxy_tls_watch(om_proxy_t *p);
void om__proxy_tls_unwatch(om_proxy_t *p);
void om__proxy_tls_service_free(om__proxy_service_t *s);
/* Read next's tls table and build its context unless it says what the
 * current one says. 0 with *staged; else the version is to be refused
 * (logged, kept for /status, nothing changed). */
int om__proxy_tls_prepare(om__proxy_service_t *s, om_policy_t *next,
                          om__proxy_tls_staged_t *staged);
/* The swap went through: the staged settings become the service's. */
void om__proxy_tls_commit(om__proxy_service_t *s,
                          om__proxy_tls_staged_t *staged);
/* The swap failed: free what was staged. */
void om__proxy_tls_discard(om__proxy_tls_staged_t *staged);
/* The service's context and server name on an upstream request. */
void om__proxy_tls_request(const om__proxy_service_t *s,
                           om_upstream_request_t *ur);
/* Register openmesh_proxy_tls_handshakes_total for s. */
void om__proxy_tls_metrics(om_proxy_t *p, om__proxy_service_t *s);
/* An attempt ended: count its handshake, note and log a failure. */
void om__proxy_tls_done(om__proxy_service_t *s, om__proxy_peer_t *peer,
                        const om_upstream_result_t *res, uint64_t now);
/* The service's "tls" object in /status. */
void om__proxy_tls_status(const om__proxy_service_t *s, json_t *o);

#endif /* OM_PROXY_INTERNAL_H */
