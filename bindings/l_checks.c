/*
 * l_checks.c: the checks on a policy's answers, for Lua (module `openmesh`,
 * table `checks`). openmesh.contract calls these, so examples,
 * openmesh.testing and the proxy (which calls om_policy_check.c directly)
 * judge an answer by the same code and in the same words.
 *
 *   om.checks.subset(result, peers) -> nil | "subset returned ..."
 *     result must be an array of the very tables of peers, each at most
 *     once
 *   om.checks.key(value) -> nil | "key returned ..."  (string or nil)
 *   om.checks.authorize(ok, reason) -> true | false, reason | nil,
 *     "authorize returned ..."  (true alone, or false and an optional
 *     reason of printable ASCII; reason "" when none)
 *   om.checks.decision(value) -> nil | "decide returned ..."  (nil, or a
 *     table of per-request settings and header edits; om_policy_check.c)
 *   om.checks.order(names, routes) -> nil | "order returned ..."
 *     names must be a non-empty array of names in routes (an array of
 *     route names), each at most once
 *   om.checks.vary_view(vary, req) -> the request as a policy that
 *     declares vary (an array of header names, ":method", ":path",
 *     ":identity") sees
 *     it: the service and the declared fields; reading anything else
 *     raises, naming the field
 *   om.checks.pattern(p) -> nil | stock Lua's message for a pattern the
 *     budgeted matcher would refuse on some subject (om_lpattern.c)
 *   om.checks.pattern_prefix(p) -> the literal every match of p starts
 *     with ("" when none)
 *
 * All of them are sandbox-safe: the memory they use is the caller state's
 * and bounded by their arguments.
 */
#include "om_lua.h"

#include <string.h>

#include "om_errno.h"
#include "om_lpattern.h"
#include "om_policy_check.h"

static int l_subset(lua_State *L) {
  char err[512];
  lua_Unsigned n;
  size_t slots, n_out = 0;
  om__peer_map_t map;
  uint32_t *seen, *out;
  char *mem;
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_settop(L, 2);
  n = lua_rawlen(L, 2);
  luaL_argcheck(L, n <= UINT32_MAX / 4, 2, "too many peers");
  slots = om__peer_map_slots((size_t)n);
  /* one block, owned by the state (collected after the call): the map's
   * keys, then its indexes, the marks and the scratch answer */
  mem = lua_newuserdatauv(L,
                          slots * (sizeof(void *) + sizeof(uint32_t)) +
                              2 * ((size_t)n + 1) * sizeof(uint32_t),
                          0);
  memset(mem, 0,
         slots * sizeof(void *) + slots * sizeof(uint32_t) +
             ((size_t)n + 1) * sizeof(uint32_t));
  map.keys = (const void **)mem;
  map.index = (uint32_t *)(mem + slots * sizeof(void *));
  map.mask = slots - 1;
  seen = map.index + slots;
  out = seen + n + 1;
  for (lua_Unsigned i = 1; i <= n; i++) {
    if (lua_rawgeti(L, 2, (lua_Integer)i) == LUA_TTABLE)
      om__peer_map_put(&map, lua_topointer(L, -1), (uint32_t)(i - 1));
    lua_pop(L, 1);
  }
  if (om__policy_check_subset(L, 1, &map, (size_t)n, seen, 2, out, &n_out, err,
                              sizeof err) == 0)
    return 0;
  lua_pushstring(L, err);
  return 1;
}

static int l_key(lua_State *L) {
  char err[512];
  luaL_checkany(L, 1);
  if (om__policy_check_key(L, 1, err, sizeof err) == 0)
    return 0;
  lua_pushstring(L, err);
  return 1;
}

static int l_order(lua_State *L) {
  luaL_checkany(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_settop(L, 2);
  return om__policy_check_order(L, 1, 2) == 0 ? 0 : 1;
}

static int l_vary_view(lua_State *L) {
  int method = 0, path = 0, out, headers, seen, declared;
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_settop(L, 2);
  lua_createtable(L, 0, 5); /* [vary, req, out] */
  out = lua_gettop(L);
  lua_getfield(L, 2, "service");
  lua_setfield(L, out, "service");
  lua_newtable(L); /* [.., out, headers] */
  headers = lua_gettop(L);
  if (lua_getfield(L, 2, "headers") == LUA_TNIL) { /* [.., seen] */
    lua_pop(L, 1);
    lua_newtable(L);
  }
  seen = lua_gettop(L);
  lua_newtable(L); /* [.., out, headers, seen, declared] */
  declared = lua_gettop(L);
  for (lua_Unsigned i = 1, n = lua_rawlen(L, 1); i <= n; i++) {
    const char *name;
    if (lua_rawgeti(L, 1, (lua_Integer)i) != LUA_TSTRING) { /* validated */
      lua_pop(L, 1);
      continue;
    }
    name = lua_tostring(L, -1);
    if (strcmp(name, ":method") == 0) {
      method = 1;
      lua_getfield(L, 2, "method");
      lua_setfield(L, out, "method");
    } else if (strcmp(name, ":path") == 0) {
      path = 1;
      lua_getfield(L, 2, "path");
      lua_setfield(L, out, "path");
      lua_getfield(L, 2, "grpc"); /* read from the path */
      lua_setfield(L, out, "grpc");
    } else if (strcmp(name, ":identity") == 0) {
      lua_getfield(L, 2, "identity");
      lua_setfield(L, out, "identity");
    } else {
      lua_getfield(L, seen, name);
      lua_setfield(L, headers, name);
      lua_pushboolean(L, 1);
      lua_setfield(L, declared, name);
    }
    lua_pop(L, 1);
  }
  /* [.., out, headers, seen, declared] -> [.., out, headers, seen,
   * headers_mt, req_mt, metadata] */
  om__policy_push_vary_meta(L, method, path);
  lua_setfield(L, out, "metadata");
  lua_setmetatable(L, out);
  lua_setmetatable(L, headers);
  lua_pop(L, 1); /* seen */
  lua_setfield(L, out, "headers");
  return 1;
}

static int l_authorize(lua_State *L) {
  char err[512], reason[OM_POLICY_REASON_MAX + 1];
  int rc;
  lua_settop(L, 2);
  rc = om__policy_check_authorize(L, 1, reason, err, sizeof err);
  if (rc < 0) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
  }
  lua_pushboolean(L, rc == 0);
  if (rc == 0)
    return 1;
  lua_pushstring(L, reason);
  return 2;
}

static int l_pattern(lua_State *L) {
  char err[256];
  size_t len;
  const char *p = luaL_checklstring(L, 1, &len);
  if (om_lpattern_check(p, len, err, sizeof err) == 0)
    return 0;
  lua_pushstring(L, err);
  return 1;
}

static int l_decision(lua_State *L) {
  char err[512];
  om_policy_decision_t d;
  lua_settop(L, 1);
  if (om__policy_check_decision(L, 1, &d, err, sizeof err) >= 0)
    return 0;
  lua_pushstring(L, err);
  return 1;
}

static int l_pattern_prefix(lua_State *L) {
  size_t len;
  const char *p = luaL_checklstring(L, 1, &len);
  luaL_Buffer b;
  char *out = luaL_buffinitsize(L, &b, len > 0 ? len : 1);
  luaL_pushresultsize(&b, om_lpattern_literal_prefix(p, len, out));
  return 1;
}

void om__lua_open_checks(lua_State *L) {
  static const luaL_Reg funcs[] = {{"subset", l_subset},
                                   {"key", l_key},
                                   {"authorize", l_authorize},
                                   {"decision", l_decision},
                                   {"order", l_order},
                                   {"vary_view", l_vary_view},
                                   {"pattern", l_pattern},
                                   {"pattern_prefix", l_pattern_prefix},
                                   {NULL, NULL}};
  luaL_newlib(L, funcs);         /* [om, checks] */
  lua_setfield(L, -2, "checks"); /* [om] */
}
