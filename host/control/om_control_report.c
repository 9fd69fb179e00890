/*
 * om_control_report.c: the verdicts of proxies on policy documents
 * (om_config_status.h). `POST /v1/config/{name}/status` records one
 * proxy's report, `GET /v1/config/{name}/status` lists them. The table is
 * this plane's memory, also on a shared store: with several planes, read
 * the status on the plane the proxies report to (docs/CONTROL.md).
 */
#include "om_control_internal.h"

#include <time.h>

enum { REP_APPLIED, REP_REFUSED, REP_INVALID, REP_EVICTED };

static int doc_known(const om_control_t *c, const char *name) {
  size_t lo = 0, hi = c->n_docs;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int k = strcmp(c->docs[mid]->name, name);
    if (k == 0)
      return 1;
    if (k < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return 0;
}

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A revision field: absent or null is 0, else a non-negative integer. */
static int revision_field(json_t *root, const char *key, uint64_t *out) {
  json_t *v = json_object_get(root, key);
  *out = 0;
  if (v == NULL || json_is_null(v))
    return 0;
  if (!json_is_integer(v) || json_integer_value(v) < 0)
    return -1;
  *out = (uint64_t)json_integer_value(v);
  return 0;
}

static void invalid(ctx_t *x, const char *field, const char *msg) {
  om_metric_inc(x->c->m.reports[REP_INVALID]);
  reply_error(x, REJ_INVALID_FIELD, field, "field '%s': %s", field, msg);
}

/*
 * Body: {"id": "host:pid", "address": "10.0.0.7:7601" (optional: the
 * caller's IP when absent), "applied": R | null, "refused": R | null,
 * "reason": "..." (with refused)}. Unknown fields are refused by name.
 */
static void report(ctx_t *x, const char *name) {
  om_control_t *c = x->c;
  om_http_request_t *req = x->req;
  static const char *const known[] = {"id", "address", "applied", "refused",
                                      "reason"};
  json_error_t je;
  json_t *root, *v;
  const char *key, *field = NULL;
  om_cfg_report_t r;
  om_cfg_status_stats_t before, after;
  char *out;
  int rc;
  root = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &je);
  if (root == NULL || !json_is_object(root)) {
    om_metric_inc(c->m.reports[REP_INVALID]);
    if (root == NULL)
      reply_error(x, REJ_INVALID_JSON, "",
                  "invalid JSON at line %d, column %d: %s", je.line, je.column,
                  je.text);
    else
      reply_error(x, REJ_INVALID_JSON, "", "the report must be a JSON object");
    json_decref(root);
    return;
  }
  json_object_foreach(root, key, v) {
    int ok = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
      ok |= strcmp(key, known[i]) == 0;
    if (!ok) {
      char f[64];
      snprintf(f, sizeof f, "%.60s", key);
      invalid(x, f, "unknown field");
      json_decref(root);
      return;
    }
  }
  memset(&r, 0, sizeof r);
  v = json_object_get(root, "id");
  r.id = json_is_string(v) ? json_string_value(v) : NULL;
  v = json_object_get(root, "address");
  if (v != NULL && !json_is_null(v) && !json_is_string(v)) {
    invalid(x, "address", "must be a string");
    json_decref(root);
    return;
  }
  r.address = json_is_string(v) ? json_string_value(v) : req->remote_ip;
  if (revision_field(root, "applied", &r.applied) != 0 ||
      revision_field(root, "refused", &r.refused) != 0) {
    invalid(x,
            revision_field(root, "applied", &r.applied) != 0 ? "applied"
                                                             : "refused",
            "must be a revision (an integer >= 0) or null");
    json_decref(root);
    return;
  }
  v = json_object_get(root, "reason");
  if (v != NULL && !json_is_null(v) && !json_is_string(v)) {
    invalid(x, "reason", "must be a string");
    json_decref(root);
    return;
  }
  r.reason = json_is_string(v) ? json_string_value(v) : NULL;
  if (r.refused != 0 && (r.reason == NULL || r.reason[0] == '\0')) {
    invalid(x, "reason", "a refusal needs its reason");
    json_decref(root);
    return;
  }
  if (!om_cfg_report_valid(&r, &field)) {
    invalid(x, field,
            strcmp(field, "id") == 0
                ? "must be 1 to 128 visible ASCII characters"
                : "must be at most 256 visible ASCII characters");
    json_decref(root);
    return;
  }
  om_cfg_status_stats(c->cfg_status, &before);
  rc = om_cfg_status_report(c->cfg_status, name, &r, om__now_ns());
  om_cfg_status_stats(c->cfg_status, &after);
  if (rc != 0) {
    json_decref(root);
    om__reply_store_error(x, rc);
    return;
  }
  if (after.evicted > before.evicted)
    om_metric_add(c->m.reports[REP_EVICTED],
                  (double)(after.evicted - before.evicted));
  om_metric_inc(
      c->m.reports[r.refused != 0 && r.refused > r.applied ? REP_REFUSED
                                                           : REP_APPLIED]);
  if (r.refused != 0 && r.refused > r.applied) {
    char rev[24];
    snprintf(rev, sizeof rev, "%" PRIu64, r.refused);
    om_log(OM_LOG_WARN, "policy_refused_by_proxy", "config", name, "proxy",
           r.id, "address", r.address, "revision", rev, "reason", r.reason,
           NULL);
  }
  v = json_pack(
      "{s:s, s:s, s:I}", "name", name, "id", r.id, "proxies",
      (json_int_t)om_cfg_status_count(c->cfg_status, name, om__now_ns()));
  json_decref(root);
  out = v != NULL ? json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(v);
  if (out == NULL) {
    om__reply_store_error(x, OM_ENOMEM);
    return;
  }
  om__reply_json(x, 200, out, strlen(out));
  free(out);
}

static void list(ctx_t *x, const char *name) {
  om_control_t *c = x->c;
  json_t *o;
  char *body;
  o = om_cfg_status_json(c->cfg_status, name, om__now_ns(), wall_now());
  body = o != NULL ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(o);
  if (body == NULL) {
    om__reply_store_error(x, OM_ENOMEM);
    return;
  }
  om__reply_json(x, 200, body, strlen(body));
  free(body);
}

/*
 * The plane learns of documents from the store's change events, which
 * start when it starts: one written before (a restart on a shared Redis)
 * is looked up in the store, then the request goes on.
 */
static void on_doc_read(void *ud, int status, om_config_doc_t *doc) {
  op_t *op = ud;
  if (status != 0 || doc == NULL) {
    if (op->paged) /* a report */
      om_metric_inc(op->x.c->m.reports[REP_INVALID]);
    if (status == OM_ENOTFOUND || status == 0)
      reply_error(&op->x, REJ_NOT_FOUND, NULL, "no configuration document '%s'",
                  op->service);
    else
      om__reply_store_error(&op->x, status);
  } else if (op->paged) {
    report(&op->x, op->service);
  } else {
    list(&op->x, op->service);
  }
  om__op_free(op);
}

static void with_doc(ctx_t *x, const char *name, int is_report) {
  op_t *op;
  int rc;
  if (doc_known(x->c, name)) {
    if (is_report)
      report(x, name);
    else
      list(x, name);
    return;
  }
  if ((op = om__op_start(x, name)) == NULL)
    return;
  op->paged = is_report; /* the op's flag field: no paging here */
  rc = om_store_config_get(x->c->store, name, on_doc_read, op);
  if (rc != 0)
    om__op_fail(op, rc);
}

void om__h_config_report(ctx_t *x, const char *name) {
  with_doc(x, name, 1);
}

void om__h_config_status(ctx_t *x, const char *name) {
  with_doc(x, name, 0);
}
