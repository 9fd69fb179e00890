/*
 * l_errors.c: the core error codes in Lua (module `openmesh`).
 *
 *   om.errors.EPOLICY -> the code (a negative integer)
 *   om.errors[code]   -> "EPOLICY"
 *   om.strerror(code) -> the message
 *
 * Generated from OM_ERRNO_MAP, so C and Lua never disagree on a code.
 */
#include "om_lua.h"

#include "om_errno.h"

static int l_strerror(lua_State *L) {
  int code = (int)luaL_checkinteger(L, 1);
  lua_pushstring(L, om_strerror(code));
  return 1;
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
  lua_pushcfunction(L, l_strerror);
  lua_setfield(L, -2, "strerror");
}
