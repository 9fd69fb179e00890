/*
 * om_policy.c: load -> validate -> (caller swaps), and the traffic call path
 * (see om_policy.h). Policy code runs only through om_sandbox_call, so every
 * call is protected and budgeted; C code here reads results with raw
 * accessors only, so no policy metamethod ever runs unprotected.
 */
#include "om_policy.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>

#include "om_errno.h"
#include "om_lua.h"
#include "om_policy_check.h"

/* Registry keys (their addresses) in the policy's state. */
static const char K_CONTRACT, K_POLICY, K_SUBSET, K_KEY, K_AUTHORIZE, K_DECIDE,
    K_PEERS, K_EMPTY;
/* a policy that declares vary: the metatables of its view of a request */
static const char K_VARY_HEADERS, K_VARY_REQ, K_VARY_METADATA;
/* set (true) once a policy that declares vary has run its top level */
static const char K_SEALED;

struct om_policy_s {
  om_sandbox_t *sb;
  om_policy_kind_t kind;
  char *name;
  size_t n_peers;
  uint64_t peers_tag; /* the caller's name for the current view, */
  int peers_tagged;   /* when it gave one (om_policy_set_peers_from) */
  uint32_t *seen;     /* per-peer stamp of the call that returned it */
  uint32_t stamp;
  om__peer_map_t map;
  om_lua_view_md_t *view_md; /* one block: the struct, then its arrays */
  int has_key, has_authorize, has_decide;
  /* the last call's decide answered a table (into the caller's decision) */
  int decided;
  /* `vary` (traffic): the header names, and :method / :path / :identity */
  char **vary;
  size_t n_vary;
  int vary_set, vary_method, vary_path, vary_identity;
  /* the last call's authorize refused it, with this reason ("" for none) */
  int denied;
  /* the last call failed: OM_POLICY_FAIL_*; bad_answer: a check of an
   * answer raised (rather than the policy's own code) */
  int failure, bad_answer;
  char reason[OM_POLICY_REASON_MAX + 1];
  /* the budgets of one route call (traffic): from budget_ms */
  double budget_ms;
  uint64_t route_instr, route_wall_ns;
};

/* The three metatables of the vary view (om_policy_check.c) for the vary
 * just read, into the registry. */
static void vary_views(lua_State *L, const om_policy_t *p) {
  lua_createtable(L, 0, (int)p->n_vary); /* [declared] */
  for (size_t i = 0; i < p->n_vary; i++) {
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, p->vary[i]);
  }
  om__policy_push_vary_meta(L, p->vary_method, p->vary_path);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &K_VARY_METADATA);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &K_VARY_REQ);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &K_VARY_HEADERS);
}

const char *om_policy_kind_name(om_policy_kind_t kind) {
  switch (kind) {
  case OM_POLICY_TRAFFIC:
    return "traffic";
  case OM_POLICY_FALLBACK:
    return "fallback";
  case OM_POLICY_EGRESS_HEURISTICS:
    return "egress_heuristics";
  }
  return "unknown";
}

static om_policy_kind_t kind_from_name(const char *s) {
  for (int k = OM_POLICY_TRAFFIC; k <= OM_POLICY_EGRESS_HEURISTICS; k++)
    if (s != NULL && strcmp(s, om_policy_kind_name(k)) == 0)
      return (om_policy_kind_t)k;
  return 0;
}

/* "policies/traffic.lua" -> "traffic": the default `name` of a policy. */
static char *display_name(const char *name) {
  const char *base = strrchr(name, '/');
  size_t len;
  char *out;
  base = base != NULL ? base + 1 : name;
  len = strlen(base);
  if (len > 4 && strcmp(base + len - 4, ".lua") == 0)
    len -= 4;
  out = malloc(len + 1);
  if (out != NULL) {
    memcpy(out, base, len);
    out[len] = '\0';
  }
  return out;
}

/* Read a field of the table at idx without metamethods; pushes it. */
static int rawfield(lua_State *L, int idx, const char *name) {
  idx = lua_absindex(L, idx);
  lua_pushstring(L, name); /* inside protected code only */
  return lua_rawget(L, idx);
}

/*
 * After validation: the kind, the display name, and the functions the hot
 * path calls, cached in the registry so a later change to the policy table
 * cannot swap them. Runs protected.
 */
static int capture(lua_State *L) {
  om_policy_t *p = lua_touserdata(L, 1);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &K_POLICY); /* [p, policy] */
  rawfield(L, 2, "kind");
  p->kind = kind_from_name(lua_tostring(L, -1));
  lua_pop(L, 1);
  if (rawfield(L, 2, "name") == LUA_TSTRING) {
    char *name = strdup(lua_tostring(L, -1));
    if (name == NULL)
      return luaL_error(L, "not enough memory");
    free(p->name);
    p->name = name;
  }
  lua_pop(L, 1);
  p->budget_ms = OM_POLICY_DEFAULT_BUDGET_MS;
  if (rawfield(L, 2, "budget_ms") == LUA_TNUMBER) /* validated: (0, max] */
    p->budget_ms = lua_tonumber(L, -1);
  lua_pop(L, 1);
  rawfield(L, 2, "subset");
  lua_rawsetp(L, LUA_REGISTRYINDEX, &K_SUBSET);
  p->has_key = rawfield(L, 2, "key") == LUA_TFUNCTION;
  lua_rawsetp(L, LUA_REGISTRYINDEX, &K_KEY);
  p->has_authorize = rawfield(L, 2, "authorize") == LUA_TFUNCTION;
  lua_rawsetp(L, LUA_REGISTRYINDEX, &K_AUTHORIZE);
  p->has_decide = rawfield(L, 2, "decide") == LUA_TFUNCTION;
  lua_rawsetp(L, LUA_REGISTRYINDEX, &K_DECIDE);
  if (rawfield(L, 2, "vary") == LUA_TTABLE && p->kind == OM_POLICY_TRAFFIC) {
    /* validated: an array of distinct names */
    lua_Unsigned n = lua_rawlen(L, -1);
    p->vary = calloc(n > 0 ? n : 1, sizeof *p->vary);
    if (p->vary == NULL)
      return luaL_error(L, "not enough memory");
    p->vary_set = 1;
    for (lua_Unsigned i = 1; i <= n; i++) {
      const char *name;
      lua_rawgeti(L, -1, (lua_Integer)i);
      name = lua_tostring(L, -1);
      if (name != NULL && strcmp(name, ":method") == 0) {
        p->vary_method = 1;
      } else if (name != NULL && strcmp(name, ":path") == 0) {
        p->vary_path = 1;
      } else if (name != NULL && strcmp(name, ":identity") == 0) {
        p->vary_identity = 1;
      } else if (name != NULL) {
        if ((p->vary[p->n_vary] = strdup(name)) == NULL)
          return luaL_error(L, "not enough memory");
        p->n_vary++;
      }
      lua_pop(L, 1);
    }
    vary_views(L, p);
  }
  lua_pop(L, 1);
  /* Most requests carry no caller metadata: they all share one empty,
   * read-only table instead of allocating one per call. */
  om__policy_push_metadata(L, NULL);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &K_EMPTY);
  /* Create the view's registry fields now, so that replacing them per
   * revision (build_peers) never allocates and cannot fail half-way. */
  lua_pushboolean(L, 0);
  lua_setfield(L, LUA_REGISTRYINDEX, OM_LUA_VIEW);
  lua_pushboolean(L, 0);
  lua_setfield(L, LUA_REGISTRYINDEX, OM_LUA_VIEW_MD);
  lua_pushboolean(L, 0);
  lua_setfield(L, LUA_REGISTRYINDEX, OM_LUA_VIEW_GROUPS);
  lua_pushboolean(L, 0);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &K_PEERS);
  return 0;
}

typedef struct {
  om_policy_t *p;
  const char *name, *src;
  size_t len;
} load_arg_t;

/* What a policy that declares vary calls instead of chance or the clock:
 * its decisions are reused for every request that agrees on the declared
 * fields, so nothing else may be among their inputs. */
static int vary_not_available(lua_State *L) {
  luaL_where(L, 1);
  lua_pushfstring(L,
                  "%s is not available to a policy that declares vary (its "
                  "decisions are reused: they may depend only on the "
                  "declared fields and the peers)",
                  lua_tostring(L, lua_upvalueindex(1)));
  lua_concat(L, 2);
  return lua_error(L);
}

/*
 * Chance and the clock in the policy's own _ENV are guards, put there
 * before its top level runs: a guard calls the function it stands for
 * (upvalue 2) until the policy is sealed, then raises. Sealing is a flag,
 * not a swap of the table entries, so a top-level capture
 * (`local r = math.random`) holds a guard and is sealed with the rest.
 */
static int vary_guard(lua_State *L) {
  int status, sealed = lua_rawgetp(L, LUA_REGISTRYINDEX, &K_SEALED) != LUA_TNIL;
  lua_pop(L, 1);
  if (sealed)
    return vary_not_available(L);
  lua_pushvalue(L, lua_upvalueindex(2));
  lua_insert(L, 1);
  status = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
  if (status != LUA_OK) {
    /* its own error ("bad argument #1 to 'math.random' ..."), at the
     * policy's line as if the policy had called it directly; any other
     * error object is raised again as it is (a memory error then arrives
     * as a runtime one, but these functions allocate only to build such a
     * message) */
    if (status == LUA_ERRRUN && lua_type(L, -1) == LUA_TSTRING) {
      luaL_where(L, 1);
      lua_insert(L, -2);
      lua_concat(L, 2);
    }
    return lua_error(L);
  }
  return lua_gettop(L);
}

static void vary_guard_env(lua_State *L, om_sandbox_t *sb) {
  static const char *const guarded[][2] = {{"math", "random"},
                                           {"math", "randomseed"},
                                           {"os", "time"},
                                           {"os", "clock"}};
  om_sandbox_push_env(sb); /* [env] */
  for (size_t i = 0; i < sizeof guarded / sizeof guarded[0]; i++) {
    if (lua_getfield(L, -1, guarded[i][0]) != LUA_TTABLE) { /* [env, lib] */
      lua_pop(L, 1);
      continue;
    }
    if (lua_getfield(L, -1, guarded[i][1]) == LUA_TFUNCTION) { /* [.., f] */
      lua_pushfstring(L, "%s.%s", guarded[i][0], guarded[i][1]);
      lua_insert(L, -2);
      lua_pushcclosure(L, vary_guard, 2); /* [env, lib, guard] */
      lua_setfield(L, -2, guarded[i][1]);
    } else {
      lua_pop(L, 1);
    }
    lua_pop(L, 1); /* [env] */
  }
  lua_pop(L, 1);
}

/*
 * Everything that touches the new state runs here, protected and under
 * the budgets, so an allocation failure or a hostile policy can only end in
 * an error message, never in a panic.
 */
static int load_and_validate(lua_State *L) {
  const load_arg_t *a = lua_touserdata(L, 1);
  om_sandbox_t *sb = a->p->sb;
  lua_settop(L, 0);
  /* The validator first, before any policy code can run. */
  if (om_sandbox_require(sb, "openmesh.contract") != LUA_OK)
    return luaL_error(L, "cannot load openmesh.contract: %s",
                      lua_tostring(L, -1));
  lua_rawsetp(L, LUA_REGISTRYINDEX, &K_CONTRACT);
  vary_guard_env(L, sb);
  lua_pushfstring(L, "@%s", a->name);
  if (om_sandbox_load(sb, lua_tostring(L, -1), a->src, a->len) != LUA_OK)
    return lua_error(L); /* "name:line: message" */
  if (lua_type(L, -1) != LUA_TTABLE)
    return luaL_error(L, "%s: a policy must return a table, got %s", a->name,
                      luaL_typename(L, -1));
  if (rawfield(L, -1, "vary") == LUA_TTABLE) { /* before its examples */
    lua_pushboolean(L, 1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &K_SEALED);
  }
  lua_pop(L, 1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &K_POLICY);
  lua_settop(L, 0);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &K_CONTRACT);
  rawfield(L, 1, "validate"); /* [contract, validate] */
  lua_rawgetp(L, LUA_REGISTRYINDEX, &K_POLICY);
  lua_pushstring(L, a->name);
  lua_call(L, 2, 2); /* [contract, ok, msg] */
  if (!lua_toboolean(L, 2))
    return luaL_error(L, "%s: %s", a->name,
                      lua_isstring(L, 3) ? lua_tostring(L, 3)
                                         : "rejected by the validator");
  lua_settop(L, 0);
  lua_pushlightuserdata(L, a->p);
  capture(L);
  if (a->p->kind == 0)
    return luaL_error(L, "%s: field 'kind': unknown policy kind", a->name);
  return 0;
}

/*
 * The budgets of one route call: budget_ms of wall clock and
 * OM_POLICY_INSTR_PER_MS instructions per millisecond of it. A budget the
 * caller set in opts (tests, the Lua face's instr_limit / wall_limit_ms)
 * replaces the one derived from budget_ms: the caller asked for it.
 */
static void route_budgets(om_policy_t *p, const om_policy_opts_t *opts) {
  double ms = p->budget_ms;
  if (!(ms > 0) || ms > OM_POLICY_MAX_BUDGET_MS)
    ms = OM_POLICY_DEFAULT_BUDGET_MS;
  p->route_instr = (uint64_t)(ms * OM_POLICY_INSTR_PER_MS);
  p->route_wall_ns = (uint64_t)(ms * 1e6);
  if (p->route_instr == 0)
    p->route_instr = 1;
  if (p->route_wall_ns == 0)
    p->route_wall_ns = 1;
  if (opts->instr_limit != 0)
    p->route_instr = opts->instr_limit;
  if (opts->wall_limit_ns != 0)
    p->route_wall_ns = opts->wall_limit_ns;
}

double om_policy_budget_ms(const om_policy_t *p) {
  return (double)p->route_wall_ns / 1e6;
}

static int read_running_example(lua_State *L) {
  lua_Integer *out = lua_touserdata(L, 1);
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &K_CONTRACT) == LUA_TTABLE &&
      rawfield(L, -1, "running_example") == LUA_TNUMBER)
    *out = lua_tointeger(L, -1);
  return 0;
}

/* The example the validator was running when the load failed (0: none).
 * Runs after the budgeted call, protected, so a state at its memory cap
 * only loses the example number. */
static lua_Integer running_example(lua_State *L) {
  lua_Integer ex = 0;
  lua_pushcfunction(L, read_running_example);
  lua_pushlightuserdata(L, &ex);
  if (lua_pcall(L, 1, 0, 0) != LUA_OK)
    lua_pop(L, 1);
  return ex;
}

int om_policy_load(const om_policy_opts_t *opts, const char *name,
                   const char *src, size_t len, om_policy_t **out, char *err,
                   size_t errlen) {
  om_sandbox_opts_t so;
  om_policy_t *p;
  lua_State *L;
  load_arg_t a;
  int rc;
  om_errbuf(err, errlen, "%s", "");
  if (opts == NULL || opts->lib_dir == NULL || name == NULL || src == NULL ||
      out == NULL) {
    om_errbuf(err, errlen, "invalid arguments");
    return OM_EINVAL;
  }
  so = (om_sandbox_opts_t){.mem_limit = opts->mem_limit,
                           .instr_limit = opts->instr_limit,
                           .wall_limit_ns = opts->wall_limit_ns,
                           .lib_dir = opts->lib_dir};
  p = calloc(1, sizeof *p);
  if (p == NULL || (p->name = display_name(name)) == NULL ||
      (rc = om_sandbox_new(&so, &p->sb)) != 0) {
    om_policy_free(p);
    om_errbuf(err, errlen, "%s: out of memory", name);
    return OM_ENOMEM;
  }
  L = om_sandbox_state(p->sb);
  a = (load_arg_t){p, name, src, len};
  lua_pushcfunction(L, load_and_validate);
  lua_pushlightuserdata(L, &a);
  if (om_sandbox_call(p->sb, 1, 0) != LUA_OK) {
    /* A tripped budget unwound past the validator: name the file, and the
     * example that was running, as the validator names its own findings. */
    const char *msg = lua_tostring(L, -1);
    char prefix[300] = "";
    if (msg != NULL && strncmp(msg, "budget:", 7) == 0) {
      lua_Integer ex = running_example(L);
      if (ex > 0)
        snprintf(prefix, sizeof prefix, "%s: example %lld: ", name,
                 (long long)ex);
      else
        snprintf(prefix, sizeof prefix, "%s: ", name);
    }
    om_lua_errmsg(L, err, errlen, prefix);
    om_policy_free(p);
    return OM_EPOLICY;
  }
  route_budgets(p, opts);
  if (p->kind == OM_POLICY_TRAFFIC && (rc = om_policy_set_peers(p, NULL, 0))) {
    om_errbuf(err, errlen, "%s: out of memory", name);
    om_policy_free(p);
    return rc;
  }
  *out = p;
  return 0;
}

int om_policy_load_file(const om_policy_opts_t *opts, const char *path,
                        om_policy_t **out, char *err, size_t errlen) {
  FILE *f;
  char *buf = NULL;
  size_t len = 0, cap = 0, n;
  int rc;
  if (path == NULL) {
    om_errbuf(err, errlen, "invalid arguments");
    return OM_EINVAL;
  }
  f = fopen(path, "rb");
  if (f == NULL) {
    om_errbuf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    return OM_ENOTFOUND;
  }
  do {
    if (len == cap) {
      size_t ncap = cap ? cap * 2 : 8192;
      char *nbuf = ncap <= ((size_t)64 << 20) ? realloc(buf, ncap) : NULL;
      if (nbuf == NULL) {
        free(buf);
        fclose(f);
        om_errbuf(err, errlen, "%s: file too large or out of memory", path);
        return ncap <= ((size_t)64 << 20) ? OM_ENOMEM : OM_ETOOBIG;
      }
      buf = nbuf;
      cap = ncap;
    }
    n = fread(buf + len, 1, cap - len, f);
    len += n;
  } while (n > 0);
  if (ferror(f)) {
    om_errbuf(err, errlen, "%s: read error", path);
    free(buf);
    fclose(f);
    return OM_EINVAL;
  }
  fclose(f);
  rc = om_policy_load(opts, path, buf ? buf : "", len, out, err, errlen);
  free(buf);
  return rc;
}

void om_policy_free(om_policy_t *p) {
  if (p == NULL)
    return;
  om_sandbox_free(p->sb);
  free(p->seen);
  free(p->map.keys);
  free(p->map.index);
  free(p->view_md);
  for (size_t i = 0; i < p->n_vary; i++)
    free(p->vary[i]);
  free(p->vary);
  free(p->name);
  free(p);
}

int om_policy_vary(const om_policy_t *p, const char *const **names, size_t *n,
                   int *method, int *path, int *identity) {
  if (p == NULL || !p->vary_set)
    return 0;
  *names = (const char *const *)p->vary;
  *n = p->n_vary;
  *method = p->vary_method;
  *path = p->vary_path;
  *identity = p->vary_identity;
  return 1;
}

om_policy_kind_t om_policy_kind(const om_policy_t *p) {
  return p->kind;
}

const char *om_policy_name(const om_policy_t *p) {
  return p->name;
}

om_sandbox_t *om_policy_sandbox(om_policy_t *p) {
  return p->sb;
}

void om_policy_push(om_policy_t *p) {
  lua_rawgetp(om_sandbox_state(p->sb), LUA_REGISTRYINDEX, &K_POLICY);
}

void om_policy_push_contract(om_policy_t *p) {
  lua_rawgetp(om_sandbox_state(p->sb), LUA_REGISTRYINDEX, &K_CONTRACT);
}

size_t om_policy_peer_count(const om_policy_t *p) {
  return p->n_peers;
}

static void push_kv_table(lua_State *L, const om_policy_kv_t *kv, size_t n) {
  lua_createtable(L, 0, (int)n);
  for (size_t i = 0; i < n; i++) {
    lua_pushlstring(L, kv[i].name, kv[i].name_len);
    lua_pushlstring(L, kv[i].value, kv[i].value_len);
    lua_rawset(L, -3);
  }
}

typedef struct {
  const om_policy_peer_t *peers;
  size_t n;
  om_lua_view_md_t *md;
  const int32_t *prev; /* NULL, or per peer its index in the current view */
} peers_arg_t;

/* A C copy of the peers' metadata, in one allocation (see om_lua.h). */
static om_lua_view_md_t *copy_metadata(const om_policy_peer_t *peers,
                                       size_t n) {
  size_t entries = 0, bytes = 0, off;
  om_lua_view_md_t *v;
  size_t *first;
  om_lua_md_t *md;
  char *text;
  for (size_t i = 0; i < n; i++) {
    entries += peers[i].n_metadata;
    for (size_t j = 0; j < peers[i].n_metadata; j++)
      bytes += peers[i].metadata[j].name_len + peers[i].metadata[j].value_len;
  }
  off = sizeof *v + (n + 1) * sizeof *first;
  off = (off + 15) & ~(size_t)15;
  v = malloc(off + entries * sizeof *md + bytes + 1);
  if (v == NULL)
    return NULL;
  first = (size_t *)(v + 1);
  md = (om_lua_md_t *)((char *)v + off);
  text = (char *)(md + entries);
  entries = 0;
  for (size_t i = 0; i < n; i++) {
    first[i] = entries;
    for (size_t j = 0; j < peers[i].n_metadata; j++) {
      const om_policy_kv_t *kv = &peers[i].metadata[j];
      md[entries] =
          (om_lua_md_t){text, text + kv->name_len, kv->name_len, kv->value_len};
      memcpy(text, kv->name, kv->name_len);
      memcpy(text + kv->name_len, kv->value, kv->value_len);
      text += kv->name_len + kv->value_len;
      entries++;
    }
  }
  first[n] = entries;
  v->n = n;
  v->first = first;
  v->md = md;
  return v;
}

/* Build {peer, ...} and store it as the view. Runs protected. */
static int build_peers(lua_State *L) {
  const peers_arg_t *a = lua_touserdata(L, 1);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &K_PEERS); /* [a, old] */
  lua_createtable(L, (int)a->n, 0);            /* [a, old, peers] */
  for (size_t i = 0; i < a->n; i++) {
    const om_policy_peer_t *pe = &a->peers[i];
    if (a->prev != NULL && a->prev[i] >= 0 && lua_istable(L, 2)) {
      /* unchanged since the current view: the same table */
      if (lua_rawgeti(L, 2, (lua_Integer)a->prev[i] + 1) == LUA_TTABLE) {
        lua_rawseti(L, -2, (lua_Integer)i + 1);
        continue;
      }
      lua_pop(L, 1);
    }
    lua_createtable(L, 0, 5); /* [a, old, peers, peer] */
    lua_pushstring(L, pe->id);
    lua_setfield(L, -2, "id");
    lua_pushstring(L, pe->url != NULL ? pe->url : "");
    lua_setfield(L, -2, "url");
    lua_pushnumber(L, pe->weight);
    lua_setfield(L, -2, "weight");
    if (pe->zone != NULL) {
      lua_pushstring(L, pe->zone);
      lua_setfield(L, -2, "zone");
    }
    push_kv_table(L, pe->metadata, pe->n_metadata);
    lua_setfield(L, -2, "metadata");
    lua_rawseti(L, -2, (lua_Integer)i + 1); /* peers[i+1] = peer */
  }
  /* The fields exist (capture), so none of these sets allocates. */
  lua_createtable(L, 0, 0); /* [a, peers, groups]: none yet for this view */
  lua_setfield(L, LUA_REGISTRYINDEX, OM_LUA_VIEW_GROUPS);
  lua_pushlightuserdata(L, a->md);
  lua_setfield(L, LUA_REGISTRYINDEX, OM_LUA_VIEW_MD);
  lua_pushvalue(L, -1);
  lua_setfield(L, LUA_REGISTRYINDEX, OM_LUA_VIEW);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &K_PEERS);
  return 0;
}

/* Fill the map from the view just built (raw reads: no allocation). */
static void map_fill(om__peer_map_t *m, lua_State *L, size_t n) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &K_PEERS);
  for (size_t i = 0; i < n; i++) {
    lua_rawgeti(L, -1, (lua_Integer)i + 1);
    om__peer_map_put(m, lua_topointer(L, -1), (uint32_t)i);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

int om_policy_set_peers(om_policy_t *p, const om_policy_peer_t *peers,
                        size_t n) {
  int rc = om_policy_set_peers_from(p, peers, n, NULL, 0, 0);
  if (rc == 0)
    p->peers_tagged = 0;
  return rc;
}

int om_policy_set_peers_from(om_policy_t *p, const om_policy_peer_t *peers,
                             size_t n, const int32_t *prev, uint64_t prev_tag,
                             uint64_t tag) {
  lua_State *L = om_sandbox_state(p->sb);
  peers_arg_t a = {peers, n, NULL, NULL};
  om__peer_map_t map = {0};
  uint32_t *seen;
  size_t slots = om__peer_map_slots(n);
  if (p->kind != OM_POLICY_TRAFFIC || (peers == NULL && n > 0) ||
      n > UINT32_MAX / 4)
    return OM_EINVAL;
  for (size_t i = 0; i < n; i++)
    if (peers[i].id == NULL)
      return OM_EINVAL;
  if (prev != NULL && p->peers_tagged && p->peers_tag == prev_tag)
    a.prev = prev;
  seen = calloc(n ? n : 1, sizeof *seen);
  map.keys = calloc(slots, sizeof *map.keys);
  map.index = calloc(slots, sizeof *map.index);
  map.mask = slots - 1;
  a.md = copy_metadata(peers, n);
  if (seen == NULL || map.keys == NULL || map.index == NULL || a.md == NULL)
    goto nomem;
  lua_settop(L, 0);
  lua_pushcfunction(L, build_peers);
  lua_pushlightuserdata(L, &a);
  if (om_sandbox_call(p->sb, 1, 0) != LUA_OK) {
    lua_settop(L, 0);
    goto nomem; /* only allocation can fail in build_peers */
  }
  map_fill(&map, L, n);
  free(p->seen);
  free(p->map.keys);
  free(p->map.index);
  free(p->view_md);
  p->view_md = a.md;
  p->seen = seen;
  p->map = map;
  p->stamp = 0;
  p->n_peers = n;
  p->peers_tag = tag;
  p->peers_tagged = 1;
  return 0;
nomem:
  free(seen);
  free(map.keys);
  free(map.index);
  free(a.md);
  return OM_ENOMEM;
}

/* req.identity: { subject, uris, dns, spiffe } or nothing pushed. */
static void push_identity(lua_State *L, const om_policy_identity_t *id) {
  const char *spiffe = NULL;
  lua_createtable(L, 0, 4); /* [.., identity] */
  lua_pushstring(L, id->subject != NULL ? id->subject : "");
  lua_setfield(L, -2, "subject");
  lua_createtable(L, (int)id->n_uris, 0);
  for (size_t i = 0; i < id->n_uris; i++) {
    lua_pushstring(L, id->uris[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
    if (spiffe == NULL && strncmp(id->uris[i], "spiffe://", 9) == 0)
      spiffe = id->uris[i];
  }
  lua_setfield(L, -2, "uris");
  lua_createtable(L, (int)id->n_dns, 0);
  for (size_t i = 0; i < id->n_dns; i++) {
    lua_pushstring(L, id->dns[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  lua_setfield(L, -2, "dns");
  if (spiffe != NULL) {
    lua_pushstring(L, spiffe);
    lua_setfield(L, -2, "spiffe");
  }
}

const om_policy_kv_t *om_policy_req_header(const om_policy_req_t *req,
                                           const char *name) {
  size_t nl = strlen(name);
  const om_policy_kv_t *found = NULL;
  for (size_t i = 0; i < req->n_headers; i++) /* the last one wins, as in */
    if (req->headers[i].name_len == nl &&     /* the headers table */
        memcmp(req->headers[i].name, name, nl) == 0)
      found = &req->headers[i];
  return found;
}

/*
 * authorize(req) with req at index 1: 0 to go on; 1 when it refused
 * (p->denied, p->reason set); raises on any other answer, so the call
 * fails as a policy error. Runs protected.
 */
static int run_authorize(lua_State *L, om_policy_t *p) {
  char msg[512];
  int rc;
  if (!p->has_authorize)
    return 0;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &K_AUTHORIZE);
  lua_pushvalue(L, 1);
  lua_call(L, 1, 2); /* [req, ok, reason] */
  rc = om__policy_check_authorize(L, 2, p->reason, msg, sizeof msg);
  if (rc < 0) {
    p->bad_answer = 1;
    return luaL_error(L, "%s", msg);
  }
  lua_settop(L, 1);
  p->denied = rc == 1;
  return rc;
}

/* req.grpc = {service, method} of a gRPC call; req is at index 1. */
static void push_grpc(lua_State *L, const om_policy_req_t *req) {
  if (req->grpc_service == NULL || req->grpc_method == NULL)
    return;
  lua_createtable(L, 0, 2);
  lua_pushlstring(L, req->grpc_service, req->grpc_service_len);
  lua_setfield(L, -2, "service");
  lua_pushlstring(L, req->grpc_method, req->grpc_method_len);
  lua_setfield(L, -2, "method");
  lua_setfield(L, 1, "grpc");
}

/* authorize(req), then key(req), subset(req, peers) and, when the caller
 * asked for a decision (argument 4) and the policy has one, decide(req)
 * into it: returns key, result, or nothing when authorize refused. Runs
 * protected. */
static int call_route(lua_State *L) {
  char msg[512];
  const om_policy_req_t *req = lua_touserdata(L, 1);
  om_policy_t *p = lua_touserdata(L, 2);
  int only_authorize = lua_toboolean(L, 3);
  om_policy_decision_t *dec = lua_touserdata(L, 4);
  lua_settop(L, 0);
  lua_createtable(L, 0, 5); /* [req] */
  lua_pushstring(L, req->service != NULL ? req->service : "");
  lua_setfield(L, 1, "service");
  if (p->vary_set) {
    /* only what the policy declared (openmesh.contract.visible_req) */
    if (p->vary_method) {
      lua_pushstring(L, req->method != NULL ? req->method : "GET");
      lua_setfield(L, 1, "method");
    }
    if (p->vary_path) {
      lua_pushstring(L, req->path != NULL ? req->path : "/");
      lua_setfield(L, 1, "path");
    }
    lua_createtable(L, 0, (int)p->n_vary);
    for (size_t i = 0; i < p->n_vary; i++) {
      const om_policy_kv_t *kv = om_policy_req_header(req, p->vary[i]);
      if (kv == NULL)
        continue;
      lua_pushlstring(L, kv->value, kv->value_len);
      lua_setfield(L, -2, p->vary[i]);
    }
    lua_rawgetp(L, LUA_REGISTRYINDEX, &K_VARY_HEADERS);
    lua_setmetatable(L, -2);
    lua_setfield(L, 1, "headers");
    lua_rawgetp(L, LUA_REGISTRYINDEX, &K_VARY_METADATA);
    lua_setfield(L, 1, "metadata");
    if (p->vary_identity && req->identity != NULL) {
      push_identity(L, req->identity);
      lua_setfield(L, 1, "identity");
    }
    if (p->vary_path)
      push_grpc(L, req);
    lua_rawgetp(L, LUA_REGISTRYINDEX, &K_VARY_REQ);
    lua_setmetatable(L, 1);
    goto call;
  }
  lua_pushstring(L, req->method != NULL ? req->method : "GET");
  lua_setfield(L, 1, "method");
  lua_pushstring(L, req->path != NULL ? req->path : "/");
  lua_setfield(L, 1, "path");
  push_kv_table(L, req->headers, req->n_headers);
  lua_setfield(L, 1, "headers");
  if (req->n_metadata == 0)
    lua_rawgetp(L, LUA_REGISTRYINDEX, &K_EMPTY);
  else
    push_kv_table(L, req->metadata, req->n_metadata);
  lua_setfield(L, 1, "metadata");
  if (req->identity != NULL) {
    push_identity(L, req->identity);
    lua_setfield(L, 1, "identity");
  }
  push_grpc(L, req);
call:
  if (run_authorize(L, p) != 0 || only_authorize)
    return 0;
  if (p->has_key) {
    lua_rawgetp(L, LUA_REGISTRYINDEX, &K_KEY);
    lua_pushvalue(L, 1);
    lua_call(L, 1, 1); /* [req, key] */
    if (om__policy_check_key(L, 2, msg, sizeof msg) != 0) {
      p->bad_answer = 1;
      return luaL_error(L, "%s", msg);
    }
  } else {
    lua_pushnil(L);
  }
  lua_rawgetp(L, LUA_REGISTRYINDEX, &K_SUBSET);
  lua_pushvalue(L, 1);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &K_PEERS);
  lua_call(L, 2, 1); /* [req, key, result] */
  if (dec != NULL && p->has_decide) {
    int rc;
    lua_rawgetp(L, LUA_REGISTRYINDEX, &K_DECIDE);
    lua_pushvalue(L, 1);
    lua_call(L, 1, 1); /* [req, key, result, decision] */
    rc = om__policy_check_decision(L, 4, dec, msg, sizeof msg);
    if (rc < 0) {
      p->bad_answer = 1;
      return luaL_error(L, "%s", msg);
    }
    p->decided = rc == 1;
    lua_settop(L, 3);
  }
  return 2;
}

/* A route call raised: a budget, a check of its answer, or its code. */
static void call_failed(om_policy_t *p) {
  p->failure = om_sandbox_last_trip(p->sb) != OM_SANDBOX_TRIP_NONE
                   ? OM_POLICY_FAIL_BUDGET
               : p->bad_answer ? OM_POLICY_FAIL_ANSWER
                               : OM_POLICY_FAIL_RUNTIME;
}

int om_policy_last_failure(const om_policy_t *p) {
  return p->failure;
}

int om_policy_route(om_policy_t *p, const om_policy_req_t *req, uint32_t *out,
                    size_t *n_out, const char **key, size_t *key_len, char *err,
                    size_t errlen) {
  return om_policy_route_view(p, req, out, n_out, NULL, key, key_len, err,
                              errlen);
}

int om_policy_route_view(om_policy_t *p, const om_policy_req_t *req,
                         uint32_t *out, size_t *n_out, int *all,
                         const char **key, size_t *key_len, char *err,
                         size_t errlen) {
  return om_policy_route_decide(p, req, out, n_out, all, key, key_len, NULL,
                                NULL, err, errlen);
}

int om_policy_has_decide(const om_policy_t *p) {
  return p != NULL && p->has_decide;
}

int om_policy_route_decide(om_policy_t *p, const om_policy_req_t *req,
                           uint32_t *out, size_t *n_out, int *all,
                           const char **key, size_t *key_len,
                           om_policy_decision_t *decision, int *decided,
                           char *err, size_t errlen) {
  lua_State *L = om_sandbox_state(p->sb);
  int res, rc;
  if (all != NULL)
    *all = 0;
  if (decided != NULL)
    *decided = 0;
  if (p->kind != OM_POLICY_TRAFFIC || req == NULL || n_out == NULL ||
      (out == NULL && p->n_peers > 0)) {
    om_errbuf(err, errlen, "invalid arguments");
    return OM_EINVAL;
  }
  p->denied = 0;
  p->decided = 0;
  p->failure = OM_POLICY_FAIL_NONE;
  p->bad_answer = 0;
  lua_settop(L, 0);
  lua_pushcfunction(L, call_route);
  lua_pushlightuserdata(L, (void *)req);
  lua_pushlightuserdata(L, p);
  lua_pushboolean(L, 0);
  lua_pushlightuserdata(L, decided != NULL ? decision : NULL);
  if (om_sandbox_call_limited(p->sb, 4, 2, p->route_instr, p->route_wall_ns) !=
      LUA_OK) {
    call_failed(p);
    om_lua_errmsg(L, err, errlen, "");
    lua_settop(L, 0);
    return OM_EPOLICY;
  }
  if (p->denied) {
    om_errbuf(err, errlen, "%s", p->reason);
    if (key != NULL)
      *key = NULL;
    *n_out = 0;
    lua_settop(L, 0);
    return OM_POLICY_DENIED;
  }
  /* [key, result]: raw reads only from here on */
  if (decided != NULL)
    *decided = p->decided;
  if (key != NULL)
    *key = lua_tolstring(L, 1, key_len); /* NULL for nil */
  res = 2;
  /* `return peers`: the view itself (its length unchanged), every peer
   * once, so no entry needs looking at */
  lua_rawgetp(L, LUA_REGISTRYINDEX, &K_PEERS); /* [key, result, peers] */
  if (lua_rawequal(L, res, 3) && lua_rawlen(L, res) == p->n_peers) {
    lua_settop(L, 2);
    *n_out = p->n_peers;
    if (all != NULL) {
      *all = 1;
      return 0;
    }
    for (size_t i = 0; i < p->n_peers; i++)
      out[i] = (uint32_t)i;
    return 0;
  }
  lua_settop(L, 2);
  /* a group of om.peers_by for this view, its length unchanged: its index
   * list is the answer, copied without walking the table */
  if (lua_type(L, res) == LUA_TTABLE &&
      lua_getfield(L, LUA_REGISTRYINDEX, OM_LUA_VIEW_GROUPS) == LUA_TTABLE) {
    const om_lua_group_t *g;
    lua_pushvalue(L, res); /* [key, result, groups, result] */
    if (lua_rawget(L, 3) == LUA_TUSERDATA &&
        (g = lua_touserdata(L, -1)) != NULL && g->n <= p->n_peers &&
        lua_rawlen(L, res) == g->n) {
      memcpy(out, g->ids, g->n * sizeof *out);
      *n_out = g->n;
      lua_settop(L, 2);
      return 0;
    }
  }
  lua_settop(L, 2);
  if (p->stamp >= UINT32_MAX - 3) { /* about to wrap: start over */
    memset(p->seen, 0, p->n_peers * sizeof *p->seen);
    p->stamp = 0;
  }
  p->stamp += 2; /* the check marks with stamp and stamp + 1 */
  rc = om__policy_check_subset(L, res, &p->map, p->n_peers, p->seen, p->stamp,
                               out, n_out, err, errlen);
  lua_settop(L, 2);
  if (rc != 0)
    p->failure = OM_POLICY_FAIL_ANSWER;
  return rc == 0 ? 0 : OM_EPOLICY;
}

int om_policy_authorize(om_policy_t *p, const om_policy_req_t *req, char *err,
                        size_t errlen) {
  lua_State *L = om_sandbox_state(p->sb);
  if (p->kind != OM_POLICY_TRAFFIC || req == NULL) {
    om_errbuf(err, errlen, "invalid arguments");
    return OM_EINVAL;
  }
  om_errbuf(err, errlen, "%s", "");
  if (!p->has_authorize)
    return 0;
  p->denied = 0;
  p->failure = OM_POLICY_FAIL_NONE;
  p->bad_answer = 0;
  lua_settop(L, 0);
  lua_pushcfunction(L, call_route);
  lua_pushlightuserdata(L, (void *)req);
  lua_pushlightuserdata(L, p);
  lua_pushboolean(L, 1);
  if (om_sandbox_call_limited(p->sb, 3, 0, p->route_instr, p->route_wall_ns) !=
      LUA_OK) {
    call_failed(p);
    om_lua_errmsg(L, err, errlen, "");
    lua_settop(L, 0);
    return OM_EPOLICY;
  }
  lua_settop(L, 0);
  if (!p->denied)
    return 0;
  om_errbuf(err, errlen, "%s", p->reason);
  return OM_POLICY_DENIED;
}

int om_policy_has_authorize(const om_policy_t *p) {
  return p != NULL && p->has_authorize;
}
