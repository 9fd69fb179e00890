/*
 * om_lua_call.c: the one protected path from C into Lua (luv's luv_cfpcall,
 * lua.c's msghandler): a traceback on error, a fixed message on OOM.
 */
#include "om_lua.h"

#include <string.h>

#include "om_errno.h"

static int msghandler(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) { /* error object is not a string */
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      return 1;
    msg =
        lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

int om_lua_pcall(lua_State *L, int nargs, int nresults) {
  int base = lua_gettop(L) - nargs; /* the function's index */
  int status;
  lua_pushcfunction(L, msghandler);
  lua_insert(L, base);
  status = lua_pcall(L, nargs, nresults, base);
  lua_remove(L, base);
  if (status == LUA_ERRMEM) {
    lua_pop(L, 1);
    lua_pushliteral(L, "not enough memory");
  }
  return status;
}

void om_lua_errmsg(lua_State *L, char *err, size_t errlen, const char *prefix) {
  size_t len;
  const char *msg = lua_tolstring(L, -1, &len);
  const char *tb;
  if (msg == NULL) {
    msg = "(no message)";
    len = strlen(msg);
  }
  tb = strstr(msg, "\nstack traceback:");
  if (tb != NULL)
    len = (size_t)(tb - msg);
  if (len > (size_t)1 << 16) /* %.*s takes an int */
    len = (size_t)1 << 16;
  om_errbuf(err, errlen, "%s%.*s", prefix, (int)len, msg);
}
