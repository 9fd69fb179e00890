/*
 * om_control_handlers.c: the control plane's request handlers other than
 * watches (om_control_internal.h): auth, the registry (register, renew,
 * deregister, discovery, listing), configuration documents and the
 * operator routes (status, metrics).
 */
#include <strings.h>

#include "om_control_internal.h"
#include "om_http_tls.h"

/* ------------------------------------------------------------------ */
/* auth */

static const char *role_name(int role) {
  return role == OM_ROLE_ADMIN      ? "admin"
         : role == OM_ROLE_REGISTER ? "register"
                                    : "read";
}

/* The `san:` lines of the token file against the verified client
 * certificate's URI and DNS SANs (OM_AUTH_MISSING: none matched, or no
 * certificate). */
static om_auth_result_t cert_roles(const om_auth_t *a,
                                   const om_tls_identity_t *id, int role) {
  om_auth_result_t u, d;
  if (id == NULL || om_auth_san_count(a) == 0)
    return OM_AUTH_MISSING;
  u = om_auth_check_sans(a, (const char *const *)id->uris, id->n_uris, role);
  d = om_auth_check_sans(a, (const char *const *)id->dns, id->n_dns, role);
  if (u == OM_AUTH_OK || d == OM_AUTH_OK)
    return OM_AUTH_OK;
  return u == OM_AUTH_FORBIDDEN || d == OM_AUTH_FORBIDDEN ? OM_AUTH_FORBIDDEN
                                                          : OM_AUTH_MISSING;
}

/*
 * 1 when the request may go on; else answered (401/403, RFC 6750 3).
 * Without an Authorization header a GET of a read route may carry the
 * token as the access_token query parameter (RFC 6750 2.3): a browser's
 * EventSource cannot set headers. Only reads: a URL ends up in logs and
 * histories, so it never carries what can write.
 */
int om__authorize(ctx_t *x, int role) {
  om_control_t *c = x->c;
  om_http_request_t *req = x->req;
  const char *h;
  size_t hl = 0;
  char buf[MAX_TOKEN_HEADER];
  om_auth_result_t r;
  x->cred = CRED_NONE;
  x->role = role;
  if (c->auth == NULL || role == 0)
    return 1;
  h = om_http_request_header(req, "authorization", &hl);
  {
    /* two credentials are no credential: which one would count? */
    size_t n = 0;
    for (size_t i = 0; i < req->n_headers; i++)
      n += req->headers[i].name_len == 13 &&
           strncasecmp(req->headers[i].name, "authorization", 13) == 0;
    if (n > 1) {
      reply_error(x, REJ_INVALID_HEADER, "authorization",
                  "more than one Authorization header");
      return 0;
    }
  }
  if (h == NULL && (x->method & (M_GET | M_HEAD)) && role == OM_ROLE_READ) {
    size_t vl = 0;
    int dup;
    const char *v =
        om__query_param(req->query, req->query_len, "access_token", &vl, &dup);
    long k;
    if (v != NULL &&
        (k = om__pct_decode(v, vl, 1, buf + 7, sizeof buf - 7)) >= 0) {
      memcpy(buf, "Bearer ", 7);
      h = buf;
      hl = (size_t)k + 7;
    } else if (v != NULL) {
      h = "Bearer";
      hl = 6;
    }
  }
  r = cert_roles(c->auth, om_http_request_identity(req), role);
  if (r == OM_AUTH_OK)
    x->cred = CRED_CERT;
  /* a certificate without the role may still come with a token that
   * has it */
  if (r != OM_AUTH_OK && (r == OM_AUTH_MISSING || h != NULL)) {
    r = om_auth_digest(h, hl, &x->digest);
    if (r == OM_AUTH_OK)
      r = om_auth_check_digest(c->auth, &x->digest, role);
    if (r == OM_AUTH_OK)
      x->cred = CRED_TOKEN;
  }
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
    om__reply_error_h(x, REJ_FORBIDDEN, NULL, 0, eh, 1,
                      "the token lacks the '%s' role", role_name(role));
  } else {
    om_http_header_t eh[1];
    memset(eh, 0, sizeof eh);
    eh[0].name = "WWW-Authenticate";
    eh[0].value = r == OM_AUTH_MISSING
                      ? "Bearer realm=\"openmesh\""
                      : "Bearer realm=\"openmesh\", error=\"invalid_token\"";
    om__reply_error_h(x, REJ_UNAUTHORIZED, NULL, 0, eh, 1,
                      r == OM_AUTH_MISSING ? "a bearer token is required"
                                           : "the bearer token is not valid");
  }
  return 0;
}

/*
 * Whether watcher w may still watch under the tokens file now in force:
 * its token's digest, or its connection's certificate, checked again for
 * the role it was let in with.
 */
int om__watcher_allowed(const om_control_t *c, const watcher_t *w) {
  if (c->auth == NULL || w->role == 0)
    return 1;
  if (w->cred == CRED_TOKEN)
    return om_auth_check_digest(c->auth, &w->digest, w->role) == OM_AUTH_OK;
  if (w->cred == CRED_CERT && w->req != NULL)
    return cert_roles(c->auth, om_http_request_identity(w->req), w->role) ==
           OM_AUTH_OK;
  return 0; /* let in while auth was off */
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
      om__reply_store_error(&op->x, status);
    return;
  }
  if (change != OM_STORE_NOCHANGE &&
      !om__ring_has(&op->x.c->announced, op->service, rev)) {
    om__log_change(om_store_change_name(change), op->service, op->id, rev,
                   op->url, op->x.req->remote_ip);
    om__ring_add(&op->x.c->answered, op->service, rev);
  }
  k = snprintf(body, sizeof body,
               "{\"service\":\"%s\",\"id\":\"%s\",\"revision\":%" PRIu64
               ",\"change\":\"%s\"}",
               op->service, op->id, rev, change_word(change));
  om__reply_json(&op->x, 200, body, (size_t)k);
}

static void on_write_done(void *ud, int status, om_store_change_t change,
                          uint64_t rev) {
  op_t *op = ud;
  reply_change(op, status, change, rev);
  om__op_free(op);
}

void om__h_put_instance(ctx_t *x, const char *svc, const char *id) {
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
    om__reply_store_error(x, rc);
    return;
  }
  op = om__op_new(x);
  if (op == NULL || (op->url = om__dup_str(in.url)) == NULL) {
    om_instance_clear(&in);
    if (op != NULL)
      om__op_free(op);
    om__reply_store_error(x, OM_ENOMEM);
    return;
  }
  snprintf(op->service, sizeof op->service, "%s", svc);
  snprintf(op->id, sizeof op->id, "%s", id);
  om__op_writing(op, 0);
  c->writing++;
  rc = om_store_put_instance(c->store, svc, &in, on_write_done, op);
  c->writing--;
  om_instance_clear(&in);
  if (rc != 0)
    om__op_fail(op, rc);
}

void om__h_instance_op(ctx_t *x, const char *svc, const char *id,
                       int heartbeat) {
  om_control_t *c = x->c;
  op_t *op = om__op_start(x, svc);
  int rc;
  if (op == NULL)
    return;
  snprintf(op->id, sizeof op->id, "%s", id);
  if (!heartbeat)
    om__op_writing(op, 1);
  c->writing++;
  if (heartbeat)
    rc = om_store_renew(c->store, svc, id, on_write_done, op);
  else
    rc = om_store_delete_instance(c->store, svc, id, on_write_done, op);
  c->writing--;
  if (rc != 0)
    om__op_fail(op, rc);
}

/*
 * 1 when the request accepts a gzip body (RFC 9110 12.5.3): a coding
 * "gzip" (or its alias "x-gzip") with a weight above 0, or "*" above 0
 * when gzip is not named. Every Accept-Encoding field counts; no field,
 * or one this cannot read, means identity.
 */
static int accepts_gzip(const om_http_request_t *req) {
  int gzip = -1, star = -1; /* -1: not named; else 1 (q > 0) or 0 */
  for (size_t i = 0; i < req->n_headers; i++) {
    const om_http_header_t *f = &req->headers[i];
    const char *p, *end;
    if (f->name_len != 15 || strncasecmp(f->name, "accept-encoding", 15) != 0)
      continue;
    p = f->value;
    end = f->value + f->value_len;
    while (p < end) {
      const char *tok, *tend;
      int ok = 1;
      while (p < end && (*p == ' ' || *p == '\t' || *p == ','))
        p++;
      tok = p;
      while (p < end && *p != ',' && *p != ';' && *p != ' ' && *p != '\t')
        p++;
      tend = p;
      /* parameters: only q matters; q=0 (0, 0.0, 0.00, 0.000) refuses */
      while (p < end && *p != ',') {
        if ((*p == 'q' || *p == 'Q') && p + 1 < end && p[1] == '=') {
          const char *v = p + 2;
          ok = 0;
          if (v < end && *v == '1')
            ok = 1;
          else if (v < end && *v == '0')
            for (v++, v += v < end && *v == '.';
                 v < end && *v >= '0' && *v <= '9'; v++)
              if (*v != '0')
                ok = 1;
          p = v;
          continue;
        }
        p++;
      }
      if ((tend - tok == 4 && strncasecmp(tok, "gzip", 4) == 0) ||
          (tend - tok == 6 && strncasecmp(tok, "x-gzip", 6) == 0))
        gzip = ok;
      else if (tend - tok == 1 && *tok == '*')
        star = ok;
    }
  }
  return gzip == 1 || (gzip == -1 && star == 1);
}

static void on_service_snapshot(void *ud, int status, om_snapshot_t *snap) {
  op_t *op = ud;
  ctx_t *x = &op->x;
  if (status != 0 || snap == NULL) {
    if (status == OM_ENOTFOUND || status == 0)
      reply_error(x, REJ_NOT_FOUND, NULL, "no service '%s'", op->service);
    else
      om__reply_store_error(x, status);
  } else if (!op->paged) {
    /* the cached document, closed with the page member; or the same
     * bytes gzip-compressed once per revision, for a client that takes
     * them (the choice varies on Accept-Encoding: RFC 9110 12.5.5) */
    static const char tail[] = ",\"next_page_token\":null}";
    om_http_header_t h[2] = {{"Vary", "Accept-Encoding", 0, 0},
                             {"Content-Encoding", "gzip", 0, 0}};
    const char *data;
    size_t len;
    if (accepts_gzip(x->req) &&
        om_snapshot_get_gzip_cached_flags(snap, om__snapshot_flags(x->c), &data,
                                          &len) == 0)
      om__reply2(x, 200, "application/json", data, len, NULL, 0, h, 2);
    else if (om_snapshot_json_cached_flags(snap, om__snapshot_flags(x->c),
                                           &data, &len) != 0 ||
             len < 2)
      om__reply_store_error(x, OM_ENOMEM);
    else
      om__reply2(x, 200, "application/json", data, len - 1, tail,
                 sizeof tail - 1, h, 1);
  } else {
    char *out = NULL;
    size_t len = 0;
    om_json_error_t err;
    size_t limit = op->page_size;
    int rc;
    memset(&err, 0, sizeof err);
    if (limit == 0) /* a token without page_size: the rest */
      limit = om_snapshot_count(snap) > 0 ? om_snapshot_count(snap) : 1;
    rc = om_snapshot_page_json_flags(snap, om__snapshot_flags(x->c),
                                     op->has_token ? op->token : NULL,
                                     op->token_len, limit, &out, &len, &err);
    if (rc == 0)
      om__reply_json(x, 200, out, len);
    else if (rc == OM_ESTATE)
      om__reply_error_h(x, REJ_REVISION_CHANGED, "page_token",
                        om_snapshot_revision(snap), NULL, 0, "%s", err.text);
    else if (rc == OM_EPARSE || rc == OM_ERANGE)
      reply_error(x, REJ_INVALID_FIELD, "page_token", "%s", err.text);
    else
      om__reply_store_error(x, rc);
    free(out);
  }
  om__op_free(op);
}

void om__h_get_service(ctx_t *x, const char *svc) {
  om_control_t *c = x->c;
  om_http_request_t *req = x->req;
  const char *v;
  size_t vl = 0;
  int dup, rc;
  uint64_t ps = 0;
  op_t *op;
  char tok[OM_PAGE_TOKEN_LEN + 8];
  long tl = -1;
  v = om__query_param(req->query, req->query_len, "page_size", &vl, &dup);
  if (v != NULL && (dup || om__parse_u64(v, vl, &ps) != 0 || ps < 1 ||
                    ps > OM_CONTROL_MAX_PAGE_SIZE)) {
    reply_error(x, REJ_INVALID_FIELD, "page_size",
                "field 'page_size': must be an integer in [1, %u]",
                OM_CONTROL_MAX_PAGE_SIZE);
    return;
  }
  v = om__query_param(req->query, req->query_len, "page_token", &vl, &dup);
  if (v != NULL) {
    tl = om__pct_decode(v, vl, 1, tok, sizeof tok);
    if (dup || tl != OM_PAGE_TOKEN_LEN) {
      reply_error(x, REJ_INVALID_FIELD, "page_token",
                  "field 'page_token': is malformed or was not issued by "
                  "this service");
      return;
    }
  }
  op = om__op_start(x, svc);
  if (op == NULL)
    return;
  op->paged = ps > 0 || tl >= 0;
  op->page_size = (size_t)ps;
  if (tl >= 0) {
    memcpy(op->token, tok, (size_t)tl + 1);
    op->token_len = (size_t)tl;
    op->has_token = 1;
  }
  rc = om_store_snapshot(c->store, svc, on_service_snapshot, op);
  if (rc != 0)
    om__op_fail(op, rc);
}

static void on_service_list(void *ud, int status, const om_service_rev_t *list,
                            size_t n) {
  op_t *op = ud;
  char *buf;
  size_t cap, k = 0;
  if (status != 0) {
    om__reply_store_error(&op->x, status);
    om__op_free(op);
    return;
  }
  /* names are [A-Za-z0-9._-]: nothing to escape */
  cap = 32 + n * (OM_NAME_MAX + 96);
  buf = malloc(cap);
  if (buf == NULL) {
    om__reply_store_error(&op->x, OM_ENOMEM);
    om__op_free(op);
    return;
  }
  k += (size_t)snprintf(buf + k, cap - k, "{\"services\":[");
  for (size_t i = 0; i < n; i++)
    k += (size_t)snprintf(
        buf + k, cap - k,
        "%s{\"service\":\"%s\",\"revision\":%" PRIu64 ",\"instances\":%zu}",
        i ? "," : "", list[i].service, list[i].revision, list[i].instances);
  k += (size_t)snprintf(buf + k, cap - k, "]}");
  om__reply_json(&op->x, 200, buf, k);
  free(buf);
  om__op_free(op);
}

void om__h_list_services(ctx_t *x) {
  om_control_t *c = x->c;
  op_t *op = om__op_start(x, NULL);
  int rc;
  if (op == NULL)
    return;
  rc = om_store_list_services(c->store, on_service_list, op);
  if (rc != 0)
    om__op_fail(op, rc);
}

static void on_leases(void *ud, int status, const om_lease_left_t *list,
                      size_t n) {
  op_t *op = ud;
  char *buf;
  size_t cap, k = 0;
  if (status != 0) {
    om__reply_store_error(&op->x, status);
    om__op_free(op);
    return;
  }
  /* names are [A-Za-z0-9._-]: nothing to escape */
  cap = 32 + n * (2 * OM_NAME_MAX + 64);
  buf = malloc(cap);
  if (buf == NULL) {
    om__reply_store_error(&op->x, OM_ENOMEM);
    om__op_free(op);
    return;
  }
  k += (size_t)snprintf(buf + k, cap - k, "{\"leases\":[");
  for (size_t i = 0; i < n; i++)
    k += (size_t)snprintf(buf + k, cap - k,
                          "%s{\"service\":\"%s\",\"id\":\"%s\","
                          "\"expires_in_ms\":%" PRIu64 "}",
                          i ? "," : "", list[i].service, list[i].id,
                          list[i].expires_in_ms);
  k += (size_t)snprintf(buf + k, cap - k, "]}");
  om__reply_json(&op->x, 200, buf, k);
  free(buf);
  om__op_free(op);
}

/* Every lease's time left: renewals move no revision, so no snapshot
 * carries it (the console counts down from it). */
void om__h_leases(ctx_t *x) {
  om_control_t *c = x->c;
  op_t *op = om__op_start(x, NULL);
  int rc;
  if (op == NULL)
    return;
  rc = om_store_leases(c->store, on_leases, op);
  if (rc != 0)
    om__op_fail(op, rc);
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
    om__reply_store_error(&op->x, status);
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
    om__reply_json(&op->x, 200, body, (size_t)k);
  }
  om__op_free(op);
}

void om__h_put_config(ctx_t *x, const char *name) {
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
      om__reply_store_error(x, rc);
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
  op = om__op_new(x);
  if (op == NULL || (op->url = om__dup_str(ctype)) == NULL) {
    if (op != NULL)
      om__op_free(op);
    om__reply_store_error(x, OM_ENOMEM);
    return;
  }
  snprintf(op->service, sizeof op->service, "%s", name);
  rc = om_store_config_put(c->store, name, ctype, req->body, req->body_len,
                           on_config_written, op);
  if (rc != 0)
    om__op_fail(op, rc);
}

static void on_config_read(void *ud, int status, om_config_doc_t *doc) {
  op_t *op = ud;
  if (status != 0 || doc == NULL) {
    if (status == OM_ENOTFOUND || status == 0)
      reply_error(&op->x, REJ_NOT_FOUND, NULL, "no document '%s'", op->service);
    else
      om__reply_store_error(&op->x, status);
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
    om__reply(&op->x, 200, doc->content_type, doc->body, doc->len, eh, 2);
  }
  om__op_free(op);
}

void om__h_get_config(ctx_t *x, const char *name) {
  om_control_t *c = x->c;
  op_t *op = om__op_start(x, name);
  int rc;
  if (op == NULL)
    return;
  rc = om_store_config_get(c->store, name, on_config_read, op);
  if (rc != 0)
    om__op_fail(op, rc);
}

/* ------------------------------------------------------------------ */
/* operations */

/* Liveness: the loop answers. */
void om__h_healthz(ctx_t *x) {
  om__reply(x, 200, "text/plain; charset=utf-8", "ok\n", 3, NULL, 0);
}

/*
 * Readiness: whether this plane should get traffic now. Not when its
 * store is unreachable (it would serve the last known state, marked
 * stale, and refuse writes), when it is draining, or inside its warm-up
 * window (its snapshots may miss live instances: om__warming). 200
 * "ready", else 503 with the reasons, so a load balancer or an
 * orchestrator moves traffic to another plane while /healthz keeps the
 * process alive.
 */
void om__h_readyz(ctx_t *x) {
  om_store_status_t st;
  char body[256];
  const char *why[3];
  int n = 0, k, warming = om__warming(x->c);
  memset(&st, 0, sizeof st);
  om_store_status(x->c->store, &st);
  if (st.stale)
    why[n++] = "store_unreachable";
  if (x->c->closing)
    why[n++] = "draining";
  if (warming)
    why[n++] = "warming";
  if (n == 0) {
    om__reply(x, 200, "application/json", "{\"ready\":true}\n", 15, NULL, 0);
    return;
  }
  k = snprintf(body, sizeof body, "{\"ready\":false,\"reasons\":[");
  for (int i = 0; i < n; i++)
    k += snprintf(body + k, sizeof body - (size_t)k, "%s\"%s\"", i ? "," : "",
                  why[i]);
  if (warming)
    k += snprintf(body + k, sizeof body - (size_t)k,
                  "],\"warming_remaining_ms\":%" PRIu64
                  ",\"message\":\"the store lost its state; snapshots may "
                  "miss live instances until every keeper renewed\"}\n",
                  om__warm_remaining_ms(x->c));
  else
    k += snprintf(body + k, sizeof body - (size_t)k, "]}\n");
  om__reply(x, 503, "application/json", body, (size_t)k, NULL, 0);
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
  om_metric_set(m->uptime, (double)(om__now_ns() - c->t_start) / 1e9);
  om_metric_set(m->watchers, (double)c->watchers);
  if (c->srv != NULL) {
    const om_http_server_metrics_t *hm = om_http_server_metrics(c->srv);
    sync_counter(m->conn_accepted, hm->connections_accepted);
    om_metric_set(m->conn_active, (double)hm->connections_active);
    sync_counter(m->conn_rejected, hm->connections_rejected);
    sync_counter(m->conn_reserved, hm->connections_reserved);
    sync_counter(m->reserve_evicted, hm->reserve_evicted);
    sync_counter(m->http_requests, hm->requests);
    sync_counter(m->http_aborted, hm->responses_aborted);
    for (int i = 0; i < OM_HTTP_REJECT__COUNT; i++)
      sync_counter(m->http_rej[i], hm->rejected[i]);
    sync_counter(m->over_capacity, hm->connections_rejected);
  }
}

void om__h_metrics(ctx_t *x) {
  size_t len = 0;
  char *text;
  sync_metrics(x->c);
  text = om_metrics_render(x->c->metrics, &len);
  if (text == NULL) {
    om__reply_store_error(x, OM_ENOMEM);
    return;
  }
  om__reply(x, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, NULL,
            0);
  free(text);
}

void om__h_status(ctx_t *x) {
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
                        json_real((double)(om__now_ns() - c->t_start) / 1e9));
    json_object_set_new(o, "revision", json_integer((json_int_t)c->rev_max));
    json_object_set_new(o, "registrations",
                        json_integer((json_int_t)st.registrations));
    json_object_set_new(o, "renewals", json_integer((json_int_t)st.renewals));
    json_object_set_new(o, "deletions", json_integer((json_int_t)st.deletions));
    json_object_set_new(o, "expiries", json_integer((json_int_t)st.expiries));
    json_object_set_new(o, "auth", json_boolean(c->auth != NULL));
    json_object_set_new(o, "warming", json_boolean(om__warming(c)));
    json_object_set_new(o, "warming_remaining_ms",
                        json_integer((json_int_t)om__warm_remaining_ms(c)));
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
    om__reply_store_error(x, OM_ENOMEM);
    return;
  }
  om__reply_json(x, 200, body, strlen(body));
  free(body);
}
