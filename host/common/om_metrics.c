/* om_metrics.c: see om_metrics.h. */
#include "om_metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { COUNTER, GAUGE, GAUGE_FN, HISTOGRAM } kind_t;

/*
 * Updates are relaxed atomics: a series is shared by every thread that
 * registered it (the proxy's workers), and a counter only needs its sum to
 * be exact, not ordered with anything else. A counter keeps whole
 * increments in an integer (one locked add: om_metric_inc is on every
 * request) and any fractional part in a double updated by compare and
 * swap; a gauge is the double alone.
 */
struct om_metric_s {
  kind_t kind;
  char *name, *help, *labels;
  _Atomic uint64_t count_int; /* counter: whole increments */
  _Atomic double value;       /* gauge value; counter: fractional adds */
  double (*fn)(void *);
  void *ud;
  double *bounds;            /* histogram */
  _Atomic uint64_t *buckets; /* n + 1, the last is +Inf */
  size_t n;
  _Atomic double sum; /* the count is the buckets' sum */
};

/* The mutex guards the series array (registration, rendering); a series,
 * once registered, never moves, so updaters hold no lock. */
struct om_metrics_s {
  pthread_mutex_t mu;
  om_metric_t **series;
  size_t n, cap;
};

om_metrics_t *om_metrics_new(void) {
  om_metrics_t *m = calloc(1, sizeof(om_metrics_t));
  if (m != NULL && pthread_mutex_init(&m->mu, NULL) != 0) {
    free(m);
    return NULL;
  }
  return m;
}

static void add_double(_Atomic double *a, double v) {
  double old = atomic_load_explicit(a, memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(
      a, &old, old + v, memory_order_relaxed, memory_order_relaxed))
    ;
}

static void metric_free(om_metric_t *x) {
  free(x->name);
  free(x->help);
  free(x->labels);
  free(x->bounds);
  free(x->buckets);
  free(x);
}

void om_metrics_free(om_metrics_t *m) {
  if (m == NULL)
    return;
  for (size_t i = 0; i < m->n; i++)
    metric_free(m->series[i]);
  free(m->series);
  pthread_mutex_destroy(&m->mu);
  free(m);
}

static int valid_name(const char *s) {
  if (s == NULL || *s == '\0' || (*s >= '0' && *s <= '9'))
    return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
          (*s >= '0' && *s <= '9') || *s == '_' || *s == ':'))
      return 0;
  return 1;
}

/* Called with m->mu held. */
static om_metric_t *add(om_metrics_t *m, kind_t kind, const char *name,
                        const char *help, const char *labels) {
  om_metric_t *x;
  if (m == NULL || !valid_name(name) || help == NULL)
    return NULL;
  if (labels == NULL)
    labels = "";
  for (size_t i = 0; i < m->n; i++) {
    x = m->series[i];
    if (strcmp(x->name, name) == 0) {
      kind_t a = x->kind == GAUGE_FN ? GAUGE : x->kind;
      kind_t b = kind == GAUGE_FN ? GAUGE : kind;
      if (a != b)
        return NULL; /* one name, one type */
      if (strcmp(x->labels, labels) == 0)
        return x->kind == kind ? x : NULL;
    }
  }
  if (m->n == m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 32;
    om_metric_t **s = realloc(m->series, cap * sizeof *s);
    if (s == NULL)
      return NULL;
    m->series = s;
    m->cap = cap;
  }
  x = calloc(1, sizeof *x);
  if (x == NULL)
    return NULL;
  x->kind = kind;
  x->name = strdup(name);
  x->help = strdup(help);
  x->labels = strdup(labels);
  if (x->name == NULL || x->help == NULL || x->labels == NULL) {
    metric_free(x);
    return NULL;
  }
  m->series[m->n++] = x;
  return x;
}

static om_metric_t *add_locked(om_metrics_t *m, kind_t kind, const char *name,
                               const char *help, const char *labels) {
  om_metric_t *x;
  if (m == NULL)
    return NULL;
  pthread_mutex_lock(&m->mu);
  x = add(m, kind, name, help, labels);
  pthread_mutex_unlock(&m->mu);
  return x;
}

om_metric_t *om_metrics_counter(om_metrics_t *m, const char *name,
                                const char *help, const char *labels) {
  return add_locked(m, COUNTER, name, help, labels);
}

om_metric_t *om_metrics_gauge(om_metrics_t *m, const char *name,
                              const char *help, const char *labels) {
  return add_locked(m, GAUGE, name, help, labels);
}

om_metric_t *om_metrics_gauge_fn(om_metrics_t *m, const char *name,
                                 const char *help, const char *labels,
                                 double (*fn)(void *ud), void *ud) {
  om_metric_t *x;
  if (fn == NULL || m == NULL)
    return NULL;
  pthread_mutex_lock(&m->mu);
  x = add(m, GAUGE_FN, name, help, labels);
  if (x != NULL && x->fn == NULL) { /* the first registration's reader */
    x->fn = fn;
    x->ud = ud;
  }
  pthread_mutex_unlock(&m->mu);
  return x;
}

om_metric_t *om_metrics_histogram(om_metrics_t *m, const char *name,
                                  const char *help, const char *labels,
                                  const double *bounds, size_t n) {
  om_metric_t *x;
  if (bounds == NULL || n == 0)
    return NULL;
  for (size_t i = 0; i < n; i++)
    if (!isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1]))
      return NULL;
  if (m == NULL)
    return NULL;
  pthread_mutex_lock(&m->mu);
  x = add(m, HISTOGRAM, name, help, labels);
  if (x == NULL || x->bounds != NULL) {
    pthread_mutex_unlock(&m->mu);
    return x;
  }
  x->bounds = malloc(n * sizeof *x->bounds);
  x->buckets = calloc(n + 1, sizeof *x->buckets);
  if (x->bounds == NULL || x->buckets == NULL) {
    m->n--; /* it is the last one added */
    metric_free(x);
    pthread_mutex_unlock(&m->mu);
    return NULL;
  }
  memcpy(x->bounds, bounds, n * sizeof *bounds);
  x->n = n;
  pthread_mutex_unlock(&m->mu);
  return x;
}

void om_metric_inc(om_metric_t *c) {
  if (c == NULL)
    return;
  if (c->kind == COUNTER)
    atomic_fetch_add_explicit(&c->count_int, 1, memory_order_relaxed);
  else
    add_double(&c->value, 1);
}

void om_metric_add(om_metric_t *c, double v) {
  if (c == NULL || (c->kind == COUNTER && !(v >= 0)))
    return;
  if (c->kind == COUNTER && v == floor(v) && v < 9007199254740992.0)
    atomic_fetch_add_explicit(&c->count_int, (uint64_t)v, memory_order_relaxed);
  else
    add_double(&c->value, v);
}

void om_metric_set(om_metric_t *g, double v) {
  if (g != NULL && g->kind == GAUGE)
    atomic_store_explicit(&g->value, v, memory_order_relaxed);
}

void om_metric_observe(om_metric_t *h, double v) {
  size_t i = 0;
  if (h == NULL || h->kind != HISTOGRAM || isnan(v))
    return;
  while (i < h->n && v > h->bounds[i]) /* few buckets: linear is fastest */
    i++;
  atomic_fetch_add_explicit(&h->buckets[i], 1, memory_order_relaxed);
  add_double(&h->sum, v);
}

double om_metric_value(const om_metric_t *m) {
  if (m == NULL)
    return 0;
  if (m->kind == GAUGE_FN)
    return m->fn(m->ud);
  return (double)atomic_load_explicit(&((om_metric_t *)m)->count_int,
                                      memory_order_relaxed) +
         atomic_load_explicit(&((om_metric_t *)m)->value, memory_order_relaxed);
}

char *om_metrics_escape(const char *value, char *out, size_t cap) {
  size_t o = 0;
  if (cap == 0)
    return out;
  for (; value != NULL && *value && o + 2 < cap; value++) {
    char c = *value;
    if (c == '\\' || c == '"' || c == '\n') {
      out[o++] = '\\';
      c = c == '\n' ? 'n' : c;
    }
    out[o++] = c;
  }
  out[o] = '\0';
  return out;
}

typedef struct {
  char *buf;
  size_t len, cap;
  int failed;
} sbuf_t;

static void put(sbuf_t *b, const char *fmt, ...) {
  va_list ap;
  int n;
  if (b->failed)
    return;
  for (;;) {
    va_start(ap, fmt);
    n = vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->failed = 1;
      return;
    }
    if ((size_t)n < b->cap - b->len) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = (b->cap + (size_t)n + 1) * 2;
    char *nb = realloc(b->buf, cap);
    if (nb == NULL) {
      b->failed = 1;
      return;
    }
    b->buf = nb;
    b->cap = cap;
  }
}

/* The shortest %g text that reads back as exactly v. */
static void shortest(char *out, size_t cap, double v) {
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(out, cap, "%.*g", prec, v);
    if (strtod(out, NULL) == v)
      return;
  }
}

/* Prometheus text: integers without exponent, +Inf/-Inf/NaN spelled out. */
static void put_value(sbuf_t *b, double v) {
  if (isnan(v))
    put(b, "NaN");
  else if (isinf(v))
    put(b, v > 0 ? "+Inf" : "-Inf");
  else if (v == floor(v) && fabs(v) < 9007199254740992.0)
    put(b, "%.0f", v);
  else {
    char num[32];
    shortest(num, sizeof num, v);
    put(b, "%s", num);
  }
}

static void put_series(sbuf_t *b, const om_metric_t *x, const char *suffix,
                       const char *extra_label) {
  int has = x->labels[0] != '\0' || extra_label != NULL;
  put(b, "%s%s", x->name, suffix);
  if (has)
    put(b, "{%s%s%s}", x->labels,
        x->labels[0] != '\0' && extra_label != NULL ? "," : "",
        extra_label != NULL ? extra_label : "");
  put(b, " ");
}

static void render_one(sbuf_t *b, const om_metric_t *x) {
  if (x->kind != HISTOGRAM) {
    put_series(b, x, "", NULL);
    put_value(b, om_metric_value(x));
    put(b, "\n");
    return;
  }
  uint64_t cum = 0;
  char le[64];
  for (size_t i = 0; i <= x->n; i++) {
    cum += atomic_load_explicit(&((om_metric_t *)x)->buckets[i],
                                memory_order_relaxed);
    if (i < x->n) {
      char num[32];
      shortest(num, sizeof num, x->bounds[i]);
      snprintf(le, sizeof le, "le=\"%s\"", num);
    } else
      snprintf(le, sizeof le, "le=\"+Inf\"");
    put_series(b, x, "_bucket", le);
    put(b, "%llu\n", (unsigned long long)cum);
  }
  put_series(b, x, "_sum", NULL);
  put_value(
      b, atomic_load_explicit(&((om_metric_t *)x)->sum, memory_order_relaxed));
  put(b, "\n");
  put_series(b, x, "_count", NULL);
  put(b, "%llu\n", (unsigned long long)cum);
}

static const char *type_name(kind_t k) {
  return k == COUNTER ? "counter" : k == HISTOGRAM ? "histogram" : "gauge";
}

char *om_metrics_render(const om_metrics_t *m, size_t *len) {
  sbuf_t b = {0};
  pthread_mutex_lock(&((om_metrics_t *)m)->mu);
  put(&b, "%s", "");
  for (size_t i = 0; i < m->n; i++) {
    const om_metric_t *x = m->series[i];
    int first = 1;
    for (size_t j = 0; j < i && first; j++)
      first = strcmp(m->series[j]->name, x->name) != 0;
    if (!first)
      continue; /* rendered with the first series of its name */
    put(&b, "# HELP %s %s\n# TYPE %s %s\n", x->name, x->help, x->name,
        type_name(x->kind));
    for (size_t j = i; j < m->n; j++)
      if (strcmp(m->series[j]->name, x->name) == 0)
        render_one(&b, m->series[j]);
  }
  pthread_mutex_unlock(&((om_metrics_t *)m)->mu);
  if (b.failed) {
    free(b.buf);
    return NULL;
  }
  if (len != NULL)
    *len = b.len;
  return b.buf;
}
