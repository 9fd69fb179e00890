/*
 * om_proxy_workers.c: N proxy workers beside one control loop
 * (om_proxy_workers.h, docs/ARCHITECTURE.md "Workers").
 *
 * Each worker has a mailbox: a list under a mutex and a uv_async on the
 * worker's loop. The control loop posts snapshots (a reference each to
 * the revision's topology, built once here: om_proxy_view.c),
 * reloads, admin gathers and the close; the worker takes the whole list
 * at once on its loop. Answers come back through the group's own
 * uv_async on the control loop: a gather whose last worker has answered,
 * a worker whose thread has ended. A worker that has finished refuses
 * mail (under its mutex), and the sender handles the message itself, so
 * nothing posted is ever lost or leaked.
 *
 * Connections are kept level: every worker's server publishes its open
 * connections (open), and a worker that accepts a connection while
 * another has fewer (counting those handed to it and not yet taken,
 * pending) hands it over (M_ADOPT). The shared socket lets the loop that
 * is awake take the next connection, and the loop that is awake is the
 * one already running: left alone, a client opening its pool of 32 at
 * once gave one worker 30 and the other 3 in one try of eight, and that
 * worker's core capped the process. Only the accept crosses threads; a
 * connection's requests stay on the loop that took it.
 */
#include "om_proxy_workers.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include <jansson.h>

#include "om_errno.h"
#include "om_http_server.h"
#include "om_log.h"
#include "om_proxy_internal.h"

typedef enum { M_SNAPSHOT, M_RELOAD, M_GATHER, M_CLOSE, M_ADOPT } msg_kind_t;

typedef struct gather_s gather_t;

typedef struct msg_s {
  struct msg_s *next;
  msg_kind_t kind;
  om__proxy_topo_t *topo; /* M_SNAPSHOT: a reference of the message's */
  gather_t *gather;       /* M_GATHER */
  int fd;                 /* M_ADOPT: a connection another worker accepted */
} msg_t;

/* One admin request waiting for every worker's part. */
struct gather_s {
  gather_t *next; /* on the group's finished list */
  om_http_request_t *req;
  int metrics;      /* 1: /metrics, 0: /status */
  unsigned pending; /* workers yet to answer; under the group's mutex */
  char **live;      /* per worker: live metrics text (NULL: none) */
  size_t *live_len;
  json_t **status;    /* per worker: status (NULL: none) */
  uint64_t *accepted; /* per worker: connections accepted */
};

typedef struct worker_s {
  om_proxy_group_t *g;
  unsigned index;
  uv_loop_t loop;
  uv_async_t wake;
  uv_thread_t thread;
  uv_mutex_t mu;
  msg_t *head, *tail; /* under mu */
  int done;           /* under mu: the proxy has closed, mail refused */
  om_proxy_t *proxy;
  om_http_tls_t *tls;
  int loop_ok, mu_ok, wake_ok, started;
  _Atomic uint32_t open;    /* the server's open connections (its stores) */
  _Atomic uint32_t pending; /* handed to this worker, not yet taken */
} worker_t;

typedef enum { G_NEW, G_RUNNING, G_CLOSING, G_DONE } phase_t;

struct om_proxy_group_s {
  uv_loop_t *control;
  om_proxy_group_opts_t o;
  unsigned n;
  worker_t *w;
  om_metrics_t *metrics;
  om_proxy_circuits_t *circuits; /* the peers' circuits, shared */
  om_http_server_t *admin;
  uv_async_t back;
  uv_mutex_t mu;      /* finished, gather pending counts, workers_done */
  gather_t *finished; /* under mu */
  unsigned workers_done;
  phase_t phase;
  int listen_fd; /* the calls socket (the workers hold dups); -1 */
  int port;      /* its bound port */
  void (*on_closed)(void *ud);
  void *closed_ud;
  char status_key[32];
  om_proxy_status_fn status_fn;
  void *status_ud;
};

/* ------------------------------------------------------------------ */
/* mailboxes */

/* Post m to w; 0, or -1 when w has finished (m is the caller's again). */
static int post(worker_t *w, msg_t *m) {
  m->next = NULL;
  uv_mutex_lock(&w->mu);
  if (w->done) {
    uv_mutex_unlock(&w->mu);
    return -1;
  }
  if (w->tail != NULL)
    w->tail->next = m;
  else
    w->head = m;
  w->tail = m;
  uv_mutex_unlock(&w->mu);
  uv_async_send(&w->wake);
  return 0;
}

/* A worker's part of gather gt (NULLs: none); the last one queues gt for
 * the control loop. Any thread. */
static void gather_answer(om_proxy_group_t *g, gather_t *gt, unsigned i,
                          char *live, size_t len, json_t *status,
                          uint64_t accepted) {
  int last;
  gt->live[i] = live;
  gt->live_len[i] = len;
  gt->status[i] = status;
  gt->accepted[i] = accepted;
  uv_mutex_lock(&g->mu);
  last = --gt->pending == 0;
  if (last) {
    gt->next = g->finished;
    g->finished = gt;
  }
  uv_mutex_unlock(&g->mu);
  if (last)
    uv_async_send(&g->back);
}

/* What a finished worker (or one that refuses mail) does with a message. */
static void msg_drop(worker_t *w, msg_t *m) {
  if (m->kind == M_SNAPSHOT)
    om__proxy_topo_unref(m->topo);
  else if (m->kind == M_ADOPT) {
    atomic_fetch_sub_explicit(&w->pending, 1, memory_order_relaxed);
    close(m->fd); /* the process is shutting down: as a closing server */
  } else if (m->kind == M_GATHER)
    gather_answer(w->g, m->gather, w->index, NULL, 0, NULL, 0);
  free(m);
}

static int send_kind(worker_t *w, msg_kind_t kind, om__proxy_topo_t *topo,
                     gather_t *gt) {
  msg_t *m = calloc(1, sizeof *m);
  if (m == NULL)
    return OM_ENOMEM;
  m->kind = kind;
  m->topo = topo != NULL ? om__proxy_topo_ref(topo) : NULL;
  m->gather = gt;
  if (post(w, m) != 0)
    msg_drop(w, m);
  return 0;
}

/* A worker's load for leveling: its open connections and those on their
 * way to it. Any thread. */
static uint32_t worker_load(worker_t *w) {
  return atomic_load_explicit(&w->open, memory_order_relaxed) +
         atomic_load_explicit(&w->pending, memory_order_relaxed);
}

/* The server's on_accept, on the accepting worker's loop: hand fd to the
 * worker with the fewest connections when it has fewer than this one
 * (1: handed over; 0: this worker takes it). A race between two workers'
 * reads costs a connection one hop too many, never a loop: an adopted
 * connection is not offered again. */
static int level_accept(om_http_server_t *srv, int fd, void *ud) {
  worker_t *w = ud, *best = w;
  om_proxy_group_t *g = w->g;
  uint32_t mine = worker_load(w), least = mine;
  msg_t *m;
  (void)srv;
  for (unsigned i = 0; i < g->n; i++) {
    uint32_t load = worker_load(&g->w[i]);
    if (load < least) {
      least = load;
      best = &g->w[i];
    }
  }
  if (best == w || (m = calloc(1, sizeof *m)) == NULL)
    return 0;
  m->kind = M_ADOPT;
  m->fd = fd;
  atomic_fetch_add_explicit(&best->pending, 1, memory_order_relaxed);
  if (post(best, m) == 0)
    return 1;
  atomic_fetch_sub_explicit(&best->pending, 1, memory_order_relaxed);
  free(m);
  return 0;
}

/* ------------------------------------------------------------------ */
/* the worker side (its loop) */

static void on_wake_closed(uv_handle_t *h) {
  (void)h;
}

/* The worker's proxy has drained and closed: refuse mail, stop. */
static void on_worker_proxy_closed(void *ud) {
  worker_t *w = ud;
  msg_t *m;
  w->proxy = NULL;
  om_http_tls_close(w->tls);
  w->tls = NULL;
  uv_mutex_lock(&w->mu);
  w->done = 1;
  m = w->head;
  w->head = w->tail = NULL;
  uv_mutex_unlock(&w->mu);
  while (m != NULL) {
    msg_t *next = m->next;
    msg_drop(w, m);
    m = next;
  }
  uv_close((uv_handle_t *)&w->wake, on_wake_closed);
}

static void worker_snapshot(worker_t *w, om__proxy_topo_t *topo) {
  char err[512], rev[32], idx[16];
  om_snapshot_t *snap = topo->snap;
  int rc = om__proxy_set_topo(w->proxy, topo, err, sizeof err);
  /* every worker refuses a snapshot for the same reason: one line says
   * it, unless this worker alone failed (memory) */
  if (rc != 0 && (w->index == 0 || rc == OM_ENOMEM)) {
    snprintf(rev, sizeof rev, "%llu",
             (unsigned long long)om_snapshot_revision(snap));
    snprintf(idx, sizeof idx, "%u", w->index);
    om_log(OM_LOG_WARN, "snapshot_rejected", "service",
           om_snapshot_service(snap), "revision", rev, "worker", idx, "error",
           err, NULL);
  }
}

static void worker_reload(worker_t *w) {
  int failed;
  char n[16];
  if (w->tls != NULL)
    (void)om_http_tls_reload(w->tls, NULL, 0); /* logged and counted */
  failed = om_proxy_reload_policies(w->proxy);
  if (w->index == 0) {
    snprintf(n, sizeof n, "%d", failed);
    om_log(OM_LOG_INFO, "proxy_policies_reloaded", "rejected", n, NULL);
  }
  failed = om_proxy_reload_tls(w->proxy);
  if (w->index == 0) {
    snprintf(n, sizeof n, "%d", failed);
    om_log(OM_LOG_INFO, "proxy_tls_reloaded", "rejected", n, NULL);
  }
}

static void worker_gather(worker_t *w, gather_t *gt) {
  const om_http_server_metrics_t *sm = om_http_server_metrics(w->proxy->server);
  uint64_t accepted = sm != NULL ? sm->connections_accepted : 0;
  char *live = NULL;
  size_t len = 0;
  json_t *status = NULL;
  if (gt->metrics)
    live = om_proxy_live_metrics(w->proxy, &len);
  else
    status = om_proxy_status_json(w->proxy);
  gather_answer(w->g, gt, w->index, live, len, status, accepted);
}

static void on_wake(uv_async_t *h) {
  worker_t *w = h->data;
  msg_t *m;
  uv_mutex_lock(&w->mu);
  m = w->head;
  w->head = w->tail = NULL;
  uv_mutex_unlock(&w->mu);
  while (m != NULL) {
    msg_t *next = m->next;
    if (w->proxy == NULL) {
      msg_drop(w, m);
      m = next;
      continue;
    }
    switch (m->kind) {
    case M_SNAPSHOT:
      worker_snapshot(w, m->topo);
      om__proxy_topo_unref(m->topo);
      break;
    case M_RELOAD:
      worker_reload(w);
      break;
    case M_GATHER:
      worker_gather(w, m->gather);
      break;
    case M_CLOSE:
      (void)om_proxy_close(w->proxy, on_worker_proxy_closed, w);
      break;
    case M_ADOPT:
      atomic_fetch_sub_explicit(&w->pending, 1, memory_order_relaxed);
      om_http_server_adopt(w->proxy->server, m->fd);
      break;
    }
    free(m);
    m = next;
  }
}

static void worker_main(void *arg) {
  worker_t *w = arg;
  om_proxy_group_t *g = w->g;
  uv_run(&w->loop, UV_RUN_DEFAULT);
  uv_mutex_lock(&g->mu);
  g->workers_done++;
  uv_mutex_unlock(&g->mu);
  uv_async_send(&g->back);
}

/* ------------------------------------------------------------------ */
/* merging the workers' parts (control loop) */

typedef struct {
  char *buf;
  size_t len, cap;
  int oom;
} sbuf_t;

static void sb_put(sbuf_t *b, const char *s, size_t n) {
  if (b->oom)
    return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    char *x;
    while (cap < b->len + n + 1)
      cap *= 2;
    if ((x = realloc(b->buf, cap)) == NULL) {
      b->oom = 1;
      return;
    }
    b->buf = x;
    b->cap = cap;
  }
  memcpy(b->buf + b->len, s, n);
  b->len += n;
  b->buf[b->len] = '\0';
}

static void sb_str(sbuf_t *b, const char *s) {
  sb_put(b, s, strlen(s));
}

/*
 * How one live series combines over the workers: summed when it counts
 * what each worker holds or did (in flight, queued, the pool limit,
 * counters), else the largest (revisions, versions, circuit states,
 * latency estimates: the same everywhere or the worst one). Policy reload
 * failures are counted by every worker for the same file: the largest.
 */
static int summed(const char *name, size_t n) {
  static const char *const sum[] = {
      "openmesh_proxy_queue_depth", "openmesh_proxy_inflight",
      "openmesh_proxy_admission_limit", "openmesh_proxy_peer_inflight"};
  if (n == strlen("openmesh_proxy_policy_reload_failures_total") &&
      memcmp(name, "openmesh_proxy_policy_reload_failures_total", n) == 0)
    return 0;
  if (n > 6 && memcmp(name + n - 6, "_total", 6) == 0)
    return 1;
  for (size_t i = 0; i < sizeof sum / sizeof sum[0]; i++)
    if (strlen(sum[i]) == n && memcmp(sum[i], name, n) == 0)
      return 1;
  return 0;
}

/* Line starting at s (to the newline or end), its length with it. */
static size_t line_len(const char *s, const char *end) {
  const char *nl = memchr(s, '\n', (size_t)(end - s));
  return nl != NULL ? (size_t)(nl - s) + 1 : (size_t)(end - s);
}

/* The sample key (series name and labels) of a sample line: its length
 * up to the last space; 0 for a comment or a line without a value. */
static size_t key_len(const char *s, size_t n) {
  if (n == 0 || s[0] == '#')
    return 0;
  for (size_t i = n; i-- > 0;)
    if (s[i] == ' ')
      return i;
  return 0;
}

/* Worker w's value for the sample key k (its cursor *at first: the
 * workers render the same series in the same order); 0 when absent. */
static double value_of(const char *text, size_t len, size_t *at, const char *k,
                       size_t kn, int *found) {
  const char *end = text + len;
  for (int pass = 0; pass < 2; pass++) {
    const char *s = text + (pass == 0 ? *at : 0);
    while (s < end) {
      size_t n = line_len(s, end), kl = key_len(s, n);
      if (kl == kn && memcmp(s, k, kn) == 0) {
        *at = (size_t)(s - text) + n;
        *found = 1;
        return strtod(s + kl + 1, NULL);
      }
      s += n;
      if (pass == 0 && kl != kn)
        break; /* out of step: search from the top */
    }
  }
  *found = 0;
  return 0;
}

static void merge_live(const gather_t *gt, unsigned n, sbuf_t *b) {
  size_t at[OM_PROXY_MAX_WORKERS] = {0};
  const char *t0 = gt->live[0], *end;
  if (t0 == NULL)
    return;
  end = t0 + gt->live_len[0];
  for (const char *s = t0; s < end;) {
    size_t len = line_len(s, end), kl = key_len(s, len), nl;
    double v;
    char num[40];
    if (kl == 0) {
      sb_put(b, s, len);
      s += len;
      continue;
    }
    v = strtod(s + kl + 1, NULL);
    nl = strcspn(s, "{ ");
    for (unsigned i = 1; i < n; i++) {
      int found;
      double x;
      if (gt->live[i] == NULL)
        continue;
      x = value_of(gt->live[i], gt->live_len[i], &at[i], s, kl, &found);
      if (!found)
        continue;
      v = summed(s, nl) ? v + x : (x > v ? x : v);
    }
    sb_put(b, s, kl);
    snprintf(num, sizeof num, " %.17g\n", v);
    sb_str(b, num);
    s += len;
  }
}

/* Status members that count what each worker holds or did: summed. */
static int summed_key(const char *k) {
  static const char *const sum[] = {"requests",
                                    "attempts",
                                    "retries",
                                    "pre_send",
                                    "post_send",
                                    "retry_budget_exhausted",
                                    "paused",
                                    "denied",
                                    "inflight",
                                    "queued",
                                    "limit",
                                    "failures",
                                    "local_errors",
                                    "held_bytes",
                                    "refused",
                                    "connections_accepted",
                                    "hits",
                                    "misses",
                                    "handshakes",
                                    "resumed",
                                    "switched",
                                    "declined",
                                    "not_allowed",
                                    "failed",
                                    "tunnels_active",
                                    "max_idle_per_peer",
                                    "idle",
                                    "connections_new",
                                    "connections_reused"};
  for (size_t i = 0; i < sizeof sum / sizeof sum[0]; i++)
    if (strcmp(sum[i], k) == 0)
      return 1;
  return 0;
}

static void merge_json(json_t *into, json_t *from, const char *parent);

/* Arrays of objects (peers) are matched by "id", else by position. */
static void merge_array(json_t *into, json_t *from) {
  size_t i;
  json_t *x;
  json_array_foreach(into, i, x) {
    json_t *id = json_object_get(x, "id"), *y = NULL;
    if (json_is_string(id)) {
      size_t j;
      json_t *c;
      json_array_foreach(from, j, c) {
        json_t *cid = json_object_get(c, "id");
        if (json_is_string(cid) &&
            strcmp(json_string_value(cid), json_string_value(id)) == 0) {
          y = c;
          break;
        }
      }
    } else {
      y = json_array_get(from, i);
    }
    if (json_is_object(x) && json_is_object(y))
      merge_json(x, y, NULL);
  }
}

/* parent: the member into is the value of ("handshakes": each worker's
 * listener TLS counts its own). */
static void merge_json(json_t *into, json_t *from, const char *parent) {
  const char *k;
  json_t *x;
  json_object_foreach(into, k, x) {
    json_t *y = json_object_get(from, k);
    if (y == NULL)
      continue;
    if (json_is_object(x) && json_is_object(y))
      merge_json(x, y, k);
    else if (json_is_array(x) && json_is_array(y))
      merge_array(x, y);
    else if (json_is_integer(x) && json_is_integer(y) &&
             (summed_key(k) ||
              (parent != NULL && strcmp(parent, "handshakes") == 0)))
      json_integer_set(x, json_integer_value(x) + json_integer_value(y));
  }
  /* what only another worker saw (a peer's TLS error in peer_errors, a
   * key of a map): the union, not the first worker's alone */
  json_object_foreach(from, k, x) {
    if (json_object_get(into, k) == NULL)
      json_object_set_new(into, k, json_deep_copy(x));
  }
}

static const om_http_header_t TEXT[] = {
    {"content-type", "text/plain; version=0.0.4; charset=utf-8", 12, 0}};
static const om_http_header_t JSON[] = {
    {"content-type", "application/json", 12, 16}};

static void respond_oom(om_http_request_t *req) {
  om_http_respond(req, 500, JSON, 1, "{\"reason\":\"out_of_memory\"}\n", 27);
}

static void respond_metrics(om_proxy_group_t *g, gather_t *gt) {
  sbuf_t b = {0};
  size_t len = 0;
  char *reg = om_metrics_render(g->metrics, &len), line[512];
  if (reg == NULL) {
    respond_oom(gt->req);
    return;
  }
  sb_put(&b, reg, len);
  free(reg);
  merge_live(gt, g->n, &b);
  snprintf(line, sizeof line,
           "# HELP openmesh_proxy_workers Worker threads serving calls, "
           "each its own event loop.\n"
           "# TYPE openmesh_proxy_workers gauge\n"
           "openmesh_proxy_workers %u\n"
           "# HELP openmesh_proxy_worker_connections_accepted_total "
           "Connections each worker accepted.\n"
           "# TYPE openmesh_proxy_worker_connections_accepted_total "
           "counter\n",
           g->n);
  sb_str(&b, line);
  for (unsigned i = 0; i < g->n; i++) {
    snprintf(line, sizeof line,
             "openmesh_proxy_worker_connections_accepted_total{worker=\"%u\"}"
             " %llu\n",
             i, (unsigned long long)gt->accepted[i]);
    sb_str(&b, line);
  }
  if (b.oom)
    respond_oom(gt->req);
  else
    om_http_respond(gt->req, 200, TEXT, 1, b.buf, b.len);
  free(b.buf);
}

static void respond_status(om_proxy_group_t *g, gather_t *gt) {
  json_t *root = NULL, *per = json_array();
  char *text = NULL;
  for (unsigned i = 0; i < g->n; i++) {
    if (gt->status[i] == NULL)
      continue;
    if (root == NULL)
      root = json_incref(gt->status[i]);
    else
      merge_json(root, gt->status[i], NULL);
  }
  if (root == NULL)
    root = json_object();
  for (unsigned i = 0; per != NULL && i < g->n; i++)
    json_array_append_new(per, json_integer((json_int_t)gt->accepted[i]));
  if (root != NULL && per != NULL &&
      json_object_set_new(root, "workers", json_integer((json_int_t)g->n)) ==
          0 &&
      json_object_set_new(root, "worker_connections_accepted", per) == 0) {
    per = NULL;
    json_object_set_new(root, "draining", json_boolean(g->phase >= G_CLOSING));
    if (g->status_fn != NULL) {
      json_t *extra = g->status_fn(g->status_ud);
      if (extra != NULL)
        json_object_set_new(root, g->status_key, extra);
    }
    text = json_dumps(root, JSON_COMPACT);
  }
  json_decref(per);
  json_decref(root);
  if (text == NULL) {
    respond_oom(gt->req);
    return;
  }
  om_http_respond(gt->req, 200, JSON, 1, text, strlen(text));
  free(text);
}

static void gather_free(om_proxy_group_t *g, gather_t *gt) {
  for (unsigned i = 0; i < g->n; i++) {
    free(gt->live[i]);
    json_decref(gt->status[i]);
  }
  free(gt);
}

static gather_t *gather_new(unsigned n) {
  gather_t *gt;
  size_t size = sizeof *gt + n * (sizeof(char *) + sizeof(size_t) +
                                  sizeof(json_t *) + sizeof(uint64_t));
  if ((gt = calloc(1, size)) == NULL)
    return NULL;
  gt->live = (char **)(gt + 1);
  gt->live_len = (size_t *)(gt->live + n);
  gt->status = (json_t **)(gt->live_len + n);
  gt->accepted = (uint64_t *)(gt->status + n);
  gt->pending = n;
  return gt;
}

/* ------------------------------------------------------------------ */
/* the admin listener (control loop) */

static void on_admin(om_http_request_t *req, void *ud) {
  om_proxy_group_t *g = ud;
  int get = (req->method_len == 3 && memcmp(req->method, "GET", 3) == 0) ||
            (req->method_len == 4 && memcmp(req->method, "HEAD", 4) == 0);
  int is_metrics = req->path_len == 8 && memcmp(req->path, "/metrics", 8) == 0;
  int is_status = req->path_len == 7 && memcmp(req->path, "/status", 7) == 0;
  int is_health = req->path_len == 8 && memcmp(req->path, "/healthz", 8) == 0;
  if ((is_metrics || is_status) && get) {
    gather_t *gt = gather_new(g->n);
    if (gt == NULL) {
      respond_oom(req);
      return;
    }
    gt->req = req;
    gt->metrics = is_metrics;
    for (unsigned i = 0; i < g->n; i++)
      if (send_kind(&g->w[i], M_GATHER, NULL, gt) != 0)
        gather_answer(g, gt, i, NULL, 0, NULL, 0);
  } else if (is_health && get) {
    if (g->phase >= G_CLOSING)
      om_http_respond(req, 503, JSON, 1, "{\"status\":\"draining\"}\n", 22);
    else
      om_http_respond(req, 200, JSON, 1, "{\"status\":\"ok\"}\n", 16);
  } else if (is_metrics || is_status || is_health) {
    static const om_http_header_t allow[] = {
        {"content-type", "application/json", 12, 16},
        {"allow", "GET, HEAD", 5, 9}};
    om_http_respond(req, 405, allow, 2, "{\"reason\":\"method_not_allowed\"}\n",
                    32);
  } else {
    om_http_respond(req, 404, JSON, 1, "{\"reason\":\"not_found\"}\n", 23);
  }
}

/* ------------------------------------------------------------------ */
/* lifecycle */

static void group_free(om_proxy_group_t *g) {
  for (unsigned i = 0; i < g->n; i++) {
    worker_t *w = &g->w[i];
    if (w->loop_ok)
      uv_loop_close(&w->loop);
    if (w->mu_ok)
      uv_mutex_destroy(&w->mu);
  }
  free(g->w);
  om_proxy_circuits_free(g->circuits);
  om_metrics_free(g->metrics);
  uv_mutex_destroy(&g->mu);
  free(g);
}

static void on_back_closed(uv_handle_t *h) {
  om_proxy_group_t *g = h->data;
  void (*cb)(void *) = g->on_closed;
  void *ud = g->closed_ud;
  group_free(g);
  if (cb != NULL)
    cb(ud);
}

static void on_admin_closed(om_http_server_t *srv, void *ud) {
  om_proxy_group_t *g = ud;
  (void)srv;
  g->admin = NULL;
  for (unsigned i = 0; i < g->n; i++)
    if (g->w[i].started)
      uv_thread_join(&g->w[i].thread);
  uv_close((uv_handle_t *)&g->back, on_back_closed);
}

/* Every worker has ended: the admin listener last (it said "draining"). */
static void all_workers_done(om_proxy_group_t *g) {
  g->phase = G_DONE;
  if (g->admin != NULL)
    om_http_server_close(g->admin, on_admin_closed);
  else
    on_admin_closed(NULL, g);
}

static void on_back(uv_async_t *h) {
  om_proxy_group_t *g = h->data;
  gather_t *gt;
  unsigned done;
  uv_mutex_lock(&g->mu);
  gt = g->finished;
  g->finished = NULL;
  done = g->workers_done;
  uv_mutex_unlock(&g->mu);
  while (gt != NULL) {
    gather_t *next = gt->next;
    if (gt->metrics)
      respond_metrics(g, gt);
    else
      respond_status(g, gt);
    gather_free(g, gt);
    gt = next;
  }
  if (g->phase == G_CLOSING && done == g->n)
    all_workers_done(g);
}

/* Run a worker's loop here until its proxy has closed (never started). */
static void close_unstarted(worker_t *w) {
  if (w->proxy != NULL) {
    (void)om_proxy_close(w->proxy, on_worker_proxy_closed, w);
  } else {
    om_http_tls_close(w->tls);
    w->tls = NULL;
    if (w->wake_ok)
      uv_close((uv_handle_t *)&w->wake, on_wake_closed);
  }
  if (w->loop_ok)
    uv_run(&w->loop, UV_RUN_DEFAULT);
}

int om_proxy_group_new(uv_loop_t *control, const om_proxy_group_opts_t *opts,
                       om_proxy_group_t **out, char *err, size_t errlen) {
  om_proxy_group_t *g;
  om_http_server_opts_t ao;
  int rc = 0;
  if (control == NULL || opts == NULL || out == NULL) {
    om_errbuf(err, errlen, "invalid arguments");
    return OM_EINVAL;
  }
  if (opts->workers < 1 || opts->workers > OM_PROXY_MAX_WORKERS) {
    om_errbuf(err, errlen, "workers: %u is not in [1, %d]", opts->workers,
              OM_PROXY_MAX_WORKERS);
    return OM_EINVAL;
  }
  g = calloc(1, sizeof *g);
  if (g == NULL || uv_mutex_init(&g->mu) != 0) {
    free(g);
    om_errbuf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  g->control = control;
  g->o = *opts;
  g->n = opts->workers;
  g->listen_fd = -1;
  g->w = calloc(g->n, sizeof *g->w);
  g->metrics = om_metrics_new();
  g->circuits = om_proxy_circuits_new();
  if (g->w == NULL || g->metrics == NULL || g->circuits == NULL) {
    g->n = 0;
    group_free(g);
    om_errbuf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  for (unsigned i = 0; i < g->n && rc == 0; i++) {
    worker_t *w = &g->w[i];
    om_proxy_opts_t po = opts->proxy;
    w->g = g;
    w->index = i;
    if (uv_mutex_init(&w->mu) != 0) {
      om_errbuf(err, errlen, "out of memory");
      rc = OM_ENOMEM;
      break;
    }
    w->mu_ok = 1;
    if (uv_loop_init(&w->loop) != 0) {
      om_errbuf(err, errlen, "out of memory");
      rc = OM_ENOMEM;
      break;
    }
    w->loop_ok = 1;
    if (uv_async_init(&w->loop, &w->wake, on_wake) != 0) {
      om_errbuf(err, errlen, "out of memory");
      rc = OM_ENOMEM;
      break;
    }
    w->wake.data = w;
    w->wake_ok = 1;
    if (opts->tls_new != NULL &&
        opts->tls_new(opts->tls_ud, &w->loop, &w->tls) != 0) {
      om_errbuf(err, errlen, "the listener TLS did not load");
      rc = OM_EINVAL;
      break;
    }
    po.server.tls = w->tls;
    if (g->n > 1) {
      po.server.open_count = &w->open;
      po.server.on_accept = level_accept;
      po.server.on_accept_ud = w;
    }
    po.metrics = g->metrics;
    po.circuits = g->circuits;
    po.worker = i;
    po.workers = g->n;
    if (po.seed != 0) /* distinct draws per worker, still reproducible */
      po.seed += i;
    rc = om_proxy_new(&w->loop, &po, &w->proxy, err, errlen);
    if (rc != 0)
      w->proxy = NULL;
  }
  ao = opts->proxy.server;
  ao.tls = NULL; /* the admin listener stays plain */
  ao.stream_bodies = 0;
  if (rc == 0 &&
      (rc = om_http_server_new(control, &ao, on_admin, g, &g->admin)) != 0)
    om_errbuf(err, errlen, "invalid server options");
  if (rc == 0 && uv_async_init(control, &g->back, on_back) != 0) {
    om_errbuf(err, errlen, "out of memory");
    rc = OM_ENOMEM;
  }
  if (rc != 0) {
    for (unsigned i = 0; i < g->n; i++)
      close_unstarted(&g->w[i]);
    if (g->admin != NULL) {
      /* its close completes on the control loop: the group waits there */
      g->back.data = g;
      g->phase = G_DONE;
      g->on_closed = NULL;
      om_http_server_close(g->admin, NULL);
      g->admin = NULL;
    }
    group_free(g);
    return rc;
  }
  g->back.data = g;
  *out = g;
  return 0;
}

int om_proxy_group_check_snapshot(const om_proxy_group_t *g,
                                  const om_snapshot_t *snap, char *err,
                                  size_t errlen) {
  if (g == NULL || g->n == 0)
    return OM_EINVAL;
  /* reads no state of the worker's: safe from this thread */
  return om_proxy_check_snapshot(g->w[0].proxy, snap, err, errlen);
}

int om_proxy_group_set_snapshot(om_proxy_group_t *g, om_snapshot_t *snap,
                                char *err, size_t errlen) {
  om__proxy_topo_t *topo;
  int rc;
  if (g == NULL || snap == NULL) {
    om_errbuf(err, errlen, "invalid arguments");
    return OM_EINVAL;
  }
  if (g->phase == G_NEW) {
    if ((rc = om__proxy_topo_new(g->w[0].proxy, snap, &topo, err, errlen)) != 0)
      return rc;
    for (unsigned i = 0; i < g->n && rc == 0; i++)
      rc = om__proxy_set_topo(g->w[i].proxy, topo, err, errlen);
    om__proxy_topo_unref(topo);
    return rc;
  }
  if (g->phase != G_RUNNING)
    return OM_ESTATE;
  /* checked, hashed and laid out for the policy here, once, off the
   * workers' loops: each worker builds only its own part */
  if ((rc = om__proxy_topo_new(g->w[0].proxy, snap, &topo, err, errlen)) != 0)
    return rc;
  for (unsigned i = 0; i < g->n && rc == 0; i++)
    if (send_kind(&g->w[i], M_SNAPSHOT, topo, NULL) != 0) {
      om_errbuf(err, errlen, "out of memory");
      rc = OM_ENOMEM;
    }
  om__proxy_topo_unref(topo);
  return rc;
}

int om_proxy_group_listen(om_proxy_group_t *g, const char *host, int port,
                          char *err, size_t errlen) {
  int rc, fd;
  if (g == NULL || host == NULL) {
    om_errbuf(err, errlen, "invalid arguments");
    return OM_EINVAL;
  }
  if (g->phase != G_NEW || g->listen_fd >= 0) {
    om_errbuf(err, errlen, "already listening or started");
    return OM_ESTATE;
  }
  if ((rc = om_http_listen_socket(host, port, &fd, err, errlen)) != 0)
    return rc;
  for (unsigned i = 0; i < g->n; i++) {
    int d = dup(fd);
    const char *why;
    if (d < 0) {
      om_errbuf(err, errlen, "cannot share the socket: out of descriptors");
      close(fd);
      return OM_EIO;
    }
    if ((rc = om_proxy_listen_fd(g->w[i].proxy, d)) != 0) {
      why = om_http_server_listen_error(g->w[i].proxy->server);
      om_errbuf(err, errlen, "%s", why != NULL ? why : om_strerror(rc));
      close(fd);
      return rc;
    }
  }
  {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) == 0)
      g->port = ntohs(ss.ss_family == AF_INET6
                          ? ((struct sockaddr_in6 *)&ss)->sin6_port
                          : ((struct sockaddr_in *)&ss)->sin_port);
  }
  g->listen_fd = fd; /* closed with the group */
  return 0;
}

int om_proxy_group_listen_admin(om_proxy_group_t *g, const char *host, int port,
                                char *err, size_t errlen) {
  int rc;
  const char *why;
  if (g == NULL || host == NULL || g->admin == NULL) {
    om_errbuf(err, errlen, "invalid arguments");
    return OM_EINVAL;
  }
  rc = om_http_server_listen(g->admin, host, port);
  if (rc != 0) {
    why = om_http_server_listen_error(g->admin);
    om_errbuf(err, errlen, "%s", why != NULL ? why : om_strerror(rc));
  }
  return rc;
}

int om_proxy_group_port(const om_proxy_group_t *g) {
  return g == NULL || g->listen_fd < 0 ? OM_ESTATE : g->port;
}

int om_proxy_group_admin_port(const om_proxy_group_t *g) {
  return g == NULL || g->admin == NULL ? OM_ESTATE
                                       : om_http_server_port(g->admin);
}

om_metrics_t *om_proxy_group_metrics(om_proxy_group_t *g) {
  return g != NULL ? g->metrics : NULL;
}

int om_proxy_group_set_status_extra(om_proxy_group_t *g, const char *key,
                                    om_proxy_status_fn fn, void *ud) {
  if (g == NULL || key == NULL || strlen(key) >= sizeof g->status_key)
    return OM_EINVAL;
  snprintf(g->status_key, sizeof g->status_key, "%s", key);
  g->status_fn = fn;
  g->status_ud = ud;
  return 0;
}

int om_proxy_group_start(om_proxy_group_t *g) {
  if (g == NULL)
    return OM_EINVAL;
  if (g->phase != G_NEW)
    return OM_ESTATE;
  g->phase = G_RUNNING;
  for (unsigned i = 0; i < g->n; i++) {
    worker_t *w = &g->w[i];
    if (uv_thread_create(&w->thread, worker_main, w) != 0) {
      /* the ones not started are closed here, as if they had ended */
      for (unsigned k = i; k < g->n; k++) {
        close_unstarted(&g->w[k]);
        uv_mutex_lock(&g->mu);
        g->workers_done++;
        uv_mutex_unlock(&g->mu);
      }
      return OM_ENOMEM;
    }
    w->started = 1;
  }
  return 0;
}

void om_proxy_group_reload(om_proxy_group_t *g) {
  if (g == NULL || g->phase != G_RUNNING)
    return;
  for (unsigned i = 0; i < g->n; i++)
    if (send_kind(&g->w[i], M_RELOAD, NULL, NULL) != 0)
      om_log(OM_LOG_ERROR, "proxy_reload_failed", "error", "out of memory",
             NULL);
}

int om_proxy_group_close(om_proxy_group_t *g, void (*on_closed)(void *ud),
                         void *ud) {
  if (g == NULL)
    return OM_EINVAL;
  if (g->phase >= G_CLOSING)
    return OM_ESTATE;
  g->on_closed = on_closed;
  g->closed_ud = ud;
  if (g->listen_fd >= 0) {
    close(g->listen_fd); /* the workers' dups keep accepting until closed */
    g->listen_fd = -1;
  }
  if (g->phase == G_NEW) {
    g->phase = G_CLOSING;
    for (unsigned i = 0; i < g->n; i++)
      close_unstarted(&g->w[i]);
    g->workers_done = g->n;
    all_workers_done(g);
    return 0;
  }
  g->phase = G_CLOSING;
  for (unsigned i = 0; i < g->n; i++)
    if (g->w[i].started && send_kind(&g->w[i], M_CLOSE, NULL, NULL) != 0) {
      /* no memory for the message: close from here is not possible (the
       * proxy is the worker's); retry on the next readiness of back */
      om_log(OM_LOG_ERROR, "proxy_close_failed", "error", "out of memory",
             NULL);
    }
  uv_async_send(&g->back); /* workers that failed to start count already */
  return 0;
}
