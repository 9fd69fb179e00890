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

/*
 * om.peers_by(peers, key, value [, keep]): the peers whose metadata[key] is
 * value (keep true or absent) or is not (keep false), as
 * om.select_metadata(peers, {[key] = value}, keep) answers. Given the
 * policy's current view, the answer is made once per view and the same
 * table is returned on every later call (O(1)); the proxy then takes the
 * subset from the group's index list without walking the table. So the
 * group is shared: a policy must not modify it (copy it first). Given any
 * other table, a fresh one, as select_metadata.
 */
static int l_peers_by(lua_State *L) {
  size_t kl, vl;
  const char *k = luaL_checklstring(L, 2, &kl);
  const char *v = luaL_checklstring(L, 3, &vl);
  int keep = lua_isnoneornil(L, 4) || lua_toboolean(L, 4);
  const om_lua_view_md_t *md;
  om_lua_group_t *g;
  size_t count = 0;
  lua_Integer n;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 4);
  n = (lua_Integer)lua_rawlen(L, 1);
  if (lua_getfield(L, LUA_REGISTRYINDEX, OM_LUA_VIEW) != LUA_TTABLE || /* 5 */
      !lua_rawequal(L, -1, 1) ||
      lua_getfield(L, LUA_REGISTRYINDEX, OM_LUA_VIEW_MD) != /* 6 */
          LUA_TLIGHTUSERDATA ||
      (md = lua_touserdata(L, -1)) == NULL || (lua_Integer)md->n != n ||
      lua_getfield(L, LUA_REGISTRYINDEX, OM_LUA_VIEW_GROUPS) != /* 7 */
          LUA_TTABLE) {
    lua_settop(L, 3); /* [peers, key, value] -> select_metadata's answer */
    lua_pushcfunction(L, l_select_metadata);
    lua_pushvalue(L, 1);
    lua_createtable(L, 0, 1);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 3);
    lua_rawset(L, -3);
    lua_pushboolean(L, keep);
    lua_call(L, 3, 1);
    return 1;
  }
  /* 8: the cache key, "+" or "-", the key's length, the key, the value */
  lua_pushfstring(L, "%s%d:", keep ? "+" : "-", (int)kl);
  lua_pushvalue(L, 2);
  lua_pushvalue(L, 3);
  lua_concat(L, 3);
  lua_pushvalue(L, 8);
  if (lua_rawget(L, 7) == LUA_TTABLE)
    return 1; /* made before for this view */
  lua_pop(L, 1);
  for (size_t i = 0; i < md->n; i++)
    count += view_match(md, i, &k, &v, &vl, 1) == keep;
  g = lua_newuserdatauv(L, sizeof *g + count * sizeof(uint32_t), 0); /* 9 */
  g->n = 0;
  lua_createtable(L, (int)count, 0); /* 10: the group */
  for (size_t i = 0; i < md->n; i++) {
    if (view_match(md, i, &k, &v, &vl, 1) != keep)
      continue;
    g->ids[g->n++] = (uint32_t)i;
    lua_rawgeti(L, 1, (lua_Integer)i + 1);
    lua_rawseti(L, 10, (lua_Integer)g->n);
  }
  lua_pushvalue(L, 10); /* groups[group] = ids */
  lua_pushvalue(L, 9);
  lua_rawset(L, 7);
  lua_pushvalue(L, 8); /* groups[cache key] = group */
  lua_pushvalue(L, 10);
  lua_rawset(L, 7);
  lua_settop(L, 10);
  return 1;
}

void om__lua_open_peers(lua_State *L) {
  static const luaL_Reg funcs[] = {{"new_array", l_new_array},
                                   {"select_metadata", l_select_metadata},
                                   {"peers_by", l_peers_by},
                                   {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0); /* [om] */
}
