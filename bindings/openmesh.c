/*
 * openmesh.c: the module entry point. It only assembles the module from
 * its areas (one l_*.c file each) and, in a policy sandbox, keeps the
 * sandbox-safe part.
 */
#include "om_lua.h"

/* Replace the module on top with a copy holding only the sandbox-safe part. */
static void restrict_for_sandbox(lua_State *L) {
  static const char *const safe[] = {
      "version",         "errors",   "strerror",  "hash",     "retry_after",
      "retry_after_ms",  "backoff",  "retryable", "deadline", "new_array",
      "select_metadata", "peers_by", "checks",    NULL};
  lua_newtable(L); /* [om, safe] */
  for (const char *const *f = safe; *f != NULL; f++) {
    lua_getfield(L, -2, *f);
    lua_setfield(L, -2, *f);
  }
  lua_remove(L, -2); /* [safe] */
}

int luaopen_openmesh(lua_State *L) {
  int sandboxed;
  luaL_checkversion(L);
  lua_newtable(L); /* [om] */
  lua_pushliteral(L, OM_VERSION);
  lua_setfield(L, -2, "version");
  om__lua_open_errors(L);
  om__lua_open_peers(L);
  om__lua_open_selection(L);
  om__lua_open_admission(L);
  om__lua_open_resilience(L);
  om__lua_open_sse(L);
  om__lua_open_checks(L);
  lua_getfield(L, LUA_REGISTRYINDEX, OM_LUA_SANDBOXED);
  sandboxed = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (sandboxed)
    restrict_for_sandbox(L);
  else
    om__lua_open_policy(L);
  return 1;
}
