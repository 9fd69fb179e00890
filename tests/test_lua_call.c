/*
 * test_lua_call.c: the protected path from C into Lua (om_lua_pcall) and the
 * module's loading into a host state.
 */
#include "om_test.h"

#include <stdlib.h>
#include <string.h>

#include <lualib.h>

#include "om_lua.h"

static lua_State *new_state(void) {
  lua_State *L = luaL_newstate();
  assert_non_null(L);
  luaL_openlibs(L);
  return L;
}

static void call_ok_returns_results(void **state) {
  (void)state;
  lua_State *L = new_state();
  assert_int_equal(luaL_loadstring(L, "return 1 + 2, 'x'"), LUA_OK);
  assert_int_equal(om_lua_pcall(L, 0, 2), LUA_OK);
  assert_int_equal(lua_gettop(L), 2);
  assert_int_equal(lua_tointeger(L, 1), 3);
  assert_string_equal(lua_tostring(L, 2), "x");
  lua_close(L);
}

static void error_carries_traceback(void **state) {
  (void)state;
  lua_State *L = new_state();
  lua_pushliteral(L, "below"); /* the wrapper must leave this alone */
  assert_int_equal(
      luaL_loadstring(L, "local function inner() error('boom') end inner()"),
      LUA_OK);
  assert_int_equal(om_lua_pcall(L, 0, 0), LUA_ERRRUN);
  assert_int_equal(lua_gettop(L), 2); /* [below, msg] */
  const char *msg = lua_tostring(L, -1);
  assert_non_null(strstr(msg, "boom"));
  assert_non_null(strstr(msg, "stack traceback:"));
  assert_non_null(strstr(msg, "inner"));
  assert_string_equal(lua_tostring(L, 1), "below");
  lua_close(L);
}

static void error_object_not_a_string(void **state) {
  (void)state;
  lua_State *L = new_state();
  assert_int_equal(luaL_loadstring(L, "error({})"), LUA_OK);
  assert_int_equal(om_lua_pcall(L, 0, 0), LUA_ERRRUN);
  assert_non_null(strstr(lua_tostring(L, -1), "error object is a table"));
  lua_close(L);
}

/* An allocator that refuses to grow once the cap is reached. */
static size_t used, cap = (size_t)-1;
static void *capped_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  (void)ud;
  if (ptr == NULL)
    osize = 0;
  if (nsize == 0) {
    used -= osize;
    free(ptr);
    return NULL;
  }
  if (nsize > osize && used + (nsize - osize) > cap)
    return NULL;
  void *p = realloc(ptr, nsize);
  if (p != NULL)
    used = used - osize + nsize;
  return p;
}

static void out_of_memory_is_reported(void **state) {
  (void)state;
  lua_State *L = lua_newstate(capped_alloc, NULL);
  assert_non_null(L);
  luaL_openlibs(L);
  assert_int_equal(luaL_loadstring(L, "local t = {} for i = 1, 1e9 do "
                                      "t[i] = ('x'):rep(1000) .. i end"),
                   LUA_OK);
  cap = used + 4 * 1024 * 1024;
  assert_int_equal(om_lua_pcall(L, 0, 0), LUA_ERRMEM);
  assert_string_equal(lua_tostring(L, -1), "not enough memory");
  cap = (size_t)-1;
  lua_close(L);
}

static void module_loads_into_host_state(void **state) {
  (void)state;
  lua_State *L = new_state();
  luaL_requiref(L, "openmesh", luaopen_openmesh, 0);
  lua_pop(L, 1);
  assert_int_equal(luaL_loadstring(L, "local om = require 'openmesh' "
                                      "return om.version, om.errors.EINVAL"),
                   LUA_OK);
  assert_int_equal(om_lua_pcall(L, 0, 2), LUA_OK);
  assert_string_equal(lua_tostring(L, 1), OM_VERSION);
  assert_int_equal(lua_tointeger(L, 2), -1);
  lua_close(L);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(call_ok_returns_results),
      cmocka_unit_test(error_carries_traceback),
      cmocka_unit_test(error_object_not_a_string),
      cmocka_unit_test(out_of_memory_is_reported),
      cmocka_unit_test(module_loads_into_host_state),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
