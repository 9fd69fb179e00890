/*
 * bench_lpattern.c: the budgeted pattern functions (om_lpattern) against the
 * stock string library on everyday patterns, both measured in this run.
 * Each figure is ns per call and the ratio ours / stock (1.0: same speed).
 */
#include "om_bench.h"

#include <lauxlib.h>
#include <lualib.h>

#include "om_lpattern.h"

#define ROUNDS 7

/* Each workload's body is a Lua function that does one call. */
typedef struct workload_s {
  const char *name;
  const char *setup; /* a chunk returning the function to time */
  int calls;         /* per round */
} workload_t;

static const workload_t workloads[] = {
    {"trim", /* the classic trim on a 1 KiB string */
     "local s = '   ' .. ('lorem ipsum '):rep(85) .. '   ' "
     "return function() return s:match('^%s*(.-)%s*$') end",
     20000},
    {"gmatch_kv", /* every key=value pair of a 10 KiB query string */
     "local t = {} for i = 1, 640 do t[i] = 'k' .. i .. '=v' .. i end "
     "local s = table.concat(t, '&') "
     "return function() local n = 0 "
     "  for k, v in s:gmatch('(%w+)=(%w+)') do n = n + 1 end return n end",
     300},
    {"find_plain", /* a needle near the end of 10 KiB, plain = true */
     "local s = ('abcdefgh'):rep(1280) .. 'needle.x' "
     "return function() return s:find('needle.x', 1, true) end",
     20000},
    {"find_nospecials", /* the same, found by the no-magic fast path */
     "local s = ('abcdefgh'):rep(1280) .. 'needle' "
     "return function() return s:find('needle') end",
     20000},
    {"find_class", /* the first number in 1 KiB of text */
     "local s = ('lorem ipsum '):rep(85) .. '12345' "
     "return function() return s:find('%d+') end",
     20000},
    {"gsub_space", /* collapse runs of blanks in 10 KiB */
     "local s = ('word  \\t other '):rep(700) "
     "return function() return s:gsub('%s+', ' ') end",
     300},
    {"match_request_line", /* a short subject: call overhead dominates */
     "local s = 'GET /index.html HTTP/1.1' "
     "return function() return s:match('^(%u+)%s+(%S+)%s+HTTP/(%d)%.(%d)$') "
     "end",
     200000},
};

static lua_State *new_state(int ours) {
  lua_State *L = luaL_newstate();
  if (L == NULL)
    exit(1);
  luaL_openlibs(L);
  if (ours) {
    lua_getglobal(L, "string");
    om_lpattern_install(L, -1, 0);
    lua_pop(L, 1);
  }
  return L;
}

/* Leave the workload's function at stack index 1. */
static void prepare(lua_State *L, const workload_t *w) {
  lua_settop(L, 0);
  if (luaL_dostring(L, w->setup) != LUA_OK) {
    fprintf(stderr, "bench_lpattern %s: %s\n", w->name, lua_tostring(L, -1));
    exit(1);
  }
}

static double per_call_ns(lua_State *L, int calls) {
  uint64_t t0 = om_bench_now_ns();
  for (int i = 0; i < calls; i++) {
    lua_pushvalue(L, 1);
    lua_call(L, 0, 0);
  }
  return (double)(om_bench_now_ns() - t0) / calls;
}

int main(void) {
  lua_State *stock = new_state(0), *ours = new_state(1);
  char name[96];
  for (size_t i = 0; i < sizeof workloads / sizeof workloads[0]; i++) {
    const workload_t *w = &workloads[i];
    double a[ROUNDS], b[ROUNDS], ra, rb;
    prepare(stock, w);
    prepare(ours, w);
    per_call_ns(stock, w->calls / 4); /* warm-up */
    per_call_ns(ours, w->calls / 4);
    for (int r = 0; r < ROUNDS; r++) { /* interleaved: same noise for both */
      a[r] = per_call_ns(stock, w->calls);
      b[r] = per_call_ns(ours, w->calls);
    }
    ra = om_bench_median(a, ROUNDS);
    rb = om_bench_median(b, ROUNDS);
    snprintf(name, sizeof name, "lpattern_%s", w->name);
    om_bench_report(name, rb, "ns");
    snprintf(name, sizeof name, "lpattern_%s_stock", w->name);
    om_bench_report(name, ra, "ns");
    snprintf(name, sizeof name, "lpattern_ratio_%s", w->name);
    om_bench_report(name, rb / ra, "x");
  }
  lua_close(stock);
  lua_close(ours);
  return 0;
}
