/*
 * om_sandbox.c: the policy state (see om_sandbox.h for the contract).
 *
 * Nothing is opened and then pruned: the state opens only the libraries the
 * allow-list copies from (base, string, table, math, utf8, coroutine, os for
 * time/clock), and policy code sees only the _ENV table built here. The real
 * globals and the registry are never reachable from policy code: there is no
 * debug library and `load` always receives the sandbox _ENV.
 */
#include "om_sandbox.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <lauxlib.h>
#include <lualib.h>

#include "om_errno.h"
#include "om_lpattern.h"
#include "om_lua.h"

#define HOOK_EVERY 1000 /* instructions between two budget checks */
#define GRACE_SLICES 8  /* of an eighth of the wall-clock cap each */
#define DEFAULT_MEM_LIMIT ((size_t)32 << 20)
#define DEFAULT_INSTR_LIMIT 10000000u
#ifndef DEFAULT_WALL_LIMIT_NS /* a profiling build under valgrind raises it */
#define DEFAULT_WALL_LIMIT_NS 100000000u
#endif
#define REG_ENV "openmesh.sandbox.env"
#define REG_LIBENV "openmesh.sandbox.libenv"
#define REG_LOADED "openmesh.sandbox.loaded"

enum { TRIP_NONE, TRIP_INSTR, TRIP_WALL };

struct om_sandbox_s {
  lua_State *L;
  size_t used, peak, limit;
  uint64_t instr_limit, wall_limit_ns;
  uint64_t ticks_left;   /* hook ticks left in the current call */
  uint64_t deadline_ns;  /* wall-clock end of the current call */
  uint64_t call_wall_ns; /* the wall-clock cap of the current call */
  uint64_t grace_cpu;    /* thread CPU clock when the grace slice began; 0:
                            the wall-clock cap has not passed yet */
  uint64_t grace_mono;   /* the monotonic clock at the same moment */
  unsigned grace_slices; /* grace slices granted in this call */
  int armed;             /* a call is running under budgets */
  int tripped;           /* TRIP_*: stays set until the next call */
  int last_trip;         /* OM_SANDBOX_TRIP_* of the last outer call */
  int cap_refused;       /* the memory cap refused a block in this call */
  uint64_t pattern_cap;  /* steps per pattern call in the current call: half
                            its instruction budget */
  int clock_fixed;       /* os.time()/os.clock() read clock_s, not the host */
  double clock_s;        /* the fixed reading, seconds since the epoch */
  char where[96];        /* "chunk:line" of the frame a budget tripped in
                            ("": unknown), reset when an outer call starts */
  char *lib_dir;
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The accounting allocator: a hard cap on growth, never a refused shrink. */
static void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  om_sandbox_t *sb = ud;
  void *p;
  if (ptr == NULL)
    osize = 0;
  if (nsize == 0) {
    free(ptr);
    sb->used -= osize;
    return NULL;
  }
  if (nsize > osize && nsize - osize > sb->limit - sb->used) {
    sb->cap_refused = 1; /* the policy's doing, not the host's malloc */
    return NULL;
  }
  p = realloc(ptr, nsize);
  if (p == NULL)
    return nsize <= osize ? ptr : NULL; /* a failed shrink keeps the block */
  sb->used = sb->used - osize + nsize;
  if (sb->used > sb->peak)
    sb->peak = sb->used;
  return p;
}

/* This thread's CPU time; 0 when the clock is unavailable. */
static uint64_t cpu_ns(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
    return 0;
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec + 1;
}

/*
 * The wall-clock cap passed at now: was the call running, or was the
 * process descheduled (a loaded machine) and the clock ran without it?
 * The first time, the call gets a grace slice of an eighth of its cap,
 * timed on both clocks; at its end the call trips only if it had the CPU
 * for at least half of the slice. Otherwise a new slice starts: time off
 * the CPU is not charged to the policy, up to GRACE_SLICES slices (so a
 * call ends by twice its cap whatever the machine does). A call over its
 * cap on a machine that gives it the CPU holds the loop about 1.125 times
 * its cap. The thread's CPU clock is a system call (about 1.7 us on the
 * reference machine): it is read only here, never per tick, so a call
 * within its cap never pays for it. Returns 1 to keep going.
 */
static int wall_forgiven(om_sandbox_t *sb, uint64_t now) {
  uint64_t cpu = cpu_ns(), slice = sb->call_wall_ns / 8;
  if (cpu == 0)
    return 0; /* no CPU clock: the wall clock decides */
  if (sb->grace_cpu != 0 &&
      (cpu - sb->grace_cpu >= (now - sb->grace_mono) / 2 ||
       sb->grace_slices >= GRACE_SLICES))
    return 0;
  sb->grace_slices++;
  sb->grace_cpu = cpu;
  sb->grace_mono = now;
  sb->deadline_ns = now + (slice > 0 ? slice : 1);
  return 1;
}

static om_sandbox_t *sandbox_of(lua_State *L) {
  void *ud;
  lua_getallocf(L, &ud);
  return ud;
}

/* Is the frame in ar library code (lib_dir), not the policy's? */
static int in_lib(const om_sandbox_t *sb, const lua_Debug *ar) {
  size_t n = sb->lib_dir != NULL ? strlen(sb->lib_dir) : 0;
  return n > 0 && ar->source[0] == '@' &&
         strncmp(ar->source + 1, sb->lib_dir, n) == 0;
}

/*
 * Record where a budget tripped: the running Lua frame, or, when that is
 * the openmesh.* library (validating what the policy returned), the
 * nearest caller that is policy code, which is the line the author can
 * change. Only called from the hook, where the frames are consistent;
 * lua_getinfo with "Sl" does not allocate.
 */
static void note_where(om_sandbox_t *sb, lua_State *L, lua_Debug *ar) {
  lua_Debug up;
  const lua_Debug *at = ar;
  if (!lua_getinfo(L, "Sl", ar))
    return;
  if (in_lib(sb, ar))
    for (int level = 1; lua_getstack(L, level, &up); level++)
      if (lua_getinfo(L, "Sl", &up) && up.currentline > 0 && !in_lib(sb, &up)) {
        at = &up;
        break;
      }
  if (at->currentline > 0)
    snprintf(sb->where, sizeof sb->where, "%s:%d", at->short_src,
             at->currentline);
}

static const char *trip_message(int tripped) {
  return tripped == TRIP_WALL ? "budget: wall-clock limit exceeded"
                              : "budget: instruction limit exceeded";
}

/*
 * The count hook. Once a budget trips it re-arms itself to fire on every
 * instruction of whichever coroutine runs next, and raises each time, so a
 * pcall in the policy cannot swallow the error and keep going.
 */
static void budget_hook(lua_State *L, lua_Debug *ar) {
  om_sandbox_t *sb = sandbox_of(L);
  if (!sb->armed)
    return;
  if (!sb->tripped) {
    if (lua_gethookcount(L) != HOOK_EVERY) /* a coroutine tripped earlier */
      lua_sethook(L, budget_hook, LUA_MASKCOUNT, HOOK_EVERY);
    uint64_t now;
    /* The memory cap refuses inside the allocator, where the frames may be
     * half-built: past half the cap, note where the call runs at each
     * tick instead, so a refusal can say near which line it came. */
    if (sb->used > sb->limit / 2)
      note_where(sb, L, ar);
    if (sb->ticks_left > 0)
      sb->ticks_left--;
    if (sb->ticks_left == 0) {
      sb->tripped = TRIP_INSTR;
    } else {
      now = now_ns();
      if (now < sb->deadline_ns || wall_forgiven(sb, now))
        return;
      sb->tripped = TRIP_WALL;
    }
    sb->where[0] = '\0';
    note_where(sb, L, ar);
  }
  lua_sethook(L, budget_hook, LUA_MASKCOUNT, 1);
  luaL_error(L, "%s", trip_message(sb->tripped));
}

/* setmetatable that refuses __gc: a policy finalizer would run unbudgeted. */
static int sandbox_setmetatable(lua_State *L) {
  if (lua_type(L, 2) == LUA_TTABLE &&
      lua_getfield(L, 2, "__gc") != LUA_TNIL) /* __index cannot hide it */
    return luaL_error(L, "setmetatable: __gc metamethods are not allowed "
                         "in policies");
  lua_settop(L, 2);
  lua_pushvalue(L, lua_upvalueindex(1)); /* [t, mt, setmetatable] */
  lua_insert(L, 1);
  lua_call(L, 2, 1);
  return 1;
}

/*
 * xpcall(f, msgh, ...): the handler runs after the stack has unwound, never
 * inside the error. A stock message handler runs while Lua is still inside
 * the raising hook, where hooks are off (ldo.c luaD_hook), so a handler that
 * loops would escape every budget. A budget error is re-raised untouched.
 */
static int sandbox_xpcall(lua_State *L) {
  int n = lua_gettop(L);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_pushvalue(L, 1); /* [f, msgh, args..., f] */
  for (int i = 3; i <= n; i++)
    lua_pushvalue(L, i);
  if (lua_pcall(L, n - 2, LUA_MULTRET, 0) == LUA_OK) {
    lua_pushboolean(L, 1);
    lua_insert(L, n + 1); /* [f, msgh, args..., true, results...] */
    return lua_gettop(L) - n;
  }
  if (sandbox_of(L)->tripped)
    return lua_error(L);
  lua_pushvalue(L, 2); /* [..., err, msgh] */
  lua_insert(L, -2);
  if (lua_pcall(L, 1, 1, 0) != LUA_OK && sandbox_of(L)->tripped)
    return lua_error(L);
  lua_pushboolean(L, 0);
  lua_insert(L, -2);
  return 2;
}

/* load(chunk [, name [, mode [, env]]]): text only, _ENV defaults to ours. */
static int sandbox_load(lua_State *L) {
  const char *mode = luaL_optstring(L, 3, "t");
  int has_env = !lua_isnone(L, 4);
  if (strcmp(mode, "t") != 0)
    return luaL_argerror(L, 3, "only text chunks (mode \"t\") may be loaded");
  lua_settop(L, 4);
  lua_pushvalue(L, lua_upvalueindex(1)); /* [chunk, name, mode, env, load] */
  lua_insert(L, 1);
  lua_pushliteral(L, "t");
  lua_replace(L, 4);
  if (!has_env) {
    lua_getfield(L, LUA_REGISTRYINDEX, REG_ENV);
    lua_replace(L, 5);
  }
  lua_call(L, 4, 2);
  return 2;
}

/* string.rep that cannot spin on empty pieces or ask for absurd sizes. */
static int sandbox_rep(lua_State *L) {
  size_t l, lsep;
  luaL_checklstring(L, 1, &l);
  lua_Integer n = luaL_checkinteger(L, 2);
  luaL_optlstring(L, 3, "", &lsep);
  if (n <= 0 || l + lsep == 0) { /* the stock loop would run n times */
    lua_pushliteral(L, "");
    return 1;
  }
  if ((lua_Unsigned)n > sandbox_of(L)->limit / (l + lsep) + 1)
    return luaL_error(L, "string.rep: result exceeds the memory limit");
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

/*
 * os.time([t]) and os.clock() as policies see them: the host's, unless a
 * test fixed the reading (om_sandbox_set_clock). os.time with a date table
 * converts it as the stock one does; only the "now" readings are fixed.
 */
static int sandbox_time(lua_State *L) {
  const om_sandbox_t *sb = sandbox_of(L);
  if (sb->clock_fixed && lua_isnoneornil(L, 1)) {
    lua_pushinteger(L, (lua_Integer)floor(sb->clock_s));
    return 1;
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

static int sandbox_clock(lua_State *L) {
  const om_sandbox_t *sb = sandbox_of(L);
  if (sb->clock_fixed) {
    lua_pushnumber(L, (lua_Number)sb->clock_s);
    return 1;
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_call(L, 0, 1);
  return 1;
}

/* table.move loops in C without executing instructions: bound its range. */
static int sandbox_move(lua_State *L) {
  lua_Integer f = luaL_checkinteger(L, 2), e = luaL_checkinteger(L, 3);
  if (e >= f && (lua_Unsigned)e - (lua_Unsigned)f >= 1000000u)
    return luaL_error(L, "table.move: range longer than 1000000 elements");
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

static int load_lib_file(lua_State *L, om_sandbox_t *sb, const char *name) {
  char path[4096];
  FILE *f;
  luaL_Buffer b;
  size_t n;
  int len = snprintf(path, sizeof path, "%s/", sb->lib_dir);
  for (const char *c = name; *c && len < (int)sizeof path - 5; c++)
    path[len++] = *c == '.' ? '/' : *c;
  memcpy(path + len, ".lua", 5);
  f = fopen(path, "rb");
  if (f == NULL)
    return luaL_error(L, "module '%s' not found (%s)", name, strerror(errno));
  luaL_buffinit(L, &b);
  do {
    char *p = luaL_prepbuffer(&b);
    n = fread(p, 1, LUAL_BUFFERSIZE, f);
    luaL_addsize(&b, n);
  } while (n == LUAL_BUFFERSIZE);
  fclose(f);           /* before anything below can raise */
  luaL_pushresult(&b); /* [src] */
  lua_pushfstring(L, "@%s", path);
  if (luaL_loadbufferx(L, lua_tostring(L, -2), lua_rawlen(L, -2),
                       lua_tostring(L, -1), "t") != LUA_OK)
    return lua_error(L);
  lua_getfield(L, LUA_REGISTRYINDEX, REG_LIBENV);
  lua_setupvalue(L, -2, 1); /* its _ENV */
  lua_pushstring(L, name);
  lua_call(L, 1, 1);
  return 1;
}

/* require(name): only `openmesh` and `openmesh.*`, loaded once per state. */
static int sandbox_require(lua_State *L) {
  om_sandbox_t *sb = sandbox_of(L);
  const char *name = luaL_checkstring(L, 1);
  int ok_name = strcmp(name, "openmesh") == 0;
  if (!ok_name && strncmp(name, "openmesh.", 9) == 0 && name[9] != '\0') {
    ok_name = 1;
    for (const char *c = name + 9; *c; c++)
      if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_' ||
            (*c == '.' && c[1] != '.' && c[1] != '\0')))
        ok_name = 0;
  }
  if (!ok_name)
    return luaL_error(L,
                      "require: policies may only require 'openmesh' "
                      "and 'openmesh.*' (got '%s')",
                      name);
  lua_settop(L, 1);
  lua_getfield(L, LUA_REGISTRYINDEX, REG_LOADED); /* [name, loaded] */
  if (lua_getfield(L, 2, name) != LUA_TNIL)
    return 1;
  lua_pop(L, 1);
  if (name[8] == '\0') {
    lua_pushcfunction(L, luaopen_openmesh);
    lua_call(L, 0, 1);
  } else if (sb->lib_dir != NULL) {
    load_lib_file(L, sb, name + 0);
  } else {
    return luaL_error(L, "module '%s' not found (no library directory)", name);
  }
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lua_pushboolean(L, 1);
  }
  lua_pushvalue(L, -1);
  lua_setfield(L, 2, name);
  return 1;
}

/* Copy the named fields of the table at src into a new table on the top. */
static void copy_fields(lua_State *L, int src, const char *const *names) {
  lua_newtable(L);
  for (; *names != NULL; names++) {
    lua_getfield(L, src, *names);
    lua_setfield(L, -2, *names);
  }
}

/* Replace field `name` of the table on top with `fn` closing over the old. */
static void wrap_field(lua_State *L, const char *name, lua_CFunction fn) {
  lua_getfield(L, -1, name);
  lua_pushcclosure(L, fn, 1);
  lua_setfield(L, -2, name);
}

/*
 * Push a new _ENV built from the allow-list, copying from the real globals
 * at G. Policies and the openmesh.* library get separate ones, so a policy
 * that overwrites `pairs` or `require` in its _ENV cannot reach the
 * validator's.
 */
static void make_env(lua_State *L, int G) {
  static const char *const base[] = {
      "assert", "error",    "ipairs",       "next",     "pairs",    "pcall",
      "select", "tonumber", "tostring",     "type",     "rawequal", "rawget",
      "rawlen", "rawset",   "getmetatable", "_VERSION", NULL};
  static const char *const libs[] = {"string", "table",     "math",
                                     "utf8",   "coroutine", NULL};
  static const char *const os_fields[] = {"time", "clock", NULL};
  copy_fields(L, G, base); /* [env] */
  int env = lua_gettop(L);
  for (const char *const *lib = libs; *lib != NULL; lib++) {
    lua_getfield(L, G, *lib); /* [env, lib] */
    lua_newtable(L);          /* [env, lib, copy] */
    lua_pushnil(L);
    while (lua_next(L, -3)) { /* [env, lib, copy, k, v] */
      lua_pushvalue(L, -2);
      lua_insert(L, -2);
      lua_rawset(L, -4);
    }
    lua_setfield(L, env, *lib);
    lua_pop(L, 1);
  }
  lua_getfield(L, G, "os");
  copy_fields(L, lua_gettop(L), os_fields);
  wrap_field(L, "time", sandbox_time);
  wrap_field(L, "clock", sandbox_clock);
  lua_setfield(L, env, "os");
  lua_pop(L, 1);
  lua_getfield(L, G, "setmetatable");
  lua_pushcclosure(L, sandbox_setmetatable, 1);
  lua_setfield(L, env, "setmetatable");
  lua_pushcfunction(L, sandbox_xpcall);
  lua_setfield(L, env, "xpcall");
  lua_getfield(L, G, "load");
  lua_pushcclosure(L, sandbox_load, 1);
  lua_setfield(L, env, "load");
  lua_pushcfunction(L, sandbox_require);
  lua_setfield(L, env, "require");
  lua_pushvalue(L, env);
  lua_setfield(L, env, "_G");
}

static int build_env(lua_State *L) {
  static const luaL_Reg opened[] = {
      {LUA_GNAME, luaopen_base},       {LUA_STRLIBNAME, luaopen_string},
      {LUA_TABLIBNAME, luaopen_table}, {LUA_MATHLIBNAME, luaopen_math},
      {LUA_UTF8LIBNAME, luaopen_utf8}, {LUA_COLIBNAME, luaopen_coroutine},
      {LUA_OSLIBNAME, luaopen_os},     {NULL, NULL}};
  for (const luaL_Reg *lib = opened; lib->func != NULL; lib++) {
    luaL_requiref(L, lib->name, lib->func, 1);
    lua_pop(L, 1);
  }
  lua_pushglobaltable(L); /* [G] */
  int G = lua_gettop(L);

  /* The real string table backs every string's methods: fix it in place. */
  lua_getfield(L, G, "string"); /* [G, string] */
  lua_pushnil(L);
  lua_setfield(L, -2, "dump");
  wrap_field(L, "rep", sandbox_rep);
  /* The stock find/match/gmatch/gsub backtrack in C where the count hook
   * never fires. These count their steps as instructions, and a single call
   * may take half the instruction budget, so a blow-up is reported as
   * "pattern too complex" before the whole call's budget trips. */
  uint64_t steps = sandbox_of(L)->instr_limit / 2;
  om_lpattern_install_capped(L, -1,
                             steps == 0 ? 1
                             : steps < OM_LPATTERN_DEFAULT_STEPS
                                 ? steps
                                 : OM_LPATTERN_DEFAULT_STEPS,
                             &sandbox_of(L)->pattern_cap);
  lua_pop(L, 1);
  lua_getfield(L, G, "table");
  wrap_field(L, "move", sandbox_move);
  lua_pop(L, 1);
  lua_pushliteral(L, ""); /* protect the string metatable */
  lua_getmetatable(L, -1);
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 2);

  make_env(L, G); /* [G, env]: what policy code sees */
  lua_setfield(L, LUA_REGISTRYINDEX, REG_ENV);
  make_env(L, G); /* a second, pristine one for openmesh.* modules */
  lua_setfield(L, LUA_REGISTRYINDEX, REG_LIBENV);
  lua_newtable(L);
  lua_setfield(L, LUA_REGISTRYINDEX, REG_LOADED);
  lua_pushboolean(L, 1); /* luaopen_openmesh then offers only pure functions */
  lua_setfield(L, LUA_REGISTRYINDEX, OM_LUA_SANDBOXED);
  return 0;
}

int om_sandbox_new(const om_sandbox_opts_t *opts, om_sandbox_t **out) {
  om_sandbox_t *sb;
  if (out == NULL)
    return OM_EINVAL;
  sb = calloc(1, sizeof *sb);
  if (sb == NULL)
    return OM_ENOMEM;
  sb->limit = opts && opts->mem_limit ? opts->mem_limit : DEFAULT_MEM_LIMIT;
  sb->instr_limit =
      opts && opts->instr_limit ? opts->instr_limit : DEFAULT_INSTR_LIMIT;
  sb->wall_limit_ns =
      opts && opts->wall_limit_ns ? opts->wall_limit_ns : DEFAULT_WALL_LIMIT_NS;
  if (opts && opts->lib_dir) {
    sb->lib_dir = strdup(opts->lib_dir);
    if (sb->lib_dir == NULL)
      goto nomem;
  }
  sb->L = lua_newstate(sandbox_alloc, sb);
  if (sb->L == NULL)
    goto nomem;
  lua_sethook(sb->L, budget_hook, LUA_MASKCOUNT, HOOK_EVERY);
  /* Policy calls make short-lived garbage (req tables, result arrays) next
   * to a long-lived heap (the library, the peer view): generational
   * collection keeps each call from paying to re-mark the whole heap. */
  lua_gc(sb->L, LUA_GCGEN, 0, 0);
  lua_pushcfunction(sb->L, build_env);
  if (lua_pcall(sb->L, 0, 0, 0) != LUA_OK)
    goto nomem; /* only allocation can fail while building */
  *out = sb;
  return 0;
nomem:
  om_sandbox_free(sb);
  return OM_ENOMEM;
}

void om_sandbox_free(om_sandbox_t *sb) {
  if (sb == NULL)
    return;
  if (sb->L != NULL)
    lua_close(sb->L);
  free(sb->lib_dir);
  free(sb);
}

lua_State *om_sandbox_state(om_sandbox_t *sb) {
  return sb->L;
}

size_t om_sandbox_mem_used(const om_sandbox_t *sb) {
  return sb->used;
}

size_t om_sandbox_mem_peak(const om_sandbox_t *sb) {
  return sb->peak;
}

void om_sandbox_set_clock(om_sandbox_t *sb, int fixed, double now_s) {
  sb->clock_fixed = fixed != 0;
  sb->clock_s = fixed ? now_s : 0;
}

void om_sandbox_push_env(om_sandbox_t *sb) {
  lua_getfield(sb->L, LUA_REGISTRYINDEX, REG_ENV);
}

static int push_budget_message(lua_State *L) {
  const om_sandbox_t *sb = lua_touserdata(L, 1);
  if (sb->tripped)
    lua_pushstring(L, trip_message(sb->tripped));
  else
    lua_pushfstring(L, "budget: memory limit of %I bytes exceeded",
                    (lua_Integer)sb->limit);
  if (sb->where[0] != '\0')
    lua_pushfstring(L, " %s %s", sb->tripped ? "at" : "near", sb->where);
  else
    lua_pushliteral(L, "");
  lua_concat(L, 2);
  return 1;
}

int om_sandbox_call_limited(om_sandbox_t *sb, int nargs, int nresults,
                            uint64_t instr_limit, uint64_t wall_limit_ns) {
  lua_State *L = sb->L;
  int status, outer = !sb->armed;
  if (outer) { /* nested calls share the outer call's budget */
    uint64_t instr = instr_limit != 0 ? instr_limit : sb->instr_limit;
    uint64_t ticks = instr / HOOK_EVERY;
    sb->pattern_cap = instr / 2 > 0 ? instr / 2 : 1;
    sb->ticks_left = ticks > 0 ? ticks : 1;
    sb->call_wall_ns = wall_limit_ns != 0 ? wall_limit_ns : sb->wall_limit_ns;
    sb->deadline_ns = now_ns() + sb->call_wall_ns;
    sb->grace_cpu = 0;
    sb->grace_slices = 0;
    sb->cap_refused = 0;
    sb->tripped = TRIP_NONE;
    sb->where[0] = '\0';
    sb->armed = 1;
    lua_sethook(L, budget_hook, LUA_MASKCOUNT, HOOK_EVERY);
  }
  status = om_lua_pcall(L, nargs, nresults);
  if (outer) {
    sb->armed = 0;
    sb->last_trip = sb->tripped == TRIP_INSTR  ? OM_SANDBOX_TRIP_INSTR
                    : sb->tripped == TRIP_WALL ? OM_SANDBOX_TRIP_WALL
                    : status == LUA_ERRMEM && sb->cap_refused
                        ? OM_SANDBOX_TRIP_MEM
                        : OM_SANDBOX_TRIP_NONE;
    if (status != LUA_OK && (sb->tripped || status == LUA_ERRMEM)) {
      /* Replace the message with the budget's. Building it may allocate,
       * so it happens protected: were that to fail too, Lua's own
       * preallocated "not enough memory" stays. */
      lua_pop(L, 1);
      lua_pushcfunction(L, push_budget_message);
      lua_pushlightuserdata(L, sb);
      if (lua_pcall(L, 1, 1, 0) == LUA_OK)
        status = LUA_ERRRUN;
    }
  }
  return status;
}

int om_sandbox_call(om_sandbox_t *sb, int nargs, int nresults) {
  return om_sandbox_call_limited(sb, nargs, nresults, 0, 0);
}

int om_sandbox_last_trip(const om_sandbox_t *sb) {
  return sb->last_trip;
}

typedef struct {
  om_sandbox_t *sb;
  const char *name, *src;
  size_t len;
} chunk_arg_t;

/* Compile, give the chunk the policy _ENV, run it. Runs protected. */
static int load_chunk(lua_State *L) {
  const chunk_arg_t *a = lua_touserdata(L, 1);
  if (luaL_loadbufferx(L, a->src, a->len, a->name, "t") != LUA_OK)
    return lua_error(L);
  om_sandbox_push_env(a->sb);
  lua_setupvalue(L, -2, 1); /* the chunk's _ENV */
  lua_call(L, 0, 1);
  return 1;
}

int om_sandbox_load(om_sandbox_t *sb, const char *name, const char *src,
                    size_t len) {
  chunk_arg_t a = {sb, name, src, len};
  lua_pushcfunction(sb->L, load_chunk); /* light functions never allocate */
  lua_pushlightuserdata(sb->L, &a);
  return om_sandbox_call(sb, 1, 1);
}

static int require_c(lua_State *L) {
  const char *name = lua_touserdata(L, 1);
  lua_settop(L, 0);
  lua_pushstring(L, name);
  return sandbox_require(L);
}

int om_sandbox_require(om_sandbox_t *sb, const char *name) {
  lua_pushcfunction(sb->L, require_c);
  lua_pushlightuserdata(sb->L, (void *)name);
  return om_sandbox_call(sb, 1, 1);
}
