/*
 * om_proxy_grpc.c: what the proxy knows of a gRPC call beyond routing
 * (docs/PROXY.md "gRPC"): its service and method from :path, its
 * grpc-timeout both ways, which Trailers-Only answers are retried, the
 * grpc-status it ended with, and the per-method metrics.
 *
 * openmesh_proxy_grpc_requests_total{service, grpc_method, grpc_status}
 * and openmesh_proxy_grpc_request_duration_seconds{service, grpc_method}
 * (from the request head to the end of the call). The method comes from
 * the caller's :path, so its label is bounded: a service keeps at most
 * OM__PROXY_GRPC_METHODS methods, the rest count as grpc_method="other".
 * The status is the one the caller sees: the upstream's grpc-status
 * (trailers, or a Trailers-Only head), else the proxy's own (the
 * refusal's row in OM__PROXY_OUTCOME_MAP), CANCELLED when the caller went
 * away, INTERNAL for a stream the proxy cut (the caller sees a reset),
 * UNKNOWN when the upstream ended without one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "om_http_chars.h"
#include "om_metrics.h"
#include "om_proxy_internal.h"

#define GRPC_CODES 17

struct om__proxy_grpc_method_s {
  char name[OM__PROXY_GRPC_METHOD_LEN + 1]; /* "pkg.Service/Method" */
  om_metric_t *latency;
  om_metric_t *status[GRPC_CODES]; /* registered on first use */
};

int om__proxy_grpc_split(const char *path, size_t len, const char **svc,
                         size_t *svc_len, const char **method,
                         size_t *method_len) {
  const char *slash;
  if (len < 4 || path[0] != '/')
    return -1;
  slash = memchr(path + 1, '/', len - 1);
  if (slash == NULL || slash == path + 1 || slash + 1 == path + len ||
      memchr(slash + 1, '/', (size_t)(path + len - slash - 1)) != NULL ||
      memchr(path, '?', len) != NULL)
    return -1;
  *svc = path + 1;
  *svc_len = (size_t)(slash - path - 1);
  *method = slash + 1;
  *method_len = (size_t)(path + len - slash - 1);
  return 0;
}

int om__proxy_grpc_status_of(const om_http_header_t *h, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int code = 0;
    if (h[i].name_len != 11 || strncasecmp(h[i].name, "grpc-status", 11) != 0)
      continue;
    if (h[i].value_len == 0 || h[i].value_len > 2)
      return -1;
    for (size_t k = 0; k < h[i].value_len; k++) {
      if (h[i].value[k] < '0' || h[i].value[k] > '9')
        return -1;
      code = code * 10 + (h[i].value[k] - '0');
    }
    return code < GRPC_CODES ? code : -1;
  }
  return -1;
}

om__proxy_grpc_method_t *om__proxy_grpc_method(om__proxy_service_t *s,
                                               const char *path, size_t len) {
  static const double bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                  0.1,   0.25,   0.5,   1,    2.5,   5,
                                  10,    30,     60,    300};
  const char *sv, *mt;
  size_t svl, mtl, nl;
  char name[OM__PROXY_GRPC_METHOD_LEN + 1], esc[2 * sizeof name + 8],
      sesc[2 * OM_NAME_MAX + 8], labels[sizeof esc + sizeof sesc + 64];
  om__proxy_grpc_method_t *m;
  if (om__proxy_grpc_split(path, len, &sv, &svl, &mt, &mtl) != 0 ||
      svl + 1 + mtl > OM__PROXY_GRPC_METHOD_LEN) {
    memcpy(name, "other", 6);
  } else {
    memcpy(name, sv, svl);
    name[svl] = '/';
    memcpy(name + svl + 1, mt, mtl);
    name[svl + 1 + mtl] = '\0';
  }
  nl = strlen(name);
  for (size_t i = 0; i < s->n_grpc; i++)
    if (strcmp(s->grpc[i].name, name) == 0)
      return &s->grpc[i];
  if (s->n_grpc >= OM__PROXY_GRPC_METHODS) {
    /* the bound: every method past it is "other" (the last slot) */
    if (strcmp(s->grpc[OM__PROXY_GRPC_METHODS - 1].name, "other") == 0)
      return &s->grpc[OM__PROXY_GRPC_METHODS - 1];
    return NULL; /* not reached: the last slot is always "other" */
  }
  if (s->grpc == NULL) {
    s->grpc = calloc(OM__PROXY_GRPC_METHODS, sizeof *s->grpc);
    if (s->grpc == NULL)
      return NULL;
  }
  if (s->n_grpc == OM__PROXY_GRPC_METHODS - 1)
    memcpy(name, "other", 6), nl = 5; /* the last slot is kept for it */
  m = &s->grpc[s->n_grpc];
  memcpy(m->name, name, nl + 1);
  om_metrics_escape(s->name, sesc, sizeof sesc);
  om_metrics_escape(m->name, esc, sizeof esc);
  snprintf(labels, sizeof labels, "service=\"%s\",grpc_method=\"%s\"", sesc,
           esc);
  m->latency = om_metrics_histogram(
      s->proxy->metrics, "openmesh_proxy_grpc_request_duration_seconds",
      "gRPC calls by method, from the request head to the call's end.", labels,
      bounds, sizeof bounds / sizeof bounds[0]);
  s->n_grpc++;
  return m;
}

void om__proxy_grpc_count(om__proxy_service_t *s, om__proxy_grpc_method_t *m,
                          int status, uint64_t elapsed_ns) {
  if (m == NULL)
    return;
  if (status < 0 || status >= GRPC_CODES)
    status = 2; /* UNKNOWN */
  if (m->status[status] == NULL) {
    char sesc[2 * OM_NAME_MAX + 8], esc[2 * sizeof m->name + 8],
        labels[sizeof sesc + sizeof esc + 64];
    om_metrics_escape(s->name, sesc, sizeof sesc);
    om_metrics_escape(m->name, esc, sizeof esc);
    snprintf(labels, sizeof labels,
             "service=\"%s\",grpc_method=\"%s\",grpc_status=\"%d\"", sesc, esc,
             status);
    m->status[status] = om_metrics_counter(
        s->proxy->metrics, "openmesh_proxy_grpc_requests_total",
        "gRPC calls by method and the status the caller saw.", labels);
  }
  om_metric_inc(m->status[status]);
  om_metric_observe(m->latency, (double)elapsed_ns / 1e9);
}

void om__proxy_grpc_free(om__proxy_service_t *s) {
  free(s->grpc);
  s->grpc = NULL;
  s->n_grpc = 0;
}

/*
 * grpc-timeout (the gRPC HTTP/2 protocol): 1 to 8 digits and a unit (H
 * hours, M minutes, S seconds, m milliseconds, u microseconds, n
 * nanoseconds), in ms rounded up; -1 when malformed (then ignored, as a
 * malformed x-openmesh-deadline-ms is).
 */
int om__proxy_grpc_timeout_parse(const char *v, size_t len, uint64_t *out) {
  uint64_t x = 0;
  if (v == NULL || len < 2 || len > 9)
    return -1;
  for (size_t i = 0; i + 1 < len; i++) {
    if (v[i] < '0' || v[i] > '9')
      return -1;
    x = x * 10 + (uint64_t)(v[i] - '0');
  }
  switch (v[len - 1]) {
  case 'H':
    *out = x * 3600000u;
    return 0;
  case 'M':
    *out = x * 60000u;
    return 0;
  case 'S':
    *out = x * 1000u;
    return 0;
  case 'm':
    *out = x;
    return 0;
  case 'u':
    *out = (x + 999u) / 1000u;
    return 0;
  case 'n':
    *out = (x + 999999u) / 1000000u;
    return 0;
  default:
    return -1;
  }
}

/*
 * ns as a grpc-timeout value (at most 8 digits and a unit), rounded
 * down so the next hop never waits longer than we do: microseconds below
 * 100 s, then milliseconds, seconds, hours. Returns its length.
 */
size_t om__proxy_grpc_timeout_format(char *buf, uint64_t ns) {
  static const struct {
    uint64_t div;
    char unit;
  } units[] = {{1000u, 'u'},
               {1000000u, 'm'},
               {1000000000u, 'S'},
               {UINT64_C(3600000000000), 'H'}};
  size_t i = 0, k;
  while (i + 1 < sizeof units / sizeof units[0] &&
         ns / units[i].div > 99999999u)
    i++;
  k = om__http_u64_dec(buf, ns / units[i].div > 99999999u ? 99999999u
                                                          : ns / units[i].div);
  buf[k++] = units[i].unit;
  buf[k] = '\0';
  return k;
}

/*
 * A gRPC Trailers-Only answer (no body follows the head) with a status
 * of the policy's grpc_retry_on: its code, with *push_ns and *has_push
 * from grpc-retry-pushback-ms (proposal A6: a malformed or negative
 * pushback means "do not retry": -1). 0 when it is not one.
 */
int om__proxy_grpc_retryable(const om__proxy_call_t *c,
                             const om_upstream_response_t *r, uint64_t *push_ns,
                             int *has_push) {
  int code = -1;
  *has_push = 0;
  if (!c->grpc || r->has_body || r->status != 200)
    return 0;
  for (size_t i = 0; i < r->n_headers; i++) {
    const om_http_header_t *f = &r->headers[i];
    if (f->name_len == 11 && strncasecmp(f->name, "grpc-status", 11) == 0 &&
        f->value_len >= 1 && f->value_len <= 2) {
      code = 0;
      for (size_t k = 0; k < f->value_len; k++)
        code = f->value[k] >= '0' && f->value[k] <= '9' && code >= 0
                   ? code * 10 + (f->value[k] - '0')
                   : -1;
    }
  }
  if (code < 1 || code > 16 || !(c->set.grpc_retry_mask >> code & 1u))
    return 0;
  for (size_t i = 0; i < r->n_headers; i++) {
    const om_http_header_t *f = &r->headers[i];
    uint64_t ms = 0;
    if (f->name_len != 22 ||
        strncasecmp(f->name, "grpc-retry-pushback-ms", 22) != 0)
      continue;
    if (f->value_len == 0 || f->value_len > 10)
      return -1;
    for (size_t k = 0; k < f->value_len; k++) {
      if (f->value[k] < '0' || f->value[k] > '9')
        return -1;
      ms = ms * 10 + (uint64_t)(f->value[k] - '0');
    }
    *push_ns = ms * NS_PER_MS;
    *has_push = 1;
  }
  return code;
}

void om__proxy_refused(om_proxy_t *p, om__proxy_service_t *s,
                       const om_http_request_t *req, om__proxy_outcome_t o) {
  om__proxy_access_log_refused(p, s, req, o);
  if (s != NULL && om__proxy_is_grpc(req))
    om__proxy_grpc_count(s, om__proxy_grpc_method(s, req->path, req->path_len),
                         om__proxy_outcome_grpc(o), 0);
}

void om__proxy_grpc_respond_bodiless(om__proxy_call_t *c, int status,
                                     om_http_header_t *h, size_t n) {
  om_http_request_t *req = c->req;
  size_t k = 0;
  c->req = NULL;
  c->finished = 1;
  c->committed = 1;
  c->grpc_status = om__proxy_grpc_status_of(h, n);
  for (size_t i = 0; i < n; i++) /* om_http_respond frames it */
    if (!(h[i].name_len == 14 &&
          strncasecmp(h[i].name, "content-length", 14) == 0))
      h[k++] = h[i];
  (void)om_http_respond(req, status, h, k, NULL, 0);
}
