/*
 * om_proxy_tls.c: TLS to a service's https:// peers (docs/PROXY.md "TLS
 * to upstreams").
 *
 * The proxy has one client context from --upstream-ca / --upstream-cert
 * / --upstream-key (the system store and no certificate by default),
 * given to the upstream pool as its default. A traffic policy's
 * `tls = { ca_file, server_name, verify, cert_file, key_file }` gives its
 * service a context of its own, each file falling back to the proxy's
 * flag: built when the policy version loads (a bad file rejects that
 * version, naming the file, and the last good stays), kept while later
 * versions say the same, and passed per request. Contexts reload their
 * files on SIGHUP (om_proxy_reload_tls), and all of them when one of the
 * --upstream-* files changes (om__proxy_tls_watch): a bad file keeps the
 * last good.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <lauxlib.h>
#include <lua.h>

#include "om_errno.h"
#include "om_log.h"
#include "om_policy.h"
#include "om_proxy_internal.h"
#include "om_sandbox.h"

#define MAX_PATH_BYTES 4096

/* What a policy's tls table says (files as given, NULL when absent). */
typedef struct {
  int has, verify;
  char *ca_file, *cert_file, *key_file, *server_name;
  om_tls_ctx_t *ctx; /* built from them; NULL when !has */
} tls_cfg_t;

struct om__proxy_tls_s {
  tls_cfg_t cur;
  char error[512]; /* the latest context that failed to build; "" none */
  uint64_t handshakes, resumed, failures;
  om_metric_t *m_ok, *m_resumed, *m_fail[OM_TLS_FAIL__COUNT];
  om__proxy_log_limit_t log; /* proxy_upstream_tls_failed lines */
};

static void cfg_clear(tls_cfg_t *c) {
  free(c->ca_file);
  free(c->cert_file);
  free(c->key_file);
  free(c->server_name);
  om_tls_ctx_unref(c->ctx);
  memset(c, 0, sizeof *c);
}

static int same_str(const char *a, const char *b) {
  return (a == NULL && b == NULL) ||
         (a != NULL && b != NULL && strcmp(a, b) == 0);
}

static int cfg_same(const tls_cfg_t *a, const tls_cfg_t *b) {
  return a->has == b->has && a->verify == b->verify &&
         same_str(a->ca_file, b->ca_file) &&
         same_str(a->cert_file, b->cert_file) &&
         same_str(a->key_file, b->key_file) &&
         same_str(a->server_name, b->server_name);
}

/* ------------------------------------------------------------------ */
/* the proxy's context */

int om__proxy_tls_init(om_proxy_t *p, char *err, size_t errlen) {
  om_tls_opts_t o = {.role = OM_TLS_CLIENT,
                     .ca_file = p->opts.upstream_ca,
                     .cert_file = p->opts.upstream_cert,
                     .key_file = p->opts.upstream_key,
                     .ca_label = "--upstream-ca",
                     .cert_label = "--upstream-cert",
                     .key_label = "--upstream-key"};
  int bad = 0;
  int rc = om_tls_ctx_new(&o, &p->tls_default, err, errlen);
  if (rc != 0)
    return rc;
  /* the options are the proxy's copies from here on */
  p->upstream_ca = om__proxy_dup_or_null(p->opts.upstream_ca, &bad);
  p->upstream_cert = om__proxy_dup_or_null(p->opts.upstream_cert, &bad);
  p->upstream_key = om__proxy_dup_or_null(p->opts.upstream_key, &bad);
  p->opts.upstream_ca = p->upstream_ca;
  p->opts.upstream_cert = p->upstream_cert;
  p->opts.upstream_key = p->upstream_key;
  p->opts.upstream.tls_ctx = p->tls_default;
  if (bad) {
    om_errbuf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  return 0;
}

void om__proxy_tls_fini(om_proxy_t *p) {
  om_tls_ctx_unref(p->tls_default);
  p->tls_default = NULL;
  free(p->upstream_ca);
  free(p->upstream_cert);
  free(p->upstream_key);
}

void om__proxy_tls_service_free(om__proxy_service_t *s) {
  if (s->tls == NULL)
    return;
  cfg_clear(&s->tls->cur);
  free(s->tls);
  s->tls = NULL;
}

/* ------------------------------------------------------------------ */
/* a policy's tls table */

static char *str_field(lua_State *L, int t, const char *name) {
  char *v = NULL;
  size_t n;
  lua_pushstring(L, name);
  if (lua_rawget(L, t) == LUA_TSTRING) {
    const char *s = lua_tolstring(L, -1, &n);
    if (n > MAX_PATH_BYTES || strlen(s) != n)
      luaL_error(L, "tls.%s: longer than %d bytes or holds a NUL", name,
                 MAX_PATH_BYTES);
    v = malloc(n + 1);
    if (v == NULL)
      luaL_error(L, "out of memory");
    memcpy(v, s, n + 1);
  }
  lua_pop(L, 1);
  return v;
}

/* Runs protected. [policy, cfg] */
static int read_tls_l(lua_State *L) {
  om_policy_t *pol = lua_touserdata(L, 1);
  tls_cfg_t *c = lua_touserdata(L, 2);
  int t;
  om_policy_push(pol);
  lua_pushstring(L, "tls");
  if (lua_rawget(L, -2) != LUA_TTABLE) /* validated by the contract */
    return 0;
  t = lua_gettop(L);
  c->has = 1;
  lua_pushstring(L, "verify");
  c->verify = lua_rawget(L, t) == LUA_TBOOLEAN ? lua_toboolean(L, -1) : 1;
  lua_pop(L, 1);
  /* each allocation is kept in c as soon as it is made: a later failure
   * leaves them for the caller to free */
  c->ca_file = str_field(L, t, "ca_file");
  c->cert_file = str_field(L, t, "cert_file");
  c->key_file = str_field(L, t, "key_file");
  c->server_name = str_field(L, t, "server_name");
  return 0;
}

static int read_tls(om_policy_t *pol, tls_cfg_t *c, char *err, size_t errlen) {
  om_sandbox_t *sb = om_policy_sandbox(pol);
  lua_State *L = om_sandbox_state(sb);
  int rc;
  lua_settop(L, 0);
  lua_pushcfunction(L, read_tls_l);
  lua_pushlightuserdata(L, pol);
  lua_pushlightuserdata(L, c);
  rc = om_sandbox_call(sb, 2, 0);
  if (rc != LUA_OK)
    om_errbuf(err, errlen, "%s",
              lua_isstring(L, -1) ? lua_tostring(L, -1) : "tls: unreadable");
  lua_settop(L, 0);
  return rc == LUA_OK ? 0 : OM_EINVAL;
}

/* The context of c: its files, each falling back to the proxy's flag. */
static int build(const om_proxy_t *p, tls_cfg_t *c, char *err, size_t errlen) {
  int own_pair = c->cert_file != NULL;
  om_tls_opts_t o = {
      .role = OM_TLS_CLIENT,
      .ca_file = c->ca_file ? c->ca_file : p->opts.upstream_ca,
      .cert_file = own_pair ? c->cert_file : p->opts.upstream_cert,
      .key_file = own_pair ? c->key_file : p->opts.upstream_key,
      .no_verify = !c->verify,
      .ca_label = c->ca_file ? "tls.ca_file" : "--upstream-ca",
      .cert_label = own_pair ? "tls.cert_file" : "--upstream-cert",
      .key_label = own_pair ? "tls.key_file" : "--upstream-key"};
  return om_tls_ctx_new(&o, &c->ctx, err, errlen);
}

int om__proxy_tls_prepare(om__proxy_service_t *s, om_policy_t *next,
                          om__proxy_tls_staged_t *staged) {
  tls_cfg_t *c;
  char err[512] = "";
  int rc;
  memset(staged, 0, sizeof *staged);
  if (s->tls == NULL && (s->tls = calloc(1, sizeof *s->tls)) == NULL)
    return OM_ENOMEM;
  c = calloc(1, sizeof *c);
  if (c == NULL)
    return OM_ENOMEM;
  rc = read_tls(next, c, err, sizeof err);
  if (rc == 0 && c->has && cfg_same(c, &s->tls->cur) && s->tls->cur.ctx) {
    cfg_clear(c); /* the same files: keep the context (and its sessions) */
    free(c);
    staged->keep = 1;
    return 0;
  }
  if (rc == 0 && c->has)
    rc = build(s->proxy, c, err, sizeof err);
  if (rc != 0) {
    snprintf(s->tls->error, sizeof s->tls->error, "%s", err);
    om_log(OM_LOG_ERROR, "proxy_policy_tls_failed", "service", s->name, "path",
           s->policy_path, "error", err, NULL);
    cfg_clear(c);
    free(c);
    return rc == OM_ENOMEM ? OM_ENOMEM : OM_EINVAL;
  }
  staged->cfg = c;
  return 0;
}

void om__proxy_tls_commit(om__proxy_service_t *s,
                          om__proxy_tls_staged_t *staged) {
  tls_cfg_t *c = staged->cfg;
  if (staged->keep || s->tls == NULL)
    return;
  cfg_clear(&s->tls->cur);
  if (c != NULL) {
    s->tls->cur = *c;
    free(c);
  }
  s->tls->error[0] = '\0';
  staged->cfg = NULL;
}

void om__proxy_tls_discard(om__proxy_tls_staged_t *staged) {
  if (staged->cfg != NULL) {
    cfg_clear(staged->cfg);
    free(staged->cfg);
    staged->cfg = NULL;
  }
}

/* ------------------------------------------------------------------ */
/* calls */

void om__proxy_tls_request(const om__proxy_service_t *s,
                           om_upstream_request_t *ur) {
  if (s->tls != NULL && s->tls->cur.has) {
    ur->tls_ctx = s->tls->cur.ctx;
    ur->tls_server_name = s->tls->cur.server_name;
  }
}

void om__proxy_tls_metrics(om_proxy_t *p, om__proxy_service_t *s) {
  static const char help[] =
      "TLS handshakes with upstream peers by result (ok: full, resumed: a "
      "session resumed, else the failure class).";
  char esc[2 * OM_NAME_MAX], labels[600];
  om__proxy_tls_t *t = s->tls;
  if (t == NULL && (t = s->tls = calloc(1, sizeof *s->tls)) == NULL)
    return;
  om_metrics_escape(s->name, esc, sizeof esc);
  snprintf(labels, sizeof labels, "service=\"%s\",result=\"ok\"", esc);
  t->m_ok = om_metrics_counter(
      p->metrics, "openmesh_proxy_tls_handshakes_total", help, labels);
  snprintf(labels, sizeof labels, "service=\"%s\",result=\"resumed\"", esc);
  t->m_resumed = om_metrics_counter(
      p->metrics, "openmesh_proxy_tls_handshakes_total", help, labels);
  for (int f = 1; f < OM_TLS_FAIL__COUNT; f++) {
    snprintf(labels, sizeof labels, "service=\"%s\",result=\"%s\"", esc,
             om_tls_fail_name((om_tls_fail_t)f));
    t->m_fail[f] = om_metrics_counter(
        p->metrics, "openmesh_proxy_tls_handshakes_total", help, labels);
  }
}

void om__proxy_tls_done(om__proxy_service_t *s, om__proxy_peer_t *peer,
                        const om_upstream_result_t *res, uint64_t now) {
  om__proxy_tls_t *t = s->tls;
  uint64_t held;
  char sup[24];
  if (t == NULL || (res->tls_handshake == 0 && res->tls_fail == 0))
    return;
  if (res->tls_handshake != 0) {
    t->handshakes++;
    if (res->tls_handshake == 2) {
      t->resumed++;
      if (t->m_resumed != NULL)
        om_metric_inc(t->m_resumed);
    } else if (t->m_ok != NULL) {
      om_metric_inc(t->m_ok);
    }
    if (peer != NULL)
      peer->tls_error = NULL;
    return;
  }
  t->failures++;
  if (res->tls_fail > 0 && res->tls_fail < OM_TLS_FAIL__COUNT &&
      t->m_fail[res->tls_fail] != NULL)
    om_metric_inc(t->m_fail[res->tls_fail]);
  if (peer != NULL)
    peer->tls_error = res->detail; /* static: the engine's reason */
  if (!om__proxy_log_limit(&t->log, now, &held))
    return;
  snprintf(sup, sizeof sup, "%llu", (unsigned long long)held);
  om_log(OM_LOG_WARN, "proxy_upstream_tls_failed", "service", s->name, "peer",
         peer != NULL ? peer->id : "", "reason", res->detail, "suppressed", sup,
         NULL);
}

void om__proxy_tls_status(const om__proxy_service_t *s, json_t *o) {
  const om__proxy_tls_t *t = s->tls;
  const om_proxy_t *p = s->proxy;
  json_t *tls, *errs = json_object();
  const tls_cfg_t *c;
  if (t == NULL || errs == NULL) {
    json_decref(errs);
    return;
  }
  c = &t->cur;
  for (size_t i = 0; i < s->view->n; i++) {
    const om__proxy_peer_t *peer = s->view->peers[i];
    if (peer->tls_error != NULL)
      json_object_set_new(errs, peer->id, json_string(peer->tls_error));
  }
  tls = json_pack("{s:b, s:s?, s:s?, s:s?, s:b, s:s, s:I, s:I, s:I, s:o}",
                  "policy", c->has, "ca_file",
                  c->ca_file ? c->ca_file : p->opts.upstream_ca, "cert_file",
                  c->cert_file ? c->cert_file : p->opts.upstream_cert,
                  "server_name", c->server_name, "verify",
                  c->has ? c->verify : 1, "error", t->error, "handshakes",
                  (json_int_t)t->handshakes, "resumed", (json_int_t)t->resumed,
                  "failures", (json_int_t)t->failures, "peer_errors", errs);
  if (tls != NULL)
    json_object_set_new(o, "tls", tls);
}

/* ------------------------------------------------------------------ */
/* reload */

static void on_upstream_files_changed(void *ud) {
  char n[24];
  snprintf(n, sizeof n, "%d", om_proxy_reload_tls(ud));
  om_log(OM_LOG_INFO, "proxy_tls_reloaded", "cause", "file_change", "rejected",
         n, NULL);
}

void om__proxy_tls_watch(om_proxy_t *p) {
  const char *files[3] = {p->upstream_ca, p->upstream_cert, p->upstream_key};
  char err[512];
  if (files[0] == NULL && files[1] == NULL && files[2] == NULL)
    return;
  if (om_file_watch_start(p->loop, files, 3, 0, on_upstream_files_changed, p,
                          &p->tls_watch, err, sizeof err) != 0) {
    p->tls_watch = NULL;
    om_log(OM_LOG_WARN, "proxy_tls_watch_failed", "error", err, "reload",
           "on SIGHUP only", NULL);
  }
}

void om__proxy_tls_unwatch(om_proxy_t *p) {
  om_file_watch_close(p->tls_watch);
  p->tls_watch = NULL;
}

int om_proxy_reload_tls(om_proxy_t *p) {
  char err[512];
  int failed = 0;
  if (p == NULL)
    return OM_EINVAL;
  if (p->tls_default != NULL &&
      om_tls_ctx_reload(p->tls_default, err, sizeof err) != 0) {
    failed++;
    om_log(OM_LOG_ERROR, "proxy_tls_reload_failed", "error", err, NULL);
  }
  for (size_t i = 0; i < p->n_services; i++) {
    om__proxy_service_t *s = p->services[i];
    if (s->tls == NULL || s->tls->cur.ctx == NULL)
      continue;
    if (om_tls_ctx_reload(s->tls->cur.ctx, err, sizeof err) != 0) {
      failed++;
      snprintf(s->tls->error, sizeof s->tls->error, "%s", err);
      om_log(OM_LOG_ERROR, "proxy_tls_reload_failed", "service", s->name,
             "error", err, NULL);
    } else {
      s->tls->error[0] = '\0';
    }
  }
  return failed;
}
