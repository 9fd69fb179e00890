/*
 * om_control.c: the control plane server (om_control.h, docs/CONTROL.md).
 *
 * Shape of a request: route (404), method (405), auth (401/403), decode and
 * validate (400/413/415/422), then one store operation whose callback
 * answers. Stores may answer later (the Redis store will), so every
 * operation carries an op_t that owns what the answer needs; a request
 * without on_close stays valid until we answer (om_http_server.h), so the
 * callback can always respond.
 *
 * Watches: the control plane holds exactly two store subscriptions (every
 * service, every document). A change goes to the watchers of its topic
 * (one service, all services, one document) from one encoded buffer: the
 * snapshot's cached SSE event, or the topic's encoded document. Topics live
 * only while they have watchers.
 *
 * The same subscription keeps a mirror of each service's last snapshot,
 * so a change the control plane did not make itself (a lease expiry) can
 * be logged per instance by comparing the two.
 */
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

#define MAX_SEGMENTS 8
#define MAX_TOKEN_HEADER 4200
#define POLICY_ERR_MAX 1024

/* ------------------------------------------------------------------ */
/* vocabulary */

/* Why we refused a request: the "error" member and the metric label. */
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
  XX(SHUTTING_DOWN, 503, "shutting_down")

typedef enum {
#define REJ_ENUM(name, status, str) REJ_##name,
  CONTROL_REJECT_MAP(REJ_ENUM)
#undef REJ_ENUM
      REJ__COUNT
} rej_t;

static const char *const rej_names[] = {
#define REJ_STR(name, status, str) str,
    CONTROL_REJECT_MAP(REJ_STR)
#undef REJ_STR
};

static const int rej_status[] = {
#define REJ_STATUS(name, status, str) status,
    CONTROL_REJECT_MAP(REJ_STATUS)
#undef REJ_STATUS
};

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
  L_OTHER,
  L__COUNT
};
static const char *const label_names[] = {
    "register", "heartbeat",  "deregister", "discovery", "list",
    "watch",    "config_get", "config_put", "ops",       "other"};

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
  R__COUNT
} route_t;

static const struct {
  unsigned methods;
  const char *allow;
} routes[R__COUNT] = {
    [R_HEALTHZ] = {M_GET | M_HEAD | M_OPTIONS, "GET, HEAD, OPTIONS"},
    [R_METRICS] = {M_GET | M_HEAD | M_OPTIONS, "GET, HEAD, OPTIONS"},
    [R_STATUS] = {M_GET | M_HEAD | M_OPTIONS, "GET, HEAD, OPTIONS"},
    [R_SERVICES] = {M_GET | M_HEAD | M_OPTIONS, "GET, HEAD, OPTIONS"},
    [R_SERVICE] = {M_GET | M_HEAD | M_OPTIONS, "GET, HEAD, OPTIONS"},
    [R_INSTANCE] = {M_PUT | M_DELETE | M_OPTIONS, "PUT, DELETE, OPTIONS"},
    [R_HEARTBEAT] = {M_POST | M_OPTIONS, "POST, OPTIONS"},
    [R_WATCH_ALL] = {M_GET | M_HEAD | M_OPTIONS, "GET, HEAD, OPTIONS"},
    [R_WATCH_SERVICE] = {M_GET | M_HEAD | M_OPTIONS, "GET, HEAD, OPTIONS"},
    [R_CONFIG] = {M_GET | M_HEAD | M_PUT | M_OPTIONS,
                  "GET, HEAD, PUT, OPTIONS"},
    [R_WATCH_CONFIG] = {M_GET | M_HEAD | M_OPTIONS, "GET, HEAD, OPTIONS"},
};

/* ------------------------------------------------------------------ */
/* types */

typedef enum { T_SERVICE = 0, T_ALL = 1, T_CONFIG = 2 } tkind_t;

typedef struct watcher_s watcher_t;

typedef struct topic_s {
  tkind_t kind;
  char name[OM_NAME_MAX + 1]; /* "" for T_ALL */
  watcher_t *head;
  size_t n;
  int busy;             /* being walked: kept even when empty */
  om_config_doc_t *doc; /* T_CONFIG: the document ev encodes */
  char *ev;
  size_t ev_len;
} topic_t;

struct watcher_s {
  watcher_t *prev, *next;
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
};

typedef struct metrics_s {
  om_metric_t *registrations, *renewals, *deletions, *expiries;
  om_metric_t *revision, *services, *instances, *stale, *uptime;
  om_metric_t *watchers, *events, *pings, *dropped;
  om_metric_t *reload_ok, *reload_failed;
  om_metric_t *conn_accepted, *conn_active, *conn_rejected;
  om_metric_t *http_requests, *http_aborted;
  om_metric_t *rej[REJ__COUNT];
  om_metric_t *http_rej[OM_HTTP_REJECT__COUNT];
  om_metric_t *over_capacity;
  om_metric_t *latency[L__COUNT];
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
  struct op_s *writes;
  size_t watchers;
  uint64_t events_sent, pings_sent, dropped, rev_max, t_start;
  size_t pending_ops;
  int closing, srv_closed, timer_closed;
  void (*done)(void *);
  void *done_ud;
  om_metrics_t *metrics;
  metrics_t m;
};

/* One request as the handlers see it. */
typedef struct ctx_s {
  om_control_t *c;
  om_http_request_t *req;
  uint64_t t0;
  int label;
  unsigned method;
} ctx_t;

/* A request waiting for the store. */
typedef struct op_s {
  ctx_t x;
  char service[OM_NAME_MAX + 1];
  char id[OM_NAME_MAX + 1];
  char *url; /* registrations: for the log line */
  /* a PUT or DELETE of an instance, in c->writes until freed */
  struct op_s *wprev, *wnext;
  int in_writes, deleting;
  int paged;
  size_t page_size;
  char token[OM_PAGE_TOKEN_LEN + 1];
  size_t token_len;
  int has_token;
} op_t;

/* ------------------------------------------------------------------ */
/* small helpers */

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  return d != NULL ? memcpy(d, s, n) : NULL;
}

/* Grow *arr (elements of elem bytes) to hold need; 0 or OM_ENOMEM. */
static int grow(void **arr, size_t *cap, size_t need, size_t elem) {
  size_t c;
  void *p;
  if (need <= *cap)
    return 0;
  c = *cap != 0 ? *cap : 8;
  while (c < need) {
    if (c > SIZE_MAX / 2 / elem)
      return OM_ENOMEM;
    c *= 2;
  }
  p = realloc(*arr, c * elem);
  if (p == NULL)
    return OM_ENOMEM;
  *arr = p;
  *cap = c;
  return 0;
}

static int hexval(char ch) {
  if (ch >= '0' && ch <= '9')
    return ch - '0';
  if (ch >= 'a' && ch <= 'f')
    return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F')
    return ch - 'A' + 10;
  return -1;
}

/*
 * Percent-decode s[0..n) into out (cap bytes with the NUL; RFC 3986 2.1);
 * plus: '+' is a space (query values, HTML form encoding). Returns the
 * length, or -1 for a bad escape, a NUL byte or no room.
 */
static long pct_decode(const char *s, size_t n, int plus, char *out,
                       size_t cap) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    int ch = (unsigned char)s[i];
    if (ch == '%') {
      int hi, lo;
      if (i + 2 >= n)
        return -1;
      hi = hexval(s[i + 1]);
      lo = hexval(s[i + 2]);
      if (hi < 0 || lo < 0)
        return -1;
      ch = hi * 16 + lo;
      i += 2;
    } else if (ch == '+' && plus) {
      ch = ' ';
    }
    if (ch == 0 || k + 1 >= cap)
      return -1;
    out[k++] = (char)ch;
  }
  out[k] = '\0';
  return (long)k;
}

/* Decimal u64, digits only (no sign, no space); 0 or -1. */
static int parse_u64(const char *s, size_t n, uint64_t *out) {
  uint64_t v = 0;
  if (n == 0 || n > 20)
    return -1;
  for (size_t i = 0; i < n; i++) {
    unsigned d = (unsigned)(s[i] - '0');
    if (d > 9 || v > (UINT64_MAX - d) / 10)
      return -1;
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

/*
 * The raw value of query parameter key (first occurrence), or NULL; *dup
 * is set when the key occurs more than once.
 */
static const char *query_param(const char *q, size_t qlen, const char *key,
                               size_t *vlen, int *dup) {
  size_t kl = strlen(key), i = 0;
  const char *found = NULL;
  *dup = 0;
  if (q == NULL)
    return NULL;
  while (i <= qlen) {
    size_t j = i;
    while (j < qlen && q[j] != '&')
      j++;
    if (j - i >= kl && memcmp(q + i, key, kl) == 0 &&
        (j - i == kl || q[i + kl] == '=')) {
      if (found != NULL) {
        *dup = 1;
      } else {
        found = j - i == kl ? q + j : q + i + kl + 1;
        *vlen = j - i == kl ? 0 : j - i - kl - 1;
      }
    }
    i = j + 1;
  }
  return found;
}

static uint64_t now_ns(void) {
  return uv_hrtime();
}

/* ------------------------------------------------------------------ */
/* answers */

/*
 * Answer with body b1 followed by b2 (b2 lets a cached document be sent
 * with a suffix without copying it). Always releases the request.
 */
static void reply2(ctx_t *x, int status, const char *ctype, const char *b1,
                   size_t l1, const char *b2, size_t l2,
                   const om_http_header_t *extra, size_t n_extra) {
  om_control_t *c = x->c;
  om_http_header_t h[16];
  size_t n = 0;
  char cl[24];
  int rc;
  memset(h, 0, sizeof h);
  if (ctype != NULL) {
    h[n].name = "Content-Type";
    h[n++].value = ctype;
  }
  h[n].name = "Cache-Control";
  h[n++].value = "no-cache";
  if (c->cors != NULL) {
    h[n].name = "Access-Control-Allow-Origin";
    h[n++].value = c->cors;
  }
  for (size_t i = 0; i < n_extra && n < 15; i++)
    h[n++] = extra[i];
  if (l2 == 0) {
    rc = om_http_respond(x->req, status, h, n, b1, l1);
  } else {
    snprintf(cl, sizeof cl, "%zu", l1 + l2);
    h[n].name = "Content-Length";
    h[n++].value = cl;
    rc = om_http_response_start(x->req, status, h, n);
    if (rc == 0) {
      om_http_response_write(x->req, b1, l1);
      om_http_response_write(x->req, b2, l2);
      om_http_response_end(x->req);
    } else {
      om_http_response_abort(x->req);
    }
    rc = 0;
  }
  if (rc == OM_EINVAL) /* a header we built is refused: a bug, but answer */
    if (om_http_respond(x->req, 500, NULL, 0, NULL, 0) != 0)
      om_http_response_abort(x->req);
  x->req = NULL;
  om_metric_observe(c->m.latency[x->label], (double)(now_ns() - x->t0) / 1e9);
}

static void reply(ctx_t *x, int status, const char *ctype, const char *body,
                  size_t len, const om_http_header_t *extra, size_t n_extra) {
  reply2(x, status, ctype, body, len, NULL, 0, extra, n_extra);
}

static void reply_json(ctx_t *x, int status, const char *body, size_t len) {
  reply(x, status, "application/json", body, len, NULL, 0);
}

/* Messages may quote bytes of the input: keep the JSON valid UTF-8. */
static json_t *json_message(char *msg) {
  json_t *j = json_string(msg);
  if (j != NULL)
    return j;
  for (char *p = msg; *p; p++)
    if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e)
      *p = '?';
  return json_string(msg);
}

/*
 * A refusal with the reason's status (CONTROL_REJECT_MAP): {"error":
 * reason, "field": field (null when ""), "message": ..., "revision": R
 * (when rev > 0)}, counted and logged.
 */
static void reply_error_h(ctx_t *x, rej_t why, const char *field, uint64_t rev,
                          const om_http_header_t *extra, size_t n_extra,
                          const char *fmt, ...) {
  om_control_t *c = x->c;
  int status = rej_status[why];
  char msg[1536], st[8];
  json_t *o = json_object();
  char *body = NULL;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (o != NULL) {
    json_object_set_new(o, "error", json_string(rej_names[why]));
    if (field != NULL)
      json_object_set_new(o, "field",
                          field[0] != '\0' ? json_string(field) : json_null());
    if (rev > 0)
      json_object_set_new(o, "revision", json_integer((json_int_t)rev));
    json_object_set_new(o, "message", json_message(msg));
    body = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
  }
  om_metric_inc(c->m.rej[why]);
  snprintf(st, sizeof st, "%d", status);
  om_log(OM_LOG_INFO, "request_rejected", "reason", rej_names[why], "status",
         st, "method", x->req->method, "path", x->req->path, "remote",
         x->req->remote_ip, "field", field, "message", msg, NULL);
  if (body != NULL) {
    reply(x, status, "application/json", body, strlen(body), extra, n_extra);
    free(body);
  } else {
    char tiny[64];
    int k = snprintf(tiny, sizeof tiny, "{\"error\":\"%s\"}", rej_names[why]);
    reply(x, status, "application/json", tiny, (size_t)k, extra, n_extra);
  }
}

#define reply_error(x, why, field, ...)                                        \
  reply_error_h((x), (why), (field), 0, NULL, 0, __VA_ARGS__)

/* A store operation that failed to start or finished with an error. */
static void reply_store_error(ctx_t *x, int rc) {
  switch (rc) {
  case OM_ENOTFOUND:
    reply_error(x, REJ_NOT_FOUND, NULL, "not found");
    return;
  case OM_ETOOBIG:
    reply_error(x, REJ_TOO_LARGE, NULL, "the document is too large");
    return;
  case OM_EINVAL:
    reply_error(x, REJ_INVALID_FIELD, "", "rejected by the store");
    return;
  case OM_ESTATE:
    reply_error(x, REJ_SHUTTING_DOWN, NULL, "the store is closing");
    return;
  case OM_EIO: {
    /* The Redis store while Redis is unreachable: reads still answer
     * from the last good state, writes cannot be applied anywhere. The
     * store reconnects within seconds: say when to come back (RFC 9110
     * section 10.2.3). */
    static const om_http_header_t retry[] = {{"Retry-After", "1", 0, 0}};
    reply_error_h(x, REJ_UNAVAILABLE, NULL, 0, retry, 1,
                  "the %s store is unreachable: the change was not applied; "
                  "retry later (reads serve the last known state, see "
                  "/status)",
                  om_store_name(x->c->store));
    return;
  }
  default:
    reply_error(x, REJ_UNAVAILABLE, NULL, "store: %s", om_strerror(rc));
    return;
  }
}

/* ------------------------------------------------------------------ */
/* operations waiting for the store */

static void maybe_finish(om_control_t *c);

static op_t *op_new(ctx_t *x) {
  op_t *op = calloc(1, sizeof *op);
  if (op == NULL)
    return NULL;
  op->x = *x;
  x->c->pending_ops++;
  return op;
}

static void op_free(op_t *op) {
  om_control_t *c = op->x.c;
  if (op->in_writes) {
    if (op->wprev != NULL)
      op->wprev->wnext = op->wnext;
    else
      c->writes = op->wnext;
    if (op->wnext != NULL)
      op->wnext->wprev = op->wprev;
  }
  free(op->url);
  free(op);
  c->pending_ops--;
  maybe_finish(c);
}

/* op writes an instance (a PUT, or a DELETE: deleting) until it is freed. */
static void op_writing(op_t *op, int deleting) {
  om_control_t *c = op->x.c;
  op->in_writes = 1;
  op->deleting = deleting;
  op->wprev = NULL;
  op->wnext = c->writes;
  if (c->writes != NULL)
    c->writes->wprev = op;
  c->writes = op;
}

/* The store refused to start the operation: answer and drop it. */
static void op_fail(op_t *op, int rc) {
  reply_store_error(&op->x, rc);
  op_free(op);
}

/* ------------------------------------------------------------------ */
/* topics and watchers */

/*
 * Binary search over n sorted entries: cmp(i) compares the key with entry
 * i (<0, 0, >0). Returns the entry's index with *found = 1, or the
 * insertion point with *found = 0. The one search behind the topic, mirror
 * and document tables.
 */
typedef int (*cmp_at_fn)(const om_control_t *c, size_t i, const void *key);

static size_t sorted_pos(const om_control_t *c, size_t n, cmp_at_fn cmp,
                         const void *key, int *found) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int r = cmp(c, mid, key);
    if (r == 0) {
      *found = 1;
      return mid;
    }
    if (r < 0)
      hi = mid;
    else
      lo = mid + 1;
  }
  *found = 0;
  return lo;
}

static int topic_cmp(tkind_t kind, const char *name, const topic_t *t) {
  if (kind != t->kind)
    return kind < t->kind ? -1 : 1;
  return strcmp(name, t->name);
}

typedef struct {
  tkind_t kind;
  const char *name;
} topic_key_t;

static int topic_at(const om_control_t *c, size_t i, const void *key) {
  const topic_key_t *k = key;
  return topic_cmp(k->kind, k->name, c->topics[i]);
}

static size_t topic_pos(const om_control_t *c, tkind_t kind, const char *name,
                        int *found) {
  topic_key_t k = {kind, name};
  return sorted_pos(c, c->n_topics, topic_at, &k, found);
}

static topic_t *topic_find(const om_control_t *c, tkind_t kind,
                           const char *name) {
  int found;
  size_t i = topic_pos(c, kind, name, &found);
  return found ? c->topics[i] : NULL;
}

static topic_t *topic_get(om_control_t *c, tkind_t kind, const char *name) {
  int found;
  size_t i = topic_pos(c, kind, name, &found);
  topic_t *t;
  if (found)
    return c->topics[i];
  if (grow((void **)&c->topics, &c->cap_topics, c->n_topics + 1,
           sizeof *c->topics) != 0)
    return NULL;
  t = calloc(1, sizeof *t);
  if (t == NULL)
    return NULL;
  t->kind = kind;
  snprintf(t->name, sizeof t->name, "%s", name);
  memmove(c->topics + i + 1, c->topics + i,
          (c->n_topics - i) * sizeof *c->topics);
  c->topics[i] = t;
  c->n_topics++;
  return t;
}

static void topic_free(topic_t *t) {
  om_config_doc_unref(t->doc);
  free(t->ev);
  free(t);
}

/* Drop t if nobody watches it and nobody is walking it. */
static void topic_release(om_control_t *c, topic_t *t) {
  int found;
  size_t i;
  if (t == NULL || t->n != 0 || t->busy)
    return;
  i = topic_pos(c, t->kind, t->name, &found);
  if (!found)
    return;
  memmove(c->topics + i, c->topics + i + 1,
          (c->n_topics - i - 1) * sizeof *c->topics);
  c->n_topics--;
  topic_free(t);
}

static void watcher_unref(watcher_t *w) {
  if (--w->refs > 0)
    return;
  for (size_t i = 0; i < w->n_burst; i++)
    om_snapshot_unref(w->burst[i]);
  free(w->burst);
  free(w);
}

enum { FIN_END, FIN_ABORT, FIN_GONE };

/* End a stream: cleanly (END), cut (ABORT), or the client left (GONE). */
static void watcher_finish(watcher_t *w, int how) {
  om_control_t *c = w->c;
  om_http_request_t *req = w->req;
  topic_t *t = w->topic;
  if (req == NULL)
    return;
  w->req = NULL;
  w->topic = NULL;
  if (w->prev != NULL)
    w->prev->next = w->next;
  else
    t->head = w->next;
  if (w->next != NULL)
    w->next->prev = w->prev;
  t->n--;
  c->watchers--;
  om_metric_set(c->m.watchers, (double)c->watchers);
  topic_release(c, t);
  if (how == FIN_END) {
    (void)om_http_response_end(req); /* released even if the client left */
  } else if (how == FIN_ABORT) {
    om_http_response_abort(req);
  }
  watcher_unref(w);
}

static void on_watch_close(om_http_request_t *req) {
  watcher_finish(req->user, FIN_GONE);
}

/*
 * Write to a stream. With check, a watcher that still has unsent bytes and
 * would go past the backlog limit is cut instead (it resyncs on
 * reconnect). Returns 0, or -1 when the watcher is gone.
 */
static int watcher_send(watcher_t *w, const char *data, size_t len, int check) {
  om_control_t *c = w->c;
  size_t pending;
  if (w->req == NULL)
    return -1;
  pending = om_http_response_pending(w->req);
  if (check && pending > 0 &&
      (len > c->max_backlog || pending > c->max_backlog - len)) {
    char p[24], ip[46];
    snprintf(p, sizeof p, "%zu", pending);
    snprintf(ip, sizeof ip, "%s", w->req->remote_ip);
    c->dropped++;
    om_metric_inc(c->m.dropped);
    om_log(OM_LOG_WARN, "watcher_dropped", "reason", "backlog", "pending", p,
           "topic", w->topic->name[0] ? w->topic->name : "*", "remote", ip,
           NULL);
    watcher_finish(w, FIN_ABORT);
    return -1;
  }
  if (om_http_response_write(w->req, data, len) != 0) {
    watcher_finish(w, FIN_ABORT);
    return -1;
  }
  return 0;
}

/* A snapshot event to one watcher. */
static int watcher_send_snapshot(watcher_t *w, om_snapshot_t *snap, int check) {
  const char *data;
  size_t len;
  if (om_snapshot_sse_cached(snap, &data, &len) != 0) {
    om_log(OM_LOG_ERROR, "watch_encode_failed", "service",
           om_snapshot_service(snap), NULL);
    watcher_finish(w, FIN_ABORT); /* it reconnects and resyncs */
    return -1;
  }
  if (watcher_send(w, data, len, check) != 0)
    return -1;
  w->c->events_sent++;
  om_metric_inc(w->c->m.events);
  return 0;
}

/* The event bytes of a document, cached on its topic. */
static int topic_set_doc(topic_t *t, om_config_doc_t *doc) {
  char id[24];
  om_sse_event_t ev;
  char *out = NULL;
  size_t len = 0;
  int rc;
  if (t->doc == doc)
    return 0;
  snprintf(id, sizeof id, "%" PRIu64, doc->revision);
  memset(&ev, 0, sizeof ev);
  ev.type = "snapshot";
  ev.type_len = 8;
  ev.id = id;
  ev.id_len = strlen(id);
  ev.data = doc->body;
  ev.data_len = doc->len;
  ev.retry_ms = -1;
  rc = om_sse_encode_alloc(&ev, &out, &len);
  if (rc != 0)
    return rc;
  om_config_doc_unref(t->doc);
  free(t->ev);
  t->doc = om_config_doc_ref(doc);
  t->ev = out;
  t->ev_len = len;
  return 0;
}

static int watcher_send_doc(watcher_t *w, om_config_doc_t *doc, int check) {
  if (topic_set_doc(w->topic, doc) != 0) {
    om_log(OM_LOG_ERROR, "watch_encode_failed", "config", doc->name, NULL);
    watcher_finish(w, FIN_ABORT);
    return -1;
  }
  if (watcher_send(w, w->topic->ev, w->topic->ev_len, check) != 0)
    return -1;
  w->c->events_sent++;
  om_metric_inc(w->c->m.events);
  return 0;
}

/* ---- the first event(s) of a stream ---- */

/* Nothing is re-sent when the client already holds revision rev. */
static int client_has(const watcher_t *w, uint64_t rev) {
  return w->has_last_id && w->last_id == rev;
}

static void on_watch_snapshot(void *ud, int status, om_snapshot_t *snap) {
  watcher_t *w = ud;
  if (w->req != NULL) {
    if (status == 0 && snap != NULL) {
      uint64_t rev = om_snapshot_revision(snap);
      if (client_has(w, rev)) {
        if (rev > w->last_rev)
          w->last_rev = rev;
      } else if (rev > w->last_rev) {
        w->last_rev = rev;
        watcher_send_snapshot(w, snap, 0);
      }
    } else if (status != OM_ENOTFOUND) {
      watcher_finish(w, FIN_ABORT);
    } /* not found: the stream waits for the service's first registration */
  }
  watcher_unref(w);
}

static void on_watch_doc(void *ud, int status, om_config_doc_t *doc) {
  watcher_t *w = ud;
  if (w->req != NULL) {
    if (status == 0 && doc != NULL) {
      if (client_has(w, doc->revision)) {
        if (doc->revision > w->last_rev)
          w->last_rev = doc->revision;
      } else if (doc->revision > w->last_rev) {
        w->last_rev = doc->revision;
        watcher_send_doc(w, doc, 0);
      }
    } else if (status != OM_ENOTFOUND) {
      watcher_finish(w, FIN_ABORT);
    }
  }
  watcher_unref(w);
}

static int by_revision(const void *a, const void *b) {
  uint64_t x = om_snapshot_revision(*(om_snapshot_t *const *)a);
  uint64_t y = om_snapshot_revision(*(om_snapshot_t *const *)b);
  return x < y ? -1 : x > y;
}

/*
 * Every service's snapshot is in: write them oldest revision first, so the
 * stream's last event ID is the newest revision (what a reconnect sends
 * back) — unless the client already holds exactly that.
 */
static void burst_complete(watcher_t *w) {
  uint64_t max = 0;
  if (w->req == NULL)
    return;
  qsort(w->burst, w->n_burst, sizeof *w->burst, by_revision);
  if (w->n_burst > 0)
    max = om_snapshot_revision(w->burst[w->n_burst - 1]);
  if (!(w->n_burst > 0 && client_has(w, max)))
    for (size_t i = 0; i < w->n_burst; i++)
      if (watcher_send_snapshot(w, w->burst[i], 0) != 0)
        break;
  for (size_t i = 0; i < w->n_burst; i++)
    om_snapshot_unref(w->burst[i]);
  free(w->burst);
  w->burst = NULL;
  w->n_burst = w->cap_burst = 0;
  w->ready = 1;
}

static void burst_done_one(watcher_t *w) {
  if (--w->outstanding == 0)
    burst_complete(w);
}

static void on_burst_snapshot(void *ud, int status, om_snapshot_t *snap) {
  watcher_t *w = ud;
  if (w->req != NULL && status == 0 && snap != NULL) {
    if (grow((void **)&w->burst, &w->cap_burst, w->n_burst + 1,
             sizeof *w->burst) == 0)
      w->burst[w->n_burst++] = om_snapshot_ref(snap);
    else
      watcher_finish(w, FIN_ABORT); /* an incomplete burst would lie */
  } else if (w->req != NULL && status != 0 && status != OM_ENOTFOUND) {
    watcher_finish(w, FIN_ABORT);
  }
  burst_done_one(w);
  watcher_unref(w);
}

static void on_burst_list(void *ud, int status, const om_service_rev_t *list,
                          size_t n) {
  watcher_t *w = ud;
  om_control_t *c = w->c;
  if (w->req != NULL && status != 0)
    watcher_finish(w, FIN_ABORT);
  if (w->req != NULL) {
    w->outstanding = 1; /* held until every read is started */
    for (size_t i = 0; i < n && w->req != NULL; i++) {
      int rc;
      w->outstanding++;
      w->refs++;
      rc = om_store_snapshot(c->store, list[i].service, on_burst_snapshot, w);
      if (rc != 0) {
        w->outstanding--;
        w->refs--;
        watcher_finish(w, FIN_ABORT);
      }
    }
    burst_done_one(w);
  }
  watcher_unref(w);
}

/* ---- fan-out ---- */

static void fanout_snapshot(om_control_t *c, om_snapshot_t *snap) {
  topic_t *ts = topic_find(c, T_SERVICE, om_snapshot_service(snap));
  topic_t *ta = topic_find(c, T_ALL, "");
  uint64_t rev = om_snapshot_revision(snap);
  watcher_t *w, *next;
  if (ts != NULL) {
    ts->busy = 1;
    for (w = ts->head; w != NULL; w = next) {
      next = w->next;
      if (rev > w->last_rev) {
        w->last_rev = rev;
        watcher_send_snapshot(w, snap, 1);
      }
    }
    ts->busy = 0;
    topic_release(c, ts);
  }
  if (ta != NULL) {
    ta->busy = 1;
    for (w = ta->head; w != NULL; w = next) {
      next = w->next;
      if (w->ready)
        watcher_send_snapshot(w, snap, 1);
    }
    ta->busy = 0;
    topic_release(c, ta);
  }
}

static void fanout_doc(om_control_t *c, om_config_doc_t *doc) {
  topic_t *t = topic_find(c, T_CONFIG, doc->name);
  watcher_t *w, *next;
  if (t == NULL)
    return;
  t->busy = 1;
  for (w = t->head; w != NULL; w = next) {
    next = w->next;
    if (doc->revision > w->last_rev) {
      w->last_rev = doc->revision;
      watcher_send_doc(w, doc, 1);
    }
  }
  t->busy = 0;
  topic_release(c, t);
}

static void on_ping(uv_timer_t *timer) {
  om_control_t *c = timer->data;
  static const char ping[] = ": ping\n\n";
  size_t i = 0;
  while (i < c->n_topics) {
    topic_t *t = c->topics[i];
    watcher_t *w, *next;
    t->busy = 1;
    for (w = t->head; w != NULL; w = next) {
      next = w->next;
      if (watcher_send(w, ping, sizeof ping - 1, 1) == 0) {
        c->pings_sent++;
        om_metric_inc(c->m.pings);
      }
    }
    t->busy = 0;
    if (t->n == 0)
      topic_release(c, t); /* shifts the array: same i is the next one */
    else
      i++;
  }
}

/* ------------------------------------------------------------------ */
/* the store's changes: mirror, logs, fan-out */

static int mirror_at(const om_control_t *c, size_t i, const void *key) {
  return strcmp(key, om_snapshot_service(c->mirror[i]));
}

static size_t mirror_pos(const om_control_t *c, const char *name, int *found) {
  return sorted_pos(c, c->n_mirror, mirror_at, name, found);
}

static uint64_t ring_key(const char *service, uint64_t rev) {
  return om_hash(service, strlen(service), rev);
}

static int ring_has(const change_ring_t *r, const char *service, uint64_t rev) {
  uint64_t k = ring_key(service, rev);
  for (size_t i = 0; i < CHANGE_RING; i++)
    if (r->rev[i] == rev && r->key[i] == k)
      return 1;
  return 0;
}

static void ring_add(change_ring_t *r, const char *service, uint64_t rev) {
  r->key[r->next] = ring_key(service, rev);
  r->rev[r->next] = rev;
  r->next = (r->next + 1) % CHANGE_RING;
}

static void log_change(const char *change, const char *service, const char *id,
                       uint64_t rev, const char *url, const char *remote) {
  char r[24];
  snprintf(r, sizeof r, "%" PRIu64, rev);
  om_log(OM_LOG_INFO, "registration", "change", change, "service", service,
         "id", id, "revision", r, "url", url, "remote", remote, NULL);
}

/*
 * The caller's address of our own write that made this change, when its
 * answer has not come yet (with Redis the change's event can come
 * first: the two connections are not ordered): a PUT of that instance
 * with that URL (url), or a DELETE of it (url NULL); else NULL, a change
 * we did not make.
 */
static const char *write_remote(const om_control_t *c, const char *svc,
                                const char *id, const char *url) {
  for (const op_t *op = c->writes; op != NULL; op = op->wnext)
    if (op->deleting == (url == NULL) && strcmp(op->id, id) == 0 &&
        strcmp(op->service, svc) == 0 &&
        (url == NULL || (op->url != NULL && strcmp(op->url, url) == 0)))
      return op->x.req->remote_ip;
  return NULL;
}

/*
 * A change seen as a store event before any answer of ours logged it: a
 * lease expiry, a write by another holder of the store (such as `openmesh
 * up`'s example services), or our own write whose event came before its
 * answer (then with the caller's address, write_remote). One log line per
 * instance, by comparing the service's previous snapshot with the new one
 * (both sorted by id). A removal is what the store says it was
 * (om_store_status_t.last_removal); when it cannot say, "deleted" if it
 * counted a deletion since the last event (each write is its own event),
 * else "expired".
 */
static void log_store_change(const om_control_t *c, const om_snapshot_t *prev,
                             const om_snapshot_t *next, const char *removed) {
  size_t np = prev != NULL ? om_snapshot_count(prev) : 0;
  size_t nn = om_snapshot_count(next), i = 0, j = 0;
  const char *svc = om_snapshot_service(next);
  uint64_t rev = om_snapshot_revision(next);
  while (i < np || j < nn) {
    const om_instance_t *a = i < np ? om_snapshot_instance(prev, i) : NULL;
    const om_instance_t *b = j < nn ? om_snapshot_instance(next, j) : NULL;
    int r = a == NULL ? 1 : b == NULL ? -1 : strcmp(a->id, b->id);
    if (r < 0) {
      log_change(removed, svc, a->id, rev, a->url,
                 strcmp(removed, "deleted") == 0
                     ? write_remote(c, svc, a->id, NULL)
                     : NULL);
      i++;
    } else if (r > 0) {
      log_change("created", svc, b->id, rev, b->url,
                 write_remote(c, svc, b->id, b->url));
      j++;
    } else {
      if (a != b && !om_instance_equal(a, b))
        log_change("updated", svc, b->id, rev, b->url,
                   write_remote(c, svc, b->id, b->url));
      i++;
      j++;
    }
  }
}

static void on_service_event(void *ud, om_snapshot_t *snap) {
  om_control_t *c = ud;
  uint64_t rev = om_snapshot_revision(snap);
  om_store_status_t st;
  int found;
  size_t i = mirror_pos(c, om_snapshot_service(snap), &found);
  /* A store fed by several writers (Redis) must never make a watcher of
   * every service see a service go back: anything not newer than what we
   * passed on for that service is dropped here, once for every stream. */
  if (found && rev <= om_snapshot_revision(c->mirror[i]))
    return;
  if (rev > c->rev_max)
    c->rev_max = rev;
  memset(&st, 0, sizeof st);
  om_store_status(c->store, &st);
  if (!c->writing && !ring_has(&c->answered, om_snapshot_service(snap), rev)) {
    log_store_change(c, found ? c->mirror[i] : NULL, snap,
                     st.last_removal == OM_STORE_DELETED   ? "deleted"
                     : st.last_removal == OM_STORE_EXPIRED ? "expired"
                     : st.deletions != c->seen_deletions   ? "deleted"
                                                           : "expired");
    ring_add(&c->announced, om_snapshot_service(snap), rev);
  }
  c->seen_deletions = st.deletions;
  if (found) {
    om_snapshot_unref(c->mirror[i]);
    c->mirror[i] = om_snapshot_ref(snap);
  } else if (grow((void **)&c->mirror, &c->cap_mirror, c->n_mirror + 1,
                  sizeof *c->mirror) == 0) {
    memmove(c->mirror + i + 1, c->mirror + i,
            (c->n_mirror - i) * sizeof *c->mirror);
    c->mirror[i] = om_snapshot_ref(snap);
    c->n_mirror++;
  } /* else: only a later log line loses its baseline */
  fanout_snapshot(c, snap);
}

static int doc_at(const om_control_t *c, size_t i, const void *key) {
  return strcmp(key, c->docs[i]->name);
}

static size_t doc_pos(const om_control_t *c, const char *name, int *found) {
  return sorted_pos(c, c->n_docs, doc_at, name, found);
}

static void on_config_event(void *ud, om_config_doc_t *doc) {
  om_control_t *c = ud;
  int found;
  size_t i = doc_pos(c, doc->name, &found);
  if (doc->revision > c->rev_max)
    c->rev_max = doc->revision;
  if (found) {
    om_config_doc_unref(c->docs[i]);
    c->docs[i] = om_config_doc_ref(doc);
  } else if (grow((void **)&c->docs, &c->cap_docs, c->n_docs + 1,
                  sizeof *c->docs) == 0) {
    memmove(c->docs + i + 1, c->docs + i, (c->n_docs - i) * sizeof *c->docs);
    c->docs[i] = om_config_doc_ref(doc);
    c->n_docs++;
  }
  fanout_doc(c, doc);
}

/* ------------------------------------------------------------------ */
/* auth */

static const char *role_name(int role) {
  return role == OM_ROLE_ADMIN      ? "admin"
         : role == OM_ROLE_REGISTER ? "register"
                                    : "read";
}

/*
 * 1 when the request may go on; else answered (401/403, RFC 6750 3).
 * Without an Authorization header a GET may carry the token as the
 * access_token query parameter (RFC 6750 2.3): a browser's EventSource
 * cannot set headers.
 */
static int authorize(ctx_t *x, int role) {
  om_control_t *c = x->c;
  om_http_request_t *req = x->req;
  const char *h;
  size_t hl = 0;
  char buf[MAX_TOKEN_HEADER];
  om_auth_result_t r;
  if (c->auth == NULL || role == 0)
    return 1;
  h = om_http_request_header(req, "authorization", &hl);
  if (h == NULL && (x->method & (M_GET | M_HEAD))) {
    size_t vl = 0;
    int dup;
    const char *v =
        query_param(req->query, req->query_len, "access_token", &vl, &dup);
    long k;
    if (v != NULL && (k = pct_decode(v, vl, 1, buf + 7, sizeof buf - 7)) >= 0) {
      memcpy(buf, "Bearer ", 7);
      h = buf;
      hl = (size_t)k + 7;
    } else if (v != NULL) {
      h = "Bearer";
      hl = 6;
    }
  }
  r = om_auth_check(c->auth, h, hl, role);
  if (r == OM_AUTH_OK)
    return 1;
  if (r == OM_AUTH_FORBIDDEN) {
    char www[96];
    om_http_header_t eh[1];
    snprintf(www, sizeof www,
             "Bearer realm=\"openmesh\", error=\"insufficient_scope\", "
             "scope=\"%s\"",
             role_name(role));
    memset(eh, 0, sizeof eh);
    eh[0].name = "WWW-Authenticate";
    eh[0].value = www;
    reply_error_h(x, REJ_FORBIDDEN, NULL, 0, eh, 1,
                  "the token lacks the '%s' role", role_name(role));
  } else {
    om_http_header_t eh[1];
    memset(eh, 0, sizeof eh);
    eh[0].name = "WWW-Authenticate";
    eh[0].value = r == OM_AUTH_MISSING
                      ? "Bearer realm=\"openmesh\""
                      : "Bearer realm=\"openmesh\", error=\"invalid_token\"";
    reply_error_h(x, REJ_UNAUTHORIZED, NULL, 0, eh, 1,
                  r == OM_AUTH_MISSING ? "a bearer token is required"
                                       : "the bearer token is not valid");
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* registry */

static const char *change_word(om_store_change_t ch) {
  return ch == OM_STORE_NOCHANGE ? "renewed" : om_store_change_name(ch);
}

static void reply_change(op_t *op, int status, om_store_change_t change,
                         uint64_t rev) {
  char body[512];
  int k;
  if (status != 0) {
    if (status == OM_ENOTFOUND)
      reply_error(&op->x, REJ_NOT_FOUND, NULL,
                  "no lease for instance '%s' of service '%s': register it "
                  "again",
                  op->id, op->service);
    else
      reply_store_error(&op->x, status);
    return;
  }
  if (change != OM_STORE_NOCHANGE &&
      !ring_has(&op->x.c->announced, op->service, rev)) {
    log_change(om_store_change_name(change), op->service, op->id, rev, op->url,
               op->x.req->remote_ip);
    ring_add(&op->x.c->answered, op->service, rev);
  }
  k = snprintf(body, sizeof body,
               "{\"service\":\"%s\",\"id\":\"%s\",\"revision\":%" PRIu64
               ",\"change\":\"%s\"}",
               op->service, op->id, rev, change_word(change));
  reply_json(&op->x, 200, body, (size_t)k);
}

static void on_write_done(void *ud, int status, om_store_change_t change,
                          uint64_t rev) {
  op_t *op = ud;
  reply_change(op, status, change, rev);
  op_free(op);
}

static void h_put_instance(ctx_t *x, const char *svc, const char *id) {
  om_control_t *c = x->c;
  om_http_request_t *req = x->req;
  om_instance_t in;
  om_json_error_t err;
  op_t *op;
  int rc;
  memset(&err, 0, sizeof err);
  rc = om_instance_from_json(req->body, req->body_len, id, &in, &err);
  if (rc == OM_ETOOBIG) {
    reply_error(x, REJ_TOO_LARGE, NULL, "%s", err.text);
    return;
  }
  if (rc == OM_EPARSE) {
    reply_error(x, REJ_INVALID_JSON, "", "%s", err.text);
    return;
  }
  if (rc == OM_EINVAL) {
    reply_error(x, REJ_INVALID_FIELD, err.field, "%s", err.text);
    return;
  }
  if (rc != 0) {
    reply_store_error(x, rc);
    return;
  }
  op = op_new(x);
  if (op == NULL || (op->url = dup_str(in.url)) == NULL) {
    om_instance_clear(&in);
    if (op != NULL)
      op_free(op);
    reply_store_error(x, OM_ENOMEM);
    return;
  }
  snprintf(op->service, sizeof op->service, "%s", svc);
  snprintf(op->id, sizeof op->id, "%s", id);
  op_writing(op, 0);
  c->writing++;
  rc = om_store_put_instance(c->store, svc, &in, on_write_done, op);
  c->writing--;
  om_instance_clear(&in);
  if (rc != 0)
    op_fail(op, rc);
}

static void h_instance_op(ctx_t *x, const char *svc, const char *id,
                          int heartbeat) {
  om_control_t *c = x->c;
  op_t *op = op_new(x);
  int rc;
  if (op == NULL) {
    reply_store_error(x, OM_ENOMEM);
    return;
  }
  snprintf(op->service, sizeof op->service, "%s", svc);
  snprintf(op->id, sizeof op->id, "%s", id);
  if (!heartbeat)
    op_writing(op, 1);
  c->writing++;
  if (heartbeat)
    rc = om_store_renew(c->store, svc, id, on_write_done, op);
  else
    rc = om_store_delete_instance(c->store, svc, id, on_write_done, op);
  c->writing--;
  if (rc != 0)
    op_fail(op, rc);
}

static void on_service_snapshot(void *ud, int status, om_snapshot_t *snap) {
  op_t *op = ud;
  ctx_t *x = &op->x;
  if (status != 0 || snap == NULL) {
    if (status == OM_ENOTFOUND || status == 0)
      reply_error(x, REJ_NOT_FOUND, NULL, "no service '%s'", op->service);
    else
      reply_store_error(x, status);
  } else if (!op->paged) {
    /* the cached document, closed with the page member */
    static const char tail[] = ",\"next_page_token\":null}";
    const char *data;
    size_t len;
    if (om_snapshot_json_cached(snap, &data, &len) != 0 || len < 2)
      reply_store_error(x, OM_ENOMEM);
    else
      reply2(x, 200, "application/json", data, len - 1, tail, sizeof tail - 1,
             NULL, 0);
  } else {
    char *out = NULL;
    size_t len = 0;
    om_json_error_t err;
    size_t limit = op->page_size;
    int rc;
    memset(&err, 0, sizeof err);
    if (limit == 0) /* a token without page_size: the rest */
      limit = om_snapshot_count(snap) > 0 ? om_snapshot_count(snap) : 1;
    rc = om_snapshot_page_json(snap, op->has_token ? op->token : NULL,
                               op->token_len, limit, &out, &len, &err);
    if (rc == 0)
      reply_json(x, 200, out, len);
    else if (rc == OM_ESTATE)
      reply_error_h(x, REJ_REVISION_CHANGED, "page_token",
                    om_snapshot_revision(snap), NULL, 0, "%s", err.text);
    else if (rc == OM_EPARSE || rc == OM_ERANGE)
      reply_error(x, REJ_INVALID_FIELD, "page_token", "%s", err.text);
    else
      reply_store_error(x, rc);
    free(out);
  }
  op_free(op);
}

static void h_get_service(ctx_t *x, const char *svc) {
  om_control_t *c = x->c;
  om_http_request_t *req = x->req;
  const char *v;
  size_t vl = 0;
  int dup, rc;
  uint64_t ps = 0;
  op_t *op;
  char tok[OM_PAGE_TOKEN_LEN + 8];
  long tl = -1;
  v = query_param(req->query, req->query_len, "page_size", &vl, &dup);
  if (v != NULL && (dup || parse_u64(v, vl, &ps) != 0 || ps < 1 ||
                    ps > OM_CONTROL_MAX_PAGE_SIZE)) {
    reply_error(x, REJ_INVALID_FIELD, "page_size",
                "field 'page_size': must be an integer in [1, %u]",
                OM_CONTROL_MAX_PAGE_SIZE);
    return;
  }
  v = query_param(req->query, req->query_len, "page_token", &vl, &dup);
  if (v != NULL) {
    tl = pct_decode(v, vl, 1, tok, sizeof tok);
    if (dup || tl != OM_PAGE_TOKEN_LEN) {
      reply_error(x, REJ_INVALID_FIELD, "page_token",
                  "field 'page_token': is malformed or was not issued by "
                  "this service");
      return;
    }
  }
  op = op_new(x);
  if (op == NULL) {
    reply_store_error(x, OM_ENOMEM);
    return;
  }
  snprintf(op->service, sizeof op->service, "%s", svc);
  op->paged = ps > 0 || tl >= 0;
  op->page_size = (size_t)ps;
  if (tl >= 0) {
    memcpy(op->token, tok, (size_t)tl + 1);
    op->token_len = (size_t)tl;
    op->has_token = 1;
  }
  rc = om_store_snapshot(c->store, svc, on_service_snapshot, op);
  if (rc != 0)
    op_fail(op, rc);
}

static void on_service_list(void *ud, int status, const om_service_rev_t *list,
                            size_t n) {
  op_t *op = ud;
  char *buf;
  size_t cap, k = 0;
  if (status != 0) {
    reply_store_error(&op->x, status);
    op_free(op);
    return;
  }
  /* names are [A-Za-z0-9._-]: nothing to escape */
  cap = 32 + n * (OM_NAME_MAX + 96);
  buf = malloc(cap);
  if (buf == NULL) {
    reply_store_error(&op->x, OM_ENOMEM);
    op_free(op);
    return;
  }
  k += (size_t)snprintf(buf + k, cap - k, "{\"services\":[");
  for (size_t i = 0; i < n; i++)
    k += (size_t)snprintf(
        buf + k, cap - k,
        "%s{\"service\":\"%s\",\"revision\":%" PRIu64 ",\"instances\":%zu}",
        i ? "," : "", list[i].service, list[i].revision, list[i].instances);
  k += (size_t)snprintf(buf + k, cap - k, "]}");
  reply_json(&op->x, 200, buf, k);
  free(buf);
  op_free(op);
}

static void h_list_services(ctx_t *x) {
  om_control_t *c = x->c;
  op_t *op = op_new(x);
  int rc;
  if (op == NULL) {
    reply_store_error(x, OM_ENOMEM);
    return;
  }
  rc = om_store_list_services(c->store, on_service_list, op);
  if (rc != 0)
    op_fail(op, rc);
}

/* ------------------------------------------------------------------ */
/* configuration */

/* The media type of a Content-Type value, lower-cased, without params. */
static void media_type(const char *v, size_t n, char *out, size_t cap) {
  size_t k = 0, i = 0;
  while (i < n && (v[i] == ' ' || v[i] == '\t'))
    i++;
  for (; i < n && v[i] != ';' && k + 1 < cap; i++) {
    char ch = v[i];
    if (ch == ' ' || ch == '\t')
      break;
    out[k++] = (char)(ch >= 'A' && ch <= 'Z' ? ch | 0x20 : ch);
  }
  out[k] = '\0';
}

static void on_config_written(void *ud, int status, om_store_change_t change,
                              uint64_t rev) {
  op_t *op = ud;
  char body[256], r[24];
  int k;
  if (status != 0) {
    reply_store_error(&op->x, status);
  } else {
    if (change != OM_STORE_NOCHANGE) {
      snprintf(r, sizeof r, "%" PRIu64, rev);
      om_log(OM_LOG_INFO, "config_changed", "name", op->service, "change",
             om_store_change_name(change), "revision", r, "content_type",
             op->url, "remote", op->x.req->remote_ip, NULL);
    }
    k = snprintf(body, sizeof body,
                 "{\"name\":\"%s\",\"revision\":%" PRIu64 ",\"change\":\"%s\"}",
                 op->service, rev,
                 change == OM_STORE_NOCHANGE ? "unchanged"
                                             : om_store_change_name(change));
    reply_json(&op->x, 200, body, (size_t)k);
  }
  op_free(op);
}

static void h_put_config(ctx_t *x, const char *name) {
  om_control_t *c = x->c;
  om_http_request_t *req = x->req;
  size_t hl = 0;
  const char *h = om_http_request_header(req, "content-type", &hl);
  char mt[64];
  const char *ctype;
  op_t *op;
  int rc;
  media_type(h != NULL ? h : "application/json", h != NULL ? hl : 16, mt,
             sizeof mt);
  /* curl -d sends form encoding unless told otherwise: read as unspecified */
  if (strcmp(mt, "application/json") == 0 ||
      strcmp(mt, "application/x-www-form-urlencoded") == 0) {
    json_error_t je;
    json_t *root =
        json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &je);
    int is_obj = root != NULL && json_is_object(root);
    json_decref(root);
    if (root == NULL) {
      reply_error(x, REJ_INVALID_JSON, "",
                  "invalid JSON at line %d, column %d: %s", je.line, je.column,
                  je.text);
      return;
    }
    if (!is_obj) {
      reply_error(x, REJ_INVALID_JSON, "",
                  "the document must be a JSON object");
      return;
    }
    ctype = "application/json";
  } else if (strcmp(mt, "text/x-lua") == 0) {
    om_policy_opts_t po;
    om_policy_t *p = NULL;
    char err[POLICY_ERR_MAX];
    om_sse_event_t ev;
    size_t need;
    memset(&ev, 0, sizeof ev);
    ev.data = req->body;
    ev.data_len = req->body_len;
    ev.retry_ms = -1;
    /* watch events carry it as text: it must be valid UTF-8 */
    if (om_sse_encode(&ev, NULL, 0, &need) == OM_EINVAL) {
      reply_error(x, REJ_INVALID_FIELD, "body",
                  "policy source must be valid UTF-8");
      return;
    }
    memset(&po, 0, sizeof po);
    po.lib_dir = c->lib_dir;
    err[0] = '\0';
    rc = om_policy_load(&po, name, req->body, req->body_len, &p, err,
                        sizeof err);
    if (rc == OM_ENOMEM) {
      reply_store_error(x, rc);
      return;
    }
    if (rc != 0) {
      reply_error(x, REJ_INVALID_POLICY, NULL, "%s", err);
      return;
    }
    om_policy_free(p);
    ctype = "text/x-lua";
  } else {
    reply_error(x, REJ_UNSUPPORTED_MEDIA_TYPE, NULL,
                "Content-Type must be application/json or text/x-lua");
    return;
  }
  op = op_new(x);
  if (op == NULL || (op->url = dup_str(ctype)) == NULL) {
    if (op != NULL)
      op_free(op);
    reply_store_error(x, OM_ENOMEM);
    return;
  }
  snprintf(op->service, sizeof op->service, "%s", name);
  rc = om_store_config_put(c->store, name, ctype, req->body, req->body_len,
                           on_config_written, op);
  if (rc != 0)
    op_fail(op, rc);
}

static void on_config_read(void *ud, int status, om_config_doc_t *doc) {
  op_t *op = ud;
  if (status != 0 || doc == NULL) {
    if (status == OM_ENOTFOUND || status == 0)
      reply_error(&op->x, REJ_NOT_FOUND, NULL, "no document '%s'", op->service);
    else
      reply_store_error(&op->x, status);
  } else {
    char etag[32], rev[24];
    om_http_header_t eh[2];
    memset(eh, 0, sizeof eh);
    snprintf(rev, sizeof rev, "%" PRIu64, doc->revision);
    snprintf(etag, sizeof etag, "\"%s\"", rev);
    eh[0].name = "ETag";
    eh[0].value = etag;
    eh[1].name = "OpenMesh-Revision";
    eh[1].value = rev;
    reply(&op->x, 200, doc->content_type, doc->body, doc->len, eh, 2);
  }
  op_free(op);
}

static void h_get_config(ctx_t *x, const char *name) {
  om_control_t *c = x->c;
  op_t *op = op_new(x);
  int rc;
  if (op == NULL) {
    reply_store_error(x, OM_ENOMEM);
    return;
  }
  snprintf(op->service, sizeof op->service, "%s", name);
  rc = om_store_config_get(c->store, name, on_config_read, op);
  if (rc != 0)
    op_fail(op, rc);
}

/* ------------------------------------------------------------------ */
/* watches */

static void sse_headers(const om_control_t *c, om_http_header_t *h, size_t *n) {
  memset(h, 0, 4 * sizeof *h);
  h[0].name = "Content-Type";
  h[0].value = "text/event-stream";
  h[1].name = "Cache-Control";
  h[1].value = "no-cache";
  h[2].name = "X-Accel-Buffering"; /* reverse proxies: do not buffer */
  h[2].value = "no";
  *n = 3;
  if (c->cors != NULL) {
    h[3].name = "Access-Control-Allow-Origin";
    h[3].value = c->cors;
    *n = 4;
  }
}

static void h_watch(ctx_t *x, tkind_t kind, const char *name) {
  om_control_t *c = x->c;
  om_http_request_t *req = x->req;
  om_http_header_t h[4];
  size_t nh, idl = 0;
  const char *idv;
  topic_t *t;
  watcher_t *w;
  int rc;
  if (c->closing) {
    reply_error(x, REJ_SHUTTING_DOWN, NULL, "shutting down");
    return;
  }
  sse_headers(c, h, &nh);
  if (x->method == M_HEAD) {
    om_http_respond(req, 200, h, nh, NULL, 0);
    return;
  }
  t = topic_get(c, kind, name);
  w = t != NULL ? calloc(1, sizeof *w) : NULL;
  if (w == NULL) {
    topic_release(c, t);
    reply_store_error(x, OM_ENOMEM);
    return;
  }
  w->c = c;
  w->refs = 1;
  idv = om_http_request_header(req, "last-event-id", &idl);
  if (idv != NULL && parse_u64(idv, idl, &w->last_id) == 0)
    w->has_last_id = 1;
  if (om_http_request_on_close(req, on_watch_close) != 0) {
    free(w); /* the client is already gone */
    topic_release(c, t);
    om_http_response_abort(req);
    return;
  }
  req->user = w;
  rc = om_http_response_start(req, 200, h, nh);
  if (rc != 0) {
    om_http_request_on_close(req, NULL);
    free(w);
    topic_release(c, t);
    om_http_response_abort(req);
    return;
  }
  w->req = req;
  w->topic = t;
  w->next = t->head;
  if (t->head != NULL)
    t->head->prev = w;
  t->head = w;
  t->n++;
  c->watchers++;
  om_metric_set(c->m.watchers, (double)c->watchers);
  om_metric_observe(c->m.latency[x->label], (double)(now_ns() - x->t0) / 1e9);
  x->req = NULL;
  if (watcher_send(w, c->retry_block, c->retry_len, 0) != 0)
    return;
  w->refs++;
  if (kind == T_SERVICE)
    rc = om_store_snapshot(c->store, name, on_watch_snapshot, w);
  else if (kind == T_CONFIG)
    rc = om_store_config_get(c->store, name, on_watch_doc, w);
  else
    rc = om_store_list_services(c->store, on_burst_list, w);
  if (rc != 0) {
    w->refs--;
    watcher_finish(w, FIN_ABORT);
  }
}

/* ------------------------------------------------------------------ */
/* operations */

static void h_healthz(ctx_t *x) {
  reply(x, 200, "text/plain; charset=utf-8", "ok\n", 3, NULL, 0);
}

/* Counters owned elsewhere, copied in before a render. */
static void sync_counter(om_metric_t *m, uint64_t now) {
  double v = om_metric_value(m);
  if ((double)now > v)
    om_metric_add(m, (double)now - v);
}

static void sync_metrics(om_control_t *c) {
  om_store_status_t st;
  metrics_t *m = &c->m;
  memset(&st, 0, sizeof st);
  om_store_status(c->store, &st);
  sync_counter(m->registrations, st.registrations);
  sync_counter(m->renewals, st.renewals);
  sync_counter(m->deletions, st.deletions);
  sync_counter(m->expiries, st.expiries);
  om_metric_set(m->services, (double)st.services);
  om_metric_set(m->instances, (double)st.instances);
  om_metric_set(m->stale, st.stale ? 1 : 0);
  om_metric_set(m->revision, (double)c->rev_max);
  om_metric_set(m->uptime, (double)(now_ns() - c->t_start) / 1e9);
  om_metric_set(m->watchers, (double)c->watchers);
  if (c->srv != NULL) {
    const om_http_server_metrics_t *hm = om_http_server_metrics(c->srv);
    sync_counter(m->conn_accepted, hm->connections_accepted);
    om_metric_set(m->conn_active, (double)hm->connections_active);
    sync_counter(m->conn_rejected, hm->connections_rejected);
    sync_counter(m->http_requests, hm->requests);
    sync_counter(m->http_aborted, hm->responses_aborted);
    for (int i = 0; i < OM_HTTP_REJECT__COUNT; i++)
      sync_counter(m->http_rej[i], hm->rejected[i]);
    sync_counter(m->over_capacity, hm->connections_rejected);
  }
}

static void h_metrics(ctx_t *x) {
  size_t len = 0;
  char *text;
  sync_metrics(x->c);
  text = om_metrics_render(x->c->metrics, &len);
  if (text == NULL) {
    reply_store_error(x, OM_ENOMEM);
    return;
  }
  reply(x, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, NULL, 0);
  free(text);
}

static void h_status(ctx_t *x) {
  om_control_t *c = x->c;
  om_store_status_t st;
  json_t *o = json_object(), *docs = json_array();
  char *body = NULL;
  memset(&st, 0, sizeof st);
  om_store_status(c->store, &st);
  if (o != NULL && docs != NULL) {
    json_object_set_new(o, "store", json_string(om_store_name(c->store)));
    json_object_set_new(o, "stale", json_boolean(st.stale));
    json_object_set_new(o, "services", json_integer((json_int_t)st.services));
    json_object_set_new(o, "instances", json_integer((json_int_t)st.instances));
    json_object_set_new(o, "watchers", json_integer((json_int_t)c->watchers));
    json_object_set_new(o, "uptime_s",
                        json_real((double)(now_ns() - c->t_start) / 1e9));
    json_object_set_new(o, "revision", json_integer((json_int_t)c->rev_max));
    json_object_set_new(o, "registrations",
                        json_integer((json_int_t)st.registrations));
    json_object_set_new(o, "renewals", json_integer((json_int_t)st.renewals));
    json_object_set_new(o, "deletions", json_integer((json_int_t)st.deletions));
    json_object_set_new(o, "expiries", json_integer((json_int_t)st.expiries));
    json_object_set_new(o, "auth", json_boolean(c->auth != NULL));
    for (size_t i = 0; i < c->n_docs; i++) {
      json_t *d = json_object();
      if (d == NULL)
        continue;
      json_object_set_new(d, "name", json_string(c->docs[i]->name));
      json_object_set_new(d, "revision",
                          json_integer((json_int_t)c->docs[i]->revision));
      json_object_set_new(d, "content_type",
                          json_string(c->docs[i]->content_type));
      json_array_append_new(docs, d);
    }
    json_object_set(o, "config", docs);
    body = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
  }
  json_decref(docs);
  json_decref(o);
  if (body == NULL) {
    reply_store_error(x, OM_ENOMEM);
    return;
  }
  reply_json(x, 200, body, strlen(body));
  free(body);
}

/* ------------------------------------------------------------------ */
/* routing */

typedef struct seg_s {
  const char *p;
  size_t n;
} seg_t;

static int seg_is(const seg_t *s, const char *lit) {
  size_t n = strlen(lit);
  return s->n == n && memcmp(s->p, lit, n) == 0;
}

/* Split "/a/b/c" into segments; -1 when there are too many. */
static int split_path(const char *path, size_t len, seg_t *segs) {
  int n = 0;
  size_t i = 0;
  if (len == 0 || path[0] != '/')
    return 0;
  while (i < len) {
    size_t j = ++i;
    while (j < len && path[j] != '/')
      j++;
    if (n == MAX_SEGMENTS)
      return -1;
    segs[n].p = path + i;
    segs[n].n = j - i;
    n++;
    i = j;
  }
  return n;
}

/* The route, and in names[] the segments that carry names. */
static route_t match(const seg_t *s, int n, const seg_t **names) {
  for (int i = 0; i < n; i++)
    if (s[i].n == 0)
      return R_NONE;
  if (n == 1 && seg_is(&s[0], "healthz"))
    return R_HEALTHZ;
  if (n == 1 && seg_is(&s[0], "metrics"))
    return R_METRICS;
  if (n == 1 && seg_is(&s[0], "status"))
    return R_STATUS;
  if (n < 2 || !seg_is(&s[0], "v1"))
    return R_NONE;
  if (seg_is(&s[1], "services")) {
    if (n == 2)
      return R_SERVICES;
    names[0] = &s[2];
    if (n == 3)
      return R_SERVICE;
    if (n >= 5 && seg_is(&s[3], "instances")) {
      names[1] = &s[4];
      if (n == 5)
        return R_INSTANCE;
      if (n == 6 && seg_is(&s[5], "heartbeat"))
        return R_HEARTBEAT;
    }
    return R_NONE;
  }
  if (seg_is(&s[1], "config") && n == 3) {
    names[0] = &s[2];
    return R_CONFIG;
  }
  if (seg_is(&s[1], "watch") && n >= 3) {
    if (seg_is(&s[2], "services") && n == 3)
      return R_WATCH_ALL;
    if (seg_is(&s[2], "services") && n == 4) {
      names[0] = &s[3];
      return R_WATCH_SERVICE;
    }
    if (seg_is(&s[2], "config") && n == 4) {
      names[0] = &s[3];
      return R_WATCH_CONFIG;
    }
  }
  return R_NONE;
}

static unsigned method_bit(const om_http_request_t *req) {
  static const struct {
    const char *name;
    unsigned bit;
  } m[] = {{"GET", M_GET},   {"HEAD", M_HEAD},     {"PUT", M_PUT},
           {"POST", M_POST}, {"DELETE", M_DELETE}, {"OPTIONS", M_OPTIONS}};
  for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
    if (strcmp(req->method, m[i].name) == 0)
      return m[i].bit;
  return 0;
}

static int route_role(route_t r, unsigned method) {
  switch (r) {
  case R_HEALTHZ:
  case R_METRICS:
    return 0;
  case R_INSTANCE:
  case R_HEARTBEAT:
    return OM_ROLE_REGISTER;
  case R_CONFIG:
    return method == M_PUT ? OM_ROLE_ADMIN : OM_ROLE_READ;
  default:
    return OM_ROLE_READ;
  }
}

static int route_label(route_t r, unsigned method) {
  switch (r) {
  case R_HEALTHZ:
  case R_METRICS:
  case R_STATUS:
    return L_OPS;
  case R_SERVICES:
    return L_LIST;
  case R_SERVICE:
    return L_DISCOVERY;
  case R_INSTANCE:
    return method == M_DELETE ? L_DEREGISTER : L_REGISTER;
  case R_HEARTBEAT:
    return L_HEARTBEAT;
  case R_WATCH_ALL:
  case R_WATCH_SERVICE:
  case R_WATCH_CONFIG:
    return L_WATCH;
  case R_CONFIG:
    return method == M_PUT ? L_CONFIG_PUT : L_CONFIG_GET;
  default:
    return L_OTHER;
  }
}

/* A CORS preflight or a plain OPTIONS (RFC 9110 9.3.7). */
static void h_options(ctx_t *x, route_t r) {
  om_http_header_t h[5];
  size_t n = 0;
  memset(h, 0, sizeof h);
  h[n].name = "Allow";
  h[n++].value = routes[r].allow;
  if (x->c->cors != NULL) {
    h[n].name = "Access-Control-Allow-Methods";
    h[n++].value = routes[r].allow;
    h[n].name = "Access-Control-Allow-Headers";
    h[n++].value = "Authorization, Content-Type, Last-Event-ID";
    h[n].name = "Access-Control-Max-Age";
    h[n++].value = "600";
  }
  reply(x, 204, NULL, NULL, 0, h, n);
}

/* Decode and check a name segment; answers 400 and returns -1 if bad. */
static int take_name(ctx_t *x, const seg_t *s, const char *field, char *out) {
  long k = pct_decode(s->p, s->n, 0, out, OM_NAME_MAX + 1);
  if (k < 0 || !om_valid_name(out, (size_t)k)) {
    reply_error(x, REJ_INVALID_FIELD, field,
                "field '%s': must be 1 to 128 characters of [A-Za-z0-9._-], "
                "not \".\" or \"..\"",
                field);
    return -1;
  }
  return 0;
}

static void on_request(om_http_request_t *req, void *ud) {
  om_control_t *c = ud;
  ctx_t x;
  seg_t segs[MAX_SEGMENTS];
  const seg_t *names[2] = {NULL, NULL};
  char a[OM_NAME_MAX + 1], b[OM_NAME_MAX + 1];
  int n = split_path(req->path, req->path_len, segs);
  route_t r = n > 0 ? match(segs, n, names) : R_NONE;
  x.c = c;
  x.req = req;
  x.t0 = now_ns();
  x.method = method_bit(req);
  x.label = route_label(r, x.method);
  if (r == R_NONE) {
    reply_error(&x, REJ_NOT_FOUND, NULL, "no route for %s", req->path);
    return;
  }
  if ((routes[r].methods & x.method) == 0) {
    om_http_header_t h[1];
    memset(h, 0, sizeof h);
    h[0].name = "Allow";
    h[0].value = routes[r].allow;
    reply_error_h(&x, REJ_METHOD_NOT_ALLOWED, NULL, 0, h, 1,
                  "%s is not allowed here; allowed: %s", req->method,
                  routes[r].allow);
    return;
  }
  if (x.method == M_OPTIONS) {
    h_options(&x, r);
    return;
  }
  if (!authorize(&x, route_role(r, x.method)))
    return;
  switch (r) {
  case R_HEALTHZ:
    h_healthz(&x);
    return;
  case R_METRICS:
    h_metrics(&x);
    return;
  case R_STATUS:
    h_status(&x);
    return;
  case R_SERVICES:
    h_list_services(&x);
    return;
  case R_WATCH_ALL:
    h_watch(&x, T_ALL, "");
    return;
  default:
    break;
  }
  if (take_name(&x, names[0],
                r == R_CONFIG || r == R_WATCH_CONFIG ? "name" : "service",
                a) != 0)
    return;
  if (names[1] != NULL && take_name(&x, names[1], "id", b) != 0)
    return;
  switch (r) {
  case R_SERVICE:
    h_get_service(&x, a);
    return;
  case R_INSTANCE:
    if (x.method == M_PUT)
      h_put_instance(&x, a, b);
    else
      h_instance_op(&x, a, b, 0);
    return;
  case R_HEARTBEAT:
    h_instance_op(&x, a, b, 1);
    return;
  case R_WATCH_SERVICE:
    h_watch(&x, T_SERVICE, a);
    return;
  case R_CONFIG:
    if (x.method == M_PUT)
      h_put_config(&x, a);
    else
      h_get_config(&x, a);
    return;
  case R_WATCH_CONFIG:
    h_watch(&x, T_CONFIG, a);
    return;
  default:
    reply_error(&x, REJ_NOT_FOUND, NULL, "no route for %s", req->path);
    return;
  }
}

/* ------------------------------------------------------------------ */
/* metrics registry */

#define P "openmesh_control_"

static int metrics_init(om_control_t *c) {
  static const double bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                  0.005,  0.01,    0.025,  0.05,  0.1,
                                  0.25,   0.5,     1.0,    2.5};
  om_metrics_t *r = om_metrics_new();
  metrics_t *m = &c->m;
  char labels[96];
  int ok = 1;
  if (r == NULL)
    return OM_ENOMEM;
  c->metrics = r;
#define CHK(e) ok = ((e) != NULL) && ok
  CHK(m->registrations = om_metrics_counter(
          r, P "registrations_total",
          "Registrations that created or changed an instance", ""));
  CHK(m->renewals = om_metrics_counter(
          r, P "renewals_total", "Lease renewals (PUT unchanged or heartbeat)",
          ""));
  CHK(m->deletions = om_metrics_counter(r, P "deletions_total",
                                        "Instances deleted by request", ""));
  CHK(m->expiries =
          om_metrics_counter(r, P "expiries_total",
                             "Instances removed when their lease expired", ""));
  CHK(m->revision = om_metrics_gauge(
          r, P "revision", "Highest revision issued (high-water mark)", ""));
  CHK(m->services =
          om_metrics_gauge(r, P "services", "Services known to the store", ""));
  CHK(m->instances = om_metrics_gauge(
          r, P "instances", "Registered instances (live leases)", ""));
  CHK(m->stale =
          om_metrics_gauge(r, P "store_stale",
                           "1 when the store serves its last known state", ""));
  CHK(m->uptime =
          om_metrics_gauge(r, P "uptime_seconds",
                           "Seconds since the control plane started", ""));
  CHK(m->watchers =
          om_metrics_gauge(r, P "watchers", "Open watch streams (SSE)", ""));
  CHK(m->events =
          om_metrics_counter(r, P "watch_events_total",
                             "Snapshot events written to watchers", ""));
  CHK(m->pings =
          om_metrics_counter(r, P "watch_pings_total",
                             "Keep-alive comments written to watchers", ""));
  CHK(m->dropped = om_metrics_counter(
          r, P "watchers_dropped_total",
          "Watchers disconnected because their unsent backlog hit the limit",
          "reason=\"backlog\""));
  CHK(m->reload_ok =
          om_metrics_counter(r, P "auth_reloads_total",
                             "Token file reloads (SIGHUP)", "result=\"ok\""));
  CHK(m->reload_failed = om_metrics_counter(r, P "auth_reloads_total",
                                            "Token file reloads (SIGHUP)",
                                            "result=\"error\""));
  CHK(m->conn_accepted =
          om_metrics_counter(r, "openmesh_http_connections_accepted_total",
                             "HTTP connections accepted", ""));
  CHK(m->conn_active = om_metrics_gauge(r, "openmesh_http_connections_active",
                                        "HTTP connections open now", ""));
  CHK(m->conn_rejected = om_metrics_counter(
          r, "openmesh_http_connections_rejected_total",
          "HTTP connections refused over max_connections", ""));
  CHK(m->http_requests =
          om_metrics_counter(r, "openmesh_http_requests_total",
                             "HTTP requests dispatched to the handler", ""));
  CHK(m->http_aborted = om_metrics_counter(
          r, "openmesh_http_responses_aborted_total",
          "HTTP responses cut (client gone, aborted stream)", ""));
  for (int i = 0; i < REJ__COUNT; i++) {
    snprintf(labels, sizeof labels, "reason=\"%s\"", rej_names[i]);
    CHK(m->rej[i] = om_metrics_counter(r, P "rejections_total",
                                       "Requests refused, by reason", labels));
  }
  for (int i = 0; i < OM_HTTP_REJECT__COUNT; i++) {
    snprintf(labels, sizeof labels, "reason=\"%s\"",
             om_http_reject_name((om_http_reject_t)i));
    CHK(m->http_rej[i] = om_metrics_counter(
            r, P "rejections_total", "Requests refused, by reason", labels));
  }
  CHK(m->over_capacity = om_metrics_counter(r, P "rejections_total",
                                            "Requests refused, by reason",
                                            "reason=\"over_capacity\""));
  for (int i = 0; i < L__COUNT; i++) {
    snprintf(labels, sizeof labels, "route=\"%s\"", label_names[i]);
    CHK(m->latency[i] = om_metrics_histogram(
            r, P "request_duration_seconds",
            "Time from a complete request to its answer (watches: to the "
            "stream's start)",
            labels, bounds, sizeof bounds / sizeof bounds[0]));
  }
#undef CHK
  return ok ? 0 : OM_ENOMEM;
}

#undef P

/* ------------------------------------------------------------------ */
/* lifetime */

static void control_free(om_control_t *c) {
  for (size_t i = 0; i < c->n_topics; i++)
    topic_free(c->topics[i]);
  free(c->topics);
  for (size_t i = 0; i < c->n_mirror; i++)
    om_snapshot_unref(c->mirror[i]);
  free(c->mirror);
  for (size_t i = 0; i < c->n_docs; i++)
    om_config_doc_unref(c->docs[i]);
  free(c->docs);
  om_metrics_free(c->metrics);
  om_auth_free(c->auth);
  free(c->cors);
  free(c->lib_dir);
  free(c);
}

static int valid_header_value(const char *s) {
  if (*s == '\0' || *s == ' ')
    return 0;
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
      return 0;
  return s[-1] != ' ';
}

int om_control_new(uv_loop_t *loop, const om_control_opts_t *opts,
                   om_control_t **out) {
  om_control_t *c;
  om_store_t *st;
  int rc;
  if (loop == NULL || opts == NULL || out == NULL || opts->store == NULL)
    return OM_EINVAL;
  if (opts->cors_origin != NULL && !valid_header_value(opts->cors_origin))
    return OM_EINVAL;
  st = opts->store;
  c = calloc(1, sizeof *c);
  if (c == NULL)
    return OM_ENOMEM;
  c->loop = loop;
  c->store = st;
  c->ping_ms = opts->ping_interval_ms ? opts->ping_interval_ms
                                      : OM_CONTROL_DEFAULT_PING_MS;
  c->max_backlog = opts->max_watch_backlog ? opts->max_watch_backlog
                                           : OM_CONTROL_DEFAULT_BACKLOG;
  c->retry_len = (size_t)snprintf(
      c->retry_block, sizeof c->retry_block, "retry: %" PRIu64 "\n\n",
      opts->retry_ms ? opts->retry_ms : (uint64_t)OM_CONTROL_DEFAULT_RETRY_MS);
  c->t_start = now_ns();
  rc = OM_ENOMEM;
  if ((opts->cors_origin != NULL &&
       (c->cors = dup_str(opts->cors_origin)) == NULL) ||
      (c->lib_dir = dup_str(opts->lib_dir != NULL ? opts->lib_dir
                                                  : om_lib_dir())) == NULL ||
      metrics_init(c) != 0)
    goto fail;
  rc = om_store_subscribe(st, NULL, on_service_event, c, &c->svc_sub);
  if (rc != 0)
    goto fail;
  rc = om_store_subscribe_config(st, NULL, on_config_event, c, &c->cfg_sub);
  if (rc != 0)
    goto fail_sub;
  rc = om_http_server_new(loop, &opts->http, on_request, c, &c->srv);
  if (rc != 0)
    goto fail_cfg;
  uv_timer_init(loop, &c->ping); /* cannot fail */
  c->ping.data = c;
  uv_timer_start(&c->ping, on_ping, c->ping_ms, c->ping_ms);
  c->auth = opts->auth;
  *out = c;
  return 0;
fail_cfg:
  om_store_unsubscribe(st, c->cfg_sub);
fail_sub:
  om_store_unsubscribe(st, c->svc_sub);
fail:
  control_free(c);
  return rc;
}

int om_control_listen(om_control_t *c, const char *host, int port) {
  if (c == NULL)
    return OM_EINVAL;
  if (c->closing)
    return OM_ESTATE;
  return om_http_server_listen(c->srv, host, port);
}

int om_control_port(const om_control_t *c) {
  if (c == NULL || c->srv == NULL)
    return OM_ESTATE;
  return om_http_server_port(c->srv);
}

void om_control_set_auth(om_control_t *c, om_auth_t *auth) {
  if (c == NULL) {
    om_auth_free(auth);
    return;
  }
  om_auth_free(c->auth);
  c->auth = auth;
}

int om_control_reload_auth(om_control_t *c, const char *path, char *err,
                           size_t errlen) {
  char msg[512];
  om_auth_t *a = NULL;
  int rc;
  if (c == NULL || path == NULL)
    return OM_EINVAL;
  msg[0] = '\0';
  rc = om_auth_load(path, &a, msg, sizeof msg);
  if (rc != 0) {
    om_metric_inc(c->m.reload_failed);
    om_log(OM_LOG_ERROR, "auth_reload_failed", "path", path, "error", msg,
           "note", "the previous tokens stay in force", NULL);
    if (err != NULL && errlen > 0)
      snprintf(err, errlen, "%s", msg);
    return rc;
  }
  {
    char n[24];
    snprintf(n, sizeof n, "%zu", om_auth_count(a));
    om_control_set_auth(c, a);
    om_metric_inc(c->m.reload_ok);
    om_log(OM_LOG_INFO, "auth_reloaded", "path", path, "tokens", n, NULL);
  }
  return 0;
}

void om_control_stats(const om_control_t *c, om_control_stats_t *out) {
  if (c == NULL || out == NULL)
    return;
  memset(out, 0, sizeof *out);
  out->watchers = c->watchers;
  out->events_sent = c->events_sent;
  out->watchers_dropped = c->dropped;
  out->revision = c->rev_max;
}

static void maybe_finish(om_control_t *c) {
  void (*done)(void *);
  void *ud;
  if (!c->closing || !c->srv_closed || !c->timer_closed || c->pending_ops != 0)
    return;
  done = c->done;
  ud = c->done_ud;
  control_free(c);
  if (done != NULL)
    done(ud);
}

static void on_srv_closed(om_http_server_t *srv, void *ud) {
  om_control_t *c = ud;
  (void)srv;
  c->srv = NULL;
  c->srv_closed = 1;
  maybe_finish(c);
}

static void on_timer_closed(uv_handle_t *h) {
  om_control_t *c = h->data;
  c->timer_closed = 1;
  maybe_finish(c);
}

int om_control_close(om_control_t *c, void (*done)(void *ud), void *ud) {
  if (c == NULL)
    return OM_EINVAL;
  if (c->closing)
    return OM_ESTATE;
  c->closing = 1;
  c->done = done;
  c->done_ud = ud;
  uv_timer_stop(&c->ping);
  uv_close((uv_handle_t *)&c->ping, on_timer_closed);
  /* end every stream cleanly: the client sees a complete response */
  while (c->n_topics > 0) {
    topic_t *t = c->topics[0];
    t->busy = 1;
    while (t->head != NULL)
      watcher_finish(t->head, FIN_END);
    t->busy = 0;
    topic_release(c, t);
  }
  om_store_unsubscribe(c->store, c->svc_sub);
  om_store_unsubscribe(c->store, c->cfg_sub);
  c->svc_sub = c->cfg_sub = NULL;
  om_http_server_close(c->srv, on_srv_closed);
  return 0;
}
