/*
 * openmesh.c: the module entry point and the helpers every binding shares.
 */
#include "om_lua.h"

#include <math.h>
#include <string.h>

#include "om_errno.h"

int om__lua_fail(lua_State *L, int code, const char *msg) {
  lua_pushnil(L);
  lua_pushfstring(L, "%s: %s", om_err_name(code),
                  msg != NULL ? msg : om_strerror(code));
  lua_pushstring(L, om_err_name(code));
  return 3;
}

static uint64_t ms_to_ns(double ms) {
  double ns = ms * 1e6;
  if (ns >= 18446744073709549568.0) /* largest double below 2^64 */
    return UINT64_MAX;
  return (uint64_t)ns;
}

uint64_t om__lua_checkms(lua_State *L, int idx, const char *what) {
  lua_Number ms = luaL_checknumber(L, idx);
  if (!isfinite(ms) || ms < 0) {
    lua_pushfstring(L, "%s must be a finite number >= 0", what);
    luaL_argerror(L, idx, lua_tostring(L, -1));
  }
  return ms_to_ns(ms);
}

uint64_t om__lua_optms(lua_State *L, int idx, const char *what,
                       uint64_t def_ns) {
  if (lua_isnoneornil(L, idx))
    return def_ns;
  return om__lua_checkms(L, idx, what);
}

int om__lua_field_fail(lua_State *L, int idx, const char *name,
                       const char *why) {
  lua_pushfstring(L, "field '%s': %s", name, why);
  return luaL_argerror(L, idx, lua_tostring(L, -1));
}

void om__lua_check_fields(lua_State *L, int idx, const char *const *allowed) {
  idx = lua_absindex(L, idx);
  lua_pushnil(L);                 /* [nil] */
  while (lua_next(L, idx) != 0) { /* [key, value] */
    const char *key;
    const char *const *f = allowed;
    if (lua_type(L, -2) != LUA_TSTRING)
      luaL_argerror(L, idx, "option keys must be strings");
    key = lua_tostring(L, -2);
    while (*f != NULL && strcmp(*f, key) != 0)
      f++;
    if (*f == NULL) {
      lua_pushfstring(L, "unknown field '%s'", key);
      luaL_argerror(L, idx, lua_tostring(L, -1));
    }
    lua_pop(L, 1); /* [key] */
  }
}

int om__lua_has_field(lua_State *L, int idx, const char *name) {
  int present;
  idx = lua_absindex(L, idx);
  lua_pushstring(L, name);
  present = lua_rawget(L, idx) != LUA_TNIL;
  lua_pop(L, 1);
  return present;
}

lua_Integer om__lua_field_int(lua_State *L, int idx, const char *name,
                              lua_Integer def, lua_Integer min,
                              lua_Integer max) {
  lua_Integer v = def;
  int isnum = 0;
  idx = lua_absindex(L, idx);
  if (lua_getfield(L, idx, name) != LUA_TNIL) {
    if (lua_type(L, -1) == LUA_TNUMBER) /* no numeric strings */
      v = lua_tointegerx(L, -1, &isnum);
    if (!isnum)
      om__lua_field_fail(L, idx, name, "integer expected");
    if (v < min || v > max) {
      lua_pushfstring(L, "must be in [%I, %I], got %I", min, max, v);
      om__lua_field_fail(L, idx, name, lua_tostring(L, -1));
    }
  }
  lua_pop(L, 1);
  return v;
}

double om__lua_field_num(lua_State *L, int idx, const char *name, double def,
                         double min, double max) {
  double v = def;
  idx = lua_absindex(L, idx);
  if (lua_getfield(L, idx, name) != LUA_TNIL) {
    if (lua_type(L, -1) != LUA_TNUMBER)
      om__lua_field_fail(L, idx, name, "number expected");
    v = lua_tonumber(L, -1);
    if (!(v >= min && v <= max)) { /* also rejects NaN */
      lua_pushfstring(L, "must be in [%f, %f], got %f", min, max, v);
      om__lua_field_fail(L, idx, name, lua_tostring(L, -1));
    }
  }
  lua_pop(L, 1);
  return v;
}

uint64_t om__lua_field_ms(lua_State *L, int idx, const char *name,
                          uint64_t def_ns) {
  uint64_t v = def_ns;
  idx = lua_absindex(L, idx);
  if (lua_getfield(L, idx, name) != LUA_TNIL) {
    lua_Number ms;
    if (lua_type(L, -1) != LUA_TNUMBER)
      om__lua_field_fail(L, idx, name, "number of milliseconds expected");
    ms = lua_tonumber(L, -1);
    if (!isfinite(ms) || ms < 0)
      om__lua_field_fail(L, idx, name, "must be a finite number >= 0");
    v = ms_to_ns(ms);
  }
  lua_pop(L, 1);
  return v;
}

void om__lua_newclass(lua_State *L, const char *name, const luaL_Reg *methods,
                      const luaL_Reg *metamethods) {
  if (luaL_newmetatable(L, name)) { /* [mt] */
    if (metamethods != NULL)
      luaL_setfuncs(L, metamethods, 0);
    if (methods != NULL) {
      lua_newtable(L); /* [mt, methods] */
      luaL_setfuncs(L, methods, 0);
      lua_setfield(L, -2, "__index"); /* [mt] */
    }
    lua_pushliteral(L, "locked"); /* no getmetatable() from Lua code */
    lua_setfield(L, -2, "__metatable");
  }
  lua_pop(L, 1);
}

void om__lua_open_errors(lua_State *L) {
  /* [om] */
  lua_newtable(L); /* [om, errors] */
#define OM__ERRNO_LUA(name, value, msg)                                        \
  lua_pushinteger(L, value);                                                   \
  lua_setfield(L, -2, #name);                                                  \
  lua_pushliteral(L, #name);                                                   \
  lua_rawseti(L, -2, value);
  OM_ERRNO_MAP(OM__ERRNO_LUA)
#undef OM__ERRNO_LUA
  lua_setfield(L, -2, "errors"); /* [om] */
}

/*
 * om.new_array(n): an empty table with room for n array items, so a hot
 * loop that fills it (a policy's subset) never pays for rehashing as it
 * grows (LuaJIT's table.new, for 5.4). The memory is the caller state's.
 */
static int l_new_array(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n >= 0 && n <= 1000000, 1, "must be in [0, 1000000]");
  lua_createtable(L, (int)n, 0);
  return 1;
}

/*
 * om.select_metadata(peers, match, keep): the peers (same tables, in order)
 * whose metadata has every key = value of `match` (keep = true), or not
 * (keep = false). The per-request filter of most traffic policies, in C:
 * in a budgeted state every Lua instruction passes the count hook's trap,
 * so a loop over peers is far cheaper here. Metadata values are strings;
 * a peer without metadata matches only an empty `match`.
 */
/* Does peer i of the view carry every key = value? */
static int view_match(const om_lua_view_md_t *v, size_t i,
                      const char *const *keys, const char *const *values,
                      const size_t *value_lens, int nmatch) {
  for (int m = 0; m < nmatch; m++) {
    size_t klen = strlen(keys[m]);
    int found = 0;
    for (size_t j = v->first[i]; j < v->first[i + 1] && !found; j++) {
      const om_lua_md_t *md = &v->md[j];
      found = md->key_len == klen && memcmp(md->key, keys[m], klen) == 0 &&
              md->value_len == value_lens[m] &&
              memcmp(md->value, values[m], value_lens[m]) == 0;
    }
    if (!found)
      return 0;
  }
  return 1;
}

/*
 * The fast path: peers (argument 1) is the policy's current view, whose
 * metadata om_policy copied to C: match there, touch only the chosen peers.
 * Returns 0 (nothing pushed beyond the stack at entry) when it is not.
 */
static int select_from_view(lua_State *L, const char *const *keys,
                            const char *const *values, const size_t *value_lens,
                            int nmatch, int keep, lua_Integer n, int out) {
  const om_lua_view_md_t *v;
  lua_Integer count = 0;
  if (lua_getfield(L, LUA_REGISTRYINDEX, OM_LUA_VIEW) != LUA_TTABLE ||
      !lua_rawequal(L, -1, 1) ||
      lua_getfield(L, LUA_REGISTRYINDEX, OM_LUA_VIEW_MD) !=
          LUA_TLIGHTUSERDATA) {
    lua_settop(L, out);
    return 0;
  }
  v = lua_touserdata(L, -1);
  lua_settop(L, out);
  if (v == NULL || (lua_Integer)v->n != n)
    return 0;
  for (size_t i = 0; i < v->n; i++) {
    if (view_match(v, i, keys, values, value_lens, nmatch) != keep)
      continue;
    lua_rawgeti(L, 1, (lua_Integer)i + 1);
    lua_rawseti(L, out, ++count);
  }
  return 1;
}

static int l_select_metadata(lua_State *L) {
  enum { MAX_MATCH = 16 };
  const char *keys[MAX_MATCH];
  const char *values[MAX_MATCH];
  size_t value_lens[MAX_MATCH];
  lua_Integer n, out = 0;
  int keep, nmatch = 0, top;
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TTABLE);
  keep = lua_toboolean(L, 3);
  lua_settop(L, 3);
  lua_pushnil(L); /* the match pairs, read once (the strings stay alive in
                     the match table, argument 2) */
  while (lua_next(L, 2) != 0) {
    if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
      luaL_argerror(L, 2, "a map of metadata strings expected");
    if (nmatch == MAX_MATCH)
      luaL_argerror(L, 2, "at most 16 metadata keys");
    keys[nmatch] = lua_tostring(L, -2);
    values[nmatch] = lua_tolstring(L, -1, &value_lens[nmatch]);
    nmatch++;
    lua_pop(L, 1);
  }
  n = (lua_Integer)lua_rawlen(L, 1);
  lua_createtable(L, (int)(n < 1000000 ? n : 1000000), 0); /* [.., out] */
  top = lua_gettop(L);
  if (select_from_view(L, keys, values, value_lens, nmatch, keep, n, top))
    return 1;
  for (lua_Integer i = 1; i <= n; i++) {
    int match;
    if (lua_rawgeti(L, 1, i) != LUA_TTABLE) /* [.., out, peer] */
      return luaL_error(L, "peers[%I]: table expected", i);
    match = lua_getfield(L, top + 1, "metadata") == LUA_TTABLE || nmatch == 0;
    for (int m = 0; match && m < nmatch; m++) {
      size_t len;
      const char *v;
      lua_getfield(L, top + 2, keys[m]); /* [.., out, peer, md, md[k]] */
      v = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
      match =
          v != NULL && len == value_lens[m] && memcmp(v, values[m], len) == 0;
      lua_settop(L, top + 2);
    }
    lua_settop(L, top + 1); /* [.., out, peer] */
    if (match == keep)
      lua_rawseti(L, top, ++out);
    else
      lua_settop(L, top);
  }
  return 1;
}

static int l_strerror(lua_State *L) {
  int code = (int)luaL_checkinteger(L, 1);
  lua_pushstring(L, om_strerror(code));
  return 1;
}

/* Replace the module on top with a copy holding only the sandbox-safe part. */
static void restrict_for_sandbox(lua_State *L) {
  static const char *const safe[] = {
      "version",     "errors",         "strerror",        "hash",
      "retry_after", "retry_after_ms", "backoff",         "retryable",
      "deadline",    "new_array",      "select_metadata", NULL};
  lua_newtable(L); /* [om, safe] */
  for (const char *const *f = safe; *f != NULL; f++) {
    lua_getfield(L, -2, *f);
    lua_setfield(L, -2, *f);
  }
  lua_remove(L, -2); /* [safe] */
}

int luaopen_openmesh(lua_State *L) {
  static const luaL_Reg funcs[] = {{"strerror", l_strerror},
                                   {"new_array", l_new_array},
                                   {"select_metadata", l_select_metadata},
                                   {NULL, NULL}};
  int sandboxed;
  luaL_checkversion(L);
  luaL_newlib(L, funcs); /* [om] */
  lua_pushliteral(L, OM_VERSION);
  lua_setfield(L, -2, "version");
  om__lua_open_errors(L);
  om__lua_open_selection(L);
  om__lua_open_admission(L);
  om__lua_open_resilience(L);
  om__lua_open_sse(L);
  lua_getfield(L, LUA_REGISTRYINDEX, OM_LUA_SANDBOXED);
  sandboxed = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (sandboxed)
    restrict_for_sandbox(L);
  else
    om__lua_open_policy(L);
  return 1;
}
