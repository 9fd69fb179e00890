/*
 * om_control_internal.h: what the control plane's files share
 * (om_control.c: routing, answers and lifetime; om_control_watch.c:
 * watches and fan-out; om_control_handlers.c: the other handlers). Not an
 * interface: only host/control includes it.
 */
#ifndef OM_CONTROL_INTERNAL_H
#define OM_CONTROL_INTERNAL_H

#include "om_list.h"
#include "om_control.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "om_errno.h"
#include "om_hash.h"
#include "om_log.h"
#include "om_metrics.h"
#include "om_paths.h"
#include "om_policy.h"
#include "om_snapshot_json.h"
#include "om_sse.h"
#include "om_config_status.h"

#define MAX_SEGMENTS 8
#define MAX_TOKEN_HEADER 4200
#define POLICY_ERR_MAX 1024

/* ------------------------------------------------------------------ */
/* vocabulary */

/*
 * Why we refused a request: the HTTP status it is answered with, and the
 * "error" member and metric label. A call site names the reason only.
 */
#define CONTROL_REJECT_MAP(XX)                                                 \
  XX(UNAUTHORIZED, 401, "unauthorized")                                        \
  XX(FORBIDDEN, 403, "forbidden")                                              \
  XX(NOT_FOUND, 404, "not_found")                                              \
  XX(METHOD_NOT_ALLOWED, 405, "method_not_allowed")                            \
  XX(INVALID_JSON, 400, "invalid_json")                                        \
  XX(INVALID_FIELD, 400, "invalid_field")                                      \
  XX(INVALID_POLICY, 422, "invalid_policy")                                    \
  XX(TOO_LARGE, 413, "too_large")                                              \
  XX(UNSUPPORTED_MEDIA_TYPE, 415, "unsupported_media_type")                    \
  XX(REVISION_CHANGED, 409, "revision_changed")                                \
  XX(UNAVAILABLE, 503, "unavailable")                                          \
  XX(SHUTTING_DOWN, 503, "shutting_down")                                      \
  XX(INVALID_HEADER, 400, "invalid_header")

typedef enum {
#define REJ_ENUM(name, status, str) REJ_##name,
  CONTROL_REJECT_MAP(REJ_ENUM)
#undef REJ_ENUM
      REJ__COUNT
} rej_t;

/* Latency histogram labels. */
enum {
  L_REGISTER,
  L_HEARTBEAT,
  L_DEREGISTER,
  L_DISCOVERY,
  L_LIST,
  L_WATCH,
  L_CONFIG_GET,
  L_CONFIG_PUT,
  L_OPS,
  L_CONFIG_REPORT,
  L_OTHER,
  L__COUNT
};

enum {
  M_GET = 1,
  M_HEAD = 2,
  M_PUT = 4,
  M_POST = 8,
  M_DELETE = 16,
  M_OPTIONS = 32
};

typedef enum {
  R_NONE = -1,
  R_HEALTHZ,
  R_READYZ,
  R_METRICS,
  R_STATUS,
  R_SERVICES,
  R_SERVICE,
  R_INSTANCE,
  R_HEARTBEAT,
  R_WATCH_ALL,
  R_WATCH_SERVICE,
  R_CONFIG,
  R_WATCH_CONFIG,
  R_CONFIG_STATUS,
  R_UI,
  R_LEASES,
  R__COUNT
} route_t;

/* ------------------------------------------------------------------ */
/* types */

typedef enum { T_SERVICE = 0, T_ALL = 1, T_CONFIG = 2 } tkind_t;

typedef struct watcher_s watcher_t;

typedef struct topic_s {
  tkind_t kind;
  char name[OM_NAME_MAX + 1]; /* "" for T_ALL */
  om_list_t watchers;         /* watcher_t by link, newest first */
  size_t n;
  int busy;             /* being walked: kept even when empty */
  om_config_doc_t *doc; /* T_CONFIG: the document ev encodes */
  char *ev;
  size_t ev_len;
} topic_t;

struct watcher_s {
  om_list_t link; /* on its topic's watchers while the stream is on */
  topic_t *topic; /* NULL once the stream is over */
  om_control_t *c;
  om_http_request_t *req; /* NULL once released */
  int refs;               /* the stream + each store read in flight */
  int ready;              /* T_ALL: the initial burst has been written */
  int has_last_id;
  uint64_t last_id;
  uint64_t last_rev; /* T_SERVICE/T_CONFIG: newest revision sent or known */
  om_snapshot_t **burst;
  size_t n_burst, cap_burst;
  int outstanding; /* T_ALL: burst reads still to come */
  int cred, role;  /* what let it in (ctx_t), rechecked on a tokens reload */
  om_auth_digest_t digest;
  /* T_SERVICE/T_CONFIG: the newest state not yet written because the
   * client has not taken the previous one (one reference); written when
   * its output drains, replaced by a newer one meanwhile */
  om_snapshot_t *held_snap;
  om_config_doc_t *held_doc;
  /* coalescing (?min_interval_ms, raised to the plane's floor): at most
   * one event per interval_ms; a change inside the window waits in due_*
   * (the newest; T_ALL: the newest of each service) and the timer writes
   * it at the window's end, so the last change is never lost */
  uint64_t interval_ms;
  uint64_t last_write_ms; /* uv_now of the last event written (wrote) */
  int wrote;
  uv_timer_t *timer; /* interval_ms > 0: holds a reference while open */
  om_snapshot_t *due_snap;
  om_config_doc_t *due_doc;
  om_snapshot_t **due_all;
  size_t n_due_all, cap_due_all;
};

typedef struct metrics_s {
  om_metric_t *registrations, *renewals, *deletions, *expiries;
  om_metric_t *revision, *services, *instances, *stale, *uptime;
  om_metric_t *watchers, *events, *pings, *dropped;
  om_metric_t *revoked;   /* streams ended by a tokens reload */
  om_metric_t *coalesced; /* states held for a busy watcher (superseded) */
  om_metric_t *reload_ok, *reload_failed;
  om_metric_t *conn_accepted, *conn_active, *conn_rejected;
  om_metric_t *conn_reserved, *reserve_evicted; /* the health reserve */
  om_metric_t *http_requests, *http_aborted;
  om_metric_t *rej[REJ__COUNT];
  om_metric_t *http_rej[OM_HTTP_REJECT__COUNT];
  om_metric_t *over_capacity;
  om_metric_t *latency[L__COUNT];
  /* policy verdicts proxies reported: applied, refused, invalid (a
   * report the plane refused), evicted (a full table made room) */
  om_metric_t *reports[4];
  om_metric_t *warming, *warmups; /* the warm-up window (om__warming) */
  om_metric_t *collected; /* empty services collected (om__collect_empty) */
} metrics_t;

/* The latest (service, revision) pairs logged one way (see below). */
#define CHANGE_RING 128
typedef struct {
  uint64_t key[CHANGE_RING], rev[CHANGE_RING];
  size_t next;
} change_ring_t;

struct om_control_s {
  uv_loop_t *loop;
  om_store_t *store;
  om_auth_t *auth;
  char *cors;
  char *lib_dir;
  uint64_t ping_ms;
  uint64_t watch_min_interval_ms; /* every watcher's interval floor */
  size_t max_backlog;
  char retry_block[40];
  size_t retry_len;
  om_http_server_t *srv;
  uv_timer_t ping;
  om_store_sub_t *svc_sub, *cfg_sub;
  uint64_t seen_deletions; /* the store's deletion count at the last event */
  topic_t **topics;        /* sorted by (kind, name) */
  size_t n_topics, cap_topics;
  om_snapshot_t **mirror; /* each service's last snapshot, by name */
  size_t n_mirror, cap_mirror;
  om_config_doc_t **docs; /* each document's last version, by name */
  size_t n_docs, cap_docs;
  int writing; /* inside our own store write: changes are logged there */
  /*
   * With a store fed by several writers (Redis) our own change also comes
   * back as an event, before or after the write's answer: each
   * (service, revision) is logged once, by whichever sees it first. */
  change_ring_t answered;  /* logged by a write's answer */
  change_ring_t announced; /* logged from a store event */
  /* Our instance writes still waiting for the store's answer: a change
   * that comes back as an event first is logged with its caller's
   * address (struct op_s, write_remote). */
  om_list_t writes; /* op_t by wlink */
  size_t watchers;
  uint64_t events_sent, pings_sent, dropped, rev_max, t_start;
  uint64_t coalesced; /* states held for a busy watcher instead of queued */
  size_t pending_ops;
  int closing, srv_closed, timer_closed;
  void (*done)(void *);
  void *done_ud;
  om_metrics_t *metrics;
  metrics_t m;
  om_cfg_status_t *cfg_status; /* proxies' verdicts per document */
  /* the warm-up window (om__warming): its length (0: none), its end
   * (0: warm), the store's state_lost count it last saw */
  uint64_t warmup_ns, warm_until, seen_lost;
  uint64_t empty_ttl_ms;   /* 0: empty services are kept */
  int collect_unsupported; /* the store does not collect: said once */
  uv_timer_t warm_timer;
  int warm_timer_closed;
};

/* One request as the handlers see it. */
typedef struct ctx_s {
  om_control_t *c;
  om_http_request_t *req;
  uint64_t t0;
  int label;
  unsigned method;
  /* how om__authorize let it in (a watch keeps it, so a reloaded tokens
   * file can end the stream): CRED_NONE (auth off or no role needed),
   * CRED_TOKEN (digest), CRED_CERT (the connection's certificate) */
  int cred, role;
  om_auth_digest_t digest;
} ctx_t;

enum { CRED_NONE, CRED_TOKEN, CRED_CERT };

/* A request waiting for the store. */
typedef struct op_s {
  ctx_t x;
  char service[OM_NAME_MAX + 1];
  char id[OM_NAME_MAX + 1];
  char *url; /* registrations: for the log line */
  /* a PUT or DELETE of an instance, on c->writes until freed */
  om_list_t wlink;
  int deleting;
  int paged;
  size_t page_size;
  char token[OM_PAGE_TOKEN_LEN + 1];
  size_t token_len;
  int has_token;
} op_t;

/* ---- shared by the files of the control plane ---- */

/* How a stream ends: cleanly (END), cut (ABORT), or the client left. */
enum { FIN_END, FIN_ABORT, FIN_GONE };

/* A refusal without a revision or extra headers (om__reply_error_h). */
#define reply_error(x, why, field, ...)                                        \
  om__reply_error_h((x), (why), (field), 0, NULL, 0, __VA_ARGS__)

/*
 * The functions below are defined in one file and called from another;
 * each one's contract comment is above its definition.
 */
char *om__dup_str(const char *s);
int om__grow(void **arr, size_t *cap, size_t need, size_t elem);
long om__pct_decode(const char *s, size_t n, int plus, char *out, size_t cap);
int om__parse_u64(const char *s, size_t n, uint64_t *out);
const char *om__query_param(const char *q, size_t qlen, const char *key,
                            size_t *vlen, int *dup);
uint64_t om__now_ns(void);
void om__reply2(ctx_t *x, int status, const char *ctype, const char *b1,
                size_t l1, const char *b2, size_t l2,
                const om_http_header_t *extra, size_t n_extra);
void om__reply(ctx_t *x, int status, const char *ctype, const char *body,
               size_t len, const om_http_header_t *extra, size_t n_extra);
void om__reply_json(ctx_t *x, int status, const char *body, size_t len);
void om__reply_error_h(ctx_t *x, rej_t why, const char *field, uint64_t rev,
                       const om_http_header_t *extra, size_t n_extra,
                       const char *fmt, ...);
void om__reply_store_error(ctx_t *x, int rc);
op_t *om__op_new(ctx_t *x);
op_t *om__op_start(ctx_t *x, const char *name);
void om__op_free(op_t *op);
void om__op_writing(op_t *op, int deleting);
void om__op_fail(op_t *op, int rc);
void om__topic_free(topic_t *t);
void om__topic_release(om_control_t *c, topic_t *t);
void om__watcher_finish(watcher_t *w, int how);
void om__on_ping(uv_timer_t *timer);
/* Remove the services empty for empty_ttl_ms that nobody watches, from
 * the store and from the mirror (om_control_watch.c; with each ping). */
void om__collect_empty(om_control_t *c);
int om__warming(om_control_t *c);
unsigned om__snapshot_flags(om_control_t *c);
uint64_t om__warm_remaining_ms(const om_control_t *c);
void om__fanout_warm(om_control_t *c);
int om__ring_has(const change_ring_t *r, const char *service, uint64_t rev);
void om__ring_add(change_ring_t *r, const char *service, uint64_t rev);
void om__log_change(const char *change, const char *service, const char *id,
                    uint64_t rev, const char *url, const char *remote);
void om__on_service_event(void *ud, om_snapshot_t *snap);
void om__on_config_event(void *ud, om_config_doc_t *doc);
void om__h_watch(ctx_t *x, tkind_t kind, const char *name);
int om__authorize(ctx_t *x, int role);
void om__watchers_recheck(om_control_t *c);
int om__watcher_allowed(const om_control_t *c, const watcher_t *w);
void om__h_put_instance(ctx_t *x, const char *svc, const char *id);
void om__h_instance_op(ctx_t *x, const char *svc, const char *id,
                       int heartbeat);
void om__h_get_service(ctx_t *x, const char *svc);
void om__h_list_services(ctx_t *x);
void om__h_leases(ctx_t *x);
void om__h_put_config(ctx_t *x, const char *name);
void om__h_get_config(ctx_t *x, const char *name);
void om__h_config_report(ctx_t *x, const char *name);
void om__h_config_status(ctx_t *x, const char *name);
void om__h_healthz(ctx_t *x);
void om__h_readyz(ctx_t *x);
void om__h_metrics(ctx_t *x);
void om__h_status(ctx_t *x);
void om__h_ui(ctx_t *x, const char *name, size_t name_len);

#endif /* OM_CONTROL_INTERNAL_H */
