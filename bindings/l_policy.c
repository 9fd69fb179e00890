/*
 * l_policy.c: policies from Lua (module `openmesh`, table `policy`), for
 * specs and tools. The policy runs in its own sandboxed state; values cross
 * between the caller's state and the policy's by copy (strings, numbers,
 * booleans and tables of them), never by reference.
 *
 *   local p, err = om.policy.load{path = "policies/traffic.lua"}
 *                  -- or {source = "...", name = "inline.lua"}
 *                  -- optional: lib_dir (else found on package.path),
 *                  -- mem_limit (bytes), instr_limit, wall_limit_ms
 *   p:kind() ; p:name() ; p:version() ; p:settings()
 *   p:subset(req, peers) -> {id, ...} | nil, "EPOLICY: ...", "EPOLICY"
 *   p:key(req) -> string | nil
 *   p:authorize(req) -> true | false, reason | nil, "EPOLICY: ...",
 *     "EPOLICY"  (true also for a policy without authorize)
 *   p:order(ctx) -> {route, ...}
 *   p:evaluate(text [, ctx]) -> {flagged =, confidence =, checks = {...}}
 *   p:close()   -- also __gc and __close
 */
#include "om_lua.h"

#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_lua_util.h"
#include "om_policy.h"

#define POLICY_TYPE "openmesh.Policy"
#define COPY_DEPTH 16
#define ERRLEN 2048

typedef struct {
  om_policy_t *p; /* NULL once closed */
} l_policy_t;

static om_policy_t *check_policy(lua_State *L, int idx) {
  l_policy_t *u = luaL_checkudata(L, idx, POLICY_TYPE);
  if (u->p == NULL)
    luaL_error(L, "attempt to use a closed policy");
  return u->p;
}

/*
 * Copy the value at idx of `from` onto `to`. Reads `from` with raw, non-
 * allocating accessors only, so it never raises there; pushes on `to` may
 * raise (run it protected when `to` is a sandbox). Functions, userdata and
 * deeper nesting than COPY_DEPTH become nil.
 */
static void xcopy(lua_State *from, int idx, lua_State *to, int depth) {
  idx = lua_absindex(from, idx);
  switch (lua_type(from, idx)) {
  case LUA_TSTRING: {
    size_t len;
    const char *s = lua_tolstring(from, idx, &len);
    lua_pushlstring(to, s, len);
    return;
  }
  case LUA_TNUMBER:
    if (lua_isinteger(from, idx))
      lua_pushinteger(to, lua_tointeger(from, idx));
    else
      lua_pushnumber(to, lua_tonumber(from, idx));
    return;
  case LUA_TBOOLEAN:
    lua_pushboolean(to, lua_toboolean(from, idx));
    return;
  case LUA_TTABLE:
    if (depth < COPY_DEPTH && lua_checkstack(from, 3)) {
      lua_newtable(to);
      lua_pushnil(from);
      while (lua_next(from, idx) != 0) { /* from: [k, v] */
        int kt = lua_type(from, -2), vt = lua_type(from, -1);
        if ((kt == LUA_TSTRING || kt == LUA_TNUMBER) && vt != LUA_TFUNCTION &&
            vt != LUA_TUSERDATA && vt != LUA_TTHREAD &&
            vt != LUA_TLIGHTUSERDATA) {
          xcopy(from, -2, to, depth + 1);
          xcopy(from, -1, to, depth + 1);
          lua_rawset(to, -3);
        }
        lua_pop(from, 1);
      }
      return;
    }
    /* fall through */
  default:
    lua_pushnil(to);
  }
}

/* Protected in the policy's state: copy n caller values, call contract.f. */
typedef struct {
  lua_State *from;
  om_policy_t *p;
  int first, n;
  const char *fn;
} contract_call_t;

static int run_contract(lua_State *L) {
  contract_call_t *c = lua_touserdata(L, 1);
  lua_settop(L, 0);
  om_policy_push_contract(c->p);
  lua_getfield(L, 1, c->fn); /* [contract, fn] */
  om_policy_push(c->p);      /* [contract, fn, policy] */
  for (int i = 0; i < c->n; i++)
    xcopy(c->from, c->first + i, L, 0);
  lua_call(L, 1 + c->n, 2);
  return 2;
}

/* Call contract.fn(policy, caller values first..first+n-1); copy results. */
static int contract_call(lua_State *L, om_policy_t *p, const char *fn,
                         int first, int n) {
  om_sandbox_t *sb = om_policy_sandbox(p);
  lua_State *PL = om_sandbox_state(sb);
  contract_call_t c = {L, p, first, n, fn};
  lua_settop(PL, 0);
  lua_pushcfunction(PL, run_contract); /* light: never allocates */
  lua_pushlightuserdata(PL, &c);
  if (om_sandbox_call(sb, 1, 2) != LUA_OK) {
    const char *msg = lua_tostring(PL, -1);
    const char *tb = msg ? strstr(msg, "\nstack traceback:") : NULL;
    lua_pushnil(L);
    lua_pushfstring(L, "EPOLICY: %s", msg ? msg : "(no message)");
    if (tb != NULL) { /* keep the message, drop the traceback */
      const char *s = lua_tostring(L, -1);
      lua_pushlstring(L, s, (size_t)(tb - msg) + strlen("EPOLICY: "));
      lua_remove(L, -2);
    }
    lua_pushliteral(L, "EPOLICY");
    lua_settop(PL, 0);
    return 3;
  }
  xcopy(PL, -2, L, 0);
  if (lua_isnil(PL, -2) && lua_type(PL, -1) == LUA_TSTRING) {
    lua_pushfstring(L, "EPOLICY: %s", lua_tostring(PL, -1));
    lua_pushliteral(L, "EPOLICY");
    lua_settop(PL, 0);
    return 3;
  }
  lua_settop(PL, 0);
  return 1;
}

/* Find lib_dir: the directory above openmesh/contract.lua on package.path. */
static const char *find_lib_dir(lua_State *L) {
  const char *path, *slash;
  lua_getglobal(L, "package");
  if (lua_type(L, -1) != LUA_TTABLE)
    return NULL;
  lua_getfield(L, -1, "path");
  if (lua_type(L, -1) != LUA_TSTRING)
    return NULL;
  path = luaL_gsub(L, lua_tostring(L, -1), "?", "openmesh/contract");
  for (const char *s = path; s != NULL && *s;) {
    const char *e = strchr(s, ';');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    lua_pushlstring(L, s, len);
    FILE *f = fopen(lua_tostring(L, -1), "r");
    if (f != NULL) {
      const char *file = lua_tostring(L, -1);
      fclose(f);
      slash = strstr(file, "openmesh/contract");
      lua_pushlstring(L, file, (size_t)(slash - file));
      return lua_tostring(L, -1);
    }
    lua_pop(L, 1);
    s = e ? e + 1 : NULL;
  }
  return NULL;
}

static int l_load(lua_State *L) {
  om_policy_opts_t opts = {0};
  const char *path = NULL, *src = NULL, *name = NULL;
  size_t len = 0;
  char err[ERRLEN];
  l_policy_t *u;
  int rc;
  luaL_checktype(L, 1, LUA_TTABLE);
  if (lua_getfield(L, 1, "path") != LUA_TNIL)
    path = luaL_checkstring(L, -1);
  if (lua_getfield(L, 1, "source") != LUA_TNIL)
    src = luaL_checklstring(L, -1, &len);
  if (lua_getfield(L, 1, "name") != LUA_TNIL)
    name = luaL_checkstring(L, -1);
  if ((path == NULL) == (src == NULL))
    return luaL_argerror(L, 1, "exactly one of 'path' or 'source' expected");
  if (lua_getfield(L, 1, "lib_dir") != LUA_TNIL)
    opts.lib_dir = luaL_checkstring(L, -1);
  else
    opts.lib_dir = find_lib_dir(L);
  if (opts.lib_dir == NULL)
    return luaL_argerror(L, 1,
                         "no 'lib_dir' given and openmesh/contract.lua "
                         "is not on package.path");
  opts.mem_limit =
      (size_t)om__lua_field_int(L, 1, "mem_limit", 0, 0, LUA_MAXINTEGER);
  opts.instr_limit =
      (uint64_t)om__lua_field_int(L, 1, "instr_limit", 0, 0, LUA_MAXINTEGER);
  opts.wall_limit_ns = om__lua_field_ms(L, 1, "wall_limit_ms", 0);
  u = lua_newuserdatauv(L, sizeof *u, 0);
  u->p = NULL;
  luaL_setmetatable(L, POLICY_TYPE);
  if (path != NULL)
    rc = om_policy_load_file(&opts, path, &u->p, err, sizeof err);
  else
    rc = om_policy_load(&opts, name ? name : "inline.lua", src, len, &u->p, err,
                        sizeof err);
  if (rc != 0)
    return om__lua_fail(L, rc, err);
  return 1;
}

static int l_close(lua_State *L) {
  l_policy_t *u = luaL_checkudata(L, 1, POLICY_TYPE);
  om_policy_free(u->p);
  u->p = NULL;
  return 0;
}

static int l_kind(lua_State *L) {
  lua_pushstring(L, om_policy_kind_name(om_policy_kind(check_policy(L, 1))));
  return 1;
}

static int l_name(lua_State *L) {
  lua_pushstring(L, om_policy_name(check_policy(L, 1)));
  return 1;
}

static int l_version(lua_State *L) {
  check_policy(L, 1);
  lua_pushinteger(L, 1); /* a fresh load; reloads are counted by the host */
  return 1;
}

static int l_settings(lua_State *L) {
  om_policy_t *p = check_policy(L, 1);
  lua_State *PL = om_sandbox_state(om_policy_sandbox(p));
  lua_settop(PL, 0);
  om_policy_push(p);
  xcopy(PL, 1, L, 0); /* functions are left out by the copy */
  lua_settop(PL, 0);
  lua_pushnil(L);
  lua_setfield(L, -2, "examples");
  return 1;
}

/* Read a string map field of the table at idx into kv (Lua-owned strings). */
static size_t read_kv(lua_State *L, int idx, const char *field,
                      om_policy_kv_t **kv, int anchors) {
  size_t n = 0, cap = 0;
  idx = lua_absindex(L, idx);
  *kv = NULL;
  if (lua_getfield(L, idx, field) == LUA_TNIL) {
    lua_pop(L, 1);
    return 0;
  }
  if (!lua_istable(L, -1))
    luaL_error(L, "field '%s': table of strings expected", field);
  lua_pushnil(L);
  while (lua_next(L, -2) != 0) {
    if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
      luaL_error(L, "field '%s': string keys and values expected", field);
    if (n == cap) { /* userdata-backed, so an error frees it */
      size_t ncap = cap ? cap * 2 : 8;
      om_policy_kv_t *nkv = lua_newuserdatauv(L, ncap * sizeof *nkv, 0);
      if (n)
        memcpy(nkv, *kv, n * sizeof *nkv);
      *kv = nkv;
      cap = ncap;
      lua_rawseti(L, anchors, (lua_Integer)lua_rawlen(L, anchors) + 1);
    }
    (*kv)[n].name = lua_tolstring(L, -2, &(*kv)[n].name_len);
    (*kv)[n].value = lua_tolstring(L, -1, &(*kv)[n].value_len);
    n++;
    lua_pop(L, 1);
  }
  /* the strings stay alive: they are in the caller's table */
  lua_pop(L, 1);
  return n;
}

static const char *opt_string_field(lua_State *L, int idx, const char *f,
                                    const char *def) {
  const char *s = def;
  if (lua_getfield(L, idx, f) != LUA_TNIL) {
    if (lua_type(L, -1) != LUA_TSTRING)
      luaL_error(L, "field '%s': string expected, got %s", f,
                 luaL_typename(L, -1));
    s = lua_tostring(L, -1);
  }
  lua_pop(L, 1); /* the string stays alive in the caller's table */
  return s;
}

/* An array of strings field of the table at idx (Lua-owned strings, the
 * array in a userdata kept alive by anchors). */
static size_t read_strings(lua_State *L, int idx, const char *field,
                           const char *const **out, int anchors) {
  size_t n;
  const char **v;
  idx = lua_absindex(L, idx);
  *out = NULL;
  if (lua_getfield(L, idx, field) == LUA_TNIL) {
    lua_pop(L, 1);
    return 0;
  }
  if (!lua_istable(L, -1))
    luaL_error(L, "field 'identity.%s': array of strings expected", field);
  n = lua_rawlen(L, -1);
  v = lua_newuserdatauv(L, (n ? n : 1) * sizeof *v, 0);
  lua_rawseti(L, anchors, (lua_Integer)lua_rawlen(L, anchors) + 1);
  for (size_t i = 0; i < n; i++) {
    if (lua_rawgeti(L, -1, (lua_Integer)i + 1) != LUA_TSTRING)
      luaL_error(L, "field 'identity.%s': array of strings expected", field);
    v[i] = lua_tostring(L, -1); /* alive in the caller's table */
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  *out = v;
  return n;
}

/* req.identity, when the table has one: into a userdata kept by anchors. */
static const om_policy_identity_t *read_identity(lua_State *L, int idx,
                                                 int anchors) {
  om_policy_identity_t *id;
  if (lua_getfield(L, idx, "identity") == LUA_TNIL) {
    lua_pop(L, 1);
    return NULL;
  }
  if (!lua_istable(L, -1))
    luaL_error(L, "field 'identity': table expected, got %s",
               luaL_typename(L, -1));
  id = lua_newuserdatauv(L, sizeof *id, 0);
  lua_rawseti(L, anchors, (lua_Integer)lua_rawlen(L, anchors) + 1);
  id->subject = opt_string_field(L, -1, "subject", "");
  id->n_uris = read_strings(L, -1, "uris", &id->uris, anchors);
  id->n_dns = read_strings(L, -1, "dns", &id->dns, anchors);
  lua_pop(L, 1);
  return id;
}

static void read_req(lua_State *L, int idx, om_policy_req_t *req, int anchors) {
  om_policy_kv_t *h, *m;
  luaL_checktype(L, idx, LUA_TTABLE);
  req->service = opt_string_field(L, idx, "service", "example");
  req->method = opt_string_field(L, idx, "method", "GET");
  req->path = opt_string_field(L, idx, "path", "/");
  req->n_headers = read_kv(L, idx, "headers", &h, anchors);
  req->headers = h;
  req->n_metadata = read_kv(L, idx, "metadata", &m, anchors);
  req->metadata = m;
  req->identity = read_identity(L, idx, anchors);
  /* req.grpc = {service, method}: as the proxy derives it from :path */
  if (lua_getfield(L, idx, "grpc") == LUA_TTABLE) {
    req->grpc_service = opt_string_field(L, -1, "service", "");
    req->grpc_method = opt_string_field(L, -1, "method", "");
    req->grpc_service_len = strlen(req->grpc_service);
    req->grpc_method_len = strlen(req->grpc_method);
  }
  lua_pop(L, 1);
}

/* The peers and key of one route call; arrays live in Lua userdata. */
static int route(lua_State *L, om_policy_t *p) {
  om_policy_req_t req = {0};
  om_policy_peer_t *peers = NULL;
  uint32_t *out;
  size_t n = 0, n_out = 0;
  char err[ERRLEN];
  int rc, anchors;
  if (om_policy_kind(p) != OM_POLICY_TRAFFIC)
    return luaL_error(L, "not a traffic policy");
  lua_settop(L, 3);
  lua_newtable(L); /* [p, req, peers, anchors]: keeps scratch arrays alive */
  anchors = lua_gettop(L);
  read_req(L, 2, &req, anchors);
  luaL_checktype(L, 3, LUA_TTABLE);
  n = lua_rawlen(L, 3);
  peers = lua_newuserdatauv(L, (n ? n : 1) * sizeof *peers, 0);
  lua_rawseti(L, anchors, (lua_Integer)lua_rawlen(L, anchors) + 1);
  for (size_t i = 0; i < n; i++) {
    om_policy_kv_t *md;
    lua_rawgeti(L, 3, (lua_Integer)i + 1);
    if (!lua_istable(L, -1))
      return luaL_error(L, "peers[%d]: table expected", (int)i + 1);
    peers[i].id = opt_string_field(L, -1, "id", NULL);
    if (peers[i].id == NULL)
      return luaL_error(L, "peers[%d]: field 'id' required", (int)i + 1);
    peers[i].url = opt_string_field(L, -1, "url", "http://127.0.0.1:1/");
    peers[i].zone = opt_string_field(L, -1, "zone", NULL);
    lua_getfield(L, -1, "weight");
    peers[i].weight = luaL_optnumber(L, -1, 1);
    lua_pop(L, 1);
    peers[i].n_metadata = read_kv(L, -1, "metadata", &md, anchors);
    peers[i].metadata = md;
    lua_pop(L, 1);
  }
  rc = om_policy_set_peers(p, peers, n);
  if (rc != 0)
    return om__lua_fail(L, rc, NULL);
  out = lua_newuserdatauv(L, (n ? n : 1) * sizeof *out, 0);
  rc = om_policy_route(p, &req, out, &n_out, NULL, NULL, err, sizeof err);
  if (rc != 0)
    return om__lua_fail(L, rc, err);
  lua_createtable(L, (int)n_out, 0);
  for (size_t i = 0; i < n_out; i++) {
    lua_pushstring(L, peers[out[i]].id);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return 1;
}

static int l_subset(lua_State *L) {
  return route(L, check_policy(L, 1));
}

static int l_key(lua_State *L) {
  om_policy_t *p = check_policy(L, 1);
  if (om_policy_kind(p) != OM_POLICY_TRAFFIC)
    return luaL_error(L, "not a traffic policy");
  luaL_checktype(L, 2, LUA_TTABLE);
  return contract_call(L, p, "key", 2, 1);
}

/* handle:decide(req): contract.decide in the policy's own sandbox, as
 * handle:key runs contract.key. */
static int l_decide(lua_State *L) {
  om_policy_t *p = check_policy(L, 1);
  if (om_policy_kind(p) != OM_POLICY_TRAFFIC)
    return luaL_error(L, "not a traffic policy");
  luaL_checktype(L, 2, LUA_TTABLE);
  return contract_call(L, p, "decide", 2, 1);
}

/* Through om_policy_authorize: the proxy's own call, check and budget. */
static int l_authorize(lua_State *L) {
  om_policy_t *p = check_policy(L, 1);
  om_policy_req_t req = {0};
  char err[ERRLEN];
  int rc;
  if (om_policy_kind(p) != OM_POLICY_TRAFFIC)
    return luaL_error(L, "not a traffic policy");
  lua_settop(L, 2);
  lua_newtable(L); /* [p, req, anchors] */
  read_req(L, 2, &req, 3);
  rc = om_policy_authorize(p, &req, err, sizeof err);
  if (rc == 0) {
    lua_pushboolean(L, 1);
    return 1;
  }
  if (rc == OM_POLICY_DENIED) {
    lua_pushboolean(L, 0);
    lua_pushstring(L, err);
    return 2;
  }
  return om__lua_fail(L, rc, err);
}

static int l_order(lua_State *L) {
  om_policy_t *p = check_policy(L, 1);
  if (om_policy_kind(p) != OM_POLICY_FALLBACK)
    return luaL_error(L, "not a fallback policy");
  luaL_checktype(L, 2, LUA_TTABLE);
  return contract_call(L, p, "order", 2, 1);
}

static int l_evaluate(lua_State *L) {
  om_policy_t *p = check_policy(L, 1);
  if (om_policy_kind(p) != OM_POLICY_EGRESS_HEURISTICS)
    return luaL_error(L, "not an egress_heuristics policy");
  luaL_checkstring(L, 2);
  return contract_call(L, p, "evaluate", 2, lua_isnoneornil(L, 3) ? 1 : 2);
}

/* handle:set_clock(ms | nil): what os.time()/os.clock() read inside the
 * policy (ms since the epoch), or the host's clocks again with nil. */
static int l_set_clock(lua_State *L) {
  om_policy_t *p = check_policy(L, 1);
  if (lua_isnoneornil(L, 2))
    om_sandbox_set_clock(om_policy_sandbox(p), 0, 0);
  else
    om_sandbox_set_clock(om_policy_sandbox(p), 1,
                         (double)luaL_checknumber(L, 2) / 1000.0);
  return 0;
}

static int l_tostring(lua_State *L) {
  l_policy_t *u = luaL_checkudata(L, 1, POLICY_TYPE);
  if (u->p == NULL)
    lua_pushliteral(L, "openmesh.Policy (closed)");
  else
    lua_pushfstring(L, "openmesh.Policy (%s %s)",
                    om_policy_kind_name(om_policy_kind(u->p)),
                    om_policy_name(u->p));
  return 1;
}

void om__lua_open_policy(lua_State *L) {
  static const luaL_Reg methods[] = {{"kind", l_kind},
                                     {"name", l_name},
                                     {"version", l_version},
                                     {"settings", l_settings},
                                     {"subset", l_subset},
                                     {"key", l_key},
                                     {"authorize", l_authorize},
                                     {"decide", l_decide},
                                     {"order", l_order},
                                     {"evaluate", l_evaluate},
                                     {"set_clock", l_set_clock},
                                     {"close", l_close},
                                     {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__gc", l_close},
                                  {"__close", l_close},
                                  {"__tostring", l_tostring},
                                  {NULL, NULL}};
  static const luaL_Reg funcs[] = {{"load", l_load}, {NULL, NULL}};
  om__lua_newclass(L, POLICY_TYPE, methods, meta);
  luaL_newlib(L, funcs);
  lua_setfield(L, -2, "policy");
}
