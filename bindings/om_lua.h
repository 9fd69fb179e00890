/*
 * om_lua.h: the Lua face of the core (module `openmesh`), internal API.
 *
 * Conventions (STYLE.md, "The Lua face"):
 * - Type names are dotted ("openmesh.Rendezvous"); one checker per type built
 *   on luaL_checkudata, which already raises.
 * - Misuse raises (luaL_argerror / luaL_error); runtime failure returns
 *   nil, "ECODE: message", "ECODE" (om__lua_fail, om_lua_util.h).
 * - Times are milliseconds in Lua, uint64_t nanoseconds in core.
 * - Each binding file exports one om__lua_open_<area>(L) that adds its
 *   functions to the module table at the top of the stack; the shared
 *   helpers of those files are in om_lua_util.h, not in the entry point.
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
 * retry_after, backoff, retryable, deadline, errors, checks): objects that hold
 * C memory across calls (parsers, admission pools, policies) would escape the
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
/*
 * The groups om.peers_by made from the current view: "keep\0key\0value"
 * -> the group's table, and that table -> a full userdata of
 * om_lua_group_t (its peer indices, for om_policy's subset check). A new
 * view gets an empty one (om_policy's build_peers), so a group lives as
 * long as the view it was made from.
 */
#define OM_LUA_VIEW_GROUPS "openmesh.view_groups"

typedef struct om_lua_group_s {
  size_t n;
  uint32_t ids[]; /* indices into the view, ascending */
} om_lua_group_t;

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
void om__lua_open_errors(lua_State *L);     /* errors, strerror */
void om__lua_open_peers(lua_State *L);      /* new_array, select_metadata */
void om__lua_open_selection(lua_State *L);  /* hash, rendezvous, p2c */
void om__lua_open_admission(lua_State *L);  /* admission, limiter, deadline */
void om__lua_open_resilience(lua_State *L); /* circuit, backoff, retry */
void om__lua_open_sse(lua_State *L);        /* sse.parser, sse.encode */
void om__lua_open_policy(lua_State *L);     /* policy.load */
void om__lua_open_checks(lua_State *L);     /* checks: answers of policies */

#endif /* OM_LUA_H */
