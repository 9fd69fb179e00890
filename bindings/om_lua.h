/*
 * om_lua.h: the Lua face of the core (module `openmesh`), internal API.
 *
 * Conventions (STYLE.md, "The Lua face"):
 * - Type names are dotted ("openmesh.Rendezvous"); one checker per type built
 *   on luaL_checkudata, which already raises.
 * - Misuse raises (luaL_argerror / luaL_error); runtime failure returns
 *   nil, "ECODE: message", "ECODE" (om__lua_fail).
 * - Times are milliseconds in Lua, uint64_t nanoseconds in core.
 * - Each binding file exports one om__lua_open_<area>(L) that adds its
 *   functions to the module table at the top of the stack.
 */
#ifndef OM_LUA_H
#define OM_LUA_H

#include <stdint.h>

#include <lauxlib.h>
#include <lua.h>

#define OM_VERSION "0.1.0"

/*
 * Registry field set in policy sandboxes. There, `require "openmesh"` gives
 * only functions whose C memory is bounded by their arguments (hash,
 * retry_after, backoff, retryable, deadline, errors): objects that hold C
 * memory across calls (parsers, admission pools, policies) would escape the
 * sandbox's memory cap.
 */
#define OM_LUA_SANDBOXED "openmesh.sandboxed"

/*
 * The current peer view of a policy state, and a C copy of its peers'
 * metadata, kept in the registry under these fields by om_policy (light
 * userdata for the copy). om.select_metadata answers from the copy when it
 * is given the view itself: that is the hot path of most traffic policies.
 */
#define OM_LUA_VIEW "openmesh.view"
#define OM_LUA_VIEW_MD "openmesh.view_metadata"

typedef struct om_lua_md_s {
  const char *key, *value;
  size_t key_len, value_len;
} om_lua_md_t;

typedef struct om_lua_view_md_s {
  size_t n;            /* peers in the view */
  const size_t *first; /* peer i's metadata: md[first[i] .. first[i+1]) */
  const om_lua_md_t *md;
} om_lua_view_md_t;

/* The module entry point: require "openmesh". */
int luaopen_openmesh(lua_State *L);

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

/*
 * om_lua_pcall: every call from C into Lua goes through here. Runs the
 * function below nargs arguments in protected mode with a traceback message
 * handler. Returns LUA_OK with nresults on the stack, or an error status with
 * the message (traceback appended) on the stack. Out of memory is reported as
 * LUA_ERRMEM with a fixed message (no traceback: building one could fail).
 */
int om_lua_pcall(lua_State *L, int nargs, int nresults);

/*
 * om_lua_errmsg: prefix + the error message on top of L's stack (left
 * there), without the traceback om_lua_pcall appends, into err (see
 * om_errbuf). "(no message)" when the value is not a string.
 */
void om_lua_errmsg(lua_State *L, char *err, size_t errlen, const char *prefix);

/* The areas of the module, each in its own file. */
void om__lua_open_errors(lua_State *L);
void om__lua_open_selection(lua_State *L);  /* hash, rendezvous, p2c */
void om__lua_open_admission(lua_State *L);  /* admission, limiter, deadline */
void om__lua_open_resilience(lua_State *L); /* circuit, backoff, retry */
void om__lua_open_sse(lua_State *L);        /* sse.parser, sse.encode */
void om__lua_open_policy(lua_State *L);     /* policy.load */

#endif /* OM_LUA_H */
