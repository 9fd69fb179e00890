/*
 * om_proxy_access_log.c: the access log's buffers, writer thread and line
 * format (om_proxy_access_log.h), and the call path's two hooks.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#include <uv.h>

#include "om_appendfile.h"
#include "om_errno.h"
#include "om_proxy_access_log.h"
#include "om_proxy_internal.h"

#define FOLLOW_EVERY_MS 1000

struct om_access_log_producer_s {
  uv_mutex_t mu;
  char *buf[2];
  size_t len[2];
  int active; /* the buffer taking lines */
  size_t lines[2];
  om_access_log_t *log;
  struct om_access_log_producer_s *next;
};

struct om_access_log_s {
  char *path;
  om_appendfile_t file;
  uv_thread_t thread;
  uv_mutex_t mu; /* producers list, stop, cond */
  uv_cond_t cond;
  int stop;
  atomic_int reopen;
  om_access_log_producer_t *producers;
  atomic_uint_fast64_t written, dropped;
  om_metric_t *m_written, *m_dropped;
};

/* ------------------------------------------------------------------ */
/* the writer */

/* Swap every producer's buffers and write the full ones out. */
static void flush_all(om_access_log_t *l) {
  om_access_log_producer_t *pr;
  uv_mutex_lock(&l->mu);
  pr = l->producers;
  uv_mutex_unlock(&l->mu);
  /* producers are only ever added at the head: the list from pr on is
   * stable without the lock */
  for (; pr != NULL; pr = pr->next) {
    int full;
    size_t len, lines;
    uv_mutex_lock(&pr->mu);
    full = pr->active;
    pr->active = !full;
    uv_mutex_unlock(&pr->mu);
    len = pr->len[full];
    lines = pr->lines[full];
    if (len == 0)
      continue;
    if (om_appendfile_write(&l->file, pr->buf[full], len) == 0) {
      atomic_fetch_add(&l->written, lines);
      om_metric_add(l->m_written, (double)lines);
    } else {
      atomic_fetch_add(&l->dropped, lines);
      om_metric_add(l->m_dropped, (double)lines);
    }
    pr->len[full] = 0;
    pr->lines[full] = 0;
  }
}

static void writer_main(void *arg) {
  om_access_log_t *l = arg;
  uint64_t last_follow = uv_hrtime();
  for (;;) {
    int stop;
    uint64_t now;
    uv_mutex_lock(&l->mu);
    if (!l->stop && !atomic_load(&l->reopen))
      (void)uv_cond_timedwait(&l->cond, &l->mu,
                              (uint64_t)OM_ACCESS_LOG_FLUSH_MS * 1000000);
    stop = l->stop;
    uv_mutex_unlock(&l->mu);
    now = uv_hrtime();
    if (atomic_exchange(&l->reopen, 0)) {
      om_appendfile_t f;
      if (om_appendfile_open(&f, l->path) == 0) {
        om_appendfile_close(&l->file);
        l->file = f;
      }
      last_follow = now;
    } else if (now - last_follow >= (uint64_t)FOLLOW_EVERY_MS * 1000000) {
      (void)om_appendfile_follow(&l->file, l->path);
      last_follow = now;
    }
    /* twice: the buffer that was taking lines, then the one the workers
     * were filling while the first was written */
    flush_all(l);
    if (stop) {
      flush_all(l);
      return;
    }
  }
}

int om_access_log_open(const char *path, om_access_log_t **out, char *err,
                       size_t errlen) {
  om_access_log_t *l = calloc(1, sizeof *l);
  int rc;
  if (l == NULL || (l->path = strdup(path)) == NULL) {
    free(l);
    om_errbuf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  rc = om_appendfile_open(&l->file, path);
  if (rc != 0) {
    om_errbuf(err, errlen, "--access-log %s: %s", path, strerror(-rc));
    free(l->path);
    free(l);
    return rc;
  }
  atomic_init(&l->reopen, 0);
  atomic_init(&l->written, 0);
  atomic_init(&l->dropped, 0);
  uv_mutex_init(&l->mu);
  uv_cond_init(&l->cond);
  if (uv_thread_create(&l->thread, writer_main, l) != 0) {
    uv_cond_destroy(&l->cond);
    uv_mutex_destroy(&l->mu);
    om_appendfile_close(&l->file);
    free(l->path);
    free(l);
    om_errbuf(err, errlen, "cannot start the access log writer");
    return OM_ENOMEM;
  }
  *out = l;
  return 0;
}

void om_access_log_set_metrics(om_access_log_t *l, om_metrics_t *metrics) {
  const char *help = "Access log lines, written or dropped (buffer full "
                     "or the file failed).";
  if (l == NULL || metrics == NULL)
    return;
  l->m_written =
      om_metrics_counter(metrics, "openmesh_proxy_access_log_lines_total", help,
                         "result=\"written\"");
  l->m_dropped =
      om_metrics_counter(metrics, "openmesh_proxy_access_log_lines_total", help,
                         "result=\"dropped\"");
}

void om_access_log_reopen(om_access_log_t *l) {
  if (l == NULL)
    return;
  atomic_store(&l->reopen, 1);
  uv_mutex_lock(&l->mu);
  uv_cond_signal(&l->cond);
  uv_mutex_unlock(&l->mu);
}

void om_access_log_close(om_access_log_t *l) {
  om_access_log_producer_t *pr, *next;
  if (l == NULL)
    return;
  uv_mutex_lock(&l->mu);
  l->stop = 1;
  uv_cond_signal(&l->cond);
  uv_mutex_unlock(&l->mu);
  uv_thread_join(&l->thread);
  for (pr = l->producers; pr != NULL; pr = next) {
    next = pr->next;
    uv_mutex_destroy(&pr->mu);
    free(pr->buf[0]);
    free(pr->buf[1]);
    free(pr);
  }
  uv_cond_destroy(&l->cond);
  uv_mutex_destroy(&l->mu);
  om_appendfile_close(&l->file);
  free(l->path);
  free(l);
}

om_access_log_producer_t *om_access_log_producer(om_access_log_t *l) {
  om_access_log_producer_t *pr = calloc(1, sizeof *pr);
  if (pr == NULL)
    return NULL;
  pr->buf[0] = malloc(OM_ACCESS_LOG_BUF);
  pr->buf[1] = malloc(OM_ACCESS_LOG_BUF);
  if (pr->buf[0] == NULL || pr->buf[1] == NULL) {
    free(pr->buf[0]);
    free(pr->buf[1]);
    free(pr);
    return NULL;
  }
  uv_mutex_init(&pr->mu);
  pr->log = l;
  uv_mutex_lock(&l->mu);
  pr->next = l->producers;
  l->producers = pr;
  uv_mutex_unlock(&l->mu);
  return pr;
}

int om_access_log_append(om_access_log_producer_t *pr, const char *line,
                         size_t len) {
  int a, ok;
  uv_mutex_lock(&pr->mu);
  a = pr->active;
  ok = pr->len[a] + len <= OM_ACCESS_LOG_BUF;
  if (ok) {
    memcpy(pr->buf[a] + pr->len[a], line, len);
    pr->len[a] += len;
    pr->lines[a]++;
  }
  uv_mutex_unlock(&pr->mu);
  if (!ok) {
    atomic_fetch_add(&pr->log->dropped, 1);
    om_metric_inc(pr->log->m_dropped);
    return -1;
  }
  return 0;
}

uint64_t om_access_log_written(const om_access_log_t *l) {
  return atomic_load(&((om_access_log_t *)l)->written);
}

uint64_t om_access_log_dropped(const om_access_log_t *l) {
  return atomic_load(&((om_access_log_t *)l)->dropped);
}

/* ------------------------------------------------------------------ */
/* the line */

/* The length of the UTF-8 sequence at s (at most n bytes), 0 when it is
 * not one (overlong, surrogate, past U+10FFFF, cut short). */
static size_t utf8_len(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  size_t k;
  uint32_t cp;
  if (c < 0x80)
    return 1;
  if (c >= 0xc2 && c <= 0xdf)
    k = 2, cp = c & 0x1f;
  else if (c >= 0xe0 && c <= 0xef)
    k = 3, cp = c & 0x0f;
  else if (c >= 0xf0 && c <= 0xf4)
    k = 4, cp = c & 0x07;
  else
    return 0;
  if (n < k)
    return 0;
  for (size_t i = 1; i < k; i++) {
    if ((s[i] & 0xc0) != 0x80)
      return 0;
    cp = cp << 6 | (s[i] & 0x3f);
  }
  if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
      (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return k;
}

size_t om_access_log_escape(char *out, size_t cap, const char *s, size_t len,
                            int *cut) {
  static const char hex[] = "0123456789abcdef";
  const unsigned char *u = (const unsigned char *)s;
  size_t k = 0, i = 0;
  if (cap == 0)
    return 0;
  while (i < len) {
    char tmp[8];
    size_t tl, step;
    unsigned char c = u[i];
    if (c == '"' || c == '\\') {
      tmp[0] = '\\', tmp[1] = (char)c, tl = 2, step = 1;
    } else if (c < 0x20 || c == 0x7f) {
      tmp[0] = '\\', tmp[1] = 'u', tmp[2] = '0', tmp[3] = '0';
      tmp[4] = hex[c >> 4], tmp[5] = hex[c & 0xf], tl = 6, step = 1;
    } else if ((step = utf8_len(u + i, len - i)) == 0) {
      memcpy(tmp, "\\ufffd", 6), tl = 6, step = 1;
    } else {
      memcpy(tmp, u + i, step), tl = step;
    }
    if (k + tl >= cap) {
      if (cut != NULL)
        *cut = 1;
      break;
    }
    memcpy(out + k, tmp, tl);
    k += tl;
    i += step;
  }
  out[k] = '\0';
  return k;
}

/* Appends to a line of fixed capacity; past it, nothing more is added. */
typedef struct {
  char *b;
  size_t k, cap;
  int cut;
} line_t;

static void put(line_t *ln, const char *s) {
  size_t n = strlen(s);
  if (ln->k + n + 2 > ln->cap) { /* keep room for "}\n" */
    ln->cut = 1;
    return;
  }
  memcpy(ln->b + ln->k, s, n);
  ln->k += n;
}

/* "name":"value" with value escaped, cut to at most max bytes. */
static void put_str(line_t *ln, const char *name, const char *v, size_t len,
                    size_t max) {
  size_t room;
  put(ln, name);
  put(ln, "\"");
  room = ln->cap - ln->k;
  room = room > 4 ? room - 4 : 0; /* the closing quote and "}\n" */
  if (room > max)
    room = max;
  if (v != NULL)
    ln->k += om_access_log_escape(ln->b + ln->k, room + 1, v, len, &ln->cut);
  put(ln, "\"");
}

size_t om_access_log_format(const om_access_log_entry_t *e, char *out,
                            size_t cap) {
  if (cap > OM_ACCESS_LOG_LINE_MAX)
    cap = OM_ACCESS_LOG_LINE_MAX;
  /* the request's part may use all but TAIL bytes: the rest of the line
   * (bounded strings and numbers) and the truncation mark always fit */
  enum { TAIL = 1800 };
  line_t ln = {out, 0, cap - TAIL, 0};
  char num[96];
  time_t t = (time_t)(e->wall_ms / 1000);
  struct tm tm;
  gmtime_r(&t, &tm);
  snprintf(num, sizeof num, "{\"time\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03uZ\"",
           tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
           tm.tm_sec, (unsigned)(e->wall_ms % 1000));
  put(&ln, num);
  put_str(&ln, ",\"request_id\":", e->request_id,
          e->request_id ? strlen(e->request_id) : 0, 128);
  put_str(&ln, ",\"service\":", e->service, e->service ? strlen(e->service) : 0,
          256);
  put_str(&ln, ",\"method\":", e->method, e->method ? strlen(e->method) : 0,
          64);
  put_str(&ln, ",\"path\":", e->path, e->path_len, 4096);
  put(&ln, ",\"fields\":{");
  for (size_t i = 0; i < e->n_fields; i++) {
    const om_policy_kv_t *f = &e->fields[i];
    char name[160];
    int cut = 0;
    if (ln.cap - ln.k < f->name_len * 6 + 32) {
      ln.cut = 1;
      break;
    }
    name[0] = i > 0 ? ',' : ' ';
    name[1] = '"';
    om_access_log_escape(name + 2, sizeof name - 4, f->name, f->name_len, &cut);
    strcat(name, "\":");
    put_str(&ln, name + (i == 0), f->value, f->value_len, 1024);
    ln.cut |= cut;
  }
  ln.cap = cap - 24;
  put(&ln, "}");
  snprintf(num, sizeof num, ",\"status\":%d", e->status);
  put(&ln, num);
  if (e->peer_id != NULL) {
    put_str(&ln, ",\"peer\":{\"id\":", e->peer_id, strlen(e->peer_id), 256);
    put_str(&ln, ",\"address\":", e->peer_url,
            e->peer_url ? strlen(e->peer_url) : 0, 512);
    put(&ln, "}");
  } else {
    put(&ln, ",\"peer\":null");
  }
  if (e->first_peer_id != NULL && e->peer_id != NULL &&
      strcmp(e->first_peer_id, e->peer_id) != 0)
    put_str(&ln, ",\"first_peer\":", e->first_peer_id, strlen(e->first_peer_id),
            256);
  snprintf(num, sizeof num, ",\"attempts\":%u,\"duration_ms\":%.3f",
           e->attempts, e->duration_ms);
  put(&ln, num);
  put_str(&ln, ",\"policy\":{\"name\":", e->policy,
          e->policy ? strlen(e->policy) : 0, 256);
  snprintf(num, sizeof num, ",\"version\":%llu,\"revision\":%llu}",
           (unsigned long long)e->policy_version,
           (unsigned long long)e->policy_revision);
  put(&ln, num);
  put_str(&ln, ",\"outcome\":", e->outcome, e->outcome ? strlen(e->outcome) : 0,
          64);
  if (ln.cut) {
    memcpy(ln.b + ln.k, ",\"truncated\":true", 17);
    ln.k += 17;
  }
  out[ln.k++] = '}';
  out[ln.k++] = '\n';
  return ln.k;
}

/* ------------------------------------------------------------------ */
/* the call path's hooks */

static uint64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The worker's producer, made on its first line. */
static om_access_log_producer_t *producer(om_proxy_t *p) {
  if (p->alog == NULL)
    p->alog = om_access_log_producer(p->opts.access_log);
  return p->alog;
}

/* The request fields the service's policy varies on (and the caller's
 * x-openmesh-key, which routes the call too), from req, into kv (cap
 * entries); the count. */
static size_t vary_fields(const om__proxy_service_t *s,
                          const om_http_request_t *req, om_policy_kv_t *kv,
                          size_t cap) {
  const char *const *names = NULL;
  size_t n_names = 0, n = 0, len;
  int m, pa, id;
  om_policy_t *pol = s != NULL ? om__proxy_policy(s) : NULL;
  if (pol != NULL && !om_policy_vary(pol, &names, &n_names, &m, &pa, &id))
    n_names = 0;
  for (size_t i = 0; i < n_names && n < cap; i++) {
    const char *v = om_http_request_header(req, names[i], &len);
    if (v != NULL)
      kv[n++] = (om_policy_kv_t){names[i], strlen(names[i]), v, len};
  }
  if (n < cap) {
    const char *v = om_http_request_header(req, "x-openmesh-key", &len);
    int dup = 0;
    for (size_t i = 0; i < n; i++)
      dup |= strcmp(kv[i].name, "x-openmesh-key") == 0;
    if (v != NULL && !dup)
      kv[n++] = (om_policy_kv_t){"x-openmesh-key", 14, v, len};
  }
  return n;
}

static void policy_of(const om__proxy_service_t *s, om_access_log_entry_t *e) {
  e->policy = "";
  if (s != NULL && s->watch != NULL) {
    om_policy_t *pol = om_policy_watch_current(s->watch);
    e->policy = pol != NULL ? om_policy_name(pol) : "";
    e->policy_version = om_policy_watch_version(s->watch);
    e->policy_revision = om_policy_watch_revision(s->watch);
  }
}

/* The request's part of the entry, from req (still the caller's). */
static void request_part(const om__proxy_service_t *s,
                         const om_http_request_t *req, const char *rid,
                         om_access_log_entry_t *e, om_policy_kv_t *kv,
                         size_t cap, char *pq, size_t pq_cap) {
  size_t n = req->path_len < pq_cap - 1 ? req->path_len : pq_cap - 1;
  memcpy(pq, req->path, n);
  if (req->query != NULL && n + 1 < pq_cap - 1) {
    size_t q =
        req->query_len < pq_cap - 2 - n ? req->query_len : pq_cap - 2 - n;
    pq[n++] = '?';
    memcpy(pq + n, req->query, q);
    n += q;
  }
  e->path = pq;
  e->path_len = n;
  e->method = req->method;
  e->service = s != NULL ? s->name : "";
  e->request_id = rid != NULL && rid[0] != '\0'
                      ? rid
                      : om_http_request_header(req, "x-request-id", NULL);
  e->n_fields = vary_fields(s, req, kv, cap);
  e->fields = kv;
}

void om__proxy_access_log_refused(om_proxy_t *p, om__proxy_service_t *s,
                                  const om_http_request_t *req,
                                  om__proxy_outcome_t o) {
  om_access_log_entry_t e;
  om_policy_kv_t kv[32];
  char pq[4096], line[OM_ACCESS_LOG_LINE_MAX];
  om_access_log_producer_t *pr;
  if (p->opts.access_log == NULL || (pr = producer(p)) == NULL)
    return;
  memset(&e, 0, sizeof e);
  request_part(s, req, NULL, &e, kv, 32, pq, sizeof pq);
  if (s == NULL) { /* the Host named no service: say which */
    e.service = om_http_request_header(req, "host", NULL);
  }
  e.wall_ms = wall_ms();
  e.status = om__proxy_outcome_status(o);
  e.outcome = om__proxy_outcome_name(o);
  policy_of(s, &e);
  om_access_log_append(pr, line, om_access_log_format(&e, line, sizeof line));
}

/*
 * The request's part of the line is kept from call_new (the caller's
 * request is released before the call ends): one allocation holding the
 * entry's strings, only when the log is on.
 */
typedef struct om__proxy_alog_req_s {
  om_access_log_entry_t e;
  om_policy_kv_t kv[32];
  char *strings;
} alog_req_t;

void om__proxy_access_log_begin(om__proxy_call_t *c,
                                const om_http_request_t *req) {
  om_access_log_entry_t e;
  om_policy_kv_t kv[32];
  char pq[4096];
  size_t need = 0, k = 0;
  alog_req_t *r;
  if (c->p->opts.access_log == NULL)
    return;
  memset(&e, 0, sizeof e);
  request_part(c->s, req, c->request_id, &e, kv, 32, pq, sizeof pq);
  need = e.path_len + 1 + strlen(e.method) + 1 +
         (e.request_id ? strlen(e.request_id) : 0) + 1;
  for (size_t i = 0; i < e.n_fields; i++)
    need += kv[i].value_len + 1;
  r = malloc(sizeof *r + need);
  if (r == NULL)
    return; /* the line goes without: counted as dropped at the end */
  r->e = e;
  r->strings = (char *)(r + 1);
#define KEEP(dst, src, len)                                                    \
  do {                                                                         \
    memcpy(r->strings + k, (src), (len));                                      \
    r->strings[k + (len)] = '\0';                                              \
    (dst) = r->strings + k;                                                    \
    k += (len) + 1;                                                            \
  } while (0)
  KEEP(r->e.path, pq, e.path_len);
  KEEP(r->e.method, e.method, strlen(e.method));
  if (e.request_id != NULL)
    KEEP(r->e.request_id, e.request_id, strlen(e.request_id));
  for (size_t i = 0; i < e.n_fields; i++) {
    r->kv[i].name = kv[i].name; /* the policy's, lives as long as the call */
    r->kv[i].name_len = kv[i].name_len;
    r->kv[i].value_len = kv[i].value_len;
    KEEP(r->kv[i].value, kv[i].value, kv[i].value_len);
  }
#undef KEEP
  r->e.fields = r->kv;
  c->alog = r;
}

/* The peer of view v named id (v's peers are in id order). */
static const om__proxy_peer_t *peer_by_id(const om__proxy_view_t *v,
                                          const char *id) {
  size_t lo = 0, hi = v != NULL ? v->n : 0;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int cmp = strcmp(v->peers[mid]->id, id);
    if (cmp == 0)
      return v->peers[mid];
    if (cmp < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

void om__proxy_access_log_end(om__proxy_call_t *c, om__proxy_outcome_t o) {
  alog_req_t *r = c->alog;
  om_access_log_producer_t *pr;
  char line[OM_ACCESS_LOG_LINE_MAX];
  if (c->p->opts.access_log == NULL)
    return;
  c->alog = NULL;
  if ((pr = producer(c->p)) == NULL || r == NULL) {
    free(r);
    atomic_fetch_add(&c->p->opts.access_log->dropped, 1);
    om_metric_inc(c->p->opts.access_log->m_dropped);
    return;
  }
  r->e.wall_ms = wall_ms();
  r->e.status = c->committed ? c->status : om__proxy_outcome_status(o);
  r->e.outcome = om__proxy_outcome_name(o);
  r->e.attempts = c->attempts;
  r->e.duration_ms = (double)(uv_hrtime() - c->t0) / 1e6;
  if (c->attempts > 0) {
    const om__proxy_peer_t *peer = peer_by_id(c->view, c->last_peer);
    r->e.peer_id = c->last_peer;
    r->e.peer_url = peer != NULL ? peer->url : "";
    if (c->attempts > 1 && c->n_tried > 0 && c->tried_list[0] < c->view->n)
      r->e.first_peer_id = c->view->peers[c->tried_list[0]]->id;
  }
  policy_of(c->s, &r->e);
  om_access_log_append(pr, line,
                       om_access_log_format(&r->e, line, sizeof line));
  free(r);
}
