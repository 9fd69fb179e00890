/*
 * om_lua_util.h: helpers shared by the binding files (l_*.c), internal.
 * Each raises a Lua error on misuse (luaL_argerror) and returns normally
 * otherwise; none keeps state.
 */
#ifndef OM_LUA_UTIL_H
#define OM_LUA_UTIL_H

#include <stdint.h>

#include <lauxlib.h>
#include <lua.h>

/*
 * om__lua_fail: push nil, "ECODE: message", "ECODE" for a core error code and
 * return 3, so a binding can `return om__lua_fail(L, rc);`. msg may be NULL
 * (then om_strerror(code) is used).
 */
int om__lua_fail(lua_State *L, int code, const char *msg);

/*
 * om__lua_checkms: argument idx as a finite, non-negative number of
 * milliseconds, converted to nanoseconds (saturating at UINT64_MAX). Raises
 * an argument error naming `what` otherwise.
 */
uint64_t om__lua_checkms(lua_State *L, int idx, const char *what);

/* Same, but returns def_ns when the argument is none or nil. */
uint64_t om__lua_optms(lua_State *L, int idx, const char *what,
                       uint64_t def_ns);

/*
 * om__lua_field_*: read an optional field of the options table at idx.
 * Absent (nil) -> def. Present with the wrong type or out of range -> raises
 * "bad argument #idx (field 'name': ...)".
 */
lua_Integer om__lua_field_int(lua_State *L, int idx, const char *name,
                              lua_Integer def, lua_Integer min,
                              lua_Integer max);
double om__lua_field_num(lua_State *L, int idx, const char *name, double def,
                         double min, double max);
uint64_t om__lua_field_ms(lua_State *L, int idx, const char *name,
                          uint64_t def_ns);

/* Raise "bad argument #idx (field 'name': why)". */
int om__lua_field_fail(lua_State *L, int idx, const char *name,
                       const char *why);

/*
 * om__lua_check_fields: raise on any key of the options table at idx that is
 * not in the NULL-terminated allowed list, so a typo never leaves a default
 * silently in force.
 */
void om__lua_check_fields(lua_State *L, int idx, const char *const *allowed);

/* 1 when the table at idx has a non-nil field name (no metamethods). */
int om__lua_has_field(lua_State *L, int idx, const char *name);

/*
 * om__lua_newclass: create (or fetch) the metatable `name` with `methods` in
 * its __index table and `metamethods` in the metatable itself; pops it.
 */
void om__lua_newclass(lua_State *L, const char *name, const luaL_Reg *methods,
                      const luaL_Reg *metamethods);

/* Convert nanoseconds to Lua milliseconds (a float). */
static inline lua_Number om__lua_ns_to_ms(uint64_t ns) {
  return (lua_Number)ns / 1e6;
}

#endif /* OM_LUA_UTIL_H */
