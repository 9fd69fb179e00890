/*
 * om_egress_cfg.c: one version of the fallback policy as the calls use it
 * (eg_cfg_t, om_egress_internal.h): its routes and settings, each route's
 * target (docs/EGRESS.md "Provider connections"), cooldown state and
 * retry budget carried over a reload for routes that keep their name,
 * and the per-route metric slots. Shared by the calls started under it.
 */
#include <stdlib.h>
#include <string.h>

#include "om_egress_internal.h"
#include "om_errno.h"

static void budget_unref(eg_budget_t *b) {
  if (b == NULL || --b->refs > 0)
    return;
  om_retry_budget_free(b->b);
  free(b);
}

static int budget_same(const om_budget_cfg_t *a, const om_budget_cfg_t *b) {
  return a->unit == b->unit && a->ratio == b->ratio &&
         a->min_per_s == b->min_per_s && a->window_ms == b->window_ms;
}

/* Route i's budget: the one prev gave a route of the same name with the
 * same settings (its balance carries over), else a new one. 0, or
 * OM_ENOMEM. */
static int budget_for(eg_cfg_t *c, size_t i, const eg_cfg_t *prev) {
  const om_route_t *r = &c->routes[i];
  om_retry_budget_opts_t o;
  eg_budget_t *b;
  if (r->budget.unit == OM_BUDGET_NONE)
    return 0;
  for (size_t k = 0; prev != NULL && prev->budget != NULL && k < prev->n; k++)
    if (prev->budget[k] != NULL && strcmp(prev->routes[k].name, r->name) == 0 &&
        budget_same(&prev->budget[k]->cfg, &r->budget)) {
      c->budget[i] = prev->budget[k];
      c->budget[i]->refs++;
      return 0;
    }
  if ((b = calloc(1, sizeof *b)) == NULL)
    return OM_ENOMEM;
  o.ratio = r->budget.ratio;
  o.min_per_s = r->budget.min_per_s;
  o.window_ns = r->budget.window_ms * MS;
  if (om_retry_budget_new(&o, &b->b) != 0) {
    free(b);
    return OM_ENOMEM; /* the contract bounded the options */
  }
  b->refs = 1;
  b->cfg = r->budget;
  snprintf(b->route, sizeof b->route, "%s", r->name);
  c->budget[i] = b;
  return 0;
}

/* Where route r's calls go (docs/EGRESS.md "Provider connections"): its
 * base_url by the mesh's URL rule, the provider call's path under it. */
static int target_for(const om_route_t *r, size_t i, eg_target_t *t, char *err,
                      size_t errlen) {
  om_upstream_url_t u;
  const char *why = "";
  const char *call =
      eg_route_is_anthropic(r) ? "/messages" : "/chat/completions";
  int rc = om_upstream_parse_url(r->base_url, &u, &why);
  if (rc == 0) {
    rc = om_upstream_target_from_url(&t->t, r->base_url, &why);
    t->named = rc == OM_ENOTFOUND;
    if (t->named)
      rc = 0;
  }
  if (rc != 0) {
    snprintf(err, errlen, "field 'routes[%zu].base_url': '%.200s': %s", i + 1,
             r->base_url, why);
    return OM_EPOLICY;
  }
  snprintf(t->host, sizeof t->host, "%s", u.host);
  t->port = u.port;
  t->path = malloc(u.path_prefix_len + strlen(call) + 1);
  if (t->path == NULL)
    return OM_ENOMEM;
  memcpy(t->path, u.path_prefix, u.path_prefix_len);
  strcpy(t->path + u.path_prefix_len, call);
  return 0;
}

static void cfg_arrays_free(eg_cfg_t *c) {
  for (size_t i = 0; c->targets != NULL && i < c->n; i++)
    free(c->targets[i].path);
  free(c->targets);
  free(c->m_attempt_last);
  free(c->state);
  free(c->m_tokens);
  free(c->m_latency);
  free(c->budget);
  free(c->m_cost);
  free(c->m_budget_out);
}

void eg_cfg_unref(eg_cfg_t *cfg) {
  if (cfg == NULL || --cfg->refs > 0)
    return;
  for (size_t i = 0; cfg->budget != NULL && i < cfg->n; i++)
    budget_unref(cfg->budget[i]);
  om_fallback_config_free(cfg->routes, cfg->n, &cfg->s);
  cfg_arrays_free(cfg);
  free(cfg);
}

int eg_cfg_build(om_policy_t *p, const eg_cfg_t *prev, eg_cfg_t **out,
                 char *err, size_t errlen) {
  eg_cfg_t *c = calloc(1, sizeof *c);
  size_t n;
  int rc;
  if (c == NULL)
    return OM_ENOMEM;
  rc = om_fallback_config(p, &c->routes, &c->n, &c->s, err, errlen);
  if (rc != 0) {
    free(c);
    return rc;
  }
  n = c->n ? c->n : 1;
  c->state = calloc(n, sizeof *c->state);
  c->m_tokens = calloc(n, sizeof *c->m_tokens);
  c->m_latency = calloc(n, sizeof *c->m_latency);
  c->budget = calloc(n, sizeof *c->budget);
  c->m_cost = calloc(n, sizeof *c->m_cost);
  c->m_budget_out = calloc(n, sizeof *c->m_budget_out);
  c->targets = calloc(n, sizeof *c->targets);
  c->m_attempt_last = calloc(n, sizeof *c->m_attempt_last);
  rc = c->targets == NULL || c->m_attempt_last == NULL || c->state == NULL ||
               c->m_tokens == NULL || c->m_latency == NULL ||
               c->budget == NULL || c->m_cost == NULL || c->m_budget_out == NULL
           ? OM_ENOMEM
           : 0;
  for (size_t i = 0; rc == 0 && i < c->n; i++)
    rc = target_for(&c->routes[i], i, &c->targets[i], err, errlen);
  c->all_openai = 1;
  for (size_t i = 0; i < c->n; i++)
    if (eg_route_is_anthropic(&c->routes[i]))
      c->all_openai = 0;
  for (size_t i = 0; rc == 0 && i < c->n; i++)
    rc = budget_for(c, i, prev);
  if (rc != 0) {
    for (size_t i = 0; c->budget != NULL && i < c->n; i++)
      budget_unref(c->budget[i]);
    om_fallback_config_free(c->routes, c->n, &c->s);
    cfg_arrays_free(c);
    free(c);
    return rc;
  }
  for (size_t i = 0; prev != NULL && i < c->n; i++)
    for (size_t k = 0; k < prev->n; k++)
      if (strcmp(prev->routes[k].name, c->routes[i].name) == 0)
        c->state[i] = prev->state[k];
  c->refs = 1;
  *out = c;
  return 0;
}
