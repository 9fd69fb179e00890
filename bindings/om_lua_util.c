/*
 * om_lua_util.c: the helpers every binding file shares (argument and
 * option-table checks, the failure triple, class metatables). They live
 * apart from the module entry point so that the area files (l_*.c) depend
 * on this file and openmesh.c depends on the area files, never both ways.
 */
#include "om_lua_util.h"

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
