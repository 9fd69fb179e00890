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
 *
 * Files: this one routes, answers and owns the lifetime; the watches and
 * the fan-out are in om_control_watch.c, the other handlers (auth,
 * registry, configuration, operator routes) in om_control_handlers.c;
 * what they share is in om_control_internal.h.
 */
#include "om_control_internal.h"
#include "om_http_tls.h"

/* ------------------------------------------------------------------ */
/* vocabulary tables */

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

static const char *const label_names[] = {
    "register",   "heartbeat",  "deregister", "discovery",     "list", "watch",
    "config_get", "config_put", "ops",        "config_report", "other"};

static const struct {
  unsigned methods;
  const char *allow;
} routes[R__COUNT] = {
    [R_HEALTHZ] = {M_GET | M_HEAD | M_OPTIONS, "GET, HEAD, OPTIONS"},
    [R_READYZ] = {M_GET | M_HEAD | M_OPTIONS, "GET, HEAD, OPTIONS"},
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
    [R_CONFIG_STATUS] = {M_GET | M_HEAD | M_POST | M_OPTIONS,
                         "GET, HEAD, POST, OPTIONS"},
    [R_UI] = {M_GET | M_HEAD | M_OPTIONS, "GET, HEAD, OPTIONS"},
    [R_LEASES] = {M_GET | M_HEAD | M_OPTIONS, "GET, HEAD, OPTIONS"},
};

/* ------------------------------------------------------------------ */
/* small helpers */

char *om__dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  return d != NULL ? memcpy(d, s, n) : NULL;
}

/* Grow *arr (elements of elem bytes) to hold need; 0 or OM_ENOMEM. */
int om__grow(void **arr, size_t *cap, size_t need, size_t elem) {
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
long om__pct_decode(const char *s, size_t n, int plus, char *out, size_t cap) {
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
int om__parse_u64(const char *s, size_t n, uint64_t *out) {
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
const char *om__query_param(const char *q, size_t qlen, const char *key,
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

uint64_t om__now_ns(void) {
  return uv_hrtime();
}

/* ------------------------------------------------------------------ */
/* answers */

/*
 * Answer with body b1 followed by b2 (b2 lets a cached document be sent
 * with a suffix without copying it). Always releases the request.
 */
void om__reply2(ctx_t *x, int status, const char *ctype, const char *b1,
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
  om_metric_observe(c->m.latency[x->label],
                    (double)(om__now_ns() - x->t0) / 1e9);
}

void om__reply(ctx_t *x, int status, const char *ctype, const char *body,
               size_t len, const om_http_header_t *extra, size_t n_extra) {
  om__reply2(x, status, ctype, body, len, NULL, 0, extra, n_extra);
}

void om__reply_json(ctx_t *x, int status, const char *body, size_t len) {
  om__reply(x, status, "application/json", body, len, NULL, 0);
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
/* The refusal of om__reply_error_h with the message made, and, for a
 * write the store could not apply, "outcome" (NULL: none). */
static void reply_refusal(ctx_t *x, rej_t why, const char *field, uint64_t rev,
                          const char *outcome, const om_http_header_t *extra,
                          size_t n_extra, char *msg) {
  om_control_t *c = x->c;
  int status = rej_status[why];
  char st[8];
  json_t *o = json_object();
  char *body = NULL;
  if (o != NULL) {
    json_object_set_new(o, "error", json_string(rej_names[why]));
    if (outcome != NULL)
      json_object_set_new(o, "outcome", json_string(outcome));
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
    om__reply(x, status, "application/json", body, strlen(body), extra,
              n_extra);
    free(body);
  } else {
    char tiny[64];
    int k = snprintf(tiny, sizeof tiny, "{\"error\":\"%s\"}", rej_names[why]);
    om__reply(x, status, "application/json", tiny, (size_t)k, extra, n_extra);
  }
}

void om__reply_error_h(ctx_t *x, rej_t why, const char *field, uint64_t rev,
                       const om_http_header_t *extra, size_t n_extra,
                       const char *fmt, ...) {
  char msg[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  reply_refusal(x, why, field, rev, NULL, extra, n_extra, msg);
}

/* A store operation that failed to start or finished with an error. */
void om__reply_store_error(ctx_t *x, int rc) {
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
    char msg[256];
    snprintf(msg, sizeof msg,
             "the %s store is unreachable: the change was not applied; "
             "retry later (reads serve the last known state, see /status)",
             om_store_name(x->c->store));
    reply_refusal(x, REJ_UNAVAILABLE, NULL, 0, "not_applied", retry, 1, msg);
    return;
  }
  case OM_EOUTCOME: {
    /* The store went away after the change was sent: it may have been
     * applied. Saying "not applied" would be a lie once in a while (a
     * Redis killed between running a script and answering it); the
     * writes are idempotent by key (a config PUT again stores the same
     * content at a new revision), so the honest answer is "unknown, and
     * a retry is safe". */
    static const om_http_header_t retry[] = {{"Retry-After", "1", 0, 0}};
    char msg[320];
    snprintf(msg, sizeof msg,
             "the %s store went away after the change was sent: it may or "
             "may not have been applied; retrying is safe (a lease PUT "
             "is idempotent, a DELETE answers not found once done, a "
             "config PUT stores the same document again)",
             om_store_name(x->c->store));
    reply_refusal(x, REJ_UNAVAILABLE, NULL, 0, "unknown", retry, 1, msg);
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

op_t *om__op_new(ctx_t *x) {
  op_t *op = calloc(1, sizeof *op);
  if (op == NULL)
    return NULL;
  om_list_init(&op->wlink);
  op->x = *x;
  x->c->pending_ops++;
  return op;
}

/*
 * om__op_new for a handler that has nothing of its own to allocate: on no
 * memory it answers x itself and returns NULL. name (NULL: none) goes to
 * op->service.
 */
op_t *om__op_start(ctx_t *x, const char *name) {
  op_t *op = om__op_new(x);
  if (op == NULL) {
    om__reply_store_error(x, OM_ENOMEM);
    return NULL;
  }
  if (name != NULL)
    snprintf(op->service, sizeof op->service, "%s", name);
  return op;
}

void om__op_free(op_t *op) {
  om_control_t *c = op->x.c;
  om_list_remove(&op->wlink);
  free(op->url);
  free(op);
  c->pending_ops--;
  maybe_finish(c);
}

/* op writes an instance (a PUT, or a DELETE: deleting) until it is freed. */
void om__op_writing(op_t *op, int deleting) {
  om_control_t *c = op->x.c;
  op->deleting = deleting;
  om_list_push_front(&c->writes, &op->wlink);
}

/* The store refused to start the operation: answer and drop it. */
void om__op_fail(op_t *op, int rc) {
  om__reply_store_error(&op->x, rc);
  om__op_free(op);
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
  if (n == 1 && seg_is(&s[0], "readyz"))
    return R_READYZ;
  if (n == 1 && seg_is(&s[0], "metrics"))
    return R_METRICS;
  if (n == 1 && seg_is(&s[0], "status"))
    return R_STATUS;
  if (n <= 2 && seg_is(&s[0], "ui")) {
    names[0] = n == 2 ? &s[1] : NULL;
    return R_UI;
  }
  if (n < 2 || !seg_is(&s[0], "v1"))
    return R_NONE;
  if (n == 2 && seg_is(&s[1], "leases"))
    return R_LEASES;
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
  if (seg_is(&s[1], "config") && n == 4 && seg_is(&s[3], "status")) {
    names[0] = &s[2];
    return R_CONFIG_STATUS;
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
  case R_READYZ:
  case R_METRICS:
  case R_UI: /* the console's files hold no data */
    return 0;
  case R_INSTANCE:
  case R_HEARTBEAT:
    return OM_ROLE_REGISTER;
  case R_CONFIG:
    return method == M_PUT ? OM_ROLE_ADMIN : OM_ROLE_READ;
  case R_CONFIG_STATUS:
    /* a proxy reporting on itself, as a heartbeat does */
    return method == M_POST ? OM_ROLE_REGISTER : OM_ROLE_READ;
  default:
    return OM_ROLE_READ;
  }
}

static int route_label(route_t r, unsigned method) {
  switch (r) {
  case R_HEALTHZ:
  case R_READYZ:
  case R_METRICS:
  case R_STATUS:
  case R_UI:
    return L_OPS;
  case R_SERVICES:
  case R_LEASES:
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
  case R_CONFIG_STATUS:
    return method == M_POST ? L_CONFIG_REPORT : L_CONFIG_GET;
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
  om__reply(x, 204, NULL, NULL, 0, h, n);
}

/* Decode and check a name segment; answers 400 and returns -1 if bad. */
static int take_name(ctx_t *x, const seg_t *s, const char *field, char *out) {
  long k = om__pct_decode(s->p, s->n, 0, out, OM_NAME_MAX + 1);
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
  x.t0 = om__now_ns();
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
    om__reply_error_h(&x, REJ_METHOD_NOT_ALLOWED, NULL, 0, h, 1,
                      "%s is not allowed here; allowed: %s", req->method,
                      routes[r].allow);
    return;
  }
  if (x.method == M_OPTIONS) {
    h_options(&x, r);
    return;
  }
  if (!om__authorize(&x, route_role(r, x.method)))
    return;
  switch (r) {
  case R_HEALTHZ:
    om__h_healthz(&x);
    return;
  case R_READYZ:
    om__h_readyz(&x);
    return;
  case R_METRICS:
    om__h_metrics(&x);
    return;
  case R_STATUS:
    om__h_status(&x);
    return;
  case R_SERVICES:
    om__h_list_services(&x);
    return;
  case R_WATCH_ALL:
    om__h_watch(&x, T_ALL, "");
    return;
  case R_LEASES:
    om__h_leases(&x);
    return;
  case R_UI:
    om__h_ui(&x, names[0] != NULL ? names[0]->p : NULL,
             names[0] != NULL ? names[0]->n : 0);
    return;
  default:
    break;
  }
  if (take_name(&x, names[0],
                r == R_CONFIG || r == R_WATCH_CONFIG || r == R_CONFIG_STATUS
                    ? "name"
                    : "service",
                a) != 0)
    return;
  if (names[1] != NULL && take_name(&x, names[1], "id", b) != 0)
    return;
  switch (r) {
  case R_SERVICE:
    om__h_get_service(&x, a);
    return;
  case R_INSTANCE:
    if (x.method == M_PUT)
      om__h_put_instance(&x, a, b);
    else
      om__h_instance_op(&x, a, b, 0);
    return;
  case R_HEARTBEAT:
    om__h_instance_op(&x, a, b, 1);
    return;
  case R_WATCH_SERVICE:
    om__h_watch(&x, T_SERVICE, a);
    return;
  case R_CONFIG:
    if (x.method == M_PUT)
      om__h_put_config(&x, a);
    else
      om__h_get_config(&x, a);
    return;
  case R_WATCH_CONFIG:
    om__h_watch(&x, T_CONFIG, a);
    return;
  case R_CONFIG_STATUS:
    if (x.method == M_POST)
      om__h_config_report(&x, a);
    else
      om__h_config_status(&x, a);
    return;
  default:
    reply_error(&x, REJ_NOT_FOUND, NULL, "no route for %s", req->path);
    return;
  }
}

/* ------------------------------------------------------------------ */
/* the warm-up window */

static void on_warm_kick(uv_timer_t *timer) {
  (void)timer;
}

static void on_warm_timer(uv_timer_t *timer) {
  om_control_t *c = timer->data;
  char n[24];
  if (c->closing || c->warm_until == 0)
    return;
  c->warm_until = 0;
  om_metric_set(c->m.warming, 0);
  snprintf(n, sizeof n, "%zu", c->n_mirror);
  om_log(OM_LOG_INFO, "control_warm", "services", n, "note",
         "snapshots no longer carry warming; every watcher gets its "
         "snapshot again",
         NULL);
  om__fanout_warm(c);
  /* The HTTP server sends what a timer wrote from its check phase, right
   * after the loop's next poll; with nothing due that poll would block
   * until the next ping. A timer due in 1 ms makes it return then (one of
   * 0 ms would run in this same pass of the timers, libuv 1.44). */
  uv_timer_start(&c->warm_timer, on_warm_kick, 1, 0);
}

/*
 * Whether the plane is inside its warm-up window, opening one when the
 * store says it lost its state since the last look. A store that came
 * back empty knows none of the leases its keepers still renew: until each
 * keeper has renewed once (a lease's TTL at most), its snapshots are
 * partial, and a client that replaced its topology by them would drop
 * live instances. The window says so on every snapshot ("warming": true)
 * so that clients merge instead of replacing (docs/CONTROL.md "Warm-up").
 * Polled where a snapshot is served or a store change arrives: a Redis
 * epoch change is seen before the changes it causes are delivered.
 */
int om__warming(om_control_t *c) {
  om_store_status_t st;
  uint64_t now;
  if (c->warmup_ns == 0)
    return 0;
  memset(&st, 0, sizeof st);
  om_store_status(c->store, &st);
  now = om__now_ns();
  if (st.state_lost != c->seen_lost && !c->closing) {
    char ms[24];
    c->seen_lost = st.state_lost;
    c->warm_until = now + c->warmup_ns;
    if (c->warm_until == 0)
      c->warm_until = 1;
    uv_timer_start(&c->warm_timer, on_warm_timer,
                   (c->warmup_ns + 999999) / 1000000, 0);
    om_metric_set(c->m.warming, 1);
    om_metric_inc(c->m.warmups);
    snprintf(ms, sizeof ms, "%" PRIu64, c->warmup_ns / 1000000);
    om_log(OM_LOG_WARN, "control_warming", "store", om_store_name(c->store),
           "window_ms", ms, "note",
           "the store holds none of its previous leases: snapshots carry "
           "warming until every keeper renewed",
           NULL);
  }
  return c->warm_until != 0;
}

unsigned om__snapshot_flags(om_control_t *c) {
  return om__warming(c) ? OM_SNAPSHOT_JSON_WARMING : 0;
}

/* What is left of the window, rounded up (0: warm). */
uint64_t om__warm_remaining_ms(const om_control_t *c) {
  uint64_t now = om__now_ns();
  if (c->warm_until == 0)
    return 0;
  return c->warm_until > now ? (c->warm_until - now + 999999) / 1000000 : 1;
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
          "Watchers the plane disconnected: backlog (unsent bytes hit the "
          "limit), revoked (a tokens reload took the stream's role)",
          "reason=\"backlog\""));
  CHK(m->revoked = om_metrics_counter(
          r, P "watchers_dropped_total",
          "Watchers the plane disconnected: backlog (unsent bytes hit the "
          "limit), revoked (a tokens reload took the stream's role)",
          "reason=\"revoked\""));
  CHK(m->coalesced = om_metrics_counter(
          r, P "watch_events_coalesced_total",
          "States held for a watcher whose client had not taken the previous "
          "one (written when it drains; a newer one replaces it)",
          ""));
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
  CHK(m->conn_reserved = om_metrics_counter(
          r, "openmesh_http_connections_reserved_total",
          "HTTP connections over max_connections taken into the health "
          "reserve (served for /healthz and /readyz, else 503)",
          ""));
  CHK(m->reserve_evicted = om_metrics_counter(
          r, "openmesh_http_reserve_evicted_total",
          "Reserve connections closed before their request to make room "
          "for a newer one",
          ""));
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
  {
    static const char *const results[] = {"applied", "refused", "invalid",
                                          "evicted"};
    for (int i = 0; i < 4; i++) {
      snprintf(labels, sizeof labels, "result=\"%s\"", results[i]);
      CHK(m->reports[i] = om_metrics_counter(
              r, P "policy_reports_total",
              "Policy verdicts reported by proxies (applied, refused), "
              "reports refused as invalid, and entries evicted from a full "
              "status table",
              labels));
    }
  }
  CHK(m->warming = om_metrics_gauge(
          r, P "warming",
          "1 inside the warm-up window after the store lost its state "
          "(snapshots carry \"warming\": true, /readyz answers 503)",
          ""));
  CHK(m->warmups = om_metrics_counter(
          r, P "warmups_total",
          "Warm-up windows started (the store started empty or lost its "
          "state)",
          ""));
  CHK(m->collected = om_metrics_counter(
          r, P "services_collected_total",
          "Services removed after --empty-service-ttl without an instance "
          "or a watcher of their own",
          ""));
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
    om__topic_free(c->topics[i]);
  free(c->topics);
  for (size_t i = 0; i < c->n_mirror; i++)
    om_snapshot_unref(c->mirror[i]);
  free(c->mirror);
  for (size_t i = 0; i < c->n_docs; i++)
    om_config_doc_unref(c->docs[i]);
  free(c->docs);
  om_metrics_free(c->metrics);
  om_cfg_status_free(c->cfg_status);
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

/* The paths a connection over max_connections may still ask for:
 * liveness and readiness answer while a flood holds every other slot. */
static const char *const health_paths[] = {"/healthz", "/readyz", NULL};

int om_control_new(uv_loop_t *loop, const om_control_opts_t *opts,
                   om_control_t **out) {
  om_http_server_opts_t http;
  om_control_t *c;
  om_store_t *st;
  int rc;
  if (loop == NULL || opts == NULL || out == NULL || opts->store == NULL)
    return OM_EINVAL;
  if (opts->cors_origin != NULL && !valid_header_value(opts->cors_origin))
    return OM_EINVAL;
  if (opts->warmup_ms > OM_CONTROL_MAX_WARMUP_MS ||
      opts->empty_service_ttl_ms > OM_CONTROL_MAX_EMPTY_TTL_MS ||
      opts->watch_min_interval_ms > OM_CONTROL_MAX_WATCH_INTERVAL_MS)
    return OM_EINVAL;
  st = opts->store;
  c = calloc(1, sizeof *c);
  if (c == NULL)
    return OM_ENOMEM;
  om_list_init(&c->writes);
  c->loop = loop;
  c->store = st;
  c->ping_ms = opts->ping_interval_ms ? opts->ping_interval_ms
                                      : OM_CONTROL_DEFAULT_PING_MS;
  c->watch_min_interval_ms = opts->watch_min_interval_ms;
  c->max_backlog = opts->max_watch_backlog ? opts->max_watch_backlog
                                           : OM_CONTROL_DEFAULT_BACKLOG;
  c->retry_len = (size_t)snprintf(
      c->retry_block, sizeof c->retry_block, "retry: %" PRIu64 "\n\n",
      opts->retry_ms ? opts->retry_ms : (uint64_t)OM_CONTROL_DEFAULT_RETRY_MS);
  c->t_start = om__now_ns();
  c->warmup_ns = opts->warmup_ms * 1000000u;
  c->empty_ttl_ms = opts->empty_service_ttl_ms;
  rc = OM_ENOMEM;
  if ((opts->cors_origin != NULL &&
       (c->cors = om__dup_str(opts->cors_origin)) == NULL) ||
      (c->lib_dir = om__dup_str(
           opts->lib_dir != NULL ? opts->lib_dir : om_lib_dir())) == NULL ||
      metrics_init(c) != 0 || om_cfg_status_new(0, 0, &c->cfg_status) != 0)
    goto fail;
  rc = om_store_subscribe(st, NULL, om__on_service_event, c, &c->svc_sub);
  if (rc != 0)
    goto fail;
  rc = om_store_subscribe_config(st, NULL, om__on_config_event, c, &c->cfg_sub);
  if (rc != 0)
    goto fail_sub;
  http = opts->http;
  if (http.reserve_connections == 0) /* probes answer under a flood */
    http.reserve_connections = OM_CONTROL_HEALTH_RESERVE;
  if (http.reserve_paths == NULL)
    http.reserve_paths = health_paths;
  rc = om_http_server_new(loop, &http, on_request, c, &c->srv);
  if (rc != 0)
    goto fail_cfg;
  om_http_tls_metrics(opts->http.tls, c->metrics, "openmesh_control");
  uv_timer_init(loop, &c->ping); /* cannot fail */
  c->ping.data = c;
  uv_timer_start(&c->ping, om__on_ping, c->ping_ms, c->ping_ms);
  uv_timer_init(loop, &c->warm_timer); /* cannot fail */
  c->warm_timer.data = c;
  (void)om__warming(c); /* a store that starts empty: from now */
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
  if (auth != NULL)
    om__watchers_recheck(c);
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
  out->warming = c->warm_until != 0;
}

static void maybe_finish(om_control_t *c) {
  void (*done)(void *);
  void *ud;
  if (!c->closing || !c->srv_closed || !c->timer_closed ||
      !c->warm_timer_closed || c->pending_ops != 0)
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

static void on_warm_timer_closed(uv_handle_t *h) {
  om_control_t *c = h->data;
  c->warm_timer_closed = 1;
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
  uv_timer_stop(&c->warm_timer);
  uv_close((uv_handle_t *)&c->warm_timer, on_warm_timer_closed);
  /* end every stream cleanly: the client sees a complete response */
  while (c->n_topics > 0) {
    topic_t *t = c->topics[0];
    t->busy = 1;
    while (!om_list_empty(&t->watchers))
      om__watcher_finish(
          OM_LIST_ENTRY(om_list_first(&t->watchers), watcher_t, link), FIN_END);
    t->busy = 0;
    om__topic_release(c, t);
  }
  om_store_unsubscribe(c->store, c->svc_sub);
  om_store_unsubscribe(c->store, c->cfg_sub);
  c->svc_sub = c->cfg_sub = NULL;
  om_http_server_close(c->srv, on_srv_closed);
  return 0;
}
