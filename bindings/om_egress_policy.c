/*
 * om_egress_policy.c: the fallback and egress_heuristics policies, called
 * from C (see om_egress_policy.h).
 *
 * Like the traffic path (om_policy.c), everything that touches the policy's
 * state runs inside one C function called through om_sandbox_call, so an
 * allocation failure, a budget overrun or a policy error ends in a message,
 * never in a panic; values are read with raw accessors only and checked for
 * type before C uses them.
 *
 * What C keeps pointers into (route names for order(), check confidences,
 * holding and handoff lines) is snapshotted into the registry on first use:
 * policy code cannot reach the registry, so a policy that mutates its own
 * table from a check or from order() cannot free a string C still holds or
 * make an index point at another route.
 */
#include "om_egress_policy.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>

#include "om_errno.h"
#include "om_lua.h"

/* Registry keys (their addresses) in the policy's state. */
static const char K_ROUTES, K_CHECKS, K_LINES;

#define MS_MAX 1e12 /* ~31 years: larger values are clamped */

static int rawfield(lua_State *L, int idx, const char *name) {
  idx = lua_absindex(L, idx);
  lua_pushstring(L, name);
  return lua_rawget(L, idx);
}

/* ------------------------------------------------------------------ */
/* Snapshots                                                           */

/* Push registry[K_ROUTES] = {name -> 0-based index, [i] = name},
 * building it from the policy's routes on first use. */
static void push_routes(lua_State *L, om_policy_t *p) {
  int map, routes;
  lua_Unsigned n;
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &K_ROUTES) == LUA_TTABLE)
    return;
  lua_pop(L, 1);
  om_policy_push(p);
  if (rawfield(L, -1, "routes") != LUA_TTABLE)
    luaL_error(L, "field 'routes': array expected");
  routes = lua_absindex(L, -1);
  n = lua_rawlen(L, routes);
  if (n == 0 || n > 1024)
    luaL_error(L, "field 'routes': 1..1024 routes expected");
  lua_createtable(L, (int)n, (int)n);
  map = lua_absindex(L, -1);
  for (lua_Unsigned i = 1; i <= n; i++) {
    if (lua_rawgeti(L, routes, (lua_Integer)i) != LUA_TTABLE ||
        rawfield(L, -1, "name") != LUA_TSTRING || lua_rawlen(L, -1) == 0)
      luaL_error(L, "field 'routes[%d].name': non-empty string expected",
                 (int)i);
    lua_pushvalue(L, -1);
    if (lua_rawget(L, map) != LUA_TNIL)
      luaL_error(L, "field 'routes[%d].name': duplicate route name", (int)i);
    lua_pop(L, 1);
    lua_pushvalue(L, -1);
    lua_pushinteger(L, (lua_Integer)(i - 1));
    lua_rawset(L, map); /* map[name] = i - 1 */
    lua_rawseti(L, map, (lua_Integer)i);
    lua_pop(L, 1);
  }
  lua_pushvalue(L, map);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &K_ROUTES); /* [policy, routes, map] */
  lua_replace(L, -3);
  lua_pop(L, 1); /* [map] */
}

/* Copy the string values of policy[field] (a map) into t[field]. */
static void copy_lines(lua_State *L, int policy, int t, const char *field) {
  lua_newtable(L);
  if (rawfield(L, policy, field) == LUA_TTABLE) {
    lua_pushnil(L);
    while (lua_next(L, -2)) {
      if (lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TSTRING) {
        lua_pushvalue(L, -2);
        lua_insert(L, -2);
        lua_rawset(L, -5);
      } else {
        lua_pop(L, 1);
      }
    }
  }
  lua_pop(L, 1);
  lua_setfield(L, t, field);
}

/* Push registry[K_CHECKS] ({name -> "high"|"low"}) and registry[K_LINES]
 * ({holding_lines, handoff_lines, handoff}), built on first use. */
static void push_heuristics(lua_State *L, om_policy_t *p) {
  int policy, checks, map;
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &K_CHECKS) == LUA_TTABLE) {
    lua_rawgetp(L, LUA_REGISTRYINDEX, &K_LINES);
    return;
  }
  lua_pop(L, 1);
  om_policy_push(p);
  policy = lua_absindex(L, -1);
  lua_newtable(L);
  map = lua_absindex(L, -1);
  if (rawfield(L, policy, "checks") != LUA_TTABLE)
    luaL_error(L, "field 'checks': array expected");
  checks = lua_absindex(L, -1);
  for (lua_Unsigned i = 1, n = lua_rawlen(L, checks); i <= n; i++) {
    if (lua_rawgeti(L, checks, (lua_Integer)i) != LUA_TTABLE ||
        rawfield(L, -1, "name") != LUA_TSTRING ||
        rawfield(L, -2, "confidence") != LUA_TSTRING)
      luaL_error(L, "field 'checks[%d]': name and confidence expected", (int)i);
    lua_rawset(L, map);
    lua_pop(L, 1);
  }
  lua_pop(L, 1); /* [policy, map] */
  lua_newtable(L);
  copy_lines(L, policy, lua_absindex(L, -1), "holding_lines");
  copy_lines(L, policy, lua_absindex(L, -1), "handoff_lines");
  copy_lines(L, policy, lua_absindex(L, -1), "handoff");
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &K_LINES);
  lua_pushvalue(L, map);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &K_CHECKS);
  lua_remove(L, policy); /* [checks map, lines] */
}

/* ------------------------------------------------------------------ */
/* fallback: config                                                    */

typedef struct {
  om_policy_t *p;
  om_route_t *routes;
  size_t n;
  om_fallback_settings_t s;
  int nomem;
} config_t;

static char *copy_str(lua_State *L, config_t *c, int idx) {
  size_t len;
  const char *s = lua_tolstring(L, idx, &len);
  char *d = malloc(len + 1);
  if (d == NULL) {
    c->nomem = 1;
    luaL_error(L, "out of memory");
  }
  memcpy(d, s, len + 1);
  return d;
}

/* A string field: copied, or NULL when absent (required: an error). */
static char *str_field(lua_State *L, config_t *c, int t, const char *name,
                       const char *path, int required) {
  char *d = NULL;
  int type = rawfield(L, t, name);
  if (type == LUA_TSTRING)
    d = copy_str(L, c, -1);
  else if (type != LUA_TNIL || required)
    luaL_error(L, "field '%s%s': string expected", path, name);
  lua_pop(L, 1);
  return d;
}

/* A positive number of milliseconds (rounded up), or def when absent. */
static uint64_t ms_field(lua_State *L, int t, const char *name,
                         const char *path, uint64_t def) {
  uint64_t v = def;
  int type = rawfield(L, t, name);
  if (type == LUA_TNUMBER) {
    lua_Number x = lua_tonumber(L, -1);
    if (!(x > 0))
      luaL_error(L, "field '%s%s': number > 0 expected", path, name);
    v = x >= MS_MAX ? (uint64_t)MS_MAX : (uint64_t)ceil(x);
  } else if (type != LUA_TNIL) {
    luaL_error(L, "field '%s%s': number expected", path, name);
  }
  lua_pop(L, 1);
  return v;
}

/* A number field within [lo, hi], or def when absent. */
static double num_field(lua_State *L, int t, const char *name, const char *path,
                        double lo, double hi, double def) {
  double v = def;
  int type = rawfield(L, t, name);
  if (type == LUA_TNUMBER) {
    v = lua_tonumber(L, -1);
    if (!(v >= lo && v <= hi))
      luaL_error(L, "field '%s%s': number in [%g, %g] expected", path, name, lo,
                 hi);
  } else if (type != LUA_TNIL) {
    luaL_error(L, "field '%s%s': number expected", path, name);
  }
  lua_pop(L, 1);
  return v;
}

/* retry_budget = {unit, ratio, min_per_s, window_ms} at t (absent: *b
 * untouched, so a route inherits the policy's). */
static void read_budget(lua_State *L, int t, const char *path,
                        om_budget_cfg_t *b) {
  static const char *units[] = {"attempts", "tokens", "cost", NULL};
  char p[64];
  int type = rawfield(L, t, "retry_budget"), bt = lua_gettop(L);
  if (type == LUA_TNIL) {
    lua_pop(L, 1);
    return;
  }
  if (type != LUA_TTABLE)
    luaL_error(L, "field '%sretry_budget': table expected", path);
  snprintf(p, sizeof p, "%sretry_budget.", path);
  if (rawfield(L, bt, "unit") != LUA_TSTRING)
    luaL_error(L,
               "field '%sunit': \"attempts\", \"tokens\" or \"cost\" "
               "expected",
               p);
  b->unit = OM_BUDGET_NONE;
  for (int i = 0; units[i] != NULL; i++)
    if (strcmp(lua_tostring(L, -1), units[i]) == 0)
      b->unit = (om_budget_unit_t)(i + 1);
  if (b->unit == OM_BUDGET_NONE)
    luaL_error(L,
               "field '%sunit': \"attempts\", \"tokens\" or \"cost\" "
               "expected",
               p);
  lua_pop(L, 1);
  b->ratio = num_field(L, bt, "ratio", p, 0, 100, 0.2);
  b->min_per_s = num_field(L, bt, "min_per_s", p, 0, 1e6, 10);
  b->window_ms =
      (uint64_t)ceil(num_field(L, bt, "window_ms", p, 1, 3600000, 10000));
  lua_pop(L, 1);
}

/* prices[model] = {input, output, cached_input} into every route of that
 * model. [..., prices] at t. */
static void read_prices(lua_State *L, config_t *c, int t) {
  for (size_t i = 0; i < c->n; i++) {
    om_route_t *r = &c->routes[i];
    char p[160];
    int pt;
    if (rawfield(L, t, r->model) != LUA_TTABLE) {
      lua_pop(L, 1);
      continue;
    }
    pt = lua_gettop(L);
    snprintf(p, sizeof p, "prices.%.140s.", r->model);
    r->price.has = 1;
    r->price.input = num_field(L, pt, "input", p, 0, 1e6, 0);
    r->price.output = num_field(L, pt, "output", p, 0, 1e6, 0);
    r->price.cached_input =
        num_field(L, pt, "cached_input", p, 0, 1e6, r->price.input);
    lua_pop(L, 1);
  }
}

/* models = {ALIAS = {"route", ...}}: each alias's chain as route
 * indices (the contract checked the names; re-checked here, as a policy
 * may mutate its table). [names, policy, ...] */
static void read_models(lua_State *L, config_t *c, int t) {
  size_t n = 0;
  lua_pushnil(L);
  while (lua_next(L, t) != 0) {
    n++;
    lua_pop(L, 1);
  }
  if (n == 0)
    return;
  c->s.models = calloc(n, sizeof *c->s.models);
  if (c->s.models == NULL) {
    c->nomem = 1;
    luaL_error(L, "out of memory");
  }
  lua_pushnil(L);
  while (lua_next(L, t) != 0) { /* [..., alias, chain] */
    om_model_alias_t *a = &c->s.models[c->s.n_models];
    lua_Unsigned len = 0;
    if (c->s.n_models == n || lua_type(L, -2) != LUA_TSTRING ||
        lua_type(L, -1) != LUA_TTABLE || (len = lua_rawlen(L, -1)) == 0 ||
        len > 1024)
      luaL_error(L, "field 'models': a table of alias = {route names}");
    c->s.n_models++;
    a->name = copy_str(L, c, -2);
    a->routes = calloc((size_t)len, sizeof *a->routes);
    if (a->routes == NULL) {
      c->nomem = 1;
      luaL_error(L, "out of memory");
    }
    for (lua_Unsigned i = 1; i <= len; i++) {
      if (lua_rawgeti(L, -1, (lua_Integer)i) != LUA_TSTRING ||
          lua_rawget(L, 1) != LUA_TNUMBER)
        luaL_error(L, "field 'models.%s[%d]': unknown route", a->name, (int)i);
      a->routes[a->n++] = (uint32_t)lua_tointeger(L, -1);
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
}

static int read_config(lua_State *L) {
  config_t *c = lua_touserdata(L, 1);
  int policy, routes, gate;
  lua_Unsigned n;
  lua_settop(L, 0);
  push_routes(L, c->p); /* [names] */
  om_policy_push(c->p); /* [names, policy] */
  policy = 2;
  rawfield(L, policy, "routes");
  routes = 3;
  n = lua_rawlen(L, routes);
  if (n != lua_rawlen(L, 1))
    return luaL_error(L, "field 'routes': changed since the policy loaded");
  c->routes = calloc((size_t)n, sizeof *c->routes);
  if (c->routes == NULL) {
    c->nomem = 1;
    return luaL_error(L, "out of memory");
  }
  read_budget(L, policy, "", &c->s.budget);
  for (lua_Unsigned i = 1; i <= n; i++) {
    om_route_t *r = &c->routes[c->n];
    char path[48];
    snprintf(path, sizeof path, "routes[%d].", (int)i);
    if (lua_rawgeti(L, routes, (lua_Integer)i) != LUA_TTABLE)
      return luaL_error(L, "field 'routes[%d]': table expected", (int)i);
    c->n++;
    r->name = str_field(L, c, -1, "name", path, 1);
    lua_rawgeti(L, 1, (lua_Integer)i);
    if (strcmp(r->name, lua_tostring(L, -1)) != 0)
      return luaL_error(L, "field '%sname': changed since the policy loaded",
                        path);
    lua_pop(L, 1);
    r->provider = str_field(L, c, -1, "provider", path, 1);
    r->base_url = str_field(L, c, -1, "base_url", path, 1);
    r->model = str_field(L, c, -1, "model", path, 1);
    r->api_key_env = str_field(L, c, -1, "api_key_env", path, 0);
    r->attempt_timeout_ms = ms_field(L, -1, "attempt_timeout_ms", path, 30000);
    r->first_byte_timeout_ms =
        ms_field(L, -1, "first_byte_timeout_ms", path, 10000);
    r->context_tokens = ms_field(L, -1, "context_tokens", path, 0);
    r->budget = c->s.budget;
    read_budget(L, lua_gettop(L), path, &r->budget);
    lua_pop(L, 1);
  }
  if (rawfield(L, policy, "prices") == LUA_TTABLE)
    read_prices(L, c, lua_gettop(L));
  lua_pop(L, 1);
  for (size_t i = 0; i < c->n; i++)
    if (c->routes[i].budget.unit == OM_BUDGET_COST && !c->routes[i].price.has)
      return luaL_error(L,
                        "field 'routes[%d].retry_budget.unit': \"cost\" "
                        "needs prices[\"%s\"]",
                        (int)i + 1, c->routes[i].model);
  {
    uint64_t attempts = ms_field(L, policy, "max_attempts", "", 3);
    c->s.max_attempts = attempts > 1000 ? 1000 : (uint32_t)attempts;
  }
  c->s.per_wait_ceiling_ms =
      ms_field(L, policy, "per_wait_ceiling_ms", "", 8000);
  c->s.deadline_ms = ms_field(L, policy, "deadline_ms", "", 60000);
  c->s.backoff_base_ms = ms_field(L, policy, "backoff_base_ms", "", 500);
  c->s.backoff_cap_ms = ms_field(L, policy, "backoff_cap_ms", "", 8000);
  c->s.pending_retry_interval_ms =
      ms_field(L, policy, "pending_retry_interval_ms", "", 60000);
  c->s.pending_max_age_ms =
      ms_field(L, policy, "pending_max_age_ms", "", 3600000);
  c->s.commitment_ms = ms_field(L, policy, "commitment_ms", "", 120000);
  {
    uint64_t failures = ms_field(L, policy, "cooldown_after_failures", "", 3);
    c->s.cooldown_after_failures =
        failures > UINT32_MAX ? UINT32_MAX : (uint32_t)failures;
  }
  c->s.cooldown_ms = ms_field(L, policy, "cooldown_ms", "", 2000);
  c->s.cooldown_max_ms = ms_field(L, policy, "cooldown_max_ms", "", 60000);
  /* the contract refuses a cap below the period; a policy that mutated its
   * own table since gets the period as its cap rather than a shorter one */
  if (c->s.cooldown_max_ms < c->s.cooldown_ms)
    c->s.cooldown_max_ms = c->s.cooldown_ms;
  c->s.judge_timeout_ms = 2000;
  c->s.has_order = rawfield(L, policy, "order") == LUA_TFUNCTION;
  lua_pop(L, 1);
  gate = rawfield(L, policy, "quality_gate");
  if (gate == LUA_TTABLE) {
    int g = lua_gettop(L);
    lua_Unsigned na;
    c->s.judge_route = str_field(L, c, g, "judge_route", "quality_gate.", 1);
    lua_pushstring(L, c->s.judge_route);
    if (lua_rawget(L, 1) != LUA_TNUMBER)
      return luaL_error(L, "field 'quality_gate.judge_route': unknown route");
    lua_pop(L, 1);
    c->s.judge_timeout_ms =
        ms_field(L, g, "judge_timeout_ms", "quality_gate.", 2000);
    if (rawfield(L, g, "agents") == LUA_TTABLE &&
        (na = lua_rawlen(L, -1)) > 0) {
      c->s.gate_agents = calloc((size_t)na, sizeof *c->s.gate_agents);
      if (c->s.gate_agents == NULL) {
        c->nomem = 1;
        return luaL_error(L, "out of memory");
      }
      for (lua_Unsigned i = 1; i <= na; i++) {
        if (lua_rawgeti(L, -1, (lua_Integer)i) != LUA_TSTRING)
          return luaL_error(
              L, "field 'quality_gate.agents[%d]': string expected", (int)i);
        c->s.gate_agents[c->s.n_gate_agents++] = copy_str(L, c, -1);
        lua_pop(L, 1);
      }
    }
  } else if (gate != LUA_TNIL) {
    return luaL_error(L, "field 'quality_gate': table expected");
  }
  lua_settop(L, policy);
  if (rawfield(L, policy, "models") == LUA_TTABLE)
    read_models(L, c, lua_gettop(L));
  lua_settop(L, 0);
  return 0;
}

int om_fallback_config(om_policy_t *p, om_route_t **routes, size_t *n,
                       om_fallback_settings_t *s, char *err, size_t errlen) {
  lua_State *L;
  config_t c;
  om_errbuf(err, errlen, "%s", "");
  if (p == NULL || routes == NULL || n == NULL || s == NULL ||
      om_policy_kind(p) != OM_POLICY_FALLBACK) {
    om_errbuf(err, errlen, "invalid arguments (a fallback policy expected)");
    return OM_EINVAL;
  }
  memset(&c, 0, sizeof c);
  c.p = p;
  L = om_sandbox_state(om_policy_sandbox(p));
  lua_settop(L, 0);
  lua_pushcfunction(L, read_config);
  lua_pushlightuserdata(L, &c);
  if (om_sandbox_call(om_policy_sandbox(p), 1, 0) != LUA_OK) {
    int rc = c.nomem ? OM_ENOMEM : OM_EPOLICY;
    om_lua_errmsg(L, err, errlen, "");
    lua_settop(L, 0);
    om_fallback_config_free(c.routes, c.n, &c.s);
    return rc;
  }
  *routes = c.routes;
  *n = c.n;
  *s = c.s;
  return 0;
}

void om_fallback_config_free(om_route_t *routes, size_t n,
                             om_fallback_settings_t *s) {
  for (size_t i = 0; routes != NULL && i < n; i++) {
    free(routes[i].name);
    free(routes[i].provider);
    free(routes[i].base_url);
    free(routes[i].model);
    free(routes[i].api_key_env);
  }
  free(routes);
  if (s != NULL) {
    for (size_t i = 0; i < s->n_gate_agents; i++)
      free(s->gate_agents[i]);
    free(s->gate_agents);
    free(s->judge_route);
    for (size_t i = 0; i < s->n_models; i++) {
      free(s->models[i].name);
      free(s->models[i].routes);
    }
    free(s->models);
    memset(s, 0, sizeof *s);
  }
}

int om_fallback_gate_enabled(const om_fallback_settings_t *s,
                             const char *agent) {
  if (s == NULL || agent == NULL || s->judge_route == NULL)
    return 0;
  for (size_t i = 0; i < s->n_gate_agents; i++)
    if (strcmp(s->gate_agents[i], agent) == 0)
      return 1;
  return 0;
}

/* ------------------------------------------------------------------ */
/* fallback: order                                                     */

typedef struct {
  om_policy_t *p;
  const om_fallback_ctx_t *ctx;
} order_arg_t;

static void set_str(lua_State *L, int t, const char *name, const char *v) {
  if (v == NULL)
    return;
  lua_pushstring(L, v);
  lua_setfield(L, t, name);
}

/* contract.order(policy, ctx): leaves [routes map, names | nil, msg]. */
static int call_order(lua_State *L) {
  const order_arg_t *a = lua_touserdata(L, 1);
  const om_fallback_ctx_t *ctx = a->ctx;
  int t;
  lua_settop(L, 0);
  push_routes(L, a->p);                         /* [map] */
  om_policy_push_contract(a->p);                /* [map, contract] */
  if (rawfield(L, 2, "order") != LUA_TFUNCTION) /* [map, contract, order] */
    return luaL_error(L, "openmesh.contract has no order()");
  lua_remove(L, 2);
  om_policy_push(a->p); /* [map, order, policy] */
  lua_createtable(L, 0, 5);
  t = lua_gettop(L);
  set_str(L, t, "agent", ctx->agent);
  set_str(L, t, "context", ctx->context);
  set_str(L, t, "channel", ctx->channel);
  set_str(L, t, "model", ctx->model);
  lua_createtable(L, (int)ctx->n_failed, 0);
  for (size_t i = 0; i < ctx->n_failed; i++) {
    const om_failed_attempt_t *f = &ctx->failed[i];
    lua_createtable(L, 0, 3);
    set_str(L, t + 2, "route", f->route);
    if (f->status > 0) {
      lua_pushinteger(L, f->status);
      lua_setfield(L, t + 2, "status");
    }
    set_str(L, t + 2, "class", f->class_name);
    lua_rawseti(L, t + 1, (lua_Integer)i + 1);
  }
  lua_setfield(L, t, "failed");
  lua_call(L, 2, 2); /* [map, names | nil, msg] */
  return 3;
}

int om_fallback_order(om_policy_t *p, const om_fallback_ctx_t *ctx,
                      uint32_t *order, size_t *n, char *err, size_t errlen) {
  lua_State *L;
  order_arg_t a = {p, ctx};
  lua_Unsigned len;
  om_errbuf(err, errlen, "%s", "");
  if (p == NULL || ctx == NULL || order == NULL || n == NULL ||
      (ctx->n_failed > 0 && ctx->failed == NULL) ||
      om_policy_kind(p) != OM_POLICY_FALLBACK) {
    om_errbuf(err, errlen, "invalid arguments (a fallback policy expected)");
    return OM_EINVAL;
  }
  L = om_sandbox_state(om_policy_sandbox(p));
  lua_settop(L, 0);
  lua_pushcfunction(L, call_order);
  lua_pushlightuserdata(L, &a);
  if (om_sandbox_call(om_policy_sandbox(p), 1, 3) != LUA_OK) {
    om_lua_errmsg(L, err, errlen, "order: ");
    lua_settop(L, 0);
    return OM_EPOLICY;
  }
  /* [map, names | nil, msg]: contract.order already checked the names
   * against the current routes; check them against the snapshot. */
  if (lua_type(L, 2) != LUA_TTABLE) {
    if (lua_type(L, 3) == LUA_TSTRING)
      om_lua_errmsg(L, err, errlen, "");
    else
      om_errbuf(err, errlen, "order returned no answer");
    lua_settop(L, 0);
    return OM_EPOLICY;
  }
  len = lua_rawlen(L, 2);
  if (len > lua_rawlen(L, 1) || len > *n) {
    int rc = len > lua_rawlen(L, 1) ? OM_EPOLICY : OM_EINVAL;
    om_errbuf(err, errlen, "order returned %llu routes, more than %s",
              (unsigned long long)len,
              rc == OM_EPOLICY ? "the policy has" : "order[] holds");
    lua_settop(L, 0);
    return rc;
  }
  for (lua_Unsigned i = 1; i <= len; i++) {
    lua_Integer idx;
    int isnum = 0;
    if (lua_rawgeti(L, 2, (lua_Integer)i) != LUA_TSTRING) {
      om_errbuf(err, errlen, "order returned a non-name at [%llu]",
                (unsigned long long)i);
      lua_settop(L, 0);
      return OM_EPOLICY;
    }
    lua_rawget(L, 1); /* map[name]; a string key, no allocation */
    idx = lua_tointegerx(L, -1, &isnum);
    lua_pop(L, 1);
    if (!isnum || idx < 0) {
      om_errbuf(err, errlen, "order returned a route unknown at load");
      lua_settop(L, 0);
      return OM_EPOLICY;
    }
    order[i - 1] = (uint32_t)idx;
  }
  lua_settop(L, 0);
  *n = (size_t)len;
  return 0;
}

/* ------------------------------------------------------------------ */
/* egress_heuristics                                                   */

typedef struct {
  om_policy_t *p;
  const om_heuristics_input_t *in;
} run_arg_t;

/* contract.evaluate(policy, text, ctx): [checks map, lines, result|nil,
 * msg]. */
static int call_evaluate(lua_State *L) {
  const run_arg_t *a = lua_touserdata(L, 1);
  const om_heuristics_input_t *in = a->in;
  int t;
  lua_settop(L, 0);
  push_heuristics(L, a->p);      /* [checks, lines] */
  om_policy_push_contract(a->p); /* [checks, lines, contract] */
  if (rawfield(L, 3, "evaluate") != LUA_TFUNCTION)
    return luaL_error(L, "openmesh.contract has no evaluate()");
  lua_remove(L, 3);
  om_policy_push(a->p);
  lua_pushlstring(L, in->text, in->len);
  lua_createtable(L, 0, 6);
  t = lua_gettop(L);
  set_str(L, t, "agent", in->agent);
  set_str(L, t, "channel", in->channel);
  lua_pushliteral(L, "interactive");
  lua_setfield(L, t, "context");
  lua_newtable(L);
  lua_setfield(L, t, "failed");
  if (in->system_prompt != NULL) {
    lua_pushlstring(L, in->system_prompt, in->system_prompt_len);
    lua_setfield(L, t, "system_prompt");
  }
  if (in->question != NULL) {
    lua_pushlstring(L, in->question, in->question_len);
    lua_setfield(L, t, "question");
  }
  lua_call(L, 3, 2); /* [checks, lines, result | nil, msg] */
  return 4;
}

int om_heuristics_run_overall(om_policy_t *p, const om_heuristics_input_t *in,
                              om_heuristic_flag_t *flags, size_t max, size_t *n,
                              int *overall, char *err, size_t errlen) {
  lua_State *L;
  om_heuristics_input_t local;
  run_arg_t a = {p, NULL};
  lua_Unsigned len;
  size_t stored = 0;
  int verdict = 0;
  om_errbuf(err, errlen, "%s", "");
  if (p == NULL || in == NULL || (in->text == NULL && in->len > 0) ||
      (flags == NULL && max > 0) || n == NULL ||
      (in->system_prompt == NULL && in->system_prompt_len > 0) ||
      (in->question == NULL && in->question_len > 0) ||
      om_policy_kind(p) != OM_POLICY_EGRESS_HEURISTICS) {
    om_errbuf(err, errlen,
              "invalid arguments (an egress_heuristics policy expected)");
    return OM_EINVAL;
  }
  local = *in;
  if (local.text == NULL)
    local.text = "";
  a.in = &local;
  L = om_sandbox_state(om_policy_sandbox(p));
  lua_settop(L, 0);
  lua_pushcfunction(L, call_evaluate);
  lua_pushlightuserdata(L, &a);
  if (om_sandbox_call(om_policy_sandbox(p), 1, 4) != LUA_OK) {
    om_lua_errmsg(L, err, errlen, "heuristics: ");
    lua_settop(L, 0);
    return OM_EPOLICY;
  }
  /* [checks, lines, result | nil, msg] */
  if (lua_type(L, 3) != LUA_TTABLE) {
    if (lua_type(L, 4) == LUA_TSTRING)
      om_lua_errmsg(L, err, errlen, "heuristics: ");
    else
      om_errbuf(err, errlen, "heuristics: evaluate returned no result");
    lua_settop(L, 0);
    return OM_EPOLICY;
  }
  if (rawfield(L, 3, "checks") != LUA_TTABLE) { /* [.., checks names] */
    om_errbuf(err, errlen, "heuristics: evaluate returned no checks");
    lua_settop(L, 0);
    return OM_EPOLICY;
  }
  len = lua_rawlen(L, 5);
  for (lua_Unsigned i = 1; i <= len; i++) {
    const char *conf;
    om_flag_confidence_t c;
    if (lua_rawgeti(L, 5, (lua_Integer)i) != LUA_TSTRING) {
      om_errbuf(err, errlen, "heuristics: a matched check has no name");
      lua_settop(L, 0);
      return OM_EPOLICY;
    }
    lua_pushvalue(L, -1);
    lua_rawget(L, 1); /* [.., name, confidence] */
    conf = lua_tostring(L, -1);
    if (conf == NULL) {
      om_errbuf(err, errlen, "heuristics: check '%s' is unknown",
                lua_tostring(L, -2));
      lua_settop(L, 0);
      return OM_EPOLICY;
    }
    c = strcmp(conf, "high") == 0 ? OM_FLAG_HIGH : OM_FLAG_LOW;
    if ((int)c > verdict)
      verdict = (int)c;
    if (stored < max) {
      /* the name stays alive in the result table left on the stack */
      flags[stored].name = lua_tostring(L, -2);
      flags[stored].confidence = c;
      stored++;
    }
    lua_pop(L, 2);
  }
  lua_settop(L, 5); /* keep the result until the next call */
  *n = stored;
  if (overall != NULL)
    *overall = verdict;
  return 0;
}

int om_heuristics_run(om_policy_t *p, const om_heuristics_input_t *in,
                      om_heuristic_flag_t *flags, size_t max, size_t *n,
                      char *err, size_t errlen) {
  return om_heuristics_run_overall(p, in, flags, max, n, NULL, err, errlen);
}

typedef struct {
  om_policy_t *p;
  const char *table, *key;
  const char *out;
} line_arg_t;

static int call_line(lua_State *L) {
  line_arg_t *a = lua_touserdata(L, 1);
  lua_settop(L, 0);
  push_heuristics(L, a->p); /* [checks, lines] */
  if (rawfield(L, 2, a->table) != LUA_TTABLE)
    return 0;
  if (a->key != NULL) {
    lua_pushstring(L, a->key);
    if (lua_rawget(L, 3) == LUA_TSTRING) {
      a->out = lua_tostring(L, -1); /* alive in the registry snapshot */
      return 0;
    }
    lua_pop(L, 1);
  }
  if (strcmp(a->table, "handoff") != 0 &&
      rawfield(L, 3, "default") == LUA_TSTRING)
    a->out = lua_tostring(L, -1);
  return 0;
}

static const char *line(om_policy_t *p, const char *table, const char *key) {
  line_arg_t a = {p, table, key, NULL};
  lua_State *L;
  if (p == NULL || om_policy_kind(p) != OM_POLICY_EGRESS_HEURISTICS)
    return NULL;
  L = om_sandbox_state(om_policy_sandbox(p));
  lua_settop(L, 0);
  lua_pushcfunction(L, call_line);
  lua_pushlightuserdata(L, &a);
  if (om_sandbox_call(om_policy_sandbox(p), 1, 0) != LUA_OK)
    a.out = NULL;
  lua_settop(L, 0);
  return a.out;
}

const char *om_heuristics_holding_line(om_policy_t *p, const char *channel) {
  return line(p, "holding_lines", channel);
}

const char *om_heuristics_handoff(om_policy_t *p, const char *channel) {
  return line(p, "handoff_lines", channel);
}

const char *om_heuristics_handoff_target(om_policy_t *p, const char *agent) {
  return line(p, "handoff", agent);
}

/* ------------------------------------------------------------------ */
/* Sanitizing                                                          */

/* The first occurrence of tag in s[from, len), or len. */
static size_t find_tag(const char *s, size_t len, size_t from,
                       const char *tag) {
  size_t tl = strlen(tag);
  for (size_t i = from; i + tl <= len; i++) {
    const char *lt = memchr(s + i, '<', len - i);
    if (lt == NULL)
      return len;
    i = (size_t)(lt - s);
    if (i + tl <= len && memcmp(s + i, tag, tl) == 0)
      return i;
  }
  return len;
}

static int is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

int om_heuristics_sanitize(om_policy_t *p, const char *text, size_t len,
                           char **out, size_t *out_len) {
  /* opening tags, then the closing tag of each */
  static const char *const tags[] = {"<thinking>", "<think>", "</thinking>",
                                     "</think>"};
  char *d;
  size_t w = 0, i = 0, a, b;
  (void)p;
  if ((text == NULL && len > 0) || out == NULL || out_len == NULL)
    return OM_EINVAL;
  d = malloc(len + 1);
  if (d == NULL)
    return OM_ENOMEM;
  while (i < len) {
    size_t at = len, which = 0;
    for (size_t k = 0; k < 4; k++) {
      size_t t = find_tag(text, len, i, tags[k]);
      if (t < at) {
        at = t;
        which = k;
      }
    }
    memcpy(d + w, text + i, at - i);
    w += at - i;
    if (at == len)
      break;
    if (which >= 2) { /* a stray closing tag: its opening was cut off */
      i = at + strlen(tags[which]);
    } else { /* the block through its closing tag, or to the end */
      size_t end = find_tag(text, len, at, tags[which + 2]);
      i = end == len ? len : end + strlen(tags[which + 2]);
    }
  }
  /* trim what the removal left at both ends */
  a = 0;
  b = w;
  while (a < b && is_space(d[a]))
    a++;
  while (b > a && is_space(d[b - 1]))
    b--;
  memmove(d, d + a, b - a);
  d[b - a] = '\0';
  *out = d;
  *out_len = b - a;
  return 0;
}
