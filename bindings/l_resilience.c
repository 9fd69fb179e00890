/*
 * l_resilience.c: the Lua face of the circuit breaker, backoff,
 * Retry-After parsing, retry rules and the retry budget.
 *
 *   local c = om.circuit{failures = 5, cooldown_ms = 30000,
 *                        max_cooldown_ms = 300000, window_ms = 10000,
 *                        min_requests = 20, failure_ratio = 0.5,
 *                        reset_ms = 300000, probe_timeout_ms = 0}
 *   c:allow(now_ms) -> bool      c:peek(now_ms) -> bool
 *   c:record(now_ms, ok) -> state    c:state(now_ms) -> state
 *   c:trips(now_ms) -> n         c:close()
 *     (state: "closed" | "open" | "half_open"; max_cooldown_ms defaults to
 *      max(300000, cooldown_ms); window_ms = 0 turns the ratio rule off,
 *      failures = 0 the consecutive rule)
 *   om.retry_after(value, now_s [, ceiling_ms]) -> ms | nil
 *   om.retry_after_ms(value [, ceiling_ms]) -> ms | nil
 *     (value nil -> nil; ceiling default 60000 ms; results are integers)
 *   om.backoff{attempt = n, base_ms = 100, cap_ms = 10000, random = r} -> ms
 *     (attempt 1 = the first retry, waits up to base_ms; r in [0, 1))
 *   om.retryable{method = "POST", headers = {...}, status = 503 |
 *                error = "timeout"|"connect"|"reset", opt_in = false,
 *                sent = true|false, statuses = {502, 503, 504},
 *                errors = {...}} -> bool, reason
 *     (sent = false: no byte of the request left, with an error only; any
 *     method may go again, reason "not_sent"; absent: as sent = true)
 *   local b = om.retry_budget{ratio = 0.2, window_ms = 10000, min_per_s = 10}
 *   b:request(now_ms)   b:withdraw(now_ms) -> bool   b:balance(now_ms) -> n
 *   b:close()
 *
 * Option tables are checked for unknown fields: a typo ("failure = 3")
 * raises instead of silently leaving the default in force.
 */
#include "om_lua.h"

#include <math.h>
#include <string.h>

#include "om_backoff.h"
#include "om_circuit.h"
#include "om_errno.h"
#include "om_lua_util.h"
#include "om_retry.h"

#define CIRCUIT_MT "openmesh.Circuit"
#define BUDGET_MT "openmesh.RetryBudget"
#define MS_NS UINT64_C(1000000)

/* ---- option-table helpers ---------------------------------------------- */

/* The options table at idx, or defaults when none/nil. */
static int opt_table(lua_State *L, int idx) {
  if (lua_isnoneornil(L, idx))
    return 0;
  luaL_checktype(L, idx, LUA_TTABLE);
  return 1;
}

/* A time argument in ms, finite and >= 0, as whole milliseconds. */
static uint64_t check_whole_ms(lua_State *L, int idx, const char *what) {
  lua_Number ms = luaL_checknumber(L, idx);
  if (!isfinite(ms) || ms < 0) {
    lua_pushfstring(L, "%s must be a finite number >= 0", what);
    luaL_argerror(L, idx, lua_tostring(L, -1));
  }
  if (ms >= 18446744073709549568.0)
    return UINT64_MAX;
  return (uint64_t)ms;
}

static void push_count(lua_State *L, uint64_t ms) {
  lua_pushinteger(L, ms > (uint64_t)LUA_MAXINTEGER ? LUA_MAXINTEGER
                                                   : (lua_Integer)ms);
}

/* ---- circuit --------------------------------------------------------------
 */

typedef struct {
  om_circuit_t *c; /* NULL once closed */
} lcircuit_t;

static om_circuit_t *check_circuit(lua_State *L, int idx) {
  lcircuit_t *u = luaL_checkudata(L, idx, CIRCUIT_MT);
  if (u->c == NULL)
    luaL_argerror(L, idx, "circuit is closed");
  return u->c;
}

static int l_circuit_close(lua_State *L) {
  lcircuit_t *u = luaL_checkudata(L, 1, CIRCUIT_MT);
  om_circuit_free(u->c);
  u->c = NULL;
  return 0;
}

static int l_circuit_new(lua_State *L) {
  static const char *const fields[] = {
      "failures",  "cooldown_ms",      "max_cooldown_ms",
      "window_ms", "min_requests",     "failure_ratio",
      "reset_ms",  "probe_timeout_ms", NULL};
  om_circuit_opts_t o;
  lcircuit_t *u;
  int rc;
  om_circuit_opts_default(&o);
  if (opt_table(L, 1)) {
    om__lua_check_fields(L, 1, fields);
    o.failures =
        (uint32_t)om__lua_field_int(L, 1, "failures", 5, 0, UINT32_MAX);
    o.cooldown_ns = om__lua_field_ms(L, 1, "cooldown_ms", o.cooldown_ns);
    if (o.cooldown_ns == 0)
      om__lua_field_fail(L, 1, "cooldown_ms", "must be > 0");
    if (o.max_cooldown_ns < o.cooldown_ns)
      o.max_cooldown_ns = o.cooldown_ns;
    o.max_cooldown_ns =
        om__lua_field_ms(L, 1, "max_cooldown_ms", o.max_cooldown_ns);
    if (o.max_cooldown_ns < o.cooldown_ns)
      om__lua_field_fail(L, 1, "max_cooldown_ms", "must be >= cooldown_ms");
    o.window_ns = om__lua_field_ms(L, 1, "window_ms", o.window_ns);
    if (o.window_ns != 0 && o.window_ns < MS_NS)
      om__lua_field_fail(L, 1, "window_ms", "must be 0 (off) or >= 1");
    o.min_requests =
        (uint32_t)om__lua_field_int(L, 1, "min_requests", 20, 1, UINT32_MAX);
    o.failure_ratio = om__lua_field_num(L, 1, "failure_ratio", 0.5, 0.0, 1.0);
    if (o.failure_ratio == 0.0)
      om__lua_field_fail(L, 1, "failure_ratio", "must be > 0");
    o.reset_ns = om__lua_field_ms(L, 1, "reset_ms", o.reset_ns);
    o.probe_timeout_ns =
        om__lua_field_ms(L, 1, "probe_timeout_ms", o.probe_timeout_ns);
    if (o.failures == 0 && o.window_ns == 0)
      om__lua_field_fail(L, 1, "failures",
                         "0 (off) needs the ratio rule (window_ms > 0)");
  }
  u = lua_newuserdatauv(L, sizeof *u, 0); /* [circuit] closed */
  u->c = NULL;
  luaL_setmetatable(L, CIRCUIT_MT);
  rc = om_circuit_new(&o, &u->c);
  if (rc != 0)
    return om__lua_fail(L, rc, NULL);
  return 1;
}

static int l_circuit_allow(lua_State *L) {
  om_circuit_t *c = check_circuit(L, 1);
  lua_pushboolean(L, om_circuit_allow(c, om__lua_checkms(L, 2, "now_ms")));
  return 1;
}

static int l_circuit_peek(lua_State *L) {
  om_circuit_t *c = check_circuit(L, 1);
  lua_pushboolean(L, om_circuit_peek(c, om__lua_checkms(L, 2, "now_ms")));
  return 1;
}

static int l_circuit_record(lua_State *L) {
  om_circuit_t *c = check_circuit(L, 1);
  uint64_t now = om__lua_checkms(L, 2, "now_ms");
  luaL_checktype(L, 3, LUA_TBOOLEAN);
  lua_pushstring(
      L, om_circuit_state_name(om_circuit_record(c, now, lua_toboolean(L, 3))));
  return 1;
}

static int l_circuit_state(lua_State *L) {
  om_circuit_t *c = check_circuit(L, 1);
  lua_pushstring(L, om_circuit_state_name(
                        om_circuit_state(c, om__lua_checkms(L, 2, "now_ms"))));
  return 1;
}

static int l_circuit_trips(lua_State *L) {
  om_circuit_t *c = check_circuit(L, 1);
  lua_pushinteger(L, om_circuit_trips(c, om__lua_checkms(L, 2, "now_ms")));
  return 1;
}

static int l_circuit_tostring(lua_State *L) {
  lcircuit_t *u = luaL_checkudata(L, 1, CIRCUIT_MT);
  if (u->c == NULL)
    lua_pushliteral(L, "openmesh.Circuit (closed)");
  else
    lua_pushfstring(L, "openmesh.Circuit (%p)", (void *)u->c);
  return 1;
}

/* ---- backoff and Retry-After ----------------------------------------------
 */

static int l_backoff(lua_State *L) {
  static const char *const fields[] = {"attempt", "base_ms", "cap_ms", "random",
                                       NULL};
  lua_Integer attempt;
  uint64_t base, cap;
  double r;
  luaL_checktype(L, 1, LUA_TTABLE);
  om__lua_check_fields(L, 1, fields);
  if (!om__lua_has_field(L, 1, "attempt"))
    om__lua_field_fail(L, 1, "attempt", "required (1 = the first retry)");
  attempt = om__lua_field_int(L, 1, "attempt", 1, 1, UINT32_MAX);
  base = om__lua_field_ms(L, 1, "base_ms", 100 * MS_NS);
  cap = om__lua_field_ms(L, 1, "cap_ms", 10000 * MS_NS);
  if (!om__lua_has_field(L, 1, "random"))
    om__lua_field_fail(L, 1, "random", "required (a number in [0, 1))");
  r = om__lua_field_num(L, 1, "random", 0.0, 0.0, 1.0);
  if (r >= 1.0)
    om__lua_field_fail(L, 1, "random", "must be in [0, 1)");
  lua_pushnumber(L, om__lua_ns_to_ms(om_backoff_full_jitter_ns(
                        (uint32_t)attempt, base, cap, r)));
  return 1;
}

/* The header value at idx: a string, or NULL for nil (absent). */
static const char *opt_header(lua_State *L, int idx, size_t *len) {
  if (lua_isnoneornil(L, idx))
    return NULL;
  if (lua_type(L, idx) != LUA_TSTRING)
    luaL_typeerror(L, idx, "string or nil");
  return lua_tolstring(L, idx, len);
}

static int l_retry_after(lua_State *L) {
  size_t len = 0;
  const char *v = opt_header(L, 1, &len);
  lua_Number now = luaL_checknumber(L, 2);
  uint64_t ceiling = OM_RETRY_AFTER_DEFAULT_CEILING_MS, ms;
  if (!isfinite(now) || now < 0 || now > 9007199254740992.0)
    luaL_argerror(L, 2, "now_s must be a finite number of epoch seconds >= 0");
  if (!lua_isnoneornil(L, 3))
    ceiling = check_whole_ms(L, 3, "ceiling_ms");
  if (v == NULL ||
      om_retry_after_parse(v, len, (int64_t)floor(now), ceiling, &ms) != 0) {
    lua_pushnil(L);
    return 1;
  }
  push_count(L, ms);
  return 1;
}

static int l_retry_after_ms(lua_State *L) {
  size_t len = 0;
  const char *v = opt_header(L, 1, &len);
  uint64_t ceiling = OM_RETRY_AFTER_DEFAULT_CEILING_MS, ms;
  if (!lua_isnoneornil(L, 2))
    ceiling = check_whole_ms(L, 2, "ceiling_ms");
  if (v == NULL || om_retry_after_ms_parse(v, len, ceiling, &ms) != 0) {
    lua_pushnil(L);
    return 1;
  }
  push_count(L, ms);
  return 1;
}

/* ---- retry rules --------------------------------------------------------- */

static const char *const error_names[] = {"", "connect", "timeout", "reset",
                                          NULL};

static om_retry_error_t error_class(lua_State *L, int idx, const char *field,
                                    int vidx) {
  const char *s;
  if (lua_type(L, vidx) != LUA_TSTRING)
    om__lua_field_fail(L, idx, field,
                       "\"connect\", \"timeout\" or \"reset\" expected");
  s = lua_tostring(L, vidx);
  for (int i = 1; error_names[i] != NULL; i++)
    if (strcmp(s, error_names[i]) == 0)
      return (om_retry_error_t)i;
  lua_pushfstring(L, "unknown error class '%s' (connect, timeout, reset)", s);
  return (om_retry_error_t)om__lua_field_fail(L, idx, field,
                                              lua_tostring(L, -1));
}

/* headers["idempotency-key"], falling back to a case-insensitive match
 * (field names are case-insensitive, RFC 9110 section 5.1). Leaves the
 * value (or nil) on the stack. */
static void idempotency_key(lua_State *L, int idx) {
  int hidx;
  if (lua_getfield(L, idx, "headers") == LUA_TNIL) /* [headers] */
    return;
  if (!lua_istable(L, -1))
    om__lua_field_fail(L, idx, "headers", "table expected");
  hidx = lua_gettop(L);
  if (lua_getfield(L, hidx, "idempotency-key") == LUA_TNIL) { /* [h, v] */
    lua_pop(L, 1);                                            /* [h] */
    lua_pushnil(L);                                           /* [h, nil] */
    while (lua_next(L, hidx) != 0) {                          /* [h, k, v] */
      if (lua_type(L, -2) == LUA_TSTRING) {
        size_t n;
        const char *k = lua_tolstring(L, -2, &n);
        static const char want[] = "idempotency-key";
        int eq = n == sizeof want - 1;
        for (size_t i = 0; eq && i < n; i++) {
          char ch = k[i];
          if (ch >= 'A' && ch <= 'Z')
            ch = (char)(ch - 'A' + 'a');
          eq = ch == want[i];
        }
        if (eq) {
          lua_remove(L, -2); /* [h, v] */
          goto found;
        }
      }
      lua_pop(L, 1); /* [h, k] */
    }
    lua_pushnil(L); /* [h, nil] */
  }
found:
  lua_remove(L, hidx); /* [v] */
  if (!lua_isnil(L, -1) && lua_type(L, -1) != LUA_TSTRING)
    om__lua_field_fail(L, idx, "headers", "'idempotency-key' must be a string");
}

static void statuses_field(lua_State *L, int idx, om_retry_policy_t *p) {
  lua_Integer n;
  if (lua_getfield(L, idx, "statuses") == LUA_TNIL) { /* [list] */
    lua_pop(L, 1);
    return;
  }
  if (!lua_istable(L, -1))
    om__lua_field_fail(L, idx, "statuses", "array of status codes expected");
  memset(p->status_bits, 0, sizeof p->status_bits);
  n = (lua_Integer)lua_rawlen(L, -1);
  for (lua_Integer i = 1; i <= n; i++) {
    int isint;
    lua_Integer st;
    lua_rawgeti(L, -1, i); /* [list, v] */
    st = lua_tointegerx(L, -1, &isint);
    if (!isint || st < 100 || st > 599)
      om__lua_field_fail(L, idx, "statuses",
                         "entries must be integers in [100, 599]");
    om_retry_policy_set_status(p, (int)st, true);
    lua_pop(L, 1); /* [list] */
  }
  lua_pop(L, 1);
}

static void errors_field(lua_State *L, int idx, om_retry_policy_t *p) {
  lua_Integer n;
  if (lua_getfield(L, idx, "errors") == LUA_TNIL) { /* [list] */
    lua_pop(L, 1);
    return;
  }
  if (!lua_istable(L, -1))
    om__lua_field_fail(L, idx, "errors", "array of error classes expected");
  p->error_bits = 0;
  n = (lua_Integer)lua_rawlen(L, -1);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, -1, i); /* [list, v] */
    p->error_bits |= OM_RETRY_ERR_BIT(error_class(L, idx, "errors", -1));
    lua_pop(L, 1); /* [list] */
  }
  lua_pop(L, 1);
}

static int l_retryable(lua_State *L) {
  static const char *const fields[] = {"method", "headers", "status",
                                       "error",  "opt_in",  "statuses",
                                       "errors", "sent",    NULL};
  om_retry_req_t req;
  om_retry_policy_t policy;
  om_retry_reason_t why;
  bool ok;
  luaL_checktype(L, 1, LUA_TTABLE);
  om__lua_check_fields(L, 1, fields);
  memset(&req, 0, sizeof req);
  om_retry_policy_default(&policy);
  req.policy = &policy;

  if (lua_getfield(L, 1, "method") != LUA_TSTRING) /* [method] */
    om__lua_field_fail(L, 1, "method", "string expected");
  req.method = lua_tolstring(L, -1, &req.method_len); /* kept on the stack */

  idempotency_key(L, 1); /* [method, key|nil] */
  if (lua_isstring(L, -1))
    req.idempotency_key = lua_tolstring(L, -1, &req.idempotency_key_len);

  if (om__lua_has_field(L, 1, "status") && om__lua_has_field(L, 1, "error"))
    om__lua_field_fail(L, 1, "status",
                       "give either 'status' or 'error', not both");
  if (om__lua_has_field(L, 1, "status"))
    req.status = (int)om__lua_field_int(L, 1, "status", 0, 100, 599);
  else if (lua_getfield(L, 1, "error") != LUA_TNIL) { /* [..., error] */
    req.error = error_class(L, 1, "error", -1);
    lua_pop(L, 1);
  } else
    om__lua_field_fail(L, 1, "status", "required (or 'error')");

  if (lua_getfield(L, 1, "opt_in") != LUA_TNIL) { /* [..., opt_in] */
    if (!lua_isboolean(L, -1))
      om__lua_field_fail(L, 1, "opt_in", "boolean expected");
    req.opt_in = lua_toboolean(L, -1);
  }
  lua_pop(L, 1);
  if (lua_getfield(L, 1, "sent") != LUA_TNIL) { /* [..., sent] */
    if (!lua_isboolean(L, -1))
      om__lua_field_fail(L, 1, "sent", "boolean expected");
    if (!lua_toboolean(L, -1) && req.status != 0)
      om__lua_field_fail(L, 1, "sent",
                         "false only with 'error': a status means it was sent");
    req.phase = lua_toboolean(L, -1) ? OM_RETRY_PHASE_POST_SEND
                                     : OM_RETRY_PHASE_PRE_SEND;
  }
  lua_pop(L, 1);
  statuses_field(L, 1, &policy);
  errors_field(L, 1, &policy);

  ok = om_retry_decide(&req, &why);
  lua_pushboolean(L, ok);
  lua_pushstring(L, om_retry_reason_name(why));
  return 2;
}

/* ---- retry budget -------------------------------------------------------- */

typedef struct {
  om_retry_budget_t *b; /* NULL once closed */
} lbudget_t;

static om_retry_budget_t *check_budget(lua_State *L, int idx) {
  lbudget_t *u = luaL_checkudata(L, idx, BUDGET_MT);
  if (u->b == NULL)
    luaL_argerror(L, idx, "retry budget is closed");
  return u->b;
}

static int l_budget_close(lua_State *L) {
  lbudget_t *u = luaL_checkudata(L, 1, BUDGET_MT);
  om_retry_budget_free(u->b);
  u->b = NULL;
  return 0;
}

static int l_budget_new(lua_State *L) {
  static const char *const fields[] = {"ratio", "window_ms", "min_per_s", NULL};
  om_retry_budget_opts_t o;
  lbudget_t *u;
  int rc;
  om_retry_budget_opts_default(&o);
  if (opt_table(L, 1)) {
    om__lua_check_fields(L, 1, fields);
    o.ratio = om__lua_field_num(L, 1, "ratio", o.ratio, 0.0, 100.0);
    o.window_ns = om__lua_field_ms(L, 1, "window_ms", o.window_ns);
    if (o.window_ns < MS_NS || o.window_ns > UINT64_C(3600000) * MS_NS)
      om__lua_field_fail(L, 1, "window_ms", "must be in [1, 3600000]");
    o.min_per_s = om__lua_field_num(L, 1, "min_per_s", o.min_per_s, 0.0, 1e6);
  }
  u = lua_newuserdatauv(L, sizeof *u, 0); /* [budget] closed */
  u->b = NULL;
  luaL_setmetatable(L, BUDGET_MT);
  rc = om_retry_budget_new(&o, &u->b);
  if (rc != 0)
    return om__lua_fail(L, rc, NULL);
  return 1;
}

static int l_budget_request(lua_State *L) {
  om_retry_budget_t *b = check_budget(L, 1);
  om_retry_budget_record_request(b, om__lua_checkms(L, 2, "now_ms"));
  return 0;
}

static int l_budget_withdraw(lua_State *L) {
  om_retry_budget_t *b = check_budget(L, 1);
  lua_pushboolean(
      L, om_retry_budget_try_withdraw(b, om__lua_checkms(L, 2, "now_ms")));
  return 1;
}

static int l_budget_balance(lua_State *L) {
  om_retry_budget_t *b = check_budget(L, 1);
  uint64_t n = om_retry_budget_balance(b, om__lua_checkms(L, 2, "now_ms"));
  push_count(L, n);
  return 1;
}

static int l_budget_tostring(lua_State *L) {
  lbudget_t *u = luaL_checkudata(L, 1, BUDGET_MT);
  if (u->b == NULL)
    lua_pushliteral(L, "openmesh.RetryBudget (closed)");
  else
    lua_pushfstring(L, "openmesh.RetryBudget (%p)", (void *)u->b);
  return 1;
}

void om__lua_open_resilience(lua_State *L) {
  static const luaL_Reg circuit_methods[] = {{"allow", l_circuit_allow},
                                             {"peek", l_circuit_peek},
                                             {"record", l_circuit_record},
                                             {"state", l_circuit_state},
                                             {"trips", l_circuit_trips},
                                             {"close", l_circuit_close},
                                             {NULL, NULL}};
  static const luaL_Reg circuit_meta[] = {{"__gc", l_circuit_close},
                                          {"__close", l_circuit_close},
                                          {"__tostring", l_circuit_tostring},
                                          {NULL, NULL}};
  static const luaL_Reg budget_methods[] = {{"request", l_budget_request},
                                            {"withdraw", l_budget_withdraw},
                                            {"balance", l_budget_balance},
                                            {"close", l_budget_close},
                                            {NULL, NULL}};
  static const luaL_Reg budget_meta[] = {{"__gc", l_budget_close},
                                         {"__close", l_budget_close},
                                         {"__tostring", l_budget_tostring},
                                         {NULL, NULL}};
  static const luaL_Reg funcs[] = {{"circuit", l_circuit_new},
                                   {"backoff", l_backoff},
                                   {"retry_after", l_retry_after},
                                   {"retry_after_ms", l_retry_after_ms},
                                   {"retryable", l_retryable},
                                   {"retry_budget", l_budget_new},
                                   {NULL, NULL}};
  /* [om] */
  om__lua_newclass(L, CIRCUIT_MT, circuit_methods, circuit_meta);
  om__lua_newclass(L, BUDGET_MT, budget_methods, budget_meta);
  luaL_setfuncs(L, funcs, 0); /* [om] */
}
