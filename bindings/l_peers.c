/*
 * l_peers.c: helpers for policies that build peer lists (module
 * `openmesh`): om.new_array and om.select_metadata, both sandbox-safe.
 */
#include "om_lua.h"

#include <string.h>

#include "om_lua_util.h"

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

void om__lua_open_peers(lua_State *L) {
  static const luaL_Reg funcs[] = {{"new_array", l_new_array},
                                   {"select_metadata", l_select_metadata},
                                   {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0); /* [om] */
}
