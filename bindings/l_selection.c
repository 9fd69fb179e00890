/*
 * l_selection.c: openmesh.hash, openmesh.rendezvous, openmesh.p2c.
 *
 *   om.hash(s [, seed])            -> integer (XXH3-64, two's complement)
 *   om.rendezvous(peers [, opts])  -> Rendezvous | nil, "ENOPEERS: ...", code
 *     r:pick(key) -> id
 *     r:rank(key [, k]) -> {id, ...}   (k default: every peer)
 *     #r, r:close()
 *   om.p2c(peers [, opts])         -> P2C | nil, "ENOPEERS: ...", code
 *     p:pick([exclude [, now_ms]]) -> id | nil, "ENOPEERS: ...", "ENOPEERS"
 *     p:start(id)
 *     p:finish(id, latency_ms [, ok [, now_ms]])
 *     p:penalize(id [, retry_after_ms [, now_ms]])
 *     p:set_eligible(id, bool), p:is_eligible(id)
 *     p:inflight(id) -> integer, p:latency(id [, now_ms]) -> ms
 *     #p, p:close()
 *
 * peers: an array of {id = string, weight = number?} (weight defaults to 1)
 * or of plain id strings. Entries are read raw (no metamethods). A bad
 * entry (missing or empty id, weight <= 0, NaN or infinite, duplicate id)
 * is misuse and raises, naming the entry. An empty list is a runtime
 * condition (a policy subset can filter every peer out), so it returns
 * nil, "ENOPEERS: ...", "ENOPEERS" like any other runtime failure.
 *
 * exclude: a set {[id] = true} or an array {id, ...} of peers this request
 * already tried; ids that are not peers are ignored (they may come from an
 * older peer set).
 *
 * Unknown ids given to start, finish, penalize, set_eligible, inflight,
 * latency raise: they are bugs in the caller. So does finish without a
 * matching start.
 *
 * Time in P2C: core has no clock, and policies run in a sandbox without
 * one, so every P2C object keeps a virtual clock in milliseconds. Passing
 * now_ms (any monotonic source, e.g. the host's request time) moves it
 * forward; it never goes back. When finish gets no now_ms, the clock
 * advances by that request's latency: time passes as work completes, which
 * is what the EWMA decay needs in a test or a simulation. pick, penalize and
 * latency without now_ms read the clock as it is.
 *
 * opts for p2c: seed (integer; default: different for every object, from
 * its address and the wall clock, so proxies do not draw the same pairs),
 * decay_ms (10000), default_latency_ms (30: the estimate while no peer has
 * a sample; then an unsampled peer reads the sampled peers' mean),
 * default_penalty_ms (1000,
 * used when a 429/503 carries no Retry-After), max_penalty_ms (60000).
 * opts for rendezvous: seed (integer, default 0; every process that must
 * agree on the mapping needs the same seed).
 */
#include "om_lua.h"

#include <math.h>
#include <string.h>
#include <time.h>

#include "om_errno.h"
#include "om_lua_util.h"
#include "om_hash.h"
#include "om_p2c.h"
#include "om_rendezvous.h"
#include "om_rng.h"

#define RDV_MT "openmesh.Rendezvous"
#define P2C_MT "openmesh.P2C"

/* --- hash ------------------------------------------------------------ */

static int l_hash(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  uint64_t seed = (uint64_t)(lua_Unsigned)luaL_optinteger(L, 2, 0);
  lua_pushinteger(L, (lua_Integer)(lua_Unsigned)om_hash(s, len, seed));
  return 1;
}

/* --- peers ----------------------------------------------------------- */

/*
 * Read the peer list at idx, checking every entry, into ids[] / lens[] /
 * weights[] (n entries, caller-sized). Leaves an index table {[id] = i - 1}
 * on the stack; the id pointers stay valid while it does (it holds the
 * strings as keys). Raises on a bad entry.
 */
static void read_peers(lua_State *L, int idx, size_t n, const char **ids,
                       size_t *lens, double *weights) {
  lua_createtable(L, 0, (int)n); /* [index] */
  for (size_t i = 0; i < n; i++) {
    lua_Integer pos = (lua_Integer)i + 1;
    int t = lua_rawgeti(L, idx, pos); /* [index, entry] */
    double w = 1.0;
    if (t == LUA_TTABLE) {
      lua_pushliteral(L, "weight");
      t = lua_rawget(L, -2); /* [index, entry, weight] */
      if (t != LUA_TNIL) {
        if (t != LUA_TNUMBER) {
          lua_pushfstring(L, "peers[%I].weight: number expected, got %s", pos,
                          luaL_typename(L, -1));
          luaL_argerror(L, idx, lua_tostring(L, -1));
        }
        w = lua_tonumber(L, -1);
        if (!(w > 0) || isinf(w)) { /* !(w > 0) also catches NaN */
          lua_pushfstring(L,
                          "peers[%I].weight: must be a finite number > 0, "
                          "got %f",
                          pos, (LUAI_UACNUMBER)w);
          luaL_argerror(L, idx, lua_tostring(L, -1));
        }
      }
      lua_pop(L, 1);
      lua_pushliteral(L, "id");
      lua_rawget(L, -2); /* [index, entry, id] */
      lua_remove(L, -2); /* [index, id] */
    } else if (t != LUA_TSTRING) {
      lua_pushfstring(L, "peers[%I]: table or string expected, got %s", pos,
                      luaL_typename(L, -1));
      luaL_argerror(L, idx, lua_tostring(L, -1));
    }
    if (lua_type(L, -1) != LUA_TSTRING || lua_rawlen(L, -1) == 0) {
      lua_pushfstring(L, "peers[%I].id: non-empty string expected, got %s", pos,
                      lua_type(L, -1) == LUA_TSTRING ? "empty string"
                                                     : luaL_typename(L, -1));
      luaL_argerror(L, idx, lua_tostring(L, -1));
    }
    lua_pushvalue(L, -1);
    if (lua_rawget(L, -3) != LUA_TNIL) { /* [index, id, previous] */
      lua_pushfstring(L, "peers[%I].id: duplicate id '%s' (also peers[%I])",
                      pos, lua_tostring(L, -2), lua_tointeger(L, -1) + 1);
      luaL_argerror(L, idx, lua_tostring(L, -1));
    }
    lua_pop(L, 1);
    ids[i] = lua_tolstring(L, -1, &lens[i]);
    weights[i] = w;
    lua_pushinteger(L, (lua_Integer)i); /* [index, id, i] */
    lua_rawset(L, -3);                  /* [index] */
  }
}

/* Scratch arrays for read_peers, as one Lua userdata (collected, never
 * leaked when something raises). */
typedef struct {
  const char **ids;
  size_t *lens;
  double *weights;
} peer_arrays_t;

static void new_peer_arrays(lua_State *L, size_t n, peer_arrays_t *a) {
  char *block;
  if (n > INT32_MAX) /* core indexes peers with 32 bits */
    luaL_error(L, "too many peers");
  block = lua_newuserdatauv(
      L, n * (sizeof *a->ids + sizeof *a->lens + sizeof *a->weights), 0);
  a->weights = (double *)(void *)block;
  a->lens = (size_t *)(void *)(block + n * sizeof *a->weights);
  a->ids = (const char **)(void *)(block +
                                   n * (sizeof *a->weights + sizeof *a->lens));
}

static uint64_t opt_seed(lua_State *L, int idx, int *given) {
  uint64_t seed = 0;
  *given = 0;
  if (lua_isnoneornil(L, idx))
    return 0;
  luaL_checktype(L, idx, LUA_TTABLE);
  if (lua_getfield(L, idx, "seed") != LUA_TNIL) {
    int isint;
    lua_Integer v = lua_tointegerx(L, -1, &isint);
    if (!isint)
      luaL_argerror(L, idx, "field 'seed': integer expected");
    seed = (uint64_t)(lua_Unsigned)v;
    *given = 1;
  }
  lua_pop(L, 1);
  return seed;
}

/* --- rendezvous ------------------------------------------------------ */

typedef struct {
  om_rendezvous_t *r; /* NULL: closed */
} l_rendezvous;

static om_rendezvous_t *check_rendezvous(lua_State *L, int idx) {
  l_rendezvous *u = luaL_checkudata(L, idx, RDV_MT);
  if (u->r == NULL)
    luaL_error(L, "attempt to use a closed " RDV_MT);
  return u->r;
}

static int l_rendezvous_new(lua_State *L) {
  om_rendezvous_opts_t opts = {0};
  om_rendezvous_peer_t *peers;
  peer_arrays_t a;
  l_rendezvous *u;
  size_t n;
  int rc, given;

  luaL_checktype(L, 1, LUA_TTABLE);
  opts.seed = opt_seed(L, 2, &given);
  n = (size_t)lua_rawlen(L, 1);
  if (n == 0)
    return om__lua_fail(L, OM_ENOPEERS, "empty peer list");
  new_peer_arrays(L, n, &a);
  peers = lua_newuserdatauv(L, n * sizeof *peers, 0);
  read_peers(L, 1, n, a.ids, a.lens, a.weights); /* [.., index] */
  for (size_t i = 0; i < n; i++) {
    peers[i].id = a.ids[i];
    peers[i].id_len = a.lens[i];
    peers[i].weight = a.weights[i];
  }
  opts.peers = peers;
  opts.npeers = n;
  u = lua_newuserdatauv(L, sizeof *u, 0);
  u->r = NULL;
  luaL_setmetatable(L, RDV_MT);
  rc = om_rendezvous_new(&opts, &u->r);
  if (rc != 0)
    return om__lua_fail(L, rc, NULL);
  return 1;
}

static void push_rendezvous_id(lua_State *L, const om_rendezvous_t *r,
                               uint32_t i) {
  size_t len;
  const char *id = om_rendezvous_id(r, i, &len);
  lua_pushlstring(L, id, len);
}

static int l_rendezvous_pick(lua_State *L) {
  const om_rendezvous_t *r = check_rendezvous(L, 1);
  size_t len;
  const char *key = luaL_checklstring(L, 2, &len);
  push_rendezvous_id(L, r, om_rendezvous_pick(r, key, len));
  return 1;
}

static int l_rendezvous_rank(lua_State *L) {
  const om_rendezvous_t *r = check_rendezvous(L, 1);
  size_t len, n = om_rendezvous_size(r), k;
  const char *key = luaL_checklstring(L, 2, &len);
  lua_Integer want = luaL_optinteger(L, 3, (lua_Integer)n);
  uint32_t *out;
  int got;
  luaL_argcheck(L, want >= 0, 3, "k must be >= 0");
  k = (lua_Unsigned)want < n ? (size_t)want : n;
  out = lua_newuserdatauv(L, (k > 0 ? k : 1) * sizeof *out, 0);
  got = om_rendezvous_rank(r, key, len, out, k);
  if (got < 0)
    return om__lua_fail(L, got, NULL);
  lua_createtable(L, got, 0);
  for (int i = 0; i < got; i++) {
    push_rendezvous_id(L, r, out[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int l_rendezvous_len(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)om_rendezvous_size(check_rendezvous(L, 1)));
  return 1;
}

static int l_rendezvous_close(lua_State *L) {
  l_rendezvous *u = luaL_checkudata(L, 1, RDV_MT);
  om_rendezvous_free(u->r);
  u->r = NULL;
  return 0;
}

static int l_rendezvous_tostring(lua_State *L) {
  l_rendezvous *u = luaL_checkudata(L, 1, RDV_MT);
  if (u->r == NULL)
    lua_pushliteral(L, RDV_MT " (closed)");
  else
    lua_pushfstring(L, RDV_MT " (%I peers)",
                    (lua_Integer)om_rendezvous_size(u->r));
  return 1;
}

/* --- p2c ------------------------------------------------------------- */

typedef struct {
  om_p2c_t *p; /* NULL: closed */
  om_rng_t rng;
  uint64_t clock_ns; /* the virtual clock (see the top of this file) */
  size_t nwords;
  uint64_t exclude[]; /* nwords words of scratch for pick */
} l_p2c;

/* User values of a P2C userdata. */
#define UV_INDEX 1 /* {[id] = 0-based index} */
#define UV_IDS 2   /* {id, ...} by 1-based index */

static l_p2c *check_p2c(lua_State *L, int idx) {
  l_p2c *u = luaL_checkudata(L, idx, P2C_MT);
  if (u->p == NULL)
    luaL_error(L, "attempt to use a closed " P2C_MT);
  return u;
}

/* The index of the peer id at arg; raises for anything else. */
static size_t check_peer(lua_State *L, int arg) {
  size_t i;
  luaL_checktype(L, arg, LUA_TSTRING);
  lua_getiuservalue(L, 1, UV_INDEX);
  lua_pushvalue(L, arg);
  if (lua_rawget(L, -2) != LUA_TNUMBER) {
    lua_pushfstring(L, "unknown peer id '%s'", lua_tostring(L, arg));
    luaL_argerror(L, arg, lua_tostring(L, -1));
  }
  i = (size_t)lua_tointeger(L, -1);
  lua_pop(L, 2);
  return i;
}

static uint64_t p2c_clock(lua_State *L, l_p2c *u, int arg) {
  if (!lua_isnoneornil(L, arg)) {
    uint64_t t = om__lua_checkms(L, arg, "now_ms");
    if (t > u->clock_ns)
      u->clock_ns = t;
  }
  return u->clock_ns;
}

/* An optional positive duration field, in ns (0 when absent: core default). */
static uint64_t opt_positive_ms(lua_State *L, int idx, const char *name) {
  double ms;
  if (lua_isnoneornil(L, idx))
    return 0;
  ms = om__lua_field_num(L, idx, name, -1, 1e-6, 1e12);
  if (ms < 0)
    return 0;
  return (uint64_t)(ms * 1e6);
}

static uint64_t default_seed(const void *where) {
  struct timespec ts[2];
  uintptr_t addr = (uintptr_t)where;
  clock_gettime(CLOCK_REALTIME, &ts[0]);
  clock_gettime(CLOCK_MONOTONIC, &ts[1]);
  return om_hash(ts, sizeof ts, (uint64_t)addr);
}

static int l_p2c_new(lua_State *L) {
  om_p2c_opts_t opts = {0};
  peer_arrays_t a;
  l_p2c *u;
  uint64_t seed;
  size_t n, nwords;
  int rc, given;

  luaL_checktype(L, 1, LUA_TTABLE);
  seed = opt_seed(L, 2, &given);
  opts.decay_ns = opt_positive_ms(L, 2, "decay_ms");
  opts.default_latency_ns = opt_positive_ms(L, 2, "default_latency_ms");
  opts.default_penalty_ns = opt_positive_ms(L, 2, "default_penalty_ms");
  opts.max_penalty_ns = opt_positive_ms(L, 2, "max_penalty_ms");
  n = (size_t)lua_rawlen(L, 1);
  if (n == 0)
    return om__lua_fail(L, OM_ENOPEERS, "empty peer list");
  new_peer_arrays(L, n, &a);
  read_peers(L, 1, n, a.ids, a.lens, a.weights); /* [.., arrays, index] */
  opts.npeers = n;
  opts.weights = a.weights;
  nwords = OM_P2C_BITMAP_WORDS(n);
  u = lua_newuserdatauv(L, sizeof *u + nwords * sizeof u->exclude[0], 2);
  u->p = NULL;
  u->clock_ns = 0;
  u->nwords = nwords;
  om_rng_seed(&u->rng, given ? seed : default_seed(u));
  luaL_setmetatable(L, P2C_MT); /* [.., arrays, index, p2c] */
  lua_pushvalue(L, -2);
  lua_setiuservalue(L, -2, UV_INDEX);
  lua_createtable(L, (int)n, 0); /* [.., index, p2c, ids] */
  for (size_t i = 0; i < n; i++) {
    lua_pushlstring(L, a.ids[i], a.lens[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  lua_setiuservalue(L, -2, UV_IDS); /* [.., index, p2c] */
  rc = om_p2c_new(&opts, &u->p);
  if (rc != 0)
    return om__lua_fail(L, rc, NULL);
  return 1;
}

/* Mark the ids of the exclude table at arg in u->exclude. */
static void fill_exclude(lua_State *L, l_p2c *u, int arg) {
  int index;
  lua_getiuservalue(L, 1, UV_INDEX); /* [index] */
  index = lua_gettop(L);
  lua_pushnil(L);
  while (lua_next(L, arg) != 0) { /* [index, k, v] */
    int found;
    if (lua_type(L, -2) == LUA_TSTRING && lua_toboolean(L, -1))
      lua_pushvalue(L, -2); /* {[id] = true} */
    else if (lua_type(L, -1) == LUA_TSTRING)
      lua_pushvalue(L, -1); /* {id, ...} */
    else
      lua_pushnil(L);
    found = lua_type(L, -1) == LUA_TSTRING &&
            lua_rawget(L, index) == LUA_TNUMBER; /* [index, k, v, i?] */
    if (found)
      om_p2c_bitmap_set(u->exclude, (size_t)lua_tointeger(L, -1));
    lua_pop(L, 2); /* [index, k] */
  }
  lua_pop(L, 1);
}

static int l_p2c_pick(lua_State *L) {
  l_p2c *u = check_p2c(L, 1);
  const uint64_t *exclude = NULL;
  uint64_t now;
  uint32_t out;
  int rc;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    memset(u->exclude, 0, u->nwords * sizeof u->exclude[0]);
    fill_exclude(L, u, 2);
    exclude = u->exclude;
  }
  now = p2c_clock(L, u, 3);
  rc = om_p2c_pick(u->p, &u->rng, exclude, now, &out);
  if (rc != 0)
    return om__lua_fail(L, rc, "no eligible peer left to pick");
  lua_getiuservalue(L, 1, UV_IDS);
  lua_rawgeti(L, -1, (lua_Integer)out + 1);
  return 1;
}

static int l_p2c_start(lua_State *L) {
  l_p2c *u = check_p2c(L, 1);
  size_t i = check_peer(L, 2);
  if (om_p2c_start(u->p, i) != 0)
    return luaL_error(L, "too many requests in flight on peer '%s'",
                      lua_tostring(L, 2));
  return 0;
}

static int l_p2c_finish(lua_State *L) {
  l_p2c *u = check_p2c(L, 1);
  size_t i = check_peer(L, 2);
  uint64_t latency = om__lua_checkms(L, 3, "latency_ms");
  int ok = lua_isnoneornil(L, 4) ? 1 : lua_toboolean(L, 4);
  uint64_t now;
  if (lua_isnoneornil(L, 5)) {
    u->clock_ns = u->clock_ns + latency < u->clock_ns ? UINT64_MAX
                                                      : u->clock_ns + latency;
    now = u->clock_ns;
  } else {
    now = p2c_clock(L, u, 5);
  }
  if (om_p2c_finish(u->p, i, latency, ok, now) != 0)
    return luaL_error(L, "finish without a matching start on peer '%s'",
                      lua_tostring(L, 2));
  return 0;
}

static int l_p2c_penalize(lua_State *L) {
  l_p2c *u = check_p2c(L, 1);
  size_t i = check_peer(L, 2);
  uint64_t retry_after = om__lua_optms(L, 3, "retry_after_ms", 0);
  om_p2c_penalize(u->p, i, retry_after, p2c_clock(L, u, 4));
  return 0;
}

static int l_p2c_set_eligible(lua_State *L) {
  l_p2c *u = check_p2c(L, 1);
  size_t i = check_peer(L, 2);
  luaL_checkany(L, 3);
  om_p2c_set_eligible(u->p, i, lua_toboolean(L, 3));
  return 0;
}

static int l_p2c_is_eligible(lua_State *L) {
  l_p2c *u = check_p2c(L, 1);
  lua_pushboolean(L, om_p2c_is_eligible(u->p, check_peer(L, 2)));
  return 1;
}

static int l_p2c_inflight(lua_State *L) {
  l_p2c *u = check_p2c(L, 1);
  lua_pushinteger(L, (lua_Integer)om_p2c_inflight(u->p, check_peer(L, 2)));
  return 1;
}

static int l_p2c_latency(lua_State *L) {
  l_p2c *u = check_p2c(L, 1);
  size_t i = check_peer(L, 2);
  uint64_t now = p2c_clock(L, u, 3);
  lua_pushnumber(L, om_p2c_latency_ns(u->p, i, now) / 1e6);
  return 1;
}

static int l_p2c_len(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)om_p2c_size(check_p2c(L, 1)->p));
  return 1;
}

static int l_p2c_close(lua_State *L) {
  l_p2c *u = luaL_checkudata(L, 1, P2C_MT);
  om_p2c_free(u->p);
  u->p = NULL;
  return 0;
}

static int l_p2c_tostring(lua_State *L) {
  l_p2c *u = luaL_checkudata(L, 1, P2C_MT);
  if (u->p == NULL)
    lua_pushliteral(L, P2C_MT " (closed)");
  else
    lua_pushfstring(L, P2C_MT " (%I peers, %I eligible)",
                    (lua_Integer)om_p2c_size(u->p),
                    (lua_Integer)om_p2c_eligible_count(u->p));
  return 1;
}

void om__lua_open_selection(lua_State *L) {
  static const luaL_Reg rdv_methods[] = {{"pick", l_rendezvous_pick},
                                         {"rank", l_rendezvous_rank},
                                         {"close", l_rendezvous_close},
                                         {NULL, NULL}};
  static const luaL_Reg rdv_meta[] = {{"__gc", l_rendezvous_close},
                                      {"__close", l_rendezvous_close},
                                      {"__len", l_rendezvous_len},
                                      {"__tostring", l_rendezvous_tostring},
                                      {NULL, NULL}};
  static const luaL_Reg p2c_methods[] = {{"pick", l_p2c_pick},
                                         {"start", l_p2c_start},
                                         {"finish", l_p2c_finish},
                                         {"penalize", l_p2c_penalize},
                                         {"set_eligible", l_p2c_set_eligible},
                                         {"is_eligible", l_p2c_is_eligible},
                                         {"inflight", l_p2c_inflight},
                                         {"latency", l_p2c_latency},
                                         {"close", l_p2c_close},
                                         {NULL, NULL}};
  static const luaL_Reg p2c_meta[] = {{"__gc", l_p2c_close},
                                      {"__close", l_p2c_close},
                                      {"__len", l_p2c_len},
                                      {"__tostring", l_p2c_tostring},
                                      {NULL, NULL}};
  static const luaL_Reg funcs[] = {{"hash", l_hash},
                                   {"rendezvous", l_rendezvous_new},
                                   {"p2c", l_p2c_new},
                                   {NULL, NULL}};
  om__lua_newclass(L, RDV_MT, rdv_methods, rdv_meta);
  om__lua_newclass(L, P2C_MT, p2c_methods, p2c_meta);
  luaL_setfuncs(L, funcs, 0); /* [om] */
}
